/* progress.c: a run's progress, without I/O.
 *
 * Every bee publishes a signed "bee.progress" record under "<run>_progress"
 * (subkey: its own key) and reads everyone's back.  This file holds the
 * decisions around that, each a pure function of its inputs so the
 * tests drive them on a fake clock:
 *
 *   - the local rate: samples per second of computing, an exponential
 *     average over computing time only (time spent averaging or waiting
 *     never lowers it), corrected for its start like Adam's moments;
 *   - when to publish: at most every BEE_PROGRESS_MIN_MS while something
 *     changed, at least every BEE_PROGRESS_MAX_MS, which is well inside
 *     the record's lifetime (BEE_PROGRESS_TTL_S); expirations are whole
 *     seconds and a store wins only with a later one, so a record due
 *     within the second of the last one expires a second later than it,
 *     never more than a second ahead of its time;
 *   - when to take the epoch step: once this bee's samples and the
 *     others' at its epoch reach the target, or as soon as the swarm has
 *     stepped past it; and whom to expect in the step's group: the peers
 *     at its epoch and those one behind, who step as soon as they see it,
 *     and when nobody is left to come (the swarm has left the epoch);
 *   - right after a round, where its group's members are: at the next
 *     epoch, though their records still say otherwise for a second;
 *   - DiLoCo: when the other peers at an epoch will have taken their
 *     inner steps;
 *   - whether a state download should wait for the swarm's next step,
 *     lest it land after the epoch's group formed;
 *   - after a split (peers that averaged the same epoch came out with
 *     other parameters), which line goes on: the larger group's, then
 *     the one more peers hold, then the lower hash;
 *   - the swarm view (records of peers that left, their last ones, do
 *     not count): the global epoch is the highest among peers that
 *     are not clients (clients follow; with none but clients, the highest
 *     of all); the samples toward the target are those of the peers at
 *     that epoch, each extrapolated at its own rate from the time its
 *     record was written, for at most PROTO_PROGRESS_EXTRAP_S (records are
 *     up to a second or two old, and an epoch may last only a few); the
 *     rate is every peer's; the time to the target is what is missing
 *     over that rate.
 */
#include "bee.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void bee_rate_add(bee_rate *r, uint64_t samples, double compute_s) {
  if (!(compute_s > 0) || !isfinite(compute_s))
    return; /* no time measured: nothing to learn */
  double inst = (double)samples / compute_s;
  double w = 1 - exp(-compute_s / BEE_RATE_TAU_S);
  r->ema += w * (inst - r->ema);
  r->seconds += compute_s;
}

double bee_rate_get(const bee_rate *r) {
  if (r->seconds <= 0)
    return 0;
  /* The average started at 0; divide out the weight 0 still has. */
  double seen = 1 - exp(-r->seconds / BEE_RATE_TAU_S);
  return r->ema / seen;
}

bool bee_progress_due(const bee_publisher *p, uint64_t now_ms,
                      uint64_t wall_s, uint64_t epoch, uint64_t samples) {
  /* Expirations are whole seconds and a store wins only with a later one:
   * the next record's may run at most a second ahead of wall_s + TTL. */
  if (p->published && p->last_exp > wall_s + BEE_PROGRESS_TTL_S)
    return false;
  if (!p->published || now_ms < p->last_ms) /* none yet; clock went back */
    return true;
  uint64_t since = now_ms - p->last_ms;
  if (since >= BEE_PROGRESS_MAX_MS)
    return true;
  return since >= BEE_PROGRESS_MIN_MS &&
         (epoch != p->epoch || samples != p->samples);
}

uint64_t bee_progress_published(bee_publisher *p, uint64_t now_ms,
                                uint64_t wall_s, uint64_t epoch,
                                uint64_t samples) {
  p->published = true;
  p->last_ms = now_ms;
  uint64_t exp = wall_s + BEE_PROGRESS_TTL_S;
  p->last_exp = exp > p->last_exp ? exp : p->last_exp + 1;
  p->epoch = epoch;
  p->samples = samples;
  return p->last_exp;
}

bool bee_round_candidate(const proto_progress *v, const char *run,
                         uint64_t epoch, uint64_t now_ms) {
  /* One that just left may be back in seconds (a service restarts it):
   * expected for BEE_LEAVE_GRACE_MS, lest a group close without it. */
  if (v->leaving && now_ms >= v->time_ms + BEE_LEAVE_GRACE_MS)
    return false;
  return strcmp(v->run, run) == 0 &&
         (v->epoch == epoch || v->epoch + 1 == epoch);
}

size_t bee_round_candidates(const proto_progress *v, size_t n,
                            const char *run, uint64_t epoch,
                            uint64_t now_ms) {
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    k += bee_round_candidate(&v[i], run, epoch, now_ms);
  return k;
}

static int id_cmp(const void *a, const void *b) {
  return memcmp(a, b, PROTO_ID_BYTES);
}

size_t bee_progress_stepped(proto_progress *v,
                            const uint8_t (*ids)[PROTO_ID_BYTES], size_t n,
                            const char *run, uint64_t epoch,
                            uint64_t time_ms,
                            const uint8_t (*members)[PROTO_ID_BYTES],
                            size_t nmembers, uint64_t now_ms) {
  if (nmembers == 0 || now_ms >= time_ms + BEE_STEPPED_MS)
    return 0;
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    if (v[i].leaving || v[i].epoch >= epoch || v[i].time_ms >= time_ms ||
        strcmp(v[i].run, run) != 0 ||
        !bsearch(ids[i], members, nmembers, PROTO_ID_BYTES, id_cmp))
      continue;
    v[i].epoch = epoch;
    v[i].samples = 0;
    v[i].time_ms = time_ms;
    k++;
  }
  return k;
}

bool bee_round_deserted(const proto_progress *v, size_t n, const char *run,
                        uint64_t epoch, bool delayed, uint64_t now_ms) {
  if (bee_round_candidates(v, n, run, epoch, now_ms) > 0)
    return false;
  /* At epoch + 1 (epoch itself has none, by the above). */
  return !delayed || epoch == UINT64_MAX ||
         bee_round_candidates(v, n, run, epoch + 1, now_ms) == 0;
}

/* Seconds from now_ms until v's peer has taken want samples at epoch of
 * run (0 when it has); -1 when it does not count (another run or epoch,
 * leaving, no rate yet). */
static double outer_left(const proto_progress *v, const char *run,
                         uint64_t epoch, uint64_t want, uint64_t now_ms) {
  if (v->leaving || v->epoch != epoch || strcmp(v->run, run) != 0 ||
      !(v->samples_per_second > 0))
    return -1;
  double age = now_ms > v->time_ms ? (double)(now_ms - v->time_ms) / 1000 : 0;
  if (age > PROTO_PROGRESS_EXTRAP_S)
    age = PROTO_PROGRESS_EXTRAP_S;
  double left =
      ((double)want - (double)v->samples) / v->samples_per_second - age;
  return left > 0 ? left : 0;
}

double bee_outer_due(const proto_progress *v, size_t n, const char *run,
                     uint64_t epoch, uint64_t want, uint64_t now_ms,
                     double *first) {
  double due = -1, first_left = -1;
  for (size_t i = 0; i < n; i++) {
    double left = outer_left(&v[i], run, epoch, want, now_ms);
    if (left < 0)
      continue;
    if (left > due)
      due = left;
    if (first_left < 0 || left < first_left)
      first_left = left;
  }
  if (first)
    *first = first_left;
  return due;
}

double bee_outer_round(const proto_progress *v, size_t n, const char *run,
                       uint64_t epoch, uint64_t want, uint64_t now_ms,
                       double own_left, double lag_s) {
  double last = -1, next = -1; /* the two latest ends */
  for (size_t i = 0; i <= n; i++) {
    double left =
        i < n ? outer_left(&v[i], run, epoch, want, now_ms) : own_left;
    if (!(left >= 0))
      continue;
    if (left > last) {
      next = last;
      last = left;
    } else if (left > next) {
      next = left;
    }
  }
  return next >= 0 && last > next + lag_s ? next : last;
}

static size_t holders(const bee_line *seen, size_t nseen, uint64_t epoch,
                      const uint8_t *hash) {
  size_t k = 0;
  for (size_t i = 0; i < nseen; i++)
    k += seen[i].epoch == epoch &&
         memcmp(seen[i].hash, hash, PROTO_PARAMS_HASH_BYTES) == 0;
  return k;
}

/* Whether line a (with na holders) goes on before line b (nb). */
static bool stronger(const bee_line *a, size_t na, const bee_line *b,
                     size_t nb) {
  if (a->group != b->group)
    return a->group > b->group;
  if (na != nb)
    return na > nb;
  return memcmp(a->hash, b->hash, PROTO_PARAMS_HASH_BYTES) < 0;
}

const bee_line *bee_split_loser(const bee_line *ours, size_t nours,
                                const bee_line *seen, size_t nseen,
                                bee_line *winner) {
  const bee_line *at = NULL; /* ours at the latest epoch that split */
  for (size_t i = 0; i < nseen; i++)
    for (size_t j = 0; j < nours; j++)
      if (ours[j].epoch == seen[i].epoch &&
          memcmp(ours[j].hash, seen[i].hash, PROTO_PARAMS_HASH_BYTES) != 0 &&
          (!at || ours[j].epoch > at->epoch))
        at = &ours[j];
  if (!at)
    return NULL;
  const bee_line *best = NULL;
  size_t nbest = 0;
  for (size_t i = 0; i < nseen; i++) {
    if (seen[i].epoch != at->epoch ||
        memcmp(seen[i].hash, at->hash, PROTO_PARAMS_HASH_BYTES) == 0)
      continue;
    size_t k = holders(seen, nseen, at->epoch, seen[i].hash);
    if (!best || stronger(&seen[i], k, best, nbest)) {
      best = &seen[i];
      nbest = k;
    }
  }
  size_t mine = 1 + holders(seen, nseen, at->epoch, at->hash);
  if (!stronger(best, nbest, at, mine))
    return NULL;
  *winner = *best;
  return at;
}

bool bee_epoch_ready(uint64_t epoch, uint64_t samples,
                     const proto_swarm_view *v, uint64_t others,
                     uint64_t target) {
  if (v->epoch > epoch)
    return true; /* the swarm has stepped past: step with it */
  if (v->epoch < epoch)
    others = 0; /* their samples were for an earlier epoch */
  return samples >= target || others >= target - samples;
}

/* The grid's dimensions: the fewest whose lines hold cap at most, each
 * the shortest that leaves room for the rest. */
static size_t grid_dims(size_t n, size_t cap, size_t m[PROTO_BITS_MAX]) {
  size_t d = 1;
  for (uint64_t p = cap; p < n; p *= cap)
    d++;
  uint64_t rem = n;
  for (size_t i = 0; i < d; i++) {
    size_t k = d - i;
    uint64_t x = 1;
    for (;; x++) {
      uint64_t p = 1;
      for (size_t j = 0; j < k && p < rem; j++)
        p *= x;
      if (p >= rem)
        break;
    }
    m[i] = (size_t)x;
    rem = (rem + x - 1) / x;
  }
  return d;
}

/* Every rank's group in turn `turn` (line[r]: the group's index) and
 * the groups' sizes (size[index]); *dims, *dim the grid's and the
 * turn's.  line and size have n slots. */
static void grid_lines(size_t n, size_t cap, uint64_t turn, size_t *line,
                       size_t *size, size_t *dims, size_t *dim) {
  size_t m[PROTO_BITS_MAX];
  size_t d = grid_dims(n, cap, m), k = (size_t)(turn % d);
  size_t stride = 1;
  for (size_t i = 0; i < k; i++)
    stride *= m[i];
  /* Every bee's line in dimension k, named by its first rank (the bee
   * whose coordinate k is 0), and the lines' sizes. */
  memset(size, 0, n * sizeof *size);
  for (size_t r = 0; r < n; r++) {
    line[r] = r - (r / stride % m[k]) * stride;
    size[line[r]]++;
  }
  /* A grid with holes leaves lines of one bee: they pair up, and an odd
   * one joins the smallest line with room, else takes the last bee of
   * the largest line of three or more.  Nobody is alone while n >= 2 and
   * the cap allows (cap 2 and an odd n leave one).  O(n). */
  size_t odd = SIZE_MAX;
  for (size_t b = 0; b < n; b++) {
    if (size[b] != 1)
      continue;
    if (odd == SIZE_MAX) {
      odd = b;
      continue;
    }
    line[b] = odd;
    size[odd] = 2;
    size[b] = 0;
    odd = SIZE_MAX;
  }
  if (odd != SIZE_MAX) {
    size_t best = SIZE_MAX, big = SIZE_MAX;
    for (size_t c = 0; c < n; c++) {
      if (c != odd && size[c] >= 2 && size[c] < cap &&
          (best == SIZE_MAX || size[c] < size[best]))
        best = c;
      if (size[c] >= 3 && (big == SIZE_MAX || size[c] > size[big]))
        big = c;
    }
    if (best != SIZE_MAX) {
      line[odd] = best;
      size[best]++;
      size[odd] = 0;
    } else if (big != SIZE_MAX) {
      size_t last = 0;
      for (size_t r = 0; r < n; r++)
        if (line[r] == big)
          last = r;
      line[last] = odd;
      size[big]--;
      size[odd] = 2;
    }
  }
  *dims = d;
  *dim = k;
}

int bee_grid_group_of(size_t n, size_t rank, size_t cap, uint64_t turn,
                      bee_grid_group *g, size_t *ranks) {
  memset(g, 0, sizeof *g);
  if (cap < 2 || rank >= n || n > (size_t)1 << PROTO_BITS_MAX)
    return -EINVAL;
  size_t *line = malloc(n * sizeof *line), *size = malloc(n * sizeof *size);
  if (!line || !size) {
    free(line);
    free(size);
    return -ENOMEM;
  }
  grid_lines(n, cap, turn, line, size, &g->dims, &g->dim);
  g->index = line[rank];
  g->size = size[line[rank]];
  size_t w = 1;
  while (((size_t)1 << w) < n)
    w++;
  for (size_t i = 0; i < w; i++)
    g->bits[i] = g->index >> (w - 1 - i) & 1 ? '1' : '0';
  g->bits[w] = 0;
  for (size_t r = 0, k = 0; ranks && r < n; r++)
    if (line[r] == g->index)
      ranks[k++] = r;
  free(line);
  free(size);
  return 0;
}
