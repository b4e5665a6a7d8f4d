/* aggregate.c: the monitor's state, one scrape at a time (monitor.h).
 *
 * Peers are kept in an array by first sighting; a scrape updates the
 * records of those it finds and drops those gone (MON_GONE_MS without a
 * record, or a last record that says it left).  Every scrape makes one
 * point of history.  The newest history_max points are kept as they are;
 * older ones are thinned to one in COARSE_EVERY and kept, COARSE_MAX of
 * them, so a long run stays in memory at a coarser grain.
 */
#include "monitor.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define COMP "monitor"
#define HISTORY_DEFAULT 86400 /* a day of 1 s scrapes */
#define COARSE_EVERY 60
#define COARSE_MAX 43200 /* a month of minutes */
#define BAD_MAX 256      /* peers whose malformed records were reported */

typedef struct ring {
  mon_point *p;
  size_t cap, head, n; /* oldest at (head - n) mod cap */
} ring;

struct mon {
  mon_config cfg;
  mon_peer *peers;
  size_t npeers;
  uint64_t joined, left, scrapes;
  mon_event ev[MON_EVENTS_MAX];
  size_t ev_head, ev_n;
  ring fine, coarse;
  uint64_t evicted;    /* points that left the fine ring */
  uint64_t epoch_seen; /* the swarm's epoch at the last scrape */
  bool any_epoch;
  uint64_t inferred;     /* target inferred from finished epochs */
  uint64_t samples_prev; /* samples at the epoch, last scrape */
  mon_point last;
  bool has_last;
  uint8_t bad[BAD_MAX][PROTO_ID_BYTES]; /* reported once each (a ring) */
  size_t nbad, bad_head;
};

static int ring_init(ring *r, size_t cap) {
  r->p = calloc(cap, sizeof *r->p);
  r->cap = cap;
  return r->p ? 0 : -ENOMEM;
}

/* Appends x; returns true and sets *out when the oldest point fell out. */
static bool ring_push(ring *r, const mon_point *x, mon_point *out) {
  bool full = r->n == r->cap;
  if (full)
    *out = r->p[r->head];
  r->p[r->head] = *x;
  r->head = (r->head + 1) % r->cap;
  if (!full)
    r->n++;
  return full;
}

static const mon_point *ring_at(const ring *r, size_t i) {
  return &r->p[(r->head + r->cap - r->n + i) % r->cap];
}

int mon_new(const mon_config *cfg, mon **out) {
  *out = NULL;
  if (!cfg->run[0] || strlen(cfg->run) > PROTO_RUN_MAX)
    return BEE_ECONFIG;
  mon *m = calloc(1, sizeof *m);
  if (!m)
    return -ENOMEM;
  m->cfg = *cfg;
  if (!m->cfg.history_max)
    m->cfg.history_max = HISTORY_DEFAULT;
  m->peers = calloc(MON_PEERS_MAX, sizeof *m->peers);
  if (!m->peers || ring_init(&m->fine, m->cfg.history_max) ||
      ring_init(&m->coarse, COARSE_MAX)) {
    mon_free(m);
    return -ENOMEM;
  }
  *out = m;
  return 0;
}

void mon_free(mon *m) {
  if (!m)
    return;
  for (size_t i = 0; m->peers && i < m->npeers; i++)
    free(m->peers[i].links);
  free(m->peers);
  free(m->fine.p);
  free(m->coarse.p);
  free(m);
}

/* An event: what happened, and a line for people ("<peer> <what>" when
 * it is about a peer). */
static void event(mon *m, uint64_t now_ms, int type, const uint8_t *id,
                  uint64_t epoch, const char *what) {
  mon_event *e = &m->ev[m->ev_head];
  memset(e, 0, sizeof *e);
  e->time_ms = now_ms;
  e->type = type;
  if (id)
    memcpy(e->id, id, PROTO_ID_BYTES);
  e->epoch = epoch;
  char id8[9] = "";
  if (id)
    proto_hex(id, 4, id8);
  /* A longer line is cut to the field, its last three bytes "...". */
  int n = snprintf(e->text, sizeof e->text, "%s%s%s", id8, id ? " " : "",
                   what);
  if (n >= (int)sizeof e->text)
    memcpy(e->text + sizeof e->text - 4, "...", 4);
  m->ev_head = (m->ev_head + 1) % MON_EVENTS_MAX;
  if (m->ev_n < MON_EVENTS_MAX)
    m->ev_n++;
}

/* The peer with this id, or NULL. */
static mon_peer *peer_of(mon *m, const uint8_t *id) {
  for (size_t i = 0; i < m->npeers; i++)
    if (memcmp(m->peers[i].id, id, PROTO_ID_BYTES) == 0)
      return &m->peers[i];
  return NULL;
}

/* The peer with this id, made when new (NULL when MON_PEERS_MAX are
 * kept already). */
static mon_peer *peer_find(mon *m, const uint8_t *id, uint64_t now_ms) {
  mon_peer *p = peer_of(m, id);
  if (p || m->npeers == MON_PEERS_MAX)
    return p;
  p = &m->peers[m->npeers++];
  memset(p, 0, sizeof *p);
  memcpy(p->id, id, PROTO_ID_BYTES);
  p->first_ms = now_ms;
  return p;
}

/* A record that does not decode: skipped, and said once per peer (of
 * the last BAD_MAX such peers), not once per scrape. */
static void bad_record(mon *m, const uint8_t *id, uint64_t now_ms,
                       const char *what, int rc) {
  for (size_t i = 0; i < m->nbad; i++)
    if (memcmp(m->bad[i], id, PROTO_ID_BYTES) == 0)
      return;
  memcpy(m->bad[m->bad_head], id, PROTO_ID_BYTES);
  m->bad_head = (m->bad_head + 1) % BAD_MAX;
  if (m->nbad < BAD_MAX)
    m->nbad++;
  char id8[9];
  proto_hex(id, 4, id8);
  bee_warn(COMP, "%s: a malformed %s record (%s); its records are skipped", id8,
           what, bee_strerror(rc));
  char text[48];
  snprintf(text, sizeof text, "sent a malformed %s record", what);
  event(m, now_ms, MON_EV_BAD, id, 0, text);
}

static void take_progress(mon *m, const mon_record *r, uint64_t now_ms) {
  proto_progress x;
  int rc = proto_progress_decode(r->value, r->n, &x);
  if (rc) {
    bad_record(m, r->id, now_ms, "progress", rc);
    return;
  }
  if (strcmp(x.run, m->cfg.run) != 0)
    return;
  mon_peer *p = peer_find(m, r->id, now_ms);
  if (!p)
    return;
  if (p->has_progress && x.epoch > p->progress.epoch + 1) {
    char txt[80];
    snprintf(txt, sizeof txt, "loaded the state: epoch %llu to %llu",
             (unsigned long long)p->progress.epoch,
             (unsigned long long)x.epoch);
    event(m, now_ms, MON_EV_STATE, p->id, x.epoch, txt);
  }
  p->progress = x;
  p->has_progress = true;
  p->seen_ms = now_ms;
}

/* Metrics count only for a peer with a progress record (this scrape's
 * progress records are taken first). */
static void take_metrics(mon *m, const mon_record *r, uint64_t now_ms) {
  proto_metrics x;
  int rc = proto_metrics_decode(r->value, r->n, &x);
  if (rc) {
    bad_record(m, r->id, now_ms, "metrics", rc);
    return;
  }
  mon_peer *p = peer_of(m, r->id);
  if (!p || strcmp(x.run, m->cfg.run) != 0)
    return;
  /* A new step's round, as its peer saw it (only between two records of
   * the peer: the first one may be of any age). */
  if (p->has_metrics && x.step != p->metrics.step) {
    char txt[128] = "";
    if (x.group_size < 2 && m->npeers > 1)
      snprintf(txt, sizeof txt, "stepped alone at epoch %llu (no group)",
               (unsigned long long)x.step);
    else if (x.group_size >= 2 && x.has_by_all && x.by_all < 0.995)
      snprintf(txt, sizeof txt,
               "epoch %llu: the group of %llu averaged %.0f%% by all",
               (unsigned long long)x.step, (unsigned long long)x.group_size,
               100 * x.by_all);
    if (txt[0])
      event(m, now_ms, MON_EV_ROUND, p->id, x.step, txt);
    /* Loss scaling dropped batches in the step (their scaled gradients
     * overflowed): a few while the scale settles, more is trouble. */
    if (x.has_loss_scale && x.dropped > 0) {
      snprintf(txt, sizeof txt,
               "epoch %llu: %llu batch%s dropped for overflow, loss scale "
               "now 2^%d",
               (unsigned long long)x.step, (unsigned long long)x.dropped,
               x.dropped == 1 ? "" : "es", ilogb(x.loss_scale));
      event(m, now_ms, MON_EV_ROUND, p->id, x.step, txt);
    }
  }
  /* Its parameters left the swarm's, or came back (a state loaded, or a
   * full state round): said when it changes, the first record too. */
  if (x.diverged != (p->has_metrics && p->metrics.diverged)) {
    char txt[96];
    if (x.diverged)
      snprintf(txt, sizeof txt,
               "out of line from epoch %llu: stepped without its peers' "
               "round",
               (unsigned long long)x.step);
    else
      snprintf(txt, sizeof txt, "back in line at epoch %llu",
               (unsigned long long)x.step);
    event(m, now_ms, MON_EV_ROUND, p->id, x.step, txt);
  }
  p->metrics = x;
  p->has_metrics = true;
  p->seen_ms = now_ms;
}

void mon_donors(mon *m, uint64_t now_ms, const mon_record *donors, size_t n) {
  for (size_t i = 0; i < n; i++) {
    proto_donor d;
    int rc = proto_donor_decode(donors[i].value, donors[i].n, &d);
    if (rc) {
      bad_record(m, donors[i].id, now_ms, "donor", rc);
      continue;
    }
    mon_peer *p = peer_of(m, donors[i].id);
    if (!p || strcmp(d.run, m->cfg.run) != 0)
      continue;
    p->has_donor = true;
    snprintf(p->addr, sizeof p->addr, "%s", d.addr);
    p->donor_epoch = d.epoch;
    p->slots = d.slots;
  }
}

int mon_links(mon *m, uint64_t now_ms, const mon_record *links, size_t n) {
  int out = 0;
  proto_links *l = malloc(sizeof *l);
  if (!l)
    return -ENOMEM;
  for (size_t i = 0; i < n; i++) {
    int rc = proto_links_decode(links[i].value, links[i].n, l);
    if (rc) {
      bad_record(m, links[i].id, now_ms, "links", rc);
      continue;
    }
    mon_peer *p = peer_of(m, links[i].id);
    if (!p || strcmp(l->run, m->cfg.run) != 0)
      continue;
    if (!p->links && !(p->links = malloc(sizeof *p->links))) {
      out = -ENOMEM;
      continue;
    }
    *p->links = *l;
    p->links_ms = now_ms;
  }
  free(l);
  for (size_t i = 0; i < m->npeers; i++) {
    mon_peer *p = &m->peers[i];
    if (p->links && now_ms - p->links_ms >= MON_GONE_MS) {
      free(p->links);
      p->links = NULL;
    }
  }
  return out;
}

/* Joins (a first progress record) and leaves (a last one that says so,
 * or quiet for MON_GONE_MS). */
static void churn(mon *m, uint64_t now_ms) {
  for (size_t i = 0; i < m->npeers;) {
    mon_peer *p = &m->peers[i];
    const proto_progress *g = &p->progress;
    bool left = p->has_progress && g->leaving;
    bool quiet = !p->seen_ms || now_ms - p->seen_ms >= MON_GONE_MS ||
                 (p->has_progress && g->time_ms + MON_GONE_MS <= now_ms);
    if (p->has_progress && !p->joined && !left && !quiet) {
      p->joined = true;
      m->joined++;
      event(m, now_ms, MON_EV_JOIN, p->id, 0, "joined");
    }
    if (left || quiet) {
      if (p->joined) {
        m->left++;
        event(m, now_ms, MON_EV_LEAVE, p->id, 0, left ? "left" : "went quiet");
      }
      free(p->links);
      *p = m->peers[--m->npeers];
      continue;
    }
    i++;
  }
}

double mon_noise_scale(const mon_peer *peers, size_t n) {
  double g2 = 0, s = 0;
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    const proto_metrics *x = &peers[i].metrics;
    if (!peers[i].has_metrics)
      continue;
    double bs = (double)x->batch_local, bb = (double)x->batch_avg;
    if (bs <= 0 || bb <= bs || !isfinite(x->grad_sq_local) ||
        !isfinite(x->grad_sq_avg))
      continue;
    /* E|G_B|^2 = |G|^2 + tr(Sigma) / B, at the two batch sizes. */
    g2 += (bb * x->grad_sq_avg - bs * x->grad_sq_local) / (bb - bs);
    s += (x->grad_sq_local - x->grad_sq_avg) / (1 / bs - 1 / bb);
    k++;
  }
  if (!k || !(g2 > 0))
    return NAN;
  return s / g2;
}

/* The peers' means for the point: loss, round and compute times, group,
 * MiB sent. */
static void means(const mon *m, mon_point *pt) {
  double loss = 0, wl = 0, group = 0, round = 0, comp = 0, mib = 0, avg = 0;
  size_t nm = 0, na = 0;
  for (size_t i = 0; i < m->npeers; i++) {
    const mon_peer *p = &m->peers[i];
    if (!p->has_metrics)
      continue;
    const proto_metrics *x = &p->metrics;
    if (x->has_loss) { /* weighted by the samples behind it */
      double w = x->batch_local ? (double)x->batch_local : 1;
      loss += x->loss * w;
      wl += w;
    }
    group += (double)x->group_size;
    round += x->averaging_s;
    comp += x->compute_s;
    mib += (double)x->bytes_sent / (1 << 20);
    if (x->has_by_all) {
      avg += x->by_all;
      na++;
    }
    nm++;
  }
  pt->loss = wl > 0 ? loss / wl : NAN;
  if (nm) {
    pt->group = group / (double)nm;
    pt->round_s = round / (double)nm;
    pt->compute_s = comp / (double)nm;
    pt->mib_sent = mib / (double)nm;
  }
  pt->averaged = na ? avg / (double)na : NAN;
  pt->granularity = pt->round_s > 0 ? pt->compute_s / pt->round_s : 0;
  pt->noise_scale = mon_noise_scale(m->peers, m->npeers);
}

/* The target: the configured one, or the most samples an epoch held
 * before the swarm moved past it (an estimate: each peer stops at the
 * target, so an epoch holds about the target or a little more). */
static uint64_t target_of(mon *m, const proto_swarm_view *v) {
  if (m->cfg.target)
    return m->cfg.target;
  if (m->any_epoch && v->epoch > m->epoch_seen && m->samples_prev > 0)
    m->inferred = m->samples_prev;
  return m->inferred;
}

const mon_point *mon_scrape(mon *m, uint64_t now_ms, const mon_record *progress,
                            size_t np, const mon_record *metrics, size_t nm) {
  for (size_t i = 0; i < np; i++)
    take_progress(m, &progress[i], now_ms);
  for (size_t i = 0; i < nm; i++)
    take_metrics(m, &metrics[i], now_ms);
  churn(m, now_ms);
  proto_progress *all = malloc((m->npeers ? m->npeers : 1) * sizeof *all);
  size_t n = 0;
  for (size_t i = 0; all && i < m->npeers; i++)
    if (m->peers[i].has_progress)
      all[n++] = m->peers[i].progress;
  proto_swarm_view v;
  /* Target 1 here: the view's samples and rates do not depend on it. */
  proto_swarm_view_compute(all, n, m->cfg.run, 1, now_ms, &v);
  free(all);
  mon_point pt = {.time_ms = now_ms,
                  .epoch = v.epoch,
                  .samples = v.samples,
                  .samples_per_second = v.samples_per_second,
                  .peers = (unsigned)v.peers,
                  .eta_s = -1};
  pt.target = target_of(m, &v);
  if (pt.target && v.samples >= pt.target)
    pt.eta_s = 0;
  else if (pt.target && v.samples_per_second > 0)
    pt.eta_s = (double)(pt.target - v.samples) / v.samples_per_second;
  if (m->any_epoch && v.epoch > m->epoch_seen) {
    char txt[40];
    snprintf(txt, sizeof txt, "epoch %llu", (unsigned long long)v.epoch);
    event(m, now_ms, MON_EV_EPOCH, NULL, v.epoch, txt);
  }
  if (n) {
    m->any_epoch = true;
    m->epoch_seen = v.epoch;
    m->samples_prev = v.samples;
  }
  means(m, &pt);
  mon_point old;
  if (ring_push(&m->fine, &pt, &old) && m->evicted++ % COARSE_EVERY == 0) {
    mon_point drop;
    ring_push(&m->coarse, &old, &drop);
  }
  m->scrapes++;
  m->last = pt;
  m->has_last = true;
  return &m->last;
}

const char *mon_run(const mon *m) { return m->cfg.run; }

const mon_peer *mon_peers(const mon *m, size_t *n) {
  *n = m->npeers;
  return m->peers;
}

void mon_counts(const mon *m, uint64_t *joined, uint64_t *left,
                uint64_t *scrapes) {
  *joined = m->joined;
  *left = m->left;
  *scrapes = m->scrapes;
}

const mon_point *mon_last(const mon *m) {
  return m->has_last ? &m->last : NULL;
}

static const mon_event *event_at(const mon *m, size_t i) {
  return &m->ev[(m->ev_head + MON_EVENTS_MAX - m->ev_n + i) % MON_EVENTS_MAX];
}

size_t mon_events(const mon *m, uint64_t since_ms, const mon_event **out,
                  size_t max) {
  size_t first = m->ev_n; /* the oldest one newer than since_ms */
  for (size_t i = 0; i < m->ev_n && first == m->ev_n; i++)
    if (event_at(m, i)->time_ms > since_ms)
      first = i;
  size_t k = m->ev_n - first;
  if (out)
    for (size_t i = k > max ? m->ev_n - max : first, j = 0; i < m->ev_n; i++)
      out[j++] = event_at(m, i);
  return k;
}

size_t mon_history_n(const mon *m) { return m->coarse.n + m->fine.n; }

const mon_point *mon_history_at(const mon *m, size_t i) {
  if (i < m->coarse.n)
    return ring_at(&m->coarse, i);
  return ring_at(&m->fine, i - m->coarse.n);
}
