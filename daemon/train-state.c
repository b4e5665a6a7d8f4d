/* train-state.c: snapshots of a bee's training state (parameters,
 * optimizer state and steps, buffers; BLAKE2b-256 checksummed), made by
 * the worker after each step: served to peers with "state.get"
 * (docs/PROTOCOL.md section 12), downloaded from them by a bee behind the
 * swarm, and written as checkpoints by a thread of their own (ckpt.c has
 * the file format).
 */
#include "train-int.h"

/* ---- snapshots: what a donor serves, what a newcomer loads ------------- */

/* The state's float arrays in the order snapshots and state rounds use:
 * parameters, the optimizer's state, DiLoCo's outer state (its
 * momentum), buffers; one that does not exist has length 0.  Returns the
 * floats of the first k. */
size_t bee__state_parts(bee_train *t, size_t k, float *part[STATE_PARTS],
                        size_t len[STATE_PARTS]) {
  part[0] = trn_model_params(t->m);
  len[0] = trn_model_nparams(t->m);
  part[1] = trn_optim_state(t->o, &len[1]);
  part[2] = NULL;
  len[2] = 0;
  if (t->outer)
    part[2] = trn_optim_state(t->outer, &len[2]);
  part[3] = trn_model_buffers(t->m, &len[3]);
  size_t n = 0;
  for (size_t i = 0; i < k && i < STATE_PARTS; i++)
    n += len[i];
  return n;
}

void bee__state_pack(bee_train *t, size_t k, uint8_t *dst) {
  float *part[STATE_PARTS];
  size_t len[STATE_PARTS];
  bee__state_parts(t, k, part, len);
  for (size_t i = 0; i < k; i++) {
    if (len[i])
      memcpy(dst, part[i], len[i] * sizeof(float));
    dst += len[i] * sizeof(float);
  }
}

void bee__state_unpack(bee_train *t, size_t k, const uint8_t *src) {
  float *part[STATE_PARTS];
  size_t len[STATE_PARTS];
  bee__state_parts(t, k, part, len);
  for (size_t i = 0; i < k; i++) {
    if (len[i])
      memcpy(part[i], src, len[i] * sizeof(float));
    src += len[i] * sizeof(float);
  }
  if (t->anchor) /* a state is always one right after an outer step */
    memcpy(t->anchor, part[0], len[0] * sizeof(float));
}

/* The snapshot's size for this model: a header of four little-endian
 * u64 (parameters, optimizer state, buffers, optimizer steps), then the
 * state's arrays (bee__state_parts).  With DiLoCo the optimizer state
 * counts the local optimizer's and the outer one's; the outer step count
 * is the epoch's. */
size_t bee__snapshot_size(bee_train *t) {
  float *part[STATE_PARTS];
  size_t len[STATE_PARTS];
  return STATE_HDR +
         bee__state_parts(t, STATE_PARTS, part, len) * sizeof(float);
}

static void put_u64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_u64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++)
    v |= (uint64_t)p[i] << (8 * i);
  return v;
}

/* The header's three counts for this bee. */
static void snapshot_counts(bee_train *t, uint64_t c[3]) {
  float *part[STATE_PARTS];
  size_t len[STATE_PARTS];
  bee__state_parts(t, STATE_PARTS, part, len);
  c[0] = len[0];
  c[1] = len[1] + len[2];
  c[2] = len[3];
}

/* BLAKE2b-256 of what gives the state's arrays their meaning. */
static void snapshot_schema(bee_train *t, uint8_t out[32]) {
  char s[256];
  snprintf(s, sizeof s, "beed snapshot fp32 %s %s %s %zu",
           bee_averaging_name(t->cfg->averaging),
           bee_optimizer_name(t->cfg->optimizer), t->desc,
           trn_model_nparams(t->m));
  crypto_generichash(out, 32, (const uint8_t *)s, strlen(s), NULL, 0);
}

const char *bee__snapshot_mismatch(bee_train *t, const uint8_t *b) {
  uint64_t c[3];
  uint8_t schema[32];
  snapshot_counts(t, c);
  if (get_u64(b) != c[0] || get_u64(b + 8) != c[1] || get_u64(b + 16) != c[2])
    return "a state of another shape (another model, optimizer or "
           "averaging mode)";
  snapshot_schema(t, schema);
  if (memcmp(b + 32, schema, sizeof schema) != 0)
    return "a state for another model, optimizer or averaging mode (the same "
           "size, another meaning)";
  return NULL;
}

void bee__snap_unref(bee_snap *s) {
  if (s && --s->refs == 0)
    free(s);
}

/* Worker: the state after the step that began epoch, for donors. */
void bee__make_snapshot(bee_train *t, uint64_t epoch) {
  size_t len = bee__snapshot_size(t);
  bee_snap *s = malloc(sizeof *s + len);
  if (!s)
    return; /* no new snapshot: donors serve the last one */
  uint8_t *b = s->data;
  s->refs = 1;
  s->epoch = epoch;
  s->len = len;
  uint64_t c[3];
  snapshot_counts(t, c);
  for (int i = 0; i < 3; i++)
    put_u64(b + 8 * i, c[i]);
  put_u64(b + 24, trn_optim_steps(t->o));
  snapshot_schema(t, b + 32);
  /* The data order as of the next batch (the loader's batches made ahead
   * do not count), for this bee's checkpoints. */
  trn_order o;
  memset(s->local, 0, sizeof s->local);
  if (t->src && trn_source_order(t->src, &o) == 0) {
    s->local[0] = o.epoch;
    s->local[1] = o.pos;
    trn_order_free(&o);
  }
  s->local[2] = trn_model_dropout_calls(t->m);
  float scale = trn_model_loss_scale(t->m, NULL);
  uint32_t bits;
  memcpy(&bits, &scale, sizeof bits);
  s->local[3] = bits;
  bee__state_pack(t, STATE_PARTS, b + STATE_HDR);
  crypto_generichash(s->sum, sizeof s->sum, b, len, NULL, 0);
  uv_mutex_lock(&t->mu);
  bee__snap_unref(t->sh.snap); /* downloads under way keep theirs */
  t->sh.snap = s;
  uv_mutex_unlock(&t->mu);
}

void bee__ckpt_local(const uint8_t *b, size_t n, uint64_t local[CKPT_NLOCAL]) {
  for (size_t i = 0; i < CKPT_NLOCAL; i++)
    local[i] = 8 * i + 8 <= n ? get_u64(b + 8 * i) : 0;
}

/* Worker: loads a snapshot the loop checked (size, checksum and shape),
 * as of its epoch: parameters, optimizer state and steps, buffers; no
 * gradients, no samples. */
void bee__load_snapshot(bee_train *t, const uint8_t *b, uint64_t epoch) {
  bee__state_unpack(t, STATE_PARTS, b + STATE_HDR);
  trn_optim_set_steps(t->o, get_u64(b + 24));
  if (t->outer) /* the snapshot is taken right after an outer step */
    trn_optim_set_steps(t->outer, epoch);
  uv_mutex_lock(&t->mu);
  t->sh.epoch = epoch;
  t->sh.samples = 0;
  t->sh.loss_sum = 0;
  uv_mutex_unlock(&t->mu);
}

/* ---- checkpoints: the writer thread --------------------------------------- */

/* Writes the latest snapshot (a copy taken under mu, so training goes on)
 * when asked; the last request before stopping is written too. */
static void ckpt_write_latest(bee_train *t) {
  uv_mutex_lock(&t->mu);
  bee_snap *s = t->sh.snap;
  size_t len = s ? s->len : 0;
  uint64_t epoch = s ? s->epoch : 0;
  uint8_t *copy = s && (!t->sh.ckpt_any || epoch != t->sh.ckpt_written)
                      ? malloc(len + CKPT_LOCAL)
                      : NULL;
  if (copy) {
    memcpy(copy, s->data, len);
    for (int i = 0; i < CKPT_NLOCAL; i++)
      put_u64(copy + len + 8 * i, s->local[i]);
    len += CKPT_LOCAL;
  }
  uv_mutex_unlock(&t->mu);
  if (!copy)
    return; /* nothing new since the last one */
  char path[BEE_PATH_MAX + 96], err[BEE_PATH_MAX + 160];
  int rc = bee_ckpt_write(t->cfg->checkpoint_dir, t->cfg->run, epoch, copy,
                          len, t->cfg->keep_checkpoints, path, sizeof path,
                          err, sizeof err);
  free(copy);
  if (rc) {
    bee_warn(COMP, "%s", err); /* training goes on; the next one may do */
    return;
  }
  uv_mutex_lock(&t->mu);
  t->sh.ckpt_written = epoch;
  t->sh.ckpt_any = true;
  uv_mutex_unlock(&t->mu);
  bee_info(COMP, "checkpoint: epoch %llu in %s", (unsigned long long)epoch,
           path);
}

void bee__ckpt_writer(void *arg) {
  bee_train *t = arg;
  for (;;) {
    uv_mutex_lock(&t->mu);
    while (!t->sh.ckpt_req && !t->sh.ckpt_stop)
      uv_cond_wait(&t->ckpt_cv, &t->mu);
    bool req = t->sh.ckpt_req, stop = t->sh.ckpt_stop;
    t->sh.ckpt_req = false;
    uv_mutex_unlock(&t->mu);
    if (req)
      ckpt_write_latest(t);
    if (stop)
      return;
  }
}

/* ---- state download (loop thread) ---------------------------------------- */

void bee__set_go(bee_train *t) {
  uv_mutex_lock(&t->mu);
  bool was = t->sh.go;
  uint64_t epoch = t->sh.load ? t->sh.load_epoch : t->sh.epoch;
  t->sh.go = true;
  uv_cond_signal(&t->go_cv);
  uv_mutex_unlock(&t->mu);
  if (!was)
    bee_info(COMP, "training starts at epoch %llu",
             (unsigned long long)epoch);
}

static void fetch_next(bee_train *t);
static void fetch_from_next_donor(bee_train *t);

static void fetch_failed(bee_train *t, const char *why) {
  char id8[9];
  bee_id8(t->fpeer, id8);
  bee_warn(COMP, "state from %s: %s", id8, why);
  free(t->fbuf);
  t->fbuf = NULL;
  fetch_from_next_donor(t);
}

static void fetch_cb(proto_conn *c, int status, int64_t remote_code,
                     proto_bytes payload, void *arg) {
  (void)c;
  bee_train *t = arg;
  char why[160];
  if (t->stopped || !t->fetching)
    return;
  if (status == BEE_EREMOTE && remote_code == BEE_ELIMIT) {
    t->fbusy++;
    fetch_failed(t, "busy serving other downloads");
    return;
  }
  if (status) {
    snprintf(why, sizeof why, "%s",
             bee_strerror(status == BEE_EREMOTE ? (int)remote_code : status));
    fetch_failed(t, why);
    return;
  }
  proto_state_msg m;
  int rc = proto_state_decode(payload.p, payload.n, &m);
  if (rc || m.type != PROTO_T_STATE_CHUNK || strcmp(m.run, t->cfg->run) != 0 ||
      m.offset != t->foffset) {
    snprintf(why, sizeof why, "a malformed answer (%s)",
             rc ? bee_strerror(rc) : "not the chunk asked for");
    fetch_failed(t, why);
    return;
  }
  if (m.total != bee__snapshot_size(t)) {
    snprintf(why, sizeof why,
             "a state of %llu bytes, where this model's takes %zu",
             (unsigned long long)m.total, bee__snapshot_size(t));
    fetch_failed(t, why);
    return;
  }
  if (t->foffset == 0) {
    free(t->fbuf);
    t->fbuf = malloc(m.total);
    if (!t->fbuf) {
      fetch_failed(t, "out of memory");
      return;
    }
    t->ftotal = m.total;
    t->fepoch = m.epoch;
    memcpy(t->fsum, m.checksum, sizeof t->fsum);
  } else if (m.epoch != t->fepoch ||
             memcmp(m.checksum, t->fsum, sizeof t->fsum) != 0) {
    /* The donor stepped meanwhile: start over on its new snapshot. */
    if (++t->frestarts > STATE_RESTARTS) {
      fetch_failed(t, "its state kept changing under the download");
      return;
    }
    t->foffset = 0;
    fetch_next(t);
    return;
  }
  if (m.data.n == 0 && t->foffset < t->ftotal) {
    fetch_failed(t, "an empty chunk before the end");
    return;
  }
  memcpy(t->fbuf + t->foffset, m.data.p, m.data.n);
  /* The header is in the first chunk: a state this bee cannot use is
   * refused before the rest is fetched. */
  const char *bad;
  if (t->foffset == 0 && m.data.n >= STATE_HDR &&
      (bad = bee__snapshot_mismatch(t, t->fbuf))) {
    fetch_failed(t, bad);
    return;
  }
  t->foffset += m.data.n;
  uint64_t pct = t->foffset * 100 / t->ftotal;
  char id8[9];
  bee_id8(t->fpeer, id8);
  if (pct / 25 > t->fshown / 25 || t->foffset == t->ftotal) {
    t->fshown = pct;
    bee_info(COMP, "state: %llu%% of %.1f MiB from %s (epoch %llu)",
             (unsigned long long)pct, (double)t->ftotal / (1 << 20), id8,
             (unsigned long long)t->fepoch);
  }
  if (t->foffset < t->ftotal) {
    fetch_next(t);
    return;
  }
  uint8_t sum[PROTO_STATE_SUM_BYTES];
  crypto_generichash(sum, sizeof sum, t->fbuf, t->ftotal, NULL, 0);
  if (memcmp(sum, t->fsum, sizeof sum) != 0) {
    fetch_failed(t, "the checksum does not match");
    return;
  }
  if ((bad = bee__snapshot_mismatch(t, t->fbuf))) {
    fetch_failed(t, bad);
    return;
  }
  uint64_t took = uv_now(t->loop) - t->fstart_ms;
  t->flast_s = (double)took / 1000;
  t->fsettle_ms = uv_now(t->loop) +
                  (2 * took > FETCH_SETTLE_MS ? 2 * took : FETCH_SETTLE_MS);
  bee_info(COMP, "state: loaded epoch %llu from %s in %.1f s",
           (unsigned long long)t->fepoch, id8, (double)took / 1000);
  uv_mutex_lock(&t->mu);
  free(t->sh.load);
  t->sh.load = t->fbuf;
  t->sh.load_epoch = t->fepoch;
  uv_mutex_unlock(&t->mu);
  bee__set_go(t);
  bee__round_moot(t, t->fepoch);
  t->fbuf = NULL;
  t->fetching = false;
  t->fbackoff_ms = 0;
  t->ffailed = 0;
}

static void fetch_next(bee_train *t) {
  proto_state_msg q = {.type = PROTO_T_STATE_REQ,
                       .offset = t->foffset,
                       .len = STATE_CHUNK};
  uint8_t buf[PROTO_RUN_MAX + 64];
  size_t len;
  snprintf(q.run, sizeof q.run, "%s", t->cfg->run);
  uint64_t call; /* not cancelled: a late answer finds us stopped */
  int rc = proto_state_encode(&q, buf, sizeof buf, &len);
  if (rc == 0)
    rc = proto_conn_call(t->fconn, STATE_METHOD, buf, len, STATE_CALL_MS,
                         fetch_cb, t, &call);
  if (rc)
    fetch_failed(t, bee_strerror(rc));
}

/* The next donor we have a connection to.  None left: ask again later
 * (the view's refresh does, from t->fretry_ms) and stay where we are, for
 * as long as donors are only busy, and for FETCH_PASSES passes in a row
 * when they failed (a connection replaced under the download, a chunk
 * that timed out on a slow link); after that, train on from here. */
static void fetch_from_next_donor(bee_train *t) {
  while (t->fdonor < t->ndonors) {
    const uint8_t *id = t->donors[t->fdonor++];
    proto_conn *c = proto_host_find(t->host, id);
    if (!c)
      continue;
    t->fconn = c;
    memcpy(t->fpeer, id, PROTO_ID_BYTES);
    t->foffset = 0;
    t->frestarts = 0;
    t->fshown = 0;
    t->fstart_ms = uv_now(t->loop);
    fetch_next(t);
    return;
  }
  t->fetching = false;
  bool failed = !t->fbusy;
  if (!failed || ++t->ffailed < FETCH_PASSES) {
    t->fbackoff_ms = t->fbackoff_ms ? 2 * t->fbackoff_ms : FETCH_BACKOFF_MS;
    if (t->fbackoff_ms > FETCH_BACKOFF_MAX_MS)
      t->fbackoff_ms = FETCH_BACKOFF_MAX_MS;
    t->fretry_ms = uv_now(t->loop) + t->fbackoff_ms;
    if (failed)
      bee_warn(COMP,
               "state: no donor could serve it (pass %u of %d); asking "
               "again in %.0f s",
               t->ffailed, FETCH_PASSES, (double)t->fbackoff_ms / 1000);
    else
      bee_info(COMP,
               "state: %u of %zu donors busy serving others; asking again "
               "in %.0f s",
               t->fbusy, t->ndonors, (double)t->fbackoff_ms / 1000);
    return;
  }
  t->ffailed = 0;
  t->fbackoff_ms = 0;
  bee_warn(COMP, "state: no donor could serve it; training on from here");
  bee__set_go(t);
}

/* The donors' records: the ones with free download slots first (most
 * first), those without a record next, those that say they are full
 * last; then the download starts. */
static void donors_cb(dht_node *n, int status, const dht_value *v,
                      const dht_stats *st, void *arg) {
  (void)n, (void)st;
  bee_train *t = arg;
  if (t->stopped || !t->fetching)
    return;
  int64_t rank[DONORS_MAX]; /* slots; -1 no record; -2 full */
  size_t with = 0;
  for (size_t i = 0; i < t->ndonors; i++)
    rank[i] = -1;
  for (size_t j = 0; status == 0 && v && j < v->n; j++) {
    const proto_dht_record *r = &v->records[j];
    uint8_t id[PROTO_ID_BYTES];
    proto_donor d;
    if (r->subkey.n != PROTO_DHT_OWNED_SUBKEY_BYTES ||
        proto_donor_decode(r->value.p, r->value.n, &d) ||
        strcmp(d.run, t->cfg->run) != 0)
      continue;
    proto_peer_id(r->subkey.p + 1, id);
    for (size_t i = 0; i < t->ndonors; i++)
      if (memcmp(id, t->donors[i], PROTO_ID_BYTES) == 0) {
        rank[i] = d.slots ? (int64_t)d.slots : -2;
        with += d.slots > 0;
      }
  }
  for (size_t i = 1; i < t->ndonors; i++) /* stable: the view's order */
    for (size_t j = i; j > 0 && rank[j] > rank[j - 1]; j--) {
      int64_t r = rank[j];
      rank[j] = rank[j - 1];
      rank[j - 1] = r;
      uint8_t id[PROTO_ID_BYTES];
      memcpy(id, t->donors[j], PROTO_ID_BYTES);
      memcpy(t->donors[j], t->donors[j - 1], PROTO_ID_BYTES);
      memcpy(t->donors[j - 1], id, PROTO_ID_BYTES);
    }
  bee_info(COMP, "state: %zu donors at the swarm's epoch, %zu with a free "
                 "download slot by their records",
           t->ndonors, with);
  fetch_from_next_donor(t);
}

double bee__join_s(const bee_train *t) {
  double mm = t->cfg->no_match_ahead ? 0 : t->cfg->matchmaking_s;
  return t->flast_s + mm + FETCH_TRAVEL_S;
}

double bee__epoch_s(const bee_train *t) {
  const proto_swarm_view *w = &t->view;
  if (t->outer && w->peers_at_epoch && w->rate_at_epoch > 0)
    return (double)bee_config_inner_steps(t->cfg) * t->cfg->batch_size /
           (w->rate_at_epoch / (double)w->peers_at_epoch);
  if (!t->outer && w->samples_per_second > 0)
    return t->cfg->target_batch_size / w->samples_per_second;
  return -1;
}

bool bee__fetch_wait(bee_train *t) {
  /* DiLoCo's round comes when the others' inner steps end; with
   * --delay-averaging an epoch's round runs through the next, and does
   * not follow the view's time to the target. */
  double eta = t->view.eta_s;
  if (t->dgrad)
    eta = -1;
  else if (t->outer)
    eta = t->swarm_due_s > 0 ? fmax(t->swarm_due_s - mono_s(), 0) : -1;
  double mm = t->cfg->no_match_ahead ? 0 : t->cfg->matchmaking_s;
  double join = bee__join_s(t);
  /* An epoch shorter than that cannot be joined at its start either (a
   * swarm that gathers its target faster than records travel forms each
   * epoch's group as soon as it steps): no wait, the state lands where it
   * may (mlp, 4 bees, target 4,096: a newcomer that waited for the step
   * came after the group in 2 runs of 3; one that did not, before it in
   * 3 of 3). */
  double epoch_s = bee__epoch_s(t);
  if (epoch_s >= 0 && epoch_s < join)
    eta = -1;
  bool was = t->fdefer.on;
  bool wait = bee_fetch_defer(&t->fdefer, eta, join, t->view.epoch,
                              uv_now(t->loop));
  if (wait && !was) {
    char last[48] = "";
    if (t->flast_s > 0)
      snprintf(last, sizeof last, ", the last download's %.1f",
               t->flast_s);
    bee_info(COMP,
             "state: the swarm expects its %s in %.1f s, before this "
             "bee could join the epoch's group (%.1f s: the matchmaking's "
             "%.1f%s, the records' travel %.1f): the download waits for "
             "the swarm's next step",
             t->outer ? "round" : "target", eta, join, mm, last,
             FETCH_TRAVEL_S);
  }
  return wait;
}

void bee__start_fetch(bee_train *t) {
  bee_fetch_started(&t->fdefer);
  t->fetching = true;
  t->fdonor = 0;
  t->fbusy = 0;
  if (!t->dht || dht_get(t->dht, t->dkey, true, donors_cb, t) != 0)
    fetch_from_next_donor(t);
}

/* An upload lapsed (its peer stopped asking): its snapshot may go. */
static void upload_unpin(void *pin, void *arg) {
  bee_train *t = arg;
  uv_mutex_lock(&t->mu);
  bee__snap_unref(pin);
  uv_mutex_unlock(&t->mu);
}

/* Admits a chunk request of peer c into the uploads we serve, logging a
 * download's start and a refusal (at most every 10 s).  Returns the
 * upload, or NULL when the peer was told it is busy. */
static bee_upload *upload_admit(bee_train *t, proto_conn *c, uint64_t req) {
  const proto_peer *p = proto_conn_peer(c);
  char id8[9];
  bee_id8(p->id, id8);
  bool fresh;
  uint64_t now = uv_now(t->loop);
  bee_upload *up =
      bee_uploads_admit(&t->uploads, p->id, now, t->cfg->max_state_uploads,
                        &fresh, upload_unpin, t);
  if (!up) {
    if (!t->busy_logged_ms || now - t->busy_logged_ms >= 10000) {
      t->busy_logged_ms = now;
      bee_info(COMP,
               "state: %s asks while %zu downloads run "
               "(--max-state-uploads); told it is busy",
               id8, t->uploads.n);
    }
    proto_conn_reply_error(c, req, BEE_ELIMIT, "busy serving other downloads");
    return NULL;
  }
  if (fresh)
    bee_info(COMP, "state: serving %s (%zu of at most %u downloads)", id8,
             t->uploads.n, t->cfg->max_state_uploads);
  return up;
}

/* A peer asks for our state: the bytes of the latest snapshot. */
void bee__state_req_cb(proto_conn *c, uint64_t id, proto_bytes method,
                         proto_bytes payload, void *data) {
  (void)method;
  bee_train *t = data;
  proto_state_msg q;
  if (proto_state_decode(payload.p, payload.n, &q) ||
      q.type != PROTO_T_STATE_REQ) {
    proto_conn_reply_error(c, id, BEE_EMALFORMED, "bad state request");
    return;
  }
  if (strcmp(q.run, t->cfg->run) != 0) {
    proto_conn_reply_error(c, id, BEE_ERANGE, "not training in that run");
    return;
  }
  /* The uploads table is the loop's: admitted before the lock. */
  bee_upload *up = upload_admit(t, c, id);
  if (!up)
    return;
  uv_mutex_lock(&t->mu);
  /* A download gets the snapshot it started on to its end; one that
   * starts (over) at offset 0 gets the latest. */
  if (t->sh.snap && (q.offset == 0 || !up->pin)) {
    bee__snap_unref(up->pin);
    up->pin = t->sh.snap;
    t->sh.snap->refs++;
  }
  const bee_snap *s = up->pin;
  if (!s || q.offset > s->len) {
    const char *why = s ? "offset past the state" : "no state yet";
    uv_mutex_unlock(&t->mu);
    proto_conn_reply_error(c, id, BEE_ERANGE, why);
    return;
  }
  size_t n = s->len - q.offset;
  if (n > q.len)
    n = q.len;
  proto_state_msg m = {.type = PROTO_T_STATE_CHUNK,
                       .epoch = s->epoch,
                       .total = s->len,
                       .offset = q.offset,
                       .data = {s->data + q.offset, n}};
  memcpy(m.run, q.run, sizeof m.run);
  memcpy(m.checksum, s->sum, sizeof m.checksum);
  size_t cap = n + 256, len;
  uint8_t *buf = malloc(cap);
  int rc = buf ? proto_state_encode(&m, buf, cap, &len) : -ENOMEM;
  uv_mutex_unlock(&t->mu);
  if (rc)
    proto_conn_reply_error(c, id, rc, "cannot send the state");
  else
    proto_conn_reply(c, id, buf, len);
  free(buf);
  up->bytes += n;
  if (rc == 0 && q.offset + n == m.total) { /* it has the last chunk */
    char id8[9];
    bee_id8(up->id, id8);
    bee_info(COMP, "state: %s has it all (%.1f MiB sent in %.1f s)", id8,
             (double)up->bytes / (1 << 20),
             (double)(uv_now(t->loop) - up->start_ms) / 1000);
    upload_unpin(up->pin, t);
    bee_uploads_end(&t->uploads, up);
  }
}
