/* bench-dht.c: latency and throughput of a DHT of many nodes on loopback.
 *
 * The same scenario for beed's DHT (--impl beed) and OpenDHT (--impl
 * opendht), driven by the same coordinator, so that only the DHT differs:
 *
 *   boot  --nodes nodes in worker processes of --per-proc nodes each.
 *         Node 0 is the bootstrap node; the others join through it, one
 *         every --stagger-us, and then look up their own id.  The run
 *         waits until every join has called back.
 *   put   --ops puts of distinct keys, --value bytes each, each from a
 *         random node, --concurrency of them in flight;
 *   get   a get of every key from a random node other than the one that
 *         put it, its answer compared with the value that was put;
 *   kill  --kill-pct percent of the nodes, chosen at random, go away
 *         without a word.  With --dead-mode timeout (the default) a
 *         listener that never answers then takes each dead node's port,
 *         as a departed peer looks across a silent network (on loopback a
 *         closed port refuses at once, which is kinder than the internet;
 *         --dead-mode refuse measures that);
 *   dget  the gets again, from random live nodes;
 *   dput  --dead-puts puts of new keys from random live nodes.
 *
 * --origin fixed replays hivemind's benchmark_dht.py instead: every put
 * from one node and every get from another, no dead peers.
 *
 * Workers time each operation themselves, from the call to its callback;
 * ops/s is the number of operations over the phase's wall time.  The CPU
 * per operation is the workers' (every thread), read from /proc.
 *
 * Why workers: every connection between two nodes of one process costs it
 * two file descriptors, and a few hundred nodes that all know each other
 * need more than the usual 20,000; OpenDHT's runners wait on select(),
 * which breaks past descriptor 1023 (about 200 runners).
 *
 * beed's workers are forked from this program: one libuv loop (one
 * thread) each, every node with its own identity, proto_host on
 * 127.0.0.1 in an open swarm ("bench": no moderator, no tokens) and
 * dht_glue.  A killed node's glue and host are closed; its silent
 * stand-in is a raw TCP listener that accepts and never reads.
 * OpenDHT's workers are bench-opendht (see there).
 *
 * The run prints p50, p99, mean and ops/s per phase and one
 * "RESULT key=value ..." line for tools/bench/run-dht.  This is a
 * benchmark, not a test: it asserts nothing about speed.
 */
#include "bench-dht.h"
#include "dht.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SWARM "bench"
#define NODES_MAX 8192
#define CONNS_PER_NODE_MIN 40 /* descriptors for fewer per node: refuse */
#define TTL_S 3600
#define KILL_SETTLE_MS 200 /* for the dead hosts' handles to close */

/* ---- options ------------------------------------------------------------ */

typedef struct opts {
  bool opendht; /* --impl */
  const char *opendht_path;
  size_t nodes, per_proc, ops, conc, value;
  unsigned kill_pct;
  bool refuse; /* --dead-mode refuse */
  unsigned stagger_us, settle_ms, timeout_s;
  uint64_t seed;
  int log_level;
  unsigned slow_ms; /* beed: print operations slower than this */
  size_t dead_puts; /* puts in the dead-peer phase */
  bool fixed;       /* --origin fixed: one node puts, another gets */
  bool probe;       /* beed: where are the values gets did not find? */
} opts;

static void usage(FILE *f) {
  fprintf(f,
          "usage: bench-dht [options]\n"
          "  --impl beed|opendht  which DHT (default beed)\n"
          "  --nodes N            DHT nodes (default 64, max %d)\n"
          "  --per-proc N         nodes per worker process (default 64)\n"
          "  --ops N              puts, then gets of the same keys (default 1000)\n"
          "  --concurrency N      operations in flight (default 8)\n"
          "  --value BYTES        value size (default 1024, max %u)\n"
          "  --kill-pct P         percent of nodes killed before the dead-peer\n"
          "                       phases (default 10; 0 skips them)\n"
          "  --dead-mode MODE     timeout: a listener that never answers takes\n"
          "                       a dead node's port (default); refuse: the\n"
          "                       port is closed\n"
          "  --dead-puts N        puts with dead peers (default ops / 5)\n"
          "  --origin MODE        random: each operation from a random node\n"
          "                       (default); fixed: every put from node N-2\n"
          "                       and every get from node N-1, as hivemind's\n"
          "                       benchmark_dht.py does (no dead peers then)\n"
          "  --probe              beed: for gets that found nothing, list\n"
          "                       which nodes hold the key, ranked by\n"
          "                       distance to it\n"
          "  --stagger-us US      between two bootstraps (default 2000)\n"
          "  --settle-ms MS       pause after the last bootstrap (default 500)\n"
          "  --seed N             random choices and keys (default: random)\n"
          "  --timeout SEC        kill a run that takes longer (default 300)\n"
          "  --log-level L        beed's: error, warn, info, debug (default error)\n"
          "  --slow-ms MS         beed: print each operation that failed or\n"
          "                       took this long, with its rounds, requests\n"
          "                       and failures\n"
          "  --opendht PATH       the OpenDHT worker (default: bench-opendht\n"
          "                       next to this program)\n",
          NODES_MAX, PROTO_DHT_VALUE_MAX);
}

static int parse_num(const char *s, uint64_t max, uint64_t *out) {
  char *end;
  if (*s < '0' || *s > '9')
    return BEE_ECONFIG;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || *end || v > max)
    return BEE_ERANGE;
  *out = v;
  return 0;
}

static int parse_opts(int argc, char **argv, opts *o) {
  enum { O_IMPL = 256, O_NODES, O_PER, O_OPS, O_CONC, O_VALUE, O_KILL, O_MODE,
         O_STAGGER, O_SETTLE, O_SEED, O_TIMEOUT, O_LOG, O_ODHT, O_SLOW, O_DPUTS,
         O_ORIGIN, O_PROBE };
  static const struct option longs[] = {
      {"impl", required_argument, NULL, O_IMPL},
      {"nodes", required_argument, NULL, O_NODES},
      {"per-proc", required_argument, NULL, O_PER},
      {"ops", required_argument, NULL, O_OPS},
      {"concurrency", required_argument, NULL, O_CONC},
      {"value", required_argument, NULL, O_VALUE},
      {"kill-pct", required_argument, NULL, O_KILL},
      {"dead-mode", required_argument, NULL, O_MODE},
      {"stagger-us", required_argument, NULL, O_STAGGER},
      {"settle-ms", required_argument, NULL, O_SETTLE},
      {"seed", required_argument, NULL, O_SEED},
      {"timeout", required_argument, NULL, O_TIMEOUT},
      {"log-level", required_argument, NULL, O_LOG},
      {"opendht", required_argument, NULL, O_ODHT},
      {"slow-ms", required_argument, NULL, O_SLOW},
      {"dead-puts", required_argument, NULL, O_DPUTS},
      {"origin", required_argument, NULL, O_ORIGIN},
      {"probe", no_argument, NULL, O_PROBE},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0},
  };
  *o = (opts){.nodes = 64, .per_proc = 64, .ops = 1000, .conc = 8,
              .value = 1024, .kill_pct = 10, .stagger_us = 2000,
              .settle_ms = 500, .timeout_s = 300, .log_level = BEE_LOG_ERROR};
  randombytes_buf(&o->seed, sizeof o->seed);
  o->seed %= 1000000000;
  int c;
  uint64_t v;
  while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
    const char *a = optarg;
    switch (c) {
    case O_IMPL:
      if (strcmp(a, "beed") && strcmp(a, "opendht"))
        goto bad;
      o->opendht = strcmp(a, "opendht") == 0;
      break;
    case O_NODES:
      if (parse_num(a, NODES_MAX, &v) || v < 2)
        goto bad;
      o->nodes = v;
      break;
    case O_PER:
      if (parse_num(a, NODES_MAX, &v) || v < 1)
        goto bad;
      o->per_proc = v;
      break;
    case O_OPS:
      if (parse_num(a, 10000000, &v) || v < 1)
        goto bad;
      o->ops = v;
      break;
    case O_CONC:
      if (parse_num(a, 100000, &v) || v < 1)
        goto bad;
      o->conc = v;
      break;
    case O_VALUE:
      if (parse_num(a, PROTO_DHT_VALUE_MAX, &v) || v < 16)
        goto bad;
      o->value = v;
      break;
    case O_KILL:
      if (parse_num(a, 90, &v))
        goto bad;
      o->kill_pct = (unsigned)v;
      break;
    case O_MODE:
      if (strcmp(a, "timeout") && strcmp(a, "refuse"))
        goto bad;
      o->refuse = strcmp(a, "refuse") == 0;
      break;
    case O_STAGGER:
      if (parse_num(a, 1000000, &v))
        goto bad;
      o->stagger_us = (unsigned)v;
      break;
    case O_SETTLE:
      if (parse_num(a, 600000, &v))
        goto bad;
      o->settle_ms = (unsigned)v;
      break;
    case O_SEED:
      if (parse_num(a, UINT64_MAX, &v))
        goto bad;
      o->seed = v;
      break;
    case O_TIMEOUT:
      if (parse_num(a, 86400, &v) || v < 1)
        goto bad;
      o->timeout_s = (unsigned)v;
      break;
    case O_LOG:
      if (bee_log_level_parse(a, &o->log_level))
        goto bad;
      break;
    case O_ODHT:
      o->opendht_path = a;
      break;
    case O_DPUTS:
      if (parse_num(a, 10000000, &v) || v < 1)
        goto bad;
      o->dead_puts = v;
      break;
    case O_ORIGIN:
      if (strcmp(a, "random") && strcmp(a, "fixed"))
        goto bad;
      o->fixed = strcmp(a, "fixed") == 0;
      break;
    case O_PROBE:
      o->probe = true;
      break;
    case O_SLOW:
      if (parse_num(a, 600000, &v))
        goto bad;
      o->slow_ms = (unsigned)v;
      break;
    case 'h':
      usage(stdout);
      exit(0);
    default:
      usage(stderr);
      return BEE_ECONFIG;
    }
    continue;
  bad:
    fprintf(stderr, "bench-dht: bad value '%s' for %s\n", a, argv[optind - 1]);
    return BEE_ECONFIG;
  }
  if (optind < argc) {
    fprintf(stderr, "bench-dht: unexpected argument '%s'\n", argv[optind]);
    return BEE_ECONFIG;
  }
  if (o->fixed && o->kill_pct) {
    fprintf(stderr, "bench-dht: --origin fixed goes with --kill-pct 0\n");
    return BEE_ECONFIG;
  }
  if (!o->dead_puts)
    o->dead_puts = (o->ops + 4) / 5;
  return 0;
}

static uint64_t now_ns(void) { return uv_hrtime(); }

static double self_cpu_s(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 +
         (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
}

/* ======================================================================== */
/* The beed worker: nodes first .. first+count-1 on one loop.               */

typedef struct wnode {
  proto_identity id;
  proto_host *host;
  dht_glue *glue;
  int port;
  bool dead;
  bool has_hole;
  uv_tcp_t hole; /* a dead node's silent stand-in */
} wnode;

/* A connection a silent listener accepted: held open, never read. */
typedef struct hole_conn {
  uv_tcp_t tcp; /* first: the handle's address is the struct's */
  struct hole_conn *next;
} hole_conn;

/* An operation in flight. */
typedef struct wop {
  bool put;
  uint32_t node;
  uint64_t key;
  uint64_t t0_ns;
} wop;

static struct {
  const opts *o;
  uv_loop_t loop;
  uv_poll_t poll;
  int fd;
  size_t first, count;
  wnode *nodes;
  hole_conn *holes;
  uint8_t *expect; /* o->value bytes, scratch for get checks */
} W;

static void w_send(bench_msg *m) {
  if (send(W.fd, m, sizeof *m, 0) != (ssize_t)sizeof *m)
    _exit(1); /* the coordinator is gone */
}

static void w_fail(int status) {
  bench_msg m = {.type = BM_FAILED, .status = status};
  w_send(&m);
  _exit(1);
}

static void hole_conn_closed(uv_handle_t *h) { free((hole_conn *)h); }

static void hole_on_conn(uv_stream_t *server, int status) {
  if (status < 0)
    return;
  hole_conn *h = malloc(sizeof *h);
  if (!h)
    abort();
  uv_tcp_init(&W.loop, &h->tcp);
  if (uv_accept(server, (uv_stream_t *)&h->tcp) < 0) {
    uv_close((uv_handle_t *)&h->tcp, hole_conn_closed);
    return;
  }
  /* Never read, never write, never close: a peer that has gone silent. */
  h->next = W.holes;
  W.holes = h;
}

static wnode *w_node(uint32_t global) {
  if (global < W.first || global >= W.first + W.count)
    w_fail(BEE_ERANGE);
  return &W.nodes[global - W.first];
}

static void w_done(wop *p, int status, bool ok, unsigned stored,
                   const dht_stats *st) {
  bench_msg m = {.type = BM_DONE, .node = p->node, .key = p->key,
                 .ns = uv_hrtime() - p->t0_ns, .arg = stored,
                 .status = status, .ok = ok,
                 .requests = st ? st->requests : 0};
  if (W.o->slow_ms && (m.ns >= W.o->slow_ms * 1000000ull || !ok))
    fprintf(stderr,
            "bench-dht: %s %s of key %llu on node %u: %.1f ms, %s, %u "
            "rounds, %u requests, %u failed, %llu ms in the core\n",
            ok ? "slow" : "failed", p->put ? "put" : "get",
            (unsigned long long)p->key, p->node,
            (double)m.ns / 1e6, status ? bee_strerror(status) : "ok",
            st ? st->rounds : 0, st ? st->requests : 0, st ? st->failures : 0,
            st ? (unsigned long long)st->ms : 0ull);
  w_send(&m);
  free(p);
}

static void w_put_cb(dht_node *n, int status, unsigned stored,
                     const dht_stats *st, void *arg) {
  (void)n;
  w_done(arg, status, status == 0, stored, st);
}

static void w_get_cb(dht_node *n, int status, const dht_value *v,
                     const dht_stats *st, void *arg) {
  wop *p = arg;
  bool ok = false;
  (void)n;
  if (status == 0) {
    bench_value(W.o->seed, p->key, W.expect, W.o->value);
    for (size_t j = 0; j < v->n && !ok; j++)
      ok = v->records[j].value.n == W.o->value &&
           memcmp(v->records[j].value.p, W.expect, W.o->value) == 0;
  }
  w_done(p, status, ok, 0, st);
}

static void w_boot_cb(dht_node *n, int status, const dht_stats *st,
                      void *arg) {
  bench_msg m = {.type = BM_BOOTED, .node = (uint32_t)(uintptr_t)arg,
                 .status = status};
  (void)n;
  (void)st;
  w_send(&m);
}

static void w_op(const bench_msg *in) {
  wnode *nd = w_node(in->node);
  wop *p = malloc(sizeof *p);
  uint8_t key[PROTO_DHT_KEY_BYTES];
  char name[64];
  int rc;
  if (!p)
    abort();
  p->put = in->type == BM_PUT;
  p->node = in->node;
  p->key = in->key;
  bench_key_name(W.o->seed, in->key, name, sizeof name);
  dht_key(name, key);
  if (nd->dead) {
    rc = BEE_ECLOSED;
  } else if (in->type == BM_GET) {
    p->t0_ns = uv_hrtime();
    rc = dht_get(dht_glue_node(nd->glue), key, false, w_get_cb, p);
  } else {
    uint8_t *value = malloc(W.o->value);
    if (!value)
      abort();
    bench_value(W.o->seed, in->key, value, W.o->value);
    p->t0_ns = uv_hrtime();
    rc = dht_put(dht_glue_node(nd->glue), key, (proto_bytes){NULL, 0},
                 (proto_bytes){value, W.o->value},
                 (uint64_t)time(NULL) + TTL_S, w_put_cb, p);
    free(value); /* dht_put copies */
  }
  if (rc)
    w_done(p, rc, false, 0, NULL);
}

static int count_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  struct dirent *e;
  int n = 0;
  if (!d)
    return 0;
  while ((e = readdir(d)))
    n += e->d_name[0] != '.';
  closedir(d);
  return n - 1; /* the directory's own */
}

static int threads_now(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  int n = 0;
  if (!f)
    return 0;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "Threads: %d", &n) == 1)
      break;
  fclose(f);
  return n;
}

static void w_teardown(void) {
  for (size_t i = 0; i < W.count; i++) {
    wnode *nd = &W.nodes[i];
    if (nd->glue)
      dht_glue_close(nd->glue);
    if (nd->host)
      proto_host_close(nd->host);
    if (nd->has_hole)
      uv_close((uv_handle_t *)&nd->hole, NULL);
    nd->glue = NULL;
    nd->host = NULL;
    nd->has_hole = false;
  }
  while (W.holes) {
    hole_conn *h = W.holes;
    W.holes = h->next;
    uv_close((uv_handle_t *)&h->tcp, hole_conn_closed);
  }
  uv_close((uv_handle_t *)&W.poll, NULL);
}

static void w_holes(bool silent) {
  for (size_t i = 0; silent && i < W.count; i++) {
    wnode *nd = &W.nodes[i];
    struct sockaddr_in sa;
    int rc;
    if (!nd->dead || nd->has_hole)
      continue;
    uv_ip4_addr("127.0.0.1", nd->port, &sa);
    uv_tcp_init(&W.loop, &nd->hole);
    nd->has_hole = true;
    if ((rc = uv_tcp_bind(&nd->hole, (const struct sockaddr *)&sa, 0)) ||
        (rc = uv_listen((uv_stream_t *)&nd->hole, 1024, hole_on_conn))) {
      fprintf(stderr, "bench-dht: cannot listen on 127.0.0.1:%d: %s\n",
              nd->port, uv_strerror(rc));
      w_fail(rc);
    }
  }
  bench_msg m = {.type = BM_HOLED};
  w_send(&m);
}

static void w_command(const bench_msg *in) {
  bench_msg m = {0};
  wnode *nd;
  switch (in->type) {
  case BM_BOOT: {
    char addr[32];
    const char *boot = addr;
    nd = w_node(in->node);
    snprintf(addr, sizeof addr, "127.0.0.1:%u", (unsigned)in->arg);
    int rc = dht_bootstrap(dht_glue_node(nd->glue), &boot, 1, w_boot_cb,
                           (void *)(uintptr_t)in->node);
    if (rc) {
      m = (bench_msg){.type = BM_BOOTED, .node = in->node, .status = rc};
      w_send(&m);
    }
    break;
  }
  case BM_PUT:
  case BM_GET:
    w_op(in);
    break;
  case BM_KILL:
    nd = w_node(in->node);
    if (!nd->dead) {
      nd->dead = true;
      dht_glue_close(nd->glue);
      proto_host_close(nd->host);
      nd->glue = NULL;
      nd->host = NULL;
    }
    break;
  case BM_HOLES:
    w_holes(in->arg != 0);
    break;
  case BM_STATS: {
    struct rusage ru;
    size_t conns = 0;
    getrusage(RUSAGE_SELF, &ru);
    for (size_t i = 0; i < W.count; i++)
      if (!W.nodes[i].dead)
        conns += proto_host_conn_count(W.nodes[i].host);
    m = (bench_msg){.type = BM_STATS_ANS, .arg = conns,
                    .ok = (uint32_t)count_fds(),
                    .requests = (uint32_t)threads_now(),
                    .rss_kb = (uint32_t)ru.ru_maxrss};
    w_send(&m);
    break;
  }
  case BM_EXIT:
    w_teardown();
    break;
  case BM_PROBE: {
    uint8_t key[PROTO_DHT_KEY_BYTES];
    char name[64];
    bench_key_name(W.o->seed, in->key, name, sizeof name);
    dht_key(name, key);
    for (size_t i = 0; i < W.count; i++) {
      nd = &W.nodes[i];
      if (nd->dead)
        continue;
      dht_value v;
      uint64_t d = 0;
      for (int j = 0; j < 8; j++)
        d = d << 8 | (uint8_t)(nd->id.id[j] ^ key[j]);
      m = (bench_msg){.type = BM_PROBE_ANS, .node = (uint32_t)(W.first + i),
                      .key = in->key, .ns = d,
                      .ok = dht_node_local_get(dht_glue_node(nd->glue), key,
                                               &v) == 0};
      w_send(&m);
    }
    break;
  }
  default:
    w_fail(BEE_EUNKNOWN);
  }
}

static void w_on_poll(uv_poll_t *h, int status, int events) {
  bench_msg m;
  (void)h;
  (void)events;
  if (status < 0)
    _exit(1);
  for (;;) {
    ssize_t n = recv(W.fd, &m, sizeof m, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
      return;
    if (n != (ssize_t)sizeof m)
      _exit(1); /* the coordinator is gone */
    w_command(&m);
    if (m.type == BM_EXIT)
      return;
  }
}

/* Every connection between two nodes of this process costs two
 * descriptors: take the hard limit, and refuse to start with too few. */
static int w_raise_nofile(size_t count) {
  struct rlimit rl;
  rlim_t need = 256 + (rlim_t)count * (2 * CONNS_PER_NODE_MIN + 1);
  if (getrlimit(RLIMIT_NOFILE, &rl))
    return -errno;
  if (rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl))
      return -errno;
  }
  if (rl.rlim_cur < need) {
    fprintf(stderr,
            "bench-dht: %zu nodes in one process need at least %llu file "
            "descriptors (%d connections per node, two ends each), but the "
            "hard RLIMIT_NOFILE is %llu: lower --per-proc or raise the "
            "hard limit (ulimit -Hn)\n",
            count, (unsigned long long)need, CONNS_PER_NODE_MIN,
            (unsigned long long)rl.rlim_cur);
    return -EMFILE;
  }
  return 0;
}

static int w_node_start(wnode *nd) {
  proto_host_config hc;
  dht_config dc;
  int rc;
  proto_identity_generate(&nd->id);
  proto_host_config_default(&hc);
  hc.loop = &W.loop;
  hc.auth = (proto_auth){.id = &nd->id, .token = NULL, .moderator_pk = NULL,
                         .swarm = SWARM, .revoked = NULL,
                         .accept_roles = PROTO_ROLES_ALL,
                         .accept_bulk_roles = 0,
                         .ciphers = PROTO_CIPHERS_ALL};
  /* Every node here dials from 127.0.0.1, where on a real network each
   * peer has its own address: the per-address handshake cap would
   * throttle the whole swarm as one abusive host, and a node that knows
   * the whole swarm needs a connection to each. */
  hc.max_pending_per_addr = W.o->nodes;
  if (hc.max_conns < 2 * W.o->nodes)
    hc.max_conns = 2 * W.o->nodes;
  if ((rc = proto_host_new(&hc, &nd->host)))
    return rc;
  if ((rc = proto_host_listen(nd->host, "127.0.0.1:0", &nd->port)))
    return rc;
  dht_config_default(&dc);
  dc.id = &nd->id;
  dc.port = (unsigned)nd->port;
  return dht_glue_new(&W.loop, nd->host, &dc, NULL, NULL, &nd->glue);
}

static int worker_main(const opts *o, int fd, size_t first, size_t count) {
  int rc;
  signal(SIGPIPE, SIG_IGN);
  bee_log_set_level(o->log_level);
  W.o = o;
  W.fd = fd;
  W.first = first;
  W.count = count;
  if ((rc = w_raise_nofile(count)))
    w_fail(rc);
  W.nodes = calloc(count, sizeof *W.nodes);
  W.expect = malloc(o->value);
  if (!W.nodes || !W.expect)
    w_fail(-ENOMEM);
  uv_loop_init(&W.loop);
  for (size_t i = 0; i < count; i++) {
    if ((rc = w_node_start(&W.nodes[i]))) {
      fprintf(stderr, "bench-dht: node %zu: %s\n", first + i, bee_strerror(rc));
      w_fail(rc);
    }
    bench_msg m = {.type = BM_PORT, .node = (uint32_t)(first + i),
                   .arg = (uint64_t)W.nodes[i].port};
    w_send(&m);
  }
  bench_msg ready = {.type = BM_READY, .arg = BENCH_VERSION};
  w_send(&ready);
  uv_poll_init(&W.loop, &W.poll, fd);
  uv_poll_start(&W.poll, UV_READABLE, w_on_poll);
  uv_run(&W.loop, UV_RUN_DEFAULT);
  rc = uv_loop_close(&W.loop);
  for (size_t i = 0; i < count; i++)
    proto_identity_clear(&W.nodes[i].id);
  free(W.nodes);
  free(W.expect);
  close(fd);
  return rc ? 1 : 0;
}

/* ======================================================================== */
/* The coordinator.                                                         */

typedef struct wproc {
  pid_t pid;
  int fd;
  size_t first, count;
  bool ready;
} wproc;

#define MISSED_MAX 8 /* failed gets remembered for --probe */

typedef struct batch {
  size_t missed[MISSED_MAX], nmissed;
  bool is_get;
  size_t key0, total, issued, ended, ok;
  double *ms; /* latency of each operation, by key - key0 */
  uint64_t t0_ns, t1_ns;
  double cpu0_s, cpu1_s;
  uint64_t requests, stored;
  int first_error;
} batch;

typedef struct wstats {
  size_t conns;
  unsigned fds_max, threads;
  double rss_mb;
} wstats;

enum { PH_SPAWN, PH_BOOT, PH_PUT, PH_GET, PH_KILL, PH_DGET, PH_DPUT, PH_END };
static const char *const phase_names[] = {
    "start", "boot", "put", "get", "kill", "get, dead peers",
    "put, dead peers", "end"};

static struct {
  opts o;
  wproc *w;
  size_t nw;
  struct pollfd *pfd;
  int *ports;
  bool *dead;
  size_t *origin;
  size_t live;
  uint64_t rng;
  int phase;
  size_t ready, booted, boot_failed, holed, stats_in;
  wstats st;
  batch *cur;
  batch put, get, dget, dput;
  double boot_s;
  wstats st_before_kill, st_end;
  bench_msg *probe; /* answers to one BM_PROBE */
  size_t nprobe;
} C;

static void on_alarm(int sig) {
  static const char msg[] = "bench-dht: timed out in phase ";
  const char *p = phase_names[C.phase];
  (void)sig;
  if (write(2, msg, sizeof msg - 1) < 0 || write(2, p, strlen(p)) < 0 ||
      write(2, "\n", 1) < 0) {
    /* nothing more to say */
  }
  for (size_t i = 0; i < C.nw; i++)
    if (C.w[i].pid > 0)
      kill(C.w[i].pid, SIGKILL);
  _exit(124);
}

static void die(const char *what) {
  fprintf(stderr, "bench-dht: %s (in phase %s)\n", what, phase_names[C.phase]);
  for (size_t i = 0; i < C.nw; i++)
    if (C.w[i].pid > 0)
      kill(C.w[i].pid, SIGKILL);
  exit(1);
}

static uint64_t rnd(void) { /* xorshift64* */
  C.rng ^= C.rng >> 12;
  C.rng ^= C.rng << 25;
  C.rng ^= C.rng >> 27;
  return C.rng * 2685821657736338717ull;
}

/* A random live node other than `not` (NODES_MAX: any). */
static size_t rnd_live(size_t not) {
  for (;;) {
    size_t i = (size_t)(rnd() % C.o.nodes);
    if (!C.dead[i] && i != not)
      return i;
  }
}

static void c_send(size_t node, bench_msg m) {
  wproc *w = &C.w[node / C.o.per_proc];
  m.node = (uint32_t)node;
  if (send(w->fd, &m, sizeof m, 0) != (ssize_t)sizeof m)
    die("a worker is gone");
}

static void c_send_all(bench_msg m) {
  for (size_t i = 0; i < C.nw; i++)
    c_send(C.w[i].first, m);
}

static void c_handle(const bench_msg *m) {
  batch *b = C.cur;
  switch (m->type) {
  case BM_PORT:
    if (m->node >= C.o.nodes)
      die("a worker named a node it does not have");
    C.ports[m->node] = (int)m->arg;
    break;
  case BM_READY:
    if (m->arg != BENCH_VERSION)
      die("the worker is from another build");
    C.ready++;
    break;
  case BM_BOOTED:
    C.booted++;
    C.boot_failed += m->status != 0;
    break;
  case BM_DONE: {
    if (!b || m->key < b->key0 || m->key >= b->key0 + b->total)
      die("an answer for no operation in flight");
    b->ms[m->key - b->key0] = (double)m->ns / 1e6;
    b->ok += m->ok != 0;
    b->requests += m->requests;
    b->stored += m->arg;
    if (!m->ok && !b->first_error)
      b->first_error = m->status ? m->status : BEE_ESTALE;
    if (!m->ok && b->is_get && b->nmissed < MISSED_MAX)
      b->missed[b->nmissed++] = m->key;
    if (++b->ended == b->total)
      b->t1_ns = now_ns();
    break;
  }
  case BM_HOLED:
    C.holed++;
    break;
  case BM_PROBE_ANS:
    if (C.nprobe < C.o.nodes)
      C.probe[C.nprobe++] = *m;
    break;
  case BM_STATS_ANS:
    C.st.conns += m->arg;
    if (m->ok > C.st.fds_max)
      C.st.fds_max = m->ok;
    C.st.threads += m->requests;
    C.st.rss_mb += m->rss_kb / 1024.0;
    C.stats_in++;
    break;
  case BM_FAILED:
    fprintf(stderr, "bench-dht: a worker failed: %s\n",
            C.o.opendht ? strerror(-m->status) : bee_strerror(m->status));
    die("cannot go on");
    break;
  default:
    die("a worker sent an unknown message");
  }
}

/* Reads what the workers sent, waiting up to timeout_ms (-1: until
 * something comes). */
static void pump(int timeout_ms) {
  int n = poll(C.pfd, C.nw, timeout_ms);
  if (n < 0 && errno != EINTR)
    die("poll failed");
  for (size_t i = 0; n > 0 && i < C.nw; i++) {
    if (!C.pfd[i].revents)
      continue;
    for (;;) {
      bench_msg m;
      ssize_t r = recv(C.pfd[i].fd, &m, sizeof m, MSG_DONTWAIT);
      if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        break;
      if (r != (ssize_t)sizeof m)
        die("a worker died");
      c_handle(&m);
    }
  }
}

/* Pumps for ms milliseconds. */
static void pump_for(unsigned ms) {
  uint64_t end = now_ns() + (uint64_t)ms * 1000000u;
  for (uint64_t t; (t = now_ns()) < end;)
    pump((int)((end - t) / 1000000u) + 1);
}

/* The workers' CPU seconds so far, every thread, from /proc. */
static double workers_cpu_s(void) {
  double s = 0, tick = (double)sysconf(_SC_CLK_TCK);
  for (size_t i = 0; i < C.nw; i++) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)C.w[i].pid);
    FILE *f = fopen(path, "r");
    if (!f)
      continue;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *p = strrchr(buf, ')');
    unsigned long long ut, st;
    /* After "pid (comm)": state and 10 more fields, then utime stime. */
    if (p && sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu",
                    &ut, &st) == 2)
      s += (double)(ut + st) / tick;
  }
  return s;
}

static void c_stats(wstats *out) {
  memset(&C.st, 0, sizeof C.st);
  C.stats_in = 0;
  c_send_all((bench_msg){.type = BM_STATS});
  while (C.stats_in < C.nw)
    pump(-1);
  *out = C.st;
}

static int cmp_probe(const void *a, const void *b) {
  uint64_t x = ((const bench_msg *)a)->ns, y = ((const bench_msg *)b)->ns;
  return x < y ? -1 : x > y;
}

/* Where the values are that gets in b did not find: the rank, by XOR
 * distance to the key among live nodes (0: the closest), of every node
 * holding it, of the node that put it and of the one that asked. */
static void probe_missed(const char *phase, const batch *b) {
  for (size_t i = 0; i < b->nmissed; i++) {
    size_t k = b->missed[i], live = C.o.nodes - (C.o.nodes - C.live);
    C.nprobe = 0;
    c_send_all((bench_msg){.type = BM_PROBE, .key = k});
    while (C.nprobe < live)
      pump(-1);
    qsort(C.probe, C.nprobe, sizeof *C.probe, cmp_probe);
    printf("probe: %s missed key %zu (put by node %zu): held at ranks", phase,
           k, C.origin[k]);
    for (size_t r = 0; r < C.nprobe; r++)
      if (C.probe[r].ok)
        printf(" %zu", r);
    for (size_t r = 0; r < C.nprobe; r++)
      if (C.probe[r].node == C.origin[k])
        printf("; putter at rank %zu", r);
    printf(" of %zu live nodes\n", C.nprobe);
  }
}

static void run_batch(batch *b, bool is_get, size_t key0, size_t total) {
  memset(b, 0, sizeof *b);
  b->is_get = is_get;
  b->key0 = key0;
  b->total = total;
  if (!(b->ms = calloc(total, sizeof *b->ms)))
    die("out of memory");
  C.cur = b;
  b->cpu0_s = workers_cpu_s();
  b->t0_ns = now_ns();
  while (b->ended < b->total) {
    while (b->issued < b->total && b->issued - b->ended < C.o.conc) {
      size_t k = key0 + b->issued++, node;
      if (C.o.fixed) {
        node = C.o.nodes - (is_get ? 1 : 2);
        if (!is_get)
          C.origin[k] = node;
      } else if (is_get) {
        node = rnd_live(C.origin[k]);
      } else {
        node = rnd_live(NODES_MAX);
        C.origin[k] = node;
      }
      c_send(node, (bench_msg){.type = is_get ? BM_GET : BM_PUT, .key = k});
    }
    pump(-1);
  }
  b->cpu1_s = workers_cpu_s();
  C.cur = NULL;
}

static int spawn(size_t i, char *const *self_argv) {
  wproc *w = &C.w[i];
  int sv[2];
  w->first = i * C.o.per_proc;
  w->count = C.o.nodes - w->first < C.o.per_proc ? C.o.nodes - w->first
                                                  : C.o.per_proc;
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv))
    return -errno;
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0)
    return -errno;
  if (pid == 0) {
    signal(SIGALRM, SIG_DFL);
    alarm(0);
    for (size_t j = 0; j < i; j++)
      close(C.w[j].fd);
    close(sv[0]);
    if (!C.o.opendht)
      _exit(worker_main(&C.o, sv[1], w->first, w->count));
    char first[24], count[24], seed[24], value[24];
    snprintf(first, sizeof first, "%zu", w->first);
    snprintf(count, sizeof count, "%zu", w->count);
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)C.o.seed);
    snprintf(value, sizeof value, "%zu", C.o.value);
    /* dup2 clears close-on-exec, but not when the descriptor is
     * already in place. */
    if (sv[1] == BENCH_WORKER_FD ? fcntl(sv[1], F_SETFD, 0) < 0
                                 : dup2(sv[1], BENCH_WORKER_FD) < 0)
      _exit(127);
    char *args[] = {self_argv[0], "--first", first, "--count", count,
                    "--seed", seed, "--value", value, NULL};
    execv(self_argv[0], args);
    fprintf(stderr, "bench-dht: cannot run %s: %s\n", self_argv[0],
            strerror(errno));
    _exit(127);
  }
  close(sv[1]);
  w->pid = pid;
  w->fd = sv[0];
  C.pfd[i] = (struct pollfd){.fd = sv[0], .events = POLLIN};
  return 0;
}

/* bench-opendht next to this program. */
static int opendht_path(char *out, size_t cap) {
  char self[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0)
    return -errno;
  self[n] = 0;
  char *slash = strrchr(self, '/');
  if (slash)
    slash[1] = 0;
  if ((size_t)snprintf(out, cap, "%sbench-opendht", slash ? self : "./") >= cap)
    return -ENAMETOOLONG;
  return 0;
}

/* ---- statistics --------------------------------------------------------- */

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

typedef struct summary {
  double p50, p99, mean, ops_s, cpu_ms_per_op;
} summary;

/* Nearest-rank percentiles over every operation, failed ones too. */
static void summarize(const batch *b, summary *s) {
  memset(s, 0, sizeof *s);
  if (b->ended == 0)
    return;
  double *v = malloc(b->ended * sizeof *v), sum = 0;
  if (!v)
    die("out of memory");
  memcpy(v, b->ms, b->ended * sizeof *v);
  qsort(v, b->ended, sizeof *v, cmp_double);
  for (size_t i = 0; i < b->ended; i++)
    sum += v[i];
  size_t r50 = (b->ended * 50 + 99) / 100, r99 = (b->ended * 99 + 99) / 100;
  s->p50 = v[r50 - 1];
  s->p99 = v[r99 - 1];
  s->mean = sum / (double)b->ended;
  double wall = (double)(b->t1_ns - b->t0_ns) / 1e9;
  s->ops_s = wall > 0 ? (double)b->ended / wall : 0;
  s->cpu_ms_per_op = 1000 * (b->cpu1_s - b->cpu0_s) / (double)b->ended;
  free(v);
}

static void print_batch(const char *name, const batch *b, const char *what) {
  summary s;
  summarize(b, &s);
  printf("%-16s %6zu ops  p50 %8.3f  p99 %8.3f  mean %8.3f ms  %8.1f ops/s  "
         "%.3f ms CPU/op  %zu/%zu %s",
         name, b->ended, s.p50, s.p99, s.mean, s.ops_s, s.cpu_ms_per_op, b->ok,
         b->total, what);
  if (b->requests)
    printf(", %.1f requests/op", (double)b->requests / (double)b->ended);
  if (!b->is_get && b->stored)
    printf(", %.2f replicas", (double)b->stored / (double)b->ended);
  if (b->first_error)
    printf(" (first failure: %s)",
           C.o.opendht ? "not stored / not found" : bee_strerror(b->first_error));
  printf("\n");
}

static void result_batch(const char *pfx, const batch *b) {
  summary s;
  summarize(b, &s);
  printf(" %s_p50=%.3f %s_p99=%.3f %s_mean=%.3f %s_ops_s=%.1f %s_cpu_ms=%.3f"
         " %s_ok=%zu %s_n=%zu",
         pfx, s.p50, pfx, s.p99, pfx, s.mean, pfx, s.ops_s, pfx,
         s.cpu_ms_per_op, pfx, b->ok, pfx, b->ended);
}

static void report(void) {
  const char *impl = C.o.opendht ? "opendht" : "beed";
  printf("%s: %zu nodes in %zu worker process%s (%u threads in all), %zu ops "
         "per phase, %zu in flight, %zu-byte values, %s, seed %llu\n",
         C.o.opendht ? "OpenDHT" : "beed", C.o.nodes, C.nw,
         C.nw == 1 ? "" : "es", C.st_before_kill.threads, C.o.ops, C.o.conc,
         C.o.value,
         C.o.fixed ? "puts from one node and gets from another"
                   : "each from a random node",
         (unsigned long long)C.o.seed);
  printf("bootstrap: %.2f s for %zu nodes, %zu failed\n", C.boot_s,
         C.o.nodes - 1, C.boot_failed);
  print_batch("put", &C.put, "stored");
  print_batch("get", &C.get, "found");
  if (C.o.kill_pct) {
    char name[40];
    snprintf(name, sizeof name, "get, %u%% dead", C.o.kill_pct);
    print_batch(name, &C.dget, "found");
    snprintf(name, sizeof name, "put, %u%% dead", C.o.kill_pct);
    print_batch(name, &C.dput, "stored");
    printf("dead peers: %zu of %zu nodes, %s\n", C.o.nodes - C.live, C.o.nodes,
           C.o.refuse ? "ports closed (refused at once)"
                      : "ports held by listeners that never answer");
  }
  if (!C.o.opendht)
    printf("connections (both ends): %zu after the gets, %zu at the end\n",
           C.st_before_kill.conns, C.st_end.conns);
  printf("workers: %.0f MiB peak RSS in all, at most %u descriptors in one; "
         "coordinator CPU %.2f s\n",
         C.st_end.rss_mb, C.st_end.fds_max, self_cpu_s());
  printf("RESULT impl=%s nodes=%zu procs=%zu threads=%u ops=%zu conc=%zu "
         "value=%zu origin=%s kill_pct=%u dead_mode=%s boot_s=%.3f "
         "boot_failed=%zu",
         impl, C.o.nodes, C.nw, C.st_before_kill.threads, C.o.ops, C.o.conc,
         C.o.value, C.o.fixed ? "fixed" : "random", C.o.kill_pct,
         C.o.refuse ? "refuse" : "timeout", C.boot_s, C.boot_failed);
  result_batch("put", &C.put);
  result_batch("get", &C.get);
  if (C.o.kill_pct) {
    result_batch("dget", &C.dget);
    result_batch("dput", &C.dput);
  }
  printf(" conns=%zu rss_mb=%.0f fds_max=%u\n", C.st_before_kill.conns,
         C.st_end.rss_mb, C.st_end.fds_max);
  fflush(stdout);
}

int main(int argc, char **argv) {
  char odht[PATH_MAX];
  if (sodium_init() < 0)
    return 1;
  if (parse_opts(argc, argv, &C.o))
    return 2;
  if (C.o.opendht && !C.o.opendht_path) {
    if (opendht_path(odht, sizeof odht)) {
      fprintf(stderr, "bench-dht: cannot find bench-opendht; pass --opendht\n");
      return 1;
    }
    C.o.opendht_path = odht;
  }
  if (C.o.opendht && access(C.o.opendht_path, X_OK)) {
    fprintf(stderr, "bench-dht: %s: %s (was OpenDHT's C library found at "
            "build time?)\n", C.o.opendht_path, strerror(errno));
    return 1;
  }
  signal(SIGPIPE, SIG_IGN);
  signal(SIGALRM, on_alarm);
  alarm(C.o.timeout_s);
  C.nw = (C.o.nodes + C.o.per_proc - 1) / C.o.per_proc;
  size_t nkeys = C.o.ops + (C.o.kill_pct ? C.o.dead_puts : 0);
  C.w = calloc(C.nw, sizeof *C.w);
  C.pfd = calloc(C.nw, sizeof *C.pfd);
  C.ports = calloc(C.o.nodes, sizeof *C.ports);
  C.dead = calloc(C.o.nodes, sizeof *C.dead);
  C.origin = calloc(nkeys, sizeof *C.origin);
  C.probe = calloc(C.o.nodes, sizeof *C.probe);
  if (!C.w || !C.pfd || !C.ports || !C.dead || !C.origin || !C.probe)
    die("out of memory");
  C.rng = C.o.seed * 0x9e3779b97f4a7c15ull + 1;
  C.live = C.o.nodes;

  char *self_argv[] = {(char *)C.o.opendht_path, NULL};
  for (size_t i = 0; i < C.nw; i++) {
    int rc = spawn(i, self_argv);
    if (rc) {
      fprintf(stderr, "bench-dht: cannot start a worker: %s\n", strerror(-rc));
      die("cannot go on");
    }
  }
  while (C.ready < C.nw)
    pump(-1);

  /* Bootstrap, staggered. */
  C.phase = PH_BOOT;
  uint64_t t0 = now_ns();
  size_t next = 1;
  while (C.booted < C.o.nodes - 1) {
    uint64_t due = C.o.stagger_us
                       ? (now_ns() - t0) / 1000 / C.o.stagger_us + 1
                       : C.o.nodes;
    while (next < C.o.nodes && next <= due)
      c_send(next++, (bench_msg){.type = BM_BOOT, .arg = (uint64_t)C.ports[0]});
    pump(next < C.o.nodes ? 1 : -1);
  }
  C.boot_s = (double)(now_ns() - t0) / 1e9;
  pump_for(C.o.settle_ms);

  C.phase = PH_PUT;
  run_batch(&C.put, false, 0, C.o.ops);
  C.phase = PH_GET;
  run_batch(&C.get, true, 0, C.o.ops);
  if (C.o.probe && !C.o.opendht)
    probe_missed("get", &C.get);
  c_stats(&C.st_before_kill);
  if (C.o.kill_pct) {
    C.phase = PH_KILL;
    size_t want = (C.o.nodes * C.o.kill_pct + 50) / 100;
    while (C.o.nodes - C.live < want) {
      size_t i = (size_t)(rnd() % C.o.nodes);
      if (C.dead[i])
        continue;
      C.dead[i] = true;
      C.live--;
      c_send(i, (bench_msg){.type = BM_KILL});
    }
    pump_for(KILL_SETTLE_MS);
    c_send_all((bench_msg){.type = BM_HOLES, .arg = !C.o.refuse});
    while (C.holed < C.nw)
      pump(-1);
    C.phase = PH_DGET;
    run_batch(&C.dget, true, 0, C.o.ops);
    if (C.o.probe && !C.o.opendht)
      probe_missed("get with dead peers", &C.dget);
    C.phase = PH_DPUT;
    run_batch(&C.dput, false, C.o.ops, nkeys - C.o.ops);
  }
  C.phase = PH_END;
  c_stats(&C.st_end);
  report();
  c_send_all((bench_msg){.type = BM_EXIT});
  int bad = 0;
  for (size_t i = 0; i < C.nw; i++) {
    int st;
    if (waitpid(C.w[i].pid, &st, 0) < 0 || !WIFEXITED(st) ||
        WEXITSTATUS(st) != 0)
      bad++;
    C.w[i].pid = 0;
    close(C.w[i].fd);
  }
  if (bad)
    fprintf(stderr, "bench-dht: %d worker%s did not exit cleanly\n", bad,
            bad == 1 ? "" : "s");
  free(C.put.ms);
  free(C.get.ms);
  free(C.dget.ms);
  free(C.dput.ms);
  free(C.w);
  free(C.pfd);
  free(C.ports);
  free(C.dead);
  free(C.origin);
  free(C.probe);
  return bad ? 1 : 0;
}
