/* cuda-module.cu: beed-cuda.so's entry (cuda-abi.h).
 *
 * Hands the program the table of the module's functions, and supplies
 * the three functions of the program the module's code calls, through
 * the program's table (trn__fail is trainer-int.h's inline).  Everything in the module but the entry is hidden
 * (-fvisibility=hidden): its trn__* names never meet the program's. */
#include "cuda-abi.h"

#include "bee-config.h"

#include <stdarg.h>
#include <stdio.h>

static const trn__cuda_host *host;

void trn__log(int level, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  host->vlog(level, fmt, ap);
  va_end(ap);
}

void trn__dropout_draw(float p, uint64_t seed, uint64_t call, uint64_t *base,
                       uint64_t *cut) {
  host->dropout_draw(p, seed, call, base, cut);
}

void trn__gpt_layout(const trn_model_config *c, size_t off[TRN__GPT_TENSORS],
                     size_t size[TRN__GPT_TENSORS]) {
  host->gpt_layout(c, off, size);
}

static const trn__cuda_api api = {
    TRN__CUDA_SIZES_INIT, BEE_VERSION,        trn__cuda_count,
    trn__cuda_props,      trn__cuda_bind,     trn__cuda_host_alloc,
    trn__cuda_host_free,  trn__cudnn_version, trn__cuda_bn_run,
    trn__gpu_new,         trn__gpu_new_gpt,   trn__gpu_free,
    trn__gpu_bytes,       trn__gpu_put,       trn__gpu_get,
    trn__gpu_zero_grads,  trn__gpu_layer_out, trn__gpu_pass,
    trn__gpu_set_scale,   trn__gpu_overflow,  trn__gpu_tokens,
    trn__gpu_logits,      trn__gpu_step,      trn__gpu_index,
    trn__dbuf_put,        trn__dbuf_get,      trn__dbuf_free,
};

extern "C" __attribute__((visibility("default"))) const trn__cuda_api *
trn__cuda_module(const trn__cuda_host *h);

/* The table goes back whatever host says, so that the program can name
 * the module's version when their layouts differ; host is kept, and the
 * table's functions may be called, only when they match. */
extern "C" __attribute__((visibility("default"))) const trn__cuda_api *
trn__cuda_module(const trn__cuda_host *h) {
  static const trn__cuda_sizes mine = TRN__CUDA_SIZES_INIT;
  if (h && trn__cuda_sizes_match(&h->sizes, &mine))
    host = h;
  return &api;
}
