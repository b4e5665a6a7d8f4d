/* bench-train.c: beed's trainer (CPU or CUDA), training samples per
 * second, timed as bench-train-torch.py times PyTorch
 * (tools/bench/run-train, tools/bench/run-train-cuda).
 *
 * Loads Fashion-MNIST's training set, builds the model on --device, and
 * runs --warmup uncounted steps, then --steps timed ones: each a batch
 * taken from the shuffled order (normalized from the bytes, on the calling
 * thread or, with --prefetch D, D batches ahead on the loader's thread),
 * forward and backward, and every --step-every batches an SGD step with
 * momentum 0.9 (trn_model_step: on the model's device) over the
 * gradients accumulated since the last.  On CUDA the batches lie in
 * pinned memory (trn_host_alloc; --pageable: malloc's, to show what that
 * buys), as beed's do.  A line on stderr says what runs
 * the matrix products (the trainer's AVX-512 kernel, or OpenBLAS) and
 * notes when OpenBLAS runs weaker kernels than the CPU has (an
 * OPENBLAS_CORETYPE in the environment).
 * Prints one line: "RESULT impl=beed device=cpu step_every=1 model=mlp
 * batch=B threads=T samples_per_s=... loss=... ... cores=C batch_ms=...
 * pass_ms=...", C being CPU time over wall time in the timed steps,
 * batch_ms the time a step spent making (or waiting for) its batch and
 * pass_ms the time in trn_model_train_batch; pinned=1 when the batches
 * are in pinned memory.
 */
#include "trainer.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* CPU time of every thread of the process, to print the cores a run used. */
static double cpu_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void usage(FILE *f) {
  fprintf(f, "usage: bench-train [--model mlp|cnn|resnet|gpt] [--batch B] [--threads T]\n"
             "                   [--steps N] [--warmup W] [--depth D] [--width C]\n"
             "                   [--data DIR | --data synthetic:CxHxW:K]\n"
             "                   [--print-core] [--device cpu|cuda[:N]]\n"
             "                   [--step-every N] [--prefetch D] [--pageable]\n"
             "                   [--precision fp32|tf32|bf16|fp16]\n"
             "  defaults: mlp 784-256-10 (cnn, resnet: trainer.h's defaults;\n"
             "  --depth, --width set resnet's), batch 256, 1 thread, 400 steps after\n"
             "  20, Fashion-MNIST from " TRN_FASHION_MNIST_DIR ";\n"
             "  synthetic:3x224x224:1000 is ImageNet's shape: 4 batches made\n"
             "  before the clock starts (trn_synthetic_batch); gpt: trainer.h's default on random\n"
             "  tokens, a sample being a window of ctx tokens\n");
}

int main(int argc, char **argv) {
  static const struct option lo[] = {
      {"model", 1, 0, 'm'}, {"batch", 1, 0, 'b'},  {"threads", 1, 0, 't'},
      {"steps", 1, 0, 's'}, {"warmup", 1, 0, 'w'}, {"data", 1, 0, 'd'},
      {"help", 0, 0, 'h'},  {"print-core", 0, 0, 'P'}, {"depth", 1, 0, 'D'},
      {"width", 1, 0, 'W'},   {"device", 1, 0, 'V'},
      {"step-every", 1, 0, 'E'}, {"prefetch", 1, 0, 'F'},
      {"precision", 1, 0, 'R'}, {"pageable", 0, 0, 'G'}, {0, 0, 0, 0}};
  const char *precision = "fp32";
  const char *device = "cpu";
  long step_every = 1, prefetch = 0;
  const char *model = "mlp", *dir = TRN_FASHION_MNIST_DIR;
  long batch = 256, threads = 1, steps = 400, warmup = 20, depth = 0,
       width = 0;
  int c;
  bool data_given = false, pageable = false;
  while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
    switch (c) {
    case 'm': model = optarg; break;
    case 'b': batch = strtol(optarg, NULL, 10); break;
    case 't': threads = strtol(optarg, NULL, 10); break;
    case 's': steps = strtol(optarg, NULL, 10); break;
    case 'w': warmup = strtol(optarg, NULL, 10); break;
    case 'd': dir = optarg, data_given = true; break;
    case 'D': depth = strtol(optarg, NULL, 10); break;
    case 'W': width = strtol(optarg, NULL, 10); break;
    case 'h': usage(stdout); return 0;
    case 'V': device = optarg; break;
    case 'E': step_every = strtol(optarg, NULL, 10); break;
    case 'F': prefetch = strtol(optarg, NULL, 10); break;
    case 'R': precision = optarg; break;
    case 'G': pageable = true; break;
    case 'P': { /* the better OPENBLAS_CORETYPE, or nothing */
      char core[32], why[160];
      if (trn_blas_better_core(core, sizeof core, why, sizeof why) == 1)
        printf("%s\n", core);
      return 0;
    }
    default: usage(stderr); return 2;
    }
  }
  if (batch < 1 || batch > TRN_BATCH_MAX || threads < 1 || threads > 256 ||
      steps < 1 || warmup < 0 || depth < 0 || depth > 1000 ||
      width < 0 || width > 4096) {
    usage(stderr);
    return 2;
  }
  char err[512], core[32];
  /* Say what runs the matrix products, and so when OpenBLAS was made to
   * run weaker kernels than the CPU has (OPENBLAS_CORETYPE in the
   * environment): the figures depend on it. */
  if (trn_blas_better_core(core, sizeof core, err, sizeof err) == 1)
    fprintf(stderr, "bench-train: note: %s\n", err);
  else
    fprintf(stderr, "bench-train: %s\n", err);
  trn_images tr = {0};
  unsigned sc = 0, sh = 0, sw = 0, sk = 0; /* synthetic: its shape */
  int rc = 0;
  bool gpt = strcmp(model, "gpt") == 0;
  if (gpt) { /* random tokens: no data to load */
    if (data_given) {
      fprintf(stderr, "bench-train: gpt trains on random tokens; no --data\n");
      return 2;
    }
  } else if (strncmp(dir, "synthetic:", 10) == 0) {
    int used = 0;
    if (sscanf(dir + 10, "%ux%ux%u:%u%n", &sc, &sh, &sw, &sk, &used) != 4 ||
        dir[10 + used] || !sc || sc > TRN_CHANNELS_MAX || !sh || !sw ||
        sk < 2) {
      fprintf(stderr, "bench-train: --data %s: want synthetic:CxHxW:K, C "
                      "1 to %d, K at least 2\n", dir, TRN_CHANNELS_MAX);
      return 2;
    }
  } else if ((rc = trn_mnist_load(dir, "train", &tr, err, sizeof err))) {
    fprintf(stderr, "bench-train: %s\n", err);
    return 1;
  }
  trn_cpu_threads_set((int)threads);
  trn_model_config mc;
  trn_model_config_default(&mc);
  trn_device dv;
  char why[256];
  if (step_every < 1 || step_every > 1 << 20) {
    fprintf(stderr, "bench-train: --step-every %ld: 1 to 2^20\n",
            step_every);
    return 2;
  }
  if ((rc = trn_device_open(device, &dv, why, sizeof why))) {
    fprintf(stderr, "bench-train: --device %s: %s\n", device, why);
    return 2;
  }
  fprintf(stderr, "bench-train: %s\n", why);
  mc.device = dv.kind, mc.device_index = dv.index;
  if (trn_precision_parse(precision) < 0) {
    fprintf(stderr, "bench-train: --precision %s: fp32, tf32, bf16 or fp16\n",
            precision);
    return 2;
  }
  mc.precision = trn_precision_parse(precision);
  mc.name = model;
  mc.max_batch = (size_t)batch;
  if (depth)
    mc.depth = (unsigned)depth;
  if (width)
    mc.width = (unsigned)width;
  if (sc)
    mc.in_c = sc, mc.in_h = sh, mc.in_w = sw, mc.classes = sk;
  trn_model *m;
  if ((rc = trn_model_new(&mc, &m, err, sizeof err))) {
    fprintf(stderr, "bench-train: %s\n", err);
    return 2;
  }
  if (sc && (size_t)sc * sh * sw != trn_model_inputs(m)) {
    fprintf(stderr, "bench-train: --data %s: %s takes %zu inputs, not "
                    "%ux%ux%u\n", dir, model, trn_model_inputs(m), sc, sh, sw);
    return 2;
  }
  trn_optim_config oc;
  trn_optim_config_default(&oc, TRN_SGD);
  oc.lr = 0.05f, oc.momentum = 0.9f;
  trn_optim *o;
  trn_order ord = {0};
  size_t T = mc.ctx; /* gpt: tokens per sample */
  /* Synthetic data: SYNTH_POOL batches made before the clock starts and
   * taken in turn (making 3x224x224 images on the fly would time the
   * host's random numbers, not training); bench-train-torch.py does the
   * same. */
  enum { SYNTH_POOL = 4 };
  size_t pool = sc ? SYNTH_POOL : 1, nx = (size_t)batch * trn_model_inputs(m);
  bool pinned = dv.kind == TRN_DEV_CUDA && !pageable;
  float *x = trn_host_alloc(pool * nx * sizeof *x, pinned);
  int32_t *y = malloc(pool * (size_t)batch * (gpt ? 2 * T : 1) * sizeof *y);
  for (size_t k = 0; sc && x && y && k < pool && !rc; k++)
    rc = trn_synthetic_batch(1, k * (uint64_t)batch, (size_t)batch, sc, sh, sw,
                             sk, x + k * nx, y + k * (size_t)batch);
  if (!x || !y || rc || trn_optim_new(&oc, trn_model_nparams(m), &o) ||
      (!sc && !gpt && trn_order_init(&ord, tr.n, "bench", 5, 0, 0))) {
    fprintf(stderr, "bench-train: out of memory\n");
    return 1;
  }
  const float mean = 0.2860f, std = 0.3530f;
  trn_loader *ld = NULL; /* --prefetch: batches made on the loader's thread */
  if (prefetch && (sc || gpt || prefetch < 2 || prefetch > 64 ||
                   (rc = trn_loader_new(&tr, &ord, (size_t)batch, &mean, &std,
                                        NULL, (size_t)prefetch, pinned,
                                        &ld)))) {
    fprintf(stderr, "bench-train: --prefetch %ld: 2 to 64, for the image "
                    "models on Fashion-MNIST\n", prefetch);
    return 2;
  }
  double t0 = 0, c0 = 0, loss = 0, prep_s = 0, pass_s = 0;
  uint64_t rng = 1;
  bool was_pinned = false;
  for (long s = -warmup; s < steps; s++) {
    if (s == 0) {
      t0 = now_s();
      c0 = cpu_s();
    }
    double l = 0;
    if (gpt) { /* windows of random tokens and their next tokens */
      int32_t *tx = y, *ty = y + (size_t)batch * T;
      for (size_t i = 0; i < (size_t)batch * T; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        tx[i] = (int32_t)((rng >> 33) % mc.vocab);
        ty[i] = (int32_t)((rng >> 13) % mc.vocab);
      }
      trn_model_zero_grad(m);
      rc = trn_model_train_tokens(m, tx, ty, (size_t)batch, T, &l);
      if (rc == 0)
        rc = trn_model_step(m, o, 1.0f / (float)(batch * (long)T));
      if (rc) {
        fprintf(stderr, "bench-train: step %ld: %s\n", s, strerror(-rc));
        return 1;
      }
      loss = l / (double)(batch * (long)T);
      continue;
    }
    double h0 = now_s();
    const float *lx = x;
    const int32_t *ly = y;
    size_t at = (size_t)(s + warmup) % pool;
    if (sc)
      lx = x + at * nx, ly = y + at * (size_t)batch;
    else
      rc = ld ? trn_loader_next(ld, &lx, &ly)
              : trn_images_batch(&tr, &ord, (size_t)batch, &mean, &std, x, y);
    double h1 = now_s();
    if (rc == 0)
      rc = trn_model_train_batch(m, lx, ly, (size_t)batch, &l);
    was_pinned = trn_host_pinned(ld ? lx : x); /* a block's start */
    double h2 = now_s();
    if (s >= 0)
      prep_s += h1 - h0, pass_s += h2 - h1;
    if (rc == 0 && (s + warmup + 1) % step_every == 0) {
      rc = trn_model_step(m, o, 1.0f / (float)(batch * step_every));
      trn_model_zero_grad(m);
    }
    if (rc) {
      fprintf(stderr, "bench-train: step %ld: %s\n", s, strerror(-rc));
      return 1;
    }
    loss = l / (double)batch;
  }
  double dt = now_s() - t0;
  double cores = (cpu_s() - c0) / dt;
  /* Memory: the peak resident set beside what the model accounts for
   * (parameters, gradients, optimizer state, activations) and the data. */
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  size_t ns;
  trn_optim_state(o, &ns);
  double mib = 1024.0 * 1024.0;
  uint64_t dropped = 0; /* batches loss scaling dropped (warmup's too) */
  float scale = trn_model_loss_scale(m, &dropped);
  double model_mib = (double)((2 * trn_model_nparams(m) + ns) * sizeof(float) +
                              trn_model_activation_bytes(m)) /
                     mib;
  double data_mib = (double)(tr.n * (size_t)tr.c * tr.h * tr.w + tr.n) / mib;
  printf("RESULT impl=beed device=%s precision=%s step_every=%ld model=%s "
         "batch=%ld "
         "threads=%ld steps=%ld "
         "samples_per_s=%.1f loss=%.4f rss_mib=%.1f model_mib=%.1f "
         "data_mib=%.1f cores=%.2f batch_ms=%.3f pass_ms=%.3f "
         "loss_scale=%g dropped=%llu pinned=%d\n",
         dv.kind == TRN_DEV_CUDA ? "cuda" : "cpu", precision, step_every,
         model, batch,
         threads, steps, (double)(steps * batch) / dt, loss,
         (double)ru.ru_maxrss / 1024.0, model_mib, data_mib, cores,
         1e3 * prep_s / (double)steps, 1e3 * pass_s / (double)steps,
         (double)scale, (unsigned long long)dropped,
         was_pinned);
  trn_host_free(x);
  free(y);
  trn_loader_free(ld);
  trn_order_free(&ord);
  trn_optim_free(o);
  trn_model_free(m);
  trn_images_free(&tr);
  return 0;
}
