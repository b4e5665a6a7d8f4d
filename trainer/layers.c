/* layers.c: the CPU layers' forward and backward passes (trainer-int.h).
 *
 * Shapes are row-major, the batch first: a linear layer maps x (B, in) to
 * y (B, out) with W (out, in) and b (out), as torch.nn.Linear stores them,
 * so weights move between the two without a transpose.  Matrix products go
 * to OpenBLAS; the rest are plain loops the compiler vectorizes.  Backward
 * passes add into the gradients (accumulation over batches is the
 * caller's), and write the gradient of their input, which the next layer
 * down reads.
 */
#include "trainer-int.h"

#include <math.h>
#include <string.h>

void trn__linear_fwd(const float *x, const float *w, const float *b, float *y,
                     size_t B, size_t in, size_t out) {
  for (size_t i = 0; i < B; i++)
    memcpy(y + i * out, b, out * sizeof *y);
  /* y (B, out) += x (B, in) . W^T (in, out) */
  trn__sgemm(false, true, B, out, in, 1.0f, x, in, w, in, 1.0f, y, out);
}

void trn__linear_bwd(const float *x, const float *w, const float *dy,
                     float *dx, float *dw, float *db, size_t B, size_t in,
                     size_t out) {
  /* dW (out, in) += dy^T (out, B) . x (B, in) */
  trn__sgemm(true, false, out, in, B, 1.0f, dy, out, x, in, 1.0f, dw, in);
  for (size_t i = 0; i < B; i++)
    for (size_t j = 0; j < out; j++)
      db[j] += dy[i * out + j];
  /* dx (B, in) = dy (B, out) . W (out, in) */
  if (dx)
    trn__sgemm(false, false, B, in, out, 1.0f, dy, out, w, in, 0.0f, dx, in);
}

/* The loops in copies for AVX-512 and the baseline (TRN__VECTOR_CLONES),
 * static: clang resolves a multiversioned function only in its own file. */
TRN__VECTOR_CLONES
static void relu_fwd(const float *x, float *y, size_t n) {
  for (size_t i = 0; i < n; i++)
    y[i] = x[i] > 0 ? x[i] : 0;
}

TRN__VECTOR_CLONES
static void relu_bwd(const float *y, const float *dy, float *dx, size_t n) {
  for (size_t i = 0; i < n; i++) {
    float v = dy[i]; /* read either way: a select, not a branch */
    dx[i] = y[i] > 0 ? v : 0;
  }
}

void trn__relu_fwd(const float *x, float *y, size_t n) { relu_fwd(x, y, n); }

void trn__relu_bwd(const float *y, const float *dy, float *dx, size_t n) {
  relu_bwd(y, dy, dx, n);
}

double trn__softmax_ce(const float *logits, const int32_t *labels, float *dl,
                       size_t B, size_t C, size_t *correct) {
  double total = 0;
  size_t right = 0;
  for (size_t i = 0; i < B; i++) {
    const float *z = logits + i * C;
    size_t arg = 0;
    float mx = z[0];
    for (size_t j = 1; j < C; j++)
      if (z[j] > mx)
        mx = z[j], arg = j;
    double sum = 0;
    for (size_t j = 0; j < C; j++)
      sum += exp((double)z[j] - mx);
    double lse = mx + log(sum);
    size_t t = (size_t)labels[i];
    total += lse - z[t];
    right += arg == t;
    if (dl) /* d(loss summed over the batch) / d logits: softmax - onehot */
      for (size_t j = 0; j < C; j++)
        dl[i * C + j] = (float)(exp((double)z[j] - lse) - (j == t ? 1.0 : 0.0));
  }
  if (correct)
    *correct = right;
  return total;
}
