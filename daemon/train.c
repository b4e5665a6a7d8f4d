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
 * epoch step: one optimizer step with the mean of the gradients gathered,
 * then the next epoch.
 *
 * This is the first increment of issue 6: the step is local.  Averaging
 * the gradients with the group that formed for the epoch (averager/) comes
 * next, at exactly that point; until then the bees' models drift apart,
 * which the epoch line says.
 *
 * Test accuracy (--eval-every) is measured on a third thread, the
 * evaluator, on a copy of the parameters the worker makes right after the
 * step, so training never waits for it.
 *
 * Threads: the worker owns the model, optimizer and data while it runs,
 * the evaluator its copy of the model (written by the worker only while
 * the evaluator is idle, under mu); the loop thread touches only the
 * shared counters (under mu) and starts and joins the two.
 */
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
  } steps[STEP_RING];
  uint64_t steps_head, steps_tail; /* written, logged; head - tail <= ring */
  bool evaluated;        /* a test evaluation to report */
  uint64_t eval_epoch;
  double eval_loss, eval_acc;
  bool eval_req, eval_busy, eval_stop; /* worker -> evaluator */
  uint64_t eval_req_epoch;
  uint64_t eval_skipped; /* epochs not evaluated: the last one still ran */
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
  uint8_t key[PROTO_DHT_KEY_BYTES];
  uint8_t sub[PROTO_DHT_OWNED_SUBKEY_BYTES];
  bee_rate rate;
  bee_publisher pub;
  bool put_busy, get_busy, put_warned;
  uint64_t last_get_ms;
  uint64_t behind_warned; /* the swarm epoch last warned about */
  bee_swarm_view view;
  bool have_view;
  uint64_t status_ms;
};

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

/* The epoch step: the mean gradient over the samples gathered, one
 * optimizer step, a clean gradient buffer, the next epoch. */
static int epoch_step(bee_train *t) {
  uv_mutex_lock(&t->mu);
  uint64_t n = t->sh.samples, epoch = t->sh.epoch;
  double loss = t->sh.loss_sum;
  uv_mutex_unlock(&t->mu);
  int rc = 0;
  if (n)
    rc = trn_optim_step(t->o, trn_model_params(t->m), trn_model_grads(t->m),
                        1.0f / (float)n);
  trn_model_zero_grad(t->m);
  if (rc)
    return rc;
  uv_mutex_lock(&t->mu);
  t->sh.epoch = epoch + 1;
  t->sh.samples = 0;
  t->sh.loss_sum = 0;
  if (t->sh.steps_head - t->sh.steps_tail == STEP_RING)
    t->sh.steps_tail++; /* the oldest report goes unlogged */
  t->sh.steps[t->sh.steps_head++ % STEP_RING] =
      (struct step_report){epoch, n, n ? loss / (double)n : 0};
  uv_mutex_unlock(&t->mu);
  uv_async_send(&t->async);
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

static void worker(void *arg) {
  bee_train *t = arg;
  const float mean = DATA_MEAN, std = DATA_STD;
  size_t b = t->cfg->batch_size;
  trn_cpu_threads_set((int)t->cfg->threads);
  for (;;) {
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
      if ((rc = epoch_step(t))) {
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

/* The swarm view from the records found (v may be NULL) and our own
 * current progress; asks for the epoch step when the target is met. */
static void update_view(bee_train *t, const dht_value *v) {
  size_t cap = 1 + (v ? v->n : 0), n = 0;
  proto_progress *all = malloc(cap * sizeof *all);
  if (!all)
    return;
  for (size_t i = 0; v && i < v->n; i++) {
    const proto_dht_record *r = &v->records[i];
    if (r->subkey.n == sizeof t->sub &&
        memcmp(r->subkey.p, t->sub, sizeof t->sub) == 0)
      continue; /* ours: the current one goes in below */
    if (proto_progress_decode(r->value.p, r->value.n, &all[n]) == 0)
      n++;
  }
  /* Our own share as of now, and the others' as read. */
  uv_mutex_lock(&t->mu);
  uint64_t epoch = t->sh.epoch, samples = t->sh.samples;
  own_progress(t, epoch, samples, &all[n++]);
  bee_swarm_view_compute(all, n, t->cfg->run, t->cfg->target_batch_size,
                         all[n - 1].time_ms, &t->view);
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
  if (t->view.epoch > epoch + 1 && t->behind_warned != t->view.epoch) {
    t->behind_warned = t->view.epoch;
    bee_warn(COMP,
             "behind the swarm: epoch %llu here, %llu there (downloading "
             "the state from a peer is not implemented yet)",
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
  unsigned every = t->cfg->status_interval_s;
  if (every && t->have_view && now - t->status_ms >= every * 1000ull) {
    t->status_ms = now;
    log_view(t);
  }
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
    bee_info(COMP,
             "epoch %llu done: step over %llu local samples, training loss "
             "%.4f (%zu peers at the epoch; gradients not averaged yet)",
             (unsigned long long)r->epoch, (unsigned long long)r->samples,
             r->loss, t->view.peers_at_epoch);
  }
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
  uv_timer_init(loop, &t->timer);
  uv_async_init(loop, &t->async, async_cb);
  t->timer.data = t->async.data = t;
  t->handles = true;
  proto_record_key(PROTO_REC_PROGRESS, cfg->run, 0, NULL, t->key);
  bee_info(COMP,
           "run '%s': %s (%zu parameters), %zu training and %zu test images "
           "from %s, batch %u, target %u samples per epoch, lr %g, %u "
           "thread%s",
           cfg->run, cfg->model, trn_model_nparams(t->m), t->tr.n, t->te.n,
           cfg->data, cfg->batch_size, cfg->target_batch_size, cfg->lr,
           cfg->threads, cfg->threads == 1 ? "" : "s");
  return 0;
}

int bee_train_start(bee_train *t, struct dht_node *dht,
                    void (*on_fatal)(void *arg), void *arg) {
  t->dht = dht;
  t->on_fatal = on_fatal;
  t->fatal_arg = arg;
  dht_owned_subkey(dht, t->sub);
  int rc = uv_thread_create(&t->thread, worker, t);
  if (rc) {
    bee_err(COMP, "cannot start the training thread: %s", uv_strerror(rc));
    return rc;
  }
  t->started = true;
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

void bee_train_stop(bee_train *t) {
  if (!t || t->stopped)
    return;
  t->stopped = true;
  t->dht = NULL;
  if (t->started) {
    uv_mutex_lock(&t->mu);
    t->sh.stop = t->sh.eval_stop = true;
    uv_cond_signal(&t->eval_cv);
    uint64_t epoch = t->sh.epoch, samples = t->sh.samples;
    uv_mutex_unlock(&t->mu);
    uv_thread_join(&t->thread); /* at most one batch or epoch step */
    if (t->eval_started)
      uv_thread_join(&t->eval_thread); /* at most one evaluation */
    bee_info(COMP, "stopped at epoch %llu with %llu samples gathered",
             (unsigned long long)epoch, (unsigned long long)samples);
  }
  if (t->handles) {
    uv_close((uv_handle_t *)&t->timer, NULL);
    uv_close((uv_handle_t *)&t->async, NULL);
  }
}

void bee_train_free(bee_train *t) {
  if (!t)
    return;
  if (t->handles) {
    uv_cond_destroy(&t->eval_cv);
    uv_mutex_destroy(&t->mu);
  }
  trn_optim_free(t->o);
  trn_model_free(t->m);
  trn_model_free(t->em);
  trn_order_free(&t->ord);
  trn_images_free(&t->tr);
  trn_images_free(&t->te);
  free(t->x);
  free(t->y);
  free(t);
}
