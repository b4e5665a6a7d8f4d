/* fuzz-groupmsg.c: libFuzzer target for the matchmaking payloads.
 *
 * Whatever proto_group_decode accepts must encode again, within
 * proto_group_encoded_max and never longer than the input (the encoder
 * writes minimal widths), decode to the same message field by field (a
 * BEGIN's members too, doubles by their bits), and encode once more to
 * the very same bytes.  A refusal must leave the message all zero.
 */
#include "proto.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static proto_group_member members[PROTO_GROUP_MEMBERS_MAX];
static proto_group_member again_members[PROTO_GROUP_MEMBERS_MAX];

static bool f64_eq(double a, double b) { return memcmp(&a, &b, sizeof a) == 0; }

static bool member_eq(const proto_group_member *a,
                      const proto_group_member *b) {
  return memcmp(a->id, b->id, sizeof a->id) == 0 &&
         strcmp(a->addr, b->addr) == 0 && a->mode == b->mode &&
         f64_eq(a->bandwidth_mbit, b->bandwidth_mbit) &&
         f64_eq(a->weight, b->weight);
}

static bool info_eq(const proto_match *a, const proto_match *b) {
  return strcmp(a->run, b->run) == 0 && a->round == b->round &&
         strcmp(a->bits, b->bits) == 0 && strcmp(a->addr, b->addr) == 0 &&
         memcmp(a->schema_hash, b->schema_hash, sizeof a->schema_hash) == 0 &&
         a->mode == b->mode && f64_eq(a->bandwidth_mbit, b->bandwidth_mbit) &&
         f64_eq(a->weight, b->weight);
}

static bool msg_eq(const proto_group_msg *a, const proto_group_msg *b) {
  if (a->type != b->type || a->nonce != b->nonce ||
      a->expiration != b->expiration || !info_eq(&a->info, &b->info) ||
      a->code != b->code || a->has_leader != b->has_leader ||
      memcmp(a->leader, b->leader, sizeof a->leader) != 0 ||
      strcmp(a->leader_addr, b->leader_addr) != 0 ||
      memcmp(a->group, b->group, sizeof a->group) != 0 ||
      a->round != b->round || a->nmembers != b->nmembers)
    return false;
  for (size_t i = 0; i < a->nmembers; i++)
    if (!member_eq(&a->members[i], &b->members[i]))
      return false;
  return true;
}

static bool all_zero(const proto_group_msg *m) {
  static const proto_group_msg zero;
  return memcmp(m, &zero, sizeof *m) == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  proto_group_msg m, again;
  size_t len, len2;
  memset(&m, 0xa5, sizeof m);
  if (proto_group_decode(data, size, &m, members, PROTO_GROUP_MEMBERS_MAX) !=
      0) {
    if (!all_zero(&m))
      abort();
    return 0;
  }
  if (m.type == PROTO_T_AVG_BEGIN && (m.members != members || m.nmembers == 0 ||
                                      m.nmembers > PROTO_GROUP_MEMBERS_MAX))
    abort();
  size_t cap = proto_group_encoded_max(&m);
  uint8_t *buf = malloc(cap), *buf2 = malloc(cap);
  if (!buf || !buf2)
    abort();
  if (proto_group_encode(&m, buf, cap, &len) != 0 || len > cap || len > size)
    abort();
  if (proto_group_decode(buf, len, &again, again_members,
                         PROTO_GROUP_MEMBERS_MAX) != 0 ||
      !msg_eq(&m, &again))
    abort();
  if (proto_group_encode(&again, buf2, cap, &len2) != 0 || len2 != len ||
      memcmp(buf, buf2, len) != 0)
    abort();
  free(buf2);
  free(buf);
  return 0;
}
