/* run.h: a bee's decisions in its run, as a core without I/O (daemon/).
 *
 * Everything a bee decides from the run's records, timings and results,
 * rather than by moving bytes, lives in one core, `bee_run`: the swarm
 * view it reads from the progress records, when the group of an epoch
 * forms (ahead of the target) and whom it expects, the round the worker
 * asks for at each step, who is behind, when a state is downloaded and
 * from whom, the download's chunks and checks, and the split check.  It
 * does no I/O of its own: the clocks, the DHT, the averager, the state
 * chunks and the worker thread come in through `bee_run_io`, and their
 * answers go back through the bee_run_* calls below, on the caller's one
 * thread.  beed binds it to libuv, the DHT node, the averager's glue and
 * the worker (train-swarm.c); tests/swarmsim.c runs hundreds of them in
 * one process on a fake clock.  The words it uses (line, ahead, donor,
 * split, moot, stepped) are defined in docs/ARCHITECTURE.md's glossary.
 *
 * Calls into the core may call io functions before they return, and some
 * io functions call back into the core before they return (io.cancel
 * runs the averaging's end at once): the core expects that.
 */
#ifndef BEE_DAEMON_RUN_H
#define BEE_DAEMON_RUN_H

#include "averager.h"
#include "bee.h"

#define BEE_RUN_TICK_MS 250 /* bee_run_tick's period */

typedef struct bee_run bee_run;

/* What the worker thread holds, as the core reads it (io.worker). */
typedef struct bee_run_worker {
  uint64_t epoch;   /* the epoch it trains at */
  uint64_t samples; /* gathered at it */
  bool go;          /* it may train (bee_run_io.go was called) */
  bool load;        /* a state handed over (io.load) and not yet taken */
  uint64_t load_epoch;
  /* It stepped without the round its peers averaged (or was marked by
   * the split check) at diverged_epoch, and has not loaded their state
   * since. */
  bool diverged;
  uint64_t diverged_epoch;
  /* The round it asked for: wanted until io.round_over answers it. */
  bool round_wanted;
  bool round_answered; /* the last one asked is answered */
  bool round_state;    /* a state round */
  uint64_t round_epoch;
  double round_weight; /* its samples (state rounds: 1) */
  /* The snapshot it serves to downloads: the epoch it begins. */
  bool snap;
  uint64_t snap_epoch;
} bee_run_worker;

/* What the core tells the worker after each view (io.guide): the view
 * and what the worker's step decisions read beside it (train.c,
 * bee_epoch_ready and its DiLoCo cousin).  Times are io.now_ms's clock. */
typedef struct bee_run_guide {
  proto_swarm_view view;
  /* A download and its records' travel (and the matchmaking ahead) fit
   * in one of the swarm's epochs. */
  bool join_fits;
  /* --group-size in a run larger than a group: each group takes a step
   * of its own, and the state rounds bring them together (bee_grid). */
  bool grouped;
  uint64_t others;    /* the other peers' samples at view.epoch */
  double others_rate; /* their samples/s, to extrapolate */
  uint64_t view_ms;   /* when the view was made */
  double own_rate;    /* this bee's samples/s then */
  /* DiLoCo: when the others at the worker's epoch will have taken their
   * inner steps, the first of them, and when the round comes with this
   * bee in it (0: unknown). */
  uint64_t others_due_ms, others_first_ms, round_ms;
} bee_run_guide;

/* The end of the round the worker asked for (io.round_over). */
typedef struct bee_run_result {
  int status;     /* 0 averaged; -ENOENT alone at its epoch; else why not */
  size_t group;   /* members of the round */
  double by_all;  /* share of the buffer every member with data averaged */
  bool ahead;     /* its group formed ahead */
  bool left;      /* its group went on without this bee */
  bool formed;    /* no group for it, where one had formed without it: a
                     leader whose group had formed refused it, or no
                     other peer was declared for the round when it read
                     the key (their group had formed before it looked) */
  uint64_t batch; /* the group's samples, its members' weights */
  uint64_t bytes_sent, bytes_recv;
  uint64_t done_ms;
  /* The round's summary when one ran (borrowed for the call): the spans
   * that did not come back averaged are the caller's to clear. */
  const avg_round_summary *summary;
  /* No round for this bee (it missed the swarm's): the swarm's step for
   * the epoch instead, len bytes at step (borrowed for the call: the
   * caller copies it into the worker's buffer). */
  bool swarm;
  const uint8_t *step;
  size_t step_len;
} bee_run_result;

/* An averaging the core asks for (io.match, io.average, io.round): the
 * matchmaking's settings; the buffer is the worker's, named by the round
 * it asked for. */
typedef struct bee_run_avg {
  uint64_t round;     /* an epoch, or BEE_RUN_STATE_ROUND + epoch */
  bool state;         /* a state round: the whole state, uncompressed */
  size_t target_size; /* the members it begins with at once */
  size_t max_size;    /* and at most */
  double weight;      /* this bee's */
  uint64_t matchmaking_ms;
  uint64_t first_start_ms; /* 0: matchmaking_ms */
  uint64_t deadline_ms;
  char bits[PROTO_BITS_MAX + 1]; /* group bits */
} bee_run_avg;

#define BEE_RUN_STATE_ROUND (UINT64_C(1) << 63) /* + epoch: a state round */
/* Steps a bee takes from its peers after a download at most, to come
 * level with the swarm instead of downloading again. */
#define BEE_RUN_CATCHUP_MAX 8

/* One epoch step the worker took, for the metrics record (its figures)
 * and the line the split check compares. */
typedef struct bee_run_step {
  uint64_t epoch, samples;
  double loss;
  int avg_status;
  size_t group;
  double by_all;
  bool diverged;
  uint8_t hash[PROTO_PARAMS_HASH_BYTES];
  double compute_s, averaging_s;
  uint64_t skipped;
  float loss_scale;
  uint64_t bytes_sent, bytes_recv;
  double grad_sq_local, grad_sq_avg;
  uint64_t batch_avg;
} bee_run_step;

/* Which read of the metrics an answer is for. */
enum { BEE_RUN_METRICS_SPLIT = 1, BEE_RUN_METRICS_RESYNC };

typedef struct bee_run_io {
  void *ctx;
  /* Clocks: monotonic and wall-clock (unix) milliseconds. */
  uint64_t (*now_ms)(void *ctx);
  uint64_t (*unix_ms)(void *ctx);
  /* The worker's state, copied (under its lock). */
  void (*worker)(void *ctx, bee_run_worker *w);
  /* The view and its companions for the worker. */
  void (*guide)(void *ctx, const bee_run_guide *g);
  /* The worker may start training. */
  void (*go)(void *ctx);
  /* A downloaded state for the worker, checked (checksum, size, shape):
   * len bytes at state (heap: the worker's now), as of epoch. */
  void (*load)(void *ctx, uint8_t *state, size_t len, uint64_t epoch);
  /* After a load: the swarm's step from epoch, for the worker to take
   * after the state and the steps before it (len bytes at buf, heap: the
   * worker's now; NULL: a step that changed nothing). */
  void (*replay)(void *ctx, uint8_t *buf, size_t len, uint64_t epoch);
  /* Marks the worker out of line from epoch on, unless it is already
   * (the split check's verdict). */
  void (*mark_diverged)(void *ctx, uint64_t epoch);
  /* Back in line with the parameters it has: no peer of the run was in
   * line to load from, and this bee's line is the one the run takes up
   * (bee__lines_orphaned). */
  void (*adopt_line)(void *ctx);
  /* The round the worker asked for is over. */
  void (*round_over)(void *ctx, const bee_run_result *r);
  /* DHT.  Each put and get returns 0 and answers later with the
   * bee_run_* call named, exactly once, or returns an error and never
   * answers.  Records expire at exp_s (unix seconds). */
  int (*put_progress)(void *ctx, const proto_progress *p, uint64_t exp_s);
  /* -> bee_run_progress_stored */
  int (*get_progress)(void *ctx); /* -> bee_run_progress_read */
  int (*put_donor)(void *ctx, const proto_donor *d, uint64_t exp_s);
  /* -> bee_run_donor_stored */
  int (*get_donors)(void *ctx); /* -> bee_run_donors_read */
  /* Fire and forget. */
  int (*put_metrics)(void *ctx, const proto_metrics *m, uint64_t exp_s);
  int (*get_metrics)(void *ctx, int which); /* -> bee_run_metrics_read */
  /* Averaging (one at a time).  match: the matchmaking alone, ahead of
   * the buffer (-> bee_run_matched); average: matchmaking and round with
   * the worker's buffer; round: the round alone with a group formed
   * ahead (both -> bee_run_round_done).  Each returns 0 and answers
   * later, or an error and never answers. */
  int (*match)(void *ctx, const bee_run_avg *a);
  int (*average)(void *ctx, const bee_run_avg *a);
  int (*round)(void *ctx, const avg_group *g, const bee_run_avg *a);
  /* Ends the averaging under way with its answer (BEE_ECANCELED) before
   * it returns; nothing under way: nothing happens. */
  void (*cancel)(void *ctx);
  /* Whether the averaging under way is still matchmaking. */
  bool (*matching)(void *ctx);
  /* Leaves the group g formed ahead (its members drop us at once), or
   * tells them we are coming (WAIT). */
  void (*leave)(void *ctx, const avg_group *g, const char *why);
  void (*wait)(void *ctx, const avg_group *g);
  /* State downloads: a chunk of len bytes at offset of the state (step
   * BEE_RUN_STATE, a request) or of the step the peer took from epoch
   * `step` (a step request), from the peer id (-> bee_run_chunk with
   * tag), over a connection we have; -ENOTCONN when there is none.
   * Several may be on their way at once, to one peer and to several.
   * Each is answered within BEE_RUN_CHUNK_MS, by the peer or a timeout;
   * the core itself drops a peer that answered none for less. */
  int (*chunk)(void *ctx, const uint8_t id[PROTO_ID_BYTES], uint64_t step,
               uint64_t offset, uint32_t len, uint64_t tag);
  /* Downloads of our state we would start now (--max-state-uploads less
   * those running). */
  uint64_t (*free_slots)(void *ctx);
  /* Why a state's header (BEE_RUN_STATE_HDR bytes) does not fit this
   * bee, or NULL when it does. */
  const char *(*state_mismatch)(void *ctx, const uint8_t *hdr);
} bee_run_io;

#define BEE_RUN_STATE_HDR 64
#define BEE_RUN_STATE UINT64_MAX /* io.chunk: the state, not a step */
/* io.chunk's answer at the latest: long enough for the last of a
 * window of requests on a link as slow as 1 Mbit/s. */
#define BEE_RUN_CHUNK_MS 60000

/* What the core needs besides the flags (this bee's address, which the
 * matchmaking and the donor record declare, is the glue's). */
typedef struct bee_run_config {
  const bee_config *cfg; /* borrowed, outlives the core */
  size_t state_bytes;    /* a snapshot of this model's state */
  size_t step_bytes;     /* a step's buffer (the parameters'); 0: bees do
                            not take the swarm's steps */
  uint32_t chunk_bytes;  /* asked per state request; 0: 1 MiB */
  uint8_t self_id[PROTO_ID_BYTES]; /* this bee's */
} bee_run_config;

/* Makes a core; nothing happens until bee_run_start.  Returns 0, or
 * -ENOMEM. */
int bee_run_new(const bee_run_config *c, const bee_run_io *io, bee_run **out);
/* Frees r (NULL accepted) and a download's buffer. */
void bee_run_free(bee_run *r);

/* Starts the run: from now on the tick and the answers count. */
void bee_run_start(bee_run *r);
/* This bee expects to join through known peers (no --join targets), or
 * has joined the DHT through one: only then may it start a run of its own
 * when it finds itself alone (bee_train_joined). */
void bee_run_expect_join(bee_run *r);
void bee_run_joined(bee_run *r);
/* Stops the run: answers that still come are ignored.  NULL is
 * ignored. */
void bee_run_stop(bee_run *r);
/* The worker stops: a group formed ahead is left (with its members
 * told).  NULL is ignored. */
void bee_run_halt(bee_run *r);

/* Every BEE_RUN_TICK_MS: samples the worker computed in compute_s
 * seconds since the last tick (for the rate); then the progress record,
 * the donor record, the view's read, the rounds, the split check. */
void bee_run_tick(bee_run *r, uint64_t samples, double compute_s);
/* The worker took steps (their reports, in order) and may wait for a
 * round. */
void bee_run_stepped(bee_run *r, const bee_run_step *steps, size_t n);

/* Answers. */
void bee_run_progress_stored(bee_run *r, int status);
/* The others' records under the progress key (status 0; not this
 * bee's), owners in ids; status != 0: none read. */
void bee_run_progress_read(bee_run *r, int status, const proto_progress *v,
                           const uint8_t (*ids)[PROTO_ID_BYTES], size_t n);
void bee_run_donor_stored(bee_run *r, int status);
void bee_run_donors_read(bee_run *r, int status, const proto_donor *v,
                         const uint8_t (*ids)[PROTO_ID_BYTES], size_t n);
void bee_run_metrics_read(bee_run *r, int which, int status,
                          const proto_metrics *v,
                          const uint8_t (*ids)[PROTO_ID_BYTES], size_t n);
/* A group formed ahead (status 0, g borrowed), or why none did. */
void bee_run_matched(bee_run *r, int status, const avg_group *g);
/* The averaging's end (res borrowed). */
void bee_run_round_done(bee_run *r, const avg_node_result *res);
/* The answer to io.chunk's request tagged tag: status 0 and m (NULL: an
 * answer that does not decode), or the transport's status (with
 * BEE_EREMOTE, the donor's code in remote_code). */
void bee_run_chunk(bee_run *r, uint64_t tag, int status, int64_t remote_code,
                   const proto_state_msg *m);
/* A peer declared itself for a round of this run with another layout:
 * it is never grouped with us, nor asked for the state. */
void bee_run_other_layout(bee_run *r, const uint8_t id[PROTO_ID_BYTES]);

/* Leaving: the last progress record, which says so, and its expiration;
 * the caller stores it. */
void bee_run_leave_record(bee_run *r, proto_progress *p, uint64_t *exp_s);

/* Read-outs for status lines and beectl. */
const proto_swarm_view *bee_run_view(const bee_run *r);
double bee_run_rate(const bee_run *r);
/* Whether a state (or step) download is under way. */
bool bee_run_downloading(const bee_run *r);
/* Counters of what it did, for the simulator and benchmarks. */
typedef struct bee_run_stats {
  uint64_t downloads;      /* states loaded */
  uint64_t download_bytes; /* chunk bytes received */
  uint64_t splits;         /* split verdicts against this bee */
  uint64_t resyncs;        /* downloads to come back in line */
  uint64_t orphans;        /* lines taken up where none was in line */
  double last_download_s;  /* the last one took this long (0: none) */
  uint64_t steps_taken;    /* the swarm's steps taken (after downloads, and
                              for rounds that missed them) */
  uint64_t steps_polled;   /* of them, asked of the donors before the
                              records said the peers had stepped */
} bee_run_stats;
void bee_run_stats_get(const bee_run *r, bee_run_stats *st);

/* The worker's decisions, from the last guide (pure: the worker calls
 * them on its own thread, with its copy of the guide). */
/* The other peers' samples at the view's epoch by now_ms: the view's
 * count extrapolated at their rate since it was made (for at most the
 * progress records' lifetime). */
double bee_run_others_now(const bee_run_guide *g, uint64_t now_ms);
/* Whether a worker at epoch with samples takes its epoch step now.
 * Gradient averaging: once its samples and the others' (at its epoch)
 * reach the target, or the swarm is past its epoch (bee_epoch_ready).
 * DiLoCo: after --inner-steps local steps, when the swarm is past, or
 * when the others at its epoch are done and it is more than
 * OUTER_LAG_MIN_S from its own end (it then takes its round with the
 * steps it has). */
bool bee_run_step_due(const bee_config *cfg, const bee_run_guide *g,
                      uint64_t epoch, uint64_t samples, uint64_t now_ms);
/* Whether the step of epoch, with samples of this bee's and a round that
 * ended with status (left: its group went on without it), takes the bee
 * out of its swarm's line (until it loads their state). */
bool bee_run_step_diverges(const bee_run_guide *g, uint64_t epoch,
                           uint64_t samples, int status, bool left);

#endif /* BEE_DAEMON_RUN_H */
