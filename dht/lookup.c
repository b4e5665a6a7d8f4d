/* lookup.c: iterative lookups, puts and bootstrap.
 *
 * A lookup keeps a shortlist of candidates sorted by distance to its
 * target, seeded from the routing table, and keeps `alpha` requests in
 * flight to the closest ones it has not asked yet, among the k closest it
 * has not seen fail.  It ends when those k have all answered (or, for a
 * plain get, as soon as one holds a live value).  A request slower than
 * `stall_ms` stops counting against alpha, so one dead peer never holds a
 * lookup up for the whole RPC timeout: the next candidate is asked at
 * once, and the slow answer is still used if it comes.
 *
 * A finished lookup stays allocated, off the node's list, until the
 * answers still in flight for it have arrived.
 */
#include "dht-int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static void cand_free(dht_cand *c) {
  free(c->addr);
  c->addr = NULL;
}

static dht_cand *cand_find(dht_lookup *l, const uint8_t id[ID_BYTES]) {
  for (size_t i = 0; i < l->nc; i++)
    if (memcmp(l->c[i].id, id, ID_BYTES) == 0)
      return &l->c[i];
  return NULL;
}

/* Adds a candidate in distance order; the farthest falls off a full list. */
static void cand_add(dht_lookup *l, const uint8_t id[ID_BYTES],
                     const char *addr, unsigned hop) {
  dht_node *n = l->n;
  if (memcmp(id, n->self, ID_BYTES) == 0 || cand_find(l, id) ||
      dht__banned(&n->table, id, dht__now(n)))
    return;
  size_t at = l->nc;
  while (at > 0 && dht__cmp_dist(l->target, id, l->c[at - 1].id) < 0)
    at--;
  if (at == DHT_SHORTLIST_MAX)
    return;
  if (l->nc == DHT_SHORTLIST_MAX) { /* an answer for it is dropped */
    if (l->c[l->nc - 1].state == C_INFLIGHT)
      l->active--;
    cand_free(&l->c[--l->nc]);
  }
  memmove(&l->c[at + 1], &l->c[at], (l->nc - at) * sizeof *l->c);
  dht_cand *c = &l->c[at];
  memset(c, 0, sizeof *c);
  memcpy(c->id, id, ID_BYTES);
  c->addr = dht__strdup(addr);
  c->hop = (uint8_t)(hop > 255 ? 255 : hop);
  l->nc++;
}

dht_lookup *dht__lookup_start(dht_node *n, const uint8_t target[ID_BYTES],
                              int kind) {
  dht_lookup *l = calloc(1, sizeof *l);
  if (!l)
    return NULL;
  l->n = n;
  memcpy(l->target, target, ID_BYTES);
  l->kind = kind;
  l->start_ms = dht__now(n);
  const dht_contact *seed[DHT_K];
  size_t k = dht__table_closest(&n->table, target, seed, DHT_K);
  for (size_t i = 0; i < k; i++)
    cand_add(l, seed[i]->id, seed[i]->addr, 0);
  dht__bucket_for(&n->table, target)->touched_ms = l->start_ms;
  l->next = n->lookups;
  n->lookups = l;
  return l;
}

static void lookup_unlink(dht_lookup *l) {
  for (dht_lookup **pp = &l->n->lookups; *pp; pp = &(*pp)->next)
    if (*pp == l) {
      *pp = l->next;
      return;
    }
}

static void lookup_free(dht_lookup *l) {
  for (size_t i = 0; i < l->nc; i++)
    cand_free(&l->c[i]);
  for (size_t i = 0; i < l->nfound; i++)
    dht__rec_free(&l->found[i]);
  free(l->found);
  while (l->waiters) {
    dht_waiter *w = l->waiters;
    l->waiters = w->next;
    free(w);
  }
  free(l);
}

void dht__lookup_merge(dht_lookup *l, const proto_dht_record *r) {
  for (size_t i = 0; i < l->nfound; i++) {
    dht_rec *f = &l->found[i];
    if (f->subkey_n != r->subkey.n ||
        (r->subkey.n && memcmp(f->subkey, r->subkey.p, r->subkey.n) != 0))
      continue;
    if (r->expiration > f->expiration) {
      dht_rec copy;
      if (dht__rec_copy(&copy, r) == 0) {
        dht__rec_free(f);
        *f = copy;
      }
    }
    return;
  }
  if (l->nfound == DHT_SUBKEYS_MAX)
    return;
  if (l->nfound == l->capfound) {
    size_t cap = l->capfound ? 2 * l->capfound : 4;
    dht_rec *v = realloc(l->found, cap * sizeof *v);
    if (!v)
      return;
    l->found = v;
    l->capfound = cap;
  }
  if (dht__rec_copy(&l->found[l->nfound], r) == 0)
    l->nfound++;
}

/* The longest chain of requests behind the result. */
static unsigned rounds(const dht_lookup *l) {
  if (l->kind == LK_VALUE && l->nfound)
    return l->found_hop + 1;
  unsigned r = 0, seen = 0;
  for (size_t i = 0; i < l->nc && seen < DHT_K; i++) {
    if (l->c[i].state == C_FAILED || l->c[i].state == C_STALLED)
      continue;
    seen++;
    if (l->c[i].state == C_DONE && l->c[i].hop + 1u > r)
      r = l->c[i].hop + 1u;
  }
  return r;
}

/* Stores what a plain get found on the closest node that answered without
 * it, so the next get of a hot key stops sooner. */
static void cache(dht_lookup *l) {
  for (size_t i = 0; i < l->nc; i++) {
    const dht_cand *c = &l->c[i];
    if (c->state != C_DONE || c->had_value)
      continue;
    proto_dht_record *views = malloc(l->nfound * sizeof *views);
    if (!views)
      return;
    for (size_t j = 0; j < l->nfound; j++)
      dht__rec_view(&l->found[j], l->target, &views[j]);
    dht__store_to(l->n, c->id, c->addr, views, l->nfound);
    free(views);
    return;
  }
}

static void finish(dht_lookup *l) {
  dht_node *n = l->n;
  if (l->starting) { /* the caller of dht_get & co. has not returned */
    l->finish_due = true;
    return;
  }
  l->finished = true;
  lookup_unlink(l);
  l->st.rounds = rounds(l);
  l->st.ms = dht__now(n) - l->start_ms;
  if (l->kind == LK_NODES) {
    if (l->done)
      l->done(l, 0);
  } else {
    if (l->kind == LK_VALUE && l->nfound)
      cache(l);
    static _Thread_local proto_dht_record views[DHT_SUBKEYS_MAX];
    for (size_t i = 0; i < l->nfound; i++)
      dht__rec_view(&l->found[i], l->target, &views[i]);
    dht_value v = {l->nfound, views};
    while (l->waiters) {
      dht_waiter *w = l->waiters;
      l->waiters = w->next;
      dht_stats st = l->st;
      st.ms = dht__now(n) - w->start_ms;
      w->cb(n, l->nfound ? 0 : -ENOENT, &v, &st, w->arg);
      free(w);
    }
  }
  if (l->pending == 0)
    lookup_free(l);
}

static int send_find(dht_lookup *l, dht_cand *c) {
  dht_node *n = l->n;
  proto_dht_msg *m = dht__scratch();
  dht__request_init(n, m, PROTO_T_DHT_FIND);
  memcpy(m->key, l->target, ID_BYTES);
  m->want_value = l->kind != LK_NODES;
  return dht__send(n, c->id, c->addr, m, P_LOOKUP, l);
}

void dht__lookup_begin(dht_lookup *l) {
  l->starting = true;
  dht__lookup_step(l);
  l->starting = false;
  if (l->finish_due && l->n->io.wake) /* finish it on the very next tick */
    l->n->io.wake(l->n->io.ctx, 0);
}

void dht__lookup_deferred(dht_node *n) {
  for (dht_lookup *l = n->lookups, *nx; l; l = nx) {
    nx = l->next;
    if (l->finish_due) {
      l->finish_due = false;
      finish(l); /* unlinks l; nx stays valid */
    }
  }
}

void dht__lookup_step(dht_lookup *l) {
  dht_node *n = l->n;
  if (l->finished || l->finish_due)
    return;
  if (l->kind == LK_VALUE && l->nfound) {
    finish(l);
    return;
  }
  /* Ask the closest unasked among the k closest that have neither failed
   * nor stalled (a stalled one rejoins the window if it answers). */
  size_t seen = 0, stalled = 0;
  bool all_done = true;
  for (size_t i = 0; i < l->nc && seen < DHT_K; i++) {
    dht_cand *c = &l->c[i];
    stalled += c->state == C_STALLED;
    if (c->state == C_FAILED || c->state == C_STALLED)
      continue;
    seen++;
    if (c->state != C_DONE)
      all_done = false;
    if (c->state != C_NEW || l->active >= n->cfg.alpha)
      continue;
    int rc = send_find(l, c);
    if (rc != 0) {
      char hex[9];
      proto_hex(c->id, 4, hex);
      bee_debug(COMP, "lookup: cannot ask %s at %s: %s", hex, c->addr,
                bee_strerror(rc));
      c->state = C_FAILED;
      l->st.failures++;
      i = (size_t)-1, seen = stalled = 0, all_done = true; /* the window moved */
      continue;
    }
    c->state = C_INFLIGHT;
    c->sent_ms = dht__now(n);
    l->active++;
    l->pending++;
    l->st.requests++;
  }
  /* A get does not end empty, nor a get of the latest value at all, while
   * a slow request to a node inside the window may still bring the value:
   * under load the replicas are the ones slow to answer.  A dead node
   * costs the RPC timeout once; it is blacklisted then. */
  if (all_done && stalled && l->kind != LK_NODES &&
      (l->kind == LK_LATEST || l->nfound == 0))
    all_done = false;
  /* The k closest have answered, or nothing is left to ask or wait for. */
  if (all_done || l->pending == 0)
    finish(l);
}

void dht__lookup_answer(dht_lookup *l, dht_pending *p, int status,
                        const proto_dht_msg *m) {
  dht_node *n = l->n;
  dht_cand *c = cand_find(l, p->id);
  l->pending--;
  if (c && c->state == C_INFLIGHT)
    l->active--;
  if (l->finished) {
    if (l->pending == 0)
      lookup_free(l);
    return;
  }
  if (status || !m || m->type != PROTO_T_DHT_FOUND) {
    if (c)
      c->state = C_FAILED;
    l->st.failures++;
  } else if (c) {
    unsigned hop = c->hop;
    c->state = C_DONE;
    if (m->found && l->kind != LK_NODES) {
      uint64_t now = dht__wall(n);
      for (size_t i = 0; i < m->nrecords; i++) {
        const proto_dht_record *r = &m->records[i];
        if (memcmp(r->key, l->target, ID_BYTES) != 0 ||
            dht__record_check(n, r, now) != 0)
          continue; /* a forged or stale record is not a value */
        if (!c->had_value && (l->nfound == 0 || hop < l->found_hop))
          l->found_hop = hop;
        c->had_value = true;
        dht__lookup_merge(l, r);
      }
    }
    for (size_t i = 0; i < m->nnodes; i++) {
      char addr[PROTO_ADDR_MAX];
      size_t an = m->nodes[i].addr.n < PROTO_ADDR_MAX - 1 ? m->nodes[i].addr.n
                                                           : PROTO_ADDR_MAX - 1;
      memcpy(addr, m->nodes[i].addr.p, an);
      addr[an] = 0;
      cand_add(l, m->nodes[i].id, addr, hop + 1);
    }
  }
  dht__lookup_step(l);
}

uint64_t dht__lookup_stalls(dht_node *n, uint64_t now) {
  uint64_t next = UINT64_MAX;
  for (dht_lookup *l = n->lookups, *nx; l; l = nx) {
    nx = l->next;
    bool moved = false;
    for (size_t i = 0; i < l->nc; i++) {
      dht_cand *c = &l->c[i];
      if (c->state != C_INFLIGHT)
        continue;
      uint64_t due = c->sent_ms + n->cfg.stall_ms;
      if (now >= due) {
        c->state = C_STALLED;
        l->active--;
        moved = true;
      } else if (due - now < next) {
        next = due - now;
      }
    }
    if (moved)
      dht__lookup_step(l); /* may finish (and unlink) l */
  }
  return next;
}

void dht__lookups_free(dht_node *n) {
  while (n->lookups) {
    dht_lookup *l = n->lookups;
    n->lookups = l->next;
    while (l->waiters) { /* the node is going away */
      dht_waiter *w = l->waiters;
      l->waiters = w->next;
      w->cb(n, BEE_ECANCELED, NULL, &l->st, w->arg);
      free(w);
    }
    if (l->done)
      l->done(l, BEE_ECANCELED);
    l->finished = true;
    if (l->pending == 0)
      lookup_free(l);
    /* else freed with the pending answers that still point at it */
  }
}

/* ---- puts --------------------------------------------------------------- */

static void put_finish(dht_node *n, dht_put_op *op) {
  op->st.ms = dht__now(n) - op->start_ms;
  if (op->cb)
    op->cb(n, op->stored ? 0 : op->first_error ? op->first_error : -EHOSTUNREACH,
           op->stored, &op->st, op->arg);
  dht__rec_free(&op->rec);
  free(op);
}

/* The closest nodes are known: store there, and here if we are among them. */
static void put_after_lookup(dht_lookup *l, int status) {
  dht_node *n = l->n;
  dht_put_op *op = l->op;
  op->st = l->st;
  op->st.rounds++;
  if (status) {
    op->first_error = status;
    put_finish(n, op);
    return;
  }
  proto_dht_record view;
  dht__rec_view(&op->rec, op->key, &view);
  unsigned sent = 0;
  const dht_cand *last = NULL;
  for (size_t i = 0; i < l->nc && sent < n->cfg.replicas; i++) {
    const dht_cand *c = &l->c[i];
    if (c->state != C_DONE)
      continue;
    proto_dht_msg *m = dht__scratch();
    dht__request_init(n, m, PROTO_T_DHT_STORE);
    m->records[0] = view;
    m->nrecords = 1;
    if (dht__send(n, c->id, c->addr, m, P_STORE, op) == 0) {
      op->waiting++;
      op->st.requests++;
    }
    sent++;
    last = c;
  }
  /* Nodes nearer than the farthest replica that were too slow to answer
   * the lookup are likely alive and loaded: they get a copy too, without
   * holding the put up, so gets that reach them find it. */
  for (size_t i = 0; last && i < l->nc; i++) {
    const dht_cand *c = &l->c[i];
    if (c == last)
      break;
    if (c->state == C_STALLED)
      dht__store_to(n, c->id, c->addr, &view, 1);
  }
  /* Keep a copy here too if we are closer than the farthest replica; a
   * client keeps none, since no one would ask it. */
  if (n->cfg.port &&
      (sent < n->cfg.replicas || dht__cmp_dist(op->key, n->self, last->id) < 0)) {
    int rc = dht__store_put(n, &view, dht__wall(n));
    if (rc == 0)
      op->stored++;
    else if (!op->first_error)
      op->first_error = rc;
  }
  if (op->waiting == 0)
    put_finish(n, op);
}

void dht__put_answer(dht_node *n, dht_pending *p, int status,
                     const proto_dht_msg *m) {
  dht_put_op *op = p->op;
  int rc = status ? status
           : !m || m->type != PROTO_T_DHT_STORED || m->nresults < 1 ? BEE_ETYPE
                                                                   : m->results[0];
  if (rc == 0)
    op->stored++;
  else if (!op->first_error)
    op->first_error = rc;
  if (status)
    op->st.failures++;
  if (--op->waiting == 0)
    put_finish(n, op);
}

int dht__put_start(dht_node *n, const uint8_t key[PROTO_DHT_KEY_BYTES],
                   const dht_rec *rec, dht_put_cb cb, void *arg) {
  dht_put_op *op = calloc(1, sizeof *op);
  if (!op)
    return -ENOMEM;
  proto_dht_record view;
  dht__rec_view(rec, key, &view);
  if (dht__rec_copy(&op->rec, &view) != 0) {
    free(op);
    return -ENOMEM;
  }
  memcpy(op->key, key, PROTO_DHT_KEY_BYTES);
  op->cb = cb;
  op->arg = arg;
  op->start_ms = dht__now(n);
  dht_lookup *l = dht__lookup_start(n, key, LK_NODES);
  if (!l) {
    dht__rec_free(&op->rec);
    free(op);
    return -ENOMEM;
  }
  l->done = put_after_lookup;
  l->op = op;
  dht__lookup_begin(l);
  return 0;
}

/* ---- bootstrap ---------------------------------------------------------- */

static void boot_free(dht_node *n, dht_boot *b) {
  for (size_t i = 0; i < b->naddrs; i++)
    free(b->addrs[i]);
  free(b->addrs);
  free(b);
  if (n->boot == b)
    n->boot = NULL;
}

static void boot_after_lookup(dht_lookup *l, int status) {
  dht_node *n = l->n;
  dht_boot *b = l->op;
  if (status == 0)
    dht__refresh_far(n);
  dht_stats st = l->st;
  st.ms = dht__now(n) - b->start_ms;
  dht_done_cb cb = b->cb;
  void *arg = b->arg;
  boot_free(n, b);
  if (cb)
    cb(n, status, &st, arg);
}

static void boot_ping_all(dht_node *n, dht_boot *b) {
  b->tries++;
  for (size_t i = 0; i < b->naddrs; i++) {
    proto_dht_msg *m = dht__scratch();
    dht__request_init(n, m, PROTO_T_DHT_PING);
    int rc = dht__send(n, NULL, b->addrs[i], m, P_PING_BOOT, b);
    if (rc)
      bee_log(b->tries == 1 ? BEE_LOG_WARN : BEE_LOG_DEBUG, COMP,
              "bootstrap: %s: %s", b->addrs[i], bee_strerror(rc));
    else
      b->waiting++;
  }
  if (b->waiting == 0)
    b->retry_ms = dht__now(n) + b->backoff_ms;
}

int dht_bootstrap(dht_node *n, const char *const *addrs, size_t naddrs,
                  dht_done_cb cb, void *arg) {
  if (n->boot)
    return -EALREADY;
  if (naddrs == 0)
    return -EINVAL;
  dht_boot *b = calloc(1, sizeof *b);
  if (!b || !(b->addrs = calloc(naddrs, sizeof *b->addrs))) {
    free(b);
    return -ENOMEM;
  }
  for (size_t i = 0; i < naddrs; i++)
    b->addrs[i] = dht__strdup(addrs[i]);
  b->naddrs = naddrs;
  b->cb = cb;
  b->arg = arg;
  b->backoff_ms = 1000;
  b->start_ms = dht__now(n);
  n->boot = b;
  boot_ping_all(n, b);
  return 0;
}

void dht__boot_answer(dht_node *n, dht_pending *p, int status,
                      const uint8_t *from_id) {
  dht_boot *b = p->op;
  (void)from_id;
  /* A dead address is named at the first try; later rounds only say that
   * none answered (a restarted bee may hold many dead known peers). */
  if (status)
    bee_log(b->tries == 1 ? BEE_LOG_WARN : BEE_LOG_DEBUG, COMP,
            "bootstrap: %s did not answer: %s", p->addr, bee_strerror(status));
  else
    b->answered++;
  if (--b->waiting > 0)
    return;
  if (b->answered == 0 && n->table.ncontacts > 0) {
    /* None of the addresses, but others reached us meanwhile (a queen
     * whose known peers of an earlier run are gone): that is a DHT to
     * be in, and the lookup through them ends the bootstrap. */
    bee_info(COMP, "bootstrap: no address answered, but %zu node%s reached "
             "this one; joining through them", n->table.ncontacts,
             n->table.ncontacts == 1 ? "" : "s");
  } else if (b->answered == 0) {
    bee_warn(COMP, "bootstrap: no peer answered; retrying in %llu s",
             (unsigned long long)(b->backoff_ms / 1000));
    b->retry_ms = dht__now(n) + b->backoff_ms;
    b->backoff_ms = b->backoff_ms * 2 > 60000 ? 60000 : b->backoff_ms * 2;
    return;
  }
  dht_lookup *l = dht__lookup_start(n, n->self, LK_NODES);
  if (!l) {
    b->retry_ms = dht__now(n) + b->backoff_ms;
    return;
  }
  b->looking = true;
  l->done = boot_after_lookup;
  l->op = b;
  dht__lookup_begin(l);
}

void dht__boot_tick(dht_node *n, uint64_t now) {
  dht_boot *b = n->boot;
  if (b && !b->looking && b->waiting == 0 && now >= b->retry_ms) {
    b->answered = 0;
    boot_ping_all(n, b);
  }
}
