/* run-fetch.c: a state download of the run core (run-int.h's bee_fetch).
 *
 * A bee behind the swarm (at start, after a restart, or more than one
 * epoch behind later) downloads the state from a donor: a peer at the
 * swarm's epoch that serves it with "state.get" (docs/PROTOCOL.md
 * section 12), one chunk (1 MiB) per request.  The donors'
 * records say which have a free download slot; those are asked first.
 * Every chunk carries the snapshot's epoch, size and checksum: a donor
 * that stepped meanwhile serves its new snapshot, and the download
 * starts over on it (at most STATE_RESTARTS times).  A donor that fails
 * (busy, an error, a chunk that does not fit) passes the download to the
 * next; when none is left the bee asks again later (busy donors) or,
 * after FETCH_PASSES failed passes, trains on from where it is.  The
 * header is checked with the first chunk, so a state of another model is
 * refused before the rest comes, and the whole against its checksum.
 */
#include "run-int.h"

#include <sodium.h>

void bee__fetch_init(bee_fetch *f, const bee_config *cfg, const bee_run_io *io,
                     size_t state_bytes, uint32_t chunk) {
  memset(f, 0, sizeof *f);
  f->cfg = cfg;
  f->io = io;
  f->state_bytes = state_bytes;
  f->chunk = chunk ? chunk : STATE_CHUNK;
}

void bee__fetch_close(bee_fetch *f) {
  free(f->buf);
  f->buf = NULL;
  f->on = false;
}

static uint64_t now(const bee_fetch *f) { return f->io->now_ms(f->io->ctx); }

static int next_donor(bee_fetch *f);

static int failed(bee_fetch *f, const char *why) {
  char id8[9];
  bee_id8(f->peer, id8);
  bee_warn(COMP, "state from %s: %s", id8, why);
  free(f->buf);
  f->buf = NULL;
  return next_donor(f);
}

static int ask(bee_fetch *f) {
  int rc = f->io->chunk(f->io->ctx, f->peer, f->offset, f->chunk);
  return rc ? failed(f, bee_strerror(rc)) : FETCH_GOING;
}

/* The next donor we have a connection to.  None left: ask again later
 * (from f->retry_ms) and stay where we are, for as long as donors are
 * only busy, and for FETCH_PASSES passes in a row when they failed (a
 * connection replaced under the download, a chunk that timed out on a
 * slow link); after that, train on from here. */
static int next_donor(bee_fetch *f) {
  while (f->next < f->ndonors) {
    memcpy(f->peer, f->donors[f->next++], PROTO_ID_BYTES);
    f->offset = 0;
    f->restarts = 0;
    f->shown = 0;
    f->start_ms = now(f);
    int rc = f->io->chunk(f->io->ctx, f->peer, 0, f->chunk);
    if (rc == 0)
      return FETCH_GOING;
    if (rc != -ENOTCONN) { /* no connection to it: the next, silently */
      char id8[9];
      bee_id8(f->peer, id8);
      bee_warn(COMP, "state from %s: %s", id8, bee_strerror(rc));
    }
  }
  f->on = false;
  bool fail = !f->busy;
  if (!fail || ++f->failed < FETCH_PASSES) {
    f->backoff_ms = f->backoff_ms ? 2 * f->backoff_ms : FETCH_BACKOFF_MS;
    if (f->backoff_ms > FETCH_BACKOFF_MAX_MS)
      f->backoff_ms = FETCH_BACKOFF_MAX_MS;
    f->retry_ms = now(f) + f->backoff_ms;
    if (fail)
      bee_warn(COMP,
               "state: no donor could serve it (pass %u of %d); asking "
               "again in %.0f s",
               f->failed, FETCH_PASSES, (double)f->backoff_ms / 1000);
    else
      bee_info(COMP,
               "state: %u of %zu donors busy serving others; asking again "
               "in %.0f s",
               f->busy, f->ndonors, (double)f->backoff_ms / 1000);
    return FETCH_WAITING;
  }
  f->failed = 0;
  f->backoff_ms = 0;
  bee_warn(COMP, "state: no donor could serve it; training on from here");
  return FETCH_GAVE_UP;
}

int bee__fetch_start(bee_fetch *f, const uint8_t (*donors)[PROTO_ID_BYTES],
                     size_t n) {
  bee_fetch_started(&f->defer);
  f->on = true;
  f->next = 0;
  f->busy = 0;
  f->ndonors = n < DONORS_MAX ? n : DONORS_MAX;
  memcpy(f->donors, donors, f->ndonors * sizeof *f->donors);
  if (f->io->get_donors(f->io->ctx) == 0)
    return FETCH_GOING; /* bee__fetch_donors comes next */
  return next_donor(f);
}

int bee__fetch_donors(bee_fetch *f, int status, const proto_donor *v,
                      const uint8_t (*ids)[PROTO_ID_BYTES], size_t n) {
  if (!f->on)
    return FETCH_GOING;
  int64_t rank[DONORS_MAX]; /* slots; -1 no record; -2 full */
  size_t with = 0;
  for (size_t i = 0; i < f->ndonors; i++)
    rank[i] = -1;
  for (size_t j = 0; status == 0 && j < n; j++) {
    if (strcmp(v[j].run, f->cfg->run) != 0)
      continue;
    for (size_t i = 0; i < f->ndonors; i++)
      if (memcmp(ids[j], f->donors[i], PROTO_ID_BYTES) == 0) {
        rank[i] = v[j].slots ? (int64_t)v[j].slots : -2;
        with += v[j].slots > 0;
      }
  }
  for (size_t i = 1; i < f->ndonors; i++) /* stable: the view's order */
    for (size_t j = i; j > 0 && rank[j] > rank[j - 1]; j--) {
      int64_t r = rank[j];
      rank[j] = rank[j - 1];
      rank[j - 1] = r;
      uint8_t id[PROTO_ID_BYTES];
      memcpy(id, f->donors[j], PROTO_ID_BYTES);
      memcpy(f->donors[j], f->donors[j - 1], PROTO_ID_BYTES);
      memcpy(f->donors[j - 1], id, PROTO_ID_BYTES);
    }
  bee_info(COMP,
           "state: %zu donors at the swarm's epoch, %zu with a free "
           "download slot by their records",
           f->ndonors, with);
  return next_donor(f);
}

int bee__fetch_chunk(bee_fetch *f, int status, int64_t remote_code,
                     const proto_state_msg *m, uint8_t **state,
                     uint64_t *epoch) {
  char why[160];
  if (!f->on)
    return FETCH_GOING; /* a late answer */
  if (status == BEE_EREMOTE && remote_code == BEE_ELIMIT) {
    f->busy++;
    return failed(f, "busy serving other downloads");
  }
  if (status) {
    snprintf(why, sizeof why, "%s",
             bee_strerror(status == BEE_EREMOTE ? (int)remote_code : status));
    return failed(f, why);
  }
  if (!m)
    return failed(f, "a malformed answer");
  if (m->type != PROTO_T_STATE_CHUNK || strcmp(m->run, f->cfg->run) != 0 ||
      m->offset != f->offset)
    return failed(f, "a malformed answer (not the chunk asked for)");
  if (m->total != f->state_bytes) {
    snprintf(why, sizeof why,
             "a state of %llu bytes, where this model's takes %zu",
             (unsigned long long)m->total, f->state_bytes);
    return failed(f, why);
  }
  if (f->offset == 0) {
    free(f->buf);
    f->buf = malloc(m->total);
    if (!f->buf)
      return failed(f, "out of memory");
    f->total = m->total;
    f->epoch = m->epoch;
    memcpy(f->sum, m->checksum, sizeof f->sum);
  } else if (m->epoch != f->epoch ||
             memcmp(m->checksum, f->sum, sizeof f->sum) != 0) {
    /* The donor stepped meanwhile: start over on its new snapshot. */
    if (++f->restarts > STATE_RESTARTS)
      return failed(f, "its state kept changing under the download");
    f->offset = 0;
    return ask(f);
  }
  if (m->data.n > f->total - f->offset)
    return failed(f, "a chunk past the state's end");
  if (m->data.n == 0 && f->offset < f->total)
    return failed(f, "an empty chunk before the end");
  memcpy(f->buf + f->offset, m->data.p, m->data.n);
  f->bytes += m->data.n;
  /* The header is in the first chunk: a state this bee cannot use is
   * refused before the rest is fetched. */
  const char *bad;
  if (f->offset == 0 && m->data.n >= BEE_RUN_STATE_HDR &&
      (bad = f->io->state_mismatch(f->io->ctx, f->buf)))
    return failed(f, bad);
  f->offset += m->data.n;
  uint64_t pct = f->offset * 100 / f->total;
  char id8[9];
  bee_id8(f->peer, id8);
  if (pct / 25 > f->shown / 25 || f->offset == f->total) {
    f->shown = pct;
    bee_info(COMP, "state: %llu%% of %.1f MiB from %s (epoch %llu)",
             (unsigned long long)pct, (double)f->total / (1 << 20), id8,
             (unsigned long long)f->epoch);
  }
  if (f->offset < f->total)
    return ask(f);
  uint8_t sum[PROTO_STATE_SUM_BYTES];
  crypto_generichash(sum, sizeof sum, f->buf, f->total, NULL, 0);
  if (memcmp(sum, f->sum, sizeof sum) != 0)
    return failed(f, "the checksum does not match");
  if (f->total < BEE_RUN_STATE_HDR ||
      (bad = f->io->state_mismatch(f->io->ctx, f->buf)))
    return failed(f, f->total < BEE_RUN_STATE_HDR ? "a state without a header"
                                                  : bad);
  uint64_t took = now(f) - f->start_ms;
  f->last_s = (double)took / 1000;
  f->settle_ms =
      now(f) + (2 * took > FETCH_SETTLE_MS ? 2 * took : FETCH_SETTLE_MS);
  bee_info(COMP, "state: loaded epoch %llu from %s in %.1f s",
           (unsigned long long)f->epoch, id8, (double)took / 1000);
  *state = f->buf;
  *epoch = f->epoch;
  f->buf = NULL;
  f->on = false;
  f->backoff_ms = 0;
  f->failed = 0;
  f->loads++;
  return FETCH_LOADED;
}

double bee__fetch_join_s(const bee_fetch *f) {
  double mm = f->cfg->no_match_ahead ? 0 : f->cfg->matchmaking_s;
  return f->last_s + mm + FETCH_TRAVEL_S;
}

bool bee__fetch_wait(bee_fetch *f, const bee_view *v, uint64_t now_ms) {
  /* DiLoCo's round comes when the others' inner steps end; with
   * --delay-averaging an epoch's round runs through the next, and does
   * not follow the view's time to the target. */
  double eta = v->view.eta_s;
  bool outer = f->cfg->averaging == BEE_AVG_DILOCO;
  if (f->cfg->delay_averaging)
    eta = -1;
  else if (outer)
    eta = v->swarm_due_ms ? (v->swarm_due_ms > now_ms
                                 ? (double)(v->swarm_due_ms - now_ms) / 1000
                                 : 0)
                          : -1;
  double mm = f->cfg->no_match_ahead ? 0 : f->cfg->matchmaking_s;
  double join = bee__fetch_join_s(f);
  /* An epoch shorter than that cannot be joined at its start either (a
   * swarm that gathers its target faster than records travel forms each
   * epoch's group as soon as it steps): no wait, the state lands where it
   * may. */
  double epoch_s = bee__view_epoch_s(v);
  if (epoch_s >= 0 && epoch_s < join)
    eta = -1;
  bool was = f->defer.on;
  bool wait = bee_fetch_defer(&f->defer, eta, join, v->view.epoch, now_ms);
  if (wait && !was) {
    char last[48] = "";
    if (f->last_s > 0)
      snprintf(last, sizeof last, ", the last download's %.1f", f->last_s);
    bee_info(COMP,
             "state: the swarm expects its %s in %.1f s, before this "
             "bee could join the epoch's group (%.1f s: the matchmaking's "
             "%.1f%s, the records' travel %.1f): the download waits for "
             "the swarm's next step",
             outer ? "round" : "target", eta, join, mm, last, FETCH_TRAVEL_S);
  }
  return wait;
}
