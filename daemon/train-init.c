/* train-init.c: a bee's training made: the built-in trainer's data,
 * device, model and optimizer (build_model), or a trainer process's
 * model in the memory it shares (bee_train_new_local); then what the run
 * needs beside the model (train_init): DiLoCo's outer step, the buffers
 * of the options, the run core, the threads' locks, the state to start
 * from (a checkpoint with --resume, or the one a trainer before left),
 * the loader, and the run's lines in the log.
 */
#include "train-int.h"

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
             ilogbf(scale),
             trn_model_loss_scale(t->model, NULL) ? "fixed" : "off");
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
    bee_warn(COMP, "model %s on cuda:%d: %s; training on the CPU", cfg->model,
             mc.device_index, err);
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
       (rc = trn_optim_set_tensors(t->optim, ends,
                                   trn_model_tensors(t->model, ends, 256))))) {
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
  if (cfg->delay_averaging && !(t->dgrad = malloc(np * sizeof *t->dgrad)))
    return -ENOMEM;
  if (cfg->delay_averaging && t->ext &&
      !(t->dhold = malloc(np * sizeof *t->dhold)))
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
  uv_async_init(t->loop, &t->async, bee__async_cb);
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
      if ((rc = trn_order_init(&ord, items, id->id, PROTO_ID_BYTES, local[0],
                               local[1]))) {
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
      bee_info(COMP,
               "resuming from %s (epoch %llu; data pass %llu at "
               "%llu of %zu)",
               path, (unsigned long long)epoch, (unsigned long long)local[0],
               (unsigned long long)local[1], items);
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
