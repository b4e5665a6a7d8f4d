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
  double gx[B * IN], gw[OUT * IN], gb[OUT];
  numgrad(f_lin, X, B * IN, gx);
  numgrad(f_lin, W, OUT * IN, gw);
  numgrad(f_lin, Bb, OUT, gb);
  close_vec("linear dx", dx, gx, B * IN, 1e-4);
  close_vec("linear dW", dw, gw, OUT * IN, 1e-4);
  close_vec("linear db", db, gb, OUT, 1e-4);
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
  for (int i = 0; i < MB * M0; i++)
    x[i] = (float)rnd(), MX[i] = x[i];
  for (size_t i = 0; i < mnp; i++)
    MP[i] = p[i];
  double loss;
  trn_model_zero_grad(m);
  ASSERT_EQ(trn_model_train_batch(m, x, MY, MB, &loss), 0);
  ASSERT(fabs(loss - f_mlp()) <= 1e-5 * fabs(loss));
  double g[1024];
  numgrad(f_mlp, MP, mnp, g);
  close_vec("mlp grads", trn_model_grads(m), g, mnp, 1e-4);
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
  printf("mlp %d-%d-%d-%d: loss and all %zu gradients agree with finite "
         "differences; batches accumulate\n",
         M0, M1, M2, M3, mnp);
}

int main(void) {
  trn_cpu_threads_set(1);
  test_linear();
  test_relu();
  test_ce();
  test_mlp();
  return 0;
}
