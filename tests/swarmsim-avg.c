/* swarmsim-avg.c: the simulated averager and state downloads of the
 * swarm simulator (swarmsim.h says what is simulated).
 *
 * The matchmaking is the averager's own core (avg_match), its messages
 * carried with each pair's latency and its declarations kept with the
 * bees' other records; the round is a model: it runs once every member
 * has begun or been dropped, for the time its bytes take on the
 * members' links.  A state download's chunk is answered by the donor
 * (its upload slots, its pinned snapshot) after a round trip and the
 * chunk's time on the stream.
 */
#include "swarmsim-int.h"

/* ---- the matchmaking: the real core, its messages simulated ------------- */

static uint64_t m_now(void *ctx) { return ((sbee *)ctx)->s->now; }
static uint64_t m_unix(void *ctx) { return sim__unix_ms(((sbee *)ctx)->s); }

static void m_declare(void *ctx, const proto_match *info, uint64_t exp) {
  sbee *b = ctx;
  avg_decl *c =
      sim__slot_store(&b->decl_slot, b->decl, sizeof *c, b->s->now,
                      b->s->now + b->s->c.dht_ms, exp * 1000 - SWARMSIM_UNIX0);
  memcpy(c->id, b->id, PROTO_ID_BYTES);
  c->expiration = exp;
  c->info = *info;
}

static void m_fetch(void *ctx) {
  sbee *b = ctx;
  sim__at(b->s, b->s->now + b->s->c.dht_ms, EV_MATCH_FETCH, b, 0);
}

int sim__match_send(void *ctx, const uint8_t id[PROTO_ID_BYTES],
                    const char *addr, const uint8_t *msg, size_t len) {
  (void)addr;
  sbee *b = ctx;
  swarmsim *s = b->s;
  sbee *to = sim__by_id(s, id);
  if (!to || !to->alive)
    return BEE_ECLOSED;
  event e = {.at = s->now + (uint64_t)(sim__rtt(s, b, to) / 2),
             .kind = EV_MATCH_MSG,
             .bee = to->idx,
             .gen = to->gen,
             .from = b->idx,
             .arg = b->gen,
             .len = len};
  e.data = sim__xcalloc(len, 1);
  memcpy(e.data, msg, len);
  sim__push(s, e);
  return 0;
}

static void m_random(void *ctx, void *buf, size_t n) {
  sbee *b = ctx;
  uint8_t *p = buf;
  for (size_t i = 0; i < n; i++)
    p[i] = (uint8_t)test_rng_next(&b->s->rng);
}

static event group_event(swarmsim *s, const sbee *b, int kind, int status,
                         const avg_group *g) {
  event e = {.at = s->now,
             .kind = kind,
             .bee = b->idx,
             .gen = b->gen,
             .status = status};
  if (g) {
    size_t sz = sizeof *g + g->nmembers * sizeof *g->members;
    e.data = sim__xcalloc(1, sz);
    avg_group *c = (avg_group *)e.data;
    *c = *g;
    proto_group_member *mm = (proto_group_member *)(c + 1);
    memcpy(mm, g->members, g->nmembers * sizeof *mm);
    c->members = mm;
  }
  return e;
}

void sim__rearm_match(swarmsim *s, sbee *b) {
  if (!b->m)
    return;
  uint64_t t = avg_match_tick(b->m);
  if (t == UINT64_MAX || !b->m)
    return;
  b->m_tick_seq++;
  sim__at(s, s->now + t, EV_MATCH_TICK, b, b->m_tick_seq);
}

static void on_match(avg_match *m, int status, const avg_group *g, void *arg) {
  sbee *b = arg;
  swarmsim *s = b->s;
  avg_match_stats st;
  avg_match_stats_get(m, &st);
  b->m = NULL;
  b->life.match_timeouts += status == BEE_ETIMEOUT;
  if (!b->cancelling)
    avg_match_free(m); /* its callback may free it; not while freed */
  if (b->m_ahead && b->cancelling) {
    bee_run_matched(b->core, status, NULL);
    return;
  }
  if (b->m_ahead) {
    /* The answer to bee_run_matched goes through the queue with a copy
     * of the group (the io contract: later, not inside). */
    sim__push(s,
              group_event(s, b, EV_MATCH_DONE, status, status == 0 ? g : NULL));
    return;
  }
  if (status == 0) {
    sim__round_begin(s, b, g);
    return;
  }
  avg_node_result r = {.status = status, .match = st};
  bee_run_round_done(b->core, &r);
}

/* The matchmaking core for request a. */
static int match_start(sbee *b, const bee_run_avg *a, bool ahead) {
  swarmsim *s = b->s;
  if (b->m || b->round)
    return BEE_ERANGE; /* one averaging at a time */
  avg_match_config c;
  avg_match_config_default(&c);
  memcpy(c.self_id, b->id, PROTO_ID_BYTES);
  snprintf(c.info.run, sizeof c.info.run, "%s", s->c.cfg->run);
  c.info.round = a->round;
  snprintf(c.info.bits, sizeof c.info.bits, "%s", a->bits);
  snprintf(c.info.addr, sizeof c.info.addr, "b%zu:1", b->idx);
  memset(c.info.schema_hash, SCHEMA_BYTE, sizeof c.info.schema_hash);
  c.info.mode = PROTO_MODE_NODE;
  c.info.bandwidth_mbit = 1000;
  c.info.weight = a->weight;
  c.target_size = a->target_size;
  c.max_size = a->max_size;
  c.min_size = 2;
  c.matchmaking_ms = a->matchmaking_ms;
  c.first_start_ms = a->first_start_ms;
  c.fetch_interval_ms = 100;
  c.deadline_ms = a->deadline_ms;
  /* As beed's (daemon/train-swarm.c). */
  c.end_when_formed = true;
  avg_match_io io = {.ctx = b,
                     .now_ms = m_now,
                     .unix_ms = m_unix,
                     .declare = m_declare,
                     .fetch = m_fetch,
                     .send = sim__match_send,
                     .random = m_random};
  int rc = avg_match_new(&c, &io, &b->m);
  if (rc)
    return rc;
  b->m_ahead = ahead;
  b->req = *a;
  rc = avg_match_start(b->m, on_match, b);
  if (rc) {
    avg_match_free(b->m);
    b->m = NULL;
    return rc;
  }
  sim__rearm_match(s, b);
  return 0;
}

/* ---- rounds: the model ---------------------------------------------------- */

static sround *round_find(swarmsim *s, const uint8_t gid[]) {
  for (size_t i = 0; i < s->nrounds; i++)
    if (s->rounds[i]->live &&
        memcmp(s->rounds[i]->gid, gid, PROTO_AVG_GROUP_BYTES) == 0)
      return s->rounds[i];
  return NULL;
}

static sround *round_of(swarmsim *s, const avg_group *g) {
  sround *r = round_find(s, g->id);
  if (r)
    return r;
  r = sim__xcalloc(1, sizeof *r);
  memcpy(r->gid, g->id, sizeof r->gid);
  r->id = ++s->round_ids;
  r->n = g->nmembers;
  r->bee = sim__xcalloc(r->n, sizeof *r->bee);
  r->gen = sim__xcalloc(r->n, sizeof *r->gen);
  r->weight = sim__xcalloc(r->n, sizeof *r->weight);
  r->st = sim__xcalloc(r->n, sizeof *r->st);
  r->start_ms = sim__xcalloc(r->n, sizeof *r->start_ms);
  r->wait_ms = sim__xcalloc(r->n, sizeof *r->wait_ms);
  r->first_ms = UINT64_MAX;
  r->live = true;
  for (size_t i = 0; i < r->n; i++) {
    sbee *m = sim__by_id(s, g->members[i].id);
    r->bee[i] = m ? m->idx : SIZE_MAX;
    r->gen[i] = m ? m->gen : 0;
    r->weight[i] = g->members[i].weight;
    if (!m)
      r->st[i] = RS_DEAD;
  }
  r->key = sim__mix(r->id, 0x5eed);
  if (s->nrounds == s->caprounds) {
    s->caprounds = s->caprounds ? 2 * s->caprounds : 64;
    s->rounds = sim__xrealloc(s->rounds, s->caprounds * sizeof *s->rounds);
  }
  s->rounds[s->nrounds++] = r;
  return r;
}

void sim__round_free(sround *r) {
  free(r->bee);
  free(r->gen);
  free(r->weight);
  free(r->st);
  free(r->start_ms);
  free(r->wait_ms);
  free(r);
}

static bool member_alive(const swarmsim *s, const sround *r, size_t i) {
  return r->bee[i] != SIZE_MAX && s->b[r->bee[i]].alive &&
         s->b[r->bee[i]].gen == r->gen[i];
}

/* How long the round takes once all have begun: each started member
 * sends its part of every other member's span and gets the mean back, a
 * k-th of the buffer each way per pair, the pairs' links apart (as the
 * lab shapes them); the slowest pair of the slowest member sets the
 * time, plus two of the group's longest round trips. */
static uint64_t round_time(const swarmsim *s, const sround *r) {
  size_t k = 0;
  for (size_t i = 0; i < r->n; i++)
    k += r->st[i] == RS_STARTED;
  if (k < 2)
    return 1;
  double worst = 0, far = 0;
  for (size_t i = 0; i < r->n; i++) {
    if (r->st[i] != RS_STARTED)
      continue;
    const sbee *a = &s->b[r->bee[i]];
    double ms = 0;
    for (size_t j = 0; j < r->n; j++) {
      if (j == i || r->st[j] != RS_STARTED)
        continue;
      const sbee *b = &s->b[r->bee[j]];
      /* one part of the buffer to j and its mean back */
      double pair =
          2 * s->c.model_bytes / (double)k / sim__stream_bpms(s, a, b);
      if (pair > ms)
        ms = pair;
      if (sim__rtt(s, a, b) > far)
        far = sim__rtt(s, a, b);
    }
    if (ms > worst)
      worst = ms;
  }
  return (uint64_t)(worst + 2 * far) + 1;
}

/* Settles who is in: dead members are dropped (their connections closed:
 * avg_round_gone), members silent past their timeout too (those that
 * vanished among them); when nobody is left to wait for, the round
 * runs. */
void sim__round_check(swarmsim *s, sround *r) {
  if (r->done || !r->live)
    return;
  bool waiting = false;
  uint64_t next = UINT64_MAX;
  for (size_t i = 0; i < r->n; i++) {
    if (r->st[i] == RS_STARTED && !member_alive(s, r, i))
      r->st[i] = RS_DEAD;
    if (r->st[i] != RS_WAITING)
      continue;
    if (r->first_ms == UINT64_MAX) {
      waiting = true;
      continue;
    }
    if (r->bee[i] != SIZE_MAX && !member_alive(s, r, i) &&
        !s->b[r->bee[i]].vanished) {
      r->st[i] = RS_DROPPED;
      continue;
    }
    uint64_t since = r->first_ms > r->wait_ms[i] ? r->first_ms : r->wait_ms[i];
    if (s->now >= since + SENDER_TIMEOUT_MS) {
      r->st[i] = RS_DROPPED;
      continue;
    }
    waiting = true;
    if (since + SENDER_TIMEOUT_MS < next)
      next = since + SENDER_TIMEOUT_MS;
  }
  if (waiting) {
    if (next != UINT64_MAX)
      sim__push(s, (event){.at = next, .kind = EV_ROUND_CHECK, .arg = r->id});
    return;
  }
  r->done = true;
  r->done_ms = s->now + round_time(s, r);
  sim__push(s, (event){.at = r->done_ms, .kind = EV_ROUND_DONE, .arg = r->id});
}

/* The summary a member sees: members that dropped out, spans of the
 * ones that did not reduce left local. */
typedef struct ssum {
  avg_round_summary sum;
  avg_span_info *spans;
  avg_member_info *members;
  size_t *by_k;
} ssum;

static void summary_of(const swarmsim *s, const sround *r, size_t self,
                       bool late, ssum *o) {
  size_t n = r->n;
  o->spans = sim__xcalloc(n, sizeof *o->spans);
  o->members = sim__xcalloc(n, sizeof *o->members);
  o->by_k = sim__xcalloc(n + 1, sizeof *o->by_k);
  size_t per = 1000, contributors = 0;
  for (size_t i = 0; i < n; i++) {
    bool in = late ? i == self : r->st[i] == RS_STARTED;
    o->spans[i].start = i * per;
    o->spans[i].len = per;
    o->spans[i].averaged = in;
    if (!in && i != self)
      o->members[i].dropped = AVG_DROP_SENDER_TIMEOUT;
    if (in && r->weight[i] > 0)
      contributors++;
    o->members[i].weight = in ? r->weight[i] : 0;
  }
  for (size_t i = 0; i < n; i++)
    o->by_k[o->spans[i].averaged ? contributors : 0] += per;
  (void)s;
  o->sum = (avg_round_summary){.status = 0,
                               .nmembers = n,
                               .spans = o->spans,
                               .members = o->members,
                               .floats_by_k = o->by_k};
}

static void summary_free(ssum *o) {
  free(o->spans);
  free(o->members);
  free(o->by_k);
}

static void answer_round(swarmsim *s, sbee *b, sround *r, size_t i, bool late) {
  ssum o;
  summary_of(s, r, i, late, &o);
  proto_group_member *gm = sim__xcalloc(r->n, sizeof *gm);
  for (size_t k = 0; k < r->n; k++) {
    if (r->bee[k] != SIZE_MAX)
      memcpy(gm[k].id, s->b[r->bee[k]].id, PROTO_ID_BYTES);
    gm[k].mode = PROTO_MODE_NODE;
    gm[k].weight = r->weight[k];
    gm[k].bandwidth_mbit = 1000;
  }
  avg_group g = {.nmembers = r->n, .self = i, .members = gm};
  memcpy(g.id, r->gid, sizeof g.id);
  avg_node_result res = {.status = 0, .group = &g, .summary = &o.sum};
  b->round = late ? NULL : r;
  bee_run_round_done(b->core, &res);
  b->round = NULL;
  free(gm);
  summary_free(&o);
}

void sim__round_done(swarmsim *s, sround *r) {
  r->live = false;
  /* The mean's identity: which members' parts made it. */
  size_t in = 0;
  r->x = 0;
  for (size_t i = 0; i < r->n; i++)
    if (r->st[i] == RS_STARTED && member_alive(s, r, i)) {
      r->key = sim__mix(r->key, r->bee[i]);
      r->x += s->b[r->bee[i]].x;
      in++;
    }
  r->x = in ? r->x / (double)in : 0;
  for (size_t i = 0; i < r->n; i++) {
    if (r->st[i] != RS_STARTED || !member_alive(s, r, i))
      continue;
    sbee *b = &s->b[r->bee[i]];
    if (b->round == r)
      answer_round(s, b, r, i, false);
  }
}

void sim__round_begin(swarmsim *s, sbee *b, const avg_group *g) {
  sround *r = round_of(s, g);
  size_t i = g->self;
  b->round = r;
  b->round_member = i;
  if (r->done || r->st[i] == RS_DROPPED || r->st[i] == RS_LEFT) {
    /* Too late: the others went on without us (their ABORTs). */
    answer_round(s, b, r, i, true);
    return;
  }
  r->st[i] = RS_STARTED;
  r->start_ms[i] = s->now;
  b->life.begun_ms = s->now;
  if (r->first_ms == UINT64_MAX)
    r->first_ms = s->now;
  sim__round_check(s, r);
}

/* ---- the averager's io ------------------------------------------------- */

int sim__io_match(void *ctx, const bee_run_avg *a) {
  return match_start(ctx, a, true);
}

int sim__io_average(void *ctx, const bee_run_avg *a) {
  return match_start(ctx, a, false);
}

int sim__io_round(void *ctx, const avg_group *g, const bee_run_avg *a) {
  sbee *b = ctx;
  (void)a;
  if (b->m || b->round || b->beginning)
    return BEE_ERANGE;
  /* Begins on the next event: the answer may come at once, and the io
   * contract says it comes later. */
  b->beginning = true;
  sim__push(b->s, group_event(b->s, b, EV_ROUND_BEGIN, 0, g));
  return 0;
}

void sim__io_cancel(void *ctx) {
  sbee *b = ctx;
  swarmsim *s = b->s;
  if (b->m) {
    avg_match *m = b->m;
    b->cancelling = true;
    avg_match_free(m); /* its callback runs now, ECANCELED */
    b->cancelling = false;
    b->m = NULL;
    return;
  }
  if (b->round) {
    sround *r = b->round;
    r->st[b->round_member] = RS_LEFT;
    b->round = NULL;
    sim__round_check(s, r);
    avg_node_result res = {.status = BEE_ECANCELED};
    bee_run_round_done(b->core, &res);
  }
}

bool sim__io_matching(void *ctx) { return ((sbee *)ctx)->m != NULL; }

void sim__io_leave(void *ctx, const avg_group *g, const char *why) {
  sbee *b = ctx;
  (void)why;
  sround *r = round_of(b->s, g);
  if (r->st[g->self] == RS_WAITING)
    r->st[g->self] = RS_LEFT;
  sim__round_check(b->s, r);
}

void sim__io_wait(void *ctx, const avg_group *g) {
  sbee *b = ctx;
  sround *r = round_find(b->s, g->id);
  if (r && g->self < r->n)
    r->wait_ms[g->self] = b->s->now;
}

/* ---- state downloads ---------------------------------------------------- */

static void unpin(void *pin, void *arg) {
  (void)arg;
  free(pin);
}

/* When the stream from d to b is free for n more bytes of a blob whose
 * real size is real, modeled as model bytes: the answer's time.  A
 * request reaches the donor half a round trip from now, its bytes leave
 * once the stream is free (chunks on one connection come one after the
 * other), and arrive half a round trip later. */
static uint64_t answer_at(swarmsim *s, sbee *b, const sbee *d, size_t n,
                          size_t real, double model) {
  double t = sim__rtt(s, b, d);
  double bytes = real ? (double)n / (double)real * model : 0;
  if (!b->stream_free)
    b->stream_free = sim__xcalloc(s->c.slots, sizeof *b->stream_free);
  uint64_t arrive = s->now + (uint64_t)(t / 2);
  uint64_t begin =
      arrive > b->stream_free[d->idx] ? arrive : b->stream_free[d->idx];
  uint64_t sent = begin + (uint64_t)(bytes / sim__stream_bpms(s, b, d));
  b->stream_free[d->idx] = sent;
  return sent + (uint64_t)(t / 2);
}

/* A donor's answer to a step request: the step it took from epoch, while
 * it keeps it and is in line; without it, an upload that has served
 * nothing ends (train-state.c's serve_step). */
static void step_answer(swarmsim *s, sbee *b, sbee *d, bee_upload *up,
                        uint64_t epoch, uint64_t offset, uint32_t len,
                        event *e) {
  const ssnap *st = NULL;
  for (size_t i = 0; i < d->w.nsteps && !d->w.diverged; i++)
    if (d->w.steps[i].epoch == epoch)
      st = &d->w.steps[i];
  size_t total = st && st->line ? s->step_bytes : 0;
  if (!st || offset > total) {
    e->at = s->now + (uint64_t)sim__rtt(s, b, d);
    e->status = BEE_EREMOTE;
    e->code = BEE_ERANGE;
    if (up->bytes == 0) {
      free(up->pin);
      up->pin = NULL;
      bee_uploads_end(&d->uploads, up);
    }
    return;
  }
  uint8_t *all = sim__xcalloc(s->step_bytes, 1);
  sim__step_bytes_of(s, epoch, st->line, all);
  size_t n = total - offset < len ? total - offset : len;
  e->data = sim__xcalloc(n ? n : 1, 1);
  memcpy(e->data, all + offset, n);
  e->len = n;
  up->bytes += n;
  e->chunk = (proto_state_msg){.type = PROTO_T_STATE_STEP,
                               .epoch = epoch,
                               .total = total,
                               .offset = offset};
  snprintf(e->chunk.run, sizeof e->chunk.run, "%s", s->c.cfg->run);
  crypto_generichash(e->chunk.checksum, sizeof e->chunk.checksum, all, total,
                     NULL, 0);
  free(all);
  e->at = answer_at(s, b, d, n, s->step_bytes, s->c.model_bytes);
}

/* An answer later than the IO's call allows: the call's timeout comes
 * instead (train-swarm.c's io_chunk). */
static void call_bound(const swarmsim *s, event *e) {
  if (e->at > s->now + BEE_RUN_CHUNK_MS) {
    e->at = s->now + BEE_RUN_CHUNK_MS;
    e->status = BEE_ETIMEOUT;
  }
}

int sim__io_chunk(void *ctx, const uint8_t id[PROTO_ID_BYTES], uint64_t step,
                  uint64_t offset, uint32_t len, uint64_t tag) {
  sbee *b = ctx;
  swarmsim *s = b->s;
  sbee *d = sim__by_id(s, id);
  if (!d || !d->alive)
    return -ENOTCONN;
  event e = {.kind = EV_CHUNK,
             .bee = b->idx,
             .gen = b->gen,
             .from = d->idx,
             .arg = d->gen,
             .tag = tag};
  double t = sim__rtt(s, b, d);
  bool fresh;
  bee_upload *up =
      bee_uploads_admit(&d->uploads, b->id, s->now, s->c.cfg->max_state_uploads,
                        &fresh, unpin, NULL);
  if (up && fresh) /* as train-state.c: a probe holds the slot */
    up->until_release =
        step == BEE_RUN_STATE && offset == 0 && len <= BEE_RUN_STATE_HDR;
  if (!up || (step == BEE_RUN_STATE && !d->w.snap)) {
    e.at = s->now + (uint64_t)t;
    e.status = BEE_EREMOTE;
    e.code = up ? BEE_ERANGE : BEE_ELIMIT;
    sim__push(s, e);
    return 0;
  }
  if (step != BEE_RUN_STATE) {
    step_answer(s, b, d, up, step, offset, len, &e);
    call_bound(s, &e);
    sim__push(s, e);
    return 0;
  }
  if (offset == 0 || !up->pin) {
    free(up->pin);
    ssnap *sn = sim__xcalloc(1, sizeof *sn);
    *sn = d->w.snapshot;
    up->pin = sn;
  }
  const ssnap *sn = up->pin;
  uint8_t *all = sim__xcalloc(s->state_bytes, 1);
  sim__state_bytes_of(s, sn, all);
  size_t n = offset < s->state_bytes ? s->state_bytes - offset : 0;
  if (n > len)
    n = len;
  e.data = sim__xcalloc(n ? n : 1, 1);
  memcpy(e.data, all + (offset < s->state_bytes ? offset : 0), n);
  e.len = n;
  up->bytes += n;
  e.chunk = (proto_state_msg){.type = PROTO_T_STATE_CHUNK,
                              .epoch = sn->epoch,
                              .total = s->state_bytes,
                              .offset = offset};
  snprintf(e.chunk.run, sizeof e.chunk.run, "%s", s->c.cfg->run);
  crypto_generichash(e.chunk.checksum, sizeof e.chunk.checksum, all,
                     s->state_bytes, NULL, 0);
  free(all);
  double state = s->c.state_bytes > 0 ? s->c.state_bytes : s->c.model_bytes;
  e.at = answer_at(s, b, d, n, s->state_bytes, state);
  call_bound(s, &e);
  if (offset + n >= s->state_bytes && (n == 0 || !up->until_release)) {
    free(up->pin);
    up->pin = NULL;
    bee_uploads_end(&d->uploads, up);
  }
  sim__push(s, e);
  return 0;
}

uint64_t sim__io_free_slots(void *ctx) {
  sbee *b = ctx;
  size_t busy = bee_uploads_active(&b->uploads, b->s->now);
  unsigned max = b->s->c.cfg->max_state_uploads;
  return busy < max ? max - busy : 0;
}

void sim__deliver_decls(swarmsim *s, sbee *b) {
  if (!b->m)
    return;
  avg_decl *v = s->rd_decls;
  size_t n = 0;
  for (size_t i = 0; i < s->nb; i++) {
    const sbee *o = &s->b[i];
    const avg_decl *d =
        sim__slot_read(&o->decl_slot, o->decl, sizeof *d, s->now);
    if (!d || d->info.round != b->req.round ||
        strcmp(d->info.bits, b->req.bits) != 0)
      continue;
    v[n++] = *d;
  }
  avg_match_declared(b->m, v, n);
}
