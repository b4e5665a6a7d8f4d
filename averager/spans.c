/* spans.c: the split of the buffer into the owners' spans.
 *
 * Under the model of docs/AVERAGING.md, section 3, a member i that owns
 * x_i of the P floats moves P + (N - 2) x_i floats each way over its own
 * link of rate b_i, so its share of the round takes (P + (N - 2) x_i) / b_i.
 * The split that makes the slowest owner as fast as possible fills the
 * owners up to one common level T, like water: x_i = (T b_i - P) / (N - 2)
 * for every i with P / b_i < T, and 0 for the others (too slow to own
 * anything, their own traffic alone already takes longer than T).
 *
 * Spans are whole multiples of `align` floats, so the split is really one
 * of K = total / align units.  Giving each unit to the member whose time
 * it raises least, one unit at a time, picks the K cheapest of all the
 * members' unit costs; that allocation is optimal for the largest time
 * and, as the test checks by brute force, for the whole sorted list of
 * times (no other split makes any member slower to make a slower one
 * faster).  Doing that for every unit would take K steps, so the
 * continuous water level comes first: every unit below it, less one per
 * member for the rounding, is surely among the K cheapest, and only the
 * last few units (at most two per owner) go through the greedy step.
 *
 * Every peer must find the same spans: the computation uses only IEEE
 * double +, -, *, / and comparisons in a fixed order, ties going to the
 * lower member index.
 */
#include "averager-int.h"

#include <assert.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>

/* One split under way: the inputs and the model's constants. */
typedef struct split {
  const double *b;      /* (n) bandwidths */
  const bool *red;      /* (n) reduces */
  size_t n, last, rest; /* members, the last owner, total % align */
  /* Member i owning u units is busy (alpha + beta (u align + extra_i)) /
   * b_i: alpha = P, beta = N - 2 for N >= 3; with N <= 2 every member
   * moves P floats each way whatever it owns, the model cannot tell
   * splits apart, and alpha = 0, beta = 1 splits in proportion to b. */
  double alpha, beta, align;
} split;

static bool owns(const split *sp, size_t i) {
  return sp->red[i] && sp->b[i] > 0;
}

static double extra(const split *sp, size_t i) {
  return i == sp->last ? (double)sp->rest : 0;
}

/* Exact numerators (integers below 2^53), so that mathematically equal
 * times are equal doubles: one correctly rounded division each. */
static double cost(const split *sp, size_t i, size_t u) {
  return (sp->alpha + sp->beta * ((double)u * sp->align + extra(sp, i))) /
         sp->b[i];
}

typedef struct owner {
  double t; /* time with no units: where the water starts to cover it */
  size_t i; /* member index */
} owner;

/* Total order: by t, then by index, so qsort's result is the same on every
 * peer whatever its algorithm. */
static int owner_cmp(const void *pa, const void *pb) {
  const owner *a = pa, *b = pb;
  if (a->t != b->t)
    return a->t < b->t ? -1 : 1;
  return (a->i > b->i) - (a->i < b->i);
}

/* The continuous water level T over the owners with the lowest starting
 * times, T sum(b) = K beta align + sum(alpha + beta extra) (adding an
 * owner whose start is below T lowers T, but not below that start); then
 * each owner's units below it, less one for the rounding.  Returns the
 * units given, at most K. */
static size_t water_fill(const split *sp, owner *ow, size_t nown, size_t K,
                         size_t *units) {
  for (size_t i = 0, k = 0; i < sp->n; i++)
    if (owns(sp, i))
      ow[k++] = (owner){cost(sp, i, 0), i};
  qsort(ow, nown, sizeof *ow, owner_cmp);
  double B = 0, C = (double)K * sp->beta * sp->align, T = 0;
  size_t m = 0;
  for (; m < nown && (m == 0 || ow[m].t < T); m++) {
    B += sp->b[ow[m].i];
    C += ow[m].t * sp->b[ow[m].i];
    T = C / B;
  }
  size_t given = 0;
  for (size_t k = 0; k < m; k++) {
    size_t i = ow[k].i;
    double u = (T * sp->b[i] - sp->alpha - sp->beta * extra(sp, i)) /
               (sp->beta * sp->align);
    double fl = floor(u) - 1;
    units[i] = fl > 0 ? (size_t)fl : 0;
    given += units[i];
  }
  return given;
}

/* The last units, cheapest first.  Where two members would end at the
 * same time, the unit goes to the one whose time it raises least (the one
 * now slower), so the other keeps its lower time; then to the lower
 * index. */
static void fill_rest(const split *sp, size_t given, size_t K, size_t *units) {
  for (; given < K; given++) {
    size_t best = SIZE_MAX;
    double best_c = 0, best_now = 0;
    for (size_t i = 0; i < sp->n; i++) {
      if (!owns(sp, i))
        continue;
      double c = cost(sp, i, units[i] + 1), now = cost(sp, i, units[i]);
      if (best == SIZE_MAX || c < best_c || (c == best_c && now > best_now))
        best = i, best_c = c, best_now = now;
    }
    units[best]++;
  }
}

int avg_spans(size_t total, size_t nmembers, const double *bandwidth,
              const bool *reduces, size_t align, size_t *start, size_t *len) {
  if (nmembers == 0 || align == 0)
    return BEE_ERANGE;
  if (nmembers > AVG_GROUP_MAX)
    return BEE_ETOOBIG;
  split sp = {bandwidth,
              reduces,
              nmembers,
              0,
              total % align,
              nmembers >= 3 ? (double)total : 0,
              nmembers >= 3 ? (double)(nmembers - 2) : 1,
              (double)align};
  size_t nown = 0;
  for (size_t i = 0; i < nmembers; i++) {
    if (!(bandwidth[i] >= 0 && bandwidth[i] <= DBL_MAX))
      return BEE_ERANGE;
    if (owns(&sp, i))
      nown++, sp.last = i;
  }
  if (nown == 0)
    return BEE_ERANGE;

  int rc = 0;
  owner *ow = malloc(nown * sizeof *ow);
  size_t *units = calloc(nmembers, sizeof *units);
  if (!ow || !units) {
    rc = -ENOMEM;
    goto out;
  }
  size_t K = total / align;
  size_t given = water_fill(&sp, ow, nown, K, units);
  assert(given <= K);
  fill_rest(&sp, given, K, units);
  size_t at = 0;
  for (size_t i = 0; i < nmembers; i++) {
    start[i] = at;
    len[i] = units[i] * align + (i == sp.last ? sp.rest : 0);
    at += len[i];
  }
  assert(at == total);
out:
  free(ow);
  free(units);
  return rc;
}
