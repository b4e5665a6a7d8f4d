/* fuzz-msg.c: libFuzzer target for the envelope decoder.
 *
 * Whatever proto_msg_decode accepts must encode again and decode to the
 * same message: a decoder that accepts what the encoder cannot write, or
 * an encoder that writes what the decoder reads differently, aborts.  A
 * STREAM_CHUNK is also rebuilt with proto_chunk_header_encode, which must
 * give the very bytes proto_msg_encode gave.
 */
#include "proto.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static bool bytes_eq(proto_bytes a, proto_bytes b) {
  return a.n == b.n && (a.n == 0 || memcmp(a.p, b.p, a.n) == 0);
}

static bool msg_eq(const proto_msg *a, const proto_msg *b) {
  return a->type == b->type && a->id == b->id && a->code == b->code &&
         a->offset == b->offset && bytes_eq(a->name, b->name) &&
         bytes_eq(a->payload, b->payload);
}

/* The chunk header followed by the data must be exactly enc[0..len). */
static void check_chunk(const proto_msg *m, const uint8_t *enc, size_t len) {
  uint8_t hdr[32];
  size_t n;
  if (proto_chunk_header_encode(m->id, m->offset, m->payload.n, hdr, sizeof hdr,
                                &n) != 0)
    abort();
  if (n + m->payload.n != len || memcmp(hdr, enc, n) != 0 ||
      (m->payload.n && memcmp(m->payload.p, enc + n, m->payload.n) != 0))
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  proto_msg m, again;
  size_t len;
  if (proto_msg_decode(data, size, &m) != 0)
    return 0;
  size_t cap = proto_msg_encoded_max(&m);
  uint8_t *buf = malloc(cap);
  if (!buf)
    abort();
  /* The encoder writes minimal widths, so never more than it read. */
  if (proto_msg_encode(&m, buf, cap, &len) != 0 || len > size)
    abort();
  if (proto_msg_decode(buf, len, &again) != 0 || !msg_eq(&m, &again))
    abort();
  if (m.type == PROTO_T_STREAM_CHUNK)
    check_chunk(&again, buf, len);
  free(buf);
  return 0;
}
