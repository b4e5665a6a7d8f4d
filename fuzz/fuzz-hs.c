/* fuzz-hs.c: libFuzzer target for the handshake state machine.
 *
 * The input is a sequence of frames, each a 2-byte big-endian length and
 * that many bytes.  The first input byte picks the side we play: a
 * responder fed the frames as if from an initiator, or an initiator that
 * has sent its HELLO and is fed the frames as answers.  Whatever arrives,
 * a step must fail cleanly or proceed; it must never report a session,
 * since the fuzzer cannot forge the peer's signatures.
 */
#include "proto.h"

#include <sodium.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static proto_identity self, moderator;
static proto_token token;
static proto_auth auth;

static void setup(void) {
  uint8_t seed[32];
  if (sodium_init() < 0)
    abort();
  memset(seed, 1, sizeof seed);
  crypto_sign_seed_keypair(moderator.pk, moderator.sk, seed);
  proto_peer_id(moderator.pk, moderator.id);
  memset(seed, 2, sizeof seed);
  crypto_sign_seed_keypair(self.pk, self.sk, seed);
  proto_peer_id(self.pk, self.id);
  if (proto_token_issue(&token, &moderator, "fuzz", self.pk, PROTO_ROLE_BEE,
                        1000, 4000000000u) != 0)
    abort();
  auth = (proto_auth){.id = &self, .token = &token,
                      .moderator_pk = moderator.pk, .swarm = "fuzz",
                      .accept_roles = PROTO_ROLES_ALL,
                      .accept_bulk_roles = PROTO_ROLE_BEE,
                      .ciphers = PROTO_CIPHERS_ALL};
  bee_log_set_level(BEE_LOG_ERROR);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static bool ready;
  uint8_t out[PROTO_HS_OUT_MAX];
  size_t olen;
  bool done = false;
  int remote;
  if (!ready) {
    setup();
    ready = true;
  }
  if (size < 1)
    return 0;
  bool initiator = data[0] & 1;
  data++, size--;
  proto_hs *hs = proto_hs_new(&auth, initiator, PROTO_PURPOSE_CONTROL, 2000);
  if (!hs)
    abort();
  int rc = 0;
  if (initiator)
    rc = proto_hs_step(hs, NULL, 0, out, &olen, &done, &remote);
  while (rc == 0 && size >= 2) {
    size_t n = (size_t)data[0] << 8 | data[1];
    data += 2, size -= 2;
    if (n > size)
      n = size;
    rc = proto_hs_step(hs, data, n, out, &olen, &done, &remote);
    if (olen > PROTO_HS_OUT_MAX || done)
      abort();
    data += n, size -= n;
  }
  proto_hs_free(hs);
  return 0;
}
