/* test-proto-rtt.c: the round trip a connection measures.
 *
 * Two hosts on one loop talk through a relay in this process that holds
 * every chunk of bytes for D ms in each direction, so the path's round
 * trip is 2 D plus a little (less a loop timer's millisecond).
 * proto_conn_rtt_ms must say so on both ends after the handshake (the
 * averager sizes its window from it), and say much less on a direct
 * loopback connection.
 */
#include "proto.h"
#include "test.h"
#include "testlib.h"

#include <arpa/inet.h>
#include <stdlib.h>
#include <time.h>

#define DELAY_MS 40

static uv_loop_t *loop;

/* ---- a delaying relay -------------------------------------------------- */

typedef struct chunk {
  struct chunk *next;
  uint64_t due;
  size_t len;
  char data[];
} chunk;

typedef struct side {
  uv_tcp_t tcp;
  struct side *peer;
  chunk *head, **tail; /* what waits to be written to this side */
  uv_timer_t timer;
  bool open;
} side;

typedef struct relay {
  uv_tcp_t listener;
  int port, target;
  side in, out; /* in: the dialler; out: the real server */
} relay;

static relay rl;

static void flush(uv_timer_t *t);

static void arm(side *s) {
  if (s->head)
    uv_timer_start(
        &s->timer, flush,
        s->head->due > uv_now(loop) ? s->head->due - uv_now(loop) : 0, 0);
}

static void written(uv_write_t *w, int status) {
  (void)status;
  free(w->data);
  free(w);
}

static void flush(uv_timer_t *t) {
  side *s = t->data;
  while (s->head && s->head->due <= uv_now(loop)) {
    chunk *c = s->head;
    s->head = c->next;
    if (!s->head)
      s->tail = &s->head;
    uv_write_t *w = malloc(sizeof *w);
    ASSERT(w);
    w->data = c;
    uv_buf_t b = uv_buf_init(c->data, (unsigned)c->len);
    if (!s->open || uv_write(w, (uv_stream_t *)&s->tcp, &b, 1, written) != 0) {
      free(c);
      free(w);
    }
  }
  arm(s);
}

static void alloc_cb(uv_handle_t *h, size_t size, uv_buf_t *b) {
  (void)h;
  b->base = malloc(size);
  b->len = b->base ? size : 0;
}

/* Bytes read on one side wait DELAY_MS, then go to the other. */
static void read_cb(uv_stream_t *st, ssize_t n, const uv_buf_t *b) {
  side *from = st->data, *to = from->peer;
  if (n > 0) {
    chunk *c = malloc(sizeof *c + (size_t)n);
    ASSERT(c);
    c->next = NULL;
    c->due = uv_now(loop) + DELAY_MS;
    c->len = (size_t)n;
    memcpy(c->data, b->base, (size_t)n);
    *to->tail = c;
    to->tail = &c->next;
    arm(to);
  } else if (n < 0) {
    from->open = false;
    uv_read_stop(st);
  }
  free(b->base);
}

static void side_init(side *s, side *peer) {
  uv_tcp_init(loop, &s->tcp);
  s->tcp.data = s;
  s->peer = peer;
  s->tail = &s->head;
  uv_timer_init(loop, &s->timer);
  s->timer.data = s;
}

static void out_connected(uv_connect_t *req, int status) {
  ASSERT_EQ(status, 0);
  rl.out.open = true;
  uv_read_start((uv_stream_t *)&rl.out.tcp, alloc_cb, read_cb);
  uv_read_start((uv_stream_t *)&rl.in.tcp, alloc_cb, read_cb);
  free(req);
}

static void on_accept(uv_stream_t *server, int status) {
  ASSERT_EQ(status, 0);
  ASSERT_EQ(uv_accept(server, (uv_stream_t *)&rl.in.tcp), 0);
  rl.in.open = true;
  struct sockaddr_in a;
  uv_ip4_addr("127.0.0.1", rl.target, &a);
  uv_connect_t *req = malloc(sizeof *req);
  ASSERT(req);
  ASSERT_EQ(
      uv_tcp_connect(req, &rl.out.tcp, (struct sockaddr *)&a, out_connected),
      0);
}

static void relay_start(int target) {
  memset(&rl, 0, sizeof rl);
  rl.target = target;
  side_init(&rl.in, &rl.out);
  side_init(&rl.out, &rl.in);
  uv_tcp_init(loop, &rl.listener);
  struct sockaddr_in a;
  uv_ip4_addr("127.0.0.1", 0, &a);
  ASSERT_EQ(uv_tcp_bind(&rl.listener, (struct sockaddr *)&a, 0), 0);
  ASSERT_EQ(uv_listen((uv_stream_t *)&rl.listener, 4, on_accept), 0);
  struct sockaddr_storage ss;
  int len = sizeof ss;
  uv_tcp_getsockname(&rl.listener, (struct sockaddr *)&ss, &len);
  rl.port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
}

static void side_close(side *s) {
  while (s->head) {
    chunk *c = s->head;
    s->head = c->next;
    free(c);
  }
  uv_close((uv_handle_t *)&s->tcp, NULL);
  uv_close((uv_handle_t *)&s->timer, NULL);
}

/* ---- the test ---------------------------------------------------------- */

typedef struct up {
  proto_conn *c;
  int status;
  bool done;
} up;

static proto_conn *server_conn;

static void server_up(proto_conn *c, int status, void *data) {
  (void)data;
  if (status == 0)
    server_conn = c;
}

static void connected(proto_host *h, proto_conn *c, int status, void *arg) {
  up *u = arg;
  (void)h;
  u->c = c;
  u->status = status;
  u->done = true;
}

static bool is_done(void *arg) { return ((up *)arg)->done; }

static proto_host *host_new(test_node *t, proto_identity *mod, proto_conn_cb cb,
                            int *port) {
  uint64_t now = (uint64_t)time(NULL);
  test_node_init(t, mod, "test", PROTO_ROLE_BEE, now - 60, now + 3600);
  proto_host_config hc;
  proto_host_config_default(&hc);
  hc.loop = loop;
  hc.auth = t->auth;
  hc.on_up = cb;
  proto_host *h;
  ASSERT_RC(proto_host_new(&hc, &h), 0);
  if (port)
    ASSERT_RC(proto_host_listen(h, "127.0.0.1:0", port), 0);
  return h;
}

int main(void) {
  loop = uv_default_loop();
  proto_identity mod;
  test_moderator(0, &mod);
  static test_node ta, tb;
  int port;
  proto_host *server = host_new(&ta, &mod, server_up, &port);
  proto_host *client = host_new(&tb, &mod, NULL, NULL);

  /* Direct: well under the relay's (0 when under a millisecond, as on an
   * idle machine; a loaded one may take a few). */
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
  up u = {0};
  ASSERT_RC(proto_host_connect(client, addr, PROTO_PURPOSE_BULK, connected, &u),
            0);
  ASSERT(test_run_until(loop, is_done, &u, 5000));
  ASSERT_RC(u.status, 0);
  uint64_t direct = proto_conn_rtt_ms(u.c);
  ASSERT_LT(direct, DELAY_MS);
  proto_conn_close(u.c, 0, "done");

  /* Through the relay: 2 x DELAY_MS each way round, on both ends. */
  relay_start(port);
  server_conn = NULL;
  snprintf(addr, sizeof addr, "127.0.0.1:%d", rl.port);
  u = (up){0};
  ASSERT_RC(proto_host_connect(client, addr, PROTO_PURPOSE_BULK, connected, &u),
            0);
  ASSERT(test_run_until(loop, is_done, &u, 10000));
  ASSERT_RC(u.status, 0);
  /* The relay holds data with loop timers, on the loop's millisecond
   * clock (cached at the turn's start), which may let it go up to a
   * millisecond early against the high-resolution clock round trips are
   * timed with: 2 ms of slack over the two holds. */
  uint64_t mine = proto_conn_rtt_ms(u.c);
  ASSERT_GE(mine, 2 * DELAY_MS - 2);
  ASSERT_LT(mine, 2 * DELAY_MS + 60);
  ASSERT(server_conn);
  uint64_t theirs = proto_conn_rtt_ms(server_conn);
  ASSERT_GE(theirs, 2 * DELAY_MS - 2);
  ASSERT_LT(theirs, 2 * DELAY_MS + 60);
  printf("rtt: direct %" PRIu64 " ms; through a relay holding %d ms each "
         "way: %" PRIu64 " ms at the dialler, %" PRIu64 " ms at the "
         "listener\n",
         direct, DELAY_MS, mine, theirs);

  proto_host_close(client);
  proto_host_close(server);
  side_close(&rl.in);
  side_close(&rl.out);
  uv_close((uv_handle_t *)&rl.listener, NULL);
  uv_run(loop, UV_RUN_DEFAULT);
  return 0;
}
