/* test-proto-session.c: the handshake and sealed frames, without sockets.
 *
 * Two in-memory nodes run the handshake by passing frame bodies to each
 * other.  Every refusal class must fail on both sides with the right code
 * (the refused side learns the reason as BEE_EREMOTE), a flipped byte in
 * any handshake message must never yield a session, and sealed traffic
 * must reject tampering, replay and reordering.
 */
#include "proto.h"
#include "test.h"
#include "testlib.h"

#include <sodium.h>

#define NOW 1800000000ull
#define DAY 86400ull

typedef test_node node;

static proto_identity moderator, moderator2;

static void node_init(node *n, const char *swarm, int role, uint64_t expires) {
  test_node_init(n, &moderator, swarm, role, NOW - DAY, expires);
}

typedef struct result {
  int rc_i, rc_r;         /* final codes of initiator and responder */
  int remote_i, remote_r; /* codes each learned from the other */
  proto_peer peer_i, peer_r; /* what each learned of the other */
  proto_sealer tx_i, rx_i, tx_r, rx_r;
  size_t lens[4]; /* length of each message sent */
  bool done_i, done_r;
} result;

/* Runs a handshake; tamper_msg >= 0 flips bit 0 of byte tamper_pos of
 * that message (0 HELLO, 1 AUTH_R, 2 AUTH_I, 3 RESULT). */
static void run(const node *a, const node *b, int purpose, int tamper_msg,
                size_t tamper_pos, result *res) {
  proto_hs *hi = proto_hs_new(&a->auth, true, purpose, NOW);
  proto_hs *hr = proto_hs_new(&b->auth, false, 0, NOW);
  uint8_t buf[PROTO_HS_OUT_MAX], out[PROTO_HS_OUT_MAX];
  size_t len = 0, olen;
  bool done_i = false, done_r = false, done;
  int remote;
  memset(res, 0, sizeof *res);
  res->rc_i = proto_hs_step(hi, NULL, 0, buf, &len, &done, &remote);
  for (int msg = 0; len > 0 && !res->rc_i && !res->rc_r; msg++) {
    if (msg < 4)
      res->lens[msg] = len;
    if (msg == tamper_msg && tamper_pos < len)
      buf[tamper_pos] ^= 1;
    bool to_r = msg % 2 == 0;
    int rc = proto_hs_step(to_r ? hr : hi, buf, len, out, &olen, &done, &remote);
    if (to_r) {
      res->rc_r = rc, res->remote_r = remote, done_r = done;
    } else {
      res->rc_i = rc, res->remote_i = remote, done_i = done;
    }
    if (rc && olen) { /* deliver the verdict, then stop */
      int rc2 = proto_hs_step(to_r ? hi : hr, out, olen, buf, &len, &done, &remote);
      if (to_r)
        res->rc_i = rc2, res->remote_i = remote;
      else
        res->rc_r = rc2, res->remote_r = remote;
      break;
    }
    memcpy(buf, out, olen);
    len = olen;
  }
  res->done_i = done_i;
  res->done_r = done_r;
  if (done_i)
    ASSERT_OK(proto_hs_result(hi, &res->peer_i, &res->tx_i, &res->rx_i));
  if (done_r)
    ASSERT_OK(proto_hs_result(hr, &res->peer_r, &res->tx_r, &res->rx_r));
  if (!res->rc_i && !res->rc_r)
    ASSERT(done_i && done_r);
  proto_hs_free(hi);
  proto_hs_free(hr);
}

static void result_clear(result *r) {
  proto_sealer_clear(&r->tx_i);
  proto_sealer_clear(&r->rx_i);
  proto_sealer_clear(&r->tx_r);
  proto_sealer_clear(&r->rx_r);
}

/* Both sides fail: the refuser with code, the refused with BEE_EREMOTE
 * carrying code. */
static void expect_refusal(const node *a, const node *b, int purpose,
                           bool responder_refuses, int code) {
  result r;
  run(a, b, purpose, -1, 0, &r);
  if (responder_refuses) {
    ASSERT_RC(r.rc_r, code);
    ASSERT_RC(r.rc_i, BEE_EREMOTE);
    ASSERT_RC(r.remote_i, code);
  } else {
    ASSERT_RC(r.rc_i, code);
    ASSERT_RC(r.rc_r, BEE_EREMOTE);
    ASSERT_RC(r.remote_r, code);
  }
  result_clear(&r);
}

static void traffic(result *r) {
  uint8_t buf[256 + PROTO_TAG_BYTES], copy[sizeof buf];
  size_t plen;
  for (int i = 0; i < 3; i++) {
    memset(buf, 'a' + i, 256);
    ASSERT_OK(proto_seal(&r->tx_i, buf, 256));
    ASSERT(memcmp(buf, "aaaa", 4) != 0); /* it is encrypted */
    memcpy(copy, buf, sizeof buf);
    ASSERT_OK(proto_open(&r->rx_r, buf, sizeof buf, &plen));
    ASSERT_EQ(plen, 256);
    ASSERT_EQ(buf[17], 'a' + i);
    /* Replaying the same sealed body must fail. */
    ASSERT_RC(proto_open(&r->rx_r, copy, sizeof copy, &plen), BEE_EAUTH);
  }
}

static void test_ok(void) {
  node a, b;
  result r;
  node_init(&a, "test", PROTO_ROLE_BEE, NOW + DAY);
  node_init(&b, "test", PROTO_ROLE_AUX, NOW + DAY);
  run(&a, &b, PROTO_PURPOSE_CONTROL, -1, 0, &r);
  ASSERT_OK(r.rc_i);
  ASSERT_OK(r.rc_r);
  ASSERT_MEMEQ(r.peer_i.pk, b.id.pk, 32);
  ASSERT_MEMEQ(r.peer_r.pk, a.id.pk, 32);
  ASSERT_MEMEQ(r.peer_i.id, b.id.id, PROTO_ID_BYTES);
  ASSERT_EQ(r.peer_i.role, PROTO_ROLE_AUX);
  ASSERT_EQ(r.peer_r.role, PROTO_ROLE_BEE);
  ASSERT_EQ(r.peer_r.purpose, PROTO_PURPOSE_CONTROL);
  ASSERT_UEQ(r.peer_r.token_expires, NOW + DAY);
  ASSERT_EQ(r.peer_i.cipher, r.peer_r.cipher);
  if (crypto_aead_aes256gcm_is_available())
    ASSERT_EQ(r.peer_i.cipher, PROTO_CIPHER_AES256GCM);
  traffic(&r);
  /* And the other direction. */
  uint8_t buf[32 + PROTO_TAG_BYTES] = "hello";
  size_t plen;
  ASSERT_OK(proto_seal(&r.tx_r, buf, 32));
  ASSERT_OK(proto_open(&r.rx_i, buf, sizeof buf, &plen));
  ASSERT_STREQ((char *)buf, "hello");

  /* A second session between the same nodes has fresh keys. */
  result r2;
  run(&a, &b, PROTO_PURPOSE_BULK, -1, 0, &r2);
  ASSERT_OK(r2.rc_i);
  ASSERT_EQ(r2.peer_r.purpose, PROTO_PURPOSE_BULK);
  ASSERT(memcmp(r.tx_i.key, r2.tx_i.key, 32) != 0);

  /* Reordered bodies fail: seal two, open the second first. */
  uint8_t m1[8 + PROTO_TAG_BYTES] = "one", m2[8 + PROTO_TAG_BYTES] = "two";
  ASSERT_OK(proto_seal(&r2.tx_i, m1, 8));
  ASSERT_OK(proto_seal(&r2.tx_i, m2, 8));
  ASSERT_RC(proto_open(&r2.rx_r, m2, sizeof m2, &plen), BEE_EAUTH);
  /* A flipped bit fails. */
  m1[3] ^= 0x10;
  ASSERT_RC(proto_open(&r2.rx_r, m1, sizeof m1, &plen), BEE_EAUTH);
  /* Too short to hold a tag. */
  ASSERT_RC(proto_open(&r2.rx_r, m1, 5, &plen), BEE_EAUTH);
  result_clear(&r);
  result_clear(&r2);
}

static void test_xchacha(void) {
  node a, b;
  result r;
  node_init(&a, "test", PROTO_ROLE_BEE, NOW + DAY);
  node_init(&b, "test", PROTO_ROLE_BEE, NOW + DAY);
  b.auth.ciphers = PROTO_CIPHER_XCHACHA20POLY1305;
  run(&a, &b, PROTO_PURPOSE_CONTROL, -1, 0, &r);
  ASSERT_OK(r.rc_i);
  ASSERT_EQ(r.peer_i.cipher, PROTO_CIPHER_XCHACHA20POLY1305);
  traffic(&r);
  result_clear(&r);
  if (crypto_aead_aes256gcm_is_available()) {
    a.auth.ciphers = PROTO_CIPHER_AES256GCM;
    expect_refusal(&a, &b, PROTO_PURPOSE_CONTROL, true, BEE_ECIPHER);
  }
}

static void test_open_swarm(void) {
  node a, b;
  result r;
  node_init(&a, "test", PROTO_ROLE_BEE, NOW + DAY);
  node_init(&b, "test", PROTO_ROLE_BEE, NOW + DAY);
  a.auth.moderator_pk = b.auth.moderator_pk = NULL;
  a.auth.token = b.auth.token = NULL;
  run(&a, &b, PROTO_PURPOSE_CONTROL, -1, 0, &r);
  ASSERT_OK(r.rc_i);
  ASSERT_OK(r.rc_r);
  ASSERT_EQ(r.peer_i.role, PROTO_ROLE_BEE);
  result_clear(&r);
  /* Open meets moderated, either way round. */
  node_init(&b, "test", PROTO_ROLE_BEE, NOW + DAY);
  expect_refusal(&a, &b, PROTO_PURPOSE_CONTROL, true, BEE_EOPEN_MISMATCH);
  expect_refusal(&b, &a, PROTO_PURPOSE_CONTROL, true, BEE_EOPEN_MISMATCH);
}

static void test_refusals(void) {
  node a, b, c;
  node_init(&a, "test", PROTO_ROLE_BEE, NOW + DAY);
  node_init(&b, "test", PROTO_ROLE_BEE, NOW + DAY);

  /* Another swarm name in the HELLO. */
  c = a;
  test_node_rebind(&c);
  c.auth.swarm = "other";
  expect_refusal(&c, &b, PROTO_PURPOSE_CONTROL, true, BEE_ETOKEN_SWARM);

  /* Initiator's token expired: the responder refuses. */
  node_init(&c, "test", PROTO_ROLE_BEE, NOW - 10);
  expect_refusal(&c, &b, PROTO_PURPOSE_CONTROL, true, BEE_ETOKEN_EXPIRED);
  /* Responder's token expired: the initiator refuses. */
  expect_refusal(&b, &c, PROTO_PURPOSE_CONTROL, false, BEE_ETOKEN_EXPIRED);

  /* Token issued for another swarm by the right moderator. */
  node_init(&c, "elsewhere", PROTO_ROLE_BEE, NOW + DAY);
  expect_refusal(&c, &b, PROTO_PURPOSE_CONTROL, true, BEE_ETOKEN_SWARM);

  /* Forged: a signature byte flipped. */
  node_init(&c, "test", PROTO_ROLE_BEE, NOW + DAY);
  c.tok.raw[c.tok.raw_len - 1] ^= 1;
  expect_refusal(&c, &b, PROTO_PURPOSE_CONTROL, true, BEE_ETOKEN_FORGED);

  /* Someone else's token. */
  node_init(&c, "test", PROTO_ROLE_BEE, NOW + DAY);
  c.tok = a.tok;
  expect_refusal(&c, &b, PROTO_PURPOSE_CONTROL, true, BEE_ETOKEN_PEER);

  /* Signed by another moderator. */
  node_init(&c, "test", PROTO_ROLE_BEE, NOW + DAY);
  ASSERT_OK(proto_token_issue(&c.tok, &moderator2, "test", c.id.pk,
                              PROTO_ROLE_BEE, NOW, NOW + DAY));
  expect_refusal(&c, &b, PROTO_PURPOSE_CONTROL, true, BEE_ETOKEN_MODERATOR);

  /* A monitor may talk but not open bulk connections. */
  node_init(&c, "test", PROTO_ROLE_MONITOR, NOW + DAY);
  result r;
  run(&c, &b, PROTO_PURPOSE_CONTROL, -1, 0, &r);
  ASSERT_OK(r.rc_r);
  ASSERT_EQ(r.peer_r.role, PROTO_ROLE_MONITOR);
  result_clear(&r);
  expect_refusal(&c, &b, PROTO_PURPOSE_BULK, true, BEE_ETOKEN_ROLE);

  /* Revoked. */
  proto_revocation rl;
  proto_revocation_init(&rl);
  ASSERT_OK(proto_revocation_add(&rl, a.id.pk));
  b.auth.revoked = &rl;
  expect_refusal(&a, &b, PROTO_PURPOSE_CONTROL, true, BEE_EREVOKED);
  b.auth.revoked = NULL;
  proto_revocation_close(&rl);

  /* Talking to ourselves. */
  run(&a, &a, PROTO_PURPOSE_CONTROL, -1, 0, &r);
  ASSERT(r.rc_i == BEE_ESELF || r.rc_r == BEE_ESELF);
  ASSERT(r.rc_i != 0 && r.rc_r != 0);
  result_clear(&r);
}

/* Flipping any one byte of any handshake message never yields a session
 * (the RESULT is the last message, so there only the initiator fails). */
static void test_tamper(void) {
  node a, b;
  result clean;
  node_init(&a, "test", PROTO_ROLE_BEE, NOW + DAY);
  node_init(&b, "test", PROTO_ROLE_BEE, NOW + DAY);
  run(&a, &b, PROTO_PURPOSE_CONTROL, -1, 0, &clean);
  ASSERT_OK(clean.rc_i);
  result_clear(&clean);
  size_t tried = 0;
  for (int msg = 0; msg < 4; msg++) {
    ASSERT_GT(clean.lens[msg], 0);
    for (size_t pos = 0; pos < clean.lens[msg]; pos += 3, tried++) {
      result r;
      run(&a, &b, PROTO_PURPOSE_CONTROL, msg, pos, &r);
      if (r.done_i)
        FAIL("flip in message %d at byte %zu gave a session", msg, pos);
      ASSERT(r.rc_i != 0 || r.rc_r != 0);
      result_clear(&r);
    }
  }
  ASSERT_GT(tried, 150); /* every third byte of ~700 */
}

/* A recorded AUTH from one session replayed into another fails. */
static void test_replay(void) {
  node a, b;
  node_init(&a, "test", PROTO_ROLE_BEE, NOW + DAY);
  node_init(&b, "test", PROTO_ROLE_BEE, NOW + DAY);
  uint8_t hello[PROTO_HS_OUT_MAX], auth_r[PROTO_HS_OUT_MAX],
      auth_i[PROTO_HS_OUT_MAX], out[PROTO_HS_OUT_MAX];
  size_t hl, arl, ail, ol;
  bool done;
  int remote;
  proto_hs *hi = proto_hs_new(&a.auth, true, PROTO_PURPOSE_CONTROL, NOW);
  proto_hs *hr = proto_hs_new(&b.auth, false, 0, NOW);
  ASSERT_OK(proto_hs_step(hi, NULL, 0, hello, &hl, &done, &remote));
  ASSERT_OK(proto_hs_step(hr, hello, hl, auth_r, &arl, &done, &remote));
  ASSERT_OK(proto_hs_step(hi, auth_r, arl, auth_i, &ail, &done, &remote));
  proto_hs_free(hr);
  /* An attacker replays the same HELLO and AUTH_I to a new responder. */
  hr = proto_hs_new(&b.auth, false, 0, NOW);
  ASSERT_OK(proto_hs_step(hr, hello, hl, out, &ol, &done, &remote));
  ASSERT_RC(proto_hs_step(hr, auth_i, ail, out, &ol, &done, &remote), BEE_EAUTH);
  ASSERT(!done);
  /* Steps after failure are refused. */
  ASSERT_RC(proto_hs_step(hr, auth_i, ail, out, &ol, &done, &remote), BEE_ECLOSED);
  proto_hs_free(hr);
  proto_hs_free(hi);
}

/* A plaintext "welcome" where AUTH is due is refused, not waited on, and
 * peer text reaches logs only as printable ASCII. */
static void test_plain_welcome(void) {
  node a;
  node_init(&a, "test", PROTO_ROLE_BEE, NOW + DAY);
  uint8_t out[PROTO_HS_OUT_MAX];
  size_t ol;
  bool done;
  int remote;
  proto_hs *hi = proto_hs_new(&a.auth, true, PROTO_PURPOSE_CONTROL, NOW);
  ASSERT_OK(proto_hs_step(hi, NULL, 0, out, &ol, &done, &remote));
  /* [1, 22, 0, "welcome"] */
  const uint8_t welcome[] = {0x94, 1, 22, 0, 0xa7, 'w', 'e', 'l', 'c', 'o', 'm', 'e'};
  ASSERT_RC(proto_hs_step(hi, welcome, sizeof welcome, out, &ol, &done, &remote),
            BEE_ETYPE);
  ASSERT(!done);
  proto_hs_free(hi);
  /* A refusal whose text tries to forge a log line. */
  hi = proto_hs_new(&a.auth, true, PROTO_PURPOSE_CONTROL, NOW);
  ASSERT_OK(proto_hs_step(hi, NULL, 0, out, &ol, &done, &remote));
  const uint8_t evil[] = {0x94, 1, 22, 0xd0, 0x80, 0xa6, 'x', '\n', 'E', 0x1b, '[', 'J'};
  ASSERT_RC(proto_hs_step(hi, evil, sizeof evil, out, &ol, &done, &remote),
            BEE_EREMOTE);
  ASSERT_STREQ(proto_hs_remote_text(hi), "x?E?[J");
  proto_hs_free(hi);
  char buf[8];
  ASSERT_STREQ(bee_printable("ab\r\ncd\x7f", 7, buf, sizeof buf), "ab??cd?");
  ASSERT_STREQ(bee_printable("0123456789", 10, buf, sizeof buf), "0123456");
}

/* Garbage and truncated handshake frames fail cleanly. */
static void test_garbage(void) {
  node b;
  node_init(&b, "test", PROTO_ROLE_BEE, NOW + DAY);
  uint8_t junk[600], out[PROTO_HS_OUT_MAX];
  size_t ol;
  bool done;
  int remote;
  for (int i = 0; i < 2000; i++) {
    size_t n = (size_t)(randombytes_uniform(sizeof junk) + 1);
    randombytes_buf(junk, n);
    if (i % 3 == 0) /* looks like a message head */
      junk[0] = 0x97, junk[1] = 1, junk[2] = 20;
    proto_hs *hr = proto_hs_new(&b.auth, false, 0, NOW);
    int rc = proto_hs_step(hr, junk, n, out, &ol, &done, &remote);
    ASSERT(rc != 0);
    ASSERT(!done);
    proto_hs_free(hr);
  }
}

int main(void) {
  ASSERT(sodium_init() >= 0);
  test_moderator(0, &moderator);
  test_moderator(1, &moderator2);
  test_ok();
  test_xchacha();
  test_open_swarm();
  test_refusals();
  test_tamper();
  test_replay();
  test_plain_welcome();
  test_garbage();
  printf("session: all checks passed\n");
  return 0;
}
