/* optim.c: optimizers over flat buffers, gradient clipping and
 * learning-rate schedules (trainer.h, "Optimizers").
 *
 * An optimizer step is separate from backward: the daemon takes it after
 * the swarm has averaged the gradients.  Its state is one flat float
 * buffer (momentum; or the first and second moments of AdamW and LAMB),
 * so it can be averaged and checkpointed like the parameters.  SGD and
 * AdamW follow PyTorch's torch.optim.SGD and torch.optim.AdamW operation
 * by operation, so that a reference computed there agrees to fp32
 * rounding; LAMB follows the paper (You et al., 2019, algorithm 2, with
 * bias correction), its trust ratio taken per parameter tensor.
 */
#include "trainer-int.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

struct trn_optim {
  trn_optim_config cfg;
  size_t n;
  float *state; /* SGD: momentum (n); AdamW, LAMB: m (n), then v (n) */
  size_t nstate;
  uint64_t steps;
  size_t *ends;  /* LAMB: where each parameter tensor ends */
  size_t nends;
  /* Steps taken on a model's CUDA device keep the state there too (dev):
   * host_old when a device step changed it since the host's copy was
   * fetched, dev_old when the host's was changed or handed out since it
   * was sent. */
  trn__dbuf dev;
  bool host_old, dev_old;
};

void trn_optim_config_default(trn_optim_config *c, int kind) {
  memset(c, 0, sizeof *c);
  c->kind = kind;
  if (kind == TRN_ADAMW || kind == TRN_LAMB) {
    c->lr = 1e-3f;
    c->beta1 = 0.9f;
    c->beta2 = 0.999f;
    c->eps = 1e-8f;
    c->weight_decay = 1e-2f;
  } else {
    c->lr = 0.01f;
  }
}

static bool finite_nonneg(float v) { return isfinite(v) && v >= 0; }

int trn_optim_new(const trn_optim_config *c, size_t nparams, trn_optim **out) {
  *out = NULL;
  if (nparams == 0 || !finite_nonneg(c->lr) || !finite_nonneg(c->weight_decay))
    return -EINVAL;
  size_t per = 0;
  if (c->kind == TRN_SGD) {
    if (!finite_nonneg(c->momentum) || c->momentum >= 1 ||
        !finite_nonneg(c->dampening) || c->dampening > 1 ||
        (c->nesterov && (c->momentum <= 0 || c->dampening != 0)))
      return -EINVAL; /* PyTorch refuses Nesterov without momentum too */
    per = c->momentum > 0 ? 1 : 0;
  } else if (c->kind == TRN_ADAMW || c->kind == TRN_LAMB) {
    if (!finite_nonneg(c->beta1) || c->beta1 >= 1 ||
        !finite_nonneg(c->beta2) || c->beta2 >= 1 || !(c->eps > 0) ||
        !isfinite(c->eps))
      return -EINVAL;
    per = 2;
  } else {
    return -EINVAL;
  }
  trn_optim *o = calloc(1, sizeof *o);
  if (!o)
    return -ENOMEM;
  o->cfg = *c;
  o->n = nparams;
  o->nstate = per * nparams;
  if (o->nstate && !(o->state = calloc(o->nstate, sizeof *o->state))) {
    free(o);
    return -ENOMEM;
  }
  *out = o;
  return 0;
}

void trn_optim_free(trn_optim *o) {
  if (!o)
    return;
  trn__dbuf_free(&o->dev);
  free(o->state);
  free(o->ends);
  free(o);
}

int trn_optim_set_tensors(trn_optim *o, const size_t *ends, size_t n) {
  if (n == 0 || ends[n - 1] != o->n)
    return -EINVAL;
  for (size_t i = 0; i < n; i++)
    if (ends[i] == 0 || (i && ends[i] <= ends[i - 1]))
      return -EINVAL;
  size_t *e = malloc(n * sizeof *e);
  if (!e)
    return -ENOMEM;
  memcpy(e, ends, n * sizeof *e);
  free(o->ends);
  o->ends = e;
  o->nends = n;
  return 0;
}

/* Brings the host's state up to date after steps on a device. */
static int fetch(trn_optim *o) {
  if (!o->host_old)
    return 0;
  int rc = trn__dbuf_get(&o->dev, o->state);
  if (rc) {
    trn__log(TRN_LOG_ERROR, "cuda:%d: the optimizer's state could not be "
             "fetched from the device", o->dev.index);
    return rc;
  }
  o->host_old = false;
  return 0;
}

float *trn_optim_state(trn_optim *o, size_t *n) {
  *n = o->nstate;
  (void)fetch(o); /* a failure is logged; the device's model fails too */
  o->dev_old = true;
  return o->state;
}

uint64_t trn_optim_steps(const trn_optim *o) { return o->steps; }

int trn_optim_kind(const trn_optim *o) { return o->cfg.kind; }

void trn_optim_set_steps(trn_optim *o, uint64_t steps) { o->steps = steps; }

void trn_optim_set_lr(trn_optim *o, float lr) {
  if (finite_nonneg(lr))
    o->cfg.lr = lr;
}

/* torch.optim.SGD: d = g + wd p; buf = d on the first step, else
 * momentum buf + (1 - dampening) d; d = d + momentum buf (Nesterov) or
 * buf; p -= lr d. */
/* One step over parameters [a, b): the optimizers below are elementwise
 * (LAMB's norms aside), so the pool's threads share the buffer and the
 * result is the same bits however it is split. */
typedef struct step_job {
  trn_optim *o;
  float *p;
  const float *g;
  float scale;
  /* adamw's per-step scalars */
  float step, bc2s, decay;
} step_job;

TRN__VECTOR_CLONES
static void sgd_range(void *arg, size_t a, size_t b) {
  const step_job *j = arg;
  const trn_optim_config *c = &j->o->cfg;
  float *p = j->p, *buf = j->o->state;
  const float *g = j->g;
  float scale = j->scale;
  bool first = j->o->steps == 0;
  for (size_t i = a; i < b; i++) {
    float d = g[i] * scale;
    if (c->weight_decay != 0)
      d = d + c->weight_decay * p[i];
    if (buf) {
      buf[i] = first ? d : c->momentum * buf[i] + (1 - c->dampening) * d;
      d = c->nesterov ? d + c->momentum * buf[i] : buf[i];
    }
    p[i] = p[i] - c->lr * d;
  }
}

static void sgd(trn_optim *o, float *p, const float *g, float scale) {
  step_job j = {.o = o, .p = p, .g = g, .scale = scale};
  trn__pool_for(o->n, 1 << 14, sgd_range, &j);
}

TRN__VECTOR_CLONES
static void adamw_range(void *arg, size_t a, size_t b) {
  const step_job *j = arg;
  const trn_optim_config *c = &j->o->cfg;
  float *p = j->p, *m = j->o->state, *v = j->o->state + j->o->n;
  const float *g = j->g;
  for (size_t i = a; i < b; i++) {
    float gi = g[i] * j->scale;
    p[i] = p[i] * j->decay;
    m[i] = m[i] * c->beta1 + (1 - c->beta1) * gi;
    v[i] = v[i] * c->beta2 + (1 - c->beta2) * gi * gi;
    float denom = sqrtf(v[i]) / j->bc2s + c->eps;
    p[i] = p[i] - j->step * (m[i] / denom);
  }
}

static void adamw(trn_optim *o, float *p, const float *g, float scale) {
  const trn_optim_config *c = &o->cfg;
  /* The scalars in double, as PyTorch computes them in Python. */
  double t = (double)(o->steps + 1);
  double bc1 = 1 - pow(c->beta1, t), bc2 = 1 - pow(c->beta2, t);
  step_job j = {.o = o, .p = p, .g = g, .scale = scale,
                .step = (float)(c->lr / bc1), .bc2s = (float)sqrt(bc2),
                .decay = (float)(1 - (double)c->lr * c->weight_decay)};
  trn__pool_for(o->n, 1 << 14, adamw_range, &j);
}

/* LAMB over the tensor [a, b): the moments as AdamW's, the update
 * u = m / bc1 / (sqrt(v / bc2) + eps) + wd p, and p -= lr r u with the
 * trust ratio r = |p| / |u| (1 when either is 0).  u is computed twice
 * (for its norm, then for the step) rather than stored. */
static void lamb_tensor(trn_optim *o, float *p, const float *g, float scale,
                        size_t a, size_t b, float bc1, float bc2) {
  const trn_optim_config *c = &o->cfg;
  float *m = o->state, *v = o->state + o->n;
  double pn = 0, un = 0;
  for (size_t i = a; i < b; i++) {
    float gi = g[i] * scale;
    m[i] = m[i] * c->beta1 + (1 - c->beta1) * gi;
    v[i] = v[i] * c->beta2 + (1 - c->beta2) * gi * gi;
    float u = (m[i] / bc1) / (sqrtf(v[i] / bc2) + c->eps) +
              c->weight_decay * p[i];
    pn += (double)p[i] * p[i];
    un += (double)u * u;
  }
  float trust = pn > 0 && un > 0 ? (float)(sqrt(pn) / sqrt(un)) : 1.0f;
  float step = c->lr * trust;
  for (size_t i = a; i < b; i++) {
    float u = (m[i] / bc1) / (sqrtf(v[i] / bc2) + c->eps) +
              c->weight_decay * p[i];
    p[i] = p[i] - step * u;
  }
}

static void lamb(trn_optim *o, float *p, const float *g, float scale) {
  double t = (double)(o->steps + 1);
  float bc1 = (float)(1 - pow(o->cfg.beta1, t));
  float bc2 = (float)(1 - pow(o->cfg.beta2, t));
  size_t a = 0;
  if (!o->nends) { /* no tensors given: the buffer is one */
    lamb_tensor(o, p, g, scale, 0, o->n, bc1, bc2);
    return;
  }
  for (size_t i = 0; i < o->nends; i++) {
    lamb_tensor(o, p, g, scale, a, o->ends[i], bc1, bc2);
    a = o->ends[i];
  }
}

int trn_optim_step(trn_optim *o, float *params, const float *grads,
                   float scale) {
  if (!isfinite(scale))
    return -EINVAL;
  int rc = fetch(o);
  if (rc)
    return rc;
  o->dev_old = true;
  if (o->cfg.kind == TRN_SGD)
    sgd(o, params, grads, scale);
  else if (o->cfg.kind == TRN_ADAMW)
    adamw(o, params, grads, scale);
  else
    lamb(o, params, grads, scale);
  o->steps++;
  return 0;
}

/* The step on a model's CUDA device: the same scalars as the CPU's, the
 * state sent when the host's is newer (or it lives on another device). */
int trn__optim_step_gpu(trn_optim *o, trn__gpu *g, float scale) {
  if (!isfinite(scale))
    return -EINVAL;
  const trn_optim_config *c = &o->cfg;
  int index = trn__gpu_index(g), rc;
  if (o->nstate && (!o->dev.p || o->dev.index != index || o->dev_old)) {
    if ((rc = fetch(o)) ||
        (rc = trn__dbuf_put(&o->dev, index, o->state, o->nstate)))
      return rc;
    o->dev_old = false;
  }
  double t = (double)(o->steps + 1);
  trn__step s = {.kind = c->kind, .scale = scale, .lr = c->lr,
                 .wd = c->weight_decay, .momentum = c->momentum,
                 .dampening = c->dampening, .nesterov = c->nesterov,
                 .first = o->steps == 0, .beta1 = c->beta1,
                 .beta2 = c->beta2, .eps = c->eps, .ends = o->ends,
                 .nends = o->nends};
  if (c->kind == TRN_ADAMW) { /* as adamw() */
    double bc1 = 1 - pow(c->beta1, t), bc2 = 1 - pow(c->beta2, t);
    s.step = (float)(c->lr / bc1);
    s.bc2s = (float)sqrt(bc2);
    s.decay = (float)(1 - (double)c->lr * c->weight_decay);
  } else if (c->kind == TRN_LAMB) { /* as lamb() */
    s.bc1 = (float)(1 - pow(c->beta1, t));
    s.bc2 = (float)(1 - pow(c->beta2, t));
  }
  if ((rc = trn__gpu_step(g, o->nstate ? o->dev.p : NULL, &s)))
    return rc;
  o->steps++;
  o->host_old = o->nstate > 0;
  return 0;
}

/* ---- gradient clipping ------------------------------------------------------ */

double trn_grad_clip(float *g, size_t n, float scale, float max_norm) {
  double ss = 0;
  for (size_t i = 0; i < n; i++) {
    double x = (double)g[i] * scale;
    ss += x * x;
  }
  double norm = sqrt(ss);
  /* As torch.nn.utils.clip_grad_norm_: max / (norm + 1e-6), at most 1. */
  if (max_norm > 0 && isfinite(norm)) {
    float coef = (float)(max_norm / (norm + 1e-6));
    if (coef < 1)
      for (size_t i = 0; i < n; i++)
        g[i] *= coef;
  }
  return norm;
}

/* ---- learning-rate schedules ------------------------------------------------ */

float trn_sched_lr(const trn_sched *s, uint64_t step) {
  if (step < s->warmup) /* linear from lr / warmup to lr */
    return (float)((double)s->lr * (double)(step + 1) / (double)s->warmup);
  if (s->kind == TRN_SCHED_CONST || s->total <= s->warmup)
    return s->lr;
  double f = (double)(step - s->warmup) / (double)(s->total - s->warmup);
  if (f > 1)
    f = 1;
  double span = (double)s->lr - s->min_lr;
  if (s->kind == TRN_SCHED_COSINE)
    return (float)(s->min_lr + span * 0.5 * (1 + cos(M_PI * f)));
  return (float)(s->lr - span * f); /* TRN_SCHED_LINEAR */
}
