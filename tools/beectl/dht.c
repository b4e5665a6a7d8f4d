/* dht.c: beectl dht get|put|peers, one DHT operation as a client node.
 *
 * beectl joins the swarm through --join like any bee, but in client mode
 * (it never enters anyone's routing table and listens on nothing), runs
 * the one operation, prints the result and leaves.  In a moderated swarm
 * it needs an identity and a token for it, as every node does; a monitor
 * token is enough.
 */
#include "beectl.h"
#include "dht.h"

#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define OP_TIMEOUT_MS 30000

enum { OP_GET, OP_PUT, OP_PEERS, OP_LINKS };

typedef struct op {
  uv_loop_t loop;
  proto_host *host;
  dht_glue *glue;
  uv_timer_t timer;
  int kind;
  uint8_t key[PROTO_DHT_KEY_BYTES];
  bool latest, plain;
  const char *value;
  uint64_t ttl_s;
  const char *join;
  const char *run; /* OP_LINKS */
  bool pairs;
  beectl_label *labels; /* OP_LINKS: the progress records' labels */
  size_t nlabels;
  int status; /* the exit status */
  bool done;
} op;

static void finish(op *o, int status) {
  if (o->done)
    return;
  o->done = true;
  o->status = status;
  dht_glue_close(o->glue);
  o->glue = NULL;
  if (o->host)
    proto_host_close(o->host);
  uv_close((uv_handle_t *)&o->timer, NULL);
}

static void print_value(proto_bytes v) {
  bool text = true;
  for (size_t i = 0; i < v.n; i++)
    if (v.p[i] < 0x20 || v.p[i] >= 0x7f)
      text = false;
  if (text) {
    printf("%.*s\n", (int)v.n, (const char *)v.p);
    return;
  }
  for (size_t i = 0; i < v.n; i++)
    printf("%02x", v.p[i]);
  printf(" (hex)\n");
}

static void get_cb(dht_node *n, int status, const dht_value *v,
                   const dht_stats *st, void *arg) {
  op *o = arg;
  (void)n;
  if (status) {
    beectl_errorf("get: %s", status == -ENOENT ? "no live value under that key"
                                               : bee_strerror(status));
    finish(o, 1);
    return;
  }
  for (size_t i = 0; i < v->n; i++) {
    const proto_dht_record *r = &v->records[i];
    const uint8_t *owner;
    char who[2 * PROTO_ID_BYTES + 8], when[32];
    if (r->subkey.n == 0) {
      snprintf(who, sizeof who, "plain");
    } else if (proto_dht_subkey_owner(r->subkey, &owner)) {
      uint8_t id[PROTO_ID_BYTES];
      proto_peer_id(owner, id);
      memcpy(who, "owner ", 6);
      proto_hex(id, PROTO_ID_BYTES, who + 6);
    } else {
      bee_printable(r->subkey.p, r->subkey.n, who, sizeof who);
    }
    time_t t = (time_t)r->expiration;
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    printf("%s\texpires %s\t", who, when);
    print_value(r->value);
  }
  fprintf(stderr, "beectl: %zu record%s, %u rounds, %u requests, %llu ms\n",
          v->n, v->n == 1 ? "" : "s", st->rounds, st->requests,
          (unsigned long long)st->ms);
  finish(o, 0);
}

static void put_cb(dht_node *n, int status, unsigned stored,
                   const dht_stats *st, void *arg) {
  op *o = arg;
  (void)n;
  if (status) {
    beectl_errorf("put: %s", bee_strerror(status));
    finish(o, 1);
    return;
  }
  printf("stored on %u node%s\n", stored, stored == 1 ? "" : "s");
  fprintf(stderr, "beectl: %u rounds, %u requests, %llu ms\n", st->rounds,
          st->requests, (unsigned long long)st->ms);
  finish(o, 0);
}

/* beectl links: the run's progress records (for names), then its links
 * records.  Records that fail their checks never reach here: the DHT
 * drops them. */
static void links_cb(dht_node *n, int status, const dht_value *v,
                     const dht_stats *st, void *arg) {
  op *o = arg;
  (void)n, (void)st;
  if (status == -ENOENT || (status == 0 && v->n == 0)) {
    beectl_errorf("no links published in run '%s' yet", o->run);
    finish(o, 1);
    return;
  }
  if (status) {
    beectl_errorf("links: %s", bee_strerror(status));
    finish(o, 1);
    return;
  }
  beectl_links_rec *recs = calloc(v->n, sizeof *recs);
  size_t k = 0;
  if (!recs) {
    finish(o, 1);
    return;
  }
  for (size_t i = 0; i < v->n; i++) {
    const uint8_t *owner;
    if (!proto_dht_subkey_owner(v->records[i].subkey, &owner) ||
        proto_links_decode(v->records[i].value.p, v->records[i].value.n,
                           &recs[k].links) != 0)
      continue;
    proto_peer_id(owner, recs[k].owner);
    k++;
  }
  finish(o, beectl_links_print(o->labels, o->nlabels, recs, k, o->pairs));
  free(recs);
}

static void labels_cb(dht_node *n, int status, const dht_value *v,
                      const dht_stats *st, void *arg) {
  op *o = arg;
  (void)st;
  if (status == 0 && v->n && (o->labels = calloc(v->n, sizeof *o->labels))) {
    for (size_t i = 0; i < v->n; i++) {
      const uint8_t *owner;
      proto_progress p;
      if (!proto_dht_subkey_owner(v->records[i].subkey, &owner) ||
          proto_progress_decode(v->records[i].value.p, v->records[i].value.n,
                                &p) != 0)
        continue;
      proto_peer_id(owner, o->labels[o->nlabels].id);
      memcpy(o->labels[o->nlabels++].label, p.label, sizeof p.label);
    }
  }
  uint8_t key[PROTO_DHT_KEY_BYTES];
  proto_record_key(PROTO_REC_LINKS, o->run, 0, NULL, key);
  int rc = dht_get(n, key, false, links_cb, o);
  if (rc) {
    beectl_errorf("links: %s", bee_strerror(rc));
    finish(o, 1);
  }
}

static void print_contact(const uint8_t id[PROTO_ID_BYTES], const char *addr,
                          void *arg) {
  char hex[2 * PROTO_ID_BYTES + 1];
  (void)arg;
  proto_hex(id, PROTO_ID_BYTES, hex);
  printf("%s %s\n", hex, addr);
}

static void boot_cb(dht_node *n, int status, const dht_stats *st, void *arg) {
  op *o = arg;
  (void)st;
  if (status) {
    beectl_errorf("cannot join through %s: %s", o->join, bee_strerror(status));
    finish(o, 1);
    return;
  }
  int rc = 0;
  if (o->kind == OP_PEERS) {
    dht_info in;
    dht_node_info(n, &in);
    dht_node_foreach_contact(n, print_contact, NULL);
    fprintf(stderr, "beectl: %zu contacts in %zu buckets\n", in.contacts,
            in.buckets);
    finish(o, 0);
    return;
  }
  if (o->kind == OP_GET) {
    rc = dht_get(n, o->key, o->latest, get_cb, o);
  } else if (o->kind == OP_LINKS) {
    uint8_t key[PROTO_DHT_KEY_BYTES];
    proto_record_key(PROTO_REC_PROGRESS, o->run, 0, NULL, key);
    rc = dht_get(n, key, false, labels_cb, o);
  } else {
    uint8_t sub[PROTO_DHT_OWNED_SUBKEY_BYTES];
    dht_owned_subkey(n, sub);
    proto_bytes subkey = o->plain ? (proto_bytes){NULL, 0}
                                  : (proto_bytes){sub, sizeof sub};
    proto_bytes value = {(const uint8_t *)o->value, strlen(o->value)};
    rc = dht_put(n, o->key, subkey, value, (uint64_t)time(NULL) + o->ttl_s,
                 put_cb, o);
  }
  if (rc) {
    beectl_errorf("%s: %s", o->kind == OP_GET ? "get" : "put", bee_strerror(rc));
    finish(o, 1);
  }
}

static void timeout_cb(uv_timer_t *t) {
  op *o = t->data;
  beectl_errorf("no result within %d s", OP_TIMEOUT_MS / 1000);
  finish(o, 1);
}

/* Loads the credentials the flags name.  Returns 0 or an exit status. */
static int credentials(flag *fl, proto_identity *id, proto_token *tok,
                       uint8_t mod[PROTO_PK_BYTES], proto_auth *auth) {
  int rc;
  bool open = fl[2].set;
  if (open == (fl[3].set || fl[4].set)) {
    beectl_errorf("give either --open or --moderator and --token");
    return EXIT_USAGE;
  }
  if (!open && !(fl[3].set && fl[4].set && fl[5].set)) {
    beectl_errorf("a moderated swarm needs --moderator, --token and --identity");
    return EXIT_USAGE;
  }
  if (beectl_parse_swarm(&fl[1]) || (!open && beectl_parse_pk(&fl[3], mod)))
    return EXIT_USAGE;
  if (fl[5].set) {
    if ((rc = proto_identity_load(id, fl[5].value, false))) {
      beectl_errorf("%s: %s", fl[5].value, bee_strerror(rc));
      return 1;
    }
  } else {
    proto_identity_generate(id); /* an open swarm: a throwaway identity */
  }
  if (!open) {
    if ((rc = proto_token_load(tok, fl[4].value)) ||
        (rc = proto_token_verify(tok, mod, fl[1].value, id->pk, PROTO_ROLES_ALL,
                                 (uint64_t)time(NULL), NULL))) {
      beectl_errorf("%s: %s", fl[4].value, bee_strerror(rc));
      return 1;
    }
  }
  *auth = (proto_auth){.id = id, .token = open ? NULL : tok,
                       .moderator_pk = open ? NULL : mod,
                       .swarm = fl[1].value,
                       .accept_roles = PROTO_ROLE_BEE | PROTO_ROLE_AUX,
                       .accept_bulk_roles = 0,
                       .ciphers = PROTO_CIPHERS_ALL};
  return 0;
}

int beectl_dht(int argc, char **argv) {
  flag fl[] = {
      {"--join", true, true, false, NULL},
      {"--swarm", true, true, false, NULL},
      {"--open", false, false, false, NULL},
      {"--moderator", true, false, false, NULL},
      {"--token", true, false, false, NULL},
      {"--identity", true, false, false, NULL},
      {"--latest", false, false, false, NULL},
      {"--ttl", true, false, false, NULL},
      {"--plain", false, false, false, NULL},
      {"--log-level", true, false, false, NULL},
      {"--run", true, false, false, NULL},
      {"--pairs", false, false, false, NULL},
  };
  args a = {fl, sizeof fl / sizeof fl[0], {0}, 0};
  const char *sub = argc > 0 ? argv[0] : "";
  static op o;
  proto_identity id;
  proto_token tok;
  uint8_t mod[PROTO_PK_BYTES];
  proto_auth auth;
  int rc, level = BEE_LOG_WARN;
  memset(&o, 0, sizeof o);
  o.kind = !strcmp(sub, "get")     ? OP_GET
           : !strcmp(sub, "put")   ? OP_PUT
           : !strcmp(sub, "peers") ? OP_PEERS
           : !strcmp(sub, "links") ? OP_LINKS
                                   : -1;
  if (o.kind < 0) {
    beectl_errorf("dht: expected get, put or peers, not '%s'", sub);
    return EXIT_USAGE;
  }
  size_t npos = o.kind == OP_GET ? 1 : o.kind == OP_PUT ? 2 : 0;
  if ((rc = beectl_parse_args(&a, argc - 1, argv + 1, npos)))
    return rc;
  if (a.npos != npos) {
    beectl_errorf("dht %s: expected %s", sub, o.kind == OP_GET ? "KEY"
                                             : o.kind == OP_PUT ? "KEY VALUE"
                                                                : "no argument");
    return EXIT_USAGE;
  }
  if (o.kind == OP_PUT && (!fl[7].set || beectl_parse_duration(fl[7].value, &o.ttl_s) ||
                           o.ttl_s > DHT_TTL_MAX_S)) {
    beectl_errorf("--ttl: expected a duration up to 7d, like 600s, 30m or 2h");
    return EXIT_USAGE;
  }
  if ((fl[6].set && o.kind != OP_GET) || (fl[8].set && o.kind != OP_PUT)) {
    beectl_errorf("%s only goes with dht %s", fl[6].set ? "--latest" : "--plain",
                  fl[6].set ? "get" : "put");
    return EXIT_USAGE;
  }
  if (o.kind == OP_LINKS) {
    /* Checked as the records carry it: a run name of [A-Za-z0-9._-]. */
    proto_links probe = {.n = 0};
    uint8_t buf[PROTO_RECORD_MAX];
    size_t len;
    size_t rn = fl[10].set ? strlen(fl[10].value) : 0;
    if (rn <= PROTO_RUN_MAX && fl[10].set)
      memcpy(probe.run, fl[10].value, rn + 1);
    if (!fl[10].set || rn == 0 || rn > PROTO_RUN_MAX ||
        proto_links_encode(&probe, buf, sizeof buf, &len) != 0) {
      beectl_errorf("links: --run RUN expected (1 to %d of A-Z a-z 0-9 . _ -)",
                    PROTO_RUN_MAX);
      return EXIT_USAGE;
    }
  } else if (fl[10].set || fl[11].set) {
    beectl_errorf("%s only goes with links", fl[10].set ? "--run" : "--pairs");
    return EXIT_USAGE;
  }
  if (fl[9].set && bee_log_level_parse(fl[9].value, &level)) {
    beectl_errorf("--log-level: expected error, warn, info or debug");
    return EXIT_USAGE;
  }
  if (o.kind == OP_PUT && strlen(a.pos[1]) > PROTO_DHT_VALUE_MAX) {
    beectl_errorf("VALUE is over %u bytes", PROTO_DHT_VALUE_MAX);
    return EXIT_USAGE;
  }
  bee_log_set_level(level);
  if (sodium_init() < 0)
    return 1;
  if ((rc = credentials(fl, &id, &tok, mod, &auth)))
    return rc;
  if (npos)
    dht_key(a.pos[0], o.key);
  o.value = o.kind == OP_PUT ? a.pos[1] : NULL;
  o.latest = fl[6].set;
  o.plain = fl[8].set;
  o.join = fl[0].value;
  o.run = fl[10].value;
  o.pairs = fl[11].set;

  uv_loop_init(&o.loop);
  proto_host_config hc;
  proto_host_config_default(&hc);
  hc.loop = &o.loop;
  hc.auth = auth;
  dht_config dc;
  dht_config_default(&dc);
  dc.id = &id;
  dc.port = 0; /* client mode */
  uv_timer_init(&o.loop, &o.timer);
  o.timer.data = &o;
  if ((rc = proto_host_new(&hc, &o.host)) ||
      (rc = dht_glue_new(&o.loop, o.host, &dc, NULL, NULL, &o.glue)) ||
      (rc = dht_bootstrap(dht_glue_node(o.glue), &o.join, 1, boot_cb, &o))) {
    beectl_errorf("cannot start a DHT client: %s", bee_strerror(rc));
    finish(&o, 1);
  } else {
    uv_timer_start(&o.timer, timeout_cb, OP_TIMEOUT_MS, 0);
  }
  uv_run(&o.loop, UV_RUN_DEFAULT);
  uv_loop_close(&o.loop);
  proto_identity_clear(&id);
  free(o.labels);
  return o.status;
}
