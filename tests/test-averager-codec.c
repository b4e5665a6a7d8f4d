/* test-averager-codec.c: the part codecs against references and bounds.
 *
 * fp16 and bf16 are checked against a reference that rounds in double
 * (frexp, nearbyint): every binary16 and bfloat16 value decodes exactly
 * and encodes back to itself, every midpoint between two neighbours goes
 * to the even one (and one fp32 ulp either side to the nearer one), and
 * 2^20 floats spread over the whole binary32 range round as the reference
 * says (and as the compiler's _Float16 does, where it has one).  Every
 * codec then takes random data at scales from subnormal to 1e37 and at
 * the sizes around a b8 block; the measured largest error must be within
 * the bound docs/AVERAGING.md derives, and is printed next to it.  Bad
 * parts (cut, padded, NaN or negative scales, infinities, the int8 -128)
 * are refused with their codes and leave the accumulator untouched, and
 * error feedback is measured over repeated rounds.
 */
#include "averager.h"
#include "test.h"

#include <float.h>
#include <math.h>

/* The compiler's own binary16, a second reference where it has one. */
#if defined(__FLT16_MAX__) && defined(__GNUC__)
#define HAVE_F16 1
__extension__ typedef _Float16 half_t;
#else
#define HAVE_F16 0
#endif

static const size_t sizes[] = {0,    1,    2,    3,     4095,  4096,
                               4097, 8191, 8192, 12289, 100003};

/* ---- helpers -------------------------------------------------------------- */

static uint64_t rng = 0x9e3779b97f4a7c15u;

static uint64_t next(void) { /* xorshift64* */
  rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
  return rng * 2685821657736338717u;
}

static double uniform(void) { return (double)(next() >> 11) * 0x1p-53; }

static double normal(void) {
  double u = uniform() + 0x1p-54, v = uniform();
  return sqrt(-2 * log(u)) * cos(2 * M_PI * v);
}

static uint32_t fbits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static float bitsf(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  ASSERT(p);
  return p;
}

/* Encodes x into an exact-size buffer (so ASan sees any overrun). */
static uint8_t *encode(avg_codec c, const float *x, size_t n, size_t *len) {
  size_t need = avg_encoded_size(c, n);
  uint8_t *out = xmalloc(need);
  ASSERT_OK(avg_encode(c, x, n, out, need, len));
  ASSERT_UEQ(*len, need);
  return out;
}

static float *decode(avg_codec c, const uint8_t *in, size_t len, size_t n) {
  float *y = xmalloc(n * sizeof *y);
  ASSERT_OK(avg_decode(c, in, len, n, y));
  return y;
}

/* ---- references ----------------------------------------------------------- */

/* The binary16 nearest to finite x, ties to even, by arithmetic in double;
 * -1 when it rounds to infinity. */
static int32_t ref_f16(float x) {
  double a = fabs(x);
  int32_t sign = signbit(x) ? 0x8000 : 0;
  if (a >= 65520.0)
    return -1;
  if (a < 0x1p-14)
    return sign | (int32_t)nearbyint(a * 0x1p24);
  int e;
  frexp(a, &e);                           /* a in [2^(e-1), 2^e) */
  double q = nearbyint(ldexp(a, 11 - e)); /* 1024..2048 */
  return sign | (((e - 1 + 15) << 10) + (int32_t)q - 1024);
}

static double val_f16(uint32_t h) {
  int e = (int)(h >> 10 & 31), m = (int)(h & 1023);
  double v = e ? ldexp(1024 + m, e - 25) : ldexp(m, -24);
  return h & 0x8000 ? -v : v;
}

/* The bfloat16 nearest to finite x; -1 for infinity. */
static int32_t ref_bf16(float x) {
  double a = fabs(x);
  int32_t sign = signbit(x) ? 0x8000 : 0;
  if (a >= 0x1p128 * (1 - 0x1p-9))
    return -1;
  if (a < 0x1p-126)
    return sign | (int32_t)nearbyint(a * 0x1p133);
  int e;
  frexp(a, &e);
  double q = nearbyint(ldexp(a, 8 - e)); /* 128..256 */
  return sign | (((e - 1 + 127) << 7) + (int32_t)q - 128);
}

/* ---- fp16 and bf16: exact values, ties, and the whole range ---------------- */

/* Every half with exponent below 31 decodes to its value and encodes back
 * to its own bits (-0 and the subnormals included). */
static void test_f16_exhaustive(void) {
  float *x = xmalloc(65536 * sizeof *x);
  uint8_t *in = xmalloc(2 * 65536);
  size_t n = 0;
  for (uint32_t h = 0; h < 65536; h++)
    if ((h & 0x7c00) != 0x7c00)
      in[2 * n] = (uint8_t)h, in[2 * n + 1] = (uint8_t)(h >> 8), n++;
  ASSERT_UEQ(n, 63488);
  ASSERT_OK(avg_decode(AVG_FP16, in, 2 * n, n, x));
  for (size_t i = 0; i < n; i++) {
    uint32_t h = (uint32_t)in[2 * i] | (uint32_t)in[2 * i + 1] << 8;
    float want = (float)val_f16(h);
    if (fbits(x[i]) != fbits(want))
      FAIL("half %04x decodes to %a, want %a", h, x[i], want);
  }
  size_t len;
  uint8_t *back = encode(AVG_FP16, x, n, &len);
  ASSERT_MEMEQ(back, in, 2 * n);
  free(back);

  free(in);
  free(x);

  /* Ties: the midpoint of two neighbours goes to the even one, one fp32
   * ulp off it to the nearer. */
  size_t m = 0;
  x = xmalloc(6 * 0x7bff * sizeof *x);
  uint16_t *want = xmalloc(6 * 0x7bff * sizeof *want);
  for (uint32_t h = 0; h < 0x7bff; h++) {
    double lo = val_f16(h), hi = val_f16(h + 1);
    float mid = (float)((lo + hi) / 2);
    ASSERT((double)mid == (lo + hi) / 2);
    for (uint32_t s = 0; s < 2; s++) {
      float sg = s ? -1.0f : 1.0f;
      uint16_t sb = (uint16_t)(s << 15), even = (uint16_t)(h & 1 ? h + 1 : h);
      x[m] = sg * mid, want[m++] = sb | even;
      x[m] = sg * nextafterf(mid, 0), want[m++] = (uint16_t)(sb | h);
      x[m] = sg * nextafterf(mid, INFINITY),
      want[m++] = (uint16_t)(sb | (h + 1));
    }
  }
  uint8_t *out = encode(AVG_FP16, x, m, &len);
  for (size_t i = 0; i < m; i++) {
    uint32_t got = (uint32_t)out[2 * i] | (uint32_t)out[2 * i + 1] << 8;
    if (got != want[i] || (int32_t)got != ref_f16(x[i]))
      FAIL("fp16(%a) = %04x, want %04x (reference %04x)", x[i], got, want[i],
           ref_f16(x[i]));
  }
  free(want);
  free(out);
  free(x);
}

static void test_bf16_exhaustive(void) {
  float *x = xmalloc(65536 * sizeof *x);
  uint8_t *in = xmalloc(2 * 65536);
  size_t n = 0;
  for (uint32_t h = 0; h < 65536; h++)
    if ((h & 0x7f80) != 0x7f80)
      in[2 * n] = (uint8_t)h, in[2 * n + 1] = (uint8_t)(h >> 8), n++;
  ASSERT_OK(avg_decode(AVG_BF16, in, 2 * n, n, x));
  for (size_t i = 0; i < n; i++) {
    uint32_t h = (uint32_t)in[2 * i] | (uint32_t)in[2 * i + 1] << 8;
    ASSERT_UEQ(fbits(x[i]), h << 16);
  }
  size_t len;
  uint8_t *back = encode(AVG_BF16, x, n, &len);
  ASSERT_MEMEQ(back, in, 2 * n);
  free(back);
  free(in);

  /* Midpoints are the halfway bit pattern, within a binade or across. */
  size_t m = 0;
  for (uint32_t h = 0; h < 0x7f7f; h++)
    for (uint32_t s = 0; s < 2; s++) {
      uint32_t mid = (s << 31) | h << 16 | 0x8000;
      x[m++] = bitsf(mid), x[m++] = bitsf(mid - 1), x[m++] = bitsf(mid + 1);
      if (m + 6 > 65536) {
        uint8_t *out = encode(AVG_BF16, x, m, &len);
        for (size_t i = 0; i < m; i++) {
          uint32_t got = (uint32_t)out[2 * i] | (uint32_t)out[2 * i + 1] << 8;
          if ((int32_t)got != ref_bf16(x[i]))
            FAIL("bf16(%a) = %04x, want %04x", x[i], got, ref_bf16(x[i]));
        }
        free(out);
        m = 0;
      }
    }
  free(x);
}

/* 2^20 floats at a stride over all 2^32 patterns, both codecs, against the
 * reference (and _Float16 when the compiler has it); those that round to
 * infinity, or are not finite, are refused. */
static void test_half_range(void) {
  enum { N = 1 << 20 };
  float *x = xmalloc(N * sizeof *x);
  for (int codec = AVG_FP16; codec <= AVG_BF16; codec++) {
    size_t n = 0, refused = 0;
    for (uint64_t b = 12345; b < (1ull << 32); b += 4093) {
      float f = bitsf((uint32_t)b);
      /* The references take finite values only (a NaN has no integer). */
      int32_t want = !isfinite(f)         ? -1
                     : codec == AVG_FP16 ? ref_f16(f)
                                         : ref_bf16(f);
      if (want >= 0) {
        x[n++] = f;
      } else if (refused++ % 97 == 0) {
        uint8_t o[2];
        size_t len;
        ASSERT_RC(avg_encode(codec, &f, 1, o, 2, &len), BEE_ERANGE);
      }
    }
    ASSERT(n > 900000 / (codec == AVG_FP16 ? 3 : 1));
    size_t len;
    uint8_t *out = encode(codec, x, n, &len);
    for (size_t i = 0; i < n; i++) {
      uint32_t got = (uint32_t)out[2 * i] | (uint32_t)out[2 * i + 1] << 8;
      int32_t want = codec == AVG_FP16 ? ref_f16(x[i]) : ref_bf16(x[i]);
      if ((int32_t)got != want)
        FAIL("%s(%a) = %04x, want %04x", avg_codec_name(codec), x[i], got,
             want);
#if HAVE_F16
      if (codec == AVG_FP16) {
        half_t h = (half_t)x[i];
        uint16_t hb;
        memcpy(&hb, &h, 2);
        ASSERT_UEQ(got, hb);
      }
#endif
    }
    free(out);
  }
  free(x);

  /* The edges of the range. */
  static const struct {
    float x;
    int codec, ok;
  } e[] = {
      {65504.0f, AVG_FP16, 1},
      {65519.996f, AVG_FP16, 1},
      {65520.0f, AVG_FP16, 0},
      {-65520.0f, AVG_FP16, 0},
      {0x1p-24f, AVG_FP16, 1},
      {0x1p-25f, AVG_FP16, 1}, /* to 0 */
      {FLT_MAX, AVG_FP16, 0},
      {0x1.fep127f, AVG_BF16, 1},
      {0x1.fefffep127f, AVG_BF16, 1},
      {0x1.ffp127f, AVG_BF16, 0},
      {-FLT_MAX, AVG_BF16, 0},
      {0x1p-149f, AVG_BF16, 1},
      {INFINITY, AVG_BF16, 0},
      {NAN, AVG_BF16, 0},
      {INFINITY, AVG_FP16, 0},
      {-NAN, AVG_FP16, 0},
      {NAN, AVG_NONE, 0},
      {-INFINITY, AVG_NONE, 0},
      {FLT_MAX, AVG_NONE, 1},
      {FLT_MAX, AVG_B8, 1},
      {NAN, AVG_U8, 0},
      {INFINITY, AVG_B8, 0},
  };
  for (size_t i = 0; i < sizeof e / sizeof e[0]; i++) {
    uint8_t o[16];
    size_t len = 99;
    int rc = avg_encode(e[i].codec, &e[i].x, 1, o, sizeof o, &len);
    if (rc != (e[i].ok ? 0 : BEE_ERANGE))
      FAIL("%s(%a): %s", avg_codec_name(e[i].codec), e[i].x, bee_errname(rc));
    ASSERT_UEQ(len, e[i].ok ? avg_encoded_size(e[i].codec, 1) : 99);
  }
}

/* ---- sizes ------------------------------------------------------------------- */

static void test_sizes(void) {
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
    size_t n = sizes[k], blocks = (n + AVG_B8_BLOCK - 1) / AVG_B8_BLOCK;
    ASSERT_UEQ(avg_encoded_size(AVG_NONE, n), 4 * n);
    ASSERT_UEQ(avg_encoded_size(AVG_FP16, n), 2 * n);
    ASSERT_UEQ(avg_encoded_size(AVG_BF16, n), 2 * n);
    ASSERT_UEQ(avg_encoded_size(AVG_U8, n), 8 + n);
    ASSERT_UEQ(avg_encoded_size(AVG_B8, n), 4 * blocks + n);
  }
  ASSERT_UEQ(avg_encoded_size(AVG_B8, 4097), 4105);
  ASSERT_UEQ(avg_encoded_size(AVG_CODEC_COUNT, 1), SIZE_MAX);
  ASSERT_UEQ(avg_encoded_size((avg_codec)-1, 1), SIZE_MAX);
  ASSERT_UEQ(avg_encoded_size(AVG_NONE, SIZE_MAX / 4 + 1), SIZE_MAX);
  ASSERT_UEQ(avg_encoded_size(AVG_FP16, SIZE_MAX / 2 + 1), SIZE_MAX);
  ASSERT_UEQ(avg_encoded_size(AVG_U8, SIZE_MAX - 8), SIZE_MAX);
  ASSERT_UEQ(avg_encoded_size(AVG_B8, SIZE_MAX - 100), SIZE_MAX);
  for (int c = 0; c < AVG_CODEC_COUNT; c++) {
    avg_codec p;
    ASSERT_OK(avg_codec_parse(avg_codec_name(c), &p));
    ASSERT_EQ(p, c);
  }
  avg_codec p;
  ASSERT_RC(avg_codec_parse("fp8", &p), BEE_ECONFIG);
  ASSERT_STREQ(avg_codec_name(AVG_CODEC_COUNT), "?");
}

/* ---- round trips within the documented bounds ------------------------------ */

/* The bounds of docs/AVERAGING.md, section 2, for one value x of a part (or
 * b8 block) whose min, max and absmax are given. */
static double bound(avg_codec c, double x, double lo, double hi, double amax) {
  double a = fabs(x);
  switch (c) {
  case AVG_FP16: return a >= 0x1p-14 ? a * 0x1p-11 : 0x1p-25;
  case AVG_BF16: return a >= 0x1p-126 ? a * 0x1p-8 : 0x1p-134;
  case AVG_U8:
    return (hi - lo) / 510 * (1 + 0x1p-12) +
           0x1p-22 * fmax(fabs(lo), fabs(hi)) + 0x1p-141;
  case AVG_B8: return amax / 254 * (1 + 0x1p-12) + 0x1p-143;
  default: return 0;
  }
}

/* The headline figure of each bound: half a step for u8 and b8, where the
 * other terms are negligible (normal scales, a range not tiny next to the
 * values); 0 where they are not, and for fp16 and bf16, whose headline is
 * |x| (relative error), taken per value by the caller. */
static double headline(avg_codec c, double lo, double hi, double amax) {
  switch (c) {
  case AVG_U8:
    if (hi - lo < 0x1p-100 ||
        0x1p-22 * fmax(fabs(lo), fabs(hi)) > 0x1p-10 * (hi - lo) / 510)
      return 0;
    return (hi - lo) / 510;
  case AVG_B8: return amax < 0x1p-100 ? 0 : amax / 254;
  default: return 0;
  }
}

typedef struct worst {
  double ratio; /* largest error / bound */
  double head;  /* largest error / headline (relative error for fp16, bf16) */
} worst;

/* Encodes x, decodes, and checks every value against its bound; also checks
 * that decode_add adds exactly w * decoded, value by value. */
static void roundtrip(avg_codec c, const float *x, size_t n, worst *w) {
  size_t len;
  uint8_t *enc = encode(c, x, n, &len);
  float *y = decode(c, enc, len, n);
  for (size_t i0 = 0; i0 < n || i0 == 0; i0 += AVG_B8_BLOCK) {
    /* Statistics of the part (u8) or of the block (b8). */
    size_t i1 = c == AVG_B8 && i0 + AVG_B8_BLOCK < n ? i0 + AVG_B8_BLOCK : n;
    size_t p0 = c == AVG_B8 ? i0 : 0;
    double lo = INFINITY, hi = -INFINITY, amax = 0;
    for (size_t i = p0; i < i1; i++)
      lo = fmin(lo, x[i]), hi = fmax(hi, x[i]), amax = fmax(amax, fabs(x[i]));
    for (size_t i = i0; i < i1; i++) {
      double err = fabs((double)y[i] - x[i]), b = bound(c, x[i], lo, hi, amax);
      if (c == AVG_NONE) {
        ASSERT_UEQ(fbits(y[i]), fbits(x[i]));
        continue;
      }
      if (!(err <= b))
        FAIL("%s: x[%zu] = %a decodes to %a, error %g > bound %g",
             avg_codec_name(c), i, x[i], y[i], err, b);
      w->ratio = fmax(w->ratio, err / b);
      double h = headline(c, lo, hi, amax);
      if (c == AVG_FP16 && fabs(x[i]) >= 0x1p-14)
        h = fabs(x[i]);
      if (c == AVG_BF16 && fabs(x[i]) >= 0x1p-126)
        h = fabs(x[i]);
      if (h > 0)
        w->head = fmax(w->head, err / h);
    }
    if (c != AVG_B8)
      break;
  }
  /* decode_add adds w * decoded: the same two roundings as here. */
  float *acc = xmalloc(n * sizeof *acc), *ref = xmalloc(n * sizeof *ref);
  for (size_t i = 0; i < n; i++) {
    acc[i] = (float)normal();
    float p = 0.75f * y[i];
    ref[i] = acc[i] + p;
  }
  ASSERT_OK(avg_decode_add(c, enc, len, n, 0.75f, acc));
  ASSERT_MEMEQ(acc, ref, n * sizeof *acc);
  free(acc);
  free(ref);
  free(y);
  free(enc);
}

static void test_roundtrips(void) {
  /* Scales from subnormal values to near the top of fp32; offset data
   * (1000 + 1e-3 N(0,1)) stresses u8's term in max |x|; spiky data puts
   * one huge value in each block. */
  static const double scales[] = {1e-40, 1e-30, 1e-3, 1, 1e3, 1e30, 1e37};
  for (int c = 0; c < AVG_CODEC_COUNT; c++) {
    worst w = {0, 0};
    size_t parts = 0;
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
      size_t n = sizes[k];
      float *x = xmalloc(n * sizeof *x);
      for (size_t s = 0; s < sizeof scales / sizeof scales[0] + 3; s++) {
        double sc = s < 7 ? scales[s] : 1;
        if (c == AVG_FP16 && sc > 1e3)
          continue; /* beyond fp16's range: refused, tested above */
        for (size_t i = 0; i < n; i++) {
          double v = sc * normal();
          if (s == 7)
            v = 1000 + 1e-3 * normal();
          if (s == 8)
            v = i % 1000 == 7 ? 1e4 * normal() : 1e-2 * normal();
          if (s == 9) /* exact in fp16 and bf16: 8 significant bits */
            v = ldexp(floor(ldexp(fmin(fabs(normal()), 15), 4)), -4);
          x[i] = (float)v;
        }
        if (c == AVG_FP16 && s == 8)
          for (size_t i = 0; i < n; i++)
            x[i] = fminf(fmaxf(x[i], -6e4f), 6e4f);
        worst one = {0, 0};
        roundtrip(c, x, n, &one);
        if (s == 9 && c != AVG_U8 && c != AVG_B8)
          ASSERT(one.ratio == 0);
        w.ratio = fmax(w.ratio, one.ratio);
        w.head = fmax(w.head, one.head);
        parts++;
      }
      /* Special values: zeros of both signs, subnormals, the largest. */
      for (size_t i = 0; i < n; i++) {
        static const float sp[] = {0.0f,      -0.0f, 0x1p-149f, -0x1p-140f,
                                   0x1p-126f, 1.0f,  -3.0f,     0.1f};
        x[i] = sp[i % 8];
      }
      roundtrip(c, x, n, &w);
      for (size_t i = 0; i < n; i++)
        x[i] = i % 2 ? FLT_MAX : -FLT_MAX / 2;
      if (c != AVG_FP16 && c != AVG_BF16 && c != AVG_U8)
        roundtrip(c, x, n, &w);
      for (size_t i = 0; i < n; i++) /* constant part: u8 exact */
        x[i] = 2.5f;
      roundtrip(c, x, n, &w);
      free(x);
    }
    /* Many small parts with a random offset and a random log-uniform scale
     * (1e-45 to 1e36): the corners the fixed cases may miss. */
    float x[64];
    for (int r = 0; r < 20000; r++) {
      size_t n = 1 + (size_t)(uniform() * 63);
      double sc = pow(10, -45 + 81 * uniform()), off = sc * 4 * normal();
      if (r % 2)
        off = r % 4 == 1 ? 0 : off * 1e4 * uniform();
      for (size_t i = 0; i < n; i++)
        x[i] = (float)(off + sc * normal());
      bool fits = true; /* in fp16's range; away from u8's limit */
      for (size_t i = 0; i < n; i++)
        fits &= fabsf(x[i]) < (c == AVG_FP16 ? 65504 : 1e38f);
      if (fits)
        roundtrip(c, x, n, &w), parts++;
    }
    static const char *const head[] = {
        "", "relative, normal values (2^-11 = 4.883e-04)",
        "relative, normal values (2^-8 = 3.906e-03)", "x (max - min) / 510",
        "x absmax / 254"};
    if (c == AVG_NONE)
      printf("%-4s  %5zu parts: bit-exact\n", avg_codec_name(c), parts);
    else
      printf("%-4s  %5zu parts: largest error %.4f of the bound; %.6g %s\n",
             avg_codec_name(c), parts, w.ratio, w.head, head[c]);
    if (c != AVG_NONE) /* the bound is tight: errors come near it */
      ASSERT(w.ratio > 0.9);
  }
}

/* ---- malformed parts -------------------------------------------------------- */

/* Copies in to an exact-size buffer and decodes it twice: into out, and
 * added to an accumulator, which must come back untouched. */
static void refuse(avg_codec c, const uint8_t *in, size_t len, size_t n,
                   int want) {
  uint8_t *copy = xmalloc(len);
  memcpy(copy, in, len);
  float *out = xmalloc(n * sizeof *out), *acc = xmalloc(n * sizeof *acc);
  float *acc0 = xmalloc(n * sizeof *acc0);
  for (size_t i = 0; i < n; i++)
    acc[i] = acc0[i] = (float)i;
  ASSERT_RC(avg_decode(c, copy, len, n, out), want);
  ASSERT_RC(avg_decode_add(c, copy, len, n, 1.0f, acc), want);
  ASSERT_MEMEQ(acc, acc0, n * sizeof *acc);
  free(copy), free(out), free(acc), free(acc0);
}

static void put32(uint8_t *p, float f) {
  uint32_t u = fbits(f);
  for (int i = 0; i < 4; i++)
    p[i] = (uint8_t)(u >> 8 * i);
}

static void test_malformed(void) {
  enum { N = 2 * AVG_B8_BLOCK + 3 }; /* three b8 blocks, the last short */
  float *x = xmalloc(N * sizeof *x);
  for (size_t i = 0; i < N; i++)
    x[i] = (float)normal();
  for (int c = 0; c < AVG_CODEC_COUNT; c++) {
    size_t len;
    uint8_t *enc = encode(c, x, N, &len);
    uint8_t *big = xmalloc(len + 1);
    memcpy(big, enc, len);
    big[len] = 0;
    refuse(c, enc, len - 1, N, BEE_ETRUNCATED);
    refuse(c, enc, 0, N, BEE_ETRUNCATED);
    refuse(c, big, len + 1, N, BEE_ETRAILING);
    refuse(c, enc, len, N + 1, BEE_ETRUNCATED);
    refuse(c, enc, len, N - 1, BEE_ETRAILING);
    refuse((avg_codec)(AVG_CODEC_COUNT + c), enc, len, N, BEE_ERANGE);
    float w[] = {-1.0f, NAN, INFINITY, -0.0f};
    float *acc = xmalloc(N * sizeof *acc);
    for (int k = 0; k < 4; k++)
      ASSERT_RC(avg_decode_add(c, enc, len, N, w[k], acc),
                k < 3 ? BEE_ERANGE : 0);
    free(acc);
    /* Too small an output buffer. */
    ASSERT_RC(avg_encode(c, x, N, big, len - 1, &len), BEE_ETOOBIG);
    free(big);

    /* Bad values or scales, first and last. */
    uint8_t *bad = xmalloc(len);
    size_t at[2] = {0, 0};
    switch (c) {
    case AVG_NONE:
      at[1] = len - 4;
      for (int k = 0; k < 2; k++) {
        float v[] = {NAN, INFINITY, -INFINITY};
        for (int j = 0; j < 3; j++) {
          memcpy(bad, enc, len);
          put32(bad + at[k], v[j]);
          refuse(c, bad, len, N, BEE_ERANGE);
        }
      }
      break;
    case AVG_FP16:
    case AVG_BF16:
      at[1] = len - 2;
      for (int k = 0; k < 2; k++) {
        uint16_t v[] = {0x7c00, 0xfc00, 0x7e00, 0x7f80, 0xffc1};
        for (int j = 0; j < 5; j++) {
          uint16_t e = c == AVG_FP16 ? 0x7c00 : 0x7f80;
          memcpy(bad, enc, len);
          bad[at[k]] = (uint8_t)v[j], bad[at[k] + 1] = (uint8_t)(v[j] >> 8);
          bool inf = (v[j] & e) == e;
          if (inf)
            refuse(c, bad, len, N, BEE_ERANGE);
          else
            ASSERT_OK(avg_decode(c, bad, len, N, x));
        }
      }
      break;
    case AVG_U8: {
      /* [lo, scale] */
      float lo[] = {NAN, INFINITY, 0, 0, 0, 0, 0, 3e38f, -1};
      float sc[] = {1, 1, NAN, INFINITY, -1, -0.0f, 1e37f, 1e36f, 0};
      int want[] = {BEE_ERANGE, BEE_ERANGE,     BEE_ERANGE,
                    BEE_ERANGE, BEE_EMALFORMED, BEE_EMALFORMED,
                    BEE_ERANGE, BEE_ERANGE,     0};
      for (int j = 0; j < 9; j++) {
        memcpy(bad, enc, len);
        put32(bad, lo[j]), put32(bad + 4, sc[j]);
        if (want[j])
          refuse(c, bad, len, N, want[j]);
        else
          ASSERT_OK(avg_decode(c, bad, len, N, x));
      }
      break;
    }
    case AVG_B8: {
      size_t last = 2 * (4 + AVG_B8_BLOCK);
      float sc[] = {NAN, INFINITY, -1, -0.0f, 2.7e36f, 0};
      int want[] = {BEE_ERANGE,     BEE_ERANGE, BEE_EMALFORMED,
                    BEE_EMALFORMED, BEE_ERANGE, 0};
      for (int k = 0; k < 2; k++)
        for (int j = 0; j < 6; j++) {
          memcpy(bad, enc, len);
          put32(bad + (k ? last : 0), sc[j]);
          if (want[j])
            refuse(c, bad, len, N, want[j]);
          else
            ASSERT_OK(avg_decode(c, bad, len, N, x));
        }
      /* The int8 -128, first value and last. */
      size_t q[] = {4, len - 1, 4 + AVG_B8_BLOCK + 4 + 100};
      for (int k = 0; k < 3; k++) {
        memcpy(bad, enc, len);
        bad[q[k]] = 0x80;
        refuse(c, bad, len, N, BEE_EMALFORMED);
        bad[q[k]] = 0x81; /* -127 is fine */
        ASSERT_OK(avg_decode(c, bad, len, N, x));
      }
      break;
    }
    }
    free(bad);
    free(enc);
    for (size_t i = 0; i < N; i++)
      x[i] = (float)normal();
  }

  /* Inputs that cannot be encoded, anywhere in the part. */
  size_t cap = avg_encoded_size(AVG_NONE, N), len = 7;
  uint8_t *out = xmalloc(cap);
  for (int c = 0; c < AVG_CODEC_COUNT; c++)
    for (int k = 0; k < 3; k++) {
      size_t i = k == 0 ? 0 : k == 1 ? N - 1 : AVG_B8_BLOCK + 5;
      float keep = x[i];
      x[i] = k == 1 ? -INFINITY : NAN;
      ASSERT_RC(avg_encode(c, x, N, out, cap, &len), BEE_ERANGE);
      ASSERT_UEQ(len, 7);
      x[i] = keep;
    }
  /* u8 whose max - min is beyond fp32. */
  x[0] = -3e38f, x[1] = 3e38f;
  ASSERT_RC(avg_encode(AVG_U8, x, N, out, cap, &len), BEE_ERANGE);
  x[0] = -1e38f, x[1] = 2e38f;
  ASSERT_OK(avg_encode(AVG_U8, x, N, out, cap, &len));
  free(out);
  free(x);
}

/* ---- error feedback ----------------------------------------------------------- */

/* Sends the same gradient g for R rounds; the receiver's sum of what it
 * decoded should track R g.  Without feedback each round's rounding is the
 * same and the error grows as R; with it, the sum telescopes to
 * R g - residual, so the error stays one round's worth. */
static void test_error_feedback(void) {
  enum { N = 5000, R = 200 };
  float *g = xmalloc(N * sizeof *g), *res = xmalloc(N * sizeof *res);
  float *y = xmalloc(N * sizeof *y);
  double *sum = xmalloc(N * sizeof *sum);
  uint8_t *out = xmalloc(avg_encoded_size(AVG_NONE, N));
  for (size_t i = 0; i < N; i++)
    g[i] = (float)(0.01 * normal());
  for (int c = 0; c < AVG_CODEC_COUNT; c++) {
    double err[2];
    for (int ef = 0; ef < 2; ef++) {
      memset(res, 0, N * sizeof *res);
      memset(sum, 0, N * sizeof *sum);
      for (int r = 0; r < R; r++) {
        size_t len;
        size_t cap = avg_encoded_size(c, N);
        if (ef)
          ASSERT_OK(avg_encode_ef(c, g, N, res, out, cap, &len));
        else
          ASSERT_OK(avg_encode(c, g, N, out, cap, &len));
        ASSERT_OK(avg_decode(c, out, len, N, y));
        for (size_t i = 0; i < N; i++)
          sum[i] += y[i];
      }
      err[ef] = 0;
      for (size_t i = 0; i < N; i++)
        err[ef] = fmax(err[ef], fabs(sum[i] - (double)R * g[i]));
      if (ef && c == AVG_NONE)
        for (size_t i = 0; i < N; i++)
          ASSERT_UEQ(fbits(res[i]), 0);
    }
    printf("%-4s  error of the sum over %d rounds: %.3g without feedback, "
           "%.3g with\n",
           avg_codec_name(c), R, err[0], err[1]);
    if (c == AVG_NONE) {
      ASSERT(err[0] == 0 && err[1] == 0);
    } else {
      ASSERT(err[1] * 20 < err[0]);
    }
  }
  /* On error the residual is untouched. */
  for (size_t i = 0; i < N; i++)
    res[i] = (float)i;
  g[N - 1] = NAN;
  size_t len = 0;
  ASSERT_RC(avg_encode_ef(AVG_B8, g, N, res, out, 5 * N, &len), BEE_ERANGE);
  g[N - 1] = 1e38f, res[N - 1] = 3e38f; /* x + residual overflows */
  ASSERT_RC(avg_encode_ef(AVG_B8, g, N, res, out, 5 * N, &len), BEE_ERANGE);
  res[N - 1] = (float)(N - 1);
  for (size_t i = 0; i < N; i++)
    ASSERT_UEQ(fbits(res[i]), fbits((float)i));
  free(g), free(res), free(y), free(sum), free(out);
}

int main(void) {
  test_sizes();
  test_f16_exhaustive();
  test_bf16_exhaustive();
  test_half_range();
  test_roundtrips();
  test_malformed();
  test_error_feedback();
  printf("ok\n");
  return 0;
}
