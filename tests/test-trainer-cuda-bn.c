/* test-trainer-cuda-bn.c: batch norm's CUDA training kernels (cuda-bn.cu)
 * against conv.c's on the same arrays, no convolution around them.
 *
 * Skips (exit 77) without the CUDA backend or a device.  With one, for
 * shapes that take every path of the kernels (images of a multiple of 4
 * values and not, of at least a block's 256 threads and fewer, slices of
 * one image and of several, a batch of one): y, 1 / sqrt(var + eps), the
 * running statistics, dx (set, and added to), dgamma and dbeta within
 * fp32's rounding of the CPU's (the worst difference printed, relative to
 * the array's largest), and the same bits from two runs.  One shape has
 * a mean 10^3 times its deviation, which the sums of x and x^2 in double
 * must still resolve.
 */
#include "test.h"

#include "trainer-int.h"
#include "trainer.h"

#include <math.h>

static uint64_t rng = 0x5eed;
static float frand(void) { /* uniform in [-1, 1) */
  rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((double)(rng >> 11) * 0x1p-52 - 1.0);
}

static double rel_diff(const float *a, const float *b, size_t n) {
  double d = 0, mx = 1e-30;
  for (size_t i = 0; i < n; i++) {
    double e = fabs((double)a[i] - b[i]);
    d = e > d ? e : d;
    mx = fabs(a[i]) > mx ? fabs(a[i]) : mx;
  }
  return d / mx;
}

static int misses;

static void near(const char *what, const float *a, const float *b, size_t n,
                 double tol) {
  double d = rel_diff(a, b, n);
  printf("  %-20s worst difference %.2e of the largest\n", what, d);
  if (!(d <= tol)) {
    fprintf(stderr, "%s: CPU and CUDA differ by %.3e (tolerance %.1e)\n",
            what, d, tol);
    misses++;
  }
}

static void check(size_t B, unsigned C, size_t hw, float offset, bool acc) {
  trn__bn bn = {.c = C, .hw = hw, .eps = 1e-5f, .momentum = 0.1f};
  size_t n = B * C * hw;
  printf("batch %zu, %u channels of %zu%s%s:\n", B, C, hw,
         offset != 0 ? ", mean 1000" : "", acc ? ", dx added to" : "");
  float *x = malloc(n * sizeof *x), *dy = malloc(n * sizeof *dy);
  float *yc = malloc(n * sizeof *yc), *yg = malloc(n * sizeof *yg);
  float *dx0 = malloc(n * sizeof *dx0);
  float *dxc = malloc(n * sizeof *dxc), *dxg = malloc(n * sizeof *dxg);
  float *dxg2 = malloc(n * sizeof *dxg2), *yg2 = malloc(n * sizeof *yg2);
  static float p[16][4096];
  ASSERT(x && dy && yc && yg && dx0 && dxc && dxg && dxg2 && yg2);
  ASSERT(C <= 4096);
  /* p: gamma beta; rm rv dg db for the CPU, the GPU, the GPU again; inv
   * for each. */
  float *gamma = p[0], *beta = p[1];
  for (unsigned c = 0; c < C; c++) {
    gamma[c] = 1 + 0.5f * frand(), beta[c] = 0.5f * frand();
    p[2][c] = 0.1f * frand();     /* running mean */
    p[3][c] = 1 + 0.1f * frand(); /* running variance */
    p[4][c] = 0.25f;              /* dgamma so far */
    p[5][c] = -0.25f;             /* dbeta so far */
    for (int k = 1; k < 3; k++)
      for (int j = 0; j < 4; j++)
        p[2 + 4 * k + j][c] = p[2 + j][c];
  }
  for (size_t i = 0; i < n; i++) {
    /* Each channel its own scale and shift. */
    unsigned c = (unsigned)(i / hw % C);
    x[i] = offset + (1 + (float)c / (float)C) * frand() + 0.1f * (float)c;
    dy[i] = frand();
    dx0[i] = acc ? frand() : 0;
  }
  float *inv_c = p[14], *inv_g = p[15];
  static float inv_g2[4096], mean_c[4096];
  trn__bn_fwd(&bn, x, gamma, beta, yc, mean_c, inv_c, p[2], p[3], B, true);
  trn__bn_bwd(&bn, x, mean_c, inv_c, gamma, dy, dxc, p[4], p[5], B);
  for (size_t i = 0; acc && i < n; i++) /* conv.c sets dx: add after */
    dxc[i] += dx0[i];
  memcpy(dxg, dx0, n * sizeof *dxg);
  memcpy(dxg2, dx0, n * sizeof *dxg2);
  ASSERT_EQ(trn__cuda_bn_run(0, &bn, B, x, gamma, beta, p[6], p[7], yg, inv_g,
                             dy, dxg, acc, p[8], p[9]),
            0);
  ASSERT_EQ(trn__cuda_bn_run(0, &bn, B, x, gamma, beta, p[10], p[11], yg2,
                             inv_g2, dy, dxg2, acc, p[12], p[13]),
            0);
  near("y", yc, yg, n, 1e-5);
  near("1 / sqrt(var + eps)", inv_c, inv_g, C, 1e-5);
  near("running mean", p[2], p[6], C, 1e-5);
  near("running variance", p[3], p[7], C, 1e-5);
  near("dx", dxc, dxg, n, 1e-4);
  near("dgamma", p[4], p[8], C, 1e-5);
  near("dbeta", p[5], p[9], C, 1e-5);
  ASSERT(memcmp(yg, yg2, n * sizeof *yg) == 0);
  ASSERT(memcmp(dxg, dxg2, n * sizeof *dxg) == 0);
  ASSERT(memcmp(inv_g, inv_g2, C * sizeof *inv_g) == 0);
  for (int j = 0; j < 4; j++)
    ASSERT(memcmp(p[6 + j], p[10 + j], C * sizeof(float)) == 0);
  printf("  two runs: the same bits\n");
  free(x), free(dy), free(yc), free(yg), free(dx0);
  free(dxc), free(dxg), free(dxg2), free(yg2);
}

int main(void) {
  int n = 0;
  if (!trn_cuda_available() || trn_device_count_cuda(&n) || n == 0) {
    printf("skip: no CUDA device (or no CUDA backend in this build)\n");
    return TEST_SKIP;
  }
  check(100, 32, 784, 0, false);  /* the cnn's first: float4, 1-2 images */
  check(100, 64, 196, 0, false);  /* its second: 3-4 images a slice */
  check(128, 512, 49, 0, false);  /* ResNet-18's last: hw not a multiple of 4 */
  check(3, 5, 300, 0, false);     /* one image a slice, float4 */
  check(7, 3, 257, 0, false);     /* at least a block, not a multiple of 4 */
  check(1000, 4, 9, 0, false);    /* tiny images, 2 a slice */
  check(1, 3, 5, 0, false);       /* a batch of one */
  check(100, 64, 196, 0, true);   /* dx added to */
  check(16, 8, 1024, 1000, false); /* the mean 10^3 deviations away */
  if (misses)
    FAIL("%d comparisons out of their tolerances", misses);
  return 0;
}
