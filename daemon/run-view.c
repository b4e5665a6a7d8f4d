/* run-view.c: the swarm view of the run core (run-int.h's bee_view).
 *
 * Once a second the bee reads the others' progress records; with its
 * own, they make the view (proto_swarm_view_compute, which trainmonitor
 * runs too): the swarm's epoch, its samples toward the target and its
 * rate.  Beside it this file counts the peers a round at the worker's
 * epoch expects (bee_round_candidates), picks the donors (the peers at
 * the swarm's epoch that serve their state), takes the members of the
 * group this bee just averaged with at the epoch they stepped to
 * (bee_progress_stepped: their records say so only a second or two
 * later), and fills the guide the worker's step decisions read.
 */
#include "run-int.h"

void bee__view_init(bee_view *v, const bee_config *cfg,
                    const uint8_t self[PROTO_ID_BYTES]) {
  memset(v, 0, sizeof *v);
  v->cfg = cfg;
  memcpy(v->self, self, PROTO_ID_BYTES);
}

bool bee__closer(const uint8_t self[PROTO_ID_BYTES], const uint8_t *a,
                 const uint8_t *b) {
  for (size_t i = 0; i < PROTO_ID_BYTES; i++) {
    uint8_t x = a[i] ^ self[i], y = b[i] ^ self[i];
    if (x != y)
      return x < y;
  }
  return false;
}

static bool closer(const bee_view *v, const uint8_t *a, const uint8_t *b) {
  return bee__closer(v->self, a, b);
}

/* Keeps id among the DONORS_MAX closest donors, in order of closeness. */
static void add_donor(bee_view *v, const uint8_t id[PROTO_ID_BYTES]) {
  size_t i = v->ndonors;
  if (i == DONORS_MAX) {
    if (!closer(v, id, v->donors[DONORS_MAX - 1]))
      return;
    i = DONORS_MAX - 1;
  } else {
    v->ndonors++;
  }
  for (; i > 0 && closer(v, id, v->donors[i - 1]); i--)
    memcpy(v->donors[i], v->donors[i - 1], PROTO_ID_BYTES);
  memcpy(v->donors[i], id, PROTO_ID_BYTES);
}

void bee__view_close(bee_view *v) {
  free(v->seen);
  free(v->seen_ids);
  free(v->stepped_ids);
  free(v->grid_ids);
  free(v->grid_ranks);
  memset(v, 0, sizeof *v);
}

void bee__view_keep(bee_view *v, const proto_progress *all,
                    const uint8_t (*ids)[PROTO_ID_BYTES], size_t n) {
  v->nseen = 0;
  if (n > v->seen_cap) {
    proto_progress *p = realloc(v->seen, n * sizeof *p);
    if (p)
      v->seen = p;
    uint8_t(*d)[PROTO_ID_BYTES] = realloc(v->seen_ids, n * sizeof *d);
    if (d)
      v->seen_ids = d;
    if (!p || !d)
      return;
    v->seen_cap = n;
  }
  if (n) {
    memcpy(v->seen, all, n * sizeof *all);
    memcpy(v->seen_ids, ids, n * sizeof *ids);
  }
  v->nseen = n;
}

double bee__view_epoch_s(const bee_view *v) {
  const proto_swarm_view *w = &v->view;
  bool outer = v->cfg->averaging == BEE_AVG_DILOCO;
  if (outer && w->peers_at_epoch && w->rate_at_epoch > 0)
    return (double)bee_config_inner_steps(v->cfg) * v->cfg->batch_size /
           (w->rate_at_epoch / (double)w->peers_at_epoch);
  if (!outer && w->samples_per_second > 0)
    return v->cfg->target_batch_size / w->samples_per_second;
  return -1;
}

double bee__guide_others_now(const bee_run_guide *g, uint64_t now_ms) {
  double age = now_ms > g->view_ms ? (double)(now_ms - g->view_ms) / 1000 : 0;
  if (age > BEE_PROGRESS_TTL_S)
    age = BEE_PROGRESS_TTL_S;
  return (double)g->others + g->others_rate * age;
}

/* DiLoCo: when the others at the worker's epoch will have taken their
 * inner steps (the first of them too), when the round comes with this
 * bee, and when those at the swarm's epoch will have. */
static void outer_times(bee_view *v, const proto_progress *all, size_t n,
                        const proto_progress *own, uint64_t epoch,
                        uint64_t samples, uint64_t now_ms, bee_run_guide *g) {
  const bee_config *c = v->cfg;
  uint64_t want = (uint64_t)bee_config_inner_steps(c) * c->batch_size;
  uint64_t unix_ms = own->time_ms;
  double first;
  double due = bee_outer_due(all, n, c->run, epoch, want, unix_ms, &first);
  double sdue =
      v->view.epoch == epoch
          ? due
          : bee_outer_due(all, n, c->run, v->view.epoch, want, unix_ms, NULL);
  g->others_due_ms = due >= 0 ? now_ms + (uint64_t)(due * 1000) : 0;
  g->others_first_ms = first >= 0 ? now_ms + (uint64_t)(first * 1000) : 0;
  double own_rate = own->samples_per_second;
  double own_left = samples >= want ? 0
                    : own_rate > 0  ? (double)(want - samples) / own_rate
                                    : -1;
  double round = bee_outer_round(all, n, c->run, epoch, want, unix_ms, own_left,
                                 OUTER_LAG_MIN_S);
  g->round_ms = round >= 0 ? now_ms + (uint64_t)(round * 1000) : 0;
  v->swarm_due_ms = sdue >= 0 ? now_ms + (uint64_t)(sdue * 1000) : 0;
  if (due >= 0 && samples < want && own_rate > 0)
    bee_debug(COMP,
              "epoch %llu: the others' inner steps end in %.1f to %.1f s, "
              "ours in %.1f s",
              (unsigned long long)epoch, first, due,
              (double)(want - samples) / own_rate);
}

static int id_cmp(const void *a, const void *b) {
  return memcmp(a, b, PROTO_ID_BYTES);
}

/* The grid's ranks (bee_view's grid_ids) from the others' records all[]
 * (owners ids[]) at the worker's epoch; the list of an earlier view at
 * the same epoch stays in.  Without the memory no ids are added (at a
 * new epoch the list is empty: no grid, and the round is one group of
 * at most --group-size). */
static void grid_set(bee_view *v, const proto_progress *all,
                     const uint8_t (*ids)[PROTO_ID_BYTES], size_t n,
                     uint64_t epoch, uint64_t now) {
  v->grid_made = false;
  if (!v->have || v->cand_epoch != epoch)
    v->ngrid = 0;
  if (v->ngrid + n + 1 > v->grid_cap) {
    size_t cap = v->ngrid + n + 1;
    uint8_t(*g)[PROTO_ID_BYTES] = realloc(v->grid_ids, cap * sizeof *g);
    if (!g)
      return;
    v->grid_ids = g;
    v->grid_cap = cap;
  }
  memcpy(v->grid_ids[v->ngrid++], v->self, PROTO_ID_BYTES);
  /* The round's candidates (at epoch or one behind), and those one ahead:
   * a group that stepped first is still on the grid of the others, who
   * would otherwise rank the bees apart from it. */
  for (size_t i = 0; i < n; i++)
    if (bee_round_candidate(&all[i], v->cfg->run, epoch, now) ||
        bee_round_candidate(&all[i], v->cfg->run, epoch + 1, now))
      memcpy(v->grid_ids[v->ngrid++], ids[i], PROTO_ID_BYTES);
  qsort(v->grid_ids, v->ngrid, sizeof *v->grid_ids, id_cmp);
  size_t k = 0;
  for (size_t i = 0; i < v->ngrid; i++)
    if (k == 0 || id_cmp(v->grid_ids[k - 1], v->grid_ids[i]) != 0)
      memmove(v->grid_ids[k++], v->grid_ids[i], PROTO_ID_BYTES);
  v->ngrid = k;
}

bool bee__view_grid(bee_view *v, uint64_t epoch, uint64_t turn,
                    bee_grid_group *g) {
  size_t cap = v->cfg->group_size;
  if (!cap || v->cand_epoch != epoch || v->ngrid <= cap)
    return false;
  if (!v->grid_made || v->grid_turn != turn) {
    uint8_t(*self)[PROTO_ID_BYTES] =
        bsearch(v->self, v->grid_ids, v->ngrid, PROTO_ID_BYTES, id_cmp);
    if (!self || (!v->grid_ranks &&
                  !(v->grid_ranks = malloc(cap * sizeof *v->grid_ranks))))
      return false;
    if (bee_grid_group_of(v->ngrid, (size_t)(self - v->grid_ids), cap, turn,
                          &v->grid, v->grid_ranks) != 0)
      return false;
    v->grid_made = true;
    v->grid_turn = turn;
  }
  *g = v->grid;
  return true;
}

bool bee__view_state_due(bee_view *v, uint64_t epoch, uint64_t turn) {
  bee_grid_group g;
  if (!bee__view_grid(v, epoch, turn, &g))
    return true; /* not known: the matchmaking finds out */
  bool due = false;
  for (size_t k = 0; k < g.size && !due; k++) {
    const uint8_t *id = v->grid_ids[v->grid_ranks[k]];
    if (memcmp(id, v->self, PROTO_ID_BYTES) == 0)
      continue;
    const proto_progress *p = NULL;
    for (size_t i = 0; i < v->nseen && !p; i++)
      if (memcmp(v->seen_ids[i], id, PROTO_ID_BYTES) == 0)
        p = &v->seen[i];
    /* Not in the last read (one may miss a record): it may come. */
    due = !p || (!p->leaving && (p->epoch + 1 == epoch ||
                                 (p->epoch == epoch && p->samples == 0)));
  }
  return due;
}

size_t bee__view_set(bee_view *v, proto_progress *all,
                     const uint8_t (*ids)[PROTO_ID_BYTES], size_t n,
                     const proto_progress *own, const bee_run_worker *w,
                     bool keep_donors, double join_s, uint64_t now_ms) {
  const bee_config *c = v->cfg;
  uint64_t epoch = w->epoch, samples = w->samples;
  all[n] = *own;
  uint64_t now = own->time_ms;
  bee_progress_stepped(all, ids, n, c->run, v->stepped_epoch, v->stepped_ms,
                       (const uint8_t(*)[PROTO_ID_BYTES])v->stepped_ids,
                       v->nstepped, now);
  proto_swarm_view_compute(all, n + 1, c->run, c->target_batch_size, now,
                           &v->view);
  /* A read of the DHT may miss a record now and then; at the same epoch
   * the count only grows, lest a round close without a peer that is
   * there (one that is gone costs the round --matchmaking-time). */
  if (c->group_size)
    grid_set(v, all, ids, n, epoch, now);
  size_t fresh = bee_round_candidates(all, n + 1, c->run, epoch, now);
  size_t cand = fresh;
  if (v->have && v->cand_epoch == epoch && cand < v->candidates)
    cand = v->candidates;
  v->candidates = cand;
  v->cand_epoch = epoch;
  /* Donors: the others at the swarm's epoch or one behind it (right
   * after a step most records still say the epoch before) that serve
   * (not clients), the DONORS_MAX closest to this bee's id (XOR), so that
   * bees behind at once ask different donors rather than all the first
   * records'.  A download takes the newest snapshot they serve. */
  if (!keep_donors) {
    v->ndonors = 0;
    for (size_t i = 0; i < n; i++)
      if (strcmp(all[i].run, c->run) == 0 && !all[i].leaving &&
          all[i].epoch + 1 >= v->view.epoch && all[i].mode != PROTO_MODE_CLIENT)
        add_donor(v, ids[i]);
  }
  bee_run_guide *g = &v->guide;
  memset(g, 0, sizeof *g);
  g->view = v->view;
  double es = bee__view_epoch_s(v);
  g->join_fits = es > join_s;
  g->grouped = c->group_size && v->ngrid > c->group_size;
  g->own_rate = own->samples_per_second;
  if (c->averaging == BEE_AVG_DILOCO)
    outer_times(v, all, n, own, epoch, samples, now_ms, g);
  bool here = v->view.epoch == epoch;
  g->others = here ? v->view.samples - samples : v->view.samples;
  g->others_rate = v->view.rate_at_epoch - (here ? own->samples_per_second : 0);
  if (g->others_rate < 0)
    g->others_rate = 0;
  g->view_ms = now_ms;
  return fresh;
}

void bee__view_stepped(bee_view *v, const avg_group *g, uint64_t epoch,
                       uint64_t unix_ms) {
  v->nstepped = 0;
  if (!g)
    return;
  if (g->nmembers > v->stepped_cap) {
    uint8_t(*d)[PROTO_ID_BYTES] =
        realloc(v->stepped_ids, g->nmembers * sizeof *d);
    if (!d)
      return; /* without the memory for the ids, none */
    v->stepped_ids = d;
    v->stepped_cap = g->nmembers;
  }
  for (size_t i = 0; i < g->nmembers; i++)
    if (i != g->self)
      memcpy(v->stepped_ids[v->nstepped++], g->members[i].id, PROTO_ID_BYTES);
  qsort(v->stepped_ids, v->nstepped, sizeof *v->stepped_ids, id_cmp);
  v->stepped_epoch = epoch;
  v->stepped_ms = unix_ms;
}
