/* test-proto-codec.c: the envelope and handshake message codecs.
 *
 * Every envelope type and every handshake message goes through a round
 * trip with edge values (0, UINT64_MAX, INT64_MIN, empty and largest
 * fields); every encoding is then cut at each length (BEE_ETRUNCATED) and
 * given one byte too many (BEE_ETRAILING).  Hand-built messages check that
 * each kind of bad input is refused with its own code.
 */
#include "proto-int.h"
#include "test.h"

#define PAYLOAD_MAX (PROTO_FRAME_MAX - 1024)
#define AUTH_SEALED_MAX 1536

static size_t n_roundtrips, n_rejected;

/* A decoder under test, its output thrown away. */
typedef int (*decode_fn)(const uint8_t *buf, size_t len);

static int dec_msg(const uint8_t *buf, size_t len) {
  proto_msg m;
  return proto_msg_decode(buf, len, &m);
}

static int dec_hello(const uint8_t *buf, size_t len) {
  proto_hello m;
  return proto__hello_decode(buf, len, &m);
}

static int dec_auth(const uint8_t *buf, size_t len) {
  proto_auth_msg m;
  return proto__auth_decode(buf, len, &m);
}

static int dec_inner(const uint8_t *buf, size_t len) {
  proto_auth_inner m;
  return proto__auth_inner_decode(buf, len, &m);
}

static int dec_result(const uint8_t *buf, size_t len) {
  int64_t code;
  proto_bytes text;
  return proto__result_decode(buf, len, &code, &text);
}

/* Checks that fn refuses buf with want. */
static void reject(decode_fn fn, const void *buf, size_t len, int want) {
  /* An exact-size copy, so the sanitizers catch any read past the end. */
  uint8_t *copy = malloc(len ? len : 1);
  ASSERT(copy);
  memcpy(copy, buf, len);
  ASSERT_RC(fn(copy, len), want);
  free(copy);
  n_rejected++;
}

#define REJECT(fn, lit, want) reject(fn, lit, sizeof(lit) - 1, want)

/* Decodes buf whole, cut at every length, and with a byte appended. */
static void check_cuts(decode_fn fn, const uint8_t *buf, size_t len) {
  uint8_t *copy = malloc(len + 1);
  ASSERT(copy);
  memcpy(copy, buf, len);
  copy[len] = 0;
  ASSERT_OK(fn(copy, len));
  ASSERT_RC(fn(copy, len + 1), BEE_ETRAILING);
  free(copy);
  /* Short prefixes as exact-size copies; for large messages the rest in
   * place, which is as strict, only less watched by ASan. */
  size_t exact = len < 4096 ? len : 4096;
  for (size_t k = 0; k < exact; k++)
    reject(fn, buf, k, BEE_ETRUNCATED);
  for (size_t k = exact; k < len; k++)
    ASSERT_RC(fn(buf, k), BEE_ETRUNCATED);
}

/* ---- envelope ----------------------------------------------------------- */

static bool bytes_eq(proto_bytes a, proto_bytes b) {
  return a.n == b.n && (a.n == 0 || memcmp(a.p, b.p, a.n) == 0);
}

static void msg_eq(const proto_msg *a, const proto_msg *b) {
  ASSERT_EQ(a->type, b->type);
  ASSERT_UEQ(a->id, b->id);
  ASSERT_EQ(a->code, b->code);
  ASSERT_UEQ(a->offset, b->offset);
  ASSERT(bytes_eq(a->name, b->name));
  ASSERT(bytes_eq(a->payload, b->payload));
}

/* Encodes m into a buffer of exactly proto_msg_encoded_max bytes, checks
 * that every smaller buffer than needed fails cleanly, decodes, compares
 * with want (m with its unused fields zeroed), and cuts the encoding. */
static void roundtrip(const proto_msg *m, const proto_msg *want) {
  size_t cap = proto_msg_encoded_max(m), len = 0;
  uint8_t *buf = malloc(cap);
  ASSERT(buf);
  ASSERT_OK(proto_msg_encode(m, buf, cap, &len));
  ASSERT_LE(len, cap);
  size_t dummy;
  ASSERT_RC(proto_msg_encode(m, buf, len - 1, &dummy), BEE_ETOOBIG);
  for (size_t c = 0; c < len && c < 64; c++)
    ASSERT_RC(proto_msg_encode(m, buf, c, &dummy), BEE_ETOOBIG);
  proto_msg got;
  memset(&got, 0xa5, sizeof got);
  ASSERT_OK(proto_msg_decode(buf, len, &got));
  msg_eq(&got, want);
  check_cuts(dec_msg, buf, len);
  /* Encode types other than the envelope's are not envelopes. */
  ASSERT_RC(proto__hello_decode(buf, len, &(proto_hello){0}), BEE_EUNKNOWN);
  free(buf);
  n_roundtrips++;
}

static proto_bytes bytes(const void *p, size_t n) {
  return (proto_bytes){.p = p, .n = n};
}

/* The fields each envelope type carries: id, name, payload, code,
 * offset (from the layouts in proto.h). */
static const char *const carries[] = {
    [PROTO_T_REQUEST] = "inp",      [PROTO_T_RESPONSE] = "ip",
    [PROTO_T_ERROR] = "icp",        [PROTO_T_CANCEL] = "i",
    [PROTO_T_ONEWAY] = "np",        [PROTO_T_STREAM_OPEN] = "inop",
    [PROTO_T_STREAM_CHUNK] = "iop", [PROTO_T_STREAM_END] = "ic",
    [PROTO_T_PING] = "i",           [PROTO_T_PONG] = "i",
    [PROTO_T_CLOSE] = "cp",
};

/* One envelope of type t with every field set: those t does not carry
 * must be ignored by encoding and come back zero from decoding. */
static void roundtrip_fields(int t, uint64_t id, proto_bytes name,
                             proto_bytes payload, int64_t code,
                             uint64_t offset) {
  proto_msg m = {.type = t,
                 .id = id,
                 .name = name,
                 .payload = payload,
                 .code = code,
                 .offset = offset};
  proto_msg want = {.type = t};
  const char *c = carries[t];
  if (strchr(c, 'i'))
    want.id = id;
  if (strchr(c, 'n'))
    want.name = name;
  if (strchr(c, 'p'))
    want.payload = payload;
  if (strchr(c, 'c'))
    want.code = code;
  if (strchr(c, 'o'))
    want.offset = offset;
  roundtrip(&m, &want);
}

/* The limit of payload-like field of type t. */
static size_t payload_max(int t) {
  if (t == PROTO_T_STREAM_CHUNK)
    return PROTO_CHUNK_MAX;
  if (t == PROTO_T_ERROR || t == PROTO_T_CLOSE)
    return PROTO_TEXT_MAX;
  return PAYLOAD_MAX;
}

static void test_envelope_roundtrip(void) {
  uint8_t *big = malloc(PAYLOAD_MAX);
  ASSERT(big);
  for (size_t i = 0; i < PAYLOAD_MAX; i++)
    big[i] = (uint8_t)(i * 7 + 1);
  char name[PROTO_METHOD_MAX];
  memset(name, 'm', sizeof name);
  for (int t = PROTO_T_REQUEST; t <= PROTO_T_CLOSE; t++) {
    size_t pmax = payload_max(t);
    roundtrip_fields(t, 0, bytes("x", 1), bytes(NULL, 0), 0, 0);
    roundtrip_fields(t, UINT64_MAX, bytes(name, sizeof name), bytes(big, pmax),
                     INT64_MIN, UINT64_MAX);
    roundtrip_fields(t, 1u << 31, bytes("dht.find", 8), bytes(big, 31),
                     INT64_MAX, 65536);
    roundtrip_fields(t, 127, bytes(name, 32), bytes(big, 256), -1, 255);
    roundtrip_fields(t, 128, bytes(name, 31), bytes("", 0), -32, 128);
  }
  free(big);
}

/* A STREAM_CHUNK header followed by its data is exactly the message. */
/* proto__msg_head_encode + the payload bytes = proto_msg_encode, for
 * every type whose last field is a payload; the others are refused. */
static void test_msg_head(void) {
  static uint8_t data[70000], whole[70100], split[70100];
  for (size_t i = 0; i < sizeof data; i++)
    data[i] = (uint8_t)(i * 7);
  const int types[] = {PROTO_T_REQUEST, PROTO_T_RESPONSE, PROTO_T_ONEWAY,
                       PROTO_T_STREAM_OPEN, PROTO_T_STREAM_CHUNK};
  const size_t lens[] = {0, 1, 4096, 65535, 65536, 70000};
  for (size_t t = 0; t < sizeof types / sizeof types[0]; t++)
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
      size_t n = types[t] == PROTO_T_STREAM_CHUNK && lens[i] > PROTO_CHUNK_MAX
                     ? PROTO_CHUNK_MAX
                     : lens[i];
      proto_msg m = {.type = types[t],
                     .id = 77,
                     .offset = 5,
                     .name = bytes((const uint8_t *)"avg.r", 5),
                     .payload = bytes(data, n)};
      size_t wlen, hlen;
      ASSERT_OK(proto_msg_encode(&m, whole, sizeof whole, &wlen));
      ASSERT_OK(proto__msg_head_encode(&m, split, sizeof split, &hlen));
      ASSERT_EQ(hlen + n, wlen);
      memcpy(split + hlen, data, n);
      ASSERT_MEMEQ(split, whole, wlen);
    }
  proto_msg ping = {.type = PROTO_T_PING, .id = 1};
  size_t hlen;
  ASSERT_RC(proto__msg_head_encode(&ping, split, sizeof split, &hlen),
            BEE_ERANGE);
  proto_msg bad = {.type = 99};
  ASSERT_RC(proto__msg_head_encode(&bad, split, sizeof split, &hlen),
            BEE_EUNKNOWN);
}

static void test_chunk_header(void) {
  uint8_t *data = malloc(PROTO_CHUNK_MAX);
  size_t cap = PROTO_CHUNK_MAX + 64;
  uint8_t *whole = malloc(cap), *split = malloc(cap);
  ASSERT(data && whole && split);
  for (size_t i = 0; i < PROTO_CHUNK_MAX; i++)
    data[i] = (uint8_t)(i ^ (i >> 8));
  size_t lens[] = {0, 1, 31, 32, 255, 256, 65535, 65536, PROTO_CHUNK_MAX};
  uint64_t ids[] = {0, 1, UINT64_MAX};
  for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
    for (size_t j = 0; j < 3; j++) {
      proto_msg m = {.type = PROTO_T_STREAM_CHUNK,
                     .id = ids[j],
                     .offset = ids[2 - j],
                     .payload = bytes(data, lens[i])};
      size_t wlen, hlen;
      ASSERT_OK(proto_msg_encode(&m, whole, cap, &wlen));
      ASSERT_OK(proto_chunk_header_encode(ids[j], ids[2 - j], lens[i], split,
                                          cap, &hlen));
      ASSERT_EQ(hlen + lens[i], wlen);
      memcpy(split + hlen, data, lens[i]);
      ASSERT_MEMEQ(split, whole, wlen);
      ASSERT_RC(proto_chunk_header_encode(ids[j], ids[2 - j], lens[i], split,
                                          hlen - 1, &hlen),
                BEE_ETOOBIG);
    }
  }
  size_t hlen;
  ASSERT_RC(
      proto_chunk_header_encode(1, 0, PROTO_CHUNK_MAX + 1, split, cap, &hlen),
      BEE_ETOOBIG);
  free(data);
  free(whole);
  free(split);
}

static void test_envelope_encode_errors(void) {
  uint8_t buf[1024];
  size_t len;
  char name[PROTO_METHOD_MAX + 1];
  memset(name, 'n', sizeof name);
  proto_msg m = {.type = PROTO_T_REQUEST, .name = bytes(name, sizeof name)};
  ASSERT_RC(proto_msg_encode(&m, buf, sizeof buf, &len), BEE_ETOOBIG);
  m.name.n = 0;
  ASSERT_RC(proto_msg_encode(&m, buf, sizeof buf, &len), BEE_ERANGE);
  m.type = PROTO_T_ONEWAY;
  ASSERT_RC(proto_msg_encode(&m, buf, sizeof buf, &len), BEE_ERANGE);
  m.type = PROTO_T_STREAM_OPEN;
  ASSERT_RC(proto_msg_encode(&m, buf, sizeof buf, &len), BEE_ERANGE);
  /* Size checks come before any byte is read, so a fake length will do. */
  m = (proto_msg){.type = PROTO_T_RESPONSE, .payload = bytes(buf, 0)};
  m.payload.n = PAYLOAD_MAX + 1;
  ASSERT_RC(proto_msg_encode(&m, buf, sizeof buf, &len), BEE_ETOOBIG);
  m.type = PROTO_T_STREAM_CHUNK;
  m.payload.n = PROTO_CHUNK_MAX + 1;
  ASSERT_RC(proto_msg_encode(&m, buf, sizeof buf, &len), BEE_ETOOBIG);
  m.type = PROTO_T_CLOSE;
  m.payload.n = PROTO_TEXT_MAX + 1;
  ASSERT_RC(proto_msg_encode(&m, buf, sizeof buf, &len), BEE_ETOOBIG);
  m.type = PROTO_T_ERROR;
  ASSERT_RC(proto_msg_encode(&m, buf, sizeof buf, &len), BEE_ETOOBIG);
  /* Handshake and token types are not envelopes either. */
  static const int bad[] = {0, 12, 19, 20, 21, 22, 30, 31, -1};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    m = (proto_msg){.type = bad[i]};
    ASSERT_RC(proto_msg_encode(&m, buf, sizeof buf, &len), BEE_EUNKNOWN);
  }
}

/* Hand-built envelopes, one per kind of fault. */
static void test_envelope_malformed(void) {
  REJECT(dec_msg, "\xc1", BEE_EMALFORMED);
  REJECT(dec_msg, "\x93\x01\x04\xc1", BEE_EMALFORMED);
  REJECT(dec_msg, "\x93\xc1\x04\x01", BEE_EMALFORMED);
  REJECT(dec_msg, "\x95\x01\x01\x01\xa1m\xc1", BEE_EMALFORMED);

  REJECT(dec_msg, "", BEE_ETRUNCATED);
  REJECT(dec_msg, "\x93\x01\x04", BEE_ETRUNCATED);
  REJECT(dec_msg, "\x93\x01\x04\xcf\x00", BEE_ETRUNCATED);
  REJECT(dec_msg, "\xdd\xff\xff\xff\xff", BEE_ETRUNCATED);
  REJECT(dec_msg, "\x94\x01\x02\x01\xc6\xff\xff\xff\xff", BEE_ETRUNCATED);

  REJECT(dec_msg, "\x93\x01\x04\x05\x00", BEE_ETRAILING);
  REJECT(dec_msg, "\x93\x01\x04\x05\x93\x01\x04\x05", BEE_ETRAILING);

  REJECT(dec_msg, "\x05", BEE_ETYPE);                 /* not an array */
  REJECT(dec_msg, "\x81\x01\x02", BEE_ETYPE);         /* a map */
  REJECT(dec_msg, "\x94\x01\x04\x05\x06", BEE_ETYPE); /* one field too many */
  REJECT(dec_msg, "\x93\x01\x04\xa1x", BEE_ETYPE);    /* id as str */
  REJECT(dec_msg, "\x93\x01\x04\xc0", BEE_ETYPE);     /* id as nil */
  REJECT(dec_msg, "\x93\x01\x04\xc3", BEE_ETYPE);     /* id as bool */
  REJECT(dec_msg, "\x93\x01\x04\xca\0\0\0\0", BEE_ETYPE); /* float */
  REJECT(dec_msg, "\x93\x01\x04\x90", BEE_ETYPE);         /* nested array */
  REJECT(dec_msg, "\x93\x01\x04\x80", BEE_ETYPE);         /* nested map */
  REJECT(dec_msg, "\x95\x01\x01\x01\xc4\x01m\xc4\x00", BEE_ETYPE);
  REJECT(dec_msg, "\x95\x01\x01\x01\xa1m\xa0", BEE_ETYPE);
  REJECT(dec_msg, "\x95\x01\x03\x01\xa1x\xa0", BEE_ETYPE); /* code as str */
  REJECT(dec_msg, "\x95\x01\x03\x01\x01\xc4\x00", BEE_ETYPE);
  REJECT(dec_msg, "\x93\xa1v\x04\x01", BEE_ETYPE); /* version as str */
  REJECT(dec_msg, "\x93\x01\xa1t\x01", BEE_ETYPE); /* type as str */

  REJECT(dec_msg, "\x90", BEE_EMISSING);
  REJECT(dec_msg, "\x91\x01", BEE_EMISSING);
  REJECT(dec_msg, "\x92\x01\x04", BEE_EMISSING);
  REJECT(dec_msg, "\x94\x01\x01\x01\xa1m", BEE_EMISSING);
  REJECT(dec_msg, "\x94\x01\x06\x01\xa1k\x00", BEE_EMISSING);

  REJECT(dec_msg, "\x93\x01\x00\x01", BEE_EUNKNOWN);
  REJECT(dec_msg, "\x93\x01\x0c\x01", BEE_EUNKNOWN);
  REJECT(dec_msg, "\x93\x01\x13\x01", BEE_EUNKNOWN);
  REJECT(dec_msg, "\x93\x01\xff\x01", BEE_EUNKNOWN);
  REJECT(dec_msg, "\x93\x01\xcd\x01\x04\x01", BEE_EUNKNOWN);
  REJECT(dec_msg, "\x93\x01\xcf\xff\xff\xff\xff\xff\xff\xff\xff\x01",
         BEE_EUNKNOWN);
  for (int t = PROTO_T_HELLO; t <= PROTO_T_REVOCATION; t++) {
    uint8_t b[] = {0x95, 0x01, (uint8_t)t, 0x01, 0x02, 0x03};
    reject(dec_msg, b, sizeof b, BEE_EUNKNOWN);
  }

  REJECT(dec_msg, "\x93\x00\x04\x01", BEE_EVERSION);
  REJECT(dec_msg, "\x93\x02\x04\x01", BEE_EVERSION);
  REJECT(dec_msg, "\x93\xff\x04\x01", BEE_EVERSION);
  REJECT(dec_msg, "\x93\xcf\xff\xff\xff\xff\xff\xff\xff\xff\x04\x01",
         BEE_EVERSION);
  REJECT(dec_msg, "\x92\x02\x00", BEE_EVERSION); /* before the count */

  REJECT(dec_msg, "\x93\x01\x04\xff", BEE_ERANGE);     /* negative id */
  REJECT(dec_msg, "\x93\x01\x09\xd0\x80", BEE_ERANGE); /* negative nonce */
  REJECT(dec_msg, "\x95\x01\x07\x01\xd3\x80\0\0\0\0\0\0\0\xc4\x00",
         BEE_ERANGE); /* negative offset */
  REJECT(dec_msg, "\x94\x01\x08\x01\xcf\x80\0\0\0\0\0\0\0",
         BEE_ERANGE); /* code above INT64_MAX */
  REJECT(dec_msg, "\x95\x01\x01\x01\xa0\xc4\x00", BEE_ERANGE); /* no name */
  REJECT(dec_msg, "\x94\x01\x05\xa0\xc4\x00", BEE_ERANGE);
}

/* Fields over their limits, each by one byte. */
static void test_envelope_toobig(void) {
  uint8_t *b = calloc(1, PAYLOAD_MAX + 64);
  ASSERT(b);
  /* REQUEST with a 65-byte method. */
  size_t n = 0;
  memcpy(b, "\x95\x01\x01\x01\xd9", 5);
  b[5] = PROTO_METHOD_MAX + 1;
  n = 6 + PROTO_METHOD_MAX + 1;
  b[n++] = 0xc4;
  b[n++] = 0;
  reject(dec_msg, b, n, BEE_ETOOBIG);
  b[5] = PROTO_METHOD_MAX;
  ASSERT_RC(dec_msg(b, n - 1), BEE_ETYPE); /* the spare byte is no bin */

  /* CLOSE with 513 bytes of text. */
  memcpy(b, "\x94\x01\x0b\x00\xda", 5);
  b[5] = (PROTO_TEXT_MAX + 1) >> 8;
  b[6] = (PROTO_TEXT_MAX + 1) & 0xff;
  reject(dec_msg, b, 7 + PROTO_TEXT_MAX + 1, BEE_ETOOBIG);

  /* RESPONSE and STREAM_OPEN payloads one over, STREAM_CHUNK data one over. */
  memcpy(b, "\x94\x01\x02\x01\xc6", 5);
  proto__put_u32(b + 5, PAYLOAD_MAX + 1);
  reject(dec_msg, b, 9 + PAYLOAD_MAX + 1, BEE_ETOOBIG);
  proto__put_u32(b + 5, PAYLOAD_MAX);
  ASSERT_OK(dec_msg(b, 9 + PAYLOAD_MAX));
  memcpy(b, "\x96\x01\x06\x01\xa1k\x01\xc6", 8);
  proto__put_u32(b + 8, PAYLOAD_MAX + 1);
  reject(dec_msg, b, 12 + PAYLOAD_MAX + 1, BEE_ETOOBIG);
  memcpy(b, "\x95\x01\x07\x01\x00\xc6", 6);
  proto__put_u32(b + 6, PROTO_CHUNK_MAX + 1);
  reject(dec_msg, b, 10 + PROTO_CHUNK_MAX + 1, BEE_ETOOBIG);
  proto__put_u32(b + 6, PROTO_CHUNK_MAX);
  ASSERT_OK(dec_msg(b, 10 + PROTO_CHUNK_MAX));
  free(b);
}

/* Nesting is never walked: a deep value in a field is just the wrong type,
 * and the decoder's stack does not grow with it. */
static void test_envelope_nesting(void) {
  uint8_t b[4 + 100000];
  memcpy(b, "\x93\x01\x04", 3);
  memset(b + 3, 0x91, sizeof b - 3);
  b[sizeof b - 1] = 0x90;
  reject(dec_msg, b, sizeof b, BEE_ETYPE);
  reject(dec_msg, b + 3, sizeof b - 3, BEE_EMISSING);
  memset(b, 0x92, sizeof b);
  reject(dec_msg, b, sizeof b, BEE_ETYPE); /* version is an array */
}

/* ---- handshake ---------------------------------------------------------- */

static void fill(uint8_t *p, size_t n, uint8_t seed) {
  for (size_t i = 0; i < n; i++)
    p[i] = (uint8_t)(seed + i * 13);
}

static void hello_roundtrip(const proto_hello *m) {
  uint8_t buf[256];
  size_t len;
  ASSERT_OK(proto__hello_encode(m, buf, sizeof buf, &len));
  for (size_t c = 0; c < len; c++)
    ASSERT_RC(proto__hello_encode(m, buf, c, &(size_t){0}), BEE_ETOOBIG);
  proto_hello got;
  ASSERT_OK(proto__hello_decode(buf, len, &got));
  ASSERT(bytes_eq(got.swarm, m->swarm));
  ASSERT(got.swarm.p >= buf && got.swarm.p < buf + len);
  ASSERT_EQ(got.purpose, m->purpose);
  ASSERT_EQ(got.ciphers, m->ciphers);
  ASSERT_EQ(got.moderated, m->moderated);
  ASSERT_MEMEQ(got.eph_pk, m->eph_pk, 32);
  check_cuts(dec_hello, buf, len);
  ASSERT_RC(dec_msg(buf, len), BEE_EUNKNOWN);
  ASSERT_RC(dec_auth(buf, len), BEE_EUNKNOWN);
  n_roundtrips++;
}

/* HELLO written field by field, so each field can be made wrong. */
static size_t hello_raw(uint8_t *buf, size_t nswarm, uint64_t purpose,
                        uint64_t ciphers, size_t npk) {
  static const char swarm[PROTO_SWARM_MAX + 1] = "swarm";
  static const uint8_t pk[64];
  proto_wr w;
  proto__wr_init(&w, buf, 512);
  proto__wr_head(&w, PROTO_T_HELLO, 5);
  proto__wr_str(&w, swarm, nswarm);
  proto__wr_uint(&w, purpose);
  proto__wr_uint(&w, ciphers);
  proto__wr_bool(&w, true);
  proto__wr_bin(&w, pk, npk);
  ASSERT_OK(w.err);
  return w.len;
}

static void test_hello(void) {
  char swarm[PROTO_SWARM_MAX + 1];
  memset(swarm, 's', sizeof swarm);
  proto_hello m = {.swarm = bytes(swarm, 1),
                   .purpose = PROTO_PURPOSE_CONTROL,
                   .ciphers = PROTO_CIPHER_AES256GCM};
  fill(m.eph_pk, 32, 1);
  hello_roundtrip(&m);
  m.swarm.n = PROTO_SWARM_MAX;
  m.purpose = PROTO_PURPOSE_BULK;
  m.ciphers = PROTO_CIPHERS_ALL;
  m.moderated = true;
  hello_roundtrip(&m);
  m.ciphers = PROTO_CIPHER_XCHACHA20POLY1305;
  hello_roundtrip(&m);

  uint8_t buf[512];
  size_t len;
  m.swarm.n = PROTO_SWARM_MAX + 1;
  ASSERT_RC(proto__hello_encode(&m, buf, sizeof buf, &len), BEE_ETOOBIG);
  m.swarm.n = 0;
  ASSERT_RC(proto__hello_encode(&m, buf, sizeof buf, &len), BEE_ERANGE);
  m.swarm.n = 5;
  int bad_purpose[] = {0, 3, -1}, bad_ciphers[] = {0, 4, 7, -1};
  for (int i = 0; i < 3; i++) {
    proto_hello b = m;
    b.purpose = bad_purpose[i];
    ASSERT_RC(proto__hello_encode(&b, buf, sizeof buf, &len), BEE_ERANGE);
  }
  for (int i = 0; i < 4; i++) {
    proto_hello b = m;
    b.ciphers = bad_ciphers[i];
    ASSERT_RC(proto__hello_encode(&b, buf, sizeof buf, &len), BEE_ERANGE);
  }

  len = hello_raw(buf, 5, 1, 3, 32);
  ASSERT_OK(dec_hello(buf, len));
  reject(dec_hello, buf, hello_raw(buf, 0, 1, 3, 32), BEE_ERANGE);
  reject(dec_hello, buf, hello_raw(buf, PROTO_SWARM_MAX + 1, 1, 3, 32),
         BEE_ETOOBIG);
  reject(dec_hello, buf, hello_raw(buf, 5, 0, 3, 32), BEE_ERANGE);
  reject(dec_hello, buf, hello_raw(buf, 5, 3, 3, 32), BEE_ERANGE);
  reject(dec_hello, buf, hello_raw(buf, 5, UINT64_MAX, 3, 32), BEE_ERANGE);
  reject(dec_hello, buf, hello_raw(buf, 5, 1, 0, 32), BEE_ERANGE);
  reject(dec_hello, buf, hello_raw(buf, 5, 1, 4, 32), BEE_ERANGE);
  reject(dec_hello, buf, hello_raw(buf, 5, 1, 1ull << 33, 32), BEE_ERANGE);
  reject(dec_hello, buf, hello_raw(buf, 5, 1, 3, 31), BEE_ERANGE);
  reject(dec_hello, buf, hello_raw(buf, 5, 1, 3, 33), BEE_ERANGE);
  reject(dec_hello, buf, hello_raw(buf, 5, 1, 3, 0), BEE_ERANGE);

  REJECT(dec_hello, "\x97\x01\x14\xa1s\x01\x03\x01\xc4\x00", BEE_ETYPE);
  REJECT(dec_hello, "\x97\x01\x14\xc4\x01s\x01\x03\xc3\xc4\x00", BEE_ETYPE);
  REJECT(dec_hello, "\x97\x01\x14\xa1s\xff\x03\xc3\xc4\x00", BEE_ERANGE);
  REJECT(dec_hello, "\x96\x01\x14\xa1s\x01\x03\xc3", BEE_EMISSING);
  REJECT(dec_hello, "\x98\x01\x14\xa1s\x01\x03\xc3\xc0\xc0", BEE_ETYPE);
  REJECT(dec_hello, "\x97\x01\x15\xa1s\x01\x03\xc3\xc4\x00", BEE_EUNKNOWN);
  REJECT(dec_hello, "\x97\x02\x14\xa1s\x01\x03\xc3\xc4\x00", BEE_EVERSION);
  REJECT(dec_hello, "\x97\x01\x14\xa1s\x01\x03\xc3\xc1", BEE_EMALFORMED);
}

static void auth_roundtrip(const proto_auth_msg *m) {
  uint8_t buf[2048];
  size_t len;
  ASSERT_OK(proto__auth_encode(m, buf, sizeof buf, &len));
  ASSERT_RC(proto__auth_encode(m, buf, len - 1, &len), BEE_ETOOBIG);
  ASSERT_OK(proto__auth_encode(m, buf, sizeof buf, &len));
  proto_auth_msg got;
  ASSERT_OK(proto__auth_decode(buf, len, &got));
  ASSERT_EQ(got.has_eph, m->has_eph);
  ASSERT_EQ(got.cipher, m->cipher);
  if (m->has_eph)
    ASSERT_MEMEQ(got.eph_pk, m->eph_pk, 32);
  else
    ASSERT_MEMEQ(got.eph_pk, (uint8_t[32]){0}, 32);
  ASSERT(bytes_eq(got.sealed, m->sealed));
  check_cuts(dec_auth, buf, len);
  ASSERT_RC(dec_hello(buf, len), BEE_EUNKNOWN);
  ASSERT_RC(dec_msg(buf, len), BEE_EUNKNOWN);
  n_roundtrips++;
}

/* AUTH written field by field; npk < 0 writes nil for the key. */
static size_t auth_raw(uint8_t *buf, uint64_t cipher, int npk, size_t nsealed) {
  static const uint8_t bytes0[AUTH_SEALED_MAX + 1];
  proto_wr w;
  proto__wr_init(&w, buf, 2048);
  proto__wr_head(&w, PROTO_T_AUTH, 3);
  proto__wr_uint(&w, cipher);
  if (npk < 0)
    proto__wr_nil(&w);
  else
    proto__wr_bin(&w, bytes0, (size_t)npk);
  proto__wr_bin(&w, bytes0, nsealed);
  ASSERT_OK(w.err);
  return w.len;
}

static void test_auth(void) {
  uint8_t sealed[AUTH_SEALED_MAX + 1];
  fill(sealed, sizeof sealed, 9);
  proto_auth_msg m = {.cipher = PROTO_CIPHER_AES256GCM,
                      .has_eph = true,
                      .sealed = bytes(sealed, 100)};
  fill(m.eph_pk, 32, 3);
  auth_roundtrip(&m);
  m.cipher = PROTO_CIPHER_XCHACHA20POLY1305;
  m.sealed.n = AUTH_SEALED_MAX;
  auth_roundtrip(&m);
  proto_auth_msg init = {.sealed = bytes(NULL, 0)};
  auth_roundtrip(&init);
  init.sealed = bytes(sealed, 1);
  auth_roundtrip(&init);

  uint8_t buf[2048];
  size_t len;
  m.sealed.n = AUTH_SEALED_MAX + 1;
  ASSERT_RC(proto__auth_encode(&m, buf, sizeof buf, &len), BEE_ETOOBIG);
  m.sealed.n = 10;
  int bad[] = {0, 3, -1};
  for (int i = 0; i < 3; i++) {
    m.cipher = bad[i];
    ASSERT_RC(proto__auth_encode(&m, buf, sizeof buf, &len), BEE_ERANGE);
  }
  init.cipher = PROTO_CIPHER_AES256GCM;
  ASSERT_RC(proto__auth_encode(&init, buf, sizeof buf, &len), BEE_ERANGE);

  ASSERT_OK(dec_auth(buf, auth_raw(buf, 2, 32, 10)));
  ASSERT_OK(dec_auth(buf, auth_raw(buf, 0, -1, 10)));
  reject(dec_auth, buf, auth_raw(buf, 1, -1, 10), BEE_ERANGE);
  reject(dec_auth, buf, auth_raw(buf, 0, 32, 10), BEE_ERANGE);
  reject(dec_auth, buf, auth_raw(buf, 3, 32, 10), BEE_ERANGE);
  reject(dec_auth, buf, auth_raw(buf, UINT64_MAX, 32, 10), BEE_ERANGE);
  reject(dec_auth, buf, auth_raw(buf, 1, 31, 10), BEE_ERANGE);
  reject(dec_auth, buf, auth_raw(buf, 1, 33, 10), BEE_ERANGE);
  reject(dec_auth, buf, auth_raw(buf, 1, 32, AUTH_SEALED_MAX + 1), BEE_ETOOBIG);
  REJECT(dec_auth, "\x95\x01\x15\xff\xc0\xc4\x00", BEE_ERANGE);
  REJECT(dec_auth, "\x95\x01\x15\x00\xc0\xa0", BEE_ETYPE);
  REJECT(dec_auth, "\x95\x01\x15\x00\xa0\xc4\x00", BEE_ETYPE);
  REJECT(dec_auth, "\x95\x01\x15\xc0\xc0\xc4\x00", BEE_ETYPE);
  REJECT(dec_auth, "\x94\x01\x15\x00\xc0", BEE_EMISSING);
  REJECT(dec_auth, "\x96\x01\x15\x00\xc0\xc4\x00\x00", BEE_ETYPE);
  REJECT(dec_auth, "\x95\x01\x14\x00\xc0\xc4\x00", BEE_EUNKNOWN);
}

static void inner_roundtrip(const proto_auth_inner *m) {
  uint8_t buf[1024];
  size_t len;
  ASSERT_OK(proto__auth_inner_encode(m, buf, sizeof buf, &len));
  ASSERT_RC(proto__auth_inner_encode(m, buf, len - 1, &(size_t){0}),
            BEE_ETOOBIG);
  proto_auth_inner got;
  ASSERT_OK(proto__auth_inner_decode(buf, len, &got));
  ASSERT_MEMEQ(got.id_pk, m->id_pk, 32);
  ASSERT_MEMEQ(got.sig, m->sig, 64);
  ASSERT(bytes_eq(got.token, m->token));
  check_cuts(dec_inner, buf, len);
  n_roundtrips++;
}

/* The inner AUTH written field by field; ntoken < 0 writes nil. */
static size_t inner_raw(uint8_t *buf, size_t npk, int ntoken, size_t nsig) {
  static const uint8_t bytes0[PROTO_TOKEN_MAX + 1];
  proto_wr w;
  proto__wr_init(&w, buf, 2048);
  proto__wr_head(&w, PROTO_T_AUTH, 3);
  proto__wr_bin(&w, bytes0, npk);
  if (ntoken < 0)
    proto__wr_nil(&w);
  else
    proto__wr_bin(&w, bytes0, (size_t)ntoken);
  proto__wr_bin(&w, bytes0, nsig);
  ASSERT_OK(w.err);
  return w.len;
}

static void test_auth_inner(void) {
  uint8_t token[PROTO_TOKEN_MAX + 1];
  fill(token, sizeof token, 5);
  proto_auth_inner m = {.token = bytes(NULL, 0)};
  fill(m.id_pk, 32, 7);
  fill(m.sig, 64, 11);
  inner_roundtrip(&m);
  m.token = bytes(token, 1);
  inner_roundtrip(&m);
  m.token.n = PROTO_TOKEN_MAX;
  inner_roundtrip(&m);

  uint8_t buf[2048];
  size_t len;
  m.token.n = PROTO_TOKEN_MAX + 1;
  ASSERT_RC(proto__auth_inner_encode(&m, buf, sizeof buf, &len), BEE_ETOOBIG);

  ASSERT_OK(dec_inner(buf, inner_raw(buf, 32, -1, 64)));
  ASSERT_OK(dec_inner(buf, inner_raw(buf, 32, 3, 64)));
  reject(dec_inner, buf, inner_raw(buf, 32, 0, 64), BEE_ERANGE);
  reject(dec_inner, buf, inner_raw(buf, 31, -1, 64), BEE_ERANGE);
  reject(dec_inner, buf, inner_raw(buf, 33, -1, 64), BEE_ERANGE);
  reject(dec_inner, buf, inner_raw(buf, 32, -1, 63), BEE_ERANGE);
  reject(dec_inner, buf, inner_raw(buf, 32, -1, 65), BEE_ERANGE);
  reject(dec_inner, buf, inner_raw(buf, 32, PROTO_TOKEN_MAX + 1, 64),
         BEE_ETOOBIG);
  REJECT(dec_inner, "\x95\x01\x15\xc0\xc0\xc0", BEE_ETYPE);
  REJECT(dec_inner, "\x94\x01\x15\xc0\xc0", BEE_EMISSING);
}

static void result_roundtrip(int64_t code, const char *text) {
  uint8_t buf[1024];
  size_t len;
  ASSERT_OK(proto__result_encode(code, text, buf, sizeof buf, &len));
  ASSERT_RC(proto__result_encode(code, text, buf, len - 1, &(size_t){0}),
            BEE_ETOOBIG);
  int64_t got;
  proto_bytes t;
  ASSERT_OK(proto__result_decode(buf, len, &got, &t));
  ASSERT_EQ(got, code);
  size_t n = text ? strlen(text) : 0;
  ASSERT_EQ(t.n, n);
  if (n)
    ASSERT_MEMEQ(t.p, text, n);
  check_cuts(dec_result, buf, len);
  ASSERT_RC(dec_msg(buf, len), BEE_EUNKNOWN);
  n_roundtrips++;
}

static void test_result(void) {
  char text[PROTO_TEXT_MAX + 2];
  memset(text, 't', sizeof text);
  text[PROTO_TEXT_MAX] = 0;
  result_roundtrip(0, "");
  result_roundtrip(0, NULL);
  result_roundtrip(BEE_ETOKEN_EXPIRED, "token expired");
  result_roundtrip(INT64_MIN, text);
  result_roundtrip(INT64_MAX, "x");
  text[PROTO_TEXT_MAX] = 't';
  text[PROTO_TEXT_MAX + 1] = 0;
  uint8_t buf[1024];
  size_t len;
  ASSERT_RC(proto__result_encode(0, text, buf, sizeof buf, &len), BEE_ETOOBIG);

  REJECT(dec_result, "\x94\x01\x16\x00\xc4\x00", BEE_ETYPE);
  REJECT(dec_result, "\x94\x01\x16\xa0\xa0", BEE_ETYPE);
  REJECT(dec_result, "\x93\x01\x16\x00", BEE_EMISSING);
  REJECT(dec_result, "\x94\x01\x14\x00\xa0", BEE_EUNKNOWN);
  REJECT(dec_result, "\x94\x01\x16\xcf\xff\xff\xff\xff\xff\xff\xff\xff\xa0",
         BEE_ERANGE);
  memcpy(buf, "\x94\x01\x16\x00\xda", 5);
  buf[5] = (PROTO_TEXT_MAX + 1) >> 8;
  buf[6] = (PROTO_TEXT_MAX + 1) & 0xff;
  memset(buf + 7, 'x', PROTO_TEXT_MAX + 1);
  reject(dec_result, buf, 7 + PROTO_TEXT_MAX + 1, BEE_ETOOBIG);
}

int main(void) {
  test_envelope_roundtrip();
  test_chunk_header();
  test_msg_head();
  test_envelope_encode_errors();
  test_envelope_malformed();
  test_envelope_toobig();
  test_envelope_nesting();
  test_hello();
  test_auth();
  test_auth_inner();
  test_result();
  printf("test-proto-codec: ok (%zu round trips, %zu bad inputs refused)\n",
         n_roundtrips, n_rejected);
  return 0;
}
