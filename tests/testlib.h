/* testlib.h: shared fixtures for the proto tests: a moderator that is the
 * same in every test process, and nodes with an identity, a token and the
 * proto_auth that uses them; plus a loop helper for transport tests. */
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

#endif
