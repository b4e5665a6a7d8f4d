/* trainmonitor.c: watches a run from its DHT and serves what it sees.
 *
 *   trainmonitor --join queen:45555 --run-id NAME [--http 127.0.0.1:8080]
 *
 * Joins the swarm's DHT as a client (never in anyone's routing table; in
 * a moderated swarm with its identity and a token, a "monitor" one is
 * enough), reads the run's progress and metrics records every
 * --scrape-interval seconds, feeds them to the monitor core (monitor.h),
 * appends one JSON line per scrape to --log-file, and serves the
 * dashboard, the JSON API, Prometheus text and a websocket (http.c).
 */
#include "dht.h"
#include "trainmonitor.h"

#include <arpa/inet.h>
#include <errno.h>
#include <signal.h>
#include <stddef.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#define COMP "trainmonitor"
#define JOIN_MAX 16
#define BOOT_RETRY_MS 5000
#define SWARM_DEFAULT "beed"

typedef struct opts {
  const char *join[JOIN_MAX];
  size_t njoin;
  const char *run, *http, *http_token, *log_file;
  const char *swarm, *moderator, *token, *identity;
  bool open;
  double interval_s;
  unsigned long long target;
  int log_level;
} opts;

/* A scrape reads these keys of the run, in this order; the links (which
 * bees publish every 10 s, each a few KiB) only every LINKS_EVERY
 * scrapes. */
enum { R_PROGRESS, R_METRICS, R_DONORS, R_LINKS, READS };
#define LINKS_EVERY 5

/* Owned records copied out of a lookup's callback: owner ids, values. */
typedef struct recset {
  uint8_t (*ids)[PROTO_ID_BYTES];
  uint8_t **vals;
  size_t *lens, n;
} recset;

typedef struct tm_state {
  uv_loop_t loop;
  opts o;
  proto_identity id;
  proto_token tok;
  uint8_t mod[PROTO_PK_BYTES];
  proto_host *host;
  dht_glue *glue;
  mon *m;
  mon_http *http;
  FILE *log;
  uv_timer_t timer;
  uv_signal_t sigint, sigterm, sighup;
  uv_timer_t tok_timer;       /* the token file, for a renewal */
  proto_file_watch tok_watch; /* as last read */
  unsigned tok_warned;        /* expiry warnings given */
  uint8_t keys[READS][PROTO_DHT_KEY_BYTES]; /* the run's, by R_* */
  int stage;                                /* the read under way */
  uint64_t scrapes;                         /* begun */
  bool joined, booting, busy, stopping;
  uint64_t boot_at_ms; /* next bootstrap try (loop ms) */
  /* the records of the scrape under way, copied */
  recset sets[READS];
  int status;
} tm_state;

static void usage(FILE *f) {
  fprintf(
      f,
      "usage: trainmonitor --join HOST:PORT --run-id NAME [options]\n"
      "  --join HOST:PORT         a peer of the swarm (repeatable)\n"
      "  --run-id NAME            the run to watch\n"
      "  --http ADDR:PORT         serve the dashboard there (default\n"
      "                           127.0.0.1:8080; 0.0.0.0:PORT for all)\n"
      "  --http-token TOKEN       require it: 'Authorization: Bearer TOKEN'\n"
      "                           or ?token=TOKEN\n"
      "  --scrape-interval SECS   read the DHT this often (default 1)\n"
      "  --target-batch-size N    the run's target (default: inferred)\n"
      "  --log-file PATH          append one JSON line per scrape\n"
      "  --open | --moderator PUBKEY --token FILE --identity FILE\n"
      "  --swarm NAME             (default beed)\n"
      "  --log-level LEVEL        error|warn|info|debug (default info)\n");
}

/* Where the value of a flag that takes a string goes, or NULL. */
static const char **string_opt(opts *o, const char *name) {
  static const struct {
    const char *name;
    size_t off;
  } t[] = {{"--run-id", offsetof(opts, run)},
           {"--http", offsetof(opts, http)},
           {"--http-token", offsetof(opts, http_token)},
           {"--log-file", offsetof(opts, log_file)},
           {"--swarm", offsetof(opts, swarm)},
           {"--moderator", offsetof(opts, moderator)},
           {"--token", offsetof(opts, token)},
           {"--identity", offsetof(opts, identity)}};
  for (size_t i = 0; i < sizeof t / sizeof *t; i++)
    if (!strcmp(name, t[i].name))
      return (const char **)(void *)((char *)o + t[i].off);
  return NULL;
}

static int parse(int argc, char **argv, opts *o) {
  memset(o, 0, sizeof *o);
  o->http = "127.0.0.1:8080";
  o->swarm = SWARM_DEFAULT;
  o->interval_s = 1;
  o->log_level = BEE_LOG_INFO;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      exit(0);
    }
    if (!strcmp(a, "--open")) {
      o->open = true;
      continue;
    }
    if (!v) {
      fprintf(stderr, "trainmonitor: %s needs a value\n", a);
      return -1;
    }
    i++;
    char *end;
    if (!strcmp(a, "--join")) {
      if (o->njoin == JOIN_MAX) {
        fprintf(stderr, "trainmonitor: at most %d --join\n", JOIN_MAX);
        return -1;
      }
      o->join[o->njoin++] = v;
    } else if (string_opt(o, a)) {
      *string_opt(o, a) = v;
    } else if (!strcmp(a, "--scrape-interval")) {
      errno = 0;
      o->interval_s = strtod(v, &end);
      if (errno || *end || end == v || !(o->interval_s >= 0.1) ||
          o->interval_s > 3600) {
        fprintf(stderr,
                "trainmonitor: bad --scrape-interval '%s' (want "
                "seconds, 0.1..3600)\n",
                v);
        return -1;
      }
    } else if (!strcmp(a, "--target-batch-size")) {
      errno = 0;
      o->target = strtoull(v, &end, 10);
      if (errno || *end || end == v || v[0] == '-' || !o->target) {
        fprintf(stderr, "trainmonitor: bad --target-batch-size '%s'\n", v);
        return -1;
      }
    } else if (!strcmp(a, "--log-level")) {
      if (bee_log_level_parse(v, &o->log_level)) {
        fprintf(stderr, "trainmonitor: bad --log-level '%s'\n", v);
        return -1;
      }
    } else {
      fprintf(stderr, "trainmonitor: unknown option %s\n", a);
      return -1;
    }
  }
  const char *bad = NULL;
  if (!o->njoin)
    bad = "--join HOST:PORT is required";
  else if (!o->run || !o->run[0] || strlen(o->run) > PROTO_RUN_MAX)
    bad = "--run-id NAME (1 to 64 bytes) is required";
  else if (o->open == (o->moderator || o->token))
    bad = "give either --open or --moderator and --token";
  else if (!o->open && !(o->moderator && o->token && o->identity))
    bad = "a moderated swarm needs --moderator, --token and --identity";
  else if (!proto_swarm_valid(o->swarm))
    bad = "--swarm: 1 to 64 characters of A-Z a-z 0-9 . _ -";
  if (bad) {
    fprintf(stderr, "trainmonitor: %s\n", bad);
    return -1;
  }
  return 0;
}

static uint64_t wall_ms(void) {
  struct timeval tv;
  gettimeofday(&tv, NULL);
  return (uint64_t)tv.tv_sec * 1000 + (uint64_t)tv.tv_usec / 1000;
}

static void recset_free(recset *rs) {
  for (size_t i = 0; i < rs->n; i++)
    free(rs->vals[i]);
  free(rs->ids);
  free(rs->vals);
  free(rs->lens);
  memset(rs, 0, sizeof *rs);
}

static bool owner_of(const proto_dht_record *r, uint8_t id[PROTO_ID_BYTES]);

/* Copies the owned records of a lookup's result (v borrowed for the
 * callback only) into rs. */
static void recset_take(recset *rs, int status, const dht_value *v) {
  recset_free(rs);
  size_t cap = status == 0 && v ? v->n : 0;
  rs->ids = calloc(cap ? cap : 1, PROTO_ID_BYTES);
  rs->vals = calloc(cap ? cap : 1, sizeof *rs->vals);
  rs->lens = calloc(cap ? cap : 1, sizeof *rs->lens);
  for (size_t i = 0; rs->ids && rs->vals && rs->lens && i < cap; i++) {
    const proto_dht_record *r = &v->records[i];
    uint8_t *copy = malloc(r->value.n ? r->value.n : 1);
    if (!copy || !owner_of(r, rs->ids[rs->n])) {
      free(copy);
      continue;
    }
    memcpy(copy, r->value.p, r->value.n);
    rs->vals[rs->n] = copy;
    rs->lens[rs->n++] = r->value.n;
  }
}

/* Views of rs's records for the monitor core (NULL when out of memory). */
static mon_record *recset_view(const recset *rs) {
  mon_record *out = calloc(rs->n ? rs->n : 1, sizeof *out);
  for (size_t i = 0; out && i < rs->n; i++)
    out[i] = (mon_record){rs->ids[i], rs->vals[i], rs->lens[i]};
  return out;
}

/* The owner's id of an owned record, or false for another subkey. */
static bool owner_of(const proto_dht_record *r, uint8_t id[PROTO_ID_BYTES]) {
  if (r->subkey.n != PROTO_DHT_OWNED_SUBKEY_BYTES)
    return false;
  proto_peer_id(r->subkey.p + 1, id);
  return true;
}

static void log_line(tm_state *s) {
  if (!s->log)
    return;
  mon_buf b = {0};
  if (mon_line_json(s->m, &b) == 0) {
    fputs(b.p, s->log);
    fputc('\n', s->log);
    fflush(s->log);
  }
  mon_buf_free(&b);
}

/* The scrape's reads are done: the monitor takes them. */
static void scrape_done(tm_state *s) {
  mon_record *r[READS];
  bool ok = true;
  for (int k = 0; k < READS; k++)
    ok &= (r[k] = recset_view(&s->sets[k])) != NULL;
  if (ok) {
    uint64_t now = wall_ms();
    mon_scrape(s->m, now, r[R_PROGRESS], s->sets[R_PROGRESS].n, r[R_METRICS],
               s->sets[R_METRICS].n);
    mon_donors(s->m, now, r[R_DONORS], s->sets[R_DONORS].n);
    if (s->scrapes % LINKS_EVERY == 1 &&
        mon_links(s->m, now, r[R_LINKS], s->sets[R_LINKS].n) != 0)
      bee_warn(COMP, "out of memory: some links records not kept");
    log_line(s);
    mon_http_update(s->http);
  }
  for (int k = 0; k < READS; k++) {
    free(r[k]);
    recset_free(&s->sets[k]);
  }
}

/* One read of a scrape is back (copied, as v lives for this call only);
 * the next one starts, or the scrape is done. */
static void read_cb(dht_node *n, int status, const dht_value *v,
                    const dht_stats *st, void *arg) {
  (void)st;
  tm_state *s = arg;
  if (s->stopping) {
    s->busy = false;
    return;
  }
  recset_take(&s->sets[s->stage], status, v);
  if (s->stage + 1 == R_LINKS && s->scrapes % LINKS_EVERY != 1)
    s->stage++; /* not this scrape: the links' set stays empty */
  if (++s->stage < READS) {
    if (dht_get(n, s->keys[s->stage], true, read_cb, s) != 0)
      read_cb(n, BEE_ECANCELED, NULL, NULL, s);
    return;
  }
  s->busy = false;
  scrape_done(s);
}

static void boot_cb(dht_node *n, int status, const dht_stats *st, void *arg) {
  (void)n, (void)st;
  tm_state *s = arg;
  s->booting = false;
  if (s->stopping)
    return;
  if (status) {
    bee_warn(COMP, "cannot join the swarm: %s; trying again in %d s",
             bee_strerror(status), BOOT_RETRY_MS / 1000);
    s->boot_at_ms = uv_now(&s->loop) + BOOT_RETRY_MS;
    return;
  }
  if (!s->joined)
    bee_info(COMP, "joined the swarm; watching run '%s'", s->o.run);
  s->joined = true;
}

static void tick(uv_timer_t *t) {
  tm_state *s = t->data;
  dht_node *n = dht_glue_node(s->glue);
  if (!s->joined) {
    if (!s->booting && uv_now(&s->loop) >= s->boot_at_ms) {
      s->booting = true;
      if (dht_bootstrap(n, s->o.join, s->o.njoin, boot_cb, s) != 0) {
        s->booting = false;
        s->boot_at_ms = uv_now(&s->loop) + BOOT_RETRY_MS;
      }
    }
    return;
  }
  if (s->busy)
    return; /* the last scrape is still reading: skip this one */
  s->busy = true;
  s->stage = R_PROGRESS;
  s->scrapes++;
  if (dht_get(n, s->keys[R_PROGRESS], true, read_cb, s) != 0)
    s->busy = false;
}

/* A renewed token in the --token file (looked at every 5 s, and at
 * SIGHUP) replaces the one held, and the swarm's nodes are told, so they
 * keep the monitor's connections open past the old token's expiry. */
static void token_check(tm_state *s, bool hup) {
  const char *path = s->o.token;
  int err;
  if (s->o.open) {
    if (hup)
      bee_info(COMP, "SIGHUP: an open swarm has no token to read again");
    return;
  }
  bool changed = proto_file_changed(&s->tok_watch, path, &err);
  if (err || (hup && s->tok_watch.failed))
    bee_warn(COMP, "%s: %s; the token held stays", path,
             strerror(-s->tok_watch.error));
  uint64_t now = (uint64_t)time(NULL);
  if (changed || (hup && !s->tok_watch.failed)) {
    proto_token t;
    int rc = proto_token_renewal(path, &s->tok, s->mod, s->o.swarm, s->id.pk,
                                 PROTO_ROLES_ALL, now, NULL, &t);
    if (rc == 1) {
      s->tok = t;
      size_t told = proto_host_token_renewed(s->host);
      s->tok_warned = proto_token_warnings_due((int64_t)(t.expires - now));
      bee_info(COMP, "%s renewed: expires in %.1f h; %zu connection%s told",
               path, ((double)t.expires - (double)now) / 3600, told,
               told == 1 ? "" : "s");
    } else if (rc == 0) {
      if (hup)
        bee_info(COMP, "%s: unchanged", path);
    } else {
      bee_warn(COMP, "%s: %s; the token held stays", path, bee_strerror(rc));
    }
    sodium_memzero(&t, sizeof t);
  }
  int64_t left = (int64_t)s->tok.expires - (int64_t)now;
  unsigned due = proto_token_warnings_due(left);
  if (due <= s->tok_warned)
    return;
  s->tok_warned = due;
  if (left > 0)
    bee_warn(COMP, "%s expires in %.1f h: the swarm will close this "
             "monitor's connections then; put a renewed token in its place",
             path, (double)left / 3600);
  else
    bee_err(COMP, "%s has expired: the swarm refuses this monitor until a "
            "renewed token is put in its place", path);
}

static void tok_timer_cb(uv_timer_t *t) { token_check(t->data, false); }

static void on_hup(uv_signal_t *h, int sig) {
  (void)sig;
  token_check(h->data, true);
}

/* Closes everything start made; the loop then runs out. */
static void stop(tm_state *s) {
  if (s->stopping)
    return;
  s->stopping = true;
  uv_timer_stop(&s->timer);
  uv_close((uv_handle_t *)&s->timer, NULL);
  uv_close((uv_handle_t *)&s->sigint, NULL);
  uv_close((uv_handle_t *)&s->sigterm, NULL);
  uv_close((uv_handle_t *)&s->sighup, NULL);
  uv_close((uv_handle_t *)&s->tok_timer, NULL);
  mon_http_stop(s->http);
  dht_glue_close(s->glue);
  s->glue = NULL;
  if (s->host)
    proto_host_close(s->host);
  s->host = NULL;
}

static void on_signal(uv_signal_t *h, int sig) {
  (void)sig;
  tm_state *s = h->data;
  unsigned clients;
  uint64_t skipped, joined, left, scrapes;
  mon_http_counts(s->http, &clients, &skipped);
  mon_counts(s->m, &joined, &left, &scrapes);
  bee_info(COMP,
           "stopping after %llu scrapes (%llu peers joined, %llu left); %u "
           "websocket clients, %llu updates skipped for slow ones",
           (unsigned long long)scrapes, (unsigned long long)joined,
           (unsigned long long)left, clients, (unsigned long long)skipped);
  stop(s);
}

/* The identity, token and moderator key the options name. */
static int credentials(tm_state *s, proto_auth *auth) {
  opts *o = &s->o;
  int rc;
  if (o->identity) {
    if ((rc = proto_identity_load(&s->id, o->identity, false))) {
      bee_err(COMP, "%s: %s", o->identity, bee_strerror(rc));
      return rc;
    }
  } else {
    proto_identity_generate(&s->id); /* an open swarm: a throwaway one */
  }
  if (!o->open) {
    if ((rc = proto_unhex(o->moderator, s->mod, PROTO_PK_BYTES)) ||
        (rc = proto_token_load(&s->tok, o->token)) ||
        (rc =
             proto_token_verify(&s->tok, s->mod, o->swarm, s->id.pk,
                                PROTO_ROLES_ALL, (uint64_t)time(NULL), NULL))) {
      bee_err(COMP, "%s: %s", o->token, bee_strerror(rc));
      return rc;
    }
    int err;
    proto_file_changed(&s->tok_watch, o->token, &err);
    s->tok_warned = proto_token_warnings_due(
        (int64_t)s->tok.expires - (int64_t)time(NULL));
  }
  *auth = (proto_auth){.id = &s->id,
                       .token = o->open ? NULL : &s->tok,
                       .moderator_pk = o->open ? NULL : s->mod,
                       .swarm = o->swarm,
                       .accept_roles = PROTO_ROLE_BEE | PROTO_ROLE_AUX,
                       .accept_bulk_roles = 0,
                       .ciphers = PROTO_CIPHERS_ALL};
  return 0;
}

/* "ADDR:PORT" (ADDR numeric, IPv6 in brackets) into host and port. */
static int http_addr(const char *s, char *host, size_t cap, unsigned *port) {
  const char *colon = strrchr(s, ':');
  if (!colon || colon == s)
    return BEE_ECONFIG;
  const char *h = s, *he = colon;
  if (*h == '[') {
    if (he[-1] != ']')
      return BEE_ECONFIG;
    h++;
    he--;
  }
  char *end;
  errno = 0;
  unsigned long p = strtoul(colon + 1, &end, 10);
  if (errno || *end || end == colon + 1 || colon[1] == '-' || p == 0 ||
      p > 65535 || (size_t)(he - h) >= cap)
    return BEE_ECONFIG;
  memcpy(host, h, (size_t)(he - h));
  host[he - h] = 0;
  unsigned char buf[16];
  if (inet_pton(AF_INET, host, buf) != 1 && inet_pton(AF_INET6, host, buf) != 1)
    return BEE_ECONFIG;
  *port = (unsigned)p;
  return 0;
}

/* Everything but the loop; on failure the caller stops what was made. */
static int start(tm_state *s) {
  opts *o = &s->o;
  char host[256];
  unsigned port;
  int rc;
  uv_timer_init(&s->loop, &s->timer);
  s->timer.data = s;
  uv_signal_init(&s->loop, &s->sigint);
  uv_signal_init(&s->loop, &s->sigterm);
  uv_signal_init(&s->loop, &s->sighup);
  uv_timer_init(&s->loop, &s->tok_timer);
  s->sigint.data = s->sigterm.data = s->sighup.data = s->tok_timer.data = s;
  if (http_addr(o->http, host, sizeof host, &port)) {
    bee_err(COMP, "bad --http '%s' (want ADDR:PORT, ADDR numeric)", o->http);
    return BEE_ECONFIG;
  }
  proto_auth auth;
  if ((rc = credentials(s, &auth)))
    return rc;
  mon_config mc = {.target = o->target};
  snprintf(mc.run, sizeof mc.run, "%s", o->run);
  if ((rc = mon_new(&mc, &s->m)))
    return rc;
  if (o->log_file && !(s->log = fopen(o->log_file, "a"))) {
    bee_err(COMP, "%s: %s", o->log_file, strerror(errno));
    return -errno;
  }
  proto_record_key(PROTO_REC_PROGRESS, o->run, 0, NULL, s->keys[R_PROGRESS]);
  proto_record_key(PROTO_REC_METRICS, o->run, 0, NULL, s->keys[R_METRICS]);
  proto_record_key(PROTO_REC_DONOR, o->run, 0, NULL, s->keys[R_DONORS]);
  proto_record_key(PROTO_REC_LINKS, o->run, 0, NULL, s->keys[R_LINKS]);
  proto_host_config hc;
  proto_host_config_default(&hc);
  hc.loop = &s->loop;
  hc.auth = auth;
  dht_config dc;
  dht_config_default(&dc);
  dc.id = &s->id;
  dc.port = 0; /* client mode */
  if ((rc = proto_host_new(&hc, &s->host)) ||
      (rc = dht_glue_new(&s->loop, s->host, &dc, NULL, NULL, &s->glue))) {
    bee_err(COMP, "cannot start a DHT client: %s", bee_strerror(rc));
    return rc;
  }
  mon_http_config htc = {.loop = &s->loop,
                         .host = host,
                         .port = (int)port,
                         .token = o->http_token,
                         .m = s->m};
  if ((rc = mon_http_start(&htc, &s->http))) {
    bee_err(COMP, "cannot serve on %s: %s", o->http, bee_strerror(rc));
    return rc;
  }
  bee_info(COMP, "serving http://%s/ (%s)", o->http,
           o->http_token ? "with a token" : "no token");
  uint64_t every = (uint64_t)(o->interval_s * 1000);
  uv_timer_start(&s->timer, tick, 0, every);
  uv_signal_start(&s->sigint, on_signal, SIGINT);
  uv_signal_start(&s->sigterm, on_signal, SIGTERM);
  uv_signal_start(&s->sighup, on_hup, SIGHUP);
  if (!o->open)
    uv_timer_start(&s->tok_timer, tok_timer_cb, 5000, 5000);
  return 0;
}

/* A start that failed: what it made is closed from the running loop
 * (libwebsockets wants its context destroyed there). */
static void fail_cb(uv_timer_t *t) { stop(t->data); }

int main(int argc, char **argv) {
  static tm_state s;
  if (parse(argc, argv, &s.o) != 0) {
    usage(stderr);
    return 2;
  }
  bee_log_set_level(s.o.log_level);
  signal(SIGPIPE, SIG_IGN);
  signal(SIGHUP, SIG_IGN); /* until on_hup takes it: never a stop */
  if (sodium_init() < 0)
    return 1;
  uv_loop_init(&s.loop);
  if (start(&s) != 0) {
    s.status = 1;
    uv_timer_start(&s.timer, fail_cb, 0, 0);
  }
  uv_run(&s.loop, UV_RUN_DEFAULT);
  mon_http_free(s.http);
  uv_run(&s.loop, UV_RUN_DEFAULT); /* what a late destroy closed */
  uv_loop_close(&s.loop);
  for (int k = 0; k < READS; k++)
    recset_free(&s.sets[k]);
  mon_free(s.m);
  if (s.log)
    fclose(s.log);
  proto_identity_clear(&s.id);
  return s.status;
}
