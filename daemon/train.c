/* train.c: the bee's own training, and its run's progress in the DHT
 * (this file: the threads, the epoch step, life cycle; train-swarm.c and
 * train-state.c hold the rest, train-int.h says what goes where).
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
#include "train-int.h"

/* ---- the worker --------------------------------------------------------- */

static void worker_fail(bee_train *t, int rc, const char *what) {
  uv_mutex_lock(&t->mu);
  t->shared.err = rc ? rc : -EIO;
  snprintf(t->shared.errmsg, sizeof t->shared.errmsg, "%s: %s", what,
           bee_strerror(rc < 0 ? rc : -EIO));
  uv_mutex_unlock(&t->mu);
  uv_async_send(&t->async);
}

/* Whether the worker is to stop (a trainer process's session polls it
 * while it waits). */
static bool worker_stopped(void *arg) {
  bee_train *t = arg;
  uv_mutex_lock(&t->mu);
  bool stop = t->shared.stop;
  uv_mutex_unlock(&t->mu);
  return stop;
}

/* What a round gave the worker. */
typedef struct avg_out {
  int status;
  size_t group;
  double by_all;
  uint64_t sent, recv, batch;
  bool ahead;
  bool left;  /* the group went on without this bee (left_behind) */
  bool swarm; /* no round: the buffer holds the swarm's step instead */
} avg_out;

/* Sends buf to the loop for the epoch's round (or a state round) without
 * waiting; see average(). */
static void request_round(bee_train *t, uint64_t epoch, float *buf, size_t n,
                          double w, bool state) {
  uv_mutex_lock(&t->mu);
  t->shared.avg_req = true;
  t->shared.avg_done = false;
  t->shared.avg_state = state;
  t->shared.avg_buf = buf;
  t->shared.avg_n = n;
  t->shared.avg_epoch = epoch;
  t->shared.avg_weight = w;
  uv_mutex_unlock(&t->mu);
  uv_async_send(&t->async);
}

/* The round requested last: waits for it with wait, else returns 2 while
 * it runs; 1 when stopped; 0 with *out filled. */
static int round_result(bee_train *t, bool wait, avg_out *out) {
  uv_mutex_lock(&t->mu);
  while (wait && !t->shared.avg_done && !t->shared.stop)
    uv_cond_wait(&t->avg_cv, &t->mu);
  int rc = t->shared.stop ? 1 : !t->shared.avg_done ? 2 : 0;
  *out = (avg_out){
      t->shared.avg_status,     t->shared.avg_group,      t->shared.avg_by_all,
      t->shared.avg_bytes_sent, t->shared.avg_bytes_recv, t->shared.avg_batch,
      t->shared.avg_ahead,      t->shared.avg_left,       t->shared.avg_swarm};
  uv_mutex_unlock(&t->mu);
  return rc;
}

/* Hands buf (n floats, this bee's weight w) to the loop for a round of
 * the epoch's (a state round with state) and waits for it.  Returns 1
 * when stopped while waiting. */
static int average(bee_train *t, uint64_t epoch, float *buf, size_t n,
                   double w, bool state, avg_out *out) {
  request_round(t, epoch, buf, n, w, state);
  return round_result(t, true, out);
}

/* The state round after the step into epoch: parameters, the optimizer's
 * state and DiLoCo's outer state, averaged with equal weights (each bee's
 * copy is one opinion of the same state); loaded back when the round
 * averaged anything.  Returns 1 when stopped. */
static int state_round(bee_train *t, uint64_t epoch, struct step_report *r) {
  bee__state_pack(t, 3, (uint8_t *)t->state_buf); /* all but the buffers */
  avg_out a;
  if (average(t, epoch, t->state_buf, t->state_len, 1.0, true, &a))
    return 1;
  r->state_round = true;
  r->state_status = a.status;
  r->state_group = a.group;
  r->state_by_all = a.by_all;
  r->bytes_sent += a.sent;
  r->bytes_recv += a.recv;
  if (a.status == 0)
    bee__state_unpack(t, 3, (const uint8_t *)t->state_buf);
  return 0;
}

/* The learning rate at epoch (--lr-schedule): the same on every bee, as
 * the epoch is the swarm's. */
static float lr_at(const bee_train *t, uint64_t epoch) {
  const bee_config *c = t->cfg;
  trn_sched s = {.kind = c->lr_schedule == BEE_SCHED_COSINE   ? TRN_SCHED_COSINE
                         : c->lr_schedule == BEE_SCHED_LINEAR ? TRN_SCHED_LINEAR
                                                              : TRN_SCHED_CONST,
                 .lr = (float)bee_config_lr(c),
                 .min_lr = (float)c->min_lr,
                 .warmup = c->warmup_epochs,
                 .total = c->total_epochs};
  return trn_sched_lr(&s, epoch);
}

/* The optimizer step from epoch with buffer g (NULL: a step that changed
 * nothing): this bee's own (finish_step) and the swarm's it takes, alike:
 * the same optimizer, the same learning rate, the same bits.  DiLoCo's
 * outer step goes from the anchor. */
static int take_step(bee_train *t, uint64_t epoch, const float *g) {
  float *p = bee__params(t);
  size_t np = bee__nparams(t);
  int rc = 0;
  if (g && t->outer) {
    memcpy(p, t->anchor, np * sizeof(float));
    rc = trn_optim_step(t->outer, p, g, 1.0f);
    memcpy(t->anchor, p, np * sizeof(float));
    if (rc == 0 && t->ext) /* the trainer's inner steps go on from here */
      rc = bee_local_step(t->ext, epoch, false, worker_stopped, t);
  } else if (g && t->ext) { /* the trainer's optimizer, on the mean */
    if (g != t->ext->grads)
      memcpy(t->ext->grads, g, np * sizeof(float));
    rc = bee_local_step(t->ext, epoch, true, worker_stopped, t);
  } else if (g) {
    trn_optim_set_lr(t->optim, lr_at(t, epoch));
    rc = trn_optim_step(t->optim, p, g, 1.0f);
  }
  return rc;
}

/* Clean gradients for the next epoch's batches. */
static void zero_grads(bee_train *t) {
  if (t->ext)
    memset(t->ext->grads, 0, t->ext->nparams * sizeof(float));
  else
    trn_model_zero_grad(t->model);
}

/* The second half of the epoch step, once the round is over: the
 * optimizer step with the averaged buffer g (DiLoCo's outer step), the
 * state round when one is due, the report, the snapshot, the checkpoint
 * and the evaluation.  s holds what the first half gathered. */
static int finish_step(bee_train *t, const struct pend *s, float *g,
                       const avg_out *a) {
  float *p = bee__params(t);
  size_t np = bee__nparams(t);
  uint64_t epoch = s->epoch, n = s->n;
  double sq_avg = 0;
  for (size_t i = 0; i < np; i++)
    sq_avg += (double)g[i] * g[i];
  /* For peers whose state is of this epoch (a download that the swarm's
   * step overtook, a round they missed): the step as taken, kept before
   * a trainer process's optimizer has the buffer. */
  bee__log_step(t, epoch, n || a->status == 0 ? g : NULL, np);
  /* Nothing here and nothing averaged in: no step (momentum would still
   * move the weights). */
  int rc = n || a->status == 0 ? take_step(t, epoch, g) : 0;
  if (rc)
    return rc;
  struct step_report rep = {.epoch = epoch,
                            .samples = n,
                            .loss = n ? s->loss / (double)n : 0,
                            .avg_status = a->status,
                            .group = a->group,
                            .by_all = a->by_all,
                            .delayed = t->dgrad != NULL,
                            .ahead = a->ahead,
                            .swarm = a->swarm,
                            .compute_s = s->compute_s,
                            .averaging_s = s->round_s,
                            .bytes_sent = a->sent,
                            .bytes_recv = a->recv,
                            .grad_sq_local = s->sq_local,
                            .grad_sq_avg = sq_avg,
                            .batch_avg = a->status == 0 ? a->batch : n};
  uint64_t skipped = 0;
  rep.loss_scale = t->ext ? 0 : trn_model_loss_scale(t->model, &skipped);
  rep.skipped = skipped - t->skipped_told;
  t->skipped_told = skipped;
  unsigned se = t->cfg->average_state_every;
  double state0 = mono_s();
  if (se && (epoch + 1) % se == 0 && state_round(t, epoch + 1, &rep))
    return 1;
  if (rep.state_round)
    rep.averaging_s += mono_s() - state0;
  /* Out of line (run.h's bee_run_step_diverges): the loop looks for a
   * peer that averaged the round this bee missed, and loads its state; a
   * full state round brings it back too. */
  uv_mutex_lock(&t->mu);
  if (!t->shared.diverged &&
      bee_run_step_diverges(&t->shared.guide, epoch, n, a->status, a->left)) {
    t->shared.diverged = true;
    t->shared.diverged_epoch = epoch;
  }
  if (rep.state_round && rep.state_status == 0 && rep.state_by_all >= 1.0)
    t->shared.diverged = false;
  rep.diverged = t->shared.diverged;
  uv_mutex_unlock(&t->mu);
  /* A state round's mean cannot be taken as a step, nor a step off the
   * swarm's line: the steps kept end here. */
  if ((rep.state_round && rep.state_status == 0) || rep.diverged)
    bee__forget_steps(t);
  crypto_generichash(rep.hash, sizeof rep.hash, (const uint8_t *)p,
                     np * sizeof(float), NULL, 0);
  uv_mutex_lock(&t->mu);
  if (t->shared.steps_head - t->shared.steps_tail == STEP_RING)
    t->shared.steps_tail++; /* the oldest report goes unlogged */
  t->shared.steps[t->shared.steps_head++ % STEP_RING] = rep;
  uv_mutex_unlock(&t->mu);
  uv_async_send(&t->async);
  bee__make_snapshot(t, epoch + 1);
  if (t->ckpt_started && (epoch + 1) % t->cfg->checkpoint_every == 0) {
    uv_mutex_lock(&t->mu);
    t->shared.ckpt_req = true;
    uv_cond_signal(&t->ckpt_cv);
    uv_mutex_unlock(&t->mu);
  }
  unsigned every = t->cfg->eval_every;
  if (t->eval_model && every && (epoch + 1) % every == 0) {
    /* The evaluator tests a copy, so training never waits for it; while
     * it is still busy with an earlier epoch, this one is skipped. */
    uv_mutex_lock(&t->mu);
    if (t->shared.eval_busy || t->shared.eval_req) {
      t->shared.eval_skipped++;
    } else {
      size_t nb;
      float *src = trn_model_buffers(t->model, &nb);
      memcpy(trn_model_params(t->eval_model), trn_model_params(t->model),
             trn_model_nparams(t->model) * sizeof(float));
      if (nb)
        memcpy(trn_model_buffers(t->eval_model, &nb), src, nb * sizeof(float));
      t->shared.eval_req = true;
      t->shared.eval_req_epoch = epoch + 1;
      uv_cond_signal(&t->eval_cv);
    }
    uv_mutex_unlock(&t->mu);
  }
  return 0;
}

/* --delay-averaging: the round requested at the last epoch step, if any:
 * finished (its step taken) when it is over, or with wait when it is
 * not yet.  Returns 1 when stopped, a negative error, else 0. */
static int settle_delayed(bee_train *t, bool wait) {
  if (!t->delayed.active)
    return 0;
  avg_out a;
  int rc = round_result(t, wait, &a);
  if (rc)
    return rc == 2 ? 0 : rc;
  t->delayed.active = false;
  uv_mutex_lock(&t->mu);
  t->delayed.round_s = t->shared.avg_done_s - t->delayed.t0;
  uv_mutex_unlock(&t->mu);
  return finish_step(t, &t->delayed, t->dgrad, &a);
}

/* A round that averaged nothing, with a state of its epoch or a later
 * one waiting (the load ended its matchmaking, run-round.c, or came
 * while it failed): the state replaces the step, which would only take
 * this bee's own gradients, computed on parameters the swarm does not
 * hold, and mark it out of line again. */
static bool state_replaces_step(bee_train *t, uint64_t epoch,
                                const avg_out *a) {
  if (a->status == 0)
    return false;
  uv_mutex_lock(&t->mu);
  bool load = t->shared.load && t->shared.load_epoch >= epoch;
  uint64_t le = t->shared.load_epoch;
  uv_mutex_unlock(&t->mu);
  if (load)
    bee_info(COMP,
             "epoch %llu: not averaged, and the state of epoch %llu has "
             "come: it replaces the step",
             (unsigned long long)epoch, (unsigned long long)le);
  return load;
}

/* Loads a state the loop checked (load, freed here) as of epoch; the
 * gradients stay as they are, and the coding error carried for a path
 * that is no longer ours goes. */
static void take_state(bee_train *t, uint8_t *load, uint64_t epoch) {
  bee__load_snapshot(t, load, epoch);
  free(load);
  bee__forget_steps(t); /* its own, of a line that is no more */
  if (t->residual)
    memset(t->residual, 0, bee__nparams(t) * sizeof *t->residual);
  if (t->ext) { /* the trainer hears of it in its next answer */
    t->ext->loaded = true;
    t->ext_batches = 0;
  }
}

/* The swarm's steps after a state just loaded, which the loop fetched
 * from its donors because the swarm stepped on while the state came
 * (run-fetch.c): taken in order, each as the donors took it, so that the
 * bee lands where the swarm is, in line, without another download.  A
 * step that does not follow, or does not fit, ends them there. */
static int replay_steps(bee_train *t) {
  struct replay r[BEE_RUN_CATCHUP_MAX];
  uv_mutex_lock(&t->mu);
  size_t n = t->shared.nreplay;
  memcpy(r, t->shared.replay, n * sizeof *r);
  t->shared.nreplay = 0;
  uint64_t epoch = t->shared.epoch, from = epoch;
  uv_mutex_unlock(&t->mu);
  size_t np = bee__nparams(t), i = 0;
  int rc = 0;
  for (; i < n && rc == 0; i++) {
    if (r[i].epoch != epoch || (r[i].buf && r[i].len != np * sizeof(float)))
      break;
    const float *g = (const float *)r[i].buf;
    if ((rc = take_step(t, epoch, g)))
      break;
    bee__log_step(t, epoch, g, np);
    free(r[i].buf);
    r[i].buf = NULL;
    epoch++;
    uv_mutex_lock(&t->mu);
    t->shared.epoch = epoch;
    t->shared.samples = 0;
    uv_mutex_unlock(&t->mu);
    bee__make_snapshot(t, epoch);
  }
  for (size_t k = i; k < n; k++)
    free(r[k].buf);
  if (epoch > from)
    bee_info(COMP,
             "state: took the swarm's steps of epochs %llu to %llu (%llu): "
             "at its epoch",
             (unsigned long long)from, (unsigned long long)epoch - 1,
             (unsigned long long)(epoch - from));
  if (i < n && rc == 0)
    bee_warn(COMP,
             "state: the swarm's step of epoch %llu does not follow the "
             "state; training on from epoch %llu",
             (unsigned long long)r[i].epoch, (unsigned long long)epoch);
  return rc;
}

/* A state of the very epoch whose round just ended, downloaded while the
 * round ran (the bee was out of line, and its round had begun before the
 * state came; in a swarm whose epochs are mostly rounds, as they are when
 * the target takes the swarm less than the records' travel, that is where
 * a state lands): the step goes from that state, with the round's mean
 * (the gradients, which a load leaves alone), so it lands where the
 * swarm's does.  Taken after the step instead, the state would set the
 * bee back to the epoch it had just left, one step behind the swarm. */
static void load_under_step(bee_train *t, uint64_t epoch) {
  uv_mutex_lock(&t->mu);
  /* Not with steps to take after it: the worker's loop takes both. */
  uint8_t *load =
      t->shared.load && t->shared.load_epoch == epoch && !t->shared.nreplay
          ? t->shared.load
          : NULL;
  t->shared.load = load ? NULL : t->shared.load;
  uv_mutex_unlock(&t->mu);
  if (!load)
    return;
  take_state(t, load, epoch);
  uv_mutex_lock(&t->mu);
  t->shared.diverged = false; /* the swarm's state from now on */
  uv_mutex_unlock(&t->mu);
  bee_info(COMP,
           "epoch %llu: the state loaded while its round ran is the epoch's "
           "own: the step goes from it",
           (unsigned long long)epoch);
}

/* The epoch step.  Gradient averaging: the mean gradient over the samples
 * gathered, averaged with the group the swarm formed (the loop runs the
 * round while we wait), one optimizer step.  DiLoCo: the local steps
 * already taken; their sum, the change since the last outer step, is
 * averaged instead, and the outer step (Nesterov SGD) goes from the last
 * outer step's parameters with the mean change as its gradient.  Then a
 * clean gradient buffer, the state round when one is due, the next epoch.
 * With --delay-averaging the round runs while the next epoch is computed
 * (the step comes when it is over: settle_delayed).  Returns 1 when
 * stopped while waiting. */
static int epoch_step(bee_train *t) {
  int rc;
  if ((rc = settle_delayed(t, true))) /* one round at a time */
    return rc;
  uv_mutex_lock(&t->mu);
  struct pend s = {.epoch = t->shared.epoch,
                   .n = t->shared.samples,
                   .loss = t->shared.loss_sum,
                   .compute_s = t->shared.compute_s};
  uv_mutex_unlock(&t->mu);
  /* A model on a GPU: the gradients come back to the host here; a device
   * that failed stops the worker (the last checkpoint stays). */
  if (!t->ext && (rc = trn_model_sync(t->model)))
    return rc;
  float *g = bee__grads(t), *p = bee__params(t);
  size_t np = bee__nparams(t);
  if (t->outer) { /* the change: anchor - now, a gradient's sign */
    for (size_t i = 0; i < np; i++) {
      g[i] = t->anchor[i] - p[i];
      s.sq_local += (double)g[i] * g[i];
    }
  } else if (s.n) { /* sums to means: the round weighs them by n */
    /* A trainer process's gradients add up each batch's mean. */
    float inv = t->ext ? 1.0f / (float)t->ext_batches
                       : 1.0f / ((float)s.n * (float)t->per_sample);
    for (size_t i = 0; i < np; i++) {
      g[i] *= inv;
      s.sq_local += (double)g[i] * g[i];
    }
  }
  s.t0 = mono_s();
  avg_out a;
  if (t->dgrad) { /* the round goes on while the next epoch is computed */
    memcpy(t->dgrad, g, np * sizeof(float));
    zero_grads(t);
    request_round(t, s.epoch, t->dgrad, np, (double)s.n, false);
    t->delayed = s;
    t->delayed.active = true;
  } else {
    request_round(t, s.epoch, g, np, (double)s.n, false);
    if ((rc = round_result(t, true, &a)))
      return rc;
    s.round_s = mono_s() - s.t0;
    if (state_replaces_step(t, s.epoch, &a))
      return 0; /* the worker takes the state next */
    load_under_step(t, s.epoch);
  }
  uv_mutex_lock(&t->mu);
  t->shared.epoch = s.epoch + 1;
  t->shared.samples = 0;
  t->shared.loss_sum = 0;
  t->shared.compute_s = 0;
  uv_mutex_unlock(&t->mu);
  t->ext_batches = 0;
  if (t->dgrad)
    return 0;
  rc = finish_step(t, &s, g, &a);
  zero_grads(t);
  return rc;
}

/* The evaluator thread: the test set through the copy the worker made. */
static void evaluator(void *arg) {
  bee_train *t = arg;
  for (;;) {
    uv_mutex_lock(&t->mu);
    while (!t->shared.eval_req && !t->shared.eval_stop)
      uv_cond_wait(&t->eval_cv, &t->mu);
    if (t->shared.eval_stop) {
      uv_mutex_unlock(&t->mu);
      return;
    }
    t->shared.eval_req = false;
    t->shared.eval_busy = true;
    uint64_t epoch = t->shared.eval_req_epoch;
    uv_mutex_unlock(&t->mu);
    double el = 0, acc = 0;
    int rc = trn_source_evaluate(t->src, t->eval_model, &el, &acc);
    uv_mutex_lock(&t->mu);
    t->shared.eval_busy = false;
    if (rc == 0) {
      t->shared.evaluated = true;
      t->shared.eval_epoch = epoch;
      t->shared.eval_loss = el;
      t->shared.eval_acc = acc;
    }
    uv_mutex_unlock(&t->mu);
    if (rc) {
      worker_fail(t, rc, "evaluation");
      return;
    }
    uv_async_send(&t->async);
  }
}

/* A trainer process's next batch: the answer its last message waits for
 * (with the swarm as the last view saw it), then its BATCH, whose
 * gradients it added in the shared memory; its test results on the way
 * go to the loop.  Returns as bee_local_batch. */
static int ext_batch(bee_train *t, uint64_t *samples, double *loss) {
  bee_local *l = t->ext;
  uv_mutex_lock(&t->mu);
  uint64_t epoch = t->shared.epoch;
  uint64_t swarm = t->shared.guide.view.samples;
  uint64_t peers = t->shared.guide.view.peers;
  uv_mutex_unlock(&t->mu);
  proto_local_msg w = {.epoch = epoch,
                       .target = t->cfg->target_batch_size,
                       .samples = swarm,
                       .peers = peers,
                       .mode = PROTO_LOCAL_GRADIENTS};
  if (t->outer) {
    w.mode = PROTO_LOCAL_DILOCO;
    w.inner_steps = bee_config_inner_steps(t->cfg);
    w.outer_lr = bee_config_outer_lr(t->cfg);
    w.outer_momentum = bee_config_outer_momentum(t->cfg);
  }
  int rc = bee_local_answer(l, &w);
  if (rc == 0)
    rc = bee_local_batch(l, worker_stopped, t, samples, loss);
  if (l->evaluated) {
    l->evaluated = false;
    uv_mutex_lock(&t->mu);
    t->shared.evaluated = true;
    t->shared.eval_epoch = l->eval_epoch;
    t->shared.eval_loss = l->eval_loss;
    t->shared.eval_acc = l->eval_acc;
    uv_mutex_unlock(&t->mu);
    uv_async_send(&t->async);
  }
  if (rc == 0)
    t->ext_batches++;
  return rc;
}

static void worker(void *arg) {
  bee_train *t = arg;
  uint64_t b = bee__batch(t);
  trn_cpu_threads_set((int)t->cfg->threads);
  /* Training starts once the loop has seen the swarm: from a peer's
   * state when the swarm is ahead, else from the run's first weights. */
  uv_mutex_lock(&t->mu);
  while (!t->shared.go && !t->shared.stop)
    uv_cond_wait(&t->go_cv, &t->mu);
  bool fresh = !t->shared.load;
  uv_mutex_unlock(&t->mu);
  if (fresh)
    bee__make_snapshot(t, 0);
  for (;;) {
    uv_mutex_lock(&t->mu);
    uint8_t *load = t->shared.load;
    uint64_t load_epoch = t->shared.load_epoch;
    t->shared.load = NULL;
    if (load) { /* the loop never sees the old epoch once it is taken */
      t->shared.epoch = load_epoch;
      t->shared.samples = 0;
      t->shared.diverged = false; /* the swarm's state from now on */
    }
    uv_mutex_unlock(&t->mu);
    if (load) {
      if (t->delayed.active) { /* its step would land on the new state */
        avg_out a;
        if (round_result(t, true, &a) == 1) {
          free(load);
          return;
        }
        t->delayed.active = false;
      }
      take_state(t, load, load_epoch);
      zero_grads(t); /* what was gathered is not the state's */
      bee__make_snapshot(t, load_epoch);
      int rr = replay_steps(t);
      if (rr < 0) {
        worker_fail(t, rr, "the swarm's steps");
        return;
      }
      if (rr)
        return; /* stopped */
      if (t->ext)
        zero_grads(t); /* the steps went through them */
      continue;
    }
    uv_mutex_lock(&t->mu);
    bool stop = t->shared.stop;
    bool step = bee_run_step_due(t->cfg, &t->shared.guide, t->shared.epoch,
                                 t->shared.samples, mono_ms());
    uv_mutex_unlock(&t->mu);
    if (stop)
      return;
    int rc;
    if ((rc = settle_delayed(t, false)) < 0) { /* a round just over */
      worker_fail(t, rc, "epoch step");
      return;
    }
    if (rc)
      return; /* stopped */
    if (step) {
      if ((rc = epoch_step(t)) < 0) {
        worker_fail(t, rc, "epoch step");
        return;
      }
      continue;
    }
    double t0 = mono_s(), loss = 0;
    uint64_t counted = b;
    if (t->ext) { /* the trainer's batch: its mean loss, summed here */
      rc = ext_batch(t, &counted, &loss);
      if (rc == 1)
        return; /* stopped */
      if (rc) {
        worker_fail(t, rc, "the trainer process");
        return;
      }
      loss *= (double)counted;
    } else {
      rc = trn_source_train(t->src, t->model, &loss);
      loss /= (double)t->per_sample; /* gpt's: the mean over a window */
    }
    /* A batch whose scaled gradients overflowed added nothing (fp16's
     * loss scaling has halved its scale): its samples do not count, and
     * DiLoCo takes no local step for it. */
    bool dropped = rc == 0 && !t->ext && trn_model_skipped(t->model);
    if (dropped && ++t->skip_streak == SKIP_STREAK_WARN)
      bee_warn(COMP,
               "%u batches in a row dropped for gradients that overflowed "
               "at loss scale 2^%d: the loss or the weights are no longer "
               "finite",
               SKIP_STREAK_WARN, ilogbf(trn_model_loss_scale(t->model, NULL)));
    if (rc == 0 && !dropped)
      t->skip_streak = 0;
    if (rc == 0 && t->outer && !dropped && !t->ext) {        /* DiLoCo: a local
                                                         step */
      trn_optim_set_lr(t->optim, lr_at(t, t->shared.epoch)); /* ours to write */
      rc = trn_model_step(t->model, t->optim, /* on its device */
                          1.0f / ((float)b * (float)t->per_sample));
      trn_model_zero_grad(t->model);
    }
    if (rc) {
      worker_fail(t, rc, "training step");
      return;
    }
    double dt = mono_s() - t0;
    if (dropped)
      counted = 0;
    uv_mutex_lock(&t->mu);
    t->shared.samples += counted;
    t->shared.pend_samples += counted;
    t->shared.pend_s += dt;
    t->shared.compute_s += dt;
    t->shared.loss_sum += dropped ? 0 : loss;
    uv_mutex_unlock(&t->mu);
  }
}

void bee_train_status(const bee_train *t, char *buf, size_t cap) {
  const proto_swarm_view *w = bee_run_view(t->run);
  snprintf(buf, cap,
           "run %s: swarm epoch %llu, %zu peers, %.0f samples/s here",
           t->cfg->run, (unsigned long long)w->epoch, w->peers,
           bee_run_rate(t->run));
}

size_t bee_train_report(const bee_train *t, char *buf, size_t cap) {
  const proto_swarm_view *w = bee_run_view(t->run);
  int n = snprintf(
      buf, cap,
      "run %s\nmodel %s\nswarm-epoch %llu\nswarm-samples %llu\n"
      "target %u\nswarm-samples-per-second %.0f\neta-seconds %.1f\n"
      "peers %zu\npeers-at-epoch %zu\nsamples-per-second %.0f\n"
      "compression %s\nlast-step %s\nout-of-line %s\nprecision %s\n",
      t->cfg->run, t->desc, (unsigned long long)w->epoch,
      (unsigned long long)w->samples, t->cfg->target_batch_size,
      w->samples_per_second, w->eta_s, w->peers, w->peers_at_epoch,
      bee_run_rate(t->run), avg_codec_name((avg_codec)t->cfg->compression),
      t->last_step[0] ? t->last_step : "none yet",
      t->out_of_line ? "yes (stepped without its peers' round; loading "
                       "their state when one has it)"
                     : "no",
      t->cfg->precision);
  if (n >= 0 && (size_t)n < cap && t->loss_scale)
    n += snprintf(buf + n, cap - (size_t)n,
                  "loss-scale 2^%d\nbatches-dropped %llu\n",
                  ilogbf(t->loss_scale), (unsigned long long)t->dropped);
  return n < 0 ? 0 : (size_t)n < cap ? (size_t)n : cap - 1;
}

/* The worker's news: an epoch step, an evaluation, or its end. */
static void async_cb(uv_async_t *h) {
  bee_train *t = h->data;
  train_shared s;
  uv_mutex_lock(&t->mu);
  s = t->shared;
  t->shared.steps_tail = t->shared.steps_head;
  if (t->shared.evaluated)
    t->shared.eval_skipped = 0; /* counted from one report to the next */
  t->shared.evaluated = false;
  uv_mutex_unlock(&t->mu);
  bee_run_step done[STEP_RING];
  size_t ndone = 0;
  for (uint64_t i = s.steps_tail; i != s.steps_head; i++) {
    const struct step_report *r = &s.steps[i % STEP_RING];
    char how[192], hash[17], lag[64] = "";
    uint64_t steps = r->samples / bee__batch(t);
    if (t->outer && steps < bee_config_inner_steps(t->cfg))
      snprintf(lag, sizeof lag, ", after %llu of its %u local steps",
               (unsigned long long)steps, bee_config_inner_steps(t->cfg));
    if (r->avg_status == 0 && r->swarm)
      snprintf(how, sizeof how,
               "took the swarm's step (its round missed it; its own %s left "
               "out)%s",
               t->outer ? "change" : "gradients", lag);
    else if (r->avg_status == 0)
      snprintf(how, sizeof how,
               "averaged in a group of %zu (%.1f%% by all) in %.2f s, %.2f "
               "MiB sent%s%s%s",
               r->group, 100 * r->by_all, r->averaging_s,
               (double)r->bytes_sent / (1 << 20),
               r->delayed ? " (behind the next epoch)" : "",
               r->ahead ? ", group formed ahead" : "", lag);
    else if (r->avg_status == -ENOENT)
      snprintf(how, sizeof how, "alone at its epoch: local %s",
               t->outer ? "change" : "gradients");
    else
      snprintf(how, sizeof how, "not averaged (%s): local %s",
               bee_strerror(r->avg_status), t->outer ? "change" : "gradients");
    char st[96] = "";
    if (r->state_round && r->state_status == 0)
      snprintf(st, sizeof st, "; state averaged in a group of %zu",
               r->state_group);
    else if (r->state_round)
      snprintf(st, sizeof st, "; state not averaged (%s)",
               r->state_status == -ENOENT ? "alone"
                                          : bee_strerror(r->state_status));
    char sk[96] = "";
    if (r->skipped)
      snprintf(sk, sizeof sk,
               "; %llu batch%s dropped for overflow, loss scale now 2^%d",
               (unsigned long long)r->skipped, r->skipped == 1 ? "" : "es",
               ilogbf(r->loss_scale));
    proto_hex(r->hash, sizeof r->hash, hash);
    bee_info(COMP,
             "epoch %llu done: %llu local samples, training loss %.4f, "
             "%s%s%s, parameters %s",
             (unsigned long long)r->epoch, (unsigned long long)r->samples,
             r->loss, how, st, sk, hash);
    t->out_of_line = r->diverged;
    t->loss_scale = r->loss_scale;
    t->dropped += r->skipped;
    snprintf(t->last_step, sizeof t->last_step,
             "epoch %llu, %llu local samples, loss %.4f, %s",
             (unsigned long long)r->epoch, (unsigned long long)r->samples,
             r->loss, how);
    bee_run_step *d = &done[ndone++];
    *d = (bee_run_step){.epoch = r->epoch,
                        .samples = r->samples,
                        .loss = r->loss,
                        .avg_status = r->avg_status,
                        .group = r->group,
                        .by_all = r->by_all,
                        .diverged = r->diverged,
                        .compute_s = r->compute_s,
                        .averaging_s = r->averaging_s,
                        .skipped = r->skipped,
                        .loss_scale = r->loss_scale,
                        .bytes_sent = r->bytes_sent,
                        .bytes_recv = r->bytes_recv,
                        .grad_sq_local = r->grad_sq_local,
                        .grad_sq_avg = r->grad_sq_avg,
                        .batch_avg = r->batch_avg};
    memcpy(d->hash, r->hash, sizeof d->hash);
  }
  /* The metrics records, the view at the new epoch, and the round the
   * worker may be waiting for. */
  bee_run_stepped(t->run, done, ndone);
  if (s.evaluated && t->per_sample > 1)
    bee_info(COMP,
             "epoch %llu: test next-token accuracy %.2f%%, loss %.4f, "
             "perplexity %.2f (%llu epochs not tested while it ran)",
             (unsigned long long)s.eval_epoch, 100 * s.eval_acc, s.eval_loss,
             exp(s.eval_loss), (unsigned long long)s.eval_skipped);
  else if (s.evaluated)
    bee_info(COMP,
             "epoch %llu: test accuracy %.2f%%, loss %.4f (%llu epochs not "
             "tested while it ran)",
             (unsigned long long)s.eval_epoch, 100 * s.eval_acc, s.eval_loss,
             (unsigned long long)s.eval_skipped);
  if (s.err && !t->stopped) {
    if (t->ext) /* the daemon goes on, for the next trainer */
      bee_info(COMP, "the trainer's session is over (%s)", s.errmsg);
    else
      bee_err(COMP, "training stopped: %s", s.errmsg);
    if (t->on_fatal)
      t->on_fatal(t->fatal_arg);
  }
}

/* ---- life cycle --------------------------------------------------------- */

/* --resume: the checkpoint's loss scale (its float's bits; 0: none), so
 * that a restarted bee does not start again from its first scale and
 * drop the batches that costs. */
static void resume_loss_scale(bee_train *t, uint64_t bits, const char *path) {
  if (bits == 0)
    return;
  float scale = 0;
  uint32_t b32 = (uint32_t)bits;
  memcpy(&scale, &b32, sizeof scale);
  int rc = bits >> 32 ? -EINVAL : trn_model_set_loss_scale(t->model, scale);
  if (rc == 0)
    bee_info(COMP, "--resume: the loss scale goes on at 2^%d", ilogbf(scale));
  else if (rc == -EPERM)
    bee_info(COMP,
             "--resume: the checkpoint's loss scale (2^%d) is not taken: "
             "this run's is %s",
             ilogbf(scale), trn_model_loss_scale(t->model, NULL) ? "fixed" : "off");
  else
    bee_warn(COMP,
             "--resume: %s holds a loss scale that is not a power of two "
             "from 2^-24 to 2^127; the scale starts afresh",
             path);
}

/* The built-in trainer: the data, the device, the model (and its copy
 * for tests), the optimizer. */
static int build_model(bee_train *t) {
  const bee_config *cfg = t->cfg;
  char err[256];
  trn_model_config mc;
  trn_model_config_default(&mc);
  mc.name = cfg->model;
  mc.max_batch = cfg->batch_size;
  mc.batchnorm = cfg->batchnorm;
  if (cfg->depth)
    mc.depth = cfg->depth;
  if (cfg->width)
    mc.width = cfg->width;
  else if (mc.depth == 18)
    mc.width = 64; /* ImageNet's ResNet-18 */
  unsigned *gpt[] = {&mc.vocab, &mc.ctx, &mc.layers, &mc.heads, &mc.embd};
  const unsigned set[] = {cfg->vocab, cfg->ctx, cfg->layers, cfg->heads,
                          cfg->embd};
  for (size_t i = 0; i < 5; i++)
    if (set[i])
      *gpt[i] = set[i];
  bool tokens = strcmp(cfg->model, "gpt") == 0;
  trn_source_config sc = {
      .data = cfg->data,
      .tokens = cfg->tokens,
      .test_tokens = cfg->val_tokens[0] ? cfg->val_tokens : NULL,
      .vocab = mc.vocab,
      .ctx = mc.ctx,
      .batch = cfg->batch_size,
      .aug = {.pad = cfg->augment ? 4 : 0, .flip = cfg->augment}};
  int rc = trn_source_open(&sc, tokens, &t->src, err, sizeof err);
  if (rc) {
    bee_err(COMP, "data %s: %s", tokens ? cfg->tokens : cfg->data, err);
    return rc;
  }
  trn_source_fit(t->src, &mc);
  t->per_sample = trn_source_per_item(t->src);
  trn_device dev;
  char why[256];
  if ((rc = trn_device_open(cfg->device, &dev, why, sizeof why))) {
    bee_err(COMP, "--device %s: %s", cfg->device, why);
    return rc;
  }
  bee_info(COMP, "device: %s", why);
  mc.device = dev.kind;
  mc.device_index = dev.index;
  mc.precision = trn_precision_parse(cfg->precision); /* config.c's */
  mc.loss_scale = cfg->loss_scale; /* 0: the trainer's default */
  mc.loss_scale_fixed = cfg->loss_scale_fixed;
  /* Every bee of the run starts from the same weights. */
  uint8_t h[8];
  crypto_generichash(h, sizeof h, (const uint8_t *)cfg->run, strlen(cfg->run),
                     NULL, 0);
  memcpy(&mc.seed, h, sizeof mc.seed);
  /* With auto, a GPU that cannot hold a model (out of memory, a failing
   * driver) leaves it the CPU: the bee keeps training. */
  bool fall_back = strcmp(cfg->device, "auto") == 0;
  rc = trn_model_new(&mc, &t->model, err, sizeof err);
  if (rc && mc.device == TRN_DEV_CUDA && fall_back) {
    bee_warn(COMP, "model %s on cuda:%d: %s; training on the CPU",
             cfg->model, mc.device_index, err);
    mc.device = TRN_DEV_CPU;
    rc = trn_model_new(&mc, &t->model, err, sizeof err);
  }
  if (rc == 0 && cfg->eval_every && trn_source_test_items(t->src)) {
    /* The test model never trains: it holds no loss scaling's array, and
     * with fp16 evaluates on TF32 (the same 10 bits, fp32's range). */
    trn_model_config ec = mc;
    ec.loss_scale = 0;
    if (ec.precision == TRN_FP16)
      ec.precision = TRN_TF32;
    rc = trn_model_new(&ec, &t->eval_model, err, sizeof err);
    if (rc && ec.device == TRN_DEV_CUDA && fall_back) {
      bee_warn(COMP, "the test model on cuda:%d: %s; testing on the CPU",
               ec.device_index, err);
      ec.device = TRN_DEV_CPU;
      rc = trn_model_new(&ec, &t->eval_model, err, sizeof err);
    }
  }
  if (rc) {
    bee_err(COMP, "model %s: %s", cfg->model, err);
    return rc;
  }
  trn_model_describe(t->model, t->desc, sizeof t->desc);
  static const int kinds[] = {[BEE_OPT_SGD] = TRN_SGD,
                              [BEE_OPT_ADAMW] = TRN_ADAMW,
                              [BEE_OPT_LAMB] = TRN_LAMB};
  trn_optim_config oc;
  trn_optim_config_default(&oc, kinds[cfg->optimizer]);
  oc.lr = (float)bee_config_lr(cfg);
  if (cfg->optimizer == BEE_OPT_SGD)
    oc.momentum = 0.9f;
  size_t np = trn_model_nparams(t->model), ends[256];
  if ((rc = trn_optim_new(&oc, np, &t->optim)) ||
      (cfg->optimizer == BEE_OPT_LAMB &&
       (rc = trn_optim_set_tensors(
            t->optim, ends, trn_model_tensors(t->model, ends, 256))))) {
    bee_err(COMP, "optimizer: %s", strerror(-rc));
    return rc;
  }
  return 0;
}

/* What the run needs beside the model, the built-in trainer's or a
 * trainer process's: DiLoCo's outer step, the buffers of the options,
 * the run core, the threads' locks, the checkpoint to resume from, the
 * loader; then the run's lines in the log. */
static int train_init(bee_train *t) {
  const bee_config *cfg = t->cfg;
  const proto_identity *id = t->id;
  char err[256];
  int rc;
  trn_optim_config oc;
  size_t np = bee__nparams(t);
  bool tokens = strcmp(cfg->model, "gpt") == 0;
  if (cfg->averaging == BEE_AVG_DILOCO) {
    trn_optim_config_default(&oc, TRN_SGD);
    oc.lr = (float)bee_config_outer_lr(cfg);
    oc.momentum = (float)bee_config_outer_momentum(cfg);
    oc.nesterov = oc.momentum > 0;
    if ((rc = trn_optim_new(&oc, np, &t->outer))) {
      bee_err(COMP, "outer optimizer: %s", strerror(-rc));
      return rc;
    }
    if (!(t->anchor = malloc(np * sizeof *t->anchor)))
      return -ENOMEM;
    memcpy(t->anchor, bee__params(t), np * sizeof *t->anchor);
  }
  if (cfg->delay_averaging &&
      !(t->dgrad = malloc(np * sizeof *t->dgrad)))
    return -ENOMEM;
  if (cfg->error_feedback && !(t->residual = calloc(np, sizeof *t->residual)))
    return -ENOMEM;
  /* The steps kept for peers: within two snapshots' bytes, none where
   * a step is taken a round late (--delay-averaging). */
  if (!cfg->delay_averaging) {
    size_t step = np * sizeof(float), snap = bee__snapshot_size(t);
    t->steps_kept = step ? 2 * snap / step : 0;
    t->steps_kept = t->steps_kept < 2            ? 2
                    : t->steps_kept > STEPS_KEPT ? STEPS_KEPT
                                                 : t->steps_kept;
  }
  if (cfg->average_state_every) {
    float *part[STATE_PARTS];
    size_t len[STATE_PARTS];
    t->state_len = bee__state_parts(t, 3, part, len);
    if (!(t->state_buf = malloc(t->state_len * sizeof *t->state_buf)))
      return -ENOMEM;
  }
  /* Each bee its own stream: the order's seed is its peer id.  (A
   * trainer process keeps its own data.) */
  size_t items = t->src ? trn_source_items(t->src) : 0;
  trn_order ord = {0};
  if (t->src &&
      (rc = trn_order_init(&ord, items, id->id, PROTO_ID_BYTES, 0, 0))) {
    bee_err(COMP, "data order: %s", strerror(-rc));
    return rc;
  }
  /* The run's decisions, with this bee's I/O (train-swarm.c). */
  bee__run_io(t, &t->io);
  bee_run_config rc_cfg = {.cfg = cfg,
                           .state_bytes = bee__snapshot_size(t),
                           .step_bytes =
                               t->steps_kept ? np * sizeof(float) : 0};
  memcpy(rc_cfg.self_id, id->id, sizeof rc_cfg.self_id);
  if ((rc = bee_run_new(&rc_cfg, &t->io, &t->run))) {
    trn_order_free(&ord);
    return rc;
  }
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
  uv_timer_init(t->loop, &t->timer);
  uv_async_init(t->loop, &t->async, async_cb);
  t->timer.data = t->async.data = t;
  t->handles = true;
  proto_record_key(PROTO_REC_PROGRESS, cfg->run, 0, NULL, t->key);
  proto_record_key(PROTO_REC_METRICS, cfg->run, 0, NULL, t->mkey);
  proto_record_key(PROTO_REC_DONOR, cfg->run, 0, NULL, t->dkey);
  if (cfg->checkpoint_dir[0] && !cfg->check && /* --check makes nothing */
      (rc = bee_ckpt_prepare(cfg->checkpoint_dir, err, sizeof err))) {
    bee_err(COMP, "%s", err);
    trn_order_free(&ord);
    return rc;
  }
  if (cfg->resume) { /* the newest valid checkpoint, loaded before go */
    char path[BEE_PATH_MAX + 96];
    uint8_t *blob;
    uint64_t epoch;
    size_t snap = bee__snapshot_size(t);
    size_t blen = 0;
    rc = bee_ckpt_newest(cfg->checkpoint_dir, cfg->run, snap + CKPT_LOCAL_OLD,
                         snap + CKPT_LOCAL, &blob, &blen, &epoch, path,
                         sizeof path, err, sizeof err);
    const char *bad = rc == 0 ? bee__snapshot_mismatch(t, blob) : NULL;
    uint64_t local[CKPT_NLOCAL] = {0};
    if (rc == 0)
      bee__ckpt_local(blob + snap, blen - snap, local);
    if (!bad && rc == 0 && t->src && local[1] > items)
      bad = "a data position past the training set's end (another "
            "dataset?)";
    if (bad) {
      bee_err(COMP, "--resume: %s holds %s", path, bad);
      free(blob);
      trn_order_free(&ord);
      return -EINVAL;
    }
    if (rc == 0 && t->src) {
      /* The data order and the dropout masks go on where they were. */
      trn_order_free(&ord);
      if ((rc = trn_order_init(&ord, items, id->id, PROTO_ID_BYTES,
                               local[0], local[1]))) {
        free(blob);
        return rc;
      }
      trn_model_set_dropout_calls(t->model, local[2]);
      resume_loss_scale(t, local[3], path);
    }
    if (rc == 0) {
      t->shared.load = blob;
      t->shared.load_epoch = epoch;
      t->shared.epoch = epoch; /* what the first view compares */
      bee_info(COMP, "resuming from %s (epoch %llu; data pass %llu at "
               "%llu of %zu)", path, (unsigned long long)epoch,
               (unsigned long long)local[0], (unsigned long long)local[1],
               items);
    } else if (rc == -ENOENT) {
      bee_info(COMP, "--resume: %s; starting afresh", err);
    } else {
      bee_err(COMP, "--resume: %s", err);
      trn_order_free(&ord);
      return rc;
    }
  }
  /* A trainer process that comes after another goes on from the state
   * its beed had when that one left (newer than any checkpoint), unless
   * its model is another. */
  if (t->carry) {
    const char *bad = t->carry_len != bee__snapshot_size(t)
                          ? "another size"
                          : bee__snapshot_mismatch(t, t->carry);
    if (bad) {
      bee_warn(COMP,
               "the trainer's model is not the last trainer's (a state of "
               "%s): it starts from its own weights or the swarm's",
               bad);
      free(t->carry);
    } else {
      free(t->shared.load);
      t->shared.load = t->carry;
      t->shared.load_epoch = t->shared.epoch = t->carry_epoch;
      bee_info(COMP,
               "the trainer goes on from the state of epoch %llu this beed "
               "kept",
               (unsigned long long)t->carry_epoch);
    }
    t->carry = NULL;
  }
  /* Images are made on the loader's thread, a few batches ahead, while
   * the model trains (on a GPU the pass would otherwise wait for each),
   * in pinned memory for a GPU (copied without a staging copy). */
  rc = t->src ? trn_source_start(t->src, &ord,
                                 trn_model_device(t->model) == TRN_DEV_CUDA)
              : 0;
  trn_order_free(&ord);
  if (rc) {
    bee_err(COMP, "data loader: %s", strerror(-rc));
    return rc;
  }
  char how[160];
  if (t->outer)
    snprintf(how, sizeof how,
             "DiLoCo: %u local steps per round, outer Nesterov lr %g "
             "momentum %g",
             bee_config_inner_steps(cfg), bee_config_outer_lr(cfg),
             bee_config_outer_momentum(cfg));
  else
    snprintf(how, sizeof how, "target %u samples per epoch%s",
             cfg->target_batch_size,
             cfg->delay_averaging ? " (averaged behind the next)" : "");
  if (t->ext)
    bee_info(COMP,
             "run '%s': %s (%zu parameters), the trainer process's data, "
             "batch %llu, %s, its own optimizer",
             cfg->run, t->desc, np, (unsigned long long)t->ext->batch, how);
  else
    bee_info(COMP,
             "run '%s': %s (%zu parameters), %s: %zu training and %zu test "
             "%s from %s, batch %u, %s, %s lr %g, %u thread%s",
             cfg->run, t->desc, np, trn_source_kind(t->src), items,
             trn_source_test_items(t->src), tokens ? "windows" : "images",
             tokens ? cfg->tokens : cfg->data, cfg->batch_size, how,
             bee_optimizer_name(cfg->optimizer), bee_config_lr(cfg),
             cfg->threads, cfg->threads == 1 ? "" : "s");
  float scale = t->ext ? 0 : trn_model_loss_scale(t->model, NULL);
  bool cpu = t->ext || trn_model_device(t->model) == TRN_DEV_CPU;
  t->loss_scale = scale;
  if (scale || strcmp(cfg->precision, "fp32") != 0)
    bee_info(COMP, "precision %s%s, %s", cfg->precision,
             cpu && strcmp(cfg->precision, "fp32") != 0
                 ? " (the CPU computes in fp32)"
                 : "",
             scale ? "loss scaled" : "no loss scaling");
  if (scale)
    bee_info(COMP, "loss scale 2^%d, %s", ilogbf(scale),
             cfg->loss_scale_fixed ? "fixed" : "dynamic");
  if (cfg->compression != AVG_NONE)
    bee_info(COMP, "rounds send %s %s%s",
             t->outer ? "the change as" : "gradients as",
             avg_codec_name((avg_codec)cfg->compression),
             cfg->error_feedback ? ", with error feedback" : "");
  if (cfg->clip > 0)
    bee_info(COMP,
             "clip: %s beyond %g times the group's median norm, part by "
             "part, are scaled down to it",
             t->outer ? "changes" : "gradients", cfg->clip);
  else
    bee_info(COMP, "clip: off (--clip off): every contribution counts whole");
  if (cfg->eval_every && !t->eval_model && !t->ext)
    bee_info(COMP, "no test set (--val-tokens): no test lines");
  if (cfg->average_state_every)
    bee_info(COMP, "state averaging: every %u epochs",
             cfg->average_state_every);
  if (cfg->lr_schedule != BEE_SCHED_CONSTANT)
    bee_info(COMP,
             "learning rate: %u epochs of warmup, then %s to %g at epoch %u",
             cfg->warmup_epochs, bee_schedule_name(cfg->lr_schedule),
             cfg->min_lr, cfg->total_epochs);
  else if (cfg->warmup_epochs)
    bee_info(COMP, "learning rate: %u epochs of warmup", cfg->warmup_epochs);
  return 0;
}

static bee_train *train_alloc(uv_loop_t *loop, const bee_config *cfg,
                              const proto_identity *id) {
  bee_train *t = calloc(1, sizeof *t);
  if (!t)
    return NULL;
  t->loop = loop;
  t->cfg = cfg;
  t->id = id;
  t->per_sample = 1;
  return t;
}

int bee_train_new(uv_loop_t *loop, const bee_config *cfg,
                  const proto_identity *id, bee_train **out) {
  bee_train *t = *out = train_alloc(loop, cfg, id);
  if (!t)
    return -ENOMEM;
  int rc = build_model(t);
  return rc ? rc : train_init(t);
}

int bee_train_new_local(uv_loop_t *loop, const bee_config *cfg,
                        const proto_identity *id, bee_local *l, uint8_t *state,
                        size_t len, uint64_t epoch, bee_train **out) {
  bee_train *t = *out = train_alloc(loop, cfg, id);
  if (!t) {
    bee_local_free(l);
    free(state);
    return -ENOMEM;
  }
  t->ext = l;
  t->carry = state;
  t->carry_len = len;
  t->carry_epoch = epoch;
  snprintf(t->desc, sizeof t->desc, "%s", l->desc);
  return train_init(t);
}

/* A name of --announce being resolved: the request, what to say, and
 * where the bee keeps it (NULL once the bee stopped: the answer is then
 * only freed). */
typedef struct announce_lookup {
  uv_getaddrinfo_t req;
  char addr[PROTO_ADDR_MAX];
  uv_getaddrinfo_t **slot;
} announce_lookup;

static void announce_resolved(uv_getaddrinfo_t *req, int status,
                              struct addrinfo *res) {
  announce_lookup *l = req->data;
  if (l->slot)
    *l->slot = NULL;
  if (status < 0 && status != UV_ECANCELED)
    bee_warn(COMP,
             "--announce %s: the name does not resolve here (%s): peers "
             "that cannot resolve it cannot dial this bee",
             l->addr, uv_strerror(status));
  uv_freeaddrinfo(res);
  free(l);
}

/* The --announce addresses at the start: each names the port this bee
 * listens on (another one is right only behind a port forward), and a
 * name resolves (asked in the background).  Warnings: the bee runs, its
 * peers may not reach it. */
static void announce_check(bee_train *t) {
  for (size_t i = 0; i < t->cfg->nannounce; i++) {
    const char *a = t->cfg->announce[i];
    char host[BEE_HOST_MAX];
    unsigned port;
    if (bee_addr_parse(a, false, host, sizeof host, &port))
      continue; /* refused by the config already */
    if (port != t->port)
      bee_warn(COMP,
               "--announce %s: this bee listens on port %u, not %u: right "
               "only behind a port forward",
               a, t->port, port);
    announce_lookup *l;
    if (proto_ip_literal(host) || !(l = calloc(1, sizeof *l)))
      continue;
    snprintf(l->addr, sizeof l->addr, "%s", a);
    l->req.data = l;
    l->slot = &t->announce_req[i];
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM};
    if (uv_getaddrinfo(t->loop, &l->req, announce_resolved, host, NULL,
                       &hints) == 0)
      t->announce_req[i] = &l->req;
    else
      free(l);
  }
}

/* Stops the lookups still running (the bee stops). */
static void announce_cancel(bee_train *t) {
  for (size_t i = 0; i < BEE_ANNOUNCE_MAX; i++) {
    uv_getaddrinfo_t *req = t->announce_req[i];
    if (!req)
      continue;
    ((announce_lookup *)req->data)->slot = NULL;
    t->announce_req[i] = NULL;
    uv_cancel((uv_req_t *)req);
  }
}

/* A loopback --announce while a peer is on another host: that peer can
 * never dial it.  Once. */
static void announce_loopback_check(bee_train *t) {
  char host[BEE_HOST_MAX];
  unsigned port;
  if (t->announce_warned || !t->cfg->nannounce || !t->members ||
      bee_addr_parse(t->cfg->announce[0], false, host, sizeof host, &port) ||
      !proto_host_loopback(host))
    return;
  for (size_t i = 0; i < t->members->n; i++) {
    char ph[BEE_HOST_MAX];
    unsigned pp;
    const char *pa = t->members->v[i].addr;
    if (pa[0] && bee_addr_parse(pa, false, ph, sizeof ph, &pp) == 0 &&
        !proto_host_loopback(ph)) {
      t->announce_warned = true;
      bee_warn(COMP,
               "--announce %s is a loopback address, and peer %s is on "
               "another host: it cannot dial this bee there",
               t->cfg->announce[0], pa);
      return;
    }
  }
}

int bee_train_start(bee_train *t, proto_host *host, unsigned port,
                    struct dht_node *dht, void (*on_fatal)(void *arg),
                    void *arg) {
  t->dht = dht;
  t->host = host;
  t->on_fatal = on_fatal;
  t->fatal_arg = arg;
  dht_owned_subkey(dht, t->sub);
  /* The listen address, where it is a specific one: the address peers
   * dial when neither --announce nor their view of us gives one. */
  char lh[BEE_HOST_MAX] = "";
  unsigned lp;
  if (bee_addr_parse(t->cfg->listen, true, lh, sizeof lh, &lp) ||
      strcmp(lh, "0.0.0.0") == 0 || strcmp(lh, "::") == 0)
    lh[0] = '\0';
  memcpy(t->listen_host, lh, sizeof lh);
  t->port = port ? port : 1;
  announce_check(t);
  /* Only bees whose gradients have the same layout and encoding average
   * together, and that step them with the same optimizer (an AdamW bee
   * and a LAMB bee averaging would each take another step from the same
   * gradients). */
  char schema[256];
  avg_codec codec = (avg_codec)t->cfg->compression;
  snprintf(schema, sizeof schema, "beed %s %s %s %s %zu",
           t->outer ? "diloco" : "grads",
           codec == AVG_NONE ? "fp32" : avg_codec_name(codec),
           bee__optim_name(t), t->desc, bee__nparams(t));
  crypto_generichash(t->schema, sizeof t->schema, (const uint8_t *)schema,
                     strlen(schema), NULL, 0);
  /* State rounds: the optimizer and the mode decide the layout. */
  snprintf(schema, sizeof schema, "beed state fp32 %s %s %s %zu",
           bee_averaging_name(t->cfg->averaging), bee__optim_name(t), t->desc,
           t->state_len);
  crypto_generichash(t->state_schema, sizeof t->state_schema,
                     (const uint8_t *)schema, strlen(schema), NULL, 0);
  uint8_t self_id[PROTO_ID_BYTES];
  memcpy(self_id, t->id->id, sizeof self_id);
  avg_node_config nc = {.loop = t->loop,
                        .host = host,
                        .self_id = self_id,
                        .dht = {.ctx = t,
                                .declare = bee__match_declare,
                                .fetch = bee__match_fetch}};
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
  bee_run_start(t->run);
  if (t->cfg->checkpoint_dir[0]) {
    if ((rc = uv_thread_create(&t->ckpt_thread, bee__ckpt_writer, t))) {
      bee_err(COMP, "cannot start the checkpoint thread: %s", uv_strerror(rc));
      return rc;
    }
    t->ckpt_started = true;
  }
  if ((rc = proto_host_on(host, STATE_METHOD, bee__state_req_cb, t))) {
    bee_err(COMP, "cannot serve the state: %s", bee_strerror(rc));
    return rc;
  }
  if ((rc = bee__links_start(t))) {
    bee_err(COMP, "cannot serve link probes: %s", bee_strerror(rc));
    return rc;
  }
  if (t->eval_model) {
    if ((rc = uv_thread_create(&t->eval_thread, evaluator, t))) {
      bee_err(COMP, "cannot start the evaluation thread: %s", uv_strerror(rc));
      return rc;
    }
    t->eval_started = true;
  }
  uv_timer_start(&t->timer, bee__tick, TICK_MS, TICK_MS);
  return 0;
}

void bee_train_expect_join(bee_train *t) {
  if (t && t->run)
    bee_run_expect_join(t->run);
}

void bee_train_set_members(bee_train *t, const bee_members *members) {
  if (t)
    t->members = members;
}

static void host_port(const char *host, unsigned port,
                      char out[PROTO_ADDR_MAX]) {
  snprintf(out, PROTO_ADDR_MAX, strchr(host, ':') ? "[%s]:%u" : "%s:%u", host,
           port);
}

const char *bee_train_self_addr(const bee_train *t, char out[PROTO_ADDR_MAX]) {
  char ip[PROTO_IP_MAX];
  if (t->cfg->nannounce) {
    snprintf(out, PROTO_ADDR_MAX, "%s", t->cfg->announce[0]);
    return "--announce";
  }
  if (t->members && bee_members_seen_at(t->members, ip)) {
    host_port(ip, t->port, out);
    return "where its peers see it";
  }
  if (t->listen_host[0]) {
    host_port(t->listen_host, t->port, out);
    return "its --listen address";
  }
  host_port("127.0.0.1", t->port, out);
  return "loopback: no peer has said where it sees this bee yet";
}

void bee__self_addr(bee_train *t, char *out) {
  announce_loopback_check(t);
  const char *why = bee_train_self_addr(t, out);
  if (strcmp(out, t->addr_said) != 0) {
    memcpy(t->addr_said, out, PROTO_ADDR_MAX);
    bee_info(COMP, "peers are given the address %s (%s)", out, why);
  }
}

void bee_train_joined(bee_train *t) {
  if (t && t->run)
    bee_run_joined(t->run);
}

/* Stops the threads (the worker at its next batch, a round it waits for
 * abandoned) and puts the last state on disk.  Once. */
static void halt_threads(bee_train *t) {
  if (t->halted)
    return;
  t->halted = true;
  if (t->avg)
    bee_run_halt(t->run);
  if (t->started) {
    uv_mutex_lock(&t->mu);
    t->shared.stop = t->shared.eval_stop = true;
    uv_cond_signal(&t->eval_cv);
    uv_cond_signal(&t->avg_cv);
    uv_cond_signal(&t->go_cv);
    uint64_t epoch = t->shared.epoch, samples = t->shared.samples;
    uv_mutex_unlock(&t->mu);
    uv_thread_join(&t->thread); /* at most one batch or epoch step */
    if (t->ckpt_started) { /* the state after the last step, on disk */
      uv_mutex_lock(&t->mu);
      t->shared.ckpt_req = t->shared.ckpt_stop = true;
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
  proto_progress p;
  uint8_t buf[PROTO_RECORD_MAX];
  size_t len;
  uint64_t exp;
  bee_run_leave_record(t->run, &p, &exp);
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
  bee_run_stop(t->run);
  /* A round under way ends now (its callback sees BEE_ECANCELED); the
   * worker no longer waits for it.  A download's answer, if one still
   * comes, finds us stopped. */
  if (t->host)
    proto_host_on(t->host, STATE_METHOD, NULL, NULL);
  bee__links_stop(t);
  announce_cancel(t);
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
  trn_optim_free(t->optim);
  trn_optim_free(t->outer);
  free(t->anchor);
  free(t->dgrad);
  free(t->residual);
  free(t->state_buf);
  trn_model_free(t->model);
  trn_model_free(t->eval_model);
  for (size_t i = 0; i < t->uploads.n; i++)
    bee__snap_unref(t->uploads.u[i].pin);
  bee__snap_unref(t->shared.snap);
  free(t->shared.load);
  for (size_t i = 0; i < t->shared.nreplay; i++)
    free(t->shared.replay[i].buf);
  for (size_t i = 0; i < t->shared.nstep_log; i++)
    free(t->shared.step_log[i]);
  bee_run_free(t->run);
  trn_source_free(t->src);
  bee_local_free(t->ext);
  free(t->carry);
  free(t);
}

uint8_t *bee_train_last_state(bee_train *t, size_t *len, uint64_t *epoch) {
  if (!t || !t->handles)
    return NULL;
  uint8_t *b = NULL;
  uv_mutex_lock(&t->mu);
  const bee_snap *s = t->shared.snap;
  if (s && (b = malloc(s->len))) {
    memcpy(b, s->data, s->len);
    *len = s->len;
    *epoch = s->epoch;
  }
  uv_mutex_unlock(&t->mu);
  return b;
}

void bee_train_shed(bee_train *t) {
  if (!t || !t->stopped)
    return;
  bee_local_release(t->ext);
  uv_mutex_lock(&t->mu);
  bee__snap_unref(t->shared.snap);
  t->shared.snap = NULL;
  for (size_t i = 0; i < t->shared.nstep_log; i++)
    free(t->shared.step_log[i]);
  t->shared.nstep_log = 0;
  uv_mutex_unlock(&t->mu);
  for (size_t i = 0; i < t->uploads.n; i++)
    bee__snap_unref(t->uploads.u[i].pin);
  t->uploads.n = 0;
  free(t->state_buf);
  t->state_buf = NULL;
  free(t->anchor);
  t->anchor = NULL;
  free(t->residual);
  t->residual = NULL;
}
