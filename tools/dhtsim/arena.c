/* arena.c: malloc over one fixed-address region, and saving that region to
 * a file and loading it back (see arena.h).
 *
 * The region is reserved (PROT_NONE) at ARENA_BASE and made writable from
 * its start as it fills.  It begins with the allocator's state and a map of
 * one byte per 64 KiB page (free, the size class of a small page, or the
 * head or tail of a run), so the whole allocator, not just the blocks it
 * handed out, is in what a save writes.
 *
 * Small blocks (up to 32 KiB): 80 classes, 8 bytes apart up to 128, then
 * eight per power of two (at most 12% rounding, and the DHT's big structs,
 * a 1408-byte bucket for one, fit a class exactly or nearly).  A class
 * carves slabs (one page, or as many as hold 16 of its blocks) one block
 * after another and keeps its freed blocks in a list threaded through
 * them; a page, once a class's, stays that class's.  Blocks of classes that are multiples of 16
 * are 16-byte aligned; the others (24, 40, ...) are 8-byte aligned, which
 * is all an object of that size can need.  Big blocks are runs of whole
 * pages with a 64-byte header; freed runs go to lists by length (exact up
 * to 64 pages, best fit above, split when longer) and give their memory
 * back to the kernel when they are 1 MiB or more.
 */
#define _GNU_SOURCE
#include "arena.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <sodium.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/personality.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define ARENA_OFF 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ARENA_OFF 1
#endif
#endif

#define ARENA_BASE ((uintptr_t)0x200000000000u) /* 32 TiB, far from all */
#define ARENA_SIZE ((size_t)1 << 40)            /* reserved, not used */
#define PAGE_SHIFT 16
#define PAGE ((size_t)1 << PAGE_SHIFT)
#define NPAGES (ARENA_SIZE >> PAGE_SHIFT)
#define MAP_AT 4096 /* the page map follows the state */
#define FIRST_PAGE ((MAP_AT + NPAGES + PAGE - 1) / PAGE)
#define COMMIT_STEP ((size_t)64 << 20)
#define NCLASS 80
#define SMALL_MAX 32768
#define RUN_HDR 64
#define RUN_LISTS 64   /* exact free lists, 1..64 pages */
#define RUN_RELEASE 16 /* pages: give freed runs this long back */
#define M_FREE 0       /* map: 1..NCLASS is a class + 1 */
#define M_HEAD 254
#define M_TAIL 255
#define STATE_MAGIC 0x6265656172656e61ull /* "beearena" */

typedef struct aclass {
  uintptr_t free;      /* freed blocks, each holding the next's address */
  uintptr_t bump, end; /* the rest of the class's newest page */
} aclass;

typedef struct arun {
  size_t npages;
  struct arun *next; /* in a free list */
} arun;

typedef struct astate {
  uint64_t magic;
  size_t top;       /* pages ever handed out: the next new one */
  size_t committed; /* bytes from ARENA_BASE that are writable */
  aclass cls[NCLASS];
  arun *runs[RUN_LISTS + 1]; /* free runs by length; [0]: longer ones */
  void *root;
} astate;

_Static_assert(sizeof(astate) <= MAP_AT, "the state overlaps the page map");

#define A ((astate *)ARENA_BASE)
#define MAP ((uint8_t *)(ARENA_BASE + MAP_AT))

static bool active;

bool arena_active(void) { return active; }

size_t arena_used(void) { return active ? A->top * PAGE : 0; }

int arena_fixed_layout(char **argv) {
  int p = personality(0xffffffff);
  if (p == -1)
    return -errno;
  if (p & ADDR_NO_RANDOMIZE)
    return 0;
  if (personality((unsigned long)p | ADDR_NO_RANDOMIZE) == -1)
    return -errno;
  execv("/proc/self/exe", argv);
  return -errno;
}

#ifdef ARENA_OFF

int arena_start(void) { return -ENOTSUP; }

int arena_save(const char *path, void *root, const char **why) {
  (void)path, (void)root;
  *why = "this build (AddressSanitizer) has no arena";
  return -ENOTSUP;
}

void *arena_load(const char *path, const char **why) {
  (void)path;
  *why = "this build (AddressSanitizer) has no arena";
  return NULL;
}

#else /* the arena */

/* Writes what failed and the errno into a static buffer for *why. */
static const char *why_errno(const char *what, int err) {
  static char buf[320];
  snprintf(buf, sizeof buf, "%.200s: %s", what, strerror(err));
  return buf;
}

extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t a, size_t b);
extern void *__libc_realloc(void *p, size_t n);
extern void *__libc_memalign(size_t align, size_t n);
extern void __libc_free(void *p);

static bool in_arena(const void *p) {
  return active && (uintptr_t)p - ARENA_BASE < ARENA_SIZE;
}

static size_t class_of(size_t n) {
  if (n <= 128)
    return n ? ((n + 7) >> 3) - 1 : 0;
  unsigned p = 63u - (unsigned)__builtin_clzll(n - 1); /* 2^p < n <= 2^p+1 */
  return 16 + (p - 7) * 8 + ((n - 1 - ((size_t)1 << p)) >> (p - 3));
}

static size_t class_size(size_t c) {
  if (c < 16)
    return (c + 1) * 8;
  unsigned p = 7 + (unsigned)(c - 16) / 8;
  return ((size_t)1 << p) + ((c - 16) % 8 + 1) * ((size_t)1 << (p - 3));
}

/* Pages a class takes at a time: enough for 16 blocks, so that a page's
 * unusable tail stays small beside what it holds. */
static size_t slab_pages(size_t size) {
  size_t np = (16 * size + PAGE - 1) / PAGE;
  return np ? np : 1;
}

static void *page_at(size_t idx) { return (void *)(ARENA_BASE + idx * PAGE); }

static size_t page_of(const void *p) {
  return ((uintptr_t)p - ARENA_BASE) >> PAGE_SHIFT;
}

/* Makes the region writable up to `bytes` from its start. */
static int commit(size_t bytes) {
  if (bytes <= A->committed)
    return 0;
  size_t to = (bytes + COMMIT_STEP - 1) / COMMIT_STEP * COMMIT_STEP;
  if (to > ARENA_SIZE)
    to = ARENA_SIZE;
  if (mprotect((void *)(ARENA_BASE + A->committed), to - A->committed,
               PROT_READ | PROT_WRITE) != 0)
    return -errno;
  A->committed = to;
  return 0;
}

static void runs_put(size_t idx, size_t np) {
  arun *r = page_at(idx);
  r->npages = np;
  MAP[idx] = M_FREE;
  if (np >= RUN_RELEASE)
    madvise((char *)r + PAGE, (np - 1) * PAGE, MADV_DONTNEED);
  arun **head = np <= RUN_LISTS ? &A->runs[np] : &A->runs[0];
  r->next = *head;
  *head = r;
}

/* np pages in a row: a freed run, or new ones.  Returns the first's index,
 * or 0 when the region is full or cannot be made writable. */
static size_t pages_take(size_t np) {
  if (np <= RUN_LISTS && A->runs[np]) {
    arun *r = A->runs[np];
    A->runs[np] = r->next;
    return page_of(r);
  }
  if (np > RUN_LISTS) {
    arun **best = NULL;
    for (arun **pp = &A->runs[0]; *pp; pp = &(*pp)->next)
      if ((*pp)->npages >= np && (!best || (*pp)->npages < (*best)->npages))
        best = pp;
    if (best) {
      arun *r = *best;
      *best = r->next;
      size_t idx = page_of(r);
      if (r->npages > np)
        runs_put(idx + np, r->npages - np);
      return idx;
    }
  }
  size_t idx = A->top;
  if (np > NPAGES - idx || commit((idx + np) * PAGE) != 0)
    return 0;
  A->top = idx + np;
  return idx;
}

static void *small_alloc(size_t c) {
  aclass *k = &A->cls[c];
  if (k->free) {
    void *p = (void *)k->free;
    k->free = *(uintptr_t *)p;
    return p;
  }
  size_t sz = class_size(c);
  if (k->end - k->bump < sz) {
    size_t np = slab_pages(sz);
    size_t idx = pages_take(np);
    if (!idx)
      return NULL;
    memset(&MAP[idx], (int)(c + 1), np);
    k->bump = (uintptr_t)page_at(idx);
    k->end = k->bump + np * PAGE;
  }
  void *p = (void *)k->bump;
  k->bump += sz;
  return p;
}

/* A run for n bytes whose first byte is at `off` (RUN_HDR, or an
 * alignment up to PAGE) from the run's start. */
static void *large_alloc(size_t n, size_t off) {
  if (n > ARENA_SIZE)
    return NULL;
  size_t np = (off + n + PAGE - 1) / PAGE;
  size_t idx = pages_take(np);
  if (!idx)
    return NULL;
  MAP[idx] = M_HEAD;
  memset(&MAP[idx + 1], M_TAIL, np - 1);
  arun *r = page_at(idx);
  r->npages = np;
  return (char *)r + off;
}

static arun *run_of(const void *p) {
  size_t idx = page_of(p);
  while (MAP[idx] == M_TAIL)
    idx--;
  if (MAP[idx] != M_HEAD)
    abort(); /* not a block of ours: a bug in the program */
  return page_at(idx);
}

static size_t usable(const void *p) {
  uint8_t m = MAP[page_of(p)];
  if (m >= 1 && m <= NCLASS)
    return class_size(m - 1u);
  arun *r = run_of(p);
  return r->npages * PAGE - (size_t)((const char *)p - (const char *)r);
}

static void *arena_alloc(size_t n) {
  void *p = n <= SMALL_MAX ? small_alloc(class_of(n ? n : 1))
                           : large_alloc(n, RUN_HDR);
  if (!p)
    errno = ENOMEM;
  return p;
}

void *malloc(size_t n) { return active ? arena_alloc(n) : __libc_malloc(n); }

void free(void *p) {
  if (!p)
    return;
  if (!in_arena(p)) {
    __libc_free(p);
    return;
  }
  size_t idx = page_of(p);
  uint8_t m = MAP[idx];
  if (m >= 1 && m <= NCLASS) {
    aclass *k = &A->cls[m - 1];
    *(uintptr_t *)p = k->free;
    k->free = (uintptr_t)p;
    return;
  }
  arun *r = run_of(p);
  runs_put(page_of(r), r->npages);
}

void *calloc(size_t a, size_t b) {
  if (!active)
    return __libc_calloc(a, b);
  if (b && a > SIZE_MAX / b) {
    errno = ENOMEM;
    return NULL;
  }
  void *p = arena_alloc(a * b);
  if (p)
    memset(p, 0, a * b);
  return p;
}

void *realloc(void *p, size_t n) {
  if (!p)
    return malloc(n);
  if (!in_arena(p))
    return __libc_realloc(p, n);
  if (n == 0) {
    free(p);
    return NULL;
  }
  size_t have = usable(p);
  if (n <= have)
    return p;
  if (have > SMALL_MAX) { /* a run at the top grows in place */
    arun *r = run_of(p);
    size_t idx = page_of(r);
    size_t off = (size_t)((char *)p - (char *)r);
    size_t np = (off + n + PAGE - 1) / PAGE;
    if (idx + r->npages == A->top && np - r->npages <= NPAGES - A->top &&
        commit((idx + np) * PAGE) == 0) {
      memset(&MAP[idx + r->npages], M_TAIL, np - r->npages);
      A->top = idx + np;
      r->npages = np;
      return p;
    }
  }
  void *q = arena_alloc(n);
  if (!q)
    return NULL;
  memcpy(q, p, have);
  free(p);
  return q;
}

void *reallocarray(void *p, size_t a, size_t b) {
  if (b && a > SIZE_MAX / b) {
    errno = ENOMEM;
    return NULL;
  }
  return realloc(p, a * b);
}

static void *aligned(size_t align, size_t n) {
  if (!active)
    return __libc_memalign(align, n);
  if (align <= 16) { /* classes that are multiples of 16 are aligned so */
    size_t m = n ? (n + 15) & ~(size_t)15 : 16;
    return arena_alloc(n <= SMALL_MAX ? m : n);
  }
  if (align > PAGE) {
    errno = EINVAL;
    return NULL;
  }
  void *p = large_alloc(n, align > RUN_HDR ? align : RUN_HDR);
  if (!p)
    errno = ENOMEM;
  return p;
}

int posix_memalign(void **out, size_t align, size_t n) {
  if (align < sizeof(void *) || (align & (align - 1)))
    return EINVAL;
  void *p = aligned(align, n);
  if (!p)
    return errno;
  *out = p;
  return 0;
}

void *aligned_alloc(size_t align, size_t n) {
  if (align == 0 || (align & (align - 1))) {
    errno = EINVAL;
    return NULL;
  }
  return aligned(align, n);
}

void *memalign(size_t align, size_t n) { return aligned_alloc(align, n); }

void *valloc(size_t n) { return aligned(4096, n); }

void *pvalloc(size_t n) { return aligned(4096, (n + 4095) & ~(size_t)4095); }

size_t malloc_usable_size(void *p) {
  if (!p)
    return 0;
  if (in_arena(p))
    return usable(p);
  static union {
    void *sym;
    size_t (*fn)(void *);
  } libc_usable;
  if (!libc_usable.sym)
    libc_usable.sym = dlsym(RTLD_NEXT, "malloc_usable_size");
  return libc_usable.sym ? libc_usable.fn(p) : 0;
}

/* ---- the region --------------------------------------------------------- */

static int region_map(void) {
  void *p = mmap(
      (void *)ARENA_BASE, ARENA_SIZE, PROT_NONE,
      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
  if (p == MAP_FAILED)
    return -errno;
  if (p != (void *)ARENA_BASE) { /* a kernel that took it as a hint */
    munmap(p, ARENA_SIZE);
    return -EEXIST;
  }
  /* Transparent huge pages where the kernel gives them on request: every
   * event touches a random node's memory, and with 4 KiB pages the TLB
   * misses cost more than the arithmetic (glibc's malloc.hugetlb tunable
   * did this before the arena).  Only a hint: no error if refused. */
  madvise(p, ARENA_SIZE, MADV_HUGEPAGE);
  return 0;
}

static int region_writable(size_t bytes) {
  size_t to = (bytes + COMMIT_STEP - 1) / COMMIT_STEP * COMMIT_STEP;
  if (mprotect((void *)ARENA_BASE, to, PROT_READ | PROT_WRITE) != 0)
    return -errno;
  A->committed = to;
  return 0;
}

int arena_start(void) {
  if (active)
    return 0;
  int rc = region_map();
  if (rc != 0)
    return rc;
  rc = region_writable(FIRST_PAGE * PAGE);
  if (rc != 0) {
    munmap((void *)ARENA_BASE, ARENA_SIZE);
    return rc;
  }
  A->magic = STATE_MAGIC;
  A->top = FIRST_PAGE;
  active = true;
  return 0;
}

/* ---- checkpoint files --------------------------------------------------- */

#define FILE_MAGIC "beesimg"
#define FILE_VERSION 1u
#define CHUNK ((size_t)64 << 20)

typedef struct file_head {
  char magic[8];
  uint32_t version, head_bytes;
  uint64_t base, used; /* the region's first `used` bytes follow */
  uint64_t at_self, at_sodium, at_libc; /* where the code was loaded */
  uint8_t exe_hash[32];                 /* BLAKE2b-256 of the binary */
  uint8_t data_hash[32];                /* and of the bytes that follow */
} file_head;

/* Hashes the running program's file, reading into a stack buffer (no
 * allocation: a save runs while the arena must not change). */
static int exe_hash(uint8_t out[32]) {
  int fd = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return -errno;
  crypto_generichash_state st;
  crypto_generichash_init(&st, NULL, 0, 32);
  uint8_t buf[16384];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0)
    crypto_generichash_update(&st, buf, (size_t)n);
  int err = n < 0 ? errno : 0;
  close(fd);
  if (err)
    return -err;
  crypto_generichash_final(&st, out, 32);
  return 0;
}

static void head_fill(file_head *h) {
  memset(h, 0, sizeof *h);
  memcpy(h->magic, FILE_MAGIC, 8);
  h->version = FILE_VERSION;
  h->head_bytes = sizeof *h;
  h->base = ARENA_BASE;
  h->at_self = (uint64_t)(uintptr_t)&arena_save;
  h->at_sodium = (uint64_t)(uintptr_t)&crypto_generichash;
  h->at_libc = (uint64_t)(uintptr_t)&__libc_malloc;
}

/* Reads or writes n bytes at p in chunks; -errno, or -EIO at the file's
 * end. */
static int io_all(int fd, void *p, size_t n, bool writing) {
  char *c = p;
  while (n > 0) {
    size_t step = n < CHUNK ? n : CHUNK;
    ssize_t r = writing ? write(fd, c, step) : read(fd, c, step);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      return r < 0 ? -errno : -EIO;
    c += r;
    n -= (size_t)r;
  }
  return 0;
}

int arena_save(const char *path, void *root, const char **why) {
  if (!active) {
    *why = "the arena was never started";
    return -EINVAL;
  }
  int pers = personality(0xffffffff);
  if (pers == -1 || !(pers & ADDR_NO_RANDOMIZE)) {
    *why = "address randomization is on (see arena_fixed_layout)";
    return -EINVAL;
  }
  char tmp[4096];
  if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) {
    *why = "the file name is too long";
    return -ENAMETOOLONG;
  }
  file_head h;
  head_fill(&h);
  int rc = exe_hash(h.exe_hash);
  if (rc != 0) {
    *why = why_errno("cannot read /proc/self/exe", -rc);
    return rc;
  }
  A->root = root;
  h.used = A->top * PAGE;
  crypto_generichash(h.data_hash, 32, (const uint8_t *)ARENA_BASE, h.used, NULL,
                     0);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    rc = -errno;
    *why = why_errno(tmp, -rc);
    return rc;
  }
  rc = io_all(fd, &h, sizeof h, true);
  if (rc == 0)
    rc = io_all(fd, (void *)ARENA_BASE, h.used, true);
  if (rc == 0 && fsync(fd) != 0)
    rc = -errno;
  if (close(fd) != 0 && rc == 0)
    rc = -errno;
  if (rc == 0 && rename(tmp, path) != 0)
    rc = -errno;
  if (rc != 0) {
    *why = why_errno(tmp, -rc);
    unlink(tmp);
  }
  return rc;
}

void *arena_load(const char *path, const char **why) {
  if (active) {
    *why = "the arena is already in use";
    return NULL;
  }
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *why = why_errno("cannot open it", errno);
    return NULL;
  }
  file_head h, want;
  head_fill(&want);
  struct stat st;
  int rc;
  bool mapped = false;
  void *root = NULL;
  if (fstat(fd, &st) != 0 || io_all(fd, &h, sizeof h, false) != 0 ||
      memcmp(h.magic, FILE_MAGIC, 8) != 0) {
    *why = "not a dhtsim-scale checkpoint";
    goto out;
  }
  if (h.version != FILE_VERSION || h.head_bytes != sizeof h) {
    *why = "a checkpoint of another version of dhtsim-scale";
    goto out;
  }
  if (h.base != ARENA_BASE || h.used < FIRST_PAGE * PAGE ||
      h.used > ARENA_SIZE || h.used % PAGE) {
    *why = "its header is damaged";
    goto out;
  }
  if ((uint64_t)st.st_size != sizeof h + h.used) {
    *why = (uint64_t)st.st_size < sizeof h + h.used
               ? "it is truncated"
               : "it is longer than its header says";
    goto out;
  }
  if (exe_hash(want.exe_hash) != 0 ||
      memcmp(h.exe_hash, want.exe_hash, 32) != 0) {
    *why = "it was written by another build of dhtsim-scale";
    goto out;
  }
  if (h.at_self != want.at_self || h.at_sodium != want.at_sodium ||
      h.at_libc != want.at_libc) {
    *why = "the program or its libraries are loaded at other addresses "
           "than when it was written (address randomization is on, or a "
           "library changed)";
    goto out;
  }
  rc = region_map();
  if (rc != 0) {
    *why = why_errno("cannot map the arena's region", -rc);
    goto out;
  }
  mapped = true;
  size_t to = (h.used + COMMIT_STEP - 1) / COMMIT_STEP * COMMIT_STEP;
  if (mprotect((void *)ARENA_BASE, to, PROT_READ | PROT_WRITE) != 0) {
    *why = why_errno("cannot make the region writable", errno);
    goto out;
  }
  rc = io_all(fd, (void *)ARENA_BASE, h.used, false);
  if (rc != 0) {
    *why = why_errno("cannot read it", -rc);
    goto out;
  }
  uint8_t hash[32];
  crypto_generichash(hash, 32, (const uint8_t *)ARENA_BASE, h.used, NULL, 0);
  if (memcmp(hash, h.data_hash, 32) != 0 || A->magic != STATE_MAGIC ||
      A->top * PAGE != h.used) {
    *why = "it is corrupt (its hash does not match)";
    goto out;
  }
  A->committed = to;
  active = true;
  root = A->root;
out:
  close(fd);
  if (!root && mapped)
    munmap((void *)ARENA_BASE, ARENA_SIZE);
  return root;
}

#endif /* ARENA_OFF */
