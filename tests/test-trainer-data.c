/* test-trainer-data.c: the trainer's data: IDX files, MNIST-format
 * datasets, each peer's shuffled order and batches.
 *
 * The real Fashion-MNIST (Debian's dataset-fashion-mnist, which
 * tools/setup installs) must load with its known sizes, class counts and
 * first labels and pixels.  Then hand-made files in a temporary folder,
 * gzip and plain: a good one loads, and each bad one (wrong magic, zero or
 * huge dimension, truncated, trailing bytes, a label out of range, a
 * label count that does not match, a broken gzip stream, an empty file, a
 * missing one) is refused with its code and a message that names the file
 * and the offset.  Orders are permutations, the same for the same seed
 * and epoch, different otherwise, and resume from (seed, epoch, pos).
 */
#include "test.h"
#include "trainer.h"

#include <errno.h>
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

static char dir[64];
static char err[512];

/* Writes bytes to dir/name, gzip-compressed when name ends in ".gz". */
static void put(const char *name, const uint8_t *p, size_t n) {
  char path[128];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  size_t len = strlen(name);
  if (len > 3 && strcmp(name + len - 3, ".gz") == 0) {
    gzFile f = gzopen(path, "wb");
    ASSERT(f != NULL);
    ASSERT(n == 0 || gzwrite(f, p, (unsigned)n) == (int)n);
    ASSERT_EQ(gzclose(f), Z_OK);
  } else {
    FILE *f = fopen(path, "wb");
    ASSERT(f != NULL);
    ASSERT(n == 0 || fwrite(p, 1, n, f) == n);
    ASSERT_EQ(fclose(f), 0);
  }
}

/* An IDX header of unsigned bytes with nd dimensions into b; returns its
 * length. */
static size_t header(uint8_t *b, int nd, const uint32_t *dims) {
  b[0] = b[1] = 0, b[2] = 8, b[3] = (uint8_t)nd;
  for (int i = 0; i < nd; i++)
    for (int k = 0; k < 4; k++)
      b[4 + 4 * i + k] = (uint8_t)(dims[i] >> (24 - 8 * k));
  return 4 + 4 * (size_t)nd;
}

/* A split "x" of n images 2x3 (pixel = 10 i + j) and n labels (i % 4),
 * gzip or plain. */
static void put_split(const char *split, size_t n, bool gz) {
  uint8_t b[1024];
  char name[64];
  uint32_t d[3] = {(uint32_t)n, 2, 3};
  size_t h = header(b, 3, d);
  for (size_t i = 0; i < n; i++)
    for (size_t j = 0; j < 6; j++)
      b[h + 6 * i + j] = (uint8_t)(10 * i + j);
  snprintf(name, sizeof name, "%s-images-idx3-ubyte%s", split, gz ? ".gz" : "");
  put(name, b, h + 6 * n);
  h = header(b, 1, d);
  for (size_t i = 0; i < n; i++)
    b[h + i] = (uint8_t)(i % 4);
  snprintf(name, sizeof name, "%s-labels-idx1-ubyte%s", split, gz ? ".gz" : "");
  put(name, b, h + n);
}

/* err says rc's case: it names the file and holds `what`. */
static void refused(int rc, int want, const char *file, const char *what) {
  if (rc != want)
    FAIL("%s: got %d (%s), want %d: %s", file, rc, strerror(-rc), want, err);
  if (!strstr(err, file) || !strstr(err, what))
    FAIL("message for %s lacks \"%s\" or the file: %s", file, what, err);
}

static void test_fashion(void) {
  trn_images tr, te;
  int rc = trn_mnist_load(TRN_FASHION_MNIST_DIR, "train", &tr, err, sizeof err);
  if (rc == -ENOENT) {
    printf("SKIP fashion-mnist: %s (tools/setup installs it)\n", err);
    return;
  }
  ASSERT_EQ(rc, 0);
  ASSERT_EQ(trn_mnist_load(TRN_FASHION_MNIST_DIR, "t10k", &te, err, sizeof err),
            0);
  ASSERT_UEQ(tr.n, 60000);
  ASSERT_UEQ(te.n, 10000);
  ASSERT(tr.c == 1 && tr.h == 28 && tr.w == 28 && tr.classes == 10);
  ASSERT(te.c == 1 && te.h == 28 && te.w == 28);
  /* Known values, from Python's gzip reading the same files. */
  static const uint8_t first_tr[10] = {9, 0, 0, 3, 0, 2, 7, 2, 5, 5};
  static const uint8_t first_te[10] = {9, 2, 1, 1, 6, 1, 4, 6, 5, 7};
  ASSERT(memcmp(tr.labels, first_tr, 10) == 0);
  ASSERT(memcmp(te.labels, first_te, 10) == 0);
  uint64_t sum = 0;
  for (size_t j = 0; j < 784; j++)
    sum += tr.pix[j];
  ASSERT_UEQ(sum, 76247);
  ASSERT_EQ(tr.pix[14 * 28 + 14], 217);
  ASSERT_EQ(te.pix[14 * 28 + 14], 110);
  size_t count[10] = {0};
  for (size_t i = 0; i < tr.n; i++)
    count[tr.labels[i]]++;
  for (int c = 0; c < 10; c++)
    ASSERT_UEQ(count[c], 6000);
  printf("fashion-mnist: 60000 + 10000 images of 28x28, 6000 per class\n");
  trn_images_free(&tr);
  trn_images_free(&te);
}

static void test_files(void) {
  trn_images d;
  trn_idx x;
  uint8_t b[256];
  uint32_t dims[3] = {3, 2, 3};
  size_t h;

  /* Good, gzip and plain. */
  put_split("train", 5, true);
  put_split("t10k", 4, false);
  ASSERT_EQ(trn_mnist_load(dir, "train", &d, err, sizeof err), 0);
  ASSERT(d.n == 5 && d.c == 1 && d.h == 2 && d.w == 3);
  ASSERT(d.pix[6 * 4 + 5] == 45 && d.labels[3] == 3);
  trn_images_free(&d);
  ASSERT_EQ(trn_mnist_load(dir, "t10k", &d, err, sizeof err), 0);
  ASSERT(d.n == 4 && d.pix[6 * 3 + 2] == 32);
  trn_images_free(&d);
  ASSERT_EQ(trn_mnist_load(dir, "test", &d, err, sizeof err), -EINVAL);
  ASSERT(d.pix == NULL);

  /* Bad IDX files, each on its own. */
  char path[128];
#define CHECK_IDX(name, want, what)                                            \
  do {                                                                         \
    snprintf(path, sizeof path, "%s/%s", dir, name);                           \
    int rc_ = trn_idx_read(path, &x, err, sizeof err);                         \
    refused(rc_, want, name, what);                                            \
    ASSERT(x.data == NULL && x.len == 0);                                      \
  } while (0)
  h = header(b, 3, dims);
  memset(b + h, 7, 18);
  b[2] = 9; /* not unsigned bytes */
  put("magic.gz", b, h + 18);
  CHECK_IDX("magic.gz", -EBADMSG, "offset 0: bad IDX magic 00 00 09 03");
  b[2] = 8, b[3] = 5; /* too many dimensions */
  put("dims5", b, h + 18);
  CHECK_IDX("dims5", -EBADMSG, "offset 0");
  b[3] = 3;
  put("trunc.gz", b, h + 17);
  CHECK_IDX("trunc.gz", -EBADMSG, "offset 33: truncated");
  put("trail.gz", b, h + 19);
  CHECK_IDX("trail.gz", -EBADMSG, "offset 34: data after");
  put("head.gz", b, 9);
  CHECK_IDX("head.gz", -EBADMSG, "offset 9: truncated in the header");
  put("empty", b, 0);
  CHECK_IDX("empty", -EBADMSG, "shorter than an IDX header");
  uint32_t zero[3] = {3, 0, 3};
  put("zero.gz", b, header(b, 3, zero));
  CHECK_IDX("zero.gz", -EBADMSG, "offset 8: dimension 1 is 0");
  uint32_t huge[3] = {0xffffffffu, 0xffffffffu, 16};
  put("huge.gz", b, header(b, 3, huge));
  CHECK_IDX("huge.gz", -EFBIG, "offset 8: dimension 1");
  /* A gzip stream whose compressed bytes are damaged. */
  h = header(b, 3, dims);
  memset(b + h, 7, 18);
  put("crc.gz", b, h + 18);
  snprintf(path, sizeof path, "%s/crc.gz", dir);
  FILE *f = fopen(path, "r+b");
  ASSERT(f != NULL);
  ASSERT_EQ(fseek(f, 12, SEEK_SET), 0);
  ASSERT_EQ(fputc(0xff, f), 0xff);
  ASSERT_EQ(fseek(f, -8, SEEK_END), 0); /* the CRC */
  ASSERT_EQ(fputc(0x5a, f), 0x5a);
  ASSERT_EQ(fclose(f), 0);
  int rc = trn_idx_read(path, &x, err, sizeof err);
  if (rc != -EIO && rc != -EBADMSG)
    FAIL("damaged gzip: %d: %s", rc, err);
  ASSERT(strstr(err, "crc.gz") != NULL);
  CHECK_IDX("missing.gz", -ENOENT, "cannot open");
#undef CHECK_IDX

  /* Datasets whose files disagree. */
  put_split("train", 5, true);
  h = header(b, 1, (uint32_t[]){5});
  memset(b + h, 1, 5);
  b[h + 2] = 10; /* item 2 out of range */
  put("train-labels-idx1-ubyte.gz", b, h + 5);
  ASSERT_EQ(trn_mnist_load(dir, "train", &d, err, sizeof err), -EBADMSG);
  refused(-EBADMSG, -EBADMSG, "train-labels-idx1-ubyte.gz",
          "offset 10: label 10 of item 2 is out of range 0..9");
  ASSERT(d.pix == NULL && d.labels == NULL);
  h = header(b, 1, (uint32_t[]){4});
  memset(b + h, 1, 4);
  put("train-labels-idx1-ubyte.gz", b, h + 4);
  ASSERT_EQ(trn_mnist_load(dir, "train", &d, err, sizeof err), -EBADMSG);
  ASSERT(strstr(err, "4 labels for the 5 images") != NULL);
  put("train-labels-idx1-ubyte.gz", b, header(b, 3, dims) + 18);
  ASSERT_EQ(trn_mnist_load(dir, "train", &d, err, sizeof err), -EBADMSG);
  ASSERT(strstr(err, "3 dimensions, labels need 1") != NULL);
  ASSERT_EQ(trn_mnist_load("/nonexistent-beed", "train", &d, err, sizeof err),
            -ENOENT);
  ASSERT(strstr(err, "/nonexistent-beed/train-images-idx3-ubyte.gz") != NULL);
  printf("files: good ones load (gzip and plain), 13 bad ones refused with "
         "file and offset\n");
}

/* CIFAR-10's binary format: records of a label and 3 x 32 x 32 bytes. */
static void test_cifar(void) {
  static uint8_t b[4 * 3073];
  char name[32];
  for (int f = 1; f <= 5; f++) {
    for (int r = 0; r < 4; r++) {
      b[r * 3073] = (uint8_t)((f + r) % 10);
      for (int j = 1; j < 3073; j++)
        b[r * 3073 + j] = (uint8_t)(f * 31 + r * 7 + j);
    }
    snprintf(name, sizeof name, "data_batch_%d.bin", f);
    put(name, b, (size_t)(f == 3 ? 2 : 4) * 3073);
  }
  put("test_batch.bin", b, 3073);
  trn_images d;
  ASSERT_EQ(trn_cifar10_load(dir, "train", &d, err, sizeof err), 0);
  ASSERT(d.n == 18 && d.c == 3 && d.h == 32 && d.w == 32 && d.classes == 10);
  /* Record 9 is file 3's second (file 3 holds two): label 4, pixel 0. */
  ASSERT_EQ(d.labels[9], 4);
  ASSERT_EQ(d.pix[9 * 3072], (uint8_t)(3 * 31 + 7 + 1));
  ASSERT_EQ(d.pix[9 * 3072 + 2 * 1024 + 5], (uint8_t)(3 * 31 + 7 + 2049 + 5));
  trn_images_free(&d);
  ASSERT_EQ(trn_cifar10_load(dir, "test", &d, err, sizeof err), 0);
  ASSERT(d.n == 1);
  trn_images_free(&d);
  put("data_batch_2.bin", b, 3073 + 100);
  ASSERT_EQ(trn_cifar10_load(dir, "train", &d, err, sizeof err), -EBADMSG);
  refused(-EBADMSG, -EBADMSG, "data_batch_2.bin",
          "offset 3073: truncated record 1");
  ASSERT(d.pix == NULL && d.n == 0);
  b[3073] = 10;
  put("data_batch_2.bin", b, 2 * 3073);
  ASSERT_EQ(trn_cifar10_load(dir, "train", &d, err, sizeof err), -EBADMSG);
  refused(-EBADMSG, -EBADMSG, "data_batch_2.bin",
          "offset 3073: label 10 of record 1");
  put("data_batch_2.bin", b, 0);
  ASSERT_EQ(trn_cifar10_load(dir, "train", &d, err, sizeof err), -EBADMSG);
  ASSERT(strstr(err, "empty") != NULL);
  ASSERT_EQ(trn_cifar10_load(dir, "valid", &d, err, sizeof err), -EINVAL);
  ASSERT_EQ(trn_cifar10_load("/nonexistent-beed", "test", &d, err, sizeof err),
            -ENOENT);
  printf("cifar-10: 5 training files and the test file load; truncated, "
         "out-of-range and empty files refused with file and offset\n");
}

static bool same(const trn_order *a, const trn_order *b) {
  return a->n == b->n && memcmp(a->idx, b->idx, a->n * sizeof *a->idx) == 0;
}

static void test_order(void) {
  const size_t n = 1000;
  trn_order a, b, c;
  ASSERT_EQ(trn_order_init(&a, n, "peer-a", 6, 0, 0), 0);
  ASSERT_EQ(trn_order_init(&b, n, "peer-a", 6, 0, 0), 0);
  ASSERT_EQ(trn_order_init(&c, n, "peer-b", 6, 0, 0), 0);
  /* A permutation, the same for the same seed, another for another. */
  bool seen[1000] = {false};
  for (size_t i = 0; i < n; i++) {
    ASSERT(a.idx[i] < n && !seen[a.idx[i]]);
    seen[a.idx[i]] = true;
  }
  ASSERT(same(&a, &b));
  ASSERT(!same(&a, &c));
  /* The pass ends and the next epoch's order starts: another permutation,
   * the one a fresh order at epoch 1 has. */
  for (size_t i = 0; i < n; i++)
    ASSERT_UEQ(trn_order_next(&a), b.idx[i]);
  trn_order_next(&a);
  ASSERT_UEQ(a.epoch, 1);
  trn_order_free(&c);
  ASSERT_EQ(trn_order_init(&c, n, "peer-a", 6, 1, 1), 0);
  ASSERT(same(&a, &c) && !same(&a, &b));
  /* Resuming from (seed, epoch, pos) continues the same stream. */
  for (size_t i = 0; i < 2 * n; i++)
    ASSERT_UEQ(trn_order_next(&a), trn_order_next(&c));
  trn_order_free(&c);
  ASSERT_EQ(trn_order_init(&c, n, "peer-a", 6, a.epoch, a.pos), 0);
  for (size_t i = 0; i < 3 * n / 2; i++)
    ASSERT_UEQ(trn_order_next(&a), trn_order_next(&c));
  trn_order_free(&c);
  ASSERT_EQ(trn_order_init(&c, 0, "x", 1, 0, 0), -EINVAL);
  ASSERT_EQ(trn_order_init(&c, 10, "x", 1, 0, 11), -EINVAL);
  ASSERT_EQ(trn_order_init(&c, 10, NULL, 1, 0, 0), -EINVAL);
  trn_order_free(&a);
  trn_order_free(&b);
  printf("order: permutations, per seed and epoch, resumable\n");
}

static void test_batch(void) {
  trn_images d;
  put_split("t10k", 4, true);
  ASSERT_EQ(trn_mnist_load(dir, "t10k", &d, err, sizeof err), 0);
  trn_order o;
  ASSERT_EQ(trn_order_init(&o, d.n, "s", 1, 0, 0), 0);
  float x[6 * 6], mean = 0.25f, sd = 0.5f;
  int32_t y[6];
  ASSERT_EQ(trn_images_batch(&d, &o, 6, &mean, &sd, x, y), 0);
  trn_order ref;
  ASSERT_EQ(trn_order_init(&ref, d.n, "s", 1, 0, 0), 0);
  for (size_t i = 0; i < 6; i++) {
    size_t k = trn_order_next(&ref);
    ASSERT_EQ(y[i], (int32_t)(k % 4));
    for (size_t j = 0; j < 6; j++) {
      float want = ((float)(10 * k + j) / 255.0f - mean) / sd;
      ASSERT(x[6 * i + j] == want);
    }
  }
  float bad = 0;
  ASSERT_EQ(trn_images_batch(&d, &o, 1, &mean, &bad, x, y), -EINVAL);
  bad = NAN;
  ASSERT_EQ(trn_images_batch(&d, &o, 1, &bad, &sd, x, y), -EINVAL);
  ASSERT_EQ(trn_images_batch(&d, &o, 0, &mean, &sd, x, y), -EINVAL);
  trn_order_free(&ref);
  trn_order_free(&o);
  trn_images_free(&d);
  printf("batch: the order's items, normalized as torchvision does\n");
}

/* Token files: llm.c's header, uint16 tokens, windows for a model. */
static void test_tokens(void) {
  static uint8_t b[1024 + 2 * 101];
  memset(b, 0, sizeof b);
  uint32_t h[3] = {20240520u, 1, 101};
  for (int i = 0; i < 3; i++)
    for (int k = 0; k < 4; k++)
      b[4 * i + k] = (uint8_t)(h[i] >> 8 * k);
  for (int i = 0; i < 101; i++)
    b[1024 + 2 * i] = (uint8_t)(i * 3 % 50), b[1024 + 2 * i + 1] = 0;
  put("tok.bin", b, sizeof b);
  put("tok.bin.gz", b, sizeof b);
  char p[128];
  snprintf(p, sizeof p, "%s/tok.bin.gz", dir);
  trn_tokens t;
  ASSERT_EQ(trn_tokens_load(p, 50, &t, err, sizeof err), 0);
  ASSERT(t.n == 101 && t.tok[7] == 21 && t.vocab == 50);
  ASSERT_UEQ(trn_tokens_windows(&t, 10), 10);
  trn_order o;
  ASSERT_EQ(trn_order_init(&o, 10, "t", 1, 0, 0), 0);
  int32_t x[2 * 10], y[2 * 10];
  ASSERT_EQ(trn_tokens_batch(&t, &o, 2, 10, x, y), 0);
  trn_order r;
  ASSERT_EQ(trn_order_init(&r, 10, "t", 1, 0, 0), 0);
  for (int w = 0; w < 2; w++) {
    size_t start = trn_order_next(&r) * 10;
    for (int i = 0; i < 10; i++) {
      ASSERT_EQ(x[w * 10 + i], t.tok[start + (size_t)i]);
      ASSERT_EQ(y[w * 10 + i], t.tok[start + (size_t)i + 1]);
    }
  }
  trn_order_free(&r);
  ASSERT_EQ(trn_tokens_batch(&t, &o, 2, 9, x, y), -EINVAL);
  trn_order_free(&o);
  trn_tokens_free(&t);
  snprintf(p, sizeof p, "%s/tok.bin", dir);
  ASSERT_EQ(trn_tokens_load(p, 49, &t, err, sizeof err), -EBADMSG);
  refused(-EBADMSG, -EBADMSG, "tok.bin", "is not below the vocabulary's 49");
  put("tok-cut.bin", b, sizeof b - 1);
  snprintf(p, sizeof p, "%s/tok-cut.bin", dir);
  ASSERT_EQ(trn_tokens_load(p, 50, &t, err, sizeof err), -EBADMSG);
  refused(-EBADMSG, -EBADMSG, "tok-cut.bin", "truncated");
  b[0] ^= 1;
  put("tok-magic.bin", b, sizeof b);
  snprintf(p, sizeof p, "%s/tok-magic.bin", dir);
  ASSERT_EQ(trn_tokens_load(p, 50, &t, err, sizeof err), -EBADMSG);
  refused(-EBADMSG, -EBADMSG, "tok-magic.bin", "offset 0: magic");
  ASSERT(t.tok == NULL);
  printf("tokens: llm.c's format loads (gzip or plain), windows and their "
         "next tokens; 3 bad files refused\n");
}

/* Augmentation: crops with black padding and mirror images, the same for
 * the same (seed, epoch, place), and none at all without. */
static void test_aug(void) {
  enum { N = 50, H = 6, W = 5 };
  static uint8_t pix[N * H * W], lab[N];
  for (int i = 0; i < N * H * W; i++)
    pix[i] = (uint8_t)(1 + i % 251); /* never 0: padding shows as 0 */
  trn_images d = {.pix = pix, .labels = lab, .n = N, .c = 1, .h = H, .w = W,
                  .classes = 10};
  trn_order o, r;
  static float x[N * H * W], ref[N * H * W], again[N * H * W];
  int32_t y[N];
  trn_aug none = {0, false}, flip = {0, true}, crop = {2, true};
  ASSERT_EQ(trn_order_init(&o, N, "a", 1, 0, 0), 0);
  ASSERT_EQ(trn_order_init(&r, N, "a", 1, 0, 0), 0);
  ASSERT_EQ(trn_images_batch_aug(&d, &o, N, NULL, NULL, &none, x, y), 0);
  ASSERT_EQ(trn_images_batch(&d, &r, N, NULL, NULL, ref, y), 0);
  ASSERT(memcmp(x, ref, sizeof x) == 0);
  /* Flips only: each image as it was or mirrored, about half of each. */
  ASSERT_EQ(trn_images_batch_aug(&d, &o, N, NULL, NULL, &flip, x, y), 0);
  ASSERT_EQ(trn_images_batch(&d, &r, N, NULL, NULL, ref, y), 0);
  int flipped = 0;
  for (int i = 0; i < N; i++) {
    bool same_ = true, mirror = true;
    for (int a = 0; a < H; a++)
      for (int b2 = 0; b2 < W; b2++) {
        same_ &= x[i * H * W + a * W + b2] == ref[i * H * W + a * W + b2];
        mirror &= x[i * H * W + a * W + b2] ==
                  ref[i * H * W + a * W + (W - 1 - b2)];
      }
    ASSERT(same_ || mirror);
    flipped += !same_;
  }
  ASSERT(flipped > 10 && flipped < 40);
  /* Crops: every pixel is black (padding) or the image's pixel at one
   * shift per image, within 2; resumed from (seed, epoch, pos), the same. */
  uint64_t ep = o.epoch;
  size_t pos = o.pos;
  ASSERT_EQ(trn_images_batch_aug(&d, &o, N, NULL, NULL, &crop, x, y), 0);
  trn_order_free(&r);
  ASSERT_EQ(trn_order_init(&r, N, "a", 1, ep, pos), 0);
  ASSERT_EQ(trn_images_batch_aug(&d, &r, N, NULL, NULL, &crop, again, y), 0);
  ASSERT(memcmp(x, again, sizeof x) == 0);
  int black = 0;
  for (int i = 0; i < N * H * W; i++)
    black += x[i] == 0;
  ASSERT(black > 0);
  trn_order k;
  ASSERT_EQ(trn_order_init(&k, N, "a", 1, ep, pos), 0);
  for (int i = 0; i < N; i++) {
    const uint8_t *src = pix + trn_order_next(&k) * H * W;
    const float *img = x + i * H * W;
    bool found = false;
    for (int sy = -2; sy <= 2 && !found; sy++)
      for (int sx = -2; sx <= 2 && !found; sx++)
        for (int f = 0; f < 2 && !found; f++) {
          bool ok = true;
          for (int a = 0; a < H && ok; a++)
            for (int b2 = 0; b2 < W && ok; b2++) {
              int c = f ? W - 1 - b2 : b2, yy = a + sy, xx = c + sx;
              float want = yy < 0 || yy >= H || xx < 0 || xx >= W
                               ? 0.0f
                               : (float)src[yy * W + xx] / 255.0f;
              ok = img[a * W + b2] == want;
            }
          found = ok;
        }
    ASSERT(found); /* a crop within 2, mirrored or not */
  }
  trn_order_free(&k);
  trn_aug big = {7, false};
  ASSERT_EQ(trn_images_batch_aug(&d, &o, 1, NULL, NULL, &big, x, y), -EINVAL);
  trn_order_free(&o);
  trn_order_free(&r);
  printf("augmentation: %d of %d mirrored; crops pad with black; the same "
         "when resumed\n",
         flipped, N);
}

/* The synthetic source: items fixed by (seed, number), labels in range,
 * a brightness per class that two disjoint sets of items agree on. */
static void test_synthetic(void) {
  enum { C = 3, H = 8, W = 8, K = 10, N = 4000, P = C * H * W };
  static float x[N * P], part[5 * P], again[N * P];
  static int32_t y[N], py[5], ay[N];
  ASSERT(trn_synthetic_batch(7, 0, N, C, H, W, K, x, y) == 0);
  ASSERT(trn_synthetic_batch(7, 0, N, C, H, W, K, again, ay) == 0);
  ASSERT(memcmp(x, again, sizeof x) == 0 && memcmp(y, ay, sizeof y) == 0);
  ASSERT(trn_synthetic_batch(7, 1234, 5, C, H, W, K, part, py) == 0);
  ASSERT(memcmp(part, x + 1234 * P, sizeof part) == 0);
  ASSERT(memcmp(py, y + 1234, sizeof py) == 0);
  ASSERT(trn_synthetic_batch(8, 0, N, C, H, W, K, again, ay) == 0);
  ASSERT(memcmp(x, again, sizeof x) != 0);
  /* Per class and channel, the mean over even items and over odd ones. */
  double sum[2][K][C] = {{{0}}}, cnt[2][K] = {{0}};
  size_t per[K] = {0};
  for (int i = 0; i < N; i++) {
    ASSERT(y[i] >= 0 && y[i] < K);
    per[y[i]]++;
    cnt[i & 1][y[i]] += H * W;
    for (int c = 0; c < C; c++)
      for (int k = 0; k < H * W; k++) {
        float v = x[(size_t)i * P + c * H * W + k];
        ASSERT(v >= -1.5f && v < 1.5f);
        sum[i & 1][y[i]][c] += v;
      }
  }
  double lo = 1, hi = -1;
  for (int k = 0; k < K; k++) {
    ASSERT(per[k] > N / K / 2 && per[k] < N / K * 2);
    for (int c = 0; c < C; c++) {
      double a = sum[0][k][c] / cnt[0][k], b = sum[1][k][c] / cnt[1][k];
      ASSERT(fabs(a - b) < 0.03);
      lo = a < lo ? a : lo, hi = a > hi ? a : hi;
    }
  }
  ASSERT(hi - lo > 0.3); /* the classes differ */
  /* ImageNet's shape, and bad sizes. */
  float *big = malloc(2 * 3 * 224 * 224 * sizeof *big);
  ASSERT(big);
  ASSERT(trn_synthetic_batch(1, 1000000, 2, 3, 224, 224, 1000, big, py) == 0);
  ASSERT(py[0] >= 0 && py[0] < 1000 && py[1] >= 0 && py[1] < 1000);
  free(big);
  ASSERT(trn_synthetic_batch(1, 0, 0, C, H, W, K, x, y) == -EINVAL);
  ASSERT(trn_synthetic_batch(1, 0, 1, 0, H, W, K, x, y) == -EINVAL);
  ASSERT(trn_synthetic_batch(1, 0, 1, C, H, W, 1, x, y) == -EINVAL);
  ASSERT(trn_synthetic_batch(1, UINT64_MAX, 2, C, H, W, K, x, y) == -EINVAL);
  printf("synthetic: items fixed by (seed, number), %d labels in range, "
         "class brightness spread %.2f, agreed by disjoint halves\n", N,
         hi - lo);
}

/* A tiny model of `name` fitted to the source s, batch b. */
static trn_model *fitted(const trn_source *s, const char *name, size_t b) {
  trn_model_config mc;
  trn_model_config_default(&mc);
  mc.name = name;
  mc.sizes[1] = 8;
  mc.layers = 1, mc.heads = 2, mc.embd = 8;
  mc.max_batch = b;
  trn_source_fit(s, &mc);
  trn_model *m;
  if (trn_model_new(&mc, &m, err, sizeof err))
    FAIL("%s: %s", name, err);
  return m;
}

/* Sources: images of either format, told apart by the files, or tokens;
 * the batches they train on are the loader's (or the windows') in the
 * order they are started on, normalized with the set's own figures. */
static void test_source(void) {
  char sub[128], p[160];
  /* CIFAR-10: 5 training files of 4 records, a test file of 3. */
  snprintf(sub, sizeof sub, "%s/cifar", dir);
  ASSERT_EQ(mkdir(sub, 0700), 0);
  static uint8_t b[4 * 3073];
  for (int f = 1; f <= 6; f++) {
    for (int r = 0; r < 4; r++) {
      b[r * 3073] = (uint8_t)((f + 3 * r) % 10);
      for (int j = 1; j < 3073; j++)
        b[r * 3073 + j] = (uint8_t)(f * 29 + r * 11 + j * 7);
    }
    if (f < 6)
      snprintf(p, sizeof p, "cifar/data_batch_%d.bin", f);
    else
      snprintf(p, sizeof p, "cifar/test_batch.bin");
    put(p, b, (size_t)(f == 6 ? 3 : 4) * 3073);
  }
  trn_source_config c = {.data = sub, .batch = 4};
  trn_source *s;
  ASSERT_EQ(trn_source_open(&c, false, &s, err, sizeof err), 0);
  ASSERT_STREQ(trn_source_kind(s), "CIFAR-10");
  ASSERT_UEQ(trn_source_items(s), 20);
  ASSERT_UEQ(trn_source_test_items(s), 3);
  ASSERT_UEQ(trn_source_per_item(s), 1);
  trn_model *m = fitted(s, "mlp", 4), *ref = fitted(s, "mlp", 4);
  char desc[128];
  trn_model_describe(m, desc, sizeof desc);
  ASSERT_STREQ(desc, "mlp 3072-8-10");
  double l;
  ASSERT_EQ(trn_source_train(s, m, &l), -EINVAL); /* not started */
  trn_order o, at;
  ASSERT_EQ(trn_order_init(&o, 20, "src", 3, 0, 4), 0);
  ASSERT_EQ(trn_source_start(s, &o, false), 0);
  ASSERT_EQ(trn_source_start(s, &o, false), -EINVAL); /* twice */
  /* The same batches as trn_images_batch with CIFAR-10's figures. */
  trn_images d;
  ASSERT_EQ(trn_cifar10_load(sub, "train", &d, err, sizeof err), 0);
  static const float mean[] = {0.4914f, 0.4822f, 0.4465f};
  static const float sd[] = {0.2470f, 0.2435f, 0.2616f};
  static float x[4 * 3072];
  int32_t y[4];
  for (int k = 0; k < 2; k++) {
    double lr;
    ASSERT_EQ(trn_source_train(s, m, &l), 0);
    ASSERT_EQ(trn_images_batch(&d, &o, 4, mean, sd, x, y), 0);
    ASSERT_EQ(trn_model_train_batch(ref, x, y, 4, &lr), 0);
    ASSERT(l == lr && l > 0);
  }
  ASSERT_EQ(trn_source_order(s, &at), 0);
  ASSERT(at.epoch == 0 && at.pos == 12 && same(&at, &o));
  trn_order_free(&at);
  double tl, acc, rl, racc;
  ASSERT_EQ(trn_source_evaluate(s, m, &tl, &acc), 0);
  trn_images te;
  ASSERT_EQ(trn_cifar10_load(sub, "test", &te, err, sizeof err), 0);
  ASSERT_EQ(trn_model_evaluate(m, &te, mean, sd, &rl, &racc), 0);
  ASSERT(tl == rl && acc == racc && acc >= 0 && acc <= 1);
  trn_images_free(&te);
  trn_images_free(&d);
  trn_order_free(&o);
  trn_model_free(m);
  trn_model_free(ref);
  m = fitted(s, "cnn", 4);
  trn_model_describe(m, desc, sizeof desc);
  ASSERT_STREQ(desc, "cnn 3x32x32 conv 32 64 dense 1024 dropout 0.5 classes 10");
  trn_model_free(m);
  m = fitted(s, "resnet", 4);
  trn_model_describe(m, desc, sizeof desc);
  ASSERT_STREQ(desc, "resnet-20 width 16 3x32x32 classes 10");
  trn_model_free(m);
  trn_source_free(s);
  c.aug.pad = 32;
  ASSERT_EQ(trn_source_open(&c, false, &s, err, sizeof err), -EINVAL);
  ASSERT(strstr(err, "padding of 32") != NULL);
  c.aug.pad = 0;

  /* IDX files, in a folder of their own: 2x3 images. */
  snprintf(sub, sizeof sub, "%s/idx", dir);
  ASSERT_EQ(mkdir(sub, 0700), 0);
  put_split("idx/train", 9, true);
  put_split("idx/t10k", 5, false);
  ASSERT_EQ(trn_source_open(&c, false, &s, err, sizeof err), 0);
  ASSERT_STREQ(trn_source_kind(s), "Fashion-MNIST/MNIST");
  ASSERT_UEQ(trn_source_items(s), 9);
  m = fitted(s, "mlp", 4);
  trn_model_describe(m, desc, sizeof desc);
  ASSERT_STREQ(desc, "mlp 6-8-10");
  trn_model_free(m);
  trn_source_free(s);
  c.data = "/nonexistent-beed";
  ASSERT_EQ(trn_source_open(&c, false, &s, err, sizeof err), -ENOENT);
  ASSERT(strstr(err, "/nonexistent-beed/train-images") != NULL && !s);
  c.batch = 0;
  ASSERT_EQ(trn_source_open(&c, false, &s, err, sizeof err), -EINVAL);
  ASSERT(strstr(err, "a batch of 0") != NULL);

  /* Tokens: tok.bin (test_tokens's: 101 tokens below 50), windows of 8. */
  char tok[128];
  snprintf(tok, sizeof tok, "%s/tok.bin", dir);
  c = (trn_source_config){.tokens = tok, .test_tokens = tok, .vocab = 50,
                          .ctx = 8, .batch = 3};
  ASSERT_EQ(trn_source_open(&c, true, &s, err, sizeof err), 0);
  ASSERT_STREQ(trn_source_kind(s), "tokens");
  ASSERT_UEQ(trn_source_items(s), 12);
  ASSERT_UEQ(trn_source_per_item(s), 8);
  m = fitted(s, "gpt", 3);
  trn_model_describe(m, desc, sizeof desc);
  ASSERT_STREQ(desc, "gpt vocab 50 ctx 8 layers 1 heads 2 embd 8");
  ASSERT_EQ(trn_order_init(&o, 12, "tok", 3, 2, 9), 0);
  ASSERT_EQ(trn_source_start(s, &o, false), 0);
  ASSERT_EQ(trn_source_train(s, m, &l), 0);
  ASSERT(l > 0 && isfinite(l));
  ASSERT_EQ(trn_source_order(s, &at), 0);
  ASSERT(at.epoch == 2 && at.pos == 12);
  trn_order_free(&at);
  ASSERT_EQ(0, trn_source_train(s, m, &l)); /* into the next pass */
  ASSERT_EQ(trn_source_order(s, &at), 0);
  ASSERT(at.epoch == 3 && at.pos == 3);
  trn_order_free(&at);
  trn_order_free(&o);
  trn_tokens t;
  ASSERT_EQ(trn_tokens_load(tok, 50, &t, err, sizeof err), 0);
  ASSERT_EQ(trn_source_evaluate(s, m, &tl, &acc), 0);
  ASSERT_EQ(trn_model_evaluate_tokens(m, &t, 8, &rl, &racc), 0);
  ASSERT(tl == rl && acc == racc && tl > 0);
  ASSERT_EQ(trn_model_evaluate_tokens(m, &t, 9, &rl, &racc), -EINVAL);
  trn_tokens_free(&t);
  trn_model_free(m);
  trn_source_free(s);
  c.test_tokens = NULL;
  ASSERT_EQ(trn_source_open(&c, true, &s, err, sizeof err), 0);
  ASSERT_UEQ(trn_source_test_items(s), 0);
  ASSERT_EQ(trn_source_evaluate(s, NULL, &tl, &acc), -ENOENT);
  trn_source_free(s);
  c.ctx = 101;
  ASSERT_EQ(trn_source_open(&c, true, &s, err, sizeof err), -EINVAL);
  refused(-EINVAL, -EINVAL, "tok.bin", "101 tokens, fewer than a window of 101");
  c.ctx = 8, c.tokens = NULL;
  ASSERT_EQ(trn_source_open(&c, true, &s, err, sizeof err), -EINVAL);
  ASSERT(strstr(err, "token file") != NULL);
  printf("sources: CIFAR-10 and IDX told apart, batches and tests as the "
         "loader's with each set's normalization, token windows; 5 bad "
         "settings refused\n");
}

int main(void) {
  snprintf(dir, sizeof dir, "%s/beed-data.XXXXXX",
           getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  ASSERT(mkdtemp(dir) != NULL);
  test_fashion();
  test_files();
  test_cifar();
  test_order();
  test_batch();
  test_aug();
  test_tokens();
  test_synthetic();
  test_source();
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  ASSERT_EQ(system(cmd), 0);
  return 0;
}
