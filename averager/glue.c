/* glue.c: matchmaking and the round over proto's transport, on a libuv
 * loop.
 *
 * The only file of averager/ that does I/O.  One averaging at a time
 * (avg_node_average): the matchmaking core runs until a group forms, then
 * a round core runs over the group.  Their messages travel as one-way
 * messages on the control connection to each peer: "avg.m" for
 * matchmaking, "avg.r" for the round; a peer we have no connection to is
 * dialled at the address it declared, and its messages wait for the
 * connection.  The round's arithmetic runs on libuv's thread pool.  The
 * DHT is the caller's: the node declares and reads the group key through
 * avg_node_dht, and the caller hands what it read to avg_node_declared.
 *
 * Messages of the round that come before we know the group (a member
 * that got BEGIN before us) are kept, bounded, and handed to the round
 * when it starts.
 *
 * Lifetime: avg_node_close may be called from any callback, the node's
 * own included; it ends the averaging under way (the callback runs with
 * BEE_ECANCELED) and frees the node on a later turn of the loop.  Dials
 * and jobs still in flight hold a reference.
 */
#include "averager-int.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define METHOD_MATCH "avg.m"
#define METHOD_ROUND "avg.r"
#define EARLY_MAX 256               /* round messages kept before the group */
#define EARLY_BYTES_MAX (64u << 20) /* and their bytes */
#define EARLY_KEEP_MS 30000         /* a kept message older than this goes */

typedef struct qmsg {
  struct qmsg *next;
  bool round; /* a round message (avg_node_leave's ABORT) */
  size_t len;
  uint8_t buf[];
} qmsg;

/* A connection being dialled, and the matchmaking messages waiting for
 * it.  The round's messages do not wait here: the round holds them
 * (BEE_EQUEUE) until avg_round_drain. */
typedef struct dial {
  struct dial *next;
  avg_node *n;
  uint8_t id[PROTO_ID_BYTES];
  qmsg *head, **tail;
  bool gone; /* the node closed, or the dial is no longer wanted */
} dial;

typedef struct early {
  struct early *next;
  uint8_t from[PROTO_ID_BYTES];
  uint64_t at_ms;
  size_t len;
  uint8_t buf[];
} early;

/* The bulk connections we opened to one peer to stripe a round's bytes
 * over (avg_node_request.stripes), kept from round to round. */
#define STRIPES_MAX 16
typedef struct stripes {
  uint8_t id[PROTO_ID_BYTES];
  proto_conn *c[STRIPES_MAX]; /* up, ours to send on */
  unsigned up, dialing, next;
} stripes;

typedef struct sdial {
  avg_node *n;
  uint8_t id[PROTO_ID_BYTES];
} sdial;

typedef struct work {
  uv_work_t w;
  avg_node *n;
  avg_job *job;
} work;

struct avg_node {
  avg_node_config cfg;
  uint8_t self[PROTO_ID_BYTES];
  uv_timer_t timer;
  int refs;
  bool closing;
  dial *dials;
  early *early;
  size_t nearly, early_bytes;
  /* The averaging under way. */
  bool busy;
  avg_node_request req;
  avg_node_cb cb;
  void *arg;
  avg_match *m;
  bool match_only; /* avg_node_match: the group is the callback's */
  avg_round *r;
  avg_group group; /* members point into ours below */
  proto_group_member *members;
  avg_mode *modes;
  double *bandwidth;
  bool *unreachable; /* members we failed to dial */
  unsigned *want;    /* stripes to each member: 0 or 1, none */
  bool replay;       /* kept round messages to hand the round */
  /* The rounds' backups, kept from round to round so that each does not
   * fault in fresh pages: n floats of the largest buffer yet.  Freed with
   * the node, after the last job (a job holds a reference). */
  float *scratch;
  size_t scratch_n;
  stripes *str; /* one per peer we striped to */
  size_t window_bytes; /* one TCP stream's window at most (auto stripes) */
  avg__meter meter;    /* our link's rate, from the rounds' messages */
  size_t nstr, capstr;
  avg_match_stats mstats;
  char name[32]; /* for the round's log lines */
};

static void unref(avg_node *n) {
  if (--n->refs == 0) {
    free(n->scratch);
    free(n->str);
    free(n);
  }
}

static uint64_t now_ms(void *ctx) {
  return uv_now(((avg_node *)ctx)->cfg.loop);
}

static uint64_t unix_ms(void *ctx) {
  (void)ctx;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void arm(avg_node *n);

/* ---- sending matchmaking messages -------------------------------------- */

static void dial_free(dial *d) {
  while (d->head) {
    qmsg *q = d->head;
    d->head = q->next;
    free(q);
  }
  free(d);
}

static void dial_unlink(avg_node *n, dial *d) {
  for (dial **pp = &n->dials; *pp; pp = &(*pp)->next)
    if (*pp == d) {
      *pp = d->next;
      return;
    }
}

static size_t member_index(const avg_node *n, const uint8_t *id);

/* A dial ended: the matchmaking messages waiting for it go out, and the
 * round, if it waits for this member, tries again (a member we cannot
 * reach is marked so, and its next send fails, which drops it). */
static void dialled(proto_host *h, proto_conn *c, int status, void *arg) {
  dial *d = arg;
  avg_node *n = d->n;
  char who[13];
  (void)h;
  proto_hex(d->id, 6, who);
  if (!d->gone) {
    dial_unlink(n, d);
    if (status == 0 &&
        memcmp(proto_conn_peer(c)->id, d->id, PROTO_ID_BYTES) != 0) {
      bee_warn("avg", "dialled %s for %s and found another peer",
               proto_conn_addr(c), who);
      status = BEE_EAUTH;
    }
    if (status == 0)
      for (qmsg *q = d->head; q; q = q->next)
        proto_conn_oneway(c, q->round ? METHOD_ROUND : METHOD_MATCH, q->buf,
                          q->len);
    size_t k = n->r ? member_index(n, d->id) : SIZE_MAX;
    if (k != SIZE_MAX) {
      if (status != 0) {
        bee_warn("avg", "group %s: cannot reach %s at %s: %s", n->name, who,
                 n->members[k].addr, bee_strerror(status));
        n->unreachable[k] = true;
      }
      avg_round_drain(n->r, k);
      arm(n);
    }
  }
  dial_free(d);
  unref(n);
}

/* Starts a dial to id at addr, or finds the one under way. */
static dial *dial_get(avg_node *n, const uint8_t *id, const char *addr,
                      int *rc) {
  for (dial *d = n->dials; d; d = d->next)
    if (memcmp(d->id, id, PROTO_ID_BYTES) == 0)
      return d;
  dial *d = calloc(1, sizeof *d);
  if (!d) {
    *rc = -ENOMEM;
    return NULL;
  }
  d->n = n;
  memcpy(d->id, id, PROTO_ID_BYTES);
  d->tail = &d->head;
  *rc =
      proto_host_connect(n->cfg.host, addr, PROTO_PURPOSE_CONTROL, dialled, d);
  if (*rc) {
    free(d);
    return NULL;
  }
  d->next = n->dials;
  n->dials = d;
  n->refs++;
  return d;
}

/* Sends msg to id over a connection we have, or one dialled at addr
 * (NULL: none). */
static int send_to(avg_node *n, const uint8_t id[PROTO_ID_BYTES],
                   const char *addr, const uint8_t *msg, size_t len,
                   bool round) {
  proto_conn *c = proto_host_find(n->cfg.host, id);
  int rc;
  if (c)
    return proto_conn_oneway(c, round ? METHOD_ROUND : METHOD_MATCH, msg, len);
  if (!addr)
    return -ENOTCONN;
  qmsg *q = malloc(sizeof *q + len);
  if (!q)
    return -ENOMEM;
  q->next = NULL;
  q->round = round;
  q->len = len;
  memcpy(q->buf, msg, len);
  dial *d = dial_get(n, id, addr, &rc);
  if (!d) {
    free(q);
    return rc;
  }
  *d->tail = q;
  d->tail = &q->next;
  return 0;
}

static int match_send(void *ctx, const uint8_t id[PROTO_ID_BYTES],
                      const char *addr, const uint8_t *msg, size_t len) {
  return send_to(ctx, id, addr, msg, len, false);
}

/* ---- the matchmaking core's io ----------------------------------------- */

static void match_declare(void *ctx, const proto_match *info, uint64_t exp) {
  avg_node *n = ctx;
  n->cfg.dht.declare(n->cfg.dht.ctx, info, exp);
}

static void match_fetch(void *ctx) {
  avg_node *n = ctx;
  n->cfg.dht.fetch(n->cfg.dht.ctx, n, &n->req.match.info);
}

static void match_random(void *ctx, void *buf, size_t len) {
  (void)ctx;
  randombytes_buf(buf, len);
}

/* ---- the round --------------------------------------------------------- */

static size_t member_index(const avg_node *n, const uint8_t *id) {
  for (size_t i = 0; n->members && i < n->group.nmembers; i++)
    if (memcmp(n->members[i].id, id, PROTO_ID_BYTES) == 0)
      return i;
  return SIZE_MAX;
}

/* ---- stripes ----------------------------------------------------------- */

static stripes *stripes_find(avg_node *n, const uint8_t *id, bool make) {
  for (size_t i = 0; i < n->nstr; i++)
    if (memcmp(n->str[i].id, id, PROTO_ID_BYTES) == 0)
      return &n->str[i];
  if (!make)
    return NULL;
  if (n->nstr == n->capstr) {
    size_t cap = n->capstr ? 2 * n->capstr : 16;
    stripes *v = realloc(n->str, cap * sizeof *v);
    if (!v)
      return NULL;
    n->str = v;
    n->capstr = cap;
  }
  stripes *st = &n->str[n->nstr++];
  memset(st, 0, sizeof *st);
  memcpy(st->id, id, PROTO_ID_BYTES);
  return st;
}

/* Forgets c if it is one of our stripes (it closed). */
static void stripes_drop(avg_node *n, proto_conn *c) {
  stripes *st = stripes_find(n, proto_conn_peer(c)->id, false);
  if (!st)
    return;
  for (unsigned i = 0; i < st->up; i++)
    if (st->c[i] == c) {
      st->c[i] = st->c[--st->up];
      return;
    }
}

static void stripe_dialled(proto_host *h, proto_conn *c, int status,
                           void *arg) {
  sdial *sd = arg;
  avg_node *n = sd->n;
  (void)h;
  stripes *st = n->closing ? NULL : stripes_find(n, sd->id, false);
  if (st)
    st->dialing--;
  if (status == 0 && c) {
    if (!st || memcmp(proto_conn_peer(c)->id, sd->id, PROTO_ID_BYTES) != 0 ||
        st->up == STRIPES_MAX) {
      proto_conn_close(c, 0, "stripe not wanted");
    } else {
      st->c[st->up++] = c;
      bee_debug("avg", "stripe %u to %s up", st->up, proto_conn_addr(c));
      size_t k = n->r ? member_index(n, sd->id) : SIZE_MAX;
      if (k != SIZE_MAX) { /* more room to send on */
        avg_round_drain(n->r, k);
        arm(n);
      }
    }
  }
  free(sd);
  unref(n);
}

static bool nowhere_host(const char *h) {
  return proto_host_loopback(h) || strcmp(h, "0.0.0.0") == 0 ||
         strcmp(h, "::") == 0;
}

/* Where to dial member g's stripes: the address it declared, unless that
 * one reaches no other host (loopback, unspecified, or the very address
 * this node declared) while g's control connection comes from another
 * host: then that connection's address, with the declared port.  (A bee
 * listening on every address declares loopback until its peers have
 * said where they see it, and a stripe dialled there reaches this node
 * itself.) */
static void stripe_addr(avg_node *n, const proto_group_member *g, char *out,
                        size_t cap) {
  char host[PROTO_ADDR_MAX], ip[PROTO_ADDR_MAX];
  const char *port, *cport;
  proto_conn *c = proto_host_find(n->cfg.host, g->id);
  snprintf(out, cap, "%s", g->addr);
  if (!c || proto_addr_host(g->addr, host, sizeof host, &port) ||
      !(nowhere_host(host) || strcmp(g->addr, n->req.match.info.addr) == 0) ||
      proto_addr_host(proto_conn_addr(c), ip, sizeof ip, &cport) ||
      nowhere_host(ip))
    return;
  snprintf(out, cap, strchr(ip, ':') ? "[%s]:%s" : "%s:%s", ip, port);
  bee_debug("avg",
            "stripes: a member declared %s, dialled at %s (its "
            "connection's host)",
            g->addr, out);
}

/* Opens the stripes n->want asks for to every member we can dial. */
static void stripes_open(avg_node *n) {
  for (size_t k = 0; k < n->group.nmembers; k++) {
    const proto_group_member *g = &n->members[k];
    unsigned want = n->want[k];
    if (k == n->group.self || g->mode == PROTO_MODE_CLIENT || want < 2)
      continue;
    stripes *st = stripes_find(n, g->id, true);
    char addr[PROTO_ADDR_MAX];
    stripe_addr(n, g, addr, sizeof addr);
    while (st && st->up + st->dialing < want) {
      sdial *sd = malloc(sizeof *sd);
      if (!sd)
        return;
      sd->n = n;
      memcpy(sd->id, g->id, PROTO_ID_BYTES);
      if (proto_host_connect(n->cfg.host, addr, PROTO_PURPOSE_BULK,
                             stripe_dialled, sd) != 0) {
        free(sd);
        break;
      }
      st->dialing++;
      n->refs++;
    }
  }
}

/* Sends on member k's stripes in turn, skipping full ones: 0, or
 * BEE_EQUEUE when every stripe is full, or 1 when there are none. */
static int stripes_send(avg_node *n, size_t k, const uint8_t *msg,
                        size_t len) {
  stripes *st =
      n->want[k] > 1 ? stripes_find(n, n->members[k].id, false) : NULL;
  if (!st || st->up == 0)
    return 1;
  bool full = false;
  for (unsigned tries = 0; st->up > 0 && tries < STRIPES_MAX; tries++) {
    unsigned i = st->next++ % st->up;
    int rc = proto_conn_oneway(st->c[i], METHOD_ROUND, msg, len);
    if (rc == 0)
      return 0;
    if (rc == BEE_EQUEUE) {
      full = true;
      if (tries + 1 >= st->up)
        break; /* every stripe tried */
      continue;
    }
    st->c[i] = st->c[--st->up]; /* closing: not ours to use any more */
  }
  return full ? BEE_EQUEUE : 1; /* none left: the control connection */
}

static int round_send(void *ctx, size_t member, const uint8_t *msg,
                      size_t len) {
  avg_node *n = ctx;
  const proto_group_member *g = &n->members[member];
  int rc = stripes_send(n, member, msg, len);
  if (rc != 1)
    return rc;
  proto_conn *c = proto_host_find(n->cfg.host, g->id);
  if (c)
    return proto_conn_oneway(c, METHOD_ROUND, msg, len);
  if (n->unreachable[member] || g->mode == PROTO_MODE_CLIENT)
    return -ENOTCONN; /* a CLIENT dials us; without a connection it is gone */
  /* Dialled now, or being dialled: drained when the dial ends. */
  return dial_get(n, g->id, g->addr, &rc) ? BEE_EQUEUE : rc;
}

static void work_run(uv_work_t *w) { avg_job_run(((work *)w->data)->job); }

static void work_done(uv_work_t *w, int status) {
  work *wk = w->data;
  avg_node *n = wk->n;
  (void)status; /* uv_cancel is never called: the job always ran */
  avg_job_done(wk->job);
  free(wk);
  if (!n->closing)
    arm(n);
  unref(n);
}

static void round_submit(void *ctx, avg_job *job) {
  avg_node *n = ctx;
  work *wk = malloc(sizeof *wk);
  if (wk) {
    wk->w.data = wk;
    wk->n = n;
    wk->job = job;
    if (uv_queue_work(n->cfg.loop, &wk->w, work_run, work_done) == 0) {
      n->refs++;
      return;
    }
    free(wk);
  }
  /* No worker: run it here, as a round without submit does. */
  avg_job_run(job);
  avg_job_done(job);
}

static const char *round_name(void *ctx, size_t member) {
  avg_node *n = ctx;
  static char buf[16]; /* used at once, for one log line */
  if (member >= n->group.nmembers)
    return NULL;
  proto_hex(n->members[member].id, 6, buf);
  return buf;
}

/* The averaging is over: its callback, with the group g (NULL: none). */
static void finish_group(avg_node *n, int status, const avg_round_summary *s,
                         const avg_group *g) {
  avg__meter_end(&n->meter, uv_now(n->cfg.loop));
  avg_node_result res = {.status = status, .group = g, .summary = s};
  if (n->m)
    avg_match_stats_get(n->m, &n->mstats);
  res.match = n->mstats;
  n->busy = false;
  avg_node_cb cb = n->cb;
  n->cb = NULL;
  if (cb)
    cb(n, &res, n->arg);
}

static void finish(avg_node *n, int status, const avg_round_summary *s) {
  finish_group(n, status, s, n->members ? &n->group : NULL);
}

static void group_free(avg_node *n) {
  free(n->members);
  free(n->modes);
  free(n->bandwidth);
  free(n->unreachable);
  free(n->want);
  n->members = NULL;
  n->modes = NULL;
  n->bandwidth = NULL;
  n->unreachable = NULL;
  n->want = NULL;
}

static void on_round(avg_round *r, const avg_round_summary *s, void *arg) {
  avg_node *n = arg;
  (void)r;
  n->r = NULL; /* freed below; the core defers it while inside */
  /* The group is the callback's to read, and the callback may start the
   * next round, which brings its own. */
  avg_group g = n->group;
  proto_group_member *members = n->members;
  avg_mode *modes = n->modes;
  double *bandwidth = n->bandwidth;
  bool *unreachable = n->unreachable;
  unsigned *want = n->want;
  n->members = NULL;
  n->modes = NULL;
  n->bandwidth = NULL;
  n->unreachable = NULL;
  n->want = NULL;
  finish_group(n, s->status, s, members ? &g : NULL);
  avg_round_free(r);
  free(members);
  free(modes);
  free(bandwidth);
  free(unreachable);
  free(want);
}

/* Whether msg, a round message, names a group other than the round
 * under way's: it is for a round its sender began before ours (a group
 * formed ahead, avg_node_match) and is kept for it.  One that does not
 * decode goes to the round, which says so. */
static bool other_group(const avg_node *n, const uint8_t *msg, size_t len) {
  proto_avg_msg m;
  return proto_avg_decode(msg, len, &m) == 0 &&
         memcmp(m.group, n->group.id, sizeof m.group) != 0;
}

/* Hands the kept round messages of our group to the round. */
static void replay_early(avg_node *n) {
  early **pp = &n->early, *e;
  while (n->r && (e = *pp)) { /* a message may end the round */
    size_t k = member_index(n, e->from);
    if (k == SIZE_MAX || other_group(n, e->buf, e->len)) {
      pp = &e->next;
      continue;
    }
    *pp = e->next;
    n->nearly--;
    n->early_bytes -= e->len;
    avg_round_handle(n->r, k, e->buf, e->len);
    free(e);
  }
}

/* The request's headroom for the window and stripes: at least 1. */
static double headroom(const avg_node *n) {
  return n->req.headroom > 1 ? n->req.headroom : 1;
}

/* The parts in flight per owner that keep a link busy for a round trip,
 * as TCP sizes its window: for each member, min(our declared bandwidth,
 * its) x the round trip the transport measured on our connection to it,
 * in parts, plus 2; the most over the members, within 4..AVG_WINDOW_MAX.
 * A member we have no connection to yet counts with the largest RTT we
 * know. */
static unsigned auto_window(const avg_node *n, const avg_round_config *rc) {
  size_t part =
      (rc->part_floats ? rc->part_floats : AVG_PART_FLOATS) * sizeof(float);
  double mine = n->members[n->group.self].bandwidth_mbit * headroom(n),
         most = 0;
  uint64_t rtt_known = 0;
  for (size_t k = 0; k < n->group.nmembers; k++) {
    proto_conn *c = proto_host_find(n->cfg.host, n->members[k].id);
    if (c && proto_conn_rtt_ms(c) > rtt_known)
      rtt_known = proto_conn_rtt_ms(c);
  }
  for (size_t k = 0; k < n->group.nmembers; k++) {
    if (k == n->group.self)
      continue;
    proto_conn *c = proto_host_find(n->cfg.host, n->members[k].id);
    uint64_t rtt = c ? proto_conn_rtt_ms(c) : rtt_known;
    double theirs = n->members[k].bandwidth_mbit * headroom(n);
    double bw = theirs < mine ? theirs : mine;
    double parts = bw * 1e6 / 8 * ((double)rtt / 1e3) / (double)part + 2;
    if (parts > most)
      most = parts;
  }
  unsigned w = most > AVG_WINDOW_MAX ? AVG_WINDOW_MAX : (unsigned)ceil(most);
  return w < 4 ? 4 : w;
}

unsigned avg_stripes_auto(double a_mbit, double b_mbit, uint64_t rtt_ms,
                          size_t window_bytes) {
  if (window_bytes == 0 || !(a_mbit > 0) || !(b_mbit > 0))
    return 0;
  double bw = a_mbit < b_mbit ? a_mbit : b_mbit;
  double want = ceil(bw * 1e6 / 8 * ((double)rtt_ms / 1e3) / (double)window_bytes);
  return want >= AVG_STRIPES_AUTO_MAX ? AVG_STRIPES_AUTO_MAX
         : want < 2                   ? 0
                                      : (unsigned)want;
}

/* The stripes to member k: the request's count, or with AVG_STRIPES_AUTO
 * avg_stripes_auto over the round trip measured to k.  With no
 * connection to k yet that is unknown: none (the next round knows it). */
static unsigned stripes_for(const avg_node *n, size_t k) {
  unsigned s = n->req.stripes;
  if (s != AVG_STRIPES_AUTO)
    return s > STRIPES_MAX ? STRIPES_MAX : s;
  proto_conn *c = proto_host_find(n->cfg.host, n->members[k].id);
  if (!c)
    return 0;
  return avg_stripes_auto(n->members[n->group.self].bandwidth_mbit *
                              headroom(n),
                          n->members[k].bandwidth_mbit * headroom(n),
                          proto_conn_rtt_ms(c), n->window_bytes);
}

/* Creates and starts the round of group g; 0, or a code (nothing runs,
 * no callback). */
static int start_round(avg_node *n, const avg_group *g, bool replay_now) {
  size_t N = g->nmembers;
  n->members = malloc(N * sizeof *n->members);
  n->modes = malloc(N * sizeof *n->modes);
  n->bandwidth = malloc(N * sizeof *n->bandwidth);
  n->unreachable = calloc(N, sizeof *n->unreachable);
  n->want = calloc(N, sizeof *n->want);
  if (!n->members || !n->modes || !n->bandwidth || !n->unreachable ||
      !n->want) {
    group_free(n);
    return -ENOMEM;
  }
  memcpy(n->members, g->members, N * sizeof *n->members);
  for (size_t i = 0; i < N; i++) {
    n->modes[i] = (avg_mode)g->members[i].mode;
    n->bandwidth[i] = g->members[i].bandwidth_mbit;
  }
  n->group = *g;
  n->group.members = n->members;
  for (size_t k = 0; k < N; k++)
    n->want[k] = k == g->self ? 0 : stripes_for(n, k);
  avg_round_config rc = n->req.round;
  if (rc.window == 0)
    rc.window = auto_window(n, &rc);
  if (rc.x && !rc.scratch) {
    if (n->scratch_n < rc.n) {
      float *p = realloc(n->scratch, rc.n * sizeof *p);
      if (p) {
        n->scratch = p;
        n->scratch_n = rc.n;
      }
    }
    if (n->scratch_n >= rc.n)
      rc.scratch = n->scratch; /* else the round allocates its own */
  }
  memcpy(rc.group, g->id, sizeof rc.group);
  rc.nmembers = N;
  rc.self = g->self;
  rc.modes = n->modes;
  rc.bandwidth = n->req.equal_spans ? NULL : n->bandwidth;
  avg_io io = {.ctx = n,
               .now_ms = now_ms,
               .send = round_send,
               .submit = round_submit,
               .name = round_name};
  proto_hex(g->id, 8, n->name);
  int rc_ = avg_round_new(&rc, &io, &n->r);
  if (rc_ == 0)
    rc_ = avg_round_start(n->r, on_round, n);
  if (rc_) {
    bee_warn("avg", "group %s: cannot start the round: %s", n->name,
             bee_strerror(rc_));
    avg_round_free(n->r);
    n->r = NULL;
    group_free(n);
    return rc_;
  }
  stripes_open(n);
  avg__meter_start(&n->meter, uv_now(n->cfg.loop));
  /* The kept messages may end the round at once; from inside a public
   * call, hand them over on the next turn (the timer) instead. */
  if (replay_now)
    replay_early(n);
  else
    n->replay = true;
  return 0;
}

static void on_match(avg_match *m, int status, const avg_group *g, void *arg) {
  avg_node *n = arg;
  avg_match_stats_get(m, &n->mstats);
  if (n->match_only) { /* the caller runs the round when it is ready */
    n->match_only = false;
    finish_group(n, status, NULL, status == 0 ? g : NULL);
    return;
  }
  if (status == 0)
    status = start_round(n, g, true);
  if (status != 0)
    finish(n, status, NULL);
}

/* ---- the timer --------------------------------------------------------- */

static void drop_old_early(avg_node *n) {
  uint64_t t = uv_now(n->cfg.loop);
  for (early **pp = &n->early, *e; (e = *pp);) {
    if (t - e->at_ms < EARLY_KEEP_MS) {
      pp = &e->next;
      continue;
    }
    *pp = e->next;
    n->nearly--;
    n->early_bytes -= e->len;
    free(e);
  }
}

static void on_timer(uv_timer_t *t) {
  avg_node *n = t->data;
  if (n->replay) {
    n->replay = false;
    if (n->r)
      replay_early(n);
  }
  arm(n);
}

/* Runs the cores' timeouts and sets the timer to the earliest next one. */
static void arm(avg_node *n) {
  if (n->closing)
    return;
  uint64_t next = UINT64_MAX, t;
  if (n->m && (t = avg_match_tick(n->m)) < next)
    next = t;
  if (n->r && (t = avg_round_tick(n->r)) < next)
    next = t;
  if (n->early) {
    drop_old_early(n);
    if (EARLY_KEEP_MS < next)
      next = EARLY_KEEP_MS;
  }
  if (n->replay)
    next = 0;
  if (next == UINT64_MAX)
    uv_timer_stop(&n->timer);
  else
    uv_timer_start(&n->timer, on_timer, next, 0);
}

/* ---- receiving --------------------------------------------------------- */

static void on_match_msg(proto_conn *c, proto_bytes method, proto_bytes p,
                         void *data) {
  avg_node *n = data;
  (void)method;
  if (n->closing)
    return;
  if (!n->m) {
    /* Not matchmaking: a JOIN still deserves its answer. */
    proto_group_msg g;
    if (proto_group_decode(p.p, p.n, &g, NULL, 0) == 0 &&
        g.type == PROTO_T_AVG_JOIN) {
      proto_group_msg r = {.type = PROTO_T_AVG_REPLY,
                           .nonce = g.nonce,
                           .code = PROTO_JOIN_NOT_LOOKING};
      uint8_t buf[128];
      size_t len;
      if (proto_group_encode(&r, buf, sizeof buf, &len) == 0)
        proto_conn_oneway(c, METHOD_MATCH, buf, len);
    }
    return;
  }
  avg_match_handle(n->m, proto_conn_peer(c)->id, p.p, p.n);
  arm(n);
}

static void on_round_msg(proto_conn *c, proto_bytes method, proto_bytes p,
                         void *data) {
  avg_node *n = data;
  const uint8_t *from = proto_conn_peer(c)->id;
  (void)method;
  if (n->closing)
    return;
  avg__meter_add(&n->meter, uv_now(n->cfg.loop), p.n);
  if (n->r) {
    size_t k = member_index(n, from);
    if (k != SIZE_MAX && !other_group(n, p.p, p.n)) {
      avg_round_handle(n->r, k, p.p, p.n);
      arm(n);
      return;
    }
  }
  /* A WAIT is for a round under way; without one it says nothing. */
  if (p.n >= 3 && p.p[2] == PROTO_T_AVG_WAIT)
    return;
  /* Before our group is known (or before our round starts): keep it,
   * within bounds. */
  if (n->nearly >= EARLY_MAX || n->early_bytes + p.n > EARLY_BYTES_MAX) {
    char who[13];
    proto_hex(from, 6, who);
    bee_debug("avg", "round message from %s outside a round: dropped", who);
    return;
  }
  early *e = malloc(sizeof *e + p.n);
  if (!e)
    return;
  memcpy(e->from, from, PROTO_ID_BYTES);
  e->at_ms = uv_now(n->cfg.loop);
  e->len = p.n;
  memcpy(e->buf, p.p, p.n);
  e->next = n->early;
  n->early = e;
  n->nearly++;
  n->early_bytes += p.n;
  arm(n);
}

/* ---- public ------------------------------------------------------------ */

/* The third field of a /proc/sys/net/ipv4/tcp_[rw]mem line (the most the
 * kernel lets a socket's buffer grow to), or 0 if unreadable. */
static size_t tcp_mem_max(const char *path) {
  FILE *f = fopen(path, "r");
  unsigned long long lo, def, hi;
  int got = f ? fscanf(f, "%llu %llu %llu", &lo, &def, &hi) : 0;
  if (f)
    fclose(f);
  return got == 3 ? (size_t)hi : 0;
}

/* One TCP stream's largest window in this network namespace, as the
 * kernel's buffer ceilings allow: the receiver advertises about half its
 * buffer (the rest is overhead), and the sender keeps no more in flight
 * than its own buffer holds.  We read our own host's settings for both
 * ends.  0 when unknown (no auto stripes then). */
static size_t kernel_stream_window(void) {
  size_t r = tcp_mem_max("/proc/sys/net/ipv4/tcp_rmem") / 2;
  size_t w = tcp_mem_max("/proc/sys/net/ipv4/tcp_wmem");
  return r < w ? r : w;
}

int avg_node_new(const avg_node_config *cfg, avg_node **out) {
  if (!cfg->loop || !cfg->host || !cfg->self_id || !cfg->dht.declare ||
      !cfg->dht.fetch)
    return BEE_ERANGE;
  avg_node *n = calloc(1, sizeof *n);
  if (!n)
    return -ENOMEM;
  n->cfg = *cfg;
  memcpy(n->self, cfg->self_id, PROTO_ID_BYTES);
  n->window_bytes = cfg->stream_window_bytes ? cfg->stream_window_bytes
                                             : kernel_stream_window();
  int rc;
  if ((rc = proto_host_on_oneway(cfg->host, METHOD_MATCH, on_match_msg, n)) ||
      (rc = proto_host_on_oneway(cfg->host, METHOD_ROUND, on_round_msg, n)) ||
      (rc = uv_timer_init(cfg->loop, &n->timer))) {
    proto_host_on_oneway(cfg->host, METHOD_MATCH, NULL, NULL);
    proto_host_on_oneway(cfg->host, METHOD_ROUND, NULL, NULL);
    free(n);
    return rc;
  }
  n->timer.data = n;
  n->refs = 2; /* the owner and the timer */
  *out = n;
  return 0;
}

void avg_node_request_default(avg_node_request *req) {
  memset(req, 0, sizeof *req);
  avg_match_config_default(&req->match);
  avg_round_config_default(&req->round);
  req->round.window = 0; /* from the links (auto_window) */
  req->stripes = AVG_STRIPES_AUTO;
}

/* An averaging starts: cb is owed once it ends. */
static void begin_op(avg_node *n, avg_node_cb cb, void *arg) {
  memset(&n->mstats, 0, sizeof n->mstats);
  n->busy = true;
  n->cb = cb;
  n->arg = arg;
}

/* rc: whether it started; if not, nothing is owed. */
static int end_op(avg_node *n, int rc) {
  if (rc) {
    n->busy = false;
    n->cb = NULL;
    return rc;
  }
  arm(n);
  return 0;
}

/* The matchmaking for req, then the round unless match_only. */
static int match(avg_node *n, const avg_node_request *req, bool match_only,
                 avg_node_cb cb, void *arg) {
  if (n->closing || n->busy)
    return BEE_ERANGE;
  n->req = *req;
  memcpy(n->req.match.self_id, n->self, PROTO_ID_BYTES);
  avg_match_io io = {.ctx = n,
                     .now_ms = now_ms,
                     .unix_ms = unix_ms,
                     .declare = match_declare,
                     .fetch = match_fetch,
                     .send = match_send,
                     .random = match_random};
  avg_match_free(n->m);
  n->m = NULL;
  int rc = avg_match_new(&n->req.match, &io, &n->m);
  if (rc)
    return rc;
  begin_op(n, cb, arg);
  n->match_only = match_only;
  return end_op(n, avg_match_start(n->m, on_match, n));
}

int avg_node_average(avg_node *n, const avg_node_request *req, avg_node_cb cb,
                     void *arg) {
  return match(n, req, false, cb, arg);
}

int avg_node_match(avg_node *n, const avg_node_request *req, avg_node_cb cb,
                   void *arg) {
  return match(n, req, true, cb, arg);
}

void avg_node_cancel(avg_node *n) {
  if (!n || n->closing || !n->busy)
    return;
  if (n->r) { /* on_round finishes it, with BEE_ECANCELED */
    avg_round_free(n->r);
    return;
  }
  avg_match *m = n->m; /* tells its leader or followers it left */
  n->m = NULL;
  n->match_only = false;
  avg_match_free(m);
  if (n->busy)
    finish(n, BEE_ECANCELED, NULL);
  arm(n);
}

bool avg_node_matching(const avg_node *n) {
  return n && !n->closing && n->busy && n->m && !n->r;
}

bool avg_node_in_round(const avg_node *n) { return n && !n->closing && n->r; }

int avg_node_round(avg_node *n, const avg_group *g, const avg_node_request *req,
                   avg_node_cb cb, void *arg) {
  if (n->closing || n->busy || !g || g->nmembers == 0 ||
      g->nmembers > AVG_GROUP_MAX || g->self >= g->nmembers ||
      memcmp(g->members[g->self].id, n->self, PROTO_ID_BYTES) != 0)
    return BEE_ERANGE;
  n->req = *req;
  avg_match_free(n->m); /* a JOIN now finds us not looking */
  n->m = NULL;
  begin_op(n, cb, arg);
  return end_op(n, start_round(n, g, false));
}

/* Sends m, a round message for g, to every other member of g. */
static void to_group(avg_node *n, const avg_group *g, proto_avg_msg *m) {
  uint8_t buf[PROTO_AVG_HDR_MAX + PROTO_TEXT_MAX];
  size_t len;
  memcpy(m->group, g->id, sizeof m->group);
  if (proto_avg_encode(m, buf, sizeof buf, &len))
    return;
  for (size_t k = 0; k < g->nmembers; k++)
    if (k != g->self && g->members[k].mode != PROTO_MODE_CLIENT)
      send_to(n, g->members[k].id, g->members[k].addr, buf, len, true);
    else if (k != g->self) /* a CLIENT dials us; without a connection it is
                              gone */
      send_to(n, g->members[k].id, NULL, buf, len, true);
}

static bool group_ok(const avg_node *n, const avg_group *g) {
  return n && !n->closing && g && g->nmembers <= AVG_GROUP_MAX &&
         g->self < g->nmembers;
}

void avg_node_leave(avg_node *n, const avg_group *g, const char *why) {
  if (!group_ok(n, g))
    return;
  size_t wlen = why ? strlen(why) : 0;
  proto_avg_msg m = {.type = PROTO_T_AVG_ABORT,
                     .sender = (uint32_t)g->self,
                     .code = BEE_ECANCELED,
                     .text = {(const uint8_t *)why,
                              wlen > PROTO_TEXT_MAX ? PROTO_TEXT_MAX : wlen}};
  to_group(n, g, &m);
}

void avg_node_wait(avg_node *n, const avg_group *g) {
  if (!group_ok(n, g))
    return;
  proto_avg_msg m = {.type = PROTO_T_AVG_WAIT};
  to_group(n, g, &m);
}

double avg_node_bandwidth_mbit(const avg_node *n) {
  return avg__meter_mbit(&n->meter);
}

void avg_node_declared(avg_node *n, const avg_decl *v, size_t count) {
  if (n->closing || !n->m)
    return;
  avg_match_declared(n->m, v, count);
  arm(n);
}

void avg_node_drain(avg_node *n, proto_conn *c) {
  if (n->closing || !n->r)
    return;
  size_t k = member_index(n, proto_conn_peer(c)->id);
  if (k != SIZE_MAX) {
    avg_round_drain(n->r, k);
    arm(n);
  }
}

void avg_node_conn_down(avg_node *n, proto_conn *c) {
  stripes_drop(n, c); /* never sent on again, closing or not */
  if (n->closing || (!n->m && !n->r))
    return;
  /* Only if no other connection to that peer is left. */
  const uint8_t *id = proto_conn_peer(c)->id;
  proto_conn *other = proto_host_find(n->cfg.host, id);
  if (other && other != c)
    return;
  if (n->m)
    avg_match_peer_gone(n->m, id);
  /* A member of the round under way: one whose process died (a
   * preempted VM) would hold the others until its reducer timeout while
   * they wait for its results; a live one keeps its connection. */
  if (n->r) {
    size_t k = member_index(n, id);
    stripes *st = stripes_find(n, id, false);
    if (k != SIZE_MAX && k != n->group.self && !(st && st->up))
      avg_round_gone(n->r, k);
  }
  arm(n);
}

static void timer_closed(uv_handle_t *h) { unref(h->data); }

void avg_node_close(avg_node *n) {
  if (!n || n->closing)
    return;
  n->closing = true;
  proto_host_on_oneway(n->cfg.host, METHOD_MATCH, NULL, NULL);
  proto_host_on_oneway(n->cfg.host, METHOD_ROUND, NULL, NULL);
  /* The round's and the match's callbacks run now, with BEE_ECANCELED. */
  if (n->r) {
    avg_round *r = n->r;
    avg_round_free(r);
  }
  if (n->m) {
    avg_match *m = n->m;
    n->m = NULL;
    avg_match_free(m);
  }
  if (n->busy)
    finish(n, BEE_ECANCELED, NULL);
  group_free(n);
  /* Our stripes go with us; their on_down finds them gone already. */
  stripes *str = n->str;
  size_t nstr = n->nstr;
  n->nstr = 0;
  for (size_t i = 0; i < nstr; i++)
    for (unsigned k = 0; k < str[i].up; k++)
      proto_conn_close(str[i].c[k], 0, "averager closed");
  for (dial *d = n->dials; d; d = d->next)
    d->gone = true; /* their callbacks free them */
  n->dials = NULL;
  while (n->early) {
    early *e = n->early;
    n->early = e->next;
    free(e);
  }
  uv_close((uv_handle_t *)&n->timer, timer_closed);
  unref(n);
}
