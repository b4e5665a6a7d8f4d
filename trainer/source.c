/* source.c: the data a model trains and is tested on (trainer.h,
 * "Sources").
 *
 * One front for the two kinds of data a run uses, so that tools/train and
 * beed choose a model and get its batches alike: labelled images (the IDX
 * files of Fashion-MNIST and MNIST, or CIFAR-10's binary batches, told
 * apart by the files the directory holds), normalized per channel and
 * made ahead by a loader thread; or token windows for gpt, made on the
 * caller's thread (a copy of B T tokens, nothing to hide).  The test set
 * is only read, so evaluation may run on another thread while training
 * goes on.
 */
#include "trainer-int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Each set's training-set mean and deviation per channel (torchvision's
 * usual figures). */
static const float FMNIST_MEAN[] = {0.2860f}, FMNIST_STD[] = {0.3530f};
static const float CIFAR_MEAN[] = {0.4914f, 0.4822f, 0.4465f};
static const float CIFAR_STD[] = {0.2470f, 0.2435f, 0.2616f};

struct trn_source {
  const char *kind;
  bool tokens;
  trn_images tr, te;   /* images */
  const float *mean, *std;
  trn_aug aug;
  trn_tokens ttr, tte; /* tokens; tte.n 0: no test set */
  size_t T, batch;
  trn_order ord;       /* tokens: the training pass */
  trn_loader *ld;      /* images: batches made ahead */
  int32_t *x, *y;      /* tokens: one batch */
};

static bool exists(const char *dir, const char *name) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  if (access(path, F_OK) == 0)
    return true;
  snprintf(path, sizeof path, "%s/%s.gz", dir, name);
  return access(path, F_OK) == 0;
}

/* Loads the token file at path, at least one window of T long. */
static int load_windows(const char *path, uint32_t vocab, size_t T,
                        trn_tokens *out, char *err, size_t len) {
  int rc = trn_tokens_load(path, vocab, out, err, len);
  if (rc == 0 && !trn_tokens_windows(out, T))
    return trn__fail(err, len, -EINVAL,
                     "%s: %zu tokens, fewer than a window of %zu and the "
                     "token after it",
                     path, out->n, T);
  return rc;
}

static int open_tokens(trn_source *s, const trn_source_config *c, char *err,
                       size_t len) {
  int rc;
  s->kind = "tokens";
  if (!c->tokens)
    return trn__fail(err, len, -EINVAL,
                     "gpt trains on a token file, and none was named");
  if ((rc = load_windows(c->tokens, c->vocab, s->T, &s->ttr, err, len)) ||
      (c->test_tokens && (rc = load_windows(c->test_tokens, c->vocab, s->T,
                                            &s->tte, err, len))))
    return rc;
  s->x = malloc(c->batch * s->T * sizeof *s->x);
  s->y = malloc(c->batch * s->T * sizeof *s->y);
  return s->x && s->y ? 0 : trn__fail(err, len, -ENOMEM, "out of memory");
}

static int open_images(trn_source *s, const trn_source_config *c, char *err,
                       size_t len) {
  int rc;
  const char *dir = c->data ? c->data : TRN_FASHION_MNIST_DIR;
  if (exists(dir, "data_batch_1.bin")) {
    s->kind = "CIFAR-10";
    s->mean = CIFAR_MEAN, s->std = CIFAR_STD;
    if ((rc = trn_cifar10_load(dir, "train", &s->tr, err, len)))
      return rc;
    rc = trn_cifar10_load(dir, "test", &s->te, err, len);
  } else {
    s->kind = "Fashion-MNIST/MNIST";
    s->mean = FMNIST_MEAN, s->std = FMNIST_STD;
    if ((rc = trn_mnist_load(dir, "train", &s->tr, err, len)))
      return rc;
    rc = trn_mnist_load(dir, "t10k", &s->te, err, len);
  }
  if (rc == 0 && (s->te.c != s->tr.c || s->te.h != s->tr.h ||
                  s->te.w != s->tr.w || s->te.classes != s->tr.classes))
    return trn__fail(err, len, -EINVAL,
                     "%s: the test images (%ux%ux%u) are not shaped as the "
                     "training images (%ux%ux%u)",
                     dir, s->te.c, s->te.h, s->te.w, s->tr.c, s->tr.h,
                     s->tr.w);
  if (rc == 0 && c->aug.pad >= s->tr.h)
    return trn__fail(err, len, -EINVAL,
                     "a crop padding of %u is not below the images' %u rows",
                     c->aug.pad, s->tr.h);
  return rc;
}

int trn_source_open(const trn_source_config *c, bool tokens,
                    trn_source **out, char *err, size_t len) {
  *out = NULL;
  if (!c->batch || c->batch > TRN_BATCH_MAX)
    return trn__fail(err, len, -EINVAL, "a batch of %zu (want 1 to %d)",
                     c->batch, TRN_BATCH_MAX);
  if (tokens && !c->ctx)
    return trn__fail(err, len, -EINVAL, "a window of 0 tokens");
  trn_source *s = calloc(1, sizeof *s);
  if (!s)
    return trn__fail(err, len, -ENOMEM, "out of memory");
  s->tokens = tokens;
  s->batch = c->batch;
  s->T = c->ctx;
  s->aug = c->aug;
  int rc = tokens ? open_tokens(s, c, err, len) : open_images(s, c, err, len);
  if (rc) {
    trn_source_free(s);
    return rc;
  }
  *out = s;
  return 0;
}

void trn_source_free(trn_source *s) {
  if (!s)
    return;
  trn_loader_free(s->ld); /* before the images it reads */
  trn_order_free(&s->ord);
  trn_images_free(&s->tr);
  trn_images_free(&s->te);
  trn_tokens_free(&s->ttr);
  trn_tokens_free(&s->tte);
  free(s->x);
  free(s->y);
  free(s);
}

const char *trn_source_kind(const trn_source *s) { return s->kind; }

size_t trn_source_items(const trn_source *s) {
  return s->tokens ? trn_tokens_windows(&s->ttr, s->T) : s->tr.n;
}

size_t trn_source_test_items(const trn_source *s) {
  return s->tokens ? trn_tokens_windows(&s->tte, s->T) : s->te.n;
}

size_t trn_source_per_item(const trn_source *s) {
  return s->tokens ? s->T : 1;
}

void trn_source_fit(const trn_source *s, trn_model_config *mc) {
  if (s->tokens) {
    mc->vocab = s->ttr.vocab;
    mc->ctx = (unsigned)s->T;
    return;
  }
  mc->in_c = s->tr.c, mc->in_h = s->tr.h, mc->in_w = s->tr.w;
  mc->classes = s->tr.classes;
  if (mc->nsizes >= 2) {
    mc->sizes[0] = s->tr.c * s->tr.h * s->tr.w;
    mc->sizes[mc->nsizes - 1] = s->tr.classes;
  }
}

int trn_source_start(trn_source *s, const trn_order *from, bool pinned) {
  if (from->n != trn_source_items(s) || s->ld || s->ord.idx)
    return -EINVAL;
  if (!s->tokens) {
    bool aug = s->aug.pad || s->aug.flip;
    return trn_loader_new(&s->tr, from, s->batch, s->mean, s->std,
                          aug ? &s->aug : NULL, 4, pinned, &s->ld);
  }
  return trn_order_init(&s->ord, from->n, from->seed, sizeof from->seed,
                        from->epoch, from->pos);
}

int trn_source_train(trn_source *s, trn_model *m, double *loss) {
  if (s->tokens) {
    if (!s->ord.idx)
      return -EINVAL;
    int rc = trn_tokens_batch(&s->ttr, &s->ord, s->batch, s->T, s->x, s->y);
    return rc ? rc
              : trn_model_train_tokens(m, s->x, s->y, s->batch, s->T, loss);
  }
  if (!s->ld)
    return -EINVAL;
  const float *x;
  const int32_t *y;
  int rc = trn_loader_next(s->ld, &x, &y);
  return rc ? rc : trn_model_train_batch(m, x, y, s->batch, loss);
}

int trn_source_order(trn_source *s, trn_order *out) {
  if (s->ld)
    return trn_loader_order(s->ld, out);
  if (!s->ord.idx)
    return -EINVAL;
  return trn_order_init(out, s->ord.n, s->ord.seed, sizeof s->ord.seed,
                        s->ord.epoch, s->ord.pos);
}

int trn_source_evaluate(const trn_source *s, trn_model *m, double *loss,
                        double *accuracy) {
  if (!trn_source_test_items(s))
    return -ENOENT;
  if (s->tokens)
    return trn_model_evaluate_tokens(m, &s->tte, s->T, loss, accuracy);
  return trn_model_evaluate(m, &s->te, s->mean, s->std, loss, accuracy);
}
