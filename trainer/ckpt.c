/* ckpt.c: checkpoints of a training run (trainer.h, "Checkpoints").
 *
 * One file holds everything a run needs to go on with the same bits: the
 * parameters, the batch norms' running statistics, the optimizer's state
 * and step count, the data order's (seed, epoch, position), the dropout
 * masks' seed and how many were drawn, and four numbers of the caller's
 * (the daemon's epoch and step).  Written to a
 * temporary file beside the target, flushed to disk and renamed over it,
 * so a crash leaves the old checkpoint or the new one, never half of one.
 * Read whole and checked (magic, version, the model's shape, sizes, CRC)
 * before anything is changed: a bad file changes nothing.
 *
 * Layout, little-endian:
 *   "BEECKPT1"  u32 version (1)  u32 optimizer kind
 *   u64 shape hash  u64 nparams  u64 nstate  u64 optimizer steps
 *   u64 dropout masks drawn  u64 order n, epoch, pos  32 bytes order seed
 *   u64 user[4]  u64 the dropout masks' seed  u64 nbuffers
 *   float params[nparams]  float state[nstate]  float buffers[nbuffers]
 *   u32 CRC-32 (zlib) of everything before it
 */
#include "trainer-int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#define MAGIC "BEECKPT1"
#define VERSION 1u
#define HEAD (8 + 4 + 4 + 8 * 8 + 32 + 8 * 4 + 8 + 8)

static void put32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++)
    p[i] = (uint8_t)(v >> 8 * i);
}
static void put64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++)
    p[i] = (uint8_t)(v >> 8 * i);
}
static uint32_t get32(const uint8_t *p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; i--)
    v = v << 8 | p[i];
  return v;
}
static uint64_t get64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--)
    v = v << 8 | p[i];
  return v;
}

/* Floats as little-endian bytes, whatever the host. */
static void put_floats(uint8_t *p, const float *f, size_t n) {
  for (size_t i = 0; i < n; i++) {
    uint32_t w;
    memcpy(&w, &f[i], 4);
    put32(p + 4 * i, w);
  }
}
static void get_floats(float *f, const uint8_t *p, size_t n) {
  for (size_t i = 0; i < n; i++) {
    uint32_t w = get32(p + 4 * i);
    memcpy(&f[i], &w, 4);
  }
}

static uint32_t crc(const uint8_t *p, size_t n) {
  uLong c = crc32(0L, Z_NULL, 0);
  while (n) { /* crc32 takes an unsigned int length */
    unsigned k = n > (1u << 30) ? (1u << 30) : (unsigned)n;
    c = crc32(c, p, k);
    p += k, n -= k;
  }
  return (uint32_t)c;
}

int trn_ckpt_save(const char *path, trn_model *m, trn_optim *o,
                  const trn_order *ord, const uint64_t user[4], char *err,
                  size_t errlen) {
  size_t np = trn_model_nparams(m), ns = 0, nb;
  const float *st = o ? trn_optim_state(o, &ns) : NULL;
  const float *buf = trn_model_buffers(m, &nb);
  size_t len = HEAD + 4 * (np + ns + nb) + 4;
  uint8_t *b = malloc(len);
  if (!b)
    return trn__fail(err, errlen, -ENOMEM, "%s: out of memory for %zu bytes",
                     path, len);
  memcpy(b, MAGIC, 8);
  put32(b + 8, VERSION);
  put32(b + 12, o ? (uint32_t)trn_optim_kind(o) : 0);
  uint8_t *p = b + 16;
  put64(p, trn__model_shape_hash(m)), p += 8;
  put64(p, np), p += 8;
  put64(p, ns), p += 8;
  put64(p, o ? trn_optim_steps(o) : 0), p += 8;
  put64(p, trn_model_dropout_calls(m)), p += 8;
  put64(p, ord ? ord->n : 0), p += 8;
  put64(p, ord ? ord->epoch : 0), p += 8;
  put64(p, ord ? ord->pos : 0), p += 8;
  if (ord)
    memcpy(p, ord->seed, 32);
  else
    memset(p, 0, 32);
  p += 32;
  for (int i = 0; i < 4; i++, p += 8)
    put64(p, user ? user[i] : 0);
  put64(p, trn__model_dropout_seed(m)), p += 8;
  put64(p, nb), p += 8;
  put_floats(p, trn_model_params(m), np), p += 4 * np;
  if (ns)
    put_floats(p, st, ns), p += 4 * ns;
  if (nb)
    put_floats(p, buf, nb), p += 4 * nb;
  put32(p, crc(b, len - 4));

  /* Beside the target, then renamed over it: all or nothing. */
  char tmp[4096];
  int rc = 0, n = snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
  if (n < 0 || (size_t)n >= sizeof tmp) {
    rc = trn__fail(err, errlen, -ENAMETOOLONG, "%s: path too long", path);
    goto out;
  }
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    rc = trn__fail(err, errlen, -errno, "%s: cannot create: %s", tmp,
                   strerror(errno));
    goto out;
  }
  for (size_t at = 0; at < len && !rc;) {
    ssize_t k = write(fd, b + at, len - at);
    if (k < 0 && errno == EINTR)
      continue;
    if (k <= 0)
      rc = trn__fail(err, errlen, k < 0 ? -errno : -EIO,
                     "%s: write at %zu: %s", tmp, at,
                     k < 0 ? strerror(errno) : "no progress");
    else
      at += (size_t)k;
  }
  if (!rc && fsync(fd) != 0)
    rc = trn__fail(err, errlen, -errno, "%s: fsync: %s", tmp, strerror(errno));
  if (close(fd) != 0 && !rc)
    rc = trn__fail(err, errlen, -errno, "%s: close: %s", tmp, strerror(errno));
  if (!rc && rename(tmp, path) != 0)
    rc = trn__fail(err, errlen, -errno, "%s: rename to %s: %s", tmp, path,
                   strerror(errno));
  if (rc)
    unlink(tmp);
out:
  free(b);
  return rc;
}

int trn_ckpt_load(const char *path, trn_model *m, trn_optim *o,
                  trn_order *ord, uint64_t user[4], char *err, size_t errlen) {
  int rc = 0;
  uint8_t *b = NULL;
  FILE *f = fopen(path, "rb");
  if (!f)
    return trn__fail(err, errlen, -errno, "%s: cannot open: %s", path,
                     strerror(errno));
  size_t np = trn_model_nparams(m), ns = 0, nb;
  if (o)
    trn_optim_state(o, &ns);
  float *buf = trn_model_buffers(m, &nb);
  /* The header first, so that a checkpoint of another model or optimizer
   * is named as that rather than as a size mismatch. */
  uint8_t h[HEAD];
  size_t got = fread(h, 1, HEAD, f);
  if (got < HEAD || memcmp(h, MAGIC, 8) != 0) {
    if (got >= 8 && memcmp(h, MAGIC, 8) != 0)
      rc = trn__fail(err, errlen, -EBADMSG, "%s: offset 0: not a beed "
                     "checkpoint (no BEECKPT1)", path);
    else
      rc = trn__fail(err, errlen, -EBADMSG, "%s: offset %zu: truncated in "
                     "the header (%d bytes)", path, got, HEAD);
    goto out;
  }
  uint32_t ver = get32(h + 8), kind = get32(h + 12);
  const uint8_t *p = h + 16;
  uint64_t hash = get64(p), fnp = get64(p + 8), fns = get64(p + 16);
  if (ver != VERSION) {
    rc = trn__fail(err, errlen, -EBADMSG,
                   "%s: offset 8: version %u, this beed reads %u", path, ver,
                   VERSION);
    goto out;
  }
  if (hash != trn__model_shape_hash(m) || fnp != np) {
    rc = trn__fail(err, errlen, -EINVAL,
                   "%s: offset 16: a checkpoint of another model (%llu "
                   "parameters, shape %016llx; this one: %zu, %016llx)",
                   path, (unsigned long long)fnp, (unsigned long long)hash, np,
                   (unsigned long long)trn__model_shape_hash(m));
    goto out;
  }
  if (o && (kind != (uint32_t)trn_optim_kind(o) || fns != ns)) {
    rc = trn__fail(err, errlen, -EINVAL,
                   "%s: offset 12: optimizer %u with %llu state values; this "
                   "run's: %d with %zu",
                   path, kind, (unsigned long long)fns, trn_optim_kind(o), ns);
    goto out;
  }
  if (fns > 4 * (uint64_t)np) { /* no optimizer keeps more than this */
    rc = trn__fail(err, errlen, -EBADMSG, "%s: offset 32: %llu state values",
                   path, (unsigned long long)fns);
    goto out;
  }
  if (get64(p + 136) != nb) { /* the shape hash covers it; a damaged file */
    rc = trn__fail(err, errlen, -EBADMSG,
                   "%s: offset 152: %llu batch-norm statistics, the model "
                   "has %zu",
                   path, (unsigned long long)get64(p + 136), nb);
    goto out;
  }
  size_t len = HEAD + 4 * (np + (size_t)fns + nb) + 4;
  if (!(b = malloc(len))) {
    rc = trn__fail(err, errlen, -ENOMEM, "%s: out of memory for %zu bytes",
                   path, len);
    goto out;
  }
  memcpy(b, h, HEAD);
  got = HEAD + fread(b + HEAD, 1, len - HEAD, f);
  if (ferror(f)) {
    rc = trn__fail(err, errlen, -EIO, "%s: read error", path);
    goto out;
  }
  if (got < len || fgetc(f) != EOF) {
    rc = trn__fail(err, errlen, -EBADMSG,
                   got < len ? "%s: offset %zu: truncated (%zu bytes "
                               "expected)"
                             : "%s: offset %zu: data after the %zu bytes "
                               "expected",
                   path, got, len);
    goto out;
  }
  uint32_t want = get32(b + len - 4), have = crc(b, len - 4);
  if (want != have) {
    rc = trn__fail(err, errlen, -EBADMSG,
                   "%s: CRC-32 %08x over %zu bytes, the file says %08x: "
                   "damaged",
                   path, have, len - 4, want);
    goto out;
  }
  uint64_t on = get64(p + 40), oe = get64(p + 48), op = get64(p + 56);
  if (ord && (on != ord->n || op > on)) {
    rc = trn__fail(err, errlen, -EINVAL,
                   "%s: offset 56: a data order of %llu items (position "
                   "%llu); this run's has %zu",
                   path, (unsigned long long)on, (unsigned long long)op,
                   ord->n);
    goto out;
  }
  /* Everything checked: now change the run. */
  if (ord) {
    trn_order fresh;
    if ((rc = trn_order_init(&fresh, on, p + 64, 32, oe, op)) != 0) {
      trn__fail(err, errlen, rc, "%s: out of memory for the order", path);
      goto out;
    }
    trn_order_free(ord);
    *ord = fresh;
  }
  if (o) {
    float *st = trn_optim_state(o, &ns);
    get_floats(st, b + HEAD + 4 * np, ns);
    trn_optim_set_steps(o, get64(p + 24));
  }
  if (nb)
    get_floats(buf, b + HEAD + 4 * (np + (size_t)fns), nb);
  trn_model_set_dropout_calls(m, get64(p + 32));
  trn__model_set_dropout_seed(m, get64(p + 128));
  get_floats(trn_model_params(m), b + HEAD, np);
  for (int i = 0; user && i < 4; i++)
    user[i] = get64(p + 96 + 8 * i);
out:
  fclose(f);
  free(b);
  return rc;
}
