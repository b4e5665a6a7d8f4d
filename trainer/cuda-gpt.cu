/* cuda-gpt.cu: `gpt` on a CUDA device, gpt.c's transformer step for step.
 *
 * The parameters, gradients and optimizer steps are cuda-model.cu's (one
 * flat array each, laid out by trn__gpt_layout); this file holds the
 * activations and the passes.  Matrix products, the attention's included,
 * go to cuBLAS (per head, batched over the sequences: scores = q k^T,
 * the softmaxed scores times v, and their gradients); layer norm, the
 * causal softmax, GELU, the embeddings and the cross-entropy are the
 * kernels below, which repeat gpt.c's arithmetic: sums in double where
 * gpt.c sums in double, the same float operations in the same order
 * elsewhere (the file is built without contracting a * b + c).  Sums over
 * rows (bias and layer-norm gradients) are cuBLAS products with a vector
 * of ones; the embedding gradients add each position's row in gpt.c's
 * order, so no atomics: a pass gives the same bits every time.
 *
 * Backward keeps one gradient of the residual stream: gpt.c copies it
 * into each block's two sums and adds the layer norms' input gradients,
 * which is the same as adding them in place.
 */
#include "cuda-int.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- kernels ------------------------------------------------------------- */

/* out (BT, C) = wte[x] + wpe[t]. */
static __global__ void g_encode(float *out, const int32_t *x, const float *wte,
                                const float *wpe, size_t n, size_t T,
                                size_t C) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n)
    return;
  size_t bt = i / C, c = i % C;
  out[i] = wte[(size_t)x[bt] * C + c] + wpe[(bt % T) * C + c];
}

/* dwte rows of the batch's distinct tokens: token tok[u] adds the
 * gradients of its positions pos[start[u] .. start[u+1]), in position
 * order (gpt.c's).  One thread per (u, channel). */
static __global__ void g_encode_bwd_wte(float *dwte, const float *d,
                                        const int32_t *tok,
                                        const int32_t *start,
                                        const int32_t *pos, size_t nu,
                                        size_t C) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= nu * C)
    return;
  size_t u = i / C, c = i % C;
  float *w = dwte + (size_t)tok[u] * C + c;
  float acc = *w;
  for (int32_t k = start[u]; k < start[u + 1]; k++)
    acc += d[(size_t)pos[k] * C + c];
  *w = acc;
}

/* dwpe (T, C) += the gradients of each position over the batch, in
 * sequence order. */
static __global__ void g_encode_bwd_wpe(float *dwpe, const float *d, size_t B,
                                        size_t T, size_t C) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= T * C)
    return;
  float acc = dwpe[i];
  for (size_t b = 0; b < B; b++)
    acc += d[b * T * C + i];
  dwpe[i] = acc;
}

/* The sum of v over the warp, in a fixed order (every lane gets it). */
static __device__ double warp_sum(double v) {
  for (int o = 16; o > 0; o /= 2)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

static __device__ float warp_max(float v) {
  for (int o = 16; o > 0; o /= 2) {
    float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = w > v ? w : v;
  }
  return v;
}

/* Layer norm, a warp per row of C: out = (x - mean) rstd w + b, mean and
 * rstd kept; the moments in double, as gpt.c. */
static __global__ void g_ln(float *out, float *mean, float *rstd,
                            const float *inp, const float *w, const float *b,
                            size_t N, size_t C) {
  size_t n = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
  unsigned lane = threadIdx.x % 32;
  if (n >= N)
    return;
  const float *x = inp + n * C;
  double m = 0, v = 0;
  for (size_t i = lane; i < C; i += 32)
    m += x[i];
  m = warp_sum(m) / (double)C;
  for (size_t i = lane; i < C; i += 32)
    v += (x[i] - m) * (x[i] - m);
  v = warp_sum(v) / (double)C;
  float s = (float)(1.0 / sqrt(v + 1e-5)), mf = (float)m;
  float *o = out + n * C;
  for (size_t i = lane; i < C; i += 32)
    o[i] = (x[i] - mf) * s * w[i] + b[i];
  if (lane == 0)
    mean[n] = mf, rstd[n] = s;
}

/* Layer norm's backward, a warp per row: dx (+= with acc) the input's
 * gradient; prod = h d, whose column sums are the weight's gradient. */
static __global__ void g_ln_bwd(float *dx, float *prod, const float *dout,
                                const float *inp, const float *w,
                                const float *mean, const float *rstd, size_t N,
                                size_t C, bool acc) {
  size_t n = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
  unsigned lane = threadIdx.x % 32;
  if (n >= N)
    return;
  const float *d = dout + n * C, *x = inp + n * C;
  float m = mean[n], s = rstd[n];
  double dn_mean = 0, dn_dot = 0;
  for (size_t i = lane; i < C; i += 32) {
    float h = (x[i] - m) * s, dn = w[i] * d[i];
    dn_mean += dn;
    dn_dot += dn * h;
  }
  float a = (float)(warp_sum(dn_mean) / (double)C);
  float c = (float)(warp_sum(dn_dot) / (double)C);
  float *dxr = dx + n * C, *pr = prod + n * C;
  for (size_t i = lane; i < C; i += 32) {
    float h = (x[i] - m) * s, dn = w[i] * d[i];
    float v = s * (dn - a - h * c);
    dxr[i] = acc ? dxr[i] + v : v;
    pr[i] = h * d[i];
  }
}

/* out (N, OC) rows = bias. */
static __global__ void g_rows(float *out, const float *bias, size_t n,
                              size_t OC) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n)
    out[i] = bias[i % OC];
}

/* The causal softmax of each row of scores (already scaled), a warp per
 * row (b, h, t) of T: columns past t are 0. */
static __global__ void g_softmax(float *att, size_t rows, size_t T) {
  size_t r = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
  unsigned lane = threadIdx.x % 32;
  if (r >= rows)
    return;
  size_t t = r % T;
  float *a = att + r * T;
  float mx = -INFINITY;
  for (size_t u = lane; u <= t; u += 32)
    mx = a[u] > mx ? a[u] : mx;
  mx = warp_max(mx);
  double sum = 0;
  for (size_t u = lane; u <= t; u += 32) {
    a[u] = expf(a[u] - mx);
    sum += a[u];
  }
  float inv = (float)(1.0 / warp_sum(sum));
  for (size_t u = lane; u < T; u += 32)
    a[u] = u <= t ? a[u] * inv : 0.0f;
}

/* Through the softmax, in place: datt[u] becomes a[u] (datt[u] - sum a
 * datt) scale. */
static __global__ void g_softmax_bwd(float *datt, const float *att, size_t rows,
                                     size_t T, float scale) {
  size_t r = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
  unsigned lane = threadIdx.x % 32;
  if (r >= rows)
    return;
  size_t t = r % T;
  float *d = datt + r * T;
  const float *a = att + r * T;
  double dot = 0;
  for (size_t u = lane; u <= t; u += 32)
    dot += (double)a[u] * d[u];
  float fd = (float)warp_sum(dot);
  for (size_t u = lane; u < T; u += 32)
    d[u] = u <= t ? a[u] * (d[u] - fd) * scale : 0.0f;
}

#define GELU_K 0.7978845608028654f /* sqrt(2 / pi) */

static __global__ void g_gelu(float *out, const float *inp, size_t n) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n)
    return;
  float x = inp[i];
  out[i] = 0.5f * x * (1.0f + tanhf(GELU_K * (x + 0.044715f * x * x * x)));
}

/* d = d gelu'(inp), in place. */
static __global__ void g_gelu_bwd(float *d, const float *inp, size_t n) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n)
    return;
  float x = inp[i], u = GELU_K * (x + 0.044715f * x * x * x);
  float th = tanhf(u), sech2 = 1.0f - th * th;
  float du = GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
  d[i] = d[i] * (0.5f * (1.0f + th) + 0.5f * x * sech2 * du);
}

/* layers.c's trn__softmax_ce, a block per row of V: the row's loss (in
 * double), its hit (the first maximum), and with dl softmax - onehot
 * times ds (the loss scale; 1: none, the same bits). */
static __global__ void g_ce(const float *logits, const int32_t *y, float *dl,
                            float ds, double *loss, uint8_t *hit, size_t V) {
  __shared__ float smx[THREADS];
  __shared__ unsigned sarg[THREADS];
  __shared__ double ssum[THREADS];
  size_t r = blockIdx.x;
  const float *z = logits + r * V;
  float mx = -INFINITY;
  unsigned arg = 0xffffffffu;
  for (size_t j = threadIdx.x; j < V; j += blockDim.x)
    if (z[j] > mx || arg == 0xffffffffu)
      mx = z[j], arg = (unsigned)j;
  smx[threadIdx.x] = mx, sarg[threadIdx.x] = arg;
  __syncthreads();
  for (unsigned w = blockDim.x / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) {
      unsigned o = threadIdx.x + w;
      /* the larger; on a tie the lower index, as the CPU's scan */
      if (sarg[o] != 0xffffffffu &&
          (sarg[threadIdx.x] == 0xffffffffu || smx[o] > smx[threadIdx.x] ||
           (smx[o] == smx[threadIdx.x] && sarg[o] < sarg[threadIdx.x])))
        smx[threadIdx.x] = smx[o], sarg[threadIdx.x] = sarg[o];
    }
    __syncthreads();
  }
  mx = smx[0];
  double sum = 0;
  for (size_t j = threadIdx.x; j < V; j += blockDim.x)
    sum += exp((double)z[j] - mx);
  ssum[threadIdx.x] = sum;
  __syncthreads();
  for (unsigned w = blockDim.x / 2; w > 0; w /= 2) {
    if (threadIdx.x < w)
      ssum[threadIdx.x] += ssum[threadIdx.x + w];
    __syncthreads();
  }
  double lse = mx + log(ssum[0]);
  size_t t = (size_t)y[r];
  if (threadIdx.x == 0) {
    loss[r] = lse - z[t];
    hit[r] = sarg[0] == t;
  }
  if (dl)
    for (size_t j = threadIdx.x; j < V; j += blockDim.x)
      dl[r * V + j] =
          (float)(exp((double)z[j] - lse) - (j == t ? 1.0 : 0.0)) * ds;
}

/* ---- the state ------------------------------------------------------------ */

/* Per-layer activations: each a stack of L slices sized for the largest
 * batch, the batch's (B, T) laid out at the start of its slice. */
enum {
  A_LN1, A_LN1M, A_LN1R, A_QKV, A_ATTY, A_ATT, A_RES2, A_LN2, A_LN2M,
  A_LN2R, A_FCH, A_GELU, A_RES3, NA
};

struct ggpt {
  size_t V, maxT, L, NH, C, maxB;
  size_t off[TRN__GPT_TENSORS], size[TRN__GPT_TENSORS];
  size_t B, T;   /* the last pass's */
  int32_t *x, *y; /* (maxB maxT) tokens and next tokens */
  size_t slice[NA];
  float *act[NA];
  float *enc, *lnf, *lnfm, *lnfr, *logits; /* (BT, C), (BT) x2, (BT, V) */
  float *tmp;     /* (BT, C) the projections' outputs */
  /* Backward's: */
  float *dlogits; /* (BT, V) */
  float *dres;    /* (BT, C) the residual stream's gradient */
  float *dln;     /* (BT, C) a layer norm's output gradient */
  float *datty;   /* (BT, C) */
  float *prod;    /* (BT, C) layer norm's h d */
  float *dqkv;    /* (BT, 3C) */
  float *dfch;    /* (BT, 4C) */
  float *datt;    /* (B, NH, T, T) */
  float *ones;    /* (BT) */
  double *loss;   /* (BT) */
  uint8_t *hit;
  double *h_loss; /* pinned host copies */
  uint8_t *h_hit;
  /* The embedding gradient's order: the batch's distinct tokens, where
   * each one's positions start, the positions grouped by token (in order),
   * counted on the host (cnt, (V)) and sent from pinned h_sort. */
  int32_t *tok, *start, *pos;
  int32_t *h_sort; /* (3 BT + 1) tok, start, pos */
  uint32_t *cnt;
  bool logits_ok; /* a pass has left logits to fetch */
};

static float *act(const ggpt *s, int a, size_t l) {
  return s->act[a] + l * s->slice[a];
}

static const float *par(const trn__gpu *g, int t, size_t l) {
  const ggpt *s = g->gpt;
  return g->params + s->off[t] + l * (s->size[t] / s->L);
}

static float *grd(const trn__gpu *g, int t, size_t l) {
  const ggpt *s = g->gpt;
  return g->grads + s->off[t] + l * (s->size[t] / s->L);
}

void trn__ggpt_free(trn__gpu *g) {
  ggpt *s = g->gpt;
  if (!s)
    return;
  for (int a = 0; a < NA; a++)
    (void)cudaFree(s->act[a]);
  void *d[] = {s->x,     s->y,       s->enc,  s->lnf,   s->lnfm,  s->lnfr,
               s->logits, s->tmp,    s->dlogits, s->dres, s->dln,
               s->datty, s->prod,    s->dqkv, s->dfch,  s->datt,  s->ones,
               s->loss,  s->hit,     s->tok,  s->start, s->pos};
  for (size_t i = 0; i < sizeof d / sizeof *d; i++)
    (void)cudaFree(d[i]);
  (void)cudaFreeHost(s->h_loss);
  (void)cudaFreeHost(s->h_hit);
  (void)cudaFreeHost(s->h_sort);
  free(s->cnt);
  free(s);
  g->gpt = NULL;
}

static __global__ void g_fill(float *p, size_t n, float v) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n)
    p[i] = v;
}

static int build(trn__gpu *g, char *err, size_t err_len) {
  ggpt *s = g->gpt;
  size_t BT = s->maxB * s->maxT, C = s->C, L = s->L, V = s->V;
  TRY(trn__gpu_core(g, err, err_len));
  size_t sl[NA] = {BT * C,     BT,     BT,         BT * 3 * C, BT * C,
                   s->maxB * s->NH * s->maxT * s->maxT,      BT * C,
                   BT * C,     BT,     BT,         BT * 4 * C, BT * 4 * C,
                   BT * C};
  for (int a = 0; a < NA; a++) {
    s->slice[a] = sl[a];
    DALLOC(s->act[a], L * sl[a], "the activations");
  }
  DALLOC(s->x, BT, "the tokens");
  DALLOC(s->y, BT, "the tokens");
  DALLOC(s->enc, BT * C, "the activations");
  DALLOC(s->lnf, BT * C, "the activations");
  DALLOC(s->lnfm, BT, "the activations");
  DALLOC(s->lnfr, BT, "the activations");
  DALLOC(s->logits, BT * V, "the logits");
  DALLOC(s->tmp, BT * C, "the activations");
  DALLOC(s->dlogits, BT * V, "the logits' gradient");
  DALLOC(s->dres, BT * C, "the gradients flowing down");
  DALLOC(s->dln, BT * C, "the gradients flowing down");
  DALLOC(s->datty, BT * C, "the gradients flowing down");
  DALLOC(s->prod, BT * C, "the gradients flowing down");
  DALLOC(s->dqkv, BT * 3 * C, "the gradients flowing down");
  DALLOC(s->dfch, BT * 4 * C, "the gradients flowing down");
  DALLOC(s->datt, s->slice[A_ATT], "the attention's gradient");
  DALLOC(s->ones, BT, "a vector of ones");
  DALLOC(s->loss, BT, "the losses");
  DALLOC(s->hit, BT, "the hits");
  DALLOC(s->tok, BT, "the token order");
  DALLOC(s->start, BT + 1, "the token order");
  DALLOC(s->pos, BT, "the token order");
  TRY(CK(cudaMallocHost((void **)&s->h_loss, BT * sizeof *s->h_loss)));
  TRY(CK(cudaMallocHost((void **)&s->h_hit, BT * sizeof *s->h_hit)));
  TRY(CK(cudaMallocHost((void **)&s->h_sort, (3 * BT + 1) * sizeof(int32_t))));
  if (!(s->cnt = (uint32_t *)calloc(V, sizeof *s->cnt)))
    return trn__fail(err, err_len, -ENOMEM, "out of memory");
  g_fill<<<blocks(BT), THREADS, 0, g->st>>>(s->ones, BT, 1.0f);
  TRY(CK(cudaGetLastError()));
  return CK(cudaStreamSynchronize(g->st));
}

int trn__gpu_new_gpt(int index, const trn_model_config *c, size_t nparams,
                     int precision, trn__gpu **out, char *err,
                     size_t err_len) {
  *out = NULL;
  trn__gpu *g = (trn__gpu *)calloc(1, sizeof *g);
  ggpt *s = (ggpt *)calloc(1, sizeof *s);
  if (!g || !s) {
    free(g);
    free(s);
    return trn__fail(err, err_len, -ENOMEM, "out of memory");
  }
  g->index = index;
  g->tf32 = precision != TRN_FP32;
  g->bf16 = precision == TRN_BF16;
  g->fp16 = precision == TRN_FP16;
  g->nparams = nparams;
  g->max_batch = c->max_batch;
  g->in = c->ctx;
  g->classes = c->vocab;
  g->gpt = s;
  s->V = c->vocab, s->maxT = c->ctx, s->L = c->layers, s->NH = c->heads;
  s->C = c->embd, s->maxB = c->max_batch;
  trn__gpt_layout(c, s->off, s->size);
  if (err_len)
    err[0] = '\0';
  int rc = build(g, err, err_len);
  if (rc) {
    if (err_len && !err[0])
      trn__fail(err, err_len, rc,
                "cuda:%d: setting up gpt failed (see the log)", index);
    trn__gpu_free(g);
    return rc;
  }
  *out = g;
  return 0;
}

/* ---- the passes ------------------------------------------------------------ */

/* out (N, OC) = inp (N, C) W^T (W (OC, C)) + bias (NULL: none), row-major
 * (column-major: out^T = W inp^T); the bias first, as gpt.c. */
static int mm_fwd(trn__gpu *g, float *out, const float *inp, const float *w,
                  const float *bias, size_t N, size_t C, size_t OC) {
  const float one = 1.0f, zero = 0.0f;
  if (bias) {
    g_rows<<<blocks(N * OC), THREADS, 0, g->st>>>(out, bias, N * OC, OC);
    TRY(CK(cudaGetLastError()));
  }
  return BK(trn__gemm(g, CUBLAS_OP_T, CUBLAS_OP_N, (int)OC, (int)N, (int)C,
                      &one, w, (int)C, inp, (int)C, bias ? &one : &zero, out,
                      (int)OC));
}

/* dinp = dout W (set); dW += dout^T inp; dbias += dout's column sums. */
static int mm_bwd(trn__gpu *g, float *dinp, float *dw, float *dbias,
                  const float *dout, const float *inp, const float *w,
                  size_t N, size_t C, size_t OC) {
  const float one = 1.0f, zero = 0.0f;
  TRY(BK(trn__gemm(g, CUBLAS_OP_N, CUBLAS_OP_N, (int)C, (int)N, (int)OC, &one,
                   w, (int)C, dout, (int)OC, &zero, dinp, (int)C)));
  TRY(BK(trn__gemm(g, CUBLAS_OP_N, CUBLAS_OP_T, (int)C, (int)OC, (int)N, &one,
                   inp, (int)C, dout, (int)OC, &one, dw, (int)C)));
  if (dbias)
    TRY(BK(cublasSgemv(g->blas, CUBLAS_OP_N, (int)OC, (int)N, &one, dout,
                       (int)OC, g->gpt->ones, 1, &one, dbias, 1)));
  return 0;
}

/* Layer norm's backward: dx += (with acc) the input's gradient, dw and
 * db += their gradients (column sums of h d and of d). */
static int ln_bwd(trn__gpu *g, float *dx, float *dw, float *db,
                  const float *dout, const float *inp, const float *w,
                  const float *mean, const float *rstd, size_t N, bool acc) {
  ggpt *s = g->gpt;
  const float one = 1.0f;
  int C = (int)s->C;
  g_ln_bwd<<<blocks(32 * N), THREADS, 0, g->st>>>(dx, s->prod, dout, inp, w,
                                                  mean, rstd, N, s->C, acc);
  TRY(CK(cudaGetLastError()));
  TRY(BK(cublasSgemv(g->blas, CUBLAS_OP_N, C, (int)N, &one, s->prod, C,
                     s->ones, 1, &one, dw, 1)));
  return BK(cublasSgemv(g->blas, CUBLAS_OP_N, C, (int)N, &one, dout, C,
                        s->ones, 1, &one, db, 1));
}

/* The causal self-attention of one layer: qkv (B, T, 3C) to out (B, T,
 * C), att (B, NH, T, T) the softmaxed scores.  Column-major, per head h
 * and sequence: att^T = K Q^T scale, out^T = V^T att^T. */
static int attn_fwd(trn__gpu *g, float *out, float *att, const float *qkv,
                    size_t B, size_t T) {
  ggpt *s = g->gpt;
  size_t C = s->C, NH = s->NH, hs = C / NH;
  const float one = 1.0f, zero = 0.0f, scale = 1.0f / sqrtf((float)hs);
  long long sq = (long long)(T * 3 * C), sa = (long long)(NH * T * T);
  for (size_t h = 0; h < NH; h++) {
    const float *q = qkv + h * hs, *k = q + C;
    TRY(BK(trn__gemm_batched(
        g, CUBLAS_OP_T, CUBLAS_OP_N, (int)T, (int)T, (int)hs, &scale, k,
        (int)(3 * C), sq, q, (int)(3 * C), sq, &zero, att + h * T * T, (int)T,
        sa, (int)B)));
  }
  size_t rows = B * NH * T;
  g_softmax<<<blocks(32 * rows), THREADS, 0, g->st>>>(att, rows, T);
  TRY(CK(cudaGetLastError()));
  for (size_t h = 0; h < NH; h++) {
    const float *v = qkv + 2 * C + h * hs;
    TRY(BK(trn__gemm_batched(
        g, CUBLAS_OP_N, CUBLAS_OP_N, (int)hs, (int)T, (int)T, &one, v,
        (int)(3 * C), sq, att + h * T * T, (int)T, sa, &zero, out + h * hs,
        (int)C, (long long)(T * C), (int)B)));
  }
  return 0;
}

/* Its backward: dqkv (set) from dout (B, T, C). */
static int attn_bwd(trn__gpu *g, float *dqkv, const float *dout,
                    const float *qkv, const float *att, size_t B, size_t T) {
  ggpt *s = g->gpt;
  size_t C = s->C, NH = s->NH, hs = C / NH;
  const float one = 1.0f, zero = 0.0f, scale = 1.0f / sqrtf((float)hs);
  long long sq = (long long)(T * 3 * C), sa = (long long)(NH * T * T);
  long long so = (long long)(T * C);
  int ld3 = (int)(3 * C), ldo = (int)C, t = (int)T, n = (int)hs;
  for (size_t h = 0; h < NH; h++) {
    const float *v = qkv + 2 * C + h * hs, *d = dout + h * hs;
    /* datt = dout v^T; dv = att^T dout. */
    TRY(BK(trn__gemm_batched(
        g, CUBLAS_OP_T, CUBLAS_OP_N, t, t, n, &one, v, ld3, sq, d, ldo,
        so, &zero, s->datt + h * T * T, t, sa, (int)B)));
    TRY(BK(trn__gemm_batched(
        g, CUBLAS_OP_N, CUBLAS_OP_T, n, t, t, &one, d, ldo, so,
        att + h * T * T, t, sa, &zero, dqkv + 2 * C + h * hs, ld3, sq,
        (int)B)));
  }
  size_t rows = B * NH * T;
  g_softmax_bwd<<<blocks(32 * rows), THREADS, 0, g->st>>>(s->datt, att, rows,
                                                          T, scale);
  TRY(CK(cudaGetLastError()));
  for (size_t h = 0; h < NH; h++) {
    const float *q = qkv + h * hs, *k = q + C;
    const float *dp = s->datt + h * T * T;
    /* dq = dpre k; dk = dpre^T q. */
    TRY(BK(trn__gemm_batched(
        g, CUBLAS_OP_N, CUBLAS_OP_N, n, t, t, &one, k, ld3, sq, dp, t, sa,
        &zero, dqkv + h * hs, ld3, sq, (int)B)));
    TRY(BK(trn__gemm_batched(
        g, CUBLAS_OP_N, CUBLAS_OP_T, n, t, t, &one, q, ld3, sq, dp, t, sa,
        &zero, dqkv + C + h * hs, ld3, sq, (int)B)));
  }
  return 0;
}

static int forward(trn__gpu *g, size_t B, size_t T, bool train) {
  ggpt *s = g->gpt;
  size_t C = s->C, BT = B * T, n = BT * C;
  g_encode<<<blocks(n), THREADS, 0, g->st>>>(
      s->enc, s->x, par(g, TRN__GPT_WTE, 0), par(g, TRN__GPT_WPE, 0), n, T, C);
  TRY(CK(cudaGetLastError()));
  const float *res = s->enc;
  for (size_t l = 0; l < s->L; l++) {
    float *ln1 = act(s, A_LN1, l), *qkv = act(s, A_QKV, l);
    float *atty = act(s, A_ATTY, l), *res2 = act(s, A_RES2, l);
    float *ln2 = act(s, A_LN2, l), *fch = act(s, A_FCH, l);
    float *ge = act(s, A_GELU, l), *res3 = act(s, A_RES3, l);
    g_ln<<<blocks(32 * BT), THREADS, 0, g->st>>>(
        ln1, act(s, A_LN1M, l), act(s, A_LN1R, l), res,
        par(g, TRN__GPT_LN1W, l), par(g, TRN__GPT_LN1B, l), BT, C);
    TRY(CK(cudaGetLastError()));
    TRY(mm_fwd(g, qkv, ln1, par(g, TRN__GPT_QKVW, l),
               par(g, TRN__GPT_QKVB, l), BT, C, 3 * C));
    TRY(attn_fwd(g, atty, act(s, A_ATT, l), qkv, B, T));
    TRY(mm_fwd(g, s->tmp, atty, par(g, TRN__GPT_PROJW, l),
               par(g, TRN__GPT_PROJB, l), BT, C, C));
    k_add<<<blocks(n), THREADS, 0, g->st>>>(res, s->tmp, res2, n);
    g_ln<<<blocks(32 * BT), THREADS, 0, g->st>>>(
        ln2, act(s, A_LN2M, l), act(s, A_LN2R, l), res2,
        par(g, TRN__GPT_LN2W, l), par(g, TRN__GPT_LN2B, l), BT, C);
    TRY(CK(cudaGetLastError()));
    TRY(mm_fwd(g, fch, ln2, par(g, TRN__GPT_FCW, l), par(g, TRN__GPT_FCB, l),
               BT, C, 4 * C));
    g_gelu<<<blocks(4 * n), THREADS, 0, g->st>>>(ge, fch, 4 * n);
    TRY(mm_fwd(g, s->tmp, ge, par(g, TRN__GPT_FCPW, l),
               par(g, TRN__GPT_FCPB, l), BT, 4 * C, C));
    k_add<<<blocks(n), THREADS, 0, g->st>>>(res2, s->tmp, res3, n);
    TRY(CK(cudaGetLastError()));
    res = res3;
  }
  g_ln<<<blocks(32 * BT), THREADS, 0, g->st>>>(
      s->lnf, s->lnfm, s->lnfr, res, par(g, TRN__GPT_LNFW, 0),
      par(g, TRN__GPT_LNFB, 0), BT, C);
  TRY(CK(cudaGetLastError()));
  /* The head, tied to the token embedding: logits (BT, V). */
  TRY(mm_fwd(g, s->logits, s->lnf, par(g, TRN__GPT_WTE, 0), NULL, BT, C,
             s->V));
  g_ce<<<(unsigned)BT, THREADS, 0, g->st>>>(
      s->logits, s->y, train ? s->dlogits : NULL,
      train && g->scale > 0 ? g->scale : 1.0f, s->loss, s->hit, s->V);
  return CK(cudaGetLastError());
}

/* Groups the batch's positions by token, in order, into h_sort and sends
 * them: the embedding gradient's order.  Returns the distinct tokens. */
static int token_order(trn__gpu *g, const int32_t *x, size_t BT, size_t *nu) {
  ggpt *s = g->gpt;
  int32_t *tok = s->h_sort, *start = tok + BT, *pos = start + BT + 1;
  size_t u = 0;
  for (size_t i = 0; i < BT; i++)
    if (s->cnt[x[i]]++ == 0)
      tok[u++] = x[i];
  /* Distinct tokens in order of first appearance; cnt becomes each one's
   * next free slot. */
  int32_t at = 0;
  for (size_t k = 0; k < u; k++) {
    start[k] = at;
    uint32_t c = s->cnt[tok[k]];
    s->cnt[tok[k]] = (uint32_t)at;
    at += (int32_t)c;
  }
  start[u] = at;
  for (size_t i = 0; i < BT; i++)
    pos[s->cnt[x[i]]++] = (int32_t)i;
  for (size_t k = 0; k < u; k++)
    s->cnt[tok[k]] = 0;
  *nu = u;
  TRY(CK(cudaMemcpyAsync(s->tok, tok, u * sizeof *tok, cudaMemcpyHostToDevice,
                         g->st)));
  TRY(CK(cudaMemcpyAsync(s->start, start, (u + 1) * sizeof *start,
                         cudaMemcpyHostToDevice, g->st)));
  return CK(cudaMemcpyAsync(s->pos, pos, BT * sizeof *pos,
                            cudaMemcpyHostToDevice, g->st));
}

static int backward(trn__gpu *g, const int32_t *x, size_t B, size_t T) {
  ggpt *s = g->gpt;
  size_t C = s->C, BT = B * T, L = s->L;
  TRY(mm_bwd(g, s->dln, grd(g, TRN__GPT_WTE, 0), NULL, s->dlogits, s->lnf,
             par(g, TRN__GPT_WTE, 0), BT, C, s->V));
  const float *res_last = L ? act(s, A_RES3, L - 1) : s->enc;
  TRY(ln_bwd(g, s->dres, grd(g, TRN__GPT_LNFW, 0), grd(g, TRN__GPT_LNFB, 0),
             s->dln, res_last, par(g, TRN__GPT_LNFW, 0), s->lnfm, s->lnfr, BT,
             false));
  for (size_t l = L; l-- > 0;) {
    const float *res = l ? act(s, A_RES3, l - 1) : s->enc;
    /* dres: this block's output gradient, the two sums' (see the top). */
    TRY(mm_bwd(g, s->dfch, grd(g, TRN__GPT_FCPW, l), grd(g, TRN__GPT_FCPB, l),
               s->dres, act(s, A_GELU, l), par(g, TRN__GPT_FCPW, l), BT, 4 * C,
               C));
    g_gelu_bwd<<<blocks(BT * 4 * C), THREADS, 0, g->st>>>(
        s->dfch, act(s, A_FCH, l), BT * 4 * C);
    TRY(CK(cudaGetLastError()));
    TRY(mm_bwd(g, s->dln, grd(g, TRN__GPT_FCW, l), grd(g, TRN__GPT_FCB, l),
               s->dfch, act(s, A_LN2, l), par(g, TRN__GPT_FCW, l), BT, C,
               4 * C));
    TRY(ln_bwd(g, s->dres, grd(g, TRN__GPT_LN2W, l), grd(g, TRN__GPT_LN2B, l),
               s->dln, act(s, A_RES2, l), par(g, TRN__GPT_LN2W, l),
               act(s, A_LN2M, l), act(s, A_LN2R, l), BT, true));
    TRY(mm_bwd(g, s->datty, grd(g, TRN__GPT_PROJW, l),
               grd(g, TRN__GPT_PROJB, l), s->dres, act(s, A_ATTY, l),
               par(g, TRN__GPT_PROJW, l), BT, C, C));
    TRY(attn_bwd(g, s->dqkv, s->datty, act(s, A_QKV, l), act(s, A_ATT, l), B,
                 T));
    TRY(mm_bwd(g, s->dln, grd(g, TRN__GPT_QKVW, l), grd(g, TRN__GPT_QKVB, l),
               s->dqkv, act(s, A_LN1, l), par(g, TRN__GPT_QKVW, l), BT, C,
               3 * C));
    TRY(ln_bwd(g, s->dres, grd(g, TRN__GPT_LN1W, l), grd(g, TRN__GPT_LN1B, l),
               s->dln, res, par(g, TRN__GPT_LN1W, l), act(s, A_LN1M, l),
               act(s, A_LN1R, l), BT, true));
  }
  size_t nu;
  TRY(token_order(g, x, BT, &nu));
  g_encode_bwd_wte<<<blocks(nu * C), THREADS, 0, g->st>>>(
      grd(g, TRN__GPT_WTE, 0), s->dres, s->tok, s->start, s->pos, nu, C);
  g_encode_bwd_wpe<<<blocks(T * C), THREADS, 0, g->st>>>(
      grd(g, TRN__GPT_WPE, 0), s->dres, B, T, C);
  return CK(cudaGetLastError());
}

int trn__gpu_tokens(trn__gpu *g, const int32_t *x, const int32_t *y, size_t B,
                    size_t T, bool train, double *loss, size_t *correct) {
  ggpt *s = g->gpt;
  size_t BT = B * T;
  TRY(CK(cudaSetDevice(g->index)));
  TRY(CK(cudaMemcpyAsync(s->x, x, BT * sizeof *x, cudaMemcpyHostToDevice,
                         g->st)));
  TRY(CK(cudaMemcpyAsync(s->y, y, BT * sizeof *y, cudaMemcpyHostToDevice,
                         g->st)));
  s->logits_ok = false;
  TRY(forward(g, B, T, train));
  if (train) {
    TRY(trn__gpu_scaled_begin(g));
    int rc = backward(g, x, B, T);
    int rc2 = trn__gpu_scaled_end(g); /* g->grads back either way */
    TRY(rc ? rc : rc2);
  }
  TRY(CK(cudaMemcpyAsync(s->h_loss, s->loss, BT * sizeof *s->loss,
                         cudaMemcpyDeviceToHost, g->st)));
  TRY(CK(cudaMemcpyAsync(s->h_hit, s->hit, BT * sizeof *s->hit,
                         cudaMemcpyDeviceToHost, g->st)));
  TRY(CK(cudaStreamSynchronize(g->st)));
  if (train)
    trn__gpu_scaled_check(g);
  s->B = B, s->T = T, s->logits_ok = true;
  trn__sum_losses(s->h_loss, s->h_hit, BT, loss, correct);
  return 0;
}

int trn__gpu_logits(trn__gpu *g, float *dst, size_t *n) {
  ggpt *s = g->gpt;
  *n = 0;
  if (!s || !s->logits_ok)
    return 0;
  *n = s->B * s->T * s->V;
  TRY(CK(cudaSetDevice(g->index)));
  return CK(cudaMemcpy(dst, s->logits, *n * sizeof *dst,
                       cudaMemcpyDeviceToHost));
}
