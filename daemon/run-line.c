/* run-line.c: lines of parameters and the split check of the run core
 * (run-int.h's bee_lines).
 *
 * Every step goes out as a metrics record under "<run>_metrics" for the
 * monitor (loss, samples/s, times, bytes, the group, the gradient noise
 * scale's inputs, the parameters' hash) with the hashes of this bee's
 * last averaged steps before it.  A bee in line reads its peers' metrics
 * now and then: a peer that averaged in a group at a step this bee
 * averaged too and came out with other parameters is on another line
 * (two groups formed for one epoch, or two parts of a swarm that trained
 * apart).  The line of the larger group goes on, then of more peers, then
 * the lower hash (bee_split_loser); a bee of another is marked out of
 * line.  A bee out of line reads the metrics to find the peers that hold
 * the swarm's state (resync), and loads it from them.
 */
#include "run-int.h"

void bee__lines_init(bee_lines *l, const bee_config *cfg,
                     const bee_run_io *io) {
  memset(l, 0, sizeof *l);
  l->cfg = cfg;
  l->io = io;
}

void bee__lines_close(bee_lines *l) { l->n = 0; }

void bee__lines_publish(bee_lines *l, const bee_run_step *r, double rate) {
  proto_metrics m = {.step = r->epoch,
                     .has_loss = r->samples > 0,
                     .loss = r->loss,
                     .samples_per_second = rate,
                     .compute_s = r->compute_s,
                     .averaging_s = r->averaging_s,
                     .bytes_sent = r->bytes_sent,
                     .bytes_received = r->bytes_recv,
                     .group_size = r->avg_status == 0 ? r->group : 1,
                     .grad_sq_local = r->grad_sq_local,
                     .batch_local = r->samples,
                     .grad_sq_avg = r->grad_sq_avg,
                     .batch_avg = r->batch_avg,
                     .time_ms = l->io->unix_ms(l->io->ctx),
                     .has_by_all = true,
                     .by_all = r->avg_status == 0 ? r->by_all : 0,
                     .diverged = r->diverged,
                     .has_params = true,
                     .has_loss_scale = r->loss_scale > 0,
                     .loss_scale = r->loss_scale,
                     .dropped = r->skipped};
  memcpy(m.params, r->hash, sizeof m.params);
  /* The lines before this step, newest first: a peer that looks after
   * this bee has moved on still counts it at those steps (the split
   * check). */
  size_t have = l->n < LINES_RING ? l->n : LINES_RING;
  for (size_t i = 0;
       i < have && m.nlines < PROTO_METRICS_LINES_MAX && !r->diverged; i++) {
    const bee_line *b = &l->ring[(l->n - 1 - i) % LINES_RING];
    if (b->epoch >= r->epoch)
      continue;
    proto_metrics_line *o = &m.lines[m.nlines++];
    o->step = b->epoch;
    o->group_size = b->group;
    memcpy(o->params, b->hash, sizeof o->params);
  }
  if (r->avg_status == 0 && r->group >= 2 && !r->diverged) {
    bee_line *b = &l->ring[l->n++ % LINES_RING];
    b->epoch = r->epoch;
    b->group = r->group;
    memcpy(b->hash, r->hash, sizeof b->hash);
  }
  snprintf(m.run, sizeof m.run, "%s", l->cfg->run);
  uint64_t exp = m.time_ms / 1000 + METRICS_TTL_S;
  if (exp <= l->metrics_exp)
    exp = l->metrics_exp + 1; /* the DHT keeps only a later one */
  /* A record that does not encode (a NaN loss, say) is not worth one. */
  if (l->io->put_metrics(l->io->ctx, &m, exp) == 0)
    l->metrics_exp = exp;
}

void bee__lines_other_layout(bee_lines *l, const uint8_t id[PROTO_ID_BYTES]) {
  for (size_t i = 0; i < l->nlayout_warned; i++)
    if (memcmp(l->layout_warned[i], id, PROTO_ID_BYTES) == 0)
      return;
  if (l->nlayout_warned < LAYOUT_WARNED_MAX)
    memcpy(l->layout_warned[l->nlayout_warned++], id, PROTO_ID_BYTES);
  char id8[9];
  bee_id8(id, id8);
  bee_warn(COMP,
           "%s trains run '%s' with another model, averaging mode, "
           "optimizer or compression: it is never in a group with this bee",
           id8, l->cfg->run);
}

void bee__lines_check(bee_lines *l, bool diverged, bool grouped, uint64_t peers,
                      uint64_t now_ms, uint64_t every_ms) {
  if (l->resync_busy || now_ms - l->resync_ms < every_ms)
    return;
  if (!diverged) {
    l->nsplit = 0; /* back in line: any donor again */
    if (grouped)
      return;
    /* Every peer reads every peer's metrics: in a larger run less often,
     * so that the reads of the key grow with the run's size, not with
     * its square. */
    uint64_t split_every =
        SPLIT_MS * (1 + (peers ? peers - 1 : 0) / SPLIT_PEERS_STEP);
    if (l->n && !l->split_busy && now_ms - l->split_ms >= split_every) {
      l->split_ms = now_ms;
      if (l->io->get_metrics(l->io->ctx, BEE_RUN_METRICS_SPLIT) == 0)
        l->split_busy = true;
    }
    return;
  }
  l->n = 0; /* the steps before the load are no line of the swarm's */
  l->resync_ms = now_ms;
  if (l->io->get_metrics(l->io->ctx, BEE_RUN_METRICS_RESYNC) == 0)
    l->resync_busy = true;
}

bool bee__lines_split(bee_lines *l, const proto_metrics *v,
                      const uint8_t (*ids)[PROTO_ID_BYTES], size_t n,
                      uint64_t *epoch) {
  if (n == 0)
    return false;
  /* Each peer's last step and the averaged steps before it that its
   * record carries: a peer that moved on since a split still counts
   * there (with its last step only, the bees of both lines once loaded
   * each other's: tools/chaos). */
  bee_line *seen = malloc(n * (1 + PROTO_METRICS_LINES_MAX) * sizeof *seen);
  if (!seen)
    return false; /* asked again in SPLIT_MS */
  size_t nseen = 0;
  for (size_t i = 0; i < n; i++) {
    const proto_metrics *m = &v[i];
    if (strcmp(m->run, l->cfg->run) != 0 || !m->has_params || m->diverged)
      continue;
    if (m->group_size >= 2) {
      seen[nseen].epoch = m->step;
      seen[nseen].group = m->group_size;
      memcpy(seen[nseen].hash, m->params, sizeof m->params);
      nseen++;
    }
    for (size_t j = 0; j < m->nlines; j++) {
      seen[nseen].epoch = m->lines[j].step;
      seen[nseen].group = m->lines[j].group_size;
      memcpy(seen[nseen].hash, m->lines[j].params, sizeof m->lines[j].params);
      nseen++;
    }
  }
  bee_line won;
  size_t have = l->n < LINES_RING ? l->n : LINES_RING;
  const bee_line *lost = bee_split_loser(l->ring, have, seen, nseen, &won);
  free(seen);
  if (!lost)
    return false; /* no split, or ours is the line that goes on */
  bee_line ours = *lost;
  l->nsplit = 0;
  for (size_t i = 0; i < n && l->nsplit < DONORS_MAX; i++) {
    const proto_metrics *m = &v[i];
    if (strcmp(m->run, l->cfg->run) != 0 || !m->has_params || m->diverged)
      continue;
    bool holds = m->step == ours.epoch &&
                 memcmp(m->params, won.hash, sizeof won.hash) == 0;
    for (size_t j = 0; j < m->nlines && !holds; j++)
      holds = m->lines[j].step == ours.epoch &&
              memcmp(m->lines[j].params, won.hash, sizeof won.hash) == 0;
    if (holds)
      memcpy(l->split_ids[l->nsplit++], ids[i], PROTO_ID_BYTES);
  }
  char a[17], b[17];
  proto_hex(ours.hash, sizeof ours.hash, a);
  proto_hex(won.hash, sizeof won.hash, b);
  bee_warn(COMP,
           "epoch %llu: the swarm split: %zu peers stepped to parameters %s "
           "in a group of %llu, this bee to %s in a group of %llu; it loads "
           "theirs",
           (unsigned long long)ours.epoch, l->nsplit, b,
           (unsigned long long)won.group, a, (unsigned long long)ours.group);
  l->n = 0;
  l->splits++;
  *epoch = ours.epoch;
  return true;
}

bool bee__lines_orphaned(const bee_lines *l, const proto_metrics *v,
                         const uint8_t (*ids)[PROTO_ID_BYTES], size_t n,
                         uint64_t view_epoch,
                         const uint8_t self[PROTO_ID_BYTES], size_t *others) {
  *others = 0;
  bool lowest = true;
  for (size_t i = 0; i < n; i++) {
    const proto_metrics *m = &v[i];
    /* Another run's, a gone peer's, or this bee's own. */
    if (strcmp(m->run, l->cfg->run) != 0 ||
        (view_epoch > ORPHAN_EPOCHS && m->step < view_epoch - ORPHAN_EPOCHS) ||
        memcmp(ids[i], self, PROTO_ID_BYTES) == 0)
      continue;
    bool other = false; /* never in a group with us: no line of ours */
    for (size_t j = 0; j < l->nlayout_warned; j++)
      other |= memcmp(l->layout_warned[j], ids[i], PROTO_ID_BYTES) == 0;
    if (other)
      continue;
    if (!m->diverged)
      return false; /* a peer in line: its state is the one to load */
    (*others)++;
    lowest &= memcmp(self, ids[i], PROTO_ID_BYTES) < 0;
  }
  /* Records not seen yet are no verdict: none seen, none decided. */
  return *others > 0 && lowest;
}

size_t bee__lines_resync(bee_lines *l, const proto_metrics *v,
                         const uint8_t (*ids)[PROTO_ID_BYTES], size_t n,
                         uint64_t from, const bee_view *view,
                         uint8_t out[DONORS_MAX][PROTO_ID_BYTES]) {
  size_t k = 0;
  for (size_t i = 0; i < n && k < DONORS_MAX; i++) {
    const proto_metrics *m = &v[i];
    if (strcmp(m->run, l->cfg->run) != 0 || m->step < from ||
        m->group_size < 2 || !m->has_by_all || m->by_all < 1.0 || m->diverged)
      continue;
    bool other = false; /* its rounds are never ours (other layout) */
    for (size_t j = 0; j < l->nlayout_warned; j++)
      other |= memcmp(l->layout_warned[j], ids[i], PROTO_ID_BYTES) == 0;
    bool won = l->nsplit == 0; /* after a split: one of the line that won */
    for (size_t j = 0; j < l->nsplit; j++)
      won |= memcmp(l->split_ids[j], ids[i], PROTO_ID_BYTES) == 0;
    other |= !won;
    for (size_t j = 0; !other && j < view->ndonors; j++)
      if (memcmp(view->donors[j], ids[i], PROTO_ID_BYTES) == 0)
        memcpy(out[k++], ids[i], PROTO_ID_BYTES);
  }
  return k;
}
