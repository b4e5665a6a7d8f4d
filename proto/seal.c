/* seal.c: sealed frame bodies (AEAD) with counter nonces.
 *
 * Each direction of a session has its own key, so a nonce only has to be
 * unique per direction: it is the count of bodies sealed so far, which
 * also makes a replayed, dropped or reordered body fail to open.
 * AES-256-GCM runs on libsodium's precomputed key schedule where the CPU
 * has AES-NI and PCLMUL; XChaCha20-Poly1305 everywhere else.
 */
#include "proto-int.h"

#include <sodium.h>
#include <string.h>

_Static_assert(sizeof(((proto_sealer *)0)->state) >=
                   sizeof(crypto_aead_aes256gcm_state),
               "proto_sealer.state too small for libsodium's AES-GCM state");
_Static_assert(crypto_aead_aes256gcm_ABYTES == PROTO_TAG_BYTES &&
                   crypto_aead_xchacha20poly1305_ietf_ABYTES == PROTO_TAG_BYTES,
               "tag size");

int proto__sealer_init(proto_sealer *s, int cipher, const uint8_t key[32]) {
  memset(s, 0, sizeof *s);
  s->cipher = cipher;
  memcpy(s->key, key, 32);
  if (cipher == PROTO_CIPHER_AES256GCM) {
    if (!crypto_aead_aes256gcm_is_available())
      return BEE_ECIPHER;
    crypto_aead_aes256gcm_beforenm((crypto_aead_aes256gcm_state *)s->state,
                                   key);
    return 0;
  }
  return cipher == PROTO_CIPHER_XCHACHA20POLY1305 ? 0 : BEE_ECIPHER;
}

int proto__ciphers_local(void) {
  int c = PROTO_CIPHER_XCHACHA20POLY1305;
  if (sodium_init() >= 0 && crypto_aead_aes256gcm_is_available())
    c |= PROTO_CIPHER_AES256GCM;
  return c;
}

/* The nonce for the current counter: big-endian counter in the last 8
 * bytes, zeros before. */
static void nonce(const proto_sealer *s, uint8_t *n, size_t len) {
  memset(n, 0, len);
  for (int i = 0; i < 8; i++)
    n[len - 1 - (size_t)i] = (uint8_t)(s->counter >> (8 * i));
}

int proto_seal(proto_sealer *s, uint8_t *buf, size_t len) {
  uint8_t n[crypto_aead_xchacha20poly1305_ietf_NPUBBYTES];
  if (s->counter == UINT64_MAX)
    return BEE_ELIMIT;
  if (s->cipher == PROTO_CIPHER_AES256GCM) {
    nonce(s, n, crypto_aead_aes256gcm_NPUBBYTES);
    crypto_aead_aes256gcm_encrypt_detached_afternm(
        buf, buf + len, NULL, buf, len, NULL, 0, NULL, n,
        (const crypto_aead_aes256gcm_state *)s->state);
  } else {
    nonce(s, n, sizeof n);
    crypto_aead_xchacha20poly1305_ietf_encrypt_detached(
        buf, buf + len, NULL, buf, len, NULL, 0, NULL, n, s->key);
  }
  s->counter++;
  return 0;
}

int proto_open(proto_sealer *s, uint8_t *buf, size_t len, size_t *plain_len) {
  uint8_t n[crypto_aead_xchacha20poly1305_ietf_NPUBBYTES];
  int rc;
  if (len < PROTO_TAG_BYTES || s->counter == UINT64_MAX)
    return BEE_EAUTH;
  size_t m = len - PROTO_TAG_BYTES;
  if (s->cipher == PROTO_CIPHER_AES256GCM) {
    nonce(s, n, crypto_aead_aes256gcm_NPUBBYTES);
    rc = crypto_aead_aes256gcm_decrypt_detached_afternm(
        buf, NULL, buf, m, buf + m, NULL, 0, n,
        (const crypto_aead_aes256gcm_state *)s->state);
  } else {
    nonce(s, n, sizeof n);
    rc = crypto_aead_xchacha20poly1305_ietf_decrypt_detached(
        buf, NULL, buf, m, buf + m, NULL, 0, n, s->key);
  }
  if (rc != 0)
    return BEE_EAUTH;
  s->counter++;
  *plain_len = m;
  return 0;
}

void proto_sealer_clear(proto_sealer *s) { sodium_memzero(s, sizeof *s); }
