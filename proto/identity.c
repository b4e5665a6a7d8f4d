/* identity.c: node identity keys, their key files, peer ids and hex.
 *
 * An identity is an Ed25519 key pair derived from a 32-byte seed; the key
 * file stores only the seed, as one text line
 *
 *   beed-secret-key-v1 <64 lowercase hex digits>
 *
 * after an optional comment.  Lines starting with '#' and blank lines are
 * ignored.  A key file must not be readable by group or others: loading
 * refuses it rather than use a key that may already have leaked.
 */
#include "proto-int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>

#define KEY_MAGIC "beed-secret-key-v1"
#define KEY_COMMENT "# beed Ed25519 secret key. Keep it private.\n"
#define SEED_BYTES 32
#define KEY_FILE_MAX 4096 /* a key file is ~110 bytes; more is not ours */

void proto_peer_id(const uint8_t pk[PROTO_PK_BYTES],
                   uint8_t id[PROTO_ID_BYTES]) {
  crypto_generichash(id, PROTO_ID_BYTES, pk, PROTO_PK_BYTES, NULL, 0);
}

/* Fills out from a seed; the seed stays the caller's to wipe. */
static void from_seed(proto_identity *out, const uint8_t seed[SEED_BYTES]) {
  crypto_sign_seed_keypair(out->pk, out->sk, seed);
  proto_peer_id(out->pk, out->id);
}

/* Aborts only if libsodium cannot initialise (no randomness source). */
void proto_identity_generate(proto_identity *out) {
  uint8_t seed[SEED_BYTES];
  if (sodium_init() < 0)
    abort(); /* no usable randomness: nothing safe to do */
  randombytes_buf(seed, sizeof seed);
  from_seed(out, seed);
  sodium_memzero(seed, sizeof seed);
}

void proto_identity_clear(proto_identity *id) {
  sodium_memzero(id, sizeof *id);
}

void proto_hex(const uint8_t *p, size_t n, char *out) {
  static const char digits[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) {
    out[2 * i] = digits[p[i] >> 4];
    out[2 * i + 1] = digits[p[i] & 15];
  }
  out[2 * n] = 0;
}

static int hexval(char c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

int proto_unhex(const char *s, uint8_t *out, size_t n) {
  /* Check everything first so a bad string leaves out untouched. */
  if (strnlen(s, 2 * n + 1) != 2 * n)
    return BEE_ERANGE;
  for (size_t i = 0; i < 2 * n; i++)
    if (hexval(s[i]) < 0)
      return BEE_ERANGE;
  for (size_t i = 0; i < n; i++)
    out[i] = (uint8_t)(hexval(s[2 * i]) << 4 | hexval(s[2 * i + 1]));
  return 0;
}

/* Reads the key file on an open fd, checking its mode on that same fd so
 * the file checked is the file read. */
static int load_fd(proto_identity *out, int fd) {
  int rc = 0;
  char buf[KEY_FILE_MAX + 1];
  char hex[2 * SEED_BYTES + 1];
  uint8_t seed[SEED_BYTES];
  size_t got = 0, off = 0, n = 0;
  struct stat st;
  if (fstat(fd, &st) < 0)
    return -errno;
  if (!S_ISREG(st.st_mode))
    return BEE_EKEYFILE;
  if (st.st_mode & 077)
    return BEE_EKEYPERM;
  for (;;) {
    ssize_t r = read(fd, buf + got, sizeof buf - got);
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0) {
      rc = -errno;
      goto out;
    }
    if (r == 0)
      break;
    got += (size_t)r;
    if (got == sizeof buf) {
      rc = BEE_EKEYFILE;
      goto out;
    }
  }
  if ((rc = proto__text_line(buf, got, KEY_MAGIC, &off, &n)))
    goto out;
  if (n != 2 * SEED_BYTES) {
    rc = BEE_EKEYFILE;
    goto out;
  }
  memcpy(hex, buf + off, n);
  hex[n] = 0;
  if (proto_unhex(hex, seed, SEED_BYTES)) {
    rc = BEE_EKEYFILE;
    goto out;
  }
  from_seed(out, seed);
out:
  sodium_memzero(buf, sizeof buf);
  sodium_memzero(hex, sizeof hex);
  sodium_memzero(seed, sizeof seed);
  return rc;
}

/* Opens and loads path; -ENOENT when it does not exist. */
static int load_path(proto_identity *out, const char *path) {
  /* O_NONBLOCK: a FIFO named by mistake must not hang us; load_fd then
   * refuses anything but a regular file. */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0)
    return -errno;
  int rc = load_fd(out, fd);
  close(fd);
  return rc;
}

/* With create, two processes starting at once may both find no file; the
 * exclusive save lets one win and the other load the winner's key. */
int proto_identity_load(proto_identity *out, const char *path, bool create) {
  int rc = load_path(out, path);
  if (rc != -ENOENT || !create)
    return rc;
  proto_identity fresh;
  proto_identity_generate(&fresh);
  rc = proto_identity_save(&fresh, path);
  if (rc == 0)
    *out = fresh;
  else if (rc == -EEXIST) /* another process created it first: use theirs */
    rc = load_path(out, path);
  proto_identity_clear(&fresh);
  return rc;
}

/* Writes a temp file and links it into place, so the key file appears
 * whole or not at all, and never replaces an existing one. */
int proto_identity_save(const proto_identity *id, const char *path) {
  uint8_t seed[SEED_BYTES];
  char text[sizeof KEY_COMMENT + sizeof KEY_MAGIC + 2 * SEED_BYTES + 2];
  crypto_sign_ed25519_sk_to_seed(seed, id->sk);
  memcpy(text, KEY_COMMENT, sizeof KEY_COMMENT - 1);
  size_t n = sizeof KEY_COMMENT - 1;
  memcpy(text + n, KEY_MAGIC " ", sizeof KEY_MAGIC);
  n += sizeof KEY_MAGIC;
  proto_hex(seed, SEED_BYTES, text + n);
  n += 2 * SEED_BYTES;
  text[n++] = '\n';
  int rc = proto_write_file(path, text, n, 0600, true);
  sodium_memzero(seed, sizeof seed);
  sodium_memzero(text, sizeof text);
  return rc;
}
