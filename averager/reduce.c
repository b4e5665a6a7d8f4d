/* reduce.c: what an owner does with the contributions to its span.
 *
 * The finiteness check with the squared norm, the weighted mean in fp32
 * with the weights summed in double, and the clip rule that keeps one
 * member's runaway gradient from dominating the group's mean.
 *
 * The mean is sum_j w_j x_j / sum_j w_j with the products and sums in fp32,
 * added in the group's member order; docs/AVERAGING.md, section 4, gives
 * its error against the exact mean.  fp32 rather than double because the
 * owner's buffer is the span itself (up to the whole model for a small
 * group), and the error of fp32 summation over a group of tens of members
 * is far below that of any lossy codec.
 */
#include "averager-int.h"

#include <assert.h>
#include <float.h>
#include <string.h>

/* Lanes of the double sum.  A fixed count, so the order of the additions
 * is set by this source, not by the vectorizer (which may not reorder
 * floating-point sums anyway without -ffast-math). */
#define LANES 8

/* The sum of squares in LANES running sums, combined at the end. */
AVG__CLONES
static double sum_sq(const float *x, size_t n) {
  double s[LANES] = {0};
  size_t i = 0;
  for (; i + LANES <= n; i += LANES)
    for (size_t j = 0; j < LANES; j++)
      s[j] += (double)x[i + j] * x[i + j];
  for (; i < n; i++)
    s[0] += (double)x[i] * x[i];
  double t = 0;
  for (size_t j = 0; j < LANES; j++)
    t += s[j];
  return t;
}

int avg_check(const float *x, size_t n, double *sq_norm) {
  double t = sum_sq(x, n);
  *sq_norm = t;
  /* A square of a finite float is below 2^256 and cannot overflow a
   * double, nor can any sum of fewer than 2^700 of them: the total is
   * finite exactly when every x is. */
  return t - t == 0 ? 0 : BEE_ERANGE;
}

void avg_acc_init(avg_acc *a, float *buf, size_t n) {
  assert(buf || n == 0);
  a->sum = buf;
  a->n = n;
  a->weight = 0;
  a->count = 0;
  if (n)
    memset(buf, 0, n * sizeof *buf);
}

/* sum += w * x: one multiply and one add per value, as avg_decode_add. */
AVG__CLONES
static void axpy(float *restrict sum, const float *restrict x, size_t n,
                 float w) {
  for (size_t i = 0; i < n; i++)
    sum[i] += w * x[i];
}

static bool weight_ok(float w) { return w >= 0.0f && w <= FLT_MAX; }

int avg_acc_add(avg_acc *a, const float *x, float weight) {
  double sq;
  if (!weight_ok(weight) || avg_check(x, a->n, &sq))
    return BEE_ERANGE;
  if (weight > 0.0f)
    axpy(a->sum, x, a->n, weight);
  a->weight += weight;
  a->count++;
  return 0;
}

int avg_acc_add_encoded(avg_acc *a, avg_codec c, const uint8_t *in, size_t len,
                        float weight) {
  int rc = avg_decode_add(c, in, len, a->n, weight, a->sum);
  if (rc)
    return rc;
  a->weight += weight;
  a->count++;
  return 0;
}

/* sum /= w in place; nonzero when a quotient is not finite. */
AVG__CLONES
static uint32_t divide(float *sum, size_t n, float w) {
  uint32_t bad = 0;
  for (size_t i = 0; i < n; i++) {
    float v = sum[i] / w;
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    bad |= (u & 0x7f800000u) == 0x7f800000u;
    sum[i] = v;
  }
  return bad;
}

int avg_acc_finish(avg_acc *a, const float *local) {
  assert(local || a->n == 0);
  /* One rounding of the total to fp32 (exact for integer sample counts up
   * to 2^24), then one correctly rounded division per value.  A total
   * beyond fp32 (or rounding to 0) makes a quotient that is not finite, or
   * is caught here. */
  float w = (float)a->weight;
  if (a->weight > 0 && w <= FLT_MAX && !divide(a->sum, a->n, w))
    return 0;
  if (a->n)
    memcpy(a->sum, local, a->n * sizeof *a->sum);
  return a->weight > 0 ? BEE_ERANGE : 0;
}

/* Insertion sort: n is a group's size, tens to a few hundred.  NaNs are
 * moved last so the order is total. */
static bool before(double a, double b) { return a < b || (b != b && a == a); }

double avg_median(double *v, size_t n) {
  for (size_t i = 1; i < n; i++) {
    double t = v[i];
    size_t j = i;
    for (; j > 0 && before(t, v[j - 1]); j--)
      v[j] = v[j - 1];
    v[j] = t;
  }
  if (n == 0)
    return 0;
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double avg_clip_factor(double norm, double median_norm, double clip,
                       avg_clip_mode mode) {
  if (!(norm >= 0 && norm <= DBL_MAX))
    return 0; /* NaN, infinite or negative: not a norm */
  if (mode == AVG_CLIP_OFF || !(clip > 0))
    return 1;
  /* A NaN or negative median clips nothing; an infinite one neither. */
  if (!(median_norm >= 0))
    return 1;
  double limit = clip * median_norm;
  if (norm <= limit)
    return 1;
  return mode == AVG_CLIP_DROP ? 0 : limit / norm;
}
