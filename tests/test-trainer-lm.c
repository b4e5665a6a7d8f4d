/* test-trainer-lm.c: gpt learns a language on the CPU.
 *
 * The "language": a fixed cycle through a shuffled alphabet of 16 tokens,
 * so the next token follows from the current one.  A gpt of 1 layer, 2
 * heads and 32 channels, trained with AdamW on windows of 7 tokens of it
 * (7 and the cycle of 16 share no factor: the windows start everywhere),
 * must bring its loss from ln 16 (2.77, guessing) to under 0.05 in 300
 * steps and predict every next token of held-out windows.  A model whose
 * attention, MLP or head did not learn stays far above that.
 */
#include "test.h"
#include "trainer.h"

#include <math.h>

enum { V = 16, N = 4000, T = 7, B = 8, STEPS = 300 };

int main(void) {
  trn_cpu_threads_set(1);
  /* The cycle: next[perm[i]] = perm[i + 1]. */
  int perm[V], next[V];
  for (int i = 0; i < V; i++)
    perm[i] = i;
  uint32_t r = 7;
  for (int i = V - 1; i > 0; i--) {
    r = r * 1103515245u + 12345u;
    int j = (int)(r >> 16) % (i + 1), t = perm[i];
    perm[i] = perm[j], perm[j] = t;
  }
  for (int i = 0; i < V; i++)
    next[perm[i]] = perm[(i + 1) % V];
  static uint16_t tok[N];
  tok[0] = 3;
  for (int i = 1; i < N; i++)
    tok[i] = (uint16_t)next[tok[i - 1]];
  trn_tokens data = {.tok = tok, .n = N, .vocab = V};

  trn_model_config c;
  trn_model_config_default(&c);
  c.name = "gpt";
  c.vocab = V, c.ctx = T, c.layers = 1, c.heads = 2, c.embd = 32;
  c.max_batch = B;
  trn_model *m;
  char err[160];
  ASSERT_EQ(trn_model_new(&c, &m, err, sizeof err), 0);
  trn_optim_config oc;
  trn_optim_config_default(&oc, TRN_ADAMW);
  oc.lr = 1e-2f;
  trn_optim *o;
  ASSERT_EQ(trn_optim_new(&oc, trn_model_nparams(m), &o), 0);
  trn_order ord;
  ASSERT_EQ(trn_order_init(&ord, trn_tokens_windows(&data, T), "lm", 2, 0, 0),
            0);
  int32_t x[B * T], y[B * T];
  double first = 0, last = 0;
  for (int s = 0; s < STEPS; s++) {
    ASSERT_EQ(trn_tokens_batch(&data, &ord, B, T, x, y), 0);
    trn_model_zero_grad(m);
    double l;
    ASSERT_EQ(trn_model_train_tokens(m, x, y, B, T, &l), 0);
    ASSERT_EQ(trn_optim_step(o, trn_model_params(m), trn_model_grads(m),
                             1.0f / (B * T)),
              0);
    if (s == 0)
      first = l / (B * T);
    last = l / (B * T);
  }
  /* Held out: windows starting between the training windows' starts. */
  for (int i = 0; i < B; i++)
    for (int t = 0; t < T; t++) {
      x[i * T + t] = tok[37 * i + 3 + t];
      y[i * T + t] = tok[37 * i + 4 + t];
    }
  double el;
  size_t right;
  ASSERT_EQ(trn_model_eval_tokens(m, x, y, B, T, &el, &right), 0);
  printf("gpt learns a 16-token cycle: loss %.3f at the start (ln 16 = "
         "%.3f), %.4f after %d steps; held out: %zu of %d next tokens\n",
         first, log(V), last, STEPS, right, B * T);
  ASSERT(first > 2.0);
  ASSERT(last < 0.05);
  ASSERT_EQ(right, B * T);
  trn_order_free(&ord);
  trn_optim_free(o);
  trn_model_free(m);
  return 0;
}
