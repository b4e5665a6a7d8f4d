/* loader.c: batches made ahead on a thread of their own (trainer.h,
 * "Data").
 *
 * A worker thread takes an image dataset's items in an order and fills a
 * ring of `depth` batches while the trainer computes on the one it holds,
 * so making a batch (gathering, normalizing) costs the training loop
 * nothing.  The batches come out in exactly the order trn_images_batch
 * would make them one by one.  Every batch takes `batch` items of the
 * order, so the place of the next batch the trainer will take (what a
 * checkpoint records, not the place of the ones made ahead) is the start
 * plus that many items per batch taken.
 */
#include "trainer-int.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct slot {
  float *x;   /* (batch, c h w) */
  int32_t *y; /* (batch) */
} slot;

struct trn_loader {
  const trn_images *d;
  trn_order order; /* the worker's, ahead of the trainer */
  uint64_t start_epoch; /* where the trainer started in the order */
  size_t start_pos;
  uint64_t ntaken; /* batches the trainer has taken (the held one too) */
  size_t batch;
  float mean[TRN_CHANNELS_MAX], std[TRN_CHANNELS_MAX];
  trn_aug aug;
  bool has_aug;
  slot *ring;
  size_t depth;
  size_t head, count; /* the oldest made batch, batches made */
  bool held;          /* the trainer holds ring[head] */
  bool stop;
  int error;
  pthread_mutex_t mu;
  pthread_cond_t made, taken;
  pthread_t th;
};

static void *worker(void *arg) {
  trn_loader *l = arg;
  pthread_mutex_lock(&l->mu);
  for (;;) {
    /* A free slot: not made and not held by the trainer. */
    while (!l->stop && l->count == l->depth)
      pthread_cond_wait(&l->taken, &l->mu);
    if (l->stop)
      break;
    slot *s = &l->ring[(l->head + l->count) % l->depth];
    pthread_mutex_unlock(&l->mu);
    int rc = trn_images_batch_aug(l->d, &l->order, l->batch, l->mean, l->std,
                                  l->has_aug ? &l->aug : NULL, s->x, s->y);
    pthread_mutex_lock(&l->mu);
    if (rc) {
      l->error = rc;
      pthread_cond_broadcast(&l->made);
      break;
    }
    l->count++;
    pthread_cond_broadcast(&l->made);
  }
  pthread_mutex_unlock(&l->mu);
  return NULL;
}

int trn_loader_new(const trn_images *d, const trn_order *from, size_t batch,
                   const float *mean, const float *std, const trn_aug *aug,
                   size_t depth, bool pinned, trn_loader **out) {
  *out = NULL;
  if (!d->n || from->n != d->n || batch == 0 || batch > TRN_BATCH_MAX ||
      depth < 2 || depth > 64 || d->c == 0 || d->c > TRN_CHANNELS_MAX ||
      (aug && (aug->pad > d->h || aug->pad > d->w)))
    return -EINVAL;
  for (unsigned c = 0; c < d->c; c++)
    if (std && !(std[c] > 0))
      return -EINVAL;
  trn_loader *l = calloc(1, sizeof *l);
  if (!l)
    return -ENOMEM;
  int rc = -ENOMEM;
  l->d = d;
  l->batch = batch;
  if (aug)
    l->aug = *aug, l->has_aug = true;
  l->depth = depth;
  for (unsigned c = 0; c < d->c; c++) {
    l->mean[c] = mean ? mean[c] : 0;
    l->std[c] = std ? std[c] : 1;
  }
  size_t one = (size_t)d->c * d->h * d->w;
  if (!(l->ring = calloc(depth, sizeof *l->ring)))
    goto fail;
  for (size_t i = 0; i < depth; i++)
    if (!(l->ring[i].x =
              trn_host_alloc(batch * one * sizeof(float), pinned)) ||
        !(l->ring[i].y = malloc(batch * sizeof(int32_t))))
      goto fail;
  /* The worker's own copy of the order, from the caller's place. */
  if ((rc = trn_order_init(&l->order, from->n, from->seed, sizeof from->seed,
                           from->epoch, from->pos)))
    goto fail;
  l->start_epoch = from->epoch;
  l->start_pos = from->pos;
  pthread_mutex_init(&l->mu, NULL);
  pthread_cond_init(&l->made, NULL);
  pthread_cond_init(&l->taken, NULL);
  if ((rc = -pthread_create(&l->th, NULL, worker, l))) {
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->made);
    pthread_cond_destroy(&l->taken);
    trn_order_free(&l->order);
    goto fail;
  }
  *out = l;
  return 0;
fail:
  for (size_t i = 0; l->ring && i < depth; i++) {
    trn_host_free(l->ring[i].x);
    free(l->ring[i].y);
  }
  free(l->ring);
  free(l);
  return rc;
}

int trn_loader_next(trn_loader *l, const float **x, const int32_t **y) {
  pthread_mutex_lock(&l->mu);
  if (l->held) { /* the trainer is done with the last one */
    l->held = false;
    l->head = (l->head + 1) % l->depth;
    l->count--;
    pthread_cond_signal(&l->taken);
  }
  while (l->count == 0 && !l->error)
    pthread_cond_wait(&l->made, &l->mu);
  int rc = l->count ? 0 : l->error;
  if (!rc) {
    l->held = true;
    l->ntaken++;
    *x = l->ring[l->head].x;
    *y = l->ring[l->head].y;
  }
  pthread_mutex_unlock(&l->mu);
  return rc;
}

int trn_loader_order(trn_loader *l, trn_order *out) {
  pthread_mutex_lock(&l->mu);
  uint64_t taken = l->ntaken;
  pthread_mutex_unlock(&l->mu);
  /* The next batch to take starts taken x batch items after the start. */
  size_t n = l->order.n;
  uint64_t items = (uint64_t)l->start_pos + taken * l->batch;
  return trn_order_init(out, n, l->order.seed, sizeof l->order.seed,
                        l->start_epoch + items / n, (size_t)(items % n));
}

void trn_loader_free(trn_loader *l) {
  if (!l)
    return;
  pthread_mutex_lock(&l->mu);
  l->stop = true;
  pthread_cond_broadcast(&l->taken);
  pthread_mutex_unlock(&l->mu);
  pthread_join(l->th, NULL);
  pthread_mutex_destroy(&l->mu);
  pthread_cond_destroy(&l->made);
  pthread_cond_destroy(&l->taken);
  for (size_t i = 0; i < l->depth; i++) {
    trn_host_free(l->ring[i].x);
    free(l->ring[i].y);
  }
  free(l->ring);
  trn_order_free(&l->order);
  free(l);
}
