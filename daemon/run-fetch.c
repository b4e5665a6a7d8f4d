/* run-fetch.c: a state download of the run core (run-int.h's bee_fetch).
 *
 * A bee behind the swarm (at start, after a restart, or more than one
 * epoch behind later) downloads the state from the donors: peers at the
 * swarm's epoch that serve it with "state.get" (docs/PROTOCOL.md section
 * 12).  The donors' records say which have a free download slot; those
 * are asked first, up to FETCH_DONORS of them at once.
 *
 * Each donor is asked first for the state's header alone (a probe at
 * offset 0, which makes the donor pin its latest snapshot for this
 * download); its answer names the snapshot: epoch, size, checksum.  The
 * first answer sets the snapshot the download assembles; a donor whose
 * snapshot is another (it stepped, or its buffers are its own: batch
 * norm's running statistics, DiLoCo's inner optimizer) leaves the
 * download.  Then every donor of the snapshot serves chunks of it, a
 * few at a time (FETCH_WINDOW requests in flight each, so that a link is
 * never idle for a round trip per chunk), the next chunk to whichever
 * donor has room; when none is left to ask, the chunks still on their
 * way are asked again of the donors that are idle, and the first answer
 * counts.  A donor that fails (busy, an error, a chunk that does not fit)
 * leaves the download and its chunks go to the others.  The header is
 * checked with the probe, so a state of another model is refused before
 * anything else comes, and the whole against its checksum at the end;
 * a whole that does not match is fetched again from one donor alone,
 * whose chunks then are all its own.  At the end, whole or not, every
 * donor that gave the download a slot is told it is over (a request at
 * the state's end, which ends its upload: an asker that begins with the
 * header alone holds its slot until then), so the slot is free at once.
 *
 * When no donor is left the bee asks again later (busy donors) or, after
 * FETCH_PASSES failed passes, trains on from where it is.
 */
#include "run-int.h"

#include <sodium.h>

enum { CH_TODO = 0, CH_ASKED, CH_DONE };

void bee__fetch_init(bee_fetch *f, const bee_config *cfg, const bee_run_io *io,
                     const bee_view *view, size_t state_bytes,
                     size_t step_bytes, uint32_t chunk,
                     const uint8_t self[PROTO_ID_BYTES]) {
  memset(f, 0, sizeof *f);
  f->cfg = cfg;
  f->io = io;
  f->view = view;
  f->state_bytes = state_bytes;
  f->step_bytes = cfg->delay_averaging ? 0 : step_bytes;
  f->chunk = chunk ? chunk : STATE_CHUNK;
  f->nchunks = (state_bytes + f->chunk - 1) / f->chunk;
  memcpy(f->self, self, PROTO_ID_BYTES);
}

static void free_steps(bee_fetch *f) {
  for (size_t i = 0; i < f->nsteps; i++)
    free(f->steps[i].buf);
  f->nsteps = 0;
}

void bee__fetch_close(bee_fetch *f) {
  free(f->buf);
  free(f->chunks);
  free(f->state);
  free_steps(f);
  f->buf = f->state = NULL;
  f->chunks = NULL;
  f->on = false;
}

static uint64_t now(const bee_fetch *f) { return f->io->now_ms(f->io->ctx); }

/* A request's tag: the download's generation, the donor, the chunk
 * (FETCH_PROBE: the header alone; FETCH_RELEASE: the end). */
#define FETCH_PROBE UINT32_MAX
#define FETCH_RELEASE (UINT32_MAX - 1)

static uint64_t tag_of(const bee_fetch *f, size_t donor, uint32_t chunk) {
  return (uint64_t)(f->gen & 0xffffff) << 40 | (uint64_t)donor << 32 | chunk;
}

static void log_donor(const bee_fetch *f, size_t d, const char *why) {
  char id8[9];
  bee_id8(f->d[d].id, id8);
  if (f->stepping)
    bee_info(COMP, "state: the step of epoch %llu from %s: %s",
             (unsigned long long)f->step_epoch, id8, why);
  else
    bee_warn(COMP, "state from %s: %s", id8, why);
}

/* Sends one request to donor d for chunk c of the blob (or a probe, or a
 * release: of the state, which holds the slot). */
static int ask(bee_fetch *f, size_t d, uint32_t c) {
  bool step = f->stepping && c != FETCH_RELEASE;
  uint64_t offset = c == FETCH_PROBE     ? 0
                    : c == FETCH_RELEASE ? f->state_bytes
                                         : (uint64_t)c * f->chunk;
  uint32_t len = c == FETCH_PROBE ? BEE_RUN_STATE_HDR : f->chunk;
  int rc =
      f->io->chunk(f->io->ctx, f->d[d].id, step ? f->step_epoch : BEE_RUN_STATE,
                   offset, len, tag_of(f, d, c));
  if (rc == 0 && c != FETCH_RELEASE && f->d[d].inflight++ == 0)
    f->d[d].heard_ms = now(f);
  return rc;
}

/* Donor d leaves the download: its chunks on their way go back to be
 * asked of the others (those asked twice stay with the other asker). */
static void drop(bee_fetch *f, size_t d, const char *why) {
  if (!f->d[d].active)
    return;
  f->d[d].active = false;
  if (why)
    log_donor(f, d, why);
  for (size_t c = 0; c < f->nchunks; c++)
    if (f->chunks[c].state == CH_ASKED && f->chunks[c].by == d) {
      if (f->chunks[c].also != SIZE_MAX) {
        f->chunks[c].by = f->chunks[c].also;
        f->chunks[c].also = SIZE_MAX;
      } else {
        f->chunks[c].state = CH_TODO;
        if (c < f->next_todo)
          f->next_todo = c;
      }
    } else if (f->chunks[c].state == CH_ASKED && f->chunks[c].also == d) {
      f->chunks[c].also = SIZE_MAX;
    }
}

/* The next chunk donor d should ask for: the first not yet asked; when
 * all are, one on its way from another donor (asked a second time, the
 * first answer counts).  SIZE_MAX: none. */
static size_t pick(bee_fetch *f, size_t d) {
  while (f->next_todo < f->nchunks && f->chunks[f->next_todo].state != CH_TODO)
    f->next_todo++;
  if (f->next_todo < f->nchunks)
    return f->next_todo++;
  for (size_t c = 0; c < f->nchunks; c++)
    if (f->chunks[c].state == CH_ASKED && f->chunks[c].by != d &&
        f->chunks[c].also == SIZE_MAX)
      return c;
  return SIZE_MAX;
}

static size_t active(const bee_fetch *f) {
  size_t k = 0;
  for (size_t d = 0; d < f->nd; d++)
    k += f->d[d].active;
  return k;
}

/* Brings candidates in, in their order, until FETCH_DONORS are in the
 * download or none is left; each is probed, and asked for its first
 * chunks with it (see probe_all).  Returns how many are in. */
static size_t refill(bee_fetch *f) {
  while (active(f) < FETCH_DONORS && f->next_cand < f->nd) {
    size_t d = f->next_cand++;
    f->d[d].active = true;
    int rc = ask(f, d, FETCH_PROBE);
    if (rc) {
      f->d[d].active = false;
      if (rc != -ENOTCONN)
        log_donor(f, d, bee_strerror(rc));
    }
  }
  return active(f);
}

/* Fills every active donor's window; a donor that cannot be asked
 * leaves, and the next candidate comes in.  Returns the donors in the
 * download. */
static size_t pump(bee_fetch *f) {
  for (size_t d = 0; d < f->nd; d++) {
    /* the probe counts in the window until its answer */
    while (f->d[d].active &&
           f->d[d].inflight < FETCH_WINDOW + (f->d[d].ready ? 0u : 1u)) {
      size_t c = pick(f, d);
      if (c == SIZE_MAX)
        break;
      bool second = f->chunks[c].state == CH_ASKED;
      int rc = ask(f, d, (uint32_t)c);
      if (rc) {
        if (!second) {
          f->chunks[c].state = CH_TODO;
          if (c < f->next_todo)
            f->next_todo = c;
        }
        drop(f, d, rc == -ENOTCONN ? NULL : bee_strerror(rc));
        refill(f); /* a later entry: this loop comes to it */
        break;
      }
      if (second) {
        f->chunks[c].also = d;
      } else {
        f->chunks[c].state = CH_ASKED;
        f->chunks[c].by = d;
        f->chunks[c].also = SIZE_MAX;
      }
    }
  }
  return active(f);
}

/* Tells every donor that gave us a slot that the download is over (a
 * request at the state's end), so that the slot is free at once. */
static void release_all(bee_fetch *f) {
  for (size_t d = 0; d < f->nd; d++)
    if (f->d[d].admitted) {
      ask(f, d, FETCH_RELEASE);
      f->d[d].admitted = false;
    }
}

/* No donor left.  Ask again later (from f->retry_ms) and stay where we
 * are, for as long as donors are only busy, and for FETCH_PASSES passes
 * in a row when they failed (a connection replaced under the download, a
 * chunk that timed out on a slow link); after that, train on from here. */
static int steps_over(bee_fetch *f);

static int pass_over(bee_fetch *f) {
  if (f->stepping)
    return steps_over(f);
  release_all(f);
  f->on = false;
  f->gen++; /* late answers of this pass are no more ours */
  free(f->buf);
  f->buf = NULL;
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
               f->busy, f->nd, (double)f->backoff_ms / 1000);
    return FETCH_WAITING;
  }
  f->failed = 0;
  f->backoff_ms = 0;
  bee_warn(COMP, "state: no donor could serve it; training on from here");
  return FETCH_GAVE_UP;
}

/* Probes the first donors, and asks each for its first chunks at once:
 * its probe's answer comes before them on the same connection, so a
 * donor of another snapshot is dropped, its chunks unused, before they
 * come; the others' chunks are on their way a round trip sooner. */
static int probe_all(bee_fetch *f) {
  refill(f);
  return pump(f) ? FETCH_GOING : pass_over(f);
}

/* A pass's counters back to none, and every chunk to be fetched; the
 * answers of the pass before are no more ours. */
static void pass_reset(bee_fetch *f) {
  f->gen++;
  f->next_cand = 0;
  f->busy = 0;
  f->have_ref = false;
  f->got = 0;
  f->next_todo = 0;
  f->shown = 0;
  for (size_t c = 0; c < f->nchunks; c++)
    f->chunks[c] = (struct fetch_chunk){CH_TODO, SIZE_MAX, SIZE_MAX};
}

/* A new pass over n donors (ids), in that order: every chunk to be
 * fetched again. */
static void pass_init(bee_fetch *f, const uint8_t (*ids)[PROTO_ID_BYTES],
                      size_t n) {
  pass_reset(f);
  f->start_ms = now(f);
  f->nd = n < DONORS_MAX ? n : DONORS_MAX;
  for (size_t d = 0; d < f->nd; d++) {
    f->d[d] = (struct fetch_donor){.active = false};
    memcpy(f->d[d].id, ids[d], PROTO_ID_BYTES);
  }
}

/* Whether candidate a comes before b among those of one rank: by their
 * distance to this bee's id, so that newcomers that start together
 * spread over the donors instead of all asking the same first ones. */
static bool closer(const bee_fetch *f, const uint8_t *a, const uint8_t *b) {
  return bee__closer(f->self, a, b);
}

/* Orders the candidates by rank (higher first), then by closer(). */
static void order(bee_fetch *f, int64_t rank[DONORS_MAX]) {
  for (size_t i = 1; i < f->ncand; i++)
    for (size_t j = i; j > 0 && (rank[j] > rank[j - 1] ||
                                 (rank[j] == rank[j - 1] &&
                                  closer(f, f->cand[j], f->cand[j - 1])));
         j--) {
      int64_t r = rank[j];
      rank[j] = rank[j - 1];
      rank[j - 1] = r;
      uint8_t id[PROTO_ID_BYTES];
      memcpy(id, f->cand[j], PROTO_ID_BYTES);
      memcpy(f->cand[j], f->cand[j - 1], PROTO_ID_BYTES);
      memcpy(f->cand[j - 1], id, PROTO_ID_BYTES);
    }
}

/* Room for the chunks of the largest blob, the state. */
static bool chunks_ready(bee_fetch *f) {
  size_t n = (f->state_bytes + f->chunk - 1) / f->chunk;
  return f->chunks ||
         (f->chunks = calloc(n ? n : 1, sizeof *f->chunks)) != NULL;
}

int bee__fetch_start(bee_fetch *f, const uint8_t (*donors)[PROTO_ID_BYTES],
                     size_t n) {
  f->restarts = 0;
  f->stepping = f->for_round = f->poll = false;
  f->nchunks = (f->state_bytes + f->chunk - 1) / f->chunk;
  free(f->state);
  f->state = NULL;
  free_steps(f);
  if (!chunks_ready(f))
    return pass_over(f);
  f->on = true;
  f->single = false;
  f->ncand = n < DONORS_MAX ? n : DONORS_MAX;
  memcpy(f->cand, donors, f->ncand * sizeof *f->cand);
  f->gen++; /* the donor records' read belongs to this download */
  if (f->io->get_donors(f->io->ctx) == 0)
    return FETCH_GOING; /* bee__fetch_donors comes next */
  int64_t rank[DONORS_MAX] = {0};
  order(f, rank);
  pass_init(f, (const uint8_t(*)[PROTO_ID_BYTES])f->cand, f->ncand);
  return probe_all(f);
}

/* A pass for the swarm's step from epoch, over the donors d[] in their
 * order (kept: those that gave the state a slot still hold it). */
static int step_pass(bee_fetch *f, uint64_t epoch) {
  f->stepping = true;
  f->step_epoch = epoch;
  f->nchunks = (f->step_bytes + f->chunk - 1) / f->chunk;
  pass_reset(f);
  for (size_t d = 0; d < f->nd; d++) {
    f->d[d].active = f->d[d].ready = false;
    f->d[d].inflight = 0;
    f->d[d].chunks = 0;
  }
  return probe_all(f);
}

int bee__fetch_step(bee_fetch *f, const uint8_t (*donors)[PROTO_ID_BYTES],
                    size_t n, uint64_t epoch, bool poll) {
  if (f->on || !f->step_bytes || n == 0 || !chunks_ready(f))
    return poll ? FETCH_NOT_YET : FETCH_NO_STEP;
  f->on = true;
  f->for_round = true;
  f->poll = poll;
  f->single = false;
  free_steps(f);
  f->ncand = n < DONORS_MAX ? n : DONORS_MAX;
  memcpy(f->cand, donors, f->ncand * sizeof *f->cand);
  int64_t rank[DONORS_MAX] = {0};
  order(f, rank);
  pass_init(f, (const uint8_t(*)[PROTO_ID_BYTES])f->cand, f->ncand);
  return step_pass(f, epoch);
}

int bee__fetch_donors(bee_fetch *f, int status, const proto_donor *v,
                      const uint8_t (*ids)[PROTO_ID_BYTES], size_t n) {
  if (!f->on)
    return FETCH_GOING;
  int64_t rank[DONORS_MAX]; /* slots; -1 no record; -2 full */
  size_t with = 0;
  for (size_t i = 0; i < f->ncand; i++)
    rank[i] = -1;
  for (size_t j = 0; status == 0 && j < n; j++) {
    if (strcmp(v[j].run, f->cfg->run) != 0)
      continue;
    for (size_t i = 0; i < f->ncand; i++)
      if (memcmp(ids[j], f->cand[i], PROTO_ID_BYTES) == 0) {
        rank[i] = v[j].slots ? (int64_t)v[j].slots : -2;
        with += v[j].slots > 0;
      }
  }
  order(f, rank);
  bee_info(COMP,
           "state: %zu donors at the swarm's epoch, %zu with a free "
           "download slot by their records",
           f->ncand, with);
  pass_init(f, (const uint8_t(*)[PROTO_ID_BYTES])f->cand, f->ncand);
  return probe_all(f);
}

static int next_step(bee_fetch *f, uint64_t epoch);

/* The whole is in: its checksum and header, then the steps since. */
static int assembled(bee_fetch *f) {
  uint8_t sum[PROTO_STATE_SUM_BYTES];
  crypto_generichash(sum, sizeof sum, f->buf, f->total, NULL, 0);
  const char *bad = NULL;
  if (memcmp(sum, f->sum, sizeof sum) != 0)
    bad = "the checksum does not match";
  else if (f->total < BEE_RUN_STATE_HDR)
    bad = "a state without a header";
  else
    bad = f->io->state_mismatch(f->io->ctx, f->buf);
  release_all(f);
  if (bad) {
    /* From several donors, one of them served bytes of another state:
     * again from the one that served the most, alone. */
    size_t most = 0, used = 0;
    for (size_t d = 0; d < f->nd; d++) {
      used += f->d[d].chunks > 0;
      if (f->d[d].chunks > f->d[most].chunks)
        most = d;
    }
    char id8[9];
    bee_id8(f->d[most].id, id8);
    if (used > 1 && !f->single)
      bee_warn(COMP, "state: %s (from %zu donors): again from %s alone", bad,
               used, id8);
    else
      bee_warn(COMP, "state from %s: %s", id8, bad);
    if (used > 1 && !f->single) {
      uint8_t id[1][PROTO_ID_BYTES];
      memcpy(id[0], f->d[most].id, PROTO_ID_BYTES);
      pass_init(f, (const uint8_t(*)[PROTO_ID_BYTES])id, 1);
      f->single = true;
      return probe_all(f);
    }
    return pass_over(f);
  }
  uint64_t took = now(f) - f->start_ms;
  f->last_s = (double)took / 1000;
  f->settle_ms =
      now(f) + (2 * took > FETCH_SETTLE_MS ? 2 * took : FETCH_SETTLE_MS);
  size_t used = 0;
  for (size_t d = 0; d < f->nd; d++)
    used += f->d[d].chunks > 0;
  bee_info(COMP,
           "state: loaded epoch %llu from %zu donor%s in %.1f s (%.1f "
           "Mbit/s)",
           (unsigned long long)f->epoch, used, used == 1 ? "" : "s",
           (double)took / 1000,
           took ? (double)f->total * 8 / 1000 / (double)took : 0.0);
  f->state = f->buf;
  f->state_epoch = f->epoch;
  f->buf = NULL;
  f->backoff_ms = 0;
  f->failed = 0;
  return next_step(f, f->state_epoch);
}

/* The download is over: the state and the steps the caller takes. */
static int loaded(bee_fetch *f) {
  release_all(f);
  f->on = false;
  f->stepping = false;
  f->gen++;
  f->loads++;
  return FETCH_LOADED;
}

/* After the state, or a step of the swarm's from epoch - 1: the next
 * step while the swarm is past it (it stepped on while the state came),
 * or the end. */
static int next_step(bee_fetch *f, uint64_t epoch) {
  if (f->step_bytes && f->view->view.epoch > epoch &&
      f->nsteps < BEE_RUN_CATCHUP_MAX)
    return step_pass(f, epoch);
  return loaded(f);
}

/* The end of a fetch of the step for a round that missed it (for_round):
 * the donors released, the fetch over; returns rc. */
static int round_step_over(bee_fetch *f, int rc) {
  release_all(f);
  f->on = f->stepping = f->for_round = f->poll = false;
  f->gen++;
  return rc;
}

/* No donor has the step: the round's is not to be had, and a download
 * ends with the steps it has (the bee then trains on from there, behind
 * the swarm, as before it took steps). */
static int steps_over(bee_fetch *f) {
  free(f->buf);
  f->buf = NULL;
  if (f->for_round)
    return round_step_over(f, f->poll ? FETCH_NOT_YET : FETCH_NO_STEP);
  bee_info(COMP,
           "state: no donor has the swarm's step of epoch %llu: this bee "
           "trains on from epoch %llu",
           (unsigned long long)f->step_epoch,
           (unsigned long long)f->step_epoch);
  return loaded(f);
}

/* The step is whole: checked against its checksum, kept. */
static int step_done(bee_fetch *f) {
  uint8_t sum[PROTO_STATE_SUM_BYTES];
  crypto_generichash(sum, sizeof sum, f->buf, f->total, NULL, 0);
  if (memcmp(sum, f->sum, sizeof sum) != 0) {
    bee_warn(COMP,
             "state: the swarm's step of epoch %llu: the checksum does "
             "not match",
             (unsigned long long)f->step_epoch);
    return steps_over(f);
  }
  f->steps[f->nsteps++] = (struct fetch_step){
      .buf = f->total ? f->buf : NULL, .len = f->total, .epoch = f->step_epoch};
  if (!f->total)
    free(f->buf);
  f->buf = NULL;
  if (f->for_round)
    return round_step_over(f, FETCH_STEP);
  return next_step(f, f->step_epoch + 1);
}

/* probed()'s answer for a donor that has stepped since the first answer,
 * before any chunk came: the download starts over (not a refusal). */
static const char NEWER[] = "newer";

/* A probe's answer from donor d: its snapshot.  The first sets the
 * download's; another's donor leaves. */
static const char *probed(bee_fetch *f, size_t d, const proto_state_msg *m) {
  if (f->stepping) {
    /* A step: the parameters' size, or 0 for one that changed nothing;
     * the first answer names it, another's donor leaves. */
    if (m->epoch != f->step_epoch ||
        (m->total != f->step_bytes && m->total != 0))
      return "another step than the one asked for";
    if (!f->have_ref) {
      free(f->buf);
      if (!(f->buf = malloc(m->total ? m->total : 1)))
        return "out of memory";
      f->have_ref = true;
      f->total = m->total;
      f->epoch = m->epoch;
      memcpy(f->sum, m->checksum, sizeof f->sum);
    } else if (m->total != f->total ||
               memcmp(m->checksum, f->sum, sizeof f->sum) != 0) {
      return "another step than the others' (a split?)";
    }
    f->d[d].ready = true;
    return NULL;
  }
  if (m->total != f->state_bytes) {
    snprintf(f->why, sizeof f->why,
             "a state of %llu bytes, where this model's takes %zu",
             (unsigned long long)m->total, f->state_bytes);
    return f->why;
  }
  const char *bad;
  if (m->data.n < BEE_RUN_STATE_HDR ||
      (bad = f->io->state_mismatch(f->io->ctx, m->data.p)))
    return m->data.n < BEE_RUN_STATE_HDR ? "a probe without the header" : bad;
  if (!f->have_ref) {
    free(f->buf);
    if (!(f->buf = malloc(m->total)))
      return "out of memory";
    f->have_ref = true;
    f->total = m->total;
    f->epoch = m->epoch;
    memcpy(f->sum, m->checksum, sizeof f->sum);
  } else if (m->epoch > f->epoch && f->got == 0 &&
             f->restarts < FETCH_RESTARTS) {
    /* A donor has stepped since the first answer, before any chunk came:
     * the download starts over, every donor asked for its latest, so that
     * the donors at the swarm's epoch serve one snapshot. */
    return NEWER;
  } else if (m->epoch != f->epoch ||
             memcmp(m->checksum, f->sum, sizeof f->sum) != 0) {
    /* Expected where donors' states differ in their own parts: no
     * warning. */
    char id8[9];
    bee_id8(f->d[d].id, id8);
    bee_info(COMP,
             "state: %s serves another snapshot (epoch %llu) than the "
             "download's (epoch %llu): one donor less",
             id8, (unsigned long long)m->epoch, (unsigned long long)f->epoch);
    return "";
  }
  f->d[d].ready = true;
  return NULL;
}

int bee__fetch_chunk(bee_fetch *f, uint64_t tag, int status,
                     int64_t remote_code, const proto_state_msg *m) {
  char why[160];
  size_t d = (size_t)(tag >> 32 & 0xff);
  uint32_t c = (uint32_t)tag;
  if (!f->on || tag >> 40 != (f->gen & 0xffffff) || d >= f->nd ||
      c == FETCH_RELEASE)
    return FETCH_GOING; /* a late answer, or a release's */
  if (f->d[d].inflight)
    f->d[d].inflight--;
  f->d[d].heard_ms = now(f);
  if (c == FETCH_PROBE && status == 0)
    f->d[d].admitted = true;
  if (!f->d[d].active)
    return FETCH_GOING; /* it left the download meanwhile */
  const char *bad = NULL;
  if (status == BEE_EREMOTE && remote_code == BEE_ELIMIT) {
    f->busy++;
    bad = "busy serving other downloads";
  } else if (f->poll && status == BEE_EREMOTE && remote_code == BEE_ERANGE) {
    bad = ""; /* no such step there yet: asked again, not logged */
  } else if (status) {
    snprintf(why, sizeof why, "%s",
             bee_strerror(status == BEE_EREMOTE ? (int)remote_code : status));
    bad = why;
  } else if (!m) {
    bad = "a malformed answer";
  } else if (m->type !=
                 (f->stepping ? PROTO_T_STATE_STEP : PROTO_T_STATE_CHUNK) ||
             strcmp(m->run, f->cfg->run) != 0 ||
             m->offset != (c == FETCH_PROBE ? 0 : (uint64_t)c * f->chunk)) {
    bad = "a malformed answer (not the chunk asked for)";
  } else if (c == FETCH_PROBE) {
    bad = probed(f, d, m);
    if (bad == NEWER) {
      f->restarts++;
      bee_info(COMP,
               "state: a donor serves epoch %llu, newer than the "
               "download's %llu: it starts over",
               (unsigned long long)m->epoch, (unsigned long long)f->epoch);
      pass_init(f, (const uint8_t(*)[PROTO_ID_BYTES])f->cand, f->ncand);
      return probe_all(f);
    }
  } else if (!f->d[d].ready) {
    bad = "a chunk before the probe's answer";
  } else if (c >= f->nchunks || m->total != f->total || m->epoch != f->epoch ||
             memcmp(m->checksum, f->sum, sizeof f->sum) != 0) {
    bad = "a chunk of another snapshot";
  } else {
    uint64_t want =
        f->total - m->offset < f->chunk ? f->total - m->offset : f->chunk;
    if (m->data.n != want)
      bad = "a chunk of the wrong size";
  }
  if (bad) {
    drop(f, d, bad[0] ? bad : NULL);
    refill(f);
    return pump(f) ? FETCH_GOING : pass_over(f);
  }
  if (c == FETCH_PROBE && f->stepping && f->total == 0)
    return step_done(f); /* a step that changed nothing: nothing to fetch */
  if (c != FETCH_PROBE && f->chunks[c].state != CH_DONE) {
    memcpy(f->buf + m->offset, m->data.p, m->data.n);
    f->bytes += m->data.n;
    f->got++;
    f->d[d].chunks++;
    f->chunks[c].state = CH_DONE;
    f->chunks[c].by = d; /* for the release: the last chunk's donor */
    uint64_t pct = f->got * 100 / f->nchunks;
    if (!f->stepping && (pct / 25 > f->shown / 25 || f->got == f->nchunks)) {
      f->shown = pct;
      bee_info(COMP, "state: %llu%% of %.1f MiB from %zu donor%s (epoch %llu)",
               (unsigned long long)pct, (double)f->total / (1 << 20), active(f),
               active(f) == 1 ? "" : "s", (unsigned long long)f->epoch);
    }
    if (f->got == f->nchunks)
      return f->stepping ? step_done(f) : assembled(f);
  }
  return pump(f) ? FETCH_GOING : pass_over(f);
}

int bee__fetch_tick(bee_fetch *f) {
  if (!f->on)
    return FETCH_GOING;
  bool dropped = false;
  uint64_t t = now(f);
  for (size_t d = 0; d < f->nd; d++)
    if (f->d[d].active && f->d[d].inflight &&
        t - f->d[d].heard_ms >= FETCH_STALL_MS) {
      char why[64];
      snprintf(why, sizeof why, "no answer for %.0f s",
               (double)(t - f->d[d].heard_ms) / 1000);
      drop(f, d, why);
      dropped = true;
    }
  if (!dropped)
    return FETCH_GOING;
  refill(f);
  return pump(f) ? FETCH_GOING : pass_over(f);
}

double bee__fetch_join_s(const bee_fetch *f) {
  double mm = f->cfg->no_match_ahead ? 0 : f->cfg->matchmaking_s;
  return f->last_s + mm + FETCH_TRAVEL_S;
}
