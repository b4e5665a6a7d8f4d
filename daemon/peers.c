/* peers.c: the known-peers file (--peers-file).
 *
 * A bee that restarts, perhaps at a new address, may find its --join
 * targets gone (the queen was preempted too).  Its DHT contacts of the
 * last run are then the way back into the swarm: main.c writes their
 * addresses here while it runs and at the stop, and bootstraps through
 * them beside the --join targets at the next start.
 *
 * The file is text, one HOST:PORT per line, '#' starting a comment:
 *
 *   # beed known peers: DHT contacts, tried at the next start
 *   10.0.3.7:45555
 *   [fd00::12]:45555
 *
 * It is a cache: a missing file is a first start, a line that is not an
 * address is skipped with a warning, and nothing in it can stop beed. */
#include "bee.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define KNOWN_FILE_MAX (64 * 1024)

bool bee_known_add(bee_known *k, const char *addr) {
  size_t n = strlen(addr);
  if (n == 0 || n >= BEE_ADDR_MAX || k->n >= BEE_KNOWN_MAX)
    return false;
  for (size_t i = 0; i < k->n; i++)
    if (strcmp(k->addr[i], addr) == 0)
      return false;
  memcpy(k->addr[k->n++], addr, n + 1);
  return true;
}

bool bee_known_has(const bee_known *k, const char *addr) {
  for (size_t i = 0; i < k->n; i++)
    if (strcmp(k->addr[i], addr) == 0)
      return true;
  return false;
}

bool bee_known_same(const bee_known *a, const bee_known *b) {
  if (a->n != b->n)
    return false;
  for (size_t i = 0; i < a->n; i++) /* entries are distinct */
    if (!bee_known_has(b, a->addr[i]))
      return false;
  return true;
}

int bee_known_prepare(const char *path, char *err, size_t errlen) {
  char dir[BEE_PATH_MAX];
  size_t n = strlen(path);
  if (n == 0 || n >= sizeof dir)
    return bee_failf(err, errlen, BEE_ETOOBIG,
                     "--peers-file: a path of 1 to %d bytes", BEE_PATH_MAX - 1);
  bee_dir_of(path, dir, sizeof dir);
  struct stat st;
  int rc = 0;
  if (path[n - 1] == '/')
    rc = -EISDIR;
  else if (stat(path, &st) == 0 && !S_ISREG(st.st_mode))
    rc = S_ISDIR(st.st_mode) ? -EISDIR : -EINVAL;
  else
    rc = bee_dir_check(dir);
  if (rc == -EINVAL)
    return bee_failf(err, errlen, rc, "--peers-file %s: not a regular file",
                     path);
  if (rc)
    return bee_failf(err, errlen, rc, "--peers-file %s: %s", path,
                     strerror(-rc));
  return 0;
}

int bee_known_load(bee_known *k, const char *path, size_t *bad,
                   size_t *bad_line, char *err, size_t errlen) {
  uint8_t *buf = NULL;
  size_t len = 0;
  k->n = 0;
  *bad = *bad_line = 0;
  int rc = proto_read_file(path, KNOWN_FILE_MAX, &buf, &len);
  if (rc == -ENOENT)
    return rc;
  if (rc == BEE_EKEYFILE)
    return bee_failf(err, errlen, rc, "%s: not a regular file", path);
  if (rc == BEE_ETOOBIG)
    return bee_failf(err, errlen, rc, "%s: longer than %d bytes", path,
                     KNOWN_FILE_MAX);
  if (rc)
    return bee_failf(err, errlen, rc, "%s: %s", path, bee_strerror(rc));
  char *s = (char *)buf, *end = s + len;
  for (size_t line = 1; s < end; line++) {
    char *nl = memchr(s, '\n', (size_t)(end - s));
    char *e = nl ? nl : end;
    char *hash = memchr(s, '#', (size_t)(e - s));
    char *stop = hash ? hash : e;
    while (s < stop && (*s == ' ' || *s == '\t'))
      s++;
    while (stop > s && (stop[-1] == ' ' || stop[-1] == '\t' ||
                        stop[-1] == '\r'))
      stop--;
    if (stop > s) {
      char host[BEE_HOST_MAX];
      unsigned port;
      size_t n = (size_t)(stop - s);
      bool ok = n < BEE_ADDR_MAX && !memchr(s, '\0', n);
      if (ok) {
        char save = *stop;
        *stop = '\0';
        ok = bee_addr_parse(s, false, host, sizeof host, &port) == 0;
        if (ok)
          bee_known_add(k, s); /* past BEE_KNOWN_MAX: ignored */
        *stop = save;
      }
      if (!ok && (*bad)++ == 0)
        *bad_line = line;
    }
    s = nl ? nl + 1 : end;
  }
  free(buf);
  return 0;
}

int bee_known_save(const bee_known *k, const char *path, char *err,
                   size_t errlen) {
  char text[BEE_KNOWN_MAX * (BEE_ADDR_MAX + 1) + 128];
  size_t n = (size_t)snprintf(text, sizeof text,
                              "# beed known peers: DHT contacts, tried at the "
                              "next start\n");
  for (size_t i = 0; i < k->n; i++)
    n += (size_t)snprintf(text + n, sizeof text - n, "%s\n", k->addr[i]);
  int rc = proto_write_file(path, text, n, 0600, false);
  if (rc)
    return bee_failf(err, errlen, rc, "%s: %s", path, bee_strerror(rc));
  return 0;
}
