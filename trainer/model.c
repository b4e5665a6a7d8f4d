/* model.c: models as a sequence of layers over one flat parameter buffer
 * (trainer.h, "Models").
 *
 * The parameters live in one allocation and the gradients in another of
 * the same size, each layer a view at its offset (llm.c's
 * malloc_and_point_parameters), so the averager and checkpoints see one
 * buffer each.  Activations live in one workspace sized for the largest
 * batch; a layer's output is the next one's input, and backward reads
 * them there.  A model is built by appending layers to a shape that
 * starts as the input's (C, H, W); flattening is free (NCHW rows).
 */
#include "trainer-int.h"

#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
  L_LINEAR = TRN__L_LINEAR,
  L_RELU = TRN__L_RELU,
  L_CONV = TRN__L_CONV,
  L_POOL = TRN__L_POOL,
  L_DROPOUT = TRN__L_DROPOUT,
  L_BN = TRN__L_BN,
};

typedef trn__layer layer; /* trainer-int.h: cuda-model.cu runs it too */

#define LAYERS_MAX TRN__LAYERS_MAX

struct trn_model {
  trn_model_config cfg;
  char name[16];
  layer l[LAYERS_MAX];
  size_t nl;
  size_t nparams;
  float *params, *grads; /* (nparams) each */
  float *buffers;        /* (nbuffers) batch norm's running statistics */
  size_t nbuffers;
  float *ws;             /* activations */
  float *d0, *d1;        /* (max_batch, widest) gradients flowing down */
  trn__conv_ws cws;      /* the convolutions' workspace (conv.c) */
  size_t in, classes;
  uint64_t dropout_calls; /* the dropout masks drawn so far */
  trn__gpt *gpt;          /* gpt: the transformer (no layer list) */
  trn__resnet *resnet;    /* resnet: its op list (no layer list) */
  size_t act_bytes;       /* the activations' and workspaces' memory */
  /* On a CUDA device: its copy (cuda-model.cu), the host's logits, and
   * which side of each array is newer.  dev_*_old: the host wrote or
   * handed out its array since the device's was sent; host_*_old: a pass
   * changed the device's since the host's was fetched.  gpu_rc: the
   * first device failure, which every later call returns. */
  trn__gpu *gpu;
  float *logits;
  bool dev_params_old, dev_grads_old, dev_bufs_old;
  bool host_params_old, host_grads_old, host_bufs_old;
  int gpu_rc;
  /* Loss scaling (scale.c); on the CPU a scaled pass's gradients go to
   * sgrads (nparams) first, on CUDA to the device's own array. */
  trn__scaler sc;
  float *sgrads;
};

void trn_model_config_default(trn_model_config *c) {
  memset(c, 0, sizeof *c);
  c->name = "mlp";
  c->sizes[0] = 784, c->sizes[1] = 256, c->sizes[2] = 10;
  c->nsizes = 3;
  c->max_batch = 256;
  c->seed = 1;
  c->in_c = 1, c->in_h = 28, c->in_w = 28, c->classes = 10;
  c->conv[0] = 32, c->conv[1] = 64;
  c->dense = 1024;
  c->dropout = 0.5f;
  c->batchnorm = false;
  c->vocab = 256, c->ctx = 64, c->layers = 4, c->heads = 4, c->embd = 128;
  c->depth = 20, c->width = 16;
  c->device = TRN_DEV_CPU;
}

/* splitmix64, for the initial weights: uniform in [-bound, bound). */
static float uniform(uint64_t *s, float bound) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  double u = (double)(z >> 11) * 0x1p-53; /* [0, 1) */
  return (float)((2 * u - 1) * bound);
}

void trn_model_init(trn_model *m, uint64_t seed) {
  uint64_t s = seed ^ 0x7472616e20696e69ull;
  m->dev_params_old = m->dev_bufs_old = true; /* for a model on CUDA */
  if (m->gpt) {
    trn__gpt_init(m->gpt, m->params, &s, uniform);
    return;
  }
  if (m->resnet) {
    trn__resnet_init(m->resnet, m->params, m->buffers, &s, uniform);
    return;
  }
  for (size_t i = 0; i < m->nl; i++) {
    layer *L = &m->l[i];
    if (L->kind == L_BN) { /* as torch: gamma 1, beta 0; mean 0, var 1 */
      for (unsigned c = 0; c < L->bn.c; c++) {
        m->params[L->w_off + c] = 1, m->params[L->b_off + c] = 0;
        m->buffers[L->buf_off + c] = 0;
        m->buffers[L->buf_off + L->bn.c + c] = 1;
      }
      continue;
    }
    if (!L->nparams)
      continue;
    /* torch.nn.Linear's and Conv2d's default: kaiming_uniform_(a =
     * sqrt(5)) for the weights and the same bound for the bias,
     * 1 / sqrt(fan_in). */
    size_t fan_in = L->kind == L_CONV ? (size_t)L->cv.c * L->cv.k * L->cv.k
                                      : L->in;
    float bound = 1.0f / sqrtf((float)fan_in);
    for (size_t k = 0; k < L->nparams; k++)
      m->params[L->w_off + k] = uniform(&s, bound);
  }
}

/* ---- building ------------------------------------------------------------- */

typedef struct shape {
  unsigned c, h, w;
} shape;

static size_t numel(shape s) { return (size_t)s.c * s.h * s.w; }

static layer *add(trn_model *m, int kind, shape *s) {
  layer *L = &m->l[m->nl++];
  L->kind = kind;
  L->src = (int)m->nl - 2, L->src2 = -1; /* a chain */
  L->c = s->c, L->h = s->h, L->w = s->w;
  L->in = L->out = numel(*s);
  return L;
}

static void add_linear(trn_model *m, shape *s, unsigned out) {
  layer *L = add(m, L_LINEAR, s);
  L->out = out;
  L->w_off = m->nparams;
  L->b_off = L->w_off + L->in * out;
  L->nparams = L->in * out + out;
  L->bias = true;
  m->nparams += L->nparams;
  *s = (shape){out, 1, 1};
}

/* A convolution, with a relu fused in when relu is set (one pass over the
 * output instead of three: conv.c), and without a bias when bias is not
 * (before a batch norm, which would cancel it). */
static void add_conv(trn_model *m, shape *s, unsigned oc, unsigned k,
                     unsigned pad, bool relu, bool bias) {
  layer *L = add(m, L_CONV, s);
  trn__conv *cv = &L->cv;
  cv->c = s->c, cv->h = s->h, cv->w = s->w;
  cv->oc = oc, cv->k = k, cv->pad = pad, cv->relu = relu;
  cv->oh = s->h + 2 * pad - k + 1;
  cv->ow = s->w + 2 * pad - k + 1;
  L->w_off = m->nparams;
  L->b_off = L->w_off + (size_t)oc * s->c * k * k;
  L->nparams = (size_t)oc * s->c * k * k + (bias ? oc : 0);
  L->bias = bias;
  m->nparams += L->nparams;
  *s = (shape){oc, cv->oh, cv->ow};
  L->out = numel(*s);
}

static void add_pool(trn_model *m, shape *s, unsigned k) {
  layer *L = add(m, L_POOL, s);
  L->k = k;
  *s = (shape){s->c, s->h / k, s->w / k};
  L->out = numel(*s);
}

/* Batch normalization (eps 1e-5, momentum 0.1, as BatchNorm2d's). */
static void add_bn(trn_model *m, shape *s) {
  layer *L = add(m, L_BN, s);
  L->bn = (trn__bn){.c = s->c, .hw = (size_t)s->h * s->w, .eps = 1e-5f,
                    .momentum = 0.1f};
  L->w_off = m->nparams;
  L->b_off = L->w_off + s->c;
  L->nparams = 2 * (size_t)s->c;
  m->nparams += L->nparams;
  L->buf_off = m->nbuffers;
  m->nbuffers += 2 * (size_t)s->c;
}

static void add_dropout(trn_model *m, shape *s, float p) {
  if (p > 0)
    add(m, L_DROPOUT, s)->p = p;
}

/* The layers of cfg's model; 0, or -EINVAL with err set. */
static int build(trn_model *m, const trn_model_config *cfg, char *err,
                 size_t errlen) {
  if (strcmp(cfg->name, "mlp") == 0) {
    if (cfg->nsizes < 2 || cfg->nsizes > TRN_MLP_SIZES_MAX)
      return trn__fail(err, errlen, -EINVAL,
                       "mlp: %zu sizes; it takes 2 to %d (input, hidden..., "
                       "classes)",
                       cfg->nsizes, TRN_MLP_SIZES_MAX);
    for (size_t i = 0; i < cfg->nsizes; i++)
      if (cfg->sizes[i] == 0 || cfg->sizes[i] > TRN_WIDTH_MAX)
        return trn__fail(err, errlen, -EINVAL, "mlp: size %zu is %u; 1 to %d",
                         i, cfg->sizes[i], TRN_WIDTH_MAX);
    shape s = {cfg->sizes[0], 1, 1};
    for (size_t i = 1; i < cfg->nsizes; i++) {
      add_linear(m, &s, cfg->sizes[i]);
      if (i + 1 < cfg->nsizes)
        add(m, L_RELU, &s);
    }
    return 0;
  }
  if (strcmp(cfg->name, "cnn") == 0) {
    /* conv 5x5 (padding 2), relu, max-pool 2, twice; dense, relu,
     * dropout, dense. */
    if (cfg->in_c == 0 || cfg->in_c > TRN_CHANNELS_MAX || cfg->in_h < 4 ||
        cfg->in_w < 4 || cfg->in_h > 4096 || cfg->in_w > 4096)
      return trn__fail(err, errlen, -EINVAL,
                       "cnn: input %ux%ux%u; 1 to %d channels, 4 to 4096 "
                       "pixels a side",
                       cfg->in_c, cfg->in_h, cfg->in_w, TRN_CHANNELS_MAX);
    for (int i = 0; i < 2; i++)
      if (cfg->conv[i] == 0 || cfg->conv[i] > 4096)
        return trn__fail(err, errlen, -EINVAL,
                         "cnn: conv %d has %u channels; 1 to 4096", i,
                         cfg->conv[i]);
    if (cfg->dense == 0 || cfg->dense > TRN_WIDTH_MAX)
      return trn__fail(err, errlen, -EINVAL, "cnn: dense width %u; 1 to %d",
                       cfg->dense, TRN_WIDTH_MAX);
    if (!(cfg->dropout >= 0 && cfg->dropout < 1))
      return trn__fail(err, errlen, -EINVAL, "cnn: dropout %g; 0 <= p < 1",
                       (double)cfg->dropout);
    shape s = {cfg->in_c, cfg->in_h, cfg->in_w};
    for (int i = 0; i < 2; i++) {
      if (cfg->batchnorm) { /* conv, batch norm, relu */
        add_conv(m, &s, cfg->conv[i], 5, 2, false, false);
        add_bn(m, &s);
        add(m, L_RELU, &s);
      } else {
        add_conv(m, &s, cfg->conv[i], 5, 2, true, true);
      }
      add_pool(m, &s, 2);
    }
    add_linear(m, &s, cfg->dense);
    add(m, L_RELU, &s);
    add_dropout(m, &s, cfg->dropout);
    add_linear(m, &s, cfg->classes);
    return 0;
  }
  return trn__fail(err, errlen, -EINVAL,
                   "unknown model \"%s\" (known: mlp, cnn, gpt, resnet)",
                   cfg->name);
}

static int new_on_cuda(trn_model *m, const layer *l, size_t nl, char *err,
                       size_t errlen);

/* resnet has its own op list: parameters and buffers follow from it.  On
 * a CUDA device only the list is built here, and handed to the device as
 * layers. */
static int build_resnet(trn_model *m, const trn_model_config *c, char *err,
                        size_t errlen) {
  int rc = trn__resnet_check(c, err, errlen);
  if (rc)
    return rc;
  bool cuda = c->device == TRN_DEV_CUDA;
  if ((rc = cuda ? trn__resnet_plan(c, &m->resnet)
                 : trn__resnet_new(c, &m->resnet)))
    return trn__fail(err, errlen, rc,
                     rc == -E2BIG ? "resnet-%u: too deep for this build"
                                  : "resnet-%u: out of memory for the "
                                    "activations",
                     c->depth);
  m->nparams = trn__resnet_nparams(m->resnet);
  m->nbuffers = trn__resnet_nbuffers(m->resnet);
  m->in = (size_t)c->in_c * c->in_h * c->in_w;
  m->classes = c->classes;
  if (cuda) {
    size_t nl = trn__resnet_layers(m->resnet, NULL, 0);
    layer *l = malloc(nl * sizeof *l);
    if (!l)
      return trn__fail(err, errlen, -ENOMEM, "out of memory");
    trn__resnet_layers(m->resnet, l, nl);
    rc = new_on_cuda(m, l, nl, err, errlen);
    free(l);
    return rc;
  }
  m->params = calloc(m->nparams, sizeof *m->params);
  m->grads = calloc(m->nparams, sizeof *m->grads);
  m->buffers = calloc(m->nbuffers, sizeof *m->buffers);
  if (!m->params || !m->grads || !m->buffers)
    return trn__fail(err, errlen, -ENOMEM,
                     "resnet-%u: out of memory for %zu parameters", c->depth,
                     m->nparams);
  m->act_bytes = trn__resnet_bytes(m->resnet);
  trn_model_init(m, c->seed);
  return 0;
}

/* gpt has no layer list: its parameters and activations are gpt.c's, or
 * on a CUDA device cuda-gpt.cu's. */
static int build_gpt(trn_model *m, const trn_model_config *c, char *err,
                     size_t errlen) {
  if (c->vocab < 2 || c->vocab > 65536 || c->ctx == 0 || c->ctx > 8192 ||
      c->layers == 0 || c->layers > 64 || c->heads == 0 || c->embd == 0 ||
      c->embd > 16384 || c->embd % c->heads)
    return trn__fail(err, errlen, -EINVAL,
                     "gpt: vocab %u (2 to 65536), ctx %u (1 to 8192), layers "
                     "%u (1 to 64), heads %u, embd %u (a multiple of heads, "
                     "at most 16384)",
                     c->vocab, c->ctx, c->layers, c->heads, c->embd);
  m->nparams = trn__gpt_nparams(c);
  m->in = c->ctx;
  m->classes = c->vocab;
  if (c->device == TRN_DEV_CUDA) {
    if (trn__gpt_plan(c, &m->gpt))
      return trn__fail(err, errlen, -ENOMEM, "out of memory");
    return new_on_cuda(m, NULL, 0, err, errlen);
  }
  int rc = trn__gpt_new(c, &m->gpt);
  m->params = calloc(m->nparams, sizeof *m->params);
  m->grads = calloc(m->nparams, sizeof *m->grads);
  if (rc || !m->params || !m->grads)
    return trn__fail(err, errlen, -ENOMEM,
                     "gpt: out of memory for %zu parameters and the "
                     "activations of %zu x %u positions",
                     m->nparams, c->max_batch, c->ctx);
  m->act_bytes = trn__gpt_bytes(m->gpt);
  trn_model_init(m, c->seed);
  return 0;
}

/* The nl layers l (gpt: none) on CUDA device cfg.device_index: host
 * arrays for the parameters, gradients, buffers and logits (the rest
 * lives on the device), the weights initialized here and sent before the
 * first pass.  gpt's logits are fetched when asked for
 * (trn_model_logits): its array is allocated then. */
static int new_on_cuda(trn_model *m, const layer *l, size_t nl, char *err,
                       size_t errlen) {
  size_t B = m->cfg.max_batch;
  m->params = calloc(m->nparams, sizeof *m->params);
  m->grads = calloc(m->nparams, sizeof *m->grads);
  m->buffers = m->nbuffers ? calloc(m->nbuffers, sizeof *m->buffers) : NULL;
  m->logits = m->gpt ? NULL : malloc(B * m->classes * sizeof *m->logits);
  if (!m->params || !m->grads || (!m->gpt && !m->logits) ||
      (m->nbuffers && !m->buffers))
    return trn__fail(err, errlen, -ENOMEM,
                     "%s: out of memory for %zu parameters", m->name,
                     m->nparams);
  trn_model_init(m, m->cfg.seed);
  int n = 0, i = m->cfg.device_index;
  char why[160];
  int rc = trn__cuda_count(&n, why, sizeof why);
  if (rc || i < 0 || i >= n)
    return trn__fail(err, errlen, rc ? rc : -ENODEV, "cuda:%d: %s", i,
                     rc || n == 0 ? why : "no such device");
  int pr = m->cfg.precision;
  rc = m->gpt ? trn__gpu_new_gpt(i, &m->cfg, m->nparams, pr, &m->gpu, err,
                                 errlen)
              : trn__gpu_new(i, l, nl, m->nparams, m->nbuffers, B, pr,
                             &m->gpu, err, errlen);
  if (rc)
    return rc;
  m->act_bytes = trn__gpu_bytes(m->gpu);
  return 0;
}

/* The room a scaled pass needs: the CPU's array, or the device's. */
static int scaling_setup(trn_model *m, char *err, size_t errlen) {
  if (m->sc.scale == 0)
    return 0;
  if (m->gpu) {
    int rc = trn__gpu_set_scale(m->gpu, m->sc.scale, err, errlen);
    m->act_bytes = trn__gpu_bytes(m->gpu); /* the array counted too */
    return rc;
  }
  if (!(m->sgrads = malloc(m->nparams * sizeof *m->sgrads)))
    return trn__fail(err, errlen, -ENOMEM,
                     "%s: out of memory for loss scaling's %zu gradients",
                     m->name, m->nparams);
  m->act_bytes += m->nparams * sizeof *m->sgrads;
  return 0;
}

int trn_model_new(const trn_model_config *cfg, trn_model **out, char *err,
                  size_t errlen) {
  *out = NULL;
  if (errlen)
    err[0] = 0;
  if (!cfg->name)
    return trn__fail(err, errlen, -EINVAL, "no model named");
  if (cfg->max_batch == 0 || cfg->max_batch > TRN_BATCH_MAX)
    return trn__fail(err, errlen, -EINVAL, "batch %zu: 1 to %d",
                     cfg->max_batch, TRN_BATCH_MAX);
  if (cfg->precision < TRN_FP32 || cfg->precision > TRN_FP16)
    return trn__fail(err, errlen, -EINVAL,
                     "precision %d: fp32, tf32, bf16 or fp16", cfg->precision);
  trn__scaler sc;
  int rc = trn__scaler_init(&sc, cfg, err, errlen);
  if (rc)
    return rc;
  trn_model *m = calloc(1, sizeof *m);
  if (!m)
    return trn__fail(err, errlen, -ENOMEM, "out of memory");
  m->cfg = *cfg;
  m->sc = sc;
  snprintf(m->name, sizeof m->name, "%s", cfg->name);
  m->cfg.name = m->name;
  if (strcmp(cfg->name, "gpt") == 0 || strcmp(cfg->name, "resnet") == 0) {
    rc = cfg->name[0] == 'g' ? build_gpt(m, cfg, err, errlen)
                             : build_resnet(m, cfg, err, errlen);
    if (rc || (rc = scaling_setup(m, err, errlen)))
      goto fail;
    *out = m;
    return 0;
  }
  rc = build(m, cfg, err, errlen);
  if (rc)
    goto fail;
  layer *last = &m->l[m->nl - 1];
  m->in = m->l[0].in;
  m->classes = last->out;
  if (last->kind != L_LINEAR || m->classes < 2) {
    rc = trn__fail(err, errlen, -EINVAL, "%s: %zu classes; at least 2",
                   m->name, m->classes);
    goto fail;
  }
  if (cfg->device == TRN_DEV_CUDA) {
    rc = new_on_cuda(m, m->l, m->nl, err, errlen);
    if (rc || (rc = scaling_setup(m, err, errlen)))
      goto fail;
    *out = m;
    return 0;
  }
  /* The workspace: every layer's output, the masks and pooling indices,
   * batch norm's statistics, two gradient buffers of the widest
   * activation, one im2col matrix. */
  size_t B = cfg->max_batch, acts = 0, stats = 0, widest = m->in, col = 0,
         tmp = 0, dw = 0;
  for (size_t i = 0; i < m->nl; i++) {
    layer *L = &m->l[i];
    acts += L->out * (L->kind == L_DROPOUT ? 2 : 1);
    stats += L->kind == L_BN ? 2 * L->bn.c : 0; /* mean and inv */
    if (L->out > widest)
      widest = L->out;
    if (L->kind == L_CONV) {
      size_t px = (size_t)L->cv.oh * L->cv.ow * TRN__CONV_CHUNK;
      size_t n = (size_t)L->cv.c * L->cv.k * L->cv.k * px;
      col = n > col ? n : col;
      tmp = (size_t)L->cv.oc * px > tmp ? (size_t)L->cv.oc * px : tmp;
      n = (size_t)L->cv.oc * (L->cv.c * L->cv.k * L->cv.k + 1);
      dw = n > dw ? n : dw;
    }
  }
  rc = -ENOMEM;
  m->params = calloc(m->nparams, sizeof *m->params);
  m->grads = calloc(m->nparams, sizeof *m->grads);
  m->buffers = m->nbuffers ? calloc(m->nbuffers, sizeof *m->buffers) : NULL;
  m->ws = malloc((acts * B + stats) * sizeof *m->ws);
  m->d0 = malloc(widest * B * sizeof *m->d0);
  m->d1 = malloc(widest * B * sizeof *m->d1);
  int cws = trn__conv_ws_init(&m->cws, col, tmp, dw);
  m->act_bytes = (acts * B + stats + 2 * widest * B) * sizeof(float);
  if (!m->params || !m->grads || !m->ws || !m->d0 || !m->d1 || cws ||
      (m->nbuffers && !m->buffers)) {
    trn__fail(err, errlen, rc, "%s: out of memory for %zu parameters and "
              "the activations of %zu samples", m->name, m->nparams, B);
    goto fail;
  }
  float *p = m->ws;
  for (size_t i = 0; i < m->nl; i++) {
    layer *L = &m->l[i];
    L->y = p;
    p += L->out * B;
    if (L->kind == L_DROPOUT) {
      L->mask = p;
      p += L->out * B;
    }
    if (L->kind == L_BN) {
      L->mean = p;
      p += L->bn.c;
      L->inv = p;
      p += L->bn.c;
    }
    if (L->kind == L_POOL && !(L->arg = malloc(L->out * B * sizeof *L->arg)))
      goto fail;
    if (L->kind == L_POOL)
      m->act_bytes += L->out * B * sizeof *L->arg;
  }
  if ((rc = scaling_setup(m, err, errlen)))
    goto fail;
  trn_model_init(m, cfg->seed);
  *out = m;
  return 0;
fail:
  if (errlen && !err[0])
    trn__fail(err, errlen, rc, "out of memory");
  trn_model_free(m);
  return rc;
}

void trn_model_free(trn_model *m) {
  if (!m)
    return;
  for (size_t i = 0; i < m->nl; i++)
    free(m->l[i].arg);
  free(m->params);
  free(m->grads);
  free(m->sgrads);
  free(m->buffers);
  free(m->ws);
  free(m->d0);
  free(m->d1);
  trn__conv_ws_free(&m->cws);
  trn__gpu_free(m->gpu);
  free(m->logits);
  trn__gpt_free(m->gpt);
  trn__resnet_free(m->resnet);
  free(m);
}

size_t trn_model_nparams(const trn_model *m) { return m->nparams; }
size_t trn_model_activation_bytes(const trn_model *m) {
  /* The convolutions' workspace grows with the thread count (on CUDA,
   * when a smaller batch needs a larger one). */
  if (m->gpu)
    return trn__gpu_bytes(m->gpu);
  if (m->resnet)
    return trn__resnet_bytes(m->resnet);
  return m->act_bytes + trn__conv_ws_bytes(&m->cws);
}
/* ---- a model on CUDA: keeping the host's arrays and the device's in step */

/* Fetches the device's array which (TRN__GPU_*) when the device changed
 * it (a pass: gradients, buffers; a step: parameters); a failure is
 * remembered in gpu_rc and logged. */
static void gpu_fetch(trn_model *m, int which) {
  static const char *const names[] = {
      [TRN__GPU_PARAMS] = "parameters", [TRN__GPU_GRADS] = "gradients",
      [TRN__GPU_BUFFERS] = "batch-norm statistics"};
  bool *old = which == TRN__GPU_PARAMS  ? &m->host_params_old
              : which == TRN__GPU_GRADS ? &m->host_grads_old
                                        : &m->host_bufs_old;
  float *dst = which == TRN__GPU_PARAMS  ? m->params
               : which == TRN__GPU_GRADS ? m->grads
                                         : m->buffers;
  if (m->gpu_rc || !*old)
    return;
  int rc = trn__gpu_get(m->gpu, which, dst);
  if (rc) {
    m->gpu_rc = rc;
    trn__log(TRN_LOG_ERROR, "cuda:%d: the %s could not be fetched from the "
             "device; the host's copy is stale", m->cfg.device_index,
             names[which]);
    return;
  }
  *old = false;
}

/* Sends what the host wrote since the last pass; 0 or the device's
 * first failure. */
static int gpu_send(trn_model *m) {
  static const int which[3] = {TRN__GPU_PARAMS, TRN__GPU_GRADS,
                               TRN__GPU_BUFFERS};
  bool *old[3] = {&m->dev_params_old, &m->dev_grads_old, &m->dev_bufs_old};
  const float *src[3] = {m->params, m->grads, m->buffers};
  for (int i = 0; i < 3 && !m->gpu_rc; i++)
    if (*old[i] && !(m->gpu_rc = trn__gpu_put(m->gpu, which[i], src[i])))
      *old[i] = false;
  return m->gpu_rc;
}

int trn_model_sync(trn_model *m) {
  if (!m->gpu)
    return 0;
  gpu_fetch(m, TRN__GPU_PARAMS);
  gpu_fetch(m, TRN__GPU_GRADS);
  if (m->nbuffers)
    gpu_fetch(m, TRN__GPU_BUFFERS);
  return m->gpu_rc;
}

int trn_model_device(const trn_model *m) {
  return m->gpu ? TRN_DEV_CUDA : TRN_DEV_CPU;
}

float *trn_model_buffers(trn_model *m, size_t *n) {
  *n = m->nbuffers;
  if (m->gpu && m->nbuffers) {
    gpu_fetch(m, TRN__GPU_BUFFERS);
    m->dev_bufs_old = true;
  }
  return m->buffers;
}
float *trn_model_params(trn_model *m) {
  if (m->gpu)
    gpu_fetch(m, TRN__GPU_PARAMS); /* after trn_model_step */
  m->dev_params_old = true;
  return m->params;
}

int trn_model_step(trn_model *m, trn_optim *o, float scale) {
  if (!m->gpu) /* the host's arrays are the model's */
    return trn_optim_step(o, m->params, m->grads, scale);
  int rc = gpu_send(m);
  if (rc)
    return rc;
  rc = trn__optim_step_gpu(o, m->gpu, scale);
  if (rc == -EINVAL) /* a bad scale: nothing happened */
    return rc;
  if (rc)
    return m->gpu_rc = rc;
  m->host_params_old = true;
  return 0;
}
float *trn_model_grads(trn_model *m) {
  if (m->gpu) {
    gpu_fetch(m, TRN__GPU_GRADS);
    m->dev_grads_old = true;
  }
  return m->grads;
}
size_t trn_model_classes(const trn_model *m) { return m->classes; }
size_t trn_model_inputs(const trn_model *m) { return m->in; }
uint64_t trn__model_shape_hash(const trn_model *m) {
  uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a over what fixes the layout */
  uint64_t v[12];
  if (m->gpt || m->resnet) {
    const trn_model_config *c = &m->cfg;
    uint64_t gv[6] = {0x677074, c->vocab, c->ctx, c->layers, c->heads,
                      c->embd};
    if (m->resnet) /* resnet: depth, width, input, classes */
      gv[0] = 0x726573, gv[1] = c->depth, gv[2] = c->width,
      gv[3] = (uint64_t)c->in_c << 32 | c->in_h, gv[4] = c->in_w,
      gv[5] = c->classes;
    for (size_t k = 0; k < sizeof gv; k++) {
      h ^= ((const uint8_t *)gv)[k];
      h *= 0x100000001b3ull;
    }
    return h;
  }
  for (size_t i = 0; i < m->nl; i++) {
    const layer *L = &m->l[i];
    v[0] = (uint64_t)L->kind, v[1] = L->in, v[2] = L->out, v[3] = L->c;
    v[4] = L->h, v[5] = L->w, v[6] = L->k, v[7] = L->cv.oc;
    v[8] = L->cv.k | (uint64_t)L->cv.relu << 32;
    v[9] = L->cv.pad | (uint64_t)L->buf_off << 16;
    v[10] = L->nparams | (uint64_t)L->bias << 48, v[11] = L->w_off;
    for (size_t k = 0; k < sizeof v; k++) {
      h ^= ((const uint8_t *)v)[k];
      h *= 0x100000001b3ull;
    }
  }
  return h;
}

size_t trn_model_tensors(const trn_model *m, size_t *ends, size_t max) {
  size_t k = 0;
  if (m->gpt)
    return trn__gpt_tensors(m->gpt, ends, max);
  if (m->resnet)
    return trn__resnet_tensors(m->resnet, ends, max);
  for (size_t i = 0; i < m->nl; i++) {
    const layer *L = &m->l[i];
    if (!L->nparams)
      continue;
    if (L->nparams == L->b_off - L->w_off) { /* a weight alone */
      if (k < max)
        ends[k] = L->b_off;
      k++;
      continue;
    }
    if (k < max)
      ends[k] = L->b_off; /* the weight ends where the bias starts */
    k++;
    if (k < max)
      ends[k] = L->w_off + L->nparams;
    k++;
  }
  return k;
}

const trn__layer *trn__model_layers(const trn_model *m, size_t *nl) {
  *nl = m->nl;
  return m->nl ? m->l : NULL;
}

int trn__model_layer_out(trn_model *m, size_t i, size_t B, float *y,
                         uint32_t *arg) {
  if (i >= m->nl || B > m->cfg.max_batch || (arg && m->l[i].kind != L_POOL))
    return -EINVAL;
  if (m->gpu)
    return trn__gpu_layer_out(m->gpu, i, B, y, arg);
  const layer *L = &m->l[i];
  memcpy(y, L->y, B * L->out * sizeof *y);
  if (arg)
    memcpy(arg, L->arg, B * L->out * sizeof *arg);
  return 0;
}

uint64_t trn__model_dropout_seed(const trn_model *m) { return m->cfg.seed; }
void trn__model_set_dropout_seed(trn_model *m, uint64_t seed) {
  m->cfg.seed = seed;
}

uint64_t trn_model_dropout_calls(const trn_model *m) {
  return m->dropout_calls;
}
void trn_model_set_dropout_calls(trn_model *m, uint64_t n) {
  m->dropout_calls = n;
}

void trn_model_zero_grad(trn_model *m) {
  memset(m->grads, 0, m->nparams * sizeof *m->grads);
  if (m->gpu) {
    if (!m->gpu_rc)
      m->gpu_rc = trn__gpu_zero_grads(m->gpu);
    m->host_grads_old = m->dev_grads_old = false;
  }
}

/* ---- passes ---------------------------------------------------------------- */

/* Runs the layers on x (B, in); the logits are the last layer's y.  In
 * training, dropout draws masks; in evaluation it passes x through. */
static void forward(trn_model *m, const float *x, size_t B, bool train) {
  const float *in = x;
  for (size_t i = 0; i < m->nl; i++) {
    layer *L = &m->l[i];
    const float *w = m->params + L->w_off;
    const float *b = L->bias || L->kind == L_BN ? m->params + L->b_off : NULL;
    switch (L->kind) {
    case L_LINEAR: trn__linear_fwd(in, w, b, L->y, B, L->in, L->out); break;
    case L_RELU: trn__relu_fwd(in, L->y, B * L->out); break;
    case L_CONV:
      trn__conv_fwd(&L->cv, in, w, b, L->y, B, &m->cws);
      break;
    case L_POOL:
      trn__maxpool_fwd(in, L->y, L->arg, B, L->c, L->h, L->w, L->k);
      break;
    case L_DROPOUT:
      if (train)
        trn__dropout_fwd(in, L->y, L->mask, B * L->out, L->p, m->cfg.seed,
                         m->dropout_calls++);
      else
        memcpy(L->y, in, B * L->out * sizeof *L->y);
      break;
    case L_BN:
      trn__bn_fwd(&L->bn, in, w, b, L->y, train ? L->mean : NULL, L->inv,
                  m->buffers + L->buf_off, m->buffers + L->buf_off + L->bn.c,
                  B, train);
      break;
    }
    in = L->y;
  }
}

static int check_batch(const trn_model *m, const int32_t *y, size_t B) {
  if (B == 0 || B > m->cfg.max_batch || m->gpt)
    return -EINVAL;
  for (size_t i = 0; i < B; i++)
    if (y[i] < 0 || (size_t)y[i] >= m->classes)
      return -EINVAL;
  return 0;
}

/* Where a CPU training pass adds its gradients: the model's, or with loss
 * scaling sgrads, zeroed. */
static float *pass_grads(trn_model *m) {
  if (!m->sc.scale)
    return m->grads;
  memset(m->sgrads, 0, m->nparams * sizeof *m->sgrads);
  return m->sgrads;
}

/* The end of a CPU training pass: a scaled one's gradients added to the
 * model's unless they overflowed. */
static void pass_end(trn_model *m) {
  if (m->sc.scale)
    trn__scaler_after(&m->sc, trn__unscale_add(m->grads, m->sgrads,
                                               m->nparams, m->sc.scale));
}

/* A training pass on the device, at this pass's loss scale: images x, or
 * gpt's tokens tok (B, T). */
static int gpu_train(trn_model *m, const float *x, const int32_t *tok,
                     const int32_t *y, size_t B, size_t T, double *l) {
  int rc;
  if ((rc = gpu_send(m)) ||
      (m->sc.scale &&
       (rc = trn__gpu_set_scale(m->gpu, m->sc.scale, NULL, 0))) ||
      (rc = m->gpu_rc =
           m->gpt ? trn__gpu_tokens(m->gpu, tok, y, B, T, true, l, NULL)
                  : trn__gpu_pass(m->gpu, x, y, B, true, m->cfg.seed,
                                  &m->dropout_calls, m->logits, l, NULL)))
    return rc;
  m->host_grads_old = true;
  m->host_bufs_old = m->nbuffers > 0;
  if (m->sc.scale)
    trn__scaler_after(&m->sc, trn__gpu_overflow(m->gpu));
  return 0;
}

int trn_model_train_batch(trn_model *m, const float *x, const int32_t *y,
                          size_t B, double *loss) {
  int rc = check_batch(m, y, B);
  if (rc)
    return rc;
  if (m->gpu) {
    double l = 0;
    if ((rc = gpu_train(m, x, NULL, y, B, 0, &l)))
      return rc;
    if (loss)
      *loss = l;
    return 0;
  }
  float *G = pass_grads(m);
  if (m->resnet) {
    float *dl = trn__resnet_dlogits(m->resnet);
    double l = trn__resnet_forward(m->resnet, m->params, m->buffers, x, y, B,
                                   true, dl, NULL);
    if (m->sc.scale)
      trn__scale_floats(dl, B * m->classes, m->sc.scale);
    trn__resnet_backward(m->resnet, m->params, G, B);
    pass_end(m);
    if (loss)
      *loss = l;
    return 0;
  }
  forward(m, x, B, true);
  /* The gradient of the batch's summed loss flows down through d0/d1;
   * the first layer computes no gradient for the input. */
  float *d = m->d0, *dn = m->d1;
  double l = trn__softmax_ce(m->l[m->nl - 1].y, y, d, B, m->classes, NULL);
  if (m->sc.scale)
    trn__scale_floats(d, B * m->classes, m->sc.scale);
  for (size_t i = m->nl; i-- > 0;) {
    layer *L = &m->l[i];
    const float *in = i ? m->l[i - 1].y : x;
    const float *w = m->params + L->w_off;
    float *dw = G + L->w_off;
    float *db = L->bias || L->kind == L_BN ? G + L->b_off : NULL;
    float *dx = i ? dn : NULL;
    switch (L->kind) {
    case L_LINEAR:
      trn__linear_bwd(in, w, d, dx, dw, db, B, L->in, L->out);
      break;
    case L_CONV:
      trn__conv_bwd(&L->cv, in, w, L->y, d, dx, dw, db, B, &m->cws);
      break;
    case L_RELU:
      if (dx)
        trn__relu_bwd(L->y, d, dx, B * L->out);
      break;
    case L_POOL:
      if (dx)
        trn__maxpool_bwd(d, L->arg, dx, B, L->c, L->h, L->w, L->k);
      break;
    case L_DROPOUT:
      if (dx)
        trn__dropout_bwd(L->mask, d, dx, B * L->out);
      break;
    case L_BN:
      trn__bn_bwd(&L->bn, in, L->mean, L->inv, w, d, dx, dw, db, B);
      break;
    }
    float *t = d;
    d = dn;
    dn = t;
  }
  pass_end(m);
  if (loss)
    *loss = l;
  return 0;
}

int trn_model_eval_batch(trn_model *m, const float *x, const int32_t *y,
                         size_t B, double *loss, size_t *correct) {
  int rc = check_batch(m, y, B);
  if (rc)
    return rc;
  if (m->gpu) {
    double l = 0;
    uint64_t calls = m->dropout_calls; /* evaluation draws none */
    if ((rc = gpu_send(m)) ||
        (rc = m->gpu_rc = trn__gpu_pass(m->gpu, x, y, B, false, m->cfg.seed,
                                        &calls, m->logits, &l, correct)))
      return rc;
    if (loss)
      *loss = l;
    return 0;
  }
  if (m->resnet) {
    double l = trn__resnet_forward(m->resnet, m->params, m->buffers, x, y, B,
                                   false, NULL, correct);
    if (loss)
      *loss = l;
    return 0;
  }
  forward(m, x, B, false);
  double l = trn__softmax_ce(m->l[m->nl - 1].y, y, NULL, B, m->classes,
                             correct);
  if (loss)
    *loss = l;
  return 0;
}

/* gpt on a CUDA device: the last pass's logits, fetched into m->logits
 * (allocated at the first call; NULL when that or the copy fails). */
static const float *gpt_logits(trn_model *m) {
  size_t n = m->cfg.max_batch * m->cfg.ctx * m->classes;
  if (!m->logits && !(m->logits = malloc(n * sizeof *m->logits)))
    return NULL;
  if (!m->gpu_rc && (m->gpu_rc = trn__gpu_logits(m->gpu, m->logits, &n)))
    trn__log(TRN_LOG_ERROR, "cuda:%d: the logits could not be fetched",
             trn__gpu_index(m->gpu));
  return m->gpu_rc ? NULL : m->logits;
}

const float *trn_model_logits(const trn_model *m) {
  if (m->gpu && m->gpt) /* the host's copy is a cache of the device's */
    return gpt_logits((trn_model *)m);
  return m->gpu      ? m->logits
         : m->gpt    ? trn__gpt_logits(m->gpt)
         : m->resnet ? trn__resnet_logits(m->resnet)
                     : m->l[m->nl - 1].y;
}

static int check_tokens(const trn_model *m, const int32_t *x, const int32_t *y,
                        size_t B, size_t T) {
  if (!m->gpt || B == 0 || B > m->cfg.max_batch || T == 0 || T > m->cfg.ctx)
    return -EINVAL;
  for (size_t i = 0; i < B * T; i++)
    if (x[i] < 0 || (size_t)x[i] >= m->classes || y[i] < 0 ||
        (size_t)y[i] >= m->classes)
      return -EINVAL;
  return 0;
}

int trn_model_train_tokens(trn_model *m, const int32_t *x, const int32_t *y,
                           size_t B, size_t T, double *loss) {
  int rc = check_tokens(m, x, y, B, T);
  if (rc)
    return rc;
  if (m->gpu) {
    double l = 0;
    if ((rc = gpu_train(m, NULL, x, y, B, T, &l)))
      return rc;
    if (loss)
      *loss = l;
    return 0;
  }
  float *G = pass_grads(m), *dl = trn__gpt_dlogits(m->gpt);
  double l = trn__gpt_forward(m->gpt, m->params, x, y, B, T, dl, NULL);
  if (m->sc.scale)
    trn__scale_floats(dl, B * T * m->classes, m->sc.scale);
  trn__gpt_backward(m->gpt, m->params, G, x, B);
  pass_end(m);
  if (loss)
    *loss = l;
  return 0;
}

int trn_model_eval_tokens(trn_model *m, const int32_t *x, const int32_t *y,
                          size_t B, size_t T, double *loss, size_t *correct) {
  int rc = check_tokens(m, x, y, B, T);
  if (rc)
    return rc;
  if (m->gpu) {
    double l = 0;
    if ((rc = gpu_send(m)) ||
        (rc = m->gpu_rc =
             trn__gpu_tokens(m->gpu, x, y, B, T, false, &l, correct)))
      return rc;
    if (loss)
      *loss = l;
    return 0;
  }
  double l = trn__gpt_forward(m->gpt, m->params, x, y, B, T, NULL, correct);
  if (loss)
    *loss = l;
  return 0;
}

/* Every item of the images d (normalized with mean, std) or every window
 * of T tokens of t, in order, in batches of max_batch: the mean loss per
 * prediction and the share predicted right. */
static int evaluate(trn_model *m, const trn_images *d, const float *mean,
                    const float *std, const trn_tokens *t, size_t T,
                    double *loss, double *accuracy) {
  size_t B = m->cfg.max_batch, n = d ? d->n : trn_tokens_windows(t, T);
  size_t per = d ? 1 : T, width = d ? m->in : T;
  float *x = d ? malloc(B * width * sizeof *x) : NULL;
  int32_t *tx = d ? NULL : malloc(B * width * sizeof *tx);
  int32_t *y = malloc(B * per * sizeof *y);
  trn_order seq = {0};
  int rc = (x || tx) && y ? trn_order_init(&seq, n, NULL, 0, 0, 0) : -ENOMEM;
  for (size_t i = 0; !rc && i < n; i++)
    seq.idx[i] = (uint32_t)i; /* every item once, in order */
  double sum = 0;
  size_t right = 0;
  for (size_t at = 0; !rc && at < n; at += B) {
    size_t b = n - at < B ? n - at : B, r = 0;
    double l = 0;
    rc = d ? trn_images_batch(d, &seq, b, mean, std, x, y)
           : trn_tokens_batch(t, &seq, b, T, tx, y);
    if (!rc)
      rc = d ? trn_model_eval_batch(m, x, y, b, &l, &r)
             : trn_model_eval_tokens(m, tx, y, b, T, &l, &r);
    sum += l, right += r;
  }
  if (!rc) {
    if (loss)
      *loss = sum / (double)(n * per);
    if (accuracy)
      *accuracy = (double)right / (double)(n * per);
  }
  trn_order_free(&seq);
  free(x);
  free(tx);
  free(y);
  return rc;
}

int trn_model_evaluate(trn_model *m, const trn_images *d, const float *mean,
                       const float *std, double *loss, double *accuracy) {
  if (!d->n || (size_t)d->c * d->h * d->w != m->in)
    return -EINVAL;
  return evaluate(m, d, mean, std, NULL, 0, loss, accuracy);
}

int trn_model_evaluate_tokens(trn_model *m, const trn_tokens *t, size_t T,
                              double *loss, double *accuracy) {
  if (!m->gpt || !T || T > m->cfg.ctx || !trn_tokens_windows(t, T))
    return -EINVAL;
  return evaluate(m, NULL, NULL, NULL, t, T, loss, accuracy);
}

static const char *const precisions[] = {"fp32", "tf32", "bf16", "fp16"};

int trn_precision_parse(const char *name) {
  for (int i = 0; i < 4; i++)
    if (name && strcmp(name, precisions[i]) == 0)
      return i;
  return -1;
}

const char *trn_precision_name(int precision) {
  return precision >= 0 && precision < 4 ? precisions[precision] : "?";
}

bool trn_model_skipped(const trn_model *m) { return m->sc.last_skipped; }

float trn_model_loss_scale(const trn_model *m, uint64_t *skipped) {
  if (skipped)
    *skipped = m->sc.skipped;
  return m->sc.scale;
}

int trn_model_set_loss_scale(trn_model *m, float scale) {
  return trn__scaler_set(&m->sc, scale);
}

int trn_model_describe(const trn_model *m, char *buf, size_t len) {
  const trn_model_config *c = &m->cfg;
  if (m->gpt)
    return snprintf(buf, len, "gpt vocab %u ctx %u layers %u heads %u embd %u",
                    c->vocab, c->ctx, c->layers, c->heads, c->embd);
  if (m->resnet)
    return snprintf(buf, len, "resnet-%u width %u %ux%ux%u classes %u",
                    c->depth, c->width, c->in_c, c->in_h, c->in_w,
                    c->classes);
  if (strcmp(m->name, "cnn") == 0)
    return snprintf(buf, len,
                    "cnn %ux%ux%u conv %u %u dense %u dropout %g%s classes %u",
                    c->in_c, c->in_h, c->in_w, c->conv[0], c->conv[1],
                    c->dense, (double)c->dropout,
                    c->batchnorm ? " batchnorm" : "", c->classes);
  int n = snprintf(buf, len, "mlp");
  for (size_t i = 0; i < c->nsizes; i++) {
    size_t at = n > 0 && (size_t)n < len ? (size_t)n : len;
    n += snprintf(buf + at, len - at, "%s%u", i ? "-" : " ", c->sizes[i]);
  }
  return n;
}

void trn_cpu_threads_set(int n) {
  if (n < 1)
    return;
  /* The convolutions' own threads, at most TRN__THREADS_MAX (pool.c),
   * and OpenBLAS's for everything else. */
  int pool = n < TRN__THREADS_MAX ? n : TRN__THREADS_MAX;
  if (trn__pool_resize(pool))
    trn__log(TRN_LOG_WARN, "cpu: %d of %d compute threads started",
             trn__pool_size(), pool);
  openblas_set_num_threads(n);
}
