/* fuzz-avgmsg.c: libFuzzer target for the averaging round's payloads.
 *
 * Whatever proto_avg_decode accepts must encode again, within
 * proto_avg_encoded_max and never longer than the input (the encoder
 * writes minimal widths), decode to the same message field by field, and
 * encode once more to the very same bytes.  A PART or RESULT with data
 * must also come out the same when built as the averager builds it:
 * proto_avg_header_encode, then the data bytes behind it.  A refusal must
 * leave the message all zero.
 */
#include "proto.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static bool bytes_eq(proto_bytes a, proto_bytes b) {
  return a.n == b.n && (a.n == 0 || memcmp(a.p, b.p, a.n) == 0);
}

static bool msg_eq(const proto_avg_msg *a, const proto_avg_msg *b) {
  return a->type == b->type &&
         memcmp(a->group, b->group, sizeof a->group) == 0 &&
         a->sender == b->sender && a->part == b->part && a->codec == b->codec &&
         memcmp(&a->weight, &b->weight, sizeof a->weight) == 0 &&
         a->contributors == b->contributors && a->has_data == b->has_data &&
         bytes_eq(a->data, b->data) && a->code == b->code &&
         bytes_eq(a->text, b->text);
}

static bool all_zero(const proto_avg_msg *m) {
  static const proto_avg_msg zero;
  return memcmp(m, &zero, sizeof *m) == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  proto_avg_msg m, again;
  size_t len, len2, hlen;
  if (proto_avg_decode(data, size, &m) != 0) {
    if (!all_zero(&m))
      abort();
    return 0;
  }
  size_t cap = proto_avg_encoded_max(&m);
  uint8_t *buf = malloc(cap), *buf2 = malloc(cap);
  if (!buf || !buf2)
    abort();
  if (proto_avg_encode(&m, buf, cap, &len) != 0 || len > cap || len > size)
    abort();
  if (proto_avg_decode(buf, len, &again) != 0 || !msg_eq(&m, &again))
    abort();
  if (proto_avg_encode(&again, buf2, cap, &len2) != 0 || len2 != len ||
      memcmp(buf, buf2, len) != 0)
    abort();
  if (m.type != PROTO_T_AVG_ABORT && m.has_data) {
    /* The header alone, then the data where the averager puts it. */
    if (proto_avg_header_encode(&m, buf2, PROTO_AVG_HDR_MAX, &hlen) != 0 ||
        hlen + m.data.n != len || memcmp(buf2, buf, hlen) != 0 ||
        memcmp(buf + hlen, m.data.p, m.data.n) != 0)
      abort();
  } else if (proto_avg_header_encode(&m, buf2, cap, &hlen) != BEE_ERANGE) {
    abort(); /* only a PART or RESULT with data has a separate header */
  }
  free(buf2);
  free(buf);
  return 0;
}
