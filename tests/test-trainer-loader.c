/* test-trainer-loader.c: batches made ahead on the loader's thread are
 * the batches trn_images_batch makes one by one, across epochs, and the
 * order the loader reports for a checkpoint is the place of the next batch
 * the trainer takes.  Freeing a loader whose thread waits for room, and
 * bad arguments, are checked too.
 */
#include "test.h"
#include "trainer.h"

#include <errno.h>
#include <stdint.h>
#include <string.h>

enum { N = 103, B = 10, BATCHES = 40, ONE = 2 * 3 * 4 };
static trn_images d;

static void make(void) {
  d.n = N, d.c = 2, d.h = 3, d.w = 4, d.classes = 10;
  d.pix = malloc(N * ONE);
  d.labels = malloc(N);
  ASSERT(d.pix && d.labels);
  for (size_t i = 0; i < N * ONE; i++)
    d.pix[i] = (uint8_t)(i * 7 + i / 13);
  for (size_t i = 0; i < N; i++)
    d.labels[i] = (uint8_t)(i % 10);
}

int main(void) {
  make();
  const float mean[2] = {0.5f, 0.25f}, sd[2] = {0.2f, 0.4f};
  trn_order start, ref;
  ASSERT_EQ(trn_order_init(&start, N, "peer", 4, 2, 37), 0);
  ASSERT_EQ(trn_order_init(&ref, N, "peer", 4, 2, 37), 0);
  trn_loader *l;
  ASSERT_EQ(trn_loader_new(&d, &start, B, mean, sd, NULL, 3, false, &l), 0);
  static float want_x[B * ONE];
  int32_t want_y[B];
  for (int k = 0; k < BATCHES; k++) {
    if (k == 25) {
      /* A checkpoint now records the place of batch 25: an order made
       * from it gives the batches the reference gives next. */
      trn_order snap, probe;
      ASSERT_EQ(trn_loader_order(l, &snap), 0);
      ASSERT_EQ(trn_order_init(&probe, N, ref.seed, sizeof ref.seed,
                               ref.epoch, ref.pos),
                0);
      for (int i = 0; i < 3 * B; i++)
        ASSERT_UEQ(trn_order_next(&snap), trn_order_next(&probe));
      trn_order_free(&snap);
      trn_order_free(&probe);
    }
    const float *x;
    const int32_t *y;
    ASSERT_EQ(trn_loader_next(l, &x, &y), 0);
    ASSERT_EQ(trn_images_batch(&d, &ref, B, mean, sd, want_x, want_y), 0);
    ASSERT(memcmp(x, want_x, sizeof want_x) == 0);
    ASSERT(memcmp(y, want_y, sizeof want_y) == 0);
  }
  ASSERT(start.epoch == 2 && start.pos == 37); /* the caller's, untouched */
  trn_loader_free(l);
  /* Freed while its thread waits for room. */
  ASSERT_EQ(trn_loader_new(&d, &start, B, NULL, NULL, NULL, 2, false, &l), 0);
  const float *x;
  const int32_t *y;
  ASSERT_EQ(trn_loader_next(l, &x, &y), 0);
  trn_loader_free(l);
  trn_loader_free(NULL);
  /* Pinned memory for a CUDA model: the same batches; pinned where the
   * CUDA runtime sees a device (a lent GPU), else malloc's. */
  int ndev = 0;
  ASSERT_EQ(trn_device_count_cuda(&ndev), 0);
  trn_order again;
  ASSERT_EQ(trn_order_init(&again, N, "peer", 4, 2, 37), 0);
  ASSERT_EQ(trn_loader_new(&d, &start, B, mean, sd, NULL, 3, true, &l), 0);
  for (int k = 0; k < 5; k++) {
    ASSERT_EQ(trn_loader_next(l, &x, &y), 0);
    ASSERT(trn_host_pinned(x) == (ndev > 0));
    ASSERT_EQ(trn_images_batch(&d, &again, B, mean, sd, want_x, want_y), 0);
    ASSERT(memcmp(x, want_x, sizeof want_x) == 0);
  }
  trn_loader_free(l);
  trn_order_free(&again);
  /* trn_host_alloc itself: aligned for any type, writable to the end,
   * plain memory when not asked to pin. */
  for (int pin = 0; pin < 2; pin++) {
    unsigned char *p = trn_host_alloc(1000, pin);
    ASSERT(p != NULL && (uintptr_t)p % 64 == 0);
    ASSERT(trn_host_pinned(p) == (pin && ndev > 0));
    memset(p, 0xa5, 1000);
    trn_host_free(p);
  }
  ASSERT(!trn_host_pinned(NULL));
  trn_host_free(NULL);
  ASSERT(trn_host_alloc(SIZE_MAX - 8, false) == NULL);
  /* Bad arguments. */
  float zero[2] = {0, 1};
  ASSERT_EQ(trn_loader_new(&d, &start, B, mean, zero, NULL, 3, false, &l),
            -EINVAL);
  ASSERT_EQ(trn_loader_new(&d, &start, 0, mean, sd, NULL, 3, false, &l),
            -EINVAL);
  ASSERT_EQ(trn_loader_new(&d, &start, B, mean, sd, NULL, 1, false, &l),
            -EINVAL);
  trn_order other;
  ASSERT_EQ(trn_order_init(&other, N - 1, "x", 1, 0, 0), 0);
  ASSERT_EQ(trn_loader_new(&d, &other, B, mean, sd, NULL, 3, false, &l),
            -EINVAL);
  printf("loader: %d batches of %d over %d items (4 epochs) as made one by "
         "one; the checkpoint's order is the next batch's place; pinned "
         "memory %s\n",
         BATCHES, B, N, ndev > 0 ? "from CUDA" : "not to be had (no GPU)");
  trn_order_free(&other);
  trn_order_free(&start);
  trn_order_free(&ref);
  trn_images_free(&d);
  return 0;
}
