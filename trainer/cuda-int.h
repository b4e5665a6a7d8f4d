/* cuda-int.h: what cuda-model.cu, cuda-gpt.cu and cuda-bn.cu share (C++,
 * nvcc only): the device copy of a model (struct trn__gpu), the checks,
 * and small helpers.  cuda-model.cu owns the struct's life, the arrays
 * every model has (parameters, gradients, buffers) and the optimizer
 * steps; a layer list's state lives in it too, gpt's in cuda-gpt.cu
 * behind g->gpt, batch norm's training kernels in cuda-bn.cu. */
#ifndef BEE_TRAINER_CUDA_INT_H
#define BEE_TRAINER_CUDA_INT_H

#include "trainer-int.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

/* ---- checking (cuda.cu's checks: logged with call, file:line; -EIO) ---- */

#define CK(call) trn__cuda_check((call), #call, __FILE__, __LINE__)
#define BK(call) trn__blas_check((call), #call, __FILE__, __LINE__)
#define DK(call) trn__dnn_check((call), #call, __FILE__, __LINE__)
/* Returns from the calling function on the first failure. */
#define TRY(x)                                                                 \
  do {                                                                         \
    int try_rc_ = (x);                                                         \
    if (try_rc_)                                                               \
      return try_rc_;                                                          \
  } while (0)

#define THREADS 256

static inline unsigned blocks(size_t n) {
  return (unsigned)((n + THREADS - 1) / THREADS);
}


/* y = a + b; both .cu files' residual sums (static: each has its own). */
static __global__ void k_add(const float *a, const float *b, float *y,
                             size_t n) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n)
    y[i] = a[i] + b[i];
}

/* ---- the device copy --------------------------------------------------- */

/* A convolution's cuDNN descriptors and chosen algorithms. */
typedef struct gconv {
  cudnnTensorDescriptor_t x, y, b;
  cudnnFilterDescriptor_t w;
  cudnnConvolutionDescriptor_t cv;
  cudnnConvolutionFwdAlgo_t fwd;
  cudnnConvolutionBwdDataAlgo_t bwd_data;
  cudnnConvolutionBwdFilterAlgo_t bwd_filter;
} gconv;

/* Batch norm's: x and y (B, c, hw, 1), its parameters (1, c, 1, 1). */
typedef struct gbn {
  cudnnTensorDescriptor_t x, p;
  float *mean, *ivar; /* (c) the batch's, saved for backward */
} gbn;

struct trn__gpu {
  int index;
  struct ggpt *gpt; /* gpt (cuda-gpt.cu): its state; then nl is 0 */
  bool tf32;  /* TF32 on the tensor cores allowed */
  bool bf16;  /* products with bf16 inputs (trn__gemm) */
  bool fp16;  /* products and convolutions with fp16 inputs */
  bool timed; /* convolution algorithms by timing (conv_timed) */
  cudaStream_t st;
  cublasHandle_t blas;
  cudnnHandle_t dnn;
  trn__layer *l; /* (nl) */
  size_t nl, nparams, nbuffers, max_batch, in, classes, widest;
  float *params, *grads, *buffers; /* (nparams), (nparams), (nbuffers) */
  float *x;                        /* (max_batch, in) */
  int32_t *y;                      /* (max_batch) */
  /* Per layer, (nl) each: */
  float **act;    /* (max_batch, out) the layer's output */
  float **mask;   /* dropout's */
  uint32_t **arg; /* max-pool's */
  gconv *conv;
  gbn *bn;
  int *grad;      /* which of dbuf holds the output's gradient */
  bool *acc;      /* it adds to its src's input gradient (set: another
                     reader of src wrote it first) */
  bool *acc2;     /* likewise for src2 */
  float **dbuf;   /* (ndbuf) each (max_batch, widest): the gradients */
  size_t ndbuf;
  double *loss;   /* (max_batch) each sample's */
  uint8_t *hit;   /* (max_batch) */
  double *h_loss; /* pinned host copies of the two */
  uint8_t *h_hit;
  void *ws; /* the convolutions' workspace */
  size_t ws_bytes, bytes;
  /* TRN_CUDA_PROFILE=1 in the environment: each layer's time, forward
   * and backward, from events around it, logged when the model is freed.
   * fev[i] is recorded before forward layer i (fev[nl] after the last),
   * bev[i] after backward layer i (bev[nl] before the first). */
  bool prof;
  cudaEvent_t *fev, *bev;  /* (nl + 1) each */
  double *fwd_ms, *bwd_ms; /* (nl) each */
  size_t passes, train_passes;
  double *lamb_part; /* LAMB: each block's sums, (2 blocks(nparams) + 2) */
  float *lamb_step;  /* LAMB: lr times the tensor's trust ratio */
  /* Loss scaling (trn__gpu_set_scale): the scale (0: none), a scaled
   * pass's own gradients (nparams), where the model's are kept during it,
   * its overflow flag on the device and a pinned host copy, and the last
   * pass's verdict. */
  float scale;
  float *sgrads, *kept;
  int *bad, *h_bad;
  bool overflow;
  /* Batch norm in training (cuda-bn.cu): each (channel, slice)'s sums and
   * backward's three coefficients a channel, for the widest layer. */
  double2 *bn_part;
  float *bn_coef;
};

/* cudaMalloc that counts the bytes in g->bytes, and explains a failure in
 * err: -ENOMEM with the sizes, or -EIO. */
int trn__dalloc(trn__gpu *g, void **p, size_t bytes, const char *what,
                char *err, size_t err_len);

/* cuBLAS's compute type for products with bf16 or fp16 inputs. */
static inline cublasComputeType_t trn__half(const trn__gpu *g) {
  return g->fp16 ? CUBLAS_COMPUTE_32F_FAST_16F : CUBLAS_COMPUTE_32F_FAST_16BF;
}

/* C = alpha op(A) op(B) + beta C over fp32 arrays, column-major, as
 * cublasSgemm; with bf16 (fp16) the products take bf16 (fp16) inputs on
 * the tensor cores (cuBLAS rounds A and B as it reads them) and sum in
 * fp32: the arrays, and the master weights among them, stay fp32. */
static inline cublasStatus_t trn__gemm(trn__gpu *g, cublasOperation_t ta,
                                       cublasOperation_t tb, int m, int n,
                                       int k, const float *alpha,
                                       const float *a, int lda, const float *b,
                                       int ldb, const float *beta, float *c,
                                       int ldc) {
  if (!g->bf16 && !g->fp16)
    return cublasSgemm(g->blas, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta,
                       c, ldc);
  return cublasGemmEx(g->blas, ta, tb, m, n, k, alpha, a, CUDA_R_32F, lda, b,
                      CUDA_R_32F, ldb, beta, c, CUDA_R_32F, ldc, trn__half(g),
                      CUBLAS_GEMM_DEFAULT);
}

/* The same for `count` products, each array sa, sb, sc floats after the
 * last (cublasSgemmStridedBatched). */
static inline cublasStatus_t
trn__gemm_batched(trn__gpu *g, cublasOperation_t ta, cublasOperation_t tb,
                  int m, int n, int k, const float *alpha, const float *a,
                  int lda, long long sa, const float *b, int ldb, long long sb,
                  const float *beta, float *c, int ldc, long long sc,
                  int count) {
  if (!g->bf16 && !g->fp16)
    return cublasSgemmStridedBatched(g->blas, ta, tb, m, n, k, alpha, a, lda,
                                     sa, b, ldb, sb, beta, c, ldc, sc, count);
  return cublasGemmStridedBatchedEx(
      g->blas, ta, tb, m, n, k, alpha, a, CUDA_R_32F, lda, sa, b, CUDA_R_32F,
      ldb, sb, beta, c, CUDA_R_32F, ldc, sc, count, trn__half(g),
      CUBLAS_GEMM_DEFAULT);
}

#define DALLOC(p, n, what)                                                     \
  TRY(trn__dalloc(g, (void **)&(p), (n) * sizeof *(p), what, err, err_len))

/* The stream, cuBLAS and cuDNN handles, and the parameter, gradient and
 * buffer arrays (the gradients zeroed): what every model needs
 * (cuda-model.cu). */
int trn__gpu_core(trn__gpu *g, char *err, size_t err_len);

/* A scaled training pass (g->scale > 0; else these do nothing): begin
 * zeroes the pass's own gradient array and the overflow flag and has the
 * backward pass add to that array instead of g->grads; end puts g->grads
 * back, checks the array for infs and NaNs and adds it divided by the
 * scale to g->grads only when it holds none, and sends the flag to the
 * host; after the stream's synchronization, trn__gpu_scaled_check sets
 * g->overflow from it.  The logits' gradient is the caller's to scale
 * (the cross-entropy kernels take the factor). */
int trn__gpu_scaled_begin(trn__gpu *g);
int trn__gpu_scaled_end(trn__gpu *g);
void trn__gpu_scaled_check(trn__gpu *g);

/* The summed loss (n per-sample losses, added in order) and hits. */
static inline void trn__sum_losses(const double *loss, const uint8_t *hit,
                                   size_t n, double *total, size_t *correct) {
  double t = 0;
  size_t right = 0;
  for (size_t i = 0; i < n; i++)
    t += loss[i], right += hit[i];
  *total = t;
  if (correct)
    *correct = right;
}

/* Batch norm's slices of the batch for c channels (cuda-bn.cu): about
 * 2048 blocks in all, none smaller than an image. */
static inline unsigned trn__bn_slices(unsigned c, size_t B) {
  size_t s = (2048 + c - 1) / c;
  return (unsigned)(s < B ? s : B);
}

/* Batch norm in training, over x (B, bn->c, bn->hw) on g's stream: the
 * batch's statistics summed in double per channel, y = gamma (x - mean)
 * ivar + beta, the running statistics rm and rv moved as conv.c moves
 * them, and the batch's mean and ivar = 1 / sqrt(var + eps) saved. */
int trn__gpu_bn_fwd(trn__gpu *g, const trn__bn *bn, const float *x,
                    const float *gamma, const float *beta, float *y,
                    float *rm, float *rv, float *mean, float *ivar, size_t B);
/* Its backward: dgamma and dbeta added to, dx (NULL: none wanted) set or,
 * with acc, added to. */
int trn__gpu_bn_bwd(trn__gpu *g, const trn__bn *bn, const float *x,
                    const float *dy, const float *gamma, const float *mean,
                    const float *ivar, float *dx, bool acc, float *dgamma,
                    float *dbeta, size_t B);

/* gpt's state (cuda-gpt.cu): freed with the model. */
void trn__ggpt_free(trn__gpu *g);

#endif /* BEE_TRAINER_CUDA_INT_H */
