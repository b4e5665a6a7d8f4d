/* ckpt.c: beed's checkpoint files.
 *
 * A checkpoint's payload is train.c's business: the state snapshot it
 * serves to peers (parameters, optimizer state and steps, buffers) and
 * what is the bee's own (its data position, its dropout count, its loss
 * scale; a reader may take two lengths of it, an older layout and the
 * current one), behind a header that says what it is:
 *
 *   "BEEDCKPT"  magic, 8 bytes
 *   u32         format version, 2 (1: the snapshot's header had no
 *               schema; such files are refused by their version)
 *   u32         run name length, then the run name (1..64 bytes)
 *   u64         epoch: the state after the step that began it
 *   u64         payload length
 *   32 bytes    BLAKE2b-256 of everything above and the payload
 *   payload
 *
 * integers little-endian.  Files are "<run>-<epoch, 12 digits>.ckpt" in
 * the checkpoint directory, written to a hidden temporary file, flushed,
 * renamed over and the directory flushed, so a crash leaves either the
 * old set or the new file whole; the newest `keep` of the run are kept.
 * A reader checks all of it before it hands anything back.
 */
#include "bee.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAGIC "BEEDCKPT"
#define VERSION 2
#define SUM 32

static void le(uint8_t *p, uint64_t v, int n) {
  for (int i = 0; i < n; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t rle(const uint8_t *p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; i++)
    v |= (uint64_t)p[i] << (8 * i);
  return v;
}

/* Header bytes before the checksum, for a run name of n bytes. */
static size_t head_len(size_t n) { return 8 + 4 + 4 + n + 8 + 8; }

static void checksum(const uint8_t *head, size_t hlen, const uint8_t *payload,
                     size_t len, uint8_t out[SUM]) {
  crypto_generichash_state st;
  crypto_generichash_init(&st, NULL, 0, SUM);
  crypto_generichash_update(&st, head, hlen);
  crypto_generichash_update(&st, payload, len);
  crypto_generichash_final(&st, out, SUM);
}

static int write_all(int fd, const uint8_t *p, size_t n) {
  while (n) {
    ssize_t k = write(fd, p, n);
    if (k < 0 && errno == EINTR)
      continue;
    if (k < 0)
      return -errno;
    p += k, n -= (size_t)k;
  }
  return 0;
}

/* The epoch in "<run>-<digits>.ckpt", or -1 when name is not one of run's. */
static int64_t file_epoch(const char *name, const char *run) {
  size_t rn = strlen(run), n = strlen(name);
  if (n != rn + 1 + 12 + 5 || strncmp(name, run, rn) != 0 || name[rn] != '-' ||
      strcmp(name + n - 5, ".ckpt") != 0)
    return -1;
  int64_t e = 0;
  for (size_t i = rn + 1; i < rn + 13; i++) {
    if (name[i] < '0' || name[i] > '9')
      return -1;
    e = e * 10 + (name[i] - '0');
  }
  return e;
}

/* The epochs of run's checkpoints in dir, newest first (heap; *n of them). */
static int list_epochs(const char *dir, const char *run, int64_t **out,
                       size_t *n, char *err, size_t errlen) {
  DIR *d = opendir(dir);
  *out = NULL;
  *n = 0;
  if (!d)
    return bee_failf(err, errlen, -errno, "checkpoint directory %s: %s", dir,
                strerror(errno));
  size_t cap = 0;
  int rc = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    int64_t ep = file_epoch(e->d_name, run);
    if (ep < 0)
      continue;
    if (*n == cap) {
      cap = cap ? 2 * cap : 16;
      int64_t *g = realloc(*out, cap * sizeof *g);
      if (!g) {
        rc = bee_failf(err, errlen, -ENOMEM, "out of memory");
        break;
      }
      *out = g;
    }
    (*out)[(*n)++] = ep;
  }
  closedir(d);
  for (size_t i = 1; i < *n; i++) /* insertion sort, newest first */
    for (size_t j = i; j > 0 && (*out)[j - 1] < (*out)[j]; j--) {
      int64_t x = (*out)[j];
      (*out)[j] = (*out)[j - 1];
      (*out)[j - 1] = x;
    }
  return rc;
}

/* mkdir -p, mode 0700 for what it makes. */
static int make_dirs(char *path) {
  for (char *p = path + 1; *p; p++) {
    if (*p != '/')
      continue;
    *p = '\0';
    int rc = mkdir(path, 0700) < 0 && errno != EEXIST ? -errno : 0;
    *p = '/';
    if (rc)
      return rc;
  }
  return mkdir(path, 0700) < 0 && errno != EEXIST ? -errno : 0;
}

int bee_dir_check(const char *dir) {
  struct stat st;
  if (stat(dir, &st) < 0)
    return -errno;
  if (!S_ISDIR(st.st_mode))
    return -ENOTDIR;
  return access(dir, W_OK | X_OK) < 0 ? -errno : 0;
}

void bee_dir_of(const char *path, char *out, size_t cap) {
  const char *slash = strrchr(path, '/');
  if (!slash)
    snprintf(out, cap, ".");
  else if (slash == path)
    snprintf(out, cap, "/");
  else
    snprintf(out, cap, "%.*s", (int)(slash - path), path);
}

int bee_ckpt_prepare(const char *dir, char *err, size_t errlen) {
  char path[BEE_PATH_MAX];
  size_t n = strlen(dir);
  if (n == 0 || n >= sizeof path)
    return bee_failf(err, errlen, BEE_ETOOBIG, "--checkpoint-dir: a path of "
                     "1 to %d bytes", BEE_PATH_MAX - 1);
  memcpy(path, dir, n + 1);
  while (n > 1 && path[n - 1] == '/')
    path[--n] = '\0';
  int rc = make_dirs(path);
  if (!rc)
    rc = bee_dir_check(path);
  if (rc)
    return bee_failf(err, errlen, rc, "--checkpoint-dir %s: %s", dir,
                     strerror(-rc));
  return 0;
}

int bee_ckpt_write(const char *dir, const char *run, uint64_t epoch,
                   const uint8_t *payload, size_t len, unsigned keep,
                   char *path, size_t pathcap, char *err, size_t errlen) {
  size_t rn = strlen(run);
  if (rn == 0 || rn > PROTO_RUN_MAX || epoch > 999999999999ull)
    return bee_failf(err, errlen, BEE_ERANGE, "checkpoint: bad run or epoch");
  char tmp[BEE_PATH_MAX + 96];
  int n = snprintf(path, pathcap, "%s/%s-%012llu.ckpt", dir, run,
                   (unsigned long long)epoch);
  if (n < 0 || (size_t)n >= pathcap)
    return bee_failf(err, errlen, BEE_ETOOBIG, "checkpoint: path too long");
  snprintf(tmp, sizeof tmp, "%s/.%s-%012llu.ckpt.tmp", dir, run,
           (unsigned long long)epoch);
  uint8_t head[8 + 4 + 4 + PROTO_RUN_MAX + 8 + 8 + SUM];
  size_t hl = head_len(rn);
  memcpy(head, MAGIC, 8);
  le(head + 8, VERSION, 4);
  le(head + 12, rn, 4);
  memcpy(head + 16, run, rn);
  le(head + 16 + rn, epoch, 8);
  le(head + 24 + rn, len, 8);
  checksum(head, hl, payload, len, head + hl);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0)
    return bee_failf(err, errlen, -errno, "checkpoint %s: %s", tmp, strerror(errno));
  int rc = write_all(fd, head, hl + SUM);
  if (!rc)
    rc = write_all(fd, payload, len);
  if (!rc && fsync(fd) < 0)
    rc = -errno;
  if (close(fd) < 0 && !rc)
    rc = -errno;
  if (!rc && rename(tmp, path) < 0)
    rc = -errno;
  if (rc) {
    unlink(tmp);
    return bee_failf(err, errlen, rc, "checkpoint %s: %s", path, strerror(-rc));
  }
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) { /* the rename itself, on disk */
    fsync(dfd);
    close(dfd);
  }
  /* The newest `keep` stay. */
  int64_t *eps;
  size_t ne;
  if (list_epochs(dir, run, &eps, &ne, NULL, 0) == 0)
    for (size_t i = keep; i < ne; i++) {
      char old[BEE_PATH_MAX + 96];
      snprintf(old, sizeof old, "%s/%s-%012lld.ckpt", dir, run,
               (long long)eps[i]);
      unlink(old);
    }
  free(eps);
  return 0;
}

int bee_ckpt_read(const char *path, const char *run, size_t min_len,
                  size_t max_len, uint8_t **payload, size_t *len,
                  uint64_t *epoch, char *err, size_t errlen) {
  *payload = NULL;
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    return bee_failf(err, errlen, -errno, "%s: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return bee_failf(err, errlen, -EINVAL, "%s: not a regular file", path);
  }
  size_t rn = strlen(run), hl = head_len(rn);
  uint64_t size = (uint64_t)st.st_size;
  uint8_t *buf = NULL;
  int rc = 0;
  if (size > hl + SUM + (uint64_t)max_len)
    size = hl; /* longer than this model's: the head says whose it is */
  uint64_t want_len = size > hl + SUM ? size - hl - SUM : 0;
  buf = malloc(size ? size : 1);
  if (!buf) {
    close(fd);
    return bee_failf(err, errlen, -ENOMEM, "%s: out of memory", path);
  }
  size_t got = 0;
  while (got < size) {
    ssize_t k = read(fd, buf + got, size - got);
    if (k < 0 && errno == EINTR)
      continue;
    if (k <= 0) {
      rc = k < 0 ? -errno : -EBADMSG;
      break;
    }
    got += (size_t)k;
  }
  close(fd);
  if (rc) {
    free(buf);
    return bee_failf(err, errlen, rc, "%s: %s", path,
                rc == -EBADMSG ? "shorter than it said" : strerror(-rc));
  }
  if (size < 16 || memcmp(buf, MAGIC, 8) != 0)
    rc = bee_failf(err, errlen, -EBADMSG, "%s: not a beed checkpoint", path);
  else if (rle(buf + 8, 4) != VERSION)
    rc = bee_failf(err, errlen, -EBADMSG, "%s: format version %llu, not %d", path,
              (unsigned long long)rle(buf + 8, 4), VERSION);
  else if (rle(buf + 12, 4) != rn || size < 16 + rn ||
           memcmp(buf + 16, run, rn) != 0)
    rc = bee_failf(err, errlen, -EINVAL, "%s: from another run", path);
  else if (want_len < min_len || rle(buf + 24 + rn, 8) != want_len)
    rc = bee_failf(err, errlen, -EINVAL,
                   "%s: %llu bytes, where this model's checkpoint takes %s%zu "
                   "(another model, or truncated)",
                   path, (unsigned long long)st.st_size,
                   min_len == max_len ? "" : "from ", hl + SUM + min_len);
  if (!rc && min_len != max_len && want_len != min_len &&
      want_len != max_len)
    rc = bee_failf(err, errlen, -EINVAL,
                   "%s: %llu bytes, where this model's checkpoint takes %zu "
                   "or %zu (another model, or damaged)",
                   path, (unsigned long long)st.st_size, hl + SUM + min_len,
                   hl + SUM + max_len);
  if (!rc) {
    uint8_t sum[SUM];
    checksum(buf, hl, buf + hl + SUM, want_len, sum);
    if (memcmp(sum, buf + hl, SUM) != 0)
      rc = bee_failf(err, errlen, -EBADMSG, "%s: checksum mismatch (damaged)",
                path);
  }
  if (rc) {
    free(buf);
    return rc;
  }
  *epoch = rle(buf + 16 + rn, 8);
  memmove(buf, buf + hl + SUM, want_len);
  *payload = buf;
  *len = want_len;
  return 0;
}

int bee_ckpt_newest(const char *dir, const char *run, size_t min_len,
                    size_t max_len, uint8_t **payload, size_t *len,
                    uint64_t *epoch, char *path, size_t pathcap, char *err,
                    size_t errlen) {
  int64_t *eps;
  size_t ne;
  *payload = NULL;
  int rc = list_epochs(dir, run, &eps, &ne, err, errlen);
  if (rc)
    return rc;
  for (size_t i = 0; i < ne; i++) {
    char why[BEE_PATH_MAX + 256];
    snprintf(path, pathcap, "%s/%s-%012lld.ckpt", dir, run, (long long)eps[i]);
    if (bee_ckpt_read(path, run, min_len, max_len, payload, len, epoch, why,
                      sizeof why) == 0) {
      free(eps);
      return 0;
    }
    bee_warn("ckpt", "skipped %s", why);
  }
  free(eps);
  return bee_failf(err, errlen, -ENOENT, "no valid checkpoint of run '%s' in %s",
              run, dir);
}
