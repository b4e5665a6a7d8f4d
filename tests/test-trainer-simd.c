/* test-trainer-simd.c: the CPU backend's vector kernels.
 *
 * trn__sgemm, the matrix products (gemm.c), against products summed in
 * double:
 * - Every combination of transposes, of alpha and beta (beta 0 with C
 *   full of NaN: C must not be read), of shapes around the kernel's tile
 *   (12 x 32, C's last rows in tiles of 8 or 4) and block depth (320),
 *   with strides wider than the rows:
 *   each element within (k + 2) float epsilons of the sum of its terms'
 *   magnitudes, and nothing written outside C.
 * - The same product on 1 and 2 threads, shared by columns and by rows:
 *   the same bits; and a block of C computed alone (other offsets, other
 *   tiles): the same bits as inside the whole.
 * A TRN_GEMM value other than auto or openblas is warned about and taken
 * as auto.  Which implementation ran (ours on AVX-512, else OpenBLAS) is
 * printed; the bounds hold for both, the same bits only for ours.
 *
 * conv.c's AVX-512 im2col, col2im and 2 x 2 max pooling against its plain
 * loops (trn__conv_vectors_set): a convolution's forward and backward
 * (output, dx, dW, db) and pooling's outputs and argmax, the same bits,
 * for shapes on both sides of the vector paths' limits (rows of 32,
 * windows of 16), with padding, without, with a fused relu, with NaNs and
 * ties in the pooled planes.  On a CPU without AVX-512 both runs take the
 * plain loops (printed).
 */
#include "test.h"
#include "trainer-int.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define SENTINEL 1234.5f

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static float uniform(void) {
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* A stored matrix of rows x cols with stride ld, random. */
static float *random_matrix(size_t rows, size_t ld) {
  float *x = malloc((rows * ld + 1) * sizeof *x);
  ASSERT(x);
  for (size_t i = 0; i < rows * ld + 1; i++)
    x[i] = uniform();
  return x;
}

static int checked;

static void check(bool ta, bool tb, size_t m, size_t n, size_t k, float alpha,
                  float beta) {
  size_t lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 5, ldc = n + 7;
  float *a = random_matrix(ta ? k : m, lda);
  float *b = random_matrix(tb ? n : k, ldb);
  size_t rows = m + 2; /* two rows past C: must stay untouched */
  float *c = malloc(rows * ldc * sizeof *c), *c0 = malloc(m * n * sizeof *c0);
  ASSERT(c && c0);
  for (size_t i = 0; i < rows * ldc; i++)
    c[i] = SENTINEL;
  for (size_t i = 0; i < m; i++)
    for (size_t j = 0; j < n; j++)
      c[i * ldc + j] = c0[i * n + j] = beta == 0 ? NAN : uniform();
  trn__sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  for (size_t i = 0; i < rows; i++)
    for (size_t j = 0; j < ldc; j++) {
      float got = c[i * ldc + j];
      if (i >= m || j >= n) {
        if (got != SENTINEL)
          FAIL("ta %d tb %d %zux%zux%zu: C[%zu][%zu] outside C written (%g)",
               ta, tb, m, n, k, i, j, got);
        continue;
      }
      double sum = 0, mag = 0;
      for (size_t p = 0; p < k; p++) {
        double x = ta ? a[p * lda + i] : a[i * lda + p];
        double y = tb ? b[j * ldb + p] : b[p * ldb + j];
        sum += x * y, mag += fabs(x * y);
      }
      double want = alpha * sum, bound = fabs(alpha) * mag;
      if (beta != 0)
        want += beta * (double)c0[i * n + j],
            bound += fabs(beta * (double)c0[i * n + j]);
      bound = bound * (double)(k + 2) * FLT_EPSILON + 1e-30;
      if (!(fabs(got - want) <= bound))
        FAIL("ta %d tb %d %zux%zux%zu alpha %g beta %g: C[%zu][%zu] = %.9g, "
             "want %.9g (bound %.3g)",
             ta, tb, m, n, k, alpha, beta, i, j, got, want, bound);
    }
  free(a), free(b), free(c), free(c0);
  checked++;
}

/* op(A) op(B) of m x n x k three ways: on one thread, on two (each a
 * share of C), and the block [i0, m) x [j0, n) alone: the same bits. */
static void same_bits(bool ta, bool tb, size_t m, size_t n, size_t k,
                      size_t i0, size_t j0) {
  size_t lda = ta ? m : k, ldb = tb ? k : n;
  float *a = random_matrix(ta ? k : m, lda);
  float *b = random_matrix(tb ? n : k, ldb);
  float *c1 = calloc(m * n, sizeof *c1), *c2 = calloc(m * n, sizeof *c2);
  float *cb = calloc(m * n, sizeof *cb);
  ASSERT(c1 && c2 && cb);
  trn_cpu_threads_set(1);
  trn__sgemm(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c1, n);
  trn_cpu_threads_set(2);
  trn__sgemm(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c2, n);
  ASSERT(memcmp(c1, c2, m * n * sizeof *c1) == 0);
  /* The block alone: A's rows from i0, B's columns from j0. */
  const float *ab = ta ? a + i0 : a + i0 * lda;
  const float *bb = tb ? b + j0 * ldb : b + j0;
  trn__sgemm(ta, tb, m - i0, n - j0, k, 1.0f, ab, lda, bb, ldb, 0.0f,
             cb + i0 * n + j0, n);
  for (size_t i = i0; i < m; i++)
    for (size_t j = j0; j < n; j++)
      if (memcmp(&cb[i * n + j], &c1[i * n + j], sizeof(float)))
        FAIL("ta %d tb %d %zux%zux%zu: C[%zu][%zu] from the block at "
             "(%zu, %zu) is %.9g, in the whole %.9g",
             ta, tb, m, n, k, i, j, i0, j0, cb[i * n + j], c1[i * n + j]);
  free(a), free(b), free(c1), free(c2), free(cb);
  checked++;
}

static float *random_floats(size_t n) {
  float *x = malloc((n ? n : 1) * sizeof *x);
  ASSERT(x);
  for (size_t i = 0; i < n; i++)
    x[i] = uniform();
  return x;
}

static void same(const char *what, const char *label, const float *a,
                 const float *b, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (memcmp(&a[i], &b[i], sizeof *a))
      FAIL("%s: %s[%zu] is %.9g with vectors, %.9g without", label, what, i,
           a[i], b[i]);
}

/* One convolution, forward and backward, with and without the vector
 * paths. */
static void conv_same(unsigned c, unsigned h, unsigned w, unsigned oc,
                      unsigned k, unsigned pad, unsigned stride, bool relu) {
  trn__conv cv = {.c = c, .h = h, .w = w, .oc = oc, .k = k, .pad = pad,
                  .stride = stride, .relu = relu};
  cv.oh = (h + 2 * pad - k) / stride + 1;
  cv.ow = (w + 2 * pad - k) / stride + 1;
  size_t B = 6, in = (size_t)c * h * w, out = (size_t)oc * cv.oh * cv.ow;
  size_t kk = (size_t)c * k * k, px = (size_t)cv.oh * cv.ow;
  float *x = random_floats(B * in), *wt = random_floats(oc * kk);
  float *bias = random_floats(oc), *dy = random_floats(B * out);
  float *y[2], *dx[2], *dw[2], *db[2];
  char label[96];
  snprintf(label, sizeof label, "conv %ux%ux%u to %u, k %u pad %u stride %u%s",
           c, h, w, oc, k, pad, stride, relu ? " relu" : "");
  for (int v = 0; v < 2; v++) {
    trn__conv_vectors_set(v == 0);
    trn__conv_ws ws;
    ASSERT_EQ(trn__conv_ws_init(&ws, kk * TRN__CONV_CHUNK * px,
                                oc * TRN__CONV_CHUNK * px, oc * kk + oc),
              0);
    y[v] = calloc(B * out, sizeof(float));
    dx[v] = calloc(B * in, sizeof(float));
    dw[v] = calloc(oc * kk, sizeof(float));
    db[v] = calloc(oc, sizeof(float));
    ASSERT(y[v] && dx[v] && dw[v] && db[v]);
    trn__conv_fwd(&cv, x, wt, bias, y[v], B, &ws);
    trn__conv_bwd(&cv, x, wt, y[v], dy, dx[v], dw[v], db[v], B, &ws);
    trn__conv_ws_free(&ws);
  }
  trn__conv_vectors_set(true);
  same("y", label, y[0], y[1], B * out);
  same("dx", label, dx[0], dx[1], B * in);
  same("dW", label, dw[0], dw[1], oc * kk);
  same("db", label, db[0], db[1], oc);
  /* And not all zeros: the forward did run. */
  size_t nonzero = 0;
  for (size_t i = 0; i < B * out; i++)
    nonzero += y[0][i] != 0;
  ASSERT(nonzero > B * out / 4);
  for (int v = 0; v < 2; v++)
    free(y[v]), free(dx[v]), free(dw[v]), free(db[v]);
  free(x), free(wt), free(bias), free(dy);
  checked++;
}

/* 2 x 2 max pooling of planes with ties (values on a grid of 4) and NaNs,
 * with and without the vector path. */
static void pool_same(unsigned h, unsigned w) {
  size_t B = 3, c = 5, in = B * c * h * w, out = B * c * (h / 2) * (w / 2);
  float *x = random_floats(in);
  for (size_t i = 0; i < in; i++)
    x[i] = i % 37 == 5 ? NAN : floorf(x[i] * 2) / 2;
  float *y[2], *dx[2];
  uint32_t *arg[2];
  float *dy = random_floats(out);
  for (int v = 0; v < 2; v++) {
    trn__conv_vectors_set(v == 0);
    y[v] = malloc((out + 1) * sizeof(float));
    arg[v] = malloc((out + 1) * sizeof(uint32_t));
    dx[v] = malloc(in * sizeof(float));
    ASSERT(y[v] && arg[v] && dx[v]);
    trn__maxpool_fwd(x, y[v], arg[v], B, c, h, w, 2);
    trn__maxpool_bwd(dy, arg[v], dx[v], B, c, h, w, 2);
  }
  trn__conv_vectors_set(true);
  char label[64];
  snprintf(label, sizeof label, "max pool 2 of %ux%u", h, w);
  same("y", label, y[0], y[1], out);
  same("dx", label, dx[0], dx[1], in);
  for (size_t i = 0; i < out; i++)
    if (arg[0][i] != arg[1][i])
      FAIL("%s: argmax[%zu] is %u with vectors, %u without", label, i,
           arg[0][i], arg[1][i]);
  for (int v = 0; v < 2; v++)
    free(y[v]), free(arg[v]), free(dx[v]);
  free(x), free(dy);
  checked++;
}

static void tanh_close(void) {
  double worst = 0, at = 0;
  for (double d = -20; d <= 20; d += 1e-5) {
    float x = (float)d;
    double want = tanh((double)x), e = fabs(trn__tanhf(x) - want);
    if (want != 0)
      e /= fabs(want);
    if (e > worst)
      worst = e, at = x;
  }
  for (float x = 1e-30f; x < 1; x *= 1.001f) {
    double e = fabs(trn__tanhf(x) - tanh((double)x)) / tanh((double)x);
    if (e > worst)
      worst = e, at = x;
  }
  printf("tanh within %.3g of its value (at %.9g)\n", worst, at);
  if (!(worst <= 2.5e-7))
    FAIL("trn__tanhf(%.9g) is %.3g off", at, worst);
  ASSERT(isnan(trn__tanhf(NAN)));
  ASSERT(trn__tanhf(INFINITY) == 1 && trn__tanhf(-INFINITY) == -1);
  ASSERT(trn__tanhf(0) == 0 && signbit(trn__tanhf(-0.0f)));
}

static char warned[256];

static void on_log(int level, const char *msg, void *data) {
  (void)data;
  if (level == TRN_LOG_WARN)
    snprintf(warned, sizeof warned, "%s", msg);
}

int main(void) {
  /* A TRN_GEMM the trainer does not know is warned about, and taken as
   * auto: the choice by the CPU. */
  setenv("TRN_GEMM", "bogus", 1);
  trn_log_set(on_log, NULL);
  const char *name = trn__sgemm_name();
  trn_log_set(NULL, NULL);
  if (!strstr(warned, "TRN_GEMM=bogus: expected auto or openblas"))
    FAIL("no warning for TRN_GEMM=bogus (got '%s')", warned);
  ASSERT(strcmp(name, trn__cpu_avx512() ? "beed avx512" : "openblas") == 0);
  printf("products by %s\n", name);
  static const size_t ms[] = {1, 5, 8, 12, 13, 20, 40}; /* tiles of 4, 8, 12 */
  static const size_t ns[] = {1, 17, 32, 33, 70};
  static const size_t ks[] = {1, 7, 320, 321, 700};
  static const float ab[][2] = {{1, 0}, {1, 1}, {0.5f, -2}};
  for (int t = 0; t < 4; t++)
    for (size_t mi = 0; mi < 5; mi++)
      for (size_t ni = 0; ni < 5; ni++)
        for (size_t ki = 0; ki < 5; ki++)
          check(t & 1, t & 2, ms[mi], ns[ni], ks[ki], ab[(mi + ni + ki) % 3][0],
                ab[(mi + ni + ki) % 3][1]);
  /* Rows past the kernel's A block (96) and columns past a B block
   * (4096), every alpha and beta. */
  for (int i = 0; i < 3; i++)
    check(i & 1, i == 2, 100, 4100, 9, ab[i][0], ab[i][1]);
  /* Shared by columns (many), by rows (few columns, many rows).  Only
   * ours promises the same bits (OpenBLAS's depend on its threads). */
  bool ours = strcmp(trn__sgemm_name(), "openblas") != 0;
  for (int t = 0; ours && t < 4; t++) {
    same_bits(t & 1, t & 2, 150, 300, 400, 13, 45);
    same_bits(t & 1, t & 2, 600, 20, 300, 37, 3);
  }
  trn_cpu_threads_set(1);
  printf("%d products checked\n", checked);

  printf("convolutions and pooling %s\n",
         trn__cpu_avx512() ? "with AVX-512 against the plain loops"
                           : "on the plain loops both times (no AVX-512)");
  checked = 0;
  conv_same(1, 28, 28, 32, 5, 2, 1, true);    /* the cnn's first */
  conv_same(32, 14, 14, 64, 5, 2, 1, true);   /* and second */
  conv_same(3, 32, 32, 16, 3, 1, 1, false);   /* resnet's, rows of 32 */
  conv_same(4, 17, 19, 5, 3, 0, 1, true);     /* no padding: ow < w */
  conv_same(2, 9, 9, 3, 1, 0, 1, false);      /* 1 x 1 */
  conv_same(2, 8, 30, 4, 7, 3, 1, false);     /* a wide window */
  conv_same(3, 6, 31, 4, 17, 8, 1, true);     /* past 16: plain loops */
  conv_same(2, 5, 33, 3, 3, 1, 1, false);     /* rows past 32: plain */
  conv_same(3, 16, 16, 8, 3, 1, 2, true);     /* stride 2: plain */
  pool_same(28, 28);
  pool_same(14, 14);
  pool_same(7, 9);
  pool_same(32, 32);
  pool_same(5, 31);
  pool_same(4, 34); /* past 32: plain */
  printf("%d layers checked\n", checked);
  tanh_close();
  return 0;
}
