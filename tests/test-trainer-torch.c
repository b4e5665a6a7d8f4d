/* test-trainer-torch.c: the CPU models and optimizers against PyTorch.
 *
 * tests/data/trainer-mlp.ref and trainer-cnn.ref (written by
 * tests/gen-trainer-ref.py with Debian's python3-torch, checked in) hold
 * PyTorch's initial weights of an mlp 64-32-16-10 and of a small cnn on
 * 1x12x12 inputs, three batches each, and what PyTorch computed from
 * them.  With the same weights and inputs our logits, mean loss and
 * gradients must agree to fp32 rounding, and so must the parameters after
 * three steps of SGD (Nesterov momentum and weight decay; momentum with
 * dampening; momentum after clipping the gradient's norm to 0.05), AdamW
 * and LAMB (written from the paper in the generator).  The cnn with batch
 * norm also checks the running statistics and the logits in evaluation.  The two files' paths are the arguments (meson
 * passes them).
 */
#include "test.h"
#include "trainer.h"

#include <errno.h>
#include <math.h>

#define RECS_MAX 16

static struct {
  char name[32];
  float *v;
  uint32_t n;
} rec[RECS_MAX];
static int nrec;

static uint32_t u32le(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
         (uint32_t)p[3] << 24;
}

/* Reads the reference file, checking every length against what is left. */
static void load(const char *path) {
  for (int i = 0; i < nrec; i++)
    free(rec[i].v);
  nrec = 0;
  FILE *f = fopen(path, "rb");
  if (!f)
    FAIL("%s: cannot open (run tests/gen-trainer-ref.py)", path);
  static uint8_t buf[1 << 20];
  size_t n = fread(buf, 1, sizeof buf, f);
  ASSERT(n < sizeof buf);
  fclose(f);
  ASSERT(n >= 8 && memcmp(buf, "BEEREF1\n", 8) == 0);
  size_t at = 8;
  while (at < n) {
    ASSERT(nrec < RECS_MAX && n - at >= 4);
    uint32_t len = u32le(buf + at);
    ASSERT(len > 0 && len < sizeof rec[0].name && n - at - 4 >= len + 4);
    memcpy(rec[nrec].name, buf + at + 4, len);
    at += 4 + len;
    uint32_t cnt = u32le(buf + at);
    at += 4;
    ASSERT((n - at) / 4 >= cnt);
    rec[nrec].v = malloc((cnt ? cnt : 1) * sizeof(float));
    ASSERT(rec[nrec].v != NULL);
    for (uint32_t i = 0; i < cnt; i++) {
      uint32_t w = u32le(buf + at + 4 * i);
      memcpy(&rec[nrec].v[i], &w, 4);
    }
    rec[nrec].n = cnt;
    at += 4 * (size_t)cnt;
    nrec++;
  }
}

static const float *get(const char *name, size_t want) {
  for (int i = 0; i < nrec; i++)
    if (strcmp(rec[i].name, name) == 0) {
      if (rec[i].n != want)
        FAIL("reference %s: %u values, want %zu", name, rec[i].n, want);
      return rec[i].v;
    }
  FAIL("reference %s: missing", name);
}

/* |a - b| <= tol x max(1e-3, the largest magnitude of b); returns the
 * largest error over that scale. */
/* Elements not to compare (NULL: all are), and how many were skipped. */
static const bool *skip;
static size_t skipped;

static double close_to(const char *what, const float *a, const float *b,
                       size_t n, double scale_a, double tol) {
  double scale = 1e-3, worst = 0;
  for (size_t i = 0; i < n; i++)
    scale = fmax(scale, fabs(b[i]));
  for (size_t i = 0; i < n; i++) {
    if (skip && skip[i]) {
      skipped++;
      continue;
    }
    double e = fabs(a[i] * scale_a - b[i]) / scale;
    if (e > tol)
      FAIL("%s[%zu]: ours %.9g, PyTorch %.9g (scale %.3g)", what, i,
           a[i] * scale_a, b[i], scale);
    worst = fmax(worst, e);
  }
  return worst;
}

enum { STEPS = 3 };
static size_t B;
static size_t T;              /* gpt: positions per sequence; 0 for images */
/* Logits and gradients within fwd_tol of their scale, the parameters
 * after the optimizer's steps within step_tol: 1e-6 and 2e-6, more for
 * the deeper models, whose sums run in other orders than PyTorch's: gpt
 * (layer norms, attention) 1e-5; resnet-18 (20 batch norms over batches
 * of 2, here) 2e-5 and 1e-4: PyTorch's own float32 result for it is
 * 4.2e-6 (gradients) and 9.8e-6 (parameters after 3 steps) from its
 * float64 one, and ours is within about twice that of PyTorch's.  Set by
 * check(). */
static double fwd_tol, step_tol;
static int32_t xi[STEPS * 64 * 8]; /* gpt: the tokens as integers */

/* Positions per sample: the losses are means over B x this. */
static size_t positions(void) { return T ? T : 1; }

/* Trains on batch k of the reference's inputs; the summed loss. */
static double one_batch(trn_model *m, const float *x, const int32_t *y,
                        int k) {
  double loss;
  if (T)
    ASSERT_EQ(trn_model_train_tokens(m, xi + (size_t)k * B * T,
                                     y + (size_t)k * B * T, B, T, &loss),
              0);
  else
    ASSERT_EQ(trn_model_train_batch(m, x + (size_t)k * B * trn_model_inputs(m),
                                    y + k * B, B, &loss),
              0);
  return loss;
}
static float buf0[1024]; /* the model's batch-norm statistics as created */
static size_t nbuf0;

/* STEPS steps of the optimizer oc from p0, one batch each, the gradients
 * clipped to a global norm of clip first (0: not). */
static void run_optim(trn_model *m, const float *p0, const float *x,
                      const int32_t *y, const trn_optim_config *oc,
                      float clip, const char *ref) {
  size_t np = trn_model_nparams(m), nb;
  float scale = 1.0f / (float)(B * positions());
  memcpy(trn_model_params(m), p0, np * sizeof(float));
  float *buf = trn_model_buffers(m, &nb);
  if (nb)
    memcpy(buf, buf0, nb * sizeof *buf);
  trn_optim *o;
  ASSERT_EQ(trn_optim_new(oc, np, &o), 0);
  size_t ends[64];
  size_t ne = trn_model_tensors(m, ends, 64);
  ASSERT(ne <= 64);
  ASSERT_EQ(trn_optim_set_tensors(o, ends, ne), 0);
  for (int k = 0; k < STEPS; k++) {
    trn_model_zero_grad(m);
    one_batch(m, x, y, k);
    if (clip > 0) {
      double norm = trn_grad_clip(trn_model_grads(m), np, scale, clip);
      ASSERT(norm > clip); /* the case clips */
    }
    ASSERT_EQ(trn_optim_step(o, trn_model_params(m), trn_model_grads(m),
                             scale),
              0);
  }
  ASSERT_UEQ(trn_optim_steps(o), STEPS);
  /* Adam-like steps divide each gradient by its own size: where the true
   * gradient is 0 but the computed one is rounding noise, both sides step
   * by their own noise, which differs.  In gpt that is the attention keys'
   * bias (a constant added to every score of a query, which the softmax
   * cancels): left out of AdamW's and LAMB's comparison. */
  static bool kbias[65536];
  ASSERT(np <= 65536);
  memset(kbias, 0, np);
  if (T && oc->kind != TRN_SGD) {
    /* trainer/gpt.c's layout: wte, wpe, ln1 w and b, qkv W, then qkv b
     * (layers x 3C: q, k, v). */
    size_t C = 16, L = 2, V = 37, ctx = 8;
    size_t qkvb = V * C + ctx * C + 2 * L * C + L * 3 * C * C;
    for (size_t l = 0; l < L; l++)
      for (size_t i = 0; i < C; i++)
        kbias[qkvb + l * 3 * C + C + i] = true;
  }
  skip = kbias, skipped = 0;
  double e = close_to(ref, trn_model_params(m), get(ref, np), np, 1, step_tol);
  skip = NULL;
  printf("  %-14s parameters after %d steps: worst error %.2g of their "
         "scale%s",
         ref, STEPS, e, skipped ? "" : "\n");
  if (skipped)
    printf(" (the %zu keys' biases left out)\n", skipped);
  if (nb && strcmp(ref, "sgd_nesterov") == 0) {
    /* Batch norm's running statistics, and the model in evaluation. */
    double eb = close_to("buffers", buf, get("sgd_nesterov_buffers", nb), nb,
                         1, step_tol);
    ASSERT_EQ(trn_model_eval_batch(m, x, y, B, NULL, NULL), 0);
    double ee = close_to("eval logits", trn_model_logits(m),
                         get("sgd_nesterov_eval_logits", B * 10), B * 10, 1,
                         step_tol);
    printf("  %-14s running statistics within %.2g, logits in evaluation "
           "within %.2g\n",
           "", eb, ee);
  }
  trn_optim_free(o);
}

/* Checks our model c against the reference file at path. */
static void check(const char *path, const trn_model_config *c, size_t batch,
                  size_t seq, const char *what) {
  load(path);
  B = batch;
  T = seq;
  fwd_tol = 1e-6, step_tol = 2e-6;
  if (seq) /* gpt */
    fwd_tol = step_tol = 1e-5;
  if (c->name[0] == 'r' && c->depth == 18)
    fwd_tol = 2e-5, step_tol = 1e-4;
  trn_model *m;
  char err[128];
  ASSERT_EQ(trn_model_new(c, &m, err, sizeof err), 0);
  size_t np = trn_model_nparams(m), in = trn_model_inputs(m);
  float *buf = trn_model_buffers(m, &nbuf0);
  ASSERT(nbuf0 <= 1024);
  if (nbuf0)
    memcpy(buf0, buf, nbuf0 * sizeof *buf);
  size_t P = positions(), ncls = trn_model_classes(m);
  const float *p0 = get("params", np);
  const float *x = get("x", STEPS * B * (T ? T : in));
  const float *yf = get("y", STEPS * B * P);
  int32_t y[STEPS * 64 * 8];
  ASSERT(B * P <= 64 * 8);
  for (size_t i = 0; i < STEPS * B * P; i++) {
    y[i] = (int32_t)yf[i];
    if (T)
      xi[i] = (int32_t)x[i];
  }

  /* One batch: logits, the mean loss, its gradients. */
  memcpy(trn_model_params(m), p0, np * sizeof(float));
  trn_model_zero_grad(m);
  double loss = one_batch(m, x, y, 0) / (double)(B * P);
  double el = close_to("logits", trn_model_logits(m),
                       get("logits", B * P * ncls), B * P * ncls, 1, fwd_tol);
  double want = get("loss", 1)[0];
  ASSERT(fabs(loss - want) <= 1e-6 * fabs(want));
  double eg = close_to("grads", trn_model_grads(m), get("grads", np), np,
                       1.0 / (double)(B * P), fwd_tol);
  printf("%s, %zu parameters, batch %zu: logits within %.2g, loss %.7f "
         "(PyTorch %.7f), gradients within %.2g of their scale\n",
         what, np, B, el, loss, want, eg);

  trn_optim_config oc;
  trn_optim_config_default(&oc, TRN_SGD);
  oc.lr = 0.05f, oc.momentum = 0.9f, oc.nesterov = true;
  oc.weight_decay = 5e-4f;
  run_optim(m, p0, x, y, &oc, 0, "sgd_nesterov");
  trn_optim_config_default(&oc, TRN_SGD);
  oc.lr = 0.1f, oc.momentum = 0.8f, oc.dampening = 0.25f;
  run_optim(m, p0, x, y, &oc, 0, "sgd_dampening");
  trn_optim_config_default(&oc, TRN_ADAMW);
  oc.lr = 3e-3f, oc.beta1 = 0.9f, oc.beta2 = 0.99f, oc.eps = 1e-7f;
  oc.weight_decay = 0.05f;
  run_optim(m, p0, x, y, &oc, 0, "adamw");
  trn_optim_config_default(&oc, TRN_LAMB);
  oc.lr = 0.02f, oc.eps = 1e-6f, oc.weight_decay = 0.01f;
  run_optim(m, p0, x, y, &oc, 0, "lamb");
  trn_optim_config_default(&oc, TRN_SGD);
  oc.lr = 0.1f, oc.momentum = 0.9f;
  run_optim(m, p0, x, y, &oc, 0.05f, "sgd_clipped");
  trn_model_free(m);
}

int main(int argc, char **argv) {
  ASSERT(argc == 7);
  trn_cpu_threads_set(1);
  trn_model_config c;
  trn_model_config_default(&c);
  static const unsigned sizes[4] = {64, 32, 16, 10};
  memcpy(c.sizes, sizes, sizeof sizes);
  c.nsizes = 4;
  c.max_batch = 16;
  check(argv[1], &c, 16, 0, "mlp 64-32-16-10");
  trn_model_config_default(&c);
  c.name = "cnn";
  c.in_h = c.in_w = 12;
  c.conv[0] = 4, c.conv[1] = 6, c.dense = 16, c.dropout = 0;
  c.max_batch = 8;
  check(argv[2], &c, 8, 0, "cnn 1x12x12, conv 4 and 6, dense 16");
  c.batchnorm = true;
  check(argv[3], &c, 8, 0, "the same with batch norm");
  trn_model_config_default(&c);
  c.name = "gpt";
  c.vocab = 37, c.ctx = 8, c.layers = 2, c.heads = 2, c.embd = 16;
  c.max_batch = 3;
  check(argv[4], &c, 3, 6, "gpt 2 layers, 2 heads, 16 wide, 6 of 8 tokens");
  trn_model_config_default(&c);
  c.name = "resnet";
  c.depth = 8, c.width = 2, c.in_c = 3, c.in_h = c.in_w = 8, c.classes = 10;
  c.max_batch = 4;
  check(argv[5], &c, 4, 0, "resnet-8, width 2, 3x8x8");
  c.depth = 18, c.width = 2, c.in_h = c.in_w = 48, c.max_batch = 2;
  check(argv[6], &c, 2, 0, "resnet-18's shape, width 2, 3x48x48");

  /* Schedules, at the steps whose rates are known exactly. */
  trn_sched sc = {.kind = TRN_SCHED_COSINE, .lr = 1, .min_lr = 0,
                  .warmup = 10, .total = 110};
  ASSERT(fabsf(trn_sched_lr(&sc, 0) - 0.1f) < 1e-7f);
  ASSERT(fabsf(trn_sched_lr(&sc, 4) - 0.5f) < 1e-7f);
  ASSERT(trn_sched_lr(&sc, 10) == 1.0f);
  ASSERT(fabsf(trn_sched_lr(&sc, 60) - 0.5f) < 1e-6f);
  ASSERT(fabsf(trn_sched_lr(&sc, 110)) < 1e-7f);
  ASSERT(fabsf(trn_sched_lr(&sc, 500)) < 1e-7f);
  sc.kind = TRN_SCHED_LINEAR, sc.min_lr = 0.2f;
  ASSERT(fabsf(trn_sched_lr(&sc, 60) - 0.6f) < 1e-6f);
  ASSERT(fabsf(trn_sched_lr(&sc, 110) - 0.2f) < 1e-7f);
  sc.kind = TRN_SCHED_CONST;
  ASSERT(trn_sched_lr(&sc, 1000) == 1.0f);
  /* Clipping: max 0 never clips; a NaN is reported and left alone. */
  float g[3] = {3, 4, 0};
  ASSERT(trn_grad_clip(g, 3, 1, 0) == 5 && g[0] == 3);
  ASSERT(fabs(trn_grad_clip(g, 3, 0.5f, 1) - 2.5) < 1e-12);
  ASSERT(fabsf(g[0] - 3 * (float)(1 / (2.5 + 1e-6))) < 1e-6f);
  g[2] = NAN;
  float g1 = g[1];
  ASSERT(isnan(trn_grad_clip(g, 3, 1, 1)) && g[1] == g1);

  /* Settings PyTorch refuses are refused here too. */
  trn_optim *o;
  trn_optim_config oc;
  trn_optim_config_default(&oc, TRN_SGD);
  oc.nesterov = true; /* without momentum */
  ASSERT_EQ(trn_optim_new(&oc, 10, &o), -EINVAL);
  trn_optim_config_default(&oc, TRN_ADAMW);
  oc.beta2 = 1;
  ASSERT_EQ(trn_optim_new(&oc, 10, &o), -EINVAL);
  oc.beta2 = 0.999f, oc.lr = -1;
  ASSERT_EQ(trn_optim_new(&oc, 10, &o), -EINVAL);
  for (int i = 0; i < nrec; i++)
    free(rec[i].v);
  return 0;
}
