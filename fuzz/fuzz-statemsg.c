/* fuzz-statemsg.c: libFuzzer target for the state download's payloads.
 *
 * Whatever proto_state_decode accepts (a REQUEST or a CHUNK) must encode
 * again, never longer than the input (the encoder writes minimal widths),
 * decode to the same message field by field, and encode once more to the
 * very same bytes.  A refusal must leave the message all zero.
 */
#include "proto.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static bool msg_eq(const proto_state_msg *a, const proto_state_msg *b) {
  return a->type == b->type && strcmp(a->run, b->run) == 0 &&
         a->offset == b->offset && a->len == b->len && a->epoch == b->epoch &&
         a->total == b->total &&
         memcmp(a->checksum, b->checksum, sizeof a->checksum) == 0 &&
         a->data.n == b->data.n &&
         (a->data.n == 0 || memcmp(a->data.p, b->data.p, a->data.n) == 0);
}

static bool all_zero(const proto_state_msg *m) {
  static const proto_state_msg zero;
  return memcmp(m, &zero, sizeof *m) == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  proto_state_msg m, again;
  size_t len, len2;
  if (proto_state_decode(data, size, &m) != 0) {
    if (!all_zero(&m))
      abort();
    return 0;
  }
  uint8_t *buf = malloc(size + 1), *buf2 = malloc(size + 1);
  if (!buf || !buf2)
    abort();
  if (proto_state_encode(&m, buf, size + 1, &len) != 0 || len > size)
    abort();
  if (proto_state_decode(buf, len, &again) != 0 || !msg_eq(&m, &again))
    abort();
  if (proto_state_encode(&again, buf2, size + 1, &len2) != 0 || len2 != len ||
      memcmp(buf, buf2, len) != 0)
    abort();
  free(buf);
  free(buf2);
  return 0;
}
