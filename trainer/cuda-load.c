/* cuda-load.c: the CUDA backend, opened at run time (cuda-abi.h).
 *
 * The first call of any trn__cuda_* or trn__gpu_* function looks for
 * beed-cuda.so, once for the process:
 *   1. the path in $BEE_CUDA_MODULE, when set (and nowhere else then);
 *   2. the build tree's trainer/, for a program run from the build tree
 *      it was built in;
 *   3. ../lib/beed/ beside the program (a prefix copied as a whole, as
 *      tools/deploy copies /usr/local/bin and /usr/local/lib/beed);
 *   4. the directory meson installs it into.
 * The first file that exists is the one: it loads, or the reason it does
 * not (a library missing, another build's layout) is kept.  Without the
 * module these functions behave as a host without a device: no device,
 * the reason in why, -ENOTSUP for the rest; trn_device_open's auto then
 * trains on the CPU and says why in one line. */
#include "cuda-abi.h"

#include "bee-config.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static pthread_once_t once = PTHREAD_ONCE_INIT;
static const trn__cuda_api *api; /* NULL: no backend */
static char missing[768];        /* why api is NULL */

static const trn__cuda_host host = {
    TRN__CUDA_SIZES_INIT,
    trn__vlog,
    trn__dropout_draw,
    trn__gpt_layout,
};

/* Whether path names a file (any kind: a dangling link is not one). */
static bool exists(const char *path) { return access(path, F_OK) == 0; }

/* Whether the program runs from the build tree it was built in. */
static bool in_build_tree(const char *exe) {
  char root[PATH_MAX];
  if (!realpath(BEE_BUILD_ROOT, root))
    return false;
  size_t n = strlen(root);
  return strncmp(exe, root, n) == 0 && exe[n] == '/';
}

/* Fills path with the module to open; false (missing says why) when no
 * candidate exists. */
static bool find(char *path, size_t len) {
  const char *env = getenv(TRN__CUDA_MODULE_ENV);
  if (env && *env) {
    /* A bare name would send dlopen through the library path. */
    snprintf(path, len, "%s%s", strchr(env, '/') ? "" : "./", env);
    if (exists(path))
      return true;
    snprintf(missing, sizeof missing, "%s=%.600s: no such file",
             TRN__CUDA_MODULE_ENV, env);
    return false;
  }
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  exe[n > 0 ? n : 0] = '\0';
  if (n > 0 && in_build_tree(exe)) {
    snprintf(path, len, "%s/trainer/%s", BEE_BUILD_ROOT, TRN__CUDA_MODULE_FILE);
    if (exists(path))
      return true;
  }
  /* /usr/local/bin/beed: /usr/local/lib/beed/beed-cuda.so */
  char *slash = strrchr(exe, '/');
  if (slash) {
    *slash = '\0';
    slash = strrchr(exe, '/');
  }
  if (slash) {
    *slash = '\0';
    snprintf(path, len, "%s/lib/beed/%s", exe, TRN__CUDA_MODULE_FILE);
    if (exists(path))
      return true;
  }
  snprintf(path, len, "%s/%s", BEE_CUDA_MODULE_DIR, TRN__CUDA_MODULE_FILE);
  if (exists(path))
    return true;
  if (!BEE_HAVE_CUDA)
    snprintf(missing, sizeof missing,
             "this build has no CUDA backend (%s is not installed)",
             TRN__CUDA_MODULE_FILE);
  else
    snprintf(missing, sizeof missing,
             "the CUDA backend %s is not installed (in %s, or in "
             "../lib/beed beside the program)",
             TRN__CUDA_MODULE_FILE, BEE_CUDA_MODULE_DIR);
  return false;
}

static void load(void) {
  char path[PATH_MAX + 64];
  if (!find(path, sizeof path))
    return;
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    /* dlerror names the library that is missing. */
    const char *e = dlerror();
    snprintf(missing, sizeof missing,
             "the CUDA backend %.300s cannot load: %.400s", path, e ? e : "?");
    return;
  }
  trn__cuda_entry_fn entry;
  void *sym = dlsym(h, TRN__CUDA_ENTRY);
  /* POSIX's way from an object pointer to a function pointer. */
  memcpy(&entry, &sym, sizeof entry);
  const trn__cuda_api *a = entry ? entry(&host) : NULL;
  if (!a) {
    snprintf(missing, sizeof missing,
             "%.600s is not a beed CUDA backend (no %s)", path,
             TRN__CUDA_ENTRY);
  } else if (!trn__cuda_sizes_match(&a->sizes, &host.sizes)) {
    snprintf(missing, sizeof missing,
             "%.500s is from beed %.32s, built for another layout (ABI %u); "
             "this is beed %s (ABI %u): install the module of this build",
             path, a->version ? a->version : "?", (unsigned)a->sizes.abi,
             BEE_VERSION, (unsigned)TRN__CUDA_ABI);
  } else {
    api = a;
    trn__log(TRN_LOG_DEBUG, "CUDA backend: %s (beed %.32s)", path, a->version);
    return;
  }
  dlclose(h);
}

static const trn__cuda_api *backend(void) {
  pthread_once(&once, load);
  return api;
}

bool trn_cuda_available(void) { return backend() != NULL; }

const char *trn__cuda_missing(void) { return backend() ? "" : missing; }

/* ---- the forwarders (trainer-int.h) --------------------------------------
 * A trn__gpu, a filled trn__dbuf or pinned memory exists only when the
 * backend does: the calls on them do not look for it (a CPU model frees
 * its empty trn__dbuf, and that must not load the module). */

int trn__cuda_count(int *n, char *why, size_t why_len) {
  if (backend())
    return api->count(n, why, why_len);
  *n = 0;
  if (why_len > 0)
    snprintf(why, why_len, "%s", missing);
  return 0;
}

int trn__cuda_props(int index, trn_device *out) {
  return backend() ? api->props(index, out) : -ENOTSUP;
}

int trn__cuda_bind(int index) {
  return backend() ? api->bind(index) : -ENOTSUP;
}

size_t trn__cudnn_version(void) { return backend() ? api->cudnn_version() : 0; }

int trn__cuda_host_alloc(size_t bytes, void **p) {
  if (backend())
    return api->host_alloc(bytes, p);
  *p = NULL;
  return -ENOTSUP;
}

void trn__cuda_host_free(void *p) {
  if (api)
    api->host_free(p);
}

int trn__cuda_bn_run(int index, const trn__bn *bn, size_t B, const float *x,
                     const float *gamma, const float *beta, float *run_mean,
                     float *run_var, float *y, float *inv, const float *dy,
                     float *dx, bool acc, float *dgamma, float *dbeta) {
  if (!backend())
    return -ENOTSUP;
  return api->bn_run(index, bn, B, x, gamma, beta, run_mean, run_var, y, inv,
                     dy, dx, acc, dgamma, dbeta);
}

int trn__gpu_new(int index, const trn__layer *l, size_t nl, size_t nparams,
                 size_t nbuffers, size_t max_batch, int precision,
                 trn__gpu **out, char *err, size_t err_len) {
  if (backend())
    return api->gpu_new(index, l, nl, nparams, nbuffers, max_batch, precision,
                        out, err, err_len);
  *out = NULL;
  return trn__fail(err, err_len, -ENOTSUP, "cuda:%d: %s", index, missing);
}

int trn__gpu_new_gpt(int index, const trn_model_config *c, size_t nparams,
                     int precision, trn__gpu **out, char *err, size_t err_len) {
  if (backend())
    return api->gpu_new_gpt(index, c, nparams, precision, out, err, err_len);
  *out = NULL;
  return trn__fail(err, err_len, -ENOTSUP, "cuda:%d: %s", index, missing);
}

void trn__gpu_free(trn__gpu *g) {
  if (g && api)
    api->gpu_free(g);
}

size_t trn__gpu_bytes(const trn__gpu *g) { return api ? api->gpu_bytes(g) : 0; }

int trn__gpu_put(trn__gpu *g, int which, const float *src) {
  return api ? api->gpu_put(g, which, src) : -ENOTSUP;
}

int trn__gpu_get(trn__gpu *g, int which, float *dst) {
  return api ? api->gpu_get(g, which, dst) : -ENOTSUP;
}

int trn__gpu_zero_grads(trn__gpu *g) {
  return api ? api->gpu_zero_grads(g) : -ENOTSUP;
}

int trn__gpu_layer_out(trn__gpu *g, size_t i, size_t B, float *y,
                       uint32_t *arg) {
  return api ? api->gpu_layer_out(g, i, B, y, arg) : -ENOTSUP;
}

int trn__gpu_pass(trn__gpu *g, const float *x, const int32_t *y, size_t B,
                  bool train, uint64_t seed, uint64_t *dropout_calls,
                  float *logits, double *loss, size_t *correct) {
  if (!api)
    return -ENOTSUP;
  return api->gpu_pass(g, x, y, B, train, seed, dropout_calls, logits, loss,
                       correct);
}

int trn__gpu_set_scale(trn__gpu *g, float scale, char *err, size_t err_len) {
  return api ? api->gpu_set_scale(g, scale, err, err_len) : -ENOTSUP;
}

bool trn__gpu_overflow(const trn__gpu *g) {
  return api ? api->gpu_overflow(g) : false;
}

int trn__gpu_tokens(trn__gpu *g, const int32_t *x, const int32_t *y, size_t B,
                    size_t T, bool train, double *loss, size_t *correct) {
  return api ? api->gpu_tokens(g, x, y, B, T, train, loss, correct) : -ENOTSUP;
}

int trn__gpu_logits(trn__gpu *g, float *dst, size_t *n) {
  if (api)
    return api->gpu_logits(g, dst, n);
  *n = 0;
  return -ENOTSUP;
}

int trn__gpu_step(trn__gpu *g, float *state, const trn__step *s) {
  return api ? api->gpu_step(g, state, s) : -ENOTSUP;
}

int trn__gpu_index(const trn__gpu *g) { return api ? api->gpu_index(g) : -1; }

int trn__dbuf_put(trn__dbuf *b, int index, const float *src, size_t n) {
  return backend() ? api->dbuf_put(b, index, src, n) : -ENOTSUP;
}

int trn__dbuf_get(const trn__dbuf *b, float *dst) {
  return api ? api->dbuf_get(b, dst) : -ENOTSUP;
}

void trn__dbuf_free(trn__dbuf *b) {
  if (api)
    api->dbuf_free(b);
}
