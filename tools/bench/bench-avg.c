/* bench-avg.c: beed's all-reduce (avg_node_round) among --procs
 * processes on loopback, timed the way the peers' benchmarks time theirs.
 *
 * The coordinator forks one process per member.  Each makes an identity
 * and a token from a throwaway moderator (the swarm is moderated and the
 * traffic encrypted, as in production), listens on 127.0.0.1, and tells
 * the coordinator its id and port over a socketpair; the coordinator
 * sends everyone the member list.  Then, for every size and repetition,
 * the coordinator sends each member "go" with a fresh group id; a member
 * fills its buffer, runs one round over the fixed group (no
 * matchmaking: the peers' collectives have a fixed group too) and reports
 * the milliseconds from its "go" to its round's end.  A repetition's time
 * is the slowest member's, as MPI and Gloo benchmarks report the slowest
 * rank's.  The first --warmup rounds open the connections and are not
 * counted.  Each member checks its result (every member's value is its
 * rank + 1, the weights equal): a wrong mean fails the run.
 *
 * Output: one line per size, "RESULT impl=beed procs=N bytes=S reps=R
 * ms_median=... ms_min=... busbw_gbs=...", which tools/bench/run-avg
 * reads.  busbw is 2(N-1)/N x bytes / time, the bus bandwidth MPI and
 * NCCL benchmarks report.
 */
#define _GNU_SOURCE /* setns */
#include "averager.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SWARM "bench-avg"
#define NMAX 64
#define SIZES_MAX 16

typedef struct opts {
  int procs, reps, warmup;
  size_t sizes[SIZES_MAX]; /* bytes */
  int nsizes;
  avg_codec codec;
  size_t part_floats;
  unsigned window;
  unsigned stripes;
  double clip;           /* --clip: AVG_CLIP_SCALE at it; 0: off */
  bool bandwidth_spans;  /* spans by --bandwidths, else equal */
  bool bandwidth_auto;   /* --bandwidths auto: by the members' meters */
  double bandwidths[64]; /* Mbit/s, declared per member */
  char netns[64][64];    /* member i runs in this namespace */
  char addrs[64][64];    /* and listens on this address */
  int nnetns, naddrs, nbw;
} opts;

/* What goes over the socketpair. */
typedef struct hello {
  uint8_t id[PROTO_ID_BYTES];
  int32_t port;
} hello;
typedef struct go {
  uint64_t floats; /* 0: exit */
  uint8_t group[PROTO_AVG_GROUP_BYTES];
  int32_t measured;   /* --bandwidths auto: spans by mbit below */
  double mbit[NMAX];  /* each member's measured link */
} go;
typedef struct report {
  double ms;
  int32_t status;
  int32_t ok;  /* the mean was right */
  double mbit; /* avg_node_bandwidth_mbit after the round */
} report;

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void xwrite(int fd, const void *p, size_t n) {
  const uint8_t *b = p;
  while (n) {
    ssize_t k = write(fd, b, n);
    if (k < 0 && errno == EINTR)
      continue;
    if (k <= 0) {
      perror("bench-avg: write");
      exit(1);
    }
    b += k, n -= (size_t)k;
  }
}

static int xread(int fd, void *p, size_t n) {
  uint8_t *b = p;
  while (n) {
    ssize_t k = read(fd, b, n);
    if (k < 0 && errno == EINTR)
      continue;
    if (k <= 0)
      return -1;
    b += k, n -= (size_t)k;
  }
  return 0;
}

/* ---- a member ---------------------------------------------------------- */

typedef struct member {
  const opts *o;
  int rank, fd;
  uv_loop_t loop;
  uv_poll_t poll;
  proto_host *h;
  avg_node *node;
  proto_group_member list[NMAX];
  float *x;
  size_t cap;
  double t0;
  size_t floats;
} member;

static void dht_declare(void *ctx, const proto_match *i, uint64_t e) {
  (void)ctx, (void)i, (void)e; /* fixed groups: never called */
}
static void dht_fetch(void *ctx, avg_node *n, const proto_match *i) {
  (void)ctx, (void)n, (void)i;
}

static void on_drain(proto_conn *c, void *data) {
  member *m = data;
  avg_node_drain(m->node, c);
}

static void on_down(proto_conn *c, int status, void *data) {
  member *m = data;
  (void)status;
  if (m->node)
    avg_node_conn_down(m->node, c);
}

static void on_round(avg_node *n, const avg_node_result *r, void *arg) {
  member *m = arg;
  report rep = {.ms = now_ms() - m->t0,
                .status = r->status,
                .ok = 1,
                .mbit = avg_node_bandwidth_mbit(n)};
  /* Everyone's value is rank + 1 with weight 1: the mean is (N + 1) / 2. */
  float want = (float)(m->o->procs + 1) / 2;
  double tol = m->o->codec == AVG_NONE ? 1e-6 : 2e-2;
  for (size_t j = 0; j < m->floats; j += 1 + m->floats / 4096)
    if (fabs(m->x[j] - want) > tol * want)
      rep.ok = 0;
  if (r->summary && r->summary->floats_by_k[m->o->procs] != m->floats)
    rep.ok = 0;
  xwrite(m->fd, &rep, sizeof rep);
}

static void on_command(uv_poll_t *p, int status, int events) {
  member *m = p->data;
  go g;
  (void)status, (void)events;
  if (xread(m->fd, &g, sizeof g) != 0 || g.floats == 0) {
    uv_poll_stop(p);
    avg_node_close(m->node);
    proto_host_close(m->h);
    uv_close((uv_handle_t *)p, NULL);
    return;
  }
  if (g.floats > m->cap) {
    free(m->x);
    m->x = malloc(g.floats * sizeof *m->x);
    if (!m->x) {
      fprintf(stderr, "bench-avg: out of memory\n");
      exit(1);
    }
    m->cap = g.floats;
  }
  m->floats = g.floats;
  for (size_t j = 0; j < g.floats; j++)
    m->x[j] = (float)(m->rank + 1);
  m->t0 = now_ms(); /* the peers fill their buffers before the clock too */
  avg_group grp = {.nmembers = (size_t)m->o->procs,
                   .self = (size_t)m->rank,
                   .members = m->list};
  memcpy(grp.id, g.group, sizeof grp.id);
  memcpy(grp.leader, m->list[0].id, PROTO_ID_BYTES);
  avg_node_request req;
  avg_node_request_default(&req);
  req.round.x = m->x;
  req.round.n = g.floats;
  req.round.weight = 1;
  req.round.codec = m->o->codec;
  if (m->o->part_floats)
    req.round.part_floats = m->o->part_floats;
  if (m->o->window)
    req.round.window = m->o->window;
  req.equal_spans = !m->o->bandwidth_spans;
  if (m->o->bandwidth_auto) { /* everyone has the same list from the go */
    req.equal_spans = !g.measured;
    for (int i = 0; i < m->o->procs; i++)
      m->list[i].bandwidth_mbit = g.measured ? g.mbit[i] : 1000;
  }
  req.stripes = m->o->stripes;
  if (m->o->clip > 0) {
    req.round.clip = m->o->clip;
    req.round.clip_mode = AVG_CLIP_SCALE;
  }
  /* A 100 MiB round over a slow emulated link takes minutes. */
  req.round.sender_timeout_ms = 120000;
  req.round.reducer_timeout_ms = 180000;
  req.round.deadline_ms = 900000;
  int rc = avg_node_round(m->node, &grp, &req, on_round, m);
  if (rc) {
    report rep = {.status = rc};
    xwrite(m->fd, &rep, sizeof rep);
  }
}

static int member_main(const opts *o, int rank, int fd,
                       const proto_identity *moderator) {
  static member m;
  proto_identity id;
  proto_token tok;
  uint64_t now = (uint64_t)time(NULL);
  m.o = o;
  m.rank = rank;
  m.fd = fd;
  proto_identity_generate(&id);
  if (proto_token_issue(&tok, moderator, SWARM, id.pk, PROTO_ROLE_BEE, now - 60,
                        now + 86400) != 0)
    return 1;
  if (o->nnetns) {
    char path[128];
    snprintf(path, sizeof path, "/run/netns/%s", o->netns[rank]);
    int nfd = open(path, O_RDONLY | O_CLOEXEC);
    if (nfd < 0 || setns(nfd, CLONE_NEWNET) != 0) {
      fprintf(stderr, "bench-avg: member %d: cannot enter %s: %s\n", rank, path,
              strerror(errno));
      return 1;
    }
    close(nfd);
  }
  uv_loop_init(&m.loop);
  proto_host_config hc;
  proto_host_config_default(&hc);
  hc.loop = &m.loop;
  hc.auth.id = &id;
  hc.auth.token = &tok;
  hc.auth.moderator_pk = moderator->pk;
  hc.auth.swarm = SWARM;
  hc.max_pending_per_addr = 2 * NMAX; /* everyone dials from 127.0.0.1 */
  hc.on_drain = on_drain;
  hc.on_down = on_down;
  hc.data = &m;
  int port, rc;
  char listen_at[80];
  snprintf(listen_at, sizeof listen_at, "%s:0",
           o->naddrs ? o->addrs[rank] : "127.0.0.1");
  if ((rc = proto_host_new(&hc, &m.h)) ||
      (rc = proto_host_listen(m.h, listen_at, &port))) {
    fprintf(stderr, "bench-avg: member %d: %s\n", rank, bee_strerror(rc));
    return 1;
  }
  avg_node_config nc = {.loop = &m.loop,
                        .host = m.h,
                        .self_id = id.id,
                        .dht = {.declare = dht_declare, .fetch = dht_fetch}};
  if ((rc = avg_node_new(&nc, &m.node))) {
    fprintf(stderr, "bench-avg: member %d: %s\n", rank, bee_strerror(rc));
    return 1;
  }
  hello hi = {.port = port};
  memcpy(hi.id, id.id, PROTO_ID_BYTES);
  xwrite(fd, &hi, sizeof hi);
  hello all[NMAX];
  if (xread(fd, all, (size_t)o->procs * sizeof *all) != 0)
    return 1;
  for (int i = 0; i < o->procs; i++) {
    memcpy(m.list[i].id, all[i].id, PROTO_ID_BYTES);
    snprintf(m.list[i].addr, sizeof m.list[i].addr, "%s:%d",
             o->naddrs ? o->addrs[i] : "127.0.0.1", (int)all[i].port);
    m.list[i].mode = PROTO_MODE_NODE;
    m.list[i].bandwidth_mbit = o->nbw ? o->bandwidths[i] : 1000;
    m.list[i].weight = 1;
  }
  uv_poll_init(&m.loop, &m.poll, fd);
  m.poll.data = &m;
  uv_poll_start(&m.poll, UV_READABLE, on_command);
  uv_run(&m.loop, UV_RUN_DEFAULT);
  uv_loop_close(&m.loop);
  free(m.x);
  proto_identity_clear(&id);
  return 0;
}

/* ---- the coordinator --------------------------------------------------- */

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: bench-avg [--procs N] [--sizes BYTES,...] [--reps R]\n"
          "                 [--warmup W] [--codec none|fp16|bf16|u8|b8]\n"
          "                 [--part-floats P] [--window W] [--stripes auto|S]\n"
          "                 [--netns NS,...] [--addrs IP,...]\n"
          "                 [--bandwidths MBIT,...|auto] [--clip F]\n"
          "  defaults: 4 procs; 4,1048576,104857600 bytes; 5 reps; 2 warm-up\n"
          "  rounds per size; codec none; the round's part size and window;\n"
          "  stripes auto (from the links); members on 127.0.0.1.\n"
          "  --netns/--addrs: member i runs in namespace i (a wanlab host)\n"
          "  and listens on address i; --bandwidths: the members' declared\n"
          "  Mbit/s, and spans sized by them (else equal spans); auto: by\n"
          "  the links each member measured in the rounds before (equal\n"
          "  spans until every member has measured its own)\n");
}

/* Splits a comma-separated list into out (at most 64 items of 63 bytes);
 * returns the count, -1 when an item is too long or there are too many. */
static int split_list(const char *s, char out[64][64]) {
  int n = 0;
  while (*s) {
    const char *e = strchr(s, ',');
    size_t len = e ? (size_t)(e - s) : strlen(s);
    if (n == 64 || len == 0 || len >= 64)
      return -1;
    memcpy(out[n], s, len);
    out[n++][len] = 0;
    s += len + (e ? 1 : 0);
  }
  return n;
}

static int parse(int argc, char **argv, opts *o) {
  static const struct option lo[] = {
      {"procs", 1, 0, 'p'},  {"sizes", 1, 0, 's'}, {"reps", 1, 0, 'r'},
      {"warmup", 1, 0, 'w'}, {"codec", 1, 0, 'c'}, {"part-floats", 1, 0, 'P'},
      {"window", 1, 0, 'W'}, {"help", 0, 0, 'h'},  {"stripes", 1, 0, 'S'},
      {"netns", 1, 0, 'N'},  {"addrs", 1, 0, 'A'}, {"bandwidths", 1, 0, 'B'},
      {"clip", 1, 0, 'C'},   {0, 0, 0, 0}};
  *o = (opts){.procs = 4,
              .reps = 5,
              .warmup = 2,
              .codec = AVG_NONE,
              .stripes = AVG_STRIPES_AUTO,
              .sizes = {4, 1u << 20, 100u << 20},
              .nsizes = 3};
  int c;
  char *end;
  while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
    switch (c) {
    case 'p': o->procs = atoi(optarg); break;
    case 'r': o->reps = atoi(optarg); break;
    case 'w': o->warmup = atoi(optarg); break;
    case 'P': o->part_floats = strtoul(optarg, NULL, 10); break;
    case 'W': o->window = (unsigned)atoi(optarg); break;
    case 'c':
      if (avg_codec_parse(optarg, &o->codec) != 0) {
        fprintf(stderr, "bench-avg: unknown codec '%s'\n", optarg);
        return 2;
      }
      break;
    case 's':
      o->nsizes = 0;
      for (char *s = optarg; *s && o->nsizes < SIZES_MAX; s = end) {
        unsigned long long v = strtoull(s, &end, 10);
        if (end == s || v < 4 || v % 4) {
          fprintf(stderr, "bench-avg: sizes are bytes, multiples of 4\n");
          return 2;
        }
        o->sizes[o->nsizes++] = (size_t)v;
        if (*end == ',')
          end++;
      }
      break;
    case 'S':
      if (strcmp(optarg, "auto") == 0) {
        o->stripes = AVG_STRIPES_AUTO;
      } else {
        char *e;
        unsigned long v = strtoul(optarg, &e, 10);
        if (*optarg == 0 || *e || v > 16) {
          fprintf(stderr, "bench-avg: --stripes is auto or 0 to 16\n");
          return 2;
        }
        o->stripes = (unsigned)v;
      }
      break;
    case 'C':
      o->clip = strtod(optarg, &end);
      if (end == optarg || *end || !(o->clip >= 0)) {
        fprintf(stderr, "bench-avg: --clip is a factor, or 0 for off\n");
        return 2;
      }
      break;
    case 'N': o->nnetns = split_list(optarg, o->netns); break;
    case 'A': o->naddrs = split_list(optarg, o->addrs); break;
    case 'B': {
      if (strcmp(optarg, "auto") == 0) {
        o->bandwidth_auto = o->bandwidth_spans = true;
        break;
      }
      char tmp[64][64];
      o->nbw = split_list(optarg, tmp);
      for (int i = 0; i < o->nbw; i++)
        if ((o->bandwidths[i] = strtod(tmp[i], NULL)) <= 0) {
          fprintf(stderr, "bench-avg: bandwidths are Mbit/s, > 0\n");
          return 2;
        }
      o->bandwidth_spans = true;
      break;
    }
    case 'h': usage(stdout); exit(0);
    default: usage(stderr); return 2;
    }
  }
  if (o->procs < 2 || o->procs > NMAX || o->reps < 1 || o->warmup < 0 ||
      o->nsizes == 0 || (o->nnetns && o->nnetns != o->procs) ||
      (o->naddrs && o->naddrs != o->procs) ||
      (o->nbw && o->nbw != o->procs && !o->bandwidth_auto) ||
      o->nnetns < 0 || o->naddrs < 0 || o->nbw < 0) {
    usage(stderr);
    return 2;
  }
  return 0;
}

int main(int argc, char **argv) {
  opts o;
  int rc = parse(argc, argv, &o);
  if (rc)
    return rc;
  bee_log_set_level(getenv("BENCH_DEBUG") ? BEE_LOG_DEBUG : BEE_LOG_WARN);
  signal(SIGPIPE, SIG_IGN);
  proto_identity moderator;
  proto_identity_generate(&moderator);
  int fds[NMAX];
  pid_t pids[NMAX];
  for (int i = 0; i < o.procs; i++) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) {
      perror("bench-avg: socketpair");
      return 1;
    }
    pids[i] = fork();
    if (pids[i] == 0) {
      close(sv[0]);
      for (int k = 0; k < i; k++)
        close(fds[k]);
      _exit(member_main(&o, i, sv[1], &moderator));
    }
    close(sv[1]);
    fds[i] = sv[0];
  }
  hello all[NMAX];
  for (int i = 0; i < o.procs; i++)
    if (xread(fds[i], &all[i], sizeof all[i]) != 0) {
      fprintf(stderr, "bench-avg: member %d did not start\n", i);
      return 1;
    }
  for (int i = 0; i < o.procs; i++)
    xwrite(fds[i], all, (size_t)o.procs * sizeof *all);
  int failed = 0;
  double mbit[NMAX] = {0}; /* the members' last measured links */
  for (int s = 0; s < o.nsizes && !failed; s++) {
    size_t floats = o.sizes[s] / 4;
    double *t = calloc((size_t)o.reps, sizeof *t);
    for (int r = -o.warmup; r < o.reps && !failed; r++) {
      go g = {.floats = floats, .measured = o.bandwidth_auto};
      for (int i = 0; i < o.procs; i++) {
        g.mbit[i] = mbit[i];
        if (!(mbit[i] > 0))
          g.measured = 0;
      }
      randombytes_buf(g.group, sizeof g.group);
      for (int i = 0; i < o.procs; i++)
        xwrite(fds[i], &g, sizeof g);
      double slowest = 0;
      for (int i = 0; i < o.procs; i++) {
        report rep;
        if (xread(fds[i], &rep, sizeof rep) != 0) {
          fprintf(stderr, "bench-avg: member %d died\n", i);
          failed = 1;
          break;
        }
        if (rep.status != 0 || !rep.ok) {
          fprintf(stderr, "bench-avg: member %d, %zu bytes: %s%s\n", i,
                  o.sizes[s], rep.status ? bee_strerror(rep.status) : "",
                  rep.ok ? "" : "wrong mean");
          failed = 1;
        }
        if (rep.ms > slowest)
          slowest = rep.ms;
        mbit[i] = rep.mbit;
      }
      if (r >= 0)
        t[r] = slowest;
    }
    if (o.bandwidth_auto) {
      printf("MEASURED procs=%d bytes=%zu mbit=", o.procs, o.sizes[s]);
      for (int i = 0; i < o.procs; i++)
        printf("%s%.1f", i ? "," : "", mbit[i]);
      printf("\n");
    }
    if (!failed) {
      qsort(t, (size_t)o.reps, sizeof *t, cmp_double);
      double med =
          o.reps % 2 ? t[o.reps / 2] : (t[o.reps / 2 - 1] + t[o.reps / 2]) / 2;
      double bus = 2.0 * (o.procs - 1) / o.procs * (double)o.sizes[s];
      char stripes[16];
      if (o.stripes == AVG_STRIPES_AUTO)
        snprintf(stripes, sizeof stripes, "auto");
      else
        snprintf(stripes, sizeof stripes, "%u", o.stripes);
      printf("RESULT impl=beed procs=%d bytes=%zu codec=%s stripes=%s "
             "spans=%s reps=%d ms_median=%.4f ms_min=%.4f busbw_gbs=%.4f\n",
             o.procs, o.sizes[s], avg_codec_name(o.codec), stripes,
             o.bandwidth_auto ? "measured" : o.bandwidth_spans ? "bandwidth" : "equal",
             o.reps, med, t[0],
             bus / (med * 1e-3) / 1e9);
      fflush(stdout);
    }
    free(t);
  }
  go stop = {0};
  for (int i = 0; i < o.procs; i++) {
    xwrite(fds[i], &stop, sizeof stop);
    close(fds[i]);
  }
  for (int i = 0; i < o.procs; i++)
    waitpid(pids[i], NULL, 0);
  proto_identity_clear(&moderator);
  return failed;
}
