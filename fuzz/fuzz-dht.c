/* fuzz-dht.c: libFuzzer target for the DHT payloads.
 *
 * Whatever proto_dht_decode accepts must encode again, within
 * proto_dht_encoded_max and never longer than the input (the encoder
 * writes minimal widths), decode to the same message field by field, and
 * encode once more to the very same bytes.  Owned records go through
 * proto_dht_record_verify, which must return cleanly: the fuzzer cannot
 * forge signatures, but seeds signed by a real key reach its success path.
 */
#include "proto.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Large (fixed arrays): static, off libFuzzer's stack. */
static proto_dht_msg m, again;

static bool bytes_eq(proto_bytes a, proto_bytes b) {
  return a.n == b.n && (a.n == 0 || memcmp(a.p, b.p, a.n) == 0);
}

static bool record_eq(const proto_dht_record *a, const proto_dht_record *b) {
  return memcmp(a->key, b->key, sizeof a->key) == 0 &&
         bytes_eq(a->subkey, b->subkey) && bytes_eq(a->value, b->value) &&
         a->expiration == b->expiration && a->has_sig == b->has_sig &&
         memcmp(a->sig, b->sig, sizeof a->sig) == 0;
}

static bool msg_eq(const proto_dht_msg *a, const proto_dht_msg *b) {
  if (a->type != b->type || a->port != b->port || a->now != b->now ||
      memcmp(a->key, b->key, sizeof a->key) != 0 ||
      a->want_value != b->want_value || a->found != b->found ||
      !bytes_eq(a->observed, b->observed) || a->nrecords != b->nrecords ||
      a->nresults != b->nresults || a->nnodes != b->nnodes)
    return false;
  for (size_t i = 0; i < a->nrecords; i++)
    if (!record_eq(&a->records[i], &b->records[i]))
      return false;
  for (size_t i = 0; i < a->nresults; i++)
    if (a->results[i] != b->results[i])
      return false;
  for (size_t i = 0; i < a->nnodes; i++)
    if (memcmp(a->nodes[i].id, b->nodes[i].id, PROTO_ID_BYTES) != 0 ||
        !bytes_eq(a->nodes[i].addr, b->nodes[i].addr))
      return false;
  return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  size_t len, len2;
  if (proto_dht_decode(data, size, &m) != 0)
    return 0;
  size_t cap = proto_dht_encoded_max(&m);
  uint8_t *buf = malloc(cap), *buf2 = malloc(cap);
  if (!buf || !buf2)
    abort();
  if (proto_dht_encode(&m, buf, cap, &len) != 0 || len > cap || len > size)
    abort();
  if (proto_dht_decode(buf, len, &again) != 0 || !msg_eq(&m, &again))
    abort();
  if (proto_dht_encode(&again, buf2, cap, &len2) != 0 || len2 != len ||
      memcmp(buf, buf2, len) != 0)
    abort();
  for (size_t i = 0; i < m.nrecords; i++) {
    const proto_dht_record *r = &m.records[i];
    if (!proto_dht_subkey_owner(r->subkey, NULL))
      continue;
    int rc = proto_dht_record_verify(r);
    /* The decoded copy carries the same bytes, so the same verdict. */
    if ((rc != 0 && rc != BEE_EAUTH) ||
        proto_dht_record_verify(&again.records[i]) != rc)
      abort();
  }
  free(buf2);
  free(buf);
  return 0;
}
