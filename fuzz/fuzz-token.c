/* fuzz-token.c: libFuzzer target for the access token and revocation list
 * decoders (proto/token.c).
 *
 * The same input goes to both.  The moderator is a fixed dummy key pair
 * made from a constant seed, so the seed corpus can hold a token and a
 * list it really signed: those reach verification and the success paths,
 * while mutants mostly stop at the signature.  A list that decoded is
 * released with proto_revocation_close; one that failed must hold nothing,
 * or LeakSanitizer reports it.
 */
#include "proto.h"

#include <sodium.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Shared with the corpus generator described in fuzz/README.md. */
#define FUZZ_MODERATOR_SEED "beed fuzz moderator: not secret"
#define FUZZ_SWARM "fuzz"
#define FUZZ_NOW 1700000000u
_Static_assert(sizeof FUZZ_MODERATOR_SEED == crypto_sign_SEEDBYTES,
               "the seed is the string with its NUL");

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static uint8_t moderator_pk[PROTO_PK_BYTES];
  static bool ready;
  if (!ready) {
    uint8_t sk[crypto_sign_SECRETKEYBYTES];
    if (sodium_init() < 0)
      return 0;
    crypto_sign_seed_keypair(moderator_pk, sk,
                             (const uint8_t *)FUZZ_MODERATOR_SEED);
    ready = true;
  }
  proto_token tok;
  if (proto_token_decode(data, size, &tok) == 0)
    (void)proto_token_verify(&tok, moderator_pk, FUZZ_SWARM, tok.peer_pk,
                             PROTO_ROLES_ALL, FUZZ_NOW, NULL);
  proto_revocation rl;
  proto_revocation_init(&rl);
  if (proto_revocation_decode(data, size, moderator_pk, FUZZ_SWARM, &rl) == 0) {
    (void)proto_revocation_has(&rl, moderator_pk);
    proto_revocation_close(&rl);
  }
  return 0;
}
