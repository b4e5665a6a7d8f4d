/* test-trainer-ckpt.c: save and restore reproduce a run bit for bit.
 *
 * A small cnn with batch norm and dropout learns random 1x12x12 images
 * for 6 steps,
 * saves, and goes on for 6 more, recording its losses.  A second run with
 * another seed, another data order and a fresh optimizer loads the
 * checkpoint and takes the same 6 steps: every loss and every parameter
 * must be the same bits, the batch norms' running statistics too (for SGD
 * with momentum, AdamW and LAMB).  Then
 * bad checkpoints: another model, another optimizer, another dataset's
 * order, a damaged byte, a truncated file, trailing bytes, a missing file
 * and a file that is not a checkpoint are each refused with a message and
 * leave the model as it was.
 */
#include "test.h"
#include "trainer.h"

#include <errno.h>
#include <unistd.h>

enum { N = 200, B = 10, STEPS = 6 };
static char dir[64], path[128], err[512];
static trn_images data;

static void make_data(void) {
  data.n = N, data.c = 1, data.h = data.w = 12, data.classes = 10;
  data.pix = malloc(N * 144);
  data.labels = malloc(N);
  ASSERT(data.pix && data.labels);
  uint32_t r = 99;
  for (size_t i = 0; i < N * 144; i++)
    data.pix[i] = (uint8_t)((r = r * 1103515245u + 12345u) >> 24);
  for (size_t i = 0; i < N; i++)
    data.labels[i] = (uint8_t)(i % 10);
}

static trn_model *new_model(uint64_t seed, unsigned dense) {
  trn_model_config c;
  trn_model_config_default(&c);
  c.name = "cnn";
  c.in_h = c.in_w = 12;
  c.conv[0] = 4, c.conv[1] = 6, c.dense = dense, c.dropout = 0.3f;
  c.batchnorm = true; /* running statistics to save too */
  c.max_batch = B;
  c.seed = seed;
  trn_model *m;
  ASSERT_EQ(trn_model_new(&c, &m, err, sizeof err), 0);
  return m;
}

static trn_optim *new_optim(int kind, trn_model *m) {
  trn_optim_config oc;
  trn_optim_config_default(&oc, kind);
  if (kind == TRN_SGD)
    oc.lr = 0.05f, oc.momentum = 0.9f;
  trn_optim *o;
  ASSERT_EQ(trn_optim_new(&oc, trn_model_nparams(m), &o), 0);
  size_t ends[32], ne = trn_model_tensors(m, ends, 32);
  ASSERT_EQ(trn_optim_set_tensors(o, ends, ne), 0);
  return o;
}

/* STEPS steps; their summed losses into loss. */
static void run(trn_model *m, trn_optim *o, trn_order *ord, double *loss) {
  float x[B * 144];
  int32_t y[B];
  for (int s = 0; s < STEPS; s++) {
    ASSERT_EQ(trn_images_batch(&data, ord, B, NULL, NULL, x, y), 0);
    trn_model_zero_grad(m);
    ASSERT_EQ(trn_model_train_batch(m, x, y, B, &loss[s]), 0);
    ASSERT_EQ(trn_optim_step(o, trn_model_params(m), trn_model_grads(m),
                             1.0f / B),
              0);
  }
}

static void round_trip(int kind, const char *name) {
  trn_model *a = new_model(1, 16);
  trn_optim *oa = new_optim(kind, a);
  trn_order da;
  ASSERT_EQ(trn_order_init(&da, N, "first", 5, 0, 0), 0);
  double l0[STEPS], l1[STEPS], l2[STEPS];
  run(a, oa, &da, l0);
  uint64_t user[4] = {7, 8, 9, UINT64_MAX}, back[4] = {0};
  ASSERT_EQ(trn_ckpt_save(path, a, oa, &da, user, err, sizeof err), 0);
  run(a, oa, &da, l1);

  trn_model *b = new_model(2, 16);
  trn_optim *ob = new_optim(kind, b);
  trn_order db;
  ASSERT_EQ(trn_order_init(&db, N, "other", 5, 3, 17), 0);
  ASSERT_EQ(trn_ckpt_load(path, b, ob, &db, back, err, sizeof err), 0);
  ASSERT(memcmp(user, back, sizeof user) == 0);
  run(b, ob, &db, l2);
  ASSERT(memcmp(l1, l2, sizeof l1) == 0);
  size_t np = trn_model_nparams(a), sa, sb;
  ASSERT(memcmp(trn_model_params(a), trn_model_params(b), np * 4) == 0);
  float *sta = trn_optim_state(oa, &sa), *stb = trn_optim_state(ob, &sb);
  ASSERT(sa == sb && (sa == 0 || memcmp(sta, stb, sa * 4) == 0));
  ASSERT_UEQ(trn_optim_steps(ob), 2 * STEPS);
  size_t nba, nbb;
  float *ba = trn_model_buffers(a, &nba), *bb = trn_model_buffers(b, &nbb);
  ASSERT(nba == nbb && nba > 0 && memcmp(ba, bb, nba * 4) == 0);
  ASSERT_UEQ(trn_model_dropout_calls(b), trn_model_dropout_calls(a));
  printf("%-5s: %d steps after the restore, the same losses (last %.9f) and "
         "parameters to the bit\n",
         name, STEPS, l2[STEPS - 1] / B);
  trn_order_free(&da);
  trn_order_free(&db);
  trn_optim_free(oa);
  trn_optim_free(ob);
  trn_model_free(a);
  trn_model_free(b);
}

/* Copies path to dir/name, changed by edit (which may resize it). */
static void variant(const char *name, void (*edit)(uint8_t *b, size_t *n)) {
  FILE *f = fopen(path, "rb");
  ASSERT(f != NULL);
  static uint8_t b[1 << 20];
  size_t n = fread(b, 1, sizeof b, f);
  fclose(f);
  edit(b, &n);
  char p[160];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  f = fopen(p, "wb");
  ASSERT(f != NULL && fwrite(b, 1, n, f) == n);
  fclose(f);
}
static void flip(uint8_t *b, size_t *n) { b[*n / 2] ^= 0x10; }
static void cut(uint8_t *b, size_t *n) { (void)b, *n -= 100; }
static void extra(uint8_t *b, size_t *n) { b[(*n)++] = 0; }
static void magic(uint8_t *b, size_t *n) { (void)n, b[3] = 'X'; }

static void refused(trn_model *m, trn_optim *o, trn_order *d,
                    const char *name, int want, const char *what) {
  char p[160];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  size_t np = trn_model_nparams(m);
  float *keep = malloc(np * 4);
  ASSERT(keep != NULL);
  memcpy(keep, trn_model_params(m), np * 4);
  int rc = trn_ckpt_load(p, m, o, d, NULL, err, sizeof err);
  if (rc != want || !strstr(err, what) || !strstr(err, name))
    FAIL("%s: %d (want %d): %s", name, rc, want, err);
  ASSERT(memcmp(keep, trn_model_params(m), np * 4) == 0);
  free(keep);
}

static void test_bad(void) {
  trn_model *m = new_model(3, 16);
  trn_optim *o = new_optim(TRN_ADAMW, m);
  trn_order d;
  ASSERT_EQ(trn_order_init(&d, N, "x", 1, 0, 0), 0);
  ASSERT_EQ(trn_ckpt_save(path, m, o, &d, NULL, err, sizeof err), 0);
  ASSERT_EQ(trn_ckpt_load(path, m, o, &d, NULL, err, sizeof err), 0);
  variant("flip", flip);
  refused(m, o, &d, "flip", -EBADMSG, "damaged");
  variant("cut", cut);
  refused(m, o, &d, "cut", -EBADMSG, "truncated");
  variant("extra", extra);
  refused(m, o, &d, "extra", -EBADMSG, "data after");
  variant("magic", magic);
  refused(m, o, &d, "magic", -EBADMSG, "not a beed checkpoint");
  refused(m, o, &d, "missing", -ENOENT, "cannot open");
  /* Another model, another optimizer, another dataset. */
  trn_model *m2 = new_model(3, 17);
  trn_optim *o2 = new_optim(TRN_ADAMW, m2);
  char base[160];
  snprintf(base, sizeof base, "%s", strrchr(path, '/') + 1);
  refused(m2, o2, &d, base, -EINVAL, "another model");
  trn_optim *sgd = new_optim(TRN_SGD, m);
  refused(m, sgd, &d, base, -EINVAL, "optimizer");
  trn_order d2;
  ASSERT_EQ(trn_order_init(&d2, N - 1, "x", 1, 0, 0), 0);
  refused(m, o, &d2, base, -EINVAL, "data order");
  /* The state can be skipped (no optimizer given). */
  ASSERT_EQ(trn_ckpt_load(path, m, NULL, NULL, NULL, err, sizeof err), 0);
  printf("bad checkpoints: 8 kinds refused, the model untouched\n");
  trn_order_free(&d);
  trn_order_free(&d2);
  trn_optim_free(o);
  trn_optim_free(o2);
  trn_optim_free(sgd);
  trn_model_free(m);
  trn_model_free(m2);
}

int main(void) {
  snprintf(dir, sizeof dir, "%s/beed-ckpt.XXXXXX",
           getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  ASSERT(mkdtemp(dir) != NULL);
  snprintf(path, sizeof path, "%s/run.ckpt", dir);
  trn_cpu_threads_set(1);
  make_data();
  round_trip(TRN_SGD, "sgd");
  round_trip(TRN_ADAMW, "adamw");
  round_trip(TRN_LAMB, "lamb");
  test_bad();
  trn_images_free(&data);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  ASSERT_EQ(system(cmd), 0);
  return 0;
}
