/* cuda-bn.cu: batch norm in training on the device, (B, c, hw) arrays.
 *
 * cuDNN's NCHW batch norm ran at a fifth of the memory's speed or less on
 * ResNet-18's first one (64 channels of 112 x 112, batch 128: 2.2 ms
 * forward, 2.3 ms backward on an H200, for 411 MB), so training passes
 * use these kernels; evaluation keeps cuDNN's (one elementwise pass).
 *
 * Each channel's sums are split over slices of the batch
 * (trn__bn_slices): one block a (channel, slice), each thread summing in
 * double in a fixed order, the block's threads added by a fixed tree and
 * the slices in order by a thread per channel, so a pass gives the same
 * bits every time.  Forward reads x twice and writes y; backward reads x
 * and dy twice and writes dx: the least a two-step normalization can do.
 * The sums are in double as conv.c's, but where conv.c sums (x - mean)^2
 * in a pass of its own, the variance here comes from sum x and sum x^2
 * (their difference loses nothing a float keeps while the mean is under
 * 10^4 deviations); backward's from sum dy and sum dy (x - mean).
 */
#include "cuda-int.h"

#include <errno.h>
#include <string.h>

#include <cuda_runtime.h>

/* A block's (a, q) summed by a fixed tree: each warp by shuffles, then
 * the warps' by warp 0; thread 0 gets the totals. */
__device__ static double2 block_sum(double a, double q) {
  __shared__ double sa[THREADS / 32], sq[THREADS / 32];
  for (int o = 16; o > 0; o >>= 1) {
    a += __shfl_down_sync(0xffffffffu, a, o);
    q += __shfl_down_sync(0xffffffffu, q, o);
  }
  unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0)
    sa[warp] = a, sq[warp] = q;
  __syncthreads();
  a = q = 0;
  if (warp == 0) {
    if (lane < THREADS / 32)
      a = sa[lane], q = sq[lane];
    for (int o = 16; o > 0; o >>= 1) {
      a += __shfl_down_sync(0xffffffffu, a, o);
      q += __shfl_down_sync(0xffffffffu, q, o);
    }
  }
  return make_double2(a, q);
}

/* One value's share of a block's sums (k_bn_sums): x and x^2, or with
 * grad dy and dy (x - m). */
__device__ static inline void bn_add(float v, float d, bool grad, double m,
                                     double *a, double *q) {
  if (grad)
    *a += d, *q += (double)d * ((double)v - m);
  else
    *a += v, *q += (double)v * v;
}

/* Block (c, s) sums over its slice of the batch: with dy NULL, x and x^2;
 * else dy and dy (x - mean[c]).  part[c S + s] gets the pair.  Images of
 * a multiple of 4 values are read four at a time (more bytes in flight
 * a thread); small ones as one run of the slice's (b, i) pairs. */
__global__ void k_bn_sums(const float *x, const float *dy, const float *mean,
                          double2 *part, unsigned C, unsigned hw, unsigned B) {
  unsigned c = blockIdx.x, s = blockIdx.y, S = gridDim.y;
  unsigned b0 = (unsigned)((size_t)s * B / S);
  unsigned b1 = (unsigned)((size_t)(s + 1) * B / S);
  double a = 0, q = 0, m = dy ? (double)mean[c] : 0.0;
  bool grad = dy != NULL;
  if (hw >= THREADS && hw % 4 == 0) {
    for (unsigned b = b0; b < b1; b++) {
      size_t at = ((size_t)b * C + c) * hw;
      const float4 *x4 = (const float4 *)(x + at);
      const float4 *d4 = (const float4 *)(grad ? dy + at : x + at);
      for (unsigned i = threadIdx.x; i < hw / 4; i += THREADS) {
        float4 v = x4[i], d = grad ? d4[i] : v;
        bn_add(v.x, d.x, grad, m, &a, &q);
        bn_add(v.y, d.y, grad, m, &a, &q);
        bn_add(v.z, d.z, grad, m, &a, &q);
        bn_add(v.w, d.w, grad, m, &a, &q);
      }
    }
  } else if (hw >= THREADS || b1 - b0 == 1) {
    for (unsigned b = b0; b < b1; b++) {
      size_t at = ((size_t)b * C + c) * hw;
      for (unsigned i = threadIdx.x; i < hw; i += THREADS)
        bn_add(x[at + i], grad ? dy[at + i] : 0.0f, grad, m, &a, &q);
    }
  } else {
    unsigned n = (b1 - b0) * hw;
    for (unsigned e = threadIdx.x; e < n; e += THREADS) {
      size_t at = ((size_t)(b0 + e / hw) * C + c) * hw + e % hw;
      bn_add(x[at], grad ? dy[at] : 0.0f, grad, m, &a, &q);
    }
  }
  double2 t = block_sum(a, q);
  if (threadIdx.x == 0)
    part[(size_t)c * S + s] = t;
}

/* Channel c's S slices' sums, added in order. */
__device__ static double2 slices_sum(const double2 *part, unsigned c,
                                     unsigned S) {
  double a = 0, q = 0;
  for (unsigned s = 0; s < S; s++)
    a += part[(size_t)c * S + s].x, q += part[(size_t)c * S + s].y;
  return make_double2(a, q);
}

/* Forward, a thread per channel: the batch's mean and biased variance
 * from the slices' sums, the saved mean and 1 / sqrt(var + eps), and the
 * running statistics (the variance unbiased), as conv.c does. */
__global__ void k_bn_stats(const double2 *part, unsigned C, unsigned S,
                           double n, float eps, float momentum, float *mean,
                           float *ivar, float *rm, float *rv) {
  unsigned c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C)
    return;
  double2 t = slices_sum(part, c, S);
  double a = t.x, q = t.y;
  double mu = a / n, ss = q - a * mu; /* sum (x - mu)^2 */
  if (ss < 0)
    ss = 0;
  float m = (float)mu, var = (float)(ss / n);
  float unbiased = n > 1 ? (float)(ss / (n - 1)) : var;
  rm[c] = (1 - momentum) * rm[c] + momentum * m;
  rv[c] = (1 - momentum) * rv[c] + momentum * unbiased;
  mean[c] = m;
  ivar[c] = 1.0f / sqrtf(var + eps);
}

/* Backward, a thread per channel: dgamma += sum dy xhat, dbeta += sum dy,
 * and dx's coefficients: k = gamma ivar / n, sum dy and sum dy xhat as
 * floats (conv.c's order). */
__global__ void k_bn_grads(const double2 *part, unsigned C, unsigned S,
                           double n, const float *gamma, const float *ivar,
                           float *dgamma, float *dbeta, float *coef) {
  unsigned c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C)
    return;
  double2 t = slices_sum(part, c, S);
  float sb = (float)t.x, sg = (float)(t.y * (double)ivar[c]);
  dgamma[c] += sg;
  dbeta[c] += sb;
  coef[3 * c] = gamma[c] * ivar[c] / (float)n;
  coef[3 * c + 1] = sb;
  coef[3 * c + 2] = sg;
}

/* Value i's channel in an array of n (B, C, hw): 32-bit arithmetic where
 * n allows (a 64-bit division costs several times as much). */
__device__ static inline unsigned bn_channel(size_t i, size_t n, unsigned C,
                                             unsigned hw) {
  if (n <= 0xffffffffu)
    return (unsigned)i / hw % C;
  return (unsigned)(i / hw % C);
}

/* y = gamma (x - mean) ivar + beta, four values a thread where the
 * images' size allows (V4: hw a multiple of 4, so a float4 stays in one
 * channel). */
template <bool V4>
__global__ void k_bn_norm(const float *x, float *y, const float *mean,
                          const float *ivar, const float *gamma,
                          const float *beta, size_t n, unsigned C,
                          unsigned hw) {
  size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  size_t i = V4 ? 4 * t : t;
  if (i >= n)
    return;
  unsigned c = bn_channel(i, n, C, hw);
  float m = mean[c], is = ivar[c], ga = gamma[c], be = beta[c];
  if (V4) {
    float4 v = ((const float4 *)x)[t];
    v.x = ga * ((v.x - m) * is) + be;
    v.y = ga * ((v.y - m) * is) + be;
    v.z = ga * ((v.z - m) * is) + be;
    v.w = ga * ((v.w - m) * is) + be;
    ((float4 *)y)[t] = v;
  } else {
    y[i] = ga * ((x[i] - m) * is) + be;
  }
}

/* dx = k (n dy - sum dy - xhat sum dy xhat), xhat = (x - mean) ivar; set,
 * or added to dx with acc. */
template <bool V4>
__global__ void k_bn_dx(const float *x, const float *dy, float *dx,
                        const float *mean, const float *ivar,
                        const float *coef, size_t n, unsigned C, unsigned hw,
                        float count, bool acc) {
  size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  size_t i = V4 ? 4 * t : t;
  if (i >= n)
    return;
  unsigned c = bn_channel(i, n, C, hw);
  float m = mean[c], is = ivar[c];
  float k = coef[3 * c], sb = coef[3 * c + 1], sg = coef[3 * c + 2];
#define BN_DX(xv, dv) (k * (count * (dv) - sb - ((xv) - m) * is * sg))
  if (V4) {
    float4 v = ((const float4 *)x)[t], d = ((const float4 *)dy)[t];
    float4 r = make_float4(BN_DX(v.x, d.x), BN_DX(v.y, d.y), BN_DX(v.z, d.z),
                           BN_DX(v.w, d.w));
    if (acc) {
      float4 o = ((const float4 *)dx)[t];
      r.x += o.x, r.y += o.y, r.z += o.z, r.w += o.w;
    }
    ((float4 *)dx)[t] = r;
  } else {
    float r = BN_DX(x[i], dy[i]);
    dx[i] = acc ? dx[i] + r : r;
  }
#undef BN_DX
}

int trn__gpu_bn_fwd(trn__gpu *g, const trn__bn *bn, const float *x,
                    const float *gamma, const float *beta, float *y,
                    float *rm, float *rv, float *mean, float *ivar,
                    size_t B) {
  unsigned C = bn->c, hw = (unsigned)bn->hw, S = trn__bn_slices(C, B);
  size_t n = B * C * (size_t)hw;
  k_bn_sums<<<dim3(C, S), THREADS, 0, g->st>>>(x, NULL, NULL, g->bn_part, C,
                                               hw, (unsigned)B);
  k_bn_stats<<<blocks(C), THREADS, 0, g->st>>>(
      g->bn_part, C, S, (double)B * hw, bn->eps, bn->momentum, mean, ivar,
      rm, rv);
  if (hw % 4 == 0)
    k_bn_norm<true><<<blocks(n / 4), THREADS, 0, g->st>>>(
        x, y, mean, ivar, gamma, beta, n, C, hw);
  else
    k_bn_norm<false><<<blocks(n), THREADS, 0, g->st>>>(x, y, mean, ivar, gamma,
                                                       beta, n, C, hw);
  return CK(cudaGetLastError());
}

int trn__gpu_bn_bwd(trn__gpu *g, const trn__bn *bn, const float *x,
                    const float *dy, const float *gamma, const float *mean,
                    const float *ivar, float *dx, bool acc, float *dgamma,
                    float *dbeta, size_t B) {
  unsigned C = bn->c, hw = (unsigned)bn->hw, S = trn__bn_slices(C, B);
  size_t n = B * C * (size_t)hw;
  k_bn_sums<<<dim3(C, S), THREADS, 0, g->st>>>(x, dy, mean, g->bn_part, C,
                                               hw, (unsigned)B);
  k_bn_grads<<<blocks(C), THREADS, 0, g->st>>>(g->bn_part, C, S,
                                               (double)B * hw, gamma, ivar,
                                               dgamma, dbeta, g->bn_coef);
  if (dx && hw % 4 == 0)
    k_bn_dx<true><<<blocks(n / 4), THREADS, 0, g->st>>>(
        x, dy, dx, mean, ivar, g->bn_coef, n, C, hw, (float)(B * hw), acc);
  else if (dx)
    k_bn_dx<false><<<blocks(n), THREADS, 0, g->st>>>(
        x, dy, dx, mean, ivar, g->bn_coef, n, C, hw, (float)(B * hw), acc);
  return CK(cudaGetLastError());
}

/* ---- for tests: the kernels over host arrays ---------------------------- */

int trn__cuda_bn_run(int index, const trn__bn *bn, size_t B, const float *x,
                     const float *gamma, const float *beta, float *run_mean,
                     float *run_var, float *y, float *inv, const float *dy,
                     float *dx, bool acc, float *dgamma, float *dbeta) {
  size_t C = bn->c, n = B * C * bn->hw;
  trn__gpu g;
  memset(&g, 0, sizeof g);
  g.index = index;
  float *d[12] = {NULL}; /* x y dy dx, gamma beta rm rv mean ivar dg db */
  size_t len[12] = {n, n, n, n, C, C, C, C, C, C, C, C};
  const float *from[12] = {x,  NULL,    dy,      dx,   gamma, beta,
                           run_mean, run_var, NULL, NULL, dgamma, dbeta};
  int rc = CK(cudaSetDevice(index));
  if (!rc)
    rc = CK(cudaStreamCreateWithFlags(&g.st, cudaStreamNonBlocking));
  if (!rc &&
      cudaMalloc((void **)&g.bn_part,
                 C * trn__bn_slices(bn->c, B) * sizeof *g.bn_part) !=
          cudaSuccess)
    rc = -ENOMEM;
  if (!rc && cudaMalloc((void **)&g.bn_coef, 3 * C * sizeof(float)) !=
                 cudaSuccess)
    rc = -ENOMEM;
  for (int i = 0; i < 12 && !rc; i++) {
    if (cudaMalloc((void **)&d[i], len[i] * sizeof(float)) != cudaSuccess)
      rc = -ENOMEM;
    else if (from[i] && (i != 3 || acc))
      rc = CK(cudaMemcpy(d[i], from[i], len[i] * sizeof(float),
                         cudaMemcpyHostToDevice));
  }
  if (!rc)
    rc = trn__gpu_bn_fwd(&g, bn, d[0], d[4], d[5], d[1], d[6], d[7], d[8],
                         d[9], B);
  if (!rc)
    rc = trn__gpu_bn_bwd(&g, bn, d[0], d[2], d[4], d[8], d[9], d[3], acc,
                         d[10], d[11], B);
  if (!rc)
    rc = CK(cudaStreamSynchronize(g.st));
  float *to[12] = {NULL, y,        NULL,    dx,   NULL, NULL,
                   run_mean, run_var, NULL, inv, dgamma, dbeta};
  for (int i = 0; i < 12 && !rc; i++)
    if (to[i])
      rc = CK(cudaMemcpy(to[i], d[i], len[i] * sizeof(float),
                         cudaMemcpyDeviceToHost));
  for (int i = 0; i < 12; i++)
    (void)cudaFree(d[i]);
  (void)cudaFree(g.bn_part);
  (void)cudaFree(g.bn_coef);
  if (g.st)
    (void)cudaStreamDestroy(g.st);
  (void)cudaGetLastError();
  return rc;
}
