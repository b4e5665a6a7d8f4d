/* testlib.c: shared fixtures for the proto tests (see testlib.h). */
#include "testlib.h"
#include "test.h"

#include <sodium.h>

void test_moderator(int n, proto_identity *out) {
  uint8_t seed[32];
  memset(seed, 0x42 + n, sizeof seed);
  crypto_sign_seed_keypair(out->pk, out->sk, seed);
  proto_peer_id(out->pk, out->id);
}

void test_node_rebind(test_node *t) {
  t->auth.id = &t->id;
  t->auth.token = &t->tok;
  t->auth.moderator_pk = t->mod_pk;
}

void test_node_init(test_node *t, const proto_identity *moderator,
                    const char *swarm, int role, uint64_t issued,
                    uint64_t expires) {
  memset(t, 0, sizeof *t);
  proto_identity_generate(&t->id);
  ASSERT_OK(proto_token_issue(&t->tok, moderator, swarm, t->id.pk, role,
                              issued, expires));
  memcpy(t->mod_pk, moderator->pk, PROTO_PK_BYTES);
  test_node_rebind(t);
  t->auth.swarm = "test";
  t->auth.accept_roles = PROTO_ROLES_ALL;
  t->auth.accept_bulk_roles = PROTO_ROLE_BEE | PROTO_ROLE_AUX;
  t->auth.ciphers = PROTO_CIPHERS_ALL;
}

typedef struct waiter {
  bool (*done)(void *);
  void *arg;
  uint64_t deadline;
  bool met;
} waiter;

static void poll_cb(uv_timer_t *t) {
  waiter *w = t->data;
  if (w->done(w->arg))
    w->met = true;
  if (w->met || uv_now(t->loop) >= w->deadline)
    uv_stop(t->loop);
}

bool test_run_until(uv_loop_t *loop, bool (*done)(void *arg), void *arg,
                    uint64_t timeout_ms) {
  waiter w = {done, arg, uv_now(loop) + timeout_ms, false};
  uv_timer_t t;
  if (done(arg))
    return true;
  uv_timer_init(loop, &t);
  t.data = &w;
  uv_timer_start(&t, poll_cb, 5, 5);
  uv_run(loop, UV_RUN_DEFAULT);
  uv_close((uv_handle_t *)&t, NULL);
  uv_run(loop, UV_RUN_NOWAIT);
  return w.met;
}
