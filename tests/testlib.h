/* testlib.h: shared fixtures for the proto tests: a moderator that is the
 * same in every test process, and nodes with an identity, a token and the
 * proto_auth that uses them; a loop helper for transport tests; and a writer
 * of hand-built msgpack for the decoder tests. */
#ifndef BEE_TESTLIB_H
#define BEE_TESTLIB_H

#include "proto.h"

typedef struct test_node {
  proto_identity id;
  proto_token tok;
  proto_auth auth;
  uint8_t mod_pk[PROTO_PK_BYTES];
} test_node;

/* The test moderator, derived from a fixed seed (n selects one of a few),
 * so child processes agree with their parent without sharing files. */
void test_moderator(int n, proto_identity *out);
/* A fresh node in swarm "test" whose token (from moderator) names swarm,
 * role and the validity window. */
void test_node_init(test_node *t, const proto_identity *moderator,
                    const char *swarm, int role, uint64_t issued,
                    uint64_t expires);
/* Points t->auth at t's own fields again (after copying a test_node). */
void test_node_rebind(test_node *t);

/* Runs loop until done(arg) is true or timeout_ms passes; returns done. */
bool test_run_until(uv_loop_t *loop, bool (*done)(void *arg), void *arg,
                    uint64_t timeout_ms);

/* Hand-built msgpack: values the encoders refuse to write, for the decoder
 * tests.  The hb_ writers append to test_hb and count in test_hn; a test
 * sets test_hn to 0 to start a new value and may patch the bytes in place.
 * Counts and lengths take 16-bit headers and integers 8-byte ones (the
 * decoders accept any width).  Writing past the buffer fails the test. */
#define TEST_HB_MAX (1u << 19) /* bytes; the largest user is groupmsg */
extern uint8_t test_hb[TEST_HB_MAX];
extern size_t test_hn;
void hb_byte(uint8_t b);
/* The low n bytes of v, big-endian. */
void hb_be(uint64_t v, int n);
void hb_raw(const void *p, size_t n);
/* An array header (0xdc) for n items. */
void hb_arr(size_t n);
/* A uint64 (0xcf), whatever its value. */
void hb_uint(uint64_t v);
void hb_f64(double v);
/* A str16 (bin16 when bin is set) of n bytes, each fill. */
void hb_fill(bool bin, size_t n, uint8_t fill);
/* A str16 holding the C string s. */
void hb_str(const char *s);

/* Bytes from hex digits in pairs, spaces between pairs ignored ("98 01
 * 3c"); returns how many went to out. */
size_t test_unhex(const char *hex, uint8_t *out);

/* xorshift64*: the tests' seeded randomness.  *s must not be 0. */
uint64_t test_rng_next(uint64_t *s);
/* Uniform in [0, 1) with 53 bits. */
double test_rng_unit(uint64_t *s);
/* Uniform in [0, n); 0 when n is 0. */
uint64_t test_rng_below(uint64_t *s, uint64_t n);

#endif
