/* test-proto-dht.c: the DHT payloads (PING..FOUND) and the signatures of
 * owned records.
 *
 * Every type round-trips at its edges (zero, the largest counts and
 * sizes); every shape rule of the decoder is refused with its own code,
 * on bytes built by hand where the encoder would not write them; and
 * owned records verify only untouched and under their signer's key.
 */
#include "proto.h"
#include "test.h"
#include "testlib.h"

#include <sodium.h>

/* Large (fixed arrays): kept static, off the stack. */
static proto_dht_msg m, back;
static const proto_dht_msg zero;

/* Blobs the messages point into. */
static uint8_t values[PROTO_DHT_RECORDS_MAX][PROTO_DHT_VALUE_MAX];
static uint8_t subkeys[PROTO_DHT_RECORDS_MAX][PROTO_DHT_SUBKEY_MAX];
static char addrs[PROTO_DHT_NODES_MAX][PROTO_ADDR_MAX];

static proto_bytes bytes(const void *p, size_t n) {
  return (proto_bytes){(const uint8_t *)p, n};
}

/* ---- hand-built msgpack -------------------------------------------------- */

/* Inputs the encoder refuses to write, on testlib's hb_ writers.  Counts
 * and lengths take 16-bit headers; unlike testlib's hb_uint, integers
 * below 128 take one byte (a test patches the version at test_hb[3]),
 * and strs and bins are n bytes of a fill. */
static void h_nil(void) { hb_byte(0xc0); }
static void h_uint(uint64_t v) {
  if (v < 128)
    hb_byte((uint8_t)v);
  else
    hb_byte(0xcf), hb_be(v, 8);
}
static void h_int(int64_t v) {
  if (v >= 0)
    h_uint((uint64_t)v);
  else
    hb_byte(0xd3), hb_be((uint64_t)v, 8);
}
/* A bin (or str) of n bytes: first, then fill. */
static void h_blob(bool str, size_t n, uint8_t first, uint8_t fill) {
  hb_byte(str ? 0xda : 0xc5), hb_be(n, 2);
  for (size_t i = 0; i < n; i++)
    hb_byte(i == 0 ? first : fill);
}
static void h_bin(size_t n) { h_blob(false, n, 'b', 'b'); }
static void h_str(size_t n, uint8_t fill) { h_blob(true, n, fill, fill); }
/* Starts a new message [1, type, nfields more]. */
static void h_head(uint64_t type, size_t nfields) {
  test_hn = 0;
  hb_arr(2 + nfields), h_uint(1), h_uint(type);
}
/* A failed decode leaves the message reading as empty: no type, no
 * port, time, key or flags, and every count 0. */
static void assert_empty(const proto_dht_msg *x) {
  ASSERT_EQ(x->type, 0);
  ASSERT_EQ(x->port, 0);
  ASSERT_EQ(x->now, 0);
  ASSERT_MEMEQ(x->key, zero.key, sizeof x->key);
  ASSERT(!x->want_value && !x->found);
  ASSERT(x->observed.p == NULL && x->observed.n == 0);
  ASSERT_EQ(x->nrecords, 0);
  ASSERT_EQ(x->nresults, 0);
  ASSERT_EQ(x->nnodes, 0);
}

/* Decodes the hand-built message; a failure must leave m empty. */
static int h_decode(void) {
  int rc = proto_dht_decode(test_hb, test_hn, &m);
  if (rc)
    assert_empty(&m);
  return rc;
}

/* One RECORD, shaped by the fields; a good one is {5, 20, -1, 0, 3, 7, -1}.
 * subkey and sig are lengths, -1 for nil; nelem other than 5 drops
 * trailing fields or adds a nil. */
typedef struct rec {
  uint32_t nelem;
  size_t key;
  int subkey;
  uint8_t tag; /* first subkey byte */
  size_t value;
  int64_t exp;
  int sig;
} rec;

static void h_record(const rec *s) {
  hb_arr(s->nelem);
  for (uint32_t i = 0; i < s->nelem; i++) {
    switch (i) {
    case 0: h_bin(s->key); break;
    case 1:
      if (s->subkey < 0)
        h_nil();
      else
        h_blob(false, (size_t)s->subkey, s->tag, 'k');
      break;
    case 2: h_bin(s->value); break;
    case 3: h_int(s->exp); break;
    case 4:
      if (s->sig < 0)
        h_nil();
      else
        h_bin((size_t)s->sig);
      break;
    default: h_nil(); break;
    }
  }
}

/* A STORE of one hand-built record. */
static int store_one(rec s) {
  h_head(PROTO_T_DHT_STORE, 3);
  h_uint(45555), h_uint(1700000000), hb_arr(1);
  h_record(&s);
  return h_decode();
}

/* ---- round trips --------------------------------------------------------- */

/* Two views with the same bytes (either may be NULL when empty). */
#define ASSERT_BYTES_EQ(a, b)                                                  \
  do {                                                                         \
    ASSERT_UEQ((a).n, (b).n);                                                  \
    if ((a).n > 0)                                                             \
      ASSERT_MEMEQ((a).p, (b).p, (a).n);                                       \
  } while (0)

static void check_same(const proto_dht_msg *a, const proto_dht_msg *b) {
  ASSERT_EQ(a->type, b->type);
  ASSERT_UEQ(a->port, b->port);
  ASSERT_UEQ(a->now, b->now);
  ASSERT_MEMEQ(a->key, b->key, sizeof a->key);
  ASSERT_EQ(a->want_value, b->want_value);
  ASSERT_EQ(a->found, b->found);
  ASSERT_BYTES_EQ(a->observed, b->observed);
  ASSERT_UEQ(a->nrecords, b->nrecords);
  for (size_t i = 0; i < a->nrecords; i++) {
    const proto_dht_record *x = &a->records[i], *y = &b->records[i];
    ASSERT_MEMEQ(x->key, y->key, sizeof x->key);
    ASSERT_BYTES_EQ(x->subkey, y->subkey);
    ASSERT_BYTES_EQ(x->value, y->value);
    ASSERT_UEQ(x->expiration, y->expiration);
    ASSERT_EQ(x->has_sig, y->has_sig);
    if (x->has_sig)
      ASSERT_MEMEQ(x->sig, y->sig, sizeof x->sig);
  }
  ASSERT_UEQ(a->nresults, b->nresults);
  for (size_t i = 0; i < a->nresults; i++)
    ASSERT_EQ(a->results[i], b->results[i]);
  ASSERT_UEQ(a->nnodes, b->nnodes);
  for (size_t i = 0; i < a->nnodes; i++) {
    ASSERT_MEMEQ(a->nodes[i].id, b->nodes[i].id, PROTO_ID_BYTES);
    ASSERT_BYTES_EQ(a->nodes[i].addr, b->nodes[i].addr);
  }
}

/* Encodes m into a heap buffer of exactly proto_dht_encoded_max bytes
 * (freed by the caller); one byte less than the encoding must not do. */
static uint8_t *encode(const proto_dht_msg *in, size_t *len) {
  size_t max = proto_dht_encoded_max(in);
  uint8_t *buf = malloc(max);
  ASSERT(buf);
  ASSERT_OK(proto_dht_encode(in, buf, max, len));
  ASSERT_LE(*len, max);
  ASSERT_RC(proto_dht_encode(in, buf, *len - 1, len), BEE_ETOOBIG);
  ASSERT_OK(proto_dht_encode(in, buf, max, len));
  return buf;
}

/* m must survive encode and decode; with cut set, every prefix of the
 * encoding (in a buffer of its own size, so ASan sees any over-read) must
 * fail, and one byte more must be BEE_ETRAILING. */
static void roundtrip(bool cut) {
  size_t len;
  uint8_t *buf = encode(&m, &len);
  ASSERT_OK(proto_dht_decode(buf, len, &back));
  check_same(&m, &back);
  /* Every owned record in these tests is signed by its owner, and its
   * decoded copy (views into buf) must verify too. */
  for (size_t i = 0; i < back.nrecords; i++)
    if (proto_dht_subkey_owner(back.records[i].subkey, NULL))
      ASSERT_OK(proto_dht_record_verify(&back.records[i]));
  if (cut) {
    for (size_t i = 0; i < len; i++) {
      uint8_t *part = malloc(i ? i : 1);
      ASSERT(part);
      memcpy(part, buf, i);
      ASSERT_NE(proto_dht_decode(part, i, &back), 0);
      assert_empty(&back);
      free(part);
    }
    uint8_t *more = malloc(len + 1);
    ASSERT(more);
    memcpy(more, buf, len);
    more[len] = 0;
    ASSERT_RC(proto_dht_decode(more, len + 1, &back), BEE_ETRAILING);
    free(more);
  }
  free(buf);
}

/* Record i of m: key, subkey (n bytes, 0 for none), value (n bytes). */
static void set_record(size_t i, size_t subkey, size_t value, bool sig) {
  proto_dht_record *r = &m.records[i];
  memset(r->key, (int)i, sizeof r->key);
  memset(subkeys[i], 'a' + (int)(i % 26), subkey);
  memset(values[i], (int)(i * 7), value);
  r->subkey = bytes(subkeys[i], subkey);
  r->value = bytes(values[i], value);
  r->expiration = 1700000000u + i;
  r->has_sig = sig;
  memset(r->sig, sig ? 0x5a : 0, sizeof r->sig);
}

static void test_ping_pong(void) {
  m = (proto_dht_msg){.type = PROTO_T_DHT_PING};
  roundtrip(true);
  m.port = 65535, m.now = UINT64_MAX;
  roundtrip(true);
  m.port = 65536;
  size_t len;
  uint8_t buf[64];
  ASSERT_RC(proto_dht_encode(&m, buf, sizeof buf, &len), BEE_ERANGE);

  m = (proto_dht_msg){.type = PROTO_T_DHT_PONG, .now = 1};
  roundtrip(true); /* empty observed address */
  memset(addrs[0], 'h', PROTO_ADDR_MAX - 1);
  m.observed = bytes(addrs[0], PROTO_ADDR_MAX - 1);
  roundtrip(false);
  m.observed.n = PROTO_ADDR_MAX;
  ASSERT_RC(proto_dht_encode(&m, buf, sizeof buf, &len), BEE_ETOOBIG);
  m.observed = bytes("1.2.3.4\0:5", 10);
  ASSERT_RC(proto_dht_encode(&m, buf, sizeof buf, &len), BEE_ERANGE);
  m.observed = bytes("10.0.0.1:45555", 14);
  roundtrip(true);

  /* The head, on PING. */
  h_head(PROTO_T_DHT_PING, 2), h_uint(65536), h_uint(0);
  ASSERT_RC(h_decode(), BEE_ERANGE);
  h_head(PROTO_T_DHT_PING, 2), h_uint(1), h_int(-1);
  ASSERT_RC(h_decode(), BEE_ERANGE);
  h_head(PROTO_T_DHT_PING, 2), h_str(1, '1'), h_uint(0);
  ASSERT_RC(h_decode(), BEE_ETYPE);
  h_head(PROTO_T_DHT_PING, 1), h_uint(1);
  ASSERT_RC(h_decode(), BEE_EMISSING);
  h_head(PROTO_T_DHT_PING, 3), h_uint(1), h_uint(2), h_uint(3);
  ASSERT_RC(h_decode(), BEE_ETYPE);
  h_head(PROTO_T_DHT_PING, 2), h_uint(1), h_uint(2);
  ASSERT_OK(h_decode());
  test_hb[3] = 2; /* the version, after the 3-byte array header */
  ASSERT_RC(h_decode(), BEE_EVERSION);
  const uint64_t others[] = {49, 56, PROTO_T_PING, PROTO_T_SWARM_HELLO, 300};
  for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
    h_head(others[i], 2), h_uint(1), h_uint(2);
    ASSERT_RC(h_decode(), BEE_EUNKNOWN);
  }
  h_head(PROTO_T_DHT_PING, 0);
  ASSERT_RC(h_decode(), BEE_EMISSING);
  test_hn = 0, h_uint(5);
  ASSERT_RC(h_decode(), BEE_ETYPE);
  test_hn = 0, hb_byte(0xc1);
  ASSERT_RC(h_decode(), BEE_EMALFORMED);
  ASSERT_RC(proto_dht_decode(test_hb, 0, &m), BEE_ETRUNCATED);

  /* PONG's address. */
  h_head(PROTO_T_DHT_PONG, 2), h_uint(1), h_str(PROTO_ADDR_MAX, 'a');
  ASSERT_RC(h_decode(), BEE_ETOOBIG);
  h_head(PROTO_T_DHT_PONG, 2), h_uint(1), h_str(3, 0);
  ASSERT_RC(h_decode(), BEE_ERANGE);
  h_head(PROTO_T_DHT_PONG, 2), h_uint(1), h_bin(3);
  ASSERT_RC(h_decode(), BEE_ETYPE);
  h_head(PROTO_T_DHT_PONG, 2), h_uint(1), h_str(PROTO_ADDR_MAX - 1, 'a');
  ASSERT_OK(h_decode());
}

static void test_store(const proto_identity *id) {
  size_t len;
  uint8_t buf[256];
  /* One bare record: no subkey, empty value, expiration 0. */
  m = (proto_dht_msg){
      .type = PROTO_T_DHT_STORE, .port = 0, .now = 0, .nrecords = 1};
  set_record(0, 0, 0, false);
  m.records[0].expiration = 0;
  roundtrip(true);
  /* An owned subkey with its signature, and a plain value with a
   * signature receivers ignore. */
  m.nrecords = 2, m.port = 45555, m.now = UINT64_MAX;
  subkeys[0][0] = PROTO_DHT_OWNER_TAG;
  memcpy(subkeys[0] + 1, id->pk, PROTO_PK_BYTES);
  m.records[0].subkey = bytes(subkeys[0], PROTO_DHT_OWNED_SUBKEY_BYTES);
  m.records[0].expiration = UINT64_MAX;
  proto_dht_record_sign(&m.records[0], id);
  set_record(1, 0, 5, true);
  roundtrip(true);

  /* The largest STORE: 256 records with the longest subkey and value. */
  m.nrecords = PROTO_DHT_RECORDS_MAX;
  for (size_t i = 0; i < m.nrecords; i++)
    set_record(i, PROTO_DHT_SUBKEY_MAX, PROTO_DHT_VALUE_MAX, true);
  roundtrip(false);
  ASSERT_GT(proto_dht_encoded_max(&m), PROTO_FRAME_MAX); /* codec only bounds */

  /* What the encoder refuses, before writing a byte. */
  m.nrecords = PROTO_DHT_RECORDS_MAX + 1;
  ASSERT_RC(proto_dht_encode(&m, buf, sizeof buf, &len), BEE_ETOOBIG);
  m.nrecords = 0;
  ASSERT_RC(proto_dht_encode(&m, buf, sizeof buf, &len), BEE_ERANGE);
  m.nrecords = 1;
  m.records[0].value.n = PROTO_DHT_VALUE_MAX + 1;
  ASSERT_RC(proto_dht_encode(&m, buf, sizeof buf, &len), BEE_ETOOBIG);
  set_record(0, PROTO_DHT_SUBKEY_MAX, 1, false);
  m.records[0].subkey.n++; /* refused before it is read */
  ASSERT_RC(proto_dht_encode(&m, buf, sizeof buf, &len), BEE_ETOOBIG);
  set_record(0, 2, 1, true);
  subkeys[0][0] = PROTO_DHT_OWNER_TAG; /* tagged, but not 1 + key */
  ASSERT_RC(proto_dht_encode(&m, buf, sizeof buf, &len), BEE_ERANGE);
  set_record(0, PROTO_DHT_OWNED_SUBKEY_BYTES, 1, false);
  subkeys[0][0] = PROTO_DHT_OWNER_TAG;
  ASSERT_RC(proto_dht_encode(&m, buf, sizeof buf, &len), BEE_EMISSING);
  m.records[0].has_sig = true;
  ASSERT_OK(proto_dht_encode(&m, buf, sizeof buf, &len)); /* shape only */
  m.port = 70000;
  ASSERT_RC(proto_dht_encode(&m, buf, sizeof buf, &len), BEE_ERANGE);

  /* The decoder's shape rules, one record at a time. */
  const rec good = {5, 20, -1, 0, 3, 7, -1};
  rec s = good;
  ASSERT_OK(store_one(s));
  ASSERT_UEQ(m.records[0].subkey.n, 0);
  ASSERT_EQ(m.records[0].has_sig, false);
  s.nelem = 4;
  ASSERT_RC(store_one(s), BEE_EMISSING);
  s.nelem = 6;
  ASSERT_RC(store_one(s), BEE_ETYPE);
  s = good, s.key = 19;
  ASSERT_RC(store_one(s), BEE_ERANGE);
  s.key = 21;
  ASSERT_RC(store_one(s), BEE_ERANGE);
  s = good, s.subkey = 0; /* "no subkey" is nil, never an empty bin */
  ASSERT_RC(store_one(s), BEE_ERANGE);
  s.subkey = PROTO_DHT_SUBKEY_MAX + 1, s.tag = 'x';
  ASSERT_RC(store_one(s), BEE_ETOOBIG);
  s.subkey = PROTO_DHT_SUBKEY_MAX;
  ASSERT_OK(store_one(s));
  s.tag = PROTO_DHT_OWNER_TAG; /* tagged: exactly 1 + key bytes */
  ASSERT_RC(store_one(s), BEE_ERANGE);
  s.subkey = 1;
  ASSERT_RC(store_one(s), BEE_ERANGE);
  s.subkey = PROTO_DHT_OWNED_SUBKEY_BYTES;
  ASSERT_RC(store_one(s), BEE_EMISSING); /* owned, but unsigned */
  s.sig = PROTO_SIG_BYTES;
  ASSERT_OK(store_one(s)); /* the decoder does not verify */
  ASSERT(proto_dht_subkey_owner(m.records[0].subkey, NULL));
  ASSERT_RC(proto_dht_record_verify(&m.records[0]), BEE_EAUTH);
  s.sig = PROTO_SIG_BYTES - 1;
  ASSERT_RC(store_one(s), BEE_ERANGE);
  s = good, s.sig = PROTO_SIG_BYTES; /* a signature on a plain value */
  ASSERT_OK(store_one(s));
  ASSERT_EQ(m.records[0].has_sig, true);
  s = good, s.value = PROTO_DHT_VALUE_MAX + 1;
  ASSERT_RC(store_one(s), BEE_ETOOBIG);
  s.value = PROTO_DHT_VALUE_MAX;
  ASSERT_OK(store_one(s));
  s = good, s.exp = -1;
  ASSERT_RC(store_one(s), BEE_ERANGE);

  /* The record list itself. */
  h_head(PROTO_T_DHT_STORE, 3), h_uint(1), h_uint(1), hb_arr(0);
  ASSERT_RC(h_decode(), BEE_ERANGE);
  h_head(PROTO_T_DHT_STORE, 3), h_uint(1), h_uint(1), h_nil();
  ASSERT_RC(h_decode(), BEE_ETYPE);
  h_head(PROTO_T_DHT_STORE, 3), h_uint(1), h_uint(1);
  hb_arr(PROTO_DHT_RECORDS_MAX + 1);
  for (size_t i = 0; i <= PROTO_DHT_RECORDS_MAX; i++)
    h_record(&good);
  ASSERT_RC(h_decode(), BEE_ETOOBIG);
  /* A count the bytes cannot back. */
  h_head(PROTO_T_DHT_STORE, 3), h_uint(1), h_uint(1);
  hb_byte(0xdd), hb_be(0xffffffff, 4);
  ASSERT_RC(h_decode(), BEE_ETRUNCATED);
}

static void test_stored(void) {
  size_t len;
  uint8_t buf[64];
  m = (proto_dht_msg){.type = PROTO_T_DHT_STORED, .now = 3};
  roundtrip(true); /* no results */
  m.nresults = 4;
  m.results[0] = 0, m.results[1] = -1, m.results[2] = INT32_MIN;
  m.results[3] = BEE_EAUTH;
  roundtrip(true);
  m.nresults = PROTO_DHT_RECORDS_MAX;
  for (size_t i = 0; i < m.nresults; i++)
    m.results[i] = i % 2 ? BEE_ERANGE : 0;
  roundtrip(false);
  m.nresults = PROTO_DHT_RECORDS_MAX + 1;
  ASSERT_RC(proto_dht_encode(&m, buf, sizeof buf, &len), BEE_ETOOBIG);
  m.nresults = 1, m.results[0] = 1;
  ASSERT_RC(proto_dht_encode(&m, buf, sizeof buf, &len), BEE_ERANGE);

  const int64_t bad[] = {1, (int64_t)INT32_MIN - 1, INT64_MIN};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    h_head(PROTO_T_DHT_STORED, 2), h_uint(1), hb_arr(1), h_int(bad[i]);
    ASSERT_RC(h_decode(), BEE_ERANGE);
  }
  h_head(PROTO_T_DHT_STORED, 2), h_uint(1), hb_arr(1), h_uint(UINT64_MAX);
  ASSERT_RC(h_decode(), BEE_ERANGE);
  h_head(PROTO_T_DHT_STORED, 2), h_uint(1), hb_arr(1), h_nil();
  ASSERT_RC(h_decode(), BEE_ETYPE);
  h_head(PROTO_T_DHT_STORED, 2), h_uint(1), hb_arr(2), h_int(INT32_MIN),
      h_int(0);
  ASSERT_OK(h_decode());
  ASSERT_EQ(m.results[0], INT32_MIN);
  h_head(PROTO_T_DHT_STORED, 2), h_uint(1);
  hb_arr(PROTO_DHT_RECORDS_MAX + 1);
  for (size_t i = 0; i <= PROTO_DHT_RECORDS_MAX; i++)
    h_int(0);
  ASSERT_RC(h_decode(), BEE_ETOOBIG);
}

static void test_find(void) {
  m = (proto_dht_msg){.type = PROTO_T_DHT_FIND, .port = 1, .now = 2};
  roundtrip(true); /* zero key, want_value false */
  memset(m.key, 0xff, sizeof m.key);
  m.want_value = true, m.port = 65535, m.now = UINT64_MAX;
  roundtrip(true);

  h_head(PROTO_T_DHT_FIND, 4), h_uint(1), h_uint(2), h_bin(20), hb_byte(0xc3);
  ASSERT_OK(h_decode());
  ASSERT_EQ(m.want_value, true);
  h_head(PROTO_T_DHT_FIND, 4), h_uint(1), h_uint(2), h_bin(19), hb_byte(0xc3);
  ASSERT_RC(h_decode(), BEE_ERANGE);
  h_head(PROTO_T_DHT_FIND, 4), h_uint(1), h_uint(2), h_str(20, 'k'),
      hb_byte(0xc3);
  ASSERT_RC(h_decode(), BEE_ETYPE);
  h_head(PROTO_T_DHT_FIND, 4), h_uint(1), h_uint(2), h_bin(20), h_uint(1);
  ASSERT_RC(h_decode(), BEE_ETYPE);
  h_head(PROTO_T_DHT_FIND, 3), h_uint(1), h_uint(2), h_bin(20);
  ASSERT_RC(h_decode(), BEE_EMISSING);
}

/* A FOUND with nrec hand-built good records (0: nil) and the contact
 * given by id/addr lengths, addr filled with fill. */
static int found_with(size_t nrec, size_t id, size_t addr, uint8_t fill,
                      uint32_t contact_elems) {
  const rec good = {5, 20, -1, 0, 3, 7, -1};
  h_head(PROTO_T_DHT_FOUND, 3), h_uint(1);
  if (nrec == 0)
    h_nil();
  else
    hb_arr(nrec);
  for (size_t i = 0; i < nrec; i++)
    h_record(&good);
  hb_arr(1), hb_arr(contact_elems);
  for (uint32_t i = 0; i < contact_elems; i++)
    if (i == 0)
      h_bin(id);
    else if (i == 1)
      h_str(addr, fill);
    else
      h_nil();
  return h_decode();
}

static void test_found(const proto_identity *id) {
  size_t len;
  uint8_t buf[512];
  m = (proto_dht_msg){.type = PROTO_T_DHT_FOUND, .now = 4};
  roundtrip(true); /* not found, no nodes */
  m.found = true, m.nrecords = 2;
  set_record(0, PROTO_DHT_OWNED_SUBKEY_BYTES, 40, false);
  subkeys[0][0] = PROTO_DHT_OWNER_TAG;
  memcpy(subkeys[0] + 1, id->pk, PROTO_PK_BYTES);
  proto_dht_record_sign(&m.records[0], id);
  set_record(1, 3, 0, false);
  m.nnodes = 3;
  for (size_t i = 0; i < m.nnodes; i++) {
    memset(m.nodes[i].id, 0x10 + (int)i, PROTO_ID_BYTES);
    snprintf(addrs[i], PROTO_ADDR_MAX, "10.0.0.%zu:45555", i);
    m.nodes[i].addr = bytes(addrs[i], strlen(addrs[i]));
  }
  roundtrip(true);

  /* The largest FOUND: 256 records of 16 KiB, 32 contacts of the longest
   * address. */
  m.nrecords = PROTO_DHT_RECORDS_MAX;
  for (size_t i = 0; i < m.nrecords; i++)
    set_record(i, PROTO_DHT_SUBKEY_MAX, PROTO_DHT_VALUE_MAX, true);
  m.nnodes = PROTO_DHT_NODES_MAX;
  for (size_t i = 0; i < m.nnodes; i++) {
    memset(m.nodes[i].id, (int)i, PROTO_ID_BYTES);
    memset(addrs[i], 'a' + (int)i % 26, PROTO_ADDR_MAX - 1);
    m.nodes[i].addr = bytes(addrs[i], PROTO_ADDR_MAX - 1);
  }
  roundtrip(false);

  /* What the encoder refuses. */
  m.nnodes = PROTO_DHT_NODES_MAX + 1;
  ASSERT_RC(proto_dht_encode(&m, buf, sizeof buf, &len), BEE_ETOOBIG);
  m.nnodes = 1, m.nrecords = 0;
  ASSERT_RC(proto_dht_encode(&m, buf, sizeof buf, &len), BEE_ERANGE);
  m.found = false, m.nrecords = 1;
  ASSERT_RC(proto_dht_encode(&m, buf, sizeof buf, &len), BEE_ERANGE);
  m.nrecords = 0;
  m.nodes[0].addr = bytes("", 0);
  ASSERT_RC(proto_dht_encode(&m, buf, sizeof buf, &len), BEE_ERANGE);
  m.nodes[0].addr = bytes("a\0b", 3);
  ASSERT_RC(proto_dht_encode(&m, buf, sizeof buf, &len), BEE_ERANGE);
  m.nodes[0].addr = bytes(addrs[0], PROTO_ADDR_MAX);
  ASSERT_RC(proto_dht_encode(&m, buf, sizeof buf, &len), BEE_ETOOBIG);

  /* The decoder's rules. */
  ASSERT_OK(found_with(0, 20, 9, 'a', 2));
  ASSERT_EQ(m.found, false);
  ASSERT_OK(found_with(2, 20, 9, 'a', 2));
  ASSERT_EQ(m.found, true);
  ASSERT_UEQ(m.nrecords, 2);
  ASSERT_RC(found_with(0, 21, 9, 'a', 2), BEE_ERANGE);
  ASSERT_RC(found_with(0, 20, 0, 'a', 2), BEE_ERANGE);
  ASSERT_RC(found_with(0, 20, 9, 0, 2), BEE_ERANGE);
  ASSERT_RC(found_with(0, 20, PROTO_ADDR_MAX, 'a', 2), BEE_ETOOBIG);
  ASSERT_RC(found_with(0, 20, 9, 'a', 1), BEE_EMISSING);
  ASSERT_RC(found_with(0, 20, 9, 'a', 3), BEE_ETYPE);
  /* An empty record array would make "found" ambiguous. */
  h_head(PROTO_T_DHT_FOUND, 3), h_uint(1), hb_arr(0), hb_arr(0);
  ASSERT_RC(h_decode(), BEE_ERANGE);
  h_head(PROTO_T_DHT_FOUND, 3), h_uint(1), hb_byte(0xc2), hb_arr(0);
  ASSERT_RC(h_decode(), BEE_ETYPE);
  h_head(PROTO_T_DHT_FOUND, 3), h_uint(1), h_nil();
  hb_arr(PROTO_DHT_NODES_MAX + 1);
  for (size_t i = 0; i <= PROTO_DHT_NODES_MAX; i++)
    hb_arr(2), h_bin(20), h_str(3, 'a');
  ASSERT_RC(h_decode(), BEE_ETOOBIG);
  h_head(PROTO_T_DHT_FOUND, 3), h_uint(1), h_nil(), h_nil();
  ASSERT_RC(h_decode(), BEE_ETYPE);
}

/* ---- owned records ------------------------------------------------------- */

static void test_sign(const proto_identity *alice,
                      const proto_identity *mallory) {
  uint8_t key[PROTO_DHT_KEY_BYTES], subkey[PROTO_DHT_OWNED_SUBKEY_BYTES];
  uint8_t value[] = "alice's checkpoint";
  const uint8_t *pk = NULL;
  memset(key, 0x42, sizeof key);
  subkey[0] = PROTO_DHT_OWNER_TAG;
  memcpy(subkey + 1, alice->pk, PROTO_PK_BYTES);
  ASSERT(proto_dht_subkey_owner(bytes(subkey, sizeof subkey), &pk));
  ASSERT(pk == subkey + 1);
  ASSERT(!proto_dht_subkey_owner(bytes(subkey, sizeof subkey - 1), &pk));
  ASSERT(pk == NULL);
  ASSERT(!proto_dht_subkey_owner(bytes(NULL, 0), &pk));
  uint8_t untagged[PROTO_DHT_OWNED_SUBKEY_BYTES] = {0x02};
  ASSERT(!proto_dht_subkey_owner(bytes(untagged, sizeof untagged), NULL));

  proto_dht_record r = {.subkey = bytes(subkey, sizeof subkey),
                        .value = bytes(value, sizeof value - 1),
                        .expiration = 1700000600};
  memcpy(r.key, key, sizeof key);
  ASSERT_RC(proto_dht_record_verify(&r), BEE_EAUTH); /* unsigned */
  proto_dht_record_sign(&r, alice);
  ASSERT(r.has_sig);
  ASSERT_OK(proto_dht_record_verify(&r));

  /* The signature covers exactly the documented bytes. */
  uint8_t msg[256];
  size_t n = 0;
  memcpy(msg, "beed dht record v1", 18), n = 18;
  msg[n++] = 0x94;
  msg[n++] = 0xc4, msg[n++] = PROTO_DHT_KEY_BYTES;
  memcpy(msg + n, key, sizeof key), n += sizeof key;
  msg[n++] = 0xc4, msg[n++] = sizeof subkey;
  memcpy(msg + n, subkey, sizeof subkey), n += sizeof subkey;
  msg[n++] = 0xc4, msg[n++] = sizeof value - 1;
  memcpy(msg + n, value, sizeof value - 1), n += sizeof value - 1;
  msg[n++] = 0xce; /* uint 32: 1700000600 = 0x6553f358 */
  msg[n++] = 0x65, msg[n++] = 0x53, msg[n++] = 0xf3, msg[n++] = 0x58;
  ASSERT_EQ(crypto_sign_verify_detached(r.sig, msg, n, alice->pk), 0);

  /* Any change to what it covers is a forgery. */
  proto_dht_record t = r;
  t.key[19] ^= 1;
  ASSERT_RC(proto_dht_record_verify(&t), BEE_EAUTH);
  subkey[7] ^= 1; /* the owner's key */
  ASSERT_RC(proto_dht_record_verify(&r), BEE_EAUTH);
  subkey[7] ^= 1;
  value[0] ^= 1;
  ASSERT_RC(proto_dht_record_verify(&r), BEE_EAUTH);
  value[0] ^= 1;
  t = r, t.value.n--;
  ASSERT_RC(proto_dht_record_verify(&t), BEE_EAUTH);
  t = r, t.expiration++;
  ASSERT_RC(proto_dht_record_verify(&t), BEE_EAUTH);
  for (size_t i = 0; i < PROTO_SIG_BYTES; i += 9) {
    t = r, t.sig[i] ^= 0x80;
    ASSERT_RC(proto_dht_record_verify(&t), BEE_EAUTH);
  }
  t = r, t.has_sig = false;
  ASSERT_RC(proto_dht_record_verify(&t), BEE_EAUTH);
  ASSERT_OK(proto_dht_record_verify(&r));

  /* Mallory signs a value under Alice's owned subkey. */
  t = r;
  proto_dht_record_sign(&t, mallory);
  ASSERT_RC(proto_dht_record_verify(&t), BEE_EAUTH);
  /* And under her own subkey it verifies. */
  uint8_t msub[PROTO_DHT_OWNED_SUBKEY_BYTES] = {PROTO_DHT_OWNER_TAG};
  memcpy(msub + 1, mallory->pk, PROTO_PK_BYTES);
  t.subkey = bytes(msub, sizeof msub);
  proto_dht_record_sign(&t, mallory);
  ASSERT_OK(proto_dht_record_verify(&t));

  /* Only owned subkeys are verified. */
  t = r, t.subkey = bytes("plain", 5);
  proto_dht_record_sign(&t, alice);
  ASSERT_RC(proto_dht_record_verify(&t), BEE_ERANGE);
  t.subkey = bytes(NULL, 0);
  ASSERT_RC(proto_dht_record_verify(&t), BEE_ERANGE);
  t.subkey = bytes(subkey, sizeof subkey - 1);
  ASSERT_RC(proto_dht_record_verify(&t), BEE_ERANGE);
}

int main(void) {
  proto_identity alice, mallory;
  proto_identity_generate(&alice);
  proto_identity_generate(&mallory);
  test_ping_pong();
  test_store(&alice);
  test_stored();
  test_find();
  test_found(&alice);
  test_sign(&alice, &mallory);
  printf("dht payloads: all checks passed\n");
  return 0;
}
