/* scale.c: loss scaling's bookkeeping, which both backends share, and the
 * CPU's end of a scaled pass.
 *
 * fp16 holds values up to 65504 and loses the small ones below 2^-24, so
 * a pass whose products take fp16 inputs (TRN_FP16 on CUDA) scales the
 * gradient it sends down by a power of two: small gradients stay above
 * fp16's floor.  Each pass computes its gradient into an array of its own
 * and adds it, divided by the scale, to the gradients only when all of it
 * is finite; so the gradients the daemon averages are always plain fp32
 * sums, whatever scale each pass ran at, and one overflow costs one batch,
 * not the batches accumulated before it.  Dynamic scaling is PyTorch's
 * GradScaler's rule, per pass: halve at an overflow, double after
 * `interval` clean passes in a row. */
#include "trainer-int.h"

#include <errno.h>
#include <math.h>
#include <string.h>

/* Whether x is 2^e with e in [lo, hi]. */
static bool power_of_two(float x, int lo, int hi) {
  int e;
  if (!(x > 0) || !isfinite(x) || frexpf(x, &e) != 0.5f)
    return false;
  return e - 1 >= lo && e - 1 <= hi;
}

int trn__scaler_init(trn__scaler *s, const trn_model_config *c, char *err,
                     size_t err_len) {
  memset(s, 0, sizeof *s);
  float v = c->loss_scale;
  if (v != 0 && !power_of_two(v, -24, 127))
    return trn__fail(err, err_len, -EINVAL,
                     "loss scale %g: a power of two from 2^-24 to 2^127, or 0 "
                     "(dynamic with fp16 on CUDA, none otherwise)",
                     (double)v);
  if (v == 0 && c->precision == TRN_FP16 && c->device == TRN_DEV_CUDA)
    v = TRN_LOSS_SCALE_START;
  s->scale = v;
  s->fixed = c->loss_scale_fixed;
  s->interval =
      c->loss_scale_interval ? c->loss_scale_interval : TRN_LOSS_SCALE_INTERVAL;
  return 0;
}

int trn__scaler_set(trn__scaler *s, float scale) {
  if (s->scale == 0 || s->fixed)
    return -EPERM;
  if (!power_of_two(scale, -24, 127))
    return -EINVAL;
  s->scale = scale;
  s->clean = 0;
  return 0;
}

bool trn__scaler_after(trn__scaler *s, bool overflow) {
  s->last_skipped = overflow;
  if (overflow) {
    s->skipped++;
    s->clean = 0;
    if (!s->fixed && s->scale > TRN__LOSS_SCALE_MIN)
      s->scale *= 0.5f;
    return false;
  }
  if (!s->fixed && ++s->clean >= s->interval) {
    s->clean = 0;
    if (s->scale < TRN__LOSS_SCALE_MAX)
      s->scale *= 2.0f;
  }
  return true;
}

bool trn__unscale_add(float *grads, const float *scaled, size_t n,
                      float scale) {
  /* x * 0 is 0 for every finite x and NaN for an inf or a NaN: one sum
   * that vectorizes tells whether all are finite. */
  float z = 0;
  for (size_t i = 0; i < n; i++)
    z += scaled[i] * 0.0f;
  if (z != 0)
    return true;
  float inv = 1.0f / scale; /* exact: scale is a power of two */
  for (size_t i = 0; i < n; i++)
    grads[i] += scaled[i] * inv;
  return false;
}

void trn__scale_floats(float *x, size_t n, float scale) {
  for (size_t i = 0; i < n; i++)
    x[i] *= scale;
}
