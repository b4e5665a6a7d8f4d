/* seal.c: sealed frame bodies (AEAD) with counter nonces.
 *
 * Each direction of a session has its own key, so a nonce only has to be
 * unique per direction: it is the count of bodies sealed so far, which
 * also makes a replayed, dropped or reordered body fail to open.
 *
 * AES-256-GCM runs on OpenSSL's libcrypto, whose stitched AES-NI/VAES and
 * carry-less-multiply code seals 2.5 times faster than libsodium 1.0.18's
 * on the machines we run (docs/ARCHITECTURE.md, Library choices); the
 * bytes on the wire are the same either way, and tests/test-proto-seal.c
 * checks that against libsodium.  XChaCha20-Poly1305, for CPUs without
 * AES-NI, stays on libsodium.
 */
#include "proto-int.h"

#include <openssl/evp.h>
#include <sodium.h>
#include <string.h>

_Static_assert(crypto_aead_aes256gcm_ABYTES == PROTO_TAG_BYTES &&
                   crypto_aead_xchacha20poly1305_ietf_ABYTES == PROTO_TAG_BYTES,
               "tag size");

#define GCM_NONCE 12

int proto__sealer_init(proto_sealer *s, int cipher, const uint8_t key[32]) {
  memset(s, 0, sizeof *s);
  if (cipher != PROTO_CIPHER_AES256GCM &&
      cipher != PROTO_CIPHER_XCHACHA20POLY1305)
    return BEE_ECIPHER;
  s->cipher = cipher;
  memcpy(s->key, key, 32);
  return 0;
}

int proto__ciphers_local(void) {
  int c = PROTO_CIPHER_XCHACHA20POLY1305;
  if (sodium_init() >= 0 && crypto_aead_aes256gcm_is_available())
    c |= PROTO_CIPHER_AES256GCM; /* only where the CPU makes it fast */
  return c;
}

/* The nonce for the current counter: big-endian counter in the last 8
 * bytes, zeros before. */
static void nonce(const proto_sealer *s, uint8_t *n, size_t len) {
  memset(n, 0, len);
  for (int i = 0; i < 8; i++)
    n[len - 1 - (size_t)i] = (uint8_t)(s->counter >> (8 * i));
}

/* The sealer's GCM context, made on first use for one direction.  The key
 * schedule is computed once; each body only sets a new nonce. */
static EVP_CIPHER_CTX *gcm(proto_sealer *s, bool encrypt) {
  if (s->ctx)
    return s->ctx;
  EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
  if (!ctx)
    return NULL;
  int ok = encrypt ? EVP_EncryptInit_ex(ctx, EVP_aes_256_gcm(), NULL, s->key, NULL)
                   : EVP_DecryptInit_ex(ctx, EVP_aes_256_gcm(), NULL, s->key, NULL);
  if (ok != 1) {
    EVP_CIPHER_CTX_free(ctx);
    return NULL;
  }
  s->ctx = ctx;
  return ctx;
}

/* Encrypts the parts into out (ciphertext is hlen + len bytes, then the
 * tag).  Parts may alias out exactly (in place). */
static int gcm_seal(proto_sealer *s, uint8_t *out, const uint8_t *hdr,
                    size_t hlen, const uint8_t *data, size_t len) {
  uint8_t n[GCM_NONCE];
  int a = 0, b = 0, c = 0;
  EVP_CIPHER_CTX *ctx = gcm(s, true);
  if (!ctx || hlen + len > INT32_MAX)
    return BEE_ELIMIT;
  nonce(s, n, sizeof n);
  if (EVP_EncryptInit_ex(ctx, NULL, NULL, NULL, n) != 1 ||
      (hlen && EVP_EncryptUpdate(ctx, out, &a, hdr, (int)hlen) != 1) ||
      (len && EVP_EncryptUpdate(ctx, out + a, &b, data, (int)len) != 1) ||
      EVP_EncryptFinal_ex(ctx, out + a + b, &c) != 1 ||
      EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, PROTO_TAG_BYTES,
                          out + hlen + len) != 1)
    return BEE_ELIMIT;
  return 0;
}

static int gcm_open(proto_sealer *s, uint8_t *buf, size_t m) {
  uint8_t n[GCM_NONCE];
  int a = 0, b = 0;
  EVP_CIPHER_CTX *ctx = gcm(s, false);
  if (!ctx || m > INT32_MAX)
    return BEE_EAUTH;
  nonce(s, n, sizeof n);
  if (EVP_DecryptInit_ex(ctx, NULL, NULL, NULL, n) != 1 ||
      (m && EVP_DecryptUpdate(ctx, buf, &a, buf, (int)m) != 1) ||
      EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, PROTO_TAG_BYTES,
                          buf + m) != 1 ||
      EVP_DecryptFinal_ex(ctx, buf + a, &b) != 1)
    return BEE_EAUTH;
  return 0;
}

int proto__seal_parts(proto_sealer *s, uint8_t *out, const uint8_t *hdr,
                      size_t hlen, const uint8_t *data, size_t len) {
  if (s->counter == UINT64_MAX)
    return BEE_ELIMIT;
  if (s->cipher == PROTO_CIPHER_AES256GCM) {
    int rc = gcm_seal(s, out, hdr, hlen, data, len);
    if (rc)
      return rc;
  } else {
    uint8_t n[crypto_aead_xchacha20poly1305_ietf_NPUBBYTES];
    if (hlen && hdr != out)
      memmove(out, hdr, hlen);
    if (len && data != out + hlen)
      memmove(out + hlen, data, len);
    nonce(s, n, sizeof n);
    crypto_aead_xchacha20poly1305_ietf_encrypt_detached(
        out, out + hlen + len, NULL, out, hlen + len, NULL, 0, NULL, n,
        s->key);
  }
  s->counter++;
  return 0;
}

int proto_seal(proto_sealer *s, uint8_t *buf, size_t len) {
  return proto__seal_parts(s, buf, buf, len, NULL, 0);
}

int proto_open(proto_sealer *s, uint8_t *buf, size_t len, size_t *plain_len) {
  int rc;
  if (len < PROTO_TAG_BYTES || s->counter == UINT64_MAX)
    return BEE_EAUTH;
  size_t m = len - PROTO_TAG_BYTES;
  if (s->cipher == PROTO_CIPHER_AES256GCM) {
    rc = gcm_open(s, buf, m);
  } else {
    uint8_t n[crypto_aead_xchacha20poly1305_ietf_NPUBBYTES];
    nonce(s, n, sizeof n);
    rc = crypto_aead_xchacha20poly1305_ietf_decrypt_detached(
             buf, NULL, buf, m, buf + m, NULL, 0, n, s->key) == 0
             ? 0
             : BEE_EAUTH;
  }
  if (rc)
    return rc;
  s->counter++;
  *plain_len = m;
  return 0;
}

void proto_sealer_clear(proto_sealer *s) {
  if (s->ctx)
    EVP_CIPHER_CTX_free(s->ctx); /* wipes the key schedule */
  sodium_memzero(s, sizeof *s);
}
