/* train.c: the bee's own training, and its run's progress in the DHT.
 *
 * A worker thread trains the model on this bee's shuffled stream (seeded
 * by its peer id), adding every batch's gradient into the model's
 * gradient buffer.  The loop thread, every TICK_MS, reads the worker's
 * counters, publishes this bee's progress record when progress.c says it
 * is due, and every VIEW_MS reads everyone's records back to compute the
 * swarm view.  After every batch the worker asks progress.c whether its
 * samples and the others' (by the last view) have reached the target at
 * its epoch, or whether the swarm has stepped past it; then it takes the
 * epoch step: it turns its gradient sums into means and waits while the
 * loop averages them with the group that forms for the epoch (the
 * averager's matchmaking through the DHT, then its round, weighted by
 * samples), then one optimizer step with the result, then the next epoch.
 * Every member of a group gets the same mean to the bit, so their
 * parameters stay the same; the step line prints their hash.
 *
 * After each step the worker also copies the state (parameters, optimizer
 * state, buffers) into a checksummed snapshot: peers behind the swarm
 * download it with "state.get" (a bee behind loads one the same way
 * before it trains on), and with --checkpoint-dir a writer thread puts it
 * on disk.  A metrics record per epoch goes to "<run>_metrics".
 *
 * Test accuracy (--eval-every) is measured on another thread, the
 * evaluator, on a copy of the parameters the worker makes right after the
 * step, so training never waits for it.
 *
 * Threads: the worker owns the model, optimizer and data while it runs,
 * the evaluator its copy of the model (written by the worker only while
 * the evaluator is idle, under mu), the checkpoint writer its copies of
 * the snapshot; the loop thread touches only what they share (under mu),
 * runs the averager, the DHT records and the downloads, and starts and
 * joins the threads.  Images are normalized with Fashion-MNIST's mean and
 * deviation, for MNIST too.
 */
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
#define MATCH_MS 2000     /* matchmaking: the latest we start a round */
#define MATCH_DEADLINE_MS 4000 /* no group by then: the local step */
#define ROUND_DEADLINE_MS 30000
#define MIN_EPOCH_S 2.0 /* epochs shorter than this are not shared */
#define STATE_METHOD "state.get"
#define STATE_CHUNK (1u << 20)     /* bytes asked per request */
#define STATE_CALL_MS 10000        /* one chunk's answer */
#define STATE_RESTARTS 3           /* snapshots that may change under us */
#define STATE_HDR 32               /* four u64: params, state, buffers, steps */
#define DONORS_MAX 16
#define START_WAIT_MS 3000 /* a first view before training, at most */
#define METRICS_TTL_S 300  /* a metrics record lives this long */
#define LEAVE_MS 2000      /* leaving: the last record's store, at most */

/* Fashion-MNIST's training-set mean and deviation, as tools/train uses. */
#define DATA_MEAN 0.2860f
#define DATA_STD 0.3530f

/* What the worker and the loop share, under mu. */
typedef struct shared {
  uint64_t epoch;
  uint64_t samples;      /* computed in this epoch */
  uint64_t pend_samples; /* not yet seen by the loop's rate */
  double pend_s;         /* their computing time */
  double loss_sum;       /* this epoch's summed training loss */
  bool stop;             /* loop -> worker */
  bee_swarm_view view;   /* loop -> worker: the last view */
  uint64_t others;       /* the other peers' samples at view.epoch */
  double others_rate;    /* and their rate, to extrapolate */
  double view_s;         /* when the view was made, mono_s() */
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
    uint8_t hash[8];      /* of the parameters after the step */
    /* for the metrics record */
    double compute_s, averaging_s;
    uint64_t bytes_sent, bytes_recv;
    double grad_sq_local, grad_sq_avg;
    uint64_t batch_avg;   /* the group's samples (its members' weights) */
  } steps[STEP_RING];
  double compute_s;       /* this epoch's computing time, worker */
  /* loop -> worker: start (after the first view), a state to load */
  bool go;
  uint8_t *load;      /* a downloaded snapshot, checked; the worker frees */
  size_t load_len;
  uint64_t load_epoch;
  /* worker -> loop: the latest snapshot, swapped in under mu */
  uint8_t *snap;
  size_t snap_len;
  uint64_t snap_epoch;
  uint8_t snap_sum[PROTO_STATE_SUM_BYTES];
  /* worker <-> loop: the gradients to average */
  bool avg_req, avg_done;
  uint64_t avg_epoch;
  double avg_weight;
  int avg_status;
  size_t avg_group;
  double avg_by_all;
  uint64_t avg_bytes_sent, avg_bytes_recv, avg_batch;
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
  trn_images tr, te;
  trn_order ord;
  float *x;
  int32_t *y;
  /* the loop's */
  proto_host *host;
  avg_node *avg;
  bool averaging; /* a round is under way */
  char addr[PROTO_ADDR_MAX];
  uint8_t schema[PROTO_SCHEMA_HASH_BYTES];
  uint8_t key[PROTO_DHT_KEY_BYTES];
  uint8_t sub[PROTO_DHT_OWNED_SUBKEY_BYTES];
  bee_rate rate;
  bee_publisher pub;
  bool put_busy, get_busy, put_warned;
  uint64_t last_get_ms;
  uint64_t behind_warned; /* the swarm epoch last warned about */
  bee_swarm_view view;
  uint64_t cand_epoch; /* the epoch the candidates were counted for */
  /* donors: peers at the swarm's epoch by the last view */
  uint8_t donors[DONORS_MAX][PROTO_ID_BYTES];
  size_t ndonors;
  /* the download under way */
  bool fetching;
  proto_conn *fconn;
  uint64_t fcall;
  uint8_t fpeer[PROTO_ID_BYTES];
  uint8_t *fbuf;
  uint64_t foffset, ftotal, fepoch;
  uint8_t fsum[PROTO_STATE_SUM_BYTES];
  unsigned frestarts;
  size_t fdonor;       /* next donor to try */
  uint64_t fshown;     /* percent last logged */
  uint64_t started_ms; /* bee_train_start's loop time */
  size_t candidates;   /* bee_round_candidates, by the last view */
  bool have_view;
  bool short_warned; /* epochs too short to share: said once */
  uint64_t metrics_exp; /* the last metrics record's expiration */
  char last_step[160];  /* the last epoch line's gist, for beectl status */
  bool halted;          /* the threads are stopped */
  void (*leave_done)(void *arg); /* leaving: called once the last record
                                    is stored or LEAVE_MS passed */
  void *leave_arg;
  uint8_t mkey[PROTO_DHT_KEY_BYTES];
  uint64_t status_ms;
};

static void make_snapshot(bee_train *t, uint64_t epoch);

static double mono_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* ---- the worker --------------------------------------------------------- */

static void worker_fail(bee_train *t, int rc, const char *what) {
  uv_mutex_lock(&t->mu);
  t->sh.err = rc ? rc : -EIO;
  snprintf(t->sh.errmsg, sizeof t->sh.errmsg, "%s: %s", what,
           strerror(rc < 0 ? -rc : EIO));
  uv_mutex_unlock(&t->mu);
  uv_async_send(&t->async);
}

/* The epoch step: the mean gradient over the samples gathered, averaged
 * with the group the swarm formed (the loop runs the round while we wait),
 * one optimizer step, a clean gradient buffer, the next epoch.  Returns 1
 * when stopped while waiting. */
static int epoch_step(bee_train *t) {
  uv_mutex_lock(&t->mu);
  uint64_t n = t->sh.samples, epoch = t->sh.epoch;
  double loss = t->sh.loss_sum;
  uv_mutex_unlock(&t->mu);
  float *g = trn_model_grads(t->m);
  size_t np = trn_model_nparams(t->m);
  double sq_local = 0, sq_avg = 0;
  if (n) { /* sums to means: the round weighs them by n */
    float inv = 1.0f / (float)n;
    for (size_t i = 0; i < np; i++) {
      g[i] *= inv;
      sq_local += (double)g[i] * g[i];
    }
  }
  double wait0 = mono_s();
  uv_mutex_lock(&t->mu);
  t->sh.avg_req = true;
  t->sh.avg_done = false;
  t->sh.avg_epoch = epoch;
  t->sh.avg_weight = (double)n;
  uv_mutex_unlock(&t->mu);
  uv_async_send(&t->async);
  uv_mutex_lock(&t->mu);
  while (!t->sh.avg_done && !t->sh.stop)
    uv_cond_wait(&t->avg_cv, &t->mu);
  bool stop = t->sh.stop;
  int avg_status = t->sh.avg_status;
  size_t group = t->sh.avg_group;
  double by_all = t->sh.avg_by_all;
  uint64_t sent = t->sh.avg_bytes_sent, recv = t->sh.avg_bytes_recv;
  uint64_t batch_avg = avg_status == 0 ? t->sh.avg_batch : n;
  double compute_s = t->sh.compute_s;
  uv_mutex_unlock(&t->mu);
  if (stop)
    return 1;
  double waited = mono_s() - wait0;
  for (size_t i = 0; i < np; i++)
    sq_avg += (double)g[i] * g[i];
  /* Nothing here and nothing averaged in: no step (momentum would still
   * move the weights). */
  int rc = 0;
  if (n || avg_status == 0)
    rc = trn_optim_step(t->o, trn_model_params(t->m), g, 1.0f);
  trn_model_zero_grad(t->m);
  if (rc)
    return rc;
  struct step_report rep = {epoch,     n,         n ? loss / (double)n : 0,
                            avg_status, group,    by_all,
                            {0},       compute_s, waited,
                            sent,      recv,      sq_local,
                            sq_avg,    batch_avg};
  crypto_generichash(rep.hash, sizeof rep.hash,
                     (const uint8_t *)trn_model_params(t->m),
                     np * sizeof(float), NULL, 0);
  uv_mutex_lock(&t->mu);
  t->sh.epoch = epoch + 1;
  t->sh.samples = 0;
  t->sh.loss_sum = 0;
  t->sh.compute_s = 0;
  if (t->sh.steps_head - t->sh.steps_tail == STEP_RING)
    t->sh.steps_tail++; /* the oldest report goes unlogged */
  t->sh.steps[t->sh.steps_head++ % STEP_RING] = rep;
  uv_mutex_unlock(&t->mu);
  uv_async_send(&t->async);
  make_snapshot(t, epoch + 1);
  if (t->ckpt_started && (epoch + 1) % t->cfg->checkpoint_every == 0) {
    uv_mutex_lock(&t->mu);
    t->sh.ckpt_req = true;
    uv_cond_signal(&t->ckpt_cv);
    uv_mutex_unlock(&t->mu);
  }
  unsigned every = t->cfg->eval_every;
  if (t->em && every && (epoch + 1) % every == 0) {
    /* The evaluator tests a copy, so training never waits for it; while
     * it is still busy with an earlier epoch, this one is skipped. */
    uv_mutex_lock(&t->mu);
    if (t->sh.eval_busy || t->sh.eval_req) {
      t->sh.eval_skipped++;
    } else {
      size_t nb;
      float *src = trn_model_buffers(t->m, &nb);
      memcpy(trn_model_params(t->em), trn_model_params(t->m),
             trn_model_nparams(t->m) * sizeof(float));
      if (nb)
        memcpy(trn_model_buffers(t->em, &nb), src, nb * sizeof(float));
      t->sh.eval_req = true;
      t->sh.eval_req_epoch = epoch + 1;
      uv_cond_signal(&t->eval_cv);
    }
    uv_mutex_unlock(&t->mu);
  }
  return 0;
}

/* The evaluator thread: the test set through the copy the worker made. */
static void evaluator(void *arg) {
  bee_train *t = arg;
  const float mean = DATA_MEAN, std = DATA_STD;
  for (;;) {
    uv_mutex_lock(&t->mu);
    while (!t->sh.eval_req && !t->sh.eval_stop)
      uv_cond_wait(&t->eval_cv, &t->mu);
    if (t->sh.eval_stop) {
      uv_mutex_unlock(&t->mu);
      return;
    }
    t->sh.eval_req = false;
    t->sh.eval_busy = true;
    uint64_t epoch = t->sh.eval_req_epoch;
    uv_mutex_unlock(&t->mu);
    double el = 0, acc = 0;
    int rc = trn_model_evaluate(t->em, &t->te, &mean, &std, &el, &acc);
    uv_mutex_lock(&t->mu);
    t->sh.eval_busy = false;
    if (rc == 0) {
      t->sh.evaluated = true;
      t->sh.eval_epoch = epoch;
      t->sh.eval_loss = el;
      t->sh.eval_acc = acc;
    }
    uv_mutex_unlock(&t->mu);
    if (rc) {
      worker_fail(t, rc, "evaluation");
      return;
    }
    uv_async_send(&t->async);
  }
}

/* ---- snapshots: what a donor serves, what a newcomer loads ------------- */

/* The snapshot's size for this model: a header of four little-endian
 * u64 (parameters, optimizer state, buffers, optimizer steps), then the
 * three float arrays. */
static size_t snapshot_size(bee_train *t) {
  size_t ns, nb;
  trn_optim_state(t->o, &ns);
  trn_model_buffers(t->m, &nb);
  return STATE_HDR + (trn_model_nparams(t->m) + ns + nb) * sizeof(float);
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

/* Worker: the state after the step that began epoch, for donors. */
static void make_snapshot(bee_train *t, uint64_t epoch) {
  size_t np = trn_model_nparams(t->m), ns, nb;
  float *st = trn_optim_state(t->o, &ns);
  float *bf = trn_model_buffers(t->m, &nb);
  size_t len = snapshot_size(t);
  uint8_t *b = malloc(len);
  if (!b)
    return; /* no new snapshot: donors serve the last one */
  put_u64(b, np);
  put_u64(b + 8, ns);
  put_u64(b + 16, nb);
  put_u64(b + 24, trn_optim_steps(t->o));
  uint8_t *p = b + STATE_HDR;
  memcpy(p, trn_model_params(t->m), np * sizeof(float));
  p += np * sizeof(float);
  if (ns)
    memcpy(p, st, ns * sizeof(float));
  p += ns * sizeof(float);
  if (nb)
    memcpy(p, bf, nb * sizeof(float));
  uint8_t sum[PROTO_STATE_SUM_BYTES];
  crypto_generichash(sum, sizeof sum, b, len, NULL, 0);
  uv_mutex_lock(&t->mu);
  uint8_t *old = t->sh.snap;
  t->sh.snap = b;
  t->sh.snap_len = len;
  t->sh.snap_epoch = epoch;
  memcpy(t->sh.snap_sum, sum, sizeof sum);
  uv_mutex_unlock(&t->mu);
  free(old);
}

/* Worker: loads a snapshot the loop checked (size and checksum), as of
 * its epoch: parameters, optimizer state and steps, buffers; no
 * gradients, no samples. */
static void load_snapshot(bee_train *t, const uint8_t *b, uint64_t epoch) {
  size_t np = trn_model_nparams(t->m), ns, nb;
  float *st = trn_optim_state(t->o, &ns);
  float *bf = trn_model_buffers(t->m, &nb);
  const uint8_t *p = b + STATE_HDR;
  memcpy(trn_model_params(t->m), p, np * sizeof(float));
  p += np * sizeof(float);
  if (ns)
    memcpy(st, p, ns * sizeof(float));
  p += ns * sizeof(float);
  if (nb)
    memcpy(bf, p, nb * sizeof(float));
  trn_optim_set_steps(t->o, get_u64(b + 24));
  trn_model_zero_grad(t->m);
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
  size_t len = t->sh.snap_len;
  uint64_t epoch = t->sh.snap_epoch;
  uint8_t *copy = t->sh.snap && (!t->sh.ckpt_any || epoch != t->sh.ckpt_written)
                      ? malloc(len)
                      : NULL;
  if (copy)
    memcpy(copy, t->sh.snap, len);
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

static void ckpt_writer(void *arg) {
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

static void worker(void *arg) {
  bee_train *t = arg;
  const float mean = DATA_MEAN, std = DATA_STD;
  size_t b = t->cfg->batch_size;
  trn_cpu_threads_set((int)t->cfg->threads);
  /* Training starts once the loop has seen the swarm: from a peer's
   * state when the swarm is ahead, else from the run's first weights. */
  uv_mutex_lock(&t->mu);
  while (!t->sh.go && !t->sh.stop)
    uv_cond_wait(&t->go_cv, &t->mu);
  bool fresh = !t->sh.load;
  uv_mutex_unlock(&t->mu);
  if (fresh)
    make_snapshot(t, 0);
  for (;;) {
    uv_mutex_lock(&t->mu);
    uint8_t *load = t->sh.load;
    uint64_t load_epoch = t->sh.load_epoch;
    t->sh.load = NULL;
    uv_mutex_unlock(&t->mu);
    if (load) {
      load_snapshot(t, load, load_epoch);
      free(load);
      make_snapshot(t, load_epoch);
      continue;
    }
    uv_mutex_lock(&t->mu);
    bool stop = t->sh.stop;
    /* The others' samples by now, at their rate since the view. */
    double age = mono_s() - t->sh.view_s;
    age = age < 0 ? 0 : age > BEE_PROGRESS_TTL_S ? BEE_PROGRESS_TTL_S : age;
    uint64_t others = t->sh.others + (uint64_t)(t->sh.others_rate * age);
    bool step = bee_epoch_ready(t->sh.epoch, t->sh.samples, &t->sh.view,
                                others, t->cfg->target_batch_size);
    uv_mutex_unlock(&t->mu);
    if (stop)
      return;
    int rc;
    if (step) {
      if ((rc = epoch_step(t)) < 0) {
        worker_fail(t, rc, "epoch step");
        return;
      }
      continue;
    }
    double t0 = mono_s(), loss = 0;
    rc = trn_images_batch(&t->tr, &t->ord, b, &mean, &std, t->x, t->y);
    if (rc == 0)
      rc = trn_model_train_batch(t->m, t->x, t->y, b, &loss);
    if (rc) {
      worker_fail(t, rc, "training step");
      return;
    }
    double dt = mono_s() - t0;
    uv_mutex_lock(&t->mu);
    t->sh.samples += b;
    t->sh.pend_samples += b;
    t->sh.pend_s += dt;
    t->sh.compute_s += dt;
    t->sh.loss_sum += loss;
    uv_mutex_unlock(&t->mu);
  }
}

/* ---- progress in the DHT (loop thread) ---------------------------------- */

static void own_progress(bee_train *t, uint64_t epoch, uint64_t samples,
                         proto_progress *p) {
  memset(p, 0, sizeof *p);
  snprintf(p->run, sizeof p->run, "%s", t->cfg->run);
  p->epoch = epoch;
  p->samples = samples;
  p->samples_per_second = bee_rate_get(&t->rate);
  p->time_ms = wall_ms();
  p->mode = t->cfg->client ? PROTO_MODE_CLIENT : PROTO_MODE_NODE;
  snprintf(p->label, sizeof p->label, "%s", t->cfg->label);
}

static void put_cb(dht_node *n, int status, unsigned stored,
                   const dht_stats *st, void *arg) {
  (void)n, (void)stored, (void)st;
  bee_train *t = arg;
  t->put_busy = false;
  if (t->stopped || status == BEE_ECANCELED)
    return;
  if (status && !t->put_warned) {
    t->put_warned = true; /* once until it works again */
    bee_warn(COMP, "progress not published: %s", bee_strerror(status));
  } else if (!status) {
    t->put_warned = false;
  }
}

static void publish(bee_train *t, uint64_t epoch, uint64_t samples) {
  proto_progress p;
  uint8_t buf[PROTO_RECORD_MAX];
  size_t len;
  own_progress(t, epoch, samples, &p);
  uint64_t now = uv_now(t->loop), wall = p.time_ms / 1000;
  if (!bee_progress_due(&t->pub, now, wall, epoch, samples))
    return;
  int rc = proto_progress_encode(&p, buf, sizeof buf, &len);
  if (rc) { /* our own fields: checked at start-up, so a bug */
    bee_err(COMP, "progress record: %s", bee_strerror(rc));
    return;
  }
  bee_publisher was = t->pub;
  uint64_t exp = bee_progress_published(&t->pub, now, wall, epoch, samples);
  rc = dht_put(t->dht, t->key, (proto_bytes){t->sub, sizeof t->sub},
               (proto_bytes){buf, len}, exp, put_cb, t);
  if (rc) {
    t->pub = was;
    bee_debug(COMP, "progress not published: %s", bee_strerror(rc));
    return;
  }
  t->put_busy = true;
}

/* ---- state download (loop thread) ---------------------------------------- */

static void set_go(bee_train *t) {
  uv_mutex_lock(&t->mu);
  t->sh.go = true;
  uv_cond_signal(&t->go_cv);
  uv_mutex_unlock(&t->mu);
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
  if (m.total != snapshot_size(t)) {
    snprintf(why, sizeof why,
             "a state of %llu bytes, where this model's takes %zu",
             (unsigned long long)m.total, snapshot_size(t));
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
  size_t ns, nb;
  trn_optim_state(t->o, &ns);
  trn_model_buffers(t->m, &nb);
  if (get_u64(t->fbuf) != trn_model_nparams(t->m) ||
      get_u64(t->fbuf + 8) != ns || get_u64(t->fbuf + 16) != nb) {
    fetch_failed(t, "a state of another shape");
    return;
  }
  bee_info(COMP, "state: loaded epoch %llu from %s",
           (unsigned long long)t->fepoch, id8);
  uv_mutex_lock(&t->mu);
  free(t->sh.load);
  t->sh.load = t->fbuf;
  t->sh.load_len = t->ftotal;
  t->sh.load_epoch = t->fepoch;
  t->sh.go = true;
  uv_cond_signal(&t->go_cv);
  uv_mutex_unlock(&t->mu);
  t->fbuf = NULL;
  t->fetching = false;
}

static void fetch_next(bee_train *t) {
  proto_state_msg q = {.type = PROTO_T_STATE_REQ,
                       .offset = t->foffset,
                       .len = STATE_CHUNK};
  uint8_t buf[PROTO_RUN_MAX + 64];
  size_t len;
  snprintf(q.run, sizeof q.run, "%s", t->cfg->run);
  int rc = proto_state_encode(&q, buf, sizeof buf, &len);
  if (rc == 0)
    rc = proto_conn_call(t->fconn, STATE_METHOD, buf, len, STATE_CALL_MS,
                         fetch_cb, t, &t->fcall);
  if (rc)
    fetch_failed(t, bee_strerror(rc));
}

/* The next donor we have a connection to; none left: train on. */
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
    fetch_next(t);
    return;
  }
  t->fetching = false;
  bee_warn(COMP, "state: no donor could serve it; training on from here");
  set_go(t);
}

static void start_fetch(bee_train *t) {
  t->fetching = true;
  t->fdonor = 0;
  fetch_from_next_donor(t);
}

/* A peer asks for our state: the bytes of the latest snapshot. */
static void state_req_cb(proto_conn *c, uint64_t id, proto_bytes method,
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
  uv_mutex_lock(&t->mu);
  if (!t->sh.snap || q.offset > t->sh.snap_len) {
    const char *why = t->sh.snap ? "offset past the state" : "no state yet";
    uv_mutex_unlock(&t->mu);
    proto_conn_reply_error(c, id, BEE_ERANGE, why);
    return;
  }
  size_t n = t->sh.snap_len - q.offset;
  if (n > q.len)
    n = q.len;
  proto_state_msg m = {.type = PROTO_T_STATE_CHUNK,
                       .epoch = t->sh.snap_epoch,
                       .total = t->sh.snap_len,
                       .offset = q.offset,
                       .data = {t->sh.snap + q.offset, n}};
  memcpy(m.run, q.run, sizeof m.run);
  memcpy(m.checksum, t->sh.snap_sum, sizeof m.checksum);
  size_t cap = n + 256, len;
  uint8_t *buf = malloc(cap);
  int rc = buf ? proto_state_encode(&m, buf, cap, &len) : -ENOMEM;
  uv_mutex_unlock(&t->mu);
  if (rc)
    proto_conn_reply_error(c, id, rc, "cannot send the state");
  else
    proto_conn_reply(c, id, buf, len);
  free(buf);
}

/* The swarm view from the records found (v may be NULL) and our own
 * current progress; asks for the epoch step when the target is met. */
static void update_view(bee_train *t, const dht_value *v) {
  size_t cap = 1 + (v ? v->n : 0), n = 0;
  proto_progress *all = malloc(cap * sizeof *all);
  if (!all)
    return;
  uint8_t (*ids)[PROTO_ID_BYTES] = malloc(cap * sizeof *ids);
  if (!ids) {
    free(all);
    return;
  }
  for (size_t i = 0; v && i < v->n; i++) {
    const proto_dht_record *r = &v->records[i];
    if (r->subkey.n != sizeof t->sub)
      continue; /* the DHT checked the owned subkey: not expected */
    if (memcmp(r->subkey.p, t->sub, sizeof t->sub) == 0)
      continue; /* ours: the current one goes in below */
    if (proto_progress_decode(r->value.p, r->value.n, &all[n]) == 0) {
      proto_peer_id(r->subkey.p + 1, ids[n]);
      n++;
    }
  }
  /* Our own share as of now, and the others' as read. */
  uv_mutex_lock(&t->mu);
  uint64_t epoch = t->sh.epoch, samples = t->sh.samples;
  own_progress(t, epoch, samples, &all[n++]);
  bee_swarm_view_compute(all, n, t->cfg->run, t->cfg->target_batch_size,
                         all[n - 1].time_ms, &t->view);
  t->candidates =
      bee_round_candidates(all, n, t->cfg->run, epoch, all[n - 1].time_ms);
  t->cand_epoch = epoch;
  /* Donors: the others at the swarm's epoch that serve (not clients). */
  t->ndonors = 0;
  for (size_t i = 0; i + 1 < n && t->ndonors < DONORS_MAX; i++)
    if (strcmp(all[i].run, t->cfg->run) == 0 && !all[i].leaving &&
        all[i].epoch == t->view.epoch && all[i].mode != PROTO_MODE_CLIENT)
      memcpy(t->donors[t->ndonors++], ids[i], PROTO_ID_BYTES);
  free(ids);
  t->sh.view = t->view;
  bool here = t->view.epoch == epoch;
  t->sh.others = here ? t->view.samples - samples : t->view.samples;
  t->sh.others_rate = t->view.rate_at_epoch - (here ? all[n - 1].samples_per_second : 0);
  if (t->sh.others_rate < 0)
    t->sh.others_rate = 0;
  t->sh.view_s = mono_s();
  uv_mutex_unlock(&t->mu);
  free(all);
  t->have_view = true;
  /* Behind the swarm (at start, or more than one epoch later on): the
   * state from a peer at the swarm's epoch. */
  uv_mutex_lock(&t->mu);
  bool go = t->sh.go;
  uv_mutex_unlock(&t->mu);
  bool behind = go ? t->view.epoch > epoch + 1 : t->view.epoch > epoch;
  if (behind && t->ndonors && !t->fetching)
    start_fetch(t);
  else if (!go && !t->fetching &&
           (t->view.peers > 1 ||
            uv_now(t->loop) - t->started_ms >= START_WAIT_MS))
    set_go(t); /* level with the swarm, or alone for START_WAIT_MS */
  /* Progress takes a second or two to travel through the DHT: an epoch
   * the swarm finishes faster than that cannot be shared. */
  double epoch_s = t->view.samples_per_second > 0
                       ? t->cfg->target_batch_size / t->view.samples_per_second
                       : 1e9;
  if (t->view.peers > 1 && epoch_s < MIN_EPOCH_S && !t->short_warned) {
    t->short_warned = true;
    bee_warn(COMP,
             "the swarm (%zu peers, %.0f samples/s) gathers the target batch "
             "in %.2f s, less than the %.0f s progress needs to travel "
             "through the DHT: bees will step alone; give "
             "--target-batch-size %.0f or more",
             t->view.peers, t->view.samples_per_second, epoch_s, MIN_EPOCH_S,
             ceil(MIN_EPOCH_S * t->view.samples_per_second));
  }
  if (behind && !t->ndonors && t->behind_warned != t->view.epoch) {
    t->behind_warned = t->view.epoch;
    bee_warn(COMP,
             "behind the swarm (epoch %llu here, %llu there) and no peer "
             "there serves its state",
             (unsigned long long)epoch, (unsigned long long)t->view.epoch);
  }
}

static void get_cb(dht_node *n, int status, const dht_value *v,
                   const dht_stats *st, void *arg) {
  (void)n, (void)st;
  bee_train *t = arg;
  t->get_busy = false;
  if (t->stopped || status == BEE_ECANCELED)
    return;
  /* Not found (no record yet, or no peer): the view is ours alone. */
  update_view(t, status == 0 ? v : NULL);
}

static void log_view(bee_train *t) {
  const bee_swarm_view *w = &t->view;
  char eta[32];
  if (w->eta_s < 0)
    snprintf(eta, sizeof eta, "unknown");
  else
    snprintf(eta, sizeof eta, "%.1f s", w->eta_s);
  bee_info(COMP,
           "swarm: epoch %llu, %llu of %u samples (%zu of %zu peers at the "
           "epoch), %.0f samples/s, target in %s; here %.0f samples/s",
           (unsigned long long)w->epoch, (unsigned long long)w->samples,
           t->cfg->target_batch_size, w->peers_at_epoch, w->peers,
           w->samples_per_second, eta, bee_rate_get(&t->rate));
}

/* ---- averaging (loop thread) --------------------------------------------- */

/* The matchmaking's declarations live in the DHT as bee.match records. */
static void match_put_cb(dht_node *n, int status, unsigned stored,
                         const dht_stats *st, void *arg) {
  (void)n, (void)stored, (void)st, (void)arg;
  if (status && status != BEE_ECANCELED)
    bee_debug(COMP, "matchmaking declaration not stored: %s",
              bee_strerror(status));
}

static void match_declare(void *ctx, const proto_match *info,
                          uint64_t expiration) {
  bee_train *t = ctx;
  uint8_t buf[PROTO_RECORD_MAX], key[PROTO_DHT_KEY_BYTES];
  size_t len;
  if (!t->dht || proto_match_encode(info, buf, sizeof buf, &len))
    return;
  proto_record_key(PROTO_REC_MATCH, info->run, info->round, info->bits, key);
  dht_put(t->dht, key, (proto_bytes){t->sub, sizeof t->sub},
          (proto_bytes){buf, len}, expiration, match_put_cb, NULL);
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
      k++;
    }
    if (d)
      avg_node_declared(f->node, d, k);
    free(d);
  }
  free(f);
}

static void match_fetch(void *ctx, avg_node *node, const proto_match *info) {
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

/* The worker's round is over, one way or another: wake it. */
static void round_over(bee_train *t, int status, size_t group,
                       double by_all, const avg_node_result *r) {
  t->averaging = false;
  uint64_t batch = 0;
  for (size_t i = 0; r && r->group && i < r->group->nmembers; i++)
    batch += (uint64_t)r->group->members[i].weight;
  uv_mutex_lock(&t->mu);
  t->sh.avg_req = false;
  t->sh.avg_done = true;
  t->sh.avg_status = status;
  t->sh.avg_group = group;
  t->sh.avg_by_all = by_all;
  t->sh.avg_batch = batch;
  t->sh.avg_bytes_sent = r && r->summary ? r->summary->bytes_sent : 0;
  t->sh.avg_bytes_recv = r && r->summary ? r->summary->bytes_recv : 0;
  uv_cond_signal(&t->avg_cv);
  uv_mutex_unlock(&t->mu);
}

static void round_cb(avg_node *n, const avg_node_result *r, void *arg) {
  (void)n;
  bee_train *t = arg;
  size_t group = r->group ? r->group->nmembers : 0;
  double by_all = 0;
  int status = r->status;
  if (status == 0 && r->summary) {
    size_t np = trn_model_nparams(t->m);
    by_all = np ? (double)r->summary->floats_by_k[r->summary->nmembers] /
                      (double)np
                : 1;
    if (r->summary->floats_by_k[0] == np)
      status = BEE_ETIMEOUT; /* nothing was averaged */
  }
  round_over(t, status, group, by_all, r);
}

/* Starts the round the worker asked for, expecting the peers at its epoch
 * and one behind by the last view (bee_round_candidates); alone, there is
 * nothing to average. */
static void start_round(bee_train *t) {
  uv_mutex_lock(&t->mu);
  bool want = t->sh.avg_req && !t->sh.avg_done;
  uint64_t epoch = t->sh.avg_epoch;
  double weight = t->sh.avg_weight;
  uv_mutex_unlock(&t->mu);
  if (!want || t->averaging || t->stopped)
    return;
  if (t->cand_epoch != epoch)
    return; /* no view at this epoch yet (a state just loaded): next tick */
  size_t peers = t->candidates;
  if (!t->avg || peers < 2) {
    round_over(t, -ENOENT, 1, 0, NULL);
    return;
  }
  avg_node_request req;
  avg_node_request_default(&req);
  avg_match_config *mc = &req.match;
  snprintf(mc->info.run, sizeof mc->info.run, "%s", t->cfg->run);
  mc->info.round = epoch;
  snprintf(mc->info.addr, sizeof mc->info.addr, "%s", t->addr);
  memcpy(mc->info.schema_hash, t->schema, sizeof t->schema);
  mc->info.mode = t->cfg->client ? PROTO_MODE_CLIENT : PROTO_MODE_NODE;
  mc->info.bandwidth_mbit = 1000;
  mc->info.weight = weight;
  /* Begin as soon as every peer at the epoch has joined; at the latest
   * MATCH_MS from now with whoever has. */
  mc->target_size = peers > 16 ? 16 : peers;
  mc->min_size = 2;
  mc->matchmaking_ms = MATCH_MS;
  mc->fetch_interval_ms = 250;
  mc->deadline_ms = MATCH_DEADLINE_MS;
  req.round.x = trn_model_grads(t->m); /* the worker waits meanwhile */
  req.round.n = trn_model_nparams(t->m);
  req.round.weight = weight;
  req.round.deadline_ms = ROUND_DEADLINE_MS;
  int rc = avg_node_average(t->avg, &req, round_cb, t);
  if (rc) {
    bee_warn(COMP, "epoch %llu: cannot start averaging: %s",
             (unsigned long long)epoch, bee_strerror(rc));
    round_over(t, rc, 1, 0, NULL);
    return;
  }
  t->averaging = true;
}

void bee_train_status(const bee_train *t, char *buf, size_t cap) {
  snprintf(buf, cap,
           "run %s: swarm epoch %llu, %zu peers, %.0f samples/s here",
           t->cfg->run, (unsigned long long)t->view.epoch, t->view.peers,
           bee_rate_get(&t->rate));
}

size_t bee_train_report(const bee_train *t, char *buf, size_t cap) {
  const bee_swarm_view *w = &t->view;
  int n = snprintf(
      buf, cap,
      "run %s\nmodel %s\nswarm-epoch %llu\nswarm-samples %llu\n"
      "target %u\nswarm-samples-per-second %.0f\neta-seconds %.1f\n"
      "peers %zu\npeers-at-epoch %zu\nsamples-per-second %.0f\n"
      "last-step %s\n",
      t->cfg->run, t->cfg->model, (unsigned long long)w->epoch,
      (unsigned long long)w->samples, t->cfg->target_batch_size,
      w->samples_per_second, w->eta_s, w->peers, w->peers_at_epoch,
      bee_rate_get(&t->rate), t->last_step[0] ? t->last_step : "none yet");
  return n < 0 ? 0 : (size_t)n < cap ? (size_t)n : cap - 1;
}

void bee_train_drain(bee_train *t, proto_conn *c) {
  if (t && t->avg)
    avg_node_drain(t->avg, c);
}

void bee_train_conn_down(bee_train *t, proto_conn *c) {
  if (t && t->avg)
    avg_node_conn_down(t->avg, c);
}

static void tick(uv_timer_t *h) {
  bee_train *t = h->data;
  uint64_t now = uv_now(t->loop);
  uv_mutex_lock(&t->mu);
  uint64_t epoch = t->sh.epoch, samples = t->sh.samples;
  bee_rate_add(&t->rate, t->sh.pend_samples, t->sh.pend_s);
  t->sh.pend_samples = 0;
  t->sh.pend_s = 0;
  uv_mutex_unlock(&t->mu);
  if (t->dht && !t->put_busy)
    publish(t, epoch, samples);
  if (t->dht && !t->get_busy && now - t->last_get_ms >= VIEW_MS) {
    t->last_get_ms = now;
    if (dht_get(t->dht, t->key, true, get_cb, t) == 0)
      t->get_busy = true;
    else
      update_view(t, NULL);
  }
  start_round(t);
  unsigned every = t->cfg->status_interval_s;
  if (every && t->have_view && now - t->status_ms >= every * 1000ull) {
    t->status_ms = now;
    log_view(t);
  }
}

/* One epoch's metrics under "<run>_metrics" (subkey: our key), for the
 * monitor: loss, samples/s, computing and averaging time, bytes, the
 * group, and the squared gradient norms before and after averaging with
 * their batches (the gradient noise scale's inputs). */
static void metrics_put_cb(dht_node *n, int status, unsigned stored,
                           const dht_stats *st, void *arg) {
  (void)n, (void)stored, (void)st, (void)arg;
  if (status && status != BEE_ECANCELED)
    bee_debug(COMP, "metrics not published: %s", bee_strerror(status));
}

static void publish_metrics(bee_train *t, const struct step_report *r) {
  if (!t->dht)
    return;
  proto_metrics m = {.step = r->epoch,
                     .has_loss = r->samples > 0,
                     .loss = r->loss,
                     .samples_per_second = bee_rate_get(&t->rate),
                     .compute_s = r->compute_s,
                     .averaging_s = r->averaging_s,
                     .bytes_sent = r->bytes_sent,
                     .bytes_received = r->bytes_recv,
                     .group_size = r->avg_status == 0 ? r->group : 1,
                     .grad_sq_local = r->grad_sq_local,
                     .batch_local = r->samples,
                     .grad_sq_avg = r->grad_sq_avg,
                     .batch_avg = r->batch_avg,
                     .time_ms = wall_ms()};
  snprintf(m.run, sizeof m.run, "%s", t->cfg->run);
  uint8_t buf[PROTO_RECORD_MAX];
  size_t len;
  if (proto_metrics_encode(&m, buf, sizeof buf, &len))
    return; /* a NaN loss, say: nothing worth a record */
  uint64_t exp = m.time_ms / 1000 + METRICS_TTL_S;
  if (exp <= t->metrics_exp)
    exp = t->metrics_exp + 1; /* the DHT keeps only a later one */
  if (dht_put(t->dht, t->mkey, (proto_bytes){t->sub, sizeof t->sub},
              (proto_bytes){buf, len}, exp, metrics_put_cb, NULL) == 0)
    t->metrics_exp = exp;
}

/* The worker's news: an epoch step, an evaluation, or its end. */
static void async_cb(uv_async_t *h) {
  bee_train *t = h->data;
  shared s;
  uv_mutex_lock(&t->mu);
  s = t->sh;
  t->sh.steps_tail = t->sh.steps_head;
  if (t->sh.evaluated)
    t->sh.eval_skipped = 0; /* counted from one report to the next */
  t->sh.evaluated = false;
  uv_mutex_unlock(&t->mu);
  for (uint64_t i = s.steps_tail; i != s.steps_head; i++) {
    const struct step_report *r = &s.steps[i % STEP_RING];
    char how[96], hash[17];
    if (r->avg_status == 0)
      snprintf(how, sizeof how, "averaged in a group of %zu (%.1f%% by all)",
               r->group, 100 * r->by_all);
    else if (r->avg_status == -ENOENT)
      snprintf(how, sizeof how, "alone at its epoch: local gradients");
    else
      snprintf(how, sizeof how, "not averaged (%s): local gradients",
               bee_strerror(r->avg_status));
    proto_hex(r->hash, sizeof r->hash, hash);
    bee_info(COMP,
             "epoch %llu done: %llu local samples, training loss %.4f, %s, "
             "parameters %s",
             (unsigned long long)r->epoch, (unsigned long long)r->samples,
             r->loss, how, hash);
    snprintf(t->last_step, sizeof t->last_step,
             "epoch %llu, %llu local samples, loss %.4f, %s",
             (unsigned long long)r->epoch, (unsigned long long)r->samples,
             r->loss, how);
    if (!t->stopped)
      publish_metrics(t, r);
  }
  start_round(t); /* the worker may be waiting for one */
  if (s.evaluated)
    bee_info(COMP,
             "epoch %llu: test accuracy %.2f%%, loss %.4f (%llu epochs not "
             "tested while it ran)",
             (unsigned long long)s.eval_epoch, 100 * s.eval_acc, s.eval_loss,
             (unsigned long long)s.eval_skipped);
  if (s.err && !t->stopped) {
    bee_err(COMP, "training stopped: %s", s.errmsg);
    if (t->on_fatal)
      t->on_fatal(t->fatal_arg);
  }
}

/* ---- life cycle --------------------------------------------------------- */

int bee_train_new(uv_loop_t *loop, const bee_config *cfg,
                  const proto_identity *id, bee_train **out) {
  char err[256];
  bee_train *t = calloc(1, sizeof *t);
  if (!t)
    return -ENOMEM;
  t->loop = loop;
  t->cfg = cfg;
  t->id = id;
  *out = t;
  int rc = trn_mnist_load(cfg->data, "train", &t->tr, err, sizeof err);
  if (rc == 0)
    rc = trn_mnist_load(cfg->data, "t10k", &t->te, err, sizeof err);
  if (rc) {
    bee_err(COMP, "data %s: %s", cfg->data, err);
    return rc;
  }
  trn_model_config mc;
  trn_model_config_default(&mc);
  mc.name = cfg->model;
  mc.max_batch = cfg->batch_size;
  /* Every bee of the run starts from the same weights. */
  uint8_t h[8];
  crypto_generichash(h, sizeof h, (const uint8_t *)cfg->run, strlen(cfg->run),
                     NULL, 0);
  memcpy(&mc.seed, h, sizeof mc.seed);
  if ((rc = trn_model_new(&mc, &t->m, err, sizeof err)) ||
      (cfg->eval_every && (rc = trn_model_new(&mc, &t->em, err, sizeof err)))) {
    bee_err(COMP, "model %s: %s", cfg->model, err);
    return rc;
  }
  trn_optim_config oc;
  trn_optim_config_default(&oc, TRN_SGD);
  oc.lr = (float)cfg->lr;
  oc.momentum = 0.9f;
  if ((rc = trn_optim_new(&oc, trn_model_nparams(t->m), &t->o))) {
    bee_err(COMP, "optimizer: %s", strerror(-rc));
    return rc;
  }
  /* Each bee its own stream: the order's seed is its peer id. */
  if ((rc = trn_order_init(&t->ord, t->tr.n, id->id, PROTO_ID_BYTES, 0, 0))) {
    bee_err(COMP, "data order: %s", strerror(-rc));
    return rc;
  }
  t->x = malloc((size_t)cfg->batch_size * trn_model_inputs(t->m) * sizeof *t->x);
  t->y = malloc((size_t)cfg->batch_size * sizeof *t->y);
  if (!t->x || !t->y)
    return -ENOMEM;
  if (uv_mutex_init(&t->mu))
    return -ENOMEM;
  if (uv_cond_init(&t->eval_cv)) {
    uv_mutex_destroy(&t->mu);
    return -ENOMEM;
  }
  if (uv_cond_init(&t->avg_cv)) {
    uv_cond_destroy(&t->eval_cv);
    uv_mutex_destroy(&t->mu);
    return -ENOMEM;
  }
  if (uv_cond_init(&t->go_cv)) {
    uv_cond_destroy(&t->avg_cv);
    uv_cond_destroy(&t->eval_cv);
    uv_mutex_destroy(&t->mu);
    return -ENOMEM;
  }
  if (uv_cond_init(&t->ckpt_cv)) {
    uv_cond_destroy(&t->go_cv);
    uv_cond_destroy(&t->avg_cv);
    uv_cond_destroy(&t->eval_cv);
    uv_mutex_destroy(&t->mu);
    return -ENOMEM;
  }
  uv_timer_init(loop, &t->timer);
  uv_async_init(loop, &t->async, async_cb);
  t->timer.data = t->async.data = t;
  t->handles = true;
  proto_record_key(PROTO_REC_PROGRESS, cfg->run, 0, NULL, t->key);
  proto_record_key(PROTO_REC_METRICS, cfg->run, 0, NULL, t->mkey);
  if (cfg->resume) { /* the newest valid checkpoint, loaded before go */
    char path[BEE_PATH_MAX + 96];
    uint8_t *blob;
    uint64_t epoch;
    rc = bee_ckpt_newest(cfg->checkpoint_dir, cfg->run, snapshot_size(t),
                         &blob, &epoch, path, sizeof path, err, sizeof err);
    if (rc == 0) {
      t->sh.load = blob;
      t->sh.load_len = snapshot_size(t);
      t->sh.load_epoch = epoch;
      t->sh.epoch = epoch; /* what the first view compares */
      bee_info(COMP, "resuming from %s (epoch %llu)", path,
               (unsigned long long)epoch);
    } else if (rc == -ENOENT) {
      bee_info(COMP, "--resume: %s; starting afresh", err);
    } else {
      bee_err(COMP, "--resume: %s", err);
      return rc;
    }
  }
  bee_info(COMP,
           "run '%s': %s (%zu parameters), %zu training and %zu test images "
           "from %s, batch %u, target %u samples per epoch, lr %g, %u "
           "thread%s",
           cfg->run, cfg->model, trn_model_nparams(t->m), t->tr.n, t->te.n,
           cfg->data, cfg->batch_size, cfg->target_batch_size, cfg->lr,
           cfg->threads, cfg->threads == 1 ? "" : "s");
  return 0;
}

int bee_train_start(bee_train *t, proto_host *host, unsigned port,
                    struct dht_node *dht, void (*on_fatal)(void *arg),
                    void *arg) {
  t->dht = dht;
  t->host = host;
  t->on_fatal = on_fatal;
  t->fatal_arg = arg;
  dht_owned_subkey(dht, t->sub);
  /* The address the matchmaking declares: the listen address, or the
   * loopback one when listening on every address (the group's members
   * use the connections the swarm already has; an address to announce is
   * still to come). */
  char lh[BEE_HOST_MAX] = "";
  unsigned lp;
  if (bee_addr_parse(t->cfg->listen, true, lh, sizeof lh, &lp) ||
      !lh[0] || strcmp(lh, "0.0.0.0") == 0 || strcmp(lh, "::") == 0)
    snprintf(lh, sizeof lh, "127.0.0.1");
  snprintf(t->addr, sizeof t->addr, strchr(lh, ':') ? "[%s]:%u" : "%s:%u",
           lh, port ? port : 1);
  /* Only bees whose gradients have the same layout average together. */
  char schema[64];
  snprintf(schema, sizeof schema, "beed grads fp32 %s %zu", t->cfg->model,
           trn_model_nparams(t->m));
  crypto_generichash(t->schema, sizeof t->schema, (const uint8_t *)schema,
                     strlen(schema), NULL, 0);
  uint8_t self_id[PROTO_ID_BYTES];
  memcpy(self_id, t->id->id, sizeof self_id);
  avg_node_config nc = {.loop = t->loop,
                        .host = host,
                        .self_id = self_id,
                        .dht = {.ctx = t,
                                .declare = match_declare,
                                .fetch = match_fetch}};
  int rc = avg_node_new(&nc, &t->avg);
  if (rc) {
    bee_err(COMP, "cannot start the averager: %s", bee_strerror(rc));
    return rc;
  }
  rc = uv_thread_create(&t->thread, worker, t);
  if (rc) {
    bee_err(COMP, "cannot start the training thread: %s", uv_strerror(rc));
    return rc;
  }
  t->started = true;
  t->started_ms = uv_now(t->loop);
  if (t->cfg->checkpoint_dir[0]) {
    if ((rc = uv_thread_create(&t->ckpt_thread, ckpt_writer, t))) {
      bee_err(COMP, "cannot start the checkpoint thread: %s", uv_strerror(rc));
      return rc;
    }
    t->ckpt_started = true;
  }
  if ((rc = proto_host_on(host, STATE_METHOD, state_req_cb, t))) {
    bee_err(COMP, "cannot serve the state: %s", bee_strerror(rc));
    return rc;
  }
  if (t->em) {
    if ((rc = uv_thread_create(&t->eval_thread, evaluator, t))) {
      bee_err(COMP, "cannot start the evaluation thread: %s", uv_strerror(rc));
      return rc;
    }
    t->eval_started = true;
  }
  t->status_ms = uv_now(t->loop);
  uv_timer_start(&t->timer, tick, TICK_MS, TICK_MS);
  return 0;
}

/* Stops the threads (the worker at its next batch, a round it waits for
 * abandoned) and puts the last state on disk.  Once. */
static void halt_threads(bee_train *t) {
  if (t->halted)
    return;
  t->halted = true;
  if (t->started) {
    uv_mutex_lock(&t->mu);
    t->sh.stop = t->sh.eval_stop = true;
    uv_cond_signal(&t->eval_cv);
    uv_cond_signal(&t->avg_cv);
    uv_cond_signal(&t->go_cv);
    uint64_t epoch = t->sh.epoch, samples = t->sh.samples;
    uv_mutex_unlock(&t->mu);
    uv_thread_join(&t->thread); /* at most one batch or epoch step */
    if (t->ckpt_started) { /* the state after the last step, on disk */
      uv_mutex_lock(&t->mu);
      t->sh.ckpt_req = t->sh.ckpt_stop = true;
      uv_cond_signal(&t->ckpt_cv);
      uv_mutex_unlock(&t->mu);
      uv_thread_join(&t->ckpt_thread);
    }
    if (t->eval_started)
      uv_thread_join(&t->eval_thread); /* at most one evaluation */
    bee_info(COMP, "stopped at epoch %llu with %llu samples gathered",
             (unsigned long long)epoch, (unsigned long long)samples);
  }
}

static void leave_over(bee_train *t) {
  void (*done)(void *) = t->leave_done;
  t->leave_done = NULL;
  if (!done)
    return;
  uv_timer_stop(&t->timer);
  done(t->leave_arg);
}

static void leave_put_cb(dht_node *n, int status, unsigned stored,
                         const dht_stats *st, void *arg) {
  (void)n, (void)stored, (void)st;
  bee_train *t = arg;
  if (status == 0)
    bee_info(COMP, "left the run: the last progress record says so");
  leave_over(t);
}

static void leave_timeout(uv_timer_t *h) {
  bee_train *t = h->data;
  bee_warn(COMP, "left the run; the last progress record was not stored "
                 "within %d ms (it expires within %d s)",
           LEAVE_MS, BEE_PROGRESS_TTL_S);
  leave_over(t);
}

void bee_train_leave(bee_train *t, void (*done)(void *arg), void *arg) {
  halt_threads(t);
  if (t->stopped || !t->dht || !t->handles) {
    done(arg);
    return;
  }
  uv_mutex_lock(&t->mu);
  uint64_t epoch = t->sh.epoch, samples = t->sh.samples;
  uv_mutex_unlock(&t->mu);
  proto_progress p;
  uint8_t buf[PROTO_RECORD_MAX];
  size_t len;
  own_progress(t, epoch, samples, &p);
  p.leaving = true;
  p.samples_per_second = 0;
  uint64_t exp = bee_progress_published(&t->pub, uv_now(t->loop),
                                        p.time_ms / 1000, epoch, samples);
  t->leave_done = done;
  t->leave_arg = arg;
  uv_timer_stop(&t->timer);
  uv_timer_start(&t->timer, leave_timeout, LEAVE_MS, 0);
  if (proto_progress_encode(&p, buf, sizeof buf, &len) ||
      dht_put(t->dht, t->key, (proto_bytes){t->sub, sizeof t->sub},
              (proto_bytes){buf, len}, exp, leave_put_cb, t))
    leave_over(t);
}

void bee_train_stop(bee_train *t) {
  if (!t || t->stopped)
    return;
  t->stopped = true;
  t->dht = NULL;
  halt_threads(t);
  t->leave_done = NULL; /* stopping now: nobody waits for the record */
  /* A round under way ends now (its callback sees BEE_ECANCELED); the
   * worker no longer waits for it.  A download's answer, if one still
   * comes, finds us stopped. */
  if (t->host)
    proto_host_on(t->host, STATE_METHOD, NULL, NULL);
  t->fetching = false;
  avg_node_close(t->avg);
  t->avg = NULL;
  if (t->handles) {
    uv_close((uv_handle_t *)&t->timer, NULL);
    uv_close((uv_handle_t *)&t->async, NULL);
  }
}

void bee_train_free(bee_train *t) {
  if (!t)
    return;
  if (t->handles) {
    uv_cond_destroy(&t->ckpt_cv);
    uv_cond_destroy(&t->go_cv);
    uv_cond_destroy(&t->avg_cv);
    uv_cond_destroy(&t->eval_cv);
    uv_mutex_destroy(&t->mu);
  }
  trn_optim_free(t->o);
  trn_model_free(t->m);
  trn_model_free(t->em);
  free(t->sh.snap);
  free(t->sh.load);
  free(t->fbuf);
  trn_order_free(&t->ord);
  trn_images_free(&t->tr);
  trn_images_free(&t->te);
  free(t->x);
  free(t->y);
  free(t);
}
