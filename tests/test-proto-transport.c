/* test-proto-transport.c: authenticated connections over loopback sockets.
 *
 * Hosts run on one libuv loop in this process; hostile peers run in child
 * processes (raw sockets, or a real peer that freezes itself with
 * SIGSTOP) so they cannot be helped by our loop.  Every case checks that
 * the bad peer is refused or closed with the right code and that the host
 * goes on serving a good peer afterwards.
 */
#include "proto.h"
#include "test.h"
#include "testlib.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sodium.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static uv_loop_t *loop;
static proto_identity moderator, moderator2;
static const char *self_exe;

typedef struct tnode {
  test_node n;
  proto_host *h;
  int port;
  int ups, downs, last_down;
  proto_conn *last_up;
  int oneways, requests;
  size_t stream_bytes;
  int stream_ends;
  bool stream_bad;
  proto_revocation rl;
} tnode;

static uint64_t now_s(void) { return (uint64_t)time(NULL); }

static long max_rss_kib(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss;
}

static void on_up(proto_conn *c, int status, void *data) {
  tnode *t = data;
  (void)status;
  t->ups++;
  t->last_up = c;
}

static void on_down(proto_conn *c, int status, void *data) {
  tnode *t = data;
  (void)c;
  t->downs++;
  t->last_down = status;
}

static void on_oneway(proto_conn *c, proto_bytes method, proto_bytes payload,
                      void *data) {
  tnode *t = data;
  (void)c;
  if (method.n == 4 && memcmp(method.p, "note", 4) == 0 && payload.n == 4 &&
      memcmp(payload.p, "ping", 4) == 0)
    t->oneways++;
}

static void on_stream(proto_conn *c, const proto_msg *m, void *data) {
  tnode *t = data;
  (void)c;
  if (m->type == PROTO_T_STREAM_CHUNK) {
    for (size_t i = 0; i < m->payload.n; i++)
      if (m->payload.p[i] != (uint8_t)((m->offset + i) * 7))
        t->stream_bad = true;
    t->stream_bytes += m->payload.n;
  } else if (m->type == PROTO_T_STREAM_END) {
    t->stream_ends++;
  }
}

static void echo(proto_conn *c, uint64_t id, proto_bytes method,
                 proto_bytes payload, void *data) {
  (void)method, (void)data;
  proto_conn_reply(c, id, payload.p, payload.n);
}

static void never(proto_conn *c, uint64_t id, proto_bytes method,
                  proto_bytes payload, void *data) {
  tnode *t = data;
  (void)c, (void)id, (void)method, (void)payload;
  t->requests++;
}

typedef void (*tweak_fn)(proto_host_config *cfg);

static void tnode_start(tnode *t, bool listen, tweak_fn tweak) {
  proto_host_config cfg;
  proto_host_config_default(&cfg);
  cfg.loop = loop;
  cfg.auth = t->n.auth;
  cfg.handshake_timeout_ms = 2000;
  cfg.on_up = on_up;
  cfg.on_down = on_down;
  cfg.on_oneway = on_oneway;
  cfg.on_stream = on_stream;
  cfg.data = t;
  if (tweak)
    tweak(&cfg);
  ASSERT_OK(proto_host_new(&cfg, &t->h));
  ASSERT_OK(proto_host_on(t->h, "echo", echo, t));
  ASSERT_OK(proto_host_on(t->h, "never", never, t));
  if (listen)
    ASSERT_OK(proto_host_listen(t->h, "127.0.0.1:0", &t->port));
}

static void tnode_init(tnode *t, int role, uint64_t expires) {
  memset(t, 0, sizeof *t);
  test_node_init(&t->n, &moderator, "test", role, now_s() - 60, expires);
  proto_revocation_init(&t->rl);
}

static void tnode_new(tnode *t, bool listen, tweak_fn tweak) {
  tnode_init(t, PROTO_ROLE_BEE, now_s() + 3600);
  tnode_start(t, listen, tweak);
}

static void tnode_stop(tnode *t) {
  if (t->h)
    proto_host_close(t->h);
  t->h = NULL;
  proto_revocation_close(&t->rl);
}

/* Closes hosts and runs the loop until every handle is gone. */
static void drain_loop(void) {
  uv_run(loop, UV_RUN_DEFAULT);
}

typedef struct cres {
  bool done;
  int status;
  proto_conn *c;
} cres;

static void connect_cb(proto_host *h, proto_conn *c, int status, void *arg) {
  cres *r = arg;
  (void)h;
  r->done = true;
  r->status = status;
  r->c = c;
}

static bool cres_done(void *arg) { return ((cres *)arg)->done; }

static int dial(tnode *from, int port, int purpose, proto_conn **out) {
  char addr[32];
  cres r = {0};
  snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
  ASSERT_OK(proto_host_connect(from->h, addr, purpose, connect_cb, &r));
  ASSERT(test_run_until(loop, cres_done, &r, 10000));
  if (out)
    *out = r.c;
  ASSERT((r.status == 0) == (r.c != NULL));
  return r.status;
}

typedef struct rres {
  int calls;
  int status;
  int64_t code;
  char text[256];
} rres;

static void reply_cb(proto_conn *c, int status, int64_t code,
                     proto_bytes payload, void *arg) {
  rres *r = arg;
  (void)c;
  r->calls++;
  r->status = status;
  r->code = code;
  size_t n = payload.n < sizeof r->text - 1 ? payload.n : sizeof r->text - 1;
  if (n)
    memcpy(r->text, payload.p, n);
  r->text[n] = 0;
}

static bool rres_done(void *arg) { return ((rres *)arg)->calls > 0; }

static void call(proto_conn *c, const char *method, const char *arg,
                 uint64_t timeout_ms, rres *r) {
  memset(r, 0, sizeof *r);
  ASSERT_OK(proto_conn_call(c, method, (const uint8_t *)arg, strlen(arg),
                            timeout_ms, reply_cb, r, NULL));
  ASSERT(test_run_until(loop, rres_done, r, 10000));
  ASSERT_EQ(r->calls, 1);
}

static bool count_ge(void *arg) {
  int **p = arg;
  return *p[0] >= *p[1];
}

/* Runs the loop until *v >= want. */
static bool wait_for(int *v, int want, uint64_t ms) {
  int *args[2] = {v, &want};
  return test_run_until(loop, count_ge, args, ms);
}

static void sleep_loop(uint64_t ms) {
  int never_set = 0;
  wait_for(&never_set, 1, ms);
}

/* ---- RPC, one-way, streams, dedupe ------------------------------------ */

static void test_rpc(void) {
  tnode a, b;
  proto_conn *c, *c2;
  rres r;
  tnode_new(&a, true, NULL);
  tnode_new(&b, false, NULL);
  ASSERT_OK(dial(&b, a.port, PROTO_PURPOSE_CONTROL, &c));
  ASSERT(wait_for(&a.ups, 1, 2000));
  ASSERT_MEMEQ(proto_conn_peer(c)->id, a.n.id.id, PROTO_ID_BYTES);
  ASSERT_MEMEQ(proto_conn_peer(a.last_up)->id, b.n.id.id, PROTO_ID_BYTES);
  ASSERT_EQ(proto_conn_peer(a.last_up)->role, PROTO_ROLE_BEE);

  call(c, "echo", "hello", 0, &r);
  ASSERT_OK(r.status);
  ASSERT_STREQ(r.text, "hello");

  call(c, "no.such.method", "x", 0, &r);
  ASSERT_RC(r.status, BEE_EREMOTE);
  ASSERT_RC((int)r.code, BEE_ENOMETHOD);
  ASSERT(strstr(r.text, "no.such.method") != NULL);

  call(c, "never", "x", 200, &r);
  ASSERT_RC(r.status, BEE_ETIMEOUT);
  ASSERT_EQ(a.requests, 1);

  /* Cancel: the callback runs once, now, and never again. */
  uint64_t id;
  memset(&r, 0, sizeof r);
  ASSERT_OK(proto_conn_call(c, "never", NULL, 0, 5000, reply_cb, &r, &id));
  ASSERT_OK(proto_conn_cancel(c, id));
  ASSERT_EQ(r.calls, 1);
  ASSERT_RC(r.status, BEE_ECANCELED);
  ASSERT_RC(proto_conn_cancel(c, id), BEE_ERANGE);
  sleep_loop(100);
  ASSERT_EQ(r.calls, 1);

  ASSERT_OK(proto_conn_oneway(c, "note", (const uint8_t *)"ping", 4));
  ASSERT(wait_for(&a.oneways, 1, 2000));

  /* A 3 MiB stream in 1 MiB chunks arrives intact. */
  size_t chunk = PROTO_CHUNK_MAX;
  uint8_t *buf = malloc(chunk);
  proto_msg open = {.type = PROTO_T_STREAM_OPEN, .id = 9,
                    .name = {(const uint8_t *)"tensor", 6}, .offset = 3 * chunk};
  ASSERT_OK(proto_conn_send(c, &open));
  for (size_t k = 0; k < 3; k++) {
    for (size_t i = 0; i < chunk; i++)
      buf[i] = (uint8_t)((k * chunk + i) * 7);
    ASSERT_OK(proto_conn_send_chunk(c, 9, k * chunk, buf, chunk));
  }
  ASSERT_RC(proto_conn_send_chunk(c, 9, 0, buf, chunk + 1), BEE_ETOOBIG);
  proto_msg end = {.type = PROTO_T_STREAM_END, .id = 9};
  ASSERT_OK(proto_conn_send(c, &end));
  ASSERT(wait_for(&a.stream_ends, 1, 5000));
  ASSERT_UEQ(a.stream_bytes, 3 * chunk);
  ASSERT(!a.stream_bad);
  free(buf);

  /* A second dial to the same peer reuses the connection. */
  ASSERT_OK(dial(&b, a.port, PROTO_PURPOSE_CONTROL, &c2));
  ASSERT(c2 == c);
  ASSERT_EQ(proto_host_conn_count(b.h), 1);
  ASSERT(proto_host_find(b.h, a.n.id.id) == c);
  /* Bulk connections are extra, several per peer. */
  proto_conn *bulk1, *bulk2;
  ASSERT_OK(dial(&b, a.port, PROTO_PURPOSE_BULK, &bulk1));
  ASSERT_OK(dial(&b, a.port, PROTO_PURPOSE_BULK, &bulk2));
  ASSERT(bulk1 != bulk2 && bulk1 != c);
  ASSERT_EQ(proto_host_conn_count(b.h), 3);
  ASSERT(proto_host_find(b.h, a.n.id.id) == c);

  /* A close with a reason reaches the other side. */
  proto_conn_close(c, 0, "bye");
  ASSERT(wait_for(&a.downs, 1, 2000));
  ASSERT_EQ(b.downs, 1);
  tnode_stop(&a);
  tnode_stop(&b);
  drain_loop();
  ASSERT_EQ(b.downs, 3); /* the bulk connections went down on close */
}

/* A host whose on_up closes the connection still gets exactly one connect
 * callback, with an error. */
static void up_close(proto_conn *c, int status, void *data) {
  on_up(c, status, data);
  proto_conn_close(c, BEE_ELIMIT, "not now");
}

static void tweak_up_close(proto_host_config *cfg) { cfg->on_up = up_close; }

static int cb_calls;
static void count_cb(proto_host *h, proto_conn *c, int status, void *arg) {
  cres *r = arg;
  (void)h;
  cb_calls++;
  r->done = true;
  r->status = status;
  r->c = c;
}

static void test_up_close(void) {
  tnode a, b;
  cres r = {0};
  char addr[32];
  tnode_new(&a, true, NULL);
  tnode_new(&b, false, tweak_up_close);
  snprintf(addr, sizeof addr, "127.0.0.1:%d", a.port);
  cb_calls = 0;
  ASSERT_OK(proto_host_connect(b.h, addr, PROTO_PURPOSE_CONTROL, count_cb, &r));
  ASSERT(test_run_until(loop, cres_done, &r, 5000));
  sleep_loop(100);
  ASSERT_EQ(cb_calls, 1);
  ASSERT(r.c == NULL);
  ASSERT_RC(r.status, BEE_ELIMIT);
  ASSERT_EQ(b.ups, 1);
  ASSERT_EQ(b.downs, 1);
  tnode_stop(&a);
  tnode_stop(&b);
  drain_loop();
}

/* Two peers dialing each other at once end with one connection, and
 * neither ever sees the other gone: the winner is reported before the
 * duplicate closes. */
typedef struct racer {
  tnode t;
  int live, min_live_after_up;
} racer;

static void race_up(proto_conn *c, int status, void *data) {
  racer *r = data;
  (void)c, (void)status;
  r->t.ups++;
  r->live++;
}

static void race_down(proto_conn *c, int status, void *data) {
  racer *r = data;
  (void)c, (void)status;
  r->t.downs++;
  r->live--;
  if (r->live < r->min_live_after_up)
    r->min_live_after_up = r->live;
}

static void test_dial_race(void) {
  racer x, y;
  cres rx = {0}, ry = {0};
  char ax[32], ay[32];
  for (int i = 0; i < 2; i++) {
    racer *r = i ? &y : &x;
    tnode_init(&r->t, PROTO_ROLE_BEE, now_s() + 3600);
    r->live = 0;
    r->min_live_after_up = 1;
    proto_host_config cfg;
    proto_host_config_default(&cfg);
    cfg.loop = loop;
    cfg.auth = r->t.n.auth;
    cfg.on_up = race_up;
    cfg.on_down = race_down;
    cfg.data = r;
    ASSERT_OK(proto_host_new(&cfg, &r->t.h));
    ASSERT_OK(proto_host_listen(r->t.h, "127.0.0.1:0", &r->t.port));
  }
  snprintf(ax, sizeof ax, "127.0.0.1:%d", y.t.port);
  snprintf(ay, sizeof ay, "127.0.0.1:%d", x.t.port);
  ASSERT_OK(proto_host_connect(x.t.h, ax, PROTO_PURPOSE_CONTROL, connect_cb, &rx));
  ASSERT_OK(proto_host_connect(y.t.h, ay, PROTO_PURPOSE_CONTROL, connect_cb, &ry));
  ASSERT(test_run_until(loop, cres_done, &rx, 5000));
  ASSERT(test_run_until(loop, cres_done, &ry, 5000));
  sleep_loop(2500); /* past the duplicate's grace (PROTO_RETIRE_MS) */
  ASSERT_OK(rx.status);
  ASSERT_OK(ry.status);
  ASSERT_EQ(proto_host_conn_count(x.t.h), 1);
  ASSERT_EQ(proto_host_conn_count(y.t.h), 1);
  ASSERT_EQ(x.live, 1);
  ASSERT_EQ(y.live, 1);
  ASSERT_GE(x.min_live_after_up, 1); /* never dropped to zero */
  ASSERT_GE(y.min_live_after_up, 1);
  tnode_stop(&x.t);
  tnode_stop(&y.t);
  drain_loop();
}

/* ---- renewed tokens ---------------------------------------------------- */

/* b's token expires in 2 s; it renews it while connected to a, and again
 * while a second connection's handshake runs: a keeps both open past the
 * old expiry.  c "renews" with a token for another key, d with another
 * role, e with a damaged one: a refuses each and closes their connections
 * when their old tokens expire. */
static void test_token_renewal(void) {
  tnode a, b, c, d, e;
  tnode_new(&a, true, NULL);
  tnode *old[] = {&b, &c, &d, &e};
  for (size_t i = 0; i < 4; i++) {
    tnode_init(old[i], PROTO_ROLE_BEE, now_s() + 2);
    tnode_start(old[i], false, NULL);
  }
  proto_conn *cb, *cb2;
  ASSERT_OK(dial(&b, a.port, PROTO_PURPOSE_CONTROL, &cb));
  ASSERT_OK(dial(&c, a.port, PROTO_PURPOSE_CONTROL, NULL));
  ASSERT_OK(dial(&d, a.port, PROTO_PURPOSE_CONTROL, NULL));
  ASSERT_OK(dial(&e, a.port, PROTO_PURPOSE_CONTROL, NULL));
  int downs = a.downs;

  ASSERT_OK(proto_token_issue(&b.n.tok, &moderator, "test", b.n.id.pk,
                              PROTO_ROLE_BEE, now_s() - 60, now_s() + 3600));
  ASSERT_UEQ(proto_host_token_renewed(b.h), 1);
  c.n.tok = a.n.tok; /* a's: it names another key */
  ASSERT_UEQ(proto_host_token_renewed(c.h), 1);
  ASSERT_OK(proto_token_issue(&d.n.tok, &moderator, "test", d.n.id.pk,
                              PROTO_ROLE_AUX, now_s() - 60, now_s() + 3600));
  ASSERT_UEQ(proto_host_token_renewed(d.h), 1);
  ASSERT_OK(proto_token_issue(&e.n.tok, &moderator, "test", e.n.id.pk,
                              PROTO_ROLE_BEE, now_s() - 60, now_s() + 3600));
  e.n.tok.raw[e.n.tok.raw_len - 3] ^= 0x20; /* the signature no longer fits */
  ASSERT_UEQ(proto_host_token_renewed(e.h), 1);

  /* Floods: b's renewal again and again (taken already, skipped
   * unchecked), e's refused one again and again (not looked at within a
   * second of the refusal).  Nothing changes, a keeps serving. */
  for (int i = 0; i < 1000; i++) {
    ASSERT_UEQ(proto_host_token_renewed(b.h), 1);
    ASSERT_UEQ(proto_host_token_renewed(e.h), 1);
  }
  sleep_loop(100);
  ASSERT_EQ(a.downs, downs);

  /* A bulk connection of b's, renewed again while it is being made. */
  cres r = {0};
  char addr[32];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", a.port);
  ASSERT_OK(proto_host_connect(b.h, addr, PROTO_PURPOSE_BULK, connect_cb, &r));
  ASSERT_OK(proto_token_issue(&b.n.tok, &moderator, "test", b.n.id.pk,
                              PROTO_ROLE_BEE, now_s() - 60, now_s() + 7200));
  ASSERT_UEQ(proto_host_token_renewed(b.h), 1); /* cb only: r's is not up */
  ASSERT(test_run_until(loop, cres_done, &r, 10000));
  ASSERT_OK(r.status);
  cb2 = r.c;

  /* Past the old tokens' expiry and a tick. */
  sleep_loop(3500);
  ASSERT_EQ(a.downs, downs + 3);
  ASSERT_EQ(a.last_down, BEE_ETOKEN_EXPIRED);
  rres rr;
  call(cb, "echo", "still here", 2000, &rr);
  ASSERT_OK(rr.status);
  ASSERT_STREQ(rr.text, "still here");
  call(cb2, "echo", "bulk too", 2000, &rr);
  ASSERT_OK(rr.status);
  ASSERT_EQ(b.downs, 0);
  for (size_t i = 1; i < 4; i++)
    ASSERT_EQ(old[i]->downs, 1);
  for (size_t i = 0; i < 4; i++)
    tnode_stop(old[i]);
  tnode_stop(&a);
  drain_loop();
}

/* ---- token refusals over real sockets --------------------------------- */

static void expect_dial(tnode *bad, tnode *a, int purpose, int code) {
  tnode_start(bad, false, NULL);
  int ups = a->ups;
  ASSERT_RC(dial(bad, a->port, purpose, NULL), code);
  sleep_loop(50);
  ASSERT_EQ(a->ups, ups);
  tnode_stop(bad);
}

static void test_refusals(void) {
  tnode a, bad, good;
  tnode_init(&a, PROTO_ROLE_BEE, now_s() + 3600);
  tnode_init(&bad, PROTO_ROLE_BEE, now_s() + 3600);
  ASSERT_OK(proto_revocation_add(&a.rl, bad.n.id.pk));
  a.n.auth.revoked = &a.rl;
  tnode_start(&a, true, NULL);
  expect_dial(&bad, &a, PROTO_PURPOSE_CONTROL, BEE_EREVOKED);

  tnode_init(&bad, PROTO_ROLE_BEE, now_s() - 5);
  expect_dial(&bad, &a, PROTO_PURPOSE_CONTROL, BEE_ETOKEN_EXPIRED);

  tnode_init(&bad, PROTO_ROLE_BEE, now_s() + 3600);
  bad.n.tok.raw[bad.n.tok.raw_len - 3] ^= 0x20;
  expect_dial(&bad, &a, PROTO_PURPOSE_CONTROL, BEE_ETOKEN_FORGED);

  tnode_init(&bad, PROTO_ROLE_BEE, now_s() + 3600);
  bad.n.tok = a.n.tok;
  expect_dial(&bad, &a, PROTO_PURPOSE_CONTROL, BEE_ETOKEN_PEER);

  /* A node that trusts another moderator refuses our token first. */
  tnode_init(&bad, PROTO_ROLE_BEE, now_s() + 3600);
  test_node_init(&bad.n, &moderator2, "test", PROTO_ROLE_BEE, now_s(),
                 now_s() + 3600);
  expect_dial(&bad, &a, PROTO_PURPOSE_CONTROL, BEE_ETOKEN_MODERATOR);
  /* A token from another moderator presented to us. */
  tnode_init(&bad, PROTO_ROLE_BEE, now_s() + 3600);
  ASSERT_OK(proto_token_issue(&bad.n.tok, &moderator2, "test", bad.n.id.pk,
                              PROTO_ROLE_BEE, now_s(), now_s() + 3600));
  expect_dial(&bad, &a, PROTO_PURPOSE_CONTROL, BEE_ETOKEN_MODERATOR);

  tnode_init(&bad, PROTO_ROLE_BEE, now_s() + 3600);
  ASSERT_OK(proto_token_issue(&bad.n.tok, &moderator, "other", bad.n.id.pk,
                              PROTO_ROLE_BEE, now_s(), now_s() + 3600));
  expect_dial(&bad, &a, PROTO_PURPOSE_CONTROL, BEE_ETOKEN_SWARM);

  tnode_init(&bad, PROTO_ROLE_MONITOR, now_s() + 3600);
  expect_dial(&bad, &a, PROTO_PURPOSE_BULK, BEE_ETOKEN_ROLE);

  tnode_init(&bad, PROTO_ROLE_BEE, now_s() + 3600);
  bad.n.auth.moderator_pk = NULL;
  bad.n.auth.token = NULL;
  expect_dial(&bad, &a, PROTO_PURPOSE_CONTROL, BEE_EOPEN_MISMATCH);

  /* The host still serves good peers. */
  proto_conn *c;
  rres r;
  tnode_new(&good, false, NULL);
  ASSERT_OK(dial(&good, a.port, PROTO_PURPOSE_CONTROL, &c));
  call(c, "echo", "still here", 0, &r);
  ASSERT_STREQ(r.text, "still here");
  ASSERT_EQ(a.ups, 1);
  tnode_stop(&good);
  tnode_stop(&a);
  drain_loop();
}

/* ---- raw-socket attacks from a child process -------------------------- */

static int raw_connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0)
    _exit(10);
  return fd;
}

/* True if the server closes fd within ms. */
static bool closed_within(int fd, int ms) {
  struct pollfd p = {.fd = fd, .events = POLLIN};
  char b[256];
  for (;;) {
    int n = poll(&p, 1, ms);
    if (n <= 0)
      return false;
    ssize_t r = read(fd, b, sizeof b);
    if (r <= 0)
      return true; /* EOF or reset */
  }
}

static int64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The child: returns an exit code naming the first check that failed. */
static int raw_attacks(int port) {
  /* Half-finished handshake: connected, silent; closed by the timeout. */
  int64_t t0 = mono_ms();
  int fd = raw_connect(port);
  if (!closed_within(fd, 3000))
    return 11;
  if (mono_ms() - t0 < 300)
    return 12; /* closed, but not by the handshake timeout */
  close(fd);
  /* A HELLO, then silence mid-handshake. */
  fd = raw_connect(port);
  uint8_t hdr[4] = {0, 0, 0, 3}, part[3] = {0x97, 1, 20};
  if (write(fd, hdr, 4) != 4 || write(fd, part, 3) != 3 || !closed_within(fd, 3000))
    return 13;
  close(fd);
  /* An oversized frame header closes at once. */
  fd = raw_connect(port);
  uint8_t big[4] = {0xff, 0xff, 0xff, 0xff};
  if (write(fd, big, 4) != 4 || !closed_within(fd, 300))
    return 14;
  close(fd);
  /* Garbage in a well-sized frame closes at once. */
  fd = raw_connect(port);
  uint8_t junk[104] = {0, 0, 0, 100};
  randombytes_buf(junk + 4, 100);
  if (write(fd, junk, sizeof junk) != (ssize_t)sizeof junk || !closed_within(fd, 300))
    return 15;
  close(fd);
  /* Ten silent connections: past the per-address cap of 4, refused now. */
  int fds[10], fast = 0;
  for (int i = 0; i < 10; i++)
    fds[i] = raw_connect(port);
  for (int i = 0; i < 10; i++)
    fast += closed_within(fds[i], 100);
  for (int i = 0; i < 10; i++)
    close(fds[i]);
  if (fast != 6)
    return 16;
  return 0;
}

typedef struct child {
  pid_t pid;
  int status;
  bool exited, stopped;
} child;

static bool child_changed(void *arg) {
  child *ch = arg;
  int st;
  pid_t r = waitpid(ch->pid, &st, WNOHANG | WUNTRACED);
  if (r == ch->pid) {
    ch->status = st;
    ch->exited = WIFEXITED(st) || WIFSIGNALED(st);
    ch->stopped = WIFSTOPPED(st);
    return true;
  }
  return false;
}

static void tweak_short(proto_host_config *cfg) {
  cfg->handshake_timeout_ms = 500;
  cfg->max_pending_per_addr = 4;
}

static void test_raw_attacks(void) {
  tnode a, good;
  tnode_new(&a, true, tweak_short);
  child ch = {0};
  fflush(NULL);
  ch.pid = fork();
  ASSERT(ch.pid >= 0);
  if (ch.pid == 0)
    _exit(raw_attacks(a.port));
  ASSERT(test_run_until(loop, child_changed, &ch, 20000));
  ASSERT(ch.exited);
  if (!WIFEXITED(ch.status) || WEXITSTATUS(ch.status) != 0)
    FAIL("raw attack check %d failed", WEXITSTATUS(ch.status));
  proto_conn *c;
  rres r;
  tnode_new(&good, false, NULL);
  ASSERT_OK(dial(&good, a.port, PROTO_PURPOSE_CONTROL, &c));
  call(c, "echo", "ok", 0, &r);
  ASSERT_OK(r.status);
  ASSERT_EQ(a.ups, 1);
  tnode_stop(&good);
  tnode_stop(&a);
  drain_loop();
}

static void tweak_two(proto_host_config *cfg) { cfg->max_conns = 2; }

static void test_conn_cap(void) {
  tnode a, b[3];
  tnode_new(&a, true, tweak_two);
  for (int i = 0; i < 3; i++)
    tnode_new(&b[i], false, NULL);
  ASSERT_OK(dial(&b[0], a.port, PROTO_PURPOSE_CONTROL, NULL));
  ASSERT_OK(dial(&b[1], a.port, PROTO_PURPOSE_CONTROL, NULL));
  ASSERT(dial(&b[2], a.port, PROTO_PURPOSE_CONTROL, NULL) != 0);
  ASSERT_EQ(proto_host_conn_count(a.h), 2);
  for (int i = 0; i < 3; i++)
    tnode_stop(&b[i]);
  tnode_stop(&a);
  drain_loop();
}

/* ---- a proxy that flips one byte of one client frame ------------------ */

typedef struct proxy {
  uv_tcp_t listener;
  int port, target;
  int flip_frame; /* 1-based index of the client frame to corrupt */
  int mute_after; /* stop reading the server once the client sent this many */
} proxy;

typedef struct pconn {
  proxy *p;
  uv_tcp_t cli, srv;
  uv_connect_t creq;
  int closing;
  uint8_t hdr[4];
  size_t hdr_have, body_left;
  int frame_no;
} pconn;

static void pconn_closed(uv_handle_t *h) {
  pconn *pc = h->data;
  if (++pc->closing == 3)
    free(pc);
}

static void pconn_close(pconn *pc) {
  if (pc->closing)
    return;
  pc->closing = 1;
  uv_close((uv_handle_t *)&pc->cli, pconn_closed);
  uv_close((uv_handle_t *)&pc->srv, pconn_closed);
}

static void palloc(uv_handle_t *h, size_t n, uv_buf_t *b) {
  (void)h;
  *b = uv_buf_init(malloc(n), (unsigned)n);
}

static void pwritten(uv_write_t *w, int status) {
  (void)status;
  free(w->data);
  free(w);
}

static void forward(uv_stream_t *to, uint8_t *data, size_t n) {
  uv_write_t *w = malloc(sizeof *w);
  w->data = data;
  uv_buf_t b = uv_buf_init((char *)data, (unsigned)n);
  if (uv_write(w, to, &b, 1, pwritten) < 0)
    pwritten(w, 0);
}

/* Walks client bytes frame by frame, corrupting the chosen frame. */
static void corrupt(pconn *pc, uint8_t *p, size_t n) {
  for (size_t i = 0; i < n;) {
    if (pc->body_left == 0) {
      pc->hdr[pc->hdr_have++] = p[i++];
      if (pc->hdr_have == 4) {
        pc->hdr_have = 0;
        pc->body_left = (size_t)pc->hdr[0] << 24 | (size_t)pc->hdr[1] << 16 |
                        (size_t)pc->hdr[2] << 8 | pc->hdr[3];
        pc->frame_no++;
        if (pc->frame_no == pc->p->flip_frame && i < n)
          p[i] ^= 0x01; /* first body byte (sealed: ciphertext) */
        if (pc->p->mute_after && pc->frame_no == pc->p->mute_after + 1)
          uv_read_stop((uv_stream_t *)&pc->srv);
      }
      continue;
    }
    size_t take = n - i < pc->body_left ? n - i : pc->body_left;
    i += take;
    pc->body_left -= take;
  }
}

static void cli_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b) {
  pconn *pc = s->data;
  if (n < 0) {
    free(b->base);
    pconn_close(pc);
    return;
  }
  corrupt(pc, (uint8_t *)b->base, (size_t)n);
  forward((uv_stream_t *)&pc->srv, (uint8_t *)b->base, (size_t)n);
}

static void srv_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b) {
  pconn *pc = s->data;
  if (n < 0) {
    free(b->base);
    pconn_close(pc);
    return;
  }
  forward((uv_stream_t *)&pc->cli, (uint8_t *)b->base, (size_t)n);
}

static void srv_connected(uv_connect_t *req, int status) {
  pconn *pc = req->data;
  if (status < 0) {
    pconn_close(pc);
    return;
  }
  uv_read_start((uv_stream_t *)&pc->cli, palloc, cli_read);
  uv_read_start((uv_stream_t *)&pc->srv, palloc, srv_read);
}

static void proxy_accept(uv_stream_t *server, int status) {
  proxy *p = server->data;
  if (status < 0)
    return;
  pconn *pc = calloc(1, sizeof *pc);
  pc->p = p;
  uv_tcp_init(loop, &pc->cli);
  uv_tcp_init(loop, &pc->srv);
  pc->cli.data = pc->srv.data = pc->creq.data = pc;
  uv_accept(server, (uv_stream_t *)&pc->cli);
  struct sockaddr_in sa;
  uv_ip4_addr("127.0.0.1", p->target, &sa);
  uv_tcp_connect(&pc->creq, &pc->srv, (struct sockaddr *)&sa, srv_connected);
}

static void proxy_start(proxy *px, int target) {
  px->target = target;
  uv_tcp_init(loop, &px->listener);
  px->listener.data = px;
  struct sockaddr_in sa;
  uv_ip4_addr("127.0.0.1", 0, &sa);
  ASSERT_OK(uv_tcp_bind(&px->listener, (struct sockaddr *)&sa, 0));
  ASSERT_OK(uv_listen((uv_stream_t *)&px->listener, 16, proxy_accept));
  int len = sizeof sa;
  uv_tcp_getsockname(&px->listener, (struct sockaddr *)&sa, &len);
  px->port = ntohs(sa.sin_port);
}

static void test_tampered_frame(void) {
  tnode a, b;
  proxy px = {.flip_frame = 3}; /* HELLO, AUTH, then the first sealed frame */
  tnode_new(&a, true, NULL);
  tnode_new(&b, false, NULL);
  proxy_start(&px, a.port);

  proto_conn *c;
  rres r;
  ASSERT_OK(dial(&b, px.port, PROTO_PURPOSE_CONTROL, &c));
  ASSERT(wait_for(&a.ups, 1, 2000));
  memset(&r, 0, sizeof r);
  ASSERT_OK(proto_conn_call(c, "echo", (const uint8_t *)"x", 1, 0, reply_cb, &r, NULL));
  ASSERT(wait_for(&a.downs, 1, 3000));
  ASSERT_RC(a.last_down, BEE_EAUTH);
  ASSERT(wait_for(&r.calls, 1, 3000));
  ASSERT_RC(r.status, BEE_ECLOSED);
  ASSERT(wait_for(&b.downs, 1, 3000));
  ASSERT_EQ(a.requests, 0);
  uv_close((uv_handle_t *)&px.listener, NULL);
  tnode_stop(&a);
  tnode_stop(&b);
  drain_loop();
}

/* A peer that keeps sending pings but never reads the pongs: the proxy
 * stops reading the host's side once the handshake is through.  The
 * host's control replies may pass its queue limit only by a little; then
 * it must close the connection rather than grow. */
static proto_conn *flood_conn;
static size_t flood_sent;

static void flood_pump(void) {
  proto_msg ping = {.type = PROTO_T_PING};
  while (flood_conn && flood_sent < 4000000) {
    ping.id = UINT64_MAX - flood_sent; /* widest nonce: 9 bytes */
    if (proto_conn_send(flood_conn, &ping) != 0)
      return; /* queue full: on_drain resumes; closed: done */
    flood_sent++;
  }
}

static void flood_drain(proto_conn *c, void *data) {
  (void)c, (void)data;
  flood_pump();
}

static void flood_down(proto_conn *c, int status, void *data) {
  if (c == flood_conn)
    flood_conn = NULL;
  on_down(c, status, data);
}

static void tweak_small_queue(proto_host_config *cfg) {
  cfg->write_queue_max = 64u << 10;
}

static void tweak_flooder(proto_host_config *cfg) {
  cfg->on_drain = flood_drain;
  cfg->on_down = flood_down;
}

static void test_ping_flood(void) {
  tnode a, b;
  proxy px = {.mute_after = 2}; /* HELLO and AUTH pass, then silence */
  tnode_new(&a, true, tweak_small_queue);
  tnode_new(&b, false, tweak_flooder);
  proxy_start(&px, a.port);
  ASSERT_OK(dial(&b, px.port, PROTO_PURPOSE_CONTROL, &flood_conn));
  ASSERT(wait_for(&a.ups, 1, 2000));
  long rss0 = max_rss_kib();
  uint64_t t0 = uv_now(loop);
  flood_pump();
  /* Without the cap on control replies the host would only close this
   * peer through the stall timeout (30 s by default), as BEE_ETIMEOUT. */
  ASSERT(wait_for(&a.downs, 1, 20000));
  ASSERT_RC(a.last_down, BEE_EQUEUE);
  ASSERT_LT(uv_now(loop) - t0, 20000);
  printf("ping flood: closed after %zu pings, %llu ms, rss +%ld KiB\n",
         flood_sent, (unsigned long long)(uv_now(loop) - t0),
         max_rss_kib() - rss0);
  if (!TEST_ASAN)
    ASSERT_LT(max_rss_kib() - rss0, 64 * 1024);
  flood_conn = NULL;
  uv_close((uv_handle_t *)&px.listener, NULL);
  tnode_stop(&a);
  tnode_stop(&b);
  drain_loop();
}

/* ---- a peer that stops reading (SIGSTOP in a child process) ----------- */

static tnode *stall_src;
static proto_conn *stall_conn;
static size_t stall_sent, stall_max_queued;
static uint8_t *stall_buf;

static void stall_pump(void) {
  while (stall_conn && stall_sent < (512u << 20)) {
    int rc = proto_conn_send_chunk(stall_conn, 1, stall_sent, stall_buf,
                                   PROTO_CHUNK_MAX);
    size_t q = proto_conn_queued(stall_conn);
    if (q > stall_max_queued)
      stall_max_queued = q;
    if (rc == BEE_EQUEUE)
      return; /* on_drain resumes */
    if (rc)
      return;
    stall_sent += PROTO_CHUNK_MAX;
  }
}

static void on_drain(proto_conn *c, void *data) {
  (void)c, (void)data;
  stall_pump();
}

static void stall_down(proto_conn *c, int status, void *data) {
  if (c == stall_conn)
    stall_conn = NULL;
  on_down(c, status, data);
}

static void tweak_stall(proto_host_config *cfg) {
  cfg->stall_timeout_ms = 1000;
  cfg->idle_timeout_ms = 1500;
  cfg->keepalive_ms = 300;
  cfg->write_queue_max = 4u << 20;
  cfg->on_drain = on_drain;
  cfg->on_down = stall_down;
}

/* Child mode: connect to port, then freeze once the connection is up. */
static void peer_up_stop(proto_conn *c, int status, void *data) {
  (void)c, (void)status, (void)data;
  raise(SIGSTOP);
}

static int peer_main(int port) {
  uv_loop_t l;
  uv_loop_init(&l);
  loop = &l;
  tnode p;
  tnode_init(&p, PROTO_ROLE_BEE, now_s() + 3600);
  proto_host_config cfg;
  proto_host_config_default(&cfg);
  cfg.loop = loop;
  cfg.auth = p.n.auth;
  cfg.on_up = peer_up_stop;
  ASSERT_OK(proto_host_new(&cfg, &p.h));
  ASSERT_OK(dial(&p, port, PROTO_PURPOSE_BULK, NULL));
  uv_run(loop, UV_RUN_DEFAULT);
  return 0;
}

static void spawn_peer(child *ch, int port) {
  char arg[16];
  snprintf(arg, sizeof arg, "%d", port);
  fflush(NULL);
  ch->pid = fork();
  ASSERT(ch->pid >= 0);
  if (ch->pid == 0) {
    execl(self_exe, self_exe, "--peer", arg, (char *)NULL);
    _exit(127);
  }
}

static void reap(child *ch) {
  kill(ch->pid, SIGKILL);
  waitpid(ch->pid, &ch->status, 0);
}

static void test_stalled_peer(void) {
  tnode a;
  child ch = {0};
  tnode_new(&a, true, tweak_stall);
  stall_src = &a;
  stall_buf = calloc(1, PROTO_CHUNK_MAX);
  long rss0 = max_rss_kib();
  spawn_peer(&ch, a.port);
  ASSERT(wait_for(&a.ups, 1, 10000));
  ASSERT(test_run_until(loop, child_changed, &ch, 5000) && ch.stopped);
  stall_conn = a.last_up;
  stall_pump();
  ASSERT(wait_for(&a.downs, 1, 10000));
  ASSERT_RC(a.last_down, BEE_ETIMEOUT);
  /* Bounded: the queue never passes its limit by more than one frame, and
   * what the socket took is far less than what we tried to send. */
  ASSERT_LE(stall_max_queued, (4u << 20) + PROTO_CHUNK_MAX + 64);
  ASSERT_LT(stall_sent, 256u << 20);
  if (!TEST_ASAN)
    ASSERT_LT(max_rss_kib() - rss0, 64 * 1024);
  printf("stalled peer: queued at most %zu bytes, socket took %zu, rss +%ld KiB\n",
         stall_max_queued, stall_sent, max_rss_kib() - rss0);
  reap(&ch);
  free(stall_buf);

  /* A frozen peer we send nothing to: keepalive pings go unanswered and
   * the idle timeout closes it. */
  child ch2 = {0};
  spawn_peer(&ch2, a.port);
  ASSERT(wait_for(&a.ups, 2, 10000));
  ASSERT(test_run_until(loop, child_changed, &ch2, 5000) && ch2.stopped);
  ASSERT(wait_for(&a.downs, 2, 5000));
  ASSERT_RC(a.last_down, BEE_ETIMEOUT);
  reap(&ch2);
  tnode_stop(&a);
  drain_loop();
}

/* Keepalives hold an idle connection open past the idle timeout. */
static void tweak_keepalive(proto_host_config *cfg) {
  cfg->keepalive_ms = 100;
  cfg->idle_timeout_ms = 500;
}

static void test_keepalive(void) {
  tnode a, b;
  tnode_new(&a, true, tweak_keepalive);
  tnode_new(&b, false, tweak_keepalive);
  ASSERT_OK(dial(&b, a.port, PROTO_PURPOSE_CONTROL, NULL));
  sleep_loop(1500);
  ASSERT_EQ(a.downs, 0);
  ASSERT_EQ(b.downs, 0);
  tnode_stop(&a);
  tnode_stop(&b);
  drain_loop();
}

/* ---- fifty endpoints --------------------------------------------------- */

#define MANY 50

/* All fifty dial from 127.0.0.1 at once: lift the per-address cap. */
static void tweak_many(proto_host_config *cfg) {
  cfg->max_pending_per_addr = 4 * MANY;
}

static void test_many(void) {
  static tnode t[MANY];
  for (int i = 0; i < MANY; i++)
    tnode_new(&t[i], true, tweak_many);
  /* Each dials the hub and its ring successor (the last one's successor
   * is the hub: that dial reuses the first connection). */
  static cres res[MANY][2];
  char addr[32];
  for (int i = 1; i < MANY; i++)
    for (int k = 0; k < 2; k++) {
      int to = k == 0 ? 0 : (i + 1) % MANY;
      snprintf(addr, sizeof addr, "127.0.0.1:%d", t[to].port);
      ASSERT_OK(proto_host_connect(t[i].h, addr, PROTO_PURPOSE_CONTROL,
                                   connect_cb, &res[i][k]));
    }
  int done = 0;
  for (int round = 0; round < 200 && done < 2 * (MANY - 1); round++) {
    sleep_loop(50);
    done = 0;
    for (int i = 1; i < MANY; i++)
      done += res[i][0].done + res[i][1].done;
  }
  ASSERT_EQ(done, 2 * (MANY - 1));
  for (int i = 1; i < MANY; i++)
    for (int k = 0; k < 2; k++)
      if (res[i][k].status)
        FAIL("node %d dial %d: %s", i, k, bee_strerror(res[i][k].status));
  ASSERT_EQ(proto_host_conn_count(t[0].h), MANY - 1);
  static rres rr[MANY];
  for (int i = 1; i < MANY; i++)
    ASSERT_OK(proto_conn_call(res[i][1].c, "echo", (const uint8_t *)"hi", 2, 0,
                              reply_cb, &rr[i], NULL));
  int answered = 0;
  for (int round = 0; round < 100 && answered < MANY - 1; round++) {
    sleep_loop(20);
    answered = 0;
    for (int i = 1; i < MANY; i++)
      answered += rr[i].calls == 1 && rr[i].status == 0;
  }
  ASSERT_EQ(answered, MANY - 1);
  for (int i = 0; i < MANY; i++)
    tnode_stop(&t[i]);
  drain_loop();
}

int main(int argc, char **argv) {
  ASSERT(sodium_init() >= 0);
  signal(SIGPIPE, SIG_IGN);
  self_exe = argv[0];
  test_moderator(0, &moderator);
  test_moderator(1, &moderator2);
  if (argc == 3 && strcmp(argv[1], "--peer") == 0)
    return peer_main(atoi(argv[2]));
  bee_log_set_level(getenv("BEE_TEST_VERBOSE") ? BEE_LOG_DEBUG : BEE_LOG_ERROR);
  uv_loop_t l;
  uv_loop_init(&l);
  loop = &l;
  test_rpc();
  test_up_close();
  test_dial_race();
  test_refusals();
  test_token_renewal();
  test_raw_attacks();
  test_conn_cap();
  test_tampered_frame();
  test_keepalive();
  test_ping_flood();
  test_stalled_peer();
  test_many();
  ASSERT_OK(uv_loop_close(loop));
  printf("transport: all checks passed\n");
  return 0;
}
