/* train-int.h: what the files of beed's training share (daemon/).
 *
 *   train.c        the worker and evaluator threads, the epoch step, the
 *                  worker's news on the loop, life cycle and leaving
 *   train-swarm.c  the run in the DHT (progress records, the swarm view,
 *                  metrics), the averaging round, the loop's tick
 *   train-state.c  snapshots of the state: served to peers, downloaded
 *                  from them, written as checkpoints
 *
 * train.c's head comment has the design.  Nothing outside these three
 * files includes this header.
 */
#ifndef BEE_DAEMON_TRAIN_INT_H
#define BEE_DAEMON_TRAIN_INT_H

#include "averager.h"
#include "bee.h"
#include "dht.h"
#include "trainer.h"

#include <errno.h>
#include <math.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define COMP "train"
#define TICK_MS 250  /* counters, publication, steps */
#define VIEW_MS 1000 /* how often the swarm's records are read */
#define STEP_RING 64 /* epoch steps the worker may be ahead of the log */
#define MATCH_GRACE_MS 2000 /* no group this long after --matchmaking-time:
                               the local step */
#define AHEAD_WAIT_S 2.0 /* a group formed ahead whose round we have not
                            begun hears from us this often (avg_node_wait),
                            well within the round's sender timeout (5 s) */
#define AHEAD_WAIT_LATE_S 10.0 /* and no longer than this after our round
                                  was expected (bee__match_ahead) */
#define STATE_ROUND (UINT64_C(1) << 63) /* a state round's number: this
                                           plus the epoch */
#define DESERTED_VIEWS 2 /* views in a row with nobody else at the epoch
                            of a matchmaking: it ends (a read of the DHT
                            may miss a record now and then) */
#define ROUND_DEADLINE_MS 30000
#define MIN_EPOCH_S 2.0 /* epochs shorter than this are not shared */
/* note_stepped: no shorter epochs.  Epochs near it switch between
 * counting the group from the step and not, as the rate estimate moves;
 * 0.25 s put test-net-batch's CI swarm (0.3 s epochs) there. */
#define STEPPED_MIN_EPOCH_S 0.1
#define STATE_METHOD "state.get"
#define STATE_CHUNK (1u << 20)     /* bytes asked per request */
#define STATE_CALL_MS 10000        /* one chunk's answer */
#define STATE_RESTARTS 3           /* snapshots that may change under us */
#define FETCH_BACKOFF_MS 1000      /* every donor busy: the first wait */
#define FETCH_BACKOFF_MAX_MS 8000  /* and the longest */
#define FETCH_PASSES 3             /* failed passes before training on */
#define LAYOUT_WARNED_MAX 32       /* peers of another layout remembered */
#define DONOR_REFRESH_MS 10000 /* the donor record, at least this often */
#define DONOR_TTL_S 30         /* and it lives this long */
#define FETCH_TRAVEL_S 1.5 /* a loaded bee's record in the others' views:
                              the next publish and read (bee__fetch_wait) */
#define FETCH_SETTLE_MS 10000 /* after a download, catch up before another
                                 (or twice what the download took) */
#define STATE_HDR 64 /* four u64 (params, state, buffers, steps), schema */
#define DONORS_MAX 16
#define START_WAIT_MS 3000 /* a first view before training, at most */
#define METRICS_TTL_S 300  /* a metrics record lives this long */
#define LEAVE_MS 2000      /* leaving: the last record's store, at most */
#define RESYNC_MS 2000     /* diverged: the peers' metrics, read this often */
#define SPLIT_MS 4000      /* in line: the same, to see a split */
#define LINES_RING 16      /* own steps remembered for that */
#define SPLIT_PEERS_STEP 32 /* the split check comes SPLIT_MS later for
                               each this many peers in the run */
#define SKIP_STREAK_WARN 100 /* batches dropped in a row (loss scaling) */

enum { AHEAD_NONE, AHEAD_MATCHING, AHEAD_HELD, AHEAD_FAILED };

/* The first half of an epoch step, for the second (train.c). */
struct pend {
  bool active;     /* --delay-averaging: a round runs for it */
  uint64_t epoch, n;
  double loss, compute_s, sq_local;
  double t0;       /* the round was requested, mono_s() */
  double round_s;  /* and took this long */
};

/* What the worker and the loop share, under mu. */
/* A snapshot of the state (bee__make_snapshot), shared by reference
 * under mu: sh.snap holds one, and so does each download served from it
 * (an upload's pin), so that a newcomer gets the snapshot it started on
 * to its end however many steps the donor takes meanwhile.  The last
 * reference frees it (bee__snap_unref). */
/* A checkpoint is a snapshot followed by what is this bee's own and no
 * donor's business: where its data order stands (pass and position), how
 * many dropout masks it has drawn and its loss scale (the float's bits,
 * 0: none), four little-endian u64.  Checkpoints written before the loss
 * scale (CKPT_LOCAL_OLD, three) are read too. */
#define CKPT_LOCAL 32
#define CKPT_LOCAL_OLD 24
#define CKPT_NLOCAL (CKPT_LOCAL / 8)

typedef struct bee_snap {
  unsigned refs;
  uint64_t epoch;
  uint64_t local[CKPT_NLOCAL]; /* CKPT_LOCAL's: order pass, position,
                                  dropout calls, loss scale */
  size_t len;
  uint8_t sum[PROTO_STATE_SUM_BYTES];
  uint8_t data[]; /* len bytes: the header, then the state's arrays */
} bee_snap;

typedef struct shared {
  uint64_t epoch;
  uint64_t samples;      /* computed in this epoch */
  uint64_t pend_samples; /* not yet seen by the loop's rate */
  double pend_s;         /* their computing time */
  double loss_sum;       /* this epoch's summed training loss */
  bool stop;             /* loop -> worker */
  proto_swarm_view view;   /* loop -> worker: the last view */
  bool join_fits;        /* a download and its records' travel (and the
                            matchmaking ahead) fit in one of the swarm's
                            epochs, by the last view (bee__join_s) */
  uint64_t others;       /* the other peers' samples at view.epoch */
  double others_rate;    /* and their rate, to extrapolate */
  double view_s;         /* when the view was made, mono_s() */
  double own_rate;       /* this bee's samples/s at the view */
  double others_due_s;   /* DiLoCo: when the others at the epoch will have
                            taken their inner steps, mono_s(); 0: none */
  double others_first_s; /* and when the first of them will have */
  double round_s;        /* and when the round comes, this bee included
                            (bee_outer_round) */
  int err;               /* worker -> loop: the worker has stopped */
  char errmsg[160];
  /* Epoch steps not yet logged by the loop: a ring, since a bee that
   * catches up steps more than once between two turns of the loop. */
  struct step_report {
    uint64_t epoch, samples;
    double loss;
    int avg_status;       /* 0: averaged; else why not */
    size_t group;         /* members of the round */
    double by_all;        /* share of the tensor every member averaged */
    bool delayed;         /* the round ran behind the next epoch's work */
    bool ahead;           /* its group formed ahead (bee__match_ahead) */
    bool diverged;        /* the parameters have left the swarm's */
    uint8_t hash[PROTO_PARAMS_HASH_BYTES]; /* of the parameters after it */
    /* for the metrics record */
    double compute_s, averaging_s;
    uint64_t skipped;     /* batches loss scaling dropped since the last */
    float loss_scale;     /* and its scale after them */
    uint64_t bytes_sent, bytes_recv;
    double grad_sq_local, grad_sq_avg;
    uint64_t batch_avg;   /* the group's samples (its members' weights) */
    bool state_round;     /* the state was averaged after the step: */
    int state_status;     /* 0, or why not */
    size_t state_group;
    double state_by_all;
  } steps[STEP_RING];
  double compute_s;       /* this epoch's computing time, worker */
  /* loop -> worker: start (after the first view), a state to load */
  bool go;
  uint8_t *load;      /* a downloaded snapshot, checked; the worker frees */
  uint64_t load_epoch;
  /* worker -> loop: the latest snapshot, swapped in under mu */
  bee_snap *snap;
  /* worker <-> loop: the buffer to average (the gradients, DiLoCo's
   * change, or the state) */
  bool avg_req, avg_done;
  bool avg_state;       /* a state round (STATE_ROUND + epoch) */
  float *avg_buf;
  size_t avg_n;
  uint64_t avg_epoch;
  double avg_weight;
  int avg_status;
  size_t avg_group;
  double avg_by_all;
  bool avg_ahead;       /* the group had formed ahead */
  bool avg_left;        /* the group went on without this bee */
  /* worker -> loop: this bee stepped without a round its peers averaged
   * (from diverged_epoch on) and has not loaded their state since */
  bool diverged;
  uint64_t diverged_epoch;
  uint64_t avg_bytes_sent, avg_bytes_recv, avg_batch;
  double avg_done_s;    /* when the round ended, mono_s() */
  uint64_t steps_head, steps_tail; /* written, logged; head - tail <= ring */
  bool evaluated;        /* a test evaluation to report */
  uint64_t eval_epoch;
  double eval_loss, eval_acc;
  bool eval_req, eval_busy, eval_stop; /* worker -> evaluator */
  uint64_t eval_req_epoch;
  uint64_t eval_skipped; /* epochs not evaluated: the last one still ran */
  bool ckpt_req, ckpt_stop; /* worker/loop -> writer */
  uint64_t ckpt_written;    /* epoch of the last checkpoint on disk */
  bool ckpt_any;
} shared;

struct bee_train {
  uv_loop_t *loop;
  const bee_config *cfg;
  const proto_identity *id;
  struct dht_node *dht; /* NULL before start and after stop */
  void (*on_fatal)(void *arg);
  void *fatal_arg;
  uv_timer_t timer;
  uv_async_t async;
  bool handles, started, stopped;
  uv_thread_t thread, eval_thread;
  bool eval_started;
  uv_mutex_t mu;
  uv_cond_t eval_cv;
  uv_cond_t avg_cv; /* the worker waits there for its round */
  uv_cond_t go_cv;  /* and there to start, or for a state to load */
  uv_cond_t ckpt_cv; /* the writer waits there for a snapshot to write */
  uv_thread_t ckpt_thread;
  bool ckpt_started;
  shared sh;
  /* the worker's */
  trn_model *m;
  trn_model *em; /* the evaluator's copy, filled by the worker */
  trn_optim *o;
  trn_optim *outer; /* DiLoCo's outer step (Nesterov SGD); else NULL */
  float *anchor;    /* DiLoCo: the parameters of the last outer step */
  float *dgrad;     /* --delay-averaging: the gradients in the round */
  float *residual;  /* --error-feedback: what the rounds' coding lost */
  struct pend delayed;
  float *sbuf;      /* state averaging: parameters and optimizer states */
  size_t sn;
  trn_source *src; /* this bee's batches (images: made ahead on a thread
                      of their own) and the test set */
  size_t per;       /* predictions per sample: 1, gpt's window */
  uint64_t skipped_told; /* loss scaling's dropped batches, reported */
  uint64_t skip_streak;  /* dropped in a row */
  char desc[160];   /* the model, as trn_model_describe says it */
  /* the loop's */
  proto_host *host;
  avg_node *avg;
  bool averaging; /* a round is under way */
  bool round_ahead; /* and its group formed ahead */
  /* The group for the coming epoch's round, formed ahead: from
   * --matchmaking-time before the swarm's estimated end of the epoch, while
   * the worker computes its last batches (bee__match_ahead). */
  struct ahead {
    int state; /* AHEAD_* */
    uint64_t epoch;
    double t0; /* the matchmaking began, mono_s() */
    double wait_s; /* our last WAIT to its members, mono_s() */
    double ready_s; /* when its round was expected to run, mono_s() */
    avg_group g;
    proto_group_member gm[AVG_GROUP_MAX];
  } ahead;
  char addr[PROTO_ADDR_MAX];
  uint8_t schema[PROTO_SCHEMA_HASH_BYTES];       /* gradient rounds */
  uint8_t state_schema[PROTO_SCHEMA_HASH_BYTES]; /* state rounds */
  uint8_t key[PROTO_DHT_KEY_BYTES];
  uint8_t sub[PROTO_DHT_OWNED_SUBKEY_BYTES];
  bee_rate rate;
  bee_publisher pub;
  bool put_busy, get_busy, put_warned;
  uint64_t last_get_ms;
  uint64_t behind_warned; /* the swarm epoch last warned about */
  proto_swarm_view view;
  uint64_t cand_epoch; /* the epoch the candidates were counted for */
  /* donors: peers at the swarm's epoch by the last view */
  uint8_t donors[DONORS_MAX][PROTO_ID_BYTES];
  size_t ndonors;
  /* the download under way */
  bool fetching;
  proto_conn *fconn;
  uint8_t fpeer[PROTO_ID_BYTES];
  uint8_t *fbuf;
  uint64_t foffset, ftotal, fepoch;
  uint8_t fsum[PROTO_STATE_SUM_BYTES];
  unsigned frestarts;
  size_t fdonor;       /* next donor to try */
  uint64_t fshown;     /* percent last logged */
  unsigned fbusy;      /* donors of this pass that were busy */
  unsigned ffailed;    /* passes in a row that failed (none busy) */
  uint64_t fstart_ms;  /* this donor's download began (loop ms) */
  uint64_t fsettle_ms; /* no new download for being behind before then */
  uint64_t fretry_ms;  /* every donor busy: ask again from then (loop ms) */
  uint64_t fbackoff_ms; /* and the wait after the next such pass */
  bee_defer fdefer;     /* the next download waits for the swarm's step */
  double swarm_due_s;   /* DiLoCo: the others at the swarm's epoch will have
                           taken their inner steps then, mono_s(); 0: none */
  double flast_s;       /* the last download took this long (0: none) */
  /* the downloads we serve (--max-state-uploads) */
  bee_uploads uploads;
  uint64_t busy_logged_ms; /* the last "told it is busy" line */
  /* peers seen declaring another layout, warned about once each */
  uint8_t layout_warned[LAYOUT_WARNED_MAX][PROTO_ID_BYTES];
  size_t nlayout_warned;
  uint64_t started_ms; /* bee_train_start's loop time */
  /* In the DHT through a --join target (or none was given, or every one
   * was this node): only then may the bee find itself alone and start
   * the run; and since when (bee_train_joined). */
  bool joined;
  bool expect_join; /* no --join, but known peers to join through */
  uint64_t joined_ms;
  size_t candidates;   /* bee_round_candidates, by the last view */
  /* A matchmaking whose epoch the swarm left (end_deserted): the views in
   * a row that found nobody else for it, the epoch they were for, and
   * whether the cancel that ends it is ours (its round_cb says alone). */
  unsigned deserted;
  uint64_t deserted_epoch;
  bool deserted_cancel;
  bool have_view;
  bool short_warned; /* epochs too short to share: said once */
  uint64_t metrics_exp; /* the last metrics record's expiration */
  char last_step[288];  /* the last epoch line's gist, for beectl status */
  float loss_scale;     /* as of the last epoch line (0: none) */
  uint64_t dropped;     /* batches loss scaling dropped, by those lines */
  bool out_of_line;     /* and whether its parameters left the swarm's */
  bool halted;          /* the threads are stopped */
  void (*leave_done)(void *arg); /* leaving: called once the last record
                                    is stored or LEAVE_MS passed */
  void *leave_arg;
  uint8_t mkey[PROTO_DHT_KEY_BYTES];
  /* our donor record under "<run>_donors" (what we serve, and how many
   * more downloads we would start now) */
  uint8_t dkey[PROTO_DHT_KEY_BYTES];
  bool donor_busy, donor_any;
  uint64_t donor_epoch, donor_slots, donor_ms, donor_exp;
  uint64_t status_ms;
  uint64_t wait_logged_ms; /* --min-peers, --join: the last "waiting" line */
  bool resync_busy;        /* bee__resync's read of the metrics */
  uint64_t resync_ms;      /* and when it was asked */
  /* This bee's last averaged steps, for bee__split_check: the parameters'
   * hash after each and its group's size. */
  bee_line lines[LINES_RING];
  size_t nlines;
  bool split_busy;
  uint64_t split_ms;
  /* after a split: the peers of the line that won, the only donors */
  uint8_t split_ids[DONORS_MAX][PROTO_ID_BYTES];
  size_t nsplit;
  /* The others' records of the last read and their owners, for the view
   * taken again right after a step (bee__view_again). */
  proto_progress *seen;
  uint8_t (*seen_ids)[PROTO_ID_BYTES];
  size_t nseen, seen_cap;
  /* The other members of the group of the last update round, stepping to
   * stepped_epoch at stepped_ms (unix ms): bee_progress_stepped. */
  uint8_t (*stepped_ids)[PROTO_ID_BYTES];
  size_t nstepped, stepped_cap;
  uint64_t stepped_epoch, stepped_ms;
};

/* Clocks: monotonic seconds, wall-clock unix milliseconds. */
static inline double mono_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline uint64_t wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* DiLoCo: a bee more than OUTER_LAG_MIN_S from its inner steps' end
 * when the other peers at its epoch have taken theirs (it loaded the
 * state late in the round, or it is slower) takes its round with the
 * steps it has, weighed by its samples, rather than step alone after the
 * others' round and load their state again.  Under mu. */
#define OUTER_LAG_MIN_S 1.0
static inline bool outer_lags(const shared *sh, uint64_t want, double now) {
  if (sh->samples == 0 || sh->samples >= want || !(sh->others_due_s > 0) ||
      !(sh->own_rate > 0) || sh->view.epoch != sh->epoch)
    return false;
  double own_left = (double)(want - sh->samples) / sh->own_rate;
  return own_left > OUTER_LAG_MIN_S && now >= sh->others_due_s;
}

/* The other peers' samples at the view's epoch by now: the view's count
 * extrapolated at their rate since it was made (at most the progress
 * records' lifetime).  Under mu. */
static inline double others_now(const shared *sh) {
  double age = mono_s() - sh->view_s;
  age = age < 0 ? 0 : age > BEE_PROGRESS_TTL_S ? BEE_PROGRESS_TTL_S : age;
  return (double)sh->others + sh->others_rate * age;
}

/* ---- train-state.c ---------------------------------------------------- */

/* The state's parts (parameters, optimizer state, outer state, buffers)
 * in the order snapshots and state rounds lay them out: pointers and
 * lengths in floats; returns the floats of the first k. */
#define STATE_PARTS 4
size_t bee__state_parts(bee_train *t, size_t k, float *part[STATE_PARTS],
                        size_t len[STATE_PARTS]);
/* Copies the first k parts to dst, or from src back (and with DiLoCo the
 * parameters to the anchor too). */
void bee__state_pack(bee_train *t, size_t k, uint8_t *dst);
void bee__state_unpack(bee_train *t, size_t k, const uint8_t *src);
/* The snapshot's size for this model, bytes. */
size_t bee__snapshot_size(bee_train *t);
/* Why a snapshot's header (STATE_HDR bytes at b) does not fit this bee,
 * or NULL when it does: its counts of parameters, optimizer state and
 * buffers, and its schema (the model, the optimizer and the averaging
 * mode, which same-sized states of AdamW and LAMB tell apart). */
const char *bee__snapshot_mismatch(bee_train *t, const uint8_t *b);
/* Reads a checkpoint's n local bytes at b (CKPT_LOCAL or CKPT_LOCAL_OLD;
 * what the old one lacks is 0). */
void bee__ckpt_local(const uint8_t *b, size_t n, uint64_t local[CKPT_NLOCAL]);
/* Worker: the state after the step that began epoch, for donors and
 * checkpoints. */
void bee__make_snapshot(bee_train *t, uint64_t epoch);
/* Drops a reference to s (NULL accepted); the last frees it.  Under mu. */
void bee__snap_unref(bee_snap *s);
/* Worker: loads a snapshot the loop checked, as of its epoch (the
 * gradients are left as they are: the caller's). */
void bee__load_snapshot(bee_train *t, const uint8_t *b, uint64_t epoch);
/* The checkpoint writer thread. */
void bee__ckpt_writer(void *arg);
/* Lets the worker start (it waits for the first view). */
void bee__set_go(bee_train *t);
/* Downloads the state from the donors of the last view. */
void bee__start_fetch(bee_train *t);
/* What a bee that downloads the state needs before the swarm counts it
 * in an epoch's group: the last download's time, the matchmaking ahead
 * and the records' travel; and the swarm's epoch by the last view (DiLoCo:
 * a round), -1 when unknown. */
double bee__join_s(const bee_train *t);
double bee__epoch_s(const bee_train *t);
/* Whether the download due now waits for the swarm's next step, lest it
 * land after the epoch's group formed (bee_fetch_defer). */
bool bee__fetch_wait(bee_train *t);
/* The "state.get" handler: the bytes of the latest snapshot. */
void bee__state_req_cb(proto_conn *c, uint64_t id, proto_bytes method,
                       proto_bytes payload, void *data);

/* ---- train-swarm.c ---------------------------------------------------- */
/* A state was loaded: a matchmaking the worker waits on ends. */
void bee__round_moot(bee_train *t, uint64_t load_epoch);

/* Our progress record as of (epoch, samples). */
void bee__own_progress(bee_train *t, uint64_t epoch, uint64_t samples,
                       proto_progress *p);
/* The averager's DHT functions: declarations as bee.match records. */
void bee__match_declare(void *ctx, const proto_match *info,
                        uint64_t expiration);
void bee__match_fetch(void *ctx, avg_node *node, const proto_match *info);
/* Starts the round the worker waits for, if it asked and none runs. */
void bee__start_round(bee_train *t);
void bee__match_ahead(bee_train *t);
void bee__ahead_drop(bee_train *t, const char *why);
void bee__resync(bee_train *t);
/* The view again from the last read's records, right after an epoch step
 * that note_stepped counted the group of: its members at the epoch they
 * stepped to with this bee. */
void bee__view_again(bee_train *t);
/* One epoch's metrics record. */
void bee__publish_metrics(bee_train *t, const struct step_report *r);
/* The loop's tick: counters, publication, the view, rounds, status. */
void bee__tick(uv_timer_t *h);

#endif /* BEE_DAEMON_TRAIN_INT_H */
