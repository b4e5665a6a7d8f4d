/* test-dht-limits.c: what one DHT node refuses, and that it keeps serving.
 *
 * A single node on a fake clock is sent STORE requests as a peer would
 * send them (encoded payloads through dht_node_handle): records that are
 * expired, too far in the future, stale, forged, over the value size,
 * over the keys, subkeys, bytes-per-key and total-storage limits, and a
 * flood from one peer.  Each must be refused with its reason, nothing it
 * refused may be stored, and the node must go on answering other peers.
 */
#include "dht.h"
#include "test.h"
#include "testlib.h"

#include <sodium.h>

#define EPOCH 1800000000ull

static uint64_t now_ms = 1000000;
static uint64_t wall_ms(void) { return EPOCH * 1000 + now_ms; }
static uint64_t io_now(void *ctx) { (void)ctx; return now_ms; }
static uint64_t io_wall(void *ctx) { (void)ctx; return wall_ms() / 1000; }
static void io_random(void *ctx, void *buf, size_t n) {
  (void)ctx;
  randombytes_buf(buf, n);
}
static int io_send(void *ctx, const uint8_t *id, const char *addr,
                   const char *method, const uint8_t *payload, size_t len,
                   uint64_t timeout_ms, uint64_t req) {
  (void)ctx, (void)id, (void)addr, (void)method, (void)payload, (void)len,
      (void)timeout_ms, (void)req;
  return 0; /* requests of the node itself go nowhere here */
}

static dht_node *node;
static proto_identity self, peer, other;
static proto_dht_msg req, ans;
static uint8_t *buf, *out;

static uint8_t value[PROTO_DHT_VALUE_MAX];

static void record(proto_dht_record *r, const char *key, proto_bytes subkey,
                   size_t value_n, uint64_t expires_in_s) {
  memset(r, 0, sizeof *r);
  dht_key(key, r->key);
  r->subkey = subkey;
  r->value = (proto_bytes){value, value_n};
  r->expiration = wall_ms() / 1000 + expires_in_s;
}

/* Sends req from `from` and decodes the answer into ans.  Returns the
 * handler's own result (nonzero: the whole request was refused). */
static int send_from(const proto_identity *from) {
  size_t len, olen;
  req.port = 45555;
  req.now = wall_ms() / 1000;
  ASSERT_OK(proto_dht_encode(&req, buf, DHT_ANSWER_MAX, &len));
  int rc = dht_node_handle(node, from->id, "10.0.0.9", req.type == PROTO_T_DHT_STORE
                                                          ? DHT_METHOD_STORE
                                                          : DHT_METHOD_FIND,
                           buf, len, out, DHT_ANSWER_MAX, &olen);
  if (rc == 0)
    ASSERT_OK(proto_dht_decode(out, olen, &ans));
  return rc;
}

/* Stores one record from `from`; returns its per-record result. */
static int store1(const proto_identity *from, const proto_dht_record *r) {
  req.type = PROTO_T_DHT_STORE;
  req.nrecords = 1;
  req.records[0] = *r;
  ASSERT_OK(send_from(from));
  ASSERT_EQ(ans.nresults, 1);
  return ans.results[0];
}

static size_t held(const char *key) {
  uint8_t k[PROTO_DHT_KEY_BYTES];
  dht_value v;
  dht_key(key, k);
  dht_node_local_get(node, k, &v);
  return v.n;
}

/* A node of the given limits; the old one is freed. */
static void fresh_node(size_t keys_max, size_t storage_max, unsigned rate) {
  dht_config cfg;
  dht_config_default(&cfg);
  cfg.id = &self;
  cfg.port = 45555;
  cfg.keys_max = keys_max;
  cfg.storage_max = storage_max;
  cfg.peer_stores_per_s = rate;
  dht_io io = {.now_ms = io_now, .wall_s = io_wall, .random = io_random,
               .send = io_send};
  dht_node_free(node);
  node = NULL;
  ASSERT_OK(dht_node_new(&cfg, &io, &node));
}

/* Total bytes: a node with room for 64 KiB takes four 16 KiB values. */
static void test_storage_cap(void) {
  proto_dht_record r;
  char name[8];
  int i, rc = 0;
  for (i = 0; i < 10 && rc == 0; i++) {
    snprintf(name, sizeof name, "t%d", i);
    record(&r, name, (proto_bytes){0}, PROTO_DHT_VALUE_MAX, 60);
    rc = store1(&peer, &r);
  }
  ASSERT_RC(rc, BEE_ELIMIT);
  ASSERT_EQ(i - 1, 4); /* four fit in 64 KiB; the fifth is refused */
  dht_info in;
  dht_node_info(node, &in);
  ASSERT_LE(in.bytes, 64u << 10);
}

/* Expired records leave storage at the node's periodic expiry, and the
 * walk over the store, skipped while nothing is due, still runs when a
 * record stored later expires first. */
static size_t records_after(uint64_t secs) {
  now_ms += secs * 1000;
  dht_node_tick(node);
  dht_info in;
  dht_node_info(node, &in);
  return in.records;
}

static void test_expiry(void) {
  proto_dht_record r;
  record(&r, "e5", (proto_bytes){0}, 8, 5);
  ASSERT_OK(store1(&peer, &r));
  record(&r, "e30", (proto_bytes){0}, 8, 30);
  ASSERT_OK(store1(&peer, &r));
  record(&r, "e100", (proto_bytes){0}, 8, 100);
  ASSERT_OK(store1(&peer, &r));
  ASSERT_EQ(records_after(0), 3);
  ASSERT_EQ(records_after(11), 2); /* e5 gone */
  record(&r, "e3", (proto_bytes){0}, 8, 3); /* due before e30 */
  ASSERT_OK(store1(&peer, &r));
  ASSERT_EQ(records_after(0), 3);
  ASSERT_EQ(records_after(11), 2); /* e3 gone, e30 not yet */
  ASSERT_EQ(held("e30"), 1);
  ASSERT_EQ(records_after(11), 1); /* 33 s: e30 gone */
  ASSERT_EQ(held("e100"), 1);
  ASSERT_EQ(records_after(70), 0);
  dht_info in;
  dht_node_info(node, &in);
  ASSERT_EQ(in.keys, 0);
  ASSERT_EQ(in.bytes, 0);
}

static void test_records(void) {
  proto_dht_record r;
  uint8_t own[PROTO_DHT_OWNED_SUBKEY_BYTES] = {PROTO_DHT_OWNER_TAG};
  memcpy(own + 1, peer.pk, PROTO_PK_BYTES);

  record(&r, "plain", (proto_bytes){0}, 10, 60);
  ASSERT_OK(store1(&peer, &r));
  ASSERT_OK(store1(&peer, &r)); /* the same again: accepted, no change */
  r.expiration -= 1;
  ASSERT_RC(store1(&peer, &r), BEE_ESTALE);
  r.expiration += 2;
  ASSERT_OK(store1(&peer, &r)); /* newer wins */

  record(&r, "expired", (proto_bytes){0}, 10, 0);
  ASSERT_RC(store1(&peer, &r), BEE_EEXPIRED);
  record(&r, "forever", (proto_bytes){0}, 10, DHT_TTL_MAX_S + 10);
  ASSERT_RC(store1(&peer, &r), BEE_ERANGE);
  ASSERT_EQ(held("expired") + held("forever"), 0);

  /* The owner's record, signed: kept.  Someone else writing it, or a
   * signature that does not match: refused. */
  record(&r, "owned", (proto_bytes){own, sizeof own}, 10, 60);
  proto_dht_record_sign(&r, &peer);
  ASSERT_OK(store1(&peer, &r));
  record(&r, "owned", (proto_bytes){own, sizeof own}, 11, 61);
  proto_dht_record_sign(&r, &other);
  ASSERT_RC(store1(&other, &r), BEE_EAUTH);
  record(&r, "owned", (proto_bytes){own, sizeof own}, 12, 62);
  proto_dht_record_sign(&r, &peer);
  r.sig[5] ^= 1;
  ASSERT_RC(store1(&peer, &r), BEE_EAUTH);
  ASSERT_EQ(held("owned"), 1);

  /* A typed record: kept under its own key when it decodes; refused
   * under another key, when malformed, and the DHT keeps serving. */
  proto_progress pg = {.epoch = 3, .samples = 100, .samples_per_second = 12.5,
                       .time_ms = wall_ms(), .mode = PROTO_MODE_NODE};
  snprintf(pg.run, sizeof pg.run, "run1");
  uint8_t pv[PROTO_RECORD_MAX];
  size_t pn;
  ASSERT_OK(proto_progress_encode(&pg, pv, sizeof pv, &pn));
  record(&r, "run1_progress", (proto_bytes){own, sizeof own}, 0, 60);
  r.value = (proto_bytes){pv, pn};
  proto_dht_record_sign(&r, &peer);
  ASSERT_OK(store1(&peer, &r));
  record(&r, "run2_progress", (proto_bytes){own, sizeof own}, 0, 60);
  r.value = (proto_bytes){pv, pn};
  proto_dht_record_sign(&r, &peer);
  ASSERT_RC(store1(&peer, &r), BEE_EAUTH);
  pv[pn - 1] = 0xc1; /* the label's place: a byte msgpack never uses */
  record(&r, "run1_progress", (proto_bytes){own, sizeof own}, 0, 61);
  r.value = (proto_bytes){pv, pn};
  proto_dht_record_sign(&r, &peer);
  ASSERT_NE(store1(&peer, &r), 0);
  ASSERT_EQ(held("run1_progress"), 1);
  ASSERT_EQ(held("run2_progress"), 0);

  /* Over the value size: the request does not even decode. */
  record(&r, "big", (proto_bytes){0}, 16, 60);
  req.type = PROTO_T_DHT_STORE;
  req.nrecords = 1;
  req.records[0] = r;
  size_t len, olen;
  req.port = 45555;
  req.now = wall_ms() / 1000;
  ASSERT_OK(proto_dht_encode(&req, buf, DHT_ANSWER_MAX, &len));
  /* Grow the value's bin header from 16 bytes to VALUE_MAX + 1. */
  uint8_t *big = malloc(len + PROTO_DHT_VALUE_MAX + 8);
  size_t at = 0;
  for (size_t i = 0; i + 2 < len; i++)
    if (buf[i] == 0xc4 && buf[i + 1] == 16) /* bin8 of 16 bytes */
      at = i;
  ASSERT_GT(at, 0);
  memcpy(big, buf, at);
  big[at] = 0xc5, big[at + 1] = (PROTO_DHT_VALUE_MAX + 1) >> 8,
  big[at + 2] = (PROTO_DHT_VALUE_MAX + 1) & 0xff;
  memset(big + at + 3, 'v', PROTO_DHT_VALUE_MAX + 1);
  size_t tail = len - (at + 2 + 16);
  memcpy(big + at + 3 + PROTO_DHT_VALUE_MAX + 1, buf + at + 2 + 16, tail);
  ASSERT_RC(dht_node_handle(node, peer.id, "10.0.0.9", DHT_METHOD_STORE, big,
                            at + 3 + PROTO_DHT_VALUE_MAX + 1 + tail, out,
                            DHT_ANSWER_MAX, &olen),
            BEE_ETOOBIG);
  free(big);
  ASSERT_EQ(held("big"), 0);
}

static void test_limits(void) {
  proto_dht_record r;
  char name[32];
  /* Bytes under one key: 16 KiB subkeys until 1 MiB is reached. */
  size_t kept = 0;
  int rc = 0;
  for (int i = 0; rc == 0 && i < 100; i++) {
    char sub[8];
    snprintf(sub, sizeof sub, "s%d", i);
    record(&r, "fat", (proto_bytes){(const uint8_t *)sub, strlen(sub)},
           PROTO_DHT_VALUE_MAX, 60);
    rc = store1(&peer, &r);
    kept += rc == 0;
  }
  ASSERT_RC(rc, BEE_ELIMIT);
  ASSERT_EQ(held("fat"), kept);
  ASSERT_LE(kept * PROTO_DHT_VALUE_MAX, DHT_KEY_BYTES_MAX);
  /* Subkeys under one key: DHT_SUBKEYS_MAX are kept, one more is not. */
  static char subs[DHT_SUBKEYS_MAX + 1][8];
  for (int i = 0; i <= DHT_SUBKEYS_MAX; i++)
    snprintf(subs[i], sizeof subs[i], "%d", i);
  req.type = PROTO_T_DHT_STORE;
  req.nrecords = 0;
  for (int i = 0; i < DHT_SUBKEYS_MAX; i++)
    record(&req.records[req.nrecords++], "wide",
           (proto_bytes){(const uint8_t *)subs[i], strlen(subs[i])}, 1, 60);
  ASSERT_OK(send_from(&other));
  for (size_t i = 0; i < ans.nresults; i++)
    ASSERT_OK(ans.results[i]);
  record(&r, "wide",
         (proto_bytes){(const uint8_t *)subs[DHT_SUBKEYS_MAX],
                       strlen(subs[DHT_SUBKEYS_MAX])}, 1, 60);
  ASSERT_RC(store1(&other, &r), BEE_ELIMIT);
  ASSERT_EQ(held("wide"), DHT_SUBKEYS_MAX);
  /* Keys: this node takes at most 8 ("fat" and "wide" are two). */
  for (int i = 0; i < 20; i++) {
    snprintf(name, sizeof name, "k%d", i);
    record(&r, name, (proto_bytes){0}, 1, 60);
    rc = store1(&peer, &r);
    if (rc)
      break;
    ASSERT_LT(i, 6);
  }
  ASSERT_RC(rc, BEE_ELIMIT);
  dht_info in;
  dht_node_info(node, &in);
  ASSERT_EQ(in.keys, 8);
}

static void test_flood(void) {
  proto_dht_record r;
  int refused = 0;
  /* One peer storing as fast as it can: past its burst it is refused... */
  for (int i = 0; i < 200; i++) {
    record(&r, "plain", (proto_bytes){0}, 10, 100 + (uint64_t)i);
    refused += store1(&other, &r) == BEE_ELIMIT;
  }
  ASSERT_GT(refused, 100);
  /* ...while another peer is still served, stores and finds alike. */
  record(&r, "plain", (proto_bytes){0}, 10, 1000);
  ASSERT_OK(store1(&peer, &r));
  req.type = PROTO_T_DHT_FIND;
  dht_key("plain", req.key);
  req.want_value = true;
  ASSERT_OK(send_from(&peer));
  ASSERT(ans.found);
  ASSERT_EQ(ans.nrecords, 1);
  ASSERT_UEQ(ans.records[0].expiration, r.expiration);
  /* And after a quiet second the flooder may store again. */
  now_ms += 1000;
  record(&r, "plain", (proto_bytes){0}, 10, 1001);
  ASSERT_OK(store1(&other, &r));
}

int main(void) {
  ASSERT(sodium_init() >= 0);
  bee_log_set_level(getenv("BEE_TEST_VERBOSE") ? BEE_LOG_DEBUG : BEE_LOG_ERROR);
  proto_identity_generate(&self);
  proto_identity_generate(&peer);
  proto_identity_generate(&other);
  randombytes_buf(value, sizeof value);
  buf = malloc(DHT_ANSWER_MAX);
  out = malloc(DHT_ANSWER_MAX);
  fresh_node(65536, 64u << 20, 10); /* a slow peer rate, for the flood */
  test_records();
  test_flood();
  fresh_node(8, 64u << 20, 1000000); /* few keys, no rate limit */
  test_limits();
  fresh_node(65536, 64u << 10, 1000000); /* 64 KiB of storage */
  test_storage_cap();
  fresh_node(65536, 64u << 20, 1000000);
  test_expiry();
  dht_node_free(node);
  free(buf);
  free(out);
  printf("dht limits: all checks passed\n");
  return 0;
}
