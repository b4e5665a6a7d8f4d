/* gemm.c: the CPU backend's matrix products (trainer-int.h).
 *
 * trn__sgemm is cblas_sgemm's row-major call.  On a CPU with AVX-512 it
 * runs our own kernel; elsewhere, or with TRN_GEMM=openblas in the
 * environment, it calls OpenBLAS (TRN_GEMM=auto, or unset: the choice by
 * the CPU; anything else is warned about once and taken as auto).  Why
 * our own: OpenBLAS picks its kernels by the CPU's name when it loads,
 * and where OPENBLAS_CORETYPE holds it to Haswell's (machines whose CPU
 * an older OpenBLAS misjudges, as this project's do) an AVX-512 CPU runs
 * 256-bit kernels.  The cnn, whose convolutions are nearly all
 * products, was 0.72 of PyTorch (oneDNN's AVX-512 convolutions) there;
 * 1.32 with this kernel.
 *
 * The kernel is the usual blocked one (Goto and van de Geijn): B in blocks
 * of KC rows and NC columns is packed into panels of NR columns, A in
 * blocks of MC rows into panels of MR rows, and a micro-kernel holds an MR
 * x NR tile of C in 24 registers while it runs down KC (a tile of C's
 * last 8 or 4 rows in 16 or 8, skipping the panel's zero rows: 16, 32
 * and 64 rows, the resnets' channels, end in one).  Each element of C
 * is one chain of fused multiply-adds over k in order, KC at a time; so
 * its bits depend on k's length alone, not on where its tile lies or on
 * how the columns are shared among threads.  Calls from outside the
 * thread pool share C's columns (or rows, when there are few columns)
 * among the pool's threads; calls from inside a pool job run on the
 * calling thread.
 */
#include "trainer-int.h"

#include <cblas.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define MR 12   /* rows of A per panel, of C per tile */
#define NR 32   /* columns of B per panel: two vectors of 16 */
#define KC 320  /* depth of a block: a B panel of 40 KiB stays in L1 */
#define MC 96   /* rows of an A block: 120 KiB, in L2 */
#define NC 2048 /* columns of a B block: 2.5 MiB packed, in L3 */

/* Below this many multiply-adds a product runs on the calling thread. */
#define GEMM_SHARE_MIN (1u << 20)

static void blas(bool ta, bool tb, size_t m, size_t n, size_t k, float alpha,
                 const float *a, size_t lda, const float *b, size_t ldb,
                 float beta, float *c, size_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
              tb ? CblasTrans : CblasNoTrans, (int)m, (int)n, (int)k, alpha,
              a, (int)lda, b, (int)ldb, beta, c, (int)ldc);
}

#ifdef TRN__X86

#define TARGET TRN__AVX512
/* The micro-kernel reads only the packed panels gemm_block sized and
 * writes C through masks; instrumented (ASan, UBSan) it would check 14
 * loads per 24 multiply-adds, where a sanitizer build used to run
 * OpenBLAS's uninstrumented kernels.  The packing, which reads the
 * caller's matrices, stays checked. */
#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 8)
#define UNCHECKED __attribute__((no_sanitize("address", "undefined")))
#else
#define UNCHECKED
#endif

/* r[0..15] (rows) transposed in place: r[q] becomes column q. */
TARGET static inline void transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; i++) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  /* In each 128-bit lane L, r[4 i + c] gets rows 4 i .. 4 i + 3 of
   * column 4 L + c. */
  for (int i = 0; i < 4; i++) {
    r[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xee);
    r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xee);
  }
  /* Then the lanes, a 4 x 4 transpose of 128-bit blocks. */
  for (int c = 0; c < 4; c++) {
    __m512 u0 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x88);
    __m512 u1 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xdd);
    __m512 u2 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x88);
    __m512 u3 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xdd);
    t[c] = _mm512_shuffle_f32x4(u0, u2, 0x88);
    t[4 + c] = _mm512_shuffle_f32x4(u1, u3, 0x88);
    t[8 + c] = _mm512_shuffle_f32x4(u0, u2, 0xdd);
    t[12 + c] = _mm512_shuffle_f32x4(u1, u3, 0xdd);
  }
  for (int q = 0; q < 16; q++)
    r[q] = t[q];
}

/* dst[p w + r] = src[r ld + p] for r < rows (<= 16; zero for rows <= r <
 * w), p < kc: rows read along p, 16 by 16 through transpose16, each
 * column stored as w floats (w is 12 or 16). */
TARGET static void pack_rows(const float *src, size_t ld, size_t rows,
                             size_t kc, float *dst, size_t w) {
  __mmask16 mw = trn__head_mask(w);
  for (size_t p = 0; p < kc; p += 16) {
    size_t np = kc - p < 16 ? kc - p : 16;
    __mmask16 mp = trn__head_mask(np);
    __m512 r[16];
    for (size_t i = 0; i < 16; i++)
      r[i] = i < rows ? _mm512_maskz_loadu_ps(mp, src + i * ld + p)
                      : _mm512_setzero_ps();
    transpose16(r);
    for (size_t q = 0; q < np; q++)
      _mm512_mask_storeu_ps(dst + (p + q) * w, mw, r[q]);
  }
}

/* A's rows [i0, i0 + mr) and columns [p0, p0 + kc) as panels of MR rows,
 * k by k (MR floats per k), the rows past mr zero.  A (i, p) is a[i lda +
 * p], or a[p lda + i] when ta. */
TARGET static void pack_a(bool ta, const float *a, size_t lda, size_t i0,
                          size_t mr, size_t p0, size_t kc, float *dst) {
  for (size_t ip = 0; ip < mr; ip += MR) {
    size_t rows = mr - ip < MR ? mr - ip : MR;
    if (ta) {
      for (size_t p = 0; p < kc; p++) {
        const float *src = a + (p0 + p) * lda + i0 + ip;
        size_t r = 0;
        for (; r < rows; r++)
          dst[p * MR + r] = src[r];
        for (; r < MR; r++)
          dst[p * MR + r] = 0;
      }
    } else {
      pack_rows(a + (i0 + ip) * lda + p0, lda, rows, kc, dst, MR);
    }
    dst += kc * MR;
  }
}

/* B's rows [p0, p0 + kc) and columns [j0, j0 + nc) as panels of NR
 * columns, k by k (NR floats per k), the columns past nc zero.  B (p, j)
 * is b[p ldb + j], or b[j ldb + p] when tb. */
TARGET static void pack_b(bool tb, const float *b, size_t ldb, size_t p0,
                          size_t kc, size_t j0, size_t nc, float *dst) {
  for (size_t jp = 0; jp < nc; jp += NR) {
    size_t cols = nc - jp < NR ? nc - jp : NR;
    if (!tb) {
      __mmask16 m0 = trn__head_mask(cols), m1 = trn__high_mask(cols);
      for (size_t p = 0; p < kc; p++) {
        const float *src = b + (p0 + p) * ldb + j0 + jp;
        _mm512_store_ps(dst + p * NR, _mm512_maskz_loadu_ps(m0, src));
        _mm512_store_ps(dst + p * NR + 16,
                        _mm512_maskz_loadu_ps(m1, src + 16));
      }
    } else {
      /* Two halves of 16 columns, each column a row of b. */
      const float *src = b + (j0 + jp) * ldb + p0;
      pack_rows(src, ldb, cols < 16 ? cols : 16, kc, dst, NR);
      pack_rows(src + 16 * ldb, ldb, cols > 16 ? cols - 16 : 0, kc,
                dst + 16, NR);
    }
    dst += kc * NR;
  }
}

/* One tile: C[0..mr) x [0..nr) (rows ldc apart) = alpha A B + beta C when
 * first (C not read when beta is 0), else C += alpha A B; A and B are
 * one packed panel each, kc deep.  R (12, 8 or 4, at least mr) is how
 * many of the panel's rows it multiplies: a short tile skips the zero
 * rows' multiply-adds, and each element of C is the same chain of them
 * whatever R is. */
#define ALWAYS_INLINE inline __attribute__((always_inline))
TARGET UNCHECKED static ALWAYS_INLINE void
tile_rows(const int R, size_t kc, const float *restrict a,
          const float *restrict b, float *c, size_t ldc, size_t mr,
          size_t nr, float alpha, float beta, bool first) {
  __m512 c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00;
  __m512 c20 = c00, c21 = c00, c30 = c00, c31 = c00, c40 = c00, c41 = c00;
  __m512 c50 = c00, c51 = c00, c60 = c00, c61 = c00, c70 = c00, c71 = c00;
  __m512 c80 = c00, c81 = c00, c90 = c00, c91 = c00, ca0 = c00, ca1 = c00;
  __m512 cb0 = c00, cb1 = c00;
  for (size_t p = 0; p < kc; p++) {
    __m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16), x;
#define ROW(i, r0, r1)                                                         \
  if (R > i) {                                                                 \
    x = _mm512_set1_ps(a[i]);                                                  \
    r0 = _mm512_fmadd_ps(x, b0, r0);                                           \
    r1 = _mm512_fmadd_ps(x, b1, r1);                                           \
  }
    ROW(0, c00, c01) ROW(1, c10, c11) ROW(2, c20, c21) ROW(3, c30, c31)
    ROW(4, c40, c41) ROW(5, c50, c51) ROW(6, c60, c61) ROW(7, c70, c71)
    ROW(8, c80, c81) ROW(9, c90, c91) ROW(10, ca0, ca1) ROW(11, cb0, cb1)
#undef ROW
    a += MR, b += NR;
  }
  __m512 acc[MR][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31},
                       {c40, c41}, {c50, c51}, {c60, c61}, {c70, c71},
                       {c80, c81}, {c90, c91}, {ca0, ca1}, {cb0, cb1}};
  __mmask16 m[2] = {trn__head_mask(nr), trn__high_mask(nr)};
  __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  for (size_t i = 0; i < mr; i++)
    for (int h = 0; h < 2; h++) {
      float *ci = c + i * ldc + 16 * h;
      __m512 v = alpha == 1.0f ? acc[i][h] : _mm512_mul_ps(va, acc[i][h]);
      if (!first)
        v = _mm512_add_ps(_mm512_maskz_loadu_ps(m[h], ci), v);
      else if (beta != 0.0f)
        v = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m[h], ci), v);
      _mm512_mask_storeu_ps(ci, m[h], v);
    }
}

typedef void tile_fn(size_t kc, const float *restrict a,
                     const float *restrict b, float *c, size_t ldc, size_t mr,
                     size_t nr, float alpha, float beta, bool first);
#define TILE(R)                                                                \
  TARGET UNCHECKED static void tile##R(                                        \
      size_t kc, const float *restrict a, const float *restrict b, float *c,  \
      size_t ldc, size_t mr, size_t nr, float alpha, float beta,             \
      bool first) {                                                           \
    tile_rows(R, kc, a, b, c, ldc, mr, nr, alpha, beta, first);               \
  }
TILE(12)
TILE(8)
TILE(4)
#undef TILE

/* The tile for mr of a panel's rows: a remainder of 4 or 8 rows (C's
 * 16, 32 or 64 rows, the resnets' channel counts, end in one) costs a
 * third or two thirds of a full tile rather than all of it. */
static tile_fn *tile_for(size_t mr) {
  return mr > 8 ? tile12 : mr > 4 ? tile8 : tile4;
}

typedef struct gemm_job {
  bool ta, tb;
  size_t m, n, k, lda, ldb, ldc;
  float alpha, beta;
  const float *a, *b;
  float *c;
  bool by_rows; /* parts share C's rows, else its columns */
} gemm_job;

/* Each thread's packing buffers, kept from call to call (a product per
 * layer per step: allocating them each time cost more than packing, and
 * far more under ASan) and freed when the thread ends. */
typedef struct packs_tls {
  float *a, *b;
  size_t a_n, b_n;
} packs_tls;

static pthread_key_t packs_key;
static pthread_once_t packs_once = PTHREAD_ONCE_INIT;
static bool packs_keyed;

static void packs_free(void *p) {
  packs_tls *w = p;
  free(w->a), free(w->b), free(w);
}

static void packs_init(void) {
  packs_keyed = pthread_key_create(&packs_key, packs_free) == 0;
}

/* *p holds at least n floats, 64-byte aligned (*have: how many it holds;
 * 0 and *p NULL after a failed allocation).  0, or -1. */
static int grow(float **p, size_t *have, size_t n) {
  if (*have >= n)
    return 0;
  free(*p);
  *have = 0;
  if (!(*p = aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64)))
    return -1;
  *have = n;
  return 0;
}

/* Room for a_n and b_n floats, 64-byte aligned, in *pa and *pb: 0, or -1
 * when memory (or a thread key) is short. */
static int packs(size_t a_n, size_t b_n, float **pa, float **pb) {
  pthread_once(&packs_once, packs_init);
  if (!packs_keyed)
    return -1;
  packs_tls *w = pthread_getspecific(packs_key);
  if (!w) {
    if (!(w = calloc(1, sizeof *w)))
      return -1;
    if (pthread_setspecific(packs_key, w)) {
      free(w);
      return -1;
    }
  }
  if (grow(&w->a, &w->a_n, a_n) || grow(&w->b, &w->b_n, b_n))
    return -1;
  *pa = w->a, *pb = w->b;
  return 0;
}

/* C's rows [i0, i1) and columns [j0, j1), on this thread.  Returns 0 or
 * -ENOMEM (nothing written then). */
TARGET static int gemm_block(const gemm_job *j, size_t i0, size_t i1,
                             size_t j0, size_t j1) {
  size_t kb = (j->k + KC - 1) / KC, kc_max = (j->k + kb - 1) / kb;
  size_t nc_max = j1 - j0 < NC ? j1 - j0 : NC;
  size_t mc_max = i1 - i0 < MC ? i1 - i0 : MC;
  size_t a_n = (mc_max + MR - 1) / MR * MR * kc_max;
  size_t b_n = (nc_max + NR - 1) / NR * NR * kc_max;
  float *pa, *pb;
  if (packs(a_n, b_n, &pa, &pb))
    return -ENOMEM;
  for (size_t jc = j0; jc < j1; jc += NC) {
    size_t nc = j1 - jc < NC ? j1 - jc : NC;
    /* k in kb blocks of nearly equal depth: the same split for every
     * tile, so every element sums in the same order. */
    for (size_t q = 0; q < kb; q++) {
      size_t p0 = j->k * q / kb, kc = j->k * (q + 1) / kb - p0;
      pack_b(j->tb, j->b, j->ldb, p0, kc, jc, nc, pb);
      for (size_t ic = i0; ic < i1; ic += MC) {
        size_t mc = i1 - ic < MC ? i1 - ic : MC;
        pack_a(j->ta, j->a, j->lda, ic, mc, p0, kc, pa);
        for (size_t jr = 0; jr < nc; jr += NR)
          for (size_t ir = 0; ir < mc; ir += MR) {
            size_t mr = mc - ir < MR ? mc - ir : MR;
            tile_for(mr)(kc, pa + ir * kc, pb + jr * kc,
                         j->c + (ic + ir) * j->ldc + jc + jr, j->ldc, mr,
                         nc - jr < NR ? nc - jr : NR, j->alpha, j->beta,
                         q == 0);
          }
      }
    }
  }
  return 0;
}

/* Part part's share of C: whole tiles, in order. */
static void gemm_part(void *arg, int part, int parts) {
  gemm_job *j = arg;
  size_t step = j->by_rows ? MR : NR, len = j->by_rows ? j->m : j->n;
  size_t units = (len + step - 1) / step, u0, u1;
  trn__pool_range(units, part, parts, &u0, &u1);
  size_t a = u0 * step, b = u1 * step < len ? u1 * step : len;
  if (a >= b)
    return;
  int rc = j->by_rows ? gemm_block(j, a, b, 0, j->n)
                      : gemm_block(j, 0, j->m, a, b);
  if (rc == 0)
    return;
  /* No memory for the packed blocks: OpenBLAS does this share (the same
   * product, in other bits) without any. */
  if (j->by_rows)
    blas(j->ta, j->tb, b - a, j->n, j->k, j->alpha,
         j->a + (j->ta ? a : a * j->lda), j->lda, j->b, j->ldb, j->beta,
         j->c + a * j->ldc, j->ldc);
  else
    blas(j->ta, j->tb, j->m, b - a, j->k, j->alpha, j->a, j->lda,
         j->b + (j->tb ? a * j->ldb : a), j->ldb, j->beta, j->c + a, j->ldc);
}

static int use_own = -1; /* -1: not decided yet */

static bool own(void) {
  int u = __atomic_load_n(&use_own, __ATOMIC_RELAXED);
  if (u < 0) {
    const char *e = getenv("TRN_GEMM");
    bool blas_asked = e && !strcmp(e, "openblas");
    if (e && *e && !blas_asked && strcmp(e, "auto") != 0)
      trn__log(TRN_LOG_WARN,
               "TRN_GEMM=%.40s: expected auto or openblas; taking auto "
               "(our kernel where the CPU has AVX-512)",
               e);
    u = trn__cpu_avx512() && !blas_asked;
    __atomic_store_n(&use_own, u, __ATOMIC_RELAXED);
  }
  return u;
}

bool trn__cpu_avx512(void) {
  static int has = -1;
  int h = __atomic_load_n(&has, __ATOMIC_RELAXED);
  if (h < 0) {
    __builtin_cpu_init();
    h = __builtin_cpu_supports("avx512f") != 0;
    __atomic_store_n(&has, h, __ATOMIC_RELAXED);
  }
  return h;
}

void trn__sgemm(bool ta, bool tb, size_t m, size_t n, size_t k, float alpha,
                const float *a, size_t lda, const float *b, size_t ldb,
                float beta, float *c, size_t ldc) {
  if (!m || !n)
    return;
  if (!own() || !k) {
    blas(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  gemm_job j = {.ta = ta, .tb = tb, .m = m, .n = n, .k = k, .lda = lda,
                .ldb = ldb, .ldc = ldc, .alpha = alpha, .beta = beta,
                .a = a, .b = b, .c = c};
  int parts = trn__pool_size();
  j.by_rows = n < (size_t)parts * NR * 2 && m > n;
  if (parts > 1 && (double)m * n * k >= GEMM_SHARE_MIN)
    trn__pool_run(gemm_part, &j);
  else
    gemm_part(&j, 0, 1);
}

const char *trn__sgemm_name(void) {
  return own() ? "beed avx512" : "openblas";
}

#else /* not x86-64: OpenBLAS for every product */

void trn__sgemm(bool ta, bool tb, size_t m, size_t n, size_t k, float alpha,
                const float *a, size_t lda, const float *b, size_t ldb,
                float beta, float *c, size_t ldc) {
  blas(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

const char *trn__sgemm_name(void) { return "openblas"; }

bool trn__cpu_avx512(void) { return false; }

#endif
