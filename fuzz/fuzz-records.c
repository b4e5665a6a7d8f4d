/* fuzz-records.c: libFuzzer target for the swarm's typed DHT records.
 *
 * Input: one flags byte, then a DHT value.  Each of the five decoders
 * reads the value, and at most one may accept it (their tags differ).
 * Whatever one accepts must encode again, never longer than the input
 * (fields of later versions are dropped, integers take their minimal
 * width), decode to the same struct byte for byte and encode once more to
 * the same bytes.
 *
 * proto_record_check then judges the value as a record whose subkey is
 * owned when flags bit 0 is set (the plain "x" otherwise) and whose key
 * is, with bit 1, the key the value's own fields name (so the success path
 * is reached), else the first bytes of the input.  Its verdict must agree
 * with the decoders: a type it names is the one whose decoder it ran, a
 * refusal is that decoder's code, and a value that decodes passes exactly
 * when the subkey is owned and the key is right.
 */
#include "proto.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define NTYPES 5 /* PROTO_REC_PROGRESS..PROTO_REC_LINKS */

typedef union any {
  proto_progress progress;
  proto_metrics metrics;
  proto_match match;
  proto_donor donor;
  proto_links links;
} any;

static size_t any_size(int type) {
  switch (type) {
  case PROTO_REC_PROGRESS: return sizeof(proto_progress);
  case PROTO_REC_METRICS: return sizeof(proto_metrics);
  case PROTO_REC_MATCH: return sizeof(proto_match);
  case PROTO_REC_LINKS: return sizeof(proto_links);
  default: return sizeof(proto_donor);
  }
}

static int decode(int type, const uint8_t *buf, size_t len, any *out) {
  switch (type) {
  case PROTO_REC_PROGRESS:
    return proto_progress_decode(buf, len, &out->progress);
  case PROTO_REC_METRICS: return proto_metrics_decode(buf, len, &out->metrics);
  case PROTO_REC_MATCH: return proto_match_decode(buf, len, &out->match);
  case PROTO_REC_LINKS: return proto_links_decode(buf, len, &out->links);
  default: return proto_donor_decode(buf, len, &out->donor);
  }
}

static int encode(int type, const any *in, uint8_t *buf, size_t cap,
                  size_t *len) {
  switch (type) {
  case PROTO_REC_PROGRESS:
    return proto_progress_encode(&in->progress, buf, cap, len);
  case PROTO_REC_METRICS:
    return proto_metrics_encode(&in->metrics, buf, cap, len);
  case PROTO_REC_MATCH: return proto_match_encode(&in->match, buf, cap, len);
  case PROTO_REC_LINKS: return proto_links_encode(&in->links, buf, cap, len);
  default: return proto_donor_encode(&in->donor, buf, cap, len);
  }
}

static void key_of(int type, const any *u, uint8_t key[PROTO_DHT_KEY_BYTES]) {
  switch (type) {
  case PROTO_REC_PROGRESS:
    proto_record_key(type, u->progress.run, 0, NULL, key);
    break;
  case PROTO_REC_METRICS:
    proto_record_key(type, u->metrics.run, 0, NULL, key);
    break;
  case PROTO_REC_MATCH:
    proto_record_key(type, u->match.run, u->match.round, u->match.bits, key);
    break;
  case PROTO_REC_LINKS:
    proto_record_key(type, u->links.run, 0, NULL, key);
    break;
  default: proto_record_key(type, u->donor.run, 0, NULL, key); break;
  }
}

/* Re-encodes what type's decoder accepted, and checks the round trip. */
static void roundtrip(int type, const any *u, size_t size) {
  static uint8_t buf[PROTO_LINKS_RECORD_MAX], buf2[PROTO_LINKS_RECORD_MAX];
  size_t len, len2;
  any again;
  if (encode(type, u, buf, sizeof buf, &len) != 0 || len > size)
    abort();
  if (decode(type, buf, len, &again) != 0 ||
      memcmp(&again, u, any_size(type)) != 0)
    abort();
  if (encode(type, &again, buf2, sizeof buf2, &len2) != 0 || len2 != len ||
      memcmp(buf, buf2, len) != 0)
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static const any zero;
  static const uint8_t owned[PROTO_DHT_OWNED_SUBKEY_BYTES] = {
      PROTO_DHT_OWNER_TAG};
  any u[NTYPES + 1];
  int rc[NTYPES + 1], accepted = PROTO_REC_NONE, type;
  if (size < 1)
    return 0;
  uint8_t flags = data[0];
  const uint8_t *value = data + 1;
  size_t n = size - 1;
  for (int t = PROTO_REC_PROGRESS; t <= PROTO_REC_LINKS; t++) {
    memset(&u[t], 0xa5, sizeof u[t]);
    rc[t] = decode(t, value, n, &u[t]);
    if (rc[t] > 0)
      abort();
    if (rc[t] != 0) {
      if (memcmp(&u[t], &zero, any_size(t)) != 0)
        abort(); /* a refused value leaves nothing behind */
      continue;
    }
    if (accepted != PROTO_REC_NONE)
      abort(); /* two decoders took the same value */
    accepted = t;
    roundtrip(t, &u[t], n);
  }

  proto_dht_record r = {.value = {value, n}, .expiration = 1700000000};
  uint8_t want[PROTO_DHT_KEY_BYTES] = {0};
  if (accepted != PROTO_REC_NONE)
    key_of(accepted, &u[accepted], want);
  if (flags & 2)
    memcpy(r.key, want, sizeof r.key);
  else
    memcpy(r.key, data, size < sizeof r.key ? size : sizeof r.key);
  if (flags & 1)
    r.subkey = (proto_bytes){owned, sizeof owned};
  else
    r.subkey = (proto_bytes){(const uint8_t *)"x", 1};
  int got = proto_record_check(&r, &type);
  if (type < PROTO_REC_NONE || type > PROTO_REC_LINKS)
    abort();
  if (type == PROTO_REC_NONE) {
    if (got != 0 || accepted != PROTO_REC_NONE)
      abort(); /* untyped values pass; a typed one is never untyped */
    return 0;
  }
  if (rc[type] != 0) {
    if (got != rc[type])
      abort(); /* the decoder's refusal, as it is */
    return 0;
  }
  bool ok = (flags & 1) && memcmp(r.key, want, sizeof want) == 0;
  if (type != accepted || got != (ok ? 0 : BEE_EAUTH))
    abort();
  return 0;
}
