/* fuzz-localmsg.c: libFuzzer target for the local trainer protocol's
 * messages (what a trainer process sends beed, and beed it).
 *
 * Whatever proto_local_decode accepts must encode again, never longer
 * than the input, decode to the same message field by field (a HELLO's
 * tensors read back with proto_local_tensor_next, which cannot fail
 * after a decode; doubles compared by their bits) and encode once more
 * to the very same bytes.  A refusal must leave the message all zero.
 */
#include "proto.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static bool same_f64(double a, double b) {
  return memcmp(&a, &b, sizeof a) == 0;
}

static bool tensor_eq(const proto_local_tensor *a,
                      const proto_local_tensor *b) {
  return a->name.n == b->name.n &&
         memcmp(a->name.p, b->name.p, a->name.n) == 0 && a->role == b->role &&
         a->dtype == b->dtype && a->ndim == b->ndim &&
         memcmp(a->dims, b->dims, a->ndim * sizeof a->dims[0]) == 0 &&
         a->elems == b->elems;
}

static bool msg_eq(const proto_local_msg *a, const proto_local_msg *b) {
  return a->type == b->type && strcmp(a->run, b->run) == 0 &&
         a->mode == b->mode && a->batch == b->batch && a->n == b->n &&
         a->epoch == b->epoch && a->loaded == b->loaded &&
         a->target == b->target && a->peers == b->peers &&
         a->inner_steps == b->inner_steps &&
         same_f64(a->outer_lr, b->outer_lr) &&
         same_f64(a->outer_momentum, b->outer_momentum) &&
         a->delayed == b->delayed &&
         strcmp(a->compression, b->compression) == 0 &&
         a->samples == b->samples && same_f64(a->loss, b->loss) &&
         a->apply == b->apply && same_f64(a->accuracy, b->accuracy) &&
         a->code == b->code && strcmp(a->text, b->text) == 0;
}

static bool all_zero(const proto_local_msg *m) {
  static const proto_local_msg zero;
  return memcmp(m, &zero, sizeof *m) == 0;
}

/* The tensors of a decoded HELLO, in an array (NULL for none). */
static proto_local_tensor *tensors_of(const proto_local_msg *m) {
  if (m->type != PROTO_T_LOCAL_HELLO)
    return NULL;
  proto_local_tensor *t = calloc(m->n, sizeof *t);
  if (!t)
    abort();
  proto_bytes it = m->tensors;
  for (size_t i = 0; i < m->n; i++)
    if (proto_local_tensor_next(&it, &t[i]) != 0)
      abort();
  proto_local_tensor more;
  if (proto_local_tensor_next(&it, &more) != 1)
    abort();
  return t;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  proto_local_msg m, again;
  size_t len, len2;
  if (proto_local_decode(data, size, &m) != 0) {
    if (!all_zero(&m))
      abort();
    return 0;
  }
  uint8_t *buf = malloc(size + 1), *buf2 = malloc(size + 1);
  if (!buf || !buf2)
    abort();
  proto_local_tensor *t = tensors_of(&m);
  m.list = t;
  if (proto_local_encode(&m, buf, size + 1, &len) != 0 || len > size)
    abort();
  if (proto_local_decode(buf, len, &again) != 0 || !msg_eq(&m, &again))
    abort();
  proto_local_tensor *t2 = tensors_of(&again);
  for (size_t i = 0; t && i < m.n; i++)
    if (!tensor_eq(&t[i], &t2[i]))
      abort();
  again.list = t2;
  if (proto_local_encode(&again, buf2, size + 1, &len2) != 0 || len2 != len ||
      memcmp(buf, buf2, len) != 0)
    abort();
  free(t);
  free(t2);
  free(buf);
  free(buf2);
  return 0;
}
