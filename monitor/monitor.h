/* monitor.h: trainmonitor's core, what it makes of a run's DHT records.
 *
 * The core does no I/O: trainmonitor's glue reads "{run}_progress" and
 * "{run}_metrics" from the DHT every scrape (the DHT has checked each
 * owned record's signature and schema) and hands the values here with
 * their owners' ids and the wall clock.  The core keeps each peer's
 * latest records, notices peers that join and leave, computes the swarm
 * view as the bees do (proto_swarm_view_compute), the round figures and
 * the gradient noise scale, keeps a bounded history, and renders all of
 * it as JSON (the dashboard, /api/...) and as Prometheus text
 * (/metrics).  Nothing here is thread-safe: one loop owns a mon.
 */
#ifndef BEE_MONITOR_H
#define BEE_MONITOR_H

#include "proto.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifndef MON_PEERS_MAX
#define MON_PEERS_MAX 4096 /* peers tracked; the records of more are skipped */
#endif
#ifndef MON_EVENTS_MAX
#define MON_EVENTS_MAX 1024 /* the newest events kept */
#endif
/* A peer is gone once its newest progress record is this old (a bee
 * that trains publishes one at least every 10 s, though the DHT keeps it
 * for 30 s), or none of its records was found for this long, or at once
 * when its last record says it left. */
#ifndef MON_GONE_MS
#define MON_GONE_MS 20000
#endif

typedef struct mon_config {
  char run[PROTO_RUN_MAX + 1];
  uint64_t target;    /* the run's target batch; 0: inferred from the epochs */
  size_t history_max; /* points kept at full resolution; 0: 86400 */
} mon_config;

/* One record as the DHT returned it: the owner's peer id and the value. */
typedef struct mon_record {
  const uint8_t *id; /* PROTO_ID_BYTES */
  const uint8_t *value;
  size_t n;
} mon_record;

typedef struct mon_peer {
  uint8_t id[PROTO_ID_BYTES];
  proto_progress progress;
  proto_metrics metrics;
  bool has_progress, has_metrics;
  uint64_t first_ms, seen_ms; /* scrapes that first and last found it */
  bool joined;                /* its join is counted (a progress record) */
  bool has_donor;             /* its donor record: address, free slots */
  char addr[PROTO_ADDR_MAX];
  uint64_t donor_epoch, slots;
  proto_links *links; /* its links record (heap); NULL: none, or
                                 none found for MON_GONE_MS */
  uint64_t links_ms;  /* the scrape that last found it */
} mon_peer;

/* STATE: a peer's epoch jumped by more than one between two of its
 * records (it loaded the state from a donor); ROUND: a peer's metrics of
 * a new step say its round failed (it stepped alone while others were in
 * the run, or a member dropped out and part of the tensor was not
 * averaged by all). */
enum {
  MON_EV_JOIN = 1,
  MON_EV_LEAVE,
  MON_EV_EPOCH,
  MON_EV_BAD,
  MON_EV_STATE,
  MON_EV_ROUND
};

typedef struct mon_event {
  uint64_t time_ms;
  int type;                   /* MON_EV_* */
  uint8_t id[PROTO_ID_BYTES]; /* JOIN, LEAVE, BAD, STATE, ROUND: whose */
  uint64_t epoch;             /* EPOCH: the swarm's new epoch; STATE: the
                                 one loaded; ROUND: the step's */
  char text[96];              /* a line for people */
} mon_event;

/* The figures of one scrape. */
typedef struct mon_point {
  uint64_t time_ms;
  uint64_t epoch, samples, target;
  double samples_per_second, eta_s; /* eta -1: unknown */
  unsigned peers;
  double loss;        /* the peers' last losses, each weighted by the
                         samples of its epoch; NaN: none */
  double group;       /* mean group size of the peers' last rounds */
  double round_s;     /* mean averaging time of their last epochs */
  double compute_s;   /* mean computing time of their last epochs */
  double granularity; /* compute_s / round_s; 0 when round_s is 0 */
  double mib_sent;    /* mean MiB sent in their last rounds */
  double averaged;    /* mean share of the tensor the peers' last
                            rounds averaged by their whole group (1: all,
                            0: none; NaN: no peer says) */
  double noise_scale; /* the critical batch estimate; NaN: none */
} mon_point;

typedef struct mon mon;

/* Makes a monitor for cfg->run.  Returns 0, BEE_ECONFIG (no run, or one
 * over PROTO_RUN_MAX) or -ENOMEM. */
int mon_new(const mon_config *cfg, mon **out);
void mon_free(mon *m); /* accepts NULL */

/* One scrape at now_ms (unix ms): every record found under the run's
 * progress and metrics keys.  A value that does not decode, or is of
 * another run, is skipped (a malformed one makes one MON_EV_BAD event per
 * peer, not one per scrape).  Updates the peers, the events and the
 * history, and returns the scrape's point. */
const mon_point *mon_scrape(mon *m, uint64_t now_ms, const mon_record *progress,
                            size_t np, const mon_record *metrics, size_t nm);

const char *mon_run(const mon *m);
/* The donor records of the scrape mon_scrape just took ("<run>_donors":
 * the state a peer serves, its address and its free download slots),
 * attached to the peers they name; a malformed one is reported as in
 * mon_scrape. */
void mon_donors(mon *m, uint64_t now_ms, const mon_record *donors, size_t n);
/* The links records of that scrape ("<run>_links": what each peer
 * measured of its links from the others), attached to the peers they
 * name; a malformed one is reported as in mon_scrape.  -ENOMEM when a
 * record could not be kept (the others are). */
int mon_links(mon *m, uint64_t now_ms, const mon_record *links, size_t n);
/* The peers known now: each has a progress record of the run (gone ones
 * are dropped); and the counts so far. */
const mon_peer *mon_peers(const mon *m, size_t *n);
void mon_counts(const mon *m, uint64_t *joined, uint64_t *left,
                uint64_t *scrapes);
/* The newest point, or NULL before the first scrape. */
const mon_point *mon_last(const mon *m);
/* Events newer than since_ms, oldest first: the newest max of them go to
 * out; returns how many there are (out may be NULL to count). */
size_t mon_events(const mon *m, uint64_t since_ms, const mon_event **out,
                  size_t max);

/* The gradient noise scale B_simple of McCandlish et al. (2018) from each
 * peer's squared gradient norms at two batch sizes (its own batch and
 * the group's averaged one): |G|^2 and tr(Sigma) are estimated per peer
 * and averaged over the peers before their ratio is taken.  NaN when no
 * peer has two different batch sizes. */
double mon_noise_scale(const mon_peer *peers, size_t n);

/* ---- rendering (render.c) ------------------------------------------------ */

/* A growing text buffer; its functions keep len and a NUL, and fail only
 * when memory runs out (then oom is set and the text is incomplete). */
typedef struct mon_buf {
  char *p;
  size_t len, cap;
  bool oom;
} mon_buf;
void mon_buf_free(mon_buf *b);
void mon_buf_printf(mon_buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* A JSON string of s, quoted and escaped. */
void mon_buf_json_str(mon_buf *b, const char *s);

/* The snapshot: run, the last point, counts, peers, recent events.
 * Returns 0 or -ENOMEM. */
int mon_snapshot_json(const mon *m, mon_buf *out);
/* The points newer than since_ms (downsampled to at most max_points,
 * evenly), as a JSON array.  0 or -ENOMEM. */
int mon_history_json(const mon *m, uint64_t since_ms, size_t max_points,
                     mon_buf *out);
/* One line of the log file: the last point and every peer's epoch, rate,
 * loss and label (no newline).  0 or -ENOMEM. */
int mon_line_json(const mon *m, mon_buf *out);
/* Prometheus text format 0.0.4: swarm gauges, per-peer gauges labelled
 * by peer id and label, and per-link gauges labelled by the ids at both
 * ends (beed_link_rtt_seconds{from,to}, beed_link_bandwidth_bits{from,to}:
 * bits per second from `from` to `to`).  0 or -ENOMEM. */
int mon_prometheus(const mon *m, mon_buf *out);
/* The link matrix as JSON: {"run", "bees": [{"id", "label"}...], "links":
 * [{"from", "to", "rtt_ms", "mbit", "age_s"}...]} with every link a known
 * peer measured (rtt_ms or mbit null where not measured).  0 or -ENOMEM. */
int mon_links_json(const mon *m, mon_buf *out);

/* History access for the renderers: the points kept, oldest first. */
size_t mon_history_n(const mon *m);
const mon_point *mon_history_at(const mon *m, size_t i);

#endif /* BEE_MONITOR_H */
