/* run.c: the run core's events and tick (run.h), which tie its parts
 * together (run-int.h says which part holds what).
 *
 * Every BEE_RUN_TICK_MS the tick folds the worker's new samples into the
 * rate, publishes the progress record when progress.c says it is due and
 * the donor record when what it says changed, reads the others' records
 * every VIEW_MS, starts the round the worker waits for or the matchmaking
 * ahead of it, tells the members of a group formed ahead that we are
 * coming, and reads the peers' metrics for the split check or the
 * resync.  A read of the records makes the view; from it the core
 * decides whether the bee is behind (a download), whether training may
 * start (--min-peers, a peer seen, or alone long enough after joining),
 * and whether a matchmaking waits for an epoch nobody else may come to.
 * A download's outcome goes to the worker (the state), the rounds (a
 * matchmaking it made moot) and the start.
 */
#include "run-int.h"

static uint64_t now(const bee_run *r) { return r->io.now_ms(r->io.ctx); }
static uint64_t unix_ms(const bee_run *r) { return r->io.unix_ms(r->io.ctx); }

static void round_over(void *ctx, const bee_run_result *res);

int bee_run_new(const bee_run_config *c, const bee_run_io *io, bee_run **out) {
  bee_run *r = calloc(1, sizeof *r);
  if (!r)
    return -ENOMEM;
  r->cfg = c->cfg;
  r->io = *io;
  bee__view_init(&r->view, c->cfg, c->self_id);
  bee__fetch_init(&r->fetch, c->cfg, &r->io, &r->view, c->state_bytes,
                  c->step_bytes, c->chunk_bytes, c->self_id);
  bee__lines_init(&r->lines, c->cfg, &r->io);
  bee__rounds_init(&r->rounds, c->cfg, &r->io, round_over, r);
  r->rounds.take_steps = r->fetch.step_bytes != 0;
  *out = r;
  return 0;
}

void bee_run_free(bee_run *r) {
  if (!r)
    return;
  bee__rounds_close(&r->rounds);
  bee__lines_close(&r->lines);
  bee__fetch_close(&r->fetch);
  bee__view_close(&r->view);
  free(r);
}

void bee_run_start(bee_run *r) {
  r->started = true;
  r->started_ms = now(r);
  r->status_ms = r->started_ms;
  if (!r->joined && r->cfg->njoin == 0 && !r->expect_join) {
    r->joined = true;
    r->joined_ms = r->started_ms;
  }
}

void bee_run_expect_join(bee_run *r) { r->expect_join = true; }

void bee_run_joined(bee_run *r) {
  if (r->joined)
    return;
  r->joined = true;
  r->joined_ms = now(r);
}

void bee_run_halt(bee_run *r) {
  if (r && r->rounds.ahead.state != AHEAD_NONE)
    bee__rounds_drop(&r->rounds, "the bee stops");
}

void bee_run_stop(bee_run *r) {
  if (!r)
    return;
  r->stopped = r->rounds.stopped = true;
  r->fetch.on = false;
}

/* ---- the progress record ------------------------------------------------ */

static void own_progress(const bee_run *r, uint64_t epoch, uint64_t samples,
                         proto_progress *p) {
  memset(p, 0, sizeof *p);
  snprintf(p->run, sizeof p->run, "%s", r->cfg->run);
  p->epoch = epoch;
  p->samples = samples;
  p->samples_per_second = bee_rate_get(&r->rate);
  p->time_ms = unix_ms(r);
  p->mode = r->cfg->client ? PROTO_MODE_CLIENT : PROTO_MODE_NODE;
  snprintf(p->label, sizeof p->label, "%s", r->cfg->label);
}

static void publish(bee_run *r, uint64_t epoch, uint64_t samples) {
  proto_progress p;
  own_progress(r, epoch, samples, &p);
  uint64_t t = now(r), wall = p.time_ms / 1000;
  if (!bee_progress_due(&r->pub, t, wall, epoch, samples))
    return;
  bee_publisher was = r->pub;
  uint64_t exp = bee_progress_published(&r->pub, t, wall, epoch, samples);
  int rc = r->io.put_progress(r->io.ctx, &p, exp);
  if (rc) {
    r->pub = was;
    bee_debug(COMP, "progress not published: %s", bee_strerror(rc));
    return;
  }
  r->put_busy = true;
}

void bee_run_progress_stored(bee_run *r, int status) {
  r->put_busy = false;
  if (r->stopped || status == BEE_ECANCELED)
    return;
  if (status && !r->put_warned) {
    r->put_warned = true; /* once until it works again */
    bee_warn(COMP, "progress not published: %s", bee_strerror(status));
  } else if (!status) {
    r->put_warned = false;
  }
}

void bee_run_leave_record(bee_run *r, proto_progress *p, uint64_t *exp_s) {
  bee_run_worker w;
  r->io.worker(r->io.ctx, &w);
  own_progress(r, w.epoch, w.samples, p);
  p->leaving = true;
  p->samples_per_second = 0;
  *exp_s = bee_progress_published(&r->pub, now(r), p->time_ms / 1000, w.epoch,
                                  w.samples);
}

/* ---- the donor record ------------------------------------------------- */

/* Advertises the snapshot we serve under "<run>_donors": its epoch and
 * the downloads we would start now; again when either changes (at most
 * once a second) and every DONOR_REFRESH_MS.  A client (behind NAT)
 * serves nobody and says nothing. */
static void publish_donor(bee_run *r, const bee_run_worker *w, uint64_t t) {
  if (!w->snap || r->cfg->client || r->donor_busy)
    return;
  uint64_t epoch = w->snap_epoch;
  uint64_t slots = r->io.free_slots(r->io.ctx);
  if (r->donor_any && t - r->donor_ms < 1000)
    return;
  if (r->donor_any && epoch == r->donor_epoch && slots == r->donor_slots &&
      t - r->donor_ms < DONOR_REFRESH_MS)
    return;
  proto_donor d = {.epoch = epoch, .slots = slots};
  snprintf(d.run, sizeof d.run, "%s", r->cfg->run);
  /* The DHT keeps the record with the later expiration. */
  uint64_t exp = unix_ms(r) / 1000 + DONOR_TTL_S;
  if (exp <= r->donor_exp)
    exp = r->donor_exp + 1;
  if (r->io.put_donor(r->io.ctx, &d, exp) != 0)
    return;
  r->donor_busy = r->donor_any = true;
  r->donor_epoch = epoch;
  r->donor_slots = slots;
  r->donor_ms = t;
  r->donor_exp = exp;
}

void bee_run_donor_stored(bee_run *r, int status) {
  r->donor_busy = false;
  if (status && status != BEE_ECANCELED && !r->stopped)
    bee_debug(COMP, "donor record not published: %s", bee_strerror(status));
}

/* ---- training's start, downloads ------------------------------------- */

static void set_go(bee_run *r) {
  bee_run_worker w;
  r->io.worker(r->io.ctx, &w);
  uint64_t epoch = w.load ? w.load_epoch : w.epoch;
  r->io.go(r->io.ctx);
  if (!w.go)
    bee_info(COMP, "training starts at epoch %llu", (unsigned long long)epoch);
}

static void step_fetched(bee_run *r, int rc);
static void step_wait_check(bee_run *r);

/* What a download's step came to: the state and the swarm's steps since
 * go to the worker, which trains on from the last; a matchmaking for an
 * epoch before that ends (moot). */
static void fetched(bee_run *r, int rc) {
  bee_fetch *f = &r->fetch;
  if (rc == FETCH_NOT_YET) { /* a poll's: asked again at a tick */
    step_wait_check(r);
    return;
  }
  if (rc == FETCH_STEP || rc == FETCH_NO_STEP) {
    step_fetched(r, rc);
  } else if (rc == FETCH_LOADED) {
    uint64_t epoch = f->state_epoch;
    r->io.load(r->io.ctx, f->state, f->state_bytes, epoch);
    f->state = NULL;
    for (size_t i = 0; i < f->nsteps; i++, epoch++)
      r->io.replay(r->io.ctx, f->steps[i].buf, f->steps[i].len,
                   f->steps[i].epoch);
    r->steps_taken += f->nsteps;
    f->nsteps = 0;
    set_go(r);
    bee__rounds_moot(&r->rounds, epoch);
  } else if (rc == FETCH_GAVE_UP) {
    set_go(r);
  }
}

/* Whether the round that just ended (res) missed the swarm's step, and
 * that step may be taken instead: an update round that averaged nothing
 * for this bee (alone, no group, or its group went on without it), no
 * download under way, and no state on its way to the worker (it replaces
 * the step).  In groups of --group-size no step is the swarm's. */
static bool step_may(bee_run *r, const bee_run_result *res,
                     const bee_run_worker *w) {
  return !r->stopped && r->fetch.step_bytes && !r->fetch.on &&
         !r->view.guide.grouped && (res->status != 0 || res->left) &&
         res->status != BEE_ECANCELED && !w->round_state && !w->load;
}

/* The swarm's step of epoch is there to take: the swarm has stepped past
 * it, and there are donors to ask. */
static bool step_there(const bee_run *r, uint64_t epoch) {
  return r->view.view.epoch > epoch && r->view.ndonors;
}

/* Its peers are still at epoch (their round runs, or they compute): the
 * step is to come.  Peers of another layout, never in its group, do not
 * count. */
static bool step_coming(const bee_run *r, uint64_t epoch) {
  return r->view.view.epoch == epoch && r->alike_epoch == epoch &&
         r->alike_at_epoch > 0;
}

/* The other peers of its layout at the view's epoch (step_coming). */
static void count_alike(bee_run *r, const proto_progress *all,
                        const uint8_t (*ids)[PROTO_ID_BYTES], size_t n) {
  const bee_lines *l = &r->lines;
  uint64_t epoch = r->view.view.epoch;
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    if (all[i].epoch != epoch || all[i].leaving ||
        strcmp(all[i].run, r->cfg->run) != 0 ||
        memcmp(ids[i], r->view.self, PROTO_ID_BYTES) == 0)
      continue;
    bool other = false;
    for (size_t j = 0; j < l->nlayout_warned && !other; j++)
      other = memcmp(l->layout_warned[j], ids[i], PROTO_ID_BYTES) == 0;
    k += !other;
  }
  r->alike_epoch = epoch;
  r->alike_at_epoch = k;
}

/* A round of the epoch runs without this bee: its group went on without
 * it, or a group had formed without it (res->formed, run.h).  Without
 * that, peers still at the epoch may have missed as well (matchmakings
 * that all timed out), and waiting for their step would have each wait
 * for the others. */
static bool round_without(const bee_run_result *res) {
  return res->left || res->formed;
}

static void take_swarm_step(bee_run *r, uint64_t epoch, bool poll) {
  fetched(r, bee__fetch_step(&r->fetch,
                             (const uint8_t(*)[PROTO_ID_BYTES])r->view.donors,
                             r->view.ndonors, epoch, poll));
}

/* The rounds' end (bee__rounds_init's over): to the worker, or first the
 * swarm's step for a round that missed it, so that the bee takes the
 * step its peers took and stays in line, its own samples left out,
 * rather than step alone and download the state after.  Where its peers
 * are still at the epoch (a group that formed without it, whose round
 * runs on), it waits for their step. */
static void round_over(void *ctx, const bee_run_result *res) {
  bee_run *r = ctx;
  bee_run_worker w;
  r->io.worker(r->io.ctx, &w);
  uint64_t epoch = w.round_epoch;
  bool there = step_there(r, epoch);
  if (!step_may(r, res, &w) ||
      (!there && !(step_coming(r, epoch) && round_without(res)))) {
    r->io.round_over(r->io.ctx, res);
    return;
  }
  r->missed = *res;
  r->missed.summary = NULL; /* borrowed for the call only */
  r->rounds.taking_step = true;
  const char *why =
      res->status ? bee_strerror(res->status) : "its group went on without it";
  if (there) {
    bee_info(COMP,
             "epoch %llu: its round missed the swarm's (%s): taking the "
             "swarm's step instead",
             (unsigned long long)epoch, why);
    take_swarm_step(r, epoch, false);
    return;
  }
  r->step_waits = true;
  r->step_wait_epoch = epoch;
  r->step_wait_until = now(r) + STEP_WAIT_MS;
  r->step_poll_ms = now(r) + STEP_POLL_MS;
  bee_info(COMP,
           "epoch %llu: its round missed the swarm's (%s), whose %zu "
           "other peers are still at the epoch: waiting for their step",
           (unsigned long long)epoch, why, r->alike_at_epoch);
}

/* While a round's end waits for its peers' step (step_waits), the donors
 * are asked for it every STEP_POLL_MS: each answers at once whether it
 * has stepped, where their records say so a second or two later
 * (records go out about once a second, and are read once a second). */
static void step_poll(bee_run *r, uint64_t t) {
  if (!r->step_waits || r->stopped || r->fetch.on || t < r->step_poll_ms ||
      !step_coming(r, r->step_wait_epoch))
    return;
  r->step_poll_ms = t + STEP_POLL_MS;
  take_swarm_step(r, r->step_wait_epoch, true);
}

/* A round's end held for its peers' step (step_waits), at each view
 * read (and at each tick, for the wait's end where reads fail): the step
 * is taken once they are past the epoch; the round's own end goes to the
 * worker if they leave it otherwise, a download starts, or the wait is
 * over. */
static void step_wait_check(bee_run *r) {
  if (!r->step_waits || (!r->stopped && r->fetch.on && r->fetch.poll))
    return; /* a poll's answer decides first */
  uint64_t epoch = r->step_wait_epoch;
  if (!r->stopped && !r->fetch.on && step_there(r, epoch)) {
    r->step_waits = false;
    bee_info(COMP, "epoch %llu: its peers stepped: taking the swarm's step",
             (unsigned long long)epoch);
    take_swarm_step(r, epoch, false);
    return;
  }
  if (!r->stopped && !r->fetch.on && step_coming(r, epoch) &&
      now(r) < r->step_wait_until)
    return;
  r->step_waits = false;
  r->rounds.taking_step = false;
  bee_info(COMP,
           "epoch %llu: no step of its peers to take (%s): its own stands",
           (unsigned long long)epoch,
           r->stopped              ? "stopping"
           : r->fetch.on           ? "a download runs"
           : step_coming(r, epoch) ? "they did not step in time"
                                   : "they left the epoch");
  r->io.round_over(r->io.ctx, &r->missed);
}

/* The swarm's step for the round that missed it came (FETCH_STEP) or not
 * (FETCH_NO_STEP): the worker gets it as the round's mean, or the round's
 * own end. */
static void step_fetched(bee_run *r, int rc) {
  bee_fetch *f = &r->fetch;
  if (r->step_waits) { /* a poll's */
    r->step_waits = false;
    r->steps_polled += rc == FETCH_STEP;
    bee_info(COMP,
             "epoch %llu: its peers stepped: their step came from the "
             "donors it asked",
             (unsigned long long)r->step_wait_epoch);
  }
  r->rounds.taking_step = false;
  bee_run_result res = r->missed;
  if (rc == FETCH_STEP && f->steps[0].buf) {
    res = (bee_run_result){.status = 0,
                           .by_all = 1,
                           .done_ms = res.done_ms,
                           .bytes_sent = res.bytes_sent,
                           .bytes_recv = res.bytes_recv,
                           .swarm = true,
                           .step = f->steps[0].buf,
                           .step_len = f->steps[0].len};
    r->steps_taken++;
  } else if (rc == FETCH_STEP) {
    bee_info(COMP,
             "the swarm's step of epoch %llu changed nothing: this "
             "bee's own step stands",
             (unsigned long long)f->steps[0].epoch);
  }
  r->io.round_over(r->io.ctx, &res);
  for (size_t i = 0; i < f->nsteps; i++)
    free(f->steps[i].buf);
  f->nsteps = 0;
}

static void start_fetch(bee_run *r, const uint8_t (*donors)[PROTO_ID_BYTES],
                        size_t n) {
  fetched(r, bee__fetch_start(&r->fetch, donors, n));
}

void bee_run_donors_read(bee_run *r, int status, const proto_donor *v,
                         const uint8_t (*ids)[PROTO_ID_BYTES], size_t n) {
  if (r->stopped)
    return;
  fetched(r, bee__fetch_donors(&r->fetch, status, v, ids, n));
}

void bee_run_chunk(bee_run *r, uint64_t tag, int status, int64_t remote_code,
                   const proto_state_msg *m) {
  if (r->stopped)
    return;
  fetched(r, bee__fetch_chunk(&r->fetch, tag, status, remote_code, m));
}

/* ---- the view ------------------------------------------------------------ */

static size_t view_set(bee_run *r, proto_progress *all,
                       const uint8_t (*ids)[PROTO_ID_BYTES], size_t n,
                       const bee_run_worker *w) {
  proto_progress own;
  own_progress(r, w->epoch, w->samples, &own);
  size_t fresh = bee__view_set(&r->view, all, ids, n, &own, w, r->fetch.on,
                               bee__fetch_join_s(&r->fetch), now(r));
  r->io.guide(r->io.ctx, &r->view.guide);
  return fresh;
}

/* Right after a step whose group the view counts at the new epoch
 * (bee__view_stepped), the view again from the last read's records. */
static void view_again(bee_run *r) {
  /* Only for a group to count: in a swarm whose epochs are shorter than
   * STEPPED_MIN_EPOCH_S a view after every step would start a
   * matchmaking ahead at every step, and there the bees fell out of step
   * and raced through thousands of epochs alone. */
  bee_view *v = &r->view;
  if (!v->have || v->nstepped == 0)
    return;
  proto_progress *all = malloc((v->nseen + 1) * sizeof *all);
  if (!all)
    return; /* the next read's view comes within VIEW_MS */
  if (v->nseen)
    memcpy(all, v->seen, v->nseen * sizeof *all);
  bee_run_worker w;
  r->io.worker(r->io.ctx, &w);
  view_set(r, all, (const uint8_t(*)[PROTO_ID_BYTES])v->seen_ids, v->nseen, &w);
  free(all);
}

static void log_view(const bee_run *r) {
  const proto_swarm_view *w = &r->view.view;
  char eta[32];
  if (w->eta_s < 0)
    snprintf(eta, sizeof eta, "unknown");
  else
    snprintf(eta, sizeof eta, "%.1f s", w->eta_s);
  bee_info(COMP,
           "swarm: epoch %llu, %llu of %u samples (%zu of %zu peers at the "
           "epoch), %.0f samples/s, target in %s; here %.0f samples/s",
           (unsigned long long)w->epoch, (unsigned long long)w->samples,
           r->cfg->target_batch_size, w->peers_at_epoch, w->peers,
           w->samples_per_second, eta, bee_rate_get(&r->rate));
}

/* Whether training may start now, for a bee that has not started: all
 * --min-peers there; a peer seen; or, after joining, alone for
 * START_WAIT_MS (the run starts here).  Without a --join target that
 * answered, alone it would start a run of its own, apart from the
 * swarm's for good: it waits, and says so. */
static void maybe_go(bee_run *r, uint64_t t) {
  const proto_swarm_view *w = &r->view.view;
  if (r->cfg->min_peers > 1) {
    if (w->peers >= r->cfg->min_peers) {
      set_go(r);
    } else if (t - r->wait_logged_ms >= 10000) {
      r->wait_logged_ms = t;
      bee_info(COMP, "waiting for %u bees in the run (--min-peers); %zu so far",
               r->cfg->min_peers, w->peers);
    }
  } else if (w->peers > 1) {
    set_go(r); /* level with the swarm */
  } else if (r->joined) {
    uint64_t since =
        r->joined_ms > r->started_ms ? r->joined_ms : r->started_ms;
    if (t - since >= START_WAIT_MS)
      set_go(r);
  } else if (t - r->wait_logged_ms >= 10000) {
    r->wait_logged_ms = t;
    bee_info(COMP,
             "training waits until a --join target or a known peer "
             "answers (%zu given)",
             r->cfg->njoin);
  }
}

/* Progress takes a second or two to travel through the DHT: an epoch the
 * swarm finishes faster than that cannot be shared.  Said once. */
static void warn_short(bee_run *r) {
  const proto_swarm_view *w = &r->view.view;
  const bee_config *c = r->cfg;
  bool outer = c->averaging == BEE_AVG_DILOCO;
  double rate = bee_rate_get(&r->rate);
  double epoch_s = w->samples_per_second > 0
                       ? c->target_batch_size / w->samples_per_second
                       : 1e9;
  if (outer) /* DiLoCo: a round after this bee's local steps */
    epoch_s = rate > 0 ? bee_config_inner_steps(c) * c->batch_size / rate : 1e9;
  if (w->peers <= 1 || epoch_s >= MIN_EPOCH_S || r->short_warned)
    return;
  r->short_warned = true;
  bee_warn(COMP,
           "the swarm (%zu peers, %.0f samples/s) %s in %.2f s, less than "
           "the %.0f s progress needs to travel through the DHT: epochs "
           "may hold more or less than the target, and a bee that joins "
           "or falls behind may step alone; give %s %.0f or more",
           w->peers, w->samples_per_second,
           outer ? "reaches a round" : "gathers the target batch", epoch_s,
           MIN_EPOCH_S, outer ? "--inner-steps" : "--target-batch-size",
           outer ? ceil(MIN_EPOCH_S * rate / c->batch_size)
                 : ceil(MIN_EPOCH_S * w->samples_per_second));
}

void bee_run_progress_read(bee_run *r, int status, const proto_progress *v,
                           const uint8_t (*ids)[PROTO_ID_BYTES], size_t n) {
  r->get_busy = false;
  if (r->stopped || status == BEE_ECANCELED)
    return;
  if (status) /* not found (no record yet, or no peer): ours alone */
    n = 0;
  proto_progress *all = calloc(n + 1, sizeof *all);
  if (!all)
    return;
  if (n)
    memcpy(all, v, n * sizeof *all);
  bee__view_keep(&r->view, all, ids, n);
  bee_run_worker w;
  r->io.worker(r->io.ctx, &w);
  size_t fresh = view_set(r, all, ids, n, &w);
  uint64_t epoch = w.epoch;
  if (status == 0) /* a failed read says nothing of the others */
    bee__rounds_deserted(&r->rounds, &r->view, all, n, fresh);
  else
    r->rounds.deserted = 0;
  free(all);
  r->view.have = true;
  if (status == 0) { /* a failed read says nothing of the others */
    count_alike(r, v, ids, n);
    step_wait_check(r);
  }
  /* Behind the swarm (at start, or more than one epoch later on): the
   * state from a peer at the swarm's epoch. */
  r->io.worker(r->io.ctx, &w);
  if (w.load) /* a state the worker has yet to take */
    epoch = w.load_epoch;
  const proto_swarm_view *sv = &r->view.view;
  bool behind = w.go ? sv->epoch > epoch + 1 : sv->epoch > epoch;
  uint64_t t = now(r);
  /* After a download the swarm is ahead by what it did meanwhile: the bee
   * catches up by stepping at once, and another download at once would
   * only come back as far behind. */
  if (w.go && t < r->fetch.settle_ms)
    behind = false;
  if (behind && r->view.ndonors && !r->fetch.on) {
    if (t >= r->fetch.retry_ms) /* not while every donor was busy */
      start_fetch(r, (const uint8_t(*)[PROTO_ID_BYTES])r->view.donors,
                  r->view.ndonors);
  } else if (!w.go && !r->fetch.on) {
    maybe_go(r, t);
  }
  warn_short(r);
  if (behind && !r->view.ndonors && r->behind_warned != sv->epoch) {
    r->behind_warned = sv->epoch;
    bee_warn(COMP,
             "behind the swarm (epoch %llu here, %llu there) and no peer "
             "there serves its state",
             (unsigned long long)epoch, (unsigned long long)sv->epoch);
  }
}

/* ---- the split check and the resync -------------------------------------- */

void bee_run_metrics_read(bee_run *r, int which, int status,
                          const proto_metrics *v,
                          const uint8_t (*ids)[PROTO_ID_BYTES], size_t n) {
  if (which == BEE_RUN_METRICS_SPLIT)
    r->lines.split_busy = false;
  else
    r->lines.resync_busy = false;
  if (r->stopped || status || r->fetch.on)
    return;
  bee_run_worker w;
  r->io.worker(r->io.ctx, &w);
  if (which == BEE_RUN_METRICS_SPLIT) {
    uint64_t epoch;
    if (!w.diverged && !w.load &&
        bee__lines_split(&r->lines, v, ids, n, &epoch))
      r->io.mark_diverged(r->io.ctx, epoch);
    return;
  }
  if (!w.diverged || w.load)
    return;
  uint8_t good[DONORS_MAX][PROTO_ID_BYTES];
  size_t k =
      bee__lines_resync(&r->lines, v, ids, n, w.diverged_epoch, &r->view, good);
  size_t others;
  if (k == 0 && bee__lines_orphaned(&r->lines, v, ids, n, r->view.view.epoch,
                                    r->view.self, &others)) {
    bee_warn(COMP,
             "epoch %llu: no peer of the run is in line (%zu others out of "
             "line too): this bee's parameters become its line, for the "
             "others to load",
             (unsigned long long)w.diverged_epoch, others);
    r->orphans++;
    r->io.adopt_line(r->io.ctx);
    return;
  }
  if (k == 0)
    return; /* none yet: asked again in RESYNC_MS */
  if (r->lines.nsplit)
    bee_info(COMP,
             "epoch %llu: loading the state of the line that goes on (%zu "
             "of its peers at the swarm's epoch)",
             (unsigned long long)w.diverged_epoch, k);
  else
    bee_info(COMP,
             "epoch %llu was stepped here without the round its peers "
             "averaged: loading their state (%zu of them at the swarm's "
             "epoch)",
             (unsigned long long)w.diverged_epoch, k);
  r->resyncs++;
  start_fetch(r, (const uint8_t(*)[PROTO_ID_BYTES])good, k);
}

void bee_run_other_layout(bee_run *r, const uint8_t id[PROTO_ID_BYTES]) {
  bee__lines_other_layout(&r->lines, id);
}

/* ---- rounds ------------------------------------------------------------- */

void bee_run_matched(bee_run *r, int status, const avg_group *g) {
  bee__rounds_matched(&r->rounds, &r->view, status, g);
}

void bee_run_round_done(bee_run *r, const avg_node_result *res) {
  bee__rounds_done(&r->rounds, &r->view, res);
}

void bee_run_stepped(bee_run *r, const bee_run_step *steps, size_t n) {
  for (size_t i = 0; i < n && !r->stopped; i++)
    bee__lines_publish(&r->lines, &steps[i], bee_rate_get(&r->rate));
  /* Stepped: the view at the new epoch now, with the group's members
   * there too, not after the next read finds their records. */
  if (n && !r->stopped)
    view_again(r);
  bee__rounds_start(&r->rounds, &r->view); /* the worker may wait for one */
}

/* ---- the tick ----------------------------------------------------------- */

void bee_run_tick(bee_run *r, uint64_t samples, double compute_s) {
  uint64_t t = now(r);
  bee_rate_add(&r->rate, samples, compute_s);
  if (!r->started || r->stopped)
    return;
  bee_run_worker w;
  r->io.worker(r->io.ctx, &w);
  if (!r->put_busy)
    publish(r, w.epoch, w.samples);
  publish_donor(r, &w, t);
  if (!r->get_busy && t - r->last_get_ms >= VIEW_MS) {
    r->last_get_ms = t;
    r->get_busy = true;
    if (r->io.get_progress(r->io.ctx) != 0)
      bee_run_progress_read(r, -ENOENT, NULL, NULL, 0);
  }
  if (r->step_waits && t >= r->step_wait_until)
    step_wait_check(r);
  step_poll(r, t);
  if (r->fetch.on)
    fetched(r, bee__fetch_tick(&r->fetch));
  bee__rounds_start(&r->rounds, &r->view);
  bee__rounds_ahead(&r->rounds, &r->view, bee_rate_get(&r->rate), now(r));
  bee__rounds_tick(&r->rounds, now(r));
  /* Out of line: the metrics of the peers that hold the swarm's state;
   * in line, now and then, for a split. */
  if (!r->fetch.on && t >= r->fetch.retry_ms) {
    r->io.worker(r->io.ctx, &w);
    bee__lines_check(&r->lines, w.diverged && w.go && !w.load,
                     r->view.guide.grouped, r->view.view.peers, t, RESYNC_MS);
  }
  unsigned every = r->cfg->status_interval_s;
  if (every && r->view.have && t - r->status_ms >= every * 1000ull) {
    r->status_ms = t;
    log_view(r);
  }
}

/* ---- read-outs and the worker's decisions --------------------------------- */

const proto_swarm_view *bee_run_view(const bee_run *r) { return &r->view.view; }

double bee_run_rate(const bee_run *r) { return bee_rate_get(&r->rate); }

bool bee_run_downloading(const bee_run *r) { return r->fetch.on; }

void bee_run_stats_get(const bee_run *r, bee_run_stats *st) {
  st->downloads = r->fetch.loads;
  st->download_bytes = r->fetch.bytes;
  st->splits = r->lines.splits;
  st->resyncs = r->resyncs;
  st->orphans = r->orphans;
  st->last_download_s = r->fetch.last_s;
  st->steps_taken = r->steps_taken;
  st->steps_polled = r->steps_polled;
}

double bee_run_others_now(const bee_run_guide *g, uint64_t now_ms) {
  return bee__guide_others_now(g, now_ms);
}

/* DiLoCo: a bee more than OUTER_LAG_MIN_S from its inner steps' end
 * when the other peers at its epoch have taken theirs (it loaded the
 * state late in the round, or it is slower) takes its round with the
 * steps it has, weighed by its samples, rather than step alone after the
 * others' round and load their state again. */
static bool outer_lags(const bee_run_guide *g, uint64_t epoch, uint64_t samples,
                       uint64_t want, uint64_t now_ms) {
  if (samples == 0 || samples >= want || !g->others_due_ms ||
      !(g->own_rate > 0) || g->view.epoch != epoch)
    return false;
  double own_left = (double)(want - samples) / g->own_rate;
  return own_left > OUTER_LAG_MIN_S && now_ms >= g->others_due_ms;
}

bool bee_run_step_due(const bee_config *cfg, const bee_run_guide *g,
                      uint64_t epoch, uint64_t samples, uint64_t now_ms) {
  if (cfg->averaging == BEE_AVG_DILOCO) {
    /* The round comes after --inner-steps local steps, when the swarm has
     * stepped past, or when the others at the epoch are done and this bee
     * is far from it; the others' samples do not count. */
    uint64_t inner = (uint64_t)bee_config_inner_steps(cfg) * cfg->batch_size;
    return bee_epoch_ready(epoch, samples, &g->view, 0, inner) ||
           outer_lags(g, epoch, samples, inner, now_ms);
  }
  uint64_t others = (uint64_t)bee__guide_others_now(g, now_ms);
  return bee_epoch_ready(epoch, samples, &g->view, others,
                         cfg->target_batch_size);
}

bool bee_run_step_diverges(const bee_run_guide *g, uint64_t epoch,
                           uint64_t samples, int status, bool left) {
  /* A step with this bee's own samples but without the round the peers
   * at the epoch averaged leaves the swarm's parameters until their state
   * is loaded (the resync); a full state round brings them back too.  A
   * round its group finished without this bee (left) marks it as well:
   * their step is not this one.  An empty step (no samples, no round: a
   * bee catching up with a swarm one epoch past the state it loaded)
   * changes nothing, which leaves the bee one step short of its peers: it
   * is marked when a download fits in one of the swarm's epochs
   * (join_fits), so their state comes at once; in a swarm whose epochs
   * are shorter than that, marking it would load, fall one behind and
   * load again forever, so there the next round's split check (or a
   * state round) catches it. */
  if (g->grouped)
    return false; /* no line to leave: the next state round mixes */
  bool empty_behind =
      samples == 0 && status != 0 && g->view.epoch > epoch && g->join_fits;
  return (status != 0 && (samples > 0 || empty_behind) && g->view.peers > 1) ||
         left;
}
