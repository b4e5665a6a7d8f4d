/* node.c: one DHT node: requests in, answers in, periodic work.
 *
 * Requests carry the sender's listen port and clock: a sender with a port
 * enters the routing table under the address its connection came from
 * (its id is the one the transport authenticated), a client (port 0)
 * never does, and a clock that differs from ours by more than
 * DHT_CLOCK_SKEW_S is warned about, since expirations depend on it.  A new
 * contact that is now one of the num_replicas nearest nodes to keys we
 * hold is handed those records.  The node's own records are republished
 * until they expire, every record it holds is copied to the key's nearest
 * nodes once per republish interval unless another holder did it first,
 * and buckets no lookup has touched for a while are refreshed with a
 * lookup of a random id in their range.
 */
#include "dht-int.h"

#include <errno.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPIRE_EVERY_MS 10000
#define REFRESH_CHECK_MS 60000
#define REFRESH_PARALLEL 2 /* refresh lookups at once */
#define REPLICATE_PARALLEL 8 /* replication lookups at once */
#define HANDOVER_MAX 256 /* records handed to one new contact at once */

void dht_config_default(dht_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->alpha = 3;
  cfg->replicas = 5;
  cfg->rpc_timeout_ms = 3000;
  cfg->stall_ms = 400;
  cfg->refresh_ms = 15 * 60 * 1000;
  cfg->republish_ms = 60 * 60 * 1000;
  cfg->storage_max = 64u << 20;
  cfg->keys_max = 65536;
  cfg->peer_stores_per_s = 200;
  cfg->lost_retry_ms = 60000;
}

char *dht__strdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *p = malloc(n);
  if (!p)
    abort(); /* small internal allocation */
  memcpy(p, s, n);
  return p;
}

/* Scratch messages and the encode buffer, per thread: the core runs on
 * one thread per set of nodes and is never re-entered while they are in
 * use (dht_io.send must not deliver synchronously). */
enum { S_SEND, S_REQ, S_ANS, S_IN, S_COUNT };
static _Thread_local proto_dht_msg *scratch_msgs[S_COUNT];
static _Thread_local uint8_t *scratch_buf;

static proto_dht_msg *scratch(int which) {
  if (!scratch_msgs[which] && !(scratch_msgs[which] = malloc(sizeof(proto_dht_msg))))
    abort();
  return scratch_msgs[which];
}

proto_dht_msg *dht__scratch(void) { return scratch(S_SEND); }

static uint8_t *encode_buf(void) {
  if (!scratch_buf && !(scratch_buf = malloc(DHT_ANSWER_MAX)))
    abort();
  return scratch_buf;
}

int dht_node_new(const dht_config *cfg, const dht_io *io, dht_node **out) {
  if (!cfg->id || !io->now_ms || !io->wall_s || !io->random || !io->send ||
      cfg->alpha == 0 || cfg->replicas == 0)
    return BEE_ECONFIG;
  dht_node *n = calloc(1, sizeof *n);
  if (!n)
    return -ENOMEM;
  n->cfg = *cfg;
  n->io = *io;
  memcpy(n->self, cfg->id->id, ID_BYTES);
  dht__table_init(&n->table, n->self);
  dht__store_init(&n->store);
  uint64_t now = dht__now(n);
  n->expire_ms = now + EXPIRE_EVERY_MS;
  n->refresh_ms = now + REFRESH_CHECK_MS;
  n->replicate_check_ms = now + REFRESH_CHECK_MS;
  n->io.random(n->io.ctx, &n->next_req, sizeof n->next_req);
  *out = n;
  return 0;
}

static void own_free(dht_own *o) {
  dht__rec_free(&o->rec);
  free(o);
}

void dht_node_free(dht_node *n) {
  if (!n)
    return;
  dht__lookups_free(n); /* gets, puts and the boot lookup: canceled */
  if (n->boot) {
    dht_boot *b = n->boot;
    dht_done_cb cb = b->cb;
    void *arg = b->arg;
    n->boot = NULL;
    for (size_t i = 0; i < b->naddrs; i++)
      free(b->addrs[i]);
    free(b->addrs);
    free(b);
    if (cb)
      cb(n, BEE_ECANCELED, &(dht_stats){0}, arg);
  }
  for (size_t i = 0; i < 64; i++)
    while (n->pend[i]) {
      dht_pending *p = n->pend[i];
      n->pend[i] = p->next;
      if (p->type == P_LOOKUP)
        dht__lookup_answer(p->op, p, BEE_ECANCELED, NULL);
      else if (p->type == P_STORE)
        dht__put_answer(n, p, BEE_ECANCELED, NULL);
      free(p->addr);
      free(p);
    }
  while (n->own) {
    dht_own *o = n->own;
    n->own = o->next;
    own_free(o);
  }
  dht__table_close(&n->table);
  dht__store_close(&n->store);
  free(n);
}

/* ---- sending ------------------------------------------------------------ */

void dht__request_init(dht_node *n, proto_dht_msg *m, int type) {
  /* Only what the encoder reads for this type; the struct is large. */
  m->type = type;
  m->port = n->cfg.port;
  m->now = dht__wall(n);
  m->want_value = m->found = false;
  m->observed = (proto_bytes){NULL, 0};
  m->nrecords = m->nresults = m->nnodes = 0;
}

static const char *method_of(int type) {
  switch (type) {
  case PROTO_T_DHT_PING: return DHT_METHOD_PING;
  case PROTO_T_DHT_STORE: return DHT_METHOD_STORE;
  default: return DHT_METHOD_FIND;
  }
}

int dht__send(dht_node *n, const uint8_t *id, const char *addr,
              const proto_dht_msg *m, int ptype, void *op) {
  uint8_t *buf = encode_buf();
  size_t len;
  int rc = proto_dht_encode(m, buf, DHT_ANSWER_MAX, &len);
  if (rc)
    return rc;
  dht_pending *p = calloc(1, sizeof *p);
  if (!p)
    return -ENOMEM;
  p->req = ++n->next_req;
  p->type = ptype;
  p->sent_ms = dht__now(n);
  p->op = op;
  p->addr = dht__strdup(addr);
  if (id) {
    memcpy(p->id, id, ID_BYTES);
    p->has_id = true;
  }
  rc = n->io.send(n->io.ctx, id, addr, method_of(m->type), buf, len,
                  n->cfg.rpc_timeout_ms, p->req);
  if (rc) {
    free(p->addr);
    free(p);
    return rc;
  }
  if (n->io.wake) /* the request may stall: tick by then */
    n->io.wake(n->io.ctx, n->cfg.stall_ms);
  p->next = n->pend[p->req % 64];
  n->pend[p->req % 64] = p;
  return 0;
}

void dht__store_to(dht_node *n, const uint8_t id[ID_BYTES], const char *addr,
                   const proto_dht_record *recs, size_t nrecs) {
  /* Batches stay well inside one frame. */
  size_t i = 0;
  while (i < nrecs) {
    proto_dht_msg *m = dht__scratch();
    dht__request_init(n, m, PROTO_T_DHT_STORE);
    size_t bytes = 0;
    while (i < nrecs && m->nrecords < PROTO_DHT_RECORDS_MAX &&
           bytes + recs[i].value.n < DHT_ANSWER_MAX / 2) {
      bytes += recs[i].value.n + recs[i].subkey.n + 128;
      m->records[m->nrecords++] = recs[i++];
    }
    if (m->nrecords == 0)
      break;
    dht__send(n, id, addr, m, P_CACHE, NULL);
  }
}

/* ---- contacts ----------------------------------------------------------- */

/* A new contact gets the records we hold whose keys it is now one of the
 * num_replicas nearest to, as far as our table knows (Kademlia 2.5): where
 * a put would place them today.  Not every key it is merely nearer to
 * than us: with churn that copies records far past their replicas. */
static void handover(dht_node *n, const uint8_t id[ID_BYTES], const char *addr) {
  static _Thread_local proto_dht_record recs[HANDOVER_MAX];
  const dht_contact *near[DHT_K];
  size_t want = n->cfg.replicas < DHT_K ? n->cfg.replicas : DHT_K;
  size_t k = 0;
  uint64_t now = dht__wall(n);
  dht_store *s = &n->store;
  for (size_t t = 0; t < s->tabsize && k < HANDOVER_MAX; t++)
    for (dht_entry *e = s->tab[t]; e && k < HANDOVER_MAX; e = e->next) {
      if (dht__cmp_dist(e->key, id, n->self) >= 0)
        continue;
      size_t m = dht__table_closest(&n->table, e->key, near, want);
      if (m == want && dht__cmp_dist(e->key, id, near[m - 1]->id) > 0)
        continue;
      k += dht__entry_view(e, now, &recs[k], HANDOVER_MAX - k);
    }
  if (k)
    dht__store_to(n, id, addr, recs, k);
}

void dht__seen(dht_node *n, const uint8_t id[ID_BYTES], const char *addr) {
  dht_bucket *evict;
  int fresh = dht__table_seen(&n->table, id, addr, dht__now(n), &evict);
  if (evict) {
    proto_dht_msg *m = dht__scratch();
    dht__request_init(n, m, PROTO_T_DHT_PING);
    if (dht__send(n, evict->c[0].id, evict->c[0].addr, m, P_PING_EVICT, NULL) == 0)
      evict->evict_req = n->next_req;
  }
  if (fresh)
    handover(n, id, addr);
}

void dht__failed(dht_node *n, const uint8_t id[ID_BYTES]) {
  dht__table_failed(&n->table, id, dht__now(n));
  dht__ban(&n->table, id, dht__now(n));
}

void dht_node_add_contact(dht_node *n, const uint8_t id[PROTO_ID_BYTES],
                          const char *addr) {
  dht__seen(n, id, addr);
}

static void clock_check(dht_node *n, const uint8_t id[ID_BYTES], uint64_t their,
                        uint64_t sent_ms) {
  uint64_t ours = dht__wall(n);
  uint64_t now = dht__now(n);
  uint64_t skew = dht__clock_skew(their, ours, now - sent_ms);
  if (skew <= DHT_CLOCK_SKEW_S || now < n->skew_warned_ms)
    return;
  n->skew_warned_ms = now + 60000; /* at most one line a minute */
  char hex[9];
  proto_hex(id, 4, hex);
  bee_warn(COMP, "peer %s's clock is %s ours by %llu s: record expirations "
           "will be off", hex, their > ours ? "ahead of" : "behind",
           (unsigned long long)skew);
}

/* ---- requests ----------------------------------------------------------- */

static int handle_store(dht_node *n, const uint8_t from[ID_BYTES],
                        const proto_dht_msg *req, proto_dht_msg *ans) {
  uint64_t now = dht__wall(n);
  bool allowed = dht__rate_take(n, from, req->nrecords, dht__now(n));
  ans->nresults = req->nrecords;
  for (size_t i = 0; i < req->nrecords; i++)
    ans->results[i] = allowed ? dht__store_put(n, &req->records[i], now) : BEE_ELIMIT;
  if (!allowed) {
    char hex[9];
    proto_hex(from, 4, hex);
    bee_warn(COMP, "peer %s stores too fast: %zu records refused", hex,
             req->nrecords);
  } else {
    /* Stale records are routine (replicas republish) and so are records
     * that expired on the way; anything else is worth a line, one per
     * request. */
    for (size_t i = 0; i < req->nrecords; i++)
      if (ans->results[i] != 0 && ans->results[i] != BEE_ESTALE &&
          ans->results[i] != BEE_EEXPIRED) {
        char hex[9];
        proto_hex(from, 4, hex);
        bee_warn(COMP, "peer %s: record refused: %s", hex,
                 bee_strerror(ans->results[i]));
        break;
      }
  }
  return 0;
}

static void handle_find(dht_node *n, const uint8_t from[ID_BYTES],
                        const proto_dht_msg *req, proto_dht_msg *ans) {
  if (req->want_value) {
    dht_entry *e = dht__store_find(&n->store, req->key);
    if (e) {
      ans->nrecords = dht__entry_view(e, dht__wall(n), ans->records,
                                      PROTO_DHT_RECORDS_MAX);
      ans->found = ans->nrecords > 0;
    }
  }
  /* A contact whose last request failed is not passed on: under churn it
   * is most likely gone, and naming it would send the asker a timeout. */
  const dht_contact *c[DHT_K + 8];
  size_t k = dht__table_closest(&n->table, req->key, c, DHT_K + 8);
  for (size_t i = 0; i < k && ans->nnodes < DHT_K; i++) {
    if (memcmp(c[i]->id, from, ID_BYTES) == 0 || c[i]->fails)
      continue; /* the asker knows itself; a suspect is not passed on */
    proto_dht_contact *o = &ans->nodes[ans->nnodes++];
    memcpy(o->id, c[i]->id, ID_BYTES);
    o->addr = (proto_bytes){(const uint8_t *)c[i]->addr, c[i]->addr_n};
  }
}

int dht_node_handle(dht_node *n, const uint8_t from_id[PROTO_ID_BYTES],
                    const char *from_ip, const char *method,
                    const uint8_t *payload, size_t len, uint8_t *out,
                    size_t cap, size_t *out_len) {
  proto_dht_msg *req = scratch(S_REQ), *ans = scratch(S_ANS);
  int rc = proto_dht_decode(payload, len, req);
  if (rc)
    return rc;
  int want = strcmp(method, DHT_METHOD_PING) == 0    ? PROTO_T_DHT_PING
             : strcmp(method, DHT_METHOD_STORE) == 0 ? PROTO_T_DHT_STORE
             : strcmp(method, DHT_METHOD_FIND) == 0  ? PROTO_T_DHT_FIND
                                                     : -1;
  if (req->type != want)
    return want < 0 ? BEE_ENOMETHOD : BEE_EUNKNOWN;
  char addr[PROTO_ADDR_MAX];
  if (req->port) { /* a server: it may enter our routing table */
    int w = strchr(from_ip, ':') ? snprintf(addr, sizeof addr, "[%s]:%u", from_ip, req->port)
                                 : snprintf(addr, sizeof addr, "%s:%u", from_ip, req->port);
    if (w > 0 && (size_t)w < sizeof addr)
      dht__seen(n, from_id, addr);
  }
  ans->type = req->type + 1;
  ans->now = dht__wall(n);
  ans->port = 0;
  ans->found = ans->want_value = false;
  ans->observed = (proto_bytes){NULL, 0};
  ans->nrecords = ans->nresults = ans->nnodes = 0;
  if (req->type == PROTO_T_DHT_PING)
    ans->observed = (proto_bytes){(const uint8_t *)from_ip, strlen(from_ip)};
  else if (req->type == PROTO_T_DHT_STORE)
    handle_store(n, from_id, req, ans);
  else
    handle_find(n, from_id, req, ans);
  return proto_dht_encode(ans, out, cap, out_len);
}

/* ---- answers ------------------------------------------------------------ */

static dht_pending *pending_take(dht_node *n, uint64_t req) {
  for (dht_pending **pp = &n->pend[req % 64]; *pp; pp = &(*pp)->next)
    if ((*pp)->req == req) {
      dht_pending *p = *pp;
      *pp = p->next;
      return p;
    }
  return NULL;
}

/* ---- lost contacts ------------------------------------------------------ */

/* Pings the addresses of lost contacts that are due, any id accepted (a
 * node that came back there under a new key joins us as well); returns
 * the ms until the next is due. */
static uint64_t lost_tick(dht_node *n, uint64_t now) {
  dht_table *t = &n->table;
  uint64_t until = UINT64_MAX;
  if (!n->cfg.lost_retry_ms)
    return until;
  for (size_t i = t->nlost; i-- > 0;) {
    dht_lost *l = &t->lost[i];
    if (l->asking)
      continue;
    if (now - l->lost_ms >= DHT_LOST_KEEP_MS) {
      dht__lost_remove(t, i);
      continue;
    }
    if (now < l->retry_ms) {
      if (l->retry_ms - now < until)
        until = l->retry_ms - now;
      continue;
    }
    proto_dht_msg *m = dht__scratch();
    dht__request_init(n, m, PROTO_T_DHT_PING);
    l->asking = dht__send(n, NULL, l->addr, m, P_PING_LOST, NULL) == 0;
    l->backoff_ms = l->backoff_ms * 2 > n->cfg.lost_retry_ms
                        ? n->cfg.lost_retry_ms
                        : l->backoff_ms * 2;
    l->retry_ms = now + l->backoff_ms;
    if (!l->asking && l->backoff_ms < until)
      until = l->backoff_ms;
  }
  return until;
}

/* The answer to a ping of a lost contact's address.  An answer put the
 * node there back in the table (dht__seen), which ended its lost entry
 * if it has the id we lost; a new id there ends the old entry too. */
static void lost_answer(dht_node *n, const char *addr, int status) {
  dht_table *t = &n->table;
  if (status == 0 || status == BEE_ESELF) { /* back, or now our own */
    dht__lost_drop(t, NULL, addr);
    return;
  }
  for (size_t i = 0; i < t->nlost; i++)
    if (strcmp(t->lost[i].addr, addr) == 0)
      t->lost[i].asking = false;
}

void dht_node_answer(dht_node *n, uint64_t req, int status,
                     const uint8_t *from_id, const uint8_t *payload,
                     size_t len) {
  dht_pending *p = pending_take(n, req);
  if (!p)
    return; /* not ours, or already given up */
  proto_dht_msg *m = NULL;
  static const int expect[] = {
      [P_LOOKUP] = PROTO_T_DHT_FOUND, [P_STORE] = PROTO_T_DHT_STORED,
      [P_PING_BOOT] = PROTO_T_DHT_PONG, [P_PING_EVICT] = PROTO_T_DHT_PONG,
      [P_CACHE] = PROTO_T_DHT_STORED, [P_PING_LOST] = PROTO_T_DHT_PONG};
  if (status == 0) {
    m = scratch(S_IN);
    if (!from_id || (p->has_id && memcmp(from_id, p->id, ID_BYTES) != 0))
      status = BEE_ETOKEN_PEER; /* another node answers at that address */
    else if (memcmp(from_id, n->self, ID_BYTES) == 0)
      status = BEE_ESELF; /* a bootstrap address that is our own */
    else if (proto_dht_decode(payload, len, m) != 0 || m->type != expect[p->type])
      status = BEE_ETYPE;
  }
  if (status == 0) {
    clock_check(n, from_id, m->now, p->sent_ms);
    dht__unban(&n->table, from_id);
    dht__seen(n, from_id, p->addr);
  } else if (p->has_id) {
    dht__failed(n, p->id);
    m = NULL;
  } else {
    m = NULL;
  }
  if (p->type == P_PING_EVICT && p->has_id) {
    dht_bucket *b = dht__bucket_for(&n->table, p->id);
    if (b->evict_req == req)
      b->evict_req = 0;
  }
  switch (p->type) {
  case P_LOOKUP:
    dht__lookup_answer(p->op, p, status, m);
    break;
  case P_STORE:
    dht__put_answer(n, p, status, m);
    break;
  case P_PING_BOOT:
    dht__boot_answer(n, p, status, from_id);
    break;
  case P_PING_LOST:
    lost_answer(n, p->addr, status);
    break;
  default:
    break;
  }
  free(p->addr);
  free(p);
}

/* ---- periodic work ------------------------------------------------------ */

static void republish(dht_node *n, uint64_t now) {
  uint64_t wall = dht__wall(n);
  for (dht_own **pp = &n->own; *pp;) {
    dht_own *o = *pp;
    if (o->rec.expiration <= wall) {
      *pp = o->next;
      own_free(o);
      continue;
    }
    if (now >= o->due_ms) {
      uint64_t left_ms = (o->rec.expiration - wall) * 1000;
      o->due_ms = now + (left_ms / 2 < n->cfg.republish_ms ? left_ms / 2
                                                            : n->cfg.republish_ms);
      dht__put_start(n, o->key, &o->rec, NULL, NULL);
    }
    pp = &o->next;
  }
}

/* ---- replication -------------------------------------------------------- *
 * Every holder of a record copies it to the key's nearest nodes once per
 * republish interval (Kademlia 2.5), so a record outlives its owner and
 * the replicas it first went to: under churn they leave, and a new node
 * near the key learns the record only if someone hands it over.  A store
 * of the key pushes a holder's turn back, so in a quiet interval one
 * holder (the first whose jittered turn comes) copies, and the others,
 * having just received its store, skip theirs. */

void dht__replicate_later(dht_node *n, dht_entry *e, uint64_t now_s) {
  uint32_t r;
  uint64_t base = n->cfg.republish_ms / 1000;
  n->io.random(n->io.ctx, &r, sizeof r);
  e->replicate_s = now_s + base + r % (base / 2 + 1);
}

static void replicate_done(dht_lookup *l, int status) {
  static _Thread_local proto_dht_record recs[DHT_SUBKEYS_MAX];
  dht_node *n = l->n;
  n->replicating--;
  if (status)
    return; /* canceled: the node is closing */
  dht_entry *e = dht__store_find(&n->store, l->target);
  if (!e)
    return; /* expired meanwhile */
  size_t k = dht__entry_view(e, dht__wall(n), recs, DHT_SUBKEYS_MAX);
  unsigned sent = 0;
  for (size_t i = 0; k && i < l->nc && sent < n->cfg.replicas; i++)
    if (l->c[i].state == C_DONE) {
      dht__store_to(n, l->c[i].id, l->c[i].addr, recs, k);
      sent++;
    }
}

/* Looks for entries whose turn has come once a minute, and starts at most
 * REPLICATE_PARALLEL copies at a time; the rest wait for the next look. */
static void replicate(dht_node *n, uint64_t now) {
  if (now < n->replicate_check_ms || !n->cfg.port)
    return; /* a client holds nothing for others */
  n->replicate_check_ms = now + REFRESH_CHECK_MS;
  uint64_t wall = dht__wall(n);
  dht_store *s = &n->store;
  for (size_t t = 0; t < s->tabsize; t++)
    for (dht_entry *e = s->tab[t]; e; e = e->next) {
      if (n->replicating >= REPLICATE_PARALLEL)
        return;
      if (e->replicate_s > wall)
        continue;
      dht__replicate_later(n, e, wall);
      dht_lookup *l = dht__lookup_start(n, e->key, LK_NODES);
      if (!l)
        return;
      l->done = replicate_done;
      n->replicating++;
      dht__lookup_begin(l);
    }
}

static void refresh_done(dht_lookup *l, int status) {
  dht_node *n = l->n;
  n->refreshing--;
  if (status == BEE_ECANCELED)
    return; /* the node is closing */
  n->refresh_ms = dht__now(n); /* the next due bucket, at the next tick */
  if (n->io.wake)
    n->io.wake(n->io.ctx, 0);
}

/* Buckets no lookup or contact has touched for refresh_ms, and those
 * marked after joining, are refreshed with a lookup of a random id in
 * their range, at most REFRESH_PARALLEL at a time: a node that has just
 * joined, or whose buckets all went quiet together, sends no burst.  A
 * refreshed bucket counts as touched up to a quarter interval early, so
 * buckets touched together drift apart. */
static void refresh(dht_node *n, uint64_t now) {
  for (size_t i = 0; i < n->table.nb && n->refreshing < REFRESH_PARALLEL; i++) {
    dht_bucket *b = n->table.b[i];
    if (!b->due && now - b->touched_ms < n->cfg.refresh_ms)
      continue; /* empty ones too: a range we know no one in */
    uint8_t rnd[ID_BYTES], target[ID_BYTES];
    uint32_t jitter;
    n->io.random(n->io.ctx, rnd, sizeof rnd);
    n->io.random(n->io.ctx, &jitter, sizeof jitter);
    dht__bucket_random_id(b, rnd, target);
    dht_lookup *l = dht__lookup_start(n, target, LK_NODES);
    b->due = false;
    b->touched_ms = now - jitter % (n->cfg.refresh_ms / 4 + 1);
    if (!l)
      continue;
    l->done = refresh_done;
    n->refreshing++;
    dht__lookup_begin(l);
  }
}

void dht__refresh_far(dht_node *n) {
  dht_bucket *own = dht__bucket_for(&n->table, n->self);
  for (size_t i = 0; i < n->table.nb; i++)
    n->table.b[i]->due = n->table.b[i] != own;
  n->refresh_ms = dht__now(n);
  if (n->io.wake)
    n->io.wake(n->io.ctx, 0);
}

uint64_t dht_node_tick(dht_node *n) {
  uint64_t now = dht__now(n);
  if (now >= n->expire_ms) {
    dht__store_expire(&n->store, dht__wall(n));
    n->expire_ms = now + EXPIRE_EVERY_MS;
  }
  if (now >= n->refresh_ms) {
    refresh(n, now);
    n->refresh_ms = now + REFRESH_CHECK_MS;
  }
  dht__lookup_deferred(n);
  republish(n, now);
  replicate(n, now);
  dht__boot_tick(n, now);
  uint64_t lost = lost_tick(n, now);
  uint64_t next = dht__lookup_stalls(n, now);
  if (lost < next)
    next = lost;
  uint64_t until = n->expire_ms - now;
  if (n->refresh_ms - now < until)
    until = n->refresh_ms - now;
  if (n->cfg.port && n->replicate_check_ms > now &&
      n->replicate_check_ms - now < until)
    until = n->replicate_check_ms - now;
  for (dht_own *o = n->own; o; o = o->next)
    if (o->due_ms > now && o->due_ms - now < until)
      until = o->due_ms - now;
  if (n->boot && !n->boot->looking && n->boot->waiting == 0)
    until = n->boot->retry_ms > now ? n->boot->retry_ms - now : 0;
  for (dht_lookup *l = n->lookups; l; l = l->next)
    if (l->finish_due)
      until = 0; /* a lookup waits to be finished */
  return next < until ? next : until;
}

/* ---- operations --------------------------------------------------------- */

int dht_get(dht_node *n, const uint8_t key[PROTO_DHT_KEY_BYTES], bool latest,
            dht_get_cb cb, void *arg) {
  int kind = latest ? LK_LATEST : LK_VALUE;
  dht_waiter *w = calloc(1, sizeof *w);
  if (!w)
    return -ENOMEM;
  w->cb = cb;
  w->arg = arg;
  w->start_ms = dht__now(n);
  for (dht_lookup *l = n->lookups; l; l = l->next)
    if (l->kind == kind && memcmp(l->target, key, ID_BYTES) == 0) {
      w->next = l->waiters; /* merged into the running lookup */
      l->waiters = w;
      return 0;
    }
  dht_lookup *l = dht__lookup_start(n, key, kind);
  if (!l) {
    free(w);
    return -ENOMEM;
  }
  /* What we hold ourselves counts as found. */
  dht_entry *e = dht__store_find(&n->store, key);
  if (e) {
    proto_dht_record *views = malloc(e->n * sizeof *views);
    size_t k = views ? dht__entry_view(e, dht__wall(n), views, e->n) : 0;
    for (size_t i = 0; i < k; i++)
      dht__lookup_merge(l, &views[i]);
    free(views);
  }
  l->waiters = w;
  dht__lookup_begin(l);
  return 0;
}

void dht_owned_subkey(const dht_node *n, uint8_t out[PROTO_DHT_OWNED_SUBKEY_BYTES]) {
  out[0] = PROTO_DHT_OWNER_TAG;
  memcpy(out + 1, n->cfg.id->pk, PROTO_PK_BYTES);
}

void dht_key(const char *name, uint8_t key[PROTO_DHT_KEY_BYTES]) {
  proto_dht_key(name, key);
}

int dht_put(dht_node *n, const uint8_t key[PROTO_DHT_KEY_BYTES],
            proto_bytes subkey, proto_bytes value, uint64_t expiration,
            dht_put_cb cb, void *arg) {
  if (subkey.n > PROTO_DHT_SUBKEY_MAX || value.n > PROTO_DHT_VALUE_MAX)
    return BEE_ETOOBIG;
  uint64_t wall = dht__wall(n);
  if (expiration <= wall || expiration > wall + DHT_TTL_MAX_S)
    return BEE_ERANGE;
  proto_dht_record r = {.subkey = subkey, .value = value,
                        .expiration = expiration};
  memcpy(r.key, key, PROTO_DHT_KEY_BYTES);
  const uint8_t *owner;
  if (subkey.n && subkey.p[0] == PROTO_DHT_OWNER_TAG) {
    if (!proto_dht_subkey_owner(subkey, &owner) ||
        memcmp(owner, n->cfg.id->pk, PROTO_PK_BYTES) != 0)
      return BEE_EAUTH; /* only our own owned subkey */
    proto_dht_record_sign(&r, n->cfg.id);
  }
  /* Remember it for republishing, replacing an older one. */
  dht_own *o = NULL;
  for (dht_own *x = n->own; x; x = x->next)
    if (memcmp(x->key, key, PROTO_DHT_KEY_BYTES) == 0 &&
        x->rec.subkey_n == subkey.n &&
        (subkey.n == 0 || memcmp(x->rec.subkey, subkey.p, subkey.n) == 0))
      o = x;
  if (!o) {
    if (!(o = calloc(1, sizeof *o)))
      return -ENOMEM;
    memcpy(o->key, key, PROTO_DHT_KEY_BYTES);
    o->next = n->own;
    n->own = o;
  } else {
    dht__rec_free(&o->rec);
  }
  if (dht__rec_copy(&o->rec, &r) != 0) {
    for (dht_own **pp = &n->own; *pp; pp = &(*pp)->next)
      if (*pp == o) {
        *pp = o->next;
        break;
      }
    free(o);
    return -ENOMEM;
  }
  uint64_t now = dht__now(n), left_ms = (expiration - wall) * 1000;
  o->due_ms = now + (left_ms / 2 < n->cfg.republish_ms ? left_ms / 2
                                                        : n->cfg.republish_ms);
  return dht__put_start(n, key, &o->rec, cb, arg);
}

/* ---- inspection --------------------------------------------------------- */

void dht_node_info(const dht_node *n, dht_info *info) {
  memset(info, 0, sizeof *info);
  info->contacts = n->table.ncontacts;
  info->buckets = n->table.nb;
  info->keys = n->store.keys;
  info->records = n->store.records;
  info->bytes = n->store.bytes;
  for (const dht_lookup *l = n->lookups; l; l = l->next)
    info->lookups++;
  uint64_t now = dht__now(n);
  for (size_t i = 0; i < n->table.nbans; i++)
    info->blacklisted += now < n->table.bans[i].until_ms;
  info->lost = n->table.nlost;
}

void dht_node_foreach_contact(const dht_node *n,
                              void (*fn)(const uint8_t id[PROTO_ID_BYTES],
                                         const char *addr, void *arg),
                              void *arg) {
  for (size_t i = n->table.nb; i-- > 0;)
    for (size_t j = 0; j < n->table.b[i]->n; j++)
      fn(n->table.b[i]->c[j].id, n->table.b[i]->c[j].addr, arg);
}

int dht_node_local_get(dht_node *n, const uint8_t key[PROTO_DHT_KEY_BYTES],
                       dht_value *v) {
  static _Thread_local proto_dht_record views[DHT_SUBKEYS_MAX];
  dht_entry *e = dht__store_find(&n->store, key);
  v->n = e ? dht__entry_view(e, dht__wall(n), views, DHT_SUBKEYS_MAX) : 0;
  v->records = views;
  return v->n ? 0 : -ENOENT;
}
