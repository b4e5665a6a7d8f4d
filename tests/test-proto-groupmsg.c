/* test-proto-groupmsg.c: the matchmaking payloads (proto/group-msg.c).
 *
 * The example of docs/PROTOCOL.md section 11, byte for byte; round trips
 * of all four types at their edges (the longest strings, 1024 members with
 * the longest addresses, the largest integers) within
 * proto_group_encoded_max; every cut of every encoding refused; each
 * malformed class of each field refused with its own code, on messages
 * built by hand from a table (one wrong field in an otherwise good
 * message); the head, the field counts and the end; the caller's cap on
 * members; and the encoder refusing, before it writes, what the decoder
 * refuses.
 */
#include "proto.h"
#include "test.h"
#include "testlib.h"

#include <float.h>
#include <math.h>

#define NMAX PROTO_GROUP_MEMBERS_MAX

/* Doubles compare by their bits: -0.0 must come back as -0.0. */
#define ASSERT_F64EQ(a, b)                                                     \
  do {                                                                         \
    double a_ = (a), b_ = (b);                                                 \
    if (memcmp(&a_, &b_, sizeof a_) != 0)                                      \
      FAIL("%s == %s: %a vs %a", #a, #b, a_, b_);                              \
  } while (0)

/* Decoded members land here: one more than the limit, so that a list over
 * the limit meets the limit and not the caller's cap. */
static proto_group_member mem[NMAX + 1], mem2[NMAX + 1];
/* Encodings: 1024 members with the longest addresses take about 316 KiB. */
static uint8_t enc[1 << 19], enc2[1 << 19];

/* ---- decoding and comparing ---------------------------------------------- */

static bool all_zero(const proto_group_msg *m) {
  static const proto_group_msg zero;
  return memcmp(m, &zero, sizeof *m) == 0;
}

/* proto_group_decode into *m, first filled with junk: a refusal must
 * leave it all zero. */
static int decode(const uint8_t *buf, size_t len, proto_group_msg *m,
                  proto_group_member *v, size_t cap) {
  memset(m, 0xa5, sizeof *m);
  int rc = proto_group_decode(buf, len, m, v, cap);
  if (rc && !all_zero(m))
    FAIL("a refusal (%s) left the message set", bee_errname(rc));
  return rc;
}

static void member_eq(const proto_group_member *a,
                      const proto_group_member *b) {
  ASSERT_MEMEQ(a->id, b->id, PROTO_ID_BYTES);
  ASSERT_STREQ(a->addr, b->addr);
  ASSERT_EQ(a->mode, b->mode);
  ASSERT_F64EQ(a->bandwidth_mbit, b->bandwidth_mbit);
  ASSERT_F64EQ(a->weight, b->weight);
}

/* b, decoded, equals a in every field a's type uses and is zero in the
 * others. */
static void msg_eq(const proto_group_msg *a, const proto_group_msg *b) {
  proto_group_msg z;
  memcpy(&z, b, sizeof z);
  ASSERT_EQ(a->type, b->type);
  z.type = 0;
  switch (a->type) {
  case PROTO_T_AVG_JOIN:
    ASSERT_UEQ(a->nonce, b->nonce);
    ASSERT_UEQ(a->expiration, b->expiration);
    ASSERT_STREQ(a->info.run, b->info.run);
    ASSERT_UEQ(a->info.round, b->info.round);
    ASSERT_STREQ(a->info.bits, b->info.bits);
    ASSERT_STREQ(a->info.addr, b->info.addr);
    ASSERT_MEMEQ(a->info.schema_hash, b->info.schema_hash,
                 PROTO_SCHEMA_HASH_BYTES);
    ASSERT_EQ(a->info.mode, b->info.mode);
    ASSERT_F64EQ(a->info.bandwidth_mbit, b->info.bandwidth_mbit);
    ASSERT_F64EQ(a->info.weight, b->info.weight);
    z.nonce = z.expiration = 0;
    memset(&z.info, 0, sizeof z.info);
    break;
  case PROTO_T_AVG_BEGIN:
    ASSERT_MEMEQ(a->group, b->group, PROTO_AVG_GROUP_BYTES);
    ASSERT_UEQ(a->round, b->round);
    ASSERT_UEQ(a->nmembers, b->nmembers);
    for (size_t i = 0; i < a->nmembers; i++)
      member_eq(&a->members[i], &b->members[i]);
    memset(z.group, 0, sizeof z.group);
    z.round = 0;
    z.nmembers = 0;
    z.members = NULL;
    break;
  default: /* REPLY, LEAVE */
    if (a->type == PROTO_T_AVG_REPLY)
      ASSERT_UEQ(a->nonce, b->nonce);
    ASSERT_UEQ(a->code, b->code);
    ASSERT_EQ(a->has_leader, b->has_leader);
    if (a->has_leader) {
      ASSERT_MEMEQ(a->leader, b->leader, PROTO_ID_BYTES);
      ASSERT_STREQ(a->leader_addr, b->leader_addr);
    }
    z.nonce = 0;
    z.code = 0;
    z.has_leader = false;
    memset(z.leader, 0, sizeof z.leader);
    memset(z.leader_addr, 0, sizeof z.leader_addr);
    break;
  }
  if (!all_zero(&z))
    FAIL("type %d: a field it does not use is set", a->type);
}

/* Every prefix of buf[0..len) (each step-th, and all of the last 64), in
 * a buffer of its own size so that ASan sees any over-read, is
 * BEE_ETRUNCATED; one byte more is BEE_ETRAILING. */
static void check_cuts(const uint8_t *buf, size_t len, size_t step) {
  proto_group_msg m;
  for (size_t i = 0; i < len; i += i + 64 < len ? step : 1) {
    uint8_t *part = malloc(i ? i : 1);
    ASSERT(part);
    memcpy(part, buf, i);
    ASSERT_CODE(decode(part, i, &m, mem2, NMAX), BEE_ETRUNCATED,
                "cut at %zu of %zu", i, len);
    free(part);
  }
  uint8_t *more = malloc(len + 1);
  ASSERT(more);
  memcpy(more, buf, len);
  more[len] = 0xc0;
  ASSERT_CODE(decode(more, len + 1, &m, mem2, NMAX), BEE_ETRAILING,
              "%zu bytes and one more", len);
  free(more);
}

/* Encodes m (within proto_group_encoded_max, in exactly its length and not
 * one byte less), decodes it, compares, and encodes the decoded message
 * to the same bytes; then the cuts.  Returns the length, the bytes in
 * enc. */
static size_t roundtrip(const proto_group_msg *m, size_t cut_step) {
  proto_group_msg d;
  size_t len = 0, len2 = 0;
  ASSERT_OK(proto_group_encode(m, enc, sizeof enc, &len));
  ASSERT_LE(len, proto_group_encoded_max(m));
  ASSERT_OK(proto_group_encode(m, enc2, len, &len2));
  ASSERT_UEQ(len2, len);
  ASSERT_MEMEQ(enc2, enc, len);
  ASSERT_RC(proto_group_encode(m, enc2, len - 1, &len2), BEE_ETOOBIG);
  ASSERT_OK(decode(enc, len, &d, mem, NMAX));
  msg_eq(m, &d);
  if (d.type == PROTO_T_AVG_BEGIN)
    ASSERT(d.members == mem);
  ASSERT_OK(proto_group_encode(&d, enc2, sizeof enc2, &len2));
  ASSERT_UEQ(len2, len);
  ASSERT_MEMEQ(enc2, enc, len);
  check_cuts(enc, len, cut_step);
  return len;
}

static void fill(char *s, size_t n, char c) {
  memset(s, c, n);
  s[n] = 0;
}

/* ---- the example and the round trips ------------------------------------- */


#define HASH5C                                                                 \
  "5c5c5c5c5c5c5c5c5c5c5c5c5c5c5c5c5c5c5c5c5c5c5c5c5c5c5c5c5c5c5c5c"

/* A JOIN with its fields filled as docs/PROTOCOL.md's example. */
static proto_group_msg example_join(void) {
  proto_group_msg m = {.type = PROTO_T_AVG_JOIN,
                       .nonce = 1,
                       .expiration = 1700000000,
                       .info = {.round = 3,
                                .mode = PROTO_MODE_NODE,
                                .bandwidth_mbit = 100,
                                .weight = 32}};
  strcpy(m.info.run, "demo");
  strcpy(m.info.bits, "01");
  strcpy(m.info.addr, "h.io:900");
  memset(m.info.schema_hash, 0x5c, PROTO_SCHEMA_HASH_BYTES);
  return m;
}

/* The exact bytes another implementation must write. */
static void test_example(void) {
  uint8_t want[128];
  size_t len, n = test_unhex("9c 01 3f 01 ce 6553f100 a4 64656d6f 03 a2 3031 "
                        "a8 682e696f3a393030 c4 20 " HASH5C " 00 "
                        "cb 4059000000000000 cb 4040000000000000",
                        want);
  proto_group_msg m = example_join(), d;
  ASSERT_UEQ(n, 80);
  ASSERT_OK(proto_group_encode(&m, enc, sizeof enc, &len));
  ASSERT_UEQ(len, n);
  ASSERT_MEMEQ(enc, want, n);
  ASSERT_OK(decode(want, n, &d, NULL, 0));
  msg_eq(&m, &d);
  /* Not a payload of the round, nor the other way round. */
  proto_avg_msg a;
  ASSERT_RC(proto_avg_decode(want, n, &a), BEE_EUNKNOWN);
  n = test_unhex("95 01 3e c4 10 5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a e7 a3 616263",
            want);
  ASSERT_OK(proto_avg_decode(want, n, &a));
  ASSERT_RC(decode(want, n, &d, mem, NMAX), BEE_EUNKNOWN);
}

/* The id of member i: 0x11 bytes, the last two xored with i. */
static void member_id(size_t i, uint8_t id[PROTO_ID_BYTES]) {
  memset(id, 0x11, PROTO_ID_BYTES);
  id[PROTO_ID_BYTES - 2] ^= (uint8_t)(i >> 8);
  id[PROTO_ID_BYTES - 1] ^= (uint8_t)i;
}

static void test_roundtrip(void) {
  static proto_group_member v[NMAX];
  proto_group_msg m = example_join();
  roundtrip(&m, 1);

  /* JOIN: the shortest strings, a CLIENT's zero expiration, -0.0; then
   * the longest strings and the largest numbers. */
  m = (proto_group_msg){.type = PROTO_T_AVG_JOIN,
                        .info = {.mode = PROTO_MODE_CLIENT,
                                 .bandwidth_mbit = DBL_TRUE_MIN,
                                 .weight = -0.0}};
  strcpy(m.info.run, "r");
  strcpy(m.info.addr, "h:1");
  roundtrip(&m, 1);
  m.nonce = m.expiration = m.info.round = UINT64_MAX;
  fill(m.info.run, PROTO_RUN_MAX, '-');
  fill(m.info.bits, PROTO_BITS_MAX, '1');
  m.info.bits[5] = '0';
  fill(m.info.addr, PROTO_ADDR_MAX - 1, 'h');
  memset(m.info.schema_hash, 0xff, PROTO_SCHEMA_HASH_BYTES);
  m.info.mode = PROTO_MODE_AUX;
  m.info.bandwidth_mbit = m.info.weight = DBL_MAX;
  size_t len = roundtrip(&m, 1);
  ASSERT_UEQ(len, 3 + 9 + 9 + 66 + 9 + 17 + 264 + 34 + 1 + 9 + 9);

  /* REPLY: every code, the leader with NOT_A_LEADER only. */
  for (uint32_t code = 0; code <= PROTO_JOIN_CODE_MAX; code++) {
    m = (proto_group_msg){.type = PROTO_T_AVG_REPLY,
                          .nonce = (uint64_t)code << 40 | code,
                          .code = code};
    if (code == PROTO_JOIN_NOT_A_LEADER) {
      m.has_leader = true;
      memset(m.leader, 0x33, PROTO_ID_BYTES);
      strcpy(m.leader_addr, "[2001:db8::1]:45555");
    }
    roundtrip(&m, 1);
  }
  m.nonce = UINT64_MAX;
  m.code = PROTO_JOIN_NOT_A_LEADER;
  m.has_leader = true;
  memset(m.leader, 0xff, PROTO_ID_BYTES);
  fill(m.leader_addr, PROTO_ADDR_MAX - 1, 'a');
  len = roundtrip(&m, 1);
  ASSERT_UEQ(len, 3 + 9 + 1 + 22 + 264);

  /* LEAVE: every code, the leader with MOVED only. */
  for (uint32_t code = 1; code <= PROTO_LEAVE_CODE_MAX; code++) {
    m = (proto_group_msg){.type = PROTO_T_AVG_LEAVE, .code = code};
    if (code == PROTO_LEAVE_MOVED) {
      m.has_leader = true;
      memset(m.leader, 0xff, PROTO_ID_BYTES);
      fill(m.leader_addr, PROTO_ADDR_MAX - 1, 'l');
    }
    len = roundtrip(&m, 1);
    ASSERT_UEQ(len, m.has_leader ? 3 + 1 + 22 + 264 : 6);
  }

  /* BEGIN: one member, three, then 1024 with the longest addresses. */
  memset(v, 0, sizeof v);
  m = (proto_group_msg){.type = PROTO_T_AVG_BEGIN, .members = v};
  memset(m.group, 0x5a, sizeof m.group);
  member_id(0, v[0].id);
  strcpy(v[0].addr, "10.0.0.1:45555");
  v[0].bandwidth_mbit = 1;
  m.nmembers = 1;
  roundtrip(&m, 1);
  for (size_t i = 1; i < 3; i++) {
    member_id(i, v[i].id);
    snprintf(v[i].addr, sizeof v[i].addr, "peer%zu.example:%zu", i, 45555 + i);
    v[i].mode = (int)i;
    v[i].bandwidth_mbit = 100.0 * (double)i;
    v[i].weight = i == 1 ? -0.0 : 1e300;
  }
  m.nmembers = 3;
  m.round = 12;
  roundtrip(&m, 1);
  for (size_t i = 0; i < NMAX; i++) {
    member_id(i, v[i].id);
    fill(v[i].addr, PROTO_ADDR_MAX - 1, (char)('a' + i % 26));
    v[i].mode = PROTO_MODE_AUX;
    v[i].bandwidth_mbit = v[i].weight = DBL_MAX;
  }
  memset(m.group, 0xff, sizeof m.group);
  m.round = UINT64_MAX;
  m.nmembers = NMAX;
  len = roundtrip(&m, 4099);
  ASSERT_UEQ(len, 3 + 18 + 9 + 3 + NMAX * (1 + 22 + 264 + 1 + 9 + 9));
  ASSERT_LE(len, proto_group_encoded_max(&m));
}

/* The caller's cap on members, and the members left alone by the other
 * types. */
static void test_cap(void) {
  proto_group_member v[2] = {{.addr = "a:1", .bandwidth_mbit = 1},
                             {.addr = "b:1", .bandwidth_mbit = 2}};
  member_id(0, v[0].id);
  member_id(1, v[1].id);
  proto_group_msg m = {.type = PROTO_T_AVG_BEGIN, .nmembers = 2, .members = v},
                  d;
  proto_group_member out[2];
  size_t len;
  ASSERT_OK(proto_group_encode(&m, enc, sizeof enc, &len));
  ASSERT_RC(decode(enc, len, &d, out, 1), BEE_ETOOBIG);
  ASSERT_RC(decode(enc, len, &d, NULL, 0), BEE_ETOOBIG);
  ASSERT_OK(decode(enc, len, &d, out, 2));
  ASSERT(d.members == out);
  msg_eq(&m, &d);

  m = example_join();
  ASSERT_OK(proto_group_encode(&m, enc, sizeof enc, &len));
  proto_group_member before[2];
  memset(out, 0xa5, sizeof out);
  memcpy(before, out, sizeof before);
  ASSERT_OK(decode(enc, len, &d, out, 2));
  ASSERT_MEMEQ(out, before, sizeof out);
  ASSERT(d.members == NULL);
}

/* ---- hand-built msgpack -------------------------------------------------- */

/* Messages the encoder refuses to write, with testlib's hb_ writers; the
 * members are this test's own. */

/* Member i of a good list: its id, a 100-byte address (so that a few
 * members outweigh the decoder's per-member minimum), NODE, 10, 1. */
static void h_member(size_t i) {
  uint8_t id[PROTO_ID_BYTES];
  member_id(i, id);
  hb_arr(5);
  hb_byte(0xc5), hb_be(PROTO_ID_BYTES, 2), hb_raw(id, PROTO_ID_BYTES);
  hb_fill(false, 100, 'm');
  hb_uint(PROTO_MODE_NODE);
  hb_f64(10);
  hb_f64(1);
}
static void h_members(size_t n) {
  hb_arr(n);
  for (size_t i = 0; i < n; i++)
    h_member(i);
}

/* ---- the schemas, as the test sees them ---------------------------------- */

enum kind {
  K_UINT,    /* any uint */
  K_RUN,     /* str 1..64 of [A-Za-z0-9._-] */
  K_BITS,    /* str 0..16 of '0'/'1' */
  K_ADDR,    /* str 1..261 of printable ASCII without spaces */
  K_LADDR,   /* the same, as the leader's address: nil is a missing half */
  K_HASH,    /* bin 32 */
  K_MODE,    /* uint 0..2 */
  K_POS,     /* float64, finite, > 0: bandwidth */
  K_F64,     /* float64, finite, >= 0: weight */
  K_RCODE,   /* REPLY code without a leader: 0..7 but 5 */
  K_RCODE5,  /* REPLY code with a leader: 5 (NOT_A_LEADER) only */
  K_LCODE,   /* LEAVE code without a leader: 1 or 3 */
  K_LCODE2,  /* LEAVE code with a leader: 2 (MOVED) only */
  K_NIL,     /* leader or leader_addr where the code takes none */
  K_LEADER,  /* bin 20 */
  K_ID,      /* a member's id: bin 20, not the first member's */
  K_GROUP,   /* bin 16 */
  K_MEMBERS, /* array of 1..1024 members */
  K_COUNT
};

/* A message type with good fields; member: the fields are those of the
 * second member of a BEGIN whose first member is good. */
typedef struct schema {
  const char *name;
  int type;
  bool member;
  size_t n;
  enum kind k[10];
} schema;

/* Hand-made tables and byte strings below are kept as written. */
/* clang-format off */
static const schema schemas[] = {
    {"JOIN", PROTO_T_AVG_JOIN, false, 10,
     {K_UINT, K_UINT, K_RUN, K_UINT, K_BITS, K_ADDR, K_HASH, K_MODE, K_POS,
      K_F64}},
    {"REPLY", PROTO_T_AVG_REPLY, false, 4, {K_UINT, K_RCODE, K_NIL, K_NIL}},
    {"REPLY NOT_A_LEADER", PROTO_T_AVG_REPLY, false, 4,
     {K_UINT, K_RCODE5, K_LEADER, K_LADDR}},
    {"BEGIN", PROTO_T_AVG_BEGIN, false, 3, {K_GROUP, K_UINT, K_MEMBERS}},
    {"BEGIN member", PROTO_T_AVG_BEGIN, true, 5,
     {K_ID, K_ADDR, K_MODE, K_POS, K_F64}},
    {"LEAVE", PROTO_T_AVG_LEAVE, false, 3, {K_LCODE, K_NIL, K_NIL}},
    {"LEAVE MOVED", PROTO_T_AVG_LEAVE, false, 3, {K_LCODE2, K_LEADER, K_LADDR}},
};
/* clang-format on */
#define NSCHEMAS (sizeof schemas / sizeof schemas[0])

/* A good value for a field of kind k. */
static void h_good(enum kind k) {
  switch (k) {
  case K_UINT: hb_uint(7); break;
  case K_RUN: hb_str("demo-1.b_c"); break;
  case K_BITS: hb_str("0110"); break;
  case K_ADDR:
  case K_LADDR: hb_str("[2001:db8::1]:45555"); break;
  case K_HASH: hb_fill(true, PROTO_SCHEMA_HASH_BYTES, 0x5c); break;
  case K_MODE: hb_uint(PROTO_MODE_AUX); break;
  case K_POS: hb_f64(2.5); break;
  case K_F64: hb_f64(1.5); break;
  case K_RCODE: hb_uint(PROTO_JOIN_GROUP_FULL); break;
  case K_RCODE5: hb_uint(PROTO_JOIN_NOT_A_LEADER); break;
  case K_LCODE: hb_uint(PROTO_LEAVE_GONE); break;
  case K_LCODE2: hb_uint(PROTO_LEAVE_MOVED); break;
  case K_NIL: hb_byte(0xc0); break;
  case K_LEADER: hb_fill(true, PROTO_ID_BYTES, 0x33); break;
  case K_ID: hb_fill(true, PROTO_ID_BYTES, 0x22); break;
  case K_GROUP: hb_fill(true, PROTO_AVG_GROUP_BYTES, 0x5a); break;
  case K_MEMBERS: h_members(2); break;
  case K_COUNT: break;
  }
}

/* Member lists the table cannot spell as bytes. */
static void b_one(void) { h_members(1); }
static void b_max(void) { h_members(NMAX); }
static void b_over(void) { h_members(NMAX + 1); }
static void b_arr32(void) { hb_byte(0xdd), hb_be(1, 4), h_member(0); }
static void b_twice(void) { hb_arr(2), h_member(0), h_member(0); }
static void b_uint_member(void) { hb_arr(2), hb_byte(0x01), h_member(1); }
static void b_empty_member(void) { hb_arr(2), hb_byte(0x90), h_member(1); }

/* One replacement for a field: the bytes of raw, or what build writes,
 * or a str (a bin with is_bin) of fill_n bytes of fill.  kinds says which
 * fields it replaces; code is what the decoder must answer (0:
 * accepted). */
typedef struct subst {
  unsigned kinds;
  const char *what;
  const char *raw;
  size_t raw_n;
  char fill;
  size_t fill_n;
  bool is_bin;
  void (*build)(void);
  int code;
} subst;

#define KB(k) (1u << (k))
#define CODES (KB(K_RCODE) | KB(K_RCODE5) | KB(K_LCODE) | KB(K_LCODE2))
#define INTS (KB(K_UINT) | KB(K_MODE) | CODES)
#define FLOATS (KB(K_POS) | KB(K_F64))
#define ADDRS (KB(K_ADDR) | KB(K_LADDR))
#define STRS (KB(K_RUN) | KB(K_BITS) | ADDRS)
#define BINS (KB(K_HASH) | KB(K_LEADER) | KB(K_ID) | KB(K_GROUP))
#define IDS (KB(K_LEADER) | KB(K_ID))
#define ALL (KB(K_COUNT) - 1)
#define VALUED (ALL & ~KB(K_NIL))
#define RAW(s) .raw = s, .raw_n = sizeof(s) - 1
#define STR(c, n) .fill = c, .fill_n = n
#define BIN(c, n) .fill = c, .fill_n = n, .is_bin = true
#define BUILD(f) .build = f

/* clang-format off */
static const subst substs[] = {
    /* Any field. */
    {VALUED, "reserved byte 0xc1", RAW("\xc1"), .code = BEE_EMALFORMED},
    {VALUED & ~KB(K_MEMBERS), "array", RAW("\x90"), .code = BEE_ETYPE},
    {VALUED, "map", RAW("\x80"), .code = BEE_ETYPE},
    {VALUED, "bool", RAW("\xc3"), .code = BEE_ETYPE},
    {VALUED & ~IDS & ~KB(K_LADDR), "nil", RAW("\xc0"), .code = BEE_ETYPE},
    /* The leader and its address: both nil, or both there, as the code
     * says; a missing half is a range error, not a type error. */
    {KB(K_LEADER) | KB(K_LADDR), "nil", RAW("\xc0"), .code = BEE_ERANGE},
    {KB(K_NIL), "a leader", BIN(0x33, 20), .code = BEE_ERANGE},
    {KB(K_NIL), "an address", RAW("\xa3" "h:1"), .code = BEE_ERANGE},
    {KB(K_NIL), "false", RAW("\xc2"), .code = BEE_ERANGE},
    {KB(K_NIL), "reserved byte 0xc1", RAW("\xc1"), .code = BEE_ERANGE},
    /* Integers. */
    {INTS, "str", RAW("\xa1" "7"), .code = BEE_ETYPE},
    {INTS, "float64", RAW("\xcb\x3f\xf0\0\0\0\0\0\0"), .code = BEE_ETYPE},
    {INTS, "negative", RAW("\xff"), .code = BEE_ERANGE},
    {INTS, "negative int64", RAW("\xd3\x80\0\0\0\0\0\0\0"), .code = BEE_ERANGE},
    {KB(K_UINT), "uint8 width", RAW("\xcc\x00"), .code = 0},
    {KB(K_UINT), "largest", RAW("\xcf\xff\xff\xff\xff\xff\xff\xff\xff"),
     .code = 0},
    {KB(K_MODE) | CODES, "2^64-1", RAW("\xcf\xff\xff\xff\xff\xff\xff\xff\xff"),
     .code = BEE_ERANGE},
    {KB(K_MODE) | CODES, "2^32", RAW("\xcf\0\0\0\x01\0\0\0\0"),
     .code = BEE_ERANGE},
    {KB(K_MODE), "mode 0 as uint8", RAW("\xcc\x00"), .code = 0},
    {KB(K_MODE), "mode 3", RAW("\x03"), .code = BEE_ERANGE},
    {KB(K_RCODE), "ACCEPTED", RAW("\x00"), .code = 0},
    {KB(K_RCODE), "NOT_LOOKING", RAW("\x01"), .code = 0},
    {KB(K_RCODE), "BAD_SCHEMA", RAW("\x02"), .code = 0},
    {KB(K_RCODE), "BAD_KEY", RAW("\x03"), .code = 0},
    {KB(K_RCODE), "YOU_LEAD", RAW("\x06"), .code = 0},
    {KB(K_RCODE), "BAD_EXPIRATION", RAW("\x07"), .code = 0},
    {KB(K_RCODE), "NOT_A_LEADER without a leader", RAW("\x05"),
     .code = BEE_ERANGE},
    {KB(K_RCODE) | KB(K_RCODE5), "code 8", RAW("\x08"), .code = BEE_ERANGE},
    {KB(K_RCODE5), "ACCEPTED with a leader", RAW("\x00"), .code = BEE_ERANGE},
    {KB(K_RCODE5), "YOU_LEAD with a leader", RAW("\x06"), .code = BEE_ERANGE},
    {KB(K_LCODE), "DISBANDED", RAW("\x01"), .code = 0},
    {KB(K_LCODE) | KB(K_LCODE2), "code 0", RAW("\x00"), .code = BEE_ERANGE},
    {KB(K_LCODE) | KB(K_LCODE2), "code 4", RAW("\x04"), .code = BEE_ERANGE},
    {KB(K_LCODE), "MOVED without a leader", RAW("\x02"), .code = BEE_ERANGE},
    {KB(K_LCODE2), "DISBANDED with a leader", RAW("\x01"), .code = BEE_ERANGE},
    {KB(K_LCODE2), "GONE with a leader", RAW("\x03"), .code = BEE_ERANGE},
    /* Floats: float64 only, finite, with the sign each field takes. */
    {FLOATS, "float32", RAW("\xca\x3f\x80\0\0"), .code = BEE_ETYPE},
    {FLOATS, "uint", RAW("\x01"), .code = BEE_ETYPE},
    {FLOATS, "NaN", RAW("\xcb\x7f\xf8\0\0\0\0\0\0"), .code = BEE_ERANGE},
    {FLOATS, "signalling NaN", RAW("\xcb\x7f\xf0\0\0\0\0\0\x01"),
     .code = BEE_ERANGE},
    {FLOATS, "negative NaN", RAW("\xcb\xff\xf8\0\0\0\0\0\0"),
     .code = BEE_ERANGE},
    {FLOATS, "+Inf", RAW("\xcb\x7f\xf0\0\0\0\0\0\0"), .code = BEE_ERANGE},
    {FLOATS, "-Inf", RAW("\xcb\xff\xf0\0\0\0\0\0\0"), .code = BEE_ERANGE},
    {FLOATS, "DBL_MAX", RAW("\xcb\x7f\xef\xff\xff\xff\xff\xff\xff"), .code = 0},
    {FLOATS, "smallest denormal", RAW("\xcb\0\0\0\0\0\0\0\x01"), .code = 0},
    {FLOATS, "-1.0", RAW("\xcb\xbf\xf0\0\0\0\0\0\0"), .code = BEE_ERANGE},
    {FLOATS, "-denormal", RAW("\xcb\x80\0\0\0\0\0\0\x01"), .code = BEE_ERANGE},
    {KB(K_F64), "0.0", RAW("\xcb\0\0\0\0\0\0\0\0"), .code = 0},
    {KB(K_F64), "-0.0", RAW("\xcb\x80\0\0\0\0\0\0\0"), .code = 0},
    {KB(K_POS), "0.0", RAW("\xcb\0\0\0\0\0\0\0\0"), .code = BEE_ERANGE},
    {KB(K_POS), "-0.0", RAW("\xcb\x80\0\0\0\0\0\0\0"), .code = BEE_ERANGE},
    /* Strings. */
    {STRS, "uint", RAW("\x01"), .code = BEE_ETYPE},
    {STRS, "bin", RAW("\xc4\x01" "1"), .code = BEE_ETYPE},
    {STRS, "NUL inside", RAW("\xa3" "1\0" "1"), .code = BEE_ERANGE},
    {KB(K_RUN) | ADDRS, "empty", RAW("\xa0"), .code = BEE_ERANGE},
    {KB(K_BITS), "empty", RAW("\xa0"), .code = 0},
    {KB(K_RUN), "64 bytes", STR('r', 64), .code = 0},
    {KB(K_RUN), "65 bytes", STR('r', 65), .code = BEE_ETOOBIG},
    {KB(K_RUN), "a space", RAW("\xa3" "a b"), .code = BEE_ERANGE},
    {KB(K_RUN), "a slash", RAW("\xa3" "a/b"), .code = BEE_ERANGE},
    {KB(K_BITS), "16 bits", STR('1', 16), .code = 0},
    {KB(K_BITS), "17 bits", STR('0', 17), .code = BEE_ETOOBIG},
    {KB(K_BITS), "a '2'", RAW("\xa3" "012"), .code = BEE_ERANGE},
    {KB(K_BITS), "a space", RAW("\xa3" "0 1"), .code = BEE_ERANGE},
    {ADDRS, "261 bytes", STR('h', 261), .code = 0},
    {ADDRS, "262 bytes", STR('h', 262), .code = BEE_ETOOBIG},
    {ADDRS, "a space", RAW("\xa4" "h :1"), .code = BEE_ERANGE},
    {ADDRS, "a tab", RAW("\xa4" "h\t:1"), .code = BEE_ERANGE},
    {ADDRS, "newline", RAW("\xa4" "h:1\n"), .code = BEE_ERANGE},
    {ADDRS, "escape", RAW("\xa4\x1b[2J"), .code = BEE_ERANGE},
    {ADDRS, "DEL", RAW("\xa4" "h:1\x7f"), .code = BEE_ERANGE},
    {ADDRS, "non-ASCII", RAW("\xa4\xc3\xa9:1"), .code = BEE_ERANGE},
    /* Bins of a fixed size. */
    {BINS, "uint", RAW("\x01"), .code = BEE_ETYPE},
    {BINS, "empty bin", BIN(1, 0), .code = BEE_ERANGE},
    {KB(K_HASH), "31 bytes", BIN(1, 31), .code = BEE_ERANGE},
    {KB(K_HASH), "33 bytes", BIN(1, 33), .code = BEE_ERANGE},
    {KB(K_HASH), "str of 32", STR('h', 32), .code = BEE_ETYPE},
    {KB(K_GROUP), "15 bytes", BIN(1, 15), .code = BEE_ERANGE},
    {KB(K_GROUP), "17 bytes", BIN(1, 17), .code = BEE_ERANGE},
    {KB(K_GROUP), "str of 16", STR('g', 16), .code = BEE_ETYPE},
    {IDS, "19 bytes", BIN(1, 19), .code = BEE_ERANGE},
    {IDS, "21 bytes", BIN(1, 21), .code = BEE_ERANGE},
    {IDS, "str of 20", STR('i', 20), .code = BEE_ETYPE},
    {KB(K_LEADER), "the first member's id", BIN(0x11, 20), .code = 0},
    {KB(K_ID), "the first member's id", BIN(0x11, 20), .code = BEE_ERANGE},
    /* The member list. */
    {KB(K_MEMBERS), "no members", RAW("\x90"), .code = BEE_ERANGE},
    {KB(K_MEMBERS), "uint", RAW("\x01"), .code = BEE_ETYPE},
    {KB(K_MEMBERS), "one member", BUILD(b_one), .code = 0},
    {KB(K_MEMBERS), "1024 members", BUILD(b_max), .code = 0},
    {KB(K_MEMBERS), "1025 members", BUILD(b_over), .code = BEE_ETOOBIG},
    {KB(K_MEMBERS), "array32 of one", BUILD(b_arr32), .code = 0},
    {KB(K_MEMBERS), "one member twice", BUILD(b_twice), .code = BEE_ERANGE},
    {KB(K_MEMBERS), "a member that is a uint", BUILD(b_uint_member),
     .code = BEE_ETYPE},
    {KB(K_MEMBERS), "a member of no fields", BUILD(b_empty_member),
     .code = BEE_EMISSING},
    {KB(K_MEMBERS), "a count over the bytes left", RAW("\xdc\x03\xe8"),
     .code = BEE_ETRUNCATED},
    /* Two members cannot fit in 4 bytes: refused before either is read. */
    {KB(K_MEMBERS), "two members in 4 bytes", RAW("\x92\x91\x90\x91\x90"),
     .code = BEE_ETRUNCATED},
};
/* clang-format on */
#define NSUBSTS (sizeof substs / sizeof substs[0])

static void h_fields(const schema *s, size_t bad, const subst *x,
                     size_t nfields) {
  for (size_t i = 0; i < nfields; i++) {
    if (i >= s->n)
      hb_uint(i);
    else if (i != bad)
      h_good(s->k[i]);
    else if (x->build)
      x->build();
    else if (x->raw)
      hb_raw(x->raw, x->raw_n);
    else
      hb_fill(x->is_bin, x->fill_n, (uint8_t)x->fill);
  }
}

/* [version, type, the schema's fields...] with field `bad` (if below
 * s->n) replaced by *x, nfields fields in all (fewer: a prefix; more:
 * good uints after the known ones).  For a member schema these are the
 * second member's fields. */
static void h_msg(const schema *s, size_t bad, const subst *x, size_t nfields,
                  uint64_t version, uint64_t type) {
  test_hn = 0;
  if (!s->member) {
    hb_arr(2 + nfields), hb_uint(version), hb_uint(type);
    h_fields(s, bad, x, nfields);
    return;
  }
  hb_arr(5), hb_uint(version), hb_uint(type);
  h_good(K_GROUP), h_good(K_UINT);
  hb_arr(2), h_member(0);
  hb_arr(nfields);
  h_fields(s, bad, x, nfields);
}

/* What the decoder accepts, the encoder writes again, no longer (minimal
 * widths), and that decodes to the same message. */
static void check_reencode(const proto_group_msg *m, size_t n) {
  proto_group_msg d;
  size_t len;
  ASSERT_OK(proto_group_encode(m, enc, sizeof enc, &len));
  ASSERT_LE(len, n);
  ASSERT_LE(len, proto_group_encoded_max(m));
  ASSERT_OK(decode(enc, len, &d, mem2, NMAX));
  msg_eq(m, &d);
}

/* ---- malformed fields, by table ------------------------------------------ */

/* Each field of each schema, replaced in turn by every substitute that
 * fits its kind, must give the substitute's code. */
static void test_fields(void) {
  size_t cases = 0;
  for (size_t si = 0; si < NSCHEMAS; si++) {
    const schema *s = &schemas[si];
    for (size_t f = 0; f < s->n; f++)
      for (size_t xi = 0; xi < NSUBSTS; xi++) {
        const subst *x = &substs[xi];
        proto_group_msg m;
        if (!(x->kinds & KB(s->k[f])))
          continue;
        h_msg(s, f, x, s->n, 1, (uint64_t)s->type);
        ASSERT_CODE(decode(test_hb, test_hn, &m, mem, NMAX + 1), x->code,
                    "%s field %zu: %s", s->name, f, x->what);
        if (x->code == 0)
          check_reencode(&m, test_hn);
        cases++;
      }
  }
  ASSERT_GE(cases, 350); /* 404 when written: the loops ran */
}

/* The head, the field counts, the end, and every cut of a good message. */
static void test_shape(void) {
  static const subst none = {0};
  proto_group_msg m;
  for (size_t si = 0; si < NSCHEMAS; si++) {
    const schema *s = &schemas[si];
    uint64_t type = (uint64_t)s->type;
    h_msg(s, SIZE_MAX, &none, s->n, 1, type);
    ASSERT_CODE(decode(test_hb, test_hn, &m, mem, NMAX), 0, "good %s", s->name);
    check_reencode(&m, test_hn);
    check_cuts(test_hb, test_hn, 1);

    /* Too few fields (for a member: a member array of 0..4), too many. */
    for (size_t k = 0; k < s->n; k++) {
      h_msg(s, SIZE_MAX, &none, k, 1, type);
      ASSERT_CODE(decode(test_hb, test_hn, &m, mem, NMAX), BEE_EMISSING,
                  "%s with %zu fields", s->name, k);
    }
    for (size_t k = s->n + 1; k <= s->n + 2; k++) {
      h_msg(s, SIZE_MAX, &none, k, 1, type);
      ASSERT_CODE(decode(test_hb, test_hn, &m, mem, NMAX), BEE_ETYPE,
                  "%s with %zu fields", s->name, k);
    }

    /* The version: 1 only. */
    static const uint64_t versions[] = {0, 2, 255, UINT64_MAX};
    for (size_t i = 0; i < 4; i++) {
      h_msg(s, SIZE_MAX, &none, s->n, versions[i], type);
      ASSERT_CODE(decode(test_hb, test_hn, &m, mem, NMAX), BEE_EVERSION,
                  "%s version %" PRIu64, s->name, versions[i]);
    }
    h_msg(s, SIZE_MAX, &none, s->n, 1, type);
    test_hb[3] = 0xff; /* -1 in the version's 0xcf, its 8 bytes cut out */
    memmove(test_hb + 4, test_hb + 12, test_hn - 12);
    test_hn -= 8;
    ASSERT_CODE(decode(test_hb, test_hn, &m, mem, NMAX), BEE_EVERSION,
                "%s version -1", s->name);

    /* The type: 63..66 only, and each with its own field count. */
    static const uint64_t types[] = {0, 60, 62, 67, 255, 256, UINT64_MAX};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
      h_msg(s, SIZE_MAX, &none, s->n, 1, types[i]);
      ASSERT_CODE(decode(test_hb, test_hn, &m, mem, NMAX), BEE_EUNKNOWN,
                  "%s as type %" PRIu64, s->name, types[i]);
    }
    h_msg(s, SIZE_MAX, &none, s->n, 1, type);
    test_hb[12] = 0xff; /* -1 in the type's 0xcf */
    memmove(test_hb + 13, test_hb + 21, test_hn - 21);
    test_hn -= 8;
    ASSERT_CODE(decode(test_hb, test_hn, &m, mem, NMAX), BEE_EUNKNOWN,
                "%s type -1", s->name);
    static const uint8_t nfields[] = {10, 4, 3, 3};
    if (!s->member)
      for (int t = PROTO_T_AVG_JOIN; t <= PROTO_T_AVG_LEAVE; t++) {
        size_t want = nfields[t - PROTO_T_AVG_JOIN];
        if (t == s->type)
          continue;
        h_msg(s, SIZE_MAX, &none, s->n, 1, (uint64_t)t);
        /* The same count: the first field has the wrong msgpack type. */
        ASSERT_CODE(decode(test_hb, test_hn, &m, mem, NMAX),
                    s->n < want ? BEE_EMISSING : BEE_ETYPE,
                    "%s's fields as type %d", s->name, t);
      }
  }

  /* Not an array of at least two; not msgpack. */
  /* clang-format off */
  static const struct {
    const char *raw;
    size_t n;
    int code;
  } heads[] = {
      {"", 0, BEE_ETRUNCATED},      {"\xc1", 1, BEE_EMALFORMED},
      {"\x80", 1, BEE_ETYPE},       {"\xa1" "b", 2, BEE_ETYPE},
      {"\xc0", 1, BEE_ETYPE},       {"\x3f", 1, BEE_ETYPE},
      {"\x90", 1, BEE_EMISSING},    {"\x91\x01", 2, BEE_EMISSING},
      {"\x92\x01\x3f", 3, BEE_EMISSING},
      {"\x92\x02\x3f", 3, BEE_EVERSION},
      {"\x92\x01\x43", 3, BEE_EUNKNOWN},
      {"\x92\xa1" "1\x3f", 4, BEE_ETYPE},
      {"\xdd\xff\xff\xff\xff", 5, BEE_ETRUNCATED},
  };
  /* clang-format on */
  for (size_t i = 0; i < sizeof heads / sizeof heads[0]; i++)
    ASSERT_CODE(
        decode((const uint8_t *)heads[i].raw, heads[i].n, &m, mem, NMAX),
        heads[i].code, "head %zu", i);
}

/* ---- the encoder's refusals ---------------------------------------------- */

/* The encoder refuses what the decoder would, with the same codes, and
 * writes nothing then. */
static void test_encode_refusals(void) {
  static uint8_t buf[4096], junk[4096];
  size_t len = 777;
  memset(junk, 0x3c, sizeof junk);
#define REFUSE(m, want)                                                        \
  do {                                                                         \
    memcpy(buf, junk, sizeof buf);                                             \
    ASSERT_RC(proto_group_encode(&(m), buf, sizeof buf, &len), want);          \
    ASSERT_MEMEQ(buf, junk, sizeof buf);                                       \
    ASSERT_UEQ(len, 777);                                                      \
  } while (0)
  static const double bad_bw[] = {0.0, -0.0,     -1.0,     -DBL_TRUE_MIN,
                                  NAN, INFINITY, -INFINITY};
  static const double bad_weight[] = {-1.0, -DBL_TRUE_MIN, NAN, INFINITY,
                                      -INFINITY};
  const proto_group_msg join = example_join();
  proto_group_msg b = join;

  /* Types outside the family. */
  b.type = PROTO_T_AVG_ABORT;
  REFUSE(b, BEE_EUNKNOWN);
  b.type = PROTO_T_AVG_LEAVE + 1;
  REFUSE(b, BEE_EUNKNOWN);
  b.type = -1;
  REFUSE(b, BEE_EUNKNOWN);
  ASSERT_RC(proto_group_encode(&join, buf, 0, &len), BEE_ETOOBIG);
  ASSERT_RC(proto_group_encode(&join, buf, 79, &len), BEE_ETOOBIG);
  ASSERT_UEQ(len, 777);

  /* JOIN. */
  b = join, b.info.run[0] = 0;
  REFUSE(b, BEE_ERANGE);
  b = join, strcpy(b.info.run, "a b");
  REFUSE(b, BEE_ERANGE);
  b = join, memset(b.info.run, 'r', sizeof b.info.run); /* no NUL: 65+ */
  REFUSE(b, BEE_ETOOBIG);
  b = join, strcpy(b.info.bits, "012");
  REFUSE(b, BEE_ERANGE);
  b = join, memset(b.info.bits, '0', sizeof b.info.bits);
  REFUSE(b, BEE_ETOOBIG);
  b = join, b.info.addr[0] = 0;
  REFUSE(b, BEE_ERANGE);
  b = join, strcpy(b.info.addr, "h :1");
  REFUSE(b, BEE_ERANGE);
  b = join, strcpy(b.info.addr, "h:1\x01");
  REFUSE(b, BEE_ERANGE);
  b = join, memset(b.info.addr, 'h', sizeof b.info.addr);
  REFUSE(b, BEE_ETOOBIG);
  b = join, b.info.mode = 3;
  REFUSE(b, BEE_ERANGE);
  b = join, b.info.mode = -1;
  REFUSE(b, BEE_ERANGE);
  for (size_t i = 0; i < sizeof bad_bw / sizeof bad_bw[0]; i++) {
    b = join, b.info.bandwidth_mbit = bad_bw[i];
    REFUSE(b, BEE_ERANGE);
  }
  for (size_t i = 0; i < sizeof bad_weight / sizeof bad_weight[0]; i++) {
    b = join, b.info.weight = bad_weight[i];
    REFUSE(b, BEE_ERANGE);
  }

  /* REPLY and LEAVE: the codes, and the leader with the codes that take
   * one only. */
  proto_group_msg reply = {.type = PROTO_T_AVG_REPLY, .nonce = 9};
  proto_group_msg moved = {.type = PROTO_T_AVG_LEAVE,
                           .code = PROTO_LEAVE_MOVED,
                           .has_leader = true,
                           .leader_addr = "h:1"};
  ASSERT_OK(proto_group_encode(&reply, buf, sizeof buf, &len));
  ASSERT_OK(proto_group_encode(&moved, buf, sizeof buf, &len));
  len = 777;
  b = reply, b.code = PROTO_JOIN_CODE_MAX + 1;
  REFUSE(b, BEE_ERANGE);
  b = reply, b.code = UINT32_MAX;
  REFUSE(b, BEE_ERANGE);
  b = reply, b.code = PROTO_JOIN_NOT_A_LEADER; /* without its leader */
  REFUSE(b, BEE_ERANGE);
  b = reply, b.has_leader = true, strcpy(b.leader_addr, "h:1");
  REFUSE(b, BEE_ERANGE); /* ACCEPTED with a leader */
  b.code = PROTO_JOIN_NOT_A_LEADER;
  ASSERT_OK(proto_group_encode(&b, buf, sizeof buf, &len));
  len = 777;
  b.leader_addr[0] = 0;
  REFUSE(b, BEE_ERANGE);
  memset(b.leader_addr, 'h', sizeof b.leader_addr);
  REFUSE(b, BEE_ETOOBIG);
  b = moved, b.code = 0;
  REFUSE(b, BEE_ERANGE);
  b = moved, b.code = PROTO_LEAVE_CODE_MAX + 1;
  REFUSE(b, BEE_ERANGE);
  b = moved, b.has_leader = false; /* MOVED without where */
  REFUSE(b, BEE_ERANGE);
  b = moved, b.code = PROTO_LEAVE_DISBANDED; /* with a leader */
  REFUSE(b, BEE_ERANGE);
  b = moved, strcpy(b.leader_addr, "h:\n");
  REFUSE(b, BEE_ERANGE);

  /* BEGIN: the count, unique ids, each member's fields. */
  static proto_group_member v[NMAX + 1];
  for (size_t i = 0; i <= NMAX; i++) {
    member_id(i, v[i].id);
    strcpy(v[i].addr, "h:1");
    v[i].bandwidth_mbit = 1;
  }
  proto_group_msg begin = {
      .type = PROTO_T_AVG_BEGIN, .nmembers = 3, .members = v};
  ASSERT_OK(proto_group_encode(&begin, buf, sizeof buf, &len));
  len = 777;
  b = begin, b.nmembers = 0;
  REFUSE(b, BEE_ERANGE);
  b = begin, b.members = NULL;
  REFUSE(b, BEE_ERANGE);
  b = begin, b.nmembers = NMAX + 1;
  REFUSE(b, BEE_ETOOBIG);
  b = begin, b.nmembers = SIZE_MAX;
  REFUSE(b, BEE_ETOOBIG);
  memcpy(v[2].id, v[0].id, PROTO_ID_BYTES);
  REFUSE(begin, BEE_ERANGE);
  member_id(2, v[2].id);
  proto_group_member keep = v[1];
  v[1].addr[0] = 0;
  REFUSE(begin, BEE_ERANGE);
  strcpy(v[1].addr, "h 1");
  REFUSE(begin, BEE_ERANGE);
  memset(v[1].addr, 'h', sizeof v[1].addr);
  REFUSE(begin, BEE_ETOOBIG);
  v[1] = keep, v[1].mode = 3;
  REFUSE(begin, BEE_ERANGE);
  v[1] = keep, v[1].mode = -1;
  REFUSE(begin, BEE_ERANGE);
  for (size_t i = 0; i < sizeof bad_bw / sizeof bad_bw[0]; i++) {
    v[1] = keep, v[1].bandwidth_mbit = bad_bw[i];
    REFUSE(begin, BEE_ERANGE);
  }
  for (size_t i = 0; i < sizeof bad_weight / sizeof bad_weight[0]; i++) {
    v[1] = keep, v[1].weight = bad_weight[i];
    REFUSE(begin, BEE_ERANGE);
  }
  v[1] = keep;
  ASSERT_OK(proto_group_encode(&begin, buf, sizeof buf, &len));
#undef REFUSE
}

int main(void) {
  test_example();
  test_roundtrip();
  test_cap();
  test_fields();
  test_shape();
  test_encode_refusals();
  printf("group msg: all checks passed\n");
  return 0;
}
