/* trainer.h: the trainer library's one public header.
 *
 * The trainer runs the local half of a training step: it owns the compute
 * device, the model and its optimizer, and hands flat gradient buffers to
 * whoever averages them.  It knows nothing of the network; the daemon ties
 * it to the swarm.  Here: logging, devices (a "--device" spec, the CUDA
 * devices, one opened, or the CPU), the data (image and token files
 * checked whole, and the sources a model trains and tests on), the
 * models, the optimizers and the checkpoints.
 *
 * Functions return 0 or a negative errno.  See trainer/README.md.
 */
#ifndef BEE_TRAINER_H
#define BEE_TRAINER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Logging.  The trainer writes one line per event through a hook, so the    */
/* daemon can route it into its own logger; by default lines go to stderr as */
/* "LEVEL trainer: message".  Levels match the daemon's (error = 0).         */

enum { TRN_LOG_ERROR = 0, TRN_LOG_WARN, TRN_LOG_INFO, TRN_LOG_DEBUG };

/* Receives one finished log line (no trailing newline), borrowed for the
 * duration of the call.  May be called from any thread that calls into the
 * trainer. */
typedef void (*trn_log_cb)(int level, const char *msg, void *data);

/* Routes the trainer's log lines to cb (NULL restores the stderr default).
 * Call it once at start-up, before any other thread uses the trainer: the
 * hook itself is not synchronized. */
void trn_log_set(trn_log_cb cb, void *data);

/* ------------------------------------------------------------------------ */
/* Devices.                                                                 */

enum {
  TRN_DEV_AUTO = 0, /* only as a parsed spec: CUDA if present, else CPU */
  TRN_DEV_CPU,
  TRN_DEV_CUDA,
};

/* Highest CUDA index a spec may name ("cuda:4095"). */
#ifndef TRN_DEV_INDEX_MAX
#define TRN_DEV_INDEX_MAX 4095
#endif

typedef struct trn_device {
  int kind;               /* TRN_DEV_CPU / TRN_DEV_CUDA */
  int index;              /* CUDA ordinal (as CUDA_VISIBLE_DEVICES numbers
                             them); 0 for the CPU */
  char name[128];         /* "NVIDIA H100 80GB HBM3", or the CPU model */
  uint64_t mem_bytes;     /* device memory; physical RAM for the CPU */
  int sm_major, sm_minor; /* compute capability; 0.0 for the CPU */
  int cpu_threads;        /* online CPUs (compute threads for TRN_DEV_CPU,
                             host threads for data loading either way) */
} trn_device;

/* Parses a device spec: "auto", "cpu", "cuda" (same as "cuda:0") or
 * "cuda:N" with N decimal, without sign or leading zeros, at most
 * TRN_DEV_INDEX_MAX.  NULL means "auto".  Sets *kind to TRN_DEV_AUTO,
 * TRN_DEV_CPU or TRN_DEV_CUDA and *index to N (0 otherwise).  Returns 0, or
 * -EINVAL (outputs untouched) for anything else. */
int trn_device_parse(const char *spec, int *kind, int *index);

/* Returns whether the CUDA backend is there: the module beed-cuda.so
 * (built where nvcc is, meson -Dcuda) and the CUDA libraries it needs
 * load.  Looks for them on the first call.  Says nothing of devices
 * (trn_device_count_cuda). */
bool trn_cuda_available(void);

/* Host memory for batches a model reads: page-locked when pinned is
 * true and the CUDA runtime gives it (a CUDA model copies a batch from it
 * at the bus's speed, with no staging copy on the host), else malloc's;
 * NULL when there is none.  Free with trn_host_free (NULL is fine);
 * trn_host_pinned says which it got.  Pinned memory is never swapped out:
 * ask for it for a CUDA model's batches only. */
void *trn_host_alloc(size_t bytes, bool pinned);
bool trn_host_pinned(const void *p);
void trn_host_free(void *p);

/* Counts the CUDA devices this process can see into *n.  No CUDA
 * backend, a machine without a driver and a driver without devices all
 * give 0 and *n = 0.  Returns -EIO (logged with the failing call) when the runtime
 * fails in any other way. */
int trn_device_count_cuda(int *n);

/* Returns the cuDNN version loaded at run time (e.g. 91300 for 9.13.0), or
 * 0 without the CUDA backend.  Needs no GPU. */
size_t trn_cudnn_version(void);

/* Resolves spec (see trn_device_parse) to a device and fills *out.
 *
 *   auto     the first CUDA device when one is present, else the CPU;
 *   cpu      the CPU, with cpu_threads = online CPUs;
 *   cuda[:N] CUDA device N, which must exist.
 *
 * On success a CUDA device is also made current for the calling thread
 * (see trn_device_bind).  why (may be NULL when why_len is 0) receives one
 * line saying what was chosen and why, or what went wrong; it is always
 * NUL-terminated and truncated to fit.  Returns 0, or:
 *   -EINVAL   spec is malformed;
 *   -ENOTSUP  spec asks for CUDA but this build has no CUDA backend;
 *   -ENODEV   cuda:N with N >= the number of devices (why names N and the
 *             count);
 *   -EIO      the CUDA runtime failed (also logged). */
int trn_device_open(const char *spec, trn_device *out, char *why,
                    size_t why_len);

/* Makes dev current for the calling thread.  CUDA keeps the current device
 * per thread, so each worker thread that launches work calls this first.
 * A no-op for the CPU.  Returns 0 or -EIO. */
int trn_device_bind(const trn_device *dev);

/* ------------------------------------------------------------------------ */
/* Data.  Files are checked whole before anything is kept: a bad one gives a */
/* negative errno and one line in err (err_len bytes, NUL-terminated) that  */
/* names the file and the byte offset, in the decompressed data, where it   */
/* went wrong.  See trainer/README.md, "Data".                              */

#ifndef TRN_IDX_DIMS_MAX
#define TRN_IDX_DIMS_MAX 4
#endif
#ifndef TRN_IDX_BYTES_MAX
#define TRN_IDX_BYTES_MAX ((size_t)1 << 34) /* 16 GiB: what one file may ask */
#endif
#define TRN_MNIST_CLASSES 10
#define TRN_CHANNELS_MAX 4

/* An IDX file of unsigned bytes (the MNIST format): the data row-major. */
typedef struct trn_idx {
  uint8_t *data; /* (dims[0], ..., dims[ndims - 1]) */
  uint32_t dims[TRN_IDX_DIMS_MAX];
  int ndims;
  size_t len; /* bytes: the product of dims */
} trn_idx;

/* Reads path, gzip-compressed or plain: the magic 00 00 08 D (unsigned
 * bytes, D dimensions, 1 to TRN_IDX_DIMS_MAX), D big-endian sizes, then
 * exactly their product of bytes.  Returns 0 and *out (free with
 * trn_idx_free), or: -errno when the file cannot be opened; -EBADMSG for a
 * wrong magic, a zero dimension, truncated data or bytes after the data;
 * -EFBIG past TRN_IDX_BYTES_MAX; -EIO for a read or gzip error; -ENOMEM.
 * *out is empty on failure. */
int trn_idx_read(const char *path, trn_idx *out, char *err, size_t err_len);
void trn_idx_free(trn_idx *x);

/* Labelled images in memory. */
typedef struct trn_images {
  uint8_t *pix;    /* (n, c, h, w) */
  uint8_t *labels; /* (n), each < classes */
  size_t n;
  unsigned c, h, w, classes;
} trn_images;

/* Loads an MNIST-format split from dir: "<split>-images-idx3-ubyte.gz" and
 * "<split>-labels-idx1-ubyte.gz" (or the same names without ".gz"), split
 * "train" or "t10k".  Fashion-MNIST (Debian's dataset-fashion-mnist puts
 * it in TRN_FASHION_MNIST_DIR) and MNIST share the format.  Checks the
 * dimensions, that there is one label per image, and every label (the
 * first out of range is named with its offset).  Returns 0 or an error as
 * trn_idx_read (-EINVAL for another split).  Free with trn_images_free. */
#define TRN_FASHION_MNIST_DIR "/usr/share/datasets/fashion-mnist"
int trn_mnist_load(const char *dir, const char *split, trn_images *out,
                   char *err, size_t err_len);
/* Loads CIFAR-10's binary batches from dir: "data_batch_1.bin" to
 * "data_batch_5.bin" for split "train", "test_batch.bin" for "test" (plain
 * or gzip).  Records of a label byte and 32x32 R, G and B planes: images
 * (n, 3, 32, 32).  A truncated record or a label over 9 is -EBADMSG named
 * with its file and offset; errors as trn_mnist_load otherwise. */
int trn_cifar10_load(const char *dir, const char *split, trn_images *out,
                     char *err, size_t err_len);
void trn_images_free(trn_images *d);

/* One peer's passes over a dataset of n items: each epoch a permutation
 * drawn from (seed, epoch), so peers with different seeds (their ids)
 * read different orders, and (seed, epoch, pos) is all it takes to pick
 * up where a saved run stopped. */
typedef struct trn_order {
  uint32_t *idx; /* (n) this epoch's permutation */
  size_t n, pos; /* items, the next one's place in idx */
  uint64_t epoch;
  uint8_t seed[32]; /* the seed, longer ones folded in */
} trn_order;

/* Returns 0, -EINVAL (n = 0 or over 2^32 - 1, pos > n) or -ENOMEM. */
int trn_order_init(trn_order *o, size_t n, const void *seed, size_t seed_len,
                   uint64_t epoch, size_t pos);
void trn_order_free(trn_order *o);
/* The next item; after the last of an epoch, the first of the next. */
size_t trn_order_next(trn_order *o);

/* Token files for language models: the header llm.c writes (256
 * little-endian int32s: magic 20240520, version 1, the token count, the
 * rest 0), then the tokens as little-endian uint16. */
typedef struct trn_tokens {
  uint16_t *tok; /* (n) */
  size_t n;
  uint32_t vocab;
} trn_tokens;
/* Reads path (plain or gzip), every token checked below vocab (at most
 * 65536).  Errors as trn_idx_read: -EBADMSG for a wrong magic or version,
 * a truncated file, data after the tokens or a token out of range, named
 * with its offset. */
int trn_tokens_load(const char *path, uint32_t vocab, trn_tokens *out,
                    char *err, size_t err_len);
void trn_tokens_free(trn_tokens *t);
/* Training windows of T tokens (and the T that follow each by one): the
 * items an order over the file runs through. */
size_t trn_tokens_windows(const trn_tokens *t, size_t T);
/* The next B windows of o: x (B, T) the window, y (B, T) the next token of
 * each position.  -EINVAL for an order not over trn_tokens_windows(t, T)
 * items. */
int trn_tokens_batch(const trn_tokens *t, trn_order *o, size_t B, size_t T,
                     int32_t *x, int32_t *y);

/* The next b items of o as a batch: x (b, c, h, w) with pixel / 255
 * normalized per channel, (p / 255 - mean[c]) / std[c] in torchvision's
 * order (mean NULL: 0, std NULL: 1), and y (b) their labels.  Returns 0,
 * or -EINVAL for an order of another size, b = 0, or a std not > 0. */
int trn_images_batch(const trn_images *d, trn_order *o, size_t b,
                     const float *mean, const float *std, float *x,
                     int32_t *y);
/* Augmentation for training images, as torchvision's RandomCrop(size,
 * padding = pad) (black padding) followed by RandomHorizontalFlip. */
typedef struct trn_aug {
  unsigned pad; /* 0: no crop */
  bool flip;
} trn_aug;
/* trn_images_batch with augmentation (aug NULL: none).  Each item's
 * random choices come from (the order's seed, epoch, the item's place in
 * the epoch), so a resumed run sees the same ones.  -EINVAL also for a pad
 * larger than the image. */
int trn_images_batch_aug(const trn_images *d, trn_order *o, size_t b,
                         const float *mean, const float *std,
                         const trn_aug *aug, float *x, int32_t *y);

/* A synthetic source for benchmarks of any image shape (ImageNet's: 3 x
 * 224 x 224, 1000 classes), nothing stored: items first .. first + b - 1
 * of seed as x (b, c, h, w) and y (b).  Each item comes from (seed, its
 * number) alone: a label uniform below classes, and pixels uniform in
 * [-1, 1) plus a brightness per (class, channel) in [-0.5, 0.5), so a
 * model has something to learn.  The same bits on every machine.
 * Returns 0 or -EINVAL (a zero size, classes < 2). */
int trn_synthetic_batch(uint64_t seed, uint64_t first, size_t b, unsigned c,
                        unsigned h, unsigned w, unsigned classes, float *x,
                        int32_t *y);

/* Batches made ahead on a thread of the loader's own, in exactly the
 * order trn_images_batch_aug would make them from `from` (copied: the
 * caller's order is not touched), `depth` (2 to 64) at a time, in
 * trn_host_alloc's memory (pinned: for a CUDA model). */
typedef struct trn_loader trn_loader;
/* Returns 0, -EINVAL (sizes, depth, a std not > 0) or -ENOMEM or the
 * thread's error.  d must outlive the loader. */
int trn_loader_new(const trn_images *d, const trn_order *from, size_t batch,
                   const float *mean, const float *std, const trn_aug *aug,
                   size_t depth, bool pinned, trn_loader **out);
/* The next batch, waiting for it if it is not made yet: x (batch, c h w)
 * and y (batch) stay valid until the next call (the loader's own).  0 or
 * the error that stopped the worker. */
int trn_loader_next(trn_loader *l, const float **x, const int32_t **y);
/* The order as a checkpoint should record it: placed at the next batch
 * the trainer will take (the batches made ahead do not count).  Fills a
 * fresh *out (free with trn_order_free); 0 or -ENOMEM. */
int trn_loader_order(trn_loader *l, trn_order *out);
/* Stops the thread and frees the loader; NULL is fine. */
void trn_loader_free(trn_loader *l);

/* ------------------------------------------------------------------------ */
/* Models.  One flat parameter buffer and one flat gradient buffer of the    */
/* same layout; CPU backend (OpenBLAS).  Today: `mlp` (linear layers with    */
/* relu between them) and `cnn` (the classic Fashion-MNIST net), each ended */
/* by softmax cross-entropy.                                                */

#define TRN_MLP_SIZES_MAX 8
#define TRN_WIDTH_MAX (1 << 20)
#define TRN_BATCH_MAX (1 << 16)

typedef struct trn_model_config {
  const char *name;               /* "mlp" or "cnn" */
  unsigned sizes[TRN_MLP_SIZES_MAX]; /* mlp: input, hidden..., classes */
  size_t nsizes;
  /* cnn: input (in_c, in_h, in_w), conv 5x5 (padding 2) to conv[0]
   * channels, relu, max-pool 2, conv 5x5 to conv[1], relu, max-pool 2,
   * dense to `dense`, relu, dropout (p = dropout; 0: none), dense to
   * `classes`. */
  unsigned in_c, in_h, in_w, classes;
  unsigned conv[2], dense;
  float dropout;
  bool batchnorm; /* cnn: conv, batch norm, relu (the batch-norm variant) */
  /* gpt: vocabulary, context (the most positions), layers, heads and
   * embedding width (a multiple of heads). */
  unsigned vocab, ctx, layers, heads, embd;
  /* resnet: depth 18 (ImageNet's ResNet-18) or 6n + 2 (CIFAR's ResNet-20,
   * -56...), the first stage's channels (64 and 16 in the papers), the
   * input (in_c, in_h, in_w) and classes as cnn's. */
  unsigned depth, width;
  size_t max_batch; /* the largest batch a call may pass */
  uint64_t seed;    /* the initial weights, and the dropout masks */
  /* Where the passes run: TRN_DEV_CPU (the default) or TRN_DEV_CUDA on
   * CUDA device device_index (every model).  Resolve "auto" with
   * trn_device_open first. */
  int device, device_index;
  /* On CUDA: TRN_FP32 (the default) computes in plain fp32; TRN_TF32 lets
   * cuBLAS and cuDNN multiply on the tensor cores with TF32 inputs (10
   * mantissa bits) and fp32 sums, as PyTorch's allow_tf32; TRN_BF16 gives
   * cuBLAS's products bf16 inputs (8 bits) with fp32 sums, as PyTorch's
   * set_float32_matmul_precision("medium"), and cuDNN's convolutions TF32;
   * TRN_FP16 gives both fp16 inputs (10 bits, a range to 65504) with fp32
   * sums, and scales the loss (below).  Every array stays fp32 (the
   * parameters are their own master copy).  The CPU computes in fp32 in
   * every case. */
  int precision;
  /* Loss scaling, for fp16's range: a training pass computes the gradient
   * of the loss times `scale` into an array of its own, and adds it to the
   * gradients divided by the scale, unless it holds an inf or a NaN: then
   * the pass adds nothing (trn_model_skipped says so).  0 (the default):
   * dynamic with TRN_FP16 on CUDA, none otherwise; another value: the
   * scale to start from, a power of two from 2^-24 to 2^127 (any device,
   * any precision: a power of two changes no bits where nothing
   * overflows).  Dynamic: an overflowing pass halves the scale (not below
   * 2^-24), loss_scale_interval clean passes in a row double it (not past
   * 2^24; 0: TRN_LOSS_SCALE_INTERVAL); loss_scale_fixed keeps it. */
  float loss_scale;
  bool loss_scale_fixed;
  unsigned loss_scale_interval;
} trn_model_config;

enum { TRN_FP32 = 0, TRN_TF32, TRN_BF16, TRN_FP16 };
/* The scale dynamic loss scaling starts from: the logits' gradient of the
 * summed loss is within [-1, 1] per entry, so 2^15 keeps it below fp16's
 * largest value (65504) where 2^16 would not. */
#define TRN_LOSS_SCALE_START 32768.0f
#define TRN_LOSS_SCALE_INTERVAL 2000 /* PyTorch GradScaler's growth_interval */
/* A loss-scale spec, as beed's --loss-scale: "auto" (scale 0: dynamic with
 * fp16 on CUDA, none otherwise), "dynamic" (from TRN_LOSS_SCALE_START),
 * "dynamic:S" (from S) or "S" (fixed at S: *fixed set); S is 2^E with E
 * from -24 to 127, or a decimal power of two from 1 to 2^31 ("65536").
 * Returns 0, or -EINVAL for anything else (nothing written). */
int trn_loss_scale_parse(const char *spec, float *scale, bool *fixed);
/* "fp32", "tf32", "bf16" or "fp16" to TRN_*, else -1; and back ("?" for
 * another value). */
int trn_precision_parse(const char *name);
const char *trn_precision_name(int precision);

typedef struct trn_model trn_model;

/* mlp 784-256-10, batch up to 256, seed 1; for cnn: 1x28x28 in, 32 and
 * 64 channels, dense 1024, dropout 0.5, 10 classes (3,274,634
 * parameters). */
void trn_model_config_default(trn_model_config *c);
/* Builds the model with its weights initialized as PyTorch initializes
 * the same layers (torch.nn.Linear and Conv2d: U(-1/sqrt(fan_in),
 * 1/sqrt(fan_in)) for weights and biases), from cfg->seed.  Returns 0
 * and *out, or -EINVAL (err says which setting) or -ENOMEM. */
int trn_model_new(const trn_model_config *cfg, trn_model **out, char *err,
                  size_t err_len);
void trn_model_free(trn_model *m);
/* Initializes the weights again from seed. */
void trn_model_init(trn_model *m, uint64_t seed);
size_t trn_model_nparams(const trn_model *m);
/* The memory the model holds for activations, their gradients and its
 * workspaces at max_batch (parameters and gradients not counted). */
size_t trn_model_activation_bytes(const trn_model *m);
size_t trn_model_inputs(const trn_model *m);  /* features per sample */
size_t trn_model_classes(const trn_model *m);
/* The flat buffers (nparams floats each), the model's own: layer by layer,
 * each layer's weight then its bias, shaped as PyTorch shapes them (linear
 * W (out, in); conv W (out, in, kh, kw)). */
float *trn_model_params(trn_model *m);
float *trn_model_grads(trn_model *m);
void trn_model_zero_grad(trn_model *m);
/* Batch norm's running means and variances (*n floats; NULL and 0 for a
 * model without): state, not parameters, but part of a checkpoint and of
 * what a swarm averages with the parameters. */
float *trn_model_buffers(trn_model *m, size_t *n);
/* Forward and backward on x (B, inputs: C x H x W for cnn, NCHW) with
 * labels y (B), in training mode (dropout on): the gradient of
 * the batch's summed loss is ADDED to the gradients (so batches
 * accumulate; divide by the samples, e.g. through trn_optim_step's scale,
 * for the mean), *loss (may be NULL) gets the summed loss.  -EINVAL for
 * B = 0 or over max_batch, or a label out of range. */
int trn_model_train_batch(trn_model *m, const float *x, const int32_t *y,
                          size_t B, double *loss);
/* gpt's: tokens x (B, T) and the next tokens y (B, T), T at most ctx; the
 * summed loss over the B T positions (the gradient of that is added).
 * -EINVAL for another model, B or T out of range, a token out of the
 * vocabulary. */
int trn_model_train_tokens(trn_model *m, const int32_t *x, const int32_t *y,
                           size_t B, size_t T, double *loss);
int trn_model_eval_tokens(trn_model *m, const int32_t *x, const int32_t *y,
                          size_t B, size_t T, double *loss, size_t *correct);
/* Forward only, in evaluation mode (no dropout): the summed loss and the
 * correct predictions; the parameters, gradients and dropout count are
 * not touched. */
int trn_model_eval_batch(trn_model *m, const float *x, const int32_t *y,
                         size_t B, double *loss, size_t *correct);
/* Evaluates on a whole dataset, in order, in batches of max_batch,
 * normalized as trn_images_batch: the mean loss and the share of correct
 * answers (either may be NULL).  Nothing of the training state changes.
 * 0, -EINVAL (the images do not fit the model's input), -ENOMEM. */
int trn_model_evaluate(trn_model *m, const trn_images *d, const float *mean,
                       const float *std, double *loss, double *accuracy);
/* gpt's: every whole window of T tokens of t in order (batches of
 * max_batch): the mean loss per predicted token and the share of next
 * tokens predicted right.  -EINVAL (another model, T out of range, fewer
 * than T + 1 tokens), -ENOMEM. */
int trn_model_evaluate_tokens(trn_model *m, const trn_tokens *t, size_t T,
                              double *loss, double *accuracy);
/* One line that names the architecture and every setting that gives the
 * parameters their meaning ("cnn 1x28x28 conv 32 64 dense 1024 dropout
 * 0.5 classes 10"): equal for two models exactly when their flat buffers
 * mean the same.  Returns what snprintf returns. */
int trn_model_describe(const trn_model *m, char *buf, size_t len);
/* A model on a CUDA device keeps the parameters, gradients and buffers
 * in device memory too.  trn_model_params, _grads and _buffers bring the
 * host array up to date before they return it, and what the caller
 * writes there goes to the device before the next pass: ask again after
 * a pass rather than keep the pointer.  trn_model_sync brings all three
 * up to date and returns 0, or -EIO once the device has failed (logged
 * with the call and file:line; every later pass fails too, so a daemon
 * checkpoints what it has and leaves).  On the CPU it does nothing. */
int trn_model_sync(trn_model *m);
/* The device the passes run on: TRN_DEV_CPU or TRN_DEV_CUDA. */
int trn_model_device(const trn_model *m);
/* The logits (B, classes) of the last batch; gpt's (B T, vocab).  A gpt
 * on a CUDA device fetches them here (NULL when that fails). */
const float *trn_model_logits(const trn_model *m);
/* The end offset of each parameter tensor (weight, bias, ...) in the flat
 * buffers, for LAMB's per-tensor trust ratio: up to max into ends;
 * returns how many there are (more than max: call again with room). */
size_t trn_model_tensors(const trn_model *m, size_t *ends, size_t max);
/* Whether the last training pass added nothing to the gradients because
 * its scaled gradients overflowed (loss scaling only; always false
 * without): the caller should not count its samples. */
bool trn_model_skipped(const trn_model *m);
/* The loss scale now (0: none) and the training passes skipped so far
 * (either pointer may be NULL). */
float trn_model_loss_scale(const trn_model *m, uint64_t *skipped);
/* Sets a dynamic loss scale back to scale (a checkpoint's, so that a
 * restarted run does not start again from its first scale and drop the
 * batches that takes); the count of clean passes starts again.  0;
 * -EPERM when m does not scale dynamically (no scaling, or a fixed
 * scale); -EINVAL for a scale that is not a power of two from 2^-24 to
 * 2^127. */
int trn_model_set_loss_scale(trn_model *m, float scale);
/* Dropout masks depend on the seed and on how many have been drawn: a
 * checkpoint keeps the count, a restore sets it, and the run goes on with
 * the same masks. */
uint64_t trn_model_dropout_calls(const trn_model *m);
void trn_model_set_dropout_calls(trn_model *m, uint64_t n);
/* The CPU backend's compute threads for every model of the process (n >
 * 0): OpenBLAS's, and the trainer's own pool that shares convolutions,
 * pooling and optimizer steps (at most 64).  Results are the same bits for
 * the same n.  Call it at start-up or between steps, from one thread. */
void trn_cpu_threads_set(int n);
/* Whether OpenBLAS runs the matrix products with weaker kernels than this
 * CPU has: it picks them when it loads, from the CPU or from
 * OPENBLAS_CORETYPE in the environment (which may force older ones).
 * Returns 1 and the OPENBLAS_CORETYPE value that would select the better
 * ones in name (name_len bytes), else 0 (also when the trainer's own
 * AVX-512 kernel does the products, as it does on any CPU with AVX-512
 * unless TRN_GEMM=openblas is in the environment); why gets one line for
 * the log either way. */
int trn_blas_better_core(char *name, size_t name_len, char *why,
                         size_t why_len);

/* ------------------------------------------------------------------------ */
/* Sources: the data a model trains and is tested on, chosen by the model. */
/* Images (mlp, cnn, resnet) come from a directory of Fashion-MNIST/MNIST    */
/* IDX files or of CIFAR-10 binary batches, whichever it holds, normalized   */
/* with the set's usual mean and deviation and made ahead by a loader;       */
/* token windows (gpt) from token files, made on the caller's thread.        */

typedef struct trn_source_config {
  const char *data; /* images: the directory */
  /* gpt: the training tokens and the held-out ones (NULL: no test), the
   * vocabulary (every token below it) and the window. */
  const char *tokens, *test_tokens;
  uint32_t vocab;
  size_t ctx;
  size_t batch; /* the training batch */
  trn_aug aug;  /* images: the training set's augmentation (zero: none) */
} trn_source_config;

typedef struct trn_source trn_source;

/* Loads the data: tokens when `tokens` (gpt), else images.  Returns 0 and
 * *out, or an error as the loaders' with err saying which file and why
 * (-EINVAL also for a batch of 0, a window that no file holds). */
int trn_source_open(const trn_source_config *c, bool tokens,
                    trn_source **out, char *err, size_t err_len);
void trn_source_free(trn_source *s);
/* "Fashion-MNIST/MNIST", "CIFAR-10" or "tokens". */
const char *trn_source_kind(const trn_source *s);
/* Training items (images, or windows of ctx tokens) and test items (0:
 * no test set). */
size_t trn_source_items(const trn_source *s);
size_t trn_source_test_items(const trn_source *s);
/* Predictions per item: 1 for an image, ctx for a window. */
size_t trn_source_per_item(const trn_source *s);
/* Fits mc's input and classes to the images (mlp's first and last size,
 * cnn's and resnet's in_c, in_h, in_w and classes) and gpt's vocab and
 * ctx to the tokens. */
void trn_source_fit(const trn_source *s, trn_model_config *mc);
/* Starts the training pass at `from` (over trn_source_items; copied),
 * images' batches made ahead in pinned memory when pinned is true (for a
 * CUDA model: trn_host_alloc).  0, -EINVAL, -ENOMEM. */
int trn_source_start(trn_source *s, const trn_order *from, bool pinned);
/* Trains m on the next batch (trn_model_train_batch or _tokens: the
 * gradients are added to), *loss the batch's summed loss. */
int trn_source_train(trn_source *s, trn_model *m, double *loss);
/* The order at the next batch trn_source_train takes, for a checkpoint
 * (free with trn_order_free).  Call it from the training thread. */
int trn_source_order(trn_source *s, trn_order *out);
/* The test set's mean loss per prediction and accuracy; -ENOENT without
 * one.  May run on another thread than training, with another model. */
int trn_source_evaluate(const trn_source *s, trn_model *m, double *loss,
                        double *accuracy);

/* ------------------------------------------------------------------------ */
/* Optimizers.  A step is separate from backward; the state is one flat      */
/* buffer.  SGD and AdamW as torch.optim computes them; LAMB as the paper    */
/* (You et al. 2019, with bias correction), trust ratio per tensor.         */

enum { TRN_SGD = 1, TRN_ADAMW, TRN_LAMB };

typedef struct trn_optim_config {
  int kind;
  float lr, weight_decay;
  float momentum, dampening;    /* SGD */
  bool nesterov;                /* SGD, needs momentum and no dampening */
  float beta1, beta2, eps;      /* AdamW, LAMB */
} trn_optim_config;

typedef struct trn_optim trn_optim;

/* SGD: lr 0.01, nothing else; AdamW and LAMB: lr 1e-3, betas 0.9 and
 * 0.999, eps 1e-8, weight decay 0.01 (PyTorch's AdamW defaults). */
void trn_optim_config_default(trn_optim_config *c, int kind);
/* Returns 0, -EINVAL for a setting out of range, -ENOMEM. */
int trn_optim_new(const trn_optim_config *c, size_t nparams, trn_optim **out);
void trn_optim_free(trn_optim *o);
/* One step: params -= the update for grads x scale (e.g. 1 / samples when
 * the gradients are sums).  -EINVAL for a scale that is not finite. */
int trn_optim_step(trn_optim *o, float *params, const float *grads,
                   float scale);
/* The step of trn_optim_step on m's parameters with its gradients, on
 * the model's device: for a model on CUDA the update runs there and the
 * optimizer's state stays there between steps (trn_optim_state fetches
 * it, and sends what the caller writes back before the next).  SGD and
 * AdamW give the CPU step's bits; LAMB's norms are summed in another
 * order.  0, -EINVAL (scale), or the device's failure. */
int trn_model_step(trn_model *m, trn_optim *o, float scale);
/* LAMB's tensors: the end offset of each parameter tensor in the flat
 * buffer, increasing, the last the buffer's size (trn_model_tensors gives
 * them).  Without, LAMB takes the whole buffer as one tensor.  0, -EINVAL
 * or -ENOMEM. */
int trn_optim_set_tensors(trn_optim *o, const size_t *ends, size_t n);
/* The state (*n floats; NULL and 0 for plain SGD), the optimizer's own. */
float *trn_optim_state(trn_optim *o, size_t *n);
uint64_t trn_optim_steps(const trn_optim *o);
int trn_optim_kind(const trn_optim *o); /* TRN_SGD, ... */
void trn_optim_set_steps(trn_optim *o, uint64_t steps); /* restoring */
void trn_optim_set_lr(trn_optim *o, float lr);          /* schedules */

/* Clips the gradient g (n floats, to be multiplied by scale) to a global
 * norm of max_norm, as torch.nn.utils.clip_grad_norm_: multiplied by
 * max_norm / (norm + 1e-6) when that is below 1 (max_norm 0: never).
 * Returns the norm before clipping (of g x scale; not finite when g
 * holds a NaN or infinity, which is then left as it is). */
double trn_grad_clip(float *g, size_t n, float scale, float max_norm);

/* Learning rate by step: a linear warmup from lr / warmup to lr over
 * `warmup` steps, then constant, or a cosine or linear decay to min_lr at
 * step `total` (and min_lr after). */
enum { TRN_SCHED_CONST = 0, TRN_SCHED_COSINE, TRN_SCHED_LINEAR };
typedef struct trn_sched {
  int kind;
  float lr, min_lr;
  uint64_t warmup, total;
} trn_sched;
float trn_sched_lr(const trn_sched *s, uint64_t step);

/* ------------------------------------------------------------------------ */
/* Checkpoints: parameters, batch-norm statistics, optimizer state and      */
/* steps, the data order's place, the dropout masks' seed and count, and    */
/* four numbers of the caller's; enough for a run to go on with the same    */
/* bits.                                                                    */

/* Writes path atomically (a temporary file beside it, flushed, renamed
 * over it).  o, ord and user may be NULL.  Returns 0 or -errno, with err
 * saying what failed. */
int trn_ckpt_save(const char *path, trn_model *m, trn_optim *o,
                  const trn_order *ord, const uint64_t user[4], char *err,
                  size_t err_len);
/* Reads path into m (and o, ord, user where not NULL).  The file is
 * checked whole first (magic, version, the model's shape, the optimizer's
 * kind and size, the order's size, its length, CRC-32); on any error
 * nothing is changed and err names the file and what is wrong: -errno
 * when it cannot be read, -EBADMSG when it is damaged or truncated,
 * -EINVAL when it belongs to another model, optimizer or dataset. */
int trn_ckpt_load(const char *path, trn_model *m, trn_optim *o,
                  trn_order *ord, uint64_t user[4], char *err,
                  size_t err_len);

#ifdef __cplusplus
}
#endif

#endif /* BEE_TRAINER_H */
