/* data.c: training data from files: IDX (MNIST, Fashion-MNIST; gzip or
 * plain), image datasets in memory, and each peer's shuffled pass over
 * them (trainer.h, "Data").
 *
 * Everything read from a file is checked before it is used: the magic, the
 * dimensions against the bytes that are really there, labels against the
 * classes.  A bad file is an error code and one line in `err` that names
 * the file and the byte offset (in the decompressed data) where it went
 * wrong; nothing is kept from it.
 */
#include "trainer-int.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

static uint32_t be32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 |
         p[3];
}

/* Reads up to n bytes; returns how many (short only at the end), or -1 on
 * a read or decompression error (msg set). */
static long read_full(gzFile f, uint8_t *p, size_t n, const char **msg) {
  size_t got = 0;
  while (got < n) {
    size_t ask = n - got > (1u << 30) ? (1u << 30) : n - got;
    int k = gzread(f, p + got, (unsigned)ask);
    if (k < 0) {
      int zerr;
      *msg = gzerror(f, &zerr);
      return -1;
    }
    if (k == 0)
      break;
    got += (size_t)k;
  }
  return (long)got;
}

int trn_idx_read(const char *path, trn_idx *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  if (errlen)
    err[0] = 0;
  gzFile f = gzopen(path, "rb");
  if (!f) {
    int e = errno ? errno : ENOMEM;
    return trn__fail(err, errlen, -e, "%s: cannot open: %s", path, strerror(e));
  }
  gzbuffer(f, 1u << 17);
  int rc;
  const char *msg = NULL;
  uint8_t head[4 + 4 * TRN_IDX_DIMS_MAX];
  long got = read_full(f, head, 4, &msg);
  if (got < 0) {
    rc = trn__fail(err, errlen, -EIO, "%s: cannot read: %s", path, msg);
    goto out;
  }
  if (got < 4) {
    rc = trn__fail(err, errlen, -EBADMSG,
              "%s: %ld bytes, shorter than an IDX header (4)", path, got);
    goto out;
  }
  /* Magic: two zero bytes, the type (0x08: unsigned byte), the number of
   * dimensions. */
  if (head[0] || head[1] || head[2] != 0x08 || head[3] < 1 ||
      head[3] > TRN_IDX_DIMS_MAX) {
    rc = trn__fail(err, errlen, -EBADMSG,
              "%s: offset 0: bad IDX magic %02x %02x %02x %02x (want 00 00 08 "
              "and 1 to %d dimensions: unsigned bytes)",
              path, head[0], head[1], head[2], head[3], TRN_IDX_DIMS_MAX);
    goto out;
  }
  int nd = head[3];
  got = read_full(f, head + 4, 4 * (size_t)nd, &msg);
  if (got < 0) {
    rc = trn__fail(err, errlen, -EIO, "%s: cannot read: %s", path, msg);
    goto out;
  }
  if (got < 4 * nd) {
    rc = trn__fail(err, errlen, -EBADMSG,
              "%s: offset %ld: truncated in the header (%d dimensions need "
              "%d bytes)",
              path, 4 + got, nd, 4 + 4 * nd);
    goto out;
  }
  size_t len = 1;
  for (int i = 0; i < nd; i++) {
    out->dims[i] = be32(head + 4 + 4 * i);
    if (out->dims[i] == 0 || len > TRN_IDX_BYTES_MAX / out->dims[i]) {
      rc = trn__fail(err, errlen, out->dims[i] ? -EFBIG : -EBADMSG,
                "%s: offset %d: dimension %d is %u%s", path, 4 + 4 * i, i,
                out->dims[i],
                out->dims[i] ? ", more data than this reader takes" : "");
      goto out;
    }
    len *= out->dims[i];
  }
  size_t hdr = 4 + 4 * (size_t)nd;
  if (!(out->data = malloc(len))) {
    rc = trn__fail(err, errlen, -ENOMEM, "%s: out of memory for %zu bytes", path,
              len);
    goto out;
  }
  got = read_full(f, out->data, len, &msg);
  if (got < 0) {
    rc = trn__fail(err, errlen, -EIO, "%s: offset about %zu: cannot read: %s", path,
              hdr, msg);
    goto out;
  }
  if ((size_t)got < len) {
    rc = trn__fail(err, errlen, -EBADMSG,
              "%s: offset %zu: truncated: the header promises %zu bytes of "
              "data, the file holds %ld",
              path, hdr + (size_t)got, len, got);
    goto out;
  }
  uint8_t extra;
  got = read_full(f, &extra, 1, &msg);
  if (got != 0) {
    rc = got < 0 ? trn__fail(err, errlen, -EIO, "%s: cannot read: %s", path, msg)
                 : trn__fail(err, errlen, -EBADMSG,
                        "%s: offset %zu: data after the %zu bytes the header "
                        "promises",
                        path, hdr + len, len);
    goto out;
  }
  out->ndims = nd;
  out->len = len;
  rc = 0;
out:
  gzclose(f);
  if (rc)
    trn_idx_free(out);
  return rc;
}

void trn_idx_free(trn_idx *x) {
  free(x->data);
  memset(x, 0, sizeof *x);
}

/* ---- image datasets ----------------------------------------------------- */

/* Opens dir/name, or dir/name without its ".gz" when only that exists. */
static int idx_find(const char *dir, const char *name, trn_idx *out,
                    char *path, size_t pathlen, char *err, size_t errlen) {
  snprintf(path, pathlen, "%s/%s", dir, name);
  int rc = trn_idx_read(path, out, err, errlen);
  if (rc != -ENOENT)
    return rc;
  size_t n = strlen(path);
  if (n > 3 && strcmp(path + n - 3, ".gz") == 0) {
    path[n - 3] = 0;
    int rc2 = trn_idx_read(path, out, err, errlen);
    if (rc2 != -ENOENT)
      return rc2;
    path[n - 3] = '.'; /* report the compressed name */
    trn__fail(err, errlen, rc, "%s: not found (nor without .gz)", path);
  }
  return rc;
}

int trn_mnist_load(const char *dir, const char *split, trn_images *out,
                   char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  if (!dir || !split || (strcmp(split, "train") && strcmp(split, "t10k")))
    return trn__fail(err, errlen, -EINVAL,
                "MNIST split must be \"train\" or \"t10k\", not \"%s\"",
                split ? split : "(null)");
  char name[64], ipath[4096], lpath[4096];
  trn_idx im = {0}, lb = {0};
  snprintf(name, sizeof name, "%s-images-idx3-ubyte.gz", split);
  int rc = idx_find(dir, name, &im, ipath, sizeof ipath, err, errlen);
  if (rc)
    return rc;
  snprintf(name, sizeof name, "%s-labels-idx1-ubyte.gz", split);
  if ((rc = idx_find(dir, name, &lb, lpath, sizeof lpath, err, errlen)))
    goto out;
  rc = -EBADMSG;
  if (im.ndims != 3) {
    trn__fail(err, errlen, rc, "%s: offset 3: %d dimensions, images need 3", ipath,
         im.ndims);
    goto out;
  }
  if (lb.ndims != 1) {
    trn__fail(err, errlen, rc, "%s: offset 3: %d dimensions, labels need 1", lpath,
         lb.ndims);
    goto out;
  }
  if (lb.dims[0] != im.dims[0]) {
    trn__fail(err, errlen, rc, "%s: offset 4: %u labels for the %u images of %s",
         lpath, lb.dims[0], im.dims[0], ipath);
    goto out;
  }
  for (size_t i = 0; i < lb.len; i++)
    if (lb.data[i] >= TRN_MNIST_CLASSES) {
      trn__fail(err, errlen, rc,
           "%s: offset %zu: label %u of item %zu is out of range 0..%d", lpath,
           8 + i, lb.data[i], i, TRN_MNIST_CLASSES - 1);
      goto out;
    }
  out->pix = im.data;
  out->labels = lb.data;
  out->n = im.dims[0];
  out->c = 1;
  out->h = im.dims[1];
  out->w = im.dims[2];
  out->classes = TRN_MNIST_CLASSES;
  im.data = lb.data = NULL;
  rc = 0;
out:
  trn_idx_free(&im);
  trn_idx_free(&lb);
  return rc;
}

/* ---- CIFAR-10 ----------------------------------------------------------- */

#define CIFAR_REC (1 + 3 * 32 * 32) /* a label, then R, G and B planes */

/* Appends the records of one CIFAR-10 batch file to *d, whose arrays have
 * room for *cap records and grow by doubling. */
static int cifar_file(const char *path, trn_images *d, size_t *cap, char *err,
                      size_t errlen) {
  gzFile f = gzopen(path, "rb");
  if (!f) {
    int e = errno ? errno : ENOMEM;
    return trn__fail(err, errlen, -e, "%s: cannot open: %s", path,
                     strerror(e));
  }
  int rc = 0;
  uint8_t rec[CIFAR_REC];
  const char *msg = NULL;
  for (size_t i = 0;; i++) {
    long got = read_full(f, rec, sizeof rec, &msg);
    if (got < 0) {
      rc = trn__fail(err, errlen, -EIO, "%s: cannot read: %s", path, msg);
      break;
    }
    if (got == 0) {
      if (i == 0)
        rc = trn__fail(err, errlen, -EBADMSG, "%s: empty", path);
      break;
    }
    if ((size_t)got < sizeof rec) {
      rc = trn__fail(err, errlen, -EBADMSG,
                     "%s: offset %zu: truncated record %zu (%ld of %d bytes)",
                     path, i * CIFAR_REC, i, got, CIFAR_REC);
      break;
    }
    if (rec[0] >= 10) {
      rc = trn__fail(err, errlen, -EBADMSG,
                     "%s: offset %zu: label %u of record %zu is out of range "
                     "0..9",
                     path, i * CIFAR_REC, rec[0], i);
      break;
    }
    if (d->n == TRN_IDX_BYTES_MAX / CIFAR_REC) {
      rc = trn__fail(err, errlen, -EFBIG, "%s: too many records", path);
      break;
    }
    if (d->n == *cap) {
      size_t want = *cap ? 2 * *cap : 1024;
      uint8_t *px = realloc(d->pix, want * (CIFAR_REC - 1));
      if (px)
        d->pix = px;
      uint8_t *lb = realloc(d->labels, want);
      if (lb)
        d->labels = lb;
      if (!px || !lb) {
        rc = trn__fail(err, errlen, -ENOMEM, "%s: out of memory", path);
        break;
      }
      *cap = want;
    }
    memcpy(d->pix + d->n * (CIFAR_REC - 1), rec + 1, CIFAR_REC - 1);
    d->labels[d->n++] = rec[0];
  }
  gzclose(f);
  return rc;
}

int trn_cifar10_load(const char *dir, const char *split, trn_images *out,
                     char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  bool train = split && strcmp(split, "train") == 0;
  if (!dir || !split || (!train && strcmp(split, "test")))
    return trn__fail(err, errlen, -EINVAL,
                     "CIFAR-10 split must be \"train\" or \"test\", not "
                     "\"%s\"",
                     split ? split : "(null)");
  out->c = 3, out->h = out->w = 32, out->classes = 10;
  char path[4096];
  int rc = 0;
  size_t cap = 0;
  for (int i = 1; i <= (train ? 5 : 1) && !rc; i++) {
    if (train)
      snprintf(path, sizeof path, "%s/data_batch_%d.bin", dir, i);
    else
      snprintf(path, sizeof path, "%s/test_batch.bin", dir);
    rc = cifar_file(path, out, &cap, err, errlen);
  }
  if (rc)
    trn_images_free(out);
  return rc;
}

void trn_images_free(trn_images *d) {
  free(d->pix);
  free(d->labels);
  memset(d, 0, sizeof *d);
}

/* ---- token files ------------------------------------------------------------ */

#define TOK_MAGIC 20240520u
#define TOK_HEAD 1024 /* 256 little-endian int32s */

static uint32_t le32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
         (uint32_t)p[3] << 24;
}

int trn_tokens_load(const char *path, uint32_t vocab, trn_tokens *out,
                    char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  if (vocab == 0 || vocab > 65536)
    return trn__fail(err, errlen, -EINVAL, "%s: vocabulary of %u; 1 to 65536",
                     path, vocab);
  gzFile f = gzopen(path, "rb");
  if (!f) {
    int e = errno ? errno : ENOMEM;
    return trn__fail(err, errlen, -e, "%s: cannot open: %s", path,
                     strerror(e));
  }
  int rc = 0;
  const char *msg = NULL;
  uint8_t head[TOK_HEAD], *raw = NULL;
  long got = read_full(f, head, sizeof head, &msg);
  if (got < 0) {
    rc = trn__fail(err, errlen, -EIO, "%s: cannot read: %s", path, msg);
    goto out;
  }
  if (got < TOK_HEAD) {
    rc = trn__fail(err, errlen, -EBADMSG,
                   "%s: offset %ld: truncated in the %d-byte header", path, got,
                   TOK_HEAD);
    goto out;
  }
  uint32_t magic = le32(head), ver = le32(head + 4), n = le32(head + 8);
  if (magic != TOK_MAGIC || ver != 1) {
    rc = trn__fail(err, errlen, -EBADMSG,
                   "%s: offset 0: magic %u version %u; a token file has %u "
                   "and 1",
                   path, magic, ver, TOK_MAGIC);
    goto out;
  }
  if (n < 2) {
    rc = trn__fail(err, errlen, -EBADMSG, "%s: offset 8: %u tokens", path, n);
    goto out;
  }
  size_t bytes = 2 * (size_t)n;
  if (!(raw = malloc(bytes)) || !(out->tok = malloc(n * sizeof *out->tok))) {
    rc = trn__fail(err, errlen, -ENOMEM, "%s: out of memory for %u tokens",
                   path, n);
    goto out;
  }
  got = read_full(f, raw, bytes, &msg);
  if (got < 0 || (size_t)got < bytes) {
    rc = got < 0 ? trn__fail(err, errlen, -EIO, "%s: cannot read: %s", path,
                             msg)
                 : trn__fail(err, errlen, -EBADMSG,
                             "%s: offset %ld: truncated: the header promises "
                             "%u tokens",
                             path, TOK_HEAD + got, n);
    goto out;
  }
  uint8_t extra;
  if ((got = read_full(f, &extra, 1, &msg)) != 0) {
    rc = trn__fail(err, errlen, got < 0 ? -EIO : -EBADMSG,
                   "%s: offset %zu: data after the %u tokens", path,
                   TOK_HEAD + bytes, n);
    goto out;
  }
  for (uint32_t i = 0; i < n; i++) {
    out->tok[i] = (uint16_t)(raw[2 * i] | raw[2 * i + 1] << 8);
    if (out->tok[i] >= vocab) {
      rc = trn__fail(err, errlen, -EBADMSG,
                     "%s: offset %zu: token %u at %u is not below the "
                     "vocabulary's %u",
                     path, TOK_HEAD + 2 * (size_t)i, out->tok[i], i, vocab);
      goto out;
    }
  }
  out->n = n;
  out->vocab = vocab;
out:
  gzclose(f);
  free(raw);
  if (rc)
    trn_tokens_free(out);
  return rc;
}

void trn_tokens_free(trn_tokens *t) {
  free(t->tok);
  memset(t, 0, sizeof *t);
}

size_t trn_tokens_windows(const trn_tokens *t, size_t T) {
  return T && t->n > T ? (t->n - 1) / T : 0;
}

int trn_tokens_batch(const trn_tokens *t, trn_order *o, size_t B, size_t T,
                     int32_t *x, int32_t *y) {
  if (B == 0 || !x || !y || trn_tokens_windows(t, T) != o->n)
    return -EINVAL;
  for (size_t b = 0; b < B; b++) {
    const uint16_t *w = t->tok + trn_order_next(o) * T;
    for (size_t i = 0; i < T; i++) {
      x[b * T + i] = w[i];
      y[b * T + i] = w[i + 1];
    }
  }
  return 0;
}

/* ---- a peer's pass over the data ----------------------------------------- */

static uint64_t splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* The permutation of the order's current epoch: Fisher-Yates driven by a
 * stream that depends on every byte of the seed and on the epoch. */
static void shuffle(trn_order *o) {
  uint64_t x = 0x6265656420646174ull ^ o->epoch * 0xd1342543de82ef95ull;
  for (size_t i = 0; i < sizeof o->seed; i++) {
    x ^= o->seed[i];
    splitmix64(&x);
  }
  for (size_t i = 0; i < o->n; i++)
    o->idx[i] = (uint32_t)i;
  for (size_t i = o->n; i > 1; i--) {
    /* Below 2^-31 bias for any n a dataset has here (n < 2^32). */
    size_t j = (size_t)(splitmix64(&x) % i);
    uint32_t t = o->idx[i - 1];
    o->idx[i - 1] = o->idx[j];
    o->idx[j] = t;
  }
}

int trn_order_init(trn_order *o, size_t n, const void *seed, size_t seed_len,
                   uint64_t epoch, size_t pos) {
  memset(o, 0, sizeof *o);
  if (n == 0 || n > UINT32_MAX || pos > n || (seed_len && !seed))
    return -EINVAL;
  if (!(o->idx = malloc(n * sizeof *o->idx)))
    return -ENOMEM;
  /* Seeds longer than the state are folded in, not cut. */
  for (size_t i = 0; i < seed_len; i++)
    o->seed[i % sizeof o->seed] ^= ((const uint8_t *)seed)[i];
  o->n = n;
  o->epoch = epoch;
  o->pos = pos;
  shuffle(o);
  return 0;
}

void trn_order_free(trn_order *o) {
  free(o->idx);
  memset(o, 0, sizeof *o);
}

/* After the last item of an epoch, the next epoch's order. */
static void order_wrap(trn_order *o) {
  if (o->pos == o->n) {
    o->epoch++;
    o->pos = 0;
    shuffle(o);
  }
}

size_t trn_order_next(trn_order *o) {
  order_wrap(o);
  return o->idx[o->pos++];
}

/* The augmentation's random bits for the item at (epoch, pos) of o: the
 * same wherever a run is resumed. */
static uint64_t aug_bits(const trn_order *o, uint64_t epoch, size_t pos) {
  uint64_t x = 0x6175676d656e7421ull ^ epoch * 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i < sizeof o->seed; i++) {
    x ^= o->seed[i];
    splitmix64(&x);
  }
  x ^= (uint64_t)pos;
  return splitmix64(&x);
}

int trn_images_batch_aug(const trn_images *d, trn_order *o, size_t b,
                         const float *mean, const float *std,
                         const trn_aug *aug, float *x, int32_t *y) {
  if (!d->n || o->n != d->n || b == 0 || !x || !y || d->c == 0 ||
      d->c > TRN_CHANNELS_MAX || (aug && (aug->pad > d->h || aug->pad > d->w)))
    return -EINVAL;
  float m[TRN_CHANNELS_MAX], s[TRN_CHANNELS_MAX];
  for (unsigned c = 0; c < d->c; c++) {
    m[c] = mean ? mean[c] : 0;
    s[c] = std ? std[c] : 1;
    if (!(s[c] > 0) || !isfinite(m[c]) || isinf(s[c]))
      return -EINVAL;
  }
  unsigned h = d->h, w = d->w, pad = aug ? aug->pad : 0;
  size_t plane = (size_t)h * w, one = d->c * plane;
  for (size_t i = 0; i < b; i++) {
    order_wrap(o); /* the item's epoch and place, before taking it */
    uint64_t epoch = o->epoch;
    size_t at = o->pos, k = trn_order_next(o);
    const uint8_t *p = d->pix + k * one;
    float *q = x + i * one;
    y[i] = d->labels[k];
    if (!aug || (!pad && !aug->flip)) {
      /* In torchvision's order (ToTensor, then Normalize), so that a
       * reference computed there sees the same bits. */
      for (unsigned c = 0; c < d->c; c++)
        for (size_t j = 0; j < plane; j++)
          q[c * plane + j] = ((float)p[c * plane + j] / 255.0f - m[c]) / s[c];
      continue;
    }
    /* RandomCrop(padding = pad) with zero (black) padding, then
     * RandomHorizontalFlip, as torchvision composes them. */
    uint64_t r = aug_bits(o, epoch, at);
    unsigned dy = pad ? (unsigned)(r % (2 * pad + 1)) : 0;
    unsigned dx = pad ? (unsigned)(r / 65537 % (2 * pad + 1)) : 0;
    bool flip = aug->flip && (r >> 63);
    for (unsigned c = 0; c < d->c; c++) {
      float zero = (0.0f - m[c]) / s[c];
      for (unsigned yi = 0; yi < h; yi++) {
        int sy = (int)(yi + dy) - (int)pad;
        for (unsigned xj = 0; xj < w; xj++) {
          unsigned oj = flip ? w - 1 - xj : xj;
          int sx = (int)(xj + dx) - (int)pad;
          float v = sy < 0 || sy >= (int)h || sx < 0 || sx >= (int)w
                        ? zero
                        : ((float)p[c * plane + (size_t)sy * w + (unsigned)sx] /
                               255.0f -
                           m[c]) /
                              s[c];
          q[c * plane + (size_t)yi * w + oj] = v;
        }
      }
    }
  }
  return 0;
}

int trn_images_batch(const trn_images *d, trn_order *o, size_t b,
                     const float *mean, const float *std, float *x,
                     int32_t *y) {
  return trn_images_batch_aug(d, o, b, mean, std, NULL, x, y);
}

/* ---- a synthetic source ---------------------------------------------------- */

int trn_synthetic_batch(uint64_t seed, uint64_t first, size_t b, unsigned c,
                        unsigned h, unsigned w, unsigned classes, float *x,
                        int32_t *y) {
  if (b == 0 || c == 0 || h == 0 || w == 0 || classes < 2 ||
      classes > INT32_MAX || first > UINT64_MAX - b)
    return -EINVAL;
  size_t plane = (size_t)h * w;
  for (size_t i = 0; i < b; i++) {
    /* One stream per item: (seed, item) and nothing else. */
    uint64_t s = seed ^ (first + i) * 0xd1342543de82ef95ull;
    splitmix64(&s);
    uint32_t label = (uint32_t)(splitmix64(&s) % classes);
    y[i] = (int32_t)label;
    float *q = x + i * c * plane;
    for (unsigned ch = 0; ch < c; ch++) {
      /* The class's brightness in this channel: what a model can learn. */
      uint64_t t = (uint64_t)label * 0x9e3779b97f4a7c15ull + ch + 1;
      float off = (float)(splitmix64(&t) >> 40) * 0x1p-24f - 0.5f;
      float *qc = q + ch * plane;
      size_t k = 0;
      for (; k + 2 <= plane; k += 2) { /* two 24-bit draws per number */
        uint64_t r = splitmix64(&s);
        qc[k] = (float)(r >> 40) * 0x1p-23f - 1.0f + off;
        qc[k + 1] = (float)(r & 0xffffff) * 0x1p-23f - 1.0f + off;
      }
      if (k < plane)
        qc[k] = (float)(splitmix64(&s) >> 40) * 0x1p-23f - 1.0f + off;
    }
  }
  return 0;
}
