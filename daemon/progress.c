/* progress.c: a run's progress, without I/O.
 *
 * Every bee publishes a signed "bee.progress" record under "<run>_progress"
 * (subkey: its own key) and reads everyone's back.  This file holds the
 * three decisions around that, each a pure function of its inputs so the
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
 *     at its epoch and those one behind, who step as soon as they see it;
 *   - the swarm view (records of peers that left, their last ones, do
 *     not count): the global epoch is the highest among peers that
 *     are not clients (clients follow; with none but clients, the highest
 *     of all); the samples toward the target are those of the peers at
 *     that epoch, each extrapolated at its own rate from the time its
 *     record was written, for at most BEE_PROGRESS_EXTRAP_S (records are
 *     up to a second or two old, and an epoch may last only a few); the
 *     rate is every peer's; the time to the target is what is missing
 *     over that rate.
 */
#include "bee.h"

#include <math.h>
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

size_t bee_round_candidates(const proto_progress *v, size_t n,
                            const char *run, uint64_t epoch,
                            uint64_t now_ms) {
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    /* One that just left may be back in seconds (a service restarts it):
     * expected for BEE_LEAVE_GRACE_MS, lest a group close without it. */
    if (v[i].leaving && now_ms >= v[i].time_ms + BEE_LEAVE_GRACE_MS)
      continue;
    if (strcmp(v[i].run, run) == 0 &&
        (v[i].epoch == epoch || v[i].epoch + 1 == epoch))
      k++;
  }
  return k;
}

bool bee_epoch_ready(uint64_t epoch, uint64_t samples,
                     const bee_swarm_view *v, uint64_t others,
                     uint64_t target) {
  if (v->epoch > epoch)
    return true; /* the swarm has stepped past: step with it */
  if (v->epoch < epoch)
    others = 0; /* their samples were for an earlier epoch */
  return samples >= target || others >= target - samples;
}

/* A peer's samples now: its record's count, plus its rate over the time
 * since it wrote the record, for at most BEE_PROGRESS_EXTRAP_S: a peer
 * that trains publishes every second or so, so an older record is a peer
 * that stopped (averaging, or gone), and a clock far off must not make
 * up an epoch. */
static uint64_t samples_now(const proto_progress *p, uint64_t now_ms) {
  if (now_ms <= p->time_ms)
    return p->samples;
  double age = (double)(now_ms - p->time_ms) / 1000;
  if (age > BEE_PROGRESS_EXTRAP_S)
    age = BEE_PROGRESS_EXTRAP_S;
  double more = p->samples_per_second * age;
  if (more >= (double)(UINT64_MAX - p->samples))
    return UINT64_MAX;
  return p->samples + (uint64_t)more;
}

void bee_swarm_view_compute(const proto_progress *v, size_t n,
                            const char *run, uint64_t target,
                            uint64_t now_ms, bee_swarm_view *out) {
  memset(out, 0, sizeof *out);
  out->eta_s = -1;
  bool any_node = false;
  uint64_t top_all = 0, top_nodes = 0;
  for (size_t i = 0; i < n; i++) {
    const proto_progress *p = &v[i];
    if (strcmp(p->run, run) != 0 || p->leaving)
      continue;
    out->peers++;
    out->samples_per_second += p->samples_per_second;
    if (p->epoch > top_all)
      top_all = p->epoch;
    if (p->mode != PROTO_MODE_CLIENT) {
      if (!any_node || p->epoch > top_nodes)
        top_nodes = p->epoch;
      any_node = true;
    }
  }
  out->epoch = any_node ? top_nodes : top_all;
  for (size_t i = 0; i < n; i++) {
    const proto_progress *p = &v[i];
    if (strcmp(p->run, run) != 0 || p->leaving || p->epoch != out->epoch)
      continue;
    out->peers_at_epoch++;
    out->rate_at_epoch += p->samples_per_second;
    /* Saturating: a forged record cannot wrap the sum around. */
    uint64_t k = samples_now(p, now_ms);
    out->samples = k > UINT64_MAX - out->samples ? UINT64_MAX
                                                 : out->samples + k;
  }
  if (out->samples >= target) {
    out->target_reached = true;
    out->eta_s = 0;
  } else if (out->samples_per_second > 0) {
    out->eta_s = (double)(target - out->samples) / out->samples_per_second;
  }
}
