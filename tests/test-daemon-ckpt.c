/* test-daemon-ckpt.c: beed's checkpoint files (daemon/ckpt.c).
 *
 * Write and read back; only the newest K of a run are kept, other runs'
 * files untouched; the newest valid one is found past damaged ones; and
 * every kind of bad file is refused with the file named: not a
 * checkpoint, another version, another run, another model's size,
 * truncated, one flipped byte anywhere, a directory.  The directory is
 * made when missing, and refused when a file is in the way.  Files live in a
 * fresh temporary directory.
 */
#include "bee.h"
#include "test.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[256];
static char err[1024];

static void fill(uint8_t *p, size_t n, uint8_t seed) {
  for (size_t i = 0; i < n; i++)
    p[i] = (uint8_t)(i * 13 + seed);
}

static size_t count(const char *prefix) {
  DIR *d = opendir(dir);
  ASSERT(d);
  size_t n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (strncmp(e->d_name, prefix, strlen(prefix)) == 0)
      n++;
  closedir(d);
  return n;
}

static void rewrite(const char *path, const uint8_t *p, size_t n) {
  FILE *f = fopen(path, "wb");
  ASSERT(f);
  ASSERT_EQ(fwrite(p, 1, n, f), n);
  ASSERT_EQ(fclose(f), 0);
}

static uint8_t *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  ASSERT(f);
  static uint8_t buf[1 << 16];
  *n = fread(buf, 1, sizeof buf, f);
  fclose(f);
  return buf;
}

int main(void) {
  const char *base = getenv("TMPDIR");
  snprintf(dir, sizeof dir, "%s/test-daemon-ckpt-XXXXXX",
           base && *base ? base : "/tmp");
  ASSERT(mkdtemp(dir) != NULL);
  enum { N = 4000 };
  uint8_t a[N], *got;
  size_t glen;
  uint64_t epoch;
  char path[512], p5[512];

  /* Round trip. */
  fill(a, N, 1);
  ASSERT_OK(
      bee_ckpt_write(dir, "run-a", 5, a, N, 3, p5, sizeof p5, err, sizeof err));
  ASSERT(strstr(p5, "/run-a-000000000005.ckpt"));
  ASSERT_OK(
      bee_ckpt_read(p5, "run-a", N, N, &got, &glen, &epoch, err, sizeof err));
  ASSERT_UEQ(epoch, 5);
  ASSERT_UEQ(glen, N);
  ASSERT_MEMEQ(got, a, N);
  free(got);

  /* A reader that takes two layouts (N - 8 bytes, as written before the
   * loss scale, or N): either is read with its length; one between, or
   * the model's old size alone, is another model's. */
  char p4[512];
  ASSERT_OK(bee_ckpt_write(dir, "run-l", 4, a, N - 8, 3, p4, sizeof p4, err,
                           sizeof err));
  ASSERT_OK(bee_ckpt_read(p4, "run-l", N - 8, N, &got, &glen, &epoch, err,
                          sizeof err));
  ASSERT_UEQ(glen, N - 8);
  ASSERT_MEMEQ(got, a, N - 8);
  free(got);
  ASSERT_OK(bee_ckpt_read(p5, "run-a", N - 8, N, &got, &glen, &epoch, err,
                          sizeof err));
  ASSERT_UEQ(glen, N);
  free(got);
  ASSERT_OK(bee_ckpt_write(dir, "run-l", 5, a, N - 4, 3, p4, sizeof p4, err,
                           sizeof err));
  ASSERT_RC(bee_ckpt_read(p4, "run-l", N - 8, N, &got, &glen, &epoch, err,
                          sizeof err),
            -EINVAL);
  ASSERT(got == NULL && strstr(err, "or ") && strstr(err, "another model"));
  ASSERT_OK(bee_ckpt_newest(dir, "run-l", N - 8, N, &got, &glen, &epoch, path,
                            sizeof path, err, sizeof err));
  ASSERT_UEQ(epoch, 4); /* epoch 5's was skipped */
  free(got);
  ASSERT_RC(bee_ckpt_read(p5, "run-a", N - 8, N - 8, &got, &glen, &epoch, err,
                          sizeof err),
            -EINVAL);

  /* The newest 3 of run-a stay; run-b's file is not run-a's to prune. */
  ASSERT_OK(bee_ckpt_write(dir, "run-b", 1, a, N, 1, path, sizeof path, err,
                           sizeof err));
  for (uint64_t e = 6; e <= 9; e++) {
    fill(a, N, (uint8_t)e);
    ASSERT_OK(bee_ckpt_write(dir, "run-a", e, a, N, 3, path, sizeof path, err,
                             sizeof err));
  }
  ASSERT_EQ(count("run-a-"), 3);
  ASSERT_EQ(count("run-b-"), 1);
  ASSERT_EQ(count(".run-a"), 0); /* no temporary file left */
  ASSERT_OK(bee_ckpt_newest(dir, "run-a", N, N, &got, &glen, &epoch, path,
                            sizeof path, err, sizeof err));
  ASSERT_UEQ(epoch, 9);
  fill(a, N, 9);
  ASSERT_MEMEQ(got, a, N);
  free(got);

  /* Every flipped byte (header, checksum, payload) is refused, naming
   * the file; the newest valid one is then epoch 8. */
  char p9[512];
  snprintf(p9, sizeof p9, "%s/run-a-000000000009.ckpt", dir);
  size_t n;
  uint8_t *orig = slurp(p9, &n), copy[1 << 16];
  memcpy(copy, orig, n);
  for (size_t i = 0; i < n; i += (i < 120 ? 1 : 97)) {
    copy[i] ^= 0x40;
    rewrite(p9, copy, n);
    ASSERT(bee_ckpt_read(p9, "run-a", N, N, &got, &glen, &epoch, err,
                         sizeof err) != 0);
    ASSERT(got == NULL);
    ASSERT(strstr(err, "run-a-000000000009.ckpt"));
    copy[i] ^= 0x40;
  }
  copy[n - 1] ^= 1;
  rewrite(p9, copy, n);
  ASSERT_RC(
      bee_ckpt_read(p9, "run-a", N, N, &got, &glen, &epoch, err, sizeof err),
      -EBADMSG);
  ASSERT(strstr(err, "checksum"));
  ASSERT_OK(bee_ckpt_newest(dir, "run-a", N, N, &got, &glen, &epoch, path,
                            sizeof path, err, sizeof err));
  ASSERT_UEQ(epoch, 8);
  free(got);

  /* Truncated, padded, another model's size, another run, not a
   * checkpoint, another version, a directory, a missing file. */
  rewrite(p9, copy, n / 2);
  ASSERT_RC(
      bee_ckpt_read(p9, "run-a", N, N, &got, &glen, &epoch, err, sizeof err),
      -EINVAL);
  ASSERT(strstr(err, "another model, or truncated"));
  memcpy(copy, orig, n);
  copy[n] = 0;
  rewrite(p9, copy, n + 1);
  ASSERT_RC(
      bee_ckpt_read(p9, "run-a", N, N, &got, &glen, &epoch, err, sizeof err),
      -EINVAL);
  rewrite(p9, copy, n);
  ASSERT_RC(bee_ckpt_read(p9, "run-a", N + 4, N + 4, &got, &glen, &epoch, err,
                          sizeof err),
            -EINVAL);
  ASSERT_RC(
      bee_ckpt_read(p9, "run-x", N, N, &got, &glen, &epoch, err, sizeof err),
      -EINVAL);
  ASSERT(strstr(err, "another run"));
  ASSERT_RC(
      bee_ckpt_read(p9, "run-aa", N, N, &got, &glen, &epoch, err, sizeof err),
      -EINVAL);
  copy[0] = 'X';
  rewrite(p9, copy, n);
  ASSERT_RC(
      bee_ckpt_read(p9, "run-a", N, N, &got, &glen, &epoch, err, sizeof err),
      -EBADMSG);
  ASSERT(strstr(err, "not a beed checkpoint"));
  copy[0] = 'B';
  copy[8] = 1; /* format 1: snapshots without their schema */
  rewrite(p9, copy, n);
  ASSERT_RC(
      bee_ckpt_read(p9, "run-a", N, N, &got, &glen, &epoch, err, sizeof err),
      -EBADMSG);
  ASSERT(strstr(err, "format version 1, not 2"));
  copy[8] = 3;
  rewrite(p9, copy, n);
  ASSERT_RC(
      bee_ckpt_read(p9, "run-a", N, N, &got, &glen, &epoch, err, sizeof err),
      -EBADMSG);
  ASSERT(strstr(err, "version 3"));
  rewrite(p9, copy, 3);
  ASSERT(bee_ckpt_read(p9, "run-a", N, N, &got, &glen, &epoch, err,
                       sizeof err) != 0);
  ASSERT_RC(
      bee_ckpt_read(dir, "run-a", N, N, &got, &glen, &epoch, err, sizeof err),
      -EINVAL);
  snprintf(path, sizeof path, "%s/none.ckpt", dir);
  ASSERT_RC(
      bee_ckpt_read(path, "run-a", N, N, &got, &glen, &epoch, err, sizeof err),
      -ENOENT);
  ASSERT(strstr(err, "none.ckpt"));

  /* No run-c at all; a directory that is not there. */
  ASSERT_RC(bee_ckpt_newest(dir, "run-c", N, N, &got, &glen, &epoch, path,
                            sizeof path, err, sizeof err),
            -ENOENT);
  snprintf(path, sizeof path, "%s/missing", dir);
  ASSERT(bee_ckpt_write(path, "run-a", 1, a, N, 3, p5, sizeof p5, err,
                        sizeof err) != 0);
  ASSERT(strstr(err, "missing"));

  /* The directory is made, with its missing parents (0700), and may be
   * named again; a file in the way is refused with its name. */
  snprintf(path, sizeof path, "%s/made/deeper/", dir);
  ASSERT_OK(bee_ckpt_prepare(path, err, sizeof err));
  ASSERT_OK(bee_ckpt_prepare(path, err, sizeof err));
  struct stat st;
  snprintf(path, sizeof path, "%s/made/deeper", dir);
  ASSERT_EQ(stat(path, &st), 0);
  ASSERT(S_ISDIR(st.st_mode));
  ASSERT_EQ(st.st_mode & 0777, 0700);
  ASSERT_OK(bee_ckpt_write(path, "run-c", 1, a, N, 3, p5, sizeof p5, err,
                           sizeof err));
  ASSERT_EQ(unlink(p5), 0);
  ASSERT_EQ(rmdir(path), 0);
  snprintf(path, sizeof path, "%s/made", dir);
  ASSERT_EQ(rmdir(path), 0);
  snprintf(path, sizeof path, "%s/run-b-000000000001.ckpt", dir);
  ASSERT_EQ(bee_ckpt_prepare(path, err, sizeof err), -ENOTDIR);
  ASSERT(strstr(err, "run-b-000000000001.ckpt"));
  snprintf(path, sizeof path, "%s/run-b-000000000001.ckpt/sub", dir);
  ASSERT_EQ(bee_ckpt_prepare(path, err, sizeof err), -ENOTDIR);
  ASSERT(strstr(err, "Not a directory"));
  ASSERT(bee_ckpt_prepare("", err, sizeof err) != 0);

  /* Clean up. */
  DIR *d = opendir(dir);
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.')
      continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    unlink(path);
  }
  closedir(d);
  ASSERT_EQ(rmdir(dir), 0);
  return 0;
}
