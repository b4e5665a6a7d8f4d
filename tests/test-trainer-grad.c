/* test-trainer-grad.c: every CPU layer's backward pass against finite
 * differences in double precision.
 *
 * For each layer (and for a whole small mlp) the test has its own forward
 * pass in double, written from the definition.  It checks that our float
 * forward agrees with it, then takes central differences of a scalar
 * objective of the output (a fixed random weighting, or the loss itself)
 * in double, for every input and every parameter, and compares them with
 * our float gradients.  Float rounding of sums of a few dozen terms stays
 * near 1e-6 relative; the tolerance is 1e-4 of the gradient's scale.
 */
#include "test.h"
#include "trainer-int.h"

#include <errno.h>
#include <math.h>

static uint64_t rng = 12345;
static double rnd(void) { /* uniform [-1, 1) */
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return (double)(rng >> 11) * 0x1p-52 - 1;
}

/* |a - b| <= tol x (the larger scale of the two vectors, at least 1e-3). */
static void close_vec(const char *what, const float *a, const double *b,
                      size_t n, double tol) {
  double scale = 1e-3;
  for (size_t i = 0; i < n; i++)
    scale = fmax(scale, fmax(fabs(a[i]), fabs(b[i])));
  for (size_t i = 0; i < n; i++)
    if (fabs(a[i] - b[i]) > tol * scale)
      FAIL("%s[%zu]: ours %.9g, reference %.9g (scale %.3g)", what, i, a[i],
           b[i], scale);
}

/* ---- linear ---------------------------------------------------------------- */

enum { B = 3, IN = 5, OUT = 4 };

static void lin_ref(const double *x, const double *w, const double *b,
                    double *y) {
  for (int i = 0; i < B; i++)
    for (int o = 0; o < OUT; o++) {
      double s = b[o];
      for (int k = 0; k < IN; k++)
        s += x[i * IN + k] * w[o * IN + k];
      y[i * OUT + o] = s;
    }
}

static double lin_obj(const double *x, const double *w, const double *b,
                      const double *r) {
  double y[B * OUT], s = 0;
  lin_ref(x, w, b, y);
  for (int i = 0; i < B * OUT; i++)
    s += y[i] * r[i];
  return s;
}

/* d obj / d v[i] by central differences, v being one of the inputs. */
static void numgrad(double (*f)(void), double *v, size_t n, double *out) {
  for (size_t i = 0; i < n; i++) {
    double keep = v[i], h = 1e-6 * fmax(1, fabs(keep));
    v[i] = keep + h;
    double up = f();
    v[i] = keep - h;
    double dn = f();
    v[i] = keep;
    out[i] = (up - dn) / (2 * h);
  }
}

/* A layer's three gradients (input, weight, bias: ours in float) against
 * central differences of f over the double copies x, w and b. */
static void check3(const char *what, double (*f)(void), const float *dx,
                   double *x, size_t nx, const float *dw, double *w, size_t nw,
                   const float *db, double *b, size_t nb) {
  static double g[4096];
  char name[48];
  ASSERT(nx <= 4096 && nw <= 4096 && nb <= 4096);
  numgrad(f, x, nx, g);
  snprintf(name, sizeof name, "%s dx", what);
  close_vec(name, dx, g, nx, 1e-4);
  numgrad(f, w, nw, g);
  snprintf(name, sizeof name, "%s dW", what);
  close_vec(name, dw, g, nw, 1e-4);
  numgrad(f, b, nb, g);
  snprintf(name, sizeof name, "%s db", what);
  close_vec(name, db, g, nb, 1e-4);
}

static double X[B * IN], W[OUT * IN], Bb[OUT], R[B * OUT];
static double f_lin(void) { return lin_obj(X, W, Bb, R); }

static void test_linear(void) {
  float x[B * IN], w[OUT * IN], b[OUT], y[B * OUT], dy[B * OUT];
  float dx[B * IN], dw[OUT * IN], db[OUT];
  for (int i = 0; i < B * IN; i++)
    x[i] = (float)rnd(), X[i] = x[i];
  for (int i = 0; i < OUT * IN; i++)
    w[i] = (float)rnd(), W[i] = w[i];
  for (int i = 0; i < OUT; i++)
    b[i] = (float)rnd(), Bb[i] = b[i];
  for (int i = 0; i < B * OUT; i++)
    R[i] = rnd(), dy[i] = (float)R[i];
  trn__linear_fwd(x, w, b, y, B, IN, OUT);
  double yr[B * OUT];
  lin_ref(X, W, Bb, yr);
  close_vec("linear y", y, yr, B * OUT, 1e-5);
  /* Gradients add into what is there: start from 1, subtract it after. */
  for (int i = 0; i < OUT * IN; i++)
    dw[i] = 1;
  for (int i = 0; i < OUT; i++)
    db[i] = 1;
  trn__linear_bwd(x, w, dy, dx, dw, db, B, IN, OUT);
  for (int i = 0; i < OUT * IN; i++)
    dw[i] -= 1;
  for (int i = 0; i < OUT; i++)
    db[i] -= 1;
  check3("linear", f_lin, dx, X, B * IN, dw, W, OUT * IN, db, Bb, OUT);
  printf("linear: y, dx, dW, db agree with finite differences\n");
}

/* ---- relu ------------------------------------------------------------------ */

enum { NR = 40 };
static double XR[NR], RR[NR];
static double f_relu(void) {
  double s = 0;
  for (int i = 0; i < NR; i++)
    s += (XR[i] > 0 ? XR[i] : 0) * RR[i];
  return s;
}

static void test_relu(void) {
  float x[NR], y[NR], dy[NR], dx[NR];
  for (int i = 0; i < NR; i++) {
    double v = rnd();
    if (fabs(v) < 0.05) /* keep finite differences off the kink */
      v = v < 0 ? -0.5 : 0.5;
    x[i] = (float)v, XR[i] = x[i];
    RR[i] = rnd(), dy[i] = (float)RR[i];
  }
  trn__relu_fwd(x, y, NR);
  trn__relu_bwd(y, dy, dx, NR);
  double g[NR];
  numgrad(f_relu, XR, NR, g);
  close_vec("relu dx", dx, g, NR, 1e-6);
  printf("relu: dx agrees with finite differences\n");
}

/* ---- softmax cross-entropy ------------------------------------------------- */

/* The cross-entropy of softmax(z (b, c)) against lab, summed. */
static double ce_ref(const double *z, const int32_t *lab, int b, int c) {
  double s = 0;
  for (int i = 0; i < b; i++) {
    double m = -INFINITY, e = 0;
    for (int j = 0; j < c; j++)
      m = fmax(m, z[i * c + j]);
    for (int j = 0; j < c; j++)
      e += exp(z[i * c + j] - m);
    s += m + log(e) - z[i * c + lab[i]];
  }
  return s;
}

enum { BC = 4, C = 7 };
static double Z[BC * C];
static int32_t LAB[BC] = {0, 3, 6, 2};
static double f_ce(void) { return ce_ref(Z, LAB, BC, C); }

static void test_ce(void) {
  float z[BC * C], dz[BC * C];
  for (int i = 0; i < BC * C; i++)
    z[i] = (float)(4 * rnd()), Z[i] = z[i];
  z[C + 1] = z[C + 3] = 30; /* a tie at a large logit: stable, argmax first */
  Z[C + 1] = Z[C + 3] = 30;
  size_t right;
  double l = trn__softmax_ce(z, LAB, dz, BC, C, &right);
  ASSERT(fabs(l - f_ce()) <= 1e-6 * fabs(l));
  double g[BC * C];
  numgrad(f_ce, Z, BC * C, g);
  close_vec("softmax-ce dz", dz, g, BC * C, 1e-5);
  size_t want = 0;
  for (int i = 0; i < BC; i++) {
    int arg = 0;
    for (int j = 1; j < C; j++)
      if (z[i * C + j] > z[i * C + arg])
        arg = j;
    want += arg == LAB[i];
  }
  ASSERT_UEQ(right, want);
  printf("softmax cross-entropy: loss and dz agree with finite differences\n");
}

/* ---- conv2d ----------------------------------------------------------------- */

/* y (b, oc, oh, ow) from x (b, c, h, w), W (oc, c, k, k), bias, padding. */
static void conv_ref(const double *x, const double *w, const double *bias,
                     double *y, int b, int c, int h, int wd, int oc, int k,
                     int pad, int st) {
  int oh = (h + 2 * pad - k) / st + 1, ow = (wd + 2 * pad - k) / st + 1;
  for (int n = 0; n < b; n++)
    for (int o = 0; o < oc; o++)
      for (int i = 0; i < oh; i++)
        for (int j = 0; j < ow; j++) {
          double s = bias[o];
          for (int ci = 0; ci < c; ci++)
            for (int a = 0; a < k; a++)
              for (int e = 0; e < k; e++) {
                int yi = i * st + a - pad, xj = j * st + e - pad;
                if (yi >= 0 && yi < h && xj >= 0 && xj < wd)
                  s += x[((n * c + ci) * h + yi) * wd + xj] *
                       w[((o * c + ci) * k + a) * k + e];
              }
          y[((n * oc + o) * oh + i) * ow + j] = s;
        }
}

enum { CB = 2, CC = 2, CH = 5, CW = 4, CO = 3, CK = 3, CP = 1 };
/* The output's largest size (stride 1); CS, the stride under test. */
enum { COH = CH + 2 * CP - CK + 1, COW = CW + 2 * CP - CK + 1 };
static int CS = 1, coh, cow;
static double CX[CB * CC * CH * CW], CWt[CO * CC * CK * CK], CBs[CO],
    CR[CB * CO * COH * COW];
static double f_conv(void) {
  double y[CB * CO * COH * COW], s = 0;
  conv_ref(CX, CWt, CBs, y, CB, CC, CH, CW, CO, CK, CP, CS);
  for (int i = 0; i < CB * CO * coh * cow; i++)
    s += y[i] * CR[i];
  return s;
}

static void fill(float *f, double *d, size_t n) {
  for (size_t i = 0; i < n; i++)
    f[i] = (float)rnd(), d[i] = f[i];
}

static void test_conv(int stride) {
  enum { NX = CB * CC * CH * CW, NW = CO * CC * CK * CK };
  enum { NYMAX = CB * CO * COH * COW };
  CS = stride;
  coh = (CH + 2 * CP - CK) / CS + 1, cow = (CW + 2 * CP - CK) / CS + 1;
  int NY = CB * CO * coh * cow;
  float x[NX], w[NW], b[CO], y[NYMAX], dy[NYMAX], dx[NX], dw[NW] = {0},
      db[CO] = {0};
  trn__conv_ws ws;
  ASSERT(trn__conv_ws_init(&ws, CC * CK * CK * COH * COW * TRN__CONV_CHUNK,
                           CO * COH * COW * TRN__CONV_CHUNK,
                           CO * (CC * CK * CK + 1)) == 0);
  fill(x, CX, NX);
  fill(w, CWt, NW);
  fill(b, CBs, CO);
  fill(dy, CR, (size_t)NY);
  trn__conv cv = {.c = CC, .h = CH, .w = CW, .oc = CO, .oh = (unsigned)coh,
                  .ow = (unsigned)cow, .k = CK, .pad = CP,
                  .stride = (unsigned)CS};
  trn__conv_fwd(&cv, x, w, b, y, CB, &ws);
  double yr[NYMAX];
  conv_ref(CX, CWt, CBs, yr, CB, CC, CH, CW, CO, CK, CP, CS);
  close_vec("conv y", y, yr, (size_t)NY, 1e-5);
  trn__conv_bwd(&cv, x, w, y, dy, dx, dw, db, CB, &ws);
  check3("conv", f_conv, dx, CX, NX, dw, CWt, NW, db, CBs, CO);
  /* A batch of several chunks (and a partial one): the same as sample by
   * sample. */
  enum { BB = 2 * TRN__CONV_CHUNK + 5, SX = CC * CH * CW };
  enum { SYMAX = CO * COH * COW };
  int SY = CO * coh * cow;
  static float bx[BB * SX], by[BB * SYMAX], bdy[BB * SYMAX], bdx[BB * SX];
  static float one_y[SYMAX], one_dx[SX];
  float bdw[NW] = {0}, bdb[CO] = {0}, sdw[NW] = {0}, sdb[CO] = {0};
  for (int i = 0; i < BB * SX; i++)
    bx[i] = (float)rnd();
  for (int i = 0; i < BB * SY; i++)
    bdy[i] = (float)rnd();
  trn__conv_fwd(&cv, bx, w, b, by, BB, &ws);
  trn__conv_bwd(&cv, bx, w, by, bdy, bdx, bdw, bdb, BB, &ws);
  for (int n = 0; n < BB; n++) {
    trn__conv_fwd(&cv, bx + n * SX, w, b, one_y, 1, &ws);
    trn__conv_bwd(&cv, bx + n * SX, w, one_y, bdy + n * SY, one_dx, sdw, sdb,
                  1, &ws);
    for (int i = 0; i < SY; i++)
      ASSERT(fabsf(one_y[i] - by[n * SY + i]) <= 1e-5f * (1 + fabsf(one_y[i])));
    for (int i = 0; i < SX; i++)
      ASSERT(fabsf(one_dx[i] - bdx[n * SX + i]) <=
             1e-5f * (1 + fabsf(one_dx[i])));
  }
  for (int i = 0; i < NW; i++)
    ASSERT(fabsf(sdw[i] - bdw[i]) <= 1e-4f * (1 + fabsf(sdw[i])));
  for (int i = 0; i < CO; i++)
    ASSERT(fabsf(sdb[i] - bdb[i]) <= 1e-4f * (1 + fabsf(sdb[i])));
  trn__conv_ws_free(&ws);
  printf("conv2d 3x3, padding 1, stride %d: y, dx, dW, db agree with finite "
         "differences; a batch of %d (chunks of %d) as sample by sample\n",
         CS, BB, TRN__CONV_CHUNK);
}

/* The chunks shared among 1, 2 and 3 threads (trn_cpu_threads_set): y and
 * dx the same bits whatever the count, dW and db the same bits for the
 * same count and within float rounding of one thread's otherwise. */
static void test_conv_threads(void) {
  enum { BB = 5 * TRN__CONV_CHUNK + 3, SX = CC * CH * CW, SY = CO * CH * CW };
  enum { NW = CO * CC * CK * CK };
  static float x[BB * SX], dy[BB * SY], y[3][BB * SY], dx[3][BB * SX];
  static float w[NW], b[CO], dw[3][NW], db[3][CO], again[NW + CO];
  for (int i = 0; i < BB * SX; i++)
    x[i] = (float)rnd();
  for (int i = 0; i < BB * SY; i++)
    dy[i] = (float)rnd();
  for (int i = 0; i < NW; i++)
    w[i] = (float)rnd();
  for (int i = 0; i < CO; i++)
    b[i] = (float)rnd();
  trn__conv cv = {.c = CC, .h = CH, .w = CW, .oc = CO, .oh = CH, .ow = CW,
                  .k = CK, .pad = CP, .stride = 1, .relu = true};
  for (int t = 0; t < 3; t++) {
    trn_cpu_threads_set(t + 1);
    ASSERT(trn__pool_size() == t + 1);
    trn__conv_ws ws;
    ASSERT(trn__conv_ws_init(&ws, CC * CK * CK * CH * CW * TRN__CONV_CHUNK,
                             CO * CH * CW * TRN__CONV_CHUNK,
                             CO * (CC * CK * CK + 1)) == 0);
    ASSERT(ws.parts == t + 1);
    trn__conv_fwd(&cv, x, w, b, y[t], BB, &ws);
    memset(dw[t], 0, sizeof dw[t]), memset(db[t], 0, sizeof db[t]);
    trn__conv_bwd(&cv, x, w, y[t], dy, dx[t], dw[t], db[t], BB, &ws);
    float *adw = again, *adb = again + NW;
    memset(again, 0, sizeof again);
    trn__conv_bwd(&cv, x, w, y[t], dy, NULL, adw, adb, BB, &ws);
    ASSERT(memcmp(adw, dw[t], sizeof dw[t]) == 0);
    ASSERT(memcmp(adb, db[t], sizeof db[t]) == 0);
    ASSERT(memcmp(y[t], y[0], sizeof y[0]) == 0);
    ASSERT(memcmp(dx[t], dx[0], sizeof dx[0]) == 0);
    for (int i = 0; i < NW; i++)
      ASSERT(fabsf(dw[t][i] - dw[0][i]) <= 1e-4f * (1 + fabsf(dw[0][i])));
    for (int i = 0; i < CO; i++)
      ASSERT(fabsf(db[t][i] - db[0][i]) <= 1e-4f * (1 + fabsf(db[0][i])));
    trn__conv_ws_free(&ws);
    /* Max pooling over the output's BB CO planes: split by planes, the
     * same bits. */
    enum { PO = BB * CO * (CH / 2) * (CW / 2) };
    static float py[3][PO], pdx[3][BB * SY];
    static uint32_t parg[3][PO];
    trn__maxpool_fwd(y[t], py[t], parg[t], BB, CO, CH, CW, 2);
    trn__maxpool_bwd(py[t], parg[t], pdx[t], BB, CO, CH, CW, 2);
    ASSERT(memcmp(py[t], py[0], sizeof py[0]) == 0);
    ASSERT(memcmp(parg[t], parg[0], sizeof parg[0]) == 0);
    ASSERT(memcmp(pdx[t], pdx[0], sizeof pdx[0]) == 0);
    /* Batch norm over the output seen as CO CH channels of CW: split by
     * channels, the same bits. */
    trn__bn bn = {.c = CO * CH, .hw = CW, .eps = 1e-5f, .momentum = 0.1f};
    static float by[3][BB * SY], bmu[3][CO * CH], binv[3][CO * CH],
        bdx[3][BB * SY], bg[3][CO * CH], bb[3][CO * CH];
    float gam[CO * CH], bet[CO * CH], rm[CO * CH] = {0}, rv[CO * CH];
    for (int i = 0; i < CO * CH; i++)
      gam[i] = 1 + 0.1f * (float)i, bet[i] = 0.01f * (float)i, rv[i] = 1;
    trn__bn_fwd(&bn, y[t], gam, bet, by[t], bmu[t], binv[t], rm, rv, BB,
                true);
    memset(bg[t], 0, sizeof bg[t]), memset(bb[t], 0, sizeof bb[t]);
    trn__bn_bwd(&bn, y[t], bmu[t], binv[t], gam, dy, bdx[t], bg[t], bb[t],
                BB);
    ASSERT(memcmp(by[t], by[0], sizeof by[0]) == 0);
    ASSERT(memcmp(bdx[t], bdx[0], sizeof bdx[0]) == 0);
    ASSERT(memcmp(bg[t], bg[0], sizeof bg[0]) == 0);
    ASSERT(memcmp(bb[t], bb[0], sizeof bb[0]) == 0);
  }
  trn_cpu_threads_set(1);
  ASSERT(trn__pool_size() == 1);
  printf("conv2d on 1, 2, 3 threads: y and dx the same bits, dW and db the "
         "same bits again on the same count and within 1e-4 across counts "
         "(batch %d); max pooling and batch norm the same bits\n", BB);
}

/* ---- max pooling and dropout -------------------------------------------------- */

static void pool_ref(const double *x, double *y, int bc, int h, int w, int k) {
  for (int n = 0; n < bc; n++)
    for (int i = 0; i < h / k; i++)
      for (int j = 0; j < w / k; j++) {
        double m = -INFINITY;
        for (int a = 0; a < k; a++)
          for (int e = 0; e < k; e++)
            m = fmax(m, x[(n * h + i * k + a) * w + j * k + e]);
        y[(n * (h / k) + i) * (w / k) + j] = m;
      }
}

enum { PB = 2, PC = 3, PH = 4, PW = 6, PN = PB * PC * PH * PW };
static double PX[PN], PR[PN / 4];
static double f_pool(void) {
  double y[PN / 4], s = 0;
  pool_ref(PX, y, PB * PC, PH, PW, 2);
  for (int i = 0; i < PN / 4; i++)
    s += y[i] * PR[i];
  return s;
}

static void test_pool_dropout(void) {
  float x[PN], y[PN / 4], dy[PN / 4], dx[PN];
  uint32_t arg[PN / 4];
  /* Distinct values, at least 0.01 apart: no ties for the differences. */
  for (int i = 0; i < PN; i++)
    x[i] = (float)((i * 37 % PN) * 0.01 - 0.3), PX[i] = x[i];
  fill(dy, PR, PN / 4);
  trn__maxpool_fwd(x, y, arg, PB, PC, PH, PW, 2);
  double yr[PN / 4];
  pool_ref(PX, yr, PB * PC, PH, PW, 2);
  close_vec("maxpool y", y, yr, PN / 4, 1e-7);
  trn__maxpool_bwd(dy, arg, dx, PB, PC, PH, PW, 2);
  double g[PN];
  numgrad(f_pool, PX, PN, g);
  close_vec("maxpool dx", dx, g, PN, 1e-6);
  /* Ties and NaN: the first maximum in row-major order (as PyTorch); a
   * NaN is the maximum (as PyTorch), the first NaN's place where there
   * are several. */
  {
    /* One 2x8 plane: four windows (a b / c d) side by side. */
    const float win[4][4] = {{2, 2, 2, 2}, {1, 3, 0, 3}, {1, NAN, 3, NAN},
                             {5, 1, NAN, 7}};
    const float want[4] = {2, 3, NAN, NAN};
    const uint32_t want_at[4] = {0, 3, 5, 14};
    float t[16], ty[4];
    uint32_t ta[4];
    for (int k = 0; k < 4; k++)
      t[2 * k] = win[k][0], t[2 * k + 1] = win[k][1],
             t[8 + 2 * k] = win[k][2], t[8 + 2 * k + 1] = win[k][3];
    trn__maxpool_fwd(t, ty, ta, 1, 1, 2, 8, 2);
    for (int k = 0; k < 4; k++) {
      ASSERT(ta[k] == want_at[k]);
      ASSERT(isnan(want[k]) ? isnan(ty[k]) : ty[k] == want[k]);
    }
  }

  /* Dropout: zeros with probability p, the rest scaled by 1 / (1 - p);
   * the same (seed, call), the same mask; backward is the mask. */
  enum { DN = 20000 };
  static float dxin[DN], dyv[DN], m1[DN], m2[DN], y1[DN], y2[DN], dd[DN];
  for (int i = 0; i < DN; i++)
    dxin[i] = (float)rnd(), dyv[i] = (float)rnd();
  trn__dropout_fwd(dxin, y1, m1, DN, 0.3f, 42, 7);
  trn__dropout_fwd(dxin, y2, m2, DN, 0.3f, 42, 7);
  ASSERT(memcmp(m1, m2, sizeof m1) == 0 && memcmp(y1, y2, sizeof y1) == 0);
  size_t zeros = 0;
  for (int i = 0; i < DN; i++) {
    ASSERT(m1[i] == 0 || m1[i] == 1.0f / 0.7f);
    zeros += m1[i] == 0;
    ASSERT(y1[i] == dxin[i] * m1[i]);
  }
  /* 6,000 expected; 5 standard deviations is 324. */
  ASSERT(zeros > 6000 - 324 && zeros < 6000 + 324);
  trn__dropout_fwd(dxin, y2, m2, DN, 0.3f, 42, 8);
  ASSERT(memcmp(m1, m2, sizeof m1) != 0);
  trn__dropout_bwd(m1, dyv, dd, DN);
  for (int i = 0; i < DN; i++)
    ASSERT(dd[i] == dyv[i] * m1[i]);
  printf("max-pool 2: y and dx agree with finite differences; dropout: "
         "%zu of %d zeroed at p = 0.3, masks fixed by (seed, call)\n",
         zeros, DN);
}

/* ---- batch normalization ---------------------------------------------------- */

/* Channel ch's mean over (b, hw) and the sum of squared deviations. */
static double moments(const double *x, int b, int c, int hw, int ch,
                      double *ss) {
  double mu = 0;
  for (int n = 0; n < b; n++)
    for (int i = 0; i < hw; i++)
      mu += x[(n * c + ch) * hw + i];
  mu /= b * hw;
  *ss = 0;
  for (int n = 0; n < b; n++)
    for (int i = 0; i < hw; i++)
      *ss += pow(x[(n * c + ch) * hw + i] - mu, 2);
  return mu;
}

/* Training-mode batch norm in double: per channel over (b, hw). */
static void bn_ref(const double *x, const double *g, const double *be,
                   double *y, int b, int c, int hw) {
  for (int ch = 0; ch < c; ch++) {
    double var, mu = moments(x, b, c, hw, ch, &var);
    var /= b * hw;
    for (int n = 0; n < b; n++)
      for (int i = 0; i < hw; i++) {
        size_t at = (size_t)(n * c + ch) * hw + i;
        y[at] = g[ch] * (x[at] - mu) / sqrt(var + 1e-5) + be[ch];
      }
  }
}

enum { BB2 = 3, BC2 = 2, BHW = 5, BN_N = BB2 * BC2 * BHW };
static double BX[BN_N], BG[BC2], BBe[BC2], BR[BN_N];
static double f_bn(void) {
  double y[BN_N], s = 0;
  bn_ref(BX, BG, BBe, y, BB2, BC2, BHW);
  for (int i = 0; i < BN_N; i++)
    s += y[i] * BR[i];
  return s;
}

static void test_bn(void) {
  float x[BN_N], g[BC2], be[BC2], y[BN_N], dy[BN_N], dx[BN_N], mean[BC2];
  float inv[BC2], rm[BC2] = {0.5f, -1}, rv[BC2] = {2, 3};
  float dg[BC2] = {0}, db[BC2] = {0};
  fill(x, BX, BN_N);
  fill(g, BG, BC2);
  fill(be, BBe, BC2);
  fill(dy, BR, BN_N);
  trn__bn bn = {.c = BC2, .hw = BHW, .eps = 1e-5f, .momentum = 0.1f};
  trn__bn_fwd(&bn, x, g, be, y, mean, inv, rm, rv, BB2, true);
  double yr[BN_N];
  bn_ref(BX, BG, BBe, yr, BB2, BC2, BHW);
  close_vec("bn y", y, yr, BN_N, 1e-5);
  trn__bn_bwd(&bn, x, mean, inv, g, dy, dx, dg, db, BB2);
  check3("bn", f_bn, dx, BX, BN_N, dg, BG, BC2, db, BBe, BC2);
  /* Running statistics: 0.9 old + 0.1 the batch's (variance unbiased);
   * evaluation normalizes with them. */
  for (int c = 0; c < BC2; c++) {
    double v, mu = moments(BX, BB2, BC2, BHW, c, &v);
    v /= BB2 * BHW - 1;
    double want_m = 0.9 * (c ? -1 : 0.5) + 0.1 * mu;
    double want_v = 0.9 * (c ? 3 : 2) + 0.1 * v;
    ASSERT(fabs(rm[c] - want_m) < 1e-6 && fabs(rv[c] - want_v) < 1e-5);
  }
  trn__bn_fwd(&bn, x, g, be, y, NULL, inv, rm, rv, BB2, false);
  for (int i = 0; i < BN_N; i++) {
    int c = i / BHW % BC2;
    double want = BG[c] * (BX[i] - rm[c]) / sqrt(rv[c] + 1e-5) + BBe[c];
    ASSERT(fabs(y[i] - want) < 1e-5 * (1 + fabs(want)));
  }
  printf("batch norm: y, dx, dgamma, dbeta agree with finite differences; "
         "running statistics and evaluation as BatchNorm2d\n");
}

/* ---- whole models --------------------------------------------------------- */

/* Fills x (and xd, its double copy) with n random inputs, copies the
 * model's parameters to pd, runs one training batch and checks its loss
 * and every gradient against f, the double reference over xd and pd.
 * Returns the loss. */
static double model_vs_fd(const char *what, trn_model *m, float *x,
                          double *xd, size_t n, const int32_t *y,
                          size_t batch, double (*f)(void), double *pd) {
  static double g[4096];
  size_t np = trn_model_nparams(m);
  ASSERT(np <= 4096);
  fill(x, xd, n);
  for (size_t i = 0; i < np; i++)
    pd[i] = trn_model_params(m)[i];
  double loss;
  trn_model_zero_grad(m);
  ASSERT_EQ(trn_model_train_batch(m, x, y, batch, &loss), 0);
  ASSERT(fabs(loss - f()) <= 1e-5 * fabs(loss));
  numgrad(f, pd, np, g);
  char name[32];
  snprintf(name, sizeof name, "%s grads", what);
  close_vec(name, trn_model_grads(m), g, np, 1e-4);
  return loss;
}

/* ---- a whole mlp ----------------------------------------------------------- */

enum { MB = 5, M0 = 6, M1 = 5, M2 = 4, M3 = 3 };
static const unsigned msz[4] = {M0, M1, M2, M3};
static double MX[MB * M0], MP[1024];
static int32_t MY[MB] = {0, 2, 1, 2, 0};
static size_t mnp;

/* The mlp in double from the flat parameters, in trainer.h's layout. */
static double f_mlp(void) {
  double a[MB * 8], t[MB * 8];
  memcpy(a, MX, sizeof MX);
  size_t off = 0;
  for (int l = 0; l < 3; l++) {
    unsigned in = msz[l], out = msz[l + 1];
    const double *w = MP + off, *b = MP + off + in * out;
    off += in * out + out;
    for (int i = 0; i < MB; i++)
      for (unsigned o = 0; o < out; o++) {
        double s = b[o];
        for (unsigned k = 0; k < in; k++)
          s += a[i * in + k] * w[o * in + k];
        t[i * out + o] = l < 2 && s < 0 ? 0 : s;
      }
    memcpy(a, t, MB * out * sizeof *a);
  }
  return ce_ref(a, MY, MB, M3);
}

static void test_mlp(void) {
  trn_model_config c;
  trn_model_config_default(&c);
  c.nsizes = 4;
  memcpy(c.sizes, msz, sizeof msz);
  c.max_batch = 8;
  c.seed = 7;
  trn_model *m;
  char err[128];
  ASSERT_EQ(trn_model_new(&c, &m, err, sizeof err), 0);
  mnp = trn_model_nparams(m);
  ASSERT_UEQ(mnp, M0 * M1 + M1 + M1 * M2 + M2 + M2 * M3 + M3);
  float x[MB * M0], *p = trn_model_params(m);
  double loss = model_vs_fd("mlp", m, x, MX, MB * M0, MY, MB, f_mlp, MP);
  /* A second batch adds to the gradients. */
  float g1[1024];
  memcpy(g1, trn_model_grads(m), mnp * sizeof *g1);
  ASSERT_EQ(trn_model_train_batch(m, x, MY, MB, NULL), 0);
  for (size_t i = 0; i < mnp; i++)
    ASSERT(fabsf(trn_model_grads(m)[i] - 2 * g1[i]) <=
           1e-6f * (1 + fabsf(g1[i])));
  /* Evaluation changes neither gradients nor parameters. */
  float g2[1024], p2[1024];
  memcpy(g2, trn_model_grads(m), mnp * sizeof *g2);
  memcpy(p2, p, mnp * sizeof *p2);
  size_t right;
  double el;
  ASSERT_EQ(trn_model_eval_batch(m, x, MY, MB, &el, &right), 0);
  ASSERT(el == loss);
  ASSERT(memcmp(g2, trn_model_grads(m), mnp * sizeof *g2) == 0);
  ASSERT(memcmp(p2, p, mnp * sizeof *p2) == 0);
  /* Bad calls. */
  int32_t bad[MB] = {0, 3, 0, 0, 0};
  ASSERT_EQ(trn_model_train_batch(m, x, bad, MB, NULL), -EINVAL);
  ASSERT_EQ(trn_model_train_batch(m, x, MY, 9, NULL), -EINVAL);
  ASSERT_EQ(trn_model_train_batch(m, x, MY, 0, NULL), -EINVAL);
  trn_model_free(m);
  /* Configurations refused with their reason. */
  c.name = "transformer";
  ASSERT_EQ(trn_model_new(&c, &m, err, sizeof err), -EINVAL);
  ASSERT(strstr(err, "unknown model") != NULL);
  c.name = "mlp";
  c.sizes[1] = 0;
  ASSERT_EQ(trn_model_new(&c, &m, err, sizeof err), -EINVAL);
  ASSERT(strstr(err, "size 1 is 0") != NULL);
  c.sizes[1] = M1;
  c.nsizes = 1;
  ASSERT_EQ(trn_model_new(&c, &m, err, sizeof err), -EINVAL);
  c.nsizes = 4;
  c.precision = 4;
  ASSERT_EQ(trn_model_new(&c, &m, err, sizeof err), -EINVAL);
  ASSERT(strstr(err, "precision 4: fp32, tf32, bf16 or fp16") != NULL);
  c.precision = TRN_FP32;
  /* CUDA where this build or machine has none: an error, not a crash. */
  c.device = TRN_DEV_CUDA;
  int n = 0;
  if (trn_device_count_cuda(&n) == 0 && n == 0) {
    int rc = trn_model_new(&c, &m, err, sizeof err);
    ASSERT(rc == -ENODEV || rc == -ENOTSUP);
    printf("mlp on CUDA without a device: %s\n", err);
  }
  c.device = TRN_DEV_CPU;
  printf("mlp %d-%d-%d-%d: loss and all %zu gradients agree with finite "
         "differences; batches accumulate\n",
         M0, M1, M2, M3, mnp);
}

/* ---- a whole cnn ------------------------------------------------------------ */

enum { NB = 3, NI = 8, N0 = 2, N1 = 3, ND = 5, NC = 3 };
static double NX[NB * NI * NI], NP[512];
static int32_t NYL[NB] = {2, 0, 1};

static void relu_d(double *v, size_t n) {
  for (size_t i = 0; i < n; i++)
    v[i] = v[i] > 0 ? v[i] : 0;
}

/* y (b, out) = x (b, in) W^T + bias, from the flat parameters at p. */
static const double *dense_ref(const double *x, const double *p, double *y,
                               int b, int in, int out) {
  for (int i = 0; i < b; i++)
    for (int o = 0; o < out; o++) {
      double s = p[in * out + o];
      for (int k = 0; k < in; k++)
        s += x[i * in + k] * p[o * in + k];
      y[i * out + o] = s;
    }
  return p + in * out + out;
}

static bool with_bn; /* the batch-norm variant */

/* Batch norm (training mode) in place when with_bn, its gamma and beta
 * at p; returns where the next parameters are. */
static const double *maybe_bn(double *a, const double *p, int c, int hw) {
  static double t[NB * N1 * NI * NI];
  if (!with_bn)
    return p;
  bn_ref(a, p, p + c, t, NB, c, hw);
  memcpy(a, t, (size_t)NB * c * hw * sizeof *a);
  return p + 2 * c;
}

/* The cnn of trainer.h in double: conv 5x5 pad 2, (batch norm,) relu,
 * pool 2, twice; dense, relu, dense (no dropout), cross-entropy summed. */
static double f_cnn(void) {
  static double a[NB * N1 * NI * NI], t[NB * N1 * NI * NI];
  static const double zero[N1]; /* the convolutions before batch norm */
  const double *p = NP;
  conv_ref(NX, p, with_bn ? zero : p + N0 * 25, a, NB, 1, NI, NI, N0, 5, 2, 1);
  p += N0 * 25 + (with_bn ? 0 : N0);
  p = maybe_bn(a, p, N0, NI * NI);
  relu_d(a, NB * N0 * NI * NI);
  pool_ref(a, t, NB * N0, NI, NI, 2);
  conv_ref(t, p, with_bn ? zero : p + N1 * N0 * 25, a, NB, N0, NI / 2, NI / 2,
           N1, 5, 2, 1);
  p += N1 * N0 * 25 + (with_bn ? 0 : N1);
  p = maybe_bn(a, p, N1, (NI / 2) * (NI / 2));
  relu_d(a, NB * N1 * (NI / 2) * (NI / 2));
  pool_ref(a, t, NB * N1, NI / 2, NI / 2, 2);
  p = dense_ref(t, p, a, NB, N1 * (NI / 4) * (NI / 4), ND);
  relu_d(a, NB * ND);
  dense_ref(a, p, t, NB, ND, NC);
  return ce_ref(t, NYL, NB, NC);
}

static void test_cnn(void) {
  trn_model_config c;
  trn_model_config_default(&c);
  c.name = "cnn";
  c.in_c = 1, c.in_h = c.in_w = NI;
  c.conv[0] = N0, c.conv[1] = N1, c.dense = ND, c.classes = NC;
  c.dropout = 0;
  c.max_batch = NB;
  trn_model *m;
  char err[128];
  ASSERT_EQ(trn_model_new(&c, &m, err, sizeof err), 0);
  size_t np = trn_model_nparams(m);
  ASSERT_UEQ(np, (N0 * 25 + N0) + (N1 * N0 * 25 + N1) + (N1 * 4 * ND + ND) +
                     (ND * NC + NC));
  float x[NB * NI * NI];
  model_vs_fd("cnn", m, x, NX, NB * NI * NI, NYL, NB, f_cnn, NP);
  trn_model_free(m);
  /* The batch-norm variant. */
  c.batchnorm = true;
  ASSERT_EQ(trn_model_new(&c, &m, err, sizeof err), 0);
  ASSERT_UEQ(trn_model_nparams(m), np + (N0 + N1)); /* +gamma, beta, -bias */
  size_t nb;
  ASSERT(trn_model_buffers(m, &nb) != NULL && nb == 2 * (N0 + N1));
  with_bn = true;
  model_vs_fd("cnn-bn", m, x, NX, NB * NI * NI, NYL, NB, f_cnn, NP);
  with_bn = false;
  trn_model_free(m);
  c.batchnorm = false;
  /* The default cnn has the 3.3M parameters. */
  trn_model_config_default(&c);
  c.name = "cnn";
  ASSERT_EQ(trn_model_new(&c, &m, err, sizeof err), 0);
  ASSERT_UEQ(trn_model_nparams(m), 3274634);
  trn_model_free(m);
  c.dropout = 1;
  ASSERT_EQ(trn_model_new(&c, &m, err, sizeof err), -EINVAL);
  ASSERT(strstr(err, "dropout") != NULL);
  printf("cnn 1x%dx%d-%d-%d-%d-%d, and with batch norm: loss and all %zu "
         "(%zu) gradients agree with finite differences; the default has "
         "3,274,634 parameters\n",
         NI, NI, N0, N1, ND, NC, np, np + N0 + N1);
}

/* ---- gpt ------------------------------------------------------------------ */

enum { GV = 7, GCTX = 4, GL = 2, GH = 2, GC = 4, GB = 2, GT = 3 };
static double GP[1024];
static const int32_t GX[GB * GT] = {1, 6, 3, 0, 2, 2};
static const int32_t GY[GB * GT] = {6, 3, 5, 2, 2, 4};

static void ln_ref(const double *x, const double *w, const double *b,
                   double *y) {
  double m = 0, v = 0;
  for (int i = 0; i < GC; i++)
    m += x[i];
  m /= GC;
  for (int i = 0; i < GC; i++)
    v += (x[i] - m) * (x[i] - m);
  v /= GC;
  for (int i = 0; i < GC; i++)
    y[i] = (x[i] - m) / sqrt(v + 1e-5) * w[i] + b[i];
}

/* y (n) = W (n, k) x (k) + b */
static void mv(const double *w, const double *b, const double *x, double *y,
               int n, int k) {
  for (int o = 0; o < n; o++) {
    y[o] = b ? b[o] : 0;
    for (int i = 0; i < k; i++)
      y[o] += w[o * k + i] * x[i];
  }
}

/* trainer/gpt.c's model in double, from the definitions, over GP. */
static double f_gpt(void) {
  const double *wte = GP, *wpe = wte + GV * GC, *ln1w = wpe + GCTX * GC,
               *ln1b = ln1w + GL * GC, *qkvw = ln1b + GL * GC,
               *qkvb = qkvw + GL * 3 * GC * GC, *pw = qkvb + GL * 3 * GC,
               *pb = pw + GL * GC * GC, *ln2w = pb + GL * GC,
               *ln2b = ln2w + GL * GC, *fw = ln2b + GL * GC,
               *fb = fw + GL * 4 * GC * GC, *fpw = fb + GL * 4 * GC,
               *fpb = fpw + GL * GC * 4 * GC, *lnfw = fpb + GL * GC,
               *lnfb = lnfw + GC;
  double loss = 0;
  int hs = GC / GH;
  for (int b = 0; b < GB; b++) {
    double x[GT][GC], h[GT][GC], qkv[GT][3 * GC], y[GT][GC], t4[4 * GC],
        t1[GC];
    for (int t = 0; t < GT; t++)
      for (int i = 0; i < GC; i++)
        x[t][i] = wte[GX[b * GT + t] * GC + i] + wpe[t * GC + i];
    for (int l = 0; l < GL; l++) {
      for (int t = 0; t < GT; t++) {
        ln_ref(x[t], ln1w + l * GC, ln1b + l * GC, h[t]);
        mv(qkvw + l * 3 * GC * GC, qkvb + l * 3 * GC, h[t], qkv[t], 3 * GC,
           GC);
      }
      for (int t = 0; t < GT; t++)
        for (int hh = 0; hh < GH; hh++) {
          double sc[GT], mx = -INFINITY, sum = 0;
          for (int u = 0; u <= t; u++) {
            sc[u] = 0;
            for (int i = 0; i < hs; i++)
              sc[u] += qkv[t][hh * hs + i] * qkv[u][GC + hh * hs + i];
            sc[u] /= sqrt(hs);
            mx = fmax(mx, sc[u]);
          }
          for (int u = 0; u <= t; u++)
            sum += sc[u] = exp(sc[u] - mx);
          for (int i = 0; i < hs; i++) {
            y[t][hh * hs + i] = 0;
            for (int u = 0; u <= t; u++)
              y[t][hh * hs + i] += sc[u] / sum * qkv[u][2 * GC + hh * hs + i];
          }
        }
      for (int t = 0; t < GT; t++) {
        mv(pw + l * GC * GC, pb + l * GC, y[t], t1, GC, GC);
        for (int i = 0; i < GC; i++)
          x[t][i] += t1[i];
        ln_ref(x[t], ln2w + l * GC, ln2b + l * GC, h[t]);
        mv(fw + l * 4 * GC * GC, fb + l * 4 * GC, h[t], t4, 4 * GC, GC);
        for (int i = 0; i < 4 * GC; i++) {
          double z = t4[i];
          t4[i] = 0.5 * z * (1 + tanh(sqrt(2 / M_PI) * (z + 0.044715 * z * z * z)));
        }
        mv(fpw + l * GC * 4 * GC, fpb + l * GC, t4, t1, GC, 4 * GC);
        for (int i = 0; i < GC; i++)
          x[t][i] += t1[i];
      }
    }
    for (int t = 0; t < GT; t++) {
      double logits[GV];
      ln_ref(x[t], lnfw, lnfb, h[t]);
      mv(wte, NULL, h[t], logits, GV, GC);
      loss += ce_ref(logits, &GY[b * GT + t], 1, GV);
    }
  }
  return loss;
}

static void test_gpt(void) {
  trn_model_config c;
  trn_model_config_default(&c);
  c.name = "gpt";
  c.vocab = GV, c.ctx = GCTX, c.layers = GL, c.heads = GH, c.embd = GC;
  c.max_batch = GB;
  trn_model *m;
  char err[160];
  ASSERT_EQ(trn_model_new(&c, &m, err, sizeof err), 0);
  size_t np = trn_model_nparams(m);
  ASSERT(np <= 1024);
  /* Random weights (GPT-2's start is too uniform to reach every path). */
  float *p = trn_model_params(m);
  for (size_t i = 0; i < np; i++)
    p[i] = (float)(0.5 * rnd()), GP[i] = p[i];
  double loss;
  trn_model_zero_grad(m);
  ASSERT_EQ(trn_model_train_tokens(m, GX, GY, GB, GT, &loss), 0);
  ASSERT(fabs(loss - f_gpt()) <= 1e-5 * fabs(loss));
  static double g[1024];
  numgrad(f_gpt, GP, np, g);
  close_vec("gpt grads", trn_model_grads(m), g, np, 1e-4);
  /* Evaluation matches; bad tokens and sizes are refused. */
  double el;
  size_t right;
  ASSERT_EQ(trn_model_eval_tokens(m, GX, GY, GB, GT, &el, &right), 0);
  ASSERT(el == loss);
  int32_t bad[GB * GT];
  memcpy(bad, GX, sizeof bad);
  bad[4] = GV;
  ASSERT_EQ(trn_model_train_tokens(m, bad, GY, GB, GT, NULL), -EINVAL);
  ASSERT_EQ(trn_model_train_tokens(m, GX, GY, GB, GCTX + 1, NULL), -EINVAL);
  float fx[GB * 16];
  ASSERT_EQ(trn_model_train_batch(m, fx, GY, GB, NULL), -EINVAL);
  trn_model_free(m);
  c.embd = 5; /* not a multiple of the heads */
  ASSERT_EQ(trn_model_new(&c, &m, err, sizeof err), -EINVAL);
  ASSERT(strstr(err, "multiple of heads") != NULL);
  printf("gpt %d layers, %d heads, %d wide: loss and all %zu gradients "
         "(embeddings, layer norms, attention, GELU, the tied head) agree "
         "with finite differences\n",
         GL, GH, GC, np);
}

/* gpt on 1, 2 and 3 threads (attention split by sequence, GELU by
 * ranges): the same bits again on the same count, and the gradient within
 * float rounding of one thread's. */
static void test_gpt_threads(void) {
  enum { TB = 16, TT = 8 };
  trn_model_config c;
  trn_model_config_default(&c);
  c.name = "gpt";
  c.vocab = GV, c.ctx = TT, c.layers = 2, c.heads = 2, c.embd = 16;
  c.max_batch = TB;
  static int32_t x[TB * TT], y[TB * TT];
  for (int i = 0; i < TB * TT; i++)
    x[i] = (int32_t)(i * 7 % GV), y[i] = (int32_t)((i * 11 + 3) % GV);
  static float g0[16384], g1[16384];
  double l0 = 0;
  for (int t = 0; t < 3; t++) {
    trn_cpu_threads_set(t + 1);
    trn_model *m;
    char err[160];
    ASSERT_EQ(trn_model_new(&c, &m, err, sizeof err), 0);
    size_t np = trn_model_nparams(m);
    ASSERT(np <= 16384);
    double l, again;
    trn_model_zero_grad(m);
    ASSERT_EQ(trn_model_train_tokens(m, x, y, TB, TT, &l), 0);
    memcpy(g1, trn_model_grads(m), np * sizeof *g1);
    trn_model_zero_grad(m);
    ASSERT_EQ(trn_model_train_tokens(m, x, y, TB, TT, &again), 0);
    ASSERT(again == l);
    ASSERT(memcmp(g1, trn_model_grads(m), np * sizeof *g1) == 0);
    if (t == 0)
      l0 = l, memcpy(g0, g1, np * sizeof *g0);
    ASSERT(fabs(l - l0) <= 1e-6 * fabs(l0));
    for (size_t i = 0; i < np; i++)
      ASSERT(fabsf(g1[i] - g0[i]) <= 1e-5f * (1 + fabsf(g0[i])));
    trn_model_free(m);
  }
  trn_cpu_threads_set(1);
  printf("gpt batch %d on 1, 2, 3 threads: the same bits again on the same "
         "count, within float rounding across counts\n", TB);
}

/* ---- resnet ------------------------------------------------------------------ */

enum { RB = 2, RC = 3, RS = 8, RW = 2, RK = 3 }; /* depth 8: one block a stage */
static double RX[RB * RC * RS * RS], RP[2048];
static const int32_t RY[RB] = {2, 0};
static const double *rp; /* the next parameters of RP */
static double rbuf[6][RB * 8 * RS * RS];

/* conv (no bias), batch norm, and relu when relu: a (c, s, s) -> out. */
static int rcbr(const double *a, double *out, int c, int s, int oc, int k,
                int st, int pad, bool relu) {
  static const double zero[64];
  static double t[RB * 8 * RS * RS];
  conv_ref(a, rp, zero, t, RB, c, s, s, oc, k, pad, st);
  rp += oc * c * k * k;
  int os = (s + 2 * pad - k) / st + 1;
  bn_ref(t, rp, rp + oc, out, RB, oc, os * os);
  rp += 2 * oc;
  if (relu)
    relu_d(out, (size_t)RB * oc * os * os);
  return os;
}

/* A basic block in place on x (c, s, s) -> (oc, s / st, s / st). */
static int rblock(double *x, int c, int s, int oc, int st) {
  double *h = rbuf[2], *o = rbuf[3], *sc = rbuf[4];
  int os = rcbr(x, h, c, s, oc, 3, st, 1, true);
  rcbr(h, o, oc, os, oc, 3, 1, 1, false);
  size_t n = (size_t)RB * oc * os * os;
  if (st != 1 || c != oc)
    rcbr(x, sc, c, s, oc, 1, st, 0, false);
  else
    memcpy(sc, x, n * sizeof *sc);
  for (size_t i = 0; i < n; i++)
    x[i] = o[i] + sc[i] > 0 ? o[i] + sc[i] : 0;
  return os;
}

/* resnet-8 of trainer/resnet.c in double, from the definitions. */
static double f_resnet(void) {
  double *x = rbuf[0], *t = rbuf[1];
  rp = RP;
  rcbr(RX, x, RC, RS, RW, 3, 1, 1, true);
  int s = RS, c = RW;
  for (int st = 0; st < 3; st++) {
    s = rblock(x, c, s, RW << st, st ? 2 : 1);
    c = RW << st;
  }
  for (int n = 0; n < RB * c; n++) { /* average pool */
    double sum = 0;
    for (int i = 0; i < s * s; i++)
      sum += x[n * s * s + i];
    t[n] = sum / (s * s);
  }
  double logits[RB * RK];
  for (int n = 0; n < RB; n++)
    for (int o = 0; o < RK; o++) {
      logits[n * RK + o] = rp[c * RK + o];
      for (int i = 0; i < c; i++)
        logits[n * RK + o] += t[n * c + i] * rp[o * c + i];
    }
  return ce_ref(logits, RY, RB, RK);
}

static void test_resnet(void) {
  trn_model_config c;
  trn_model_config_default(&c);
  c.name = "resnet";
  c.depth = 8, c.width = RW, c.in_c = RC, c.in_h = c.in_w = RS;
  c.classes = RK, c.max_batch = RB;
  trn_model *m;
  char err[200];
  ASSERT_EQ(trn_model_new(&c, &m, err, sizeof err), 0);
  size_t np = trn_model_nparams(m);
  ASSERT(np <= 2048);
  float x[RB * RC * RS * RS];
  model_vs_fd("resnet-8", m, x, RX, RB * RC * RS * RS, RY, RB, f_resnet, RP);
  trn_model_free(m);
  /* ResNet-18 for 224x224 has torchvision's 11,689,512 parameters. */
  c.depth = 18, c.width = 64, c.in_h = c.in_w = 224, c.classes = 1000;
  c.max_batch = 1;
  ASSERT_EQ(trn_model_new(&c, &m, err, sizeof err), 0);
  ASSERT_UEQ(trn_model_nparams(m), 11689512);
  trn_model_free(m);
  c.depth = 19;
  ASSERT_EQ(trn_model_new(&c, &m, err, sizeof err), -EINVAL);
  ASSERT(strstr(err, "6n + 2") != NULL);
  printf("resnet-8, width %d: loss and all %zu gradients (stride-2 and 1x1 "
         "convolutions, batch norms, shortcuts, average pool) agree with "
         "finite differences; resnet-18 has 11,689,512 parameters\n",
         RW, np);
}

/* SGD and AdamW split over 1, 2 and 3 threads: the same bits. */
static void test_optim_threads(void) {
  enum { N = 100003 };
  static float p[3][N], g[N];
  for (int i = 0; i < N; i++)
    g[i] = (float)rnd();
  int kinds[2] = {TRN_SGD, TRN_ADAMW};
  for (int k = 0; k < 2; k++)
    for (int t = 0; t < 3; t++) {
      trn_cpu_threads_set(t + 1);
      trn_optim_config oc;
      trn_optim_config_default(&oc, kinds[k]);
      oc.momentum = 0.9f, oc.nesterov = kinds[k] == TRN_SGD;
      oc.weight_decay = 0.01f;
      trn_optim *o;
      ASSERT(trn_optim_new(&oc, N, &o) == 0);
      for (int i = 0; i < N; i++)
        p[t][i] = (float)i / N - 0.5f;
      for (int s = 0; s < 3; s++)
        ASSERT(trn_optim_step(o, p[t], g, 0.5f) == 0);
      ASSERT(memcmp(p[t], p[0], sizeof p[0]) == 0);
      trn_optim_free(o);
    }
  trn_cpu_threads_set(1);
  printf("sgd (nesterov) and adamw over %d parameters on 1, 2, 3 threads: "
         "the same bits\n", N);
}

int main(void) {
  trn_cpu_threads_set(1);
  test_linear();
  test_relu();
  test_ce();
  test_conv(1);
  test_conv(2);
  test_conv_threads();
  test_optim_threads();
  test_pool_dropout();
  test_bn();
  test_mlp();
  test_cnn();
  test_gpt();
  test_gpt_threads();
  test_resnet();
  return 0;
}
