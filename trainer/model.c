/* model.c: models as a sequence of layers over one flat parameter buffer
 * (trainer.h, "Models").
 *
 * The parameters live in one allocation and the gradients in another of
 * the same size, each layer a view at its offset (llm.c's
 * malloc_and_point_parameters), so the averager and checkpoints see one
 * buffer each.  Activations live in one workspace sized for the largest
 * batch.  Today's layers: linear and relu, ended by softmax cross-entropy;
 * the model `mlp`.
 */
#include "trainer-int.h"

#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { L_LINEAR, L_RELU };

typedef struct layer {
  int kind;
  size_t in, out; /* features per sample */
  size_t w, b;    /* offsets of W (out, in) and b (out) in the buffers */
  float *y;       /* (max_batch, out) this layer's output, in the workspace */
} layer;

struct trn_model {
  trn_model_config cfg;
  char name[16];
  layer *l;
  size_t nl;
  size_t nparams;
  float *params, *grads; /* (nparams) each */
  float *ws;             /* activations */
  float *d0, *d1;        /* (max_batch, widest) gradients flowing down */
  size_t in, classes;
};

void trn_model_config_default(trn_model_config *c) {
  memset(c, 0, sizeof *c);
  c->name = "mlp";
  c->sizes[0] = 784, c->sizes[1] = 256, c->sizes[2] = 10;
  c->nsizes = 3;
  c->max_batch = 256;
  c->seed = 1;
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
  for (size_t i = 0; i < m->nl; i++) {
    layer *L = &m->l[i];
    if (L->kind != L_LINEAR)
      continue;
    /* torch.nn.Linear's default: kaiming_uniform_(a = sqrt(5)) for W and
     * the same bound for b, 1 / sqrt(fan_in). */
    float bound = 1.0f / sqrtf((float)L->in);
    for (size_t k = 0; k < L->in * L->out; k++)
      m->params[L->w + k] = uniform(&s, bound);
    for (size_t k = 0; k < L->out; k++)
      m->params[L->b + k] = uniform(&s, bound);
  }
}

int trn_model_new(const trn_model_config *cfg, trn_model **out, char *err,
                  size_t errlen) {
  *out = NULL;
  if (errlen)
    err[0] = 0;
  if (!cfg->name || strcmp(cfg->name, "mlp") != 0)
    return trn__fail(err, errlen, -EINVAL, "unknown model \"%s\" (known: mlp)",
                cfg->name ? cfg->name : "(null)");
  if (cfg->nsizes < 2 || cfg->nsizes > TRN_MLP_SIZES_MAX)
    return trn__fail(err, errlen, -EINVAL,
                "mlp: %zu sizes; it takes 2 to %d (input, hidden..., classes)",
                cfg->nsizes, TRN_MLP_SIZES_MAX);
  for (size_t i = 0; i < cfg->nsizes; i++)
    if (cfg->sizes[i] == 0 || cfg->sizes[i] > TRN_WIDTH_MAX)
      return trn__fail(err, errlen, -EINVAL, "mlp: size %zu is %u; 1 to %d", i,
                  cfg->sizes[i], TRN_WIDTH_MAX);
  if (cfg->sizes[cfg->nsizes - 1] < 2)
    return trn__fail(err, errlen, -EINVAL, "mlp: the last size (classes) is %u",
                cfg->sizes[cfg->nsizes - 1]);
  if (cfg->max_batch == 0 || cfg->max_batch > TRN_BATCH_MAX)
    return trn__fail(err, errlen, -EINVAL, "batch %zu: 1 to %d", cfg->max_batch,
                TRN_BATCH_MAX);
  int rc = -ENOMEM;
  trn_model *m = calloc(1, sizeof *m);
  size_t nlin = cfg->nsizes - 1;
  if (!m || !(m->l = calloc(2 * nlin - 1, sizeof *m->l)))
    goto fail;
  m->cfg = *cfg;
  snprintf(m->name, sizeof m->name, "%s", cfg->name);
  m->cfg.name = m->name;
  m->in = cfg->sizes[0];
  m->classes = cfg->sizes[cfg->nsizes - 1];
  /* linear, relu, linear, relu, ..., linear */
  size_t acts = 0, widest = m->in;
  for (size_t i = 0; i < nlin; i++) {
    layer *L = &m->l[m->nl++];
    L->kind = L_LINEAR;
    L->in = cfg->sizes[i];
    L->out = cfg->sizes[i + 1];
    L->w = m->nparams;
    m->nparams += L->in * L->out;
    L->b = m->nparams;
    m->nparams += L->out;
    acts += L->out;
    if (L->out > widest)
      widest = L->out;
    if (i + 1 < nlin) {
      layer *R = &m->l[m->nl++];
      R->kind = L_RELU;
      R->in = R->out = L->out;
      acts += R->out;
    }
  }
  size_t B = cfg->max_batch;
  m->params = calloc(m->nparams, sizeof *m->params);
  m->grads = calloc(m->nparams, sizeof *m->grads);
  m->ws = malloc(acts * B * sizeof *m->ws);
  m->d0 = malloc(widest * B * sizeof *m->d0);
  m->d1 = malloc(widest * B * sizeof *m->d1);
  if (!m->params || !m->grads || !m->ws || !m->d0 || !m->d1) {
    trn__fail(err, errlen, rc, "%s: out of memory for %zu parameters", m->name,
         m->nparams);
    goto fail;
  }
  float *p = m->ws;
  for (size_t i = 0; i < m->nl; i++) {
    m->l[i].y = p;
    p += m->l[i].out * B;
  }
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
  free(m->l);
  free(m->params);
  free(m->grads);
  free(m->ws);
  free(m->d0);
  free(m->d1);
  free(m);
}

size_t trn_model_nparams(const trn_model *m) { return m->nparams; }
float *trn_model_params(trn_model *m) { return m->params; }
float *trn_model_grads(trn_model *m) { return m->grads; }
size_t trn_model_classes(const trn_model *m) { return m->classes; }
size_t trn_model_inputs(const trn_model *m) { return m->in; }

void trn_model_zero_grad(trn_model *m) {
  memset(m->grads, 0, m->nparams * sizeof *m->grads);
}

/* Runs the layers on x (B, in); the logits are the last layer's y. */
static void forward(trn_model *m, const float *x, size_t B) {
  const float *in = x;
  for (size_t i = 0; i < m->nl; i++) {
    layer *L = &m->l[i];
    if (L->kind == L_LINEAR)
      trn__linear_fwd(in, m->params + L->w, m->params + L->b, L->y, B, L->in,
                      L->out);
    else
      trn__relu_fwd(in, L->y, B * L->out);
    in = L->y;
  }
}

static int check_batch(const trn_model *m, const int32_t *y, size_t B) {
  if (B == 0 || B > m->cfg.max_batch)
    return -EINVAL;
  for (size_t i = 0; i < B; i++)
    if (y[i] < 0 || (size_t)y[i] >= m->classes)
      return -EINVAL;
  return 0;
}

int trn_model_train_batch(trn_model *m, const float *x, const int32_t *y,
                          size_t B, double *loss) {
  int rc = check_batch(m, y, B);
  if (rc)
    return rc;
  forward(m, x, B);
  /* The gradient of the batch's summed loss flows down through d0/d1. */
  float *d = m->d0, *dn = m->d1;
  double l = trn__softmax_ce(m->l[m->nl - 1].y, y, d, B, m->classes, NULL);
  for (size_t i = m->nl; i-- > 0;) {
    layer *L = &m->l[i];
    const float *in = i ? m->l[i - 1].y : x;
    if (L->kind == L_LINEAR)
      trn__linear_bwd(in, m->params + L->w, d, i ? dn : NULL, m->grads + L->w,
                      m->grads + L->b, B, L->in, L->out);
    else
      trn__relu_bwd(L->y, d, dn, B * L->out);
    float *t = d;
    d = dn;
    dn = t;
  }
  if (loss)
    *loss = l;
  return 0;
}

int trn_model_eval_batch(trn_model *m, const float *x, const int32_t *y,
                         size_t B, double *loss, size_t *correct) {
  int rc = check_batch(m, y, B);
  if (rc)
    return rc;
  forward(m, x, B);
  double l = trn__softmax_ce(m->l[m->nl - 1].y, y, NULL, B, m->classes,
                             correct);
  if (loss)
    *loss = l;
  return 0;
}

const float *trn_model_logits(const trn_model *m) { return m->l[m->nl - 1].y; }

void trn_cpu_threads_set(int n) {
  if (n > 0)
    openblas_set_num_threads(n);
}
