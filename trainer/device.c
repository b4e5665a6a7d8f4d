/* device.c: device specs, the CPU device, and the choice of device.
 *
 * Parses "--device" specs, describes the CPU, and decides between the CPU
 * and CUDA; the CUDA runtime itself is behind trn__cuda_* (cuda.cu, in
 * the module cuda-load.c opens, when there is one).  Also holds the
 * trainer's log hook.
 */
#include "trainer-int.h"

#include <cblas.h>

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- logging ----------------------------------------------------------- */

static trn_log_cb log_cb;
static void *log_data;

void trn_log_set(trn_log_cb cb, void *data) {
  log_cb = cb;
  log_data = data;
}

void trn__log(int level, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  trn__vlog(level, fmt, ap);
  va_end(ap);
}

void trn__vlog(int level, const char *fmt, va_list ap) {
  static const char *const names[] = {"ERROR", "WARN", "INFO", "DEBUG"};
  char line[512];
  vsnprintf(line, sizeof line, fmt, ap);
  if (log_cb) {
    log_cb(level, line, log_data);
    return;
  }
  /* Without a hook, debug lines are dropped: nobody asked for them. */
  if (level >= TRN_LOG_ERROR && level < TRN_LOG_DEBUG)
    fprintf(stderr, "%s trainer: %s\n", names[level], line);
}

/* Writes one line into the caller's why buffer, if it has one. */
static void say(char *why, size_t why_len, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

static void say(char *why, size_t why_len, const char *fmt, ...) {
  if (!why || why_len == 0)
    return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, why_len, fmt, ap);
  va_end(ap);
}

int trn_device_count_cuda(int *n) { return trn__cuda_count(n, NULL, 0); }

size_t trn_cudnn_version(void) { return trn__cudnn_version(); }

/* ---- host memory for batches ------------------------------------------- */

/* Each block starts with this header; both allocators' blocks are 64-byte
 * aligned (cudaMallocHost's by the page), so the caller's part is too. */
typedef union host_head {
  uint32_t magic; /* HOST_PLAIN or HOST_PINNED */
  max_align_t align;
  unsigned char pad[64];
} host_head;

_Static_assert(sizeof(host_head) == 64, "host_head is 64 bytes");

enum { HOST_PLAIN = 0x62656550u, HOST_PINNED = 0x6265654cu };

void *trn_host_alloc(size_t bytes, bool pinned) {
  if (bytes > SIZE_MAX - 2 * sizeof(host_head))
    return NULL;
  host_head *h = NULL;
  uint32_t magic = HOST_PLAIN;
  /* aligned_alloc wants a multiple of the alignment. */
  size_t total = (sizeof *h + bytes + sizeof *h - 1) / sizeof *h * sizeof *h;
  if (pinned && trn__cuda_host_alloc(total, (void **)&h) == 0)
    magic = HOST_PINNED;
  else if (!(h = aligned_alloc(sizeof *h, total)))
    return NULL;
  h->magic = magic;
  return h + 1;
}

bool trn_host_pinned(const void *p) {
  return p && ((const host_head *)p - 1)->magic == HOST_PINNED;
}

void trn_host_free(void *p) {
  if (!p)
    return;
  host_head *h = (host_head *)p - 1;
  if (h->magic == HOST_PINNED)
    trn__cuda_host_free(h);
  else
    free(h);
}

/* ---- specs ------------------------------------------------------------- */

/* Parses the N of "cuda:N": decimal digits only, no sign, no leading zero,
 * at most TRN_DEV_INDEX_MAX. */
static int parse_index(const char *s, int *index) {
  int v = 0;
  if (*s == '\0' || (s[0] == '0' && s[1] != '\0'))
    return -EINVAL;
  for (; *s; s++) {
    if (*s < '0' || *s > '9')
      return -EINVAL;
    v = v * 10 + (*s - '0');
    if (v > TRN_DEV_INDEX_MAX)
      return -EINVAL;
  }
  *index = v;
  return 0;
}

int trn_device_parse(const char *spec, int *kind, int *index) {
  int k, i = 0;
  if (!spec || strcmp(spec, "auto") == 0) {
    k = TRN_DEV_AUTO;
  } else if (strcmp(spec, "cpu") == 0) {
    k = TRN_DEV_CPU;
  } else if (strcmp(spec, "cuda") == 0) {
    k = TRN_DEV_CUDA;
  } else if (strncmp(spec, "cuda:", 5) == 0) {
    k = TRN_DEV_CUDA;
    if (parse_index(spec + 5, &i))
      return -EINVAL;
  } else {
    return -EINVAL;
  }
  *kind = k;
  *index = i;
  return 0;
}

/* A decimal number in 0..max: digits only, no sign, no leading zero. */
static int parse_uint(const char *s, unsigned long max, unsigned long *out) {
  unsigned long v = 0;
  if (*s == '\0' || (s[0] == '0' && s[1] != '\0'))
    return -EINVAL;
  for (; *s; s++) {
    if (*s < '0' || *s > '9' || (v = v * 10 + (unsigned long)(*s - '0')) > max)
      return -EINVAL;
  }
  *out = v;
  return 0;
}

/* S of a loss-scale spec: 2^E or a decimal power of two. */
static int parse_scale(const char *s, float *out) {
  unsigned long u;
  if (s[0] == '2' && s[1] == '^') {
    bool neg = s[2] == '-';
    if (parse_uint(s + 2 + neg, neg ? 24 : 127, &u))
      return -EINVAL;
    *out = ldexpf(1.0f, neg ? -(int)u : (int)u);
    return 0;
  }
  if (parse_uint(s, 1ul << 31, &u) || u == 0 || (u & (u - 1)))
    return -EINVAL;
  *out = (float)u;
  return 0;
}

int trn_loss_scale_parse(const char *spec, float *scale, bool *fixed) {
  float v = TRN_LOSS_SCALE_START;
  bool dyn = strncmp(spec, "dynamic", 7) == 0;
  if (strcmp(spec, "auto") == 0)
    v = 0;
  else if (dyn && spec[7] != '\0' &&
           (spec[7] != ':' || parse_scale(spec + 8, &v)))
    return -EINVAL;
  else if (!dyn && parse_scale(spec, &v))
    return -EINVAL;
  *scale = v;
  *fixed = !dyn && v != 0;
  return 0;
}

/* ---- the CPU ----------------------------------------------------------- */

static int online_cpus(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  if (n < 1)
    return 1;
  return n > INT_MAX ? INT_MAX : (int)n;
}

static uint64_t physical_memory(void) {
  long pages = sysconf(_SC_PHYS_PAGES), page_bytes = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_bytes <= 0)
    return 0;
  return (uint64_t)pages * (uint64_t)page_bytes;
}

/* Reads the CPU model from /proc/cpuinfo's "model name" line (x86).  Other
 * architectures spell it differently or not at all; they get "cpu". */
static void cpu_model(char *buf, size_t len) {
  char line[256];
  snprintf(buf, len, "cpu");
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f)
    return;
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, "model name", 10) != 0)
      continue;
    char *v = strchr(line, ':');
    if (v) {
      v += strspn(v + 1, " \t") + 1;
      v[strcspn(v, "\n")] = '\0';
      if (*v)
        snprintf(buf, len, "%s", v);
    }
    break;
  }
  fclose(f);
}

static void open_cpu(trn_device *d) {
  memset(d, 0, sizeof *d);
  d->kind = TRN_DEV_CPU;
  cpu_model(d->name, sizeof d->name);
  d->mem_bytes = physical_memory();
  d->cpu_threads = online_cpus();
}

/* ---- choosing ---------------------------------------------------------- */

static int open_cuda(int index, trn_device *d) {
  memset(d, 0, sizeof *d);
  d->kind = TRN_DEV_CUDA;
  d->index = index;
  d->cpu_threads = online_cpus();
  int rc = trn__cuda_props(index, d);
  if (rc == 0)
    rc = trn__cuda_bind(index);
  return rc;
}

static void say_cuda(char *why, size_t why_len, const char *how,
                     const trn_device *d) {
  say(why, why_len, "%scuda:%d: %s, %.1f GiB, sm_%d%d", how, d->index, d->name,
      (double)d->mem_bytes / (1024.0 * 1024 * 1024), d->sm_major, d->sm_minor);
}

/* Opens the CPU because auto found no usable CUDA device; reason says why. */
static void fall_back(trn_device *d, const char *reason, char *why,
                      size_t why_len) {
  open_cpu(d);
  say(why, why_len,
      "auto: using the CPU, %d threads; no usable CUDA device: %s",
      d->cpu_threads, reason);
}

int trn_device_open(const char *spec, trn_device *out, char *why,
                    size_t why_len) {
  trn_device d;
  char reason[256] = "";
  int kind, index, n = 0;
  int rc = trn_device_parse(spec, &kind, &index);
  if (why && why_len > 0)
    why[0] = '\0';
  if (rc) {
    say(why, why_len, "bad device \"%s\": expected auto, cpu, cuda or cuda:N",
        spec);
    goto out;
  }
  if (kind == TRN_DEV_CPU) {
    open_cpu(&d);
    say(why, why_len, "cpu: %s, %d threads", d.name, d.cpu_threads);
    goto out;
  }
  if (kind == TRN_DEV_CUDA && !trn_cuda_available()) {
    rc = -ENOTSUP;
    say(why, why_len, "cuda:%d: %s", index, trn__cuda_missing());
    goto out;
  }

  rc = trn__cuda_count(&n, reason, sizeof reason);
  if (kind == TRN_DEV_AUTO) {
    /* Whatever keeps the node training: a broken driver is logged and
     * reported in why, not fatal. */
    if (rc || n == 0) {
      fall_back(&d, reason, why, why_len);
      rc = 0;
      goto out;
    }
    if ((rc = open_cuda(0, &d))) {
      fall_back(&d, "cuda:0 failed to open, see the log", why, why_len);
      rc = 0;
      goto out;
    }
    say_cuda(why, why_len, "auto: ", &d);
    goto out;
  }

  if (rc) {
    say(why, why_len, "cuda:%d: %s", index, reason);
  } else if (index >= n && n == 0) {
    rc = -ENODEV;
    say(why, why_len, "cuda:%d: there is no CUDA device: %s", index, reason);
  } else if (index >= n && n == 1) {
    rc = -ENODEV;
    say(why, why_len, "cuda:%d: only 1 CUDA device is present (cuda:0)", index);
  } else if (index >= n) {
    rc = -ENODEV;
    say(why, why_len, "cuda:%d: only %d CUDA devices are present (cuda:0-%d)",
        index, n, n - 1);
  } else if ((rc = open_cuda(index, &d))) {
    say(why, why_len, "cuda:%d: the CUDA runtime failed, see the log", index);
  } else {
    say_cuda(why, why_len, "", &d);
  }

out:
  if (rc == 0)
    *out = d;
  return rc;
}

int trn_device_bind(const trn_device *dev) {
  switch (dev->kind) {
  case TRN_DEV_CPU: return 0;
  case TRN_DEV_CUDA: return trn__cuda_bind(dev->index);
  default: return -EINVAL;
  }
}

/* ---- OpenBLAS's kernels --------------------------------------------------- */

int trn_blas_better_core(char *name, size_t name_len, char *why,
                         size_t why_len) {
  const char *now = openblas_get_corename();
  const char *env = getenv("OPENBLAS_CORETYPE");
  if (name_len)
    name[0] = 0;
  if (!now)
    now = "?";
  if (strcmp(trn__sgemm_name(), "openblas") != 0) {
    /* gemm.c's kernel does the products: OpenBLAS's choice is moot. */
    trn__fail(why, why_len, 0,
              "matrix products run in the trainer's AVX-512 kernel "
              "(OpenBLAS, with its %s kernels, only where that is off)",
              now);
    return 0;
  }
#if defined(__x86_64__) && defined(__GNUC__)
  /* OpenBLAS's AVX-512 kernels (SkylakeX, Cooperlake, SapphireRapids)
   * need AVX-512 F, BW, DQ and VL. */
  bool avx512 = __builtin_cpu_supports("avx512f") &&
                __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512dq") &&
                __builtin_cpu_supports("avx512vl");
  bool has512 = strcmp(now, "SkylakeX") == 0 ||
                strcmp(now, "Cooperlake") == 0 ||
                strcmp(now, "SapphireRapids") == 0;
  if (avx512 && !has512) {
    snprintf(name, name_len, "SkylakeX");
    trn__fail(why, why_len, 0,
              "OpenBLAS runs its %s kernels on a CPU with AVX-512%s%s%s; "
              "OPENBLAS_CORETYPE=SkylakeX (or leaving it unset) selects "
              "AVX-512 ones",
              now, env ? " (OPENBLAS_CORETYPE=" : "", env ? env : "",
              env ? " in the environment)" : "");
    return 1;
  }
#endif
  trn__fail(why, why_len, 0, "OpenBLAS runs its %s kernels", now);
  return 0;
}
