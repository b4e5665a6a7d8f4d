/* cuda-fake-module.c: a stand-in for beed-cuda.so, for
 * test-trainer-cuda-load: one "device" that has no memory, built three
 * ways (FAKE_KIND): a working table, a table of another layout, and a
 * library without the entry.  It checks the loader and the forwarding
 * on machines without a GPU. */
#include "cuda-abi.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#define FAKE_WORKS 0
#define FAKE_OTHER_LAYOUT 1
#define FAKE_NO_ENTRY 2

static const trn__cuda_host *host;

static void say(int level, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  host->vlog(level, fmt, ap);
  va_end(ap);
}

static int count(int *n, char *why, size_t why_len) {
  *n = 1;
  return 0;
}

static int props(int index, trn_device *out) {
  snprintf(out->name, sizeof out->name, "fake GPU %d", index);
  out->mem_bytes = 1ull << 30;
  out->sm_major = 9;
  out->sm_minor = 0;
  say(TRN_LOG_INFO, "fake: props of %d", index);
  return 0;
}

static int bind(int index) { return 0; }

static int host_alloc(size_t bytes, void **p) {
  *p = NULL;
  return -ENOMEM;
}

static void host_free(void *p) {}
static size_t cudnn_version(void) { return 91234; }

static int gpu_new(int index, const trn__layer *l, size_t nl, size_t nparams,
                   size_t nbuffers, size_t max_batch, int precision,
                   trn__gpu **out, char *err, size_t err_len) {
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
    .gpu_new = gpu_new,
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
