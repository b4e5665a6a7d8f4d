/* train-int.h: what the files of beed's training share (daemon/).
 *
 *   train.c        the worker and evaluator threads, the epoch step, the
 *                  worker's news on the loop, start, leaving and stop
 *   train-init.c   the training made: the model (built in, or a trainer
 *                  process's) and what the run needs beside it
 *   train-swarm.c  the run core's I/O (run.h's bee_run_io): the DHT's
 *                  records, the averager, the state's chunks, the worker's
 *                  shared state; the loop's tick
 *   train-state.c  snapshots of the state: served to peers, written as
 *                  checkpoints
 *   train-links.c  the links to the peers: measured, published, declared
 *
 * train.c's head comment has the design; the decisions of the run are
 * the core's (run.h).  Nothing outside these five files includes this
 * header.
 */
#ifndef BEE_DAEMON_TRAIN_INT_H
#define BEE_DAEMON_TRAIN_INT_H

#include "averager.h"
#include "bee.h"
#include "dht.h"
#include "run.h"
#include "trainer.h"

#include <errno.h>
#include <math.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define COMP "train"
#define TICK_MS BEE_RUN_TICK_MS /* counters, publication, steps */
#define STEP_RING 64 /* epoch steps the worker may be ahead of the log */
#define STATE_ROUND BEE_RUN_STATE_ROUND /* + epoch: a state round */
#define ROUND_DEADLINE_MS 30000 /* a round's end, at the latest */
#define STATE_METHOD "state.get"
#define STATE_CALL_MS BEE_RUN_CHUNK_MS /* one chunk's answer */
#define STATE_HDR BEE_RUN_STATE_HDR /* four u64 (params, state, buffers,
                                       steps), schema */
#define LEAVE_MS 2000      /* leaving: the last record's store, at most */
#define SKIP_STREAK_WARN 100 /* batches dropped in a row (loss scaling) */

/* The first half of an epoch step, for the second (train.c). */
struct pend {
  bool active;     /* --delay-averaging: a round runs for it */
  uint64_t epoch, n;
  double loss, compute_s, sq_local;
  double t0;       /* the round was requested, mono_s() */
  double round_s;  /* and took this long */
};

/* A snapshot of the state (bee__make_snapshot), shared by reference
 * under mu: shared.snap holds one, and so does each download served from it
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

/* An epoch's step as this bee took it (bee__log_step): the buffer its
 * optimizer stepped with from `epoch` to epoch + 1 (the round's mean; with
 * DiLoCo the mean change), len bytes, or len 0 for a step that changed
 * nothing.  A bee whose state is of that epoch takes the same step with
 * it instead of downloading the state again (docs/PROTOCOL.md section
 * 12).  Kept in shared.step_log under mu, the newest last. */
typedef struct bee_step {
  uint64_t epoch;
  size_t len;
  uint8_t sum[PROTO_STATE_SUM_BYTES];
  uint8_t data[];
} bee_step;
/* Steps kept, at most; fewer where they would outweigh two snapshots
 * (steps_kept). */
#define STEPS_KEPT 8

typedef struct bee_snap {
  unsigned refs;
  uint64_t epoch;
  uint64_t local[CKPT_NLOCAL]; /* CKPT_LOCAL's: order pass, position,
                                  dropout calls, loss scale */
  size_t len;
  uint8_t sum[PROTO_STATE_SUM_BYTES];
  uint8_t data[]; /* len bytes: the header, then the state's arrays */
} bee_snap;

/* What the worker and the loop share, under mu. */
typedef struct train_shared {
  uint64_t epoch;
  uint64_t samples;      /* computed in this epoch */
  uint64_t pend_samples; /* not yet seen by the loop's rate */
  double pend_s;         /* their computing time */
  double loss_sum;       /* this epoch's summed training loss */
  bool stop;             /* loop -> worker */
  bee_run_guide guide;   /* loop -> worker: the last view, and what the
                            step decisions read beside it (run.h) */
  int err;               /* worker -> loop: the worker has stopped */
  char errmsg[160];
  /* Epoch steps not yet logged by the loop: a ring, since a bee that
   * catches up steps more than once between two turns of the loop. */
  struct step_report {
    uint64_t epoch, samples;
    double loss;
    int avg_status; /* 0: averaged; else why not */
    size_t group;   /* members of the round */
    double by_all;  /* share of the tensor every member averaged */
    bool delayed;   /* the round ran behind the next epoch's work */
    bool ahead;     /* its group formed ahead (run-round.c) */
    bool swarm;     /* no round: it took the swarm's step */
    bool diverged;  /* the parameters have left the swarm's */
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
  /* and the swarm's steps after it, to take in order (the worker frees) */
  struct replay {
    uint8_t *buf; /* len bytes: a step's buffer; NULL: the step changed
                     nothing */
    size_t len;
    uint64_t epoch;
  } replay[BEE_RUN_CATCHUP_MAX];
  size_t nreplay;
  /* worker -> loop: its last steps, for peers to take (bee_step) */
  bee_step *step_log[STEPS_KEPT];
  size_t nstep_log;
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
  bool avg_ahead; /* the group had formed ahead */
  bool avg_swarm; /* no round: the buffer is the swarm's step */
  bool avg_left;  /* the group went on without this bee */
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
} train_shared;

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
  train_shared shared; /* under mu */
  /* the worker's */
  bee_local *ext;       /* --model external: the trainer process's session,
                       whose memory holds the model; then model, optim
                       and src are NULL */
  uint64_t ext_batches; /* its BATCHes in this epoch */
  bool replay_later;    /* the swarm's steps after a state loaded before
                           the trainer's WELCOME: after its first batch */
  uint8_t *carry;       /* the state the last trainer left (new_local) */
  size_t carry_len;
  uint64_t carry_epoch;
  trn_model *model;
  trn_model *eval_model; /* the evaluator's copy, filled by the worker */
  trn_optim *optim;
  trn_optim *outer; /* DiLoCo's outer step (Nesterov SGD); else NULL */
  float *anchor;    /* DiLoCo: the parameters of the last outer step */
  float *dgrad;     /* --delay-averaging: the gradients in the round */
  /* --delay-averaging with a trainer process: the next epoch's gradients
   * so far, kept aside while its optimizer steps with dgrad's mean in the
   * one gradient buffer it has */
  float *dhold;
  float *residual;  /* --error-feedback: what the rounds' coding lost */
  struct pend delayed;
  float *state_buf; /* state averaging: parameters and optimizer states */
  size_t state_len; /* its floats */
  trn_source *src; /* this bee's batches (images: made ahead on a thread
                      of their own) and the test set */
  size_t per_sample; /* predictions per sample: 1, gpt's window */
  /* bee_steps kept for peers: at most STEPS_KEPT, and within two
   * snapshots' bytes; 0: none (--delay-averaging) */
  size_t steps_kept;
  uint64_t skipped_told; /* loss scaling's dropped batches, reported */
  uint64_t skip_streak;  /* dropped in a row */
  char desc[160];   /* the model, as trn_model_describe says it */
  /* the loop's */
  bee_run *run; /* the run's decisions (run.h); NULL until bee_train_new
                   built the model */
  bee_run_io io;
  proto_host *host;
  const bee_members *members; /* for the address peers see us at */
  avg_node *avg;
  char listen_host[BEE_HOST_MAX]; /* a specific --listen address, or "" */
  unsigned port;                  /* the one we listen on (0: none) */
  char addr_said[PROTO_ADDR_MAX]; /* the last self address logged */
  bool announce_warned; /* a loopback --announce, remote peers: said */
  uv_getaddrinfo_t *announce_req[BEE_ANNOUNCE_MAX]; /* names resolving */
  uint8_t schema[PROTO_SCHEMA_HASH_BYTES];       /* gradient rounds */
  uint8_t state_schema[PROTO_SCHEMA_HASH_BYTES]; /* state rounds */
  /* DHT keys: progress, metrics, donors; our owned subkey */
  uint8_t key[PROTO_DHT_KEY_BYTES];
  uint8_t mkey[PROTO_DHT_KEY_BYTES];
  uint8_t dkey[PROTO_DHT_KEY_BYTES];
  uint8_t sub[PROTO_DHT_OWNED_SUBKEY_BYTES];
  /* the downloads we serve (--max-state-uploads) */
  bee_uploads uploads;
  uint64_t busy_logged_ms; /* the last "told it is busy" line */
  char last_step[288];  /* the last epoch line's gist, for beectl status */
  float loss_scale;     /* as of the last epoch line (0: none) */
  uint64_t dropped;     /* batches loss scaling dropped, by those lines */
  bool out_of_line;     /* and whether its parameters left the swarm's */
  bool halted;          /* the threads are stopped */
  void (*leave_done)(void *arg); /* leaving: called once the last record
                                    is stored or LEAVE_MS passed */
  void *leave_arg;
  /* the links (train-links.c) */
  bee_links links;
  uint8_t lkey[PROTO_DHT_KEY_BYTES];
  uint64_t links_now, links_tick_ms, links_pub_ms; /* mono_ms */
  uint64_t links_start_ms;                         /* bee__links_start's */
  uint64_t links_exp; /* the last record's expiration */
  bool probing;       /* our probe of probe_id is under way */
  uint64_t probe_ms;  /* when it began (mono_ms) */
  uint8_t probe_id[PROTO_ID_BYTES];
  unsigned probe_left;                    /* its answers still to come */
  uint64_t probe_budget_ms, probe_served; /* probes answered: the minute's */
  double declared_said; /* the bandwidth last logged as declared */
};

/* Clocks: monotonic seconds and milliseconds (mono_ms is the run core's
 * clock, bee_run_io.now_ms), wall-clock unix milliseconds. */
static inline double mono_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline uint64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static inline uint64_t wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* The model's arrays: the built-in trainer's, or the trainer process's
 * in the memory it shares (t->ext). */
static inline float *bee__params(bee_train *t) {
  return t->ext ? t->ext->params : trn_model_params(t->model);
}
static inline float *bee__grads(bee_train *t) {
  return t->ext ? t->ext->grads : trn_model_grads(t->model);
}
static inline size_t bee__nparams(const bee_train *t) {
  return t->ext ? t->ext->nparams : trn_model_nparams(t->model);
}
static inline float *bee__buffers(bee_train *t, size_t *n) {
  if (!t->ext)
    return trn_model_buffers(t->model, n);
  *n = t->ext->nbuffers;
  return t->ext->buffers;
}
static inline float *bee__optim_state(bee_train *t, size_t *n) {
  if (!t->ext)
    return trn_optim_state(t->optim, n);
  *n = t->ext->nstate;
  return t->ext->state;
}
/* The optimizer's name in schemas and lines: a trainer process's is its
 * own, beyond beed's sight. */
static inline const char *bee__optim_name(const bee_train *t) {
  return t->ext ? "external" : bee_optimizer_name(t->cfg->optimizer);
}
/* Samples a local step takes. */
static inline uint64_t bee__batch(const bee_train *t) {
  return t->ext ? t->ext->batch : t->cfg->batch_size;
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
/* bee_train_self_addr into out (PROTO_ADDR_MAX bytes), with a line when
 * it changes. */
void bee__self_addr(bee_train *t, char *out);
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
/* Worker: keeps the step it took from epoch with buffer g (n floats;
 * NULL: a step that changed nothing) for peers to take, the oldest going
 * when more than steps_kept are kept.  Under no lock. */
void bee__log_step(bee_train *t, uint64_t epoch, const float *g, size_t n);
/* Worker: forgets the steps kept (its line changed: a state loaded, a
 * state round, a step out of line). */
void bee__forget_steps(bee_train *t);
/* The checkpoint writer thread. */
void bee__ckpt_writer(void *arg);
/* The "state.get" handler: the bytes of the latest snapshot. */
void bee__state_req_cb(proto_conn *c, uint64_t id, proto_bytes method,
                       proto_bytes payload, void *data);

/* ---- train.c ---------------------------------------------------------- */
/* The worker's and evaluator's news, on the loop (t->async). */
void bee__async_cb(uv_async_t *h);

/* ---- train-swarm.c ---------------------------------------------------- */
/* The run core's I/O for t (t->io). */
void bee__run_io(bee_train *t, bee_run_io *io);
/* The averager's DHT functions: declarations as bee.match records. */
void bee__match_declare(void *ctx, const proto_match *info,
                        uint64_t expiration);
void bee__match_fetch(void *ctx, avg_node *node, const proto_match *info);
/* The loop's tick: the worker's counters to the core, then its tick. */
void bee__tick(uv_timer_t *h);

/* ---- train-links.c ---------------------------------------------------- */
/* Serves probes and names the links record; 0 or proto_host_on's code. */
int bee__links_start(bee_train *t);
void bee__links_stop(bee_train *t);
/* From the tick: the connections' figures, probes, the record (each at
 * its interval). */
void bee__links_tick(bee_train *t);
/* What this bee declares as its bandwidth, Mbit/s (--bandwidth). */
double bee__links_declared(bee_train *t);

#endif /* BEE_DAEMON_TRAIN_INT_H */
