/* codec.c: the part codecs, fp32 in and out of none, fp16, bf16, u8, b8.
 *
 * The byte layouts and error bounds are in docs/AVERAGING.md, section 2.
 * All multi-byte fields are little-endian.
 *
 * The loops are written for the compiler's vectorizer, with no
 * intrinsics: fixed-width lanes for the reductions (min, max, absmax),
 * selects rather than branches, and the fp16 conversions done with
 * integer arithmetic plus one float add (F. Giesen's branch-free method),
 * so that baseline SSE2 already runs them several values at a time.
 * Results do not depend on how the compiler vectorizes, nor on which of
 * the AVG__CLONES versions runs (averager-int.h): each value goes through
 * the same IEEE operations in the same order, and the reductions (min,
 * max) are exact whatever the order.  The subnormal fp16 path relies on
 * the default rounding mode and on FTZ/DAZ being off, as all of beed
 * does (docs/AVERAGING.md, section 5).
 *
 * Decoding is strict and checks a whole part before it writes or adds
 * anything, so the owner's accumulator is never half-updated by a part
 * that turns out corrupt.  Encoding refuses what decoding would refuse, so
 * every part we send decodes.
 */
#include "averager-int.h"

#include <assert.h>
#include <float.h>
#include <math.h>
#include <string.h>

/* Values the encoders work on at a time: one AVG_B8 block, and small
 * enough (16 KiB) that x + residual stays in L1 between the passes. */
#define CHUNK AVG_B8_BLOCK
/* Lanes of the reductions, wide enough for 512-bit vectors. */
#define LANES 16

#define EXP32 0x7f800000u /* binary32 exponent field */
#define SIGN32 0x80000000u
#define EXP16 0x7c00u  /* binary16 exponent field */
#define EXPB16 0x7f80u /* bfloat16 exponent field */

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define HOST_BE 1
#else
#define HOST_BE 0
#endif

/* ---- bits and bytes ---------------------------------------------------- */

static inline uint32_t fbits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static inline float bitsf(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* Little-endian loads and stores.  On little-endian hosts these are plain
 * unaligned moves, which the vectorizer handles. */
static inline uint32_t ld32(const uint8_t *p) {
#if HOST_BE
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
         (uint32_t)p[3] << 24;
#else
  uint32_t v;
  memcpy(&v, p, sizeof v);
  return v;
#endif
}

static inline uint16_t ld16(const uint8_t *p) {
#if HOST_BE
  return (uint16_t)(p[0] | p[1] << 8);
#else
  uint16_t v;
  memcpy(&v, p, sizeof v);
  return v;
#endif
}

static inline void st32(uint8_t *p, uint32_t v) {
#if HOST_BE
  p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8), p[2] = (uint8_t)(v >> 16);
  p[3] = (uint8_t)(v >> 24);
#else
  memcpy(p, &v, sizeof v);
#endif
}

static inline void st16(uint8_t *p, uint16_t v) {
#if HOST_BE
  p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8);
#else
  memcpy(p, &v, sizeof v);
#endif
}

static inline float ldf(const uint8_t *p) { return bitsf(ld32(p)); }
static inline void stf(uint8_t *p, float f) { st32(p, fbits(f)); }

/* 1 when the binary32 with these bits is NaN or infinite. */
static inline uint32_t nonfinite(uint32_t u) { return (u & EXP32) == EXP32; }

/* ---- conversions -------------------------------------------------------- */

/* binary32 to binary16, round to nearest even.  Normal results: rebias the
 * exponent and round at bit 13 by adding 0xfff plus the bit that becomes
 * the last kept one; a carry out of the mantissa bumps the exponent, up to
 * 0x7c00 (infinity) from 65520 on.  Below 2^-14 the result is subnormal,
 * a multiple of 2^-24: adding 0.5f, whose ulp is 2^-24, makes the FPU
 * round |x| to that grid (nearest even), and the mantissa bits of the sum
 * are the half's bits.  NaN, infinity and |x| >= 65536 give 0x7c00, which
 * the encoder refuses. */
static inline uint16_t f32_to_f16(float f) {
  uint32_t u = fbits(f), a = u & ~SIGN32;
  uint32_t norm = (a - ((127u - 15) << 23) + 0xfffu + ((a >> 13) & 1)) >> 13;
  uint32_t sub = fbits(bitsf(a) + 0.5f) - fbits(0.5f);
  uint32_t h = a < (113u << 23) ? sub : norm; /* 113 - 127 = -14 */
  h = a >= (143u << 23) ? EXP16 : h;          /* 143 - 127 = 16 */
  return (uint16_t)(h | (u >> 16 & 0x8000u));
}

/* binary16 to binary32, exact.  The caller has refused exponent 31.  A
 * subnormal a * 2^-24 is (2^-14 + a * 2^-24) - 2^-14, both exact. */
static inline float f16_to_f32(uint16_t h) {
  uint32_t a = h & 0x7fffu;
  uint32_t norm = (a << 13) + ((127u - 15) << 23);
  uint32_t sub = fbits(bitsf((a << 13) + (113u << 23)) - bitsf(113u << 23));
  uint32_t r = a < 0x400u ? sub : norm;
  return bitsf(r | (uint32_t)(h & 0x8000u) << 16);
}

/* binary32 to bfloat16, round to nearest even at bit 16.  Finite input only
 * (the caller checks): the largest ones carry into 0x7f80, infinity. */
static inline uint16_t f32_to_bf16(float f) {
  uint32_t u = fbits(f);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

static inline float bf16_to_f32(uint16_t h) { return bitsf((uint32_t)h << 16); }

/* ---- encoding kernels: each returns nonzero when a value is refused ---- */

static inline uint32_t enc_none(const float *x, size_t n, uint8_t *out) {
  uint32_t bad = 0;
  for (size_t i = 0; i < n; i++) {
    uint32_t u = fbits(x[i]);
    bad |= nonfinite(u);
    st32(out + 4 * i, u);
  }
  return bad;
}

static inline uint32_t enc_f16(const float *x, size_t n, uint8_t *out) {
  uint32_t bad = 0;
  for (size_t i = 0; i < n; i++) {
    uint16_t h = f32_to_f16(x[i]);
    bad |= (h & EXP16) == EXP16;
    st16(out + 2 * i, h);
  }
  return bad;
}

static inline uint32_t enc_bf16(const float *x, size_t n, uint8_t *out) {
  uint32_t bad = 0;
  for (size_t i = 0; i < n; i++) {
    uint16_t h = f32_to_bf16(x[i]);
    bad |= nonfinite(fbits(x[i])) | ((h & EXPB16) == EXPB16);
    st16(out + 2 * i, h);
  }
  return bad;
}

/* A float's bits as an int32 in the order of the floats: negatives get
 * their magnitude bits flipped.  -0 sorts just below +0, NaNs beyond the
 * infinities (negative ones below -inf).  Integer min and max vectorize
 * where float ones would need -ffinite-math-only. */
static inline int32_t key(float f) {
  uint32_t u = fbits(f);
  return (int32_t)(u & SIGN32 ? u ^ ~SIGN32 : u);
}

static inline float unkey(int32_t k) {
  uint32_t u = (uint32_t)k;
  return bitsf(u & SIGN32 ? u ^ ~SIGN32 : u);
}

/* Smallest and largest of n >= 1 values, and whether any is not finite:
 * then the smallest is at most -inf's key or the largest at least +inf's. */
static inline uint32_t minmax(const float *x, size_t n, float *lo_out,
                              float *hi_out) {
  int32_t lo[LANES], hi[LANES];
  for (size_t j = 0; j < LANES; j++)
    lo[j] = hi[j] = key(x[0]);
  size_t i = 0;
  for (; i + LANES <= n; i += LANES)
    for (size_t j = 0; j < LANES; j++) {
      int32_t k = key(x[i + j]);
      lo[j] = k < lo[j] ? k : lo[j];
      hi[j] = k > hi[j] ? k : hi[j];
    }
  for (; i < n; i++) {
    int32_t k = key(x[i]);
    lo[0] = k < lo[0] ? k : lo[0];
    hi[0] = k > hi[0] ? k : hi[0];
  }
  for (size_t j = 1; j < LANES; j++) {
    lo[0] = lo[j] < lo[0] ? lo[j] : lo[0];
    hi[0] = hi[j] > hi[0] ? hi[j] : hi[0];
  }
  *lo_out = unkey(lo[0]), *hi_out = unkey(hi[0]);
  return lo[0] <= key(-INFINITY) || hi[0] >= key(INFINITY);
}

/* Largest |x| of n values, as bits (the order of non-negative floats is
 * that of their bits), and whether any is not finite. */
static inline uint32_t absmax(const float *x, size_t n, uint32_t *bad_out) {
  uint32_t m[LANES] = {0};
  size_t i = 0;
  for (; i + LANES <= n; i += LANES)
    for (size_t j = 0; j < LANES; j++) {
      uint32_t a = fbits(x[i + j]) & ~SIGN32;
      m[j] = a > m[j] ? a : m[j];
    }
  for (; i < n; i++) {
    uint32_t a = fbits(x[i]) & ~SIGN32;
    m[0] = a > m[0] ? a : m[0];
  }
  for (size_t j = 1; j < LANES; j++)
    m[0] = m[j] > m[0] ? m[j] : m[0];
  *bad_out = m[0] >= EXP32; /* infinity and every NaN sort above */
  return m[0];
}

/* q = round((x - lo) / scale) in 0..255, scale > 0.  x - lo >= 0 is exact
 * or rounds down to 0 at worst; the clamp catches the last ulp of rounding
 * past 255 (and an overflow of x - lo to infinity, see u8_header_ok). */
static inline void quant_u8(const float *x, size_t n, float lo, float scale,
                            uint8_t *out) {
  for (size_t i = 0; i < n; i++) {
    float t = (x[i] - lo) / scale + 0.5f;
    t = t < 255.0f ? t : 255.0f;
    out[i] = (uint8_t)(int32_t)t;
  }
}

/* q = round(x / s) half away from zero, in -127..127, s > 0. */
static inline void quant_b8(const float *x, size_t n, float s, uint8_t *out) {
  for (size_t i = 0; i < n; i++) {
    float half = bitsf(0x3f000000u | (fbits(x[i]) & SIGN32)); /* +-0.5 */
    float t = x[i] / s + half;
    t = t < 127.0f ? t : 127.0f;
    t = t > -127.0f ? t : -127.0f;
    out[i] = (uint8_t)(int8_t)(int32_t)t;
  }
}

/* ---- headers, shared by the encoder and the decoder ---------------------- */

/* A scale as read from the wire: finite (else BEE_ERANGE), not negative,
 * not even -0 (BEE_EMALFORMED: the encoder never writes one), and max_q
 * times it finite (BEE_ERANGE), as every decoded value is a product with
 * it. */
static int scale_check(float s, float max_q) {
  uint32_t u = fbits(s);
  if (nonfinite(u))
    return BEE_ERANGE;
  if (u & SIGN32)
    return BEE_EMALFORMED;
  return nonfinite(fbits(s * max_q)) ? BEE_ERANGE : 0;
}

/* The u8 header: lo finite, scale a valid scale, and lo + scale * 255
 * finite.  lo + scale * q rounds monotonically in q, so every value then
 * lies between lo and that one and is finite too. */
static int u8_header_ok(float lo, float scale) {
  if (nonfinite(fbits(lo)))
    return BEE_ERANGE;
  int rc = scale_check(scale, 255.0f);
  if (rc)
    return rc;
  return nonfinite(fbits(lo + scale * 255.0f)) ? BEE_ERANGE : 0;
}

/* ---- encoders over x + r (r may be NULL) -------------------------------- */

/* Values [i, i + m) of x + r, in buf, or a view of x itself without r. */
static inline const float *src(const float *x, const float *r, size_t i,
                               size_t m, float *buf) {
  if (!r)
    return x + i;
  for (size_t j = 0; j < m; j++)
    buf[j] = x[i + j] + r[i + j];
  return buf;
}

AVG__CLONES
static int encode_elementwise(avg_codec c, const float *x, const float *r,
                              size_t n, uint8_t *out) {
  float buf[CHUNK];
  uint32_t bad = 0;
  for (size_t i = 0, m; i < n; i += m) {
    m = n - i < CHUNK ? n - i : CHUNK;
    const float *y = src(x, r, i, m, buf);
    if (c == AVG_NONE)
      bad |= enc_none(y, m, out + 4 * i);
    else if (c == AVG_FP16)
      bad |= enc_f16(y, m, out + 2 * i);
    else
      bad |= enc_bf16(y, m, out + 2 * i);
  }
  return bad ? BEE_ERANGE : 0;
}

/* u8: header [lo, scale], then q[n], value = lo + scale * q.  The scale is
 * (max - min) / 255 from the exact difference (in double, where it cannot
 * overflow), rounded once to fp32. */
AVG__CLONES
static int encode_u8(const float *x, const float *r, size_t n, uint8_t *out) {
  float buf[CHUNK], lo = 0, hi = 0;
  for (size_t i = 0, m; i < n; i += m) {
    m = n - i < CHUNK ? n - i : CHUNK;
    float l, h;
    if (minmax(src(x, r, i, m, buf), m, &l, &h))
      return BEE_ERANGE;
    lo = i == 0 || l < lo ? l : lo;
    hi = i == 0 || h > hi ? h : hi;
  }
  float scale = (float)(((double)hi - (double)lo) / 255.0);
  if (u8_header_ok(lo, scale))
    return BEE_ERANGE; /* max - min beyond fp32's range */
  stf(out, lo);
  stf(out + 4, scale);
  out += 8;
  if (scale == 0.0f) { /* constant part, or a range under 2^-142 */
    memset(out, 0, n);
    return 0;
  }
  for (size_t i = 0, m; i < n; i += m) {
    m = n - i < CHUNK ? n - i : CHUNK;
    quant_u8(src(x, r, i, m, buf), m, lo, scale, out + i);
  }
  return 0;
}

/* b8: per block [s, q[len]], value = s * q, s = absmax / 127.  A block whose
 * 127 * s would round up to infinity (absmax within an ulp of FLT_MAX)
 * gets the next float down; one whose s underflows to 0 (absmax below
 * 2^-143) decodes to zeros.  Both stay within the bound of
 * docs/AVERAGING.md. */
AVG__CLONES
static int encode_b8(const float *x, const float *r, size_t n, uint8_t *out) {
  float buf[CHUNK];
  for (size_t i = 0, m; i < n; i += m) {
    m = n - i < CHUNK ? n - i : CHUNK;
    const float *y = src(x, r, i, m, buf);
    uint32_t bad;
    float amax = bitsf(absmax(y, m, &bad)), s = 0;
    if (bad)
      return BEE_ERANGE;
    if (amax > 0) {
      s = amax / 127.0f;
      if (nonfinite(fbits(s * 127.0f)))
        s = bitsf(fbits(s) - 1);
    }
    assert(scale_check(s, 127.0f) == 0);
    stf(out, s);
    if (s == 0.0f)
      memset(out + 4, 0, m);
    else
      quant_b8(y, m, s, out + 4);
    out += 4 + m;
  }
  return 0;
}

static int encode(avg_codec c, const float *x, const float *r, size_t n,
                  uint8_t *out) {
  switch (c) {
  case AVG_NONE:
  case AVG_FP16:
  case AVG_BF16: return encode_elementwise(c, x, r, n, out);
  case AVG_U8: return encode_u8(x, r, n, out);
  case AVG_B8: return encode_b8(x, r, n, out);
  default: return BEE_ERANGE;
  }
}

/* ---- decoding: check a whole part, then write or add -------------------- */

/* Checks everything but the length, which the caller has matched. */
AVG__CLONES
static int check(avg_codec c, const uint8_t *in, size_t n) {
  uint32_t bad = 0;
  switch (c) {
  case AVG_NONE:
    for (size_t i = 0; i < n; i++)
      bad |= nonfinite(ld32(in + 4 * i));
    return bad ? BEE_ERANGE : 0;
  case AVG_FP16:
    for (size_t i = 0; i < n; i++)
      bad |= (ld16(in + 2 * i) & EXP16) == EXP16;
    return bad ? BEE_ERANGE : 0;
  case AVG_BF16:
    for (size_t i = 0; i < n; i++)
      bad |= (ld16(in + 2 * i) & EXPB16) == EXPB16;
    return bad ? BEE_ERANGE : 0;
  case AVG_U8: return u8_header_ok(ldf(in), ldf(in + 4));
  case AVG_B8:
    for (size_t i = 0, m; i < n; i += m, in += 4 + m) {
      m = n - i < AVG_B8_BLOCK ? n - i : AVG_B8_BLOCK;
      int rc = scale_check(ldf(in), 127.0f);
      if (rc)
        return rc;
      for (size_t j = 0; j < m; j++)
        bad |= in[4 + j] == 0x80; /* -128: outside the symmetric range */
      if (bad)
        return BEE_EMALFORMED;
    }
    return 0;
  default: return BEE_ERANGE;
  }
}

/* Writes the n decoded values of a checked part. */
AVG__CLONES
static void write_part(avg_codec c, const uint8_t *in, size_t n, float *out) {
  switch (c) {
  case AVG_NONE:
    for (size_t i = 0; i < n; i++)
      out[i] = ldf(in + 4 * i);
    break;
  case AVG_FP16:
    for (size_t i = 0; i < n; i++)
      out[i] = f16_to_f32(ld16(in + 2 * i));
    break;
  case AVG_BF16:
    for (size_t i = 0; i < n; i++)
      out[i] = bf16_to_f32(ld16(in + 2 * i));
    break;
  case AVG_U8: {
    float lo = ldf(in), scale = ldf(in + 4);
    for (size_t i = 0; i < n; i++)
      out[i] = lo + scale * (float)in[8 + i];
    break;
  }
  case AVG_B8:
    for (size_t i = 0, m; i < n; i += m, in += 4 + m) {
      m = n - i < AVG_B8_BLOCK ? n - i : AVG_B8_BLOCK;
      float s = ldf(in);
      for (size_t j = 0; j < m; j++)
        out[i + j] = s * (float)(int8_t)in[4 + j];
    }
    break;
  default: assert(0);
  }
}

/* acc += w * decoded, for a checked part: one multiply and one add per
 * value, in this order, whatever the codec (w = -1 is exact, which the
 * error feedback uses). */
AVG__CLONES
static void add_part(avg_codec c, const uint8_t *in, size_t n, float w,
                     float *acc) {
  switch (c) {
  case AVG_NONE:
    for (size_t i = 0; i < n; i++)
      acc[i] += w * ldf(in + 4 * i);
    break;
  case AVG_FP16:
    for (size_t i = 0; i < n; i++)
      acc[i] += w * f16_to_f32(ld16(in + 2 * i));
    break;
  case AVG_BF16:
    for (size_t i = 0; i < n; i++)
      acc[i] += w * bf16_to_f32(ld16(in + 2 * i));
    break;
  case AVG_U8: {
    float lo = ldf(in), scale = ldf(in + 4);
    for (size_t i = 0; i < n; i++)
      acc[i] += w * (lo + scale * (float)in[8 + i]);
    break;
  }
  case AVG_B8:
    for (size_t i = 0, m; i < n; i += m, in += 4 + m) {
      m = n - i < AVG_B8_BLOCK ? n - i : AVG_B8_BLOCK;
      float s = ldf(in);
      for (size_t j = 0; j < m; j++)
        acc[i + j] += w * (s * (float)(int8_t)in[4 + j]);
    }
    break;
  default: assert(0);
  }
}

/* ---- public ------------------------------------------------------------- */

static const char *const names[AVG_CODEC_COUNT] = {"none", "fp16", "bf16", "u8",
                                                   "b8"};

const char *avg_codec_name(avg_codec c) {
  return (unsigned)c < AVG_CODEC_COUNT ? names[c] : "?";
}

int avg_codec_parse(const char *s, avg_codec *c) {
  for (unsigned i = 0; i < AVG_CODEC_COUNT; i++)
    if (strcmp(s, names[i]) == 0) {
      *c = (avg_codec)i;
      return 0;
    }
  return BEE_ECONFIG;
}

size_t avg_encoded_size(avg_codec c, size_t n) {
  switch (c) {
  case AVG_NONE: return n <= SIZE_MAX / 4 ? 4 * n : SIZE_MAX;
  case AVG_FP16:
  case AVG_BF16: return n <= SIZE_MAX / 2 ? 2 * n : SIZE_MAX;
  case AVG_U8: return n < SIZE_MAX - 8 ? 8 + n : SIZE_MAX;
  case AVG_B8: {
    size_t blocks = n / AVG_B8_BLOCK + (n % AVG_B8_BLOCK != 0);
    return n < SIZE_MAX - 4 * blocks ? n + 4 * blocks : SIZE_MAX;
  }
  default: return SIZE_MAX;
  }
}

static int encode_any(avg_codec c, const float *x, size_t n, float *residual,
                      uint8_t *out, size_t cap, size_t *len) {
  size_t need = avg_encoded_size(c, n);
  if (need == SIZE_MAX)
    return BEE_ERANGE;
  if (need > cap)
    return BEE_ETOOBIG;
  int rc = encode(c, x, residual, n, out);
  if (rc)
    return rc;
  if (residual) {
    /* residual = (x + residual) - decoded, y computed exactly as the
     * encoder did, then one exact negation and one rounding per value. */
    for (size_t i = 0; i < n; i++)
      residual[i] = x[i] + residual[i];
    add_part(c, out, n, -1.0f, residual);
  }
  *len = need;
  return 0;
}

int avg_encode(avg_codec c, const float *x, size_t n, uint8_t *out, size_t cap,
               size_t *len) {
  return encode_any(c, x, n, NULL, out, cap, len);
}

int avg_encode_ef(avg_codec c, const float *x, size_t n, float *residual,
                  uint8_t *out, size_t cap, size_t *len) {
  assert(residual);
  return encode_any(c, x, n, residual, out, cap, len);
}

/* Length, then contents: the part is checked whole before use. */
static int check_part(avg_codec c, const uint8_t *in, size_t len, size_t n) {
  size_t need = avg_encoded_size(c, n);
  if (need == SIZE_MAX)
    return BEE_ERANGE;
  if (len != need)
    return len < need ? BEE_ETRUNCATED : BEE_ETRAILING;
  return check(c, in, n);
}

int avg_decode(avg_codec c, const uint8_t *in, size_t len, size_t n,
               float *out) {
  int rc = check_part(c, in, len, n);
  if (rc)
    return rc;
  write_part(c, in, n, out);
  return 0;
}

int avg_decode_add(avg_codec c, const uint8_t *in, size_t len, size_t n,
                   float weight, float *acc) {
  if (!(weight >= 0.0f && weight <= FLT_MAX))
    return BEE_ERANGE;
  int rc = check_part(c, in, len, n);
  if (rc)
    return rc;
  if (weight > 0.0f)
    add_part(c, in, n, weight, acc);
  return 0;
}
