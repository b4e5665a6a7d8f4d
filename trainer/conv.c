/* conv.c: the CPU layers for images (trainer-int.h): 2-D convolution by
 * im2col and trn__sgemm (gemm.c), max pooling, dropout, batch
 * normalization.
 *
 * Tensors are NCHW, row-major, as PyTorch's default layout, so weights
 * (out channels, in channels, kh, kw) move between the two as they are.
 * A convolution is done a chunk of TRN__CONV_CHUNK samples at a time: the
 * chunk's patches are laid out side by side as a matrix col (C k k,
 * chunk Ho Wo) and multiplied by W (Oc, C k k), so the workspace stays a
 * chunk's size whatever the batch.  The chunks are shared among the
 * pool's threads (pool.c), each with a workspace of its own.
 */
#include "trainer-int.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The output columns j whose input column j + kj - pad lies inside the
 * image: [*j0, *j1). */
static unsigned stride(const trn__conv *cv) {
  return cv->stride ? cv->stride : 1;
}

/* ceil(a / s) for a >= 0; 0 for a < 0. */
static unsigned up(int a, unsigned s) {
  return a <= 0 ? 0 : (unsigned)(a + (int)s - 1) / s;
}

static void span(const trn__conv *cv, unsigned kj, unsigned *j0,
                 unsigned *j1) {
  /* j s + kj - pad in [0, w): j >= (pad - kj) / s, j < (w + pad - kj) / s */
  unsigned s = stride(cv);
  *j0 = up((int)cv->pad - (int)kj, s);
  *j1 = up((int)cv->w + (int)cv->pad - (int)kj, s);
  if (*j1 > cv->ow)
    *j1 = cv->ow;
  if (*j1 < *j0)
    *j1 = *j0;
}

/* col (c k k, oh ow), its rows ld floats apart, from x (c, h, w): the
 * patch of every output pixel, zero outside the image (padding).  Each
 * row of a patch position is one copy of the image row's inside part
 * between two runs of zeros. */
static void im2col(const float *x, const trn__conv *cv, float *col,
                   size_t ld) {
  unsigned k = cv->k, oh = cv->oh, ow = cv->ow, st = stride(cv);
  for (unsigned c = 0; c < cv->c; c++)
    for (unsigned ki = 0; ki < k; ki++)
      for (unsigned kj = 0; kj < k; kj++) {
        float *row = col + ((size_t)(c * k + ki) * k + kj) * ld;
        unsigned j0, j1;
        span(cv, kj, &j0, &j1);
        for (unsigned i = 0; i < oh; i++) {
          int yi = (int)(i * st + ki) - (int)cv->pad;
          float *r = row + (size_t)i * ow;
          if (yi < 0 || yi >= (int)cv->h || j0 == j1) {
            memset(r, 0, ow * sizeof *r);
            continue;
          }
          const float *src = x + ((size_t)c * cv->h + (unsigned)yi) * cv->w;
          /* Rows are short (14 to 32 floats here): plain loops, not three
           * library calls per row. */
          for (unsigned j = 0; j < j0; j++)
            r[j] = 0;
          if (st == 1) {
            float *restrict o = r + j0;
            const float *restrict in = src + (j0 + kj - cv->pad);
            for (unsigned j = 0; j < j1 - j0; j++)
              o[j] = in[j];
          } else
            for (unsigned j = j0; j < j1; j++)
              r[j] = src[j * st + kj - cv->pad];
          for (unsigned j = j1; j < ow; j++)
            r[j] = 0;
        }
      }
}

/* The reverse: adds every patch entry of col (rows ld apart) back into
 * dx (c, h, w). */
static void col2im(const float *col, const trn__conv *cv, float *dx,
                   size_t ld) {
  unsigned k = cv->k, oh = cv->oh, ow = cv->ow, st = stride(cv);
  memset(dx, 0, (size_t)cv->c * cv->h * cv->w * sizeof *dx);
  for (unsigned c = 0; c < cv->c; c++)
    for (unsigned ki = 0; ki < k; ki++)
      for (unsigned kj = 0; kj < k; kj++) {
        const float *row = col + ((size_t)(c * k + ki) * k + kj) * ld;
        unsigned j0, j1;
        span(cv, kj, &j0, &j1);
        for (unsigned i = 0; i < oh; i++) {
          int yi = (int)(i * st + ki) - (int)cv->pad;
          if (yi < 0 || yi >= (int)cv->h)
            continue;
          float *dst = dx + ((size_t)c * cv->h + (unsigned)yi) * cv->w;
          const float *r = row + (size_t)i * ow;
          if (st == 1) { /* a run the compiler can do in vectors */
            float *restrict o = dst + (j0 + kj - cv->pad);
            const float *restrict in = r + j0;
            for (unsigned j = 0; j < j1 - j0; j++)
              o[j] += in[j];
          } else
            for (unsigned j = j0; j < j1; j++) /* j s + kj >= pad from j0 */
              dst[j * st + kj - cv->pad] += r[j];
        }
      }
}

#ifdef TRN__X86
#define TARGET TRN__AVX512

/* im2col and col2im for stride 1, rows of at most 32 floats and windows of
 * at most 16: each image row is one or two vectors, and every patch
 * position's share of it is one permute of them (lane j of output row i
 * holds image column j + kj - pad), so a row is loaded once for all k^2
 * positions and nothing is added into memory.  The same floats, and the
 * same sums in the same order, as im2col and col2im above. */
#define VEC_K_MAX 16

static bool vector_fits(const trn__conv *cv) {
  return cv->w <= 32 && cv->ow <= 32 && cv->k <= VEC_K_MAX;
}

/* For each kj: the lanes' sources (lane l of half h: 16 h + l + kj - pad
 * for im2col, 16 h + l + pad - kj for col2im) and which lie in [0, lim). */
TARGET static void shifts(const trn__conv *cv, bool back, unsigned lim,
                          __m512i idx[][2], __mmask16 ok[][2]) {
  for (unsigned kj = 0; kj < cv->k; kj++)
    for (int h = 0; h < 2; h++) {
      int32_t v[16];
      unsigned m = 0;
      for (int l = 0; l < 16; l++) {
        int x = 16 * h + l +
                (back ? (int)cv->pad - (int)kj : (int)kj - (int)cv->pad);
        bool in = x >= 0 && x < (int)lim;
        v[l] = in ? x : 0;
        m |= (unsigned)in << l;
      }
      idx[kj][h] = _mm512_loadu_si512(v);
      ok[kj][h] = (__mmask16)m;
    }
}

TARGET static void im2col_s1(const float *x, const trn__conv *cv, float *col,
                             size_t ld) {
  unsigned k = cv->k, oh = cv->oh, ow = cv->ow, pad = cv->pad;
  __m512i idx[VEC_K_MAX][2];
  __mmask16 ok[VEC_K_MAX][2];
  shifts(cv, false, cv->w, idx, ok);
  __mmask16 in0 = trn__head_mask(cv->w);
  __mmask16 in1 = trn__high_mask(cv->w);
  __mmask16 out0 = trn__head_mask(ow), out1 = trn__high_mask(ow);
  for (unsigned c = 0; c < cv->c; c++)
    /* Every image row with pad rows of zeros above and below: output row
     * i of position (ki, kj) reads row i + ki - pad. */
    for (int yi = -(int)pad; yi < (int)(oh + k - 1) - (int)pad; yi++) {
      __m512 lo = _mm512_setzero_ps(), hi = lo;
      if (yi >= 0 && yi < (int)cv->h) {
        const float *src = x + ((size_t)c * cv->h + (unsigned)yi) * cv->w;
        lo = _mm512_maskz_loadu_ps(in0, src);
        hi = _mm512_maskz_loadu_ps(in1, src + 16);
      }
      for (unsigned ki = 0; ki < k; ki++) {
        int i = yi - (int)ki + (int)pad;
        if (i < 0 || i >= (int)oh)
          continue;
        for (unsigned kj = 0; kj < k; kj++) {
          float *r = col + ((size_t)(c * k + ki) * k + kj) * ld +
                     (size_t)i * ow;
          _mm512_mask_storeu_ps(
              r, out0, _mm512_maskz_permutex2var_ps(ok[kj][0], lo,
                                                    idx[kj][0], hi));
          if (ow > 16)
            _mm512_mask_storeu_ps(
                r + 16, out1, _mm512_maskz_permutex2var_ps(ok[kj][1], lo,
                                                           idx[kj][1], hi));
        }
      }
    }
}

TARGET static void col2im_s1(const float *col, const trn__conv *cv, float *dx,
                             size_t ld) {
  unsigned k = cv->k, oh = cv->oh, ow = cv->ow, w = cv->w;
  __m512i idx[VEC_K_MAX][2];
  __mmask16 ok[VEC_K_MAX][2];
  shifts(cv, true, ow, idx, ok);
  __mmask16 in0 = trn__head_mask(ow), in1 = trn__high_mask(ow);
  __mmask16 out0 = trn__head_mask(w), out1 = trn__high_mask(w);
  for (unsigned c = 0; c < cv->c; c++)
    for (unsigned yi = 0; yi < cv->h; yi++) {
      __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0;
      for (unsigned ki = 0; ki < k; ki++) {
        int i = (int)yi - (int)ki + (int)cv->pad;
        if (i < 0 || i >= (int)oh)
          continue;
        for (unsigned kj = 0; kj < k; kj++) {
          const float *r = col + ((size_t)(c * k + ki) * k + kj) * ld +
                           (size_t)i * ow;
          __m512 lo = _mm512_maskz_loadu_ps(in0, r);
          __m512 hi = _mm512_maskz_loadu_ps(in1, r + 16);
          acc0 = _mm512_add_ps(acc0, _mm512_maskz_permutex2var_ps(
                                         ok[kj][0], lo, idx[kj][0], hi));
          if (w > 16)
            acc1 = _mm512_add_ps(acc1, _mm512_maskz_permutex2var_ps(
                                           ok[kj][1], lo, idx[kj][1], hi));
        }
      }
      float *dst = dx + ((size_t)c * cv->h + yi) * w;
      _mm512_mask_storeu_ps(dst, out0, acc0);
      if (w > 16)
        _mm512_mask_storeu_ps(dst + 16, out1, acc1);
    }
}
#endif

static bool vectors_on = true; /* trn__conv_vectors_set */

void trn__conv_vectors_set(bool on) { vectors_on = on; }

/* Which im2col and col2im cv takes. */
static bool vector_cols(const trn__conv *cv) {
#ifdef TRN__X86
  return vectors_on && stride(cv) == 1 && vector_fits(cv) &&
         trn__cpu_avx512();
#else
  (void)cv;
  return false;
#endif
}

static void to_cols(const float *x, const trn__conv *cv, float *col,
                    size_t ld) {
#ifdef TRN__X86
  if (vector_cols(cv)) {
    im2col_s1(x, cv, col, ld);
    return;
  }
#endif
  im2col(x, cv, col, ld);
}

static void from_cols(const float *col, const trn__conv *cv, float *dx,
                      size_t ld) {
#ifdef TRN__X86
  if (vector_cols(cv)) {
    col2im_s1(col, cv, dx, ld);
    return;
  }
#endif
  col2im(col, cv, dx, ld);
}

/* The patches of samples n0 .. n0 + nb - 1 of x side by side: col (c k k,
 * nb oh ow).  Returns nb oh ow, the row length. */
static size_t chunk_cols(const trn__conv *cv, const float *x, size_t n0,
                         size_t nb, float *col) {
  size_t in = (size_t)cv->c * cv->h * cv->w, px = (size_t)cv->oh * cv->ow;
  for (size_t s = 0; s < nb; s++)
    to_cols(x + (n0 + s) * in, cv, col + s * px, nb * px);
  return nb * px;
}

/* ---- the workspace ---- */

static int ws_grow(trn__conv_ws *ws, int parts) {
  while (ws->parts < parts) {
    int i = ws->parts;
    ws->col[i] = malloc(ws->col_n * sizeof(float));
    ws->tmp[i] = malloc(ws->tmp_n * sizeof(float));
    ws->dw[i] = i ? malloc(ws->dw_n * sizeof(float)) : NULL;
    if (!ws->col[i] || !ws->tmp[i] || (i && !ws->dw[i])) {
      free(ws->col[i]), free(ws->tmp[i]), free(ws->dw[i]);
      ws->col[i] = ws->tmp[i] = ws->dw[i] = NULL;
      break;
    }
    ws->parts++;
  }
  return ws->parts;
}

int trn__conv_ws_init(trn__conv_ws *ws, size_t col_n, size_t tmp_n,
                      size_t dw_n) {
  *ws = (trn__conv_ws){.col_n = col_n, .tmp_n = tmp_n, .dw_n = dw_n};
  if (!col_n)
    return 0;
  if (ws_grow(ws, 1) < 1)
    return -ENOMEM;
  ws_grow(ws, trn__pool_size()); /* fewer: threads left idle */
  return 0;
}

void trn__conv_ws_free(trn__conv_ws *ws) {
  for (int i = 0; i < ws->parts; i++)
    free(ws->col[i]), free(ws->tmp[i]), free(ws->dw[i]);
  ws->parts = 0;
}

size_t trn__conv_ws_bytes(const trn__conv_ws *ws) {
  if (!ws->parts)
    return 0;
  return (ws->parts * (ws->col_n + ws->tmp_n) + (ws->parts - 1) * ws->dw_n) *
         sizeof(float);
}

/* Sums in double, in eight lanes (item i into lane i % 8): independent
 * chains the compiler can keep in vectors, in an order fixed by n alone. */
static void add8(const float *x, size_t n, double acc[8]) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; k++)
      acc[k] += x[i + k];
  for (; i < n; i++)
    acc[i % 8] += x[i];
}

/* acc += (x - mu)^2, lane by lane. */
static void add8_sq(const float *x, double mu, size_t n, double acc[8]) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; k++)
      acc[k] += ((double)x[i + k] - mu) * ((double)x[i + k] - mu);
  for (; i < n; i++)
    acc[i % 8] += ((double)x[i] - mu) * ((double)x[i] - mu);
}

/* acc += dy xhat, xhat = (x - mean) is as batch norm's forward rounds
 * it, lane by lane. */
static void add8_dot_norm(const float *dy, const float *x, float mean,
                          float is, size_t n, double acc[8]) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; k++)
      acc[k] += (double)dy[i + k] * ((x[i + k] - mean) * is);
  for (; i < n; i++)
    acc[i % 8] += (double)dy[i] * ((x[i] - mean) * is);
}

static double lanes(const double acc[8]) {
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) +
         ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

/* ---- forward and backward, a chunk of samples at a time ---- */

typedef struct conv_job {
  const trn__conv *cv;
  const float *x, *w, *b, *y, *dy;
  float *out, *dx, *dw, *db;
  size_t B, chunks;
  trn__conv_ws *ws;
  int parts; /* the workspace's: at most this many share the chunks */
} conv_job;

static int job_parts(const conv_job *j, int parts) {
  return parts < j->parts ? parts : j->parts;
}

static void fwd_chunk(const conv_job *j, size_t n0, float *col, float *tmp) {
  const trn__conv *cv = j->cv;
  size_t px = (size_t)cv->oh * cv->ow;
  size_t kk = (size_t)cv->c * cv->k * cv->k;
  size_t nb = j->B - n0 < TRN__CONV_CHUNK ? j->B - n0 : TRN__CONV_CHUNK;
  size_t ld = chunk_cols(cv, j->x, n0, nb, col);
  /* tmp (oc, nb px) = W (oc, kk) . col (kk, nb px): one product for the
   * chunk, then each sample's rows into y (n, oc, px) with the bias. */
  trn__sgemm(false, false, cv->oc, ld, kk, 1.0f, j->w, kk, col, ld, 0.0f, tmp,
             ld);
  for (size_t s = 0; s < nb; s++)
    for (unsigned o = 0; o < cv->oc; o++) {
      float *yo = j->out + ((n0 + s) * cv->oc + o) * px;
      const float *t = tmp + o * ld + s * px;
      float bo = j->b ? j->b[o] : 0;
      if (cv->relu)
        for (size_t p = 0; p < px; p++) {
          float v = t[p] + bo;
          yo[p] = v > 0 ? v : 0;
        }
      else
        for (size_t p = 0; p < px; p++)
          yo[p] = t[p] + bo;
    }
}

static void fwd_part(void *arg, int part, int parts) {
  conv_job *j = arg;
  parts = job_parts(j, parts);
  if (part >= parts)
    return;
  size_t c0, c1;
  trn__pool_range(j->chunks, part, parts, &c0, &c1);
  for (size_t c = c0; c < c1; c++)
    fwd_chunk(j, c * TRN__CONV_CHUNK, j->ws->col[part], j->ws->tmp[part]);
}

void trn__conv_fwd(const trn__conv *cv, const float *x, const float *w,
                   const float *b, float *y, size_t B, trn__conv_ws *ws) {
  conv_job j = {.cv = cv, .x = x, .w = w, .b = b, .out = y, .B = B,
                .chunks = (B + TRN__CONV_CHUNK - 1) / TRN__CONV_CHUNK,
                .ws = ws};
  j.parts = ws_grow(ws, trn__pool_size());
  if (j.parts > 1 && j.chunks > 1)
    trn__pool_run(fwd_part, &j);
  else
    fwd_part(&j, 0, 1);
}

/* dW and db of one chunk added into dw, db (part 0: the caller's; others:
 * the part's own partial sums), and the chunk's dx. */
static void bwd_chunk(const conv_job *j, size_t n0, float *col, float *tmp,
                      float *dw, float *db) {
  const trn__conv *cv = j->cv;
  size_t in = (size_t)cv->c * cv->h * cv->w, px = (size_t)cv->oh * cv->ow;
  size_t kk = (size_t)cv->c * cv->k * cv->k;
  size_t nb = j->B - n0 < TRN__CONV_CHUNK ? j->B - n0 : TRN__CONV_CHUNK;
  size_t ld = chunk_cols(cv, j->x, n0, nb, col);
  /* dy's rows side by side as tmp (oc, nb px), through the fused relu
   * (where its output was 0, so is the gradient); db from them. */
  for (size_t s = 0; s < nb; s++)
    for (unsigned o = 0; o < cv->oc; o++) {
      size_t at = ((n0 + s) * cv->oc + o) * px;
      const float *d = j->dy + at, *yo = j->y + at;
      float *t = tmp + o * ld + s * px;
      if (cv->relu)
        for (size_t p = 0; p < px; p++) {
          float v = d[p]; /* read either way: a select, not a branch */
          t[p] = yo[p] > 0 ? v : 0;
        }
      else
        memcpy(t, d, px * sizeof *t);
      if (db) {
        double acc[8] = {0};
        add8(t, px, acc);
        db[o] += (float)lanes(acc);
      }
    }
  /* dW (oc, kk) += dy (oc, nb px) . col^T (nb px, kk) */
  trn__sgemm(false, true, cv->oc, kk, ld, 1.0f, tmp, ld, col, ld, 1.0f, dw,
             kk);
  if (!j->dx)
    return;
  /* dcol (kk, nb px) = W^T (kk, oc) . dy (oc, nb px), then into dx */
  trn__sgemm(true, false, kk, ld, cv->oc, 1.0f, j->w, kk, tmp, ld, 0.0f, col,
             ld);
  for (size_t s = 0; s < nb; s++)
    from_cols(col + s * px, cv, j->dx + (n0 + s) * in, ld);
}

static void bwd_part(void *arg, int part, int parts) {
  conv_job *j = arg;
  parts = job_parts(j, parts);
  if (part >= parts)
    return;
  const trn__conv *cv = j->cv;
  size_t dwn = (size_t)cv->oc * cv->c * cv->k * cv->k;
  float *dw = j->dw, *db = j->db;
  if (part) { /* partial sums, added to the caller's in part order */
    dw = j->ws->dw[part], db = j->db ? dw + dwn : NULL;
    memset(dw, 0, (dwn + (j->db ? cv->oc : 0)) * sizeof *dw);
  }
  size_t c0, c1;
  trn__pool_range(j->chunks, part, parts, &c0, &c1);
  for (size_t c = c0; c < c1; c++)
    bwd_chunk(j, c * TRN__CONV_CHUNK, j->ws->col[part], j->ws->tmp[part], dw,
              db);
}

void trn__conv_bwd(const trn__conv *cv, const float *x, const float *w,
                   const float *y, const float *dy, float *dx, float *dw,
                   float *db, size_t B, trn__conv_ws *ws) {
  conv_job j = {.cv = cv, .x = x, .w = w, .y = y, .dy = dy, .dx = dx,
                .dw = dw, .db = db, .B = B,
                .chunks = (B + TRN__CONV_CHUNK - 1) / TRN__CONV_CHUNK,
                .ws = ws};
  j.parts = ws_grow(ws, trn__pool_size());
  if (j.parts < 2 || j.chunks < 2) {
    bwd_part(&j, 0, 1);
    return;
  }
  int parts = job_parts(&j, trn__pool_run(bwd_part, &j));
  size_t dwn = (size_t)cv->oc * cv->c * cv->k * cv->k;
  for (int p = 1; p < parts; p++) {
    const float *pw = ws->dw[p];
    for (size_t i = 0; i < dwn; i++)
      dw[i] += pw[i];
    if (db)
      for (unsigned o = 0; o < cv->oc; o++)
        db[o] += pw[dwn + o];
  }
}

/* 2 x 2 windows, the common case, without the general loops: the first
 * maximum in row-major order, a NaN taken as the maximum. */
static void maxpool2(const float *x, float *y, uint32_t *arg, size_t planes,
                     unsigned h, unsigned w) {
  unsigned oh = h / 2, ow = w / 2;
  for (size_t n = 0; n < planes; n++) {
    const float *xp = x + n * h * w;
    float *yp = y + n * oh * ow;
    uint32_t *ap = arg + n * oh * ow;
    for (unsigned i = 0; i < oh; i++) {
      const float *r0 = xp + 2 * i * w, *r1 = r0 + w;
      uint32_t base = 2 * i * w;
      for (unsigned j = 0; j < ow; j++) {
        float v = r0[2 * j];
        uint32_t at = base + 2 * j;
        float c1 = r0[2 * j + 1], c2 = r1[2 * j], c3 = r1[2 * j + 1];
        /* Selects, not branches: where the maximum is is a coin toss.
         * c replaces v when c > v, or c is NaN and v is not: that is,
         * when not c <= v and v is a number. */
        bool t = !(c1 <= v) & (v == v);
        v = t ? c1 : v, at = t ? base + 2 * j + 1 : at;
        t = !(c2 <= v) & (v == v);
        v = t ? c2 : v, at = t ? base + w + 2 * j : at;
        t = !(c3 <= v) & (v == v);
        v = t ? c3 : v, at = t ? base + w + 2 * j + 1 : at;
        yp[i * ow + j] = v;
        ap[i * ow + j] = at;
      }
    }
  }
}

typedef struct pool_job {
  const float *x, *dy;
  float *y, *dx;
  uint32_t *arg;
  const uint32_t *carg;
  unsigned h, w, k;
} pool_job;

#ifdef TRN__X86
/* maxpool2 for rows of at most 32: a row pair's windows at once, the
 * four candidates taken apart by permutes and compared in maxpool2's
 * order with its rule. */
TARGET static void maxpool2_v(const float *x, float *y, uint32_t *arg,
                              size_t planes, unsigned h, unsigned w) {
  unsigned oh = h / 2, ow = w / 2;
  __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3,
                                  2, 1, 0);
  __m512i even = _mm512_add_epi32(lane, lane);
  __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  __mmask16 in0 = trn__head_mask(w), in1 = trn__high_mask(w);
  __mmask16 out = trn__head_mask(ow);
  for (size_t n = 0; n < planes; n++) {
    const float *xp = x + n * h * w;
    for (unsigned i = 0; i < oh; i++) {
      const float *r0 = xp + 2 * i * w, *r1 = r0 + w;
      __m512 lo0 = _mm512_maskz_loadu_ps(in0, r0);
      __m512 hi0 = _mm512_maskz_loadu_ps(in1, r0 + 16);
      __m512 lo1 = _mm512_maskz_loadu_ps(in0, r1);
      __m512 hi1 = _mm512_maskz_loadu_ps(in1, r1 + 16);
      __m512 c[4] = {_mm512_permutex2var_ps(lo0, even, hi0),
                     _mm512_permutex2var_ps(lo0, odd, hi0),
                     _mm512_permutex2var_ps(lo1, even, hi1),
                     _mm512_permutex2var_ps(lo1, odd, hi1)};
      __m512i at0 = _mm512_add_epi32(_mm512_set1_epi32((int)(2 * i * w)),
                                     even);
      __m512i at[4] = {at0, _mm512_add_epi32(at0, _mm512_set1_epi32(1)),
                       _mm512_add_epi32(at0, _mm512_set1_epi32((int)w)),
                       _mm512_add_epi32(at0, _mm512_set1_epi32((int)w + 1))};
      __m512 v = c[0];
      __m512i a = at[0];
      for (int q = 1; q < 4; q++) {
        /* not c <= v, and v a number */
        __mmask16 t = _mm512_cmp_ps_mask(c[q], v, _CMP_NLE_UQ) &
                      _mm512_cmp_ps_mask(v, v, _CMP_ORD_Q);
        v = _mm512_mask_blend_ps(t, v, c[q]);
        a = _mm512_mask_blend_epi32(t, a, at[q]);
      }
      _mm512_mask_storeu_ps(y + (n * oh + i) * ow, out, v);
      _mm512_mask_storeu_epi32(arg + (n * oh + i) * ow, out, a);
    }
  }
}
#endif

/* Planes [p0, p1) forward. */
static void maxpool_planes(void *job, size_t p0, size_t p1) {
  const pool_job *j = job;
  unsigned h = j->h, w = j->w, k = j->k, oh = h / k, ow = w / k;
  size_t in = (size_t)h * w, out = (size_t)oh * ow;
#ifdef TRN__X86
  if (k == 2 && w <= 32 && vectors_on && trn__cpu_avx512()) {
    maxpool2_v(j->x + p0 * in, j->y + p0 * out, j->arg + p0 * out, p1 - p0,
               h, w);
    return;
  }
#endif
  if (k == 2) {
    maxpool2(j->x + p0 * in, j->y + p0 * out, j->arg + p0 * out, p1 - p0, h,
             w);
    return;
  }
  for (size_t n = p0; n < p1; n++) {
    const float *xp = j->x + n * in;
    for (unsigned i = 0; i < oh; i++)
      for (unsigned jj = 0; jj < ow; jj++) {
        /* The first maximum in row-major order wins, as in PyTorch; a
         * NaN is taken as the maximum and propagates. */
        uint32_t best = (i * k) * w + jj * k;
        float v = xp[best];
        for (unsigned a = 0; a < k; a++)
          for (unsigned b = 0; b < k; b++) {
            uint32_t at = (i * k + a) * w + jj * k + b;
            if (xp[at] > v || (xp[at] != xp[at] && v == v))
              v = xp[at], best = at;
          }
        j->y[n * out + i * ow + jj] = v;
        j->arg[n * out + i * ow + jj] = best;
      }
  }
}

/* Planes [p0, p1) backward. */
TRN__VECTOR_CLONES
static void maxpool_back_planes(void *job, size_t p0, size_t p1) {
  const pool_job *j = job;
  size_t in = (size_t)j->h * j->w, out = (size_t)(j->h / j->k) * (j->w / j->k);
  memset(j->dx + p0 * in, 0, (p1 - p0) * in * sizeof *j->dx);
  for (size_t n = p0; n < p1; n++)
    for (size_t p = 0; p < out; p++)
      j->dx[n * in + j->carg[n * out + p]] += j->dy[n * out + p];
}

/* Planes are independent: shared among the pool's threads, the same bits
 * whatever their number. */
void trn__maxpool_fwd(const float *x, float *y, uint32_t *arg, size_t B,
                      unsigned c, unsigned h, unsigned w, unsigned k) {
  pool_job j = {.x = x, .y = y, .arg = arg, .h = h, .w = w, .k = k};
  trn__pool_for(B * c, 16, maxpool_planes, &j);
}

void trn__maxpool_bwd(const float *dy, const uint32_t *arg, float *dx,
                      size_t B, unsigned c, unsigned h, unsigned w,
                      unsigned k) {
  pool_job j = {.dy = dy, .dx = dx, .carg = arg, .h = h, .w = w, .k = k};
  trn__pool_for(B * c, 16, maxpool_back_planes, &j);
}

/* A counter-based generator: the mask of a call depends only on the seed
 * and the call's number, so a restored run draws the same masks. */
static uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void trn__dropout_draw(float p, uint64_t seed, uint64_t call, uint64_t *base,
                       uint64_t *cut) {
  *base = mix(seed ^ mix(call + 0x64726f70ull));
  /* 2^-32 steps: p is compared with 32 random bits per element. */
  *cut = (uint64_t)((double)p * 4294967296.0);
}

void trn__dropout_fwd(const float *x, float *y, float *mask, size_t n,
                      float p, uint64_t seed, uint64_t call) {
  float keep = 1.0f / (1.0f - p);
  uint64_t base, cut;
  trn__dropout_draw(p, seed, call, &base, &cut);
  for (size_t i = 0; i < n; i++) {
    uint64_t r = mix(base + 0x9e3779b97f4a7c15ull * (i + 1)) >> 32;
    mask[i] = r < cut ? 0.0f : keep;
    y[i] = x[i] * mask[i];
  }
}

void trn__dropout_bwd(const float *mask, const float *dy, float *dx,
                      size_t n) {
  for (size_t i = 0; i < n; i++)
    dx[i] = dy[i] * mask[i];
}

/* ---- batch normalization --------------------------------------------------- */

/* Channels are independent: shared among the pool's threads, the same
 * bits whatever their number. */
typedef struct bn_job {
  const trn__bn *bn;
  const float *x, *gamma, *beta, *mean_in, *inv_in, *dy;
  float *y, *mean_out, *inv, *run_mean, *run_var, *dx, *dgamma, *dbeta;
  size_t B;
  bool train;
} bn_job;

TRN__VECTOR_CLONES
static void bn_fwd_channels(void *job, size_t c0, size_t c1) {
  const bn_job *j = job;
  const trn__bn *bn = j->bn;
  const float *x = j->x, *gamma = j->gamma, *beta = j->beta;
  float *y = j->y, *mean_out = j->mean_out, *inv = j->inv;
  float *run_mean = j->run_mean, *run_var = j->run_var;
  size_t B = j->B, hw = bn->hw, n = B * hw;
  bool train = j->train;
  for (size_t c = c0; c < c1; c++) {
    float mean, var;
    if (train) {
      /* The batch's statistics over (n, h, w), in double. */
      double acc[8] = {0};
      for (size_t b = 0; b < B; b++)
        add8(x + (b * bn->c + c) * hw, hw, acc);
      double mu = lanes(acc) / (double)n;
      memset(acc, 0, sizeof acc);
      for (size_t b = 0; b < B; b++)
        add8_sq(x + (b * bn->c + c) * hw, mu, hw, acc);
      double ss = lanes(acc);
      mean = (float)mu;
      var = (float)(ss / (double)n); /* biased, for normalizing */
      /* Running statistics as torch.nn.BatchNorm2d keeps them: the
       * variance unbiased. */
      float unbiased = n > 1 ? (float)(ss / (double)(n - 1)) : var;
      run_mean[c] = (1 - bn->momentum) * run_mean[c] + bn->momentum * mean;
      run_var[c] = (1 - bn->momentum) * run_var[c] + bn->momentum * unbiased;
    } else {
      mean = run_mean[c], var = run_var[c];
    }
    float is = 1.0f / sqrtf(var + bn->eps);
    if (inv)
      inv[c] = is;
    if (mean_out)
      mean_out[c] = mean;
    for (size_t b = 0; b < B; b++) {
      size_t at = (b * bn->c + c) * hw;
      for (size_t i = 0; i < hw; i++)
        y[at + i] = gamma[c] * ((x[at + i] - mean) * is) + beta[c];
    }
  }
}

void trn__bn_fwd(const trn__bn *bn, const float *x, const float *gamma,
                 const float *beta, float *y, float *mean, float *inv,
                 float *run_mean, float *run_var, size_t B, bool train) {
  bn_job j = {.bn = bn, .x = x, .gamma = gamma, .beta = beta, .y = y,
              .mean_out = mean, .inv = inv, .run_mean = run_mean,
              .run_var = run_var, .B = B, .train = train};
  trn__pool_for(bn->c, 2, bn_fwd_channels, &j);
}

TRN__VECTOR_CLONES
static void bn_bwd_channels(void *job, size_t c0, size_t c1) {
  const bn_job *j = job;
  const trn__bn *bn = j->bn;
  const float *x = j->x, *mean = j->mean_in, *inv = j->inv_in;
  const float *gamma = j->gamma, *dy = j->dy;
  float *dx = j->dx, *dgamma = j->dgamma, *dbeta = j->dbeta;
  size_t B = j->B, hw = bn->hw, n = B * hw;
  for (size_t c = c0; c < c1; c++) {
    double ag[8] = {0}, ab[8] = {0}; /* sum dy xhat, sum dy */
    for (size_t b = 0; b < B; b++) {
      size_t at = (b * bn->c + c) * hw;
      add8_dot_norm(dy + at, x + at, mean[c], inv[c], hw, ag);
      add8(dy + at, hw, ab);
    }
    double sg = lanes(ag), sb = lanes(ab);
    dgamma[c] += (float)sg;
    dbeta[c] += (float)sb;
    if (!dx)
      continue;
    /* dx = gamma inv / n (n dy - sum dy - xhat sum dy xhat) */
    float k = gamma[c] * inv[c] / (float)n, m = mean[c], is = inv[c];
    float mb = (float)sb, mg = (float)sg;
    for (size_t b = 0; b < B; b++) {
      size_t at = (b * bn->c + c) * hw;
      for (size_t i = 0; i < hw; i++)
        dx[at + i] =
            k * ((float)n * dy[at + i] - mb - ((x[at + i] - m) * is) * mg);
    }
  }
}

void trn__bn_bwd(const trn__bn *bn, const float *x, const float *mean,
                 const float *inv, const float *gamma, const float *dy,
                 float *dx, float *dgamma, float *dbeta, size_t B) {
  bn_job j = {.bn = bn, .x = x, .mean_in = mean, .inv_in = inv, .gamma = gamma,
              .dy = dy, .dx = dx, .dgamma = dgamma, .dbeta = dbeta, .B = B};
  trn__pool_for(bn->c, 2, bn_bwd_channels, &j);
}
