/* run-round.c: the averaging rounds of the run core (run-int.h's
 * bee_rounds).
 *
 * At each epoch step the worker hands its buffer over and waits; the core
 * asks the averager (io) for a round with the group for the epoch.  That
 * group is usually formed ahead: once the swarm is expected at the target
 * within --matchmaking-time (DiLoCo: once this bee's inner steps end so
 * soon), while the worker computes its last batches, so the round begins
 * as soon as the buffer is ready.  Otherwise the step's own matchmaking
 * forms it.  One group of every peer expected at the epoch (those at it
 * and one behind, by the view), so that every bee of the run takes the
 * same step.  A bee alone at its epoch, or with nothing to give past an
 * epoch the swarm has left, steps without a round.  A matchmaking the
 * swarm left (nobody else can come to its epoch any more) ends at once,
 * and so does one a loaded state made moot.
 */
#include "run-int.h"

void bee__rounds_init(bee_rounds *o, const bee_config *cfg,
                      const bee_run_io *io,
                      void (*over)(void *ctx, const bee_run_result *r),
                      void *over_ctx) {
  memset(o, 0, sizeof *o);
  o->cfg = cfg;
  o->io = io;
  o->over = over;
  o->over_ctx = over_ctx;
}

void bee__rounds_close(bee_rounds *o) {
  free(o->ahead.gm);
  o->ahead.gm = NULL;
  o->ahead.gm_cap = 0;
}

static uint64_t now(const bee_rounds *o) { return o->io->now_ms(o->io->ctx); }

static bool outer(const bee_rounds *o) {
  return o->cfg->averaging == BEE_AVG_DILOCO;
}

/* --group-size: the grid's turn of the rounds of epoch.  A state round
 * (at the epochs --average-state-every divides) begins a turn, and the
 * update rounds up to the next keep it: the members of a group, alike
 * after its state round, take their steps together. */
static uint64_t turn_of(const bee_rounds *o, uint64_t epoch) {
  unsigned k = o->cfg->average_state_every;
  return k ? epoch / k : epoch;
}

/* The matchmaking of the round of `round` (an epoch, or
 * BEE_RUN_STATE_ROUND + epoch with state) expecting `peers` members, this
 * bee's weight w: it begins as soon as every peer expected has joined, at
 * the latest --matchmaking-time from now with whoever has.  grid: this
 * bee's group in a run of --group-size past a group (NULL: one group of
 * every peer). */
static void fill(const bee_rounds *o, bee_run_avg *a, uint64_t round,
                 bool state, size_t peers, double w,
                 const bee_grid_group *grid) {
  memset(a, 0, sizeof *a);
  a->round = round;
  a->state = state;
  /* One group of every peer expected, so that all of them take the same
   * step: a cap below the swarm's size would leave the bees past it to
   * groups of their own, out of line.  The group begins as soon as the
   * peers this bee expects are in; a leader that expects more (its view
   * saw one more record) is still followed.  With --group-size past a
   * group, the group of the grid's turn, under its bits. */
  size_t cap = o->cfg->group_size ? o->cfg->group_size : AVG_GROUP_MAX;
  if (grid) {
    peers = grid->size;
    memcpy(a->bits, grid->bits, sizeof a->bits);
  }
  a->target_size = peers < 2 ? 2 : peers > cap ? cap : peers;
  a->max_size = cap;
  a->weight = w;
  a->matchmaking_ms = (uint64_t)(o->cfg->matchmaking_s * 1000);
  a->deadline_ms = a->matchmaking_ms + MATCH_GRACE_MS;
}

void bee__rounds_drop(bee_rounds *o, const char *why) {
  if (o->ahead.state == AHEAD_HELD) {
    bee_info(COMP, "leaving the group formed for epoch %llu: %s",
             (unsigned long long)o->ahead.epoch, why);
    o->io->leave(o->io->ctx, &o->ahead.g, why);
  }
  if (o->ahead.state == AHEAD_MATCHING) {
    o->ahead.state = AHEAD_NONE;
    o->io->cancel(o->io->ctx); /* its answer finds AHEAD_NONE */
  }
  o->ahead.state = AHEAD_NONE;
}

/* The round the worker waits for is over, one way or another: its answer.
 * The group's samples are the weights its members gave the round (those
 * declared in the matchmaking, when it formed ahead, were estimates).
 * An update round's group (when it ran) steps to the next epoch with this
 * bee: the view counts its members there at once (bee_progress_stepped),
 * unless the swarm's epochs are shorter than STEPPED_MIN_EPOCH_S (there
 * the members' start skew and a round's own time are the epoch, and
 * counted from the step they end epochs with a fraction of the target;
 * the views then wait for the records, and each bee gathers about the
 * target itself), or with DiLoCo, whose rounds come after local steps,
 * not samples. */
static void over(bee_rounds *o, bee_view *v, int status, size_t group,
                 double by_all, bool left, const avg_node_result *r) {
  o->averaging = false;
  bee_run_worker w;
  o->io->worker(o->io->ctx, &w);
  if (!w.round_state) {
    const avg_group *g = status == 0 && r ? r->group : NULL;
    if (outer(o) || !(v->view.samples_per_second > 0) ||
        o->cfg->target_batch_size <
            STEPPED_MIN_EPOCH_S * v->view.samples_per_second)
      g = NULL;
    bee__view_stepped(v, g, w.round_epoch + 1, o->io->unix_ms(o->io->ctx));
  }
  bee_run_result res = {.status = status,
                        .group = group,
                        .by_all = by_all,
                        .ahead = o->round_ahead && status == 0,
                        .left = left,
                        .formed =
                            status == BEE_EMISSED ||
                            (status != 0 && r &&
                             (r->match.refused_formed ||
                              (r->match.fetches && !r->match.declared_max))),
                        .done_ms = now(o),
                        .summary = r ? r->summary : NULL};
  for (size_t i = 0; r && r->group && i < r->group->nmembers; i++)
    res.batch += r->summary && i < r->summary->nmembers
                     ? (uint64_t)r->summary->members[i].weight
                     : (uint64_t)r->group->members[i].weight;
  res.bytes_sent = r && r->summary ? r->summary->bytes_sent : 0;
  res.bytes_recv = r && r->summary ? r->summary->bytes_recv : 0;
  o->over(o->over_ctx, &res);
}

/* Whether an update round's group went on without this bee: it dropped
 * most of its peers (in a group of three or more), as a member that
 * stalled does when it comes back to find their ABORTs.  Each of them
 * dropped only it, zeroed its span and stepped alike; what it holds now
 * is not theirs.  (In a group of two each dropped the other: neither can
 * tell, and a peer that died leaves the other no wiser.) */
static bool left_behind(const avg_round_summary *s, uint64_t epoch) {
  size_t dropped = 0, others = s->nmembers ? s->nmembers - 1 : 0;
  for (size_t i = 0; i < s->nmembers; i++)
    dropped += s->members[i].dropped != AVG_DROP_NONE;
  if (others < 2 || 2 * dropped <= others)
    return false;
  bee_warn(COMP,
           "epoch %llu: %zu of the %zu other members of the group went on "
           "without this bee (it stalled, or its links did): its step is "
           "not theirs; it loads their state",
           (unsigned long long)epoch, dropped, others);
  return true;
}

void bee__rounds_done(bee_rounds *o, bee_view *v, const avg_node_result *r) {
  size_t group = r->group ? r->group->nmembers : 0;
  double by_all = 0;
  int status = r->status;
  if (status == BEE_ECANCELED && o->deserted_cancel)
    status = -ENOENT; /* nobody else at its epoch, or a state came */
  bool left = false;
  if (status == 0 && r->summary) {
    bee_run_worker w;
    o->io->worker(o->io->ctx, &w);
    size_t np = 0;
    for (size_t k = 0; k <= r->summary->nmembers; k++)
      np += r->summary->floats_by_k[k];
    /* "By all": by every member that had something to give; one with no
     * samples (weight 0) or an AUX member contributes nothing anyway. */
    size_t k = 0;
    for (size_t i = 0; r->group && i < r->group->nmembers; i++)
      k += r->group->members[i].weight > 0 && /* declared: > 0 with data */
           r->group->members[i].mode != PROTO_MODE_AUX;
    if (k > r->summary->nmembers)
      k = r->summary->nmembers;
    by_all = np && k ? (double)r->summary->floats_by_k[k] / (double)np : 1;
    if (r->summary->floats_by_k[0] == np)
      status = BEE_ETIMEOUT; /* nothing was averaged */
    left = !w.round_state && left_behind(r->summary, w.round_epoch);
  }
  over(o, v, status, group, by_all, left, r);
}

void bee__rounds_matched(bee_rounds *o, bee_view *v, int status,
                         const avg_group *g) {
  if (o->stopped || o->ahead.state != AHEAD_MATCHING)
    return; /* cancelled */
  if (status == 0) {
    if (g->nmembers > o->ahead.gm_cap) {
      proto_group_member *m = realloc(o->ahead.gm, g->nmembers * sizeof *m);
      if (!m) {
        o->ahead.state = AHEAD_NONE;
        o->io->leave(o->io->ctx, g, "out of memory");
        bee__rounds_start(o, v);
        return;
      }
      o->ahead.gm = m;
      o->ahead.gm_cap = g->nmembers;
    }
    o->ahead.state = AHEAD_HELD;
    o->ahead.wait_ms = now(o);
    o->ahead.g = *g;
    memcpy(o->ahead.gm, g->members, g->nmembers * sizeof *o->ahead.gm);
    o->ahead.g.members = o->ahead.gm;
    bee_debug(COMP, "epoch %llu: a group of %zu formed ahead in %.2f s",
              (unsigned long long)o->ahead.epoch, g->nmembers,
              (double)(now(o) - o->ahead.t0_ms) / 1000);
  } else if (status == BEE_EMISSED) {
    o->ahead.state = AHEAD_MISSED; /* the round ends so at once */
    bee_info(COMP,
             "epoch %llu: its matchmaking ahead found the epoch's group "
             "formed without it",
             (unsigned long long)o->ahead.epoch);
  } else {
    o->ahead.state = AHEAD_FAILED; /* matched again once the target is in */
    bee_debug(COMP, "epoch %llu: no group formed ahead: %s",
              (unsigned long long)o->ahead.epoch, bee_strerror(status));
  }
  bee__rounds_start(o, v); /* the worker may be waiting */
}

void bee__rounds_ahead(bee_rounds *o, bee_view *v, double rate,
                       uint64_t now_ms) {
  const bee_config *c = o->cfg;
  if (c->no_match_ahead || o->averaging || o->stopped || o->taking_step ||
      o->ahead.state == AHEAD_MATCHING)
    return;
  bee_run_worker w;
  o->io->worker(o->io->ctx, &w);
  uint64_t epoch = w.epoch, samples = w.samples;
  /* A round asked for and not over, or this epoch's over already (the
   * worker is about to step). */
  bool asked = w.round_wanted ||
               (w.round_answered && !w.round_state && w.round_epoch == epoch);
  const bee_run_guide *g = &v->guide;
  double others = bee__guide_others_now(g, now_ms);
  if (o->ahead.state != AHEAD_NONE && o->ahead.epoch != epoch)
    bee__rounds_drop(o, "the epoch moved on");
  if (asked || samples == 0 || o->ahead.state != AHEAD_NONE ||
      v->cand_epoch != epoch || v->candidates < 2 || !(rate > 0))
    return;
  bee_grid_group grid;
  bool grouped = bee__view_grid(v, epoch, turn_of(o, epoch), &grid);
  if (grouped && grid.size < 2)
    return;
  /* eta: when to look; ready: when the round can run; own: when this
   * bee's inner steps end (the weight). */
  double eta, ready, own;
  if (outer(o)) {
    double want = (double)bee_config_inner_steps(c) * (double)c->batch_size;
    eta = ready = own = (want - (double)samples) / rate;
    double first_s = g->others_first_ms ? (double)g->others_first_ms / 1000 : 0;
    double round_s = g->round_ms ? (double)g->round_ms / 1000 : 0;
    double at = (double)now_ms / 1000;
    /* A laggard's round comes when the last of the others' inner steps
     * end.  Their group forms by the time the first of them is done (its
     * leader's start), so a laggard looks ahead of that. */
    if (eta > OUTER_LAG_MIN_S && first_s > 0 && first_s - at < eta)
      eta = first_s > at ? first_s - at : 0;
    /* Every bee declares the start the round can keep, the bees slower
     * than it and the laggard's early round counted (bee_outer_round): a
     * group that began at its leader's own end would go without the bees
     * that come after it, who then step alone. */
    if (round_s > 0)
      ready = round_s > at ? round_s - at : 0;
  } else {
    double left = (double)c->target_batch_size - (double)samples - others;
    eta = ready = own = left / (rate + g->others_rate);
  }
  if (eta > c->matchmaking_s)
    return;
  /* The weight we declare is a guess (what we will have by then); the
   * round weighs by the samples the worker hands it. */
  double got = own < ready ? own : ready;
  double wt = (double)samples + (got > 0 ? rate * got : 0);
  bee_run_avg a;
  fill(o, &a, epoch, false, v->candidates, wt, grouped ? &grid : NULL);
  if (ready > c->matchmaking_s) {
    if (ready > READY_MAX_S)
      ready = READY_MAX_S;
    a.first_start_ms = (uint64_t)(ready * 1000);
    a.deadline_ms = a.first_start_ms + MATCH_GRACE_MS;
    bee_debug(COMP, "epoch %llu: matching ahead for a round in %.1f s",
              (unsigned long long)epoch, ready);
  }
  o->ahead.state = AHEAD_MATCHING; /* before: the answer may come inside */
  o->ahead.epoch = epoch;
  o->ahead.t0_ms = now_ms;
  o->ahead.ready_ms = now_ms + (ready > 0 ? (uint64_t)(ready * 1000) : 0);
  int rc = o->io->match(o->io->ctx, &a);
  if (rc) {
    bee_debug(COMP, "epoch %llu: no matchmaking ahead: %s",
              (unsigned long long)epoch, bee_strerror(rc));
    o->ahead.state = AHEAD_FAILED;
  }
}

void bee__rounds_start(bee_rounds *o, bee_view *v) {
  bee_run_worker w;
  o->io->worker(o->io->ctx, &w);
  bool state = w.round_state;
  uint64_t epoch = w.round_epoch;
  double weight = w.round_weight;
  if (!w.round_wanted || o->averaging || o->stopped || o->taking_step)
    return;
  bool ours = !state && o->ahead.epoch == epoch;
  if (o->ahead.state == AHEAD_MATCHING && ours)
    return; /* its answer comes back here */
  if (o->ahead.state == AHEAD_MISSED && ours) {
    /* Another matchmaking would find nobody (that group's declarations
     * may have expired) and wait out its time. */
    o->ahead.state = AHEAD_NONE;
    o->round_ahead = false;
    over(o, v, BEE_EMISSED, 1, 0, false, NULL);
    return;
  }
  if (o->ahead.state == AHEAD_HELD && ours) {
    bee_run_avg a;
    fill(o, &a, epoch, false, o->ahead.g.nmembers, weight, NULL);
    o->ahead.state = AHEAD_NONE;
    o->averaging = o->round_ahead = true;
    int rc = o->io->round(o->io->ctx, &o->ahead.g, &a);
    if (rc) {
      bee_warn(COMP, "epoch %llu: cannot start the averaging: %s",
               (unsigned long long)epoch, bee_strerror(rc));
      over(o, v, rc, 1, 0, false, NULL);
    }
    return;
  }
  /* Nothing to give, and the swarm has stepped past the epoch by the last
   * view: its round is over, with or without this bee.  A matchmaking
   * would wait for nobody while the swarm's next epoch goes by, and a bee
   * that came to the epoch late (a state loaded one epoch behind, a
   * stall) would step the same way at every epoch after, never
   * training. */
  bool delayed = o->cfg->delay_averaging;
  /* The candidates were counted at the worker's epoch: with
   * --delay-averaging it is already one past the round's (and counts the
   * peers at both). */
  uint64_t at = state || !delayed ? epoch : epoch + 1;
  bee_grid_group grid;
  bool grouped = bee__view_grid(v, at, turn_of(o, epoch), &grid);
  /* Where the swarm's steps can be taken (take_steps), a bee with samples
   * of an epoch the swarm has left takes its step too (run.c), rather
   * than wait out a matchmaking, or form a group of stragglers that
   * would split the swarm.  In groups of --group-size each group's step
   * is its own: there is no swarm's step to take; and the state round of
   * an epoch the swarm has left went without this bee (its group took
   * it at the epoch's start, and its members compute or have stepped):
   * it goes on at once, and a later turn mixes it in. */
  bool moot = grouped && state &&
              (v->view.epoch > epoch ||
               !bee__view_state_due(v, epoch, turn_of(o, epoch)));
  if (moot ||
      (!state && !delayed && (weight == 0 || (o->take_steps && !grouped)) &&
       v->view.epoch > epoch)) {
    if (o->ahead.state != AHEAD_NONE)
      bee__rounds_drop(o, "the swarm left its epoch");
    o->round_ahead = false;
    over(o, v, -ENOENT, 1, 0, false, NULL);
    return;
  }
  if (o->ahead.state != AHEAD_NONE)
    bee__rounds_drop(o, state ? "a state round comes first"
                              : "the round is for another epoch");
  if (v->cand_epoch != at)
    return; /* no view at this epoch yet (a state just loaded): next tick */
  size_t peers = grouped ? grid.size : v->candidates;
  o->round_ahead = false;
  if (peers < 2) {
    over(o, v, -ENOENT, 1, 0, false, NULL);
    return;
  }
  bee_run_avg a;
  fill(o, &a, state ? BEE_RUN_STATE_ROUND + epoch : epoch, state, peers, weight,
       grouped ? &grid : NULL); /* the worker waits meanwhile */
  o->averaging = true;
  int rc = o->io->average(o->io->ctx, &a);
  if (rc) {
    bee_warn(COMP, "epoch %llu: cannot start %s averaging: %s",
             (unsigned long long)epoch, state ? "state" : "the",
             bee_strerror(rc));
    over(o, v, rc, 1, 0, false, NULL);
  }
}

/* Ends the round's matchmaking under way: its answer comes inside, as a
 * round without a group (-ENOENT). */
static void end_matching(bee_rounds *o) {
  o->deserted_cancel = true;
  o->io->cancel(o->io->ctx);
  o->deserted_cancel = false;
}

void bee__rounds_deserted(bee_rounds *o, bee_view *v,
                          const proto_progress *others, size_t n,
                          size_t fresh) {
  uint64_t epoch;
  bool delayed = o->cfg->delay_averaging, round = false, state = false;
  if (o->averaging && o->io->matching(o->io->ctx)) {
    bee_run_worker w;
    o->io->worker(o->io->ctx, &w);
    epoch = w.round_epoch;
    delayed &= !w.round_state; /* the state travels at the epoch's start */
    round = true;
    state = w.round_state;
  } else if (o->ahead.state == AHEAD_MATCHING) {
    epoch = o->ahead.epoch;
  } else {
    o->deserted = 0;
    return;
  }
  if (epoch != o->deserted_epoch)
    o->deserted = 0;
  o->deserted_epoch = epoch;
  /* An update round still matching while the swarm has stepped past its
   * epoch, where the swarm's step can be taken (as bee__rounds_start's
   * moot round): the group of the epoch went without this bee.  A record
   * at a later epoch says so itself, where the deserted check below rests
   * on records that are absent and waits for a second view; the bee
   * takes the swarm's step (run.c) a second sooner. */
  if (round && !state && !delayed && o->take_steps && !v->guide.grouped &&
      v->view.epoch > epoch) {
    o->deserted = 0;
    bee_info(COMP,
             "epoch %llu: the swarm stepped past it (to epoch %llu) while "
             "this bee looked for its group: its matchmaking ends",
             (unsigned long long)epoch, (unsigned long long)v->view.epoch);
    end_matching(o);
    return;
  }
  uint64_t unix_ms = o->io->unix_ms(o->io->ctx);
  /* A state round in groups of --group-size: its own group's members
   * only. */
  bee_grid_group grid;
  bool gone =
      state && bee__view_grid(v, epoch, turn_of(o, epoch), &grid)
          ? !bee__view_state_due(v, epoch, turn_of(o, epoch))
          : bee_round_deserted(others, n, o->cfg->run, epoch, delayed, unix_ms);
  if (!gone) {
    o->deserted = 0;
    return;
  }
  if (++o->deserted < DESERTED_VIEWS)
    return;
  o->deserted = 0;
  bee_info(COMP,
           "epoch %llu: no other peer can come to its group any more (the "
           "swarm is at epoch %llu): its matchmaking ends, the step is "
           "taken alone",
           (unsigned long long)epoch, (unsigned long long)v->view.epoch);
  v->candidates = fresh;
  if (round) {
    end_matching(o);
  } else {
    bee__rounds_drop(o, "the swarm left its epoch");
  }
}

void bee__rounds_moot(bee_rounds *o, uint64_t load_epoch) {
  if (!o->averaging || !o->io->matching(o->io->ctx))
    return;
  bee_run_worker w;
  o->io->worker(o->io->ctx, &w);
  uint64_t epoch = w.round_epoch;
  if (epoch > load_epoch)
    return; /* a round past the state: not moot */
  bee_info(COMP,
           "epoch %llu: its matchmaking ends: the state of epoch %llu was "
           "loaded",
           (unsigned long long)epoch, (unsigned long long)load_epoch);
  end_matching(o);
}

void bee__rounds_tick(bee_rounds *o, uint64_t now_ms) {
  /* Members that began the group's round wait for our parts; we are
   * still computing ours (DiLoCo: a slower bee's inner steps).  Only
   * until AHEAD_WAIT_LATE_MS after our round was expected: a worker stuck
   * past that is dropped by their sender timeout, as a dead member,
   * rather than hold their round to its deadline. */
  if (o->ahead.state == AHEAD_HELD &&
      now_ms - o->ahead.wait_ms >= AHEAD_WAIT_MS &&
      now_ms < o->ahead.ready_ms + AHEAD_WAIT_LATE_MS) {
    o->ahead.wait_ms = now_ms;
    o->io->wait(o->io->ctx, &o->ahead.g);
  }
}
