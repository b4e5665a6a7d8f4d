/* match.c: forming an averaging group through the DHT, as a socket-free
 * core.
 *
 * Every peer that wants to average in a round declares itself under the
 * group key "<run>.avg.<round>.<bits>" with the time it wants to start as
 * the record's expiration.  The declarations are totally ordered by
 * (expiration, peer id).  A peer asks the earliest declared peer before
 * itself to lead it (JOIN); a leader takes followers until the group has
 * target_size members or its own start comes with at least min_size, then
 * sends BEGIN with a random group id and the member list.  A peer that is
 * refused asks the next one; one that nobody takes leads, or looks again
 * with a later start.
 *
 * Why it cannot deadlock or split a peer: a JOIN only ever goes to a peer
 * earlier in the order (a later one is told YOU_LEAD), so the waits form
 * no cycle; a peer asks one leader at a time, answers JOINs as a leader
 * only while it follows nobody (else NOT_A_LEADER, naming its leader), and
 * never begins its own group while a JOIN of its own is unanswered (the
 * answer could make it someone's follower).  When a leader with followers
 * is taken by another leader, it sends them LEAVE MOVED with the new
 * leader, and they ask that one.  Every wait has a timeout: a JOIN's
 * answer request_timeout_ms, a follower's BEGIN the leader's start plus
 * twice that, the whole search deadline_ms.  docs/AVERAGING.md, section 8.
 *
 * With end_when_formed a peer also learns early that its round went on
 * without it.  A peer with nobody left to ask asks the later declared
 * peers too (a probe: a JOIN that a looking peer answers "you lead"),
 * and the search ends (BEE_EMISSED) once every live declaration of the
 * key has refused it, one of them at least because its group had formed
 * (it began, or it was full), none because it looks and will come.
 *
 * The core sends, declares and reads the DHT only through avg_match_io,
 * and keeps time with its clocks, so tests run hundreds of peers in one
 * process on a fake clock.
 */
#include "averager-int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#define DECLS_MAX 4096 /* declarations kept from one read of the key */
#define TRIED_MAX 256  /* refusals remembered per search */
/* A declared start further ahead than this is refused (BAD_EXPIRATION):
 * no peer plans a round an hour ahead, and the order must not be gamed by
 * a start far in the future. */
#define FUTURE_MAX_S 3600
#define PROBES_MAX 8 /* probes out at once */

enum { ST_IDLE, ST_LOOKING, ST_FOLLOWING, ST_DONE };

typedef struct follower {
  uint8_t id[PROTO_ID_BYTES];
  proto_group_member info;
} follower;

typedef struct tried {
  uint8_t id[PROTO_ID_BYTES];
  uint64_t expiration; /* the declaration refused: a new one may be asked */
} tried;

/* A JOIN to a later declared peer, to learn whether it looks. */
typedef struct probe {
  uint8_t id[PROTO_ID_BYTES];
  uint64_t expiration; /* its declaration */
  uint64_t nonce;
  uint64_t until; /* monotonic ms: its answer */
} probe;

struct avg_match {
  avg_match_config cfg;
  avg_match_io io;
  avg_match_cb cb;
  void *arg;
  int state;
  uint64_t t0;         /* monotonic ms at start */
  uint64_t expiration; /* our declared start, unix s; UINT64_MAX: CLIENT */
  uint64_t next_fetch; /* monotonic ms */
  /* The leader we ask or follow. */
  bool asking;
  uint64_t nonce;
  uint64_t ask_until; /* monotonic ms: the JOIN's answer */
  uint8_t leader[PROTO_ID_BYTES];
  char leader_addr[PROTO_ADDR_MAX];
  uint64_t leader_exp;   /* its declared start, 0: not known */
  uint64_t follow_until; /* monotonic ms: its BEGIN */
  /* A leader to ask next, named by a refusal or a LEAVE MOVED. */
  bool has_hint;
  uint8_t hint[PROTO_ID_BYTES];
  char hint_addr[PROTO_ADDR_MAX];
  /* Ours, while we lead. */
  follower *fol; /* (fol_cap) */
  size_t nfol, fol_cap;
  proto_group_member *members; /* (max_size) a BEGIN's, decoded; made at
                                  the first BEGIN */
  int depth;                   /* calls into the core under way */
  bool freeing;                /* avg_match_free came during one */
  /* The last read of the key, sorted by (expiration, id). */
  avg_decl *decls;
  size_t ndecls;
  tried tried[TRIED_MAX];
  size_t ntried, tried_next;
  probe probes[PROBES_MAX]; /* end_when_formed: out now */
  size_t nprobes;
  bool coming; /* a peer answered "you lead": it looks, and comes */
  avg_match_stats stats;
  char self_name[16];
};

/* ---- small helpers ----------------------------------------------------- */

static uint64_t now(const avg_match *m) { return m->io.now_ms(m->io.ctx); }
static uint64_t unix_s(const avg_match *m) {
  return m->io.unix_ms(m->io.ctx) / 1000;
}

/* The first 6 bytes of an id in hex, for log lines. */
static const char *short_id(const uint8_t id[PROTO_ID_BYTES], char out[16]) {
  proto_hex(id, 6, out);
  return out;
}

static int order_cmp(uint64_t exp_a, const uint8_t *id_a, uint64_t exp_b,
                     const uint8_t *id_b) {
  if (exp_a != exp_b)
    return exp_a < exp_b ? -1 : 1;
  return memcmp(id_a, id_b, PROTO_ID_BYTES);
}

static int decl_cmp(const void *a, const void *b) {
  const avg_decl *x = a, *y = b;
  return order_cmp(x->expiration, x->id, y->expiration, y->id);
}

static bool same_id(const uint8_t *a, const uint8_t *b) {
  return memcmp(a, b, PROTO_ID_BYTES) == 0;
}

static const avg_decl *decl_find(const avg_match *m, const uint8_t *id) {
  for (size_t i = 0; i < m->ndecls; i++)
    if (same_id(m->decls[i].id, id))
      return &m->decls[i];
  return NULL;
}

static bool was_tried(const avg_match *m, const uint8_t *id, uint64_t exp) {
  for (size_t i = 0; i < m->ntried; i++)
    if (same_id(m->tried[i].id, id) && m->tried[i].expiration == exp)
      return true;
  return false;
}

static void mark_tried(avg_match *m, const uint8_t *id, uint64_t exp) {
  if (was_tried(m, id, exp))
    return;
  tried *t = &m->tried[m->tried_next];
  memcpy(t->id, id, PROTO_ID_BYTES);
  t->expiration = exp;
  m->tried_next = (m->tried_next + 1) % TRIED_MAX;
  if (m->ntried < TRIED_MAX)
    m->ntried++;
}

/* Whether info (a JOIN's or a declaration's) is for our key and layout. */
static int key_check(const avg_match *m, const proto_match *info) {
  const proto_match *me = &m->cfg.info;
  if (strcmp(info->run, me->run) != 0 || info->round != me->round ||
      strcmp(info->bits, me->bits) != 0)
    return PROTO_JOIN_BAD_KEY;
  if (memcmp(info->schema_hash, me->schema_hash, PROTO_SCHEMA_HASH_BYTES))
    return PROTO_JOIN_BAD_SCHEMA;
  return PROTO_JOIN_ACCEPTED;
}

static void member_of(const uint8_t *id, const proto_match *info,
                      proto_group_member *g) {
  memset(g, 0, sizeof *g);
  memcpy(g->id, id, PROTO_ID_BYTES);
  memcpy(g->addr, info->addr, sizeof g->addr);
  g->mode = info->mode;
  g->bandwidth_mbit = info->bandwidth_mbit;
  g->weight = info->weight;
}

/* ---- sending ----------------------------------------------------------- */

static int send_msg(avg_match *m, const uint8_t *id, const char *addr,
                    const proto_group_msg *msg) {
  uint8_t small[1024], *buf = small;
  size_t cap = proto_group_encoded_max(msg), len;
  if (cap > sizeof small && !(buf = malloc(cap)))
    return -ENOMEM;
  int rc = proto_group_encode(msg, buf, cap, &len);
  if (rc == 0) {
    rc = m->io.send(m->io.ctx, id, addr, buf, len);
    m->stats.msgs_sent++;
  }
  if (buf != small)
    free(buf);
  return rc;
}

static void send_reply(avg_match *m, const uint8_t *to, const char *addr,
                       uint64_t nonce, uint32_t code) {
  proto_group_msg r = {.type = PROTO_T_AVG_REPLY, .nonce = nonce, .code = code};
  if (code == PROTO_JOIN_NOT_A_LEADER) {
    r.has_leader = true;
    memcpy(r.leader, m->leader, PROTO_ID_BYTES);
    memcpy(r.leader_addr, m->leader_addr, sizeof r.leader_addr);
  }
  send_msg(m, to, addr, &r);
}

static void send_leave(avg_match *m, const uint8_t *to, const char *addr,
                       uint32_t code) {
  proto_group_msg l = {.type = PROTO_T_AVG_LEAVE, .code = code};
  if (code == PROTO_LEAVE_MOVED) {
    l.has_leader = true;
    memcpy(l.leader, m->leader, PROTO_ID_BYTES);
    memcpy(l.leader_addr, m->leader_addr, sizeof l.leader_addr);
  }
  send_msg(m, to, addr, &l);
}

/* Lets every follower go with code (MOVED: to our new leader). */
static void release_followers(avg_match *m, uint32_t code) {
  for (size_t i = 0; i < m->nfol; i++)
    send_leave(m, m->fol[i].id, m->fol[i].info.addr, code);
  m->nfol = 0;
}

/* ---- the end ----------------------------------------------------------- */

static void finish(avg_match *m, int status, const avg_group *g) {
  m->state = ST_DONE;
  m->stats.ms = now(m) - m->t0;
  if (m->cb)
    m->cb(m, status, g, m->arg);
}

static int member_cmp(const void *a, const void *b) {
  const proto_group_member *x = a, *y = b;
  return memcmp(x->id, y->id, PROTO_ID_BYTES);
}

/* We lead, and the group is complete: BEGIN to every follower. */
static void begin(avg_match *m) {
  size_t n = m->nfol + 1;
  proto_group_member *v = calloc(n, sizeof *v);
  if (!v) {
    release_followers(m, PROTO_LEAVE_GONE);
    finish(m, -ENOMEM, NULL);
    return;
  }
  /* The leader first, then the followers by id: the round's order. */
  member_of(m->cfg.self_id, &m->cfg.info, &v[0]);
  for (size_t i = 0; i < m->nfol; i++)
    v[i + 1] = m->fol[i].info;
  qsort(v + 1, m->nfol, sizeof *v, member_cmp);
  proto_group_msg b = {.type = PROTO_T_AVG_BEGIN,
                       .round = m->cfg.info.round,
                       .nmembers = n,
                       .members = v};
  m->io.random(m->io.ctx, b.group, sizeof b.group);
  /* One encoding for every follower: a group of hundreds would otherwise
   * encode its member list hundreds of times. */
  size_t cap = proto_group_encoded_max(&b), len;
  uint8_t *buf = malloc(cap);
  if (buf && proto_group_encode(&b, buf, cap, &len) == 0)
    for (size_t i = 1; i < n; i++) {
      m->io.send(m->io.ctx, v[i].id, v[i].addr, buf, len);
      m->stats.msgs_sent++;
    }
  free(buf);
  avg_group g = {.nmembers = n, .self = 0, .members = v};
  memcpy(g.id, b.group, sizeof g.id);
  memcpy(g.leader, m->cfg.self_id, PROTO_ID_BYTES);
  char gid[33];
  proto_hex(g.id, 8, gid);
  bee_info("match", "%s: leading group %s of %zu (%" PRIu64 " ms)",
           m->self_name, gid, n, now(m) - m->t0);
  m->nfol = 0;
  finish(m, 0, &g);
  free(v);
}

/* ---- looking ----------------------------------------------------------- */

/* Declares us (again) with a start matchmaking_ms from now (the first
 * time first_start_ms when later), and reads the key.  A CLIENT declares
 * nothing: nobody could dial it to follow it. */
static void declare(avg_match *m) {
  uint64_t after = m->cfg.matchmaking_ms;
  if (m->stats.declarations == 0 && m->cfg.first_start_ms > after)
    after = m->cfg.first_start_ms;
  uint64_t ms = m->io.unix_ms(m->io.ctx) + after;
  if (m->cfg.info.mode == PROTO_MODE_CLIENT) {
    m->expiration = UINT64_MAX;
  } else {
    m->expiration = (ms + 999) / 1000;
    m->io.declare(m->io.ctx, &m->cfg.info, m->expiration);
    m->stats.declarations++;
  }
  m->io.fetch(m->io.ctx);
  m->next_fetch = now(m) + m->cfg.fetch_interval_ms;
}

/* The leader to ask next: a hint, else the earliest declaration before
 * ours that has not refused us and has not started yet. */
static bool pick_leader(avg_match *m, uint8_t *id, char *addr, uint64_t *exp) {
  uint64_t t = unix_s(m);
  if (m->has_hint) {
    m->has_hint = false;
    const avg_decl *d = decl_find(m, m->hint);
    uint64_t e = d ? d->expiration : 0;
    if (!same_id(m->hint, m->cfg.self_id) && !was_tried(m, m->hint, e)) {
      memcpy(id, m->hint, PROTO_ID_BYTES);
      memcpy(addr, m->hint_addr, PROTO_ADDR_MAX);
      *exp = e;
      return true;
    }
  }
  for (size_t i = 0; i < m->ndecls; i++) {
    const avg_decl *d = &m->decls[i];
    if (order_cmp(d->expiration, d->id, m->expiration, m->cfg.self_id) >= 0)
      break; /* sorted: the rest come after us */
    if (d->expiration <= t || was_tried(m, d->id, d->expiration))
      continue;
    memcpy(id, d->id, PROTO_ID_BYTES);
    memcpy(addr, d->info.addr, PROTO_ADDR_MAX);
    *exp = d->expiration;
    return true;
  }
  return false;
}

/* The probe out to id (with nonce, when by_nonce); SIZE_MAX: none. */
static size_t probe_find(const avg_match *m, const uint8_t *id, uint64_t nonce,
                         bool by_nonce) {
  for (size_t i = 0; i < m->nprobes; i++)
    if (same_id(m->probes[i].id, id) &&
        (!by_nonce || m->probes[i].nonce == nonce))
      return i;
  return SIZE_MAX;
}

static void probe_drop(avg_match *m, size_t k) {
  m->probes[k] = m->probes[--m->nprobes];
}

/* end_when_formed, with nobody left to ask and nobody following us: a
 * JOIN to each later declared peer that has not answered yet.  A peer
 * that looks answers "you lead" (and comes: its JOIN goes to the
 * earliest); one whose group formed, "not looking". */
static void probe_later(avg_match *m) {
  if (!m->cfg.end_when_formed || m->coming || m->nfol ||
      m->expiration == UINT64_MAX)
    return;
  uint64_t t = unix_s(m);
  for (size_t i = 0; i < m->ndecls && m->nprobes < PROBES_MAX; i++) {
    const avg_decl *d = &m->decls[i];
    if (order_cmp(d->expiration, d->id, m->expiration, m->cfg.self_id) < 0 ||
        d->expiration <= t || was_tried(m, d->id, d->expiration) ||
        probe_find(m, d->id, 0, false) != SIZE_MAX)
      continue;
    proto_group_msg j = {.type = PROTO_T_AVG_JOIN,
                         .nonce = ++m->nonce,
                         .expiration = m->expiration,
                         .info = m->cfg.info};
    m->stats.probes++;
    if (send_msg(m, d->id, d->info.addr, &j) != 0) {
      mark_tried(m, d->id, d->expiration);
      continue;
    }
    probe *p = &m->probes[m->nprobes++];
    memcpy(p->id, d->id, PROTO_ID_BYTES);
    p->expiration = d->expiration;
    p->nonce = j.nonce;
    p->until = now(m) + m->cfg.request_timeout_ms;
  }
}

/* end_when_formed: the search ends when every live declaration of the key
 * has refused us, one at least as formed, none as looking, and the peers
 * declared are as many as we expect (one that has not declared yet may
 * still lead us).  A declaration whose start has passed counts as a
 * refusal: that peer began, or declares again and is read anew. */
static void end_if_missed(avg_match *m) {
  if (!m->cfg.end_when_formed || m->state != ST_LOOKING || m->asking ||
      m->nfol || m->nprobes || m->coming || m->stats.refused_formed == 0)
    return;
  uint64_t t = unix_s(m);
  size_t peers = 0;
  for (size_t i = 0; i < m->ndecls; i++) {
    const avg_decl *d = &m->decls[i];
    /* Untried and live: it may still lead us, or follow us. */
    if (d->expiration > t && !was_tried(m, d->id, d->expiration))
      return;
    bool again = false; /* another declaration of the same peer */
    for (size_t j = 0; j < i && !again; j++)
      again = same_id(m->decls[j].id, d->id);
    peers += !again;
  }
  if (peers + 1 < m->cfg.target_size)
    return;
  bee_info("match",
           "%s: a group of the round formed without it, and no peer looks "
           "(%" PRIu64 " ms)",
           m->self_name, now(m) - m->t0);
  finish(m, BEE_EMISSED, NULL);
}

static void ask_next(avg_match *m) {
  if (m->state != ST_LOOKING || m->asking)
    return;
  if (m->nfol + 1 >= m->cfg.target_size) {
    begin(m); /* full while we asked: no one else to ask */
    return;
  }
  uint64_t exp;
  if (!pick_leader(m, m->leader, m->leader_addr, &exp)) {
    probe_later(m);
    end_if_missed(m);
    return;
  }
  m->leader_exp = exp;
  m->nonce++;
  proto_group_msg j = {.type = PROTO_T_AVG_JOIN,
                       .nonce = m->nonce,
                       .expiration =
                           m->expiration == UINT64_MAX ? 0 : m->expiration,
                       .info = m->cfg.info};
  m->asking = true;
  m->ask_until = now(m) + m->cfg.request_timeout_ms;
  m->stats.joins_sent++;
  if (send_msg(m, m->leader, m->leader_addr, &j) != 0) {
    m->asking = false;
    mark_tried(m, m->leader, exp);
    m->has_hint = false;
    ask_next(m); /* bounded: each failure marks one more peer tried */
  }
}

/* Our JOIN was answered or timed out without a taker. */
static void ask_failed(avg_match *m) {
  m->asking = false;
  mark_tried(m, m->leader, m->leader_exp);
  ask_next(m);
}

static void follow(avg_match *m) {
  char who[16];
  m->asking = false;
  m->state = ST_FOLLOWING;
  m->nprobes = 0; /* their answers come as late ones */
  if (m->nfol)
    release_followers(m, PROTO_LEAVE_MOVED);
  /* The leader begins at its start, or sooner when full; it may have
   * waited a JOIN of its own first. */
  uint64_t t = now(m), ums = m->io.unix_ms(m->io.ctx);
  uint64_t start =
      m->leader_exp ? m->leader_exp * 1000 : ums + m->cfg.matchmaking_ms;
  uint64_t wait = start > ums ? start - ums : 0;
  m->follow_until = t + wait + 2 * m->cfg.request_timeout_ms;
  bee_debug("match", "%s: following %s", m->self_name,
            short_id(m->leader, who));
}

/* Back to looking after our leader let us go or vanished. */
static void unfollow(avg_match *m) {
  mark_tried(m, m->leader, m->leader_exp);
  m->state = ST_LOOKING;
  if (m->expiration != UINT64_MAX && m->expiration <= unix_s(m))
    declare(m);
  ask_next(m);
}

/* Our start has come while we look and ask nobody: we begin with the
 * followers we have, or let them go and declare again.  True when we
 * began. */
static bool start_came(avg_match *m) {
  if (m->nfol > 0 && m->nfol + 1 >= m->cfg.min_size) {
    begin(m);
    return true;
  }
  release_followers(m, PROTO_LEAVE_DISBANDED);
  m->stats.redeclared++;
  declare(m);
  return false;
}

/* ---- handling ---------------------------------------------------------- */

static uint32_t join_verdict(avg_match *m, const uint8_t *from,
                             const proto_group_msg *j) {
  if (m->state == ST_FOLLOWING)
    return PROTO_JOIN_NOT_A_LEADER;
  if (m->state != ST_LOOKING || m->cfg.info.mode == PROTO_MODE_CLIENT)
    return PROTO_JOIN_NOT_LOOKING;
  uint32_t k = (uint32_t)key_check(m, &j->info);
  if (k)
    return k;
  uint64_t t = unix_s(m);
  /* Our start has come: we begin (or look again) at the next tick. */
  if (m->expiration <= t)
    return PROTO_JOIN_NOT_LOOKING;
  if (j->info.mode != PROTO_MODE_CLIENT) {
    if (j->expiration <= t || j->expiration > t + FUTURE_MAX_S)
      return PROTO_JOIN_BAD_EXPIRATION;
    if (order_cmp(j->expiration, from, m->expiration, m->cfg.self_id) < 0)
      return PROTO_JOIN_YOU_LEAD;
  }
  for (size_t i = 0; i < m->nfol; i++)
    if (same_id(m->fol[i].id, from))
      return PROTO_JOIN_ACCEPTED; /* a repeated JOIN: still ours */
  if (m->nfol + 1 >= m->cfg.max_size)
    return PROTO_JOIN_GROUP_FULL;
  if (m->nfol == m->fol_cap) { /* room for one more follower */
    size_t cap = m->fol_cap ? 2 * m->fol_cap : 16;
    if (cap > m->cfg.max_size)
      cap = m->cfg.max_size;
    follower *f = realloc(m->fol, cap * sizeof *f);
    if (!f)
      return PROTO_JOIN_GROUP_FULL;
    m->fol = f;
    m->fol_cap = cap;
  }
  return PROTO_JOIN_ACCEPTED;
}

static void on_join(avg_match *m, const uint8_t *from,
                    const proto_group_msg *j) {
  char who[16];
  /* Our start came before our timer ran: act on it first, so that "not
   * looking" is said only by a peer that began or ended its search, never
   * by one about to declare again (a prober counts it as formed). */
  if (m->state == ST_LOOKING && !m->asking && m->expiration != UINT64_MAX &&
      m->expiration <= unix_s(m))
    start_came(m);
  uint32_t code = join_verdict(m, from, j);
  send_reply(m, from, j->info.addr, j->nonce, code);
  if (code != PROTO_JOIN_ACCEPTED) {
    m->stats.joins_refused++;
    bee_debug("match", "%s: refused %s: %s", m->self_name, short_id(from, who),
              avg_join_code_name((int)code));
    return;
  }
  follower *f = NULL;
  for (size_t i = 0; i < m->nfol && !f; i++)
    if (same_id(m->fol[i].id, from))
      f = &m->fol[i];
  if (!f) {
    f = &m->fol[m->nfol++];
    memcpy(f->id, from, PROTO_ID_BYTES);
    m->stats.joins_accepted++;
  }
  member_of(from, &j->info, &f->info);
  if (m->nfol + 1 >= m->cfg.target_size && !m->asking)
    begin(m);
}

/* Whether a refusal r says that the refuser looks and will come to us:
 * we are earlier than it, or it follows us already. */
static bool says_coming(const avg_match *m, const proto_group_msg *r) {
  return r->code == PROTO_JOIN_YOU_LEAD ||
         (r->code == PROTO_JOIN_NOT_A_LEADER && r->has_leader &&
          same_id(r->leader, m->cfg.self_id));
}

static bool refused_formed(const proto_group_msg *r) {
  return r->code == PROTO_JOIN_NOT_LOOKING || r->code == PROTO_JOIN_GROUP_FULL;
}

/* A hint to ask next: a refuser's leader, or a leader's new one. */
static void set_hint(avg_match *m, const proto_group_msg *r) {
  if (r->has_leader && !same_id(r->leader, m->cfg.self_id)) {
    m->has_hint = true;
    memcpy(m->hint, r->leader, PROTO_ID_BYTES);
    memcpy(m->hint_addr, r->leader_addr, sizeof m->hint_addr);
  }
}

/* A probe's answer.  A follower names its leader, asked next: that one
 * looks (and comes), or its group formed. */
static void on_probe_reply(avg_match *m, size_t k, const proto_group_msg *r) {
  probe p = m->probes[k];
  probe_drop(m, k);
  if (r->code == PROTO_JOIN_ACCEPTED) /* it cannot, being later: a race */
    send_leave(m, p.id, NULL, PROTO_LEAVE_GONE);
  mark_tried(m, p.id, p.expiration);
  if (says_coming(m, r))
    m->coming = true;
  else if (refused_formed(r))
    m->stats.refused_formed++;
  else if (r->code == PROTO_JOIN_NOT_A_LEADER && !m->has_hint)
    set_hint(m, r);
  ask_next(m);
}

static void on_reply(avg_match *m, const uint8_t *from,
                     const proto_group_msg *r) {
  char who[16];
  size_t k = probe_find(m, from, r->nonce, true);
  if (k != SIZE_MAX) {
    on_probe_reply(m, k, r);
    return;
  }
  if (!m->asking || r->nonce != m->nonce || !same_id(from, m->leader)) {
    /* A late answer: a JOIN we gave up on.  If it took us, say we left. */
    if (r->code == PROTO_JOIN_ACCEPTED && m->state != ST_IDLE &&
        !(m->state == ST_FOLLOWING && same_id(from, m->leader)))
      send_leave(m, from, NULL, PROTO_LEAVE_GONE);
    return;
  }
  if (r->code == PROTO_JOIN_ACCEPTED) {
    follow(m);
    return;
  }
  bee_debug("match", "%s: %s refused us: %s", m->self_name, short_id(from, who),
            avg_join_code_name((int)r->code));
  if (refused_formed(r))
    m->stats.refused_formed++;
  if (says_coming(m, r))
    m->coming = true;
  set_hint(m, r);
  ask_failed(m);
}

/* Checks a BEGIN from our leader and ends with its group. */
static int on_begin(avg_match *m, const uint8_t *from,
                    const proto_group_msg *b) {
  char who[16];
  /* From the leader we follow, or the one we asked: its ACCEPTED may
   * still be on its way, on a transport that does not keep order. */
  if ((m->state != ST_FOLLOWING && !m->asking) || !same_id(from, m->leader)) {
    bee_warn("match", "%s: BEGIN from %s, who does not lead us: ignored",
             m->self_name, short_id(from, who));
    return BEE_EAUTH;
  }
  size_t self = SIZE_MAX, reducers = 0;
  for (size_t i = 0; i < b->nmembers; i++) {
    if (same_id(b->members[i].id, m->cfg.self_id))
      self = i;
    if (b->members[i].mode != PROTO_MODE_CLIENT)
      reducers++;
  }
  int rc = 0;
  if (b->round != m->cfg.info.round || self == SIZE_MAX ||
      !same_id(b->members[0].id, from) || reducers == 0 ||
      b->nmembers > m->cfg.max_size)
    rc = BEE_ERANGE;
  if (rc) {
    bee_warn("match",
             "%s: BEGIN from %s does not fit (round %" PRIu64
             ", %zu members, we %s listed): leaving it",
             m->self_name, short_id(from, who), b->round, b->nmembers,
             self == SIZE_MAX ? "not" : "are");
    send_leave(m, from, m->leader_addr, PROTO_LEAVE_GONE);
    if (m->state == ST_FOLLOWING)
      unfollow(m);
    else
      ask_failed(m);
    return rc;
  }
  if (m->nfol) /* we asked with followers of our own: they go too */
    release_followers(m, PROTO_LEAVE_GONE);
  m->asking = false;
  avg_group g = {.nmembers = b->nmembers, .self = self, .members = b->members};
  memcpy(g.id, b->group, sizeof g.id);
  memcpy(g.leader, from, PROTO_ID_BYTES);
  finish(m, 0, &g);
  return 0;
}

static void on_leave(avg_match *m, const uint8_t *from,
                     const proto_group_msg *l) {
  if (m->state == ST_FOLLOWING && same_id(from, m->leader)) {
    set_hint(m, l);
    unfollow(m);
    return;
  }
  for (size_t i = 0; i < m->nfol; i++)
    if (same_id(m->fol[i].id, from)) {
      m->fol[i] = m->fol[--m->nfol];
      return;
    }
}

/* Every public call runs between enter and leave, so that a callback
 * may free the core: the free waits for the outermost call to return. */
static void enter(avg_match *m) { m->depth++; }

static void destroy(avg_match *m) {
  free(m->fol);
  free(m->members);
  free(m->decls);
  free(m);
}

static void leave(avg_match *m) {
  if (--m->depth == 0 && m->freeing)
    destroy(m);
}

static bool active(const avg_match *m) {
  return (m->state == ST_LOOKING || m->state == ST_FOLLOWING) && !m->freeing;
}

/* ---- public ------------------------------------------------------------ */

const char *avg_join_code_name(int code) {
  static const char *const names[] = {
      "accepted",   "not looking",  "bad schema", "bad key",
      "group full", "not a leader", "you lead",   "bad expiration"};
  return code >= 0 && code <= PROTO_JOIN_CODE_MAX ? names[code] : "?";
}

void avg_match_config_default(avg_match_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->target_size = 16;
  cfg->min_size = 2;
  cfg->matchmaking_ms = 5000;
  cfg->request_timeout_ms = 3000;
  cfg->fetch_interval_ms = 1000;
  cfg->deadline_ms = 30000;
  cfg->info.mode = PROTO_MODE_NODE;
  cfg->info.bandwidth_mbit = 100;
}

int avg_match_new(const avg_match_config *cfg, const avg_match_io *io,
                  avg_match **out) {
  uint8_t buf[PROTO_RECORD_MAX];
  size_t len;
  if (!io || !io->now_ms || !io->unix_ms || !io->declare || !io->fetch ||
      !io->send || !io->random)
    return BEE_ERANGE;
  size_t max = cfg->max_size ? cfg->max_size : cfg->target_size;
  if (cfg->target_size < 2 || cfg->target_size > AVG_GROUP_MAX ||
      max < cfg->target_size || max > AVG_GROUP_MAX || cfg->min_size < 1 ||
      cfg->min_size > cfg->target_size ||
      cfg->request_timeout_ms == 0 || cfg->fetch_interval_ms == 0 ||
      cfg->deadline_ms == 0 || cfg->first_start_ms > FUTURE_MAX_S / 2 * 1000ull)
    return BEE_ERANGE;
  /* The record must be one we could publish (a valid proto_match). */
  int rc = proto_match_encode(&cfg->info, buf, sizeof buf, &len);
  if (rc)
    return rc;
  avg_match *m = calloc(1, sizeof *m);
  if (!m)
    return -ENOMEM;
  m->cfg = *cfg;
  m->cfg.max_size = max;
  m->io = *io;
  short_id(cfg->self_id, m->self_name);
  *out = m;
  return 0;
}

int avg_match_start(avg_match *m, avg_match_cb cb, void *arg) {
  if (m->state != ST_IDLE)
    return BEE_ERANGE;
  m->cb = cb;
  m->arg = arg;
  m->t0 = now(m);
  m->state = ST_LOOKING;
  enter(m);
  declare(m);
  leave(m);
  return 0;
}

void avg_match_declared(avg_match *m, const avg_decl *v, size_t n) {
  if (!active(m))
    return;
  size_t keep = 0, want = n < DECLS_MAX ? n : DECLS_MAX;
  avg_decl *d = realloc(m->decls, (want ? want : 1) * sizeof *d);
  if (!d)
    return; /* the old list stays; a later read may fit */
  m->decls = d;
  for (size_t i = 0; i < n && keep < DECLS_MAX; i++) {
    if (key_check(m, &v[i].info) != PROTO_JOIN_ACCEPTED ||
        v[i].info.mode == PROTO_MODE_CLIENT || same_id(v[i].id, m->cfg.self_id))
      continue;
    d[keep++] = v[i];
  }
  m->ndecls = keep;
  if (keep > m->stats.declared_max)
    m->stats.declared_max = keep;
  qsort(d, keep, sizeof *d, decl_cmp);
  m->stats.fetches++;
  enter(m);
  ask_next(m);
  leave(m);
}

int avg_match_handle(avg_match *m, const uint8_t from[PROTO_ID_BYTES],
                     const uint8_t *msg, size_t len) {
  proto_group_msg g;
  char who[16];
  if (m->freeing)
    return BEE_ECANCELED;
  m->stats.msgs_recv++;
  /* Room for a BEGIN's members is made when the first one comes. */
  int rc = proto_group_decode(msg, len, &g, m->members,
                              m->members ? m->cfg.max_size : 0);
  if (rc == BEE_ETOOBIG && !m->members) {
    m->members = malloc(m->cfg.max_size * sizeof *m->members);
    rc = m->members ? proto_group_decode(msg, len, &g, m->members,
                                         m->cfg.max_size)
                    : -ENOMEM;
  }
  if (rc) {
    bee_warn("match", "%s: bad message from %s: %s", m->self_name,
             short_id(from, who), bee_strerror(rc));
    return rc;
  }
  enter(m);
  if (!active(m)) {
    if (g.type == PROTO_T_AVG_JOIN)
      send_reply(m, from, g.info.addr, g.nonce, PROTO_JOIN_NOT_LOOKING);
    rc = BEE_ECANCELED;
  } else {
    switch (g.type) {
    case PROTO_T_AVG_JOIN: on_join(m, from, &g); break;
    case PROTO_T_AVG_REPLY: on_reply(m, from, &g); break;
    case PROTO_T_AVG_BEGIN: rc = on_begin(m, from, &g); break;
    default: on_leave(m, from, &g); break;
    }
  }
  leave(m);
  return rc;
}

/* The timeouts; false when the search ended. */
static bool run_timers(avg_match *m, uint64_t t) {
  if (t - m->t0 >= m->cfg.deadline_ms) {
    bee_info("match", "%s: no group within %" PRIu64 " ms", m->self_name,
             m->cfg.deadline_ms);
    if (m->state == ST_FOLLOWING || m->asking)
      send_leave(m, m->leader, m->leader_addr, PROTO_LEAVE_GONE);
    release_followers(m, PROTO_LEAVE_GONE);
    finish(m, BEE_ETIMEOUT, NULL);
    return false;
  }
  if (m->asking && t >= m->ask_until) {
    /* If it took us after all, it must not count us. */
    send_leave(m, m->leader, m->leader_addr, PROTO_LEAVE_GONE);
    ask_failed(m);
    if (!active(m))
      return false;
  }
  if (m->state == ST_FOLLOWING && t >= m->follow_until) {
    send_leave(m, m->leader, m->leader_addr, PROTO_LEAVE_GONE);
    unfollow(m);
    if (!active(m))
      return false;
  }
  for (size_t k = 0; k < m->nprobes && m->state == ST_LOOKING;) {
    if (t < m->probes[k].until) {
      k++;
      continue;
    }
    /* No answer: gone, or too slow to matter. */
    mark_tried(m, m->probes[k].id, m->probes[k].expiration);
    probe_drop(m, k);
    ask_next(m);
  }
  if (!active(m))
    return false;
  if (m->state == ST_LOOKING && !m->asking && m->expiration != UINT64_MAX &&
      m->expiration <= unix_s(m) && start_came(m))
    return false;
  if (m->state == ST_LOOKING && t >= m->next_fetch) {
    m->io.fetch(m->io.ctx);
    m->next_fetch = t + m->cfg.fetch_interval_ms;
  }
  return active(m);
}

void avg_match_peer_gone(avg_match *m, const uint8_t id[PROTO_ID_BYTES]) {
  char who[16];
  if (!active(m))
    return;
  enter(m);
  if ((m->state == ST_FOLLOWING || m->asking) && same_id(id, m->leader)) {
    bee_debug("match", "%s: %s is gone", m->self_name, short_id(id, who));
    if (m->state == ST_FOLLOWING)
      unfollow(m);
    else
      ask_failed(m);
  } else {
    for (size_t i = 0; i < m->nfol; i++)
      if (same_id(m->fol[i].id, id)) {
        m->fol[i] = m->fol[--m->nfol];
        break;
      }
  }
  leave(m);
}

uint64_t avg_match_tick(avg_match *m) {
  if (!active(m))
    return UINT64_MAX;
  uint64_t t = now(m);
  enter(m);
  bool on = run_timers(m, t);
  /* When to come back: the earliest of the waits. */
  uint64_t at = m->t0 + m->cfg.deadline_ms;
  if (on && m->asking && m->ask_until < at)
    at = m->ask_until;
  if (on && m->state == ST_FOLLOWING && m->follow_until < at)
    at = m->follow_until;
  if (on && m->state == ST_LOOKING) {
    if (m->next_fetch < at)
      at = m->next_fetch;
    for (size_t k = 0; k < m->nprobes; k++)
      if (m->probes[k].until < at)
        at = m->probes[k].until;
    /* Our start; once it has passed, only an unanswered JOIN holds us
     * (its timeout is counted above). */
    uint64_t ums = m->io.unix_ms(m->io.ctx);
    if (m->expiration != UINT64_MAX && m->expiration * 1000 > ums &&
        t + (m->expiration * 1000 - ums) < at)
      at = t + (m->expiration * 1000 - ums);
  }
  leave(m);
  if (!on)
    return UINT64_MAX;
  return at > t ? at - t : 0;
}

void avg_match_stats_get(const avg_match *m, avg_match_stats *st) {
  *st = m->stats;
}

void avg_match_free(avg_match *m) {
  if (!m || m->freeing)
    return;
  bool was_active = active(m);
  m->freeing = true; /* a free from the callback below returns at once */
  if (was_active) {
    m->depth++;
    if (m->state == ST_FOLLOWING || m->asking)
      send_leave(m, m->leader, m->leader_addr, PROTO_LEAVE_GONE);
    release_followers(m, PROTO_LEAVE_GONE);
    finish(m, BEE_ECANCELED, NULL);
    m->depth--;
  }
  if (m->depth == 0)
    destroy(m);
}

/* ---- Moshpit ----------------------------------------------------------- */

int avg_moshpit_bits(const char *bits,
                     const uint8_t group[PROTO_AVG_GROUP_BYTES], size_t index,
                     size_t nmembers, size_t target_size,
                     char out[PROTO_BITS_MAX + 1]) {
  size_t nb = strlen(bits);
  if (nb > PROTO_BITS_MAX || target_size < 2 || target_size > AVG_GROUP_MAX ||
      nmembers == 0 || nmembers > target_size || index >= nmembers)
    return BEE_ERANGE;
  /* A permutation of 0..target_size-1 drawn from the group id: every
   * member computes the same one and takes the entry at its index, so the
   * members get distinct cells of the next grid dimension. */
  uint32_t perm[AVG_GROUP_MAX];
  uint8_t seed[randombytes_SEEDBYTES];
  crypto_generichash(seed, sizeof seed, group, PROTO_AVG_GROUP_BYTES,
                     (const uint8_t *)"beed moshpit", 12);
  uint32_t rnd[AVG_GROUP_MAX];
  randombytes_buf_deterministic(rnd, target_size * sizeof *rnd, seed);
  for (size_t i = 0; i < target_size; i++)
    perm[i] = (uint32_t)i;
  for (size_t i = target_size - 1; i > 0; i--) {
    size_t j = rnd[i] % (i + 1);
    uint32_t t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
  uint32_t cell = perm[index];
  size_t cb = 0;
  while (((size_t)1 << cb) < target_size)
    cb++;
  /* The new bits: ours shifted left by cb, the cell's bits appended, the
   * length kept. */
  char all[PROTO_BITS_MAX + 64 + 1];
  memcpy(all, bits, nb);
  for (size_t i = 0; i < cb; i++)
    all[nb + i] = (char)('0' + ((cell >> (cb - 1 - i)) & 1));
  memcpy(out, all + cb, nb);
  out[nb] = 0;
  return 0;
}
