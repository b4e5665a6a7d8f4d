/* train-swarm.c: a bee's run in the DHT and its averaging: the progress
 * record it publishes and the swarm view it reads back (progress.c makes
 * the decisions), the metrics record per epoch, the matchmaking's
 * declarations, the round the worker waits for at each step, and the
 * loop's tick that drives them.
 */
#include "train-int.h"

/* ---- progress in the DHT (loop thread) ---------------------------------- */

void bee__own_progress(bee_train *t, uint64_t epoch, uint64_t samples,
                         proto_progress *p) {
  memset(p, 0, sizeof *p);
  snprintf(p->run, sizeof p->run, "%s", t->cfg->run);
  p->epoch = epoch;
  p->samples = samples;
  p->samples_per_second = bee_rate_get(&t->rate);
  p->time_ms = wall_ms();
  p->mode = t->cfg->client ? PROTO_MODE_CLIENT : PROTO_MODE_NODE;
  snprintf(p->label, sizeof p->label, "%s", t->cfg->label);
}

static void put_cb(dht_node *n, int status, unsigned stored,
                   const dht_stats *st, void *arg) {
  (void)n, (void)stored, (void)st;
  bee_train *t = arg;
  t->put_busy = false;
  if (t->stopped || status == BEE_ECANCELED)
    return;
  if (status && !t->put_warned) {
    t->put_warned = true; /* once until it works again */
    bee_warn(COMP, "progress not published: %s", bee_strerror(status));
  } else if (!status) {
    t->put_warned = false;
  }
}

static void publish(bee_train *t, uint64_t epoch, uint64_t samples) {
  proto_progress p;
  uint8_t buf[PROTO_RECORD_MAX];
  size_t len;
  bee__own_progress(t, epoch, samples, &p);
  uint64_t now = uv_now(t->loop), wall = p.time_ms / 1000;
  if (!bee_progress_due(&t->pub, now, wall, epoch, samples))
    return;
  int rc = proto_progress_encode(&p, buf, sizeof buf, &len);
  if (rc) { /* our own fields: checked at start-up, so a bug */
    bee_err(COMP, "progress record: %s", bee_strerror(rc));
    return;
  }
  bee_publisher was = t->pub;
  uint64_t exp = bee_progress_published(&t->pub, now, wall, epoch, samples);
  rc = dht_put(t->dht, t->key, (proto_bytes){t->sub, sizeof t->sub},
               (proto_bytes){buf, len}, exp, put_cb, t);
  if (rc) {
    t->pub = was;
    bee_debug(COMP, "progress not published: %s", bee_strerror(rc));
    return;
  }
  t->put_busy = true;
}

/* A matchmaking for an epoch the swarm has left: nobody else is there to
 * come to its group (bee_round_deserted over the others' records, two
 * reads of them in a row, lest a missed record end it; a read that
 * failed counts for nothing).  A bee that finds itself there (it
 * stalled, or loaded a state and asked for that epoch's round while the
 * others were already in theirs) would otherwise wait out
 * --matchmaking-time and its grace for nobody, and in a swarm whose
 * epochs are about that long, fall behind again each time.  It ends now:
 * the candidates at the worker's epoch are counted afresh (fresh, so no
 * new matchmaking starts there), and the worker steps alone ("alone at
 * its epoch"); if the peers averaged that epoch without it, it then loads
 * their state (bee__resync). */
static void end_deserted(bee_train *t, const proto_progress *others,
                         size_t n, uint64_t now_ms, size_t fresh) {
  uint64_t epoch;
  bool delayed = t->dgrad != NULL, round = false;
  if (t->averaging && avg_node_matching(t->avg)) {
    uv_mutex_lock(&t->mu);
    epoch = t->sh.avg_epoch;
    delayed &= !t->sh.avg_state; /* the state travels at the epoch's start */
    uv_mutex_unlock(&t->mu);
    round = true;
  } else if (t->ahead.state == AHEAD_MATCHING) {
    epoch = t->ahead.epoch;
  } else {
    t->deserted = 0;
    return;
  }
  if (epoch != t->deserted_epoch)
    t->deserted = 0;
  t->deserted_epoch = epoch;
  if (!bee_round_deserted(others, n, t->cfg->run, epoch, delayed, now_ms)) {
    t->deserted = 0;
    return;
  }
  if (++t->deserted < DESERTED_VIEWS)
    return;
  t->deserted = 0;
  bee_info(COMP,
           "epoch %llu: no other peer can come to its group any more (the "
           "swarm is at epoch %llu): its matchmaking ends, the step is "
           "taken alone",
           (unsigned long long)epoch, (unsigned long long)t->view.epoch);
  t->candidates = fresh;
  if (round) {
    t->deserted_cancel = true; /* round_cb runs inside: alone, not failed */
    avg_node_cancel(t->avg);
    t->deserted_cancel = false;
  } else {
    bee__ahead_drop(t, "the swarm left its epoch");
  }
}

/* A state just loaded: the worker takes it once its round is over, so a
 * matchmaking it waits on for that epoch or an earlier one (an epoch it
 * stepped alone, most likely, the swarm gone on) is moot and ends now,
 * lest the worker wait out its --matchmaking-time before it takes the
 * state, and start the swarm's epoch too late to be in its group; the
 * state replaces that step (train.c).  A round already begun finishes:
 * its members count on this bee's part. */
void bee__round_moot(bee_train *t, uint64_t load_epoch) {
  if (!t->averaging || !t->avg || !avg_node_matching(t->avg))
    return;
  uv_mutex_lock(&t->mu);
  uint64_t epoch = t->sh.avg_epoch;
  uv_mutex_unlock(&t->mu);
  if (epoch > load_epoch)
    return; /* a round past the state: not moot */
  bee_info(COMP,
           "epoch %llu: its matchmaking ends: the state of epoch %llu was "
           "loaded",
           (unsigned long long)epoch, (unsigned long long)load_epoch);
  t->deserted_cancel = true; /* round_cb runs inside: alone, not failed */
  avg_node_cancel(t->avg);
  t->deserted_cancel = false;
}

/* Keeps the others' records of a read, owners in ids, for
 * bee__view_again (when memory runs short, none: that view is only
 * sooner). */
static void keep_seen(bee_train *t, const proto_progress *all,
                      const uint8_t (*ids)[PROTO_ID_BYTES], size_t n) {
  t->nseen = 0;
  if (n > t->seen_cap) {
    proto_progress *p = realloc(t->seen, n * sizeof *p);
    if (p)
      t->seen = p;
    uint8_t(*d)[PROTO_ID_BYTES] = realloc(t->seen_ids, n * sizeof *d);
    if (d)
      t->seen_ids = d;
    if (!p || !d)
      return;
    t->seen_cap = n;
  }
  if (n) {
    memcpy(t->seen, all, n * sizeof *all);
    memcpy(t->seen_ids, ids, n * sizeof *ids);
  }
  t->nseen = n;
}

/* The view from the others' records all[0..n) (owners in ids) and our own
 * current progress, written at all[n]: the members of the group this bee
 * just averaged with taken at the epoch they stepped to
 * (bee_progress_stepped), the candidates for the round of our epoch, the
 * donors, and what the worker reads.  Returns the candidates counted
 * afresh. */
static size_t view_set(bee_train *t, proto_progress *all,
                       const uint8_t (*ids)[PROTO_ID_BYTES], size_t n) {
  uv_mutex_lock(&t->mu);
  uint64_t epoch = t->sh.epoch, samples = t->sh.samples;
  bee__own_progress(t, epoch, samples, &all[n]);
  uint64_t now = all[n].time_ms;
  bee_progress_stepped(all, ids, n, t->cfg->run, t->stepped_epoch,
                       t->stepped_ms,
                       (const uint8_t(*)[PROTO_ID_BYTES])t->stepped_ids,
                       t->nstepped, now);
  proto_swarm_view_compute(all, n + 1, t->cfg->run,
                           t->cfg->target_batch_size, now, &t->view);
  /* A read of the DHT may miss a record now and then; at the same epoch
   * the count only grows, lest a round close without a peer that is
   * there (one that is gone costs the round --matchmaking-time). */
  size_t fresh = bee_round_candidates(all, n + 1, t->cfg->run, epoch, now);
  size_t cand = fresh;
  if (t->have_view && t->cand_epoch == epoch && cand < t->candidates)
    cand = t->candidates;
  t->candidates = cand;
  t->cand_epoch = epoch;
  /* Donors: the others at the swarm's epoch that serve (not clients);
   * kept as they are while a download goes through them. */
  if (!t->fetching) {
    t->ndonors = 0;
    for (size_t i = 0; i < n && t->ndonors < DONORS_MAX; i++)
      if (strcmp(all[i].run, t->cfg->run) == 0 && !all[i].leaving &&
          all[i].epoch == t->view.epoch && all[i].mode != PROTO_MODE_CLIENT)
        memcpy(t->donors[t->ndonors++], ids[i], PROTO_ID_BYTES);
  }
  t->sh.view = t->view;
  double es = bee__epoch_s(t);
  t->sh.join_fits = es > bee__join_s(t);
  t->sh.own_rate = all[n].samples_per_second;
  if (t->outer) { /* at our epoch, for the worker; at the swarm's */
    uint64_t want =
        (uint64_t)bee_config_inner_steps(t->cfg) * t->cfg->batch_size;
    double first;
    double due = bee_outer_due(all, n, t->cfg->run, epoch, want, now, &first);
    double sdue = t->view.epoch == epoch
                      ? due
                      : bee_outer_due(all, n, t->cfg->run, t->view.epoch,
                                      want, now, NULL);
    double at = mono_s();
    t->sh.others_due_s = due >= 0 ? at + due : 0;
    t->sh.others_first_s = first >= 0 ? at + first : 0;
    double own_rate = all[n].samples_per_second;
    double own = samples >= want ? 0
                 : own_rate > 0  ? (double)(want - samples) / own_rate
                                 : -1;
    double round = bee_outer_round(all, n, t->cfg->run, epoch, want, now,
                                   own, OUTER_LAG_MIN_S);
    t->sh.round_s = round >= 0 ? at + round : 0;
    t->swarm_due_s = sdue >= 0 ? at + sdue : 0;
    if (due >= 0 && samples < want && all[n].samples_per_second > 0)
      bee_debug(COMP, "epoch %llu: the others' inner steps end in %.1f to "
                      "%.1f s, ours in %.1f s",
                (unsigned long long)epoch, first, due,
                (double)(want - samples) / all[n].samples_per_second);
  }
  bool here = t->view.epoch == epoch;
  t->sh.others = here ? t->view.samples - samples : t->view.samples;
  t->sh.others_rate =
      t->view.rate_at_epoch - (here ? all[n].samples_per_second : 0);
  if (t->sh.others_rate < 0)
    t->sh.others_rate = 0;
  t->sh.view_s = mono_s();
  uv_mutex_unlock(&t->mu);
  return fresh;
}

void bee__view_again(bee_train *t) {
  /* Only for a group to count (note_stepped): in a swarm whose epochs are
   * shorter than STEPPED_MIN_EPOCH_S a view after every step would start
   * a matchmaking ahead at every step, and there (mlp, 4 bees, target
   * 4,096, 15 ms epochs) the bees fell out of step and raced through
   * thousands of epochs alone. */
  if (!t->have_view || t->nstepped == 0)
    return;
  proto_progress *all = malloc((t->nseen + 1) * sizeof *all);
  if (!all)
    return; /* the next read's view comes within VIEW_MS */
  if (t->nseen)
    memcpy(all, t->seen, t->nseen * sizeof *all);
  view_set(t, all, (const uint8_t(*)[PROTO_ID_BYTES])t->seen_ids, t->nseen);
  free(all);
}

/* The swarm view from the records found (v may be NULL) and our own
 * current progress; asks for the epoch step when the target is met. */
static void update_view(bee_train *t, const dht_value *v) {
  size_t cap = 1 + (v ? v->n : 0), n = 0;
  proto_progress *all = malloc(cap * sizeof *all);
  if (!all)
    return;
  uint8_t (*ids)[PROTO_ID_BYTES] = malloc(cap * sizeof *ids);
  if (!ids) {
    free(all);
    return;
  }
  for (size_t i = 0; v && i < v->n; i++) {
    const proto_dht_record *r = &v->records[i];
    if (r->subkey.n != sizeof t->sub)
      continue; /* the DHT checked the owned subkey: not expected */
    if (memcmp(r->subkey.p, t->sub, sizeof t->sub) == 0)
      continue; /* ours: the current one goes in below */
    if (proto_progress_decode(r->value.p, r->value.n, &all[n]) == 0) {
      proto_peer_id(r->subkey.p + 1, ids[n]);
      n++;
    }
  }
  keep_seen(t, all, (const uint8_t(*)[PROTO_ID_BYTES])ids, n);
  size_t fresh = view_set(t, all, (const uint8_t(*)[PROTO_ID_BYTES])ids, n);
  free(ids);
  uint64_t epoch = all[n].epoch; /* ours, at the end */
  if (v) /* a failed read says nothing of the others */
    end_deserted(t, all, n, all[n].time_ms, fresh);
  else
    t->deserted = 0;
  free(all);
  t->have_view = true;
  /* Behind the swarm (at start, or more than one epoch later on): the
   * state from a peer at the swarm's epoch. */
  uv_mutex_lock(&t->mu);
  bool go = t->sh.go;
  if (t->sh.load) /* a state the worker has yet to take */
    epoch = t->sh.load_epoch;
  uv_mutex_unlock(&t->mu);
  bool behind = go ? t->view.epoch > epoch + 1 : t->view.epoch > epoch;
  /* After a download the swarm is ahead by what it did meanwhile: the bee
   * catches up by stepping at once, and another download at once would
   * only come back as far behind. */
  if (go && uv_now(t->loop) < t->fsettle_ms)
    behind = false;
  if (behind && t->ndonors && !t->fetching) {
    if (uv_now(t->loop) >= t->fretry_ms && /* not while every donor was busy */
        !bee__fetch_wait(t))
      bee__start_fetch(t);
  }
  else if (!go && !t->fetching && t->cfg->min_peers > 1) {
    if (t->view.peers >= t->cfg->min_peers) /* --min-peers: all there */
      bee__set_go(t);
    else if (uv_now(t->loop) - t->wait_logged_ms >= 10000) {
      t->wait_logged_ms = uv_now(t->loop);
      bee_info(COMP, "waiting for %u bees in the run (--min-peers); %zu so far",
               t->cfg->min_peers, t->view.peers);
    }
  } else if (!go && !t->fetching && t->view.peers > 1) {
    bee__set_go(t); /* level with the swarm */
  } else if (!go && !t->fetching && t->joined) {
    /* Alone for START_WAIT_MS after joining: the run starts here. */
    uint64_t since = t->joined_ms > t->started_ms ? t->joined_ms : t->started_ms;
    if (uv_now(t->loop) - since >= START_WAIT_MS)
      bee__set_go(t);
  } else if (!go && !t->fetching &&
             uv_now(t->loop) - t->wait_logged_ms >= 10000) {
    /* No --join target has answered: alone, it would start a run of its
     * own, apart from the swarm's for good. */
    t->wait_logged_ms = uv_now(t->loop);
    bee_info(COMP, "training waits until a --join target or a known peer "
             "answers (%zu given)", t->cfg->njoin);
  }
  /* Progress takes a second or two to travel through the DHT: an epoch
   * the swarm finishes faster than that cannot be shared. */
  double epoch_s = t->view.samples_per_second > 0
                       ? t->cfg->target_batch_size / t->view.samples_per_second
                       : 1e9;
  if (t->outer) /* DiLoCo: a round after this bee's local steps */
    epoch_s = bee_rate_get(&t->rate) > 0
                  ? bee_config_inner_steps(t->cfg) * t->cfg->batch_size /
                        bee_rate_get(&t->rate)
                  : 1e9;
  if (t->view.peers > 1 && epoch_s < MIN_EPOCH_S && !t->short_warned) {
    t->short_warned = true;
    bee_warn(COMP,
             "the swarm (%zu peers, %.0f samples/s) %s in %.2f s, less than "
             "the %.0f s progress needs to travel through the DHT: epochs "
             "may hold more or less than the target, and a bee that joins "
             "or falls behind may step alone; give %s %.0f or more",
             t->view.peers, t->view.samples_per_second,
             t->outer ? "reaches a round" : "gathers the target batch",
             epoch_s, MIN_EPOCH_S,
             t->outer ? "--inner-steps" : "--target-batch-size",
             t->outer ? ceil(MIN_EPOCH_S * bee_rate_get(&t->rate) /
                             t->cfg->batch_size)
                      : ceil(MIN_EPOCH_S * t->view.samples_per_second));
  }
  if (behind && !t->ndonors && t->behind_warned != t->view.epoch) {
    t->behind_warned = t->view.epoch;
    bee_warn(COMP,
             "behind the swarm (epoch %llu here, %llu there) and no peer "
             "there serves its state",
             (unsigned long long)epoch, (unsigned long long)t->view.epoch);
  }
}

static void get_cb(dht_node *n, int status, const dht_value *v,
                   const dht_stats *st, void *arg) {
  (void)n, (void)st;
  bee_train *t = arg;
  t->get_busy = false;
  if (t->stopped || status == BEE_ECANCELED)
    return;
  /* Not found (no record yet, or no peer): the view is ours alone. */
  update_view(t, status == 0 ? v : NULL);
}

static void log_view(bee_train *t) {
  const proto_swarm_view *w = &t->view;
  char eta[32];
  if (w->eta_s < 0)
    snprintf(eta, sizeof eta, "unknown");
  else
    snprintf(eta, sizeof eta, "%.1f s", w->eta_s);
  bee_info(COMP,
           "swarm: epoch %llu, %llu of %u samples (%zu of %zu peers at the "
           "epoch), %.0f samples/s, target in %s; here %.0f samples/s",
           (unsigned long long)w->epoch, (unsigned long long)w->samples,
           t->cfg->target_batch_size, w->peers_at_epoch, w->peers,
           w->samples_per_second, eta, bee_rate_get(&t->rate));
}

/* ---- averaging (loop thread) --------------------------------------------- */

/* The matchmaking's declarations live in the DHT as bee.match records. */
static void match_put_cb(dht_node *n, int status, unsigned stored,
                         const dht_stats *st, void *arg) {
  (void)n, (void)stored, (void)st, (void)arg;
  if (status && status != BEE_ECANCELED)
    bee_debug(COMP, "matchmaking declaration not stored: %s",
              bee_strerror(status));
}

void bee__match_declare(void *ctx, const proto_match *info,
                          uint64_t expiration) {
  bee_train *t = ctx;
  uint8_t buf[PROTO_RECORD_MAX], key[PROTO_DHT_KEY_BYTES];
  size_t len;
  if (!t->dht || proto_match_encode(info, buf, sizeof buf, &len))
    return;
  proto_record_key(PROTO_REC_MATCH, info->run, info->round, info->bits, key);
  dht_put(t->dht, key, (proto_bytes){t->sub, sizeof t->sub},
          (proto_bytes){buf, len}, expiration, match_put_cb, NULL);
}

typedef struct fetch_ctx {
  bee_train *t;
  avg_node *node;
} fetch_ctx;

/* A peer of the run declared itself for a round with another layout
 * (another model, averaging mode or optimizer): it is never grouped with
 * us.  Said once per peer, as a warning: it is a misconfiguration. */
static void other_layout(bee_train *t, const uint8_t id[PROTO_ID_BYTES]) {
  for (size_t i = 0; i < t->nlayout_warned; i++)
    if (memcmp(t->layout_warned[i], id, PROTO_ID_BYTES) == 0)
      return;
  if (t->nlayout_warned < LAYOUT_WARNED_MAX)
    memcpy(t->layout_warned[t->nlayout_warned++], id, PROTO_ID_BYTES);
  char id8[9];
  bee_id8(id, id8);
  bee_warn(COMP,
           "%s trains run '%s' with another model, averaging mode, "
           "optimizer or compression: it is never in a group with this bee",
           id8, t->cfg->run);
}

static void match_fetch_cb(dht_node *n, int status, const dht_value *v,
                           const dht_stats *st, void *arg) {
  (void)n, (void)st;
  fetch_ctx *f = arg;
  bee_train *t = f->t;
  if (status == 0 && !t->stopped && t->avg == f->node) {
    avg_decl *d = calloc(v->n ? v->n : 1, sizeof *d);
    size_t k = 0;
    for (size_t i = 0; d && i < v->n; i++) {
      const proto_dht_record *r = &v->records[i];
      if (r->subkey.n != PROTO_DHT_OWNED_SUBKEY_BYTES ||
          proto_match_decode(r->value.p, r->value.n, &d[k].info))
        continue; /* the DHT checked owner and schema: not expected */
      proto_peer_id(r->subkey.p + 1, d[k].id);
      d[k].expiration = r->expiration;
      const uint8_t *want =
          d[k].info.round >= STATE_ROUND ? t->state_schema : t->schema;
      if (memcmp(d[k].info.schema_hash, want, PROTO_SCHEMA_HASH_BYTES) != 0)
        other_layout(t, d[k].id);
      k++;
    }
    if (d)
      avg_node_declared(f->node, d, k);
    free(d);
  }
  free(f);
}

void bee__match_fetch(void *ctx, avg_node *node, const proto_match *info) {
  bee_train *t = ctx;
  uint8_t key[PROTO_DHT_KEY_BYTES];
  fetch_ctx *f = malloc(sizeof *f);
  if (!t->dht || !f) {
    free(f);
    return;
  }
  *f = (fetch_ctx){t, node};
  proto_record_key(PROTO_REC_MATCH, info->run, info->round, info->bits, key);
  if (dht_get(t->dht, key, true, match_fetch_cb, f))
    free(f);
}

/* The group of an update round that ran (g; NULL: none ran, nobody to
 * count): its other members step to epoch now, as this bee does
 * (bee_progress_stepped).  Not in a swarm that
 * gathers its target in less than STEPPED_MIN_EPOCH_S: there the members'
 * start skew and a round's own time are the epoch, and counted from the
 * step they end epochs with a fraction of the target (mlp, 4 bees, target
 * 4,096: epochs of 0.5 to 1 times it, a bee often stepping with no
 * sample of its own); the views then wait for the records, and each bee
 * gathers about the target itself.  Nor with DiLoCo, whose rounds come
 * after local steps, not samples.  Without the memory for the ids, none
 * either. */
static void note_stepped(bee_train *t, const avg_group *g, uint64_t epoch) {
  t->nstepped = 0;
  if (!g || t->outer || !(t->view.samples_per_second > 0) ||
      t->cfg->target_batch_size <
          STEPPED_MIN_EPOCH_S * t->view.samples_per_second)
    return;
  if (g->nmembers > t->stepped_cap) {
    uint8_t(*d)[PROTO_ID_BYTES] =
        realloc(t->stepped_ids, g->nmembers * sizeof *d);
    if (!d)
      return;
    t->stepped_ids = d;
    t->stepped_cap = g->nmembers;
  }
  for (size_t i = 0; i < g->nmembers; i++)
    if (i != g->self)
      memcpy(t->stepped_ids[t->nstepped++], g->members[i].id, PROTO_ID_BYTES);
  t->stepped_epoch = epoch;
  t->stepped_ms = wall_ms();
}

/* The worker's round is over, one way or another: wake it.  The group's
 * samples are the weights its members gave the round (those declared in
 * the matchmaking, when it formed ahead, were estimates). */
static void round_over(bee_train *t, int status, size_t group,
                       double by_all, bool left, const avg_node_result *r) {
  t->averaging = false;
  uv_mutex_lock(&t->mu);
  bool state = t->sh.avg_state;
  uint64_t epoch = t->sh.avg_epoch;
  uv_mutex_unlock(&t->mu);
  if (!state) /* an update round: its group, if it ran */
    note_stepped(t, status == 0 && r ? r->group : NULL, epoch + 1);
  uint64_t batch = 0;
  for (size_t i = 0; r && r->group && i < r->group->nmembers; i++)
    batch += r->summary && i < r->summary->nmembers
                 ? (uint64_t)r->summary->members[i].weight
                 : (uint64_t)r->group->members[i].weight;
  uv_mutex_lock(&t->mu);
  t->sh.avg_req = false;
  t->sh.avg_done = true;
  t->sh.avg_status = status;
  t->sh.avg_group = group;
  t->sh.avg_by_all = by_all;
  t->sh.avg_ahead = t->round_ahead && status == 0;
  t->sh.avg_left = left;
  t->sh.avg_batch = batch;
  t->sh.avg_bytes_sent = r && r->summary ? r->summary->bytes_sent : 0;
  t->sh.avg_bytes_recv = r && r->summary ? r->summary->bytes_recv : 0;
  t->sh.avg_done_s = mono_s();
  uv_cond_signal(&t->avg_cv);
  uv_mutex_unlock(&t->mu);
}

/* An update round (the gradients, or DiLoCo's change) whose spans did not
 * all come back averaged (a member took the parts of its span and did not
 * return the mean) left each member its own values there; stepped with
 * them, the members would part ways.  Zeroed instead, on every member that
 * saw the span fail, the step leaves that part to the optimizer's state
 * alone, the same on all of them, so they stay in line.  (The member that
 * stalled, should it come back, may hold the mean there: it is the one out
 * of line.) */
static void zero_local(const avg_round_summary *s, float *buf, size_t n,
                       uint64_t epoch) {
  size_t zeroed = 0;
  for (size_t i = 0; i < s->nmembers; i++) {
    const avg_span_info *sp = &s->spans[i];
    if (sp->averaged || sp->len == 0 || sp->start > n ||
        sp->len > n - sp->start)
      continue;
    memset(buf + sp->start, 0, sp->len * sizeof *buf);
    zeroed += sp->len;
  }
  if (zeroed)
    bee_warn(COMP,
             "epoch %llu: %.1f%% of the round stayed local (a member did not "
             "return the mean of its part): left out of this step, as on "
             "every member that saw it",
             (unsigned long long)epoch, 100.0 * (double)zeroed / (double)n);
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

static void round_cb(avg_node *n, const avg_node_result *r, void *arg) {
  (void)n;
  bee_train *t = arg;
  size_t group = r->group ? r->group->nmembers : 0;
  double by_all = 0;
  int status = r->status;
  if (status == BEE_ECANCELED && t->deserted_cancel)
    status = -ENOENT; /* end_deserted: nobody else at its epoch */
  bool left = false;
  if (status == 0 && r->summary) {
    uv_mutex_lock(&t->mu);
    size_t np = t->sh.avg_n;
    float *buf = t->sh.avg_buf; /* the worker's, idle until round_over */
    bool state = t->sh.avg_state;
    uint64_t epoch = t->sh.avg_epoch;
    uv_mutex_unlock(&t->mu);
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
    else if (!state)
      zero_local(r->summary, buf, np, epoch);
    left = !state && left_behind(r->summary, epoch);
  }
  round_over(t, status, group, by_all, left, r);
}

/* A request for the round of `round` (an epoch, or STATE_ROUND + epoch
 * with state) expecting `peers` members, this bee's weight w: begin as
 * soon as every peer expected has joined, at the latest
 * --matchmaking-time from now with whoever has. */
static void fill_request(bee_train *t, avg_node_request *req, uint64_t round,
                         bool state, size_t peers, double w, float *buf,
                         size_t nbuf) {
  avg_node_request_default(req);
  avg_match_config *mc = &req->match;
  snprintf(mc->info.run, sizeof mc->info.run, "%s", t->cfg->run);
  mc->info.round = round;
  snprintf(mc->info.addr, sizeof mc->info.addr, "%s", t->addr);
  memcpy(mc->info.schema_hash, state ? t->state_schema : t->schema,
         sizeof t->schema);
  mc->info.mode = t->cfg->client ? PROTO_MODE_CLIENT : PROTO_MODE_NODE;
  mc->info.bandwidth_mbit = 1000;
  mc->info.weight = w;
  unsigned mm = (unsigned)(t->cfg->matchmaking_s * 1000);
  /* One group of every peer expected, so that all of them take the same
   * step: a cap below the swarm's size would leave the bees past it to
   * groups of their own, out of line.  The group begins as soon as the
   * peers this bee expects are in; a leader that expects more (its view
   * saw one more record) is still followed. */
  mc->target_size = peers < 2 ? 2 : peers > AVG_GROUP_MAX ? AVG_GROUP_MAX
                                                          : peers;
  mc->max_size = AVG_GROUP_MAX;
  mc->min_size = 2;
  mc->matchmaking_ms = mm;
  mc->fetch_interval_ms = 100;
  mc->deadline_ms = mm + MATCH_GRACE_MS;
  req->round.x = buf;
  req->round.n = nbuf;
  req->round.weight = w;
  if (!state) { /* the state travels whole */
    req->round.codec = (avg_codec)t->cfg->compression;
    req->round.residual = t->residual;
  }
  req->round.deadline_ms = ROUND_DEADLINE_MS;
}

/* The group formed ahead is no more use: the epoch moved on (a state
 * loaded), a state round comes first, or the bee leaves.  Its members are
 * told, and drop us from its round at once. */
void bee__ahead_drop(bee_train *t, const char *why) {
  if (t->ahead.state == AHEAD_HELD) {
    bee_info(COMP, "leaving the group formed for epoch %llu: %s",
             (unsigned long long)t->ahead.epoch, why);
    avg_node_leave(t->avg, &t->ahead.g, why);
  }
  if (t->ahead.state == AHEAD_MATCHING) {
    t->ahead.state = AHEAD_NONE;
    avg_node_cancel(t->avg); /* its callback finds AHEAD_NONE */
  }
  t->ahead.state = AHEAD_NONE;
}

static void ahead_cb(avg_node *n, const avg_node_result *r, void *arg) {
  (void)n;
  bee_train *t = arg;
  if (t->stopped || t->ahead.state != AHEAD_MATCHING)
    return; /* cancelled */
  if (r->status == 0) {
    t->ahead.state = AHEAD_HELD;
    t->ahead.wait_s = mono_s();
    t->ahead.g = *r->group;
    memcpy(t->ahead.gm, r->group->members,
           r->group->nmembers * sizeof *t->ahead.gm);
    t->ahead.g.members = t->ahead.gm;
    bee_debug(COMP, "epoch %llu: a group of %zu formed ahead in %.2f s",
              (unsigned long long)t->ahead.epoch, r->group->nmembers,
              mono_s() - t->ahead.t0);
  } else {
    t->ahead.state = AHEAD_FAILED; /* matched again once the target is in */
    bee_debug(COMP, "epoch %llu: no group formed ahead: %s",
              (unsigned long long)t->ahead.epoch, bee_strerror(r->status));
  }
  bee__start_round(t); /* the worker may be waiting */
}

/* A group formed ahead waits at most this long for its round. */
#define READY_MAX_S 600.0

/* Matchmaking ahead (unless --no-match-ahead): once the swarm is expected
 * to reach the target within --matchmaking-time, by the last view and the
 * rates since, the group for the epoch's round forms while the worker
 * computes its last batches; the round begins as soon as the worker hands
 * its buffer over (bee__start_round).  DiLoCo: when this bee's inner steps
 * end within that time (a laggard's: the first of the others'), declaring
 * the start the round can keep.  Only once the worker trains at the epoch (a
 * state round at its start comes first), one averaging at a time. */
void bee__match_ahead(bee_train *t) {
  if (t->cfg->no_match_ahead || !t->avg || t->averaging || t->stopped ||
      t->ahead.state == AHEAD_MATCHING)
    return;
  double rate = bee_rate_get(&t->rate);
  uv_mutex_lock(&t->mu);
  uint64_t epoch = t->sh.epoch, samples = t->sh.samples;
  /* A round asked for and not over, or this epoch's over already (the
   * worker is about to step). */
  bool asked = (t->sh.avg_req && !t->sh.avg_done) ||
               (t->sh.avg_done && !t->sh.avg_state && t->sh.avg_epoch == epoch);
  double others = others_now(&t->sh);
  double others_rate = t->sh.others_rate;
  double first_s = t->sh.others_first_s, round_s = t->sh.round_s;
  uv_mutex_unlock(&t->mu);
  if (t->ahead.state != AHEAD_NONE && t->ahead.epoch != epoch)
    bee__ahead_drop(t, "the epoch moved on");
  if (asked || samples == 0 || t->ahead.state != AHEAD_NONE ||
      t->cand_epoch != epoch || t->candidates < 2 || !(rate > 0))
    return;
  /* eta: when to look; ready: when the round can run; own: when this
   * bee's inner steps end (the weight). */
  double eta, ready, own;
  if (t->outer) {
    double want =
        (double)bee_config_inner_steps(t->cfg) * (double)t->cfg->batch_size;
    eta = ready = own = (want - (double)samples) / rate;
    double now = mono_s();
    /* A laggard's round comes when the last of the others' inner steps
     * end (outer_lags).  Their group forms by the time the first of them
     * is done (its leader's start), so a laggard looks ahead of that. */
    if (eta > OUTER_LAG_MIN_S && first_s > 0 && first_s - now < eta)
      eta = first_s > now ? first_s - now : 0;
    /* Every bee declares the start the round can keep, the bees slower
     * than it and the laggard's early round counted (bee_outer_round):
     * a group that began at its leader's own end would go without the
     * bees that come after it, who then step alone. */
    if (round_s > 0)
      ready = round_s > now ? round_s - now : 0;
  } else {
    double left = (double)t->cfg->target_batch_size - (double)samples - others;
    eta = ready = own = left / (rate + others_rate);
  }
  if (eta > t->cfg->matchmaking_s)
    return;
  /* The weight we declare is a guess (what we will have by then); the
   * round weighs by the samples the worker hands it. */
  double got = own < ready ? own : ready;
  double w = (double)samples + (got > 0 ? rate * got : 0);
  avg_node_request req;
  fill_request(t, &req, epoch, false, t->candidates, w, NULL, 0);
  if (ready > t->cfg->matchmaking_s) {
    if (ready > READY_MAX_S)
      ready = READY_MAX_S;
    req.match.first_start_ms = (uint64_t)(ready * 1000);
    req.match.deadline_ms = req.match.first_start_ms + MATCH_GRACE_MS;
    bee_debug(COMP, "epoch %llu: matching ahead for a round in %.1f s",
              (unsigned long long)epoch, ready);
  }
  int rc = avg_node_match(t->avg, &req, ahead_cb, t);
  if (rc) {
    bee_debug(COMP, "epoch %llu: no matchmaking ahead: %s",
              (unsigned long long)epoch, bee_strerror(rc));
    t->ahead.state = AHEAD_FAILED;
    t->ahead.epoch = epoch;
    return;
  }
  t->ahead.state = AHEAD_MATCHING;
  t->ahead.epoch = epoch;
  t->ahead.t0 = mono_s();
  t->ahead.ready_s = t->ahead.t0 + (ready > 0 ? ready : 0);
}

/* Starts the round the worker asked for: with the group formed ahead for
 * its epoch, once the matchmaking under way for it ends; else a
 * matchmaking now, expecting the peers at its epoch and one behind by the
 * last view (bee_round_candidates); alone, there is nothing to average. */
void bee__start_round(bee_train *t) {
  uv_mutex_lock(&t->mu);
  bool want = t->sh.avg_req && !t->sh.avg_done;
  bool state = t->sh.avg_state;
  uint64_t epoch = t->sh.avg_epoch;
  double weight = t->sh.avg_weight;
  float *buf = t->sh.avg_buf;
  size_t nbuf = t->sh.avg_n;
  uv_mutex_unlock(&t->mu);
  if (!want || t->averaging || t->stopped)
    return;
  bool ours = !state && t->ahead.epoch == epoch;
  if (t->ahead.state == AHEAD_MATCHING && ours)
    return; /* its callback comes back here */
  if (t->ahead.state == AHEAD_HELD && ours) {
    avg_node_request req;
    fill_request(t, &req, epoch, false, t->ahead.g.nmembers, weight, buf,
                 nbuf);
    t->ahead.state = AHEAD_NONE;
    int rc = avg_node_round(t->avg, &t->ahead.g, &req, round_cb, t);
    if (rc) {
      bee_warn(COMP, "epoch %llu: cannot start the averaging: %s",
               (unsigned long long)epoch, bee_strerror(rc));
      round_over(t, rc, 1, 0, false, NULL);
      return;
    }
    t->averaging = t->round_ahead = true;
    return;
  }
  /* Nothing to give, and the swarm has stepped past the epoch by the last
   * view: its round is over, with or without this bee.  A matchmaking
   * would wait for nobody while the swarm's next epoch goes by, and a bee
   * that came to the epoch late (a state loaded one epoch behind, a
   * stall) would step the same way at every epoch after, never training
   * (tests/test-net-heal.sh's first version: 13 epochs in a row). */
  if (!state && !t->dgrad && weight == 0 && t->view.epoch > epoch) {
    if (t->ahead.state != AHEAD_NONE)
      bee__ahead_drop(t, "the swarm left its epoch");
    t->round_ahead = false;
    round_over(t, -ENOENT, 1, 0, false, NULL);
    return;
  }
  if (t->ahead.state != AHEAD_NONE)
    bee__ahead_drop(t, state ? "a state round comes first"
                                  : "the round is for another epoch");
  /* The candidates were counted at the worker's epoch: with
   * --delay-averaging it is already one past the round's (and counts the
   * peers at both). */
  uint64_t at = state || !t->dgrad ? epoch : epoch + 1;
  if (t->cand_epoch != at)
    return; /* no view at this epoch yet (a state just loaded): next tick */
  size_t peers = t->candidates;
  t->round_ahead = false;
  if (!t->avg || peers < 2) {
    round_over(t, -ENOENT, 1, 0, false, NULL);
    return;
  }
  avg_node_request req;
  fill_request(t, &req, state ? STATE_ROUND + epoch : epoch, state, peers,
               weight, buf, nbuf); /* the worker waits meanwhile */
  int rc = avg_node_average(t->avg, &req, round_cb, t);
  if (rc) {
    bee_warn(COMP, "epoch %llu: cannot start %s averaging: %s",
             (unsigned long long)epoch, state ? "state" : "the",
             bee_strerror(rc));
    round_over(t, rc, 1, 0, false, NULL);
    return;
  }
  t->averaging = true;
}

void bee_train_expect_join(bee_train *t) {
  if (t)
    t->expect_join = true;
}

void bee_train_joined(bee_train *t) {
  if (!t || t->joined)
    return;
  t->joined = true;
  t->joined_ms = uv_now(t->loop);
}

void bee_train_drain(bee_train *t, proto_conn *c) {
  if (t && t->avg)
    avg_node_drain(t->avg, c);
}

void bee_train_conn_down(bee_train *t, proto_conn *c) {
  if (t && t->avg)
    avg_node_conn_down(t->avg, c);
}

static void donor_put_cb(dht_node *n, int status, unsigned stored,
                         const dht_stats *st, void *arg) {
  (void)n, (void)stored, (void)st;
  bee_train *t = arg;
  t->donor_busy = false;
  if (status && status != BEE_ECANCELED && !t->stopped)
    bee_debug(COMP, "donor record not published: %s", bee_strerror(status));
}

/* Downloads we would start now: --max-state-uploads less those running
 * (asked within BEE_UPLOAD_IDLE_MS). */
static uint64_t free_slots(const bee_train *t, uint64_t now) {
  size_t busy = bee_uploads_active(&t->uploads, now);
  return busy < t->cfg->max_state_uploads ? t->cfg->max_state_uploads - busy
                                          : 0;
}

/* Advertises the snapshot we serve under "<run>_donors": its epoch, our
 * address and the downloads we would start now; again when either
 * changes (at most once a second) and every DONOR_REFRESH_MS.  A client
 * (behind NAT) serves nobody and says nothing. */
static void publish_donor(bee_train *t, uint64_t now) {
  uv_mutex_lock(&t->mu);
  bool have = t->sh.snap != NULL;
  uint64_t epoch = have ? t->sh.snap->epoch : 0;
  uv_mutex_unlock(&t->mu);
  if (!have || t->cfg->client || t->donor_busy)
    return;
  uint64_t slots = free_slots(t, now);
  if (t->donor_any && now - t->donor_ms < 1000)
    return;
  if (t->donor_any && epoch == t->donor_epoch && slots == t->donor_slots &&
      now - t->donor_ms < DONOR_REFRESH_MS)
    return;
  proto_donor d = {.epoch = epoch, .slots = slots};
  snprintf(d.run, sizeof d.run, "%s", t->cfg->run);
  snprintf(d.addr, sizeof d.addr, "%s", t->addr);
  uint8_t buf[PROTO_RECORD_MAX];
  size_t len;
  if (proto_donor_encode(&d, buf, sizeof buf, &len))
    return; /* our own fields: checked at start-up */
  /* The DHT keeps the record with the later expiration. */
  uint64_t exp = wall_ms() / 1000 + DONOR_TTL_S;
  if (exp <= t->donor_exp)
    exp = t->donor_exp + 1;
  if (dht_put(t->dht, t->dkey, (proto_bytes){t->sub, sizeof t->sub},
              (proto_bytes){buf, len}, exp, donor_put_cb, t) != 0)
    return;
  t->donor_busy = t->donor_any = true;
  t->donor_epoch = epoch;
  t->donor_slots = slots;
  t->donor_ms = now;
  t->donor_exp = exp;
}

void bee__tick(uv_timer_t *h) {
  bee_train *t = h->data;
  uint64_t now = uv_now(t->loop);
  uv_mutex_lock(&t->mu);
  uint64_t epoch = t->sh.epoch, samples = t->sh.samples;
  bee_rate_add(&t->rate, t->sh.pend_samples, t->sh.pend_s);
  t->sh.pend_samples = 0;
  t->sh.pend_s = 0;
  uv_mutex_unlock(&t->mu);
  if (t->dht && !t->put_busy)
    publish(t, epoch, samples);
  if (t->dht)
    publish_donor(t, now);
  if (t->dht && !t->get_busy && now - t->last_get_ms >= VIEW_MS) {
    t->last_get_ms = now;
    if (dht_get(t->dht, t->key, true, get_cb, t) == 0)
      t->get_busy = true;
    else
      update_view(t, NULL);
  }
  bee__start_round(t);
  bee__match_ahead(t);
  /* Members that began the group's round wait for our parts; we are
   * still computing ours (DiLoCo: a slower bee's inner steps).  Only
   * until AHEAD_WAIT_LATE_S after our round was expected: a worker stuck
   * past that is dropped by their sender timeout, as a dead member,
   * rather than hold their round to its deadline. */
  double at = mono_s();
  if (t->ahead.state == AHEAD_HELD && at - t->ahead.wait_s >= AHEAD_WAIT_S &&
      at < t->ahead.ready_s + AHEAD_WAIT_LATE_S) {
    t->ahead.wait_s = at;
    avg_node_wait(t->avg, &t->ahead.g);
  }
  bee__resync(t);
  unsigned every = t->cfg->status_interval_s;
  if (every && t->have_view && now - t->status_ms >= every * 1000ull) {
    t->status_ms = now;
    log_view(t);
  }
}

/* One epoch's metrics under "<run>_metrics" (subkey: our key), for the
 * monitor: loss, samples/s, computing and averaging time, bytes, the
 * group, the squared gradient norms before and after averaging with
 * their batches (the gradient noise scale's inputs), and with loss
 * scaling the scale and the batches dropped for overflow. */
static void metrics_put_cb(dht_node *n, int status, unsigned stored,
                           const dht_stats *st, void *arg) {
  (void)n, (void)stored, (void)st, (void)arg;
  if (status && status != BEE_ECANCELED)
    bee_debug(COMP, "metrics not published: %s", bee_strerror(status));
}

void bee__publish_metrics(bee_train *t, const struct step_report *r) {
  if (!t->dht)
    return;
  proto_metrics m = {.step = r->epoch,
                     .has_loss = r->samples > 0,
                     .loss = r->loss,
                     .samples_per_second = bee_rate_get(&t->rate),
                     .compute_s = r->compute_s,
                     .averaging_s = r->averaging_s,
                     .bytes_sent = r->bytes_sent,
                     .bytes_received = r->bytes_recv,
                     .group_size = r->avg_status == 0 ? r->group : 1,
                     .grad_sq_local = r->grad_sq_local,
                     .batch_local = r->samples,
                     .grad_sq_avg = r->grad_sq_avg,
                     .batch_avg = r->batch_avg,
                     .time_ms = wall_ms(),
                     .has_by_all = true,
                     .by_all = r->avg_status == 0 ? r->by_all : 0,
                     .diverged = r->diverged,
                     .has_params = true,
                     .has_loss_scale = r->loss_scale > 0,
                     .loss_scale = r->loss_scale,
                     .dropped = r->skipped};
  memcpy(m.params, r->hash, sizeof m.params);
  /* The lines before this step, newest first: a peer that looks after
   * this bee has moved on still counts it at those steps (split_cb). */
  size_t have = t->nlines < LINES_RING ? t->nlines : LINES_RING;
  for (size_t i = 0; i < have && m.nlines < PROTO_METRICS_LINES_MAX &&
                     !r->diverged;
       i++) {
    const bee_line *l = &t->lines[(t->nlines - 1 - i) % LINES_RING];
    if (l->epoch >= r->epoch)
      continue;
    proto_metrics_line *o = &m.lines[m.nlines++];
    o->step = l->epoch;
    o->group_size = l->group;
    memcpy(o->params, l->hash, sizeof o->params);
  }
  if (r->avg_status == 0 && r->group >= 2 && !r->diverged) {
    bee_line *l = &t->lines[t->nlines++ % LINES_RING];
    l->epoch = r->epoch;
    l->group = r->group;
    memcpy(l->hash, r->hash, sizeof l->hash);
  }
  snprintf(m.run, sizeof m.run, "%s", t->cfg->run);
  uint8_t buf[PROTO_RECORD_MAX];
  size_t len;
  if (proto_metrics_encode(&m, buf, sizeof buf, &len))
    return; /* a NaN loss, say: nothing worth a record */
  uint64_t exp = m.time_ms / 1000 + METRICS_TTL_S;
  if (exp <= t->metrics_exp)
    exp = t->metrics_exp + 1; /* the DHT keeps only a later one */
  if (dht_put(t->dht, t->mkey, (proto_bytes){t->sub, sizeof t->sub},
              (proto_bytes){buf, len}, exp, metrics_put_cb, NULL) == 0)
    t->metrics_exp = exp;
}

/* ---- back in line (loop thread) ----------------------------------------- */

/* The peers' metrics: those at the swarm's epoch (the donors) that
 * averaged a round at or after the one this bee missed, all of it in a
 * group, and have not left their swarm's parameters themselves serve the
 * state this bee should hold; it downloads it from them.  Two bees that
 * both missed never load each other's, and a bee never loads from peers
 * it saw declare another layout (another compression, say): it could
 * never average with them anyway. */
static void resync_cb(dht_node *n, int status, const dht_value *v,
                      const dht_stats *st, void *arg) {
  (void)n, (void)st;
  bee_train *t = arg;
  t->resync_busy = false;
  if (t->stopped || status || !v || t->fetching)
    return;
  uv_mutex_lock(&t->mu);
  bool diverged = t->sh.diverged && !t->sh.load;
  uint64_t from = t->sh.diverged_epoch;
  uv_mutex_unlock(&t->mu);
  if (!diverged)
    return;
  uint8_t good[DONORS_MAX][PROTO_ID_BYTES];
  size_t k = 0;
  for (size_t i = 0; i < v->n && k < DONORS_MAX; i++) {
    const proto_dht_record *r = &v->records[i];
    proto_metrics m;
    uint8_t id[PROTO_ID_BYTES];
    if (r->subkey.n != sizeof t->sub ||
        memcmp(r->subkey.p, t->sub, sizeof t->sub) == 0 ||
        proto_metrics_decode(r->value.p, r->value.n, &m) ||
        strcmp(m.run, t->cfg->run) != 0 || m.step < from ||
        m.group_size < 2 || !m.has_by_all || m.by_all < 1.0 || m.diverged)
      continue;
    proto_peer_id(r->subkey.p + 1, id);
    bool other = false; /* its rounds are never ours (other_layout) */
    for (size_t j = 0; j < t->nlayout_warned; j++)
      other |= memcmp(t->layout_warned[j], id, PROTO_ID_BYTES) == 0;
    bool won = t->nsplit == 0; /* after a split: one of the line that won */
    for (size_t j = 0; j < t->nsplit; j++)
      won |= memcmp(t->split_ids[j], id, PROTO_ID_BYTES) == 0;
    other |= !won;
    for (size_t j = 0; !other && j < t->ndonors; j++)
      if (memcmp(t->donors[j], id, PROTO_ID_BYTES) == 0)
        memcpy(good[k++], id, PROTO_ID_BYTES);
  }
  if (k == 0 || bee__fetch_wait(t))
    return; /* none yet, or not now: asked again in RESYNC_MS */
  if (t->nsplit)
    bee_info(COMP,
             "epoch %llu: loading the state of the line that goes on (%zu "
             "of its peers at the swarm's epoch)",
             (unsigned long long)from, k);
  else
    bee_info(COMP,
             "epoch %llu was stepped here without the round its peers "
             "averaged: loading their state (%zu of them at the swarm's "
             "epoch)",
             (unsigned long long)from, k);
  memcpy(t->donors, good, k * sizeof good[0]);
  t->ndonors = k;
  bee__start_fetch(t);
}

/* The peers' metrics, for a split: peers of the run at a step this bee
 * averaged too, in a group, whose parameters came out otherwise.  Two
 * groups formed for one epoch (a bee that started or caught up late found
 * the first one closed and formed another with the other latecomers) left
 * two lines of parameters, each in line with itself, and every later
 * round, even one that joins them all, keeps them apart; so does one
 * group whose members came in with different parameters.  The line of
 * the larger group, then of more peers, then the lower hash goes on
 * (bee_split_loser); a bee of another marks itself out of line and loads
 * the state from that line's peers. */
static void split_cb(dht_node *n, int status, const dht_value *v,
                     const dht_stats *st, void *arg) {
  (void)n, (void)st;
  bee_train *t = arg;
  t->split_busy = false;
  if (t->stopped || status || !v || t->fetching)
    return;
  uv_mutex_lock(&t->mu);
  bool diverged = t->sh.diverged || t->sh.load;
  uv_mutex_unlock(&t->mu);
  if (diverged || v->n == 0)
    return;
  /* Each peer's last step and the averaged steps before it that its
   * record carries: a peer that moved on since a split still counts
   * there (with its last step only, the bees of both lines once loaded
   * each other's: tools/chaos). */
  bee_line *seen = malloc(v->n * (1 + PROTO_METRICS_LINES_MAX) * sizeof *seen);
  if (!seen)
    return; /* asked again in SPLIT_MS */
  size_t nseen = 0;
  for (size_t i = 0; i < v->n; i++) {
    const proto_dht_record *r = &v->records[i];
    proto_metrics m;
    if (r->subkey.n != sizeof t->sub ||
        memcmp(r->subkey.p, t->sub, sizeof t->sub) == 0 ||
        proto_metrics_decode(r->value.p, r->value.n, &m) ||
        strcmp(m.run, t->cfg->run) != 0 || !m.has_params || m.diverged)
      continue;
    if (m.group_size >= 2) {
      seen[nseen].epoch = m.step;
      seen[nseen].group = m.group_size;
      memcpy(seen[nseen].hash, m.params, sizeof m.params);
      nseen++;
    }
    for (size_t j = 0; j < m.nlines; j++) {
      seen[nseen].epoch = m.lines[j].step;
      seen[nseen].group = m.lines[j].group_size;
      memcpy(seen[nseen].hash, m.lines[j].params, sizeof m.lines[j].params);
      nseen++;
    }
  }
  bee_line won;
  size_t have = t->nlines < LINES_RING ? t->nlines : LINES_RING;
  const bee_line *ours = bee_split_loser(t->lines, have, seen, nseen, &won);
  free(seen);
  if (!ours)
    return; /* no split, or ours is the line that goes on */
  t->nsplit = 0;
  for (size_t i = 0; i < v->n && t->nsplit < DONORS_MAX; i++) {
    const proto_dht_record *r = &v->records[i];
    proto_metrics m;
    if (r->subkey.n != sizeof t->sub ||
        proto_metrics_decode(r->value.p, r->value.n, &m) != 0 ||
        strcmp(m.run, t->cfg->run) != 0 || !m.has_params || m.diverged)
      continue;
    bool holds = m.step == ours->epoch &&
                 memcmp(m.params, won.hash, sizeof won.hash) == 0;
    for (size_t j = 0; j < m.nlines && !holds; j++)
      holds = m.lines[j].step == ours->epoch &&
              memcmp(m.lines[j].params, won.hash, sizeof won.hash) == 0;
    if (holds)
      proto_peer_id(r->subkey.p + 1, t->split_ids[t->nsplit++]);
  }
  char a[17], b[17];
  proto_hex(ours->hash, sizeof ours->hash, a);
  proto_hex(won.hash, sizeof won.hash, b);
  bee_warn(COMP,
           "epoch %llu: the swarm split: %zu peers stepped to parameters %s "
           "in a group of %llu, this bee to %s in a group of %llu; it loads "
           "theirs",
           (unsigned long long)ours->epoch, t->nsplit, b,
           (unsigned long long)won.group, a,
           (unsigned long long)ours->group);
  uv_mutex_lock(&t->mu);
  if (!t->sh.diverged) {
    t->sh.diverged = true;
    t->sh.diverged_epoch = ours->epoch;
  }
  uv_mutex_unlock(&t->mu);
  t->nlines = 0;
}

void bee__resync(bee_train *t) {
  uint64_t now = uv_now(t->loop);
  /* A download that waits for the swarm's step asks at every view. */
  uint64_t every = t->fdefer.on ? VIEW_MS : RESYNC_MS;
  if (!t->dht || t->fetching || t->resync_busy || now < t->fretry_ms ||
      now - t->resync_ms < every)
    return;
  uv_mutex_lock(&t->mu);
  bool diverged = t->sh.diverged && t->sh.go && !t->sh.load;
  uv_mutex_unlock(&t->mu);
  if (!diverged) {
    t->nsplit = 0; /* back in line: any donor again */
    /* Every peer reads every peer's metrics: in a larger run less often,
     * so that the reads of the key grow with the run's size, not with
     * its square. */
    uint64_t split_every =
        SPLIT_MS * (1 + (t->view.peers ? t->view.peers - 1 : 0) /
                            SPLIT_PEERS_STEP);
    if (t->nlines && !t->split_busy && now - t->split_ms >= split_every) {
      t->split_ms = now;
      if (dht_get(t->dht, t->mkey, true, split_cb, t) == 0)
        t->split_busy = true;
    }
    return;
  }
  t->nlines = 0; /* the steps before the load are no line of the swarm's */
  t->resync_ms = now;
  if (dht_get(t->dht, t->mkey, true, resync_cb, t) == 0)
    t->resync_busy = true;
}
