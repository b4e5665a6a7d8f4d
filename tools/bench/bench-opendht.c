/* bench-opendht.c: OpenDHT nodes for the DHT benchmark.
 *
 * A worker of bench-dht --impl opendht (see bench-dht.c and bench-dht.h):
 * it runs --count OpenDHT nodes, each a dht_runner of OpenDHT's C API
 * (libopendht-c) on its own UDP port, and carries out what the
 * coordinator asks on descriptor BENCH_WORKER_FD, answering there.  It is
 * not meant to be run by hand.
 *
 * How each step maps onto OpenDHT:
 *   boot  dht_runner_bootstrap("127.0.0.1", node 0's port), then a
 *         dht_runner_get of the node's own id; booted when that get calls
 *         done (beed's bootstrap likewise ends with a lookup of itself);
 *   put   dht_runner_put of a plain (unsigned, unencrypted) value, not
 *         permanent; timed to the done callback, done(ok) counts as
 *         stored;
 *   get   dht_runner_get, timed to the first value that matches what was
 *         put: the get callback then returns false, which ends the get.
 *         That is the moment the caller holds its value, as beed's get
 *         reports it.  A get that calls done without it is timed to done
 *         and counts as not found;
 *   kill  dht_runner_delete, which sends nothing (OpenDHT says no
 *         goodbye);
 *   holes a UDP socket bound to the dead node's port on 127.0.0.1 that
 *         never reads, so what is sent there vanishes.  OpenDHT's sockets
 *         are unconnected, so the ICMP "port unreachable" that a closed
 *         port returns is not reported to it either: with or without the
 *         socket, a dead node looks to OpenDHT like a timeout.
 *
 * Every runner is threaded (the C API has no other mode): each has a DHT
 * thread and a receive thread, so this process runs about two threads
 * per node where beed runs all of a worker's nodes on one.  Callbacks
 * come on those threads; the latency is read on CLOCK_MONOTONIC there.
 *
 * The C API cannot choose the address a runner binds: it binds 0.0.0.0
 * and [::].  So that nothing can leave the machine, the worker refuses to
 * start unless loopback is the only network interface; tools/bench/run-dht
 * runs the benchmark in a fresh network namespace (unshare -n).
 */
#include "bench-dht.h"

#include <opendht/opendht_c.h>

#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <ifaddrs.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>

typedef struct node {
  dht_runner *r;
  in_port_t port;
  bool dead;
  int hole; /* the dead node's silent socket, or -1 */
} node;

/* An operation in flight.  Runner threads call back; `ended` is read and
 * written under the lock.  Freed by its done callback. */
typedef struct op {
  uint32_t node;
  uint64_t key;
  uint64_t t0_ns;
  bool ended;
  uint8_t *expect; /* gets: the value that was put */
} op;

static struct {
  int fd;
  size_t first, count, value;
  uint64_t seed;
  node *nodes;
  pthread_mutex_t mu;
} W = {.fd = BENCH_WORKER_FD, .mu = PTHREAD_MUTEX_INITIALIZER};

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void w_send(const bench_msg *m) {
  pthread_mutex_lock(&W.mu);
  ssize_t n = send(W.fd, m, sizeof *m, 0);
  pthread_mutex_unlock(&W.mu);
  if (n != (ssize_t)sizeof *m)
    _exit(1); /* the coordinator is gone */
}

static void w_fail(int err) {
  bench_msg m = {.type = BM_FAILED, .status = -err};
  w_send(&m);
  _exit(1);
}

static int parse_num(const char *s, uint64_t max, uint64_t *out) {
  char *end;
  if (*s < '0' || *s > '9')
    return -EINVAL;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || *end || v > max)
    return -ERANGE;
  *out = v;
  return 0;
}

/* OpenDHT binds every address; run only where that means loopback. */
static int only_loopback(void) {
  struct ifaddrs *ifs;
  int others = 0;
  if (getifaddrs(&ifs))
    return -errno;
  for (struct ifaddrs *i = ifs; i; i = i->ifa_next)
    if (strcmp(i->ifa_name, "lo") != 0) {
      fprintf(stderr, "bench-opendht: interface %s is not loopback\n",
              i->ifa_name);
      others++;
    }
  freeifaddrs(ifs);
  return others ? -EPERM : 0;
}

static node *w_node(uint32_t global) {
  if (global < W.first || global >= W.first + W.count)
    w_fail(ERANGE);
  return &W.nodes[global - W.first];
}

/* ---- callbacks (runner threads) ----------------------------------------- */

/* Reports op once: the first of a matching value and done. */
static void op_end(op *p, bool ok, uint64_t t) {
  pthread_mutex_lock(&W.mu);
  bool first = !p->ended;
  p->ended = true;
  pthread_mutex_unlock(&W.mu);
  if (!first)
    return;
  bench_msg m = {.type = BM_DONE, .node = p->node, .key = p->key,
                 .ns = t - p->t0_ns, .ok = ok, .status = ok ? 0 : -ENOENT};
  w_send(&m);
}

static void put_done(bool ok, void *arg) {
  op *p = arg;
  op_end(p, ok, now_ns());
  free(p);
}

static bool get_value(const dht_value *v, void *arg) {
  op *p = arg;
  uint64_t t = now_ns();
  dht_data_view d = dht_value_get_data(v);
  if (d.size != W.value || memcmp(d.data, p->expect, W.value) != 0)
    return true; /* not the value that was put: keep looking */
  op_end(p, true, t);
  return false; /* found: end the get */
}

static void get_done(bool ok, void *arg) {
  op *p = arg;
  (void)ok;
  op_end(p, false, now_ns()); /* nothing if the value came first */
  free(p->expect);
  free(p);
}

static bool boot_value(const dht_value *v, void *arg) {
  (void)v;
  (void)arg;
  return true;
}

static void boot_done(bool ok, void *arg) {
  bench_msg m = {.type = BM_BOOTED, .node = (uint32_t)(uintptr_t)arg,
                 .status = ok ? 0 : -EHOSTUNREACH};
  w_send(&m);
}

/* ---- commands (main thread) --------------------------------------------- */

static void w_op(const bench_msg *in) {
  node *nd = w_node(in->node);
  op *p = calloc(1, sizeof *p);
  char name[64];
  dht_infohash key;
  if (!p || !(p->expect = malloc(W.value)))
    w_fail(ENOMEM);
  p->node = in->node;
  p->key = in->key;
  int n = bench_key_name(W.seed, in->key, name, sizeof name);
  dht_infohash_get(&key, (const uint8_t *)name, (size_t)n);
  bench_value(W.seed, in->key, p->expect, W.value);
  if (nd->dead) {
    op_end(p, false, now_ns());
    free(p->expect);
    free(p);
  } else if (in->type == BM_GET) {
    p->t0_ns = now_ns();
    dht_runner_get(nd->r, &key, get_value, get_done, p);
  } else {
    dht_value *v = dht_value_new(p->expect, W.value);
    free(p->expect);
    p->expect = NULL;
    p->t0_ns = now_ns();
    dht_runner_put(nd->r, &key, v, put_done, p, false);
    dht_value_unref(v);
  }
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

/* Open descriptors.  OpenDHT's receive threads wait on select(), which
 * fails past descriptor 1023: this says how close a worker came. */
static unsigned count_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  struct dirent *e;
  unsigned n = 0;
  if (!d)
    return 0;
  while ((e = readdir(d)))
    n += e->d_name[0] != '.';
  closedir(d);
  return n ? n - 1 : 0; /* the directory's own */
}

static void w_command(const bench_msg *in) {
  bench_msg m = {0};
  node *nd;
  switch (in->type) {
  case BM_BOOT: {
    char port[8];
    nd = w_node(in->node);
    snprintf(port, sizeof port, "%u", (unsigned)in->arg);
    dht_runner_bootstrap(nd->r, "127.0.0.1", port);
    dht_infohash self = dht_runner_get_node_id(nd->r);
    dht_runner_get(nd->r, &self, boot_value, boot_done,
                   (void *)(uintptr_t)in->node);
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
      dht_runner_delete(nd->r);
      nd->r = NULL;
    }
    break;
  case BM_HOLES:
    for (size_t i = 0; in->arg && i < W.count; i++) {
      nd = &W.nodes[i];
      if (!nd->dead || nd->hole >= 0)
        continue;
      struct sockaddr_in sa = {.sin_family = AF_INET,
                               .sin_port = htons(nd->port)};
      sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      if ((nd->hole = socket(AF_INET, SOCK_DGRAM, 0)) < 0 ||
          bind(nd->hole, (struct sockaddr *)&sa, sizeof sa)) {
        fprintf(stderr, "bench-opendht: cannot hold port %u: %s\n",
                (unsigned)nd->port, strerror(errno));
        w_fail(errno);
      }
    }
    m.type = BM_HOLED;
    w_send(&m);
    break;
  case BM_STATS: {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    m = (bench_msg){.type = BM_STATS_ANS, .ok = count_fds(),
                    .requests = (uint32_t)threads_now(),
                    .rss_kb = (uint32_t)ru.ru_maxrss};
    w_send(&m);
    break;
  }
  case BM_EXIT:
    break;
  default:
    w_fail(EPROTO);
  }
}

int main(int argc, char **argv) {
  static const struct option longs[] = {
      {"first", required_argument, NULL, 'f'},
      {"count", required_argument, NULL, 'c'},
      {"seed", required_argument, NULL, 's'},
      {"value", required_argument, NULL, 'v'},
      {NULL, 0, NULL, 0},
  };
  uint64_t v;
  int c;
  signal(SIGPIPE, SIG_IGN);
  while ((c = getopt_long(argc, argv, "", longs, NULL)) != -1) {
    if (c == '?' || parse_num(optarg, UINT64_MAX, &v)) {
      fprintf(stderr, "bench-opendht: a worker of bench-dht --impl opendht; "
              "not meant to be run by hand\n");
      return 2;
    }
    if (c == 'f')
      W.first = v;
    else if (c == 'c')
      W.count = v;
    else if (c == 's')
      W.seed = v;
    else
      W.value = v;
  }
  if (W.count == 0 || W.count > 4096 || W.value == 0 || W.value > 60000) {
    fprintf(stderr, "bench-opendht: bad --count or --value\n");
    return 2;
  }
  if (only_loopback()) {
    fprintf(stderr, "bench-opendht: OpenDHT's C API binds 0.0.0.0 and [::]; "
            "run the benchmark where loopback is the only interface, e.g. "
            "unshare -n sh -c 'ip link set lo up && exec bench-dht ...' (as "
            "tools/bench/run-dht does)\n");
    w_fail(EPERM);
  }
  if (!(W.nodes = calloc(W.count, sizeof *W.nodes)))
    w_fail(ENOMEM);

  dht_runner_config cfg;
  dht_runner_config_default(&cfg);
  cfg.peer_discovery = false; /* no multicast */
  cfg.peer_publish = false;
  cfg.log = false;
  for (size_t i = 0; i < W.count; i++) {
    node *nd = &W.nodes[i];
    int rc;
    nd->hole = -1;
    if (!(nd->r = dht_runner_new()))
      w_fail(ENOMEM);
    if ((rc = dht_runner_run_config(nd->r, 0, &cfg)) ||
        !(nd->port = dht_runner_get_bound_port(nd->r, AF_INET))) {
      fprintf(stderr, "bench-opendht: node %zu: cannot run (%d)\n",
              W.first + i, rc);
      w_fail(rc > 0 ? rc : EADDRNOTAVAIL);
    }
    bench_msg m = {.type = BM_PORT, .node = (uint32_t)(W.first + i),
                   .arg = nd->port};
    w_send(&m);
  }
  bench_msg ready = {.type = BM_READY, .arg = BENCH_VERSION};
  w_send(&ready);

  for (;;) {
    bench_msg m;
    ssize_t n = recv(W.fd, &m, sizeof m, 0);
    if (n < 0 && errno == EINTR)
      continue;
    if (n != (ssize_t)sizeof m)
      break; /* the coordinator is gone */
    w_command(&m);
    if (m.type == BM_EXIT)
      break;
  }
  /* Runners first: their threads may still call back into ops. */
  for (size_t i = 0; i < W.count; i++) {
    if (W.nodes[i].r)
      dht_runner_delete(W.nodes[i].r);
    if (W.nodes[i].hole >= 0)
      close(W.nodes[i].hole);
  }
  free(W.nodes);
  return 0;
}
