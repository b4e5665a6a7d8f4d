/* resnet.c: `resnet` on the CPU (trainer.h, "Models"): residual networks
 * as a list of operations over numbered activations, which lets a block's
 * input feed both its convolutions and its shortcut.
 *
 * Two families, by depth:
 *   18             ImageNet's ResNet-18: conv 7x7 stride 2, batch norm,
 *                  relu, max-pool 3x3 stride 2; four stages of two basic
 *                  blocks (width, 2, 4, 8 times width channels, stride 2
 *                  from the second); global average pool; dense.
 *   20, 32, 44, 56, 110 (6n + 2)
 *                  the CIFAR ResNets: conv 3x3, batch norm, relu; three
 *                  stages of n basic blocks (width, 2, 4 times width
 *                  channels, stride 2 from the second); average pool;
 *                  dense.
 * A basic block: conv 3x3 (the stage's stride), batch norm, relu, conv
 * 3x3, batch norm, plus the shortcut (the input, or where the shape
 * changes a 1x1 convolution with the stride and a batch norm), relu.
 * Convolutions have no bias (batch norm follows each), as torchvision's.
 */
#include "trainer-int.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { R_CONV, R_BN, R_RELU, R_ADD, R_MAXPOOL, R_AVGPOOL, R_LINEAR };

typedef struct rop {
  int kind;
  int in, in2, out;        /* activations: input(s), output */
  unsigned c, h, w;        /* the input's shape */
  size_t in_n, out_n;      /* floats per sample */
  trn__conv cv;            /* R_CONV */
  trn__bn bn;              /* R_BN */
  unsigned k, s, p;        /* R_MAXPOOL: window, stride, padding */
  size_t w_off, b_off, nparams, buf_off;
  float *mean, *inv;       /* R_BN: the batch's (c) each */
  uint32_t *arg;           /* R_MAXPOOL */
} rop;

#define OPS_MAX 256
#define ACTS_MAX 256

struct trn__resnet {
  rop op[OPS_MAX];
  size_t nop;
  size_t act_n[ACTS_MAX]; /* floats per sample of each activation */
  float *act[ACTS_MAX], *grad[ACTS_MAX];
  size_t nact;
  size_t nparams, nbuffers, B;
  float *scratch;   /* (B, the largest activation) */
  trn__conv_ws cws; /* the convolutions' workspace */
  size_t classes;
  size_t bytes;     /* all of the above */
};

/* ---- building ----------------------------------------------------------- */

typedef struct cur {
  int a;            /* the activation */
  unsigned c, h, w; /* its shape */
} cur;

static rop *op_new(trn__resnet *r, int kind, cur *x) {
  if (r->nop == OPS_MAX || r->nact == ACTS_MAX)
    return NULL;
  rop *o = &r->op[r->nop++];
  memset(o, 0, sizeof *o);
  o->kind = kind;
  o->in = x->a;
  o->c = x->c, o->h = x->h, o->w = x->w;
  o->in_n = (size_t)x->c * x->h * x->w;
  return o;
}

/* The op's output becomes a new activation of shape (c, h, w). */
static void op_out(trn__resnet *r, rop *o, cur *x, unsigned c, unsigned h,
                   unsigned w) {
  o->out = (int)r->nact;
  o->out_n = (size_t)c * h * w;
  r->act_n[r->nact++] = o->out_n;
  *x = (cur){o->out, c, h, w};
}

static int conv(trn__resnet *r, cur *x, unsigned oc, unsigned k,
                unsigned stride, unsigned pad) {
  rop *o = op_new(r, R_CONV, x);
  if (!o)
    return -E2BIG;
  unsigned oh = (x->h + 2 * pad - k) / stride + 1;
  unsigned ow = (x->w + 2 * pad - k) / stride + 1;
  o->cv = (trn__conv){.c = x->c, .h = x->h, .w = x->w, .oc = oc, .oh = oh,
                      .ow = ow, .k = k, .pad = pad, .stride = stride};
  o->w_off = r->nparams;
  o->nparams = (size_t)oc * x->c * k * k;
  r->nparams += o->nparams;
  op_out(r, o, x, oc, oh, ow);
  return 0;
}

static int bn(trn__resnet *r, cur *x) {
  rop *o = op_new(r, R_BN, x);
  if (!o)
    return -E2BIG;
  o->bn = (trn__bn){.c = x->c, .hw = (size_t)x->h * x->w, .eps = 1e-5f,
                    .momentum = 0.1f};
  o->w_off = r->nparams;
  o->b_off = o->w_off + x->c;
  o->nparams = 2 * (size_t)x->c;
  r->nparams += o->nparams;
  o->buf_off = r->nbuffers;
  r->nbuffers += 2 * (size_t)x->c;
  op_out(r, o, x, x->c, x->h, x->w);
  return 0;
}

static int simple(trn__resnet *r, cur *x, int kind) {
  rop *o = op_new(r, kind, x);
  if (!o)
    return -E2BIG;
  op_out(r, o, x, x->c, x->h, x->w);
  return 0;
}

static int add(trn__resnet *r, cur *x, const cur *y) {
  rop *o = op_new(r, R_ADD, x);
  if (!o)
    return -E2BIG;
  o->in2 = y->a;
  op_out(r, o, x, x->c, x->h, x->w);
  return 0;
}

static int maxpool(trn__resnet *r, cur *x, unsigned k, unsigned s,
                   unsigned p) {
  rop *o = op_new(r, R_MAXPOOL, x);
  if (!o)
    return -E2BIG;
  o->k = k, o->s = s, o->p = p;
  op_out(r, o, x, x->c, (x->h + 2 * p - k) / s + 1, (x->w + 2 * p - k) / s + 1);
  return 0;
}

static int avgpool(trn__resnet *r, cur *x) {
  rop *o = op_new(r, R_AVGPOOL, x);
  if (!o)
    return -E2BIG;
  op_out(r, o, x, x->c, 1, 1);
  return 0;
}

static int linear(trn__resnet *r, cur *x, unsigned out) {
  rop *o = op_new(r, R_LINEAR, x);
  if (!o)
    return -E2BIG;
  o->w_off = r->nparams;
  o->b_off = o->w_off + o->in_n * out;
  o->nparams = o->in_n * out + out;
  r->nparams += o->nparams;
  op_out(r, o, x, out, 1, 1);
  return 0;
}

/* conv, batch norm, and relu when relu is set. */
static int cbr(trn__resnet *r, cur *x, unsigned oc, unsigned k, unsigned s,
               unsigned p, bool relu) {
  int rc = conv(r, x, oc, k, s, p);
  if (!rc)
    rc = bn(r, x);
  if (!rc && relu)
    rc = simple(r, x, R_RELU);
  return rc;
}

static int block(trn__resnet *r, cur *x, unsigned oc, unsigned stride) {
  cur in = *x, sc = *x;
  int rc = cbr(r, x, oc, 3, stride, 1, true);
  if (!rc)
    rc = cbr(r, x, oc, 3, 1, 1, false);
  if (!rc && (stride != 1 || in.c != oc)) /* the shortcut changes shape */
    rc = cbr(r, &sc, oc, 1, stride, 0, false);
  if (!rc)
    rc = add(r, x, &sc);
  if (!rc)
    rc = simple(r, x, R_RELU);
  return rc;
}

static int build(trn__resnet *r, const trn_model_config *c) {
  cur x = {0, c->in_c, c->in_h, c->in_w};
  r->act_n[r->nact++] = (size_t)c->in_c * c->in_h * c->in_w; /* the input */
  unsigned wd = c->width;
  int rc;
  if (c->depth == 18) {
    if ((rc = cbr(r, &x, wd, 7, 2, 3, true)) || (rc = maxpool(r, &x, 3, 2, 1)))
      return rc;
    for (unsigned s = 0; s < 4; s++)
      for (unsigned b = 0; b < 2; b++)
        if ((rc = block(r, &x, wd << s, s && !b ? 2 : 1)))
          return rc;
  } else {
    unsigned n = (c->depth - 2) / 6;
    if ((rc = cbr(r, &x, wd, 3, 1, 1, true)))
      return rc;
    for (unsigned s = 0; s < 3; s++)
      for (unsigned b = 0; b < n; b++)
        if ((rc = block(r, &x, wd << s, s && !b ? 2 : 1)))
          return rc;
  }
  if ((rc = avgpool(r, &x)) || (rc = linear(r, &x, c->classes)))
    return rc;
  r->classes = c->classes;
  return 0;
}

/* ---- the model ------------------------------------------------------------ */

int trn__resnet_check(const trn_model_config *c, char *err, size_t errlen) {
  bool cifar = c->depth >= 8 && (c->depth - 2) % 6 == 0 && c->depth <= 200;
  if (c->depth != 18 && !cifar)
    return trn__fail(err, errlen, -EINVAL,
                     "resnet: depth %u; 18 (ImageNet's ResNet-18) or 6n + 2 "
                     "(CIFAR's: 20, 32, 44, 56, 110)",
                     c->depth);
  unsigned least = c->depth == 18 ? 32 : 4;
  if (c->in_c == 0 || c->in_c > TRN_CHANNELS_MAX || c->in_h < least ||
      c->in_w < least || c->in_h > 4096 || c->in_w > 4096 || c->width == 0 ||
      c->width > 1024 || c->classes < 2 || c->classes > TRN_WIDTH_MAX)
    return trn__fail(err, errlen, -EINVAL,
                     "resnet-%u: input %ux%ux%u (at least %u a side), width "
                     "%u (1 to 1024), %u classes",
                     c->depth, c->in_c, c->in_h, c->in_w, least, c->width,
                     c->classes);
  return 0;
}

int trn__resnet_plan(const trn_model_config *c, trn__resnet **out) {
  trn__resnet *r = calloc(1, sizeof *r);
  if (!r)
    return -ENOMEM;
  int rc = build(r, c);
  if (rc) {
    free(r);
    return rc;
  }
  *out = r;
  return 0;
}

int trn__resnet_new(const trn_model_config *c, trn__resnet **out) {
  trn__resnet *r;
  int rc = trn__resnet_plan(c, &r);
  if (rc)
    return rc;
  size_t B = c->max_batch, widest = 0, col = 0, tmp = 0, dw = 0;
  r->B = B;
  rc = -ENOMEM;
  for (size_t i = 0; i < r->nact; i++) {
    widest = r->act_n[i] > widest ? r->act_n[i] : widest;
    if (i && !(r->act[i] = malloc(B * r->act_n[i] * sizeof(float))))
      goto fail;
    if (!(r->grad[i] = malloc(B * r->act_n[i] * sizeof(float))))
      goto fail;
  }
  for (size_t i = 0; i < r->nop; i++) {
    rop *o = &r->op[i];
    if (o->kind == R_CONV) {
      size_t px = (size_t)o->cv.oh * o->cv.ow * TRN__CONV_CHUNK;
      size_t n = (size_t)o->cv.c * o->cv.k * o->cv.k * px;
      col = n > col ? n : col;
      tmp = o->cv.oc * px > tmp ? o->cv.oc * px : tmp;
      n = (size_t)o->cv.oc * o->cv.c * o->cv.k * o->cv.k;
      dw = n > dw ? n : dw; /* no bias: no db */
    }
    if (o->kind == R_BN && (!(o->mean = malloc(o->bn.c * sizeof(float))) ||
                            !(o->inv = malloc(o->bn.c * sizeof(float)))))
      goto fail;
    if (o->kind == R_MAXPOOL &&
        !(o->arg = malloc(B * o->out_n * sizeof *o->arg)))
      goto fail;
  }
  if (!(r->scratch = malloc(B * widest * sizeof(float))) ||
      trn__conv_ws_init(&r->cws, col, tmp, dw))
    goto fail;
  r->bytes = B * widest * sizeof(float);
  for (size_t i = 0; i < r->nact; i++) /* the input is the caller's */
    r->bytes += (i ? 2 : 1) * B * r->act_n[i] * sizeof(float);
  for (size_t i = 0; i < r->nop; i++)
    if (r->op[i].kind == R_BN)
      r->bytes += 2 * r->op[i].bn.c * sizeof(float);
    else if (r->op[i].kind == R_MAXPOOL)
      r->bytes += B * r->op[i].out_n * sizeof(uint32_t);
  *out = r;
  return 0;
fail:
  trn__resnet_free(r);
  return rc;
}

void trn__resnet_free(trn__resnet *r) {
  if (!r)
    return;
  for (size_t i = 0; i < r->nact; i++) {
    if (i)
      free(r->act[i]);
    free(r->grad[i]);
  }
  for (size_t i = 0; i < r->nop; i++) {
    free(r->op[i].mean);
    free(r->op[i].inv);
    free(r->op[i].arg);
  }
  free(r->scratch);
  trn__conv_ws_free(&r->cws);
  free(r);
}

size_t trn__resnet_layers(const trn__resnet *r, trn__layer *l, size_t max) {
  static const int kinds[] = {
      [R_CONV] = TRN__L_CONV,       [R_BN] = TRN__L_BN,
      [R_RELU] = TRN__L_RELU,       [R_ADD] = TRN__L_ADD,
      [R_MAXPOOL] = TRN__L_POOL,    [R_AVGPOOL] = TRN__L_AVGPOOL,
      [R_LINEAR] = TRN__L_LINEAR,
  };
  for (size_t i = 0; i < r->nop && i < max; i++) {
    const rop *o = &r->op[i];
    /* Op i makes activation i + 1 (activation 0 is the input). */
    l[i] = (trn__layer){.kind = kinds[o->kind], .src = o->in - 1,
                        .src2 = o->kind == R_ADD ? o->in2 - 1 : -1,
                        .c = o->c, .h = o->h, .w = o->w, .in = o->in_n,
                        .out = o->out_n, .cv = o->cv, .k = o->k, .s = o->s,
                        .pad = o->p, .bn = o->bn, .w_off = o->w_off,
                        .b_off = o->b_off, .nparams = o->nparams,
                        .bias = o->kind == R_LINEAR, .buf_off = o->buf_off};
  }
  return r->nop;
}

size_t trn__resnet_nparams(const trn__resnet *r) { return r->nparams; }
size_t trn__resnet_bytes(const trn__resnet *r) {
  return r->bytes + trn__conv_ws_bytes(&r->cws);
}
size_t trn__resnet_nbuffers(const trn__resnet *r) { return r->nbuffers; }

void trn__resnet_init(const trn__resnet *r, float *p, float *buf, uint64_t *s,
                      float (*uniform)(uint64_t *s, float bound)) {
  for (size_t i = 0; i < r->nop; i++) {
    const rop *o = &r->op[i];
    float *w = p + o->w_off;
    if (o->kind == R_CONV || o->kind == R_LINEAR) {
      /* PyTorch's default for both: U(-1/sqrt(fan_in), 1/sqrt(fan_in)). */
      size_t fan = o->kind == R_CONV
                       ? (size_t)o->cv.c * o->cv.k * o->cv.k
                       : o->in_n;
      float bound = 1.0f / sqrtf((float)fan);
      for (size_t k = 0; k < o->nparams; k++)
        w[k] = uniform(s, bound);
    } else if (o->kind == R_BN) {
      for (unsigned c = 0; c < o->bn.c; c++) {
        p[o->w_off + c] = 1, p[o->b_off + c] = 0;
        buf[o->buf_off + c] = 0, buf[o->buf_off + o->bn.c + c] = 1;
      }
    }
  }
}

size_t trn__resnet_tensors(const trn__resnet *r, size_t *ends, size_t max) {
  size_t k = 0;
  for (size_t i = 0; i < r->nop; i++) {
    const rop *o = &r->op[i];
    if (!o->nparams)
      continue;
    if (o->kind == R_BN || o->kind == R_LINEAR) { /* weight, then bias */
      if (k < max)
        ends[k] = o->b_off;
      k++;
    }
    if (k < max)
      ends[k] = o->w_off + o->nparams;
    k++;
  }
  return k;
}

/* k x k windows with stride s and padding p (padding never the max). */
static void maxpool_fwd(const rop *o, const float *x, float *y, uint32_t *arg,
                        size_t B) {
  unsigned oh = (o->h + 2 * o->p - o->k) / o->s + 1;
  unsigned ow = (o->w + 2 * o->p - o->k) / o->s + 1;
  for (size_t n = 0; n < B * o->c; n++) {
    const float *xp = x + n * o->h * o->w;
    for (unsigned i = 0; i < oh; i++)
      for (unsigned j = 0; j < ow; j++) {
        float v = -INFINITY;
        uint32_t at = 0;
        bool any = false;
        for (unsigned a = 0; a < o->k; a++)
          for (unsigned b = 0; b < o->k; b++) {
            int yi = (int)(i * o->s + a) - (int)o->p;
            int xj = (int)(j * o->s + b) - (int)o->p;
            if (yi < 0 || yi >= (int)o->h || xj < 0 || xj >= (int)o->w)
              continue;
            uint32_t q = (uint32_t)yi * o->w + (uint32_t)xj;
            if (!any || xp[q] > v || (xp[q] != xp[q] && v == v))
              v = xp[q], at = q, any = true;
          }
        y[(n * oh + i) * ow + j] = v;
        arg[(n * oh + i) * ow + j] = at;
      }
  }
}

double trn__resnet_forward(trn__resnet *r, const float *params, float *buf,
                           const float *x, const int32_t *y, size_t B,
                           bool train, float *dlogits, size_t *correct) {
  r->act[0] = (float *)x; /* read only */
  for (size_t i = 0; i < r->nop; i++) {
    rop *o = &r->op[i];
    const float *in = r->act[o->in];
    float *out = r->act[o->out];
    switch (o->kind) {
    case R_CONV:
      trn__conv_fwd(&o->cv, in, params + o->w_off, NULL, out, B, &r->cws);
      break;
    case R_BN:
      trn__bn_fwd(&o->bn, in, params + o->w_off, params + o->b_off, out,
                  train ? o->mean : NULL, o->inv, buf + o->buf_off,
                  buf + o->buf_off + o->bn.c, B, train);
      break;
    case R_RELU: trn__relu_fwd(in, out, B * o->out_n); break;
    case R_ADD: {
      const float *in2 = r->act[o->in2];
      for (size_t k = 0; k < B * o->out_n; k++)
        out[k] = in[k] + in2[k];
      break;
    }
    case R_MAXPOOL: maxpool_fwd(o, in, out, o->arg, B); break;
    case R_AVGPOOL: {
      size_t hw = (size_t)o->h * o->w;
      for (size_t n = 0; n < B * o->c; n++) {
        double sum = 0;
        for (size_t k = 0; k < hw; k++)
          sum += in[n * hw + k];
        out[n] = (float)(sum / (double)hw);
      }
      break;
    }
    case R_LINEAR:
      trn__linear_fwd(in, params + o->w_off, params + o->b_off, out, B,
                      o->in_n, o->out_n);
      break;
    }
  }
  const rop *last = &r->op[r->nop - 1];
  return trn__softmax_ce(r->act[last->out], y, dlogits, B, r->classes,
                         correct);
}

float *trn__resnet_dlogits(trn__resnet *r) {
  return r->grad[r->op[r->nop - 1].out];
}
const float *trn__resnet_logits(const trn__resnet *r) {
  return r->act[r->op[r->nop - 1].out];
}

/* Adds the scratch (the op's input gradient) into the input's. */
static void add_into(float *g, const float *d, size_t n) {
  for (size_t k = 0; k < n; k++)
    g[k] += d[k];
}

/* Each activation's gradient is set by the first op (in backward order)
 * that reads it and added to by the others: the first writes straight
 * into it, the others through the scratch, so no gradient is zeroed
 * first and no first writer pays an extra pass (0 + v is v; a -0.0 would
 * come out as -0.0 rather than +0.0, which no sum tells apart). */
void trn__resnet_backward(trn__resnet *r, const float *params, float *grads,
                          size_t B) {
  bool set[ACTS_MAX] = {false};
  set[r->op[r->nop - 1].out] = true; /* the logits': the caller's */
  for (size_t i = r->nop; i-- > 0;) {
    rop *o = &r->op[i];
    const float *in = r->act[o->in], *d = r->grad[o->out];
    float *gin = r->grad[o->in];
    float *dx = !o->in ? NULL : set[o->in] ? r->scratch : gin;
    size_t n = B * o->in_n;
    switch (o->kind) {
    case R_CONV:
      trn__conv_bwd(&o->cv, in, params + o->w_off, r->act[o->out], d, dx,
                    grads + o->w_off, NULL, B, &r->cws);
      break;
    case R_BN:
      trn__bn_bwd(&o->bn, in, o->mean, o->inv, params + o->w_off, d, dx,
                  grads + o->w_off, grads + o->b_off, B);
      break;
    case R_RELU:
      if (dx)
        trn__relu_bwd(r->act[o->out], d, dx, n);
      break;
    case R_ADD: /* both inputs take the output's gradient */
      for (int k = 0; k < 2; k++) {
        int a = k ? o->in2 : o->in;
        if (a == 0)
          continue;
        if (set[a])
          add_into(r->grad[a], d, n);
        else
          memcpy(r->grad[a], d, n * sizeof *d);
        set[a] = true;
      }
      continue;
    case R_MAXPOOL:
      if (dx) {
        unsigned oh = (o->h + 2 * o->p - o->k) / o->s + 1;
        unsigned ow = (o->w + 2 * o->p - o->k) / o->s + 1;
        memset(dx, 0, n * sizeof *dx);
        for (size_t p = 0; p < B * o->c; p++)
          for (size_t q = 0; q < (size_t)oh * ow; q++)
            dx[p * o->h * o->w + o->arg[p * oh * ow + q]] += d[p * oh * ow + q];
      }
      break;
    case R_AVGPOOL:
      if (dx) {
        size_t hw = (size_t)o->h * o->w;
        for (size_t p = 0; p < B * o->c; p++)
          for (size_t k = 0; k < hw; k++)
            dx[p * hw + k] = d[p] / (float)hw;
      }
      break;
    case R_LINEAR:
      trn__linear_bwd(in, params + o->w_off, d, dx, grads + o->w_off,
                      grads + o->b_off, B, o->in_n, o->out_n);
      break;
    }
    if (dx == r->scratch)
      add_into(gin, dx, n);
    if (dx)
      set[o->in] = true;
  }
}
