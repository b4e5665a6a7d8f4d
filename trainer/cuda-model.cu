/* cuda-model.cu: a layer list (model.c's mlp and cnn, resnet.c's
 * networks) on a CUDA device, and optimizer steps there.
 *
 * A layer reads the output of an earlier one (src; src2 too for a sum),
 * so a list may branch and join as a residual block does.  The device
 * holds its own copy of the flat parameter, gradient and buffer arrays,
 * every layer's output, and the gradients flowing down: a few buffers of
 * the widest output, each layer's output gradient in one of them from
 * when the first of its readers writes it until the layer itself has
 * used it (a chain needs two; the layer that writes a gradient first
 * sets it, the others add to it).  model.c
 * keeps the host copies the rest of the program sees in step
 * (trn__gpu_put, trn__gpu_get).  Matrix products go to cuBLAS, the
 * convolutions, their bias gradients and batch norm in evaluation to
 * cuDNN, batch norm in training to cuda-bn.cu, the rest to the small
 * kernels below.  By default the arithmetic is plain fp32:
 * cuBLAS's default math and cuDNN's FMA math, which never round to TF32
 * on the tensor cores (with tf32 both may).  Only deterministic
 * convolution algorithms, the fastest by cuDNN's timing, once per shape in
 * a process (or its heuristics' choice: conv_timed), so a pass gives the
 * same bits every time, within rounding of the CPU backend
 * (tests/test-trainer-cuda-model.c measures how close).  Dropout draws
 * the CPU's masks bit for bit (the same counter-based generator), so a
 * run moves between backends without changing its masks; the optimizer
 * kernels repeat optim.c's operations in its order.
 *
 * Every call is checked: CUDA, cuBLAS and cuDNN errors are logged with the
 * call and file:line and return -EIO; an allocation the device cannot
 * satisfy returns -ENOMEM with the sizes in the caller's message.
 */
#include "cuda-int.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

/* ---- kernels --------------------------------------------------------------- */

/* y[b, c, i] += bias[c] over (B, C, hw), then max(y, 0) with relu. */
__global__ void k_bias(float *y, const float *bias, size_t n, unsigned C,
                       size_t hw, bool relu) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n)
    return;
  float v = y[i] + bias[(i / hw) % C];
  y[i] = relu && !(v > 0) ? 0.0f : v;
}

__global__ void k_relu(const float *x, float *y, size_t n) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n)
    y[i] = x[i] > 0 ? x[i] : 0.0f;
}

/* dx = dy where the output y > 0, else 0 (with acc added to dx); dx may
 * be dy. */
__global__ void k_relu_bwd(const float *y, const float *dy, float *dx,
                           size_t n, bool acc) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n)
    return;
  float v = y[i] > 0 ? dy[i] : 0.0f;
  dx[i] = acc ? dx[i] + v : v;
}

/* A sum's backward: both inputs take dy (each set, or with acc added;
 * NULL: the model's input, which needs none). */
__global__ void k_add_bwd(const float *dy, float *da, bool acc_a, float *db,
                          bool acc_b, size_t n) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n)
    return;
  float v = dy[i];
  if (da)
    da[i] = acc_a ? da[i] + v : v;
  if (db)
    db[i] = acc_b ? db[i] + v : v;
}

/* Each of n planes of hw pixels to its mean, summed in double in pixel
 * order as resnet.c does. */
__global__ void k_avgpool(const float *x, float *y, size_t n, size_t hw) {
  size_t p = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (p >= n)
    return;
  double sum = 0;
  for (size_t k = 0; k < hw; k++)
    sum += x[p * hw + k];
  y[p] = (float)(sum / (double)hw);
}

__global__ void k_avgpool_bwd(const float *dy, float *dx, size_t n, size_t hw,
                              bool acc) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n)
    return;
  float v = dy[i / hw] / (float)hw;
  dx[i] = acc ? dx[i] + v : v;
}

/* db[j] += the sum over the batch of dy[i, j], in batch order. */
__global__ void k_colsum(const float *dy, float *db, size_t B, size_t out) {
  size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= out)
    return;
  float s = 0;
  for (size_t i = 0; i < B; i++)
    s += dy[i * out + j];
  db[j] += s;
}

/* The pooling windows: k x k, stride s, padding p, over planes of h x w
 * (padding is never the maximum). */
struct pool_shape {
  unsigned h, w, k, s, p, oh, ow;
};

/* One thread per output; the first maximum wins, as on the CPU. */
__global__ void k_pool(const float *x, float *y, uint32_t *arg, size_t n,
                       pool_shape q) {
  size_t o = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (o >= n)
    return;
  size_t plane = o / ((size_t)q.oh * q.ow);
  unsigned r = (unsigned)(o % ((size_t)q.oh * q.ow));
  int y0 = (int)(r / q.ow * q.s) - (int)q.p,
      x0 = (int)(r % q.ow * q.s) - (int)q.p;
  const float *xp = x + plane * q.h * q.w;
  uint32_t best = 0;
  float mx = 0;
  bool any = false;
  for (int dy = 0; dy < (int)q.k; dy++)
    for (int dx = 0; dx < (int)q.k; dx++) {
      int yi = y0 + dy, xj = x0 + dx;
      if (yi < 0 || yi >= (int)q.h || xj < 0 || xj >= (int)q.w)
        continue;
      uint32_t at = (uint32_t)yi * q.w + (uint32_t)xj;
      if (!any || xp[at] > mx)
        mx = xp[at], best = at, any = true;
    }
  y[o] = mx;
  arg[o] = best;
}

/* One thread per input pixel: the sum, in output order (the CPU's), of
 * the gradients of the windows whose maximum it was; 0 for none (with acc
 * added to dx). */
__global__ void k_pool_bwd(const float *dy, const uint32_t *arg, float *dx,
                           size_t n, pool_shape q, bool acc) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n)
    return;
  size_t plane = i / ((size_t)q.h * q.w);
  unsigned r = (unsigned)(i % ((size_t)q.h * q.w));
  int py = (int)(r / q.w) + (int)q.p, px = (int)(r % q.w) + (int)q.p;
  /* Windows oy with oy s <= py < oy s + k, likewise ox. */
  int y0 = py - (int)q.k + 1, x0 = px - (int)q.k + 1;
  int ylo = y0 > 0 ? (y0 + (int)q.s - 1) / (int)q.s : 0;
  int xlo = x0 > 0 ? (x0 + (int)q.s - 1) / (int)q.s : 0;
  int yhi = py / (int)q.s, xhi = px / (int)q.s;
  yhi = yhi < (int)q.oh - 1 ? yhi : (int)q.oh - 1;
  xhi = xhi < (int)q.ow - 1 ? xhi : (int)q.ow - 1;
  const float *dp = dy + plane * q.oh * q.ow;
  const uint32_t *ap = arg + plane * q.oh * q.ow;
  float v = 0;
  for (int oy = ylo; oy <= yhi; oy++)
    for (int ox = xlo; ox <= xhi; ox++) {
      size_t o = (size_t)oy * q.ow + (size_t)ox;
      if (ap[o] == r)
        v += dp[o];
    }
  dx[i] = acc ? dx[i] + v : v;
}

__device__ static uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* conv.c's trn__dropout_fwd, element i drawn from (base, i) alone. */
__global__ void k_dropout(const float *x, float *y, float *mask, size_t n,
                          uint64_t base, uint64_t cut, float keep) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n)
    return;
  uint64_t r = mix(base + 0x9e3779b97f4a7c15ull * (i + 1)) >> 32;
  float m = r < cut ? 0.0f : keep;
  mask[i] = m;
  y[i] = x[i] * m;
}

/* y = a b (with acc added to y). */
__global__ void k_mul(const float *a, const float *b, float *y, size_t n,
                      bool acc) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n)
    return;
  float v = a[i] * b[i];
  y[i] = acc ? y[i] + v : v;
}

/* layers.c's trn__softmax_ce, one thread per sample: its loss (double)
 * and hit, and with dl the gradient softmax - onehot times ds (the loss
 * scale; 1: none, the same bits). */
__global__ void k_softmax_ce(const float *z0, const int32_t *labels, float *dl,
                             float ds, double *loss, uint8_t *hit, size_t B,
                             size_t C) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= B)
    return;
  const float *z = z0 + i * C;
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
  loss[i] = lse - z[t];
  hit[i] = arg == t;
  if (dl)
    for (size_t j = 0; j < C; j++)
      dl[i * C + j] =
          (float)(exp((double)z[j] - lse) - (j == t ? 1.0 : 0.0)) * ds;
}

/* *bad = 1 when one of s's n floats is an inf or a NaN (every thread that
 * finds one writes the same 1: no order to it). */
__global__ void k_nonfinite(const float *s, size_t n, int *bad) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n && !isfinite(s[i]))
    *bad = 1;
}

/* g += s * inv, unless *bad. */
__global__ void k_unscale_add(float *g, const float *s, size_t n, float inv,
                              const int *bad) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n && !*bad)
    g[i] += s[i] * inv;
}

/* ---- the device copy --------------------------------------------------------- */

int trn__dalloc(trn__gpu *g, void **p, size_t bytes, const char *what,
                  char *err, size_t err_len) {
  if (bytes == 0)
    bytes = 1;
  cudaError_t e = cudaMalloc(p, bytes);
  if (e == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    size_t fr = 0, tot = 0;
    (void)cudaMemGetInfo(&fr, &tot);
    return trn__fail(err, err_len, -ENOMEM,
                     "cuda:%d: out of memory: %.1f MiB asked for %s with "
                     "%.1f MiB held; %.1f of %.1f MiB free",
                     g->index, bytes / 1048576.0, what, g->bytes / 1048576.0,
                     fr / 1048576.0, tot / 1048576.0);
  }
  if (CK(e))
    return trn__fail(err, err_len, -EIO,
                     "cuda:%d: cudaMalloc of %zu bytes "
                     "for %s failed (see the log)",
                     g->index, bytes, what);
  g->bytes += bytes;
  return 0;
}

static int set4d(cudnnTensorDescriptor_t d, size_t n, unsigned c, unsigned h,
                 unsigned w) {
  return DK(cudnnSetTensor4dDescriptor(d, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT,
                                       (int)n, (int)c, (int)h, (int)w));
}

/* The first deterministic algorithm of perf (n results, the heuristics'
 * best first) that computes in fp32 (with tf32: may round inputs to TF32
 * on the tensor cores; with fp16: to fp16 too) and needs at most WS_MAX
 * bytes: its index, or -1. */
#define WS_MAX ((size_t)1 << 30)
template <typename P>
static int pick(const P *perf, int n, bool tf32, bool fp16) {
  for (int i = 0; i < n; i++)
    if (perf[i].status == CUDNN_STATUS_SUCCESS &&
        perf[i].determinism == CUDNN_DETERMINISTIC &&
        (tf32 || perf[i].mathType != CUDNN_TENSOR_OP_MATH) &&
        (fp16 || perf[i].mathType != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) &&
        perf[i].memory <= WS_MAX)
      return i;
  return -1;
}

/* The three algorithms of a convolution shape, chosen by timing. */
typedef struct algo_key {
  int index;
  unsigned c, h, w, oc, k, pad, stride;
  size_t B;
  bool tf32, fp16, data;
} algo_key;
typedef struct algo_memo {
  algo_key key;
  cudnnConvolutionFwdAlgo_t fwd;
  cudnnConvolutionBwdFilterAlgo_t bwd_filter;
  cudnnConvolutionBwdDataAlgo_t bwd_data;
  size_t mem[3];
} algo_memo;

/* What each shape's timing chose, once per process: every model of the
 * process on that device then computes the same bits for the same input. */
static pthread_mutex_t memo_lock = PTHREAD_MUTEX_INITIALIZER;
static algo_memo memo[512];
static size_t nmemo;

/* Whether convolutions take the deterministic algorithms cuDNN times
 * fastest (the default) rather than its heuristics' first
 * (TRN_CUDA_CONV=heuristic in the environment).  Timing is what makes
 * ResNet-18 as fast as PyTorch's cudnn.benchmark (0.95 of its speed
 * against 0.80 with the heuristics' choice, H100, fp32), but timings vary
 * between runs: two processes may choose differently and so compute
 * different bits (within fp32 rounding), and a run restored from a
 * checkpoint would not repeat its losses exactly.  Within a process the
 * choice is kept, so its passes stay deterministic; the heuristics give
 * the same bits in every process on the same GPU and cuDNN. */
static bool conv_timed(void) {
  const char *e = getenv("TRN_CUDA_CONV");
  if (!e || strcmp(e, "timed") == 0)
    return true;
  if (strcmp(e, "heuristic") == 0)
    return false;
  trn__log(TRN_LOG_WARN,
           "TRN_CUDA_CONV=%.40s: expected timed or heuristic; timing the "
           "convolutions' algorithms",
           e);
  return true;
}

/* The algorithms of convolution i from cudnnFind* (timed, sorted fastest
 * first), remembered in memo; pick() takes the first of each kind.  The
 * lock is held while timing so one shape is timed once. */
static int conv_find(trn__gpu *g, size_t i, gconv *c, size_t mem[3], char *err,
                     size_t err_len) {
  const trn__conv *cv = &g->l[i].cv;
  algo_key key;
  memset(&key, 0, sizeof key); /* the padding too: compared by memcmp */
  key.index = g->index;
  key.c = cv->c, key.h = cv->h, key.w = cv->w, key.oc = cv->oc, key.k = cv->k;
  key.pad = cv->pad, key.stride = cv->stride ? cv->stride : 1;
  key.B = g->max_batch, key.tf32 = g->tf32, key.fp16 = g->fp16;
  key.data = g->l[i].src >= 0;
  pthread_mutex_lock(&memo_lock);
  for (size_t m = 0; m < nmemo; m++)
    if (memcmp(&memo[m].key, &key, sizeof key) == 0) {
      c->fwd = memo[m].fwd, c->bwd_filter = memo[m].bwd_filter;
      c->bwd_data = memo[m].bwd_data;
      memcpy(mem, memo[m].mem, sizeof memo[m].mem);
      pthread_mutex_unlock(&memo_lock);
      return 0;
    }
  enum { N = 16 };
  int n = 0, k, rc = 0;
  const char *what = NULL;
  cudnnConvolutionFwdAlgoPerf_t pf[N];
  cudnnConvolutionBwdFilterAlgoPerf_t pw[N];
  cudnnConvolutionBwdDataAlgoPerf_t pd[N];
  mem[2] = 0;
  if ((rc = DK(cudnnFindConvolutionForwardAlgorithm(g->dnn, c->x, c->w, c->cv,
                                                    c->y, N, &n, pf))))
    goto out;
  if ((k = pick(pf, n, g->tf32, g->fp16)) < 0) {
    what = "forward";
    goto out;
  }
  c->fwd = pf[k].algo, mem[0] = pf[k].memory;
  if ((rc = DK(cudnnFindConvolutionBackwardFilterAlgorithm(
           g->dnn, c->x, c->y, c->cv, c->w, N, &n, pw))))
    goto out;
  if ((k = pick(pw, n, g->tf32, g->fp16)) < 0) {
    what = "filter-gradient";
    goto out;
  }
  c->bwd_filter = pw[k].algo, mem[1] = pw[k].memory;
  if (key.data) {
    if ((rc = DK(cudnnFindConvolutionBackwardDataAlgorithm(
             g->dnn, c->w, c->y, c->cv, c->x, N, &n, pd))))
      goto out;
    if ((k = pick(pd, n, g->tf32, g->fp16)) < 0) {
      what = "data-gradient";
      goto out;
    }
    c->bwd_data = pd[k].algo, mem[2] = pd[k].memory;
  }
  if (nmemo < sizeof memo / sizeof *memo)
    memo[nmemo++] = (algo_memo){key,          c->fwd, c->bwd_filter,
                                c->bwd_data, {mem[0], mem[1], mem[2]}};
out:
  pthread_mutex_unlock(&memo_lock);
  if (what)
    return trn__fail(err, err_len, -EIO,
                     "cuda:%d: no deterministic %s algorithm for "
                     "convolution %zu",
                     g->index, what, i);
  return rc;
}

/* The algorithms of convolution i: the first of each kind that pick()
 * takes from cuDNN's heuristics. */
static int conv_heuristic(trn__gpu *g, size_t i, gconv *c, size_t mem[3],
                          char *err, size_t err_len) {
  enum { N = 16 };
  int n = 0, k;
  cudnnConvolutionFwdAlgoPerf_t pf[N];
  TRY(DK(cudnnGetConvolutionForwardAlgorithm_v7(g->dnn, c->x, c->w, c->cv, c->y,
                                                N, &n, pf)));
  if ((k = pick(pf, n, g->tf32, g->fp16)) < 0)
    return trn__fail(err, err_len, -EIO,
                     "cuda:%d: no deterministic "
                     "forward algorithm for convolution %zu",
                     g->index, i);
  c->fwd = pf[k].algo, mem[0] = pf[k].memory;
  cudnnConvolutionBwdFilterAlgoPerf_t pw[N];
  TRY(DK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
      g->dnn, c->x, c->y, c->cv, c->w, N, &n, pw)));
  if ((k = pick(pw, n, g->tf32, g->fp16)) < 0)
    return trn__fail(err, err_len, -EIO,
                     "cuda:%d: no deterministic "
                     "filter-gradient algorithm for convolution %zu",
                     g->index, i);
  c->bwd_filter = pw[k].algo, mem[1] = pw[k].memory;
  if (g->l[i].src >= 0) { /* the model's input needs no gradient */
    cudnnConvolutionBwdDataAlgoPerf_t pd[N];
    TRY(DK(cudnnGetConvolutionBackwardDataAlgorithm_v7(
        g->dnn, c->w, c->y, c->cv, c->x, N, &n, pd)));
    if ((k = pick(pd, n, g->tf32, g->fp16)) < 0)
      return trn__fail(err, err_len, -EIO,
                       "cuda:%d: no deterministic "
                       "data-gradient algorithm for convolution %zu",
                       g->index, i);
    c->bwd_data = pd[k].algo, mem[2] = pd[k].memory;
  }
  return 0;
}

/* Descriptors for convolution i at max_batch, and its three algorithms,
 * timed or from the heuristics (conv_timed).  *ws grows to the most any
 * of them needs. */
static int conv_setup(trn__gpu *g, size_t i, size_t *ws, char *err,
                      size_t err_len) {
  const trn__conv *cv = &g->l[i].cv;
  gconv *c = &g->conv[i];
  size_t B = g->max_batch;
  TRY(DK(cudnnCreateTensorDescriptor(&c->x)));
  TRY(DK(cudnnCreateTensorDescriptor(&c->y)));
  TRY(DK(cudnnCreateTensorDescriptor(&c->b)));
  TRY(DK(cudnnCreateFilterDescriptor(&c->w)));
  TRY(DK(cudnnCreateConvolutionDescriptor(&c->cv)));
  unsigned stride = cv->stride ? cv->stride : 1;
  TRY(set4d(c->x, B, cv->c, cv->h, cv->w));
  TRY(set4d(c->y, B, cv->oc, cv->oh, cv->ow));
  TRY(set4d(c->b, 1, cv->oc, 1, 1));
  TRY(DK(cudnnSetFilter4dDescriptor(c->w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW,
                                    (int)cv->oc, (int)cv->c, (int)cv->k,
                                    (int)cv->k)));
  TRY(DK(cudnnSetConvolution2dDescriptor(
      c->cv, (int)cv->pad, (int)cv->pad, (int)stride, (int)stride, 1, 1,
      CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT)));
  /* FMA: never TF32.  DEFAULT: TF32 where cuDNN finds it faster (what
   * PyTorch's allow_tf32 sets).  ALLOW_CONVERSION: fp16 inputs on the
   * tensor cores too. */
  TRY(DK(cudnnSetConvolutionMathType(
      c->cv, g->fp16   ? CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION
             : g->tf32 ? CUDNN_DEFAULT_MATH
                       : CUDNN_FMA_MATH)));
  size_t mem[3] = {0, 0, 0};
  TRY(g->timed ? conv_find(g, i, c, mem, err, err_len)
               : conv_heuristic(g, i, c, mem, err, err_len));
  for (int m = 0; m < 3; m++)
    *ws = mem[m] > *ws ? mem[m] : *ws;
  if (g->prof)
    trn__log(TRN_LOG_INFO,
             "cuda:%d profile: conv %zu algorithms: forward "
             "%d, filter gradient %d, data gradient %d",
             g->index, i, (int)c->fwd, (int)c->bwd_filter,
             g->l[i].src >= 0 ? (int)c->bwd_data : -1);
  return 0;
}

/* Checks the list's wiring (each layer reads earlier ones of the width it
 * takes; every output but the last is read) and plans the gradient
 * buffers, walking the layers as backward does: a layer's output gradient
 * takes a free buffer when its first reader writes it, and frees it once
 * the layer has passed it on. */
static int plan(trn__gpu *g, char *err, size_t err_len) {
  size_t nl = g->nl;
  for (size_t i = 0; i < nl; i++) {
    const trn__layer *L = &g->l[i];
    int srcs[2] = {L->src, L->kind == TRN__L_ADD ? L->src2 : -1};
    for (int k = 0; k < (L->kind == TRN__L_ADD ? 2 : 1); k++) {
      int s = srcs[k];
      size_t w = s < 0 ? g->in : g->l[s].out;
      if (s < -1 || s >= (int)i || w != L->in || (i == 0 && s != -1) ||
          (k == 1 && s == srcs[0]))
        return trn__fail(err, err_len, -EINVAL,
                         "cuda: layer %zu reads layer %d (%zu wide) for an "
                         "input of %zu",
                         i, s, w, L->in);
    }
    g->widest = L->out > g->widest ? L->out : g->widest;
  }
  int *freel = (int *)malloc((2 * nl + 1) * sizeof *freel);
  if (!freel)
    return trn__fail(err, err_len, -ENOMEM, "out of memory");
  int nfree = 0, nbuf = 0;
#define TAKE() (nfree ? freel[--nfree] : nbuf++)
  for (size_t i = 0; i < nl; i++)
    g->grad[i] = -1;
  g->grad[nl - 1] = TAKE(); /* the logits' */
  int rc = 0;
  for (size_t i = nl; i-- > 0;) {
    const trn__layer *L = &g->l[i];
    if (g->grad[i] < 0) {
      rc = trn__fail(err, err_len, -EINVAL,
                     "cuda: layer %zu's output is read by no layer", i);
      break;
    }
    if (L->src >= 0 && !(g->acc[i] = g->grad[L->src] >= 0))
      g->grad[L->src] = TAKE();
    if (L->kind == TRN__L_ADD && L->src2 >= 0 &&
        !(g->acc2[i] = g->grad[L->src2] >= 0))
      g->grad[L->src2] = TAKE();
    freel[nfree++] = g->grad[i];
  }
#undef TAKE
  free(freel);
  g->ndbuf = (size_t)nbuf;
  return rc;
}

int trn__gpu_core(trn__gpu *g, char *err, size_t err_len) {
  TRY(CK(cudaSetDevice(g->index)));
  TRY(CK(cudaStreamCreateWithFlags(&g->st, cudaStreamNonBlocking)));
  TRY(BK(cublasCreate(&g->blas)));
  TRY(BK(cublasSetStream(g->blas, g->st)));
  /* Plain fp32 (CUBLAS_DEFAULT_MATH never uses TF32 for sgemm), or TF32
   * on the tensor cores. */
  TRY(BK(cublasSetMathMode(g->blas, g->tf32 ? CUBLAS_TF32_TENSOR_OP_MATH
                                            : CUBLAS_DEFAULT_MATH)));
  TRY(DK(cudnnCreate(&g->dnn)));
  TRY(DK(cudnnSetStream(g->dnn, g->st)));
  DALLOC(g->params, g->nparams, "the parameters");
  DALLOC(g->grads, g->nparams, "the gradients");
  DALLOC(g->buffers, g->nbuffers, "the buffers");
  return CK(cudaMemsetAsync(g->grads, 0, g->nparams * sizeof(float), g->st));
}

static int gpu_build(trn__gpu *g, char *err, size_t err_len) {
  size_t B = g->max_batch;
  TRY(plan(g, err, err_len));
  TRY(trn__gpu_core(g, err, err_len));
  const char *prof = getenv("TRN_CUDA_PROFILE");
  if (prof && strcmp(prof, "1") == 0) {
    for (size_t i = 0; i <= g->nl; i++) {
      TRY(CK(cudaEventCreate(&g->fev[i])));
      TRY(CK(cudaEventCreate(&g->bev[i])));
    }
    g->prof = true;
  }
  DALLOC(g->x, B * g->in, "the input batch");
  DALLOC(g->y, B, "the labels");
  DALLOC(g->loss, B, "the losses");
  DALLOC(g->hit, B, "the hits");
  TRY(CK(cudaMallocHost((void **)&g->h_loss, B * sizeof *g->h_loss)));
  TRY(CK(cudaMallocHost((void **)&g->h_hit, B * sizeof *g->h_hit)));
  size_t bn_part = 0; /* the widest batch norm's sums */
  unsigned bn_c = 0;
  for (size_t i = 0; i < g->nl; i++) {
    const trn__layer *L = &g->l[i];
    DALLOC(g->act[i], B * L->out, "the activations");
    if (L->kind == TRN__L_DROPOUT)
      DALLOC(g->mask[i], B * L->out, "the dropout masks");
    if (L->kind == TRN__L_POOL)
      DALLOC(g->arg[i], B * L->out, "the pooling indices");
    if (L->kind == TRN__L_BN) {
      gbn *b = &g->bn[i];
      TRY(DK(cudnnCreateTensorDescriptor(&b->x)));
      TRY(DK(cudnnCreateTensorDescriptor(&b->p)));
      TRY(set4d(b->p, 1, L->bn.c, 1, 1));
      DALLOC(b->mean, L->bn.c, "batch norm's statistics");
      DALLOC(b->ivar, L->bn.c, "batch norm's statistics");
      size_t np = (size_t)L->bn.c * trn__bn_slices(L->bn.c, B);
      bn_part = np > bn_part ? np : bn_part;
      bn_c = L->bn.c > bn_c ? L->bn.c : bn_c;
    }
  }
  if (bn_c) {
    DALLOC(g->bn_part, bn_part, "batch norm's sums");
    DALLOC(g->bn_coef, 3 * bn_c, "batch norm's sums");
  }
  for (size_t i = 0; i < g->ndbuf; i++)
    DALLOC(g->dbuf[i], B * g->widest, "the gradients flowing down");
  size_t ws = 0;
  for (size_t i = 0; i < g->nl; i++)
    if (g->l[i].kind == TRN__L_CONV)
      TRY(conv_setup(g, i, &ws, err, err_len));
  g->ws_bytes = ws;
  TRY(trn__dalloc(g, &g->ws, ws, "the convolutions' workspace", err, err_len));
  return CK(cudaStreamSynchronize(g->st));
}

int trn__gpu_new(int index, const trn__layer *l, size_t nl, size_t nparams,
                 size_t nbuffers, size_t max_batch, int precision,
                 trn__gpu **out, char *err, size_t err_len) {
  *out = NULL;
  if (nl == 0 || nl > 4096)
    return trn__fail(err, err_len, -EINVAL, "cuda: %zu layers", nl);
  trn__gpu *g = (trn__gpu *)calloc(1, sizeof *g);
  if (!g)
    return trn__fail(err, err_len, -ENOMEM, "out of memory");
  g->index = index;
  g->tf32 = precision != TRN_FP32; /* bf16: the convolutions on TF32 */
  g->bf16 = precision == TRN_BF16;
  g->fp16 = precision == TRN_FP16;
  g->timed = conv_timed();
  g->nl = nl;
  g->nparams = nparams;
  g->nbuffers = nbuffers;
  g->max_batch = max_batch;
  g->in = l[0].in;
  g->classes = l[nl - 1].out;
#define HOST(p, n) ((p) = (decltype(p))calloc((n), sizeof *(p)))
  if (!HOST(g->l, nl) || !HOST(g->act, nl) || !HOST(g->mask, nl) ||
      !HOST(g->arg, nl) || !HOST(g->conv, nl) || !HOST(g->bn, nl) ||
      !HOST(g->grad, nl) || !HOST(g->acc, nl) || !HOST(g->acc2, nl) ||
      !HOST(g->dbuf, 2 * nl + 1) ||
      !HOST(g->fev, nl + 1) || !HOST(g->bev, nl + 1) ||
      !HOST(g->fwd_ms, nl) || !HOST(g->bwd_ms, nl)) {
#undef HOST
    trn__gpu_free(g);
    return trn__fail(err, err_len, -ENOMEM, "out of memory");
  }
  memcpy(g->l, l, nl * sizeof *l);
  if (err_len)
    err[0] = '\0';
  int rc = gpu_build(g, err, err_len);
  if (rc) {
    if (err_len && !err[0])
      trn__fail(err, err_len, rc,
                "cuda:%d: setting up the model failed "
                "(see the log)",
                index);
    trn__gpu_free(g);
    return rc;
  }
  *out = g;
  return 0;
}

/* Logs the profile: each layer's mean milliseconds per pass. */
static void profile_log(const trn__gpu *g) {
  static const char *const kinds[] = {"linear",  "relu",       "conv",
                                      "max-pool", "dropout",   "batch norm",
                                      "add",      "avg-pool"};
  if (!g->passes)
    return;
  double f = 0, b = 0;
  for (size_t i = 0; i < g->nl; i++)
    f += g->fwd_ms[i], b += g->bwd_ms[i];
  trn__log(TRN_LOG_INFO,
           "cuda:%d profile: %zu passes (%zu training): "
           "forward %.3f ms, backward %.3f ms a pass",
           g->index, g->passes, g->train_passes, f / g->passes,
           g->train_passes ? b / g->train_passes : 0.0);
  for (size_t i = 0; i < g->nl; i++)
    trn__log(TRN_LOG_INFO,
             "cuda:%d profile: layer %zu %-10s forward %.3f "
             "ms, backward %.3f ms",
             g->index, i, kinds[g->l[i].kind], g->fwd_ms[i] / g->passes,
             g->train_passes ? g->bwd_ms[i] / g->train_passes : 0.0);
}

void trn__gpu_free(trn__gpu *g) {
  if (!g)
    return;
  (void)cudaSetDevice(g->index);
  if (g->st)
    (void)cudaStreamSynchronize(g->st);
  trn__ggpt_free(g);
  if (g->prof) {
    profile_log(g);
    for (size_t i = 0; i <= g->nl; i++) {
      (void)cudaEventDestroy(g->fev[i]);
      (void)cudaEventDestroy(g->bev[i]);
    }
  }
  if (g->kept) /* a pass failed inside; its array is sgrads */
    g->grads = g->kept;
  void *bufs[] = {g->params,    g->grads,     g->buffers, g->x,
                  g->y,         g->loss,      g->hit,     g->ws,
                  g->lamb_part, g->lamb_step, g->sgrads,  g->bad};
  for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
    (void)cudaFree(bufs[i]);
  (void)cudaFreeHost(g->h_loss);
  (void)cudaFreeHost(g->h_hit);
  (void)cudaFreeHost(g->h_bad);
  for (size_t i = 0; g->dbuf && i < g->ndbuf; i++)
    (void)cudaFree(g->dbuf[i]);
  for (size_t i = 0; g->bn && i < g->nl; i++) { /* all or none (new) */
    (void)cudaFree(g->act[i]);
    (void)cudaFree(g->mask[i]);
    (void)cudaFree(g->arg[i]);
    gconv *c = &g->conv[i];
    if (c->x)
      (void)cudnnDestroyTensorDescriptor(c->x);
    if (c->y)
      (void)cudnnDestroyTensorDescriptor(c->y);
    if (c->b)
      (void)cudnnDestroyTensorDescriptor(c->b);
    if (c->w)
      (void)cudnnDestroyFilterDescriptor(c->w);
    if (c->cv)
      (void)cudnnDestroyConvolutionDescriptor(c->cv);
    gbn *b = &g->bn[i];
    if (b->x)
      (void)cudnnDestroyTensorDescriptor(b->x);
    if (b->p)
      (void)cudnnDestroyTensorDescriptor(b->p);
    (void)cudaFree(b->mean);
    (void)cudaFree(b->ivar);
  }
  (void)cudaFree(g->bn_part);
  (void)cudaFree(g->bn_coef);
  if (g->dnn)
    (void)cudnnDestroy(g->dnn);
  if (g->blas)
    (void)cublasDestroy(g->blas);
  if (g->st)
    (void)cudaStreamDestroy(g->st);
  (void)cudaGetLastError();
  void *host[] = {g->l,     g->act,  g->mask, g->arg, g->conv,
                  g->bn,    g->grad, g->acc,  g->acc2,
                  g->dbuf,  g->fev,  g->bev,  g->fwd_ms, g->bwd_ms};
  for (size_t i = 0; i < sizeof host / sizeof *host; i++)
    free(host[i]);
  free(g);
}

size_t trn__gpu_bytes(const trn__gpu *g) { return g->bytes; }

static float *array(trn__gpu *g, int which, size_t *n) {
  switch (which) {
  case TRN__GPU_PARAMS: *n = g->nparams; return g->params;
  case TRN__GPU_GRADS: *n = g->nparams; return g->grads;
  default: *n = g->nbuffers; return g->buffers;
  }
}

int trn__gpu_put(trn__gpu *g, int which, const float *src) {
  size_t n;
  float *d = array(g, which, &n);
  if (n == 0)
    return 0;
  TRY(CK(cudaSetDevice(g->index)));
  /* From pageable memory the copy is done when the call returns. */
  TRY(CK(
      cudaMemcpyAsync(d, src, n * sizeof *d, cudaMemcpyHostToDevice, g->st)));
  return CK(cudaStreamSynchronize(g->st));
}

int trn__gpu_get(trn__gpu *g, int which, float *dst) {
  size_t n;
  float *d = array(g, which, &n);
  if (n == 0)
    return 0;
  TRY(CK(cudaSetDevice(g->index)));
  TRY(CK(
      cudaMemcpyAsync(dst, d, n * sizeof *d, cudaMemcpyDeviceToHost, g->st)));
  return CK(cudaStreamSynchronize(g->st));
}

int trn__gpu_zero_grads(trn__gpu *g) {
  TRY(CK(cudaSetDevice(g->index)));
  return CK(cudaMemsetAsync(g->grads, 0, g->nparams * sizeof(float), g->st));
}

int trn__gpu_layer_out(trn__gpu *g, size_t i, size_t B, float *y,
                       uint32_t *arg) {
  if (i >= g->nl || !g->act || B > g->max_batch ||
      (arg && g->l[i].kind != TRN__L_POOL))
    return -EINVAL;
  size_t n = B * g->l[i].out;
  TRY(CK(cudaSetDevice(g->index)));
  TRY(CK(cudaMemcpyAsync(y, g->act[i], n * sizeof *y, cudaMemcpyDeviceToHost,
                         g->st)));
  if (arg)
    TRY(CK(cudaMemcpyAsync(arg, g->arg[i], n * sizeof *arg,
                           cudaMemcpyDeviceToHost, g->st)));
  return CK(cudaStreamSynchronize(g->st));
}

/* The workspace a call at batch B needs for convolution i's algorithms
 * (cuDNN may want more for a batch other than max_batch): grows it
 * when short. */
static int conv_ws(trn__gpu *g, size_t i, bool train) {
  gconv *c = &g->conv[i];
  size_t need = 0, s = 0;
  TRY(DK(cudnnGetConvolutionForwardWorkspaceSize(g->dnn, c->x, c->w, c->cv,
                                                 c->y, c->fwd, &s)));
  need = s > need ? s : need;
  if (train) {
    TRY(DK(cudnnGetConvolutionBackwardFilterWorkspaceSize(
        g->dnn, c->x, c->y, c->cv, c->w, c->bwd_filter, &s)));
    need = s > need ? s : need;
    if (g->l[i].src >= 0) {
      TRY(DK(cudnnGetConvolutionBackwardDataWorkspaceSize(
          g->dnn, c->w, c->y, c->cv, c->x, c->bwd_data, &s)));
      need = s > need ? s : need;
    }
  }
  if (need <= g->ws_bytes)
    return 0;
  TRY(CK(cudaStreamSynchronize(g->st)));
  (void)cudaFree(g->ws);
  g->bytes -= g->ws_bytes ? g->ws_bytes : 1;
  g->ws = NULL;
  g->ws_bytes = 0;
  char err[160];
  int rc = trn__dalloc(g, &g->ws, need, "the convolutions' workspace", err,
                       sizeof err);
  if (rc) {
    trn__log(TRN_LOG_ERROR, "%s", err);
    return rc;
  }
  g->ws_bytes = need;
  return 0;
}

static pool_shape pool_of(const trn__layer *L) {
  pool_shape q;
  q.h = L->h, q.w = L->w, q.k = L->k, q.s = L->s ? L->s : L->k, q.p = L->pad;
  q.oh = (L->h + 2 * q.p - q.k) / q.s + 1;
  q.ow = (L->w + 2 * q.p - q.k) / q.s + 1;
  return q;
}

static int forward(trn__gpu *g, size_t B, bool train, uint64_t seed,
                   uint64_t *calls) {
  const float one = 1.0f, zero = 0.0f;
  for (size_t i = 0; i < g->nl; i++) {
    const trn__layer *L = &g->l[i];
    const float *in = L->src < 0 ? g->x : g->act[L->src];
    float *y = g->act[i];
    const float *w = g->params + L->w_off, *b = g->params + L->b_off;
    size_t n = B * L->out;
    if (g->prof)
      TRY(CK(cudaEventRecord(g->fev[i], g->st)));
    switch (L->kind) {
    case TRN__L_LINEAR:
      /* Row-major y (B, out) = x (B, in) W^T: column-major, y^T = W x^T
       * with W^T stored (in, out) column-major. */
      TRY(BK(trn__gemm(g, CUBLAS_OP_T, CUBLAS_OP_N, (int)L->out, (int)B,
                       (int)L->in, &one, w, (int)L->in, in, (int)L->in, &zero,
                       y, (int)L->out)));
      k_bias<<<blocks(n), THREADS, 0, g->st>>>(y, b, n, (unsigned)L->out, 1,
                                               false);
      break;
    case TRN__L_RELU: k_relu<<<blocks(n), THREADS, 0, g->st>>>(in, y, n); break;
    case TRN__L_CONV: {
      gconv *c = &g->conv[i];
      const trn__conv *cv = &L->cv;
      TRY(set4d(c->x, B, cv->c, cv->h, cv->w));
      TRY(set4d(c->y, B, cv->oc, cv->oh, cv->ow));
      TRY(conv_ws(g, i, train));
      TRY(DK(cudnnConvolutionForward(g->dnn, &one, c->x, in, c->w, w, c->cv,
                                     c->fwd, g->ws, g->ws_bytes, &zero, c->y,
                                     y)));
      if (L->bias)
        k_bias<<<blocks(n), THREADS, 0, g->st>>>(
            y, b, n, cv->oc, (size_t)cv->oh * cv->ow, cv->relu);
      else if (cv->relu)
        k_relu<<<blocks(n), THREADS, 0, g->st>>>(y, y, n);
      break;
    }
    case TRN__L_POOL:
      k_pool<<<blocks(n), THREADS, 0, g->st>>>(in, y, g->arg[i], n,
                                               pool_of(L));
      break;
    case TRN__L_ADD:
      k_add<<<blocks(n), THREADS, 0, g->st>>>(
          in, L->src2 < 0 ? g->x : g->act[L->src2], y, n);
      break;
    case TRN__L_AVGPOOL:
      k_avgpool<<<blocks(n), THREADS, 0, g->st>>>(in, y, n,
                                                  (size_t)L->h * L->w);
      break;
    case TRN__L_DROPOUT:
      if (train) {
        uint64_t base, cut; /* the CPU's draw (conv.c) */
        trn__dropout_draw(L->p, seed, (*calls)++, &base, &cut);
        k_dropout<<<blocks(n), THREADS, 0, g->st>>>(in, y, g->mask[i], n, base,
                                                    cut, 1.0f / (1.0f - L->p));
      } else {
        TRY(CK(cudaMemcpyAsync(y, in, n * sizeof *y, cudaMemcpyDeviceToDevice,
                               g->st)));
      }
      break;
    case TRN__L_BN: {
      gbn *bn = &g->bn[i];
      float *rm = g->buffers + L->buf_off, *rv = rm + L->bn.c;
      if (train) {
        TRY(trn__gpu_bn_fwd(g, &L->bn, in, w, b, y, rm, rv, bn->mean,
                            bn->ivar, B));
        break;
      }
      /* Evaluation on cuDNN: its descriptor at this batch. */
      TRY(set4d(bn->x, B, L->bn.c, (unsigned)L->bn.hw, 1));
      TRY(DK(cudnnBatchNormalizationForwardInference(
          g->dnn, CUDNN_BATCHNORM_SPATIAL, &one, &zero, bn->x, in, bn->x, y,
          bn->p, w, b, rm, rv, (double)L->bn.eps)));
      break;
    }
    }
    TRY(CK(cudaGetLastError())); /* a kernel that failed to launch */
  }
  if (g->prof)
    TRY(CK(cudaEventRecord(g->fev[g->nl], g->st)));
  return 0;
}

/* Backward from the logits' gradient (in dbuf[grad[nl - 1]]), as model.c's
 * and resnet.c's CPU passes: each layer sets or adds to its inputs'
 * gradients (beta 0 or 1 for cuBLAS and cuDNN). */
static int backward(trn__gpu *g, size_t B) {
  const float one = 1.0f, zero = 0.0f;
  if (g->prof)
    TRY(CK(cudaEventRecord(g->bev[g->nl], g->st)));
  for (size_t i = g->nl; i-- > 0;) {
    const trn__layer *L = &g->l[i];
    const float *in = L->src < 0 ? g->x : g->act[L->src];
    const float *w = g->params + L->w_off;
    float *dw = g->grads + L->w_off, *db = g->grads + L->b_off;
    float *d = g->dbuf[g->grad[i]];
    float *dx = L->src >= 0 ? g->dbuf[g->grad[L->src]] : NULL;
    bool acc = g->acc[i];
    const float *beta = acc ? &one : &zero;
    size_t n = B * L->out, nin = B * L->in;
    switch (L->kind) {
    case TRN__L_LINEAR:
      /* dW (out, in) += dy^T x: column-major dW^T (in, out) = x^T dy. */
      TRY(BK(trn__gemm(g, CUBLAS_OP_N, CUBLAS_OP_T, (int)L->in, (int)L->out,
                       (int)B, &one, in, (int)L->in, d, (int)L->out, &one, dw,
                       (int)L->in)));
      k_colsum<<<blocks(L->out), THREADS, 0, g->st>>>(d, db, B, L->out);
      /* dx (B, in) = dy W: column-major dx^T = W^T dy^T. */
      if (dx)
        TRY(BK(trn__gemm(g, CUBLAS_OP_N, CUBLAS_OP_N, (int)L->in, (int)B,
                         (int)L->out, &one, w, (int)L->in, d, (int)L->out,
                         beta, dx, (int)L->in)));
      break;
    case TRN__L_CONV: {
      gconv *c = &g->conv[i];
      const trn__conv *cv = &L->cv;
      TRY(set4d(c->x, B, cv->c, cv->h, cv->w));
      TRY(set4d(c->y, B, cv->oc, cv->oh, cv->ow));
      TRY(conv_ws(g, i, true));
      if (cv->relu) /* through the fused relu, in place */
        k_relu_bwd<<<blocks(n), THREADS, 0, g->st>>>(g->act[i], d, d, n,
                                                     false);
      if (L->bias)
        TRY(DK(cudnnConvolutionBackwardBias(g->dnn, &one, c->y, d, &one, c->b,
                                            db)));
      TRY(DK(cudnnConvolutionBackwardFilter(g->dnn, &one, c->x, in, c->y, d,
                                            c->cv, c->bwd_filter, g->ws,
                                            g->ws_bytes, &one, c->w, dw)));
      if (dx)
        TRY(DK(cudnnConvolutionBackwardData(g->dnn, &one, c->w, w, c->y, d,
                                            c->cv, c->bwd_data, g->ws,
                                            g->ws_bytes, beta, c->x, dx)));
      break;
    }
    case TRN__L_RELU:
      if (dx)
        k_relu_bwd<<<blocks(n), THREADS, 0, g->st>>>(g->act[i], d, dx, n, acc);
      break;
    case TRN__L_POOL:
      if (dx)
        k_pool_bwd<<<blocks(nin), THREADS, 0, g->st>>>(d, g->arg[i], dx, nin,
                                                       pool_of(L), acc);
      break;
    case TRN__L_DROPOUT:
      if (dx)
        k_mul<<<blocks(n), THREADS, 0, g->st>>>(g->mask[i], d, dx, n, acc);
      break;
    case TRN__L_BN: {
      gbn *bn = &g->bn[i];
      TRY(trn__gpu_bn_bwd(g, &L->bn, in, d, w, bn->mean, bn->ivar, dx, acc,
                          dw, db, B));
      break;
    }
    case TRN__L_ADD:
      k_add_bwd<<<blocks(n), THREADS, 0, g->st>>>(
          d, dx, acc, L->src2 >= 0 ? g->dbuf[g->grad[L->src2]] : NULL,
          g->acc2[i], n);
      break;
    case TRN__L_AVGPOOL:
      if (dx)
        k_avgpool_bwd<<<blocks(nin), THREADS, 0, g->st>>>(
            d, dx, nin, (size_t)L->h * L->w, acc);
      break;
    }
    TRY(CK(cudaGetLastError()));
    if (g->prof)
      TRY(CK(cudaEventRecord(g->bev[i], g->st)));
  }
  return 0;
}

int trn__gpu_pass(trn__gpu *g, const float *x, const int32_t *y, size_t B,
                  bool train, uint64_t seed, uint64_t *dropout_calls,
                  float *logits, double *loss, size_t *correct) {
  TRY(CK(cudaSetDevice(g->index)));
  TRY(CK(cudaMemcpyAsync(g->x, x, B * g->in * sizeof *x, cudaMemcpyHostToDevice,
                         g->st)));
  TRY(CK(
      cudaMemcpyAsync(g->y, y, B * sizeof *y, cudaMemcpyHostToDevice, g->st)));
  TRY(forward(g, B, train, seed, dropout_calls));
  const float *z = g->act[g->nl - 1];
  k_softmax_ce<<<blocks(B), THREADS, 0, g->st>>>(
      z, g->y, train ? g->dbuf[g->grad[g->nl - 1]] : NULL,
      train && g->scale > 0 ? g->scale : 1.0f, g->loss, g->hit, B, g->classes);
  TRY(CK(cudaGetLastError()));
  if (train) {
    TRY(trn__gpu_scaled_begin(g));
    int rc = backward(g, B);
    int rc2 = trn__gpu_scaled_end(g); /* g->grads back either way */
    TRY(rc ? rc : rc2);
  }
  TRY(CK(cudaMemcpyAsync(g->h_loss, g->loss, B * sizeof *g->loss,
                         cudaMemcpyDeviceToHost, g->st)));
  TRY(CK(cudaMemcpyAsync(g->h_hit, g->hit, B * sizeof *g->hit,
                         cudaMemcpyDeviceToHost, g->st)));
  TRY(CK(cudaMemcpyAsync(logits, z, B * g->classes * sizeof *z,
                         cudaMemcpyDeviceToHost, g->st)));
  TRY(CK(cudaStreamSynchronize(g->st)));
  if (g->prof) {
    float ms;
    for (size_t i = 0; i < g->nl; i++) {
      TRY(CK(cudaEventElapsedTime(&ms, g->fev[i], g->fev[i + 1])));
      g->fwd_ms[i] += ms;
      if (train) {
        TRY(CK(cudaEventElapsedTime(&ms, g->bev[i + 1], g->bev[i])));
        g->bwd_ms[i] += ms;
      }
    }
    g->passes++;
    g->train_passes += train;
  }
  if (train)
    trn__gpu_scaled_check(g);
  trn__sum_losses(g->h_loss, g->h_hit, B, loss, correct);
  return 0;
}

/* ---- loss scaling ------------------------------------------------------------ */

int trn__gpu_set_scale(trn__gpu *g, float scale, char *err, size_t err_len) {
  if (scale > 0 && !g->sgrads) {
    TRY(CK(cudaSetDevice(g->index)));
    DALLOC(g->sgrads, g->nparams, "loss scaling's gradients");
    DALLOC(g->bad, 1, "loss scaling's flag");
    TRY(CK(cudaMallocHost((void **)&g->h_bad, sizeof *g->h_bad)));
    *g->h_bad = 0;
  }
  g->scale = scale > 0 ? scale : 0;
  return 0;
}

bool trn__gpu_overflow(const trn__gpu *g) { return g->overflow; }

int trn__gpu_scaled_begin(trn__gpu *g) {
  g->overflow = false;
  if (!(g->scale > 0))
    return 0;
  TRY(CK(cudaMemsetAsync(g->sgrads, 0, g->nparams * sizeof(float), g->st)));
  TRY(CK(cudaMemsetAsync(g->bad, 0, sizeof *g->bad, g->st)));
  g->kept = g->grads;
  g->grads = g->sgrads;
  return 0;
}

int trn__gpu_scaled_end(trn__gpu *g) {
  if (!g->kept)
    return 0;
  g->grads = g->kept;
  g->kept = NULL;
  size_t n = g->nparams;
  k_nonfinite<<<blocks(n), THREADS, 0, g->st>>>(g->sgrads, n, g->bad);
  k_unscale_add<<<blocks(n), THREADS, 0, g->st>>>(g->grads, g->sgrads, n,
                                                  1.0f / g->scale, g->bad);
  TRY(CK(cudaGetLastError()));
  return CK(cudaMemcpyAsync(g->h_bad, g->bad, sizeof *g->bad,
                            cudaMemcpyDeviceToHost, g->st));
}

void trn__gpu_scaled_check(trn__gpu *g) {
  g->overflow = g->scale > 0 && *g->h_bad != 0;
}

/* ---- optimizer steps --------------------------------------------------------- */

/* optim.c's sgd_range, element by element (the file is built without
 * contracting a * b + c into one rounding, as the CPU's C is). */
__global__ void k_sgd(float *p, const float *g, float *buf, size_t n,
                      trn__step s) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n)
    return;
  float d = g[i] * s.scale;
  if (s.wd != 0)
    d = d + s.wd * p[i];
  if (buf) {
    buf[i] = s.first ? d : s.momentum * buf[i] + (1 - s.dampening) * d;
    d = s.nesterov ? d + s.momentum * buf[i] : buf[i];
  }
  p[i] = p[i] - s.lr * d;
}

/* optim.c's adamw_range. */
__global__ void k_adamw(float *p, const float *g, float *m, float *v, size_t n,
                        trn__step s) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n)
    return;
  float gi = g[i] * s.scale;
  p[i] = p[i] * s.decay;
  m[i] = m[i] * s.beta1 + (1 - s.beta1) * gi;
  v[i] = v[i] * s.beta2 + (1 - s.beta2) * gi * gi;
  float denom = sqrtf(v[i]) / s.bc2s + s.eps;
  p[i] = p[i] - s.step * (m[i] / denom);
}

__device__ static float lamb_u(const float *p, const float *m, const float *v,
                               size_t i, const trn__step &s) {
  return (m[i] / s.bc1) / (sqrtf(v[i] / s.bc2) + s.eps) + s.wd * p[i];
}

/* Sums each thread's (pp, uu) over the block in a fixed tree (the same
 * bits every time); thread 0 gets the two sums.  Every thread of the
 * block must call it. */
__device__ static void block_sums(double pp, double uu, double *psum,
                                  double *usum) {
  __shared__ double sp[THREADS], su[THREADS];
  sp[threadIdx.x] = pp;
  su[threadIdx.x] = uu;
  __syncthreads();
  for (unsigned w = blockDim.x / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) {
      sp[threadIdx.x] += sp[threadIdx.x + w];
      su[threadIdx.x] += su[threadIdx.x + w];
    }
    __syncthreads();
  }
  *psum = sp[0];
  *usum = su[0];
}

/* LAMB over [a, b), first half: the moments, and each block's sums of p^2
 * and u^2 (in double, a fixed tree: the same bits every time) into
 * part[2 block], part[2 block + 1]. */
__global__ void k_lamb_moments(const float *p, const float *g, float *m,
                               float *v, size_t a, size_t b, trn__step s,
                               double *part) {
  size_t i = a + (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  double pp = 0, uu = 0;
  if (i < b) {
    float gi = g[i] * s.scale;
    m[i] = m[i] * s.beta1 + (1 - s.beta1) * gi;
    v[i] = v[i] * s.beta2 + (1 - s.beta2) * gi * gi;
    float u = lamb_u(p, m, v, i, s);
    pp = (double)p[i] * p[i];
    uu = (double)u * u;
  }
  double ps, us;
  block_sums(pp, uu, &ps, &us);
  if (threadIdx.x == 0) {
    part[2 * blockIdx.x] = ps;
    part[2 * blockIdx.x + 1] = us;
  }
}

/* The tensor's trust ratio from nb blocks' sums, times lr: one block, a
 * fixed order. */
__global__ void k_lamb_trust(const double *part, size_t nb, float lr,
                             float *step) {
  double pp = 0, uu = 0, ps, us;
  for (size_t k = threadIdx.x; k < nb; k += blockDim.x)
    pp += part[2 * k], uu += part[2 * k + 1];
  block_sums(pp, uu, &ps, &us);
  if (threadIdx.x == 0) {
    float trust = ps > 0 && us > 0 ? (float)(sqrt(ps) / sqrt(us)) : 1.0f;
    *step = lr * trust;
  }
}

__global__ void k_lamb_apply(float *p, const float *m, const float *v, size_t a,
                             size_t b, trn__step s, const float *step) {
  size_t i = a + (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < b)
    p[i] = p[i] - *step * lamb_u(p, m, v, i, s);
}

int trn__gpu_index(const trn__gpu *g) { return g->index; }

int trn__gpu_step(trn__gpu *g, float *state, const trn__step *s) {
  size_t n = g->nparams;
  TRY(CK(cudaSetDevice(g->index)));
  if (s->kind == TRN_SGD) {
    k_sgd<<<blocks(n), THREADS, 0, g->st>>>(g->params, g->grads, state, n, *s);
  } else if (s->kind == TRN_ADAMW) {
    k_adamw<<<blocks(n), THREADS, 0, g->st>>>(g->params, g->grads, state,
                                              state + n, n, *s);
  } else {
    if (!g->lamb_part) { /* room for the largest tensor's blocks */
      char err[160];
      int rc = trn__dalloc(g, (void **)&g->lamb_part,
                      2 * (blocks(n) + 1) * sizeof(double),
                      "LAMB's partial norms", err, sizeof err);
      if (!rc)
        rc = trn__dalloc(g, (void **)&g->lamb_step, sizeof(float),
                         "LAMB's step", err, sizeof err);
      if (rc) {
        trn__log(TRN_LOG_ERROR, "%s", err);
        return rc;
      }
    }
    size_t a = 0, one = n;
    const size_t *ends = s->nends ? s->ends : &one;
    size_t nt = s->nends ? s->nends : 1;
    for (size_t t = 0; t < nt; t++) {
      size_t b = ends[t], nb = blocks(b - a);
      k_lamb_moments<<<nb, THREADS, 0, g->st>>>(
          g->params, g->grads, state, state + n, a, b, *s, g->lamb_part);
      k_lamb_trust<<<1, THREADS, 0, g->st>>>(g->lamb_part, nb, s->lr,
                                             g->lamb_step);
      k_lamb_apply<<<nb, THREADS, 0, g->st>>>(g->params, state, state + n, a, b,
                                              *s, g->lamb_step);
      a = b;
    }
  }
  TRY(CK(cudaGetLastError()));
  return CK(cudaStreamSynchronize(g->st));
}

/* ---- device arrays ------------------------------------------------------------ */

int trn__dbuf_put(trn__dbuf *b, int index, const float *src, size_t n) {
  TRY(CK(cudaSetDevice(index)));
  if (b->p && (b->index != index || b->n != n))
    trn__dbuf_free(b);
  if (!b->p) {
    cudaError_t e = cudaMalloc((void **)&b->p, (n ? n : 1) * sizeof(float));
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      b->p = NULL;
      trn__log(TRN_LOG_ERROR,
               "cuda:%d: out of memory for %.1f MiB of "
               "optimizer state",
               index, n * 4 / 1048576.0);
      return -ENOMEM;
    }
    TRY(CK(e));
    b->index = index;
    b->n = n;
  }
  /* The default stream: synchronous with the host, and the model's
   * stream is idle between calls (each call waits for its work). */
  return n ? CK(cudaMemcpy(b->p, src, n * sizeof(float),
                           cudaMemcpyHostToDevice))
           : 0;
}

int trn__dbuf_get(const trn__dbuf *b, float *dst) {
  if (!b->p || !b->n)
    return 0;
  TRY(CK(cudaSetDevice(b->index)));
  return CK(
      cudaMemcpy(dst, b->p, b->n * sizeof(float), cudaMemcpyDeviceToHost));
}

void trn__dbuf_free(trn__dbuf *b) {
  if (b->p) {
    (void)cudaSetDevice(b->index);
    (void)cudaFree(b->p);
  }
  b->p = NULL;
  b->n = 0;
}
