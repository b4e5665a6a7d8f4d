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
  ASSERT_OK(proto_token_issue(&t->tok, moderator, swarm, t->id.pk, role, issued,
                              expires));
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

uint8_t test_hb[TEST_HB_MAX];
size_t test_hn;

void hb_byte(uint8_t b) {
  ASSERT(test_hn < sizeof test_hb);
  test_hb[test_hn++] = b;
}

void hb_be(uint64_t v, int n) {
  for (int i = n - 1; i >= 0; i--)
    hb_byte((uint8_t)(v >> (8 * i)));
}

void hb_raw(const void *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    hb_byte(((const uint8_t *)p)[i]);
}

void hb_arr(size_t n) { hb_byte(0xdc), hb_be(n, 2); }

void hb_uint(uint64_t v) { hb_byte(0xcf), hb_be(v, 8); }

void hb_f64(double v) {
  uint64_t bits;
  memcpy(&bits, &v, sizeof bits);
  hb_byte(0xcb), hb_be(bits, 8);
}

void hb_fill(bool bin, size_t n, uint8_t fill) {
  hb_byte(bin ? 0xc5 : 0xda), hb_be(n, 2);
  for (size_t i = 0; i < n; i++)
    hb_byte(fill);
}

void hb_str(const char *s) {
  size_t n = strlen(s);
  hb_byte(0xda), hb_be(n, 2), hb_raw(s, n);
}

size_t test_unhex(const char *h, uint8_t *out) {
  size_t n = 0;
  for (; *h; h++) {
    if (*h == ' ')
      continue;
    unsigned v;
    ASSERT(sscanf(h, "%2x", &v) == 1);
    out[n++] = (uint8_t)v;
    h++;
  }
  return n;
}

uint64_t test_rng_next(uint64_t *s) {
  *s ^= *s >> 12, *s ^= *s << 25, *s ^= *s >> 27;
  return *s * 2685821657736338717u;
}

double test_rng_unit(uint64_t *s) {
  return (double)(test_rng_next(s) >> 11) * 0x1p-53;
}

uint64_t test_rng_below(uint64_t *s, uint64_t n) {
  return n ? test_rng_next(s) % n : 0;
}
