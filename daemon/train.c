/* train.c: the bee's own training, and its run's progress in the DHT
 * (this file: the threads, the epoch step, start and stop; train-init.c,
 * train-swarm.c, train-state.c and train-links.c hold the rest,
 * train-int.h says what goes where).
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
    /* A delayed round's mean steps while the next epoch's gradients add
     * up in the same buffer: they wait aside, and come back after it. */
    bool hold = g == t->dgrad && t->dhold;
    float *gb = t->ext->grads;
    if (hold)
      memcpy(t->dhold, gb, np * sizeof(float));
    if (g != gb)
      memcpy(gb, g, np * sizeof(float));
    rc = bee_local_step(t->ext, epoch, true, worker_stopped, t);
    if (hold)
      memcpy(gb, t->dhold, np * sizeof(float));
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

/* The swarm's steps after a state (replay_steps), then clean gradients
 * for a trainer process (the steps went through them, after the batch it
 * sent first), and with them its count: the samples and batches that
 * are no longer in them.  Nonzero: the worker ends (failed, said to the
 * loop, or stopped). */
static int replay_or_end(bee_train *t) {
  int rr = replay_steps(t);
  if (rr < 0)
    worker_fail(t, rr, "the swarm's steps");
  else if (rr == 0 && t->ext) {
    zero_grads(t);
    t->ext_batches = 0;
    uv_mutex_lock(&t->mu);
    t->shared.samples = 0;
    t->shared.loss_sum = 0;
    t->shared.compute_s = 0;
    uv_mutex_unlock(&t->mu);
  }
  return rr;
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
    float inv = !t->ext          ? 1.0f / ((float)s.n * (float)t->per_sample)
                : t->ext_batches ? 1.0f / (float)t->ext_batches
                                 : 0.0f;
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
                       .mode = PROTO_LOCAL_GRADIENTS,
                       .delayed = t->dgrad != NULL};
  snprintf(w.compression, sizeof w.compression, "%s",
           avg_codec_name(t->cfg->compression));
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
      /* A trainer process waits for its WELCOME: it takes the swarm's
       * steps (its optimizer's) once it has the state and the turn
       * again, after its first batch, which they overwrite. */
      t->replay_later = t->ext && !t->ext->welcomed;
      if (!t->replay_later && replay_or_end(t))
        return;
      continue;
    }
    if (t->replay_later && t->ext->welcomed && t->ext->owe) {
      t->replay_later = false;
      if (replay_or_end(t))
        return;
      continue;
    }
    uv_mutex_lock(&t->mu);
    bool stop = t->shared.stop;
    bool step = bee_run_step_due(t->cfg, &t->shared.guide, t->shared.epoch,
                                 t->shared.samples, mono_ms());
    uv_mutex_unlock(&t->mu);
    if (t->ext && !t->ext->welcomed)
      step = false; /* a step is the trainer's: its WELCOME comes first */
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
    /* DiLoCo: a local step (a trainer process takes its own). */
    if (rc == 0 && t->outer && !dropped && !t->ext) {
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
void bee__async_cb(uv_async_t *h) {
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
  free(t->dhold);
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
