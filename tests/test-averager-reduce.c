/* test-averager-reduce.c: the owner's arithmetic and the split into spans.
 *
 * The weighted mean is checked against a double-precision reference within
 * the fp32 summation bound of docs/AVERAGING.md, section 4, run twice for
 * the same bits, fed through every codec's hot path (which must give the
 * same bits as decoding first), and with zero weights, refused inputs and
 * overflow.  The clip rule is checked case by case and on a group with
 * one runaway member.  The spans are checked for their properties on
 * random groups and, for every small group, against brute force: no other
 * split into aligned units gives a shorter round under the model, nor a
 * better sorted list of member times.  Last, the bytes each member sends
 * in a round with equal spans must be 2 (N - 1) / N x payload x the
 * codec's ratio within 2%.
 */
#include "averager.h"
#include "test.h"

#include <float.h>
#include <math.h>

static uint64_t rng = 0x2545f4914f6cdd1du;

static uint64_t next(void) {
  rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
  return rng * 2685821657736338717u;
}

static double uniform(void) { return (double)(next() >> 11) * 0x1p-53; }
static size_t below(size_t n) { return (size_t)(uniform() * (double)n); }

static double normal(void) {
  double u = uniform() + 0x1p-54, v = uniform();
  return sqrt(-2 * log(u)) * cos(2 * M_PI * v);
}

static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  ASSERT(p);
  return p;
}

/* ---- check ------------------------------------------------------------------ */

static void test_check(void) {
  enum { N = 10007 };
  float *x = xmalloc(N * sizeof *x);
  double ref = 0, sq;
  for (size_t i = 0; i < N; i++) {
    x[i] = (float)(1e3 * normal());
    ref += (double)x[i] * x[i];
  }
  ASSERT_OK(avg_check(x, N, &sq));
  ASSERT(fabs(sq - ref) <= 1e-12 * ref);
  ASSERT_OK(avg_check(x, 0, &sq));
  ASSERT(sq == 0);
  /* Large but finite values do not overflow the double sum. */
  for (size_t i = 0; i < N; i++)
    x[i] = i % 2 ? FLT_MAX : -FLT_MAX;
  ASSERT_OK(avg_check(x, N, &sq));
  ASSERT(isfinite(sq) && sq > 1e80);
  size_t at[] = {0, 1, 7, 8, N / 2, N - 8, N - 1};
  float bad[] = {NAN, INFINITY, -INFINITY};
  for (size_t k = 0; k < sizeof at / sizeof at[0]; k++)
    for (int j = 0; j < 3; j++) {
      float keep = x[at[k]];
      x[at[k]] = bad[j];
      ASSERT_RC(avg_check(x, N, &sq), BEE_ERANGE);
      ASSERT(!isfinite(sq));
      x[at[k]] = keep;
    }
  free(x);
}

/* ---- the weighted mean ------------------------------------------------------ */

enum { K = 9, N = 20011 };

/* The mean of the k contributions x[j] with weights w[j], added in member
 * order through codec c (AVG_NONE through avg_acc_add for member 0, our
 * own), into out. */
static void mean(avg_codec c, float (*x)[N], const float *w, size_t k,
                 float *out) {
  avg_acc a;
  avg_acc_init(&a, out, N);
  size_t cap = avg_encoded_size(AVG_NONE, N), len;
  uint8_t *buf = xmalloc(cap);
  for (size_t j = 0; j < k; j++) {
    if (j == 0) {
      ASSERT_OK(avg_acc_add(&a, x[j], w[j]));
      continue;
    }
    ASSERT_OK(avg_encode(c, x[j], N, buf, cap, &len));
    ASSERT_OK(avg_acc_add_encoded(&a, c, buf, len, w[j]));
  }
  ASSERT_UEQ(a.count, k);
  ASSERT_OK(avg_acc_finish(&a, x[0]));
  free(buf);
}

static void test_mean(void) {
  float(*x)[N] = xmalloc(K * sizeof *x);
  float *out = xmalloc(N * sizeof *out), *again = xmalloc(N * sizeof *again);
  float w[K];
  double worst = 0;
  static const double scales[] = {1e-30, 1e-3, 1, 1e4, 1e30};
  for (size_t s = 0; s < 5; s++) {
    for (size_t j = 0; j < K; j++) {
      w[j] = j == 3 ? 0 : (float)(1 + below(64)); /* sample counts */
      for (size_t i = 0; i < N; i++)
        x[j][i] = (float)(scales[s] * (normal() + (j == 5 ? 0.5 : 0)));
    }
    mean(AVG_NONE, x, w, K, out);
    double W = 0;
    for (size_t j = 0; j < K; j++)
      W += w[j];
    for (size_t i = 0; i < N; i++) {
      double ref = 0, mag = 0;
      for (size_t j = 0; j < K; j++) {
        ref += (double)w[j] * x[j][i];
        mag += fabs((double)w[j] * x[j][i]);
      }
      ref /= W, mag /= W;
      /* K - 1 additions and a product per term, then W's rounding and
       * the division: (K + 2) u of the magnitudes, u = 2^-24. */
      double b = (K + 2) * 0x1p-24 * mag + 0x1p-149;
      double err = fabs(out[i] - ref);
      if (!(err <= b))
        FAIL("mean[%zu] = %a, reference %a: error %g > %g", i, out[i], ref, err,
             b);
      worst = fmax(worst, err / (0x1p-24 * mag));
    }
    /* Bitwise the same when run again. */
    mean(AVG_NONE, x, w, K, again);
    ASSERT_MEMEQ(out, again, N * sizeof *out);
    /* Through each codec's hot path: the same bits as adding the decoded
     * contributions. */
    for (int c = 1; c < AVG_CODEC_COUNT; c++) {
      if (c == AVG_FP16 && scales[s] > 1e3)
        continue;
      mean(c, x, w, K, out);
      float(*y)[N] = xmalloc(K * sizeof *y);
      size_t cap = avg_encoded_size(AVG_NONE, N), len;
      uint8_t *buf = xmalloc(cap);
      memcpy(y[0], x[0], sizeof y[0]);
      for (size_t j = 1; j < K; j++) {
        ASSERT_OK(avg_encode(c, x[j], N, buf, cap, &len));
        ASSERT_OK(avg_decode(c, buf, len, N, y[j]));
      }
      mean(AVG_NONE, y, w, K, again);
      ASSERT_MEMEQ(out, again, N * sizeof *out);
      free(buf);
      free(y);
    }
  }
  printf("mean: largest error %.2f u of the magnitudes (bound %d u)\n", worst,
         K + 2);
  free(out);
  free(again);
  free(x);
}

static void test_mean_edges(void) {
  float *x = xmalloc(N * sizeof *x), *local = xmalloc(N * sizeof *local);
  float *buf = xmalloc(N * sizeof *buf), *keep = xmalloc(N * sizeof *keep);
  for (size_t i = 0; i < N; i++)
    x[i] = (float)normal(), local[i] = (float)normal();
  avg_acc a;
  /* Zero weights only: the local values stay. */
  avg_acc_init(&a, buf, N);
  ASSERT_OK(avg_acc_add(&a, x, 0));
  ASSERT_OK(avg_acc_add(&a, x, -0.0f));
  ASSERT_UEQ(a.count, 2);
  ASSERT_OK(avg_acc_finish(&a, local));
  ASSERT_MEMEQ(buf, local, N * sizeof *buf);
  /* Nothing at all: the same. */
  avg_acc_init(&a, buf, N);
  ASSERT_OK(avg_acc_finish(&a, local));
  ASSERT_MEMEQ(buf, local, N * sizeof *buf);
  /* A zero-weight member changes nothing, and one member's mean is itself
   * (weight 3: x * 3 / 3 is x exactly unless rounding, so use 1 and 4). */
  avg_acc_init(&a, buf, N);
  ASSERT_OK(avg_acc_add(&a, x, 1));
  memcpy(keep, buf, N * sizeof *buf);
  ASSERT_OK(avg_acc_add(&a, local, 0));
  ASSERT_MEMEQ(buf, keep, N * sizeof *buf);
  ASSERT_OK(avg_acc_finish(&a, local));
  ASSERT_MEMEQ(buf, x, N * sizeof *buf);
  avg_acc_init(&a, buf, N);
  ASSERT_OK(avg_acc_add(&a, x, 4));
  ASSERT_OK(avg_acc_finish(&a, local));
  ASSERT_MEMEQ(buf, x, N * sizeof *buf);
  /* Refused: bad weights, bad values, bad parts; nothing added. */
  avg_acc_init(&a, buf, N);
  ASSERT_OK(avg_acc_add(&a, x, 2));
  memcpy(keep, buf, N * sizeof *buf);
  float bw[] = {-1, NAN, INFINITY, -INFINITY};
  for (int k = 0; k < 4; k++)
    ASSERT_RC(avg_acc_add(&a, local, bw[k]), BEE_ERANGE);
  float sv = local[N - 1];
  local[N - 1] = NAN;
  ASSERT_RC(avg_acc_add(&a, local, 1), BEE_ERANGE);
  local[N - 1] = sv;
  uint8_t *enc = xmalloc(avg_encoded_size(AVG_NONE, N));
  size_t len;
  ASSERT_OK(avg_encode(AVG_B8, local, N, enc, 4 * N, &len));
  ASSERT_RC(avg_acc_add_encoded(&a, AVG_B8, enc, len - 1, 1), BEE_ETRUNCATED);
  enc[len - 1] = 0x80;
  ASSERT_RC(avg_acc_add_encoded(&a, AVG_B8, enc, len, 1), BEE_EMALFORMED);
  ASSERT_MEMEQ(buf, keep, N * sizeof *buf);
  ASSERT_UEQ(a.count, 1);
  ASSERT(a.weight == 2);
  /* A weighted sum that overflows fp32: refused at the end, local kept. */
  for (size_t i = 0; i < N; i++)
    x[i] = 3e38f;
  ASSERT_OK(avg_acc_add(&a, x, 1));
  ASSERT_OK(avg_acc_add(&a, x, 1));
  ASSERT_RC(avg_acc_finish(&a, local), BEE_ERANGE);
  ASSERT_MEMEQ(buf, local, N * sizeof *buf);
  free(enc), free(x), free(local), free(buf), free(keep);
}

/* ---- clipping --------------------------------------------------------------- */

static void test_clip(void) {
  double v[] = {3, NAN, 1, 2};
  ASSERT(avg_median(v, 3) == 3); /* 3, NaN, 1: NaN last */
  ASSERT(v[0] == 1 && v[1] == 3 && isnan(v[2]));
  double u[] = {4, 1, 3, 2};
  ASSERT(avg_median(u, 4) == 2.5);
  ASSERT(avg_median(u, 1) == 1);
  ASSERT(avg_median(NULL, 0) == 0);

  ASSERT(avg_clip_factor(5, 1, 10, AVG_CLIP_SCALE) == 1);
  ASSERT(avg_clip_factor(10, 1, 10, AVG_CLIP_SCALE) == 1);
  ASSERT(avg_clip_factor(40, 1, 10, AVG_CLIP_SCALE) == 0.25);
  ASSERT(avg_clip_factor(40, 1, 10, AVG_CLIP_DROP) == 0);
  ASSERT(avg_clip_factor(40, 1, 10, AVG_CLIP_OFF) == 1);
  ASSERT(avg_clip_factor(40, 1, 0, AVG_CLIP_DROP) == 1);
  ASSERT(avg_clip_factor(40, 1, NAN, AVG_CLIP_DROP) == 1);
  ASSERT(avg_clip_factor(40, NAN, 10, AVG_CLIP_DROP) == 1);
  ASSERT(avg_clip_factor(40, INFINITY, 10, AVG_CLIP_DROP) == 1);
  ASSERT(avg_clip_factor(0, 0, 10, AVG_CLIP_SCALE) == 1);
  ASSERT(avg_clip_factor(1e-30, 0, 10, AVG_CLIP_SCALE) == 0);
  double bad[] = {NAN, INFINITY, -1};
  for (int k = 0; k < 3; k++)
    for (int mode = 0; mode < 3; mode++)
      ASSERT(avg_clip_factor(bad[k], 1, 10, mode) == 0);

  /* A group where member 2's gradient ran away (x 1000): scaled, its
   * contribution has norm clip x median and the mean stays near the
   * others'; dropped, the mean is the others'. */
  enum { M = 6, L = 1000 };
  static float g[M][L];
  double norms[M], sorted[M];
  for (size_t j = 0; j < M; j++) {
    for (size_t i = 0; i < L; i++)
      g[j][i] = (float)((1 + 0.1 * normal()) * (j == 2 ? 1000 : 1));
    double sq;
    ASSERT_OK(avg_check(g[j], L, &sq));
    norms[j] = sorted[j] = sqrt(sq);
  }
  double med = avg_median(sorted, M);
  for (int mode = AVG_CLIP_SCALE; mode <= AVG_CLIP_DROP; mode++) {
    float out[L], tmp[L];
    avg_acc a;
    avg_acc_init(&a, out, L);
    for (size_t j = 0; j < M; j++) {
      double f = avg_clip_factor(norms[j], med, 5, mode);
      ASSERT(j == 2 ? f < 0.01 : f == 1);
      if (f == 0)
        continue; /* dropped */
      for (size_t i = 0; i < L; i++)
        tmp[i] = (float)(g[j][i] * f);
      double sq;
      ASSERT_OK(avg_check(tmp, L, &sq));
      ASSERT(sqrt(sq) <= 5 * med * (1 + 1e-6));
      ASSERT_OK(avg_acc_add(&a, tmp, 1));
    }
    ASSERT_OK(avg_acc_finish(&a, g[0]));
    double m = 0;
    for (size_t i = 0; i < L; i++)
      m += out[i] / L;
    ASSERT(mode == AVG_CLIP_SCALE ? m < 2 : fabs(m - 1) < 0.02);
  }
}

/* ---- spans -------------------------------------------------------------------- */

/* The model's times of docs/AVERAGING.md, section 3, in floats over the
 * rate: (P + (N - 2) len) / b for N >= 3, and len / b for N <= 2 (where
 * every split moves the same bytes and the tie-break is proportional). */
static double span_time(size_t total, size_t nm, double b, size_t len) {
  if (nm >= 3)
    return ((double)total + (double)(nm - 2) * (double)len) / b;
  return (double)len / b;
}

static void check_props(size_t total, size_t nm, const double *b,
                        const bool *red, size_t align, const size_t *start,
                        const size_t *len) {
  size_t at = 0, last = SIZE_MAX;
  for (size_t i = 0; i < nm; i++) {
    ASSERT_UEQ(start[i], at);
    at += len[i];
    if (!red[i] || b[i] == 0)
      ASSERT_UEQ(len[i], 0);
    else
      last = i;
  }
  ASSERT_UEQ(at, total);
  /* Starts aligned up to the last owner's; those after it start at the
   * end, with nothing. */
  for (size_t i = 0; i < nm; i++) {
    if (i <= last)
      ASSERT_UEQ(start[i] % align, 0);
    if (i != last)
      ASSERT_UEQ(len[i] % align, 0);
  }
}

/* Sorted times of the owners, largest first, for a split into units. */
static void times(size_t total, size_t nm, const double *b, const bool *red,
                  size_t align, const size_t *units, double *t, size_t *nt) {
  size_t last = 0, k = 0;
  for (size_t i = 0; i < nm; i++)
    if (red[i] && b[i] > 0)
      last = i;
  for (size_t i = 0; i < nm; i++)
    if (red[i] && b[i] > 0) {
      size_t len = units[i] * align + (i == last ? total % align : 0);
      t[k++] = span_time(total, nm, b[i], len);
    }
  for (size_t i = 1; i < k; i++) /* largest first */
    for (size_t j = i; j > 0 && t[j] > t[j - 1]; j--) {
      double s = t[j];
      t[j] = t[j - 1], t[j - 1] = s;
    }
  *nt = k;
}

/* -1, 0, 1 as a is lexicographically better, equal, worse than b (within
 * a relative 1e-12 per entry). */
static int lex(const double *a, const double *b, size_t n) {
  for (size_t i = 0; i < n; i++) {
    double tol = 1e-12 * fmax(a[i], b[i]);
    if (a[i] < b[i] - tol)
      return -1;
    if (a[i] > b[i] + tol)
      return 1;
  }
  return 0;
}

/* Every split of K units among the owners, against ours. */
static size_t brute(size_t total, size_t nm, const double *b, const bool *red,
                    size_t align, const size_t *len) {
  size_t nu = total / align, units[8] = {0}, ours[8], own[8], no = 0;
  double tb[8], to[8];
  size_t nt;
  for (size_t i = 0; i < nm; i++) {
    ours[i] = len[i] / align;
    if (red[i] && b[i] > 0)
      own[no++] = i;
  }
  times(total, nm, b, red, align, ours, to, &nt);
  size_t splits = 0;
  /* Odometer over the first no - 1 owners; the last takes the rest. */
  for (;;) {
    size_t used = 0;
    for (size_t k = 0; k + 1 < no; k++)
      used += units[own[k]];
    if (used <= nu) {
      units[own[no - 1]] = nu - used;
      times(total, nm, b, red, align, units, tb, &nt);
      if (lex(tb, to, nt) < 0) {
        fprintf(stderr, "total %zu align %zu:", total, align);
        for (size_t i = 0; i < nm; i++)
          fprintf(stderr, " [b %g red %d len %zu vs %zu]", b[i], red[i], len[i],
                  units[i]);
        fprintf(stderr, "\n");
        for (size_t i = 0; i < nt; i++)
          fprintf(stderr, " %g/%g", tb[i], to[i]);
        fprintf(stderr, "\n");
      }
      if (lex(tb, to, nt) < 0)
        FAIL("a split beats ours: largest time %.17g vs %.17g", tb[0], to[0]);
      splits++;
    }
    size_t k = 0;
    for (; k + 1 < no; k++) {
      if (++units[own[k]] <= nu)
        break;
      units[own[k]] = 0;
    }
    if (k + 1 >= no)
      break;
  }
  return splits;
}

static void test_spans(void) {
  size_t start[AVG_GROUP_MAX], len[AVG_GROUP_MAX];
  double b[AVG_GROUP_MAX];
  bool red[AVG_GROUP_MAX];

  /* Errors. */
  b[0] = 1, red[0] = true, b[1] = 2, red[1] = false;
  ASSERT_RC(avg_spans(10, 0, b, red, 1, start, len), BEE_ERANGE);
  ASSERT_RC(avg_spans(10, 1, b, red, 0, start, len), BEE_ERANGE);
  ASSERT_RC(avg_spans(10, 2, b, red, 1, start, len), 0);
  red[0] = false;
  ASSERT_RC(avg_spans(10, 2, b, red, 1, start, len), BEE_ERANGE);
  red[0] = red[1] = true;
  double badb[] = {-1, NAN, INFINITY};
  for (int k = 0; k < 3; k++) {
    b[1] = badb[k];
    ASSERT_RC(avg_spans(10, 2, b, red, 1, start, len), BEE_ERANGE);
  }
  b[0] = b[1] = 0;
  ASSERT_RC(avg_spans(10, 2, b, red, 1, start, len), BEE_ERANGE);
  ASSERT_RC(avg_spans(10, AVG_GROUP_MAX + 1, b, red, 1, start, len),
            BEE_ETOOBIG);

  /* Equal bandwidths: equal spans within align, for every group size. */
  for (size_t nm = 1; nm <= 64; nm++) {
    size_t totals[] = {0, 1, 1000, 1 << 20, (1 << 20) + 17, 12345678};
    for (size_t t = 0; t < 6; t++) {
      size_t align = t % 2 ? 1 : 64;
      for (size_t i = 0; i < nm; i++)
        b[i] = 100, red[i] = true;
      ASSERT_OK(avg_spans(totals[t], nm, b, red, align, start, len));
      check_props(totals[t], nm, b, red, align, start, len);
      size_t lo = SIZE_MAX, hi = 0;
      for (size_t i = 0; i < nm; i++)
        lo = len[i] < lo ? len[i] : lo, hi = len[i] > hi ? len[i] : hi;
      ASSERT_LE(hi - lo, align);
    }
  }

  /* Random groups: properties, and the same answer twice. */
  for (int r = 0; r < 3000; r++) {
    size_t nm = 1 + below(r < 2900 ? 40 : AVG_GROUP_MAX);
    size_t total = below(r % 3 ? 1u << 24 : 300);
    size_t align = r % 4 ? 1 + below(300) : 1;
    bool any = false;
    for (size_t i = 0; i < nm; i++) {
      red[i] = below(5) != 0;
      b[i] = below(8) ? exp(4 * normal()) : 0;
      any |= red[i] && b[i] > 0;
    }
    int rc = avg_spans(total, nm, b, red, align, start, len);
    if (!any) {
      ASSERT_RC(rc, BEE_ERANGE);
      continue;
    }
    ASSERT_OK(rc);
    check_props(total, nm, b, red, align, start, len);
    size_t len2[AVG_GROUP_MAX], start2[AVG_GROUP_MAX];
    ASSERT_OK(avg_spans(total, nm, b, red, align, start2, len2));
    ASSERT_MEMEQ(len, len2, nm * sizeof *len);
  }

  /* Brute force: every small group, every split. */
  size_t splits = 0, cases = 0;
  for (int r = 0; r < 4000; r++) {
    size_t nm = 1 + below(5), align = 1 + below(4);
    size_t total = below(11 * align + 1);
    bool any = false;
    for (size_t i = 0; i < nm; i++) {
      red[i] = below(4) != 0;
      /* Few distinct values, so ties happen. */
      b[i] = r % 2 ? (double)below(4) : exp(2 * normal());
      any |= red[i] && b[i] > 0;
    }
    if (!any)
      continue;
    ASSERT_OK(avg_spans(total, nm, b, red, align, start, len));
    check_props(total, nm, b, red, align, start, len);
    splits += brute(total, nm, b, red, align, len);
    cases++;
  }
  printf("spans: %zu small groups, %zu splits: none beats ours\n", cases,
         splits);

  /* What it buys: one member at half the others' rate. */
  size_t P = 1 << 24, nm = 8;
  for (size_t i = 0; i < nm; i++)
    b[i] = i == 3 ? 50 : 100, red[i] = true;
  ASSERT_OK(avg_spans(P, nm, b, red, 1, start, len));
  double ours = 0, equal = 0;
  for (size_t i = 0; i < nm; i++) {
    ours = fmax(ours, span_time(P, nm, b[i], len[i]));
    equal = fmax(equal, span_time(P, nm, b[i], P / nm));
  }
  printf("spans: 8 members, one at half rate: round %.3f of the equal "
         "split's (slow member owns %.4f)\n",
         ours / equal, (double)len[3] / P);
  ASSERT(ours < 0.8 * equal);
  ASSERT(len[3] < len[0] / 2);
}

/* ---- bytes per member --------------------------------------------------------- */

/* What member i sends in a round: its piece of each other owner's span,
 * and the result of its own span to each other member, in parts of at
 * most `part` floats, each part encoded on its own. */
static size_t sent(avg_codec c, size_t nm, size_t i, const size_t *len,
                   size_t part) {
  size_t bytes = 0;
  for (size_t j = 0; j < nm; j++) {
    size_t enc = 0;
    for (size_t at = 0; at < len[j]; at += part)
      enc += avg_encoded_size(c, len[j] - at < part ? len[j] - at : part);
    bytes += j == i ? (nm - 1) * enc : enc;
  }
  return bytes;
}

static void test_bytes(void) {
  static const double ratio[] = {1, 0.5, 0.5, 0.25, 0.25};
  size_t start[64], len[64], part = (512u << 10) / 4;
  double b[64];
  bool red[64];
  double worst = 0;
  size_t totals[] = {1u << 20, 25000000, 110000000};
  for (size_t t = 0; t < 3; t++)
    for (size_t nm = 2; nm <= 64; nm *= 2) {
      for (size_t i = 0; i < nm; i++)
        b[i] = 1, red[i] = true;
      ASSERT_OK(avg_spans(totals[t], nm, b, red, 1024, start, len));
      for (int c = 0; c < AVG_CODEC_COUNT; c++) {
        double want = 2.0 * (double)(nm - 1) / (double)nm * 4.0 *
                      (double)totals[t] * ratio[c];
        for (size_t i = 0; i < nm; i++) {
          double dev = fabs((double)sent(c, nm, i, len, part) / want - 1);
          worst = fmax(worst, dev);
          if (dev > 0.02)
            FAIL("%s, N = %zu, P = %zu floats: member %zu sends %zu bytes, "
                 "%.2f%% off 2(N-1)/N P r = %.0f",
                 avg_codec_name(c), nm, totals[t], i, sent(c, nm, i, len, part),
                 dev * 100, want);
        }
      }
    }
  printf("bytes: largest deviation from 2(N-1)/N x payload x ratio: %.3f%%\n",
         worst * 100);
}

int main(void) {
  test_check();
  test_mean();
  test_mean_edges();
  test_clip();
  test_spans();
  test_bytes();
  printf("ok\n");
  return 0;
}
