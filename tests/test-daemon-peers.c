/* test-daemon-peers.c: beed's known-peers file (daemon/peers.c).
 *
 * The list keeps distinct addresses up to BEE_KNOWN_MAX and compares as a
 * set; a saved file reads back the same, mode 0600, with nothing left
 * beside it; reading skips comments, blanks, CRLF and surrounding blanks,
 * counts the lines that are not addresses (with the first one's number),
 * including a NUL inside one and one longer than an address may be; a
 * missing file is -ENOENT, a directory or an oversized file an error
 * naming it; and the start-up check refuses a missing directory, a
 * directory named as the file, and a path ending in '/'; the directory of
 * a path and its check.  Files live in a
 * fresh temporary directory.
 */
#include "bee.h"
#include "test.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[256];
static char err[1024];

static void put(const char *path, const char *p, size_t n) {
  FILE *f = fopen(path, "wb");
  ASSERT(f);
  ASSERT_EQ(fwrite(p, 1, n, f), n);
  ASSERT_EQ(fclose(f), 0);
}

int main(void) {
  const char *base = getenv("TMPDIR");
  snprintf(dir, sizeof dir, "%s/test-daemon-peers-XXXXXX",
           base && *base ? base : "/tmp");
  ASSERT(mkdtemp(dir) != NULL);
  char path[512], other[512];
  struct stat st;
  size_t bad, bad_line;
  static bee_known k, r;

  /* The list: distinct, bounded, compared as a set. */
  ASSERT(bee_known_add(&k, "10.0.0.1:45555"));
  ASSERT(!bee_known_add(&k, "10.0.0.1:45555"));
  ASSERT(!bee_known_add(&k, ""));
  ASSERT(bee_known_add(&k, "[fd00::12]:45556"));
  ASSERT(bee_known_add(&k, "queen.example.org:45555"));
  ASSERT_EQ(k.n, 3);
  ASSERT(bee_known_add(&r, "queen.example.org:45555"));
  ASSERT(bee_known_add(&r, "10.0.0.1:45555"));
  ASSERT(!bee_known_same(&k, &r));
  ASSERT(bee_known_add(&r, "[fd00::12]:45556"));
  ASSERT(bee_known_same(&k, &r));
  ASSERT(bee_known_has(&r, "[fd00::12]:45556"));
  ASSERT(!bee_known_has(&r, "10.0.0.2:45555"));
  r.n = 0;
  for (int i = 0; i < BEE_KNOWN_MAX + 5; i++) {
    char a[32];
    snprintf(a, sizeof a, "10.1.0.%d:4000", i);
    ASSERT_EQ(bee_known_add(&r, a), i < BEE_KNOWN_MAX);
  }
  ASSERT_EQ(r.n, BEE_KNOWN_MAX);

  /* Save and read back: the same set, mode 0600, no temporary left. */
  snprintf(path, sizeof path, "%s/peers", dir);
  ASSERT_EQ(bee_known_load(&r, path, &bad, &bad_line, err, sizeof err),
            -ENOENT);
  ASSERT_OK(bee_known_prepare(path, err, sizeof err));
  ASSERT_OK(bee_known_save(&k, path, err, sizeof err));
  ASSERT_EQ(stat(path, &st), 0);
  ASSERT_EQ(st.st_mode & 0777, 0600);
  ASSERT_OK(bee_known_load(&r, path, &bad, &bad_line, err, sizeof err));
  ASSERT_UEQ(bad, 0);
  ASSERT(bee_known_same(&k, &r));
  ASSERT_OK(bee_known_prepare(path, err, sizeof err)); /* the file is there */
  r.n = 0;
  for (int i = 0; i < BEE_KNOWN_MAX; i++) { /* a full list round-trips */
    char a[64];
    snprintf(a, sizeof a, "node-%02d.a-rather-long-domain.example.org:%d", i,
             40000 + i);
    ASSERT(bee_known_add(&r, a));
  }
  ASSERT_OK(bee_known_save(&r, path, err, sizeof err));
  ASSERT_OK(bee_known_load(&k, path, &bad, &bad_line, err, sizeof err));
  ASSERT(bee_known_same(&k, &r));
  snprintf(other, sizeof other, "ls -A '%s' | grep -c . | grep -qx 1", dir);
  ASSERT_EQ(system(other), 0);

  /* Comments, blanks, CRLF and blanks around an address are fine; what is
   * not an address is skipped and counted. */
  char line[400];
  memset(line, 'a', sizeof line);
  memcpy(line + sizeof line - 6, ":4000\n", 6);
  char text[1024];
  size_t n = (size_t)snprintf(text, sizeof text,
                              "# known peers\n"
                              "\n"
                              "  10.0.0.1:45555  \r\n"
                              "10.0.0.2:45555 # the second\n"
                              "10.0.0.1:45555\n"
                              "not an address\n"
                              "10.0.0.3:0\n"
                              "10.0.0.4:99999\n"
                              "\t[fd00::1]:7\n");
  memcpy(text + n, line, sizeof line); /* line 10: too long */
  n += sizeof line;
  memcpy(text + n, "10.0.0.5:1\0x\n10.0.0.6:2", 23); /* 11: a NUL inside */
  n += 23; /* 12: no newline at the end */
  put(path, text, n);
  ASSERT_OK(bee_known_load(&r, path, &bad, &bad_line, err, sizeof err));
  ASSERT_UEQ(r.n, 4);
  ASSERT(bee_known_has(&r, "10.0.0.1:45555"));
  ASSERT(bee_known_has(&r, "10.0.0.2:45555"));
  ASSERT(bee_known_has(&r, "[fd00::1]:7"));
  ASSERT(bee_known_has(&r, "10.0.0.6:2"));
  ASSERT_UEQ(bad, 5);
  ASSERT_UEQ(bad_line, 6);

  /* Past BEE_KNOWN_MAX entries the rest are ignored, not refused. */
  FILE *f = fopen(path, "w");
  ASSERT(f);
  for (int i = 0; i < 3 * BEE_KNOWN_MAX; i++)
    fprintf(f, "10.2.%d.%d:5000\n", i / 200, i % 200);
  ASSERT_EQ(fclose(f), 0);
  ASSERT_OK(bee_known_load(&r, path, &bad, &bad_line, err, sizeof err));
  ASSERT_UEQ(r.n, BEE_KNOWN_MAX);
  ASSERT_UEQ(bad, 0);

  /* Files that cannot be read as one: named in the error. */
  f = fopen(path, "w");
  ASSERT(f);
  for (int i = 0; i < 5000; i++)
    fprintf(f, "# padding line %d\n", i);
  ASSERT_EQ(fclose(f), 0);
  ASSERT(bee_known_load(&r, path, &bad, &bad_line, err, sizeof err) != 0);
  ASSERT(strstr(err, path) && strstr(err, "longer than"));
  ASSERT_EQ(r.n, 0);
  ASSERT_EQ(unlink(path), 0);
  ASSERT(bee_known_load(&r, dir, &bad, &bad_line, err, sizeof err) != 0);
  ASSERT(strstr(err, dir) && strstr(err, "not a regular file"));

  /* Where a file's directory is, and whether it may be written in. */
  bee_dir_of("peers", other, sizeof other);
  ASSERT_STREQ(other, ".");
  bee_dir_of("/peers", other, sizeof other);
  ASSERT_STREQ(other, "/");
  bee_dir_of("/var/lib/beed/peers", other, sizeof other);
  ASSERT_STREQ(other, "/var/lib/beed");
  bee_dir_of("a/", other, sizeof other);
  ASSERT_STREQ(other, "a");
  ASSERT_OK(bee_dir_check(dir));
  snprintf(path, sizeof path, "%s/none", dir);
  ASSERT_EQ(bee_dir_check(path), -ENOENT);

  /* The start-up check. */
  snprintf(path, sizeof path, "%s/missing/peers", dir);
  ASSERT_EQ(bee_known_prepare(path, err, sizeof err), -ENOENT);
  ASSERT(strstr(err, "--peers-file") && strstr(err, path));
  ASSERT_EQ(bee_known_prepare(dir, err, sizeof err), -EISDIR);
  snprintf(path, sizeof path, "%s/", dir);
  ASSERT_EQ(bee_known_prepare(path, err, sizeof err), -EISDIR);
  snprintf(path, sizeof path, "%s/afile", dir);
  put(path, "x", 1);
  snprintf(other, sizeof other, "%s/afile/peers", dir);
  ASSERT_EQ(bee_known_prepare(other, err, sizeof err), -ENOTDIR);
  ASSERT(bee_known_prepare("", err, sizeof err) != 0);
  ASSERT_OK(bee_known_prepare("peers-in-the-working-directory", err,
                              sizeof err));
  ASSERT_EQ(unlink(path), 0);
  ASSERT_EQ(rmdir(dir), 0);
  return 0;
}
