/* cuda-fake-module.c: a stand-in for beed-cuda.so, for
 * test-trainer-cuda-load: one "device" that has no memory, built three
 * ways (FAKE_KIND): a working table, a table of another layout, and a
 * library without the entry.  It checks the loader and the forwarding
 * on machines without a GPU: each of its functions notes that it ran and
 * with which arguments (trn__fake_seen). */
#include "cuda-abi.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define FAKE_WORKS 0
#define FAKE_OTHER_LAYOUT 1
#define FAKE_NO_ENTRY 2

static const trn__cuda_host *host;

/* What the last call that reached the module brought: the number of its
 * function in the table (its place in trn__cuda_api, count = 1) and two
 * of its arguments, so that the test sees each forwarder reach its own
 * function with its own arguments. */
typedef struct fake_seen {
  int fn;
  uintptr_t a, b;
} fake_seen;
fake_seen trn__fake_seen;
#define SEE(n, x, y)                                                           \
  (trn__fake_seen = (fake_seen){(n), (uintptr_t)(x), (uintptr_t)(y)})

static void say(int level, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  host->vlog(level, fmt, ap);
  va_end(ap);
}

static int count(int *n, char *why, size_t why_len) {
  SEE(1, n, why_len);
  *n = 1;
  return 0;
}

static int props(int index, trn_device *out) {
  SEE(2, index, out);
  snprintf(out->name, sizeof out->name, "fake GPU %d", index);
  out->mem_bytes = 1ull << 30;
  out->sm_major = 9;
  out->sm_minor = 0;
  say(TRN_LOG_INFO, "fake: props of %d", index);
  return 0;
}

static int bind(int index) {
  SEE(3, index, 0);
  return 0;
}

static int host_alloc(size_t bytes, void **p) {
  SEE(4, bytes, p);
  *p = NULL;
  return -ENOMEM;
}

static void host_free(void *p) { SEE(5, p, 0); }
static size_t cudnn_version(void) { return 91234; }

static int bn_run(int index, const trn__bn *bn, size_t B, const float *x,
                  const float *gamma, const float *beta, float *run_mean,
                  float *run_var, float *y, float *inv, const float *dy,
                  float *dx, bool acc, float *dgamma, float *dbeta) {
  SEE(7, index + B, dbeta);
  return -107;
}

static int gpu_new_gpt(int index, const trn_model_config *c, size_t nparams,
                       int precision, trn__gpu **out, char *err,
                       size_t err_len) {
  SEE(9, index + nparams, c);
  *out = NULL;
  snprintf(err, err_len, "fake: gpt");
  return -109;
}

static void gpu_free(trn__gpu *g) { SEE(10, g, 0); }

static size_t gpu_bytes(const trn__gpu *g) {
  SEE(11, g, 0);
  return 1011;
}

static int gpu_put(trn__gpu *g, int which, const float *src) {
  SEE(12, g, src + which);
  return -112;
}

static int gpu_get(trn__gpu *g, int which, float *dst) {
  SEE(13, g, dst + which);
  return -113;
}

static int gpu_zero_grads(trn__gpu *g) {
  SEE(14, g, 0);
  return -114;
}

static int gpu_layer_out(trn__gpu *g, size_t i, size_t B, float *y,
                         uint32_t *arg) {
  SEE(15, g, (uintptr_t)arg + i + B);
  return -115;
}

static int gpu_pass(trn__gpu *g, const float *x, const int32_t *y, size_t B,
                    bool train, uint64_t seed, uint64_t *dropout_calls,
                    float *logits, double *loss, size_t *correct) {
  SEE(16, g, (uintptr_t)correct + B + seed);
  return -116;
}

static int gpu_set_scale(trn__gpu *g, float scale, char *err, size_t err_len) {
  SEE(17, g, (uintptr_t)(scale * 4) + err_len);
  return -117;
}

static bool gpu_overflow(const trn__gpu *g) {
  SEE(18, g, 0);
  return true;
}

static int gpu_tokens(trn__gpu *g, const int32_t *x, const int32_t *y, size_t B,
                      size_t T, bool train, double *loss, size_t *correct) {
  SEE(19, g, (uintptr_t)correct + B * T);
  return -119;
}

static int gpu_logits(trn__gpu *g, float *dst, size_t *n) {
  SEE(20, g, dst);
  *n = 20;
  return -120;
}

static int gpu_step(trn__gpu *g, float *state, const trn__step *st) {
  SEE(21, g, st);
  return -121;
}

static int gpu_index(const trn__gpu *g) {
  SEE(22, g, 0);
  return 22;
}

static int dbuf_put(trn__dbuf *b, int index, const float *src, size_t n) {
  SEE(23, b, (uintptr_t)src + (size_t)index + n);
  return -123;
}

static int dbuf_get(const trn__dbuf *b, float *dst) {
  SEE(24, b, dst);
  return -124;
}

static void dbuf_free(trn__dbuf *b) { SEE(25, b, 0); }

static int gpu_new(int index, const trn__layer *l, size_t nl, size_t nparams,
                   size_t nbuffers, size_t max_batch, int precision,
                   trn__gpu **out, char *err, size_t err_len) {
  SEE(8, index + nparams, err_len);
  uint64_t base = 0, cut = 0;
  host->dropout_draw(0.5f, 1, 2, &base, &cut); /* the host's table works */
  *out = NULL;
  snprintf(err, err_len, "fake: no memory for %zu parameters (cut %s)", nparams,
           cut ? "set" : "zero");
  return -ENOMEM;
}

static const trn__cuda_api api = {
    TRN__CUDA_SIZES_INIT,
#if FAKE_KIND == FAKE_OTHER_LAYOUT
    "9.9.9",
#else
    "fake",
#endif
    count,
    props,
    bind,
    host_alloc,
    host_free,
    cudnn_version,
    bn_run,
    gpu_new,
    gpu_new_gpt,
    gpu_free,
    gpu_bytes,
    gpu_put,
    gpu_get,
    gpu_zero_grads,
    gpu_layer_out,
    gpu_pass,
    gpu_set_scale,
    gpu_overflow,
    gpu_tokens,
    gpu_logits,
    gpu_step,
    gpu_index,
    dbuf_put,
    dbuf_get,
    dbuf_free,
};

#if FAKE_KIND != FAKE_NO_ENTRY
const trn__cuda_api *trn__cuda_module(const trn__cuda_host *h);

const trn__cuda_api *trn__cuda_module(const trn__cuda_host *h) {
#if FAKE_KIND == FAKE_OTHER_LAYOUT
  static trn__cuda_api other;
  other = api;
  other.sizes.abi++;
  return &other;
#else
  host = h;
  return &api;
#endif
}
#else
/* The table under another name: a library, but not a module. */
const trn__cuda_api *trn__fake_table(void);
const trn__cuda_api *trn__fake_table(void) { return &api; }
#endif
