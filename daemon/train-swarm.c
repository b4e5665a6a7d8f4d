/* train-swarm.c: the run core's I/O (run.h's bee_run_io) for beed: the
 * run's records in the DHT (progress, donors, metrics, the matchmaking's
 * declarations), the averager's glue on the transport, the state's
 * chunks from donors, and the state the worker thread shares with the
 * loop (under t->mu).  It decides nothing: what to read, publish,
 * average or download, and when, is the core's; this file encodes,
 * decodes, and carries answers back to it.  The loop's tick is here too.
 */
#include "train-int.h"

/* ---- clocks and the worker ----------------------------------------------- */

static uint64_t io_now(void *ctx) {
  (void)ctx;
  return mono_ms();
}

static uint64_t io_unix(void *ctx) {
  (void)ctx;
  return wall_ms();
}

static void io_worker(void *ctx, bee_run_worker *w) {
  bee_train *t = ctx;
  uv_mutex_lock(&t->mu);
  const train_shared *s = &t->shared;
  *w = (bee_run_worker){.epoch = s->epoch,
                        .samples = s->samples,
                        .go = s->go,
                        .load = s->load != NULL,
                        .load_epoch = s->load_epoch,
                        .diverged = s->diverged,
                        .diverged_epoch = s->diverged_epoch,
                        .round_wanted = s->avg_req && !s->avg_done,
                        .round_answered = s->avg_done,
                        .round_state = s->avg_state,
                        .round_epoch = s->avg_epoch,
                        .round_weight = s->avg_weight,
                        .snap = s->snap != NULL,
                        .snap_epoch = s->snap ? s->snap->epoch : 0};
  uv_mutex_unlock(&t->mu);
}

static void io_guide(void *ctx, const bee_run_guide *g) {
  bee_train *t = ctx;
  uv_mutex_lock(&t->mu);
  t->shared.guide = *g;
  uv_mutex_unlock(&t->mu);
}

static void io_go(void *ctx) {
  bee_train *t = ctx;
  uv_mutex_lock(&t->mu);
  t->shared.go = true;
  uv_cond_signal(&t->go_cv);
  uv_mutex_unlock(&t->mu);
}

static void io_load(void *ctx, uint8_t *state, size_t len, uint64_t epoch) {
  (void)len; /* the core checked it against bee__snapshot_size */
  bee_train *t = ctx;
  uv_mutex_lock(&t->mu);
  free(t->shared.load);
  t->shared.load = state;
  t->shared.load_epoch = epoch;
  uv_mutex_unlock(&t->mu);
}

static void io_replay(void *ctx, uint8_t *buf, size_t len, uint64_t epoch) {
  bee_train *t = ctx;
  uv_mutex_lock(&t->mu);
  train_shared *sh = &t->shared;
  if (sh->nreplay < BEE_RUN_CATCHUP_MAX) {
    sh->replay[sh->nreplay++] = (struct replay){buf, len, epoch};
    buf = NULL;
  }
  uv_mutex_unlock(&t->mu);
  free(buf); /* more than the core sends: not expected */
}

static void io_adopt_line(void *ctx) {
  bee_train *t = ctx;
  uv_mutex_lock(&t->mu);
  t->shared.diverged = false;
  uv_mutex_unlock(&t->mu);
}

static void io_mark_diverged(void *ctx, uint64_t epoch) {
  bee_train *t = ctx;
  uv_mutex_lock(&t->mu);
  if (!t->shared.diverged) {
    t->shared.diverged = true;
    t->shared.diverged_epoch = epoch;
  }
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

/* The worker's round is over: its buffer (idle until now) gets the
 * failed spans cleared, and the worker wakes. */
static void io_round_over(void *ctx, const bee_run_result *r) {
  bee_train *t = ctx;
  uv_mutex_lock(&t->mu);
  float *buf = t->shared.avg_buf;
  size_t np = t->shared.avg_n;
  bool state = t->shared.avg_state;
  uint64_t epoch = t->shared.avg_epoch;
  uv_mutex_unlock(&t->mu);
  if (r->status == 0 && r->summary && !state && buf)
    zero_local(r->summary, buf, np, epoch);
  /* The swarm's step instead of a round: the worker steps with it. */
  bool swarm = r->swarm && buf && r->step_len == np * sizeof *buf;
  if (swarm)
    memcpy(buf, r->step, r->step_len);
  uv_mutex_lock(&t->mu);
  t->shared.avg_req = false;
  t->shared.avg_done = true;
  t->shared.avg_status = r->status;
  t->shared.avg_group = r->group;
  t->shared.avg_by_all = r->by_all;
  t->shared.avg_ahead = r->ahead;
  t->shared.avg_left = r->left;
  t->shared.avg_swarm = swarm;
  t->shared.avg_batch = r->batch;
  t->shared.avg_bytes_sent = r->bytes_sent;
  t->shared.avg_bytes_recv = r->bytes_recv;
  t->shared.avg_done_s = mono_s();
  uv_cond_signal(&t->avg_cv);
  uv_mutex_unlock(&t->mu);
}

/* ---- the DHT's records --------------------------------------------------- */

static int put(bee_train *t, const uint8_t *key, const uint8_t *buf, size_t len,
               uint64_t exp, dht_put_cb cb, void *arg) {
  if (!t->dht)
    return BEE_ECANCELED;
  return dht_put(t->dht, key, (proto_bytes){t->sub, sizeof t->sub},
                 (proto_bytes){buf, len}, exp, cb, arg);
}

/* The records of a read that are another peer's (owned subkeys), their
 * owners into ids; ours and those of another kind are left out. */
static bool others_record(const bee_train *t, const proto_dht_record *r,
                          uint8_t id[PROTO_ID_BYTES]) {
  if (r->subkey.n != sizeof t->sub)
    return false; /* the DHT checked the owned subkey: not expected */
  if (memcmp(r->subkey.p, t->sub, sizeof t->sub) == 0)
    return false; /* ours */
  proto_peer_id(r->subkey.p + 1, id);
  return true;
}

/* The others' records of a read (v, status: the read's), decoded by dec
 * into size-byte items at *out, their owners at *ids (both heap, the
 * caller frees them; NULL when there are none).  Returns how many;
 * *status becomes -ENOMEM when memory runs short (none then). */
static size_t others(const bee_train *t, int *status, const dht_value *v,
                     size_t size,
                     int (*dec)(const uint8_t *p, size_t n, void *out),
                     void **out, uint8_t (**ids)[PROTO_ID_BYTES]) {
  size_t cap = v && *status == 0 ? v->n : 0, k = 0;
  *out = NULL;
  *ids = NULL;
  if (cap == 0)
    return 0;
  uint8_t *all = calloc(cap, size);
  uint8_t(*owners)[PROTO_ID_BYTES] = calloc(cap, sizeof *owners);
  if (!all || !owners) {
    free(all);
    free(owners);
    *status = -ENOMEM;
    return 0;
  }
  for (size_t i = 0; i < cap; i++)
    if (others_record(t, &v->records[i], owners[k]) &&
        dec(v->records[i].value.p, v->records[i].value.n, all + k * size) ==
            0)
      k++;
  *out = all;
  *ids = owners;
  return k;
}

static int dec_progress(const uint8_t *p, size_t n, void *out) {
  return proto_progress_decode(p, n, out);
}

static int dec_donor(const uint8_t *p, size_t n, void *out) {
  return proto_donor_decode(p, n, out);
}

static int dec_metrics(const uint8_t *p, size_t n, void *out) {
  return proto_metrics_decode(p, n, out);
}

static void progress_put_cb(dht_node *n, int status, unsigned stored,
                            const dht_stats *st, void *arg) {
  (void)n, (void)stored, (void)st;
  bee_train *t = arg;
  bee_run_progress_stored(t->run, status);
}

static int io_put_progress(void *ctx, const proto_progress *p, uint64_t exp_s) {
  bee_train *t = ctx;
  uint8_t buf[PROTO_RECORD_MAX];
  size_t len;
  int rc = proto_progress_encode(p, buf, sizeof buf, &len);
  if (rc) { /* our own fields: checked at start-up, so a bug */
    bee_err(COMP, "progress record: %s", bee_strerror(rc));
    return rc;
  }
  return put(t, t->key, buf, len, exp_s, progress_put_cb, t);
}

static void progress_get_cb(dht_node *n, int status, const dht_value *v,
                            const dht_stats *st, void *arg) {
  (void)n, (void)st;
  bee_train *t = arg;
  void *all;
  uint8_t(*ids)[PROTO_ID_BYTES];
  /* Short of memory: a view from our own record, this time. */
  size_t k = others(t, &status, v, sizeof(proto_progress), dec_progress,
                    &all, &ids);
  bee_run_progress_read(t->run, status, all,
                        (const uint8_t(*)[PROTO_ID_BYTES])ids, k);
  free(all);
  free(ids);
}

static int io_get_progress(void *ctx) {
  bee_train *t = ctx;
  return t->dht ? dht_get(t->dht, t->key, true, progress_get_cb, t)
                : BEE_ECANCELED;
}

static void donor_put_cb(dht_node *n, int status, unsigned stored,
                         const dht_stats *st, void *arg) {
  (void)n, (void)stored, (void)st;
  bee_train *t = arg;
  bee_run_donor_stored(t->run, status);
}

static int io_put_donor(void *ctx, const proto_donor *d, uint64_t exp_s) {
  bee_train *t = ctx;
  proto_donor rec = *d;
  bee__self_addr(t, rec.addr);
  uint8_t buf[PROTO_RECORD_MAX];
  size_t len;
  int rc = proto_donor_encode(&rec, buf, sizeof buf, &len);
  if (rc)
    return rc; /* our own fields: checked at start-up */
  return put(t, t->dkey, buf, len, exp_s, donor_put_cb, t);
}

static void donors_get_cb(dht_node *n, int status, const dht_value *v,
                          const dht_stats *st, void *arg) {
  (void)n, (void)st;
  bee_train *t = arg;
  void *all;
  uint8_t(*ids)[PROTO_ID_BYTES];
  /* Short of memory: the donors in the view's order. */
  size_t k =
      others(t, &status, v, sizeof(proto_donor), dec_donor, &all, &ids);
  bee_run_donors_read(t->run, status, all,
                      (const uint8_t(*)[PROTO_ID_BYTES])ids, k);
  free(all);
  free(ids);
}

static int io_get_donors(void *ctx) {
  bee_train *t = ctx;
  return t->dht ? dht_get(t->dht, t->dkey, true, donors_get_cb, t)
                : BEE_ECANCELED;
}

static void metrics_put_cb(dht_node *n, int status, unsigned stored,
                           const dht_stats *st, void *arg) {
  (void)n, (void)stored, (void)st, (void)arg;
  if (status && status != BEE_ECANCELED)
    bee_debug(COMP, "metrics not published: %s", bee_strerror(status));
}

static int io_put_metrics(void *ctx, const proto_metrics *m, uint64_t exp_s) {
  bee_train *t = ctx;
  uint8_t buf[PROTO_RECORD_MAX];
  size_t len;
  int rc = proto_metrics_encode(m, buf, sizeof buf, &len);
  if (rc)
    return rc;
  return put(t, t->mkey, buf, len, exp_s, metrics_put_cb, NULL);
}

typedef struct metrics_ctx {
  bee_train *t;
  int which;
} metrics_ctx;

static void metrics_get_cb(dht_node *n, int status, const dht_value *v,
                           const dht_stats *st, void *arg) {
  (void)n, (void)st;
  metrics_ctx *mc = arg;
  bee_train *t = mc->t;
  int which = mc->which;
  free(mc);
  void *all;
  uint8_t(*ids)[PROTO_ID_BYTES];
  /* Short of memory: asked again later. */
  size_t k =
      others(t, &status, v, sizeof(proto_metrics), dec_metrics, &all, &ids);
  if (status == 0 && !v)
    status = -ENOENT;
  bee_run_metrics_read(t->run, which, status, all,
                       (const uint8_t(*)[PROTO_ID_BYTES])ids, k);
  free(all);
  free(ids);
}

static int io_get_metrics(void *ctx, int which) {
  bee_train *t = ctx;
  metrics_ctx *mc = malloc(sizeof *mc);
  if (!t->dht || !mc) {
    free(mc);
    return t->dht ? -ENOMEM : BEE_ECANCELED;
  }
  *mc = (metrics_ctx){t, which};
  int rc = dht_get(t->dht, t->mkey, true, metrics_get_cb, mc);
  if (rc)
    free(mc);
  return rc;
}

/* ---- the matchmaking's declarations ----------------------------------- */

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
  put(t, key, buf, len, expiration, match_put_cb, NULL);
}

typedef struct fetch_ctx {
  bee_train *t;
  avg_node *node;
} fetch_ctx;

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
        bee_run_other_layout(t->run, d[k].id);
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

/* ---- averaging --------------------------------------------------------- */

/* The averager's request for the core's a, with the worker's buffer. */
static void fill_request(bee_train *t, avg_node_request *req,
                         const bee_run_avg *a) {
  avg_node_request_default(req);
  avg_match_config *mc = &req->match;
  snprintf(mc->info.run, sizeof mc->info.run, "%s", t->cfg->run);
  mc->info.round = a->round;
  snprintf(mc->info.bits, sizeof mc->info.bits, "%s", a->bits);
  bee__self_addr(t, mc->info.addr);
  memcpy(mc->info.schema_hash, a->state ? t->state_schema : t->schema,
         sizeof t->schema);
  mc->info.mode = t->cfg->client ? PROTO_MODE_CLIENT : PROTO_MODE_NODE;
  mc->info.bandwidth_mbit = bee__links_declared(t);
  if (t->cfg->bandwidth_mbit == 0)
    req->headroom = 2; /* declared as measured: room to measure more */
  mc->info.weight = a->weight;
  mc->target_size = a->target_size;
  mc->max_size = a->max_size;
  mc->min_size = 2;
  mc->matchmaking_ms = a->matchmaking_ms;
  mc->first_start_ms = a->first_start_ms;
  mc->fetch_interval_ms = 100;
  mc->deadline_ms = a->deadline_ms;
  /* One group of every peer expected (or of the grid's line): one that
   * formed without it is the round missed; the bee learns it at once. */
  mc->end_when_formed = true;
  uv_mutex_lock(&t->mu);
  req->round.x = t->shared.avg_req ? t->shared.avg_buf : NULL;
  req->round.n = t->shared.avg_req ? t->shared.avg_n : 0;
  uv_mutex_unlock(&t->mu);
  req->round.weight = a->weight;
  if (!a->state) { /* the state travels whole */
    req->round.codec = (avg_codec)t->cfg->compression;
    req->round.residual = t->residual;
    /* An update whose norm is far beyond the group's (a diverged or
     * broken bee) moves no one far.  Not in state rounds: their values
     * are the parameters themselves, and a scaled model is none. */
    if (t->cfg->clip > 0) {
      req->round.clip = t->cfg->clip;
      req->round.clip_mode = AVG_CLIP_SCALE;
    }
  }
  req->round.deadline_ms = ROUND_DEADLINE_MS;
}

static void ahead_cb(avg_node *n, const avg_node_result *r, void *arg) {
  (void)n;
  bee_train *t = arg;
  bee_run_matched(t->run, r->status, r->group);
}

static void round_cb(avg_node *n, const avg_node_result *r, void *arg) {
  (void)n;
  bee_train *t = arg;
  bee_run_round_done(t->run, r);
}

static int io_match(void *ctx, const bee_run_avg *a) {
  bee_train *t = ctx;
  avg_node_request req;
  fill_request(t, &req, a);
  req.round.x = NULL; /* the buffer comes with the round */
  req.round.n = 0;
  return avg_node_match(t->avg, &req, ahead_cb, t);
}

static int io_average(void *ctx, const bee_run_avg *a) {
  bee_train *t = ctx;
  avg_node_request req;
  fill_request(t, &req, a);
  return avg_node_average(t->avg, &req, round_cb, t);
}

static int io_round(void *ctx, const avg_group *g, const bee_run_avg *a) {
  bee_train *t = ctx;
  avg_node_request req;
  fill_request(t, &req, a);
  return avg_node_round(t->avg, g, &req, round_cb, t);
}

static void io_cancel(void *ctx) {
  bee_train *t = ctx;
  avg_node_cancel(t->avg);
}

static bool io_matching(void *ctx) {
  bee_train *t = ctx;
  return avg_node_matching(t->avg);
}

static void io_leave(void *ctx, const avg_group *g, const char *why) {
  bee_train *t = ctx;
  avg_node_leave(t->avg, g, why);
}

static void io_wait(void *ctx, const avg_group *g) {
  bee_train *t = ctx;
  avg_node_wait(t->avg, g);
}

void bee_train_drain(bee_train *t, proto_conn *c) {
  if (t && t->avg)
    avg_node_drain(t->avg, c);
}

void bee_train_conn_down(bee_train *t, proto_conn *c) {
  if (t && t->avg)
    avg_node_conn_down(t->avg, c);
}

/* ---- the state's chunks ---------------------------------------------- */

typedef struct chunk_ctx {
  bee_train *t;
  uint64_t tag;
} chunk_ctx;

static void chunk_cb(proto_conn *c, int status, int64_t remote_code,
                     proto_bytes payload, void *arg) {
  (void)c;
  chunk_ctx *cc = arg;
  bee_train *t = cc->t;
  uint64_t tag = cc->tag;
  free(cc);
  if (t->stopped)
    return;
  proto_state_msg m;
  if (status == 0 && proto_state_decode(payload.p, payload.n, &m) != 0) {
    bee_run_chunk(t->run, tag, 0, 0, NULL);
    return;
  }
  bee_run_chunk(t->run, tag, status, remote_code, status == 0 ? &m : NULL);
}

static int io_chunk(void *ctx, const uint8_t id[PROTO_ID_BYTES], uint64_t step,
                    uint64_t offset, uint32_t len, uint64_t tag) {
  bee_train *t = ctx;
  proto_conn *c = t->host ? proto_host_find(t->host, id) : NULL;
  if (!c)
    return -ENOTCONN;
  proto_state_msg q = {.type = step == BEE_RUN_STATE ? PROTO_T_STATE_REQ
                                                     : PROTO_T_STATE_STEP_REQ,
                       .epoch = step == BEE_RUN_STATE ? 0 : step,
                       .offset = offset,
                       .len = len};
  uint8_t buf[PROTO_RUN_MAX + 64];
  size_t n;
  snprintf(q.run, sizeof q.run, "%s", t->cfg->run);
  int rc = proto_state_encode(&q, buf, sizeof buf, &n);
  if (rc)
    return rc;
  chunk_ctx *cc = malloc(sizeof *cc);
  if (!cc)
    return -ENOMEM;
  *cc = (chunk_ctx){t, tag};
  uint64_t call; /* not cancelled: a late answer finds us stopped, and the
                    core knows its tag for another download's */
  rc = proto_conn_call(c, STATE_METHOD, buf, n, STATE_CALL_MS, chunk_cb, cc,
                       &call);
  if (rc)
    free(cc);
  return rc;
}

static uint64_t io_free_slots(void *ctx) {
  bee_train *t = ctx;
  size_t busy = bee_uploads_active(&t->uploads, uv_now(t->loop));
  unsigned max = t->cfg->max_state_uploads;
  return busy < max ? max - busy : 0;
}

static const char *io_state_mismatch(void *ctx, const uint8_t *hdr) {
  return bee__snapshot_mismatch(ctx, hdr);
}

void bee__run_io(bee_train *t, bee_run_io *io) {
  *io = (bee_run_io){.ctx = t,
                     .now_ms = io_now,
                     .unix_ms = io_unix,
                     .worker = io_worker,
                     .guide = io_guide,
                     .go = io_go,
                     .load = io_load,
                     .replay = io_replay,
                     .mark_diverged = io_mark_diverged,
                     .adopt_line = io_adopt_line,
                     .round_over = io_round_over,
                     .put_progress = io_put_progress,
                     .get_progress = io_get_progress,
                     .put_donor = io_put_donor,
                     .get_donors = io_get_donors,
                     .put_metrics = io_put_metrics,
                     .get_metrics = io_get_metrics,
                     .match = io_match,
                     .average = io_average,
                     .round = io_round,
                     .cancel = io_cancel,
                     .matching = io_matching,
                     .leave = io_leave,
                     .wait = io_wait,
                     .chunk = io_chunk,
                     .free_slots = io_free_slots,
                     .state_mismatch = io_state_mismatch};
}

void bee__tick(uv_timer_t *h) {
  bee_train *t = h->data;
  uv_mutex_lock(&t->mu);
  uint64_t samples = t->shared.pend_samples;
  double compute_s = t->shared.pend_s;
  t->shared.pend_samples = 0;
  t->shared.pend_s = 0;
  uv_mutex_unlock(&t->mu);
  bee_run_tick(t->run, samples, compute_s);
  bee__links_tick(t);
}
