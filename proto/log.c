/* log.c: error names and texts, and the one-line-per-event logger.
 *
 * Lines go to stderr as "LEVEL component: message" so journald keeps them
 * as one record each and adds its own timestamp; when stderr is not a
 * journal (a terminal or a file) a timestamp is prefixed.
 */
#include "proto-int.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const struct {
  const char *name;
  const char *text;
} errs[] = {
#define E(code, text) [code - BEE_EBASE - 1] = {&(#code)[4], text}
    E(BEE_EMALFORMED, "malformed msgpack"),
    E(BEE_ETRUNCATED, "message truncated"),
    E(BEE_ETRAILING, "trailing bytes after message"),
    E(BEE_ETYPE, "field has the wrong type or count"),
    E(BEE_EMISSING, "required field missing"),
    E(BEE_EUNKNOWN, "unknown message type"),
    E(BEE_EVERSION, "unsupported protocol version"),
    E(BEE_EDEPTH, "nesting too deep"),
    E(BEE_ETOOBIG, "size over limit"),
    E(BEE_ERANGE, "value out of range"),
    E(BEE_EAUTH, "authentication failed"),
    E(BEE_ENOTOKEN, "no access token presented"),
    E(BEE_ETOKEN_FORGED, "access token signature invalid"),
    E(BEE_ETOKEN_EXPIRED, "access token expired"),
    E(BEE_ETOKEN_EARLY, "access token issued in the future"),
    E(BEE_ETOKEN_SWARM, "access token is for another swarm"),
    E(BEE_ETOKEN_ROLE, "access token role not accepted"),
    E(BEE_ETOKEN_PEER, "access token names another peer"),
    E(BEE_ETOKEN_MODERATOR, "access token signed by another moderator"),
    E(BEE_EREVOKED, "peer is revoked"),
    E(BEE_EOPEN_MISMATCH, "one side is moderated, the other open"),
    E(BEE_ECIPHER, "no common cipher"),
    E(BEE_EKEYPERM, "key file is accessible to group or others (chmod 600)"),
    E(BEE_EKEYFILE, "key or token file malformed"),
    E(BEE_ETIMEOUT, "timed out"),
    E(BEE_ECLOSED, "connection closed"),
    E(BEE_ECANCELED, "canceled"),
    E(BEE_ENOMETHOD, "unknown method"),
    E(BEE_EQUEUE, "write queue full"),
    E(BEE_ELIMIT, "limit reached"),
    E(BEE_ESELF, "connected to self"),
    E(BEE_ECONFIG, "bad configuration"),
    E(BEE_EREMOTE, "peer reported an error"),
    E(BEE_EEXPIRED, "record expired"),
    E(BEE_ESTALE, "record older than the one held"),
    E(BEE_EMISSED, "the round's group formed without us"),
#undef E
};

bool bee_log_burst_at(bee_log_burst *b, const char *line, uint64_t now_ms,
                      char *more, size_t cap) {
  /* FNV-1a of the text; never 0 (a free slot). */
  uint64_t h = 1469598103934665603ull;
  for (const char *p = line; *p; p++)
    h = (h ^ (uint8_t)*p) * 1099511628211ull;
  h |= 1;
  more[0] = '\0';
  /* Its slot; else a free one, else the one logged longest ago. */
  size_t k, slot = 0;
  for (k = 0; k < BEE_LOG_BURST_KINDS && b->kind[k].hash != h; k++)
    if (b->kind[slot].hash &&
        (!b->kind[k].hash || b->kind[k].last_ms < b->kind[slot].last_ms))
      slot = k;
  if (k == BEE_LOG_BURST_KINDS) {
    b->kind[slot].hash = h;
    b->kind[slot].last_ms = now_ms;
    b->kind[slot].held = 0;
    return true;
  }
  if (now_ms - b->kind[k].last_ms < BEE_LOG_BURST_MS) {
    b->kind[k].held++;
    return false;
  }
  if (b->kind[k].held)
    snprintf(more, cap, " (%llu more in the last %llu s)",
             (unsigned long long)b->kind[k].held,
             (unsigned long long)((now_ms - b->kind[k].last_ms + 500) / 1000));
  b->kind[k].last_ms = now_ms;
  b->kind[k].held = 0;
  return true;
}

bool bee_log_burst_now(bee_log_burst *b, const char *line, char *more,
                       size_t cap) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return bee_log_burst_at(
      b, line, (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000,
      more, cap);
}

const char *bee_strerror(int code) {
  if (code > BEE_EBASE && code < BEE_ELAST && errs[code - BEE_EBASE - 1].text)
    return errs[code - BEE_EBASE - 1].text;
  if (code < 0 && code > -4096)
    return strerror(-code);
  return code == 0 ? "ok" : "unknown error";
}

const char *bee_errname(int code) {
  if (code > BEE_EBASE && code < BEE_ELAST && errs[code - BEE_EBASE - 1].name)
    return errs[code - BEE_EBASE - 1].name;
  if (code < 0 && code > -4096)
    return "ERRNO";
  return code == 0 ? "OK" : "EUNKNOWN_CODE";
}

char *bee_printable(const void *p, size_t n, char *out, size_t cap) {
  const uint8_t *s = p;
  size_t k = n < cap - 1 ? n : cap - 1;
  for (size_t i = 0; i < k; i++)
    out[i] = s[i] >= 0x20 && s[i] < 0x7f ? (char)s[i] : '?';
  out[k] = 0;
  return out;
}

static int log_level = BEE_LOG_INFO;
static int log_stamp = -1; /* -1: decide on first use */

void bee_log_set_level(int level) { log_level = level; }
int bee_log_get_level(void) { return log_level; }

int bee_log_level_parse(const char *s, int *level) {
  static const char *names[] = {"error", "warn", "info", "debug"};
  for (int i = 0; i < 4; i++)
    if (strcmp(s, names[i]) == 0) {
      *level = i;
      return 0;
    }
  return BEE_ECONFIG;
}

void bee_log(int level, const char *component, const char *fmt, ...) {
  static const char *tags[] = {"ERROR", "WARN", "INFO", "DEBUG"};
  if (level > log_level)
    return;
  if (log_stamp < 0)
    log_stamp = getenv("JOURNAL_STREAM") == NULL;
  char line[2048];
  size_t n = 0;
  if (log_stamp) {
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    n = strftime(line, sizeof line, "%H:%M:%S", &tm);
    n += (size_t)snprintf(line + n, sizeof line - n, ".%03ld ",
                          ts.tv_nsec / 1000000);
  }
  if (level < 0 || level > BEE_LOG_DEBUG)
    level = BEE_LOG_ERROR;
  n += (size_t)snprintf(line + n, sizeof line - n, "%-5s %s: ", tags[level],
                        component);
  if (n < sizeof line) {
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(line + n, sizeof line - n, fmt, ap);
    va_end(ap);
    n = w < 0 ? n : n + (size_t)w;
  }
  if (n >= sizeof line - 1)
    n = sizeof line - 2;
  line[n++] = '\n';
  /* One write per line so lines from several threads never interleave. */
  ssize_t unused = write(STDERR_FILENO, line, n);
  (void)unused;
}
