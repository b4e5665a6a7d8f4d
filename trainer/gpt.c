/* gpt.c: `gpt`, a small decoder-only transformer on the CPU (trainer.h,
 * "Models"): token and position embeddings, n_layer blocks of pre-norm
 * causal self-attention and a GELU MLP, a final layer norm, and the
 * output head tied to the token embedding; cross-entropy on the next
 * token at every position.
 *
 * The parameters are one flat buffer, tensor after tensor in the order of
 * struct gpt_params (the same order for every layer's tensors stacked), so
 * the averager and checkpoints see one buffer like any other model's.
 * The math is GPT-2's: layer norm with eps 1e-5, attention scaled by
 * 1 / sqrt(head size) with the causal mask, GELU's tanh approximation.
 * Matrix products go through trn__sgemm; the rest are plain loops.
 * Shapes in the comments: B batch, T positions, C channels, NH heads, V
 * vocabulary, L layers.
 */
#include "trainer-int.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- the layers ---------------------------------------------------------- */

/* out (B, T, C) = wte[inp] + wpe[t] */
static void encoder_fwd(float *out, const int32_t *inp, const float *wte,
                        const float *wpe, size_t B, size_t T, size_t C) {
  for (size_t b = 0; b < B; b++)
    for (size_t t = 0; t < T; t++) {
      float *o = out + (b * T + t) * C;
      const float *e = wte + (size_t)inp[b * T + t] * C, *p = wpe + t * C;
      for (size_t i = 0; i < C; i++)
        o[i] = e[i] + p[i];
    }
}

static void encoder_bwd(float *dwte, float *dwpe, const float *dout,
                        const int32_t *inp, size_t B, size_t T, size_t C) {
  for (size_t b = 0; b < B; b++)
    for (size_t t = 0; t < T; t++) {
      const float *d = dout + (b * T + t) * C;
      float *e = dwte + (size_t)inp[b * T + t] * C, *p = dwpe + t * C;
      for (size_t i = 0; i < C; i++)
        e[i] += d[i], p[i] += d[i];
    }
}

/* out (N, C) = (inp - mean) / sqrt(var + 1e-5) w + b, per row; mean and
 * rstd (N) kept for backward. */
TRN__VECTOR_CLONES
static void layernorm_fwd(float *out, float *mean, float *rstd,
                          const float *inp, const float *w, const float *b,
                          size_t N, size_t C) {
  for (size_t n = 0; n < N; n++) {
    const float *x = inp + n * C;
    double m = 0, v = 0;
    for (size_t i = 0; i < C; i++)
      m += x[i];
    m /= (double)C;
    for (size_t i = 0; i < C; i++)
      v += (x[i] - m) * (x[i] - m);
    v /= (double)C;
    float s = (float)(1.0 / sqrt(v + 1e-5)), mf = (float)m;
    float *o = out + n * C;
    for (size_t i = 0; i < C; i++)
      o[i] = (x[i] - mf) * s * w[i] + b[i];
    mean[n] = mf, rstd[n] = s;
  }
}

TRN__VECTOR_CLONES
static void layernorm_bwd(float *dinp, float *dw, float *db, const float *dout,
                          const float *inp, const float *w, const float *mean,
                          const float *rstd, size_t N, size_t C) {
  for (size_t n = 0; n < N; n++) {
    const float *d = dout + n * C, *x = inp + n * C;
    float m = mean[n], s = rstd[n];
    /* The two sums of the input gradient's projection. */
    double dn_mean = 0, dn_dot = 0;
    for (size_t i = 0; i < C; i++) {
      float h = (x[i] - m) * s, dn = w[i] * d[i];
      dn_mean += dn;
      dn_dot += dn * h;
    }
    float a = (float)(dn_mean / (double)C), c = (float)(dn_dot / (double)C);
    float *dx = dinp + n * C;
    for (size_t i = 0; i < C; i++) {
      float h = (x[i] - m) * s, dn = w[i] * d[i];
      db[i] += d[i];
      dw[i] += h * d[i];
      dx[i] += s * (dn - a - h * c);
    }
  }
}

/* out (N, OC) = inp (N, C) W^T (W (OC, C)) + bias (OC; NULL: none). */
static void matmul_fwd(float *out, const float *inp, const float *w,
                       const float *bias, size_t N, size_t C, size_t OC) {
  if (bias)
    for (size_t n = 0; n < N; n++)
      memcpy(out + n * OC, bias, OC * sizeof *out);
  trn__sgemm(false, true, N, OC, C, 1.0f, inp, C, w, C, bias ? 1.0f : 0.0f,
             out, OC);
}

/* dinp += dout W; dW += dout^T inp; dbias += the sum of dout's rows. */
static void matmul_bwd(float *dinp, float *dw, float *dbias, const float *dout,
                       const float *inp, const float *w, size_t N, size_t C,
                       size_t OC) {
  trn__sgemm(false, false, N, C, OC, 1.0f, dout, OC, w, C, 1.0f, dinp, C);
  trn__sgemm(true, false, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dw, C);
  if (dbias)
    for (size_t n = 0; n < N; n++)
      for (size_t o = 0; o < OC; o++)
        dbias[o] += dout[n * OC + o];
}

/* Causal self-attention: qkv (B, T, 3C) holds q, k and v side by side;
 * att (B, NH, T, T) the softmaxed scores (row t covers 0..t); out (B, T,
 * C) the heads' weighted values, head h in channels h hs .. (h+1) hs. */
/* The batch's sequences are independent: shared among the pool's threads
 * (each writes only its own rows), the same bits whatever their number. */
typedef struct att_job {
  float *out, *att, *dqkv, *datt;
  const float *qkv, *catt, *dout;
  size_t T, C, NH;
} att_job;

TRN__VECTOR_CLONES
static void attention_fwd_range(void *job, size_t b0, size_t b1) {
  const att_job *j = job;
  float *out = j->out, *att = j->att;
  const float *qkv = j->qkv;
  size_t T = j->T, C = j->C, NH = j->NH, hs = C / NH;
  float scale = 1.0f / sqrtf((float)hs);
  for (size_t b = b0; b < b1; b++)
    for (size_t t = 0; t < T; t++)
      for (size_t h = 0; h < NH; h++) {
        const float *q = qkv + (b * T + t) * 3 * C + h * hs;
        float *a = att + ((b * NH + h) * T + t) * T;
        float mx = -INFINITY;
        for (size_t u = 0; u <= t; u++) {
          const float *k = qkv + (b * T + u) * 3 * C + C + h * hs;
          float s = 0;
          for (size_t i = 0; i < hs; i++)
            s += q[i] * k[i];
          a[u] = s * scale;
          mx = a[u] > mx ? a[u] : mx;
        }
        double sum = 0;
        for (size_t u = 0; u <= t; u++) {
          a[u] = expf(a[u] - mx);
          sum += a[u];
        }
        float inv = (float)(1.0 / sum);
        for (size_t u = 0; u <= t; u++)
          a[u] *= inv;
        for (size_t u = t + 1; u < T; u++)
          a[u] = 0; /* the mask: never read, kept defined */
        float *o = out + (b * T + t) * C + h * hs;
        memset(o, 0, hs * sizeof *o);
        for (size_t u = 0; u <= t; u++) {
          const float *v = qkv + (b * T + u) * 3 * C + 2 * C + h * hs;
          for (size_t i = 0; i < hs; i++)
            o[i] += a[u] * v[i];
        }
      }
}

static void attention_fwd(float *out, float *att, const float *qkv, size_t B,
                          size_t T, size_t C, size_t NH) {
  att_job j = {.out = out, .att = att, .qkv = qkv, .T = T, .C = C, .NH = NH};
  trn__pool_for(B, 1, attention_fwd_range, &j);
}

TRN__VECTOR_CLONES
static void attention_bwd_range(void *job, size_t b0, size_t b1) {
  const att_job *j = job;
  float *dqkv = j->dqkv;
  const float *dout = j->dout, *qkv = j->qkv, *att = j->catt;
  size_t T = j->T, C = j->C, NH = j->NH, hs = C / NH;
  float scale = 1.0f / sqrtf((float)hs);
  for (size_t b = b0; b < b1; b++)
    for (size_t t = 0; t < T; t++)
      for (size_t h = 0; h < NH; h++) {
        const float *a = att + ((b * NH + h) * T + t) * T;
        float *datt_row = j->datt + b * T; /* this sequence's scratch */
        const float *d = dout + (b * T + t) * C + h * hs;
        /* Through the weighted sum: datt[u] = d . v_u, dv_u += a[u] d. */
        for (size_t u = 0; u <= t; u++) {
          const float *v = qkv + (b * T + u) * 3 * C + 2 * C + h * hs;
          float *dv = dqkv + (b * T + u) * 3 * C + 2 * C + h * hs;
          float s = 0;
          for (size_t i = 0; i < hs; i++) {
            s += d[i] * v[i];
            dv[i] += a[u] * d[i];
          }
          datt_row[u] = s;
        }
        /* Through the softmax: dpre[u] = a[u] (datt[u] - sum a datt). */
        double dot = 0;
        for (size_t u = 0; u <= t; u++)
          dot += (double)a[u] * datt_row[u];
        const float *q = qkv + (b * T + t) * 3 * C + h * hs;
        float *dq = dqkv + (b * T + t) * 3 * C + h * hs;
        for (size_t u = 0; u <= t; u++) {
          float dpre = a[u] * (datt_row[u] - (float)dot) * scale;
          const float *k = qkv + (b * T + u) * 3 * C + C + h * hs;
          float *dk = dqkv + (b * T + u) * 3 * C + C + h * hs;
          for (size_t i = 0; i < hs; i++) {
            dq[i] += dpre * k[i];
            dk[i] += dpre * q[i];
          }
        }
      }
}

/* datt (B, T): scratch, a row per sequence. */
static void attention_bwd(float *dqkv, const float *dout, const float *qkv,
                          const float *att, float *datt, size_t B, size_t T,
                          size_t C, size_t NH) {
  att_job j = {.dqkv = dqkv, .dout = dout, .qkv = qkv, .catt = att,
               .datt = datt, .T = T, .C = C, .NH = NH};
  trn__pool_for(B, 1, attention_bwd_range, &j);
}

#define GELU_K 0.7978845608028654f /* sqrt(2 / pi) */

/* GELU, tanh approximation: 0.5 x (1 + tanh(k (x + 0.044715 x^3))). */
typedef struct gelu_job {
  float *out;
  const float *inp, *dout;
} gelu_job;

TRN__VECTOR_CLONES
static void gelu_fwd_range(void *job, size_t i0, size_t i1) {
  const gelu_job *j = job;
  float *out = j->out;
  const float *inp = j->inp;
  for (size_t i = i0; i < i1; i++) {
    float x = inp[i];
    out[i] = 0.5f * x *
             (1.0f + trn__tanhf(GELU_K * (x + 0.044715f * x * x * x)));
  }
}

static void gelu_fwd(float *out, const float *inp, size_t n) {
  gelu_job j = {.out = out, .inp = inp};
  trn__pool_for(n, 1 << 12, gelu_fwd_range, &j);
}

TRN__VECTOR_CLONES
static void gelu_bwd_range(void *job, size_t i0, size_t i1) {
  const gelu_job *j = job;
  float *dinp = j->out;
  const float *inp = j->inp, *dout = j->dout;
  for (size_t i = i0; i < i1; i++) {
    float x = inp[i], u = GELU_K * (x + 0.044715f * x * x * x);
    float th = trn__tanhf(u), sech2 = 1.0f - th * th;
    float du = GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] += dout[i] * (0.5f * (1.0f + th) + 0.5f * x * sech2 * du);
  }
}

static void gelu_bwd(float *dinp, const float *inp, const float *dout,
                     size_t n) {
  gelu_job j = {.out = dinp, .inp = inp, .dout = dout};
  trn__pool_for(n, 1 << 12, gelu_bwd_range, &j);
}

/* ---- the model ------------------------------------------------------------- */

/* Activations, each (B, T, ...) for every layer where it has an L. */
enum {
  A_ENC, A_LN1, A_LN1M, A_LN1R, A_QKV, A_ATTY, A_ATT, A_PROJ, A_RES2, A_LN2,
  A_LN2M, A_LN2R, A_FCH, A_GELU, A_FCP, A_RES3, A_LNF, A_LNFM, A_LNFR,
  A_LOGITS, NA
};

struct trn__gpt {
  size_t V, maxT, L, NH, C, B; /* B: the largest batch */
  size_t psize[TRN__GPT_TENSORS], poff[TRN__GPT_TENSORS];
  size_t asize[NA];
  float *acts[NA], *grads[NA]; /* activations and their gradients */
  float *datt;                 /* (B, maxT) attention backward's scratch */
  size_t T;                    /* the last batch's */
};

static void param_sizes(trn__gpt *g) {
  size_t V = g->V, T = g->maxT, L = g->L, C = g->C;
  size_t s[TRN__GPT_TENSORS] = {V * C, T * C, L * C, L * C, L * 3 * C * C,
                          L * 3 * C, L * C * C, L * C, L * C, L * C,
                          L * 4 * C * C, L * 4 * C, L * C * 4 * C, L * C,
                          C, C};
  size_t off = 0;
  for (int i = 0; i < TRN__GPT_TENSORS; i++) {
    g->psize[i] = s[i];
    g->poff[i] = off;
    off += s[i];
  }
}

static void act_sizes(trn__gpt *g) {
  size_t BT = g->B * g->maxT, L = g->L, C = g->C, NH = g->NH, T = g->maxT;
  size_t s[NA] = {BT * C,      L * BT * C,      L * BT,          L * BT,
                  L * BT * 3 * C, L * BT * C,   L * g->B * NH * T * T,
                  L * BT * C,  L * BT * C,      L * BT * C,      L * BT,
                  L * BT,      L * BT * 4 * C,  L * BT * 4 * C,  L * BT * C,
                  L * BT * C,  BT * C,          BT,              BT,
                  BT * g->V};
  memcpy(g->asize, s, sizeof s);
}

void trn__gpt_layout(const trn_model_config *c, size_t off[TRN__GPT_TENSORS],
                     size_t size[TRN__GPT_TENSORS]) {
  trn__gpt g = {.V = c->vocab, .maxT = c->ctx, .L = c->layers,
                .NH = c->heads, .C = c->embd};
  param_sizes(&g);
  memcpy(off, g.poff, sizeof g.poff);
  memcpy(size, g.psize, sizeof g.psize);
}

size_t trn__gpt_nparams(const trn_model_config *c) {
  trn__gpt g = {.V = c->vocab, .maxT = c->ctx, .L = c->layers,
                .NH = c->heads, .C = c->embd};
  param_sizes(&g);
  return g.poff[TRN__GPT_TENSORS - 1] + g.psize[TRN__GPT_TENSORS - 1];
}

int trn__gpt_plan(const trn_model_config *c, trn__gpt **out) {
  trn__gpt *g = calloc(1, sizeof *g);
  if (!g)
    return -ENOMEM;
  *g = (trn__gpt){.V = c->vocab, .maxT = c->ctx, .L = c->layers,
                  .NH = c->heads, .C = c->embd, .B = c->max_batch};
  param_sizes(g);
  act_sizes(g);
  *out = g;
  return 0;
}

int trn__gpt_new(const trn_model_config *c, trn__gpt **out) {
  trn__gpt *g;
  if (trn__gpt_plan(c, &g))
    return -ENOMEM;
  for (int i = 0; i < NA; i++)
    if (!(g->acts[i] = malloc(g->asize[i] * sizeof(float))) ||
        !(g->grads[i] = malloc(g->asize[i] * sizeof(float)))) {
      trn__gpt_free(g);
      return -ENOMEM;
    }
  if (!(g->datt = malloc(g->B * g->maxT * sizeof(float)))) {
    trn__gpt_free(g);
    return -ENOMEM;
  }
  *out = g;
  return 0;
}

size_t trn__gpt_bytes(const trn__gpt *g) {
  size_t n = g->B * g->maxT;
  for (int i = 0; i < NA; i++)
    n += 2 * g->asize[i]; /* activations and their gradients */
  return n * sizeof(float);
}

void trn__gpt_free(trn__gpt *g) {
  if (!g)
    return;
  for (int i = 0; i < NA; i++) {
    free(g->acts[i]);
    free(g->grads[i]);
  }
  free(g->datt);
  free(g);
}

size_t trn__gpt_tensors(const trn__gpt *g, size_t *ends, size_t max) {
  for (size_t i = 0; i < TRN__GPT_TENSORS && i < max; i++)
    ends[i] = g->poff[i] + g->psize[i];
  return TRN__GPT_TENSORS;
}

void trn__gpt_init(const trn__gpt *g, float *p, uint64_t *s,
                   float (*uniform)(uint64_t *s, float bound)) {
  /* GPT-2's: normal-like weights of scale 0.02 (here uniform with the
   * same standard deviation), the residual projections scaled by
   * 1 / sqrt(2 L), biases 0, layer norms 1 and 0. */
  float u = 0.02f * sqrtf(3.0f), ur = u / sqrtf(2.0f * (float)g->L);
  for (int i = 0; i < TRN__GPT_TENSORS; i++) {
    float *t = p + g->poff[i];
    size_t n = g->psize[i];
    float bound = i == TRN__GPT_PROJW || i == TRN__GPT_FCPW ? ur : u;
    bool ones = i == TRN__GPT_LN1W || i == TRN__GPT_LN2W || i == TRN__GPT_LNFW;
    bool zeros = i == TRN__GPT_QKVB || i == TRN__GPT_PROJB ||
                 i == TRN__GPT_FCB || i == TRN__GPT_FCPB ||
                 i == TRN__GPT_LN1B || i == TRN__GPT_LN2B || i == TRN__GPT_LNFB;
    for (size_t k = 0; k < n; k++)
      t[k] = ones ? 1.0f : zeros ? 0.0f : uniform(s, bound);
  }
}

/* Pointers to layer l's slice of a stacked tensor or activation. */
#define PAR(p, i, l) ((p) + g->poff[i] + (l) * (g->psize[i] / g->L))
#define ACT(a, i, l) (g->a[i] + (l) * (g->asize[i] / g->L))

double trn__gpt_forward(trn__gpt *g, const float *params, const int32_t *inp,
                        const int32_t *tgt, size_t B, size_t T, float *dlogits,
                        size_t *correct) {
  size_t C = g->C, NH = g->NH, V = g->V, BT = B * T;
  g->T = T;
  /* Activations laid out for (B, T) of this batch inside the maxima. */
  encoder_fwd(g->acts[A_ENC], inp, params + g->poff[TRN__GPT_WTE],
              params + g->poff[TRN__GPT_WPE], B, T, C);
  const float *res = g->acts[A_ENC];
  for (size_t l = 0; l < g->L; l++) {
    float *ln1 = ACT(acts, A_LN1, l), *qkv = ACT(acts, A_QKV, l);
    float *atty = ACT(acts, A_ATTY, l), *att = ACT(acts, A_ATT, l);
    float *proj = ACT(acts, A_PROJ, l), *res2 = ACT(acts, A_RES2, l);
    float *ln2 = ACT(acts, A_LN2, l), *fch = ACT(acts, A_FCH, l);
    float *ge = ACT(acts, A_GELU, l), *fcp = ACT(acts, A_FCP, l);
    float *res3 = ACT(acts, A_RES3, l);
    layernorm_fwd(ln1, ACT(acts, A_LN1M, l), ACT(acts, A_LN1R, l), res,
                  PAR(params, TRN__GPT_LN1W, l), PAR(params, TRN__GPT_LN1B, l),
                  BT, C);
    matmul_fwd(qkv, ln1, PAR(params, TRN__GPT_QKVW, l),
               PAR(params, TRN__GPT_QKVB, l), BT, C, 3 * C);
    attention_fwd(atty, att, qkv, B, T, C, NH);
    matmul_fwd(proj, atty, PAR(params, TRN__GPT_PROJW, l),
               PAR(params, TRN__GPT_PROJB, l), BT, C, C);
    for (size_t i = 0; i < BT * C; i++)
      res2[i] = res[i] + proj[i];
    layernorm_fwd(ln2, ACT(acts, A_LN2M, l), ACT(acts, A_LN2R, l), res2,
                  PAR(params, TRN__GPT_LN2W, l), PAR(params, TRN__GPT_LN2B, l),
                  BT, C);
    matmul_fwd(fch, ln2, PAR(params, TRN__GPT_FCW, l),
               PAR(params, TRN__GPT_FCB, l), BT, C, 4 * C);
    gelu_fwd(ge, fch, BT * 4 * C);
    matmul_fwd(fcp, ge, PAR(params, TRN__GPT_FCPW, l),
               PAR(params, TRN__GPT_FCPB, l), BT, 4 * C, C);
    for (size_t i = 0; i < BT * C; i++)
      res3[i] = res2[i] + fcp[i];
    res = res3;
  }
  layernorm_fwd(g->acts[A_LNF], g->acts[A_LNFM], g->acts[A_LNFR], res,
                params + g->poff[TRN__GPT_LNFW],
                params + g->poff[TRN__GPT_LNFB], BT, C);
  /* The head, tied to the token embedding: logits (BT, V). */
  matmul_fwd(g->acts[A_LOGITS], g->acts[A_LNF], params + g->poff[TRN__GPT_WTE],
             NULL, BT, C, V);
  return trn__softmax_ce(g->acts[A_LOGITS], tgt, dlogits, BT, V, correct);
}

void trn__gpt_backward(trn__gpt *g, const float *params, float *grads,
                       const int32_t *inp, size_t B) {
  size_t C = g->C, NH = g->NH, V = g->V, T = g->T, BT = B * T;
  for (int i = 0; i < NA; i++)
    if (i != A_LOGITS) /* dlogits is already there */
      memset(g->grads[i], 0, g->asize[i] * sizeof(float));
  const float *res_last =
      g->L ? ACT(acts, A_RES3, g->L - 1) : g->acts[A_ENC];
  float *dres_last = g->L ? ACT(grads, A_RES3, g->L - 1) : g->grads[A_ENC];
  matmul_bwd(g->grads[A_LNF], grads + g->poff[TRN__GPT_WTE], NULL,
             g->grads[A_LOGITS], g->acts[A_LNF], params + g->poff[TRN__GPT_WTE],
             BT, C, V);
  layernorm_bwd(dres_last, grads + g->poff[TRN__GPT_LNFW],
                grads + g->poff[TRN__GPT_LNFB], g->grads[A_LNF], res_last,
                params + g->poff[TRN__GPT_LNFW], g->acts[A_LNFM],
                g->acts[A_LNFR], BT, C);
  for (size_t l = g->L; l-- > 0;) {
    const float *res = l ? ACT(acts, A_RES3, l - 1) : g->acts[A_ENC];
    float *dres = l ? ACT(grads, A_RES3, l - 1) : g->grads[A_ENC];
    float *dres3 = ACT(grads, A_RES3, l), *dres2 = ACT(grads, A_RES2, l);
    /* res3 = res2 + fcp: both get dres3. */
    for (size_t i = 0; i < BT * C; i++)
      dres2[i] = dres3[i];
    matmul_bwd(ACT(grads, A_GELU, l), PAR(grads, TRN__GPT_FCPW, l),
               PAR(grads, TRN__GPT_FCPB, l), dres3, ACT(acts, A_GELU, l),
               PAR(params, TRN__GPT_FCPW, l), BT, 4 * C, C);
    gelu_bwd(ACT(grads, A_FCH, l), ACT(acts, A_FCH, l), ACT(grads, A_GELU, l),
             BT * 4 * C);
    matmul_bwd(ACT(grads, A_LN2, l), PAR(grads, TRN__GPT_FCW, l),
               PAR(grads, TRN__GPT_FCB, l), ACT(grads, A_FCH, l),
               ACT(acts, A_LN2, l), PAR(params, TRN__GPT_FCW, l), BT, C, 4 * C);
    layernorm_bwd(dres2, PAR(grads, TRN__GPT_LN2W, l),
                  PAR(grads, TRN__GPT_LN2B, l), ACT(grads, A_LN2, l),
                  ACT(acts, A_RES2, l), PAR(params, TRN__GPT_LN2W, l),
                  ACT(acts, A_LN2M, l), ACT(acts, A_LN2R, l), BT, C);
    /* res2 = res + proj. */
    for (size_t i = 0; i < BT * C; i++)
      dres[i] = dres2[i];
    matmul_bwd(ACT(grads, A_ATTY, l), PAR(grads, TRN__GPT_PROJW, l),
               PAR(grads, TRN__GPT_PROJB, l), dres2, ACT(acts, A_ATTY, l),
               PAR(params, TRN__GPT_PROJW, l), BT, C, C);
    attention_bwd(ACT(grads, A_QKV, l), ACT(grads, A_ATTY, l),
                  ACT(acts, A_QKV, l), ACT(acts, A_ATT, l), g->datt, B, T,
                  C, NH);
    matmul_bwd(ACT(grads, A_LN1, l), PAR(grads, TRN__GPT_QKVW, l),
               PAR(grads, TRN__GPT_QKVB, l), ACT(grads, A_QKV, l),
               ACT(acts, A_LN1, l), PAR(params, TRN__GPT_QKVW, l), BT, C,
               3 * C);
    layernorm_bwd(dres, PAR(grads, TRN__GPT_LN1W, l),
                  PAR(grads, TRN__GPT_LN1B, l), ACT(grads, A_LN1, l), res,
                  PAR(params, TRN__GPT_LN1W, l), ACT(acts, A_LN1M, l),
                  ACT(acts, A_LN1R, l), BT, C);
  }
  encoder_bwd(grads + g->poff[TRN__GPT_WTE], grads + g->poff[TRN__GPT_WPE],
              g->grads[A_ENC], inp, B, T, C);
}

float *trn__gpt_dlogits(trn__gpt *g) { return g->grads[A_LOGITS]; }
const float *trn__gpt_logits(const trn__gpt *g) { return g->acts[A_LOGITS]; }
