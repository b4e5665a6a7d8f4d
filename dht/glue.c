/* glue.c: a DHT node served over proto's transport, on a libuv loop.
 *
 * The only file of dht/ that does I/O.  Requests from peers arrive as the
 * RPC methods dht.ping, dht.store and dht.find on any connection and go to
 * dht_node_handle with the peer id the handshake authenticated.  The
 * node's own requests go out on the control connection to that peer, or
 * on a new one dialed at the contact's address; whatever happens, the
 * node hears back once (dht_node_answer), at the latest when its timeout
 * passes, even while a connection is still being made.
 *
 * Lifetime: every call or dial in flight holds a reference on the glue.
 * dht_glue_close may be called from any callback, the node's own
 * included: it stops serving at once and frees the node on a later turn
 * of the loop.  Callbacks that come later find the glue closing, drop
 * their answer and release their reference; the last frees the glue.
 */
#include "dht-int.h"

#include <errno.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define GLUE_POLL_MS 100 /* how often deadlines of dials are checked */

typedef struct gsend {
  struct gsend *next; /* dials in progress */
  dht_glue *g;
  uint64_t req;
  uint64_t deadline_ms;
  bool answered;
  bool dialing;
  char method[16];
  uint64_t timeout_ms;
  size_t len;
  uint8_t payload[]; /* kept for the dial */
} gsend;

struct dht_glue {
  uv_loop_t *loop;
  proto_host *host;
  dht_node *node;
  uv_timer_t timer;
  int refs; /* calls and dials in flight, the timer, and the owner */
  bool closing;
  gsend *dials;
  uint8_t *answer; /* DHT_ANSWER_MAX bytes, for dht_node_handle */
  int (*validate)(void *ctx, const proto_dht_record *r);
  void *validate_ctx;
};

static void unref(dht_glue *g) {
  if (--g->refs == 0) {
    free(g->answer);
    free(g);
  }
}

/* ---- dht_io ------------------------------------------------------------- */

static uint64_t io_now_ms(void *ctx) {
  dht_glue *g = ctx;
  return uv_now(g->loop);
}

static uint64_t io_wall_s(void *ctx) {
  (void)ctx;
  return (uint64_t)time(NULL);
}

static void io_random(void *ctx, void *buf, size_t n) {
  (void)ctx;
  randombytes_buf(buf, n);
}

static void timer_cb(uv_timer_t *t);

/* Brings the timer forward when the node needs a tick sooner. */
static void io_wake(void *ctx, uint64_t ms) {
  dht_glue *g = ctx;
  if (g->closing)
    return;
  uint64_t due = uv_timer_get_due_in(&g->timer);
  if (!uv_is_active((uv_handle_t *)&g->timer) || ms < due)
    uv_timer_start(&g->timer, timer_cb, ms, 0);
}

static int io_validate(void *ctx, const proto_dht_record *r) {
  dht_glue *g = ctx;
  return g->validate ? g->validate(g->validate_ctx, r) : 0;
}

static void answer(gsend *s, int status, const uint8_t *from,
                   const uint8_t *payload, size_t len) {
  dht_glue *g = s->g;
  if (s->answered)
    return;
  s->answered = true;
  if (!g->closing)
    dht_node_answer(g->node, s->req, status, from, payload, len);
}

static void reply_cb(proto_conn *c, int status, int64_t code,
                     proto_bytes payload, void *arg) {
  gsend *s = arg;
  dht_glue *g = s->g;
  answer(s, status, status == 0 ? proto_conn_peer(c)->id : NULL, payload.p,
         payload.n);
  (void)code;
  free(s);
  unref(g);
}

/* Sends s on c; on success reply_cb owns s (and its reference). */
static int call_on(gsend *s, proto_conn *c) {
  uint64_t now = uv_now(s->g->loop);
  uint64_t left = s->deadline_ms > now ? s->deadline_ms - now : 1;
  return proto_conn_call(c, s->method, s->payload, s->len, left, reply_cb, s,
                         NULL);
}

static void unlink_dial(dht_glue *g, gsend *s) {
  for (gsend **pp = &g->dials; *pp; pp = &(*pp)->next)
    if (*pp == s) {
      *pp = s->next;
      return;
    }
}

static void connect_cb(proto_host *h, proto_conn *c, int status, void *arg) {
  gsend *s = arg;
  dht_glue *g = s->g;
  (void)h;
  unlink_dial(g, s);
  s->dialing = false;
  int rc = status ? status : !c || s->answered || g->closing ? BEE_ETIMEOUT : 0;
  if (rc == 0)
    rc = call_on(s, c);
  if (rc) {
    answer(s, rc, NULL, NULL, 0); /* later than the send: the node waits */
    free(s);
    unref(g);
  }
}

static int io_send(void *ctx, const uint8_t *id, const char *addr,
                   const char *method, const uint8_t *payload, size_t len,
                   uint64_t timeout_ms, uint64_t req) {
  dht_glue *g = ctx;
  size_t mlen = strlen(method);
  if (g->closing)
    return BEE_ECLOSED;
  if (mlen >= sizeof ((gsend *)0)->method)
    return BEE_ETOOBIG;
  gsend *s = malloc(sizeof *s + len);
  if (!s)
    return -ENOMEM;
  memset(s, 0, sizeof *s);
  s->g = g;
  s->req = req;
  s->timeout_ms = timeout_ms;
  s->deadline_ms = uv_now(g->loop) + timeout_ms;
  memcpy(s->method, method, mlen + 1);
  memcpy(s->payload, payload, len);
  s->len = len;
  /* A failure here is returned, never answered: the node registers the
   * request only after this returns. */
  proto_conn *c = id ? proto_host_find(g->host, id) : NULL;
  int rc = c ? call_on(s, c)
             : proto_host_connect(g->host, addr, PROTO_PURPOSE_CONTROL,
                                  connect_cb, s);
  if (rc) {
    free(s);
    return rc;
  }
  g->refs++;
  if (c)
    return 0;
  s->dialing = true;
  s->next = g->dials;
  g->dials = s;
  return 0;
}

/* ---- requests from peers ------------------------------------------------ */

/* The IP of "ip:port" or "[ip]:port". */
static void remote_ip(const char *addr, char *ip, size_t cap) {
  const char *s = addr, *colon = strrchr(addr, ':');
  size_t n = colon ? (size_t)(colon - addr) : strlen(addr);
  if (n >= 2 && s[0] == '[' && s[n - 1] == ']')
    s++, n -= 2;
  if (n >= cap)
    n = cap - 1;
  memcpy(ip, s, n);
  ip[n] = 0;
  /* An IPv4 peer on a dual-stack socket reads as ::ffff:a.b.c.d. */
  if (strncmp(ip, "::ffff:", 7) == 0 && strchr(ip + 7, '.'))
    memmove(ip, ip + 7, strlen(ip + 7) + 1);
}

static void on_request(proto_conn *c, uint64_t id, proto_bytes method,
                       proto_bytes payload, void *data) {
  dht_glue *g = data;
  char m[16], ip[64];
  size_t len;
  if (g->closing) {
    proto_conn_reply_error(c, id, BEE_ECLOSED, "shutting down");
    return;
  }
  if (method.n >= sizeof m) {
    proto_conn_reply_error(c, id, BEE_ENOMETHOD, "unknown method");
    return;
  }
  memcpy(m, method.p, method.n);
  m[method.n] = 0;
  remote_ip(proto_conn_addr(c), ip, sizeof ip);
  int rc = dht_node_handle(g->node, proto_conn_peer(c)->id, ip, m, payload.p,
                           payload.n, g->answer, DHT_ANSWER_MAX, &len);
  if (rc)
    proto_conn_reply_error(c, id, rc, bee_strerror(rc));
  else
    proto_conn_reply(c, id, g->answer, len);
}

/* ---- timer -------------------------------------------------------------- */

static void timer_cb(uv_timer_t *t) {
  dht_glue *g = t->data;
  if (g->closing)
    return;
  uint64_t now = uv_now(g->loop);
  /* Dials past their deadline are answered now; the dial goes on and its
   * callback finds the answer given. */
  for (gsend *s = g->dials; s; s = s->next)
    if (!s->answered && now >= s->deadline_ms)
      answer(s, BEE_ETIMEOUT, NULL, NULL, 0);
  uint64_t next = dht_node_tick(g->node);
  if (g->dials && next > GLUE_POLL_MS)
    next = GLUE_POLL_MS;
  if (next < 5)
    next = 5;
  uv_timer_start(&g->timer, timer_cb, next, 0);
}

/* The node is freed here, on a later turn of the loop than the close,
 * never inside one of its own callbacks. */
static void timer_closed(uv_handle_t *h) {
  dht_glue *g = h->data;
  dht_node_free(g->node);
  g->node = NULL;
  unref(g);
}

int dht_glue_new(uv_loop_t *loop, proto_host *host, const dht_config *cfg,
                 int (*validate)(void *ctx, const proto_dht_record *r),
                 void *validate_ctx, dht_glue **out) {
  dht_glue *g = calloc(1, sizeof *g);
  if (!g || !(g->answer = malloc(DHT_ANSWER_MAX))) {
    free(g);
    return -ENOMEM;
  }
  g->loop = loop;
  g->host = host;
  g->validate = validate;
  g->validate_ctx = validate_ctx;
  dht_io io = {.ctx = g, .now_ms = io_now_ms, .wall_s = io_wall_s,
               .random = io_random, .send = io_send,
               .validate = io_validate, .wake = io_wake};
  int rc = dht_node_new(cfg, &io, &g->node);
  if (!rc && !(rc = proto_host_on(host, DHT_METHOD_PING, on_request, g)) &&
      !(rc = proto_host_on(host, DHT_METHOD_STORE, on_request, g)))
    rc = proto_host_on(host, DHT_METHOD_FIND, on_request, g);
  if (rc) {
    dht_node_free(g->node);
    free(g->answer);
    free(g);
    return rc;
  }
  uv_timer_init(loop, &g->timer);
  g->timer.data = g;
  g->refs = 2; /* the owner and the timer */
  uv_timer_start(&g->timer, timer_cb, 10, 0);
  *out = g;
  return 0;
}

dht_node *dht_glue_node(dht_glue *g) { return g->node; }

void dht_glue_close(dht_glue *g) {
  if (!g || g->closing)
    return;
  g->closing = true;
  proto_host_on(g->host, DHT_METHOD_PING, NULL, NULL);
  proto_host_on(g->host, DHT_METHOD_STORE, NULL, NULL);
  proto_host_on(g->host, DHT_METHOD_FIND, NULL, NULL);
  /* Calls still in flight drop their answers when they end; the node goes
   * when the timer has closed. */
  uv_close((uv_handle_t *)&g->timer, timer_closed);
  unref(g);
}
