/* test-proto-wire.c: the strict msgpack reader and the capped writer.
 *
 * The reader is what stands between a peer's bytes and everything else,
 * so each msgpack width, sign extension, length field and bound is tried
 * with hand-built bytes, and every failed read must leave the cursor where
 * it was.  The writer is checked for minimal widths and for failing
 * cleanly (BEE_ETOOBIG, never past cap) when its buffer is too small.
 */
#include "proto-int.h"
#include "test.h"

/* A cursor over a byte-string literal (its terminating NUL left out). */
#define RD(r, lit) proto__rd_init((r), (const uint8_t *)(lit), sizeof(lit) - 1)

static void check_uint(const char *bytes, size_t n, uint64_t want) {
  proto_rd r;
  uint64_t v = 0;
  proto__rd_init(&r, (const uint8_t *)bytes, n);
  ASSERT_OK(proto__rd_uint(&r, &v));
  ASSERT_UEQ(v, want);
  ASSERT_OK(proto__rd_end(&r));
}

static void check_int(const char *bytes, size_t n, int64_t want) {
  proto_rd r;
  int64_t v = 0;
  proto__rd_init(&r, (const uint8_t *)bytes, n);
  ASSERT_OK(proto__rd_int(&r, &v));
  ASSERT_EQ(v, want);
  ASSERT_OK(proto__rd_end(&r));
}

/* rd_uint refuses a negative value with BEE_ERANGE, consuming nothing. */
static void check_uint_range(const char *bytes, size_t n) {
  proto_rd r;
  uint64_t v = 7;
  proto__rd_init(&r, (const uint8_t *)bytes, n);
  ASSERT_RC(proto__rd_uint(&r, &v), BEE_ERANGE);
  ASSERT_EQ(proto__rd_left(&r), n);
  ASSERT_UEQ(v, 7);
}

#define UINT(lit, want) check_uint(lit, sizeof(lit) - 1, want)
#define INT(lit, want) check_int(lit, sizeof(lit) - 1, want)
#define NEG(lit) check_uint_range(lit, sizeof(lit) - 1)

static void test_ints(void) {
  UINT("\x00", 0);
  UINT("\x7f", 127);
  UINT("\xcc\xff", 255);
  UINT("\xcd\xff\xff", 65535);
  UINT("\xce\xff\xff\xff\xff", UINT32_MAX);
  UINT("\xcf\xff\xff\xff\xff\xff\xff\xff\xff", UINT64_MAX);
  UINT("\xcf\x00\x00\x00\x00\x00\x00\x00\x01", 1); /* not minimal: fine */
  UINT("\xd0\x7f", 127); /* a signed format holding a non-negative value */
  UINT("\xd3\x7f\xff\xff\xff\xff\xff\xff\xff", INT64_MAX);

  INT("\xff", -1);
  INT("\xe0", -32);
  INT("\xd0\x80", -128);
  INT("\xd0\xff", -1);
  INT("\xd1\x80\x00", INT16_MIN);
  INT("\xd1\xff\x7f", -129);
  INT("\xd2\x80\x00\x00\x00", INT32_MIN);
  INT("\xd2\x7f\xff\xff\xff", INT32_MAX);
  INT("\xd3\x80\x00\x00\x00\x00\x00\x00\x00", INT64_MIN);
  INT("\xcf\x7f\xff\xff\xff\xff\xff\xff\xff", INT64_MAX);
  INT("\xce\xff\xff\xff\xff", UINT32_MAX); /* unsigned, no sign extension */
  INT("\xcc\x80", 128);

  NEG("\xff");
  NEG("\xe0");
  NEG("\xd0\x80");
  NEG("\xd1\x80\x00");
  NEG("\xd2\xff\xff\xff\xff");
  NEG("\xd3\x80\x00\x00\x00\x00\x00\x00\x00");

  /* An unsigned value above INT64_MAX does not fit int64_t. */
  proto_rd r;
  int64_t v;
  RD(&r, "\xcf\x80\x00\x00\x00\x00\x00\x00\x00");
  ASSERT_RC(proto__rd_int(&r, &v), BEE_ERANGE);
  ASSERT_EQ(proto__rd_left(&r), 9);

  /* Other types are not integers; 0xc1 is not msgpack at all. */
  uint64_t u;
  const char *types[] = {"\xc0", "\xc2", "\xa1x",       "\xc4\x01x",
                         "\x90", "\x80", "\xca\0\0\0\0"};
  for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
    proto__rd_init(&r, (const uint8_t *)types[i], 1);
    ASSERT_RC(proto__rd_uint(&r, &u), BEE_ETYPE);
    ASSERT_RC(proto__rd_int(&r, &v), BEE_ETYPE);
  }
  RD(&r, "\xc1");
  ASSERT_RC(proto__rd_uint(&r, &u), BEE_EMALFORMED);
  ASSERT_RC(proto__rd_int(&r, &v), BEE_EMALFORMED);
}

/* Every proper prefix of an integer is BEE_ETRUNCATED, consuming nothing. */
static void test_int_truncated(void) {
  const char *ints[] = {"\xcc\x01",
                        "\xcd\x01\x02",
                        "\xce\x01\x02\x03\x04",
                        "\xcf\x01\x02\x03\x04\x05\x06\x07\x08",
                        "\xd0\x01",
                        "\xd1\x01\x02",
                        "\xd2\x01\x02\x03\x04",
                        "\xd3\x01\x02\x03\x04\x05\x06\x07\x08"};
  size_t lens[] = {2, 3, 5, 9, 2, 3, 5, 9};
  for (size_t i = 0; i < 8; i++) {
    for (size_t k = 0; k < lens[i]; k++) {
      proto_rd r;
      uint64_t u;
      int64_t v;
      proto__rd_init(&r, (const uint8_t *)ints[i], k);
      ASSERT_RC(proto__rd_uint(&r, &u), BEE_ETRUNCATED);
      ASSERT_RC(proto__rd_int(&r, &v), BEE_ETRUNCATED);
      ASSERT_EQ(proto__rd_left(&r), k);
    }
  }
}

static void check_blob(const char *bytes, size_t n, bool bin, size_t hdr) {
  proto_rd r;
  proto_bytes b;
  proto__rd_init(&r, (const uint8_t *)bytes, n);
  /* The other kind is a type error. */
  ASSERT_RC(bin ? proto__rd_str(&r, &b, 100) : proto__rd_bin(&r, &b, 100),
            BEE_ETYPE);
  /* One byte under the length is over the limit. */
  ASSERT_RC(bin ? proto__rd_bin(&r, &b, 2) : proto__rd_str(&r, &b, 2),
            BEE_ETOOBIG);
  ASSERT_EQ(proto__rd_left(&r), n);
  ASSERT_OK(bin ? proto__rd_bin(&r, &b, 3) : proto__rd_str(&r, &b, 3));
  ASSERT_EQ(b.n, 3);
  ASSERT(b.p == (const uint8_t *)bytes + hdr);
  ASSERT_MEMEQ(b.p, "xyz", 3);
  ASSERT_OK(proto__rd_end(&r));
  /* Any prefix is truncated. */
  for (size_t k = 0; k < n; k++) {
    proto__rd_init(&r, (const uint8_t *)bytes, k);
    ASSERT_RC(bin ? proto__rd_bin(&r, &b, 100) : proto__rd_str(&r, &b, 100),
              BEE_ETRUNCATED);
    ASSERT_EQ(proto__rd_left(&r), k);
  }
}

#define BLOB(lit, bin, hdr) check_blob(lit, sizeof(lit) - 1, bin, hdr)

static void test_blobs(void) {
  BLOB("\xa3xyz", false, 1);
  BLOB("\xd9\x03xyz", false, 2);
  BLOB("\xda\x00\x03xyz", false, 3);
  BLOB("\xdb\x00\x00\x00\x03xyz", false, 5);
  BLOB("\xc4\x03xyz", true, 2);
  BLOB("\xc5\x00\x03xyz", true, 3);
  BLOB("\xc6\x00\x00\x00\x03xyz", true, 5);

  /* Lengths far beyond the bytes left are truncation, not a huge view. */
  proto_rd r;
  proto_bytes b;
  RD(&r, "\xc6\xff\xff\xff\xff");
  ASSERT_RC(proto__rd_bin(&r, &b, SIZE_MAX), BEE_ETRUNCATED);
  RD(&r, "\xdb\xff\xff\xff\xffxyz");
  ASSERT_RC(proto__rd_str(&r, &b, SIZE_MAX), BEE_ETRUNCATED);
  ASSERT_EQ(proto__rd_left(&r), 8);

  /* Empty str and bin. */
  RD(&r, "\xa0\xc4\x00");
  ASSERT_OK(proto__rd_str(&r, &b, 0));
  ASSERT_EQ(b.n, 0);
  ASSERT_OK(proto__rd_bin(&r, &b, 0));
  ASSERT_EQ(b.n, 0);
  ASSERT_OK(proto__rd_end(&r));

  RD(&r, "\xc1");
  ASSERT_RC(proto__rd_str(&r, &b, 10), BEE_EMALFORMED);
  ASSERT_RC(proto__rd_bin(&r, &b, 10), BEE_EMALFORMED);

  /* fixbin: exactly n bytes, copied out. */
  uint8_t key[4] = {0};
  RD(&r, "\xc4\x04wxyz");
  ASSERT_OK(proto__rd_fixbin(&r, key, 4));
  ASSERT_MEMEQ(key, "wxyz", 4);
  RD(&r, "\xc4\x03wxy");
  ASSERT_RC(proto__rd_fixbin(&r, key, 4), BEE_ERANGE);
  ASSERT_EQ(proto__rd_left(&r), 5);
  /* A longer one fails too (as BEE_ETOOBIG, from the length limit). */
  RD(&r, "\xc4\x05vwxyz");
  ASSERT_NE(proto__rd_fixbin(&r, key, 4), 0);
  ASSERT_EQ(proto__rd_left(&r), 7);
}

static void test_bool_nil(void) {
  proto_rd r;
  bool v = false;
  RD(&r, "\xc3\xc2\xc0\x01");
  ASSERT_OK(proto__rd_bool(&r, &v));
  ASSERT(v);
  ASSERT_OK(proto__rd_bool(&r, &v));
  ASSERT(!v);
  ASSERT_EQ(proto__rd_nil(&r), 1);
  ASSERT_EQ(proto__rd_nil(&r), 0); /* not nil: nothing consumed */
  ASSERT_RC(proto__rd_bool(&r, &v), BEE_ETYPE);
  ASSERT_EQ(proto__rd_left(&r), 1);
  proto__rd_init(&r, (const uint8_t *)"", 0);
  ASSERT_RC(proto__rd_nil(&r), BEE_ETRUNCATED);
  ASSERT_RC(proto__rd_bool(&r, &v), BEE_ETRUNCATED);
  RD(&r, "\xc1");
  ASSERT_RC(proto__rd_bool(&r, &v), BEE_EMALFORMED);
}

static void test_containers(void) {
  proto_rd r;
  uint32_t n = 0;
  RD(&r, "\x93\x01\x02\x03");
  ASSERT_OK(proto__rd_array(&r, &n));
  ASSERT_EQ(n, 3);
  RD(&r, "\xdc\x00\x03\x01\x02\x03");
  ASSERT_OK(proto__rd_array(&r, &n));
  ASSERT_EQ(n, 3);
  RD(&r, "\xdd\x00\x00\x00\x02\x01\x02");
  ASSERT_OK(proto__rd_array(&r, &n));
  ASSERT_EQ(n, 2);
  RD(&r, "\x81\x01\x02");
  ASSERT_OK(proto__rd_map(&r, &n));
  ASSERT_EQ(n, 1);
  RD(&r, "\xde\x00\x01\x01\x02");
  ASSERT_OK(proto__rd_map(&r, &n));
  ASSERT_EQ(n, 1);
  RD(&r, "\xdf\x00\x00\x00\x01\x01\x02");
  ASSERT_OK(proto__rd_map(&r, &n));
  ASSERT_EQ(n, 1);

  /* Counts the bytes left cannot back: refused before anyone sizes an
   * allocation from them.  The reader itself never allocates. */
  const char *huge[] = {"\xdd\xff\xff\xff\xff", "\xdf\xff\xff\xff\xff",
                        "\xdc\xff\xff", "\xde\xff\xff"};
  for (int i = 0; i < 4; i++) {
    bool map = i % 2 == 1;
    size_t len = i < 2 ? 5 : 3;
    proto__rd_init(&r, (const uint8_t *)huge[i], len);
    ASSERT_RC(map ? proto__rd_map(&r, &n) : proto__rd_array(&r, &n),
              BEE_ETRUNCATED);
    ASSERT_EQ(proto__rd_left(&r), len);
  }
  RD(&r, "\x93\x01\x02");
  ASSERT_RC(proto__rd_array(&r, &n), BEE_ETRUNCATED);
  RD(&r, "\x81\x01"); /* a map entry needs two bytes */
  ASSERT_RC(proto__rd_map(&r, &n), BEE_ETRUNCATED);
  RD(&r, "\xdd\x00\x00\x00");
  ASSERT_RC(proto__rd_array(&r, &n), BEE_ETRUNCATED);

  /* Wrong kinds. */
  RD(&r, "\x81\x01\x02");
  ASSERT_RC(proto__rd_array(&r, &n), BEE_ETYPE);
  RD(&r, "\x91\x01");
  ASSERT_RC(proto__rd_map(&r, &n), BEE_ETYPE);
  RD(&r, "\xc1");
  ASSERT_RC(proto__rd_array(&r, &n), BEE_EMALFORMED);
  ASSERT_RC(proto__rd_map(&r, &n), BEE_EMALFORMED);
}

/* proto__rd_skip over every kind of value. */
static void test_skip(void) {
  static const char all[] =
      "\xc0\xc2\xc3\x05\xe0\xcc\x01\xcd\x01\x02\xce\x01\x02\x03\x04"
      "\xcf\x01\x02\x03\x04\x05\x06\x07\x08\xd0\x01\xd1\x01\x02"
      "\xd2\x01\x02\x03\x04\xd3\x01\x02\x03\x04\x05\x06\x07\x08"
      "\xca\x01\x02\x03\x04\xcb\x01\x02\x03\x04\x05\x06\x07\x08"
      "\xa1x\xd9\x01x\xda\x00\x01x\xdb\x00\x00\x00\x01x"
      "\xc4\x01x\xc5\x00\x01x\xc6\x00\x00\x00\x01x"
      "\xd4\x01x\xd5\x01xx\xd6\x01xxxx\xd7\x01xxxxxxxx"
      "\xd8\x01xxxxxxxxxxxxxxxx"
      "\xc7\x02\x01xx\xc8\x00\x02\x01xx\xc9\x00\x00\x00\x02\x01xx"
      "\x92\x01\x81\xa1k\x90\xdc\x00\x01\x80\xdd\x00\x00\x00\x00"
      "\xde\x00\x01\x01\x02\xdf\x00\x00\x00\x00";
  const int count = 35; /* values at the top level of all */
  proto_rd r;
  proto__rd_init(&r, (const uint8_t *)all, sizeof all - 1);
  for (int i = 0; i < count; i++)
    ASSERT_OK(proto__rd_skip(&r, PROTO_DEPTH_MAX));
  ASSERT_OK(proto__rd_end(&r));

  /* Every proper prefix of each value is truncated and consumes nothing. */
  proto__rd_init(&r, (const uint8_t *)all, sizeof all - 1);
  for (int i = 0; i < count; i++) {
    const uint8_t *start = r.p;
    ASSERT_OK(proto__rd_skip(&r, PROTO_DEPTH_MAX));
    size_t size = (size_t)(r.p - start);
    for (size_t k = 0; k < size; k++) {
      proto_rd t;
      proto__rd_init(&t, start, k);
      ASSERT_RC(proto__rd_skip(&t, PROTO_DEPTH_MAX), BEE_ETRUNCATED);
      ASSERT(t.p == start);
    }
  }

  RD(&r, "\xc1");
  ASSERT_RC(proto__rd_skip(&r, PROTO_DEPTH_MAX), BEE_EMALFORMED);
  RD(&r, "\x92\x01\xc1");
  ASSERT_RC(proto__rd_skip(&r, PROTO_DEPTH_MAX), BEE_EMALFORMED);
  ASSERT_EQ(proto__rd_left(&r), 3);
  RD(&r, "\xc7\xff\x01"); /* ext8 longer than the data */
  ASSERT_RC(proto__rd_skip(&r, PROTO_DEPTH_MAX), BEE_ETRUNCATED);
}

/* n arrays nested in one another, the innermost one empty. */
static size_t nested(uint8_t *buf, int n, bool maps) {
  size_t len = 0;
  for (int i = 0; i < n - 1; i++) {
    buf[len++] = maps ? 0x81 : 0x91;
    if (maps)
      buf[len++] = 0x01; /* key; the value is the next container */
  }
  buf[len++] = maps ? 0x80 : 0x90;
  return len;
}

static void test_depth(void) {
  uint8_t buf[256];
  proto_rd r;
  for (int maps = 0; maps < 2; maps++) {
    size_t len = nested(buf, PROTO_DEPTH_MAX, maps);
    proto__rd_init(&r, buf, len);
    ASSERT_OK(proto__rd_skip(&r, PROTO_DEPTH_MAX));
    ASSERT_OK(proto__rd_end(&r));
    len = nested(buf, PROTO_DEPTH_MAX + 1, maps);
    proto__rd_init(&r, buf, len);
    ASSERT_RC(proto__rd_skip(&r, PROTO_DEPTH_MAX), BEE_EDEPTH);
    ASSERT_EQ(proto__rd_left(&r), len);
    len = nested(buf, 100, maps);
    proto__rd_init(&r, buf, len);
    ASSERT_RC(proto__rd_skip(&r, PROTO_DEPTH_MAX), BEE_EDEPTH);
    ASSERT_EQ(proto__rd_left(&r), len);
  }
  /* A wide but shallow value is fine. */
  memset(buf, 0x90, sizeof buf);
  buf[0] = 0xdc;
  buf[1] = 0x00;
  buf[2] = 253;
  proto__rd_init(&r, buf, sizeof buf);
  ASSERT_OK(proto__rd_skip(&r, 2));
  ASSERT_OK(proto__rd_end(&r));
  proto__rd_init(&r, buf, 1);
  ASSERT_RC(proto__rd_skip(&r, 0), BEE_EDEPTH);
}

static void test_head(void) {
  proto_rd r;
  int type = -1;
  RD(&r, "\x94\x01\x07\x05\x06");
  ASSERT_OK(proto__rd_head(&r, 7, 2, &type));
  ASSERT_EQ(type, 7);
  ASSERT_EQ(proto__rd_left(&r), 2);
  RD(&r, "\x94\x01\x07\x05\x06");
  ASSERT_OK(proto__rd_head(&r, -1, 2, &type));
  RD(&r, "\x94\x01\x07\x05\x06");
  ASSERT_RC(proto__rd_head(&r, 8, 2, &type), BEE_EUNKNOWN);
  RD(&r, "\x94\x01\x07\x05\x06");
  ASSERT_RC(proto__rd_head(&r, 7, 3, &type), BEE_EMISSING);
  RD(&r, "\x94\x01\x07\x05\x06");
  ASSERT_RC(proto__rd_head(&r, 7, 1, &type), BEE_ETYPE);
  RD(&r, "\x94\x02\x07\x05\x06");
  ASSERT_RC(proto__rd_head(&r, 7, 2, &type), BEE_EVERSION);
  RD(&r, "\x94\xff\x07\x05\x06");
  ASSERT_RC(proto__rd_head(&r, 7, 2, &type), BEE_EVERSION);
  RD(&r, "\x94\x01\xff\x05\x06");
  ASSERT_RC(proto__rd_head(&r, -1, 2, &type), BEE_EUNKNOWN);
  RD(&r, "\x94\x01\xcd\x01\x00\x05");
  ASSERT_RC(proto__rd_head(&r, -1, 1, &type), BEE_EUNKNOWN);
  RD(&r, "\x91\x01");
  ASSERT_RC(proto__rd_head(&r, -1, 0, &type), BEE_EMISSING);
  RD(&r, "\x90");
  ASSERT_RC(proto__rd_head(&r, -1, 0, &type), BEE_EMISSING);
  RD(&r, "\x92\xa1z\x07");
  ASSERT_RC(proto__rd_head(&r, -1, 0, &type), BEE_ETYPE);
  RD(&r, "\x01");
  ASSERT_RC(proto__rd_head(&r, -1, 0, &type), BEE_ETYPE);

  RD(&r, "\x01\x02");
  ASSERT_OK(proto__rd_skip(&r, 1));
  ASSERT_RC(proto__rd_end(&r), BEE_ETRAILING);
}

/* A message the writer builds, read back, then cut at every length. */
static void test_writer_roundtrip(void) {
  uint8_t buf[256];
  proto_wr w;
  proto__wr_init(&w, buf, sizeof buf);
  proto__wr_array(&w, 9);
  proto__wr_uint(&w, UINT64_MAX);
  proto__wr_int(&w, INT64_MIN);
  proto__wr_int(&w, -1);
  proto__wr_bool(&w, true);
  proto__wr_nil(&w);
  proto__wr_str(&w, "hello", 5);
  proto__wr_bin(&w, "\x00\x01", 2);
  proto__wr_map(&w, 1);
  proto__wr_uint(&w, 1);
  proto__wr_array(&w, 0);
  proto__wr_bin_head(&w, 3);
  ASSERT_OK(w.err);
  memcpy(buf + w.len, "xyz", 3);
  size_t len = w.len + 3;

  proto_rd r;
  uint32_t n;
  uint64_t u;
  int64_t v;
  bool b;
  proto_bytes s;
  proto__rd_init(&r, buf, len);
  ASSERT_OK(proto__rd_array(&r, &n));
  ASSERT_EQ(n, 9);
  ASSERT_OK(proto__rd_uint(&r, &u));
  ASSERT_UEQ(u, UINT64_MAX);
  ASSERT_OK(proto__rd_int(&r, &v));
  ASSERT_EQ(v, INT64_MIN);
  ASSERT_OK(proto__rd_int(&r, &v));
  ASSERT_EQ(v, -1);
  ASSERT_OK(proto__rd_bool(&r, &b));
  ASSERT(b);
  ASSERT_EQ(proto__rd_nil(&r), 1);
  ASSERT_OK(proto__rd_str(&r, &s, 5));
  ASSERT_MEMEQ(s.p, "hello", 5);
  ASSERT_OK(proto__rd_bin(&r, &s, 2));
  ASSERT_MEMEQ(s.p, "\x00\x01", 2);
  ASSERT_OK(proto__rd_skip(&r, 2));
  ASSERT_OK(proto__rd_bin(&r, &s, 3));
  ASSERT_MEMEQ(s.p, "xyz", 3);
  ASSERT_OK(proto__rd_end(&r));

  for (size_t k = 0; k < len; k++) {
    proto__rd_init(&r, buf, k);
    ASSERT_RC(proto__rd_skip(&r, PROTO_DEPTH_MAX), BEE_ETRUNCATED);
    ASSERT_EQ(proto__rd_left(&r), k);
  }
  proto__rd_init(&r, buf, len);
  ASSERT_OK(proto__rd_skip(&r, PROTO_DEPTH_MAX));
  ASSERT_OK(proto__rd_end(&r));
}

/* The writer picks the smallest width for each value. */
static void check_wr_uint(uint64_t v, const char *want, size_t n) {
  uint8_t buf[16];
  proto_wr w;
  proto__wr_init(&w, buf, sizeof buf);
  proto__wr_uint(&w, v);
  ASSERT_OK(w.err);
  ASSERT_EQ(w.len, n);
  ASSERT_MEMEQ(buf, want, n);
}

static void check_wr_int(int64_t v, const char *want, size_t n) {
  uint8_t buf[16];
  proto_wr w;
  proto__wr_init(&w, buf, sizeof buf);
  proto__wr_int(&w, v);
  ASSERT_OK(w.err);
  ASSERT_EQ(w.len, n);
  ASSERT_MEMEQ(buf, want, n);
}

#define WR_UINT(v, lit) check_wr_uint(v, lit, sizeof(lit) - 1)
#define WR_INT(v, lit) check_wr_int(v, lit, sizeof(lit) - 1)

static void test_writer_widths(void) {
  WR_UINT(0, "\x00");
  WR_UINT(127, "\x7f");
  WR_UINT(128, "\xcc\x80");
  WR_UINT(256, "\xcd\x01\x00");
  WR_UINT(65536, "\xce\x00\x01\x00\x00");
  WR_UINT(UINT64_MAX, "\xcf\xff\xff\xff\xff\xff\xff\xff\xff");
  WR_INT(-1, "\xff");
  WR_INT(-32, "\xe0");
  WR_INT(-33, "\xd0\xdf");
  WR_INT(-129, "\xd1\xff\x7f");
  WR_INT(INT64_MIN, "\xd3\x80\x00\x00\x00\x00\x00\x00\x00");
  WR_INT(5, "\x05");
}

/* Too small a buffer: BEE_ETOOBIG, nothing written past cap, and later
 * writes ignored even when they would fit. */
static void test_writer_overflow(void) {
  uint8_t buf[8];
  proto_wr w;
  memset(buf, 0xee, sizeof buf);
  proto__wr_init(&w, buf, 4);
  proto__wr_uint(&w, 1);
  proto__wr_str(&w, "abcdef", 6);
  ASSERT_RC(w.err, BEE_ETOOBIG);
  size_t at = w.len;
  ASSERT_LE(at, 4);
  proto__wr_uint(&w, 1);
  ASSERT_EQ(w.len, at);
  ASSERT_RC(w.err, BEE_ETOOBIG);
  for (size_t i = 4; i < sizeof buf; i++)
    ASSERT_EQ(buf[i], 0xee);

  /* Exactly full is fine. */
  proto__wr_init(&w, buf, 4);
  proto__wr_str(&w, "abc", 3);
  ASSERT_OK(w.err);
  ASSERT_EQ(w.len, 4);
  proto__wr_nil(&w);
  ASSERT_RC(w.err, BEE_ETOOBIG);

  /* Each width of bin header, one byte short. */
  size_t sizes[] = {1, 300, 70000};
  size_t hdrs[] = {2, 3, 5};
  for (int i = 0; i < 3; i++) {
    proto__wr_init(&w, buf, hdrs[i]);
    proto__wr_bin_head(&w, sizes[i]);
    ASSERT_OK(w.err);
    ASSERT_EQ(w.len, hdrs[i]);
    proto__wr_init(&w, buf, hdrs[i] - 1);
    proto__wr_bin_head(&w, sizes[i]);
    ASSERT_RC(w.err, BEE_ETOOBIG);
  }
  /* Empty bodies may come as NULL; memcpy must never see it (UBSan). */
  proto__wr_init(&w, buf, sizeof buf);
  proto__wr_str(&w, NULL, 0);
  proto__wr_bin(&w, NULL, 0);
  ASSERT_OK(w.err);
  ASSERT_EQ(w.len, 3);
  ASSERT_MEMEQ(buf, "\xa0\xc4\x00", 3);

  proto__wr_init(&w, buf, 0);
  proto__wr_head(&w, 1, 0);
  ASSERT_RC(w.err, BEE_ETOOBIG);
  ASSERT_EQ(w.len, 0);
}

int main(void) {
  test_ints();
  test_int_truncated();
  test_blobs();
  test_bool_nil();
  test_containers();
  test_skip();
  test_depth();
  test_head();
  test_writer_roundtrip();
  test_writer_widths();
  test_writer_overflow();
  printf("test-proto-wire: ok\n");
  return 0;
}
