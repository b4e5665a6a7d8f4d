/* test-proto-seal.c: sealed bodies, checked against libsodium.
 *
 * AES-256-GCM runs on libcrypto; its ciphertext and tag must be exactly
 * libsodium's for the same key and nonce, so the choice of library never
 * shows on the wire.  Sealing from parts must equal sealing the whole,
 * and opening must refuse every altered, replayed or reordered body.
 */
#include "proto-int.h"
#include "test.h"

#include <sodium.h>

#define MAXLEN (1u << 20)

static uint8_t plain[MAXLEN], a[MAXLEN + 16], b[MAXLEN + 16];

/* libsodium's sealing of plain[0..len) with counter nonce ctr. */
static void reference(int cipher, const uint8_t key[32], uint64_t ctr,
                      size_t len, uint8_t *out) {
  uint8_t n[24] = {0};
  size_t nlen = cipher == PROTO_CIPHER_AES256GCM ? 12 : 24;
  for (int i = 0; i < 8; i++)
    n[nlen - 1 - (size_t)i] = (uint8_t)(ctr >> (8 * i));
  if (cipher == PROTO_CIPHER_AES256GCM)
    crypto_aead_aes256gcm_encrypt_detached(out, out + len, NULL, plain, len,
                                           NULL, 0, NULL, n, key);
  else
    crypto_aead_xchacha20poly1305_ietf_encrypt_detached(
        out, out + len, NULL, plain, len, NULL, 0, NULL, n, key);
}

static void check_cipher(int cipher) {
  static const size_t lens[] = {0, 1, 15, 16, 17, 255, 4096, 65537, MAXLEN};
  uint8_t key[32];
  proto_sealer tx, rx, parts;
  size_t plen;
  randombytes_buf(key, sizeof key);
  ASSERT_OK(proto__sealer_init(&tx, cipher, key));
  ASSERT_OK(proto__sealer_init(&rx, cipher, key));
  ASSERT_OK(proto__sealer_init(&parts, cipher, key));
  for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
    size_t len = lens[i];
    uint64_t ctr = tx.counter;
    memcpy(a, plain, len);
    ASSERT_OK(proto_seal(&tx, a, len));
    reference(cipher, key, ctr, len, b);
    ASSERT_MEMEQ(a, b, len + PROTO_TAG_BYTES);
    /* The same body sealed from two parts, not in place. */
    size_t cut = len / 3;
    ASSERT_OK(proto__seal_parts(&parts, b, plain, cut, plain + cut, len - cut));
    ASSERT_MEMEQ(a, b, len + PROTO_TAG_BYTES);
    /* Any flipped bit is refused; the counter does not move. */
    size_t at = len ? (size_t)randombytes_uniform((uint32_t)len + 16) : 3;
    b[at] ^= 0x40;
    ASSERT_RC(proto_open(&rx, b, len + PROTO_TAG_BYTES, &plen), BEE_EAUTH);
    ASSERT_OK(proto_open(&rx, a, len + PROTO_TAG_BYTES, &plen));
    ASSERT_EQ(plen, len);
    ASSERT_MEMEQ(a, plain, len);
  }
  /* Replay of the last body: the receiver expects the next counter. */
  memcpy(a, plain, 64);
  ASSERT_OK(proto_seal(&tx, a, 64));
  memcpy(b, a, 64 + 16);
  ASSERT_OK(proto_open(&rx, a, 80, &plen));
  ASSERT_RC(proto_open(&rx, b, 80, &plen), BEE_EAUTH);
  /* Reordered: the second body first. */
  memcpy(a, plain, 64);
  memcpy(b, plain, 64);
  ASSERT_OK(proto_seal(&tx, a, 64));
  ASSERT_OK(proto_seal(&tx, b, 64));
  ASSERT_RC(proto_open(&rx, b, 80, &plen), BEE_EAUTH);
  ASSERT_OK(proto_open(&rx, a, 80, &plen));
  /* The counter never wraps. */
  tx.counter = UINT64_MAX - 1;
  ASSERT_OK(proto_seal(&tx, a, 8));
  ASSERT_RC(proto_seal(&tx, a, 8), BEE_ELIMIT);
  proto_sealer_clear(&tx);
  proto_sealer_clear(&rx);
  proto_sealer_clear(&parts);
  ASSERT(tx.ctx == NULL && tx.key[0] == 0 && tx.key[31] == 0);
}

int main(void) {
  ASSERT(sodium_init() >= 0);
  randombytes_buf(plain, sizeof plain);
  proto_sealer s;
  uint8_t key[32] = {0};
  ASSERT_RC(proto__sealer_init(&s, 3, key), BEE_ECIPHER);
  check_cipher(PROTO_CIPHER_XCHACHA20POLY1305);
  if (crypto_aead_aes256gcm_is_available())
    check_cipher(PROTO_CIPHER_AES256GCM);
  else
    printf("no AES-NI here: AES-256-GCM cross-check skipped\n");
  printf("seal: all checks passed\n");
  return 0;
}
