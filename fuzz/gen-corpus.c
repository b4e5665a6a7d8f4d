/* gen-corpus.c: writes the seed corpus of the fuzz targets.
 *
 *   gen-corpus DIR        (DIR is usually fuzz/corpus)
 *
 * Writes DIR/msg/, DIR/handshake/, DIR/token/, DIR/records/ and
 * DIR/groupmsg/: valid encodings made with the real encoders (so they
 * follow the format when it changes) and a few malformed ones.  The output is deterministic:
 * keys come from fixed seeds and Ed25519 signatures are deterministic, so
 * rerunning it after a format change gives a reviewable diff.  Built with
 * the fuzz targets; not run by the test suite.
 */
#include "proto-int.h"

#include <errno.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Must match fuzz-token.c. */
#define FUZZ_MODERATOR_SEED "beed fuzz moderator: not secret"
#define FUZZ_SWARM "fuzz"
#define FUZZ_NOW 1700000000u

static const char *root;

static void put(const char *target, const char *name, const void *p, size_t n) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", root, target);
  if (mkdir(path, 0755) < 0 && errno != EEXIST) {
    perror(path);
    exit(1);
  }
  snprintf(path, sizeof path, "%s/%s/%s", root, target, name);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(p, 1, n, f) != n || fclose(f) != 0) {
    perror(path);
    exit(1);
  }
}

#define PUT_LIT(target, name, lit) put(target, name, lit, sizeof(lit) - 1)

static void put_msg(const char *name, const proto_msg *m) {
  uint8_t buf[1024];
  size_t len;
  if (proto_msg_encode(m, buf, sizeof buf, &len) != 0) {
    fprintf(stderr, "gen-corpus: cannot encode %s\n", name);
    exit(1);
  }
  put("msg", name, buf, len);
}

static void gen_msg(void) {
  static const uint8_t data[] = "0123456789abcdef0123456789abcdef!";
  proto_bytes method = {(const uint8_t *)"dht.find", 8};
  proto_bytes body = {data, 33};
  put_msg("request", &(proto_msg){.type = PROTO_T_REQUEST,
                                  .id = 1,
                                  .name = method,
                                  .payload = body});
  put_msg("response",
          &(proto_msg){.type = PROTO_T_RESPONSE, .id = 1, .payload = body});
  put_msg("error", &(proto_msg){.type = PROTO_T_ERROR,
                                .id = UINT64_MAX,
                                .code = BEE_ENOMETHOD,
                                .payload = {(const uint8_t *)"no method", 9}});
  put_msg("cancel", &(proto_msg){.type = PROTO_T_CANCEL, .id = 300});
  put_msg("oneway", &(proto_msg){.type = PROTO_T_ONEWAY, .name = method});
  put_msg("stream-open", &(proto_msg){.type = PROTO_T_STREAM_OPEN,
                                      .id = 7,
                                      .name = {(const uint8_t *)"grad", 4},
                                      .offset = 1u << 20,
                                      .payload = body});
  put_msg("stream-chunk", &(proto_msg){.type = PROTO_T_STREAM_CHUNK,
                                       .id = 7,
                                       .offset = 65536,
                                       .payload = body});
  put_msg("stream-end",
          &(proto_msg){.type = PROTO_T_STREAM_END, .id = 7, .code = INT64_MIN});
  put_msg("ping", &(proto_msg){.type = PROTO_T_PING, .id = 0x12345678});
  put_msg("pong", &(proto_msg){.type = PROTO_T_PONG, .id = 0x12345678});
  put_msg("close", &(proto_msg){.type = PROTO_T_CLOSE,
                                .code = 0,
                                .payload = {(const uint8_t *)"bye", 3}});
  /* Valid but not minimal: a uint64 id of 4 and a str16 method. */
  PUT_LIT("msg", "wide-ints",
          "\x95\x01\x01\xcf\0\0\0\0\0\0\0\x04\xda\x00\x01m\xc5\x00\x00");
  PUT_LIT("msg", "bad-trailing", "\x93\x01\x04\x05\x00");
  PUT_LIT("msg", "bad-version", "\x93\x02\x04\x05");
  PUT_LIT("msg", "bad-count", "\xdd\xff\xff\xff\xff\x01\x04");
  PUT_LIT("msg", "bad-nested", "\x93\x01\x04\x91\x91\x91\x90");
}

static void put_hs(const char *name, uint8_t which, const uint8_t *p,
                   size_t n) {
  uint8_t buf[2048];
  buf[0] = which;
  memcpy(buf + 1, p, n);
  put("handshake", name, buf, n + 1);
}

static void gen_handshake(void) {
  uint8_t buf[2048], pk[32], sealed[200];
  size_t len;
  for (int i = 0; i < 32; i++)
    pk[i] = (uint8_t)(i * 37 + 5);
  memset(sealed, 0x5a, sizeof sealed);
  proto_hello h = {.swarm = {(const uint8_t *)FUZZ_SWARM, 4},
                   .purpose = PROTO_PURPOSE_CONTROL,
                   .ciphers = PROTO_CIPHERS_ALL,
                   .moderated = true};
  memcpy(h.eph_pk, pk, 32);
  if (proto__hello_encode(&h, buf, sizeof buf, &len) == 0)
    put_hs("hello", 0, buf, len);
  proto_auth_msg a = {.cipher = PROTO_CIPHER_XCHACHA20POLY1305,
                      .has_eph = true,
                      .sealed = {sealed, sizeof sealed}};
  memcpy(a.eph_pk, pk, 32);
  if (proto__auth_encode(&a, buf, sizeof buf, &len) == 0)
    put_hs("auth-responder", 1, buf, len);
  a = (proto_auth_msg){.sealed = {sealed, 48}};
  if (proto__auth_encode(&a, buf, sizeof buf, &len) == 0)
    put_hs("auth-initiator", 1, buf, len);
  proto_auth_inner in = {.token = {sealed, 120}};
  memcpy(in.id_pk, pk, 32);
  memset(in.sig, 0xee, sizeof in.sig);
  if (proto__auth_inner_encode(&in, buf, sizeof buf, &len) == 0)
    put_hs("auth-inner", 2, buf, len);
  in.token.n = 0;
  if (proto__auth_inner_encode(&in, buf, sizeof buf, &len) == 0)
    put_hs("auth-inner-open", 2, buf, len);
  if (proto__result_encode(BEE_ETOKEN_EXPIRED, "token expired", buf, sizeof buf,
                           &len) == 0)
    put_hs("result", 3, buf, len);
  PUT_LIT("handshake", "bad-hello-purpose",
          "\x00\x97\x01\x14\xa1s\x03\x03\xc3\xc4\x00");
  PUT_LIT("handshake", "bad-auth-cipher", "\x01\x95\x01\x15\x01\xc0\xc4\x00");
}

static void gen_token(void) {
  proto_identity mod, peer;
  uint8_t seed[crypto_sign_SEEDBYTES];
  crypto_sign_seed_keypair(mod.pk, mod.sk,
                           (const uint8_t *)FUZZ_MODERATOR_SEED);
  proto_peer_id(mod.pk, mod.id);
  memset(seed, 0x42, sizeof seed);
  crypto_sign_seed_keypair(peer.pk, peer.sk, seed);
  proto_token tok;
  if (proto_token_issue(&tok, &mod, FUZZ_SWARM, peer.pk, PROTO_ROLE_BEE,
                        FUZZ_NOW - 60, FUZZ_NOW + 86400) != 0) {
    fprintf(stderr, "gen-corpus: cannot issue a token\n");
    exit(1);
  }
  put("token", "token", tok.raw, tok.raw_len);
  put("token", "bad-token-cut", tok.raw, tok.raw_len - 1);

  proto_revocation rl;
  uint8_t *enc = NULL, key[PROTO_PK_BYTES];
  size_t len;
  proto_revocation_init(&rl);
  snprintf(rl.swarm, sizeof rl.swarm, "%s", FUZZ_SWARM);
  memcpy(rl.moderator_pk, mod.pk, PROTO_PK_BYTES);
  rl.seq = 3;
  rl.issued = FUZZ_NOW;
  if (proto_revocation_encode(&rl, &mod, &enc, &len) != 0)
    exit(1);
  put("token", "revocation-empty", enc, len);
  free(enc);
  for (int i = 0; i < 3; i++) {
    memset(key, 0x10 * (i + 1), sizeof key);
    proto_revocation_add(&rl, key);
  }
  proto_revocation_add(&rl, peer.pk);
  if (proto_revocation_encode(&rl, &mod, &enc, &len) != 0)
    exit(1);
  put("token", "revocation", enc, len);
  enc[len - 1] ^= 1; /* forged */
  put("token", "bad-revocation-sig", enc, len);
  free(enc);
  proto_revocation_close(&rl);
}

/* A records seed: the flags byte of fuzz-records.c (bit 0: owned subkey,
 * bit 1: the value's own key), then the value. */
static void put_rec(const char *name, uint8_t flags, const uint8_t *p,
                    size_t n) {
  static uint8_t buf[PROTO_LINKS_RECORD_MAX + 64];
  if (n + 1 > sizeof buf) {
    fprintf(stderr, "gen-corpus: %s too long\n", name);
    exit(1);
  }
  buf[0] = flags;
  memcpy(buf + 1, p, n);
  put("records", name, buf, n + 1);
}

static void must(int rc, const char *what) {
  if (rc) {
    fprintf(stderr, "gen-corpus: cannot encode %s: %s\n", what,
            bee_strerror(rc));
    exit(1);
  }
}

static void gen_records(void) {
  uint8_t buf[PROTO_RECORD_MAX + 32];
  size_t len;
  proto_progress p = {.epoch = 3,
                      .samples = 12800,
                      .samples_per_second = 512.5,
                      .time_ms = FUZZ_NOW * 1000ull,
                      .mode = PROTO_MODE_NODE};
  snprintf(p.run, sizeof p.run, "fuzz-run");
  snprintf(p.label, sizeof p.label, "gpu0 \xc3\xa9t\xc3\xa9");
  must(proto_progress_encode(&p, buf, sizeof buf, &len), "progress");
  put_rec("progress", 3, buf, len);
  put_rec("progress-plain-subkey", 2, buf, len);
  /* Two fields of a later version after the known ones. */
  buf[0] += 2;
  memcpy(buf + len, "\xa5later\x92\x01\xc0", 9);
  put_rec("progress-later", 3, buf, len + 9);
  /* Version 2: the byte after the 13-byte tag. */
  must(proto_progress_encode(&p, buf, sizeof buf, &len), "progress");
  buf[14] = 2;
  put_rec("bad-progress-version", 3, buf, len);

  proto_metrics m = {.step = 100,
                     .samples_per_second = 2048,
                     .compute_s = 1.5,
                     .averaging_s = 0.25,
                     .bytes_sent = 1u << 20,
                     .bytes_received = 1u << 20,
                     .group_size = 8,
                     .grad_sq_local = 0.5,
                     .batch_local = 64,
                     .grad_sq_avg = 0.125,
                     .batch_avg = 512,
                     .time_ms = FUZZ_NOW * 1000ull};
  snprintf(m.run, sizeof m.run, "fuzz-run");
  must(proto_metrics_encode(&m, buf, sizeof buf, &len), "metrics");
  put_rec("metrics-no-loss", 3, buf, len);
  m.has_loss = true;
  m.loss = 2.75;
  must(proto_metrics_encode(&m, buf, sizeof buf, &len), "metrics");
  put_rec("metrics", 3, buf, len);
  /* The optional fields: by_all, diverged, the hash, no lines, the loss
   * scale and the batches dropped. */
  m.has_by_all = true;
  m.by_all = 1;
  m.has_params = true;
  memset(m.params, 0x5a, sizeof m.params);
  m.has_loss_scale = true;
  m.loss_scale = 32768;
  m.dropped = 3;
  must(proto_metrics_encode(&m, buf, sizeof buf, &len), "metrics");
  put_rec("metrics-scaled", 3, buf, len);

  proto_match a = {.round = 41,
                   .mode = PROTO_MODE_CLIENT,
                   .bandwidth_mbit = 100,
                   .weight = 1};
  snprintf(a.run, sizeof a.run, "fuzz-run");
  snprintf(a.bits, sizeof a.bits, "0110");
  snprintf(a.addr, sizeof a.addr, "10.0.0.1:45555");
  memset(a.schema_hash, 0x5c, sizeof a.schema_hash);
  must(proto_match_encode(&a, buf, sizeof buf, &len), "match");
  put_rec("match", 3, buf, len);
  /* The weight (the last field) as a float32, then as NaN. */
  buf[len - 9] = 0xca;
  put_rec("bad-match-float32", 3, buf, len - 4);
  memcpy(buf + len - 9, "\xcb\x7f\xf8\0\0\0\0\0\0", 9);
  put_rec("bad-match-nan", 3, buf, len);
  a.bits[0] = 0;
  must(proto_match_encode(&a, buf, sizeof buf, &len), "match");
  put_rec("match-no-bits", 3, buf, len);

  proto_donor d = {.epoch = 3, .slots = PROTO_DONOR_SLOTS_MAX};
  snprintf(d.run, sizeof d.run, "fuzz-run");
  snprintf(d.addr, sizeof d.addr, "donor.example:45555");
  must(proto_donor_encode(&d, buf, sizeof buf, &len), "donor");
  put_rec("donor", 3, buf, len);
  put_rec("donor-other-key", 1, buf, len);

  static proto_links l = {.time_ms = FUZZ_NOW * 1000ull, .n = 3};
  static uint8_t lbuf[PROTO_LINKS_RECORD_MAX];
  snprintf(l.run, sizeof l.run, "fuzz-run");
  for (size_t i = 0; i < l.n; i++) {
    memset(l.links[i].id, (int)(0x31 + i), PROTO_ID_BYTES);
    l.links[i].rtt_us = 103000 * (i + 1);
    l.links[i].mbit = 60.5 * (double)i;
    l.links[i].age_s = i;
  }
  must(proto_links_encode(&l, lbuf, sizeof lbuf, &len), "links");
  put_rec("links", 3, lbuf, len);
  /* The first entry's id as the third's: a peer twice. */
  memcpy(lbuf + len - 1 - 9 - 5 - PROTO_ID_BYTES, l.links[0].id,
         PROTO_ID_BYTES);
  put_rec("bad-links-twice", 3, lbuf, len);

  /* Untyped: a revocation list's head, and a newer peer's type. */
  put_rec("plain-revocation-head", 3, (const uint8_t *)"\x92\x01\x1f", 3);
  static const uint8_t future[] = "\x92\xaa"
                                  "bee.future\x01";
  put_rec("plain-future-type", 3, future, sizeof future - 1);
}

static void put_group(const char *name, const proto_group_msg *m) {
  uint8_t buf[4096];
  size_t len;
  must(proto_group_encode(m, buf, sizeof buf, &len), name);
  put("groupmsg", name, buf, len);
}

static void gen_groupmsg(void) {
  uint8_t buf[4096];
  size_t len;
  proto_group_msg j = {.type = PROTO_T_AVG_JOIN,
                       .nonce = 0x1234,
                       .expiration = FUZZ_NOW + 5,
                       .info = {.round = 41,
                                .mode = PROTO_MODE_NODE,
                                .bandwidth_mbit = 100,
                                .weight = 32}};
  snprintf(j.info.run, sizeof j.info.run, "fuzz-run");
  snprintf(j.info.bits, sizeof j.info.bits, "0110");
  snprintf(j.info.addr, sizeof j.info.addr, "10.0.0.1:45555");
  memset(j.info.schema_hash, 0x5c, sizeof j.info.schema_hash);
  put_group("join", &j);
  /* The weight (the last field) as a float32. */
  must(proto_group_encode(&j, buf, sizeof buf, &len), "join");
  buf[len - 9] = 0xca;
  put("groupmsg", "bad-join-float32", buf, len - 4);
  /* A CLIENT declares no start. */
  j.expiration = 0;
  j.info.mode = PROTO_MODE_CLIENT;
  j.info.bits[0] = 0;
  put_group("join-client", &j);

  proto_group_msg r = {.type = PROTO_T_AVG_REPLY, .nonce = 0x1234};
  put_group("reply-accepted", &r);
  r.code = PROTO_JOIN_NOT_A_LEADER;
  r.has_leader = true;
  memset(r.leader, 0x33, sizeof r.leader);
  snprintf(r.leader_addr, sizeof r.leader_addr, "[2001:db8::1]:45555");
  put_group("reply-not-a-leader", &r);
  /* NOT_A_LEADER's leader with a nil address. */
  must(proto_group_encode(&r, buf, sizeof buf, &len), "reply");
  len -= 1 + strlen(r.leader_addr);
  buf[len++] = 0xc0;
  put("groupmsg", "bad-reply-no-addr", buf, len);

  proto_group_msg l = {.type = PROTO_T_AVG_LEAVE,
                       .code = PROTO_LEAVE_DISBANDED};
  put_group("leave-disbanded", &l);
  l.code = PROTO_LEAVE_MOVED;
  l.has_leader = true;
  memset(l.leader, 0x44, sizeof l.leader);
  snprintf(l.leader_addr, sizeof l.leader_addr, "leader.example:45555");
  put_group("leave-moved", &l);

  proto_group_member v[4] = {0};
  for (int i = 0; i < 4; i++) {
    memset(v[i].id, 0x10 + i, sizeof v[i].id);
    snprintf(v[i].addr, sizeof v[i].addr, "10.0.0.%d:45555", i + 1);
    v[i].mode = i == 3 ? PROTO_MODE_AUX : PROTO_MODE_NODE;
    v[i].bandwidth_mbit = 100.0 * (i + 1);
    v[i].weight = i == 3 ? 0 : 32;
  }
  proto_group_msg b = {
      .type = PROTO_T_AVG_BEGIN, .round = 41, .nmembers = 4, .members = v};
  memset(b.group, 0x5a, sizeof b.group);
  put_group("begin", &b);
  /* The last member's id made the first's: one id twice. */
  must(proto_group_encode(&b, buf, sizeof buf, &len), "begin");
  for (size_t i = 0; i + 22 <= len; i++)
    if (buf[i] == 0xc4 && buf[i + 1] == 20 && buf[i + 2] == 0x13)
      memset(buf + i + 2, 0x10, 20);
  put("groupmsg", "bad-begin-twice", buf, len);
  b.nmembers = 1;
  put_group("begin-one", &b);
}

/* DIR/statemsg/: a REQUEST, CHUNKs (middle, last, empty at the end) and
 * refused ones (len 0, data past total, a float where a uint goes). */
static void gen_statemsg(void) {
  uint8_t buf[4096], data[200];
  size_t len;
  for (size_t i = 0; i < sizeof data; i++)
    data[i] = (uint8_t)(i * 7);
  proto_state_msg q = {.type = PROTO_T_STATE_REQ, .offset = 1 << 20,
                       .len = 1 << 20};
  snprintf(q.run, sizeof q.run, "fuzz-run");
  must(proto_state_encode(&q, buf, sizeof buf, &len), "state req");
  put("statemsg", "req", buf, len);
  proto_state_msg c = {.type = PROTO_T_STATE_CHUNK, .epoch = 12,
                       .total = 1000, .offset = 400,
                       .data = {data, sizeof data}};
  snprintf(c.run, sizeof c.run, "fuzz-run");
  memset(c.checksum, 0xab, sizeof c.checksum);
  must(proto_state_encode(&c, buf, sizeof buf, &len), "state chunk");
  put("statemsg", "chunk", buf, len);
  c.offset = 800;
  must(proto_state_encode(&c, buf, sizeof buf, &len), "state last");
  put("statemsg", "chunk-last", buf, len);
  c.offset = 1000, c.data.n = 0;
  must(proto_state_encode(&c, buf, sizeof buf, &len), "state empty");
  put("statemsg", "chunk-empty", buf, len);
  /* Refused: the encoder will not write them, so patch valid bytes. */
  q.len = 1;
  must(proto_state_encode(&q, buf, sizeof buf, &len), "state req 1");
  buf[len - 1] = 0; /* len 0 */
  put("statemsg", "bad-req-len0", buf, len);
  c.offset = 900, c.data.n = 100;
  must(proto_state_encode(&c, buf, sizeof buf, &len), "state chunk 900");
  put("statemsg", "ok-chunk-900", buf, len);
}

/* DIR/localmsg/: one of each message, a HELLO of a small conv net with
 * its optimizer state and a buffer, and refused ones (a dimension 0, a
 * BATCH of 0 samples). */
static void gen_localmsg(void) {
  static uint8_t buf[8192];
  size_t len;
  proto_local_tensor t[] = {
      {{(const uint8_t *)"conv.weight", 11},
       PROTO_LOCAL_PARAM,
       0,
       4,
       {16, 1, 3, 3},
       144},
      {{(const uint8_t *)"conv.bias", 9}, PROTO_LOCAL_PARAM, 0, 1, {16}, 16},
      {{(const uint8_t *)"state.0.exp_avg", 15},
       PROTO_LOCAL_STATE,
       0,
       4,
       {16, 1, 3, 3},
       144},
      {{(const uint8_t *)"state.0.step", 12}, PROTO_LOCAL_STATE, 0, 0, {0}, 1},
      {{(const uint8_t *)"bn.running_var", 14},
       PROTO_LOCAL_BUFFER,
       0,
       1,
       {16},
       16},
  };
  proto_local_msg h = {
      .type = PROTO_T_LOCAL_HELLO, .batch = 64, .list = t, .n = 5};
  snprintf(h.run, sizeof h.run, "fuzz-run");
  must(proto_local_encode(&h, buf, sizeof buf, &len), "local hello");
  put("localmsg", "hello", buf, len);
  for (size_t i = 0; i + 2 < len; i++) /* [16] -> [0]: the bias's dims */
    if (buf[i] == 0x91 && buf[i + 1] == 16) {
      buf[i + 1] = 0;
      break;
    }
  put("localmsg", "bad-hello-dim0", buf, len);
  const proto_local_msg others[] = {
      {.type = PROTO_T_LOCAL_WELCOME,
       .epoch = 3,
       .loaded = true,
       .mode = PROTO_LOCAL_DILOCO,
       .target = 4096,
       .peers = 3,
       .inner_steps = 500,
       .outer_lr = 0.7,
       .outer_momentum = 0.9,
       .compression = "none"},
      {.type = PROTO_T_LOCAL_WELCOME,
       .mode = PROTO_LOCAL_GRADIENTS,
       .target = 4096,
       .peers = 2,
       .delayed = true,
       .compression = "b8"},
      {.type = PROTO_T_LOCAL_BATCH, .samples = 64, .loss = 0.5},
      {.type = PROTO_T_LOCAL_GO, .epoch = 3, .samples = 1024, .peers = 3},
      {.type = PROTO_T_LOCAL_STEP, .epoch = 3, .apply = true},
      {.type = PROTO_T_LOCAL_STEPPED, .epoch = 3},
      {.type = PROTO_T_LOCAL_LOADED, .epoch = 9},
      {.type = PROTO_T_LOCAL_BYE},
      {.type = PROTO_T_LOCAL_REFUSED, .code = BEE_ERANGE, .text = "no"},
      {.type = PROTO_T_LOCAL_EVAL, .epoch = 3, .loss = 0.4, .accuracy = 0.9},
  };
  const char *names[] = {
      "welcome", "welcome-delayed", "batch", "go",      "step",
      "stepped", "loaded",          "bye",   "refused", "eval"};
  for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
    must(proto_local_encode(&others[i], buf, sizeof buf, &len), names[i]);
    put("localmsg", names[i], buf, len);
  }
  must(proto_local_encode(&others[2], buf, sizeof buf, &len), "batch");
  buf[3] = 0; /* [1, 82, 0, loss]: no samples */
  put("localmsg", "bad-batch0", buf, len);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: gen-corpus DIR\n");
    return 2;
  }
  if (sodium_init() < 0)
    return 1;
  root = argv[1];
  gen_msg();
  gen_handshake();
  gen_token();
  gen_records();
  gen_groupmsg();
  gen_statemsg();
  gen_localmsg();
  return 0;
}
