/* test-proto-identity.c: identity key files, peer ids and hex.
 *
 * Works in a fresh directory under /tmp, removed at the end.  Key
 * derivation is checked against RFC 8032's first Ed25519 test vector and
 * peer ids against BLAKE2b-160 values computed with Python's hashlib.
 */
#include "proto.h"
#include "test.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>

static char dir[] = "/tmp/beed-test-identity-XXXXXX";

/* RFC 8032, section 7.1, TEST 1. */
static const char rfc_seed[] =
    "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60";
static const char rfc_pk[] =
    "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a";
/* hashlib.blake2b(bytes.fromhex(rfc_pk), digest_size=20).hexdigest() */
static const char rfc_id[] = "1b3517cf5af0ac86b8efe88452908c45f5c7e079";

static const char *path(const char *name) {
  static char buf[512];
  int n = snprintf(buf, sizeof buf, "%s/%s", dir, name);
  ASSERT(n > 0 && (size_t)n < sizeof buf);
  return buf;
}

static void write_text(const char *p, const char *text, mode_t mode) {
  unlink(p);
  int fd = open(p, O_WRONLY | O_CREAT | O_EXCL, mode);
  ASSERT(fd >= 0);
  ASSERT_EQ(fchmod(fd, mode), 0);
  size_t n = strlen(text);
  ASSERT_EQ(write(fd, text, n), (ssize_t)n);
  close(fd);
}

static mode_t file_mode(const char *p) {
  struct stat st;
  ASSERT_EQ(stat(p, &st), 0);
  return st.st_mode & 07777;
}

static void cleanup(void) {
  DIR *d = opendir(dir);
  if (!d)
    return;
  for (struct dirent *e; (e = readdir(d));)
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
      if (unlink(path(e->d_name)) != 0)
        rmdir(path(e->d_name));
  closedir(d);
  rmdir(dir);
}

static void test_hex(void) {
  uint8_t bytes[256], back[256];
  char hex[513];
  for (int i = 0; i < 256; i++)
    bytes[i] = (uint8_t)i;
  proto_hex(bytes, sizeof bytes, hex);
  ASSERT_EQ(strlen(hex), 512);
  ASSERT(!strncmp(hex, "000102", 6));
  ASSERT(!strcmp(hex + 506, "fdfeff"));
  ASSERT_OK(proto_unhex(hex, back, sizeof back));
  ASSERT_MEMEQ(bytes, back, sizeof bytes);

  uint8_t two[2] = {7, 7};
  ASSERT_OK(proto_unhex("ABcd", two, 2));
  ASSERT_EQ(two[0], 0xab);
  ASSERT_EQ(two[1], 0xcd);
  ASSERT_RC(proto_unhex("abc", two, 2), BEE_ERANGE);
  ASSERT_RC(proto_unhex("abcde", two, 2), BEE_ERANGE);
  ASSERT_RC(proto_unhex("abcdef", two, 2), BEE_ERANGE);
  ASSERT_RC(proto_unhex("", two, 2), BEE_ERANGE);
  ASSERT_RC(proto_unhex("abcg", two, 2), BEE_ERANGE);
  ASSERT_RC(proto_unhex("ab d", two, 2), BEE_ERANGE);
  ASSERT_RC(proto_unhex("0x12", two, 2), BEE_ERANGE);
  ASSERT_EQ(two[0], 0xab); /* a refused string leaves out alone */
  ASSERT_OK(proto_unhex("", two, 0));
}

static void test_peer_id(void) {
  uint8_t zero[PROTO_PK_BYTES] = {0}, id[PROTO_ID_BYTES];
  uint8_t pk[PROTO_PK_BYTES], want[PROTO_ID_BYTES];
  char hex[2 * PROTO_ID_BYTES + 1];
  proto_peer_id(zero, id);
  proto_hex(id, sizeof id, hex);
  ASSERT_STREQ(hex, "0210bea6a139797d74aa5764fb226398f07f42c4");

  ASSERT_OK(proto_unhex(rfc_pk, pk, sizeof pk));
  proto_peer_id(pk, id);
  proto_hex(id, sizeof id, hex);
  ASSERT_STREQ(hex, rfc_id);
  crypto_generichash(want, sizeof want, pk, sizeof pk, NULL, 0);
  ASSERT_MEMEQ(id, want, sizeof id);
}

static void test_generate(void) {
  proto_identity a, b;
  uint8_t id[PROTO_ID_BYTES], sig[64];
  static const uint8_t msg[] = "hello";
  proto_identity_generate(&a);
  proto_identity_generate(&b);
  ASSERT(memcmp(a.pk, b.pk, PROTO_PK_BYTES) != 0);
  proto_peer_id(a.pk, id);
  ASSERT_MEMEQ(a.id, id, sizeof id);
  crypto_sign_detached(sig, NULL, msg, sizeof msg, a.sk);
  ASSERT_EQ(crypto_sign_verify_detached(sig, msg, sizeof msg, a.pk), 0);
  ASSERT(crypto_sign_verify_detached(sig, msg, sizeof msg, b.pk) != 0);
  proto_identity_clear(&a);
  static const proto_identity zero;
  ASSERT_MEMEQ(&a, &zero, sizeof a);
}

static void test_create_and_reload(void) {
  proto_identity a, b;
  const char *p = path("node.key");
  ASSERT_RC(proto_identity_load(&a, p, false), -ENOENT);
  mode_t old = umask(0); /* the file must be 0600 whatever the umask */
  ASSERT_OK(proto_identity_load(&a, p, true));
  umask(old);
  ASSERT_EQ(file_mode(p), 0600);
  ASSERT_OK(proto_identity_load(&b, p, false));
  ASSERT_MEMEQ(a.pk, b.pk, PROTO_PK_BYTES);
  ASSERT_MEMEQ(a.sk, b.sk, PROTO_SK_BYTES);
  ASSERT_MEMEQ(a.id, b.id, PROTO_ID_BYTES);
  ASSERT_OK(proto_identity_load(&b, p, true)); /* exists: just loads */
  ASSERT_MEMEQ(a.pk, b.pk, PROTO_PK_BYTES);

  /* The file holds the comment and the seed line, nothing else. */
  uint8_t seed[32];
  char want[200], hex[65], got[300];
  crypto_sign_ed25519_sk_to_seed(seed, a.sk);
  proto_hex(seed, 32, hex);
  snprintf(want, sizeof want,
           "# beed Ed25519 secret key. Keep it private.\n"
           "beed-secret-key-v1 %s\n",
           hex);
  int fd = open(p, O_RDONLY);
  ASSERT(fd >= 0);
  ssize_t n = read(fd, got, sizeof got - 1);
  close(fd);
  ASSERT(n > 0);
  got[n] = 0;
  ASSERT_STREQ(got, want);

  /* Group or other bits of any kind are refused. */
  static const mode_t bad[] = {0640, 0604, 0620, 0602, 0610, 0601, 0644};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ASSERT_EQ(chmod(p, bad[i]), 0);
    ASSERT_RC(proto_identity_load(&b, p, false), BEE_EKEYPERM);
    ASSERT_RC(proto_identity_load(&b, p, true), BEE_EKEYPERM);
  }
  ASSERT_EQ(chmod(p, 0400), 0);
  ASSERT_OK(proto_identity_load(&b, p, false));
  ASSERT_EQ(chmod(p, 0600), 0);

  /* Save never overwrites. */
  proto_identity c;
  proto_identity_generate(&c);
  ASSERT_RC(proto_identity_save(&c, p), -EEXIST);
  ASSERT_OK(proto_identity_load(&b, p, false));
  ASSERT_MEMEQ(a.pk, b.pk, PROTO_PK_BYTES);
  ASSERT_OK(proto_identity_save(&c, path("other.key")));
  ASSERT_EQ(file_mode(path("other.key")), 0600);
  ASSERT_OK(proto_identity_load(&b, path("other.key"), false));
  ASSERT_MEMEQ(c.pk, b.pk, PROTO_PK_BYTES);

  /* Missing parent directory: the create fails cleanly. */
  ASSERT_RC(proto_identity_load(&b, path("nodir/x.key"), true), -ENOENT);
  /* A directory is not a key file. */
  ASSERT_EQ(mkdir(path("sub"), 0700), 0);
  ASSERT_RC(proto_identity_load(&b, path("sub"), false), BEE_EKEYFILE);
  rmdir(path("sub"));
}

static void test_known_seed(void) {
  proto_identity id;
  uint8_t pk[PROTO_PK_BYTES];
  char text[300];
  ASSERT_OK(proto_unhex(rfc_pk, pk, sizeof pk));

  /* Comments, blank lines, CRLF and trailing blanks are tolerated. */
  snprintf(text, sizeof text,
           "# a comment\n\n   \nbeed-secret-key-v1 %s \r\n# after\n\n",
           rfc_seed);
  write_text(path("rfc.key"), text, 0600);
  ASSERT_OK(proto_identity_load(&id, path("rfc.key"), false));
  ASSERT_MEMEQ(id.pk, pk, sizeof pk);

  /* Upper case hex and no final newline. */
  char upper[65];
  for (int i = 0; i < 64; i++)
    upper[i] = (char)(rfc_seed[i] >= 'a' ? rfc_seed[i] - 32 : rfc_seed[i]);
  upper[64] = 0;
  snprintf(text, sizeof text, "beed-secret-key-v1 %s", upper);
  write_text(path("rfc.key"), text, 0600);
  ASSERT_OK(proto_identity_load(&id, path("rfc.key"), false));
  ASSERT_MEMEQ(id.pk, pk, sizeof pk);

  char idhex[41];
  proto_hex(id.id, sizeof id.id, idhex);
  ASSERT_STREQ(idhex, rfc_id);
}

/* Expands tmpl into out: '@' becomes the whole seed, '<' the seed less
 * its last two digits, '>' less its last digit. */
static void expand(char *out, size_t cap, const char *tmpl) {
  size_t n = 0;
  for (const char *t = tmpl; *t; t++) {
    size_t k = *t == '@' ? 64 : *t == '<' ? 62 : *t == '>' ? 63 : 0;
    const char *src = k ? rfc_seed : t;
    if (!k)
      k = 1;
    ASSERT(n + k < cap);
    memcpy(out + n, src, k);
    n += k;
  }
  out[n] = 0;
}

static void test_malformed(void) {
  char text[400];
  proto_identity id;
  static const char *bad[] = {
      "",
      "\n",
      "# only a comment\n",
      "beed-secret-key-v2 @\n",
      "beed-secret-key @\n",
      "beed-secret-key-v1\n",
      "beed-secret-key-v1 \n",
      "beed-secret-key-v1  @\n", /* two spaces */
      "beed-secret-key-v1\t@\n",
      " beed-secret-key-v1 @\n",
      "beed-secret-key-v1 <\n",         /* short */
      "beed-secret-key-v1 @00\n",       /* long */
      "beed-secret-key-v1 >g\n",        /* non-hex */
      "beed-secret-key-v1 < \n",        /* short, padded */
      "beed-secret-key-v1 @ garbage\n", /* extra on the line */
      "beed-secret-key-v1 @garbage\n",
      "beed-secret-key-v1 @\ngarbage\n",              /* extra line */
      "beed-secret-key-v1 @\nbeed-secret-key-v1 @\n", /* two keys */
      "garbage\nbeed-secret-key-v1 @\n",
      "beed-secret-key-v1 0x<\n",
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    expand(text, sizeof text, bad[i]);
    write_text(path("bad.key"), text, 0600);
    int rc = proto_identity_load(&id, path("bad.key"), false);
    if (rc != BEE_EKEYFILE)
      FAIL("case %zu (%s): got %s", i, text, bee_errname(rc));
    /* create does not replace a malformed file */
    ASSERT_RC(proto_identity_load(&id, path("bad.key"), true), BEE_EKEYFILE);
  }

  /* A NUL inside the line. */
  int fd = open(path("nul.key"), O_WRONLY | O_CREAT | O_EXCL, 0600);
  ASSERT(fd >= 0);
  expand(text, sizeof text, "beed-secret-key-v1 @\n");
  size_t len = strlen(text);
  text[30] = 0;
  ASSERT_EQ(write(fd, text, len), (ssize_t)len);
  close(fd);
  ASSERT_RC(proto_identity_load(&id, path("nul.key"), false), BEE_EKEYFILE);

  /* An oversized file is not a key file. */
  static char big[8192];
  memset(big, '#', sizeof big - 1);
  write_text(path("big.key"), big, 0600);
  ASSERT_RC(proto_identity_load(&id, path("big.key"), false), BEE_EKEYFILE);
}

int main(void) {
  ASSERT(sodium_init() >= 0);
  ASSERT(mkdtemp(dir) != NULL);
  atexit(cleanup); /* also after a failed assertion */
  test_hex();
  test_peer_id();
  test_generate();
  test_create_and_reload();
  test_known_seed();
  test_malformed();
  return 0;
}
