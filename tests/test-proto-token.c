/* test-proto-token.c: access tokens and revocation lists.
 *
 * Encodings are built here by hand with a tiny msgpack writer, so the wire
 * format is pinned byte for byte independently of proto's own writer, and
 * so malformed, non-canonical and re-signed variants can be made.
 */
#include "proto.h"
#include "test.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>

#define NOW 1700000000u

static char dir[] = "/tmp/beed-test-token-XXXXXX";

static const char *path(const char *name) {
  static char buf[512];
  int n = snprintf(buf, sizeof buf, "%s/%s", dir, name);
  ASSERT(n > 0 && (size_t)n < sizeof buf);
  return buf;
}

static void cleanup(void) {
  DIR *d = opendir(dir);
  if (!d)
    return;
  for (struct dirent *e; (e = readdir(d));)
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
      unlink(path(e->d_name));
  closedir(d);
  rmdir(dir);
}

static void write_bytes(const char *p, const void *data, size_t n) {
  int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT(fd >= 0);
  ASSERT_EQ(write(fd, data, n), (ssize_t)n);
  close(fd);
}

static size_t read_bytes(const char *p, char *out, size_t cap) {
  int fd = open(p, O_RDONLY);
  ASSERT(fd >= 0);
  ssize_t n = read(fd, out, cap - 1);
  close(fd);
  ASSERT(n >= 0);
  out[n] = 0;
  return (size_t)n;
}

/* ---- a tiny msgpack writer --------------------------------------------- */

typedef struct buf {
  uint8_t b[8192];
  size_t n;
} buf;

static void put(buf *b, const void *p, size_t n) {
  ASSERT(b->n + n <= sizeof b->b);
  memcpy(b->b + b->n, p, n);
  b->n += n;
}

static void put1(buf *b, unsigned v) {
  uint8_t c = (uint8_t)v;
  put(b, &c, 1);
}

static void put_be(buf *b, uint64_t v, int bytes) {
  for (int i = bytes - 1; i >= 0; i--)
    put1(b, (unsigned)(v >> (8 * i)) & 0xff);
}

static void mp_array(buf *b, uint32_t n) {
  if (n < 16) {
    put1(b, 0x90 | n);
  } else if (n <= 0xffff) {
    put1(b, 0xdc);
    put_be(b, n, 2);
  } else {
    put1(b, 0xdd);
    put_be(b, n, 4);
  }
}

/* Canonical (shortest) unsigned integer, or always 0xcf when wide. */
static void mp_uint(buf *b, uint64_t v, bool wide) {
  if (wide) {
    put1(b, 0xcf);
    put_be(b, v, 8);
  } else if (v < 128) {
    put1(b, (unsigned)v);
  } else if (v <= 0xff) {
    put1(b, 0xcc);
    put_be(b, v, 1);
  } else if (v <= 0xffff) {
    put1(b, 0xcd);
    put_be(b, v, 2);
  } else if (v <= 0xffffffff) {
    put1(b, 0xce);
    put_be(b, v, 4);
  } else {
    put1(b, 0xcf);
    put_be(b, v, 8);
  }
}

static void mp_str(buf *b, const void *p, size_t n, bool wide) {
  if (n < 32 && !wide) {
    put1(b, 0xa0 | (unsigned)n);
  } else {
    put1(b, 0xd9);
    put_be(b, n, 1);
  }
  put(b, p, n);
}

static void mp_bin(buf *b, const void *p, size_t n, bool wide) {
  if (wide) {
    put1(b, 0xc5);
    put_be(b, n, 2);
  } else {
    put1(b, 0xc4);
    put_be(b, n, 1);
  }
  put(b, p, n);
}

/* ---- hand-built tokens ------------------------------------------------- */

/* The fields of a token as they go on the wire.  alt_at (1-based element
 * index, 0: none) replaces that element with the raw bytes alt; count
 * overrides the array length; extra appends one more element. */
typedef struct tokf {
  const char *swarm;
  const uint8_t *peer;
  size_t peer_len;
  uint64_t role, issued, expires;
  const uint8_t *mod;
  const uint8_t *sig; /* NULL: the unsigned form */
  size_t sig_len;
  bool wide;
  int alt_at;
  const void *alt;
  size_t alt_len;
  int count;
  bool extra;
} tokf;

static void enc_token(buf *b, const tokf *f) {
  int n = f->count ? f->count : f->sig ? 9 : 8;
  b->n = 0;
  mp_array(b, (uint32_t)n);
  for (int i = 1; i <= 9; i++) {
    if (i == 9 && !f->sig)
      break;
    if (i == f->alt_at) {
      put(b, f->alt, f->alt_len);
      continue;
    }
    switch (i) {
    case 1: mp_uint(b, 1, f->wide); break;
    case 2: mp_uint(b, 30, f->wide); break;
    case 3: mp_str(b, f->swarm, strlen(f->swarm), f->wide); break;
    case 4: mp_bin(b, f->peer, f->peer_len ? f->peer_len : 32, f->wide); break;
    case 5: mp_uint(b, f->role, f->wide); break;
    case 6: mp_uint(b, f->issued, f->wide); break;
    case 7: mp_uint(b, f->expires, f->wide); break;
    case 8: mp_bin(b, f->mod, 32, f->wide); break;
    case 9: mp_bin(b, f->sig, f->sig_len ? f->sig_len : 64, f->wide); break;
    }
  }
  if (f->extra)
    put1(b, 0xc0);
}

static tokf fields_of(const proto_token *t) {
  tokf f = {0};
  f.swarm = t->swarm;
  f.peer = t->peer_pk;
  f.role = (uint64_t)t->role;
  f.issued = t->issued;
  f.expires = t->expires;
  f.mod = t->moderator_pk;
  f.sig = t->sig;
  return f;
}

static proto_identity mod, mod2, peer, peer2;

static void issue(proto_token *t, const char *swarm, int role, uint64_t issued,
                  uint64_t expires) {
  ASSERT_OK(proto_token_issue(t, &mod, swarm, peer.pk, role, issued, expires));
}

static int verify(const proto_token *t, const proto_revocation *rl) {
  return proto_token_verify(t, mod.pk, "swarm-a", peer.pk, PROTO_ROLES_ALL, NOW,
                            rl);
}

static void test_roles(void) {
  int r = 0;
  ASSERT_STREQ(proto_role_name(PROTO_ROLE_BEE), "bee");
  ASSERT_STREQ(proto_role_name(PROTO_ROLE_MONITOR), "monitor");
  ASSERT_STREQ(proto_role_name(PROTO_ROLE_AUX), "aux");
  ASSERT_STREQ(proto_role_name(3), "?");
  ASSERT_OK(proto_role_parse("bee", &r));
  ASSERT_EQ(r, PROTO_ROLE_BEE);
  ASSERT_OK(proto_role_parse("monitor", &r));
  ASSERT_EQ(r, PROTO_ROLE_MONITOR);
  ASSERT_OK(proto_role_parse("aux", &r));
  ASSERT_EQ(r, PROTO_ROLE_AUX);
  ASSERT_RC(proto_role_parse("Bee", &r), BEE_ECONFIG);
  ASSERT_RC(proto_role_parse("", &r), BEE_ECONFIG);
  ASSERT_RC(proto_role_parse("?", &r), BEE_ECONFIG);
}

static void test_issue_format(void) {
  proto_token t, d;
  buf b, m;
  issue(&t, "swarm-a", PROTO_ROLE_BEE, NOW - 10, NOW + 3600);
  ASSERT_STREQ(t.swarm, "swarm-a");
  ASSERT_MEMEQ(t.peer_pk, peer.pk, 32);
  ASSERT_MEMEQ(t.moderator_pk, mod.pk, 32);
  ASSERT_EQ(t.role, PROTO_ROLE_BEE);
  ASSERT_UEQ(t.issued, NOW - 10);
  ASSERT_UEQ(t.expires, NOW + 3600);

  /* raw is exactly the canonical array of nine. */
  tokf f = fields_of(&t);
  enc_token(&b, &f);
  ASSERT_EQ(t.raw_len, b.n);
  ASSERT_MEMEQ(t.raw, b.b, b.n);

  /* The signature covers "beed token v1" + the array of eight. */
  f.sig = NULL;
  enc_token(&b, &f);
  m.n = 0;
  put(&m, "beed token v1", 13);
  put(&m, b.b, b.n);
  ASSERT_EQ(crypto_sign_verify_detached(t.sig, m.b, m.n, mod.pk), 0);

  ASSERT_OK(proto_token_decode(t.raw, t.raw_len, &d));
  ASSERT_MEMEQ(&d, &t, sizeof d);
  ASSERT_OK(verify(&t, NULL));
  ASSERT_OK(verify(&d, NULL));

  /* Each role, and a name of exactly PROTO_SWARM_MAX bytes. */
  char longest[PROTO_SWARM_MAX + 2];
  memset(longest, 'x', PROTO_SWARM_MAX);
  longest[PROTO_SWARM_MAX] = 0;
  static const int roles[] = {PROTO_ROLE_BEE, PROTO_ROLE_MONITOR,
                              PROTO_ROLE_AUX};
  for (int i = 0; i < 3; i++) {
    issue(&t, longest, roles[i], NOW, NOW + 1);
    ASSERT_OK(proto_token_decode(t.raw, t.raw_len, &d));
    ASSERT_EQ(d.role, roles[i]);
    ASSERT_OK(
        proto_token_verify(&d, mod.pk, longest, peer.pk, roles[i], NOW, NULL));
  }
  /* Large times take the wide integer forms. */
  issue(&t, "swarm-a", PROTO_ROLE_BEE, 0, UINT64_MAX);
  ASSERT_OK(proto_token_decode(t.raw, t.raw_len, &d));
  ASSERT_UEQ(d.expires, UINT64_MAX);
  ASSERT_OK(verify(&d, NULL));

  /* Refused arguments. */
  ASSERT_RC(proto_token_issue(&t, &mod, "", peer.pk, 1, NOW, NOW), BEE_ERANGE);
  longest[PROTO_SWARM_MAX] = 'x';
  longest[PROTO_SWARM_MAX + 1] = 0;
  ASSERT_RC(proto_token_issue(&t, &mod, longest, peer.pk, 1, NOW, NOW),
            BEE_ETOOBIG);
  ASSERT_RC(proto_token_issue(&t, &mod, "s", peer.pk, 0, NOW, NOW), BEE_ERANGE);
  ASSERT_RC(proto_token_issue(&t, &mod, "s", peer.pk, 3, NOW, NOW), BEE_ERANGE);
  ASSERT_RC(proto_token_issue(&t, &mod, "s", peer.pk, 8, NOW, NOW), BEE_ERANGE);
  ASSERT_RC(proto_token_issue(&t, &mod, "s", peer.pk, -1, NOW, NOW),
            BEE_ERANGE);
  ASSERT_RC(proto_token_issue(&t, &mod, "s", peer.pk, 1, NOW, NOW - 1),
            BEE_ERANGE);
}

static void test_verify_refusals(void) {
  proto_token t, x;
  issue(&t, "swarm-a", PROTO_ROLE_BEE, NOW - 10, NOW + 3600);

  x = t;
  x.sig[5] ^= 1;
  ASSERT_RC(verify(&x, NULL), BEE_ETOKEN_FORGED);
  uint8_t raw[PROTO_TOKEN_MAX];
  memcpy(raw, t.raw, t.raw_len);
  raw[t.raw_len - 1] ^= 0x80; /* last sig byte, through the decoder */
  ASSERT_OK(proto_token_decode(raw, t.raw_len, &x));
  ASSERT_RC(verify(&x, NULL), BEE_ETOKEN_FORGED);

  ASSERT_RC(proto_token_verify(&t, mod2.pk, "swarm-a", peer.pk, PROTO_ROLES_ALL,
                               NOW, NULL),
            BEE_ETOKEN_MODERATOR);
  /* Signed by mod2 but claiming to be from mod. */
  ASSERT_OK(proto_token_issue(&x, &mod2, "swarm-a", peer.pk, 1, NOW - 10,
                              NOW + 3600));
  memcpy(x.moderator_pk, mod.pk, 32);
  ASSERT_RC(verify(&x, NULL), BEE_ETOKEN_FORGED);

  ASSERT_RC(proto_token_verify(&t, mod.pk, "swarm-b", peer.pk, PROTO_ROLES_ALL,
                               NOW, NULL),
            BEE_ETOKEN_SWARM);
  ASSERT_RC(proto_token_verify(&t, mod.pk, "swarm-", peer.pk, PROTO_ROLES_ALL,
                               NOW, NULL),
            BEE_ETOKEN_SWARM);
  ASSERT_RC(proto_token_verify(&t, mod.pk, "swarm-a", peer2.pk, PROTO_ROLES_ALL,
                               NOW, NULL),
            BEE_ETOKEN_PEER);
  ASSERT_RC(proto_token_verify(&t, mod.pk, "swarm-a", peer.pk,
                               PROTO_ROLE_MONITOR | PROTO_ROLE_AUX, NOW, NULL),
            BEE_ETOKEN_ROLE);
  ASSERT_RC(proto_token_verify(&t, mod.pk, "swarm-a", peer.pk, 0, NOW, NULL),
            BEE_ETOKEN_ROLE);

  /* Expiry: valid up to expires - 1. */
  ASSERT_OK(
      proto_token_verify(&t, mod.pk, "swarm-a", peer.pk, 1, NOW + 3599, NULL));
  ASSERT_RC(
      proto_token_verify(&t, mod.pk, "swarm-a", peer.pk, 1, NOW + 3600, NULL),
      BEE_ETOKEN_EXPIRED);
  ASSERT_RC(
      proto_token_verify(&t, mod.pk, "swarm-a", peer.pk, 1, UINT64_MAX, NULL),
      BEE_ETOKEN_EXPIRED);

  /* Issued in the future: PROTO_CLOCK_SKEW_S of slack. */
  issue(&x, "swarm-a", PROTO_ROLE_BEE, NOW + PROTO_CLOCK_SKEW_S, NOW + 7200);
  ASSERT_OK(verify(&x, NULL));
  issue(&x, "swarm-a", PROTO_ROLE_BEE, NOW + PROTO_CLOCK_SKEW_S + 1,
        NOW + 7200);
  ASSERT_RC(verify(&x, NULL), BEE_ETOKEN_EARLY);
  issue(&x, "swarm-a", PROTO_ROLE_BEE, UINT64_MAX, UINT64_MAX);
  ASSERT_RC(verify(&x, NULL), BEE_ETOKEN_EARLY);
  ASSERT_RC(
      proto_token_verify(&x, mod.pk, "swarm-a", peer.pk, 1, UINT64_MAX, NULL),
      BEE_ETOKEN_EXPIRED);

  /* Revoked. */
  proto_revocation rl;
  proto_revocation_init(&rl);
  ASSERT_OK(verify(&t, &rl));
  ASSERT_OK(proto_revocation_add(&rl, peer2.pk));
  ASSERT_OK(verify(&t, &rl));
  ASSERT_OK(proto_revocation_add(&rl, peer.pk));
  ASSERT_RC(verify(&t, &rl), BEE_EREVOKED);

  /* The order of the checks. */
  issue(&x, "swarm-a", PROTO_ROLE_BEE, NOW - 10, NOW - 5); /* expired */
  ASSERT_RC(proto_token_verify(&x, mod2.pk, "no", peer2.pk, 0, NOW, &rl),
            BEE_ETOKEN_MODERATOR);
  x.sig[0] ^= 1;
  ASSERT_RC(proto_token_verify(&x, mod.pk, "no", peer2.pk, 0, NOW, &rl),
            BEE_ETOKEN_FORGED);
  x.sig[0] ^= 1;
  ASSERT_RC(proto_token_verify(&x, mod.pk, "no", peer2.pk, 0, NOW, &rl),
            BEE_ETOKEN_SWARM);
  ASSERT_RC(proto_token_verify(&x, mod.pk, "swarm-a", peer2.pk, 0, NOW, &rl),
            BEE_ETOKEN_PEER);
  ASSERT_RC(proto_token_verify(&x, mod.pk, "swarm-a", peer.pk, 0, NOW, &rl),
            BEE_ETOKEN_ROLE);
  ASSERT_RC(proto_token_verify(&x, mod.pk, "swarm-a", peer.pk, 1, NOW, &rl),
            BEE_ETOKEN_EXPIRED);
  issue(&x, "swarm-a", PROTO_ROLE_BEE, NOW + 1000, NOW + 2000);
  ASSERT_RC(proto_token_verify(&x, mod.pk, "swarm-a", peer.pk, 1, NOW, &rl),
            BEE_ETOKEN_EARLY);
  proto_revocation_close(&rl);
  ASSERT_EQ(rl.n, 0);
}

/* A token re-encoded with one field changed keeps the old signature: the
 * decoder takes it, verification does not. */
static void test_resigned(void) {
  proto_token t, d;
  buf b;
  issue(&t, "swarm-a", PROTO_ROLE_BEE, NOW - 10, NOW + 3600);
  for (int field = 0; field < 6; field++) {
    tokf f = fields_of(&t);
    const char *swarm = "swarm-a";
    switch (field) {
    case 0:
      f.swarm = "swarm-b";
      swarm = "swarm-b";
      break;
    case 1: f.peer = peer2.pk; break;
    case 2: f.role = PROTO_ROLE_AUX; break;
    case 3: f.issued = NOW - 11; break;
    case 4: f.expires = NOW + 360000; break;
    case 5: f.mod = mod2.pk; break;
    }
    enc_token(&b, &f);
    ASSERT_OK(proto_token_decode(b.b, b.n, &d));
    int rc = proto_token_verify(&d, field == 5 ? mod2.pk : mod.pk, swarm,
                                field == 1 ? peer2.pk : peer.pk,
                                PROTO_ROLES_ALL, NOW, NULL);
    if (rc != BEE_ETOKEN_FORGED)
      FAIL("field %d: got %s", field, bee_errname(rc));
    /* and with the claimed moderator, a changed key is simply not ours */
    if (field == 5)
      ASSERT_RC(verify(&d, NULL), BEE_ETOKEN_MODERATOR);
  }

  /* The same values in a non-canonical encoding are refused: a token's
   * bytes are exactly the moderator's, never reshaped on the way. */
  tokf f = fields_of(&t);
  f.wide = true;
  enc_token(&b, &f);
  ASSERT(b.n != t.raw_len);
  ASSERT_RC(proto_token_decode(b.b, b.n, &d), BEE_ERANGE);
}

static void expect_decode(const tokf *f, int want, const char *what) {
  buf b;
  proto_token d;
  enc_token(&b, f);
  int rc = proto_token_decode(b.b, b.n, &d);
  if (rc != want)
    FAIL("%s: got %s, want %s", what, bee_errname(rc), bee_errname(want));
  if (rc) {
    static const proto_token zero;
    ASSERT_MEMEQ(&d, &zero, sizeof d); /* nothing half-decoded */
  }
}

static void test_decode_strict(void) {
  proto_token t, d;
  issue(&t, "swarm-a", PROTO_ROLE_MONITOR, NOW - 10, NOW + 3600);

  for (size_t n = 0; n < t.raw_len; n++) {
    int rc = proto_token_decode(t.raw, n, &d);
    if (rc != BEE_ETRUNCATED)
      FAIL("prefix of %zu bytes: got %s", n, bee_errname(rc));
  }
  uint8_t big[PROTO_TOKEN_MAX + 1];
  memcpy(big, t.raw, t.raw_len);
  big[t.raw_len] = 0xc0;
  ASSERT_RC(proto_token_decode(big, t.raw_len + 1, &d), BEE_ETRAILING);
  memset(big + t.raw_len, 0xc0, sizeof big - t.raw_len);
  ASSERT_RC(proto_token_decode(big, sizeof big, &d), BEE_ETOOBIG);
  ASSERT_RC(proto_token_decode(big, PROTO_TOKEN_MAX, &d), BEE_ETRAILING);

  static const uint8_t u8_1[] = {0xcc, 0x01}, neg[] = {0xff},
                       str1[] = {0xa1, 'x'}, bin1[] = {0xc4, 0x01, 'x'},
                       nil[] = {0xc0}, two[] = {0x02}, t31[] = {0x1f},
                       c1[] = {0xc1}, map[] = {0x80},
                       f64[] = {0xcb, 0, 0, 0, 0, 0, 0, 0, 0};
  tokf base = fields_of(&t);
  struct {
    int at;
    const uint8_t *alt;
    size_t len;
    int want;
    const char *what;
  } cases[] = {
      {1, two, 1, BEE_EVERSION, "version 2"},
      {1, neg, 1, BEE_EVERSION, "version -1"},
      {1, str1, 2, BEE_ETYPE, "version as str"},
      {2, t31, 1, BEE_EUNKNOWN, "type 31"},
      {2, str1, 2, BEE_ETYPE, "type as str"},
      {3, bin1, 3, BEE_ETYPE, "swarm as bin"},
      {3, u8_1, 2, BEE_ETYPE, "swarm as int"},
      {3, nil, 1, BEE_ETYPE, "swarm nil"},
      {4, str1, 2, BEE_ETYPE, "peer as str"},
      {4, bin1, 3, BEE_ERANGE, "peer of 1 byte"},
      {5, str1, 2, BEE_ETYPE, "role as str"},
      {5, neg, 1, BEE_ERANGE, "role -1"},
      {5, f64, 9, BEE_ETYPE, "role as float"},
      {6, nil, 1, BEE_ETYPE, "issued nil"},
      {6, neg, 1, BEE_ERANGE, "issued -1"},
      {7, str1, 2, BEE_ETYPE, "expires as str"},
      {8, bin1, 3, BEE_ERANGE, "moderator of 1 byte"},
      {8, map, 1, BEE_ETYPE, "moderator as map"},
      {9, bin1, 3, BEE_ERANGE, "sig of 1 byte"},
      {9, str1, 2, BEE_ETYPE, "sig as str"},
      {9, c1, 1, BEE_EMALFORMED, "sig 0xc1"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    tokf f = base;
    f.alt_at = cases[i].at;
    f.alt = cases[i].alt;
    f.alt_len = cases[i].len;
    expect_decode(&f, cases[i].want, cases[i].what);
  }

  tokf f = base;
  expect_decode(&f, 0, "as issued");
  f.wide = true;
  expect_decode(&f, BEE_ERANGE, "wide (not canonical)");
  f = base;
  f.role = 3;
  expect_decode(&f, BEE_ERANGE, "role 3");
  f.role = 0;
  expect_decode(&f, BEE_ERANGE, "role 0");
  f.role = 8;
  expect_decode(&f, BEE_ERANGE, "role 8");
  f.role = 0x100000001;
  expect_decode(&f, BEE_ERANGE, "role 2^32 + 1");
  f = base;
  f.expires = f.issued - 1;
  expect_decode(&f, BEE_ERANGE, "expires < issued");
  f.expires = f.issued;
  expect_decode(&f, 0, "expires == issued");
  f = base;
  f.peer_len = 31;
  expect_decode(&f, BEE_ERANGE, "peer of 31 bytes");
  f.peer_len = 33;
  expect_decode(&f, BEE_ERANGE, "peer of 33 bytes");
  f = base;
  f.sig_len = 63;
  expect_decode(&f, BEE_ERANGE, "sig of 63 bytes");
  f.sig_len = 65;
  expect_decode(&f, BEE_ERANGE, "sig of 65 bytes");
  f = base;
  f.swarm = "";
  expect_decode(&f, BEE_ERANGE, "empty swarm");
  char longest[PROTO_SWARM_MAX + 2];
  memset(longest, 'y', sizeof longest - 1);
  longest[PROTO_SWARM_MAX + 1] = 0;
  f.swarm = longest;
  expect_decode(&f, BEE_ETOOBIG, "swarm too long");
  longest[PROTO_SWARM_MAX] = 0;
  expect_decode(&f, 0, "longest swarm");
  static const uint8_t nul_swarm[] = {0xa3, 'a', 0, 'b'};
  f = base;
  f.alt_at = 3;
  f.alt = nul_swarm;
  f.alt_len = sizeof nul_swarm;
  expect_decode(&f, BEE_ERANGE, "swarm with NUL");
  f = base;
  f.count = 8;
  f.sig = NULL;
  expect_decode(&f, BEE_EMISSING, "no sig");
  f = base;
  f.count = 10;
  f.extra = true;
  expect_decode(&f, BEE_ETYPE, "ten elements");
  f = base;
  f.count = 9;
  f.extra = true;
  expect_decode(&f, BEE_ETRAILING, "a value after the array");

  static const uint8_t not_array[] = {0x81, 0x01, 0x1e};
  ASSERT_RC(proto_token_decode(not_array, sizeof not_array, &d), BEE_ETYPE);
  ASSERT_RC(proto_token_decode(not_array, 0, &d), BEE_ETRUNCATED);
}

static void test_token_file(void) {
  proto_token t, d;
  char text[2048], b64[1024];
  issue(&t, "swarm-a", PROTO_ROLE_AUX, NOW - 10, NOW + 3600);
  ASSERT_OK(proto_token_save(&t, path("a.token")));
  ASSERT_OK(proto_token_load(&d, path("a.token")));
  ASSERT_MEMEQ(&d, &t, sizeof d);
  struct stat st;
  ASSERT_EQ(stat(path("a.token"), &st), 0);
  ASSERT_EQ(st.st_mode & 0777, 0644);

  sodium_bin2base64(b64, sizeof b64, t.raw, t.raw_len,
                    sodium_base64_VARIANT_ORIGINAL);
  char want[2048];
  snprintf(want, sizeof want, "beed-token-v1 %s\n", b64);
  read_bytes(path("a.token"), text, sizeof text);
  ASSERT_STREQ(text, want);

  /* Overwriting is fine (tokens are renewed), and the mode is no secret. */
  issue(&t, "swarm-a", PROTO_ROLE_BEE, NOW, NOW + 7200);
  ASSERT_OK(proto_token_save(&t, path("a.token")));
  ASSERT_EQ(chmod(path("a.token"), 0666), 0);
  ASSERT_OK(proto_token_load(&d, path("a.token")));
  ASSERT_MEMEQ(&d, &t, sizeof d);

  snprintf(text, sizeof text, "# token\n\nbeed-token-v1 %s\r\n# end\n", b64);
  write_bytes(path("b.token"), text, strlen(text));
  ASSERT_OK(proto_token_load(&d, path("b.token")));

  const char *bad[] = {
      "",
      "# nothing\n",
      "beed-token-v2 @\n",
      "beed-token-v1\n",
      "beed-token-v1 @ x\n",
      "beed-token-v1 @\nbeed-token-v1 @\n",
      "beed-token-v1 !!!!\n",
      "beed-token-v1 AAA\n", /* not a multiple of four */
      "beed-secret-key-v1 @\n",
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    size_t n = 0;
    for (const char *s = bad[i]; *s; s++) {
      if (*s == '@') {
        memcpy(text + n, b64, strlen(b64));
        n += strlen(b64);
      } else {
        text[n++] = *s;
      }
    }
    write_bytes(path("bad.token"), text, n);
    int rc = proto_token_load(&d, path("bad.token"));
    if (rc != BEE_EKEYFILE)
      FAIL("bad token file %zu: got %s", i, bee_errname(rc));
  }
  /* Well-formed base64 of a bad encoding gives the decoder's reason. */
  write_bytes(path("bad.token"), "beed-token-v1 gQ==\n", 19); /* 0x81 */
  ASSERT_RC(proto_token_load(&d, path("bad.token")), BEE_ETYPE);
  write_bytes(path("bad.token"), "beed-token-v1 mQ==\n", 19); /* 0x99 */
  ASSERT_RC(proto_token_load(&d, path("bad.token")), BEE_ETRUNCATED);

  static char huge[(64 << 10) + 16];
  memset(huge, '#', sizeof huge);
  write_bytes(path("bad.token"), huge, sizeof huge);
  ASSERT_RC(proto_token_load(&d, path("bad.token")), BEE_ETOOBIG);
  ASSERT_RC(proto_token_load(&d, path("missing.token")), -ENOENT);
  t.raw_len = 0;
  ASSERT_RC(proto_token_save(&t, path("c.token")), BEE_ERANGE);
}

/* ---- revocation lists -------------------------------------------------- */

/* Renewal: a file's changes are seen (a rewrite in place, a rename over
 * it, a removal warned of once); a renewed token is taken only when it
 * verifies for this node with its role, and the one held again is no
 * change; expiry warnings come at a day, 6 h, 1 h, 10 min and 0. */
static void test_renewal(void) {
  proto_file_watch w = {0};
  proto_token cur, t, other;
  int err;
  issue(&cur, "swarm-a", PROTO_ROLE_BEE, NOW - 10, NOW + 60);
  ASSERT_OK(proto_token_save(&cur, path("r.token")));
  ASSERT(proto_file_changed(&w, path("r.token"), &err)); /* first look */
  ASSERT_EQ(err, 0);
  ASSERT(!proto_file_changed(&w, path("r.token"), &err));
  ASSERT_EQ(proto_token_renewal(path("r.token"), &cur, mod.pk, "swarm-a",
                                peer.pk, PROTO_ROLES_ALL, NOW, NULL, &t), 0);

  /* A renewal, put in place by a rename (what beectl does). */
  issue(&t, "swarm-a", PROTO_ROLE_BEE, NOW, NOW + 86400);
  ASSERT_OK(proto_token_save(&t, path("r.token")));
  ASSERT(proto_file_changed(&w, path("r.token"), &err));
  ASSERT_EQ(proto_token_renewal(path("r.token"), &cur, mod.pk, "swarm-a",
                                peer.pk, PROTO_ROLES_ALL, NOW, NULL, &other), 1);
  ASSERT_MEMEQ(&other, &t, sizeof t);
  /* Refusals: another role (the token is still handed back), another
   * peer, expired, revoked, another moderator, not a token at all. */
  issue(&t, "swarm-a", PROTO_ROLE_AUX, NOW, NOW + 86400);
  ASSERT_OK(proto_token_save(&t, path("r.token")));
  ASSERT_EQ(proto_token_renewal(path("r.token"), &cur, mod.pk, "swarm-a",
                                peer.pk, PROTO_ROLES_ALL, NOW, NULL, &other),
            BEE_ETOKEN_ROLE);
  ASSERT_EQ(other.role, PROTO_ROLE_AUX);
  issue(&t, "swarm-a", PROTO_ROLE_BEE, NOW, NOW + 86400);
  ASSERT_OK(proto_token_save(&t, path("r.token")));
  ASSERT_EQ(proto_token_renewal(path("r.token"), &cur, mod.pk, "swarm-a",
                                peer2.pk, PROTO_ROLES_ALL, NOW, NULL, &other),
            BEE_ETOKEN_PEER);
  ASSERT_EQ(proto_token_renewal(path("r.token"), &cur, mod.pk, "swarm-a",
                                peer.pk, PROTO_ROLES_ALL, NOW + 86400, NULL,
                                &other),
            BEE_ETOKEN_EXPIRED);
  ASSERT_EQ(proto_token_renewal(path("r.token"), &cur, mod2.pk, "swarm-a",
                                peer.pk, PROTO_ROLES_ALL, NOW, NULL, &other),
            BEE_ETOKEN_MODERATOR);
  proto_revocation rl;
  proto_revocation_init(&rl);
  ASSERT_OK(proto_revocation_add(&rl, peer.pk));
  ASSERT_EQ(proto_token_renewal(path("r.token"), &cur, mod.pk, "swarm-a",
                                peer.pk, PROTO_ROLES_ALL, NOW, &rl, &other),
            BEE_EREVOKED);
  proto_revocation_close(&rl);
  write_bytes(path("r.token"), "not a token\n", 12);
  ASSERT(proto_file_changed(&w, path("r.token"), &err)); /* rewritten */
  ASSERT_EQ(proto_token_renewal(path("r.token"), &cur, mod.pk, "swarm-a",
                                peer.pk, PROTO_ROLES_ALL, NOW, NULL, &other),
            BEE_EKEYFILE);
  ASSERT_UEQ(other.raw_len, 0);

  /* Gone: said once; back: a change. */
  ASSERT_EQ(unlink(path("r.token")), 0);
  ASSERT(!proto_file_changed(&w, path("r.token"), &err));
  ASSERT_EQ(err, -ENOENT);
  ASSERT(w.failed && w.error == -ENOENT);
  ASSERT(!proto_file_changed(&w, path("r.token"), &err));
  ASSERT_EQ(err, 0);
  ASSERT_OK(proto_token_save(&cur, path("r.token")));
  ASSERT(proto_file_changed(&w, path("r.token"), &err));
  ASSERT(!w.failed);

  ASSERT_EQ(proto_token_warnings_due(7 * 86400), 0);
  ASSERT_EQ(proto_token_warnings_due(86401), 0);
  ASSERT_EQ(proto_token_warnings_due(86400), 1);
  ASSERT_EQ(proto_token_warnings_due(6 * 3600), 2);
  ASSERT_EQ(proto_token_warnings_due(3000), 3);
  ASSERT_EQ(proto_token_warnings_due(599), 4);
  ASSERT_EQ(proto_token_warnings_due(1), 4);
  ASSERT_EQ(proto_token_warnings_due(0), 5);
  ASSERT_EQ(proto_token_warnings_due(-100), 5);
}

static void random_key(uint8_t k[32]) { randombytes_buf(k, 32); }

static bool is_sorted(const proto_revocation *rl) {
  for (size_t i = 1; i < rl->n; i++)
    if (memcmp(rl->keys[i - 1], rl->keys[i], 32) >= 0)
      return false;
  return true;
}

static void test_revocation_set(void) {
  proto_revocation rl;
  uint8_t keys[200][32], other[32];
  proto_revocation_init(&rl);
  ASSERT_EQ(rl.n, 0);
  random_key(other);
  ASSERT(!proto_revocation_has(&rl, other));
  for (int i = 0; i < 200; i++)
    random_key(keys[i]);
  for (int i = 0; i < 200; i++) {
    ASSERT_OK(proto_revocation_add(&rl, keys[i]));
    ASSERT_OK(proto_revocation_add(&rl, keys[i / 2])); /* repeats */
    ASSERT_EQ(rl.n, i + 1);
    ASSERT(is_sorted(&rl));
  }
  for (int i = 0; i < 200; i++)
    ASSERT(proto_revocation_has(&rl, keys[i]));
  ASSERT(!proto_revocation_has(&rl, other));
  /* Edges: below the first and above the last key. */
  uint8_t lo[32] = {0}, hi[32];
  memset(hi, 0xff, sizeof hi);
  ASSERT(!proto_revocation_has(&rl, lo));
  ASSERT(!proto_revocation_has(&rl, hi));
  ASSERT_OK(proto_revocation_add(&rl, hi));
  ASSERT_OK(proto_revocation_add(&rl, lo));
  ASSERT(is_sorted(&rl));
  ASSERT_MEMEQ(rl.keys[0], lo, 32);
  ASSERT_MEMEQ(rl.keys[rl.n - 1], hi, 32);
  proto_revocation_close(&rl);
  ASSERT_EQ(rl.n, 0);
  ASSERT(rl.keys == NULL);
  proto_revocation_close(&rl); /* twice is fine */
}

static void enc_rl_body(buf *b, const char *swarm, const uint8_t mpk[32],
                        uint64_t seq, uint64_t issued,
                        const proto_revocation *rl, const uint8_t *sig) {
  b->n = 0;
  mp_array(b, sig ? 8 : 7);
  mp_uint(b, 1, false);
  mp_uint(b, 31, false);
  mp_str(b, swarm, strlen(swarm), false);
  mp_bin(b, mpk, 32, false);
  mp_uint(b, seq, false);
  mp_uint(b, issued, false);
  mp_array(b, (uint32_t)rl->n);
  for (size_t i = 0; i < rl->n; i++)
    mp_bin(b, rl->keys[i], 32, false);
  if (sig)
    mp_bin(b, sig, 64, false);
}

static void test_revocation_codec(void) {
  proto_revocation rl, d;
  uint8_t *enc;
  size_t len;
  buf b, m;
  proto_revocation_init(&rl);
  memcpy(rl.swarm, "swarm-a", 8);
  rl.seq = 7;
  rl.issued = NOW;
  for (int i = 0; i < 20; i++) {
    uint8_t k[32];
    random_key(k);
    ASSERT_OK(proto_revocation_add(&rl, k));
  }
  ASSERT_OK(proto_revocation_encode(&rl, &mod, &enc, &len));

  /* Byte for byte, and the signature over the domain + array of seven. */
  enc_rl_body(&b, "swarm-a", mod.pk, 7, NOW, &rl, enc + len - 64);
  ASSERT_EQ(len, b.n);
  ASSERT_MEMEQ(enc, b.b, len);
  enc_rl_body(&b, "swarm-a", mod.pk, 7, NOW, &rl, NULL);
  m.n = 0;
  put(&m, "beed revocation v1", 18);
  put(&m, b.b, b.n);
  ASSERT_EQ(crypto_sign_verify_detached(enc + len - 64, m.b, m.n, mod.pk), 0);

  ASSERT_OK(proto_revocation_decode(enc, len, mod.pk, "swarm-a", &d));
  ASSERT_STREQ(d.swarm, "swarm-a");
  ASSERT_MEMEQ(d.moderator_pk, mod.pk, 32);
  ASSERT_UEQ(d.seq, 7);
  ASSERT_UEQ(d.issued, NOW);
  ASSERT_EQ(d.n, rl.n);
  ASSERT_MEMEQ(d.keys, rl.keys, rl.n * 32);
  /* A decoded list can be extended and re-signed by its moderator. */
  uint8_t k[32];
  random_key(k);
  ASSERT_OK(proto_revocation_add(&d, k));
  d.seq++;
  uint8_t *enc2;
  size_t len2;
  ASSERT_OK(proto_revocation_encode(&d, &mod, &enc2, &len2));
  ASSERT_RC(proto_revocation_encode(&d, &mod2, &enc2, &len2),
            BEE_ETOKEN_MODERATOR);
  proto_revocation_close(&d);
  ASSERT_OK(proto_revocation_decode(enc2, len2, mod.pk, "swarm-a", &d));
  ASSERT_EQ(d.n, rl.n + 1);
  ASSERT(proto_revocation_has(&d, k));
  proto_revocation_close(&d);
  free(enc2);

  /* Refusals; each leaves the list empty. */
#define EXPECT_RL(buf_, len_, mpk_, swarm_, want_)                             \
  do {                                                                         \
    proto_revocation_init(&d);                                                 \
    ASSERT_RC(proto_revocation_decode(buf_, len_, mpk_, swarm_, &d), want_);   \
    ASSERT_EQ(d.n, 0);                                                         \
    ASSERT(d.keys == NULL);                                                    \
  } while (0)
  EXPECT_RL(enc, len, mod2.pk, "swarm-a", BEE_ETOKEN_MODERATOR);
  EXPECT_RL(enc, len, mod.pk, "swarm-b", BEE_ETOKEN_SWARM);
  enc[len - 1] ^= 1;
  EXPECT_RL(enc, len, mod.pk, "swarm-a", BEE_ETOKEN_FORGED);
  enc[len - 1] ^= 1;
  memcpy(b.b, enc, len);
  b.b[len - 64 - 2 - 1] ^= 1; /* last byte of the last key */
  EXPECT_RL(b.b, len, mod.pk, "swarm-a", BEE_ETOKEN_FORGED);
  /* Changed seq with the old signature. */
  enc_rl_body(&b, "swarm-a", mod.pk, 8, NOW, &rl, enc + len - 64);
  EXPECT_RL(b.b, b.n, mod.pk, "swarm-a", BEE_ETOKEN_FORGED);
  /* Signed by mod2, claiming mod. */
  uint8_t *enc3;
  size_t len3;
  proto_revocation other = rl;
  memset(other.moderator_pk, 0, 32);
  ASSERT_OK(proto_revocation_encode(&other, &mod2, &enc3, &len3));
  enc_rl_body(&b, "swarm-a", mod.pk, 7, NOW, &rl, enc3 + len3 - 64);
  EXPECT_RL(b.b, b.n, mod.pk, "swarm-a", BEE_ETOKEN_FORGED);
  free(enc3);
  /* Out of order and duplicate keys, even if signed. */
  proto_revocation bad = rl;
  uint8_t swapped[20][32];
  memcpy(swapped, rl.keys, sizeof swapped);
  memcpy(swapped[3], rl.keys[4], 32);
  memcpy(swapped[4], rl.keys[3], 32);
  bad.keys = swapped;
  enc_rl_body(&b, "swarm-a", mod.pk, 7, NOW, &bad, enc + len - 64);
  EXPECT_RL(b.b, b.n, mod.pk, "swarm-a", BEE_ERANGE);
  ASSERT_RC(proto_revocation_encode(&bad, &mod, &enc3, &len3), BEE_ERANGE);
  memcpy(swapped[4], swapped[3], 32);
  enc_rl_body(&b, "swarm-a", mod.pk, 7, NOW, &bad, enc + len - 64);
  EXPECT_RL(b.b, b.n, mod.pk, "swarm-a", BEE_ERANGE);
  /* Truncation at every length, and a trailing byte. */
  for (size_t n = 0; n < len; n++)
    EXPECT_RL(enc, n, mod.pk, "swarm-a", BEE_ETRUNCATED);
  memcpy(b.b, enc, len);
  b.b[len] = 0xc0;
  EXPECT_RL(b.b, len + 1, mod.pk, "swarm-a", BEE_ETRAILING);
  /* A key of the wrong size. */
  b.n = 0;
  mp_array(&b, 8);
  mp_uint(&b, 1, false);
  mp_uint(&b, 31, false);
  mp_str(&b, "swarm-a", 7, false);
  mp_bin(&b, mod.pk, 32, false);
  mp_uint(&b, 1, false);
  mp_uint(&b, NOW, false);
  mp_array(&b, 1);
  mp_bin(&b, mod.pk, 31, false);
  mp_bin(&b, enc + len - 64, 64, false);
  EXPECT_RL(b.b, b.n, mod.pk, "swarm-a", BEE_ERANGE);
  /* A token is not a list. */
  proto_token t;
  issue(&t, "swarm-a", 1, NOW, NOW + 1);
  EXPECT_RL(t.raw, t.raw_len, mod.pk, "swarm-a", BEE_EUNKNOWN);
  free(enc);

  /* An empty list round-trips. */
  proto_revocation empty;
  proto_revocation_init(&empty);
  memcpy(empty.swarm, "s", 2);
  ASSERT_OK(proto_revocation_encode(&empty, &mod, &enc, &len));
  ASSERT_OK(proto_revocation_decode(enc, len, mod.pk, "s", &d));
  ASSERT_EQ(d.n, 0);
  proto_revocation_close(&d);
  free(enc);
  empty.swarm[0] = 0;
  ASSERT_RC(proto_revocation_encode(&empty, &mod, &enc, &len), BEE_ERANGE);
  proto_revocation_close(&rl);
}

static void test_revocation_limits(void) {
  proto_revocation rl, d;
  uint8_t *enc;
  size_t len;
  proto_revocation_init(&rl);
  memcpy(rl.swarm, "big", 4);
  rl.keys = calloc(PROTO_REVOKED_MAX, 32);
  ASSERT(rl.keys);
  for (size_t i = 0; i < PROTO_REVOKED_MAX; i++) {
    rl.keys[i][0] = (uint8_t)(i >> 16);
    rl.keys[i][1] = (uint8_t)(i >> 8);
    rl.keys[i][2] = (uint8_t)i;
    rl.keys[i][31] = 1;
  }
  rl.n = PROTO_REVOKED_MAX;
  uint8_t k[32] = {0};
  ASSERT_RC(proto_revocation_add(&rl, k), BEE_ETOOBIG);
  ASSERT_OK(proto_revocation_add(&rl, rl.keys[12345])); /* already there */
  ASSERT_EQ(rl.n, PROTO_REVOKED_MAX);
  ASSERT(proto_revocation_has(&rl, rl.keys[PROTO_REVOKED_MAX - 1]));
  ASSERT(!proto_revocation_has(&rl, k));

  ASSERT_OK(proto_revocation_encode(&rl, &mod, &enc, &len));
  ASSERT_OK(proto_revocation_decode(enc, len, mod.pk, "big", &d));
  ASSERT_EQ(d.n, PROTO_REVOKED_MAX);
  proto_revocation_close(&d);

  /* The file form of a full list fits its file cap. */
  ASSERT_OK(proto_revocation_save(&rl, &mod, path("big.rl")));
  ASSERT_OK(proto_revocation_load(&d, path("big.rl"), mod.pk, "big"));
  ASSERT_EQ(d.n, PROTO_REVOKED_MAX);
  proto_revocation_close(&d);
  unlink(path("big.rl"));
  free(enc);

  /* One key over the limit: the count is refused before any allocation. */
  static buf b;
  b.n = 0;
  mp_array(&b, 8);
  mp_uint(&b, 1, false);
  mp_uint(&b, 31, false);
  mp_str(&b, "big", 3, false);
  mp_bin(&b, mod.pk, 32, false);
  mp_uint(&b, 1, false);
  mp_uint(&b, NOW, false);
  mp_array(&b, PROTO_REVOKED_MAX + 1);
  uint8_t *over = malloc(b.n + PROTO_REVOKED_MAX + 1 + 66);
  ASSERT(over);
  memcpy(over, b.b, b.n);
  memset(over + b.n, 0xc0, PROTO_REVOKED_MAX + 1 + 66);
  proto_revocation_init(&d);
  ASSERT_RC(proto_revocation_decode(over, b.n + PROTO_REVOKED_MAX + 1 + 66,
                                    mod.pk, "big", &d),
            BEE_ETOOBIG);
  ASSERT_EQ(d.n, 0);
  /* A count the bytes cannot back is a truncation. */
  ASSERT_RC(proto_revocation_decode(over, b.n + 100, mod.pk, "big", &d),
            BEE_ETRUNCATED);
  free(over);
  proto_revocation_close(&rl);
}

static void test_revocation_file(void) {
  proto_revocation rl, d;
  char text[4096];
  proto_revocation_init(&rl);
  memcpy(rl.swarm, "swarm-a", 8);
  rl.seq = 1;
  rl.issued = NOW;
  ASSERT_OK(proto_revocation_add(&rl, peer.pk));
  ASSERT_OK(proto_revocation_add(&rl, peer2.pk));
  ASSERT_OK(proto_revocation_save(&rl, &mod, path("a.rl")));
  struct stat st;
  ASSERT_EQ(stat(path("a.rl"), &st), 0);
  ASSERT_EQ(st.st_mode & 0777, 0644);
  read_bytes(path("a.rl"), text, sizeof text);
  ASSERT(!strncmp(text, "beed-revocation-v1 ", 19));
  ASSERT_EQ(text[strlen(text) - 1], '\n');

  ASSERT_OK(proto_revocation_load(&d, path("a.rl"), mod.pk, "swarm-a"));
  ASSERT_EQ(d.n, 2);
  ASSERT(proto_revocation_has(&d, peer.pk));
  ASSERT(proto_revocation_has(&d, peer2.pk));
  ASSERT_UEQ(d.seq, 1);
  proto_revocation_close(&d);

  ASSERT_RC(proto_revocation_load(&d, path("a.rl"), mod.pk, "swarm-b"),
            BEE_ETOKEN_SWARM);
  ASSERT_EQ(d.n, 0);
  ASSERT_RC(proto_revocation_load(&d, path("a.rl"), mod2.pk, "swarm-a"),
            BEE_ETOKEN_MODERATOR);
  ASSERT_RC(proto_revocation_load(&d, path("none.rl"), mod.pk, "swarm-a"),
            -ENOENT);

  /* A token file is not a list file, and vice versa. */
  proto_token t;
  issue(&t, "swarm-a", 1, NOW, NOW + 1);
  ASSERT_OK(proto_token_save(&t, path("t.token")));
  ASSERT_RC(proto_revocation_load(&d, path("t.token"), mod.pk, "swarm-a"),
            BEE_EKEYFILE);
  ASSERT_RC(proto_token_load(&t, path("a.rl")), BEE_EKEYFILE);

  /* A forged byte in the file. */
  size_t n = read_bytes(path("a.rl"), text, sizeof text);
  uint8_t bin[2048];
  size_t bin_len;
  ASSERT_EQ(sodium_base642bin(bin, sizeof bin, text + 19, n - 20, NULL,
                              &bin_len, NULL, sodium_base64_VARIANT_ORIGINAL),
            0);
  bin[bin_len - 10] ^= 4;
  memcpy(text, "# edited\nbeed-revocation-v1 ", 28);
  sodium_bin2base64(text + 28, sizeof text - 29, bin, bin_len,
                    sodium_base64_VARIANT_ORIGINAL);
  strcat(text, "\n");
  write_bytes(path("b.rl"), text, strlen(text));
  ASSERT_RC(proto_revocation_load(&d, path("b.rl"), mod.pk, "swarm-a"),
            BEE_ETOKEN_FORGED);
  proto_revocation_close(&rl);
}

int main(void) {
  ASSERT(sodium_init() >= 0);
  ASSERT(mkdtemp(dir) != NULL);
  atexit(cleanup);
  proto_identity_generate(&mod);
  proto_identity_generate(&mod2);
  proto_identity_generate(&peer);
  proto_identity_generate(&peer2);
  test_roles();
  test_issue_format();
  test_verify_refusals();
  test_resigned();
  test_decode_strict();
  test_token_file();
  test_renewal();
  test_revocation_set();
  test_revocation_codec();
  test_revocation_limits();
  test_revocation_file();
  return 0;
}
