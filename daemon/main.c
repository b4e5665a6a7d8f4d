/* main.c: beed, one node of a swarm.
 *
 * Reads the configuration, checks this node's identity and token before
 * touching the network, then runs one libuv loop: the transport's host,
 * the join targets (dialed with exponential backoff until connected), the
 * swarm membership of members.c, with --run-id the training of train.c, a
 * status line every --status-interval seconds, and SIGINT/SIGTERM for a
 * clean shutdown.
 *
 * Exit status: 0 after a clean shutdown, 1 when the node cannot start,
 * 2 for a bad flag or config line.
 */
#include "bee.h"
#include "bee-config.h"
#include "dht.h"

#include <errno.h>
#include <signal.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define COMP "beed"
#define BACKOFF_MIN_MS 1000
#define BACKOFF_MAX_MS 30000
#define ASK_MIN_MS 1000  /* first swarm.peers refresh after a join */
#define ASK_MAX_MS 30000 /* refreshes slow down to this */
#define STABLE_MS 10000  /* a connection this old resets the backoff */
#define KNOWN_SAVE_MS 30000 /* --peers-file rewritten (when changed) */
/* --model external: a new trainer's model, checked against the swarm's
 * peers of its run: this many asked at most, each answer awaited so
 * long. */
#define SCHEMA_METHOD "run.schema"
#define SCHEMA_ASK_MAX 8
#define SCHEMA_CALL_MS 3000
#define TOKEN_CHECK_MS 5000 /* --token's file looked at for a renewal */
#define KNOWN_WAIT_MS 5000  /* a bee without --join waits so long for the
                               known peers before it trains on its own */

typedef struct bee_daemon bee_daemon;

/* One --join target: dialed until connected, and again when lost. */
typedef struct bee_join {
  bee_daemon *d;
  const char *target; /* in d->cfg */
  uv_timer_t timer;
  uint64_t backoff_ms; /* next retry delay before jitter */
  uint64_t up_at_ms;   /* loop time of the last connection */
  bool dialing;
  bool self; /* the target is this node: never dialed again */
  bool have_id;
  uint8_t id[PROTO_ID_BYTES]; /* who answered there last time */
} bee_join;

struct bee_daemon {
  uv_loop_t loop;
  bee_config cfg;
  proto_identity id;
  proto_token token;
  proto_revocation revoked;
  proto_host *host;
  dht_glue *dht;
  bee_revoke revoke;
  bee_members members;
  /* NULL without --run-id; with --model external, until a trainer came */
  bee_train *train;
  bee_local_server *trainers; /* --model external: where it comes */
  /* Sessions of trainers gone, stopped: a DHT answer under way may
   * still reach them, so they are freed at exit. */
  bee_train **gone;
  size_t ngone;
  bool session_ending; /* the trainer left: leaving the run */
  /* A trainer whose model is being checked against the swarm's: the
   * peers asked (SCHEMA_METHOD), the calls still out, the round of asking
   * (answers of an earlier round are dropped). */
  bee_local *pending;
  unsigned schema_calls;
  uint64_t schema_round;
  uint8_t *hello; /* the last trainer's HELLO, for peers that ask */
  size_t hello_len;
  uint8_t *carry; /* the state its session left (bee_train_last_state) */
  size_t carry_len;
  uint64_t carry_epoch;
  bool joined;      /* bee_train_joined's moment has come */
  bool expect_join; /* and bee_train_expect_join's applies */
  unsigned port;    /* the one we listen on (0: none) */
  bee_control control;
  uv_signal_t sigint, sigterm, sighup;
  uv_timer_t token_timer;  /* --token: renewals, expiry warnings */
  proto_file_watch token_watch; /* the token file as last read */
  proto_file_watch rl_watch;    /* the --revocations file as last read */
  unsigned token_warned;        /* expiry warnings given for the token */
  uv_timer_t status_timer;
  uv_timer_t ask_timer; /* asks the join targets for their peers */
  uv_timer_t notify_timer; /* systemd: STATUS= and WATCHDOG=1 */
  uv_timer_t known_timer;  /* writes --peers-file */
  uv_timer_t known_wait;   /* no --join: how long the known peers may take */
  bee_known known;         /* read from --peers-file at start */
  bee_known known_saved;   /* what the file holds now */
  bool known_failing;      /* the last write failed (warned once) */
  uint64_t watchdog_ms;
  uint64_t ask_ms;
  bee_join joins[BEE_JOIN_MAX];
  bool stopping;
  bool leaving; /* telling the run we leave, then stopping */
  int exit_code;
};

/* ---- join targets ------------------------------------------------------- */

/* delay_ms give or take a fifth, so restarted swarms do not dial in step. */
static uint64_t jitter(uint64_t delay_ms) {
  return delay_ms * (800 + randombytes_uniform(401)) / 1000;
}

static void join_dial(bee_join *j);

/* The node joined the swarm (or found none to join): training may start. */
static void daemon_joined(bee_daemon *d) {
  d->joined = true;
  bee_train_joined(d->train);
}

static void join_timer_cb(uv_timer_t *t) { join_dial(t->data); }

/* Schedules the next attempt and doubles the backoff. */
static void join_retry(bee_join *j, const char *why) {
  uint64_t delay = jitter(j->backoff_ms);
  bee_info(COMP, "join %s: %s; retrying in %.1f s", j->target, why,
           (double)delay / 1000);
  j->backoff_ms *= 2;
  if (j->backoff_ms > BACKOFF_MAX_MS)
    j->backoff_ms = BACKOFF_MAX_MS;
  uv_timer_start(&j->timer, join_timer_cb, delay, 0);
}

static void ask_timer_cb(uv_timer_t *t) {
  bee_daemon *d = t->data;
  for (size_t i = 0; i < d->cfg.njoin; i++) {
    bee_join *j = &d->joins[i];
    const bee_member *e =
        j->have_id ? bee_members_find(&d->members, j->id) : NULL;
    if (e && e->nconns)
      bee_members_ask(&d->members, e->conns[0]);
  }
  d->ask_ms = d->ask_ms * 2 > ASK_MAX_MS ? ASK_MAX_MS : d->ask_ms * 2;
  uv_timer_start(&d->ask_timer, ask_timer_cb, jitter(d->ask_ms), 0);
}

static void join_connect_cb(proto_host *h, proto_conn *c, int status,
                            void *arg) {
  bee_join *j = arg;
  bee_daemon *d = j->d;
  j->dialing = false;
  if (d->stopping)
    return;
  if (status == BEE_ESELF) {
    j->self = true;
    bee_warn(COMP, "join %s: that is this node; not dialing it again",
             j->target);
    bool all_self = true; /* a config that names every node, this one too */
    for (size_t i = 0; i < d->cfg.njoin; i++)
      all_self &= d->joins[i].self;
    if (all_self)
      daemon_joined(d);
    return;
  }
  if (status || !c) {
    join_retry(j, bee_strerror(status));
    return;
  }
  const proto_peer *p = proto_conn_peer(c);
  char hex[2 * PROTO_ID_BYTES + 1];
  proto_hex(p->id, PROTO_ID_BYTES, hex);
  bee_info(COMP, "join %s: connected to %s", j->target, hex);
  memcpy(j->id, p->id, PROTO_ID_BYTES);
  j->have_id = true;
  j->up_at_ms = uv_now(&d->loop);
  /* c may be a connection the peer opened to us first: the transport keeps
   * one per peer and hands us that one. */
  bee_members_up(&d->members, c);
  bee_members_ask(&d->members, c);
  /* Ask again soon: peers that joined at the same moment show up late. */
  d->ask_ms = ASK_MIN_MS;
  uv_timer_start(&d->ask_timer, ask_timer_cb, jitter(d->ask_ms), 0);
}

static void join_dial(bee_join *j) {
  bee_daemon *d = j->d;
  if (d->stopping || j->dialing || j->self)
    return;
  if (j->have_id && bee_members_find(&d->members, j->id))
    return; /* already connected to whoever answers there */
  int rc = proto_host_connect(d->host, j->target, PROTO_PURPOSE_CONTROL,
                              join_connect_cb, j);
  if (rc) {
    join_retry(j, bee_strerror(rc));
    return;
  }
  j->dialing = true;
}

/* The last connection to peer id went down: dial the join targets that
 * led to it.  A connection that lived long enough resets the backoff. */
static void joins_peer_gone(bee_daemon *d, const uint8_t id[PROTO_ID_BYTES]) {
  for (size_t i = 0; i < d->cfg.njoin; i++) {
    bee_join *j = &d->joins[i];
    if (!j->have_id || memcmp(j->id, id, PROTO_ID_BYTES) != 0 || j->self ||
        j->dialing)
      continue;
    if (uv_now(&d->loop) - j->up_at_ms >= STABLE_MS)
      j->backoff_ms = BACKOFF_MIN_MS;
    join_retry(j, "connection lost");
  }
}

/* ---- host callbacks ------------------------------------------------------ */

static void on_up(proto_conn *c, int status, void *data) {
  bee_daemon *d = data;
  if (!d->stopping && status == 0)
    bee_members_up(&d->members, c);
}

static void on_drain(proto_conn *c, void *data) {
  bee_daemon *d = data;
  bee_train_drain(d->train, c);
}

static void on_down(proto_conn *c, int status, void *data) {
  bee_daemon *d = data;
  uint8_t gone[PROTO_ID_BYTES];
  bee_train_conn_down(d->train, c);
  if (bee_members_down(&d->members, c, status, gone) == 1 && !d->stopping)
    joins_peer_gone(d, gone);
}

static void on_oneway(proto_conn *c, proto_bytes method, proto_bytes payload,
                      void *data) {
  bee_daemon *d = data;
  char name[PROTO_METHOD_MAX + 1];
  if (!bee_members_oneway(&d->members, c, method, payload))
    bee_debug(COMP, "ignoring one-way %s",
              bee_printable(method.p, method.n, name, sizeof name));
}

/* ---- life cycle ---------------------------------------------------------- */

static void status_cb(uv_timer_t *t) {
  bee_daemon *d = t->data;
  bee_members_log_status(&d->members);
  if (d->dht) {
    dht_info in;
    dht_node_info(dht_glue_node(d->dht), &in);
    bee_info(COMP, "dht: %zu contacts in %zu buckets, %zu keys (%zu records, "
             "%zu bytes), %zu lookups running, %zu peers blacklisted, %zu "
             "lost being retried",
             in.contacts, in.buckets, in.keys, in.records, in.bytes,
             in.lookups, in.blacklisted, in.lost);
  }
}

/* `beectl status`: who we are, our peers, the DHT, the training. */
static size_t control_status(void *arg, char *buf, size_t cap) {
  bee_daemon *d = arg;
  char hex[2 * PROTO_ID_BYTES + 1];
  proto_hex(d->id.id, PROTO_ID_BYTES, hex);
  size_t n = 0;
  int k = snprintf(buf, cap, "beed %s\npeer-id %s\nswarm %s\nconnected %zu\n",
                   BEE_VERSION, hex, d->cfg.swarm, d->members.n);
  if (k > 0)
    n = (size_t)k < cap ? (size_t)k : cap - 1;
  if (d->cfg.moderated && n < cap) {
    k = snprintf(buf + n, cap - n, "token-expires %llu\nrevocations-seq %llu\n",
                 (unsigned long long)d->token.expires,
                 (unsigned long long)d->revoked.seq);
    if (k > 0)
      n += (size_t)k < cap - n ? (size_t)k : cap - n - 1;
  }
  if (d->dht && n < cap) {
    dht_info in;
    dht_node_info(dht_glue_node(d->dht), &in);
    k = snprintf(buf + n, cap - n,
                 "dht-contacts %zu\ndht-keys %zu\ndht-lost %zu\n",
                 in.contacts, in.keys, in.lost);
    if (k > 0)
      n += (size_t)k < cap - n ? (size_t)k : cap - n - 1;
  }
  if (d->train && n < cap)
    n += bee_train_report(d->train, buf + n, cap - n);
  return n;
}

static void daemon_stop(bee_daemon *d);

static void begin_stop(bee_daemon *d, const char *why);

/* ---- the access token: renewals and expiry ------------------------------ */

/* "24.0 h", "12 min", "8 s": a token's time left, for the log. */
typedef struct { char s[32]; } span_text;
static span_text span(int64_t left_s) {
  span_text t;
  if (left_s >= 3600)
    snprintf(t.s, sizeof t.s, "%.1f h", (double)left_s / 3600);
  else if (left_s >= 60)
    snprintf(t.s, sizeof t.s, "%lld min", (long long)(left_s / 60));
  else
    snprintf(t.s, sizeof t.s, "%lld s", (long long)(left_s > 0 ? left_s : 0));
  return t;
}

/* Reads --token again.  A token that passes the start-up checks (this
 * key, the swarm, the moderator, the clock, the revocations) with this
 * node's role replaces the one held, and the connected peers are told
 * (proto_host_token_renewed), so the connections outlive the old one. */
static void token_reload(bee_daemon *d, bool hup) {
  const char *path = d->cfg.token;
  proto_token t;
  uint64_t now = (uint64_t)time(NULL);
  int rc = proto_token_renewal(path, &d->token, d->cfg.moderator_pk,
                               d->cfg.swarm, d->id.pk,
                               PROTO_ROLE_BEE | PROTO_ROLE_AUX, now,
                               &d->revoked, &t);
  span_text left = span((int64_t)d->token.expires - (int64_t)now);
  if (rc == BEE_ETOKEN_ROLE && t.raw_len && t.role != d->token.role) {
    bee_warn(COMP, "token %s: role %s, but this node runs as %s: restart "
             "beed to change its role; the current token stays (expires in "
             "%s)", path, proto_role_name(t.role),
             proto_role_name(d->token.role), left.s);
  } else if (rc < 0) {
    bee_warn(COMP, "token %s: %s; the current one stays (expires in %s)",
             path, bee_strerror(rc), left.s);
  } else if (rc == 0) {
    if (hup)
      bee_info(COMP, "token %s: unchanged (expires in %s)", path, left.s);
  } else {
    d->token = t;
    size_t told = d->host ? proto_host_token_renewed(d->host) : 0;
    d->token_warned = proto_token_warnings_due((int64_t)(t.expires - now));
    bee_info(COMP, "token %s renewed: role %s, expires in %s; %zu "
             "connection%s told", path, proto_role_name(t.role),
             span((int64_t)t.expires - (int64_t)now).s, told,
             told == 1 ? "" : "s");
  }
  sodium_memzero(&t, sizeof t);
}

/* Reads --revocations again: a list with a higher seq than the one held
 * (from the file or the DHT) replaces it, disconnects the peers it
 * revokes and goes into the DHT. */
static void revocations_reload(bee_daemon *d, bool hup) {
  const char *path = d->cfg.revocations;
  proto_revocation rl;
  proto_revocation_init(&rl);
  unsigned long long held = d->revoked.seq;
  int rc = proto_revocation_load(&rl, path, d->cfg.moderator_pk, d->cfg.swarm);
  if (rc) {
    bee_warn(COMP, "revocations %s: %s; the list held stays (seq %llu)", path,
             bee_strerror(rc), held);
  } else if (rl.seq == held) {
    if (hup)
      bee_info(COMP, "revocations %s: unchanged (seq %llu)", path, held);
  } else if (rl.seq < held) {
    bee_warn(COMP, "revocations %s: list %llu is older than the one held "
             "(%llu, from the DHT), which stays", path,
             (unsigned long long)rl.seq, held);
  } else {
    bee_info(COMP, "revocations %s: list %llu replaces %llu: %zu revoked "
             "key%s", path, (unsigned long long)rl.seq, held, rl.n,
             rl.n == 1 ? "" : "s");
    bee_revoke_offer(&d->revoke, &rl);
    if (proto_revocation_has(&d->revoked, d->id.pk))
      bee_err(COMP, "this node's own key is revoked: peers refuse it");
  }
  proto_revocation_close(&rl);
}

/* Whether a watched file changed since it was read (always at SIGHUP);
 * one that cannot be looked at is warned of once (what: "token"...). */
static bool file_changed(const char *what, const char *path,
                         proto_file_watch *w, bool hup) {
  int err;
  bool changed = proto_file_changed(w, path, &err);
  if (err || (hup && w->failed))
    bee_warn(COMP, "%s %s: %s; what was read from it stays", what, path,
             strerror(-w->error));
  return changed || (hup && !w->failed);
}

/* Reads the token and revocation files again when they changed (or at
 * SIGHUP), then warns as the token held nears its expiry. */
static void token_check(bee_daemon *d, bool hup) {
  if (!d->cfg.moderated) {
    if (hup)
      bee_info(COMP, "SIGHUP: an open swarm has no token to read again");
    return;
  }
  if (d->cfg.revocations[0] &&
      file_changed("revocations", d->cfg.revocations, &d->rl_watch, hup))
    revocations_reload(d, hup);
  if (file_changed("token", d->cfg.token, &d->token_watch, hup))
    token_reload(d, hup);
  int64_t left = (int64_t)d->token.expires - (int64_t)time(NULL);
  unsigned due = proto_token_warnings_due(left);
  if (due <= d->token_warned)
    return;
  d->token_warned = due;
  if (left > 0)
    bee_warn(COMP, "token %s expires in %s: peers will close this "
             "node's connections then; put a renewed token in its place "
             "(read within %d s, or at SIGHUP)", d->cfg.token, span(left).s,
             TOKEN_CHECK_MS / 1000);
  else
    bee_err(COMP, "token %s has expired: peers refuse this node until a "
            "renewed token is put in its place", d->cfg.token);
}

static void token_timer_cb(uv_timer_t *t) { token_check(t->data, false); }

static void sighup_cb(uv_signal_t *s, int signum) {
  (void)signum;
  bee_info(COMP, "SIGHUP: reading the token%s again",
           ((bee_daemon *)s->data)->cfg.revocations[0] ? " and revocations"
                                                      : "");
  token_check(s->data, true);
}

static void control_leave(void *arg) { begin_stop(arg, "beectl leave"); }

/* systemd's STATUS= line: what `systemctl status beed@...` shows. */
static void notify_status(bee_daemon *d, const char *extra) {
  char line[256];
  if (d->train)
    bee_train_status(d->train, line, sizeof line);
  else
    snprintf(line, sizeof line, "%zu peers", d->members.n);
  bee_notify("%sSTATUS=%s", extra, line);
}

static void notify_cb(uv_timer_t *t) {
  bee_daemon *d = t->data;
  notify_status(d, d->watchdog_ms ? "WATCHDOG=1\n" : "");
}

static void known_collect(const uint8_t id[PROTO_ID_BYTES], const char *addr,
                          void *arg) {
  (void)id;
  bee_known_add(arg, addr);
}

/* Writes the DHT's contacts to --peers-file when they changed, then the
 * addresses the file held before, up to BEE_KNOWN_MAX: right after a
 * join the routing table holds a few contacts only, and a crash then
 * must not cost the bee the rest of the swarm it knew.  An empty routing
 * table leaves the file alone. */
static void known_save(bee_daemon *d) {
  if (!d->cfg.peers_file[0] || !d->dht)
    return;
  bee_known now = {.n = 0};
  dht_node_foreach_contact(dht_glue_node(d->dht), known_collect, &now);
  if (now.n == 0)
    return;
  for (size_t i = 0; i < d->known_saved.n; i++)
    bee_known_add(&now, d->known_saved.addr[i]);
  if (bee_known_same(&now, &d->known_saved))
    return;
  char err[BEE_PATH_MAX + 128];
  if (bee_known_save(&now, d->cfg.peers_file, err, sizeof err)) {
    if (!d->known_failing)
      bee_warn(COMP, "peers file %s (retried every %d s)", err,
               KNOWN_SAVE_MS / 1000);
    d->known_failing = true;
    return;
  }
  if (d->known_failing)
    bee_info(COMP, "peers file %s written again", d->cfg.peers_file);
  d->known_failing = false;
  bee_debug(COMP, "peers file %s: %zu addresses", d->cfg.peers_file, now.n);
  d->known_saved = now;
}

static void known_timer_cb(uv_timer_t *t) { known_save(t->data); }

static void known_wait_cb(uv_timer_t *t) {
  bee_daemon *d = t->data;
  bee_info(COMP, "no known peer answered in %.0f s; training may start "
           "on its own", KNOWN_WAIT_MS / 1000.0);
  daemon_joined(d);
}

static void dht_boot_cb(dht_node *n, int status, const dht_stats *st,
                        void *arg) {
  bee_daemon *d = arg;
  dht_info in;
  if (status) {
    if (!d->stopping)
      bee_warn(COMP, "dht: bootstrap ended: %s", bee_strerror(status));
    return;
  }
  dht_node_info(n, &in);
  bee_info(COMP, "dht: joined in %llu ms: %zu contacts", (unsigned long long)st->ms,
           in.contacts);
  uv_timer_stop(&d->known_wait);
  daemon_joined(d);
  known_save(d);
}

/* Stops everything; uv_run returns once the handles are closed. */
static void daemon_stop(bee_daemon *d) {
  if (d->stopping)
    return;
  d->stopping = true;
  bee_notify("STOPPING=1\nSTATUS=stopping");
  bee_control_stop(&d->control);
  bee_local_close(d->trainers);
  d->trainers = NULL;
  bee_local_free(d->pending);
  d->pending = NULL;
  d->schema_round++;
  bee_train_stop(d->train); /* before the DHT it publishes in */
  bee_members_stop(&d->members);
  bee_revoke_stop(&d->revoke);
  known_save(d); /* the contacts of the last moment, for the next start */
  dht_glue_close(d->dht);
  d->dht = NULL;
  if (d->host)
    proto_host_close(d->host);
  d->host = NULL;
  uv_close((uv_handle_t *)&d->sigint, NULL);
  uv_close((uv_handle_t *)&d->sigterm, NULL);
  uv_close((uv_handle_t *)&d->sighup, NULL);
  uv_close((uv_handle_t *)&d->token_timer, NULL);
  uv_close((uv_handle_t *)&d->status_timer, NULL);
  uv_close((uv_handle_t *)&d->ask_timer, NULL);
  uv_close((uv_handle_t *)&d->notify_timer, NULL);
  uv_close((uv_handle_t *)&d->known_timer, NULL);
  uv_close((uv_handle_t *)&d->known_wait, NULL);
  for (size_t i = 0; i < d->cfg.njoin; i++)
    uv_close((uv_handle_t *)&d->joins[i].timer, NULL);
}

/* --model external: the session of a trainer that left has left the
 * run; beed keeps its state for the next trainer and waits for it. */
static void session_left(void *arg) {
  bee_daemon *d = arg;
  bee_train *t = d->train;
  d->session_ending = false;
  if (d->stopping || !t)
    return; /* daemon_stop has it */
  free(d->carry);
  d->carry = bee_train_last_state(t, &d->carry_len, &d->carry_epoch);
  bee_train_stop(t);
  bee_train_shed(t);
  bee_train **g = realloc(d->gone, (d->ngone + 1) * sizeof *g);
  if (!g) {
    d->exit_code = 1;
    daemon_stop(d);
    return;
  }
  d->gone = g;
  d->gone[d->ngone++] = t;
  d->train = NULL;
  bee_local_idle(d->trainers);
  if (d->carry)
    bee_info(COMP,
             "the trainer is gone; this beed left the run and keeps its "
             "state of epoch %llu for the next trainer on %s",
             (unsigned long long)d->carry_epoch, d->cfg.trainer_socket);
  else
    bee_info(COMP,
             "the trainer is gone; this beed left the run and waits "
             "for the next trainer on %s",
             d->cfg.trainer_socket);
}

static void train_fatal(void *arg) {
  bee_daemon *d = arg;
  if (bee_external(&d->cfg) && d->train && !d->stopping && !d->leaving) {
    if (!d->session_ending) {
      d->session_ending = true;
      bee_train_leave(d->train, session_left, d);
    }
    return;
  }
  d->exit_code = 1;
  daemon_stop(d);
}

static void leave_done(void *arg) { daemon_stop(arg); }

/* A clean stop: a training bee first tells its run it leaves (at most
 * 2 s); a second request, or a bee that does not train, stops at once. */
static void begin_stop(bee_daemon *d, const char *why) {
  bee_info(COMP, "shutting down (%s)", why);
  if (d->train && !d->leaving && !d->stopping) {
    d->leaving = true;
    bee_train_leave(d->train, leave_done, d);
    return;
  }
  daemon_stop(d);
}

static void signal_cb(uv_signal_t *s, int signum) {
  begin_stop(s->data, signum == SIGINT ? "SIGINT" : "SIGTERM");
}

/* Checks --peers-file's place and reads the addresses it holds.  Returns
 * nonzero, logged, when the file could never be written; one that cannot
 * be read is a warning (it is a cache). */
static int known_load(bee_daemon *d) {
  const char *path = d->cfg.peers_file;
  char err[BEE_PATH_MAX + 128];
  size_t bad, bad_line;
  if (bee_known_prepare(path, err, sizeof err)) {
    bee_err(COMP, "%s", err);
    return 1;
  }
  int rc = bee_known_load(&d->known, path, &bad, &bad_line, err, sizeof err);
  if (rc == -ENOENT) {
    bee_info(COMP, "peers file %s: none yet", path);
    return 0;
  }
  if (rc) {
    bee_warn(COMP, "peers file %s; starting without known peers", err);
    return 0;
  }
  if (bad)
    bee_warn(COMP, "peers file %s:%zu: not HOST:PORT; %zu such line%s skipped",
             path, bad_line, bad, bad == 1 ? "" : "s");
  bee_info(COMP, "peers file %s: %zu known peer%s to join through", path,
           d->known.n, d->known.n == 1 ? "" : "s");
  d->known_saved = d->known;
  return 0;
}

/* Makes every handle, so daemon_stop can close them all whatever fails
 * later. */
static int handles_init(bee_daemon *d) {
  int rc = uv_loop_init(&d->loop);
  if (rc)
    return rc;
  uv_signal_init(&d->loop, &d->sigint);
  uv_signal_init(&d->loop, &d->sigterm);
  uv_signal_init(&d->loop, &d->sighup);
  uv_timer_init(&d->loop, &d->token_timer);
  d->sighup.data = d->token_timer.data = d;
  uv_timer_init(&d->loop, &d->status_timer);
  uv_timer_init(&d->loop, &d->ask_timer);
  uv_timer_init(&d->loop, &d->notify_timer);
  uv_timer_init(&d->loop, &d->known_timer);
  uv_timer_init(&d->loop, &d->known_wait);
  d->notify_timer.data = d->known_timer.data = d->known_wait.data = d;
  bee_revoke_init(&d->revoke, &d->loop, &d->revoked,
                  d->cfg.moderated ? d->cfg.moderator_pk : NULL, d->cfg.swarm,
                  d->cfg.revocation_interval_s);
  d->sigint.data = d->sigterm.data = d;
  d->status_timer.data = d->ask_timer.data = d;
  for (size_t i = 0; i < d->cfg.njoin; i++) {
    bee_join *j = &d->joins[i];
    j->d = d;
    j->target = d->cfg.join[i];
    j->backoff_ms = BACKOFF_MIN_MS;
    uv_timer_init(&d->loop, &j->timer);
    j->timer.data = j;
  }
  return 0;
}

/* Loads the identity, and in a moderated swarm the revocation list and our
 * token, which must let us in: a node with a bad token stops here rather
 * than be refused by every peer. */
static int load_credentials(bee_daemon *d) {
  const bee_config *cfg = &d->cfg;
  char hex[2 * PROTO_PK_BYTES + 1];
  int rc = proto_identity_load(&d->id, cfg->identity, !cfg->check);
  if (rc == -ENOENT && cfg->check) { /* --check makes no file */
    bee_info(COMP, "identity %s: missing; beed would create it (a throwaway "
             "key stands in for the rest of the check)", cfg->identity);
    proto_identity_generate(&d->id);
    rc = 0;
  }
  if (rc) {
    bee_err(COMP, "identity %s: %s", cfg->identity, bee_strerror(rc));
    return rc;
  }
  proto_hex(d->id.id, PROTO_ID_BYTES, hex);
  bee_info(COMP, "peer id %s (identity %s)", hex, cfg->identity);
  proto_hex(d->id.pk, PROTO_PK_BYTES, hex);
  bee_info(COMP, "public key %s", hex);
  if (cfg->open) {
    bee_warn(COMP,
             "open swarm '%s': no moderator, any node that can reach "
             "this one may join",
             cfg->swarm);
    return 0;
  }
  if (cfg->revocations[0]) {
    rc = proto_revocation_load(&d->revoked, cfg->revocations, cfg->moderator_pk,
                               cfg->swarm);
    if (rc) {
      bee_err(COMP, "revocations %s: %s", cfg->revocations, bee_strerror(rc));
      return rc;
    }
    bee_info(COMP, "revocations %s: %zu keys (seq %llu)", cfg->revocations,
             d->revoked.n, (unsigned long long)d->revoked.seq);
    int err;
    proto_file_changed(&d->rl_watch, cfg->revocations, &err);
  }
  rc = proto_token_load(&d->token, cfg->token);
  if (rc) {
    bee_err(COMP, "token %s: %s", cfg->token, bee_strerror(rc));
    return rc;
  }
  uint64_t now = (uint64_t)time(NULL);
  rc = proto_token_verify(&d->token, cfg->moderator_pk, cfg->swarm, d->id.pk,
                          PROTO_ROLE_BEE | PROTO_ROLE_AUX, now,
                          cfg->revocations[0] ? &d->revoked : NULL);
  if (rc) {
    bee_err(COMP, "token %s refused: %s; this node cannot join swarm '%s'",
            cfg->token, bee_strerror(rc), cfg->swarm);
    if (rc == BEE_ETOKEN_PEER)
      bee_err(COMP,
              "the token names another key; this node's public key "
              "is %s",
              hex);
    return rc;
  }
  bee_info(COMP, "token %s: role %s, expires in %s", cfg->token,
           proto_role_name(d->token.role),
           span((int64_t)d->token.expires - (int64_t)now).s);
  int err;
  proto_file_changed(&d->token_watch, cfg->token, &err);
  d->token_warned = proto_token_warnings_due((int64_t)(d->token.expires - now));
  return 0;
}

/* A SIGINT or SIGTERM that comes while beed starts (a stop right after a
 * start, by systemd or a supervisor; loading the training data takes a
 * while) is noted here until the loop watches for them (daemon_start),
 * then raised again, so it still ends in a clean stop and status 0, not
 * in the default action's death (status 143; tools/chaos met it).  A
 * handler, not a blocked mask: threads that libraries start before main
 * (OpenBLAS's) would take the signal with the default action. */
static volatile sig_atomic_t early_stop;

static void early_stop_cb(int signum) { early_stop = signum; }
static void early_hup_cb(int signum) { (void)signum; }

/* --model external: the trainer's model is the swarm's (or nobody could
 * say): the training starts on it, as it would on a built-in one at
 * start. */
static void session_start(bee_daemon *d, bee_local *l) {
  if (l->hello && (!d->hello || d->hello_len != l->hello_len ||
                   memcmp(d->hello, l->hello, l->hello_len) != 0)) {
    free(d->hello);
    d->hello_len = 0;
    if ((d->hello = malloc(l->hello_len))) {
      memcpy(d->hello, l->hello, l->hello_len);
      d->hello_len = l->hello_len;
    }
  }
  int rc = bee_train_new_local(&d->loop, &d->cfg, &d->id, l, d->carry,
                               d->carry_len, d->carry_epoch, &d->train);
  d->carry = NULL;
  if (rc == 0) {
    if (d->expect_join)
      bee_train_expect_join(d->train);
    bee_train_set_members(d->train, &d->members);
    rc = bee_train_start(d->train, d->host, d->port, dht_glue_node(d->dht),
                         train_fatal, d);
  }
  if (rc) {
    train_fatal(d);
    return;
  }
  if (d->joined)
    bee_train_joined(d->train);
}

/* A peer asks for the model of our trainer of its run: our last
 * trainer's HELLO, which lists the tensors. */
static void schema_req_cb(proto_conn *c, uint64_t id, proto_bytes method,
                          proto_bytes payload, void *data) {
  bee_daemon *d = data;
  (void)method;
  size_t n = strlen(d->cfg.run);
  if (!d->hello || payload.n != n || memcmp(payload.p, d->cfg.run, n) != 0)
    proto_conn_reply_error(c, id, BEE_ERANGE, "no trainer of that run here");
  else if (proto_conn_reply(c, id, d->hello, d->hello_len))
    proto_conn_reply_error(c, id, BEE_ETOOBIG, "the model's list is too long");
}

typedef struct schema_ask {
  bee_daemon *d;
  uint64_t round;
} schema_ask;

static void schema_decided(bee_daemon *d, const char *refusal) {
  bee_local *l = d->pending;
  d->pending = NULL;
  d->schema_round++; /* the answers still out are of no use now */
  if (!refusal) {
    session_start(d, l);
    return;
  }
  bee_local_refuse(l, BEE_ERANGE, refusal);
  bee_local_free(l);
  bee_local_idle(d->trainers);
}

static void schema_cb(proto_conn *c, int status, int64_t remote_code,
                      proto_bytes payload, void *arg) {
  schema_ask *a = arg;
  bee_daemon *d = a->d;
  bool mine = a->round == d->schema_round && d->pending;
  free(a);
  (void)remote_code;
  if (!mine)
    return;
  d->schema_calls--;
  proto_local_msg ours, theirs;
  if (status == 0 && proto_local_decode(payload.p, payload.n, &theirs) == 0 &&
      theirs.type == PROTO_T_LOCAL_HELLO &&
      strcmp(theirs.run, d->cfg.run) == 0 &&
      proto_local_decode(d->pending->hello, d->pending->hello_len, &ours) ==
          0) {
    char why[PROTO_TEXT_MAX - 64], text[PROTO_TEXT_MAX], peer[9];
    if (proto_local_tensors_diff(&ours, &theirs, why, sizeof why) == 0) {
      schema_decided(d, NULL);
      return;
    }
    bee_id8(proto_conn_peer(c)->id, peer);
    snprintf(text, sizeof text,
             "the swarm's model is another: %s (as peer %s has it)", why, peer);
    schema_decided(d, text);
    return;
  }
  if (d->schema_calls == 0) /* nobody of the run could say */
    schema_decided(d, NULL);
}

static void schema_ask_one(proto_conn *c, void *arg) {
  bee_daemon *d = arg;
  const proto_peer *p = proto_conn_peer(c);
  if (d->schema_calls >= SCHEMA_ASK_MAX || p->role != PROTO_ROLE_BEE ||
      p->purpose != PROTO_PURPOSE_CONTROL)
    return;
  schema_ask *a = malloc(sizeof *a);
  if (!a)
    return;
  *a = (schema_ask){d, d->schema_round};
  if (proto_conn_call(c, SCHEMA_METHOD, (const uint8_t *)d->cfg.run,
                      strlen(d->cfg.run), SCHEMA_CALL_MS, schema_cb, a,
                      NULL) == 0)
    d->schema_calls++;
  else
    free(a);
}

/* --model external: a trainer's HELLO checked, its memory mapped.  Its
 * model must be the swarm's: peers of the run are asked for theirs, and
 * the first answer decides (a trainer with another model is refused with
 * the first difference); with nobody to ask, or nobody of the run
 * answering, this trainer's model is the run's. */
static void trainer_came(bee_local *l, void *arg) {
  bee_daemon *d = arg;
  if (d->stopping || d->leaving) {
    bee_local_free(l);
    return;
  }
  d->pending = l;
  d->schema_round++;
  d->schema_calls = 0;
  proto_host_foreach(d->host, schema_ask_one, d);
  if (d->schema_calls == 0)
    schema_decided(d, NULL);
}

/* Creates the host, listens and starts dialing.  Returns 0 or a code
 * already logged. */
static int daemon_start(bee_daemon *d) {
  const bee_config *cfg = &d->cfg;
  proto_host_config hc;
  /* Signals first: a SIGTERM during start-up still ends in a clean stop
   * (libuv holds it until the loop runs). */
  uv_signal_start(&d->sigint, signal_cb, SIGINT);
  uv_signal_start(&d->sigterm, signal_cb, SIGTERM);
  uv_signal_start(&d->sighup, sighup_cb, SIGHUP);
  if (early_stop)
    uv_kill(uv_os_getpid(), early_stop);
  proto_host_config_default(&hc);
  hc.loop = &d->loop;
  hc.auth.id = &d->id;
  hc.auth.swarm = cfg->swarm;
  if (cfg->moderated) {
    hc.auth.token = &d->token;
    hc.auth.moderator_pk = cfg->moderator_pk;
    hc.auth.revoked = &d->revoked; /* from the file, then the DHT */
  }
  hc.max_conns = cfg->max_conns;
  hc.on_up = on_up;
  hc.on_down = on_down;
  hc.on_drain = on_drain;
  hc.on_oneway = on_oneway;
  hc.data = d;
  int rc = proto_host_new(&hc, &d->host);
  if (rc) {
    bee_err(COMP, "cannot start the transport: %s", bee_strerror(rc));
    return rc;
  }
  int port = 0;
  if (!cfg->no_listen) {
    rc = proto_host_listen(d->host, cfg->listen, &port);
    if (rc) {
      bee_err(COMP, "listen %s: %s", cfg->listen, bee_strerror(rc));
      return rc;
    }
    bee_info(COMP, "listening on %s (port %d)", cfg->listen, port);
  } else {
    bee_info(COMP, "not listening (--no-listen)");
  }
  if ((rc = bee_members_start(&d->members, d->host, (unsigned)port))) {
    bee_err(COMP, "cannot register the swarm handlers: %s", bee_strerror(rc));
    return rc;
  }
  dht_config dc;
  dht_config_default(&dc);
  dc.id = &d->id;
  dc.port = cfg->client ? 0 : (unsigned)port;
  if ((rc = dht_glue_new(&d->loop, d->host, &dc, bee_revoke_validate,
                         &d->revoke, &d->dht))) {
    bee_err(COMP, "cannot start the DHT: %s", bee_strerror(rc));
    return rc;
  }
  if (cfg->client || !port)
    bee_info(COMP, "dht: client mode: requests only, never in routing tables");
  if (cfg->moderated)
    bee_revoke_start(&d->revoke, d->host, d->dht);
  /* Bootstrap through the --join targets and the known peers of the last
   * run.  A bee without --join waits KNOWN_WAIT_MS for the known ones
   * before it may start a run of its own. */
  const char *targets[BEE_JOIN_MAX + BEE_KNOWN_MAX];
  size_t ntargets = 0;
  for (size_t i = 0; i < cfg->njoin; i++)
    targets[ntargets++] = cfg->join[i];
  for (size_t i = 0; i < d->known.n; i++) {
    bool dup = false;
    for (size_t j = 0; j < cfg->njoin; j++)
      dup |= strcmp(cfg->join[j], d->known.addr[i]) == 0;
    if (!dup)
      targets[ntargets++] = d->known.addr[i];
  }
  d->expect_join = !cfg->njoin && ntargets;
  d->port = (unsigned)port;
  if (d->train && d->expect_join)
    bee_train_expect_join(d->train);
  if ((d->train || bee_external(cfg)) && d->expect_join)
    uv_timer_start(&d->known_wait, known_wait_cb, KNOWN_WAIT_MS, 0);
  bee_train_set_members(d->train, &d->members);
  if (d->train &&
      (rc = bee_train_start(d->train, d->host, (unsigned)port,
                            dht_glue_node(d->dht), train_fatal, d)))
    return rc;
  if (ntargets) {
    rc = dht_bootstrap(dht_glue_node(d->dht), targets, ntargets, dht_boot_cb, d);
    if (rc)
      bee_warn(COMP, "dht: cannot bootstrap: %s", bee_strerror(rc));
  }
  if (cfg->peers_file[0])
    uv_timer_start(&d->known_timer, known_timer_cb, KNOWN_SAVE_MS,
                   KNOWN_SAVE_MS);
  if (cfg->moderated)
    uv_timer_start(&d->token_timer, token_timer_cb, TOKEN_CHECK_MS,
                   TOKEN_CHECK_MS);
  if (cfg->status_interval_s)
    uv_timer_start(&d->status_timer, status_cb,
                   (uint64_t)cfg->status_interval_s * 1000,
                   (uint64_t)cfg->status_interval_s * 1000);
  for (size_t i = 0; i < cfg->njoin; i++)
    join_dial(&d->joins[i]);
  if (cfg->control[0] &&
      (rc = bee_control_start(&d->control, &d->loop, cfg->control,
                              control_status, control_leave, d)))
    return rc;
  if (bee_external(cfg) &&
      ((rc = proto_host_on(d->host, SCHEMA_METHOD, schema_req_cb, d)) ||
       (rc = bee_local_listen(&d->loop, cfg, trainer_came, d, &d->trainers))))
    return rc;
  /* systemd: serving now; then STATUS every 5 s, and WATCHDOG=1 at half
   * the unit's watchdog interval when it has one. */
  if (getenv("NOTIFY_SOCKET")) {
    d->watchdog_ms = bee_notify_watchdog_ms();
    uint64_t every = d->watchdog_ms && d->watchdog_ms < 5000 ? d->watchdog_ms
                                                             : 5000;
    notify_status(d, "READY=1\n");
    uv_timer_start(&d->notify_timer, notify_cb, every, every);
  }
  return 0;
}

/* Where path would be written: a directory that is there and writable
 * (missing: made at start when make is set).  Returns 0 or logs why not. */
static int check_dir(const char *what, const char *dir, bool make) {
  int rc = bee_dir_check(dir);
  if (rc == -ENOENT && make) {
    bee_info(COMP, "%s %s: missing; beed would make it", what, dir);
    return 0;
  }
  if (rc)
    bee_err(COMP, "%s %s: %s", what, dir, strerror(-rc));
  return rc;
}

/* --check: what beed loads at start (the key, token and revocations were
 * loaded by main), then the peers file, the training (data, model,
 * device, the checkpoint to resume from) and the places it would write;
 * a summary on stdout.  Opens no socket and makes no file.  Returns the
 * exit status. */
static int check_only(bee_daemon *d) {
  const bee_config *cfg = &d->cfg;
  int bad = 0;
  if (cfg->peers_file[0] && known_load(d))
    bad++;
  if (cfg->checkpoint_dir[0] &&
      check_dir("--checkpoint-dir", cfg->checkpoint_dir, true))
    bad++;
  if (cfg->control[0]) {
    char dir[BEE_PATH_MAX];
    bee_dir_of(cfg->control, dir, sizeof dir);
    if (check_dir("--control", dir, false))
      bad++;
  }
  if (cfg->trainer_socket[0]) {
    char dir[BEE_PATH_MAX];
    bee_dir_of(cfg->trainer_socket, dir, sizeof dir);
    if (check_dir("--trainer-socket", dir, false))
      bad++;
  }
  if (cfg->run[0] && !bee_external(cfg) &&
      bee_train_new(&d->loop, cfg, &d->id, &d->train))
    bad++;
  if (bad)
    return 1;
  printf("beed: would start: swarm '%s' (%s), %s%s, %zu join target%s",
         cfg->swarm, cfg->open ? "open" : "moderated",
         cfg->no_listen ? "not listening" : "listening on ",
         cfg->no_listen ? "" : cfg->listen, cfg->njoin,
         cfg->njoin == 1 ? "" : "s");
  if (d->known.n)
    printf(" and %zu known peer%s", d->known.n, d->known.n == 1 ? "" : "s");
  if (cfg->run[0])
    printf("; run '%s': %s, %s averaging", cfg->run, cfg->model,
           bee_averaging_name(cfg->averaging));
  printf("\n");
  return 0;
}

static int run(bee_daemon *d) {
  int rc = handles_init(d);
  if (rc) {
    bee_err(COMP, "event loop: %s", uv_strerror(rc));
    return 1;
  }
  bee_members_init(&d->members, d->id.id);
  bee_info(COMP, "swarm '%s' (%s), %zu join target%s", d->cfg.swarm,
           d->cfg.open ? "open" : "moderated", d->cfg.njoin,
           d->cfg.njoin == 1 ? "" : "s");
  if (d->cfg.check)
    d->exit_code = check_only(d);
  else if (d->cfg.peers_file[0] && known_load(d))
    d->exit_code = 1;
  else if (d->cfg.run[0] && !bee_external(&d->cfg) &&
           bee_train_new(&d->loop, &d->cfg, &d->id, &d->train))
    d->exit_code = 1;
  else if (daemon_start(d))
    d->exit_code = 1;
  if (d->exit_code || d->cfg.check)
    daemon_stop(d);
  uv_run(&d->loop, UV_RUN_DEFAULT);
  rc = uv_loop_close(&d->loop);
  if (rc)
    bee_warn(COMP, "event loop not empty at exit: %s", uv_strerror(rc));
  bee_members_close(&d->members);
  bee_train_free(d->train);
  for (size_t i = 0; i < d->ngone; i++)
    bee_train_free(d->gone[i]);
  free(d->gone);
  free(d->carry);
  free(d->hello);
  if (!d->exit_code && !d->cfg.check)
    bee_info(COMP, "stopped");
  return d->exit_code;
}

int main(int argc, char **argv) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = early_stop_cb;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sa.sa_handler = early_hup_cb; /* the token is being read anyway */
  sigaction(SIGHUP, &sa, NULL);
  char err[512];
  bee_daemon *d = calloc(1, sizeof *d);
  if (!d) {
    fprintf(stderr, "beed: out of memory\n");
    return 1;
  }
  int rc = bee_config_parse(&d->cfg, argc, argv, err, sizeof err);
  if (rc) {
    fprintf(stderr, "beed: %s\n(see beed --help)\n", err);
    free(d);
    return 2;
  }
  if (d->cfg.help || d->cfg.version) {
    if (d->cfg.help)
      bee_config_usage(stdout);
    else
      printf("beed %s\n", BEE_VERSION);
    free(d);
    return 0;
  }
  bee_log_set_level(d->cfg.log_level);
  signal(SIGPIPE, SIG_IGN);
  if (sodium_init() < 0) {
    bee_err(COMP, "libsodium failed to initialize");
    free(d);
    return 1;
  }
  bee_info(COMP, "beed %s %s", BEE_VERSION,
           d->cfg.check ? "checking its settings (--check)" : "starting");
  proto_revocation_init(&d->revoked);
  int code = 1;
  if (load_credentials(d) == 0)
    code = run(d);
  proto_revocation_close(&d->revoked);
  proto_identity_clear(&d->id);
  sodium_memzero(&d->token, sizeof d->token);
  free(d);
  return code;
}
