/* cuda-abi.h: the table through which the trainer calls its CUDA backend.
 *
 * The CUDA side (cuda*.cu) is a module of its own, beed-cuda.so, linked
 * against cuBLAS, cuDNN and the CUDA runtime; the programs are not.
 * cuda-load.c opens the module the first time a trn__cuda_* or trn__gpu_*
 * function is called, and forwards those calls through the table the
 * module hands back.  So one beed binary serves both kinds of host: where
 * the libraries or the module are missing it sees no CUDA device, says
 * why, and trains on the CPU, instead of failing in the loader before
 * main.
 *
 * The module needs three of the program's functions; it gets them in a
 * table too, so that it has no undefined symbol but the libraries' (it is
 * linked with -z defs).  Both tables carry the ABI number and the sizes of
 * the structs they pass: a module from another build whose layout differs
 * is refused with a message, never called. */
#ifndef BEE_TRAINER_CUDA_ABI_H
#define BEE_TRAINER_CUDA_ABI_H

#include "trainer-int.h"

#include <stdarg.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Raised whenever a function, an argument or a struct passed changes. */
#define TRN__CUDA_ABI 1
/* The module's one exported symbol: a trn__cuda_entry_fn. */
#define TRN__CUDA_ENTRY "trn__cuda_module"
/* Its file name, and the environment variable that names it exactly
 * (tests, unusual layouts): cuda-load.c says where else it looks. */
#define TRN__CUDA_MODULE_FILE "beed-cuda.so"
#define TRN__CUDA_MODULE_ENV "BEE_CUDA_MODULE"

/* What both sides check before a call goes through. */
typedef struct trn__cuda_sizes {
  uint32_t abi;
  uint32_t device, layer, model_config, step, dbuf, bn;
} trn__cuda_sizes;

#define TRN__CUDA_SIZES_INIT                                                   \
  {                                                                            \
    TRN__CUDA_ABI, (uint32_t)sizeof(trn_device), (uint32_t)sizeof(trn__layer), \
        (uint32_t)sizeof(trn_model_config), (uint32_t)sizeof(trn__step),       \
        (uint32_t)sizeof(trn__dbuf), (uint32_t)sizeof(trn__bn)                 \
  }

/* The program's side, handed to the module. */
typedef struct trn__cuda_host {
  trn__cuda_sizes sizes;
  void (*vlog)(int level, const char *fmt, va_list ap);
  void (*dropout_draw)(float p, uint64_t seed, uint64_t call, uint64_t *base,
                       uint64_t *cut);
  void (*gpt_layout)(const trn_model_config *c, size_t off[TRN__GPT_TENSORS],
                     size_t size[TRN__GPT_TENSORS]);
} trn__cuda_host;

/* The module's side: the functions trainer-int.h declares, same
 * arguments, same meaning. */
typedef struct trn__cuda_api {
  trn__cuda_sizes sizes;
  const char *version; /* the beed version the module was built from */
  int (*count)(int *n, char *why, size_t why_len);
  int (*props)(int index, trn_device *out);
  int (*bind)(int index);
  int (*host_alloc)(size_t bytes, void **p);
  void (*host_free)(void *p);
  size_t (*cudnn_version)(void);
  int (*bn_run)(int index, const trn__bn *bn, size_t B, const float *x,
                const float *gamma, const float *beta, float *run_mean,
                float *run_var, float *y, float *inv, const float *dy,
                float *dx, bool acc, float *dgamma, float *dbeta);
  int (*gpu_new)(int index, const trn__layer *l, size_t nl, size_t nparams,
                 size_t nbuffers, size_t max_batch, int precision,
                 trn__gpu **out, char *err, size_t err_len);
  int (*gpu_new_gpt)(int index, const trn_model_config *c, size_t nparams,
                     int precision, trn__gpu **out, char *err, size_t err_len);
  void (*gpu_free)(trn__gpu *g);
  size_t (*gpu_bytes)(const trn__gpu *g);
  int (*gpu_put)(trn__gpu *g, int which, const float *src);
  int (*gpu_get)(trn__gpu *g, int which, float *dst);
  int (*gpu_zero_grads)(trn__gpu *g);
  int (*gpu_layer_out)(trn__gpu *g, size_t i, size_t B, float *y,
                       uint32_t *arg);
  int (*gpu_pass)(trn__gpu *g, const float *x, const int32_t *y, size_t B,
                  bool train, uint64_t seed, uint64_t *dropout_calls,
                  float *logits, double *loss, size_t *correct);
  int (*gpu_set_scale)(trn__gpu *g, float scale, char *err, size_t err_len);
  bool (*gpu_overflow)(const trn__gpu *g);
  int (*gpu_tokens)(trn__gpu *g, const int32_t *x, const int32_t *y, size_t B,
                    size_t T, bool train, double *loss, size_t *correct);
  int (*gpu_logits)(trn__gpu *g, float *dst, size_t *n);
  int (*gpu_step)(trn__gpu *g, float *state, const trn__step *s);
  int (*gpu_index)(const trn__gpu *g);
  int (*dbuf_put)(trn__dbuf *b, int index, const float *src, size_t n);
  int (*dbuf_get)(const trn__dbuf *b, float *dst);
  void (*dbuf_free)(trn__dbuf *b);
} trn__cuda_api;

/* The module's entry: returns its table, and keeps host (which outlives
 * it) when host's sizes are its own; the program calls nothing in the
 * table unless the table's sizes are its own too. */
typedef const trn__cuda_api *(*trn__cuda_entry_fn)(const trn__cuda_host *host);

/* Whether two size blocks describe the same layout. */
static inline bool trn__cuda_sizes_match(const trn__cuda_sizes *a,
                                         const trn__cuda_sizes *b) {
  return a->abi == b->abi && a->device == b->device && a->layer == b->layer &&
         a->model_config == b->model_config && a->step == b->step &&
         a->dbuf == b->dbuf && a->bn == b->bn;
}

#ifdef __cplusplus
}
#endif

#endif /* BEE_TRAINER_CUDA_ABI_H */
