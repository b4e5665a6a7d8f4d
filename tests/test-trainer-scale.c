/* test-trainer-scale.c: loss scaling (trn_model_config's loss_scale) on
 * the CPU, where the same bookkeeping runs as on CUDA with fp16.
 *
 * - A power-of-two scale changes no bits where nothing overflows: mlp,
 *   cnn (batch norm, dropout), resnet-8 and gpt with the loss scaled by
 *   2^10 give the unscaled model's gradients, losses and batch-norm
 *   statistics bit for bit after one pass, and within rounding after a
 *   second pass added to the first.
 * - A pass whose scaled gradients overflow adds nothing: at 2^127 a
 *   one-sample batch of tiny pixels passes and gives the unscaled
 *   gradients; a batch of 8 large ones then overflows, is reported
 *   (trn_model_skipped, the count) and leaves the gradients as they were.
 * - Dynamic scaling halves at each overflow until a pass is clean, and
 *   that pass gives the unscaled gradients; it doubles after `interval`
 *   clean passes, not past 2^24; a fixed scale never moves.
 * - Bad settings are refused with a message: a scale that is not a power
 *   of two, out of range, a NaN; an unknown precision.  fp16 on the CPU
 *   scales nothing unless asked.  trn_loss_scale_parse takes and refuses
 *   the specs beed's --loss-scale does (loss-scale-cases.h).
 */
#include "loss-scale-cases.h"
#include "test.h"
#include "trainer.h"

#include <errno.h>
#include <math.h>

enum { B = 8 };
static char err[512];

static trn_model *make(const trn_model_config *base, float scale, bool fixed,
                       unsigned interval) {
  trn_model_config c = *base;
  c.loss_scale = scale;
  c.loss_scale_fixed = fixed;
  c.loss_scale_interval = interval;
  trn_model *m;
  if (trn_model_new(&c, &m, err, sizeof err))
    FAIL("%s: %s", c.name, err);
  return m;
}

/* Pixels or tokens for batch k of model m (b items). */
static void batch(const trn_model *m, bool tokens, unsigned k, size_t b,
                  float *x, int32_t *tok, int32_t *y, size_t T) {
  uint32_t r = 7 + 1000 * k;
  size_t V = trn_model_classes(m);
  if (tokens) {
    for (size_t i = 0; i < b * T; i++) {
      tok[i] = (int32_t)((r = r * 1103515245u + 12345u) >> 16) % (int32_t)V;
      y[i] = (int32_t)((r = r * 1103515245u + 12345u) >> 16) % (int32_t)V;
    }
    return;
  }
  size_t in = trn_model_inputs(m);
  for (size_t i = 0; i < b * in; i++)
    x[i] = (float)((r = r * 1103515245u + 12345u) >> 8) / 16777216.0f * 2 - 1;
  for (size_t i = 0; i < b; i++)
    y[i] = (int32_t)(i * 3 + k) % (int32_t)V;
}

static void pass(trn_model *m, bool tokens, const float *x, const int32_t *tok,
                 const int32_t *y, size_t b, size_t T, double *loss) {
  if (tokens)
    ASSERT_EQ(trn_model_train_tokens(m, tok, y, b, T, loss), 0);
  else
    ASSERT_EQ(trn_model_train_batch(m, x, y, b, loss), 0);
}

/* The largest |a - b| over n floats, relative to the largest |a|. */
static double rel_diff(const float *a, const float *b, size_t n) {
  double d = 0, big = 0;
  for (size_t i = 0; i < n; i++) {
    d = fmax(d, fabs((double)a[i] - b[i]));
    big = fmax(big, fabs((double)a[i]));
  }
  return big > 0 ? d / big : d;
}

/* The same model with and without the loss scaled by 2^10. */
static void same_bits(const char *what, const trn_model_config *c) {
  bool tokens = strcmp(c->name, "gpt") == 0;
  size_t T = tokens ? c->ctx : 0;
  trn_model *a = make(c, 0, false, 0), *s = make(c, 1024.0f, false, 0);
  ASSERT(trn_model_loss_scale(a, NULL) == 0);
  ASSERT(trn_model_loss_scale(s, NULL) == 1024.0f);
  size_t n = trn_model_nparams(a), in = tokens ? T : trn_model_inputs(a);
  float *x = malloc(B * in * sizeof *x);
  int32_t *tok = malloc(B * in * sizeof *tok), *y = malloc(B * in * sizeof *y);
  float *ga = malloc(n * sizeof *ga);
  ASSERT(x && tok && y && ga);
  for (unsigned k = 0; k < 2; k++) {
    double la, ls;
    batch(a, tokens, k, B, x, tok, y, T);
    pass(a, tokens, x, tok, y, B, T, &la);
    pass(s, tokens, x, tok, y, B, T, &ls);
    ASSERT(!trn_model_skipped(s));
    if (la != ls)
      FAIL("%s, pass %u: loss %.17g scaled, %.17g not", what, k, ls, la);
    memcpy(ga, trn_model_grads(a), n * sizeof *ga);
    const float *gs = trn_model_grads(s);
    if (k == 0 && memcmp(ga, gs, n * sizeof *ga) != 0)
      FAIL("%s: one pass's gradients differ from the unscaled ones by %.3g "
           "of the largest",
           what, rel_diff(ga, gs, n));
    /* A second pass adds its unscaled sum to the first in one rounding;
     * unscaled, the products add into the first as they go. */
    double d = rel_diff(ga, gs, n);
    if (d > 1e-6)
      FAIL("%s: two passes' gradients %.3g apart", what, d);
    if (k == 1)
      printf("%s: one pass the same bits, two within %.2g of the largest\n",
             what, d);
  }
  size_t nb = 0, nb2 = 0;
  float *ba = trn_model_buffers(a, &nb), *bs = trn_model_buffers(s, &nb2);
  ASSERT_EQ(nb, nb2);
  if (nb)
    ASSERT_MEMEQ(ba, bs, nb * sizeof *ba);
  uint64_t skipped = 9;
  trn_model_loss_scale(s, &skipped);
  ASSERT_UEQ(skipped, 0);
  free(x), free(tok), free(y), free(ga);
  trn_model_free(a);
  trn_model_free(s);
}

static trn_model_config mlp(void) {
  trn_model_config c;
  trn_model_config_default(&c);
  c.sizes[0] = 64, c.sizes[1] = 32, c.sizes[2] = 10;
  c.max_batch = B;
  return c;
}

static void test_same_bits(void) {
  trn_model_config c = mlp();
  same_bits("mlp 64-32-10", &c);
  trn_model_config_default(&c);
  c.name = "cnn";
  c.in_h = c.in_w = 12, c.conv[0] = 4, c.conv[1] = 6, c.dense = 16;
  c.dropout = 0.3f, c.batchnorm = true, c.max_batch = B;
  same_bits("cnn with batch norm and dropout", &c);
  trn_model_config_default(&c);
  c.name = "resnet", c.depth = 8, c.width = 4;
  c.in_c = 3, c.in_h = c.in_w = 8, c.max_batch = B;
  same_bits("resnet-8", &c);
  trn_model_config_default(&c);
  c.name = "gpt", c.vocab = 32, c.ctx = 8, c.layers = 2, c.heads = 2;
  c.embd = 16, c.max_batch = B;
  same_bits("gpt", &c);
}

/* A clean pass at 2^127, then an overflowing one that changes nothing. */
static void test_overflow(void) {
  trn_model_config c = mlp();
  trn_model *a = make(&c, 0, false, 0), *s = make(&c, 0x1p127f, true, 0);
  size_t n = trn_model_nparams(a), in = trn_model_inputs(a);
  float x[B * 64];
  int32_t y[B];
  batch(a, false, 0, 1, x, NULL, y, 0);
  for (size_t i = 0; i < in; i++)
    x[i] *= 1e-30f; /* the input gradients stay small enough */
  double la, ls;
  pass(a, false, x, NULL, y, 1, 0, &la);
  pass(s, false, x, NULL, y, 1, 0, &ls);
  ASSERT(!trn_model_skipped(s));
  float *g1 = malloc(n * sizeof *g1);
  ASSERT(g1);
  memcpy(g1, trn_model_grads(a), n * sizeof *g1);
  ASSERT_MEMEQ(g1, trn_model_grads(s), n * sizeof *g1);
  batch(a, false, 1, B, x, NULL, y, 0);
  for (size_t i = 0; i < B * in; i++)
    x[i] *= 1e6f; /* the weight gradients pass 2^128 */
  pass(s, false, x, NULL, y, B, 0, &ls);
  ASSERT(trn_model_skipped(s));
  ASSERT(isfinite(ls)); /* the forward pass was fine */
  ASSERT_MEMEQ(g1, trn_model_grads(s), n * sizeof *g1);
  uint64_t skipped = 0;
  ASSERT(trn_model_loss_scale(s, &skipped) == 0x1p127f); /* fixed */
  ASSERT_UEQ(skipped, 1);
  printf("2^127, fixed: a clean pass the same bits, an overflow skipped\n");
  free(g1);
  trn_model_free(a);
  trn_model_free(s);
}

/* Dynamic: halves until clean; then grows every `interval` passes. */
static void test_dynamic(void) {
  trn_model_config c = mlp();
  trn_model *a = make(&c, 0, false, 0), *s = make(&c, 0x1p127f, false, 3);
  size_t n = trn_model_nparams(a);
  float x[B * 64];
  int32_t y[B];
  batch(a, false, 0, B, x, NULL, y, 0);
  for (size_t i = 0; i < B * trn_model_inputs(a); i++)
    x[i] *= 1e6f; /* overflows at 2^127 and some scales below */
  double l;
  pass(a, false, x, NULL, y, B, 0, &l);
  unsigned tries = 0;
  float *zero = calloc(n, sizeof *zero);
  ASSERT(zero);
  for (;;) {
    ASSERT_LT(tries, 128);
    float before = trn_model_loss_scale(s, NULL);
    pass(s, false, x, NULL, y, B, 0, &l);
    tries++;
    if (!trn_model_skipped(s))
      break;
    ASSERT(trn_model_loss_scale(s, NULL) == before / 2);
    ASSERT_MEMEQ(trn_model_grads(s), zero, n * sizeof *zero);
  }
  uint64_t skipped = 0;
  float at = trn_model_loss_scale(s, &skipped);
  ASSERT_UEQ(skipped, tries - 1);
  ASSERT_GE(skipped, 1);
  ASSERT_MEMEQ(trn_model_grads(a), trn_model_grads(s), n * sizeof *zero);
  printf("dynamic from 2^127: %llu passes skipped, clean at 2^%d with the "
         "unscaled bits\n",
         (unsigned long long)skipped, (int)log2f(at));
  trn_model_free(s);
  /* With ordinary pixels: 3 clean passes double it, 3 more again. */
  batch(a, false, 0, B, x, NULL, y, 0);
  s = make(&c, 16.0f, false, 3);
  for (int i = 0; i < 5; i++) {
    pass(s, false, x, NULL, y, B, 0, &l);
    ASSERT(!trn_model_skipped(s));
    ASSERT(trn_model_loss_scale(s, NULL) == (i < 2 ? 16.0f : 32.0f));
  }
  pass(s, false, x, NULL, y, B, 0, &l);
  ASSERT(trn_model_loss_scale(s, NULL) == 64.0f);
  trn_model_free(s);
  /* Growth stops at 2^24. */
  s = make(&c, 0x1p23f, false, 1);
  for (int i = 0; i < 4; i++)
    pass(s, false, x, NULL, y, B, 0, &l);
  ASSERT(trn_model_loss_scale(s, NULL) == 0x1p24f);
  trn_model_free(s);
  /* Fixed: never grows, and is not set back. */
  s = make(&c, 16.0f, true, 1);
  for (int i = 0; i < 4; i++)
    pass(s, false, x, NULL, y, B, 0, &l);
  ASSERT(trn_model_loss_scale(s, NULL) == 16.0f);
  ASSERT_EQ(trn_model_set_loss_scale(s, 64.0f), -EPERM);
  ASSERT(trn_model_loss_scale(s, NULL) == 16.0f);
  trn_model_free(s);
  /* A checkpoint's scale set back: the passes go on from it, and the
   * count of clean passes starts again (2 clean passes, set, 2 more: no
   * growth yet; the third doubles it). */
  s = make(&c, 16.0f, false, 3);
  for (int i = 0; i < 2; i++)
    pass(s, false, x, NULL, y, B, 0, &l);
  ASSERT_EQ(trn_model_set_loss_scale(s, 0x1p10f), 0);
  for (int i = 0; i < 3; i++) {
    ASSERT(trn_model_loss_scale(s, NULL) == 0x1p10f);
    pass(s, false, x, NULL, y, B, 0, &l);
    ASSERT(!trn_model_skipped(s));
  }
  ASSERT(trn_model_loss_scale(s, NULL) == 0x1p11f);
  const float bad[] = {3.0f, 0x1p-25f, 0, -2.0f, INFINITY, NAN};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
    ASSERT_EQ(trn_model_set_loss_scale(s, bad[i]), -EINVAL);
  ASSERT_EQ(trn_model_set_loss_scale(s, 0x1p127f), 0); /* dynamic's top */
  ASSERT(trn_model_loss_scale(s, NULL) == 0x1p127f);
  trn_model_free(s);
  /* No scaling: nothing to set. */
  s = make(&c, 0, false, 0);
  ASSERT_EQ(trn_model_set_loss_scale(s, 16.0f), -EPERM);
  ASSERT(trn_model_loss_scale(s, NULL) == 0);
  trn_model_free(s);
  trn_model_free(a);
  free(zero);
}

static void test_settings(void) {
  trn_model_config c = mlp();
  const float bad[] = {3.0f, 0x1p-25f, -2.0f, INFINITY, NAN, 1.5f};
  trn_model *m;
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    c.loss_scale = bad[i];
    err[0] = 0;
    if (trn_model_new(&c, &m, err, sizeof err) != -EINVAL)
      FAIL("loss scale %g was not refused", (double)bad[i]);
    ASSERT(strstr(err, "loss scale") && strstr(err, "power of two"));
  }
  printf("refused: %s\n", err);
  c.loss_scale = 0x1p-24f;
  ASSERT_EQ(trn_model_new(&c, &m, err, sizeof err), 0);
  ASSERT(trn_model_loss_scale(m, NULL) == 0x1p-24f);
  trn_model_free(m);
  c.loss_scale = 0;
  c.precision = 4;
  ASSERT_EQ(trn_model_new(&c, &m, err, sizeof err), -EINVAL);
  ASSERT(strstr(err, "fp16"));
  /* fp16 on the CPU computes in fp32: no scaling unless asked. */
  c.precision = TRN_FP16;
  ASSERT_EQ(trn_model_new(&c, &m, err, sizeof err), 0);
  ASSERT(trn_model_loss_scale(m, NULL) == 0);
  trn_model_free(m);
  /* Specs: the same cases as beed's --loss-scale. */
  for (size_t i = 0; i < sizeof loss_scale_good / sizeof *loss_scale_good;
       i++) {
    float v = -1;
    bool fixed = !loss_scale_good[i].fixed;
    ASSERT_EQ(trn_loss_scale_parse(loss_scale_good[i].spec, &v, &fixed), 0);
    if (v != loss_scale_good[i].scale || fixed != loss_scale_good[i].fixed)
      FAIL("loss scale spec %s: %g%s", loss_scale_good[i].spec, (double)v,
           fixed ? " fixed" : "");
  }
  ASSERT(TRN_LOSS_SCALE_START == 32768.0f); /* "dynamic" above */
  for (size_t i = 0; i < sizeof loss_scale_bad / sizeof *loss_scale_bad;
       i++) {
    float v = 7;
    bool fixed = true;
    if (trn_loss_scale_parse(loss_scale_bad[i], &v, &fixed) != -EINVAL ||
        v != 7 || !fixed)
      FAIL("loss scale spec '%s' was not refused cleanly", loss_scale_bad[i]);
  }
  ASSERT_EQ(trn_precision_parse("fp16"), TRN_FP16);
  ASSERT_STREQ(trn_precision_name(TRN_FP16), "fp16");
  ASSERT_EQ(trn_precision_parse("FP16"), -1);
}

int main(void) {
  test_settings();
  test_same_bits();
  test_overflow();
  test_dynamic();
  printf("ok\n");
  return 0;
}
