/* trainer-int.h: internals shared between trainer/'s own files.
 *
 * The log hook, and the seam between the CPU side (device.c, plain C) and
 * the CUDA side (cuda*.cu, compiled by nvcc as C++ into the module
 * beed-cuda.so).  The programs' trn__cuda_* and trn__gpu_* functions are
 * cuda-load.c's, which forward to the module's when it loads and see no
 * devices when it does not.
 */
#ifndef BEE_TRAINER_INT_H
#define BEE_TRAINER_INT_H

#include "trainer.h"

#include <stdarg.h>
#include <stdio.h>

#ifdef __CUDACC__ /* the .cu files: the types of the checks below */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Formats one line and hands it to the hook set by trn_log_set. */
void trn__log(int level, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* The same with its arguments in ap. */
void trn__vlog(int level, const char *fmt, va_list ap)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 0)))
#endif
    ;

/* Writes one line into err (err_len bytes, NUL-terminated; nothing when
 * err_len is 0) and returns rc: the trainer's "error code and message"
 * in one call.  Inline: the CUDA module has its own copy, as it has no
 * other way to the program's functions than cuda-abi.h's table. */
#if defined(__GNUC__)
__attribute__((format(printf, 4, 5)))
#endif
static inline int
trn__fail(char *err, size_t err_len, int rc, const char *fmt, ...) {
  if (err_len) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
  }
  return rc;
}

/* Loss scaling's bookkeeping (scale.c), the same for both backends. */
typedef struct trn__scaler {
  float scale;       /* 0: no scaling */
  bool fixed;        /* the scale never changes */
  unsigned interval; /* clean passes in a row that double it */
  unsigned clean;    /* clean passes since it last changed */
  uint64_t skipped;  /* passes that added nothing */
  bool last_skipped; /* the last training pass was one */
} trn__scaler;
#define TRN__LOSS_SCALE_MIN 0x1p-24f
#define TRN__LOSS_SCALE_MAX 0x1p24f

/* Sets s up from c's loss_scale, loss_scale_fixed, loss_scale_interval,
 * precision and device.  0, or -EINVAL with err naming the setting. */
int trn__scaler_init(trn__scaler *s, const trn_model_config *c, char *err,
                     size_t err_len);
/* After a training pass whose scaled gradients did (overflow) or did not
 * hold an inf or a NaN: counts it, halves or doubles the scale.  Returns
 * whether the pass's gradients were added (!overflow). */
bool trn__scaler_after(trn__scaler *s, bool overflow);
/* A dynamic scale set back (a checkpoint's): 0; -EPERM when s does not
 * scale dynamically (no scaling, or a fixed scale); -EINVAL for a scale
 * that is not a power of two from 2^-24 to 2^127. */
int trn__scaler_set(trn__scaler *s, float scale);
/* The CPU's end of a scaled pass: when every one of the n floats of
 * scaled is finite, grads[i] += scaled[i] / scale and returns false;
 * else leaves grads alone and returns true (an overflow). */
bool trn__unscale_add(float *grads, const float *scaled, size_t n, float scale);
/* x[i] *= scale for n floats (the logits' gradient of a scaled pass). */
void trn__scale_floats(float *x, size_t n, float scale);

/* Counts visible CUDA devices into *n.  "No driver" and "no device" are
 * not errors: *n = 0, and why (when why_len > 0) says which.  Returns 0 or
 * -EIO (logged, with why set). */
int trn__cuda_count(int *n, char *why, size_t why_len);

/* Fills the CUDA fields of *out (name, mem_bytes, sm_major, sm_minor) for
 * device index, which the caller has checked against trn__cuda_count.
 * Returns 0 or -EIO (logged). */
int trn__cuda_props(int index, trn_device *out);

/* Makes device index current for the calling thread.  Returns 0 or -EIO. */
int trn__cuda_bind(int index);

/* Page-locked host memory from the CUDA runtime (cudaHostAlloc, portable
 * among devices): 0, or -ENOMEM when it gives none (no device or driver,
 * no memory), nothing logged; -ENOTSUP without CUDA.  Free with
 * trn__cuda_host_free. */
int trn__cuda_host_alloc(size_t bytes, void **p);
void trn__cuda_host_free(void *p);

/* Returns cudnnGetVersion(), or 0 without CUDA. */
size_t trn__cudnn_version(void);

/* Why the CUDA backend is not there, in one line ("" when it is): the
 * module missing, a library it needs missing, another build's module
 * (cuda-load.c). */
const char *trn__cuda_missing(void);

#ifdef __CUDACC__
/* cuda.cu: 0 for success, else the call with file:line and the library's
 * message logged, and -EIO (cuda.cu's and cuda-model.cu's every call). */
int trn__cuda_check(cudaError_t err, const char *call, const char *file,
                    int line);
int trn__blas_check(cublasStatus_t s, const char *call, const char *file,
                    int line);
int trn__dnn_check(cudnnStatus_t s, const char *call, const char *file,
                   int line);
#endif

/* On a hot loop of plain C: a copy compiled for AVX-512 beside the
 * baseline one, picked when the program loads by what the CPU has (GCC's
 * and clang's function multiversioning).  Both round alike: no fused
 * multiply-adds (-ffp-contract=off in trainer/meson.build), no
 * reassociation; only the vectors are wider.  Static functions only:
 * clang 14 resolves a multiversioned function only within its own file.
 * Not in a ThreadSanitizer build: the loader runs the resolvers,
 * instrumented, before TSan is set up, and the program dies at once. */
#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TRN__NO_CLONES 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define TRN__NO_CLONES 1
#endif
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) &&       \
    !defined(__CUDACC__)
#define TRN__X86 1
#endif
#if defined(TRN__X86) && !defined(TRN__NO_CLONES)
#define TRN__VECTOR_CLONES __attribute__((target_clones("avx512f", "default")))
#else
#define TRN__VECTOR_CLONES
#endif

#ifdef TRN__X86
#include <immintrin.h>
/* The AVX-512 intrinsics paths (gemm.c, conv.c): compiled for it, run
 * only where trn__cpu_avx512 says so. */
#define TRN__AVX512 __attribute__((target("avx512f")))
/* The first n of 16 lanes (all 16 from n = 16 on). */
static inline __mmask16 trn__head_mask(size_t n) {
  return (__mmask16)(n >= 16 ? 0xffff : (1u << n) - 1);
}
/* The second vector's lanes of the first n of 32. */
static inline __mmask16 trn__high_mask(size_t n) {
  return trn__head_mask(n > 16 ? n - 16 : 0);
}
#endif

/* ---- pool.c: the CPU backend's worker threads ------------------------------ */

/* The most threads one job is split over. */
#define TRN__THREADS_MAX 64

/* n parts per job (1..TRN__THREADS_MAX): the caller and n - 1 workers.
 * Called at start-up, not while a job runs.  Returns 0, or -1 when fewer
 * threads could be started (the pool keeps those that did). */
int trn__pool_resize(int n);
int trn__pool_size(void);
/* Runs fn(arg, part, parts) for part = 0 .. parts - 1 at once and returns
 * parts when all are done; part 0 runs on the caller.  OpenBLAS is held to
 * one thread meanwhile.  When the pool is busy with another thread's job,
 * fn runs alone on the caller (parts = 1). */
int trn__pool_run(void (*fn)(void *arg, int part, int parts), void *arg);
/* Part part's share [*a, *b) of n items, parts shares in order. */
void trn__pool_range(size_t n, int part, int parts, size_t *a, size_t *b);
/* fn(arg, a, b) over [0, n) in the pool's parts' shares, or all of it on
 * the caller when there is one thread or fewer than 2 grain items: for
 * work whose items are independent (the result is the same bits however
 * it is split). */
void trn__pool_for(size_t n, size_t grain,
                   void (*fn)(void *arg, size_t a, size_t b), void *arg);

/* ---- gemm.c: matrix products ----------------------------------------------- */

/* C (m, n) = alpha op(A) op(B) + beta C, row-major, as cblas_sgemm with
 * CblasRowMajor: op(A) (m, k) is A, or A^T when ta (A stored (k, m));
 * op(B) (k, n) likewise with tb; lda, ldb, ldc are the stored rows'
 * strides.  C is not read when beta is 0.  Our AVX-512 kernel where the
 * CPU has it (each element of C the same bits however the work is
 * shared), else OpenBLAS; from outside a pool job it shares the product
 * among the pool's threads. */
void trn__sgemm(bool ta, bool tb, size_t m, size_t n, size_t k, float alpha,
                const float *a, size_t lda, const float *b, size_t ldb,
                float beta, float *c, size_t ldc);
/* Which of the two runs the products: "beed avx512" or "openblas". */
const char *trn__sgemm_name(void);
/* Whether this CPU (and its OS) runs AVX-512F: the other vector paths'
 * test (conv.c's im2col). */
bool trn__cpu_avx512(void);

/* ---- tanh for GELU --------------------------------------------------------- */

/* tanh(x) within 3e-7 of its value (a few float ulps; test-trainer-simd
 * sweeps it against tanh in double), in plain arithmetic that the
 * compiler turns into vectors: libm's tanhf, a call per element, was a
 * third of gpt's time on the CPU.  For |x| < 0.4 its odd Taylor series
 * to x^15; beyond, 1 - 2 / (e^2|x| + 1) with e^y as 2^n times a degree-7
 * series in y - n ln 2 (|x| held to 10, where tanh is 1 in float), the
 * sign put back.  NaN gives NaN. */
#ifndef __cplusplus /* C's union initializer; the .cu files have tanhf */
static inline float trn__tanhf(float x) {
  float a = __builtin_fabsf(x), z = x * x;
  /* The series' coefficients, each rounded once from its exact ratio. */
  const float t3 = (float)(-1.0 / 3), t5 = (float)(2.0 / 15),
              t7 = (float)(-17.0 / 315), t9 = (float)(62.0 / 2835),
              t11 = (float)(-1382.0 / 155925),
              t13 = (float)(21844.0 / 6081075),
              t15 = (float)(-929569.0 / 638512875);
  float small = __builtin_copysignf( /* the sign: -0 gives -0 */
      x + x * z *
              (t3 + z * (t5 + z * (t7 + z * (t9 + z * (t11 + z * (t13 +
                                                              z * t15)))))),
      x);
  float y = 2 * (a < 10.0f ? a : 10.0f); /* NaN: 10, put back below */
  /* n = round(y / ln 2) by adding 1.5 2^23, whose float then holds n in
   * its low bits: no float-to-int conversion (which keeps GCC from
   * making vectors of the loop with AVX-512). */
  union {
    float f;
    uint32_t u;
  } m = {.f = y * 1.44269504f + 12582912.0f};
  float nf = m.f - 12582912.0f; /* n, in [0, 29] */
  float r = y - nf * 0.693359375f + nf * 2.12194440e-4f;
  const float e3 = (float)(1.0 / 6), e4 = (float)(1.0 / 24),
              e5 = (float)(1.0 / 120), e6 = (float)(1.0 / 720),
              e7 = (float)(1.0 / 5040);
  float p = 1 + r * (1 + r * (0.5f + r * (e3 + r * (e4 + r * (e5 + r * (e6 +
                                                               r * e7))))));
  union {
    uint32_t u;
    float f;
  } two_n = {.u = (m.u + 127u) << 23}; /* 2^n: the 1.5 2^23 shifts out */
  float big = __builtin_copysignf(1 - 2 / (p * two_n.f + 1), x);
  return a < 0.4f ? small : a == a ? big : x;
}
#endif

/* ---- model.c ------------------------------------------------------------- */

/* A hash of the model's layer list (kinds, shapes, parameter offsets):
 * equal for two models whose flat buffers mean the same thing. */
uint64_t trn__model_shape_hash(const trn_model *m);
/* The seed the dropout masks are drawn from (the config's, until a
 * checkpoint sets the saved run's). */
uint64_t trn__model_dropout_seed(const trn_model *m);
void trn__model_set_dropout_seed(trn_model *m, uint64_t seed);

/* ---- gpt.c: the transformer ------------------------------------------------ */

typedef struct trn__gpt trn__gpt;
/* Parameters of cfg's gpt (its vocab, ctx, layers, heads, embd). */
size_t trn__gpt_nparams(const trn_model_config *cfg);
/* Activation buffers for cfg's largest batch.  0 or -ENOMEM. */
int trn__gpt_new(const trn_model_config *cfg, trn__gpt **out);
/* The shapes alone, without the CPU's activations (for a model on a CUDA
 * device): for trn__gpt_init and trn__gpt_tensors. */
int trn__gpt_plan(const trn_model_config *cfg, trn__gpt **out);
void trn__gpt_free(trn__gpt *g);
size_t trn__gpt_bytes(const trn__gpt *g); /* its activations' memory */
/* GPT-2's initialization into p, drawing from uniform(s, bound). */
void trn__gpt_init(const trn__gpt *g, float *p, uint64_t *s,
                   float (*uniform)(uint64_t *s, float bound));
size_t trn__gpt_tensors(const trn__gpt *g, size_t *ends, size_t max);
/* Forward on tokens inp (B, T), the summed cross-entropy against tgt (B,
 * T); the loss's gradient into dlogits (NULL: evaluation), the argmax
 * hits into *correct (may be NULL). */
double trn__gpt_forward(trn__gpt *g, const float *params, const int32_t *inp,
                        const int32_t *tgt, size_t B, size_t T, float *dlogits,
                        size_t *correct);
/* Backward after a forward with dlogits: the parameters' gradients are
 * added to grads. */
void trn__gpt_backward(trn__gpt *g, const float *params, float *grads,
                       const int32_t *inp, size_t B);
float *trn__gpt_dlogits(trn__gpt *g);
const float *trn__gpt_logits(const trn__gpt *g);

/* gpt's parameter tensors, in their order in the flat buffer: token and
 * position embeddings, each block's tensors stacked over the layers
 * (layer norm 1, attention's qkv and projection, layer norm 2, the MLP's
 * two), the final layer norm. */
enum {
  TRN__GPT_WTE, TRN__GPT_WPE, TRN__GPT_LN1W, TRN__GPT_LN1B, TRN__GPT_QKVW,
  TRN__GPT_QKVB, TRN__GPT_PROJW, TRN__GPT_PROJB, TRN__GPT_LN2W,
  TRN__GPT_LN2B, TRN__GPT_FCW, TRN__GPT_FCB, TRN__GPT_FCPW, TRN__GPT_FCPB,
  TRN__GPT_LNFW, TRN__GPT_LNFB, TRN__GPT_TENSORS
};
/* Each tensor's offset and size (floats) for c's dimensions. */
void trn__gpt_layout(const trn_model_config *c, size_t off[TRN__GPT_TENSORS],
                     size_t size[TRN__GPT_TENSORS]);

/* ---- resnet.c: residual networks ---------------------------------------- */

typedef struct trn__resnet trn__resnet;
/* -EINVAL with err set for a config resnet cannot build, else 0. */
int trn__resnet_check(const trn_model_config *c, char *err, size_t errlen);
/* The network and its activations for c's largest batch; 0, -ENOMEM or
 * -E2BIG (too deep for the op list). */
int trn__resnet_new(const trn_model_config *c, trn__resnet **out);
/* The op list alone, without the CPU's activations and workspaces (for a
 * model on a CUDA device): trn__resnet_layers only. */
int trn__resnet_plan(const trn_model_config *c, trn__resnet **out);
/* The ops as a layer list (trn__layer, src and src2 set) for the CUDA
 * backend: their count, written to l when it has room for max. */
struct trn__layer;
size_t trn__resnet_layers(const trn__resnet *r, struct trn__layer *l,
                          size_t max);
void trn__resnet_free(trn__resnet *r);
size_t trn__resnet_nparams(const trn__resnet *r);
size_t trn__resnet_nbuffers(const trn__resnet *r);
size_t trn__resnet_bytes(const trn__resnet *r); /* activations, workspaces */
void trn__resnet_init(const trn__resnet *r, float *p, float *buf, uint64_t *s,
                      float (*uniform)(uint64_t *s, float bound));
size_t trn__resnet_tensors(const trn__resnet *r, size_t *ends, size_t max);
/* Forward on x (B, c, h, w): the summed cross-entropy against y; with
 * train the batch norms use (and update) batch statistics and dlogits
 * gets the loss's gradient. */
double trn__resnet_forward(trn__resnet *r, const float *params, float *buf,
                           const float *x, const int32_t *y, size_t B,
                           bool train, float *dlogits, size_t *correct);
/* After a training forward: the parameters' gradients added to grads. */
void trn__resnet_backward(trn__resnet *r, const float *params, float *grads,
                          size_t B);
float *trn__resnet_dlogits(trn__resnet *r);
const float *trn__resnet_logits(const trn__resnet *r);

/* ---- layers.c: the CPU layers ------------------------------------------- */

/* y (B, out) = x (B, in) . W^T + b, W (out, in). */
void trn__linear_fwd(const float *x, const float *w, const float *b, float *y,
                     size_t B, size_t in, size_t out);
/* dW += dy^T . x, db += the sum of dy over the batch, dx = dy . W (dx
 * NULL: not wanted, the first layer). */
void trn__linear_bwd(const float *x, const float *w, const float *dy,
                     float *dx, float *dw, float *db, size_t B, size_t in,
                     size_t out);
void trn__relu_fwd(const float *x, float *y, size_t n);
/* From the output y: dx = dy where y > 0, else 0. */
void trn__relu_bwd(const float *y, const float *dy, float *dx, size_t n);
/* The cross-entropy of softmax(logits (B, C)) against labels, summed over
 * the batch (log-sum-exp in double); dl (NULL: not wanted) gets its
 * gradient, softmax - onehot; *correct (may be NULL) the argmax hits. */
double trn__softmax_ce(const float *logits, const int32_t *labels, float *dl,
                       size_t B, size_t C, size_t *correct);

/* ---- conv.c: the CPU layers for images ------------------------------------ */

/* A 2-D convolution: x (c, h, w) to y (oc, oh, ow), kernel k x k, zero
 * padding pad, stride (0 or 1: 1); oh = (h + 2 pad - k) / stride + 1. */
typedef struct trn__conv {
  unsigned c, h, w, oc, oh, ow, k, pad, stride;
  bool relu; /* a relu fused in: y = max(conv, 0), and backward through it */
} trn__conv;

/* Samples whose patches go into one matrix product: large enough to keep
 * OpenBLAS's kernels busy, small enough for the workspace. */
#define TRN__CONV_CHUNK 4

/* A model's convolution workspace, one set per thread part: col and tmp
 * (c k k and oc floats per output pixel of TRN__CONV_CHUNK samples, the
 * largest over the model's convolutions), and for parts 1 .. n - 1 a
 * partial dW and db (oc c k k + oc floats).  Parts are added when the
 * pool grows; a part that cannot be allocated is a thread left idle. */
typedef struct trn__conv_ws {
  size_t col_n, tmp_n, dw_n;
  int parts;
  float *col[TRN__THREADS_MAX], *tmp[TRN__THREADS_MAX],
      *dw[TRN__THREADS_MAX];
} trn__conv_ws;
/* Sizes *ws and allocates one part per thread of the pool.  Returns 0 or
 * -ENOMEM (nothing held).  A zero-sized workspace (no convolutions) holds
 * nothing. */
int trn__conv_ws_init(trn__conv_ws *ws, size_t col_n, size_t tmp_n,
                      size_t dw_n);
void trn__conv_ws_free(trn__conv_ws *ws);
/* The bytes it holds now. */
size_t trn__conv_ws_bytes(const trn__conv_ws *ws);

/* y (B, oc, oh, ow) from x (B, c, h, w), W (oc, c, k, k), b (oc; NULL:
 * no bias, and no db in backward).  The chunks of samples are shared
 * among the pool's threads; the result does not depend on their number. */
void trn__conv_fwd(const trn__conv *cv, const float *x, const float *w,
                   const float *b, float *y, size_t B, trn__conv_ws *ws);
/* dW and db += their gradients; dx (NULL: not wanted) = the input's.  y
 * is the forward's output (read only with a fused relu).  With more than
 * one thread, each sums its chunks' dW and db apart and the parts are
 * added in part order: the same bits for the same thread count. */
void trn__conv_bwd(const trn__conv *cv, const float *x, const float *w,
                   const float *y, const float *dy, float *dx, float *dw,
                   float *db, size_t B, trn__conv_ws *ws);
/* Whether the convolutions and 2 x 2 pooling may take their AVX-512 paths
 * where the CPU has it (the default): off, the plain loops.  Both give
 * the same bits; for the test that checks so. */
void trn__conv_vectors_set(bool on);
/* k x k windows, stride k: y (B, c, h / k, w / k) and where each maximum
 * was (its index in its channel's plane). */
void trn__maxpool_fwd(const float *x, float *y, uint32_t *arg, size_t B,
                      unsigned c, unsigned h, unsigned w, unsigned k);
void trn__maxpool_bwd(const float *dy, const uint32_t *arg, float *dx,
                      size_t B, unsigned c, unsigned h, unsigned w,
                      unsigned k);
/* A dropout call's generator: element i is zeroed when mix(base + golden
 * (i + 1)) >> 32 < cut (conv.c's mix); cuda-model.cu draws the same. */
void trn__dropout_draw(float p, uint64_t seed, uint64_t call, uint64_t *base,
                       uint64_t *cut);
/* y = x mask, mask 0 with probability p else 1 / (1 - p), drawn from
 * (seed, call) alone. */
void trn__dropout_fwd(const float *x, float *y, float *mask, size_t n,
                      float p, uint64_t seed, uint64_t call);
void trn__dropout_bwd(const float *mask, const float *dy, float *dx,
                      size_t n);

/* Batch normalization over (n, h, w) per channel, as torch.nn.BatchNorm2d:
 * in training the batch's mean and biased variance normalize, and the
 * running statistics move by `momentum` toward the mean and the unbiased
 * variance; in evaluation the running statistics normalize. */
typedef struct trn__bn {
  unsigned c;
  size_t hw;
  float eps, momentum;
} trn__bn;
/* y = gamma xhat + beta, xhat = (x - mean) / sqrt(var + eps); the
 * batch's mean (c) and inv (c) = 1 / sqrt(var + eps) are kept for
 * backward (either may be NULL in evaluation), which computes xhat again
 * from x, to the same bits, instead of keeping (B, c, hw) more. */
void trn__bn_fwd(const trn__bn *bn, const float *x, const float *gamma,
                 const float *beta, float *y, float *mean, float *inv,
                 float *run_mean, float *run_var, size_t B, bool train);
/* From the forward's x, mean and inv: dgamma, dbeta += their gradients;
 * dx (NULL: not wanted) the input's. */
void trn__bn_bwd(const trn__bn *bn, const float *x, const float *mean,
                 const float *inv, const float *gamma, const float *dy,
                 float *dx, float *dgamma, float *dbeta, size_t B);

/* cuda-bn.cu's training kernels on CUDA device `index` over host arrays
 * (B, bn->c, bn->hw), for tests: y, and inv = 1 / sqrt(var + eps), from
 * x, the running statistics moved; then from dy, dx (set, or added to
 * with acc), dgamma and dbeta (added to), as trn__bn_fwd and trn__bn_bwd
 * do.  0, -ENOMEM or -EIO (logged), -ENOTSUP without CUDA. */
int trn__cuda_bn_run(int index, const trn__bn *bn, size_t B, const float *x,
                     const float *gamma, const float *beta, float *run_mean,
                     float *run_var, float *y, float *inv, const float *dy,
                     float *dx, bool acc, float *dgamma, float *dbeta);

/* ---- model.c's layer list, which cuda-model.cu runs too ------------------ */

enum {
  TRN__L_LINEAR,
  TRN__L_RELU,
  TRN__L_CONV,
  TRN__L_POOL,
  TRN__L_DROPOUT,
  TRN__L_BN,
  TRN__L_ADD,     /* the sum of two earlier layers' outputs (resnet) */
  TRN__L_AVGPOOL, /* each channel's mean over the plane: (c, 1, 1) */
};

#define TRN__LAYERS_MAX 32

typedef struct trn__layer {
  int kind;
  /* The layers whose outputs are this one's input(s), -1 the model's
   * input: model.c's lists chain (src = i - 1); resnet.c's layers feed a
   * block's input to its shortcut too.  src2: TRN__L_ADD's second. */
  int src, src2;
  unsigned c, h, w;      /* input shape per sample */
  size_t in, out;        /* floats per sample, in and out */
  trn__conv cv;          /* TRN__L_CONV */
  unsigned k;            /* TRN__L_POOL: window */
  unsigned s, pad;       /* TRN__L_POOL: stride (0: k) and padding */
  float p;               /* TRN__L_DROPOUT: the probability of a zero */
  trn__bn bn;            /* TRN__L_BN */
  size_t w_off, b_off;   /* parameters: weight (BN: gamma), bias (beta) */
  size_t nparams;
  bool bias;             /* TRN__L_LINEAR, _CONV: has one (b_off valid) */
  /* The CPU backend's buffers (NULL for a model on a CUDA device): */
  float *y;              /* (max_batch, out) the layer's output */
  float *mask;           /* TRN__L_DROPOUT: (max_batch, out) 0 or 1/(1-p) */
  uint32_t *arg;         /* TRN__L_POOL: (max_batch, out) where each max was */
  float *mean, *inv;     /* TRN__L_BN: the batch's mean, 1 / deviation (c) */
  size_t buf_off;        /* TRN__L_BN: running mean (c), then variance (c) */
} trn__layer;

/* ---- cuda-model.cu: a layer list on a CUDA device ------------------------ */

/* The device's copy of a model: parameters, gradients, buffers,
 * activations and workspaces in device memory, a stream, a cuBLAS and a
 * cuDNN handle.  Every call makes the device current for the calling
 * thread first, so any thread may call (one at a time).  Errors from CUDA,
 * cuBLAS and cuDNN are logged with the call and file:line and come back as
 * -EIO; running out of device memory is -ENOMEM with the sizes in err.  In
 * a build without CUDA these return -ENOTSUP (device.c). */
typedef struct trn__gpu trn__gpu;

enum { TRN__GPU_PARAMS, TRN__GPU_GRADS, TRN__GPU_BUFFERS };

/* Builds the device copy of the nl layers l (copied), nparams parameters,
 * nbuffers buffer floats, batches up to max_batch, on CUDA device index;
 * precision TRN_FP32, TRN_TF32 (products and convolutions may round their
 * inputs to TF32) or TRN_BF16 (products round them to bf16, convolutions
 * to TF32).  Chooses each convolution's algorithms (conv_timed). */
int trn__gpu_new(int index, const trn__layer *l, size_t nl, size_t nparams,
                 size_t nbuffers, size_t max_batch, int precision,
                 trn__gpu **out, char *err, size_t err_len);
void trn__gpu_free(trn__gpu *g);
size_t trn__gpu_bytes(const trn__gpu *g); /* device memory it holds */
/* Copies the host array which (TRN__GPU_*, its full length) to or from
 * the device; get waits for the copy. */
int trn__gpu_put(trn__gpu *g, int which, const float *src);
int trn__gpu_get(trn__gpu *g, int which, float *dst);
int trn__gpu_zero_grads(trn__gpu *g);
/* For tests: layer i's output from the last pass at batch B (B x its
 * width) into y, and for a max-pool its winners (each output's index in
 * its input plane) into arg (may be NULL); -EINVAL for a bad index or
 * batch, or arg for another kind of layer. */
int trn__gpu_layer_out(trn__gpu *g, size_t i, size_t B, float *y,
                       uint32_t *arg);
/* m's layer list (mlp, cnn; NULL and *nl 0 for gpt and resnet), and the
 * copy trn__gpu_layer_out makes, from either backend. */
const trn__layer *trn__model_layers(const trn_model *m, size_t *nl);
int trn__model_layer_out(trn_model *m, size_t i, size_t B, float *y,
                         uint32_t *arg);
/* One pass on x (B, in) with labels y (B), checked by the caller: forward,
 * and with train backward (the gradients added to the device's) and
 * dropout masks drawn as the CPU draws them from (seed, *dropout_calls),
 * which counts up.  The logits (B, classes) are copied to logits, the
 * summed loss (each sample's in double, added in sample order) to *loss,
 * and the argmax hits to *correct (may be NULL). */
int trn__gpu_pass(trn__gpu *g, const float *x, const int32_t *y, size_t B,
                  bool train, uint64_t seed, uint64_t *dropout_calls,
                  float *logits, double *loss, size_t *correct);
/* Loss scaling on the device (either model kind): scale > 0 makes every
 * later training pass (trn__gpu_pass, trn__gpu_tokens) compute the
 * gradient of its loss times scale into an array of the device's own,
 * check it for infs and NaNs, and add it divided by scale to the
 * gradients only when it holds none; 0 turns that off.  The first call
 * with a scale allocates the array (nparams floats): 0, -ENOMEM (err
 * says the sizes) or -EIO. */
int trn__gpu_set_scale(trn__gpu *g, float scale, char *err, size_t err_len);
/* Whether the last scaled training pass overflowed (added nothing). */
bool trn__gpu_overflow(const trn__gpu *g);

/* gpt on CUDA device index (cuda-gpt.cu): c's dimensions, nparams
 * parameters laid out as trn__gpt_layout says, batches of up to
 * c->max_batch sequences of up to c->ctx tokens. */
int trn__gpu_new_gpt(int index, const trn_model_config *c, size_t nparams,
                     int precision, trn__gpu **out, char *err,
                     size_t err_len);
/* One pass of a gpt model on tokens x (B, T) and their next tokens y (B,
 * T), checked by the caller: forward, and with train backward (the
 * gradients added to the device's).  The summed loss (each position's in
 * double, added in order) goes to *loss, the argmax hits to *correct (may
 * be NULL); the logits stay on the device. */
int trn__gpu_tokens(trn__gpu *g, const int32_t *x, const int32_t *y, size_t B,
                    size_t T, bool train, double *loss, size_t *correct);
/* The last trn__gpu_tokens pass's logits, (B T, vocab), into dst (room
 * for max_batch ctx vocab); *n: the floats written (0: no pass yet). */
int trn__gpu_logits(trn__gpu *g, float *dst, size_t *n);

/* An optimizer step's settings and per-step scalars, as optim.c computes
 * them for its CPU step. */
typedef struct trn__step {
  int kind; /* TRN_SGD, TRN_ADAMW, TRN_LAMB */
  float scale, lr, wd;
  float momentum, dampening; /* SGD (no state: no momentum) */
  bool nesterov, first;
  float beta1, beta2, eps;   /* AdamW, LAMB */
  float step, bc2s, decay;   /* AdamW */
  float bc1, bc2;            /* LAMB */
  const size_t *ends;        /* LAMB: its tensors' ends (none: one tensor) */
  size_t nends;
} trn__step;

/* One optimizer step on the device's parameters with its gradients;
 * state is the optimizer's state in device memory (a trn__dbuf of the
 * same device; NULL for SGD without momentum).  Waits for the step. */
int trn__gpu_step(trn__gpu *g, float *state, const trn__step *s);
int trn__gpu_index(const trn__gpu *g);

/* A float array in one CUDA device's memory (an optimizer's state kept
 * next to a model on that device). */
typedef struct trn__dbuf {
  int index; /* the device */
  float *p;  /* (n) NULL: none yet */
  size_t n;
} trn__dbuf;
/* Copies n floats from src into the array on device index, allocating it
 * (again, when the device or size differs).  0, -ENOMEM or -EIO. */
int trn__dbuf_put(trn__dbuf *b, int index, const float *src, size_t n);
int trn__dbuf_get(const trn__dbuf *b, float *dst);
void trn__dbuf_free(trn__dbuf *b);
/* An optimizer step on a model's device, the state kept there (optim.c). */
int trn__optim_step_gpu(trn_optim *o, trn__gpu *g, float scale);

#ifdef __cplusplus
}
#endif

#endif /* BEE_TRAINER_INT_H */
