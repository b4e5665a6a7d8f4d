/* test-proto-records.c: the swarm's typed DHT records (progress, metrics,
 * matchmaking, state donors), the keys of DHT names, and the schema check
 * the DHT runs on every record.
 *
 * Every type round-trips at its edges; every malformed class of every
 * field of every type is refused with its own code, on bytes built by
 * hand from a table (one wrong field in an otherwise good value), and
 * through proto_record_check as well as the decoder; fields after the
 * known ones are skipped; and a typed record passes the check only under
 * an owned subkey and the key its own fields name.
 */
#include "proto.h"
#include "test.h"
#include "testlib.h"

#include <float.h>
#include <math.h>
#include <sodium.h>

/* ---- the four schemas, as the test sees them ----------------------------- */

enum kind {
  K_RUN,   /* str 1..64 of [A-Za-z0-9._-] */
  K_UINT,  /* any uint */
  K_F64,   /* float64, finite, >= 0 */
  K_POS,   /* float64, finite, > 0 */
  K_LOSS,  /* float64, finite, or nil */
  K_LABEL, /* str 0..64 of printable UTF-8 */
  K_MODE,  /* uint 0..2 */
  K_GROUP, /* uint 0..65535 */
  K_BITS,  /* str 0..16 of '0'/'1' */
  K_ADDR,  /* str 1..261 of printable ASCII without spaces */
  K_HASH,  /* bin 32 */
  K_SLOTS, /* uint 0..1024 */
};

typedef struct schema {
  int type;
  const char *tag;
  size_t n;
  enum kind k[14];
} schema;

/* Hand-made tables and byte strings below are kept as written. */
/* clang-format off */
static const schema schemas[] = {
    {PROTO_REC_PROGRESS, "bee.progress", 7,
     {K_RUN, K_UINT, K_UINT, K_F64, K_UINT, K_MODE, K_LABEL}},
    {PROTO_REC_METRICS, "bee.metrics", 14,
     {K_RUN, K_UINT, K_LOSS, K_F64, K_F64, K_F64, K_UINT, K_UINT, K_GROUP,
      K_F64, K_UINT, K_F64, K_UINT, K_UINT}},
    {PROTO_REC_MATCH, "bee.match", 8,
     {K_RUN, K_UINT, K_BITS, K_ADDR, K_HASH, K_MODE, K_POS, K_F64}},
    {PROTO_REC_DONOR, "bee.donor", 4, {K_RUN, K_ADDR, K_UINT, K_SLOTS}},
};
/* clang-format on */
#define NSCHEMAS (sizeof schemas / sizeof schemas[0])

/* A good value for a field of kind k. */
static void h_good(enum kind k) {
  switch (k) {
  case K_RUN: hb_str("demo-1.b_c"); break;
  case K_UINT: hb_uint(7); break;
  case K_F64: hb_f64(1.5); break;
  case K_POS: hb_f64(2.5); break;
  case K_LOSS: hb_f64(-0.25); break;
  case K_LABEL: hb_str("epoch 3 \xc3\xa9t\xc3\xa9 \xe2\x82\xac"); break;
  case K_MODE: hb_uint(1); break;
  case K_GROUP: hb_uint(4); break;
  case K_BITS: hb_str("0110"); break;
  case K_ADDR: hb_str("[2001:db8::1]:45555"); break;
  case K_HASH: hb_fill(true, 32, 0x5c); break;
  case K_SLOTS: hb_uint(3); break;
  }
}

/* One replacement for a field: the bytes of raw, or (raw NULL) a str, or
 * a bin with is_bin, of fill_n bytes of fill.  kinds says which fields it
 * replaces; code is what the decoders must answer (0: accepted). */
typedef struct subst {
  unsigned kinds;
  const char *what;
  const char *raw;
  size_t raw_n;
  char fill;
  size_t fill_n;
  bool is_bin;
  int code;
} subst;

#define KB(k) (1u << (k))
#define UINTS (KB(K_UINT) | KB(K_MODE) | KB(K_GROUP) | KB(K_SLOTS))
#define FLOATS (KB(K_F64) | KB(K_POS) | KB(K_LOSS))
#define STRS (KB(K_RUN) | KB(K_LABEL) | KB(K_BITS) | KB(K_ADDR))
#define ALL 0xfffu
#define RAW(s) .raw = s, .raw_n = sizeof(s) - 1
#define STR(c, n) .fill = c, .fill_n = n
#define BIN(c, n) .fill = c, .fill_n = n, .is_bin = true

/* clang-format off */
static const subst substs[] = {
    /* Any field. */
    {ALL, "reserved byte 0xc1", RAW("\xc1"), .code = BEE_EMALFORMED},
    {ALL, "array", RAW("\x90"), .code = BEE_ETYPE},
    {ALL, "map", RAW("\x80"), .code = BEE_ETYPE},
    {ALL, "bool", RAW("\xc3"), .code = BEE_ETYPE},
    {ALL & ~KB(K_LOSS), "nil", RAW("\xc0"), .code = BEE_ETYPE},
    /* Integers. */
    {UINTS, "str", RAW("\xa1" "7"), .code = BEE_ETYPE},
    {UINTS, "float64", RAW("\xcb\x3f\xf0\0\0\0\0\0\0"), .code = BEE_ETYPE},
    {UINTS, "negative", RAW("\xff"), .code = BEE_ERANGE},
    {UINTS, "negative int64", RAW("\xd3\x80\0\0\0\0\0\0\0"), .code = BEE_ERANGE},
    {UINTS, "uint8 width", RAW("\xcc\x00"), .code = 0},
    {KB(K_UINT), "largest", RAW("\xcf\xff\xff\xff\xff\xff\xff\xff\xff"),
     .code = 0},
    {KB(K_MODE), "mode 2", RAW("\x02"), .code = 0},
    {KB(K_MODE), "mode 3", RAW("\x03"), .code = BEE_ERANGE},
    {KB(K_MODE), "mode 2^64-1", RAW("\xcf\xff\xff\xff\xff\xff\xff\xff\xff"),
     .code = BEE_ERANGE},
    {KB(K_GROUP), "group 65535", RAW("\xcd\xff\xff"), .code = 0},
    {KB(K_GROUP), "group 65536", RAW("\xce\x00\x01\x00\x00"),
     .code = BEE_ERANGE},
    {KB(K_SLOTS), "slots 1024", RAW("\xcd\x04\x00"), .code = 0},
    {KB(K_SLOTS), "slots 1025", RAW("\xcd\x04\x01"), .code = BEE_ERANGE},
    /* Floats: float64 only, finite, with the sign each field takes. */
    {FLOATS, "float32", RAW("\xca\x3f\x80\0\0"), .code = BEE_ETYPE},
    {FLOATS, "uint", RAW("\x01"), .code = BEE_ETYPE},
    {FLOATS, "str", RAW("\xa3" "1.0"), .code = BEE_ETYPE},
    {FLOATS, "NaN", RAW("\xcb\x7f\xf8\0\0\0\0\0\0"), .code = BEE_ERANGE},
    {FLOATS, "signalling NaN", RAW("\xcb\x7f\xf0\0\0\0\0\0\x01"),
     .code = BEE_ERANGE},
    {FLOATS, "negative NaN", RAW("\xcb\xff\xf8\0\0\0\0\0\0"),
     .code = BEE_ERANGE},
    {FLOATS, "+Inf", RAW("\xcb\x7f\xf0\0\0\0\0\0\0"), .code = BEE_ERANGE},
    {FLOATS, "-Inf", RAW("\xcb\xff\xf0\0\0\0\0\0\0"), .code = BEE_ERANGE},
    {FLOATS, "DBL_MAX", RAW("\xcb\x7f\xef\xff\xff\xff\xff\xff\xff"), .code = 0},
    {FLOATS, "smallest denormal", RAW("\xcb\0\0\0\0\0\0\0\x01"), .code = 0},
    {KB(K_F64) | KB(K_LOSS), "0.0", RAW("\xcb\0\0\0\0\0\0\0\0"), .code = 0},
    {KB(K_POS), "0.0", RAW("\xcb\0\0\0\0\0\0\0\0"), .code = BEE_ERANGE},
    {KB(K_POS), "-0.0", RAW("\xcb\x80\0\0\0\0\0\0\0"), .code = BEE_ERANGE},
    {KB(K_F64) | KB(K_POS), "-1.0", RAW("\xcb\xbf\xf0\0\0\0\0\0\0"),
     .code = BEE_ERANGE},
    {KB(K_F64) | KB(K_POS), "-denormal", RAW("\xcb\x80\0\0\0\0\0\0\x01"),
     .code = BEE_ERANGE},
    {KB(K_F64) | KB(K_POS), "-DBL_MAX",
     RAW("\xcb\xff\xef\xff\xff\xff\xff\xff\xff"), .code = BEE_ERANGE},
    {KB(K_LOSS), "-1.0", RAW("\xcb\xbf\xf0\0\0\0\0\0\0"), .code = 0},
    {KB(K_LOSS), "nil", RAW("\xc0"), .code = 0},
    /* Strings. */
    {STRS, "uint", RAW("\x01"), .code = BEE_ETYPE},
    {STRS, "bin", RAW("\xc4\x01" "1"), .code = BEE_ETYPE},
    {STRS, "NUL inside", RAW("\xa3" "1\0" "1"), .code = BEE_ERANGE},
    {KB(K_RUN) | KB(K_ADDR), "empty", RAW("\xa0"), .code = BEE_ERANGE},
    {KB(K_LABEL) | KB(K_BITS), "empty", RAW("\xa0"), .code = 0},
    {KB(K_RUN), "64 bytes", STR('r', 64), .code = 0},
    {KB(K_RUN), "65 bytes", STR('r', 65), .code = BEE_ETOOBIG},
    {KB(K_RUN), "a space", RAW("\xa3" "a b"), .code = BEE_ERANGE},
    {KB(K_RUN), "a slash", RAW("\xa3" "a/b"), .code = BEE_ERANGE},
    {KB(K_RUN), "a colon", RAW("\xa3" "a:b"), .code = BEE_ERANGE},
    {KB(K_RUN), "non-ASCII", RAW("\xa2\xc3\xa9"), .code = BEE_ERANGE},
    {KB(K_LABEL), "64 bytes", STR('l', 64), .code = 0},
    {KB(K_LABEL), "65 bytes", STR('l', 65), .code = BEE_ETOOBIG},
    {KB(K_LABEL), "4-byte UTF-8", RAW("\xa4\xf0\x9f\x90\x9d"), .code = 0},
    {KB(K_LABEL), "U+10FFFF", RAW("\xa4\xf4\x8f\xbf\xbf"), .code = 0},
    {KB(K_LABEL), "newline", RAW("\xa3" "a\nb"), .code = BEE_ERANGE},
    {KB(K_LABEL), "escape", RAW("\xa4\x1b[2J"), .code = BEE_ERANGE},
    {KB(K_LABEL), "DEL", RAW("\xa1\x7f"), .code = BEE_ERANGE},
    {KB(K_LABEL), "C1 CSI", RAW("\xa2\xc2\x9b"), .code = BEE_ERANGE},
    {KB(K_LABEL), "lone continuation", RAW("\xa1\x80"), .code = BEE_ERANGE},
    {KB(K_LABEL), "0xff", RAW("\xa1\xff"), .code = BEE_ERANGE},
    {KB(K_LABEL), "overlong NUL", RAW("\xa2\xc0\x80"), .code = BEE_ERANGE},
    {KB(K_LABEL), "overlong '/'", RAW("\xa3\xe0\x80\xaf"), .code = BEE_ERANGE},
    {KB(K_LABEL), "surrogate", RAW("\xa3\xed\xa0\x80"), .code = BEE_ERANGE},
    {KB(K_LABEL), "past U+10FFFF", RAW("\xa4\xf4\x90\x80\x80"),
     .code = BEE_ERANGE},
    {KB(K_LABEL), "cut sequence", RAW("\xa3" "a\xe2\x82"), .code = BEE_ERANGE},
    {KB(K_BITS), "16 bits", STR('1', 16), .code = 0},
    {KB(K_BITS), "17 bits", STR('0', 17), .code = BEE_ETOOBIG},
    {KB(K_BITS), "a '2'", RAW("\xa3" "012"), .code = BEE_ERANGE},
    {KB(K_BITS), "a letter", RAW("\xa2" "0b"), .code = BEE_ERANGE},
    {KB(K_ADDR), "261 bytes", STR('h', 261), .code = 0},
    {KB(K_ADDR), "262 bytes", STR('h', 262), .code = BEE_ETOOBIG},
    {KB(K_ADDR), "newline", RAW("\xa4h:1\n"), .code = BEE_ERANGE},
    {KB(K_ADDR), "a space", RAW("\xa4h :1"), .code = BEE_ERANGE},
    {KB(K_ADDR), "DEL", RAW("\xa4h:1\x7f"), .code = BEE_ERANGE},
    {KB(K_ADDR), "non-ASCII", RAW("\xa4\xc3\xa9:1"), .code = BEE_ERANGE},
    /* The schema hash. */
    {KB(K_HASH), "31 bytes", BIN(1, 31), .code = BEE_ERANGE},
    {KB(K_HASH), "33 bytes", BIN(1, 33), .code = BEE_ERANGE},
    {KB(K_HASH), "empty", BIN(1, 0), .code = BEE_ERANGE},
    {KB(K_HASH), "str of 32", STR('h', 32), .code = BEE_ETYPE},
    {KB(K_HASH), "uint", RAW("\x01"), .code = BEE_ETYPE},
};
/* clang-format on */
#define NSUBSTS (sizeof substs / sizeof substs[0])

/* [tag, version, the schema's fields...] with field `bad` (if below s->n)
 * replaced by *x, nfields fields in all (fewer: a prefix; more: good uints
 * after the known ones). */
static void h_value(const schema *s, size_t bad, const subst *x, size_t nfields,
                    uint64_t version) {
  test_hn = 0;
  hb_arr(2 + nfields);
  hb_str(s->tag);
  hb_uint(version);
  for (size_t i = 0; i < nfields; i++) {
    if (i >= s->n)
      hb_uint(i);
    else if (i != bad)
      h_good(s->k[i]);
    else if (x->raw)
      hb_raw(x->raw, x->raw_n);
    else
      hb_fill(x->is_bin, x->fill_n, (uint8_t)x->fill);
  }
}

/* ---- decoding any type --------------------------------------------------- */

typedef union any {
  proto_progress progress;
  proto_metrics metrics;
  proto_match match;
  proto_donor donor;
} any;

static size_t any_size(int type) {
  switch (type) {
  case PROTO_REC_PROGRESS: return sizeof(proto_progress);
  case PROTO_REC_METRICS: return sizeof(proto_metrics);
  case PROTO_REC_MATCH: return sizeof(proto_match);
  default: return sizeof(proto_donor);
  }
}

/* Decodes with type's decoder into *out, first filled with junk: a
 * failure must leave the struct all zero. */
static int decode_any(int type, const uint8_t *buf, size_t len, any *out) {
  static const any zero;
  int rc;
  memset(out, 0xa5, sizeof *out);
  switch (type) {
  case PROTO_REC_PROGRESS:
    rc = proto_progress_decode(buf, len, &out->progress);
    break;
  case PROTO_REC_METRICS:
    rc = proto_metrics_decode(buf, len, &out->metrics);
    break;
  case PROTO_REC_MATCH: rc = proto_match_decode(buf, len, &out->match); break;
  default: rc = proto_donor_decode(buf, len, &out->donor); break;
  }
  if (rc)
    ASSERT_MEMEQ(out, &zero, any_size(type));
  return rc;
}

/* The key a decoded value belongs under. */
static void key_any(int type, const any *u, uint8_t key[PROTO_DHT_KEY_BYTES]) {
  switch (type) {
  case PROTO_REC_PROGRESS:
    proto_record_key(type, u->progress.run, 0, NULL, key);
    break;
  case PROTO_REC_METRICS:
    proto_record_key(type, u->metrics.run, 0, NULL, key);
    break;
  case PROTO_REC_MATCH:
    proto_record_key(type, u->match.run, u->match.round, u->match.bits, key);
    break;
  default: proto_record_key(type, u->donor.run, 0, NULL, key); break;
  }
}

/* ---- records as the DHT holds them --------------------------------------- */

static uint8_t owned[PROTO_DHT_OWNED_SUBKEY_BYTES];

/* proto_record_check of value under key (NULL: all zero) and an owned
 * subkey (owner) or the plain subkey "x". */
static int check(const uint8_t *value, size_t n, const uint8_t *key, bool owner,
                 int *type) {
  proto_dht_record r = {.value = {value, n}, .expiration = 1700000000};
  if (key)
    memcpy(r.key, key, PROTO_DHT_KEY_BYTES);
  r.subkey = owner ? (proto_bytes){owned, sizeof owned}
                   : (proto_bytes){(const uint8_t *)"x", 1};
  *type = -1; /* must be set either way */
  return proto_record_check(&r, type);
}

/* Every prefix of buf[0..len), each in a buffer of its own size (so ASan
 * sees any over-read), is BEE_ETRUNCATED; one byte more BEE_ETRAILING.
 * proto_record_check judges every prefix that holds the whole tag as the
 * type it names (BEE_ETRUNCATED) and lets shorter ones pass untyped. */
static void check_cuts(int type, const uint8_t *buf, size_t len) {
  any u;
  int got, crc;
  bool typed = false;
  for (size_t i = 0; i <= len; i++) {
    uint8_t *part = malloc(i + 1);
    ASSERT(part);
    memcpy(part, buf, i);
    part[i] = 0xc0;
    ASSERT_CODE(decode_any(type, part, i, &u), i < len ? BEE_ETRUNCATED : 0,
                "type %d cut at %zu of %zu", type, i, len);
    if (i == len)
      ASSERT_CODE(decode_any(type, part, i + 1, &u), BEE_ETRAILING,
                  "type %d with a byte more", type);
    if (i < len) {
      crc = check(part, i, NULL, true, &got);
      if (got == PROTO_REC_NONE) {
        ASSERT_OK(crc);
        ASSERT(!typed); /* once the tag is there, it stays typed */
      } else {
        ASSERT_EQ(got, type);
        ASSERT_CODE(crc, BEE_ETRUNCATED, "check of type %d cut at %zu", type,
                    i);
        typed = true;
      }
    }
    free(part);
  }
  ASSERT(typed);
}

/* ---- malformed values, by table ------------------------------------------ */

/* Each field of each schema, replaced in turn by every substitute that
 * fits its kind, must give the substitute's code: from the decoder, and
 * from proto_record_check under an owned subkey and (when it decodes) the
 * right key.  Another type's decoder must call it BEE_EUNKNOWN. */
static void test_fields(void) {
  size_t cases = 0;
  for (size_t si = 0; si < NSCHEMAS; si++) {
    const schema *s = &schemas[si];
    for (size_t f = 0; f < s->n; f++)
      for (size_t xi = 0; xi < NSUBSTS; xi++) {
        const subst *x = &substs[xi];
        uint8_t key[PROTO_DHT_KEY_BYTES];
        any u;
        int type;
        if (!(x->kinds & KB(s->k[f])))
          continue;
        h_value(s, f, x, s->n, 1);
        ASSERT_CODE(decode_any(s->type, test_hb, test_hn, &u), x->code,
                    "%s field %zu: %s", s->tag, f, x->what);
        memset(key, 0, sizeof key);
        if (x->code == 0)
          key_any(s->type, &u, key);
        ASSERT_CODE(check(test_hb, test_hn, key, true, &type), x->code,
                    "check of %s field %zu: %s", s->tag, f, x->what);
        ASSERT_EQ(type, s->type);
        for (size_t oi = 0; oi < NSCHEMAS; oi++)
          if (oi != si)
            ASSERT_CODE(decode_any(schemas[oi].type, test_hb, test_hn, &u),
                        BEE_EUNKNOWN, "%s decoded as %s", s->tag,
                        schemas[oi].tag);
        cases++;
      }
  }
  ASSERT_GE(cases, 400); /* 478 when written: the loops ran */
}

/* The head [tag, version], the field count, the end of the value and the
 * fields of later versions. */
static void test_shape(void) {
  static const subst none = {0};
  for (size_t si = 0; si < NSCHEMAS; si++) {
    const schema *s = &schemas[si];
    uint8_t good[PROTO_RECORD_MAX];
    size_t good_n;
    any u, base;
    int type;
    /* The good value itself, cut anywhere. */
    h_value(s, SIZE_MAX, &none, s->n, 1);
    ASSERT_OK(decode_any(s->type, test_hb, test_hn, &base));
    ASSERT_LE(test_hn, sizeof good);
    memcpy(good, test_hb, test_hn);
    good_n = test_hn;
    check_cuts(s->type, good, good_n);

    /* Missing fields: every shorter array of a good prefix. */
    for (size_t k = 0; k < 2 + s->n; k++) {
      test_hn = 0;
      hb_arr(k);
      if (k > 0)
        hb_str(s->tag);
      if (k > 1)
        hb_uint(1);
      for (size_t i = 0; i + 2 < k; i++)
        h_good(s->k[i]);
      ASSERT_CODE(decode_any(s->type, test_hb, test_hn, &u), BEE_EMISSING,
                  "%s with %zu elements", s->tag, k);
      if (k > 0)
        ASSERT_CODE(check(test_hb, test_hn, NULL, true, &type), BEE_EMISSING,
                    "check of %s with %zu elements", s->tag, k);
    }

    /* The version: 1 only, a uint. */
    static const uint64_t versions[] = {0, 2, 255, UINT64_MAX};
    for (size_t i = 0; i < 4; i++) {
      h_value(s, SIZE_MAX, &none, s->n, versions[i]);
      ASSERT_CODE(decode_any(s->type, test_hb, test_hn, &u), BEE_EVERSION,
                  "%s version %llu", s->tag, (unsigned long long)versions[i]);
      ASSERT_CODE(check(test_hb, test_hn, NULL, true, &type), BEE_EVERSION,
                  "check of %s version %llu", s->tag,
                  (unsigned long long)versions[i]);
      ASSERT_EQ(type, s->type);
    }
    memcpy(test_hb, good, good_n);
    test_hn = good_n;
    size_t vpos = 3 + 3 + strlen(s->tag); /* after array16 and str16 tag */
    test_hb[vpos] = 0xff;                 /* -1 in place of the 0xcf */
    memmove(test_hb + vpos + 1, test_hb + vpos + 9, test_hn - vpos - 9);
    test_hn -= 8;
    ASSERT_CODE(decode_any(s->type, test_hb, test_hn, &u), BEE_EVERSION,
                "%s version -1", s->tag);
    test_hb[vpos] = 0xa1; /* a str "1"... */
    ASSERT_CODE(decode_any(s->type, test_hb, test_hn, &u), BEE_ETYPE,
                "%s version str", s->tag);

    /* The tag: a str, and this type's. */
    /* clang-format off */
    static const struct {
      const char *raw;
      size_t n;
      int code;
    } tags[] = {
        {"\x01", 1, BEE_ETYPE},          {"\xc0", 1, BEE_ETYPE},
        {"\xc4\x03" "bee", 5, BEE_ETYPE}, {"\x91\xa0", 2, BEE_ETYPE},
        {"\xc1", 1, BEE_EMALFORMED},     {"\xa0", 1, BEE_EUNKNOWN},
        {"\xa4" "bee.", 5, BEE_EUNKNOWN}, {"\xaa" "bee.future", 11, BEE_EUNKNOWN},
    };
    /* clang-format on */
    for (size_t i = 0; i < sizeof tags / sizeof tags[0]; i++) {
      test_hn = 0;
      hb_arr(2 + s->n);
      hb_raw(tags[i].raw, tags[i].n);
      hb_uint(1);
      for (size_t f = 0; f < s->n; f++)
        h_good(s->k[f]);
      ASSERT_CODE(decode_any(s->type, test_hb, test_hn, &u), tags[i].code,
                  "%s with tag %zu", s->tag, i);
    }
    /* The tag with a character more, less, or in another case. */
    char other[32];
    snprintf(other, sizeof other, "%ss", s->tag);
    test_hn = 0, hb_arr(2 + s->n), hb_str(other), hb_uint(1);
    for (size_t f = 0; f < s->n; f++)
      h_good(s->k[f]);
    ASSERT_CODE(decode_any(s->type, test_hb, test_hn, &u), BEE_EUNKNOWN, "%s",
                other);
    ASSERT_OK(check(test_hb, test_hn, NULL, false, &type));
    ASSERT_EQ(type, PROTO_REC_NONE);
    other[0] = 'B', other[strlen(other) - 1] = 0;
    test_hn = 0, hb_arr(2 + s->n), hb_str(other), hb_uint(1);
    for (size_t f = 0; f < s->n; f++)
      h_good(s->k[f]);
    ASSERT_CODE(decode_any(s->type, test_hb, test_hn, &u), BEE_EUNKNOWN, "%s",
                other);

    /* Not an array at all. */
    /* clang-format off */
    static const struct {
      const char *raw;
      size_t n;
      int code;
    } heads[] = {
        {"", 0, BEE_ETRUNCATED},     {"\xc1", 1, BEE_EMALFORMED},
        {"\x80", 1, BEE_ETYPE},      {"\xa1" "b", 2, BEE_ETYPE},
        {"\xc0", 1, BEE_ETYPE},      {"\x90", 1, BEE_EMISSING},
        {"\xdd\xff\xff\xff\xff", 5, BEE_ETRUNCATED},
    };
    /* clang-format on */
    for (size_t i = 0; i < sizeof heads / sizeof heads[0]; i++)
      ASSERT_CODE(
          decode_any(s->type, (const uint8_t *)heads[i].raw, heads[i].n, &u),
          heads[i].code, "%s from head %zu", s->tag, i);

    /* Bytes after the value. */
    memcpy(test_hb, good, good_n);
    test_hb[good_n] = 0x00;
    ASSERT_CODE(decode_any(s->type, test_hb, good_n + 1, &u), BEE_ETRAILING,
                "%s with a trailing byte", s->tag);

    /* Fields of later versions are skipped, whatever their type. */
    h_value(s, SIZE_MAX, &none, s->n + 3, 1);
    ASSERT_OK(decode_any(s->type, test_hb, test_hn, &u));
    ASSERT_MEMEQ(&u, &base, any_size(s->type));
    test_hn = 0;
    hb_arr(2 + s->n + 5);
    hb_str(s->tag), hb_uint(1);
    for (size_t f = 0; f < s->n; f++)
      h_good(s->k[f]);
    hb_str("later"), hb_raw("\x92\x01\x91\x80", 4), hb_raw("\x81\xa1k\xc0", 4);
    hb_raw("\xca\0\0\0\0", 5), hb_raw("\xd4\x01\x02", 3);
    ASSERT_OK(decode_any(s->type, test_hb, test_hn, &u));
    ASSERT_MEMEQ(&u, &base, any_size(s->type));
    check_cuts(s->type, test_hb, test_hn);
    /* ... nested at most 7 deep (the value itself is the 8th level). */
    for (int depth = 7; depth <= 8; depth++) {
      test_hn = 0;
      hb_arr(2 + s->n + 1);
      hb_str(s->tag), hb_uint(1);
      for (size_t f = 0; f < s->n; f++)
        h_good(s->k[f]);
      for (int d = 0; d < depth - 1; d++)
        hb_byte(0x91);
      hb_byte(0x90);
      ASSERT_CODE(decode_any(s->type, test_hb, test_hn, &u),
                  depth == 7 ? 0 : BEE_EDEPTH, "%s with an extra field %d deep",
                  s->tag, depth);
    }
    /* ... and a bad one is still refused: they must be msgpack. */
    h_value(s, SIZE_MAX, &none, s->n, 1);
    test_hb[2] = (uint8_t)(2 + s->n + 1);
    hb_byte(0xc1);
    ASSERT_CODE(decode_any(s->type, test_hb, test_hn, &u), BEE_EMALFORMED,
                "%s with a 0xc1 extra", s->tag);
    /* A later field may fill the value up to what the DHT carries, not
     * a byte more. */
    for (size_t more = 0; more < 2; more++) {
      h_value(s, SIZE_MAX, &none, s->n, 1);
      test_hb[2] = (uint8_t)(2 + s->n + 1);
      hb_fill(true, PROTO_DHT_VALUE_MAX - test_hn - 3 + more, 0);
      ASSERT_UEQ(test_hn, PROTO_DHT_VALUE_MAX + more);
      ASSERT_CODE(decode_any(s->type, test_hb, test_hn, &u),
                  more ? BEE_ETOOBIG : 0, "%s of %zu bytes", s->tag, test_hn);
    }
  }
}

/* ---- round trips --------------------------------------------------------- */

/* Encodes (one byte less than needed must not do, nor anything be written
 * then), decodes, compares by bytes (decoded structs are zero where
 * unused, and so are the inputs here), and cuts the encoding everywhere. */
static void roundtrip(int type, const any *in) {
  uint8_t buf[PROTO_RECORD_MAX + 1], key[PROTO_DHT_KEY_BYTES];
  size_t len = 0, len2 = 12345;
  any back;
  int got;
  switch (type) {
  case PROTO_REC_PROGRESS:
    ASSERT_OK(
        proto_progress_encode(&in->progress, buf, PROTO_RECORD_MAX, &len));
    ASSERT_RC(proto_progress_encode(&in->progress, buf, len - 1, &len2),
              BEE_ETOOBIG);
    break;
  case PROTO_REC_METRICS:
    ASSERT_OK(proto_metrics_encode(&in->metrics, buf, PROTO_RECORD_MAX, &len));
    ASSERT_RC(proto_metrics_encode(&in->metrics, buf, len - 1, &len2),
              BEE_ETOOBIG);
    break;
  case PROTO_REC_MATCH:
    ASSERT_OK(proto_match_encode(&in->match, buf, PROTO_RECORD_MAX, &len));
    ASSERT_RC(proto_match_encode(&in->match, buf, len - 1, &len2), BEE_ETOOBIG);
    break;
  default:
    ASSERT_OK(proto_donor_encode(&in->donor, buf, PROTO_RECORD_MAX, &len));
    ASSERT_RC(proto_donor_encode(&in->donor, buf, len - 1, &len2), BEE_ETOOBIG);
    break;
  }
  ASSERT_UEQ(len2, 12345);
  ASSERT_LE(len, PROTO_RECORD_MAX);
  ASSERT_OK(decode_any(type, buf, len, &back));
  ASSERT_MEMEQ(&back, in, any_size(type));
  check_cuts(type, buf, len);
  key_any(type, in, key);
  ASSERT_OK(check(buf, len, key, true, &got));
  ASSERT_EQ(got, type);
}

static void fill(char *s, size_t n, char c) {
  memset(s, c, n);
  s[n] = 0;
}

static void test_roundtrip(void) {
  any u;
  /* Progress: the least and the most of everything. */
  memset(&u, 0, sizeof u);
  strcpy(u.progress.run, "a");
  roundtrip(PROTO_REC_PROGRESS, &u);
  fill(u.progress.run, PROTO_RUN_MAX, 'Z');
  u.progress.epoch = u.progress.samples = u.progress.time_ms = UINT64_MAX;
  u.progress.samples_per_second = DBL_MAX;
  u.progress.mode = PROTO_MODE_AUX;
  for (int i = 0; i < 16; i++) /* 64 bytes of a 4-byte character */
    memcpy(u.progress.label + 4 * i, "\xf0\x9f\x90\x9d", 4);
  roundtrip(PROTO_REC_PROGRESS, &u);

  /* Metrics: loss unknown, then negative; the largest group. */
  memset(&u, 0, sizeof u);
  strcpy(u.metrics.run, "r.1");
  roundtrip(PROTO_REC_METRICS, &u);
  u.metrics.has_loss = true;
  u.metrics.loss = -DBL_MAX;
  u.metrics.step = u.metrics.bytes_sent = u.metrics.bytes_received = UINT64_MAX;
  u.metrics.batch_local = u.metrics.batch_avg = u.metrics.time_ms = UINT64_MAX;
  u.metrics.group_size = PROTO_GROUP_MAX;
  u.metrics.samples_per_second = u.metrics.compute_s = 1e-300;
  u.metrics.averaging_s = DBL_MAX;
  u.metrics.grad_sq_local = DBL_TRUE_MIN;
  u.metrics.grad_sq_avg = 0.125;
  roundtrip(PROTO_REC_METRICS, &u);

  /* Matchmaking: no bits, then all 16; the longest address. */
  memset(&u, 0, sizeof u);
  strcpy(u.match.run, "m");
  strcpy(u.match.addr, "h:1");
  u.match.bandwidth_mbit = DBL_TRUE_MIN;
  roundtrip(PROTO_REC_MATCH, &u);
  fill(u.match.run, PROTO_RUN_MAX, '-');
  fill(u.match.bits, PROTO_BITS_MAX, '1');
  u.match.bits[3] = '0';
  fill(u.match.addr, PROTO_ADDR_MAX - 1, 'h');
  memset(u.match.schema_hash, 0xff, PROTO_SCHEMA_HASH_BYTES);
  u.match.round = UINT64_MAX;
  u.match.mode = PROTO_MODE_CLIENT;
  u.match.bandwidth_mbit = DBL_MAX;
  u.match.weight = DBL_MAX;
  roundtrip(PROTO_REC_MATCH, &u);

  /* Donors: no slots, then the most. */
  memset(&u, 0, sizeof u);
  strcpy(u.donor.run, "d");
  strcpy(u.donor.addr, "10.0.0.1:45555");
  roundtrip(PROTO_REC_DONOR, &u);
  u.donor.slots = PROTO_DONOR_SLOTS_MAX;
  u.donor.epoch = UINT64_MAX;
  roundtrip(PROTO_REC_DONOR, &u);
}

/* The exact bytes of two small records: what another implementation must
 * write (and docs/PROTOCOL.md shows). */
static void test_vectors(void) {
  /* clang-format off */
  static const uint8_t donor[] = "\x96\xa9" "bee.donor" "\x01\xa4" "demo"
                                 "\xa8" "h.io:900" "\x05\x02";
  static const uint8_t progress[] =
      "\x99\xac" "bee.progress" "\x01\xa4" "demo" "\x03\xcd\x01\x2c"
      "\xcb\x40\x59\x00\x00\x00\x00\x00\x00" "\xcf\x00\x00\x01\x8b\xcf\xe5\x68"
      "\x00" "\x00\xa2" "ok";
  /* clang-format on */
  proto_donor d = {.epoch = 5, .slots = 2};
  proto_progress p = {.epoch = 3,
                      .samples = 300,
                      .samples_per_second = 100.0,
                      .time_ms = 1700000000000ull,
                      .mode = PROTO_MODE_NODE};
  uint8_t buf[PROTO_RECORD_MAX];
  size_t len;
  strcpy(d.run, "demo");
  strcpy(d.addr, "h.io:900");
  ASSERT_OK(proto_donor_encode(&d, buf, sizeof buf, &len));
  ASSERT_UEQ(len, sizeof donor - 1);
  ASSERT_MEMEQ(buf, donor, len);
  strcpy(p.run, "demo");
  strcpy(p.label, "ok");
  ASSERT_OK(proto_progress_encode(&p, buf, sizeof buf, &len));
  ASSERT_UEQ(len, sizeof progress - 1);
  ASSERT_MEMEQ(buf, progress, len);
}

/* The encoders refuse what the decoders would, and write nothing then. */
static void test_encode_refusals(void) {
  uint8_t buf[PROTO_RECORD_MAX], junk[PROTO_RECORD_MAX];
  size_t len = 777;
  memset(junk, 0x3c, sizeof junk);
#define REFUSE(call, want)                                                     \
  do {                                                                         \
    memcpy(buf, junk, sizeof buf);                                             \
    ASSERT_RC(call, want);                                                     \
    ASSERT_MEMEQ(buf, junk, sizeof buf);                                       \
    ASSERT_UEQ(len, 777);                                                      \
  } while (0)
  proto_progress p = {.samples_per_second = 1};
  strcpy(p.run, "r");
  REFUSE(proto_progress_encode(&p, buf, 0, &len), BEE_ETOOBIG);
  p.run[0] = 0;
  REFUSE(proto_progress_encode(&p, buf, sizeof buf, &len), BEE_ERANGE);
  strcpy(p.run, "a b");
  REFUSE(proto_progress_encode(&p, buf, sizeof buf, &len), BEE_ERANGE);
  memset(p.run, 'r', sizeof p.run); /* no NUL: over 64 bytes */
  REFUSE(proto_progress_encode(&p, buf, sizeof buf, &len), BEE_ETOOBIG);
  strcpy(p.run, "r");
  memset(p.label, 'l', sizeof p.label);
  REFUSE(proto_progress_encode(&p, buf, sizeof buf, &len), BEE_ETOOBIG);
  strcpy(p.label, "two\nlines");
  REFUSE(proto_progress_encode(&p, buf, sizeof buf, &len), BEE_ERANGE);
  strcpy(p.label, "\xc3");
  REFUSE(proto_progress_encode(&p, buf, sizeof buf, &len), BEE_ERANGE);
  p.label[0] = 0;
  static const double bad_rates[] = {-1.0, -DBL_TRUE_MIN, NAN, INFINITY,
                                     -INFINITY};
  for (size_t i = 0; i < 5; i++) {
    p.samples_per_second = bad_rates[i];
    REFUSE(proto_progress_encode(&p, buf, sizeof buf, &len), BEE_ERANGE);
  }
  p.samples_per_second = 0;
  p.mode = 3;
  REFUSE(proto_progress_encode(&p, buf, sizeof buf, &len), BEE_ERANGE);
  p.mode = -1;
  REFUSE(proto_progress_encode(&p, buf, sizeof buf, &len), BEE_ERANGE);

  proto_metrics m = {.has_loss = true, .loss = NAN};
  strcpy(m.run, "r");
  REFUSE(proto_metrics_encode(&m, buf, sizeof buf, &len), BEE_ERANGE);
  m.has_loss = false; /* an unknown loss is nil, whatever the field holds */
  ASSERT_OK(proto_metrics_encode(&m, buf, sizeof buf, &len));
  len = 777;
  m.group_size = PROTO_GROUP_MAX + 1;
  REFUSE(proto_metrics_encode(&m, buf, sizeof buf, &len), BEE_ERANGE);
  m.group_size = 0;
  double *nonneg[] = {&m.samples_per_second, &m.compute_s, &m.averaging_s,
                      &m.grad_sq_local, &m.grad_sq_avg};
  for (size_t i = 0; i < 5; i++) {
    *nonneg[i] = -0.5;
    REFUSE(proto_metrics_encode(&m, buf, sizeof buf, &len), BEE_ERANGE);
    *nonneg[i] = INFINITY;
    REFUSE(proto_metrics_encode(&m, buf, sizeof buf, &len), BEE_ERANGE);
    *nonneg[i] = 0;
  }

  proto_match a = {.bandwidth_mbit = 100};
  strcpy(a.run, "r");
  strcpy(a.addr, "h:1");
  ASSERT_OK(proto_match_encode(&a, buf, sizeof buf, &len));
  len = 777;
  strcpy(a.bits, "012");
  REFUSE(proto_match_encode(&a, buf, sizeof buf, &len), BEE_ERANGE);
  memset(a.bits, '0', sizeof a.bits);
  REFUSE(proto_match_encode(&a, buf, sizeof buf, &len), BEE_ETOOBIG);
  a.bits[0] = 0;
  a.addr[0] = 0;
  REFUSE(proto_match_encode(&a, buf, sizeof buf, &len), BEE_ERANGE);
  strcpy(a.addr, "h:1\t");
  REFUSE(proto_match_encode(&a, buf, sizeof buf, &len), BEE_ERANGE);
  memset(a.addr, 'h', sizeof a.addr);
  REFUSE(proto_match_encode(&a, buf, sizeof buf, &len), BEE_ETOOBIG);
  strcpy(a.addr, "h:1");
  a.bandwidth_mbit = 0;
  REFUSE(proto_match_encode(&a, buf, sizeof buf, &len), BEE_ERANGE);
  a.bandwidth_mbit = 1;
  a.weight = -1;
  REFUSE(proto_match_encode(&a, buf, sizeof buf, &len), BEE_ERANGE);
  a.weight = NAN;
  REFUSE(proto_match_encode(&a, buf, sizeof buf, &len), BEE_ERANGE);
  a.weight = 0;
  a.mode = 3;
  REFUSE(proto_match_encode(&a, buf, sizeof buf, &len), BEE_ERANGE);

  proto_donor d = {.slots = PROTO_DONOR_SLOTS_MAX + 1};
  strcpy(d.run, "r");
  strcpy(d.addr, "h:1");
  REFUSE(proto_donor_encode(&d, buf, sizeof buf, &len), BEE_ERANGE);
  d.slots = 0;
  strcpy(d.run, "r/");
  REFUSE(proto_donor_encode(&d, buf, sizeof buf, &len), BEE_ERANGE);
#undef REFUSE
}

/* ---- keys ---------------------------------------------------------------- */

static void key_of(const char *name, uint8_t key[PROTO_DHT_KEY_BYTES]) {
  proto_dht_key(name, key);
}

static void test_keys(void) {
  uint8_t got[PROTO_DHT_KEY_BYTES], want[PROTO_DHT_KEY_BYTES];
  uint8_t msg[64];
  /* BLAKE2b-160("beed dht key" || name), in one call here... */
  memcpy(msg, "beed dht key", 12);
  memcpy(msg + 12, "demo_progress", 13);
  crypto_generichash(want, sizeof want, msg, 25, NULL, 0);
  proto_dht_key("demo_progress", got);
  ASSERT_MEMEQ(got, want, sizeof got);
  /* ... and as Python's hashlib.blake2b(digest_size=20) has it. */
  ASSERT_OK(proto_unhex("db33e90459c6440f14925b316d290883796e545b", want, 20));
  ASSERT_MEMEQ(got, want, sizeof got);
  proto_dht_key("", got);
  ASSERT_OK(proto_unhex("66a5bf38f6f9ea262af7928489f1d3be1012303e", want, 20));
  ASSERT_MEMEQ(got, want, sizeof got);

  /* Each type's name. */
  static const struct {
    int type;
    uint64_t round;
    const char *bits;
    const char *name;
  } names[] = {
      {PROTO_REC_PROGRESS, 9, "01", "demo_progress"},
      {PROTO_REC_METRICS, 9, "01", "demo_metrics"},
      {PROTO_REC_DONOR, 9, "01", "demo_donors"},
      {PROTO_REC_MATCH, 12, "0110", "demo.avg.12.0110"},
      {PROTO_REC_MATCH, 0, "", "demo.avg.0."},
      {PROTO_REC_MATCH, 0, NULL, "demo.avg.0."},
      {PROTO_REC_MATCH, UINT64_MAX, "1111111111111111",
       "demo.avg.18446744073709551615.1111111111111111"},
  };
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    proto_record_key(names[i].type, "demo", names[i].round, names[i].bits, got);
    key_of(names[i].name, want);
    if (memcmp(got, want, sizeof got) != 0)
      FAIL("key %zu is not the key of \"%s\"", i, names[i].name);
  }
  /* Round and bits count for matchmaking only. */
  proto_record_key(PROTO_REC_PROGRESS, "demo", 0, NULL, want);
  proto_record_key(PROTO_REC_PROGRESS, "demo", 77, "1", got);
  ASSERT_MEMEQ(got, want, sizeof got);
  proto_record_key(PROTO_REC_MATCH, "demo", 1, "0", got);
  proto_record_key(PROTO_REC_MATCH, "demo", 1, "00", want);
  ASSERT(memcmp(got, want, sizeof got) != 0);
}

/* ---- the DHT's check ----------------------------------------------------- */

static void test_check(void) {
  uint8_t buf[PROTO_RECORD_MAX], key[PROTO_DHT_KEY_BYTES];
  size_t len;
  int type;
  /* Untyped values pass unjudged, under any key and subkey. */
  /* clang-format off */
  static const struct {
    const char *raw;
    size_t n;
  } plain[] = {
      {"", 0},
      {"hello", 5},
      {"\xc1", 1},
      {"\xac" "bee.progress", 13},      /* a tag alone, not in an array */
      {"\x90", 1},                      /* [] */
      {"\x92\x01\x1f", 3},              /* [1, 31]: a revocation list */
      {"\x92\xa3" "bee\x01", 6},        /* ["bee", 1] */
      {"\x92\xa9" "other.tag\x01", 12},
      {"\x92\xac" "Bee.progress\x01", 15},
      {"\x92\xc4\x0c" "bee.progress\x01", 16}, /* a bin tag */
      /* Unknown "bee." types: a newer peer's, never refused here. */
      {"\x92\xaa" "bee.future\x01", 13},
      {"\x91\xa4" "bee.", 6},
      {"\x93\xad" "bee.progress2\x02\xc1", 17},
  };
  /* clang-format on */
  for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++)
    for (int owner = 0; owner < 2; owner++) {
      ASSERT_CODE(
          check((const uint8_t *)plain[i].raw, plain[i].n, NULL, owner, &type),
          0, "plain value %zu", i);
      ASSERT_EQ(type, PROTO_REC_NONE);
    }
  /* A value that names a known type is judged as one, even when its
   * array header promises more than there is. */
  /* clang-format off */
  static const struct {
    const char *raw;
    size_t n;
  } cut[] = {
      {"\x99\xac" "bee.progress", 14},
      {"\xdc\x00\x63\xac" "bee.progress", 17},
      {"\xdd\xff\xff\xff\xff\xac" "bee.progress", 19},
  };
  /* clang-format on */
  for (size_t i = 0; i < sizeof cut / sizeof cut[0]; i++) {
    ASSERT_CODE(check((const uint8_t *)cut[i].raw, cut[i].n, NULL, true, &type),
                BEE_ETRUNCATED, "cut value %zu", i);
    ASSERT_EQ(type, PROTO_REC_PROGRESS);
  }
  proto_dht_record nothing = {.value = {NULL, 0}};
  type = -1;
  ASSERT_OK(proto_record_check(&nothing, &type));
  ASSERT_EQ(type, PROTO_REC_NONE);

  /* A typed record: under its key and an owned subkey only. */
  proto_match a = {.round = 41, .bandwidth_mbit = 10, .weight = 1};
  strcpy(a.run, "demo");
  strcpy(a.bits, "101");
  strcpy(a.addr, "10.1.2.3:45555");
  ASSERT_OK(proto_match_encode(&a, buf, sizeof buf, &len));
  proto_record_key(PROTO_REC_MATCH, "demo", 41, "101", key);
  ASSERT_OK(check(buf, len, key, true, &type));
  ASSERT_EQ(type, PROTO_REC_MATCH);
  ASSERT_RC(check(buf, len, key, false, &type), BEE_EAUTH);
  ASSERT_EQ(type, PROTO_REC_MATCH);
  proto_dht_record r = {.value = {buf, len}};
  memcpy(r.key, key, sizeof key);
  ASSERT_RC(proto_record_check(&r, &type), BEE_EAUTH); /* no subkey */
  r.subkey = (proto_bytes){owned, sizeof owned - 1};   /* 0x01, 31 bytes */
  ASSERT_RC(proto_record_check(&r, &type), BEE_EAUTH);
  r.subkey = (proto_bytes){owned, sizeof owned};
  ASSERT_OK(proto_record_check(&r, &type));
  /* Under another round's, bits', run's or type's key. */
  static const struct {
    int type;
    const char *run;
    uint64_t round;
    const char *bits;
  } wrong[] = {
      {PROTO_REC_MATCH, "demo", 40, "101"},
      {PROTO_REC_MATCH, "demo", 41, "10"},
      {PROTO_REC_MATCH, "demo", 41, "1010"},
      {PROTO_REC_MATCH, "demO", 41, "101"},
      {PROTO_REC_PROGRESS, "demo", 41, "101"},
      {PROTO_REC_DONOR, "demo", 41, "101"},
  };
  for (size_t i = 0; i < sizeof wrong / sizeof wrong[0]; i++) {
    proto_record_key(wrong[i].type, wrong[i].run, wrong[i].round, wrong[i].bits,
                     key);
    ASSERT_CODE(check(buf, len, key, true, &type), BEE_EAUTH, "wrong key %zu",
                i);
    ASSERT_EQ(type, PROTO_REC_MATCH);
  }
  memset(key, 0, sizeof key);
  ASSERT_RC(check(buf, len, key, true, &type), BEE_EAUTH);

  /* The same for the other three types, and across them. */
  proto_progress p = {.epoch = 2};
  strcpy(p.run, "demo");
  ASSERT_OK(proto_progress_encode(&p, buf, sizeof buf, &len));
  proto_record_key(PROTO_REC_PROGRESS, "demo", 0, NULL, key);
  ASSERT_OK(check(buf, len, key, true, &type));
  ASSERT_EQ(type, PROTO_REC_PROGRESS);
  ASSERT_RC(check(buf, len, key, false, &type), BEE_EAUTH);
  proto_record_key(PROTO_REC_METRICS, "demo", 0, NULL, key);
  ASSERT_RC(check(buf, len, key, true, &type), BEE_EAUTH);

  proto_metrics m = {.step = 1};
  strcpy(m.run, "demo");
  ASSERT_OK(proto_metrics_encode(&m, buf, sizeof buf, &len));
  ASSERT_OK(check(buf, len, key, true, &type));
  ASSERT_EQ(type, PROTO_REC_METRICS);
  ASSERT_RC(check(buf, len, key, false, &type), BEE_EAUTH);
  proto_record_key(PROTO_REC_METRICS, "demo2", 0, NULL, key);
  ASSERT_RC(check(buf, len, key, true, &type), BEE_EAUTH);

  proto_donor d = {.slots = 4};
  strcpy(d.run, "demo");
  strcpy(d.addr, "donor.example:45555");
  ASSERT_OK(proto_donor_encode(&d, buf, sizeof buf, &len));
  proto_record_key(PROTO_REC_DONOR, "demo", 0, NULL, key);
  ASSERT_OK(check(buf, len, key, true, &type));
  ASSERT_EQ(type, PROTO_REC_DONOR);
  ASSERT_RC(check(buf, len, key, false, &type), BEE_EAUTH);
  proto_record_key(PROTO_REC_PROGRESS, "demo", 0, NULL, key);
  ASSERT_RC(check(buf, len, key, true, &type), BEE_EAUTH);
}

/* bee.progress's optional eighth field: leaving, written only when true;
 * a false one reads as absent, and a non-bool there is a later version's
 * field, skipped. */
static void test_leaving(void) {
  proto_progress p = {.epoch = 3, .samples = 7, .samples_per_second = 2.5,
                      .time_ms = 1700000000000ull, .mode = PROTO_MODE_NODE},
                 d;
  snprintf(p.run, sizeof p.run, "run");
  snprintf(p.label, sizeof p.label, "eu");
  uint8_t a[PROTO_RECORD_MAX], b[PROTO_RECORD_MAX];
  size_t an, bn;
  ASSERT_OK(proto_progress_encode(&p, a, sizeof a, &an));
  p.leaving = true;
  ASSERT_OK(proto_progress_encode(&p, b, sizeof b, &bn));
  ASSERT_UEQ(bn, an + 1);
  ASSERT_EQ(b[0], a[0] + 1); /* one more element in the fixarray */
  ASSERT_EQ(b[bn - 1], 0xc3);
  ASSERT_MEMEQ(b + 1, a + 1, an - 1);
  ASSERT_OK(proto_progress_decode(b, bn, &d));
  ASSERT(d.leaving && d.epoch == 3);
  ASSERT_OK(proto_progress_decode(a, an, &d));
  ASSERT(!d.leaving);
  b[bn - 1] = 0xc2; /* false, spelled out */
  ASSERT_OK(proto_progress_decode(b, bn, &d));
  ASSERT(!d.leaving);
  b[bn - 1] = 0x05; /* a later field of another type */
  ASSERT_OK(proto_progress_decode(b, bn, &d));
  ASSERT(!d.leaving);
  b[bn - 1] = 0xc1;
  ASSERT_RC(proto_progress_decode(b, bn, &d), BEE_EMALFORMED);
  /* leaving, then a later field: both read. */
  memcpy(b, a, an);
  b[0] = (uint8_t)(a[0] + 2);
  b[an] = 0xc3;
  b[an + 1] = 0x2a;
  ASSERT_OK(proto_progress_decode(b, an + 2, &d));
  ASSERT(d.leaving);
}

/* bee.metrics's optional fifteenth field: the share the round averaged by
 * all, a float64 in [0, 1]; another type there is a later version's
 * field, skipped; a float outside [0, 1] is refused. */
static void test_by_all(void) {
  proto_metrics m = {.step = 4, .samples_per_second = 2.5, .time_ms = 17},
                d;
  snprintf(m.run, sizeof m.run, "run");
  uint8_t a[PROTO_RECORD_MAX], b[PROTO_RECORD_MAX];
  size_t an, bn;
  ASSERT_OK(proto_metrics_encode(&m, a, sizeof a, &an));
  m.has_by_all = true;
  m.by_all = 0.75;
  ASSERT_OK(proto_metrics_encode(&m, b, sizeof b, &bn));
  ASSERT_UEQ(bn, an + 9);
  /* 16 elements, an array16 (0xdc, then the count); one more */
  ASSERT_EQ(a[0], 0xdc);
  ASSERT_EQ(b[2], a[2] + 1);
  ASSERT_EQ(b[an], 0xcb);
  ASSERT_MEMEQ(b + 3, a + 3, an - 3);
  ASSERT_OK(proto_metrics_decode(b, bn, &d));
  ASSERT(d.has_by_all && d.by_all == 0.75 && d.step == 4);
  ASSERT_OK(proto_metrics_decode(a, an, &d));
  ASSERT(!d.has_by_all);
  for (double bad = -0.5; bad < 2; bad += 1.75) { /* -0.5, 1.25 */
    m.by_all = bad;
    ASSERT_RC(proto_metrics_encode(&m, b, sizeof b, &bn), BEE_ERANGE);
    m.by_all = 1;
    ASSERT_OK(proto_metrics_encode(&m, b, sizeof b, &bn));
    memcpy(b + bn - 8, (uint8_t[8]){0}, 8); /* 0.0: fine */
    ASSERT_OK(proto_metrics_decode(b, bn, &d));
    ASSERT(d.has_by_all && d.by_all == 0);
    uint64_t bits;
    memcpy(&bits, &bad, 8);
    for (int i = 0; i < 8; i++)
      b[bn - 8 + i] = (uint8_t)(bits >> (56 - 8 * i));
    ASSERT_RC(proto_metrics_decode(b, bn, &d), BEE_ERANGE);
  }
  /* a later field of another type there: skipped */
  memcpy(b, a, an);
  b[2] = (uint8_t)(a[2] + 1);
  b[an] = 0x05;
  ASSERT_OK(proto_metrics_decode(b, an + 1, &d));
  ASSERT(!d.has_by_all && d.step == 4);
}

/* bee.metrics's optional sixteenth field, after by_all: a bool that says
 * the peer's parameters left its swarm's; written only when true, refused
 * without by_all; another type there is a later version's field. */
static void test_diverged(void) {
  proto_metrics m = {.step = 9, .time_ms = 5, .has_by_all = true, .by_all = 0},
                d;
  snprintf(m.run, sizeof m.run, "run");
  uint8_t a[PROTO_RECORD_MAX], b[PROTO_RECORD_MAX];
  size_t an, bn;
  ASSERT_OK(proto_metrics_encode(&m, a, sizeof a, &an));
  m.diverged = true;
  ASSERT_OK(proto_metrics_encode(&m, b, sizeof b, &bn));
  ASSERT_UEQ(bn, an + 1);
  ASSERT_EQ(b[2], a[2] + 1);
  ASSERT_EQ(b[an], 0xc3);
  ASSERT_OK(proto_metrics_decode(b, bn, &d));
  ASSERT(d.diverged && d.has_by_all && d.by_all == 0 && d.step == 9);
  ASSERT_OK(proto_metrics_decode(a, an, &d));
  ASSERT(!d.diverged);
  b[an] = 0xc2; /* false written out: read as false */
  ASSERT_OK(proto_metrics_decode(b, bn, &d));
  ASSERT(!d.diverged && d.has_by_all);
  b[an] = 0xa1; /* a later field of another type: skipped */
  b[bn] = 'x';
  ASSERT_OK(proto_metrics_decode(b, bn + 1, &d));
  ASSERT(!d.diverged && d.has_by_all);
  b[an] = 0xc1; /* never used: malformed */
  ASSERT_RC(proto_metrics_decode(b, bn, &d), BEE_EMALFORMED);
  m.has_by_all = false; /* positional: by_all comes first */
  ASSERT_RC(proto_metrics_encode(&m, b, sizeof b, &bn), BEE_ERANGE);
}

/* The seventeenth field, after diverged (then written even when false):
 * the parameters' hash, a bin of 8; another type there is a later
 * version's field, another size refused. */
static void test_params_hash(void) {
  proto_metrics m = {.step = 9, .time_ms = 5, .has_by_all = true, .by_all = 1},
                d;
  snprintf(m.run, sizeof m.run, "run");
  uint8_t a[PROTO_RECORD_MAX], b[PROTO_RECORD_MAX];
  size_t an, bn;
  ASSERT_OK(proto_metrics_encode(&m, a, sizeof a, &an));
  m.has_params = true;
  memcpy(m.params, "\x01\x02\x03\x04\x05\x06\x07\x08", 8);
  ASSERT_OK(proto_metrics_encode(&m, b, sizeof b, &bn));
  ASSERT_UEQ(bn, an + 1 + 2 + 8); /* false, then bin8 */
  ASSERT_EQ(b[2], a[2] + 2);
  ASSERT_EQ(b[an], 0xc2);
  ASSERT_EQ(b[an + 1], 0xc4);
  ASSERT_OK(proto_metrics_decode(b, bn, &d));
  ASSERT(d.has_params && !d.diverged && memcmp(d.params, m.params, 8) == 0);
  ASSERT_OK(proto_metrics_decode(a, an, &d));
  ASSERT(!d.has_params);
  m.diverged = true;
  ASSERT_OK(proto_metrics_encode(&m, b, sizeof b, &bn));
  ASSERT_OK(proto_metrics_decode(b, bn, &d));
  ASSERT(d.has_params && d.diverged);
  b[an + 1] = 0xa9; /* a str of 9 there: a later version's field */
  ASSERT_OK(proto_metrics_decode(b, bn, &d));
  ASSERT(!d.has_params && d.diverged);
  b[an + 1] = 0xc4, b[an + 2] = 7; /* a bin of 7, one byte left over */
  ASSERT_RC(proto_metrics_decode(b, bn, &d), BEE_ERANGE);
  m.has_by_all = false;
  ASSERT_RC(proto_metrics_encode(&m, b, sizeof b, &bn), BEE_ERANGE);
}

/* The eighteenth field, after the hash: the peer's earlier averaged
 * steps, [[step, group, hash] ...], at most 4, each below step with a
 * group of 2 or more; another type there is a later version's field. */
static void test_params_lines(void) {
  proto_metrics m = {.step = 9, .time_ms = 5, .has_by_all = true,
                     .by_all = 1, .has_params = true},
                d;
  snprintf(m.run, sizeof m.run, "run");
  memset(m.params, 0x11, 8);
  uint8_t a[PROTO_RECORD_MAX], b[PROTO_RECORD_MAX];
  size_t an, bn;
  ASSERT_OK(proto_metrics_encode(&m, a, sizeof a, &an));
  m.nlines = 2;
  m.lines[0] = (proto_metrics_line){.step = 8, .group_size = 3};
  memset(m.lines[0].params, 0x22, 8);
  m.lines[1] = (proto_metrics_line){.step = 6, .group_size = 2};
  memset(m.lines[1].params, 0x33, 8);
  ASSERT_OK(proto_metrics_encode(&m, b, sizeof b, &bn));
  ASSERT_UEQ(bn, an + 1 + 2 * (1 + 1 + 1 + 2 + 8));
  ASSERT_EQ(b[2], a[2] + 1);
  ASSERT_EQ(b[an], 0x92); /* an array of 2 */
  ASSERT_OK(proto_metrics_decode(b, bn, &d));
  ASSERT_UEQ(d.nlines, 2);
  ASSERT_UEQ(d.lines[0].step, 8);
  ASSERT_UEQ(d.lines[1].group_size, 2);
  ASSERT_MEMEQ(d.lines[1].params, m.lines[1].params, 8);
  ASSERT_OK(proto_metrics_decode(a, an, &d));
  ASSERT_UEQ(d.nlines, 0);
  /* A later version's field in its place: skipped. */
  memcpy(a, b, bn);
  a[an] = 0xa1, a[an + 1] = 'x';
  ASSERT_OK(proto_metrics_decode(a, an + 2, &d));
  ASSERT_UEQ(d.nlines, 0);
  ASSERT(d.has_params);
  /* A step not below this one, a group of 1, five lines: refused both
   * ways. */
  b[an + 2] = 9; /* the first line's step */
  ASSERT_RC(proto_metrics_decode(b, bn, &d), BEE_ERANGE);
  b[an + 2] = 8, b[an + 3] = 1; /* its group */
  ASSERT_RC(proto_metrics_decode(b, bn, &d), BEE_ERANGE);
  m.lines[0].step = 9;
  ASSERT_RC(proto_metrics_encode(&m, b, sizeof b, &bn), BEE_ERANGE);
  m.lines[0].step = 8, m.lines[0].group_size = 1;
  ASSERT_RC(proto_metrics_encode(&m, b, sizeof b, &bn), BEE_ERANGE);
  m.lines[0].group_size = 3, m.nlines = 5;
  ASSERT_RC(proto_metrics_encode(&m, b, sizeof b, &bn), BEE_ERANGE);
  m.nlines = 1, m.has_params = false;
  ASSERT_RC(proto_metrics_encode(&m, b, sizeof b, &bn), BEE_ERANGE);
}

/* The nineteenth and twentieth fields, after lines (then written, empty
 * included): the peer's loss scale (a float > 0) and the batches it
 * dropped in the step (a uint).  Another type in either place is a later
 * version's field. */
static void test_loss_scale(void) {
  proto_metrics m = {.step = 9, .time_ms = 5, .has_by_all = true,
                     .by_all = 1, .has_params = true},
                d;
  snprintf(m.run, sizeof m.run, "run");
  memset(m.params, 0x11, 8);
  uint8_t a[PROTO_RECORD_MAX], b[PROTO_RECORD_MAX];
  size_t an, bn, xn;
  ASSERT_OK(proto_metrics_encode(&m, a, sizeof a, &an));
  m.has_loss_scale = true;
  m.loss_scale = 0x1p15;
  m.dropped = 300;
  ASSERT_OK(proto_metrics_encode(&m, b, sizeof b, &bn));
  /* An empty lines array, the float64, a uint16. */
  ASSERT_UEQ(bn, an + 1 + 9 + 3);
  ASSERT_EQ(b[2], a[2] + 3);
  ASSERT_EQ(b[an], 0x90);
  ASSERT_EQ(b[an + 1], 0xcb);
  ASSERT_EQ(b[an + 10], 0xcd);
  ASSERT_OK(proto_metrics_decode(b, bn, &d));
  ASSERT(d.has_loss_scale && d.loss_scale == 0x1p15);
  ASSERT_UEQ(d.dropped, 300);
  ASSERT_UEQ(d.nlines, 0);
  ASSERT_OK(proto_metrics_decode(a, an, &d));
  ASSERT(!d.has_loss_scale && d.dropped == 0);
  /* With lines before them. */
  m.nlines = 1;
  m.lines[0] = (proto_metrics_line){.step = 8, .group_size = 2};
  ASSERT_OK(proto_metrics_encode(&m, b, sizeof b, &bn));
  ASSERT_OK(proto_metrics_decode(b, bn, &d));
  ASSERT(d.has_loss_scale && d.nlines == 1 && d.dropped == 300);
  m.nlines = 0;
  /* A scale of 0, below 0, infinite or NaN: refused both ways. */
  const double bad[] = {0, -1, INFINITY, NAN};
  ASSERT_OK(proto_metrics_encode(&m, b, sizeof b, &bn));
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    m.loss_scale = bad[i];
    ASSERT_RC(proto_metrics_encode(&m, a, sizeof a, &xn), BEE_ERANGE);
    uint8_t c[PROTO_RECORD_MAX];
    memcpy(c, b, bn);
    uint64_t bits;
    memcpy(&bits, &bad[i], 8);
    for (int k = 0; k < 8; k++) /* big-endian float64 after 0xcb */
      c[bn - 11 + k] = (uint8_t)(bits >> (56 - 8 * k));
    ASSERT_RC(proto_metrics_decode(c, bn, &d), BEE_ERANGE);
  }
  m.loss_scale = 1;
  /* Not without the hash (so lines) before it. */
  m.has_params = false;
  ASSERT_RC(proto_metrics_encode(&m, a, sizeof a, &xn), BEE_ERANGE);
  m.has_params = true;
  /* A later version's field in the scale's place (a str), or in the
   * count's (a bool): skipped. */
  uint8_t c[PROTO_RECORD_MAX];
  memcpy(c, b, an + 1); /* up to the empty lines */
  size_t cn = an + 1;
  c[cn++] = 0xa1, c[cn++] = 'x';
  c[cn++] = 0xcd, c[cn++] = 0x01, c[cn++] = 0x2c;
  ASSERT_OK(proto_metrics_decode(c, cn, &d));
  ASSERT(!d.has_loss_scale && d.dropped == 0 && d.has_params);
  memcpy(c, b, an + 10); /* up to the scale */
  c[an + 10] = 0xc2;
  ASSERT_OK(proto_metrics_decode(c, an + 11, &d));
  ASSERT(d.has_loss_scale && d.dropped == 0);
  /* The scale without the count: refused (they come together). */
  c[2] -= 1;
  ASSERT_RC(proto_metrics_decode(c, an + 10, &d), BEE_EMISSING);
}

int main(void) {
  if (sodium_init() < 0)
    FAIL("sodium_init");
  owned[0] = PROTO_DHT_OWNER_TAG;
  memset(owned + 1, 0x77, PROTO_PK_BYTES);
  test_keys();
  test_vectors();
  test_roundtrip();
  test_encode_refusals();
  test_fields();
  test_shape();
  test_check();
  test_leaving();
  test_by_all();
  test_diverged();
  test_params_hash();
  test_params_lines();
  test_loss_scale();
  printf("typed records: all checks passed\n");
  return 0;
}
