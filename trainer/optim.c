/* optim.c: optimizers over flat buffers (trainer.h, "Optimizers").
 *
 * An optimizer step is separate from backward: the daemon takes it after
 * the swarm has averaged the gradients.  Its state is one flat float
 * buffer (momentum; or AdamW's first and second moments), so it can be
 * averaged and checkpointed like the parameters.  The updates follow
 * PyTorch's torch.optim.SGD and torch.optim.AdamW operation by operation,
 * so that a reference computed there agrees to fp32 rounding.
 */
#include "trainer-int.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

struct trn_optim {
  trn_optim_config cfg;
  size_t n;
  float *state; /* SGD: momentum (n); AdamW: m (n), then v (n) */
  size_t nstate;
  uint64_t steps;
};

void trn_optim_config_default(trn_optim_config *c, int kind) {
  memset(c, 0, sizeof *c);
  c->kind = kind;
  if (kind == TRN_ADAMW) {
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
  } else if (c->kind == TRN_ADAMW) {
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
  free(o->state);
  free(o);
}

float *trn_optim_state(trn_optim *o, size_t *n) {
  *n = o->nstate;
  return o->state;
}

uint64_t trn_optim_steps(const trn_optim *o) { return o->steps; }

void trn_optim_set_steps(trn_optim *o, uint64_t steps) { o->steps = steps; }

void trn_optim_set_lr(trn_optim *o, float lr) {
  if (finite_nonneg(lr))
    o->cfg.lr = lr;
}

/* torch.optim.SGD: d = g + wd p; buf = d on the first step, else
 * momentum buf + (1 - dampening) d; d = d + momentum buf (Nesterov) or
 * buf; p -= lr d. */
static void sgd(trn_optim *o, float *p, const float *g, float scale) {
  const trn_optim_config *c = &o->cfg;
  float *buf = o->state;
  bool first = o->steps == 0;
  for (size_t i = 0; i < o->n; i++) {
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

/* torch.optim.AdamW (not amsgrad): p *= 1 - lr wd; m = b1 m + (1 - b1) g;
 * v = b2 v + (1 - b2) g^2; p -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps),
 * bc = 1 - beta^t. */
static void adamw(trn_optim *o, float *p, const float *g, float scale) {
  const trn_optim_config *c = &o->cfg;
  float *m = o->state, *v = o->state + o->n;
  /* The scalars in double, as PyTorch computes them in Python. */
  double t = (double)(o->steps + 1);
  double bc1 = 1 - pow(c->beta1, t), bc2 = 1 - pow(c->beta2, t);
  float step = (float)(c->lr / bc1), bc2s = (float)sqrt(bc2);
  float decay = (float)(1 - (double)c->lr * c->weight_decay);
  for (size_t i = 0; i < o->n; i++) {
    float gi = g[i] * scale;
    p[i] = p[i] * decay;
    m[i] = m[i] * c->beta1 + (1 - c->beta1) * gi;
    v[i] = v[i] * c->beta2 + (1 - c->beta2) * gi * gi;
    float denom = sqrtf(v[i]) / bc2s + c->eps;
    p[i] = p[i] - step * (m[i] / denom);
  }
}

int trn_optim_step(trn_optim *o, float *params, const float *grads,
                   float scale) {
  if (!isfinite(scale))
    return -EINVAL;
  if (o->cfg.kind == TRN_SGD)
    sgd(o, params, grads, scale);
  else
    adamw(o, params, grads, scale);
  o->steps++;
  return 0;
}
