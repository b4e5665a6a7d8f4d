/* train.c: `train`, one machine's training run with beed's trainer and no
 * swarm: the standalone baseline the collaborative runs are measured
 * against, and the quality check of issue 5 (tools/train/README.md).
 *
 *   train [--model mlp|cnn|resnet|gpt] [--batchnorm] [--epochs E] [--batch B]
 *         [--optim sgd|adamw|lamb]
 *         [--lr LR] [--momentum M] [--weight-decay WD] [--schedule
 *         const|cosine|linear] [--warmup STEPS] [--clip NORM]
 *         [--threads T] [--seed S] [--data DIR] [--checkpoint FILE]
 *         [--resume] [--min-accuracy PCT]
 *         gpt: --tokens FILE --val-tokens FILE [--vocab V] [--ctx T]
 *         [--layers L] [--heads H] [--embd C]
 *         resnet: [--depth 18|20|32|44|56|110] [--width W]
 *
 * Trains on Fashion-MNIST's training set in this run's shuffled order
 * (batches made ahead on a thread of their own), or gpt on windows of a
 * token file; evaluates on the held-out data after every epoch (one line
 * each: loss, accuracy or perplexity, seconds, samples/s), optionally
 * saves a checkpoint after every epoch and resumes from one.  Exits 0, or
 * 1 when the last epoch's accuracy is below --min-accuracy, or when
 * anything fails (the message says what); 2 for a bad flag.
 */
#include "trainer.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct opts {
  const char *model, *data, *ckpt, *tokens, *val_tokens, *device;
  size_t ctx;
  unsigned vocab, layers, heads, embd, depth, width;
  int epochs, threads;
  size_t batch;
  int optim, sched;
  float lr, momentum, wd, clip, min_acc;
  uint64_t warmup, seed;
  bool resume, batchnorm;
  int precision;
  float loss_scale; /* --loss-scale (trn_loss_scale_parse) */
  bool loss_scale_fixed;
} opts;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: train [--model mlp|cnn|resnet|gpt] [--batchnorm] [--epochs E]\n"
          "             [--batch B]\n"
          "             [--optim sgd|adamw|lamb] [--lr LR] [--momentum M]\n"
          "             [--weight-decay WD] [--schedule const|cosine|linear]\n"
          "             [--warmup STEPS] [--clip NORM] [--threads T]\n"
          "             [--seed S] [--data DIR] [--checkpoint FILE]\n"
          "             [--resume] [--min-accuracy PCT]\n"
          "             [--device auto|cpu|cuda[:N]]\n"
          "             [--precision fp32|tf32|bf16|fp16]\n"
          "             [--loss-scale auto|dynamic|dynamic:S|S]\n"
          "             gpt: --tokens FILE --val-tokens FILE [--vocab V]\n"
          "             [--ctx T] [--layers L] [--heads H] [--embd C]\n"
          "             resnet: [--depth 18|20|32|44|56|110] [--width W]\n"
          "  defaults: mlp, 10 epochs, batch 128, sgd with lr 0.05 and\n"
          "  momentum 0.9, constant rate, 1 thread, seed 1, the CPU, the data in\n"
          "  " TRN_FASHION_MNIST_DIR "\n");
}

/* A number from a flag, or exit 2 naming the flag. */
static double num(const char *flag, const char *v, double lo, double hi) {
  char *end;
  errno = 0;
  double x = strtod(v, &end);
  if (errno || end == v || *end || !(x >= lo && x <= hi)) {
    fprintf(stderr, "train: --%s: '%s' is not a number in [%g, %g]\n", flag,
            v, lo, hi);
    exit(2);
  }
  return x;
}

static void parse(int argc, char **argv, opts *o) {
  static const struct option lo[] = {
      {"model", 1, 0, 'm'},    {"epochs", 1, 0, 'e'},
      {"batch", 1, 0, 'b'},    {"optim", 1, 0, 'o'},
      {"lr", 1, 0, 'l'},       {"momentum", 1, 0, 'M'},
      {"weight-decay", 1, 0, 'w'}, {"schedule", 1, 0, 's'},
      {"warmup", 1, 0, 'W'},   {"clip", 1, 0, 'c'},
      {"threads", 1, 0, 't'},  {"seed", 1, 0, 'S'},
      {"data", 1, 0, 'd'},     {"checkpoint", 1, 0, 'k'},
      {"resume", 0, 0, 'r'},   {"min-accuracy", 1, 0, 'a'},
      {"batchnorm", 0, 0, 'n'}, {"tokens", 1, 0, 'T'},
      {"val-tokens", 1, 0, 'V'}, {"vocab", 1, 0, 'v'},
      {"ctx", 1, 0, 'x'},      {"layers", 1, 0, 'L'},
      {"heads", 1, 0, 'H'},    {"embd", 1, 0, 'E'},
      {"depth", 1, 0, 'D'},    {"width", 1, 0, 'R'},
      {"device", 1, 0, 'G'},   {"precision", 1, 0, 'P'},
      {"loss-scale", 1, 0, 'X'},
      {"help", 0, 0, 'h'},     {0, 0, 0, 0}};
  *o = (opts){.model = "mlp", .data = TRN_FASHION_MNIST_DIR, .device = "cpu",
              .epochs = 10,
              .threads = 1, .batch = 128, .optim = TRN_SGD, .lr = 0.05f,
              .momentum = 0.9f, .seed = 1, .vocab = 256, .ctx = 64,
              .layers = 4, .heads = 4, .embd = 128, .depth = 20,
              .width = 16};
  int c;
  while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
    switch (c) {
    case 'm': o->model = optarg; break;
    case 'e': o->epochs = (int)num("epochs", optarg, 1, 10000); break;
    case 'b': o->batch = (size_t)num("batch", optarg, 1, TRN_BATCH_MAX); break;
    case 'o':
      o->optim = !strcmp(optarg, "sgd")     ? TRN_SGD
                 : !strcmp(optarg, "adamw") ? TRN_ADAMW
                 : !strcmp(optarg, "lamb")  ? TRN_LAMB
                                            : 0;
      if (!o->optim) {
        fprintf(stderr, "train: --optim: '%s' (sgd, adamw or lamb)\n", optarg);
        exit(2);
      }
      break;
    case 'l': o->lr = (float)num("lr", optarg, 0, 100); break;
    case 'M': o->momentum = (float)num("momentum", optarg, 0, 0.9999); break;
    case 'w': o->wd = (float)num("weight-decay", optarg, 0, 10); break;
    case 's':
      o->sched = !strcmp(optarg, "const")    ? TRN_SCHED_CONST
                 : !strcmp(optarg, "cosine") ? TRN_SCHED_COSINE
                 : !strcmp(optarg, "linear") ? TRN_SCHED_LINEAR
                                             : -1;
      if (o->sched < 0) {
        fprintf(stderr, "train: --schedule: '%s' (const, cosine, linear)\n",
                optarg);
        exit(2);
      }
      break;
    case 'W': o->warmup = (uint64_t)num("warmup", optarg, 0, 1e9); break;
    case 'c': o->clip = (float)num("clip", optarg, 0, 1e9); break;
    case 't': o->threads = (int)num("threads", optarg, 1, 256); break;
    case 'G': o->device = optarg; break;
    case 'P':
      if ((o->precision = trn_precision_parse(optarg)) < 0) {
        fprintf(stderr, "train: --precision %s: fp32, tf32, bf16 or fp16\n",
                optarg);
        exit(2);
      }
      break;
    case 'X':
      if (trn_loss_scale_parse(optarg, &o->loss_scale, &o->loss_scale_fixed)) {
        fprintf(stderr,
                "train: --loss-scale %s: auto, dynamic, dynamic:S or S (S a "
                "power of two: 65536 or 2^16, 2^-24 to 2^127)\n",
                optarg);
        exit(2);
      }
      break;
    case 'S': o->seed = (uint64_t)num("seed", optarg, 0, 1e15); break;
    case 'd': o->data = optarg; break;
    case 'k': o->ckpt = optarg; break;
    case 'r': o->resume = true; break;
    case 'n': o->batchnorm = true; break;
    case 'T': o->tokens = optarg; break;
    case 'V': o->val_tokens = optarg; break;
    case 'v': o->vocab = (unsigned)num("vocab", optarg, 2, 65536); break;
    case 'x': o->ctx = (size_t)num("ctx", optarg, 1, 8192); break;
    case 'L': o->layers = (unsigned)num("layers", optarg, 1, 64); break;
    case 'H': o->heads = (unsigned)num("heads", optarg, 1, 1024); break;
    case 'E': o->embd = (unsigned)num("embd", optarg, 1, 16384); break;
    case 'D': o->depth = (unsigned)num("depth", optarg, 8, 200); break;
    case 'R': o->width = (unsigned)num("width", optarg, 1, 1024); break;
    case 'a': o->min_acc = (float)num("min-accuracy", optarg, 0, 100); break;
    case 'h': usage(stdout); exit(0);
    default: usage(stderr); exit(2);
    }
  }
  if (optind < argc) {
    fprintf(stderr, "train: unexpected argument '%s'\n", argv[optind]);
    exit(2);
  }
  if (o->resume && !o->ckpt) {
    fprintf(stderr, "train: --resume needs --checkpoint FILE\n");
    exit(2);
  }
}

int main(int argc, char **argv) {
  opts o;
  parse(argc, argv, &o);
  char err[512];
  bool tokens = strcmp(o.model, "gpt") == 0;
  if (tokens && (!o.tokens || !o.val_tokens)) {
    fprintf(stderr, "train: gpt needs --tokens FILE and --val-tokens FILE "
                    "(tools/train/tokenize makes them)\n");
    return 2;
  }
  trn_source_config scfg = {.data = o.data, .tokens = o.tokens,
                            .test_tokens = o.val_tokens, .vocab = o.vocab,
                            .ctx = o.ctx, .batch = o.batch};
  trn_source *src;
  int rc = trn_source_open(&scfg, tokens, &src, err, sizeof err);
  if (rc) {
    fprintf(stderr, "train: %s\n", err);
    return rc == -EINVAL ? 2 : 1;
  }
  trn_cpu_threads_set(o.threads);
  char core[32];
  if (trn_blas_better_core(core, sizeof core, err, sizeof err) == 1)
    fprintf(stderr, "train: note: %s\n", err);
  trn_model_config mc;
  trn_model_config_default(&mc);
  mc.name = o.model;
  mc.max_batch = o.batch;
  mc.seed = o.seed;
  mc.batchnorm = o.batchnorm;
  mc.vocab = o.vocab, mc.ctx = (unsigned)o.ctx, mc.layers = o.layers;
  mc.heads = o.heads, mc.embd = o.embd;
  mc.depth = o.depth, mc.width = o.width; /* resnet, on the images */
  trn_source_fit(src, &mc); /* the images' shape and classes */
  mc.precision = o.precision;
  mc.loss_scale = o.loss_scale;
  mc.loss_scale_fixed = o.loss_scale_fixed;
  trn_device dev;
  if ((rc = trn_device_open(o.device, &dev, err, sizeof err))) {
    fprintf(stderr, "train: --device %s: %s\n", o.device, err);
    return 2;
  }
  fprintf(stderr, "train: %s\n", err);
  mc.device = dev.kind, mc.device_index = dev.index;
  trn_model *m;
  if ((rc = trn_model_new(&mc, &m, err, sizeof err))) {
    fprintf(stderr, "train: %s\n", err);
    return 2;
  }
  trn_optim_config oc;
  trn_optim_config_default(&oc, o.optim);
  oc.lr = o.lr, oc.weight_decay = o.wd;
  if (o.optim == TRN_SGD)
    oc.momentum = o.momentum;
  trn_optim *opt;
  size_t ends[64], ne = trn_model_tensors(m, ends, 64);
  if ((rc = trn_optim_new(&oc, trn_model_nparams(m), &opt)) ||
      (rc = trn_optim_set_tensors(opt, ends, ne < 64 ? ne : 64))) {
    fprintf(stderr, "train: optimizer: %s\n", strerror(-rc));
    return 2;
  }
  char seed[32];
  snprintf(seed, sizeof seed, "train-%llu", (unsigned long long)o.seed);
  trn_order ord;
  if ((rc = trn_order_init(&ord, trn_source_items(src), seed, strlen(seed),
                           0, 0))) {
    fprintf(stderr, "train: %s\n", strerror(-rc));
    return 1;
  }
  uint64_t done[4] = {0}; /* epochs done */
  if (o.resume) {
    if ((rc = trn_ckpt_load(o.ckpt, m, opt, &ord, done, err,
                            sizeof err))) {
      fprintf(stderr, "train: %s\n", err);
      return 1;
    }
    printf("# resumed from %s after epoch %llu\n", o.ckpt,
           (unsigned long long)done[0]);
  }
  rc = trn_source_start(src, &ord, trn_model_device(m) == TRN_DEV_CUDA);
  trn_order_free(&ord);
  if (rc) {
    fprintf(stderr, "train: data loader: %s\n", strerror(-rc));
    return 1;
  }
  size_t steps_per_epoch = trn_source_items(src) / o.batch;
  size_t per = trn_source_per_item(src); /* predictions per sample */
  float scale = 1.0f / (float)(o.batch * per);
  if (steps_per_epoch == 0) {
    fprintf(stderr, "train: fewer items (%zu) than one batch (%zu)\n",
            trn_source_items(src), o.batch);
    return 2;
  }
  trn_sched sc = {.kind = o.sched, .lr = o.lr, .min_lr = 0,
                  .warmup = o.warmup,
                  .total = steps_per_epoch * (uint64_t)o.epochs};
  printf("# %s, %zu parameters, %s, batch %zu, %d thread%s, %d epochs\n",
         o.model, trn_model_nparams(m),
         o.optim == TRN_SGD ? "sgd" : o.optim == TRN_ADAMW ? "adamw" : "lamb",
         o.batch, o.threads, o.threads == 1 ? "" : "s", o.epochs);
  double acc = 0, total_s = 0;
  for (uint64_t e = done[0]; e < (uint64_t)o.epochs; e++) {
    double t0 = now_s(), loss = 0;
    for (size_t s = 0; s < steps_per_epoch; s++) {
      trn_optim_set_lr(opt, trn_sched_lr(&sc, trn_optim_steps(opt)));
      double l = 0;
      trn_model_zero_grad(m);
      rc = trn_source_train(src, m, &l);
      /* A batch loss scaling dropped (its gradients overflowed) takes no
       * step, as PyTorch's GradScaler skips optimizer.step(). */
      bool dropped = !rc && trn_model_skipped(m);
      if (!rc && !dropped && o.clip > 0)
        trn_grad_clip(trn_model_grads(m), trn_model_nparams(m), scale,
                      o.clip);
      if (!rc && !dropped) /* on the model's device */
        rc = trn_model_step(m, opt, scale);
      if (rc) {
        fprintf(stderr, "train: epoch %llu, step %zu: %s\n",
                (unsigned long long)e + 1, s, strerror(-rc));
        return 1;
      }
      loss += l;
    }
    double dt = now_s() - t0, tl;
    total_s += dt;
    if ((rc = trn_source_evaluate(src, m, &tl, &acc))) {
      fprintf(stderr, "train: evaluation: %s\n", strerror(-rc));
      return 1;
    }
    acc *= 100;
    double n = (double)(steps_per_epoch * o.batch);
    if (tokens)
      printf("epoch %llu: train loss %.4f, validation loss %.4f, perplexity "
             "%.2f, next-token accuracy %.2f%%, %.1f s, %.0f tokens/s\n",
             (unsigned long long)e + 1, loss / (n * (double)per), tl, exp(tl),
             acc, dt, n * (double)per / dt);
    else
      printf("epoch %llu: train loss %.4f, test loss %.4f, test accuracy "
             "%.2f%%, %.1f s, %.0f samples/s\n",
             (unsigned long long)e + 1, loss / n, tl, acc, dt, n / dt);
    uint64_t dropped = 0;
    float ls = trn_model_loss_scale(m, &dropped);
    if (ls)
      printf("# loss scale 2^%d, %llu batches dropped so far\n", ilogbf(ls),
             (unsigned long long)dropped);
    fflush(stdout);
    done[0] = e + 1;
    if (o.ckpt) { /* the order at the next batch the trainer takes */
      trn_order at;
      if ((rc = trn_source_order(src, &at)) ||
          (rc = trn_ckpt_save(o.ckpt, m, opt, &at, done, err, sizeof err))) {
        fprintf(stderr, "train: %s\n", rc == -ENOMEM ? "out of memory" : err);
        return 1;
      }
      trn_order_free(&at);
    }
  }
  printf("# %.1f s of training; final %s accuracy %.2f%%\n", total_s,
         tokens ? "next-token" : "test", acc);
  trn_source_free(src);
  trn_optim_free(opt);
  trn_model_free(m);
  if (o.min_acc > 0 && acc < o.min_acc) {
    fprintf(stderr, "train: accuracy %.2f%% is below %.2f%%\n", acc,
            (double)o.min_acc);
    return 1;
  }
  return 0;
}
