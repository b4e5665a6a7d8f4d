/* test-proto-localmsg.c: the local trainer protocol's messages
 * (proto/local-msg.c).
 *
 * Round trips of every message, a HELLO's tensor list read back in order
 * (names, roles, dimensions, element counts), the largest HELLO the
 * limits allow; and every refusal: a tensor list that is empty, too long
 * or without a parameter; a name empty, too long or with a space; a role
 * or type unknown; a dimension 0; too many dimensions; elements past the
 * limit in one tensor or all; batch 0; an accuracy over 1 or NaN; an
 * outer rate NaN or momentum below 0; a REFUSED code that is no error; a frame over the
 * limit; a truncated message (every prefix) and trailing bytes.  And
 * the difference two tensor lists name first (a shape, a name, a role,
 * a count).
 */
#include "proto.h"
#include "test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint8_t buf[PROTO_LOCAL_FRAME_MAX + 64];

static proto_local_tensor tensor(const char *name, int role, unsigned ndim,
                                 const uint64_t *dims) {
  proto_local_tensor t = {.name = {(const uint8_t *)name, strlen(name)},
                          .role = role,
                          .dtype = PROTO_LOCAL_F32,
                          .ndim = ndim,
                          .elems = 1};
  for (unsigned i = 0; i < ndim; i++) {
    if (i < PROTO_LOCAL_DIMS_MAX) /* more: refused by ndim alone */
      t.dims[i] = dims[i];
    t.elems *= dims[i];
  }
  return t;
}

/* Encodes m, decodes it back into d, and checks every prefix fails. */
static size_t roundtrip(const proto_local_msg *m, proto_local_msg *d) {
  size_t len;
  ASSERT_OK(proto_local_encode(m, buf, sizeof buf, &len));
  ASSERT_OK(proto_local_decode(buf, len, d));
  ASSERT_EQ(d->type, m->type);
  proto_local_msg z;
  for (size_t n = 0; n < len; n += 1 + n / 64) {
    ASSERT(proto_local_decode(buf, n, &z) != 0);
    ASSERT_EQ(z.type, 0);
  }
  buf[len] = 0xc0;
  ASSERT_RC(proto_local_decode(buf, len + 1, &z), BEE_ETRAILING);
  return len;
}

static void test_hello(void) {
  const uint64_t w[] = {64, 1, 3, 3}, b[] = {64}, none[1] = {0};
  proto_local_tensor list[] = {
      tensor("conv1.weight", PROTO_LOCAL_PARAM, 4, w),
      tensor("conv1.bias", PROTO_LOCAL_PARAM, 1, b),
      tensor("state.0.exp_avg", PROTO_LOCAL_STATE, 4, w),
      tensor("state.0.step", PROTO_LOCAL_STATE, 0, none),
      tensor("bn.running_mean", PROTO_LOCAL_BUFFER, 1, b),
  };
  proto_local_msg m = {.type = PROTO_T_LOCAL_HELLO,
                       .mode = PROTO_LOCAL_DILOCO,
                       .batch = 64,
                       .list = list,
                       .n = 5},
                  d;
  snprintf(m.run, sizeof m.run, "lab-1");
  roundtrip(&m, &d);
  ASSERT_STREQ(d.run, "lab-1");
  ASSERT_EQ(d.mode, PROTO_LOCAL_DILOCO);
  ASSERT_UEQ(d.batch, 64);
  ASSERT_UEQ(d.n, 5);
  ASSERT(d.list == NULL);
  proto_bytes it = d.tensors;
  proto_local_tensor t;
  for (size_t i = 0; i < 5; i++) {
    ASSERT_OK(proto_local_tensor_next(&it, &t));
    ASSERT_UEQ(t.name.n, list[i].name.n);
    ASSERT_MEMEQ(t.name.p, list[i].name.p, t.name.n);
    ASSERT(t.name.p >= buf && t.name.p < buf + sizeof buf); /* a view */
    ASSERT_EQ(t.role, list[i].role);
    ASSERT_EQ(t.dtype, PROTO_LOCAL_F32);
    ASSERT_UEQ(t.ndim, list[i].ndim);
    ASSERT_MEMEQ(t.dims, list[i].dims, t.ndim * sizeof t.dims[0]);
    ASSERT_UEQ(t.elems, list[i].elems);
  }
  ASSERT_UEQ(t.elems, 64);
  ASSERT_EQ(proto_local_tensor_next(&it, &t), 1);
  ASSERT_UEQ(d.tensors.n > 0, 1);

  /* The limits: PROTO_LOCAL_TENSORS_MAX tensors of the longest name and
   * the most dimensions fit in a frame; the elements add up to the most
   * allowed. */
  static proto_local_tensor many[PROTO_LOCAL_TENSORS_MAX + 1];
  static char names[PROTO_LOCAL_TENSORS_MAX + 1][PROTO_LOCAL_NAME_MAX + 1];
  uint64_t dims[PROTO_LOCAL_DIMS_MAX] = {2, 2, 2, 2, 2, 2, 2, 2};
  for (size_t i = 0; i <= PROTO_LOCAL_TENSORS_MAX; i++) {
    memset(names[i], 'a' + (int)(i % 26), PROTO_LOCAL_NAME_MAX);
    snprintf(names[i], 12, "t%zu.", i);
    names[i][strlen(names[i])] = 'x';
    many[i] = tensor(names[i], i % 3, PROTO_LOCAL_DIMS_MAX, dims);
  }
  ASSERT_UEQ(strlen(names[0]), PROTO_LOCAL_NAME_MAX);
  m.list = many, m.n = PROTO_LOCAL_TENSORS_MAX;
  size_t len = roundtrip(&m, &d);
  printf("largest HELLO: %zu bytes of %u\n", len, PROTO_LOCAL_FRAME_MAX);
  ASSERT_UEQ(d.n, PROTO_LOCAL_TENSORS_MAX);
  it = d.tensors;
  size_t k = 0;
  while (proto_local_tensor_next(&it, &t) == 0)
    k++;
  ASSERT_UEQ(k, PROTO_LOCAL_TENSORS_MAX);
  m.n = PROTO_LOCAL_TENSORS_MAX + 1;
  ASSERT_RC(proto_local_encode(&m, buf, sizeof buf, &len), BEE_ERANGE);
  uint64_t half[] = {PROTO_LOCAL_ELEMS_MAX / 2};
  proto_local_tensor big[] = {tensor("a", PROTO_LOCAL_PARAM, 1, half),
                              tensor("b", PROTO_LOCAL_STATE, 1, half)};
  m.list = big, m.n = 2;
  roundtrip(&m, &d);
}

static void test_others(void) {
  proto_local_msg m, d;
  m = (proto_local_msg){.type = PROTO_T_LOCAL_WELCOME,
                        .epoch = 17,
                        .loaded = true,
                        .mode = PROTO_LOCAL_GRADIENTS,
                        .target = 32768,
                        .peers = 3,
                        .inner_steps = 500,
                        .outer_lr = 0.7,
                        .outer_momentum = 0.9,
                        .delayed = true,
                        .compression = "b8"};
  roundtrip(&m, &d);
  ASSERT(d.delayed);
  ASSERT_STREQ(d.compression, "b8");
  ASSERT_UEQ(d.inner_steps, 500);
  ASSERT(d.outer_lr == 0.7 && d.outer_momentum == 0.9);
  ASSERT_UEQ(d.epoch, 17);
  ASSERT(d.loaded);
  ASSERT_UEQ(d.target, 32768);
  ASSERT_UEQ(d.peers, 3);
  m = (proto_local_msg){
      .type = PROTO_T_LOCAL_BATCH, .samples = 64, .loss = 2.302585};
  roundtrip(&m, &d);
  ASSERT_UEQ(d.samples, 64);
  ASSERT(d.loss == 2.302585);
  m.loss = NAN; /* a trainer's loss as it is: beed says what it makes of it */
  roundtrip(&m, &d);
  ASSERT(isnan(d.loss));
  m = (proto_local_msg){
      .type = PROTO_T_LOCAL_GO, .epoch = UINT64_MAX, .samples = 9, .peers = 4};
  roundtrip(&m, &d);
  ASSERT_UEQ(d.epoch, UINT64_MAX);
  ASSERT_UEQ(d.samples, 9);
  m = (proto_local_msg){.type = PROTO_T_LOCAL_STEP, .epoch = 5, .apply = true};
  roundtrip(&m, &d);
  ASSERT(d.apply);
  m.apply = false;
  roundtrip(&m, &d);
  ASSERT(!d.apply);
  m = (proto_local_msg){.type = PROTO_T_LOCAL_STEPPED, .epoch = 6};
  roundtrip(&m, &d);
  ASSERT_UEQ(d.epoch, 6);
  m = (proto_local_msg){.type = PROTO_T_LOCAL_LOADED, .epoch = 7};
  roundtrip(&m, &d);
  ASSERT_UEQ(d.epoch, 7);
  m = (proto_local_msg){.type = PROTO_T_LOCAL_BYE};
  ASSERT_UEQ(roundtrip(&m, &d), 3);
  m = (proto_local_msg){.type = PROTO_T_LOCAL_REFUSED, .code = BEE_ERANGE};
  snprintf(m.text, sizeof m.text,
           "tensor 3 (fc.weight) is [10, 128] here "
           "and [10, 64] in the swarm");
  roundtrip(&m, &d);
  ASSERT_EQ(d.code, BEE_ERANGE);
  ASSERT_STREQ(d.text, m.text);
  m = (proto_local_msg){
      .type = PROTO_T_LOCAL_EVAL, .epoch = 8, .loss = 0.4, .accuracy = 1};
  roundtrip(&m, &d);
  ASSERT(d.accuracy == 1 && d.loss == 0.4);
}

static void test_refused(void) {
  size_t len;
  const uint64_t one[] = {1}, zero[] = {0},
                 nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  proto_local_tensor t = tensor("w", PROTO_LOCAL_PARAM, 1, one);
  proto_local_msg m = {
      .type = PROTO_T_LOCAL_HELLO, .batch = 1, .list = &t, .n = 1};
  snprintf(m.run, sizeof m.run, "r");
  ASSERT_OK(proto_local_encode(&m, buf, sizeof buf, &len));
  m.batch = 0;
  ASSERT_RC(proto_local_encode(&m, buf, sizeof buf, &len), BEE_ERANGE);
  m.batch = 1, m.mode = 2;
  ASSERT_RC(proto_local_encode(&m, buf, sizeof buf, &len), BEE_ERANGE);
  m.mode = 0, m.n = 0;
  ASSERT_RC(proto_local_encode(&m, buf, sizeof buf, &len), BEE_ERANGE);
  m.n = 1;
  snprintf(m.run, sizeof m.run, "a b");
  ASSERT_RC(proto_local_encode(&m, buf, sizeof buf, &len), BEE_ERANGE);
  snprintf(m.run, sizeof m.run, "r");
  struct {
    proto_local_tensor t;
    const char *why;
  } bad[] = {
      {tensor("", PROTO_LOCAL_PARAM, 1, one), "an empty name"},
      {tensor("a b", PROTO_LOCAL_PARAM, 1, one), "a space"},
      {tensor("w", PROTO_LOCAL_STATE, 1, one), "no parameter"},
      {tensor("w", 3, 1, one), "role 3"},
      {tensor("w", PROTO_LOCAL_PARAM, 1, zero), "a dimension 0"},
      {tensor("w", PROTO_LOCAL_PARAM, 9, nine), "nine dimensions"},
  };
  static char longname[PROTO_LOCAL_NAME_MAX + 2];
  memset(longname, 'n', PROTO_LOCAL_NAME_MAX + 1);
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    printf("refused: %s\n", bad[i].why);
    m.list = &bad[i].t;
    ASSERT_RC(proto_local_encode(&m, buf, sizeof buf, &len), BEE_ERANGE);
  }
  proto_local_tensor l = tensor(longname, PROTO_LOCAL_PARAM, 1, one);
  m.list = &l;
  ASSERT_RC(proto_local_encode(&m, buf, sizeof buf, &len), BEE_ERANGE);
  proto_local_tensor f = tensor("w", PROTO_LOCAL_PARAM, 1, one);
  f.dtype = 1;
  m.list = &f;
  ASSERT_RC(proto_local_encode(&m, buf, sizeof buf, &len), BEE_ERANGE);
  f.dtype = PROTO_LOCAL_F32, f.elems = 2; /* not the dimensions' product */
  ASSERT_RC(proto_local_encode(&m, buf, sizeof buf, &len), BEE_ERANGE);
  uint64_t huge[] = {1ull << 20, 1ull << 20, 1ull << 20};
  proto_local_tensor h = tensor("w", PROTO_LOCAL_PARAM, 3, huge);
  h.elems = 0; /* what elems_of gives: past the limit */
  m.list = &h;
  ASSERT_RC(proto_local_encode(&m, buf, sizeof buf, &len), BEE_ERANGE);
  uint64_t most[] = {PROTO_LOCAL_ELEMS_MAX};
  proto_local_tensor two[] = {tensor("a", PROTO_LOCAL_PARAM, 1, most),
                              tensor("b", PROTO_LOCAL_PARAM, 1, one)};
  m.list = two, m.n = 2;
  ASSERT_RC(proto_local_encode(&m, buf, sizeof buf, &len), BEE_ERANGE);
  m.n = 1;
  ASSERT_OK(proto_local_encode(&m, buf, sizeof buf, &len));
  ASSERT_RC(proto_local_encode(&m, buf, len - 1, &len), BEE_ETOOBIG);

  proto_local_msg e = {.type = PROTO_T_LOCAL_EVAL, .accuracy = 1.5};
  ASSERT_RC(proto_local_encode(&e, buf, sizeof buf, &len), BEE_ERANGE);
  e.accuracy = NAN;
  ASSERT_RC(proto_local_encode(&e, buf, sizeof buf, &len), BEE_ERANGE);
  proto_local_msg w = {
      .type = PROTO_T_LOCAL_WELCOME, .outer_lr = NAN, .compression = "none"};
  ASSERT_RC(proto_local_encode(&w, buf, sizeof buf, &len), BEE_ERANGE);
  w.outer_lr = 0, w.outer_momentum = -0.5;
  ASSERT_RC(proto_local_encode(&w, buf, sizeof buf, &len), BEE_ERANGE);
  /* a delayed step is gradient averaging's */
  w.outer_momentum = 0.9, w.mode = PROTO_LOCAL_DILOCO, w.delayed = true;
  ASSERT_RC(proto_local_encode(&w, buf, sizeof buf, &len), BEE_ERANGE);
  w.mode = PROTO_LOCAL_GRADIENTS;
  ASSERT_OK(proto_local_encode(&w, buf, sizeof buf, &len));
  /* the codec's name: one word of printable bytes */
  snprintf(w.compression, sizeof w.compression, "b 8");
  ASSERT_RC(proto_local_encode(&w, buf, sizeof buf, &len), BEE_ERANGE);
  w.compression[0] = 0;
  ASSERT_RC(proto_local_encode(&w, buf, sizeof buf, &len), BEE_ERANGE);
  proto_local_msg r = {.type = PROTO_T_LOCAL_REFUSED, .code = 0};
  ASSERT_RC(proto_local_encode(&r, buf, sizeof buf, &len), BEE_ERANGE);
  proto_local_msg b = {.type = PROTO_T_LOCAL_BATCH, .samples = 0};
  ASSERT_RC(proto_local_encode(&b, buf, sizeof buf, &len), BEE_ERANGE);
  proto_local_msg o = {.type = PROTO_T_STATE_REQ};
  ASSERT_RC(proto_local_encode(&o, buf, sizeof buf, &len), BEE_EUNKNOWN);

  /* Hand-made: [1, 82, 0, 0.5] (no samples), [1, 82, 1] (a field
   * short), [1, 90] (another type), [1, 87, nil] (a field too many),
   * [1, 80, "r", 0, 1, [["w", 0, 0, [0]]]] (a dimension 0), the same
   * with the batch 0, and [1, 88, -9, "a\0b"] (a NUL in the text). */
  proto_local_msg d;
  const uint8_t nos[] = {0x94, 1, 82, 0, 0xcb, 0x3f, 0xe0, 0, 0, 0, 0, 0, 0};
  ASSERT_RC(proto_local_decode(nos, sizeof nos, &d), BEE_ERANGE);
  ASSERT_EQ(d.type, 0);
  const uint8_t shrt[] = {0x93, 1, 82, 1};
  ASSERT_RC(proto_local_decode(shrt, sizeof shrt, &d), BEE_EMISSING);
  const uint8_t other[] = {0x92, 1, 90};
  ASSERT_RC(proto_local_decode(other, sizeof other, &d), BEE_EUNKNOWN);
  const uint8_t more[] = {0x93, 1, 87, 0xc0};
  ASSERT_RC(proto_local_decode(more, sizeof more, &d), BEE_ETYPE);
  const uint8_t dim0[] = {0x96, 1,    80,  0xa1, 'r', 0,    1, 0x91,
                          0x94, 0xa1, 'w', 0,    0,   0x91, 0};
  ASSERT_RC(proto_local_decode(dim0, sizeof dim0, &d), BEE_ERANGE);
  const uint8_t dim1[] = {0x96, 1,    80,  0xa1, 'r', 0,    1, 0x91,
                          0x94, 0xa1, 'w', 0,    0,   0x91, 1};
  ASSERT_OK(proto_local_decode(dim1, sizeof dim1, &d));
  const uint8_t batch0[] = {0x96, 1,    80,  0xa1, 'r', 0,    0, 0x91,
                            0x94, 0xa1, 'w', 0,    0,   0x91, 1};
  ASSERT_RC(proto_local_decode(batch0, sizeof batch0, &d), BEE_ERANGE);
  ASSERT_EQ(d.type, 0);
  const uint8_t nul[] = {0x94, 1, 88, 0xf7, 0xa3, 'a', 0, 'b'};
  ASSERT_RC(proto_local_decode(nul, sizeof nul, &d), BEE_ERANGE);
  /* Over the frame limit, whatever it holds. */
  ASSERT_RC(proto_local_decode(buf, PROTO_LOCAL_FRAME_MAX + 1, &d),
            BEE_ETOOBIG);
}

/* HELLO of list[0..n), encoded into b and decoded into *m. */
static void hello_of(const proto_local_tensor *list, size_t n, uint8_t *b,
                     size_t cap, proto_local_msg *m) {
  proto_local_msg h = {
      .type = PROTO_T_LOCAL_HELLO, .batch = 1, .list = list, .n = n};
  snprintf(h.run, sizeof h.run, "r");
  size_t len;
  ASSERT_OK(proto_local_encode(&h, b, cap, &len));
  ASSERT_OK(proto_local_decode(b, len, m));
}

static void test_diff(void) {
  static uint8_t ba[4096], bb[4096];
  const uint64_t w[] = {10, 128}, w2[] = {10, 64}, b10[] = {10};
  proto_local_tensor ours[] = {tensor("fc.weight", PROTO_LOCAL_PARAM, 2, w),
                               tensor("fc.bias", PROTO_LOCAL_PARAM, 1, b10),
                               tensor("state.0.m", PROTO_LOCAL_STATE, 2, w)};
  proto_local_tensor theirs[3];
  memcpy(theirs, ours, sizeof ours);
  proto_local_msg a, b;
  char why[256];
  hello_of(ours, 3, ba, sizeof ba, &a);
  hello_of(theirs, 3, bb, sizeof bb, &b);
  ASSERT_EQ(proto_local_tensors_diff(&a, &b, why, sizeof why), 0);
  struct {
    proto_local_tensor t;
    size_t at;
    const char *want;
  } cases[] = {
      {tensor("fc.weight", PROTO_LOCAL_PARAM, 2, w2), 0,
       "tensor 0 (fc.weight) is [10, 128] here and [10, 64] in the swarm"},
      {tensor("fc.b", PROTO_LOCAL_PARAM, 1, b10), 1,
       "tensor 1 is fc.bias here and fc.b in the swarm"},
      {tensor("state.0.m", PROTO_LOCAL_BUFFER, 2, w), 2,
       "tensor 2 (state.0.m) is optimizer state here and a buffer in the "
       "swarm"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    memcpy(theirs, ours, sizeof ours);
    theirs[cases[i].at] = cases[i].t;
    hello_of(theirs, 3, bb, sizeof bb, &b);
    ASSERT_EQ(proto_local_tensors_diff(&a, &b, why, sizeof why), 1);
    printf("diff: %s\n", why);
    ASSERT_STREQ(why, cases[i].want);
  }
  memcpy(theirs, ours, sizeof ours);
  hello_of(theirs, 2, bb, sizeof bb, &b);
  ASSERT_EQ(proto_local_tensors_diff(&a, &b, why, sizeof why), 1);
  ASSERT_STREQ(why, "3 tensors here, 2 in the swarm (the first not there: "
                    "state.0.m)");
  ASSERT_EQ(proto_local_tensors_diff(&b, &a, why, sizeof why), 1);
  ASSERT_STREQ(why, "2 tensors here, 3 in the swarm (the first not here: "
                    "state.0.m)");
}

int main(void) {
  test_diff();
  test_hello();
  test_others();
  test_refused();
  printf("ok\n");
  return 0;
}
