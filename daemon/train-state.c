/* train-state.c: snapshots of a bee's training state (parameters,
 * optimizer state and steps, buffers; BLAKE2b-256 checksummed), made by
 * the worker after each step: served to peers with "state.get"
 * (docs/PROTOCOL.md section 12; a bee behind the swarm downloads them,
 * run-fetch.c), and written as checkpoints by a thread of their own
 * (ckpt.c has the file format).
 */
#include "train-int.h"

/* ---- snapshots: what a donor serves, what a newcomer loads ------------- */

/* The state's float arrays in the order snapshots and state rounds use:
 * parameters, the optimizer's state, DiLoCo's outer state (its
 * momentum), buffers; one that does not exist has length 0.  Returns the
 * floats of the first k. */
size_t bee__state_parts(bee_train *t, size_t k, float *part[STATE_PARTS],
                        size_t len[STATE_PARTS]) {
  part[0] = bee__params(t);
  len[0] = bee__nparams(t);
  part[1] = bee__optim_state(t, &len[1]);
  part[2] = NULL;
  len[2] = 0;
  if (t->outer)
    part[2] = trn_optim_state(t->outer, &len[2]);
  part[3] = bee__buffers(t, &len[3]);
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
           bee_averaging_name(t->cfg->averaging), bee__optim_name(t), t->desc,
           bee__nparams(t));
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
  put_u64(b + 24, t->ext ? 0 : trn_optim_steps(t->optim));
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
  s->local[2] = t->ext ? 0 : trn_model_dropout_calls(t->model);
  float scale = t->ext ? 0 : trn_model_loss_scale(t->model, NULL);
  uint32_t bits;
  memcpy(&bits, &scale, sizeof bits);
  s->local[3] = bits;
  bee__state_pack(t, STATE_PARTS, b + STATE_HDR);
  crypto_generichash(s->sum, sizeof s->sum, b, len, NULL, 0);
  uv_mutex_lock(&t->mu);
  bee__snap_unref(t->shared.snap); /* downloads under way keep theirs */
  t->shared.snap = s;
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
  if (!t->ext) /* a trainer process's steps are in its state */
    trn_optim_set_steps(t->optim, get_u64(b + 24));
  if (t->outer) /* the snapshot is taken right after an outer step */
    trn_optim_set_steps(t->outer, epoch);
  uv_mutex_lock(&t->mu);
  t->shared.epoch = epoch;
  t->shared.samples = 0;
  t->shared.loss_sum = 0;
  uv_mutex_unlock(&t->mu);
}

/* ---- the steps taken, for peers to take ------------------------------- */

void bee__log_step(bee_train *t, uint64_t epoch, const float *g, size_t n) {
  if (!t->steps_kept)
    return;
  size_t len = g ? n * sizeof *g : 0;
  /* A full log's oldest step goes; its buffer takes the new one where it
   * fits: no allocation (and its page faults) at every step.  Only the
   * worker changes the log, so it stays as it is until we add to it. */
  bee_step *s = NULL;
  uv_mutex_lock(&t->mu);
  train_shared *sh = &t->shared;
  if (sh->nstep_log == t->steps_kept) {
    s = sh->step_log[0];
    memmove(sh->step_log, sh->step_log + 1,
            (sh->nstep_log - 1) * sizeof *sh->step_log);
    sh->nstep_log--;
  }
  uv_mutex_unlock(&t->mu);
  if (s && s->len != len) {
    free(s);
    s = NULL;
  }
  if (!s)
    s = malloc(sizeof *s + len);
  if (!s) { /* no step kept: a peer that needs it downloads the state */
    bee__forget_steps(t);
    return;
  }
  s->epoch = epoch;
  s->len = len;
  if (len)
    memcpy(s->data, g, len);
  crypto_generichash(s->sum, sizeof s->sum, s->data, len, NULL, 0);
  uv_mutex_lock(&t->mu);
  /* Steps follow each other: one after a gap (a state loaded, forgotten
   * steps) starts the log afresh. */
  if (sh->nstep_log && sh->step_log[sh->nstep_log - 1]->epoch + 1 != epoch) {
    for (size_t i = 0; i < sh->nstep_log; i++)
      free(sh->step_log[i]);
    sh->nstep_log = 0;
  }
  sh->step_log[sh->nstep_log++] = s;
  uv_mutex_unlock(&t->mu);
}

void bee__forget_steps(bee_train *t) {
  uv_mutex_lock(&t->mu);
  for (size_t i = 0; i < t->shared.nstep_log; i++)
    free(t->shared.step_log[i]);
  t->shared.nstep_log = 0;
  uv_mutex_unlock(&t->mu);
}

/* ---- checkpoints: the writer thread --------------------------------------- */

/* Writes the latest snapshot (a copy taken under mu, so training goes on)
 * when asked; the last request before stopping is written too. */
static void ckpt_write_latest(bee_train *t) {
  uv_mutex_lock(&t->mu);
  bee_snap *s = t->shared.snap;
  size_t len = s ? s->len : 0;
  uint64_t epoch = s ? s->epoch : 0;
  uint8_t *copy = s && (!t->shared.ckpt_any || epoch != t->shared.ckpt_written)
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
  t->shared.ckpt_written = epoch;
  t->shared.ckpt_any = true;
  uv_mutex_unlock(&t->mu);
  bee_info(COMP, "checkpoint: epoch %llu in %s", (unsigned long long)epoch,
           path);
}

void bee__ckpt_writer(void *arg) {
  bee_train *t = arg;
  for (;;) {
    uv_mutex_lock(&t->mu);
    while (!t->shared.ckpt_req && !t->shared.ckpt_stop)
      uv_cond_wait(&t->ckpt_cv, &t->mu);
    bool req = t->shared.ckpt_req, stop = t->shared.ckpt_stop;
    t->shared.ckpt_req = false;
    uv_mutex_unlock(&t->mu);
    if (req)
      ckpt_write_latest(t);
    if (stop)
      return;
  }
}

/* ---- serving the state (loop thread) ------------------------------------ */

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
static bee_upload *upload_admit(bee_train *t, proto_conn *c, uint64_t req,
                                const proto_state_msg *q) {
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
  if (fresh) {
    /* An asker that begins with the header alone pipelines its requests:
     * it says when it is done (a request at the state's end). */
    up->until_release = q->offset == 0 && q->len <= STATE_HDR;
    bee_info(COMP, "state: serving %s (%zu of at most %u downloads)", id8,
             t->uploads.n, t->cfg->max_state_uploads);
  }
  return up;
}

/* Under mu, which it releases: the answer to request q, bytes [offset,
 * offset + len) of a snapshot's or a step's (data, total, sum) as a
 * message of type; counted against the upload up.  Returns the bytes
 * sent, and whether it went (*rc 0). */
static size_t reply_part(bee_train *t, proto_conn *c, uint64_t id,
                         const proto_state_msg *q, bee_upload *up, int type,
                         uint64_t epoch, const uint8_t *data, size_t total,
                         const uint8_t *sum, const char *what, int *rc) {
  size_t n = total - q->offset;
  if (n > q->len)
    n = q->len;
  proto_state_msg m = {.type = type,
                       .epoch = epoch,
                       .total = total,
                       .offset = q->offset,
                       .data = {data + q->offset, n}};
  memcpy(m.run, q->run, sizeof m.run);
  memcpy(m.checksum, sum, sizeof m.checksum);
  size_t cap = n + 256, len;
  uint8_t *buf = malloc(cap);
  *rc = buf ? proto_state_encode(&m, buf, cap, &len) : -ENOMEM;
  uv_mutex_unlock(&t->mu);
  if (*rc)
    proto_conn_reply_error(c, id, *rc, what);
  else
    proto_conn_reply(c, id, buf, len);
  free(buf);
  up->bytes += n;
  return n;
}

/* A peer asks for the step we took from q->epoch: its bytes [offset,
 * offset + len), while we keep it and are in line. */
static void serve_step(bee_train *t, proto_conn *c, uint64_t id,
                       const proto_state_msg *q, bee_upload *up) {
  uv_mutex_lock(&t->mu);
  const bee_step *s = NULL;
  for (size_t i = 0; i < t->shared.nstep_log && !t->shared.diverged; i++)
    if (t->shared.step_log[i]->epoch == q->epoch)
      s = t->shared.step_log[i];
  if (!s || q->offset > s->len) {
    uv_mutex_unlock(&t->mu);
    proto_conn_reply_error(c, id, BEE_ERANGE,
                           s ? "offset past the step" : "no such step here");
    /* An upload that has served nothing ends: a peer that asks for a step
     * we have not taken yet (it polls while we average) holds no slot. */
    if (up->bytes == 0) {
      if (up->pin)
        upload_unpin(up->pin, t);
      bee_uploads_end(&t->uploads, up);
    }
    return;
  }
  int rc;
  reply_part(t, c, id, q, up, PROTO_T_STATE_STEP, s->epoch, s->data, s->len,
             s->sum, "cannot send the step", &rc);
}

/* A peer asks for our state: the bytes of the latest snapshot. */
void bee__state_req_cb(proto_conn *c, uint64_t id, proto_bytes method,
                         proto_bytes payload, void *data) {
  (void)method;
  bee_train *t = data;
  proto_state_msg q;
  if (proto_state_decode(payload.p, payload.n, &q) ||
      (q.type != PROTO_T_STATE_REQ && q.type != PROTO_T_STATE_STEP_REQ)) {
    proto_conn_reply_error(c, id, BEE_EMALFORMED, "bad state request");
    return;
  }
  if (strcmp(q.run, t->cfg->run) != 0) {
    proto_conn_reply_error(c, id, BEE_ERANGE, "not training in that run");
    return;
  }
  /* The uploads table is the loop's: admitted before the lock. */
  bee_upload *up = upload_admit(t, c, id, &q);
  if (!up)
    return;
  if (q.type == PROTO_T_STATE_STEP_REQ) {
    serve_step(t, c, id, &q, up);
    return;
  }
  uv_mutex_lock(&t->mu);
  /* A download gets the snapshot it started on to its end; one that
   * starts (over) at offset 0 gets the latest. */
  if (t->shared.snap && (q.offset == 0 || !up->pin)) {
    bee__snap_unref(up->pin);
    up->pin = t->shared.snap;
    t->shared.snap->refs++;
  }
  const bee_snap *s = up->pin;
  if (!s || q.offset > s->len) {
    const char *why = s ? "offset past the state" : "no state yet";
    uv_mutex_unlock(&t->mu);
    proto_conn_reply_error(c, id, BEE_ERANGE, why);
    return;
  }
  int rc;
  uint64_t total = s->len;
  size_t n = reply_part(t, c, id, &q, up, PROTO_T_STATE_CHUNK, s->epoch,
                        s->data, s->len, s->sum, "cannot send the state", &rc);
  /* The state's end ends the download: the last chunk for an asker that
   * fetches chunk after chunk, the request at the end itself (nothing to
   * send) for one that asks for several at once and of several donors
   * (until_release): it sends it once it has the whole. */
  if (rc == 0 && q.offset + n == total && (n == 0 || !up->until_release)) {
    char id8[9];
    bee_id8(up->id, id8);
    bee_info(COMP, "state: done serving %s (%.1f MiB sent in %.1f s)", id8,
             (double)up->bytes / (1 << 20),
             (double)(uv_now(t->loop) - up->start_ms) / 1000);
    upload_unpin(up->pin, t);
    bee_uploads_end(&t->uploads, up);
  }
}
