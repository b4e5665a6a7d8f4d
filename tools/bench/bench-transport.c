/* bench-transport.c: throughput of the authenticated, encrypted transport.
 *
 * A receiver and a sender process (fork) on 127.0.0.1.  The receiver runs
 * a proto_host that listens in a moderated swarm: a throwaway moderator
 * issues tokens to both sides, so the real handshake and token checks run.
 * The sender opens --streams bulk connections and streams --bytes in
 * total, split evenly, as STREAM_OPEN, --chunk sized STREAM_CHUNKs and
 * STREAM_END, pacing on on_drain whenever the write queue is full.  The
 * receiver checks every offset, counts the bytes and, once every stream
 * has ended, sends the sender a one-way "bench.done" with its figures.
 * The time reported runs from the sender's first message to the moment
 * the receiver held the last byte, both read on CLOCK_MONOTONIC, which
 * every process on the machine shares.
 *
 * --plain measures the same copy over plain TCP (blocking send/recv, one
 * thread per stream on each side); --crypto-only seals and opens the same
 * bytes in one process, to show what the AEAD alone costs.  Each run ends
 * with one "RESULT key=value ..." line for tools/bench/run-transport.
 *
 * This is a benchmark, not a test: it asserts nothing about speed.
 */
#include "proto.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>

#define COMP "bench"
#define SWARM "bench"
#define KIND "bench"
#define DONE_METHOD "bench.done"
#define STREAMS_MAX 64
#define STREAM_ID 1 /* one stream per connection, so every id can be 1 */

/* ---- options ------------------------------------------------------------ */

typedef struct opts {
  uint64_t bytes;     /* total over all streams */
  int streams;        /* connections, one stream each */
  size_t chunk;       /* bytes per STREAM_CHUNK (or per send/recv) */
  int ciphers;        /* PROTO_CIPHER_* offered by both sides */
  size_t queue_max;   /* write_queue_max, bytes; 0: the host default */
  unsigned timeout_s; /* a run still going after this long is killed */
  bool plain, crypto_only, verify;
} opts;

static void usage(FILE *f) {
  fprintf(
      f,
      "usage: bench-transport [options]\n"
      "  --bytes SIZE     bytes to move in total (default 1G)\n"
      "  --streams N      connections, one stream each (default 1, max %d)\n"
      "  --chunk SIZE     chunk size (default and max %u)\n"
      "  --cipher NAME    aes, xchacha or any (default any)\n"
      "  --queue SIZE     sender's write queue limit (default: host's)\n"
      "  --verify         receiver compares every chunk with the source\n"
      "  --timeout SEC    kill a run that takes longer (default 120)\n"
      "  --plain          plain TCP socket copy instead of beed\n"
      "  --crypto-only    seal and open in one process, no sockets\n"
      "SIZE takes a K, M or G suffix (powers of 1024).\n",
      STREAMS_MAX, PROTO_CHUNK_MAX);
}

/* Parses "123", "64K", "1M", "1G" into *out. */
static int parse_size(const char *s, uint64_t *out) {
  char *end;
  uint64_t mul = 1;
  if (*s < '0' || *s > '9')
    return BEE_ECONFIG;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno)
    return BEE_ERANGE;
  const char *units = "KMG",
             *u = *end ? strchr(units, toupper((unsigned char)*end)) : NULL;
  if (u) {
    mul = 1ull << (10 * (u - units + 1));
    end++;
  }
  if (*end)
    return BEE_ECONFIG;
  if (v > UINT64_MAX / mul)
    return BEE_ERANGE;
  *out = (uint64_t)v * mul;
  return 0;
}

static int parse_opts(int argc, char **argv, opts *o) {
  enum { O_BYTES = 256, O_STREAMS, O_CHUNK, O_CIPHER, O_QUEUE, O_TIMEOUT };
  static const struct option longs[] = {
      {"bytes", required_argument, NULL, O_BYTES},
      {"streams", required_argument, NULL, O_STREAMS},
      {"chunk", required_argument, NULL, O_CHUNK},
      {"cipher", required_argument, NULL, O_CIPHER},
      {"queue", required_argument, NULL, O_QUEUE},
      {"timeout", required_argument, NULL, O_TIMEOUT},
      {"verify", no_argument, NULL, 'v'},
      {"plain", no_argument, NULL, 'p'},
      {"crypto-only", no_argument, NULL, 'c'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0},
  };
  *o = (opts){.bytes = 1ull << 30,
              .streams = 1,
              .chunk = PROTO_CHUNK_MAX,
              .ciphers = PROTO_CIPHERS_ALL,
              .timeout_s = 120};
  int ch;
  uint64_t v;
  while ((ch = getopt_long(argc, argv, "", longs, NULL)) != -1) {
    switch (ch) {
    case O_BYTES:
      if (parse_size(optarg, &o->bytes) || o->bytes == 0)
        goto bad;
      break;
    case O_STREAMS:
      if (parse_size(optarg, &v) || v < 1 || v > STREAMS_MAX)
        goto bad;
      o->streams = (int)v;
      break;
    case O_CHUNK:
      if (parse_size(optarg, &v) || v < 1 || v > PROTO_CHUNK_MAX)
        goto bad;
      o->chunk = (size_t)v;
      break;
    case O_CIPHER:
      if (strcmp(optarg, "aes") == 0)
        o->ciphers = PROTO_CIPHER_AES256GCM;
      else if (strcmp(optarg, "xchacha") == 0)
        o->ciphers = PROTO_CIPHER_XCHACHA20POLY1305;
      else if (strcmp(optarg, "any") == 0)
        o->ciphers = PROTO_CIPHERS_ALL;
      else
        goto bad;
      break;
    case O_QUEUE:
      if (parse_size(optarg, &v) || v < PROTO_CHUNK_MAX || v > (1ull << 32))
        goto bad;
      o->queue_max = (size_t)v;
      break;
    case O_TIMEOUT:
      if (parse_size(optarg, &v) || v < 1 || v > 86400)
        goto bad;
      o->timeout_s = (unsigned)v;
      break;
    case 'v': o->verify = true; break;
    case 'p': o->plain = true; break;
    case 'c': o->crypto_only = true; break;
    case 'h': usage(stdout); exit(0);
    default: usage(stderr); return BEE_ECONFIG;
    }
  }
  if (optind == argc && !(o->plain && o->crypto_only))
    return 0;
  usage(stderr);
  return BEE_ECONFIG;
bad:
  fprintf(stderr, "bench-transport: bad value '%s' for --%s\n", optarg,
          longs[ch - O_BYTES].name);
  return BEE_ECONFIG;
}

/* ---- shared helpers ----------------------------------------------------- */

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* CPU time this process has used, microseconds. */
typedef struct cpu_us {
  uint64_t user, sys;
} cpu_us;

static cpu_us cpu_now(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (cpu_us){
      (uint64_t)ru.ru_utime.tv_sec * 1000000u + (uint64_t)ru.ru_utime.tv_usec,
      (uint64_t)ru.ru_stime.tv_sec * 1000000u + (uint64_t)ru.ru_stime.tv_usec};
}

static const char *cipher_name(int cipher) {
  switch (cipher) {
  case PROTO_CIPHER_AES256GCM: return "aes-gcm";
  case PROTO_CIPHER_XCHACHA20POLY1305: return "xchacha";
  default: return "none";
  }
}

/* Bytes stream i of n carries: an even split, the remainder on the last. */
static uint64_t share(const opts *o, int i) {
  uint64_t each = o->bytes / (uint64_t)o->streams;
  return i == o->streams - 1 ? o->bytes - each * (uint64_t)(o->streams - 1)
                             : each;
}

/* What the receiver measured, sent back to the sender: bytes received,
 * CLOCK_MONOTONIC of the first message and of the last byte (ns), and the
 * CPU it used in between (us). */
typedef struct rx_report {
  uint64_t bytes, t_first_ns, t_last_ns, user_us, sys_us;
} rx_report;

/* The swarm both sides share: a throwaway moderator and its tokens. */
typedef struct world {
  proto_identity moderator, rx_id, tx_id;
  proto_token rx_tok, tx_tok;
} world;

static int world_init(world *w) {
  uint64_t now = (uint64_t)time(NULL);
  int rc;
  proto_identity_generate(&w->moderator);
  proto_identity_generate(&w->rx_id);
  proto_identity_generate(&w->tx_id);
  rc = proto_token_issue(&w->rx_tok, &w->moderator, SWARM, w->rx_id.pk,
                         PROTO_ROLE_BEE, now - 60, now + 3600);
  if (!rc)
    rc = proto_token_issue(&w->tx_tok, &w->moderator, SWARM, w->tx_id.pk,
                           PROTO_ROLE_BEE, now - 60, now + 3600);
  return rc;
}

static void world_clear(world *w) {
  proto_identity_clear(&w->moderator);
  proto_identity_clear(&w->rx_id);
  proto_identity_clear(&w->tx_id);
}

static void auth_set(proto_auth *a, const world *w, const proto_identity *id,
                     const proto_token *tok, int ciphers) {
  a->id = id;
  a->token = tok;
  a->moderator_pk = w->moderator.pk;
  a->swarm = SWARM;
  a->revoked = NULL;
  a->accept_roles = PROTO_ROLES_ALL;
  a->accept_bulk_roles = PROTO_ROLE_BEE | PROTO_ROLE_AUX;
  a->ciphers = ciphers;
}

/* Fills the source buffer with xorshift64 noise (the AEAD does not care,
 * but a compressing link or a zero-page trick would). */
static void pattern_fill(uint8_t *p, size_t n) {
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i < n; i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    p[i] = (uint8_t)(x >> 32);
  }
}

/* The receiver, while one runs: the timeout handler takes it down too. */
static volatile pid_t receiver_pid = -1;

static void on_alarm(int sig) {
  static const char msg[] = "bench-transport: timed out\n";
  (void)sig;
  if (receiver_pid > 0) {
    kill(receiver_pid, SIGKILL);
    waitpid(receiver_pid, NULL, 0);
  }
  ssize_t n = write(STDERR_FILENO, msg, sizeof msg - 1);
  (void)n; /* nothing more to do if even that fails */
  _exit(124);
}

/* Forks the receiver, which runs fn and exits with its status.  fn writes
 * the port it listens on (an int) to port_fd and may write an rx_report
 * to out_fd.  The parent gets the child's pid, the port, and the reading
 * end of out_fd in *out_fd (its to close). */
typedef int (*receiver_fn)(const opts *o, const world *w,
                           const uint8_t *pattern, int port_fd, int out_fd);

static int spawn(receiver_fn fn, const opts *o, const world *w,
                 const uint8_t *pattern, pid_t *pid, int *port, int *out_fd) {
  int pp[2], rp[2];
  if (pipe(pp) < 0)
    return -errno;
  if (pipe(rp) < 0) {
    int rc = -errno;
    close(pp[0]);
    close(pp[1]);
    return rc;
  }
  fflush(NULL);
  *pid = fork();
  if (*pid < 0) {
    int rc = -errno;
    close(pp[0]), close(pp[1]), close(rp[0]), close(rp[1]);
    return rc;
  }
  if (*pid == 0) {
    signal(SIGALRM, SIG_DFL);
    alarm(o->timeout_s); /* alarms are not inherited across fork */
    close(pp[0]);
    close(rp[0]);
    int rc = fn(o, w, pattern, pp[1], rp[1]);
    fflush(NULL);
    _exit(rc ? 1 : 0);
  }
  receiver_pid = *pid;
  close(pp[1]);
  close(rp[1]);
  *out_fd = rp[0];
  ssize_t n = read(pp[0], port, sizeof *port);
  close(pp[0]);
  if (n != (ssize_t)sizeof *port) {
    close(rp[0]);
    return BEE_ECLOSED; /* the receiver failed to listen and said why */
  }
  return 0;
}

/* Waits for the receiver; kills it first if the sender failed. */
static int reap(pid_t pid, bool kill_it) {
  int st;
  if (kill_it)
    kill(pid, SIGTERM);
  while (waitpid(pid, &st, 0) < 0)
    if (errno != EINTR)
      return -errno;
  receiver_pid = -1;
  if (kill_it)
    return 0;
  if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
    return 0;
  fprintf(stderr, "bench-transport: the receiver failed (status 0x%x)\n", st);
  return BEE_EREMOTE;
}

/* One run's figures.  Each side's CPU use counts over its own wall time:
 * the sender's from its first message to the receiver's report, the
 * receiver's from the first message it got to the last byte. */
typedef struct figures {
  const char *mode, *title; /* "beed" / "plain", and as printed */
  int cipher;               /* 0 for plain TCP */
  uint64_t bytes;
  uint64_t ns; /* sender's first message to the receiver's last byte */
  uint64_t tx_wall_ns, rx_wall_ns;
  cpu_us tx, rx;
} figures;

/* Share of one core: CPU microseconds over wall nanoseconds. */
static double core_share(uint64_t us, uint64_t wall_ns) {
  return wall_ns ? (double)us * 1000.0 / (double)wall_ns : 0.0;
}

/* Prints the figures for people, then as one RESULT line for scripts. */
static void report(const opts *o, const figures *f) {
  uint64_t tx_us = f->tx.user + f->tx.sys, rx_us = f->rx.user + f->rx.sys;
  double tx_core = core_share(tx_us, f->tx_wall_ns);
  double rx_core = core_share(rx_us, f->rx_wall_ns);
  double gbs = (double)f->bytes / (double)f->ns; /* bytes per ns = GB/s */
  printf("%s: %d stream(s), %s, %" PRIu64 " bytes in %zu-byte chunks: "
         "%.3f s, %.3f GB/s\n",
         f->title, o->streams,
         f->cipher ? cipher_name(f->cipher) : "unencrypted", f->bytes, o->chunk,
         (double)f->ns / 1e9, gbs);
  printf("  cpu: sender %.3f s, %.0f%% of a core (kernel %.0f%%); "
         "receiver %.3f s, %.0f%% (kernel %.0f%%)\n",
         (double)tx_us / 1e6, 100 * tx_core,
         100 * core_share(f->tx.sys, f->tx_wall_ns), (double)rx_us / 1e6,
         100 * rx_core, 100 * core_share(f->rx.sys, f->rx_wall_ns));
  printf("RESULT mode=%s cipher=%s streams=%d bytes=%" PRIu64
         " chunk=%zu seconds=%.4f gb_per_s=%.3f tx_cpu=%.2f rx_cpu=%.2f"
         " tx_cpu_s=%.3f rx_cpu_s=%.3f\n",
         f->mode, cipher_name(f->cipher), o->streams, f->bytes, o->chunk,
         (double)f->ns / 1e9, gbs, tx_core, rx_core, (double)tx_us / 1e6,
         (double)rx_us / 1e6);
}

/* ---- beed: receiver ----------------------------------------------------- */

typedef struct rx_stream {
  uint64_t total, got;
  bool opened, ended;
} rx_stream;

typedef struct receiver {
  const opts *o;
  const uint8_t *pattern;
  proto_host *h;
  rx_stream s[STREAMS_MAX];
  int nconns, nended, ndown;
  uint64_t got, t_first_ns, t_last_ns;
  cpu_us cpu0;
  bool done;
  int status;
} receiver;

static void rx_fail(receiver *rx, int rc, const char *what) {
  if (!rx->status) {
    bee_err(COMP, "receiver: %s (%s)", what, bee_strerror(rc));
    rx->status = rc;
  }
  proto_host_close(rx->h);
}

static void rx_on_up(proto_conn *c, int status, void *data) {
  receiver *rx = data;
  if (rx->nconns == rx->o->streams) {
    proto_conn_close(c, BEE_ELIMIT, "unexpected connection");
    return;
  }
  proto_conn_set_data(c, &rx->s[rx->nconns++]);
}

static void rx_finish(receiver *rx, proto_conn *c) {
  uint64_t sum = 0;
  for (int i = 0; i < rx->nconns; i++)
    sum += rx->s[i].total;
  if (sum != rx->o->bytes) {
    rx_fail(rx, BEE_ERANGE, "streams announced the wrong total");
    return;
  }
  cpu_us now = cpu_now();
  rx_report r = {rx->got, rx->t_first_ns, rx->t_last_ns,
                 now.user - rx->cpu0.user, now.sys - rx->cpu0.sys};
  rx->done = true;
  int rc = proto_conn_oneway(c, DONE_METHOD, (const uint8_t *)&r, sizeof r);
  if (rc)
    rx_fail(rx, rc, "cannot send the report");
  /* The sender closes every connection once it has the report. */
}

static void rx_on_stream(proto_conn *c, const proto_msg *m, void *data) {
  receiver *rx = data;
  rx_stream *s = proto_conn_get_data(c);
  if (!s || rx->status)
    return;
  switch (m->type) {
  case PROTO_T_STREAM_OPEN:
    if (s->opened || m->id != STREAM_ID)
      goto bad;
    s->opened = true;
    s->total = m->offset;
    if (!rx->t_first_ns) {
      rx->t_first_ns = now_ns();
      rx->cpu0 = cpu_now();
    }
    break;
  case PROTO_T_STREAM_CHUNK:
    if (!s->opened || s->ended || m->id != STREAM_ID || m->offset != s->got ||
        m->payload.n > s->total - s->got || m->payload.n > rx->o->chunk)
      goto bad;
    if (rx->o->verify && memcmp(m->payload.p, rx->pattern, m->payload.n)) {
      rx_fail(rx, BEE_EAUTH, "chunk differs from the source");
      return;
    }
    s->got += m->payload.n;
    rx->got += m->payload.n;
    rx->t_last_ns = now_ns();
    break;
  case PROTO_T_STREAM_END:
    if (!s->opened || s->ended || m->id != STREAM_ID || m->code != 0 ||
        s->got != s->total)
      goto bad;
    s->ended = true;
    if (++rx->nended == rx->o->streams)
      rx_finish(rx, c);
    break;
  default: goto bad;
  }
  return;
bad:
  rx_fail(rx, BEE_ERANGE, "stream message out of order");
}

static void rx_on_down(proto_conn *c, int status, void *data) {
  receiver *rx = data;
  if (!proto_conn_get_data(c))
    return; /* one we refused */
  rx->ndown++;
  if (!rx->done)
    rx_fail(rx, status ? status : BEE_ECLOSED, "connection lost mid-transfer");
  else if (rx->ndown == rx->nconns)
    proto_host_close(rx->h);
}

static int beed_receiver(const opts *o, const world *w, const uint8_t *pattern,
                         int port_fd, int out_fd) {
  uv_loop_t loop;
  receiver rx = {.o = o, .pattern = pattern};
  proto_host_config cfg;
  int port, rc;
  close(out_fd); /* the report goes back over the connection */
  if ((rc = uv_loop_init(&loop)) < 0)
    goto out;
  proto_host_config_default(&cfg);
  cfg.loop = &loop;
  auth_set(&cfg.auth, w, &w->rx_id, &w->rx_tok, o->ciphers);
  cfg.max_pending_per_addr = STREAMS_MAX; /* every sender is 127.0.0.1 */
  cfg.on_up = rx_on_up;
  cfg.on_down = rx_on_down;
  cfg.on_stream = rx_on_stream;
  cfg.data = &rx;
  if ((rc = proto_host_new(&cfg, &rx.h)))
    goto loop_out;
  if ((rc = proto_host_listen(rx.h, "127.0.0.1:0", &port))) {
    bee_err(COMP, "receiver: cannot listen: %s", bee_strerror(rc));
    proto_host_close(rx.h);
    uv_run(&loop, UV_RUN_DEFAULT);
    goto loop_out;
  }
  if (write(port_fd, &port, sizeof port) != (ssize_t)sizeof port) {
    rc = -errno;
    proto_host_close(rx.h);
  }
  close(port_fd);
  port_fd = -1;
  uv_run(&loop, UV_RUN_DEFAULT);
  if (!rc)
    rc = rx.status;
loop_out:
  uv_loop_close(&loop);
out:
  if (port_fd >= 0)
    close(port_fd);
  return rc;
}

/* ---- beed: sender ------------------------------------------------------- */

typedef struct sender sender;

typedef struct tx_stream {
  sender *tx;
  proto_conn *c;
  uint64_t total, off;
  bool opened, ended;
} tx_stream;

struct sender {
  const opts *o;
  const uint8_t *pattern;
  proto_host *h;
  tx_stream s[STREAMS_MAX];
  int nup;
  int cipher;
  uint64_t t0_ns, t_ack_ns, queue_full;
  cpu_us cpu0, cpu1;
  rx_report report;
  bool have_report;
  int status;
};

static void tx_fail(sender *tx, int rc, const char *what) {
  if (!tx->status) {
    bee_err(COMP, "sender: %s (%s)", what, bee_strerror(rc));
    tx->status = rc;
  }
  proto_host_close(tx->h);
}

/* Sends what stream s can until its queue is full; on_drain resumes it. */
static int pump(tx_stream *s) {
  const opts *o = s->tx->o;
  int rc;
  if (!s->opened) {
    proto_msg m = {.type = PROTO_T_STREAM_OPEN,
                   .id = STREAM_ID,
                   .name = {(const uint8_t *)KIND, strlen(KIND)},
                   .offset = s->total};
    if ((rc = proto_conn_send(s->c, &m)))
      return rc == BEE_EQUEUE ? 0 : rc;
    s->opened = true;
  }
  while (s->off < s->total) {
    uint64_t left = s->total - s->off;
    size_t n = left < o->chunk ? (size_t)left : o->chunk;
    rc = proto_conn_send_chunk(s->c, STREAM_ID, s->off, s->tx->pattern, n);
    if (rc == BEE_EQUEUE) {
      s->tx->queue_full++;
      return 0;
    }
    if (rc)
      return rc;
    s->off += n;
  }
  if (!s->ended) {
    proto_msg m = {.type = PROTO_T_STREAM_END, .id = STREAM_ID};
    if ((rc = proto_conn_send(s->c, &m)))
      return rc == BEE_EQUEUE ? 0 : rc;
    s->ended = true;
  }
  return 0;
}

static void tx_start(sender *tx) {
  tx->cipher = proto_conn_peer(tx->s[0].c)->cipher;
  tx->cpu0 = cpu_now();
  tx->t0_ns = now_ns();
  for (int i = 0; i < tx->o->streams; i++) {
    int rc = pump(&tx->s[i]);
    if (rc) {
      tx_fail(tx, rc, "send failed");
      return;
    }
  }
}

static void tx_on_connect(proto_host *h, proto_conn *c, int status, void *arg) {
  tx_stream *s = arg;
  sender *tx = s->tx;
  if (status) {
    tx_fail(tx, status, "cannot connect");
    return;
  }
  if (tx->status)
    return; /* another stream failed; the host is closing */
  s->c = c;
  proto_conn_set_data(c, s);
  if (++tx->nup == tx->o->streams)
    tx_start(tx);
}

static void tx_on_drain(proto_conn *c, void *data) {
  tx_stream *s = proto_conn_get_data(c);
  int rc;
  if (s && (rc = pump(s)))
    tx_fail(data, rc, "send failed");
}

static void tx_on_oneway(proto_conn *c, proto_bytes method, proto_bytes payload,
                         void *data) {
  sender *tx = data;
  if (method.n != strlen(DONE_METHOD) ||
      memcmp(method.p, DONE_METHOD, method.n) != 0)
    return;
  if (payload.n != sizeof tx->report) {
    tx_fail(tx, BEE_ERANGE, "malformed report from the receiver");
    return;
  }
  tx->t_ack_ns = now_ns();
  tx->cpu1 = cpu_now();
  memcpy(&tx->report, payload.p, sizeof tx->report);
  tx->have_report = true;
  proto_host_close(tx->h);
}

static void tx_on_down(proto_conn *c, int status, void *data) {
  sender *tx = data;
  if (!tx->have_report)
    tx_fail(tx, status ? status : BEE_ECLOSED, "connection lost mid-transfer");
}

static int beed_sender(const opts *o, const world *w, const uint8_t *pattern,
                       int port) {
  uv_loop_t loop;
  sender tx = {.o = o, .pattern = pattern};
  proto_host_config cfg;
  char addr[32];
  int rc;
  if ((rc = uv_loop_init(&loop)) < 0)
    return rc;
  proto_host_config_default(&cfg);
  cfg.loop = &loop;
  auth_set(&cfg.auth, w, &w->tx_id, &w->tx_tok, o->ciphers);
  if (o->queue_max)
    cfg.write_queue_max = o->queue_max;
  cfg.on_down = tx_on_down;
  cfg.on_drain = tx_on_drain;
  cfg.on_oneway = tx_on_oneway;
  cfg.data = &tx;
  if ((rc = proto_host_new(&cfg, &tx.h)))
    goto out;
  snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
  for (int i = 0; i < o->streams; i++) {
    tx.s[i].tx = &tx;
    tx.s[i].total = share(o, i);
    if ((rc = proto_host_connect(tx.h, addr, PROTO_PURPOSE_BULK, tx_on_connect,
                                 &tx.s[i]))) {
      tx_fail(&tx, rc, "cannot connect");
      break;
    }
  }
  uv_run(&loop, UV_RUN_DEFAULT);
  rc = tx.status;
  if (!rc && !tx.have_report)
    rc = BEE_ECLOSED;
  if (!rc && tx.report.bytes != o->bytes) {
    bee_err(COMP, "receiver counted %" PRIu64 " bytes, expected %" PRIu64,
            tx.report.bytes, o->bytes);
    rc = BEE_ERANGE;
  }
  if (!rc) {
    const rx_report *r = &tx.report;
    figures f = {.mode = "beed",
                 .title = "beed",
                 .cipher = tx.cipher,
                 .bytes = r->bytes,
                 .ns = r->t_last_ns - tx.t0_ns,
                 .tx_wall_ns = tx.t_ack_ns - tx.t0_ns,
                 .rx_wall_ns = r->t_last_ns - r->t_first_ns,
                 .tx = {tx.cpu1.user - tx.cpu0.user, tx.cpu1.sys - tx.cpu0.sys},
                 .rx = {r->user_us, r->sys_us}};
    report(o, &f);
    printf("  write queue full %" PRIu64 " times; report back after %.3f s\n",
           tx.queue_full, (double)f.tx_wall_ns / 1e9);
  }
out:
  uv_loop_close(&loop);
  return rc;
}

/* ---- plain TCP ---------------------------------------------------------- */

typedef struct plain_job {
  int fd;
  uint64_t bytes; /* to send; received, for the receiver */
  size_t chunk;
  const uint8_t *src;
  uint64_t t_last_ns;
  int err;
} plain_job;

static void *plain_recv(void *arg) {
  plain_job *j = arg;
  uint8_t *buf = malloc(j->chunk);
  if (!buf) {
    j->err = -ENOMEM;
    return NULL;
  }
  for (;;) {
    ssize_t n = recv(j->fd, buf, j->chunk, 0);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      j->err = -errno;
    if (n <= 0)
      break;
    j->bytes += (uint64_t)n;
    j->t_last_ns = now_ns();
  }
  free(buf);
  return NULL;
}

static void *plain_send(void *arg) {
  plain_job *j = arg;
  uint64_t left = j->bytes;
  while (left > 0) {
    size_t n = left < j->chunk ? (size_t)left : j->chunk;
    size_t off = 0;
    while (off < n) {
      ssize_t k = send(j->fd, j->src + off, n - off, MSG_NOSIGNAL);
      if (k < 0 && errno == EINTR)
        continue;
      if (k < 0) {
        j->err = -errno;
        return NULL;
      }
      off += (size_t)k;
    }
    left -= n;
  }
  shutdown(j->fd, SHUT_WR);
  return NULL;
}

/* Runs fn on every job in its own thread and waits for them all. */
static int run_jobs(plain_job *jobs, int n, void *(*fn)(void *)) {
  pthread_t th[STREAMS_MAX];
  int started = 0, rc = 0;
  for (; started < n; started++)
    if ((rc = -pthread_create(&th[started], NULL, fn, &jobs[started])))
      break;
  for (int i = 0; i < started; i++)
    pthread_join(th[i], NULL);
  for (int i = 0; i < n && !rc; i++)
    rc = jobs[i].err;
  return rc;
}

static int plain_receiver(const opts *o, const world *w, const uint8_t *pattern,
                          int port_fd, int out_fd) {
  plain_job jobs[STREAMS_MAX] = {0};
  struct sockaddr_in sa = {.sin_family = AF_INET,
                           .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof sa;
  int nfd = 0, rc = 0;
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  if (lfd < 0 || bind(lfd, (struct sockaddr *)&sa, sizeof sa) < 0 ||
      listen(lfd, STREAMS_MAX) < 0 ||
      getsockname(lfd, (struct sockaddr *)&sa, &len) < 0) {
    rc = -errno;
    bee_err(COMP, "plain receiver: cannot listen: %s", bee_strerror(rc));
    goto out;
  }
  int port = ntohs(sa.sin_port);
  if (write(port_fd, &port, sizeof port) != (ssize_t)sizeof port) {
    rc = -errno;
    goto out;
  }
  for (; nfd < o->streams; nfd++) {
    jobs[nfd] = (plain_job){.chunk = o->chunk};
    if ((jobs[nfd].fd = accept(lfd, NULL, NULL)) < 0) {
      rc = -errno;
      goto out;
    }
  }
  cpu_us c0 = cpu_now();
  uint64_t t0 = now_ns();
  rc = run_jobs(jobs, o->streams, plain_recv);
  cpu_us c1 = cpu_now();
  rx_report r = {.t_first_ns = t0,
                 .user_us = c1.user - c0.user,
                 .sys_us = c1.sys - c0.sys};
  for (int i = 0; i < o->streams; i++) {
    r.bytes += jobs[i].bytes;
    if (jobs[i].t_last_ns > r.t_last_ns)
      r.t_last_ns = jobs[i].t_last_ns;
  }
  if (!rc && write(out_fd, &r, sizeof r) != (ssize_t)sizeof r)
    rc = -errno;
out:
  for (int i = 0; i < nfd; i++)
    close(jobs[i].fd);
  if (lfd >= 0)
    close(lfd);
  close(port_fd);
  close(out_fd);
  return rc;
}

static int plain_sender(const opts *o, const uint8_t *pattern, int port,
                        int in_fd) {
  plain_job jobs[STREAMS_MAX] = {0};
  struct sockaddr_in sa = {.sin_family = AF_INET,
                           .sin_port = htons((uint16_t)port),
                           .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  rx_report r;
  int nfd = 0, rc = 0;
  for (; nfd < o->streams; nfd++) {
    jobs[nfd] =
        (plain_job){.bytes = share(o, nfd), .chunk = o->chunk, .src = pattern};
    jobs[nfd].fd = socket(AF_INET, SOCK_STREAM, 0);
    if (jobs[nfd].fd < 0) {
      rc = -errno;
      goto out;
    }
    if (connect(jobs[nfd].fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
      rc = -errno;
      nfd++;
      goto out;
    }
  }
  cpu_us c0 = cpu_now();
  uint64_t t0 = now_ns();
  rc = run_jobs(jobs, o->streams, plain_send);
  uint64_t t1 = now_ns();
  cpu_us c1 = cpu_now();
  if (rc) {
    bee_err(COMP, "plain sender: %s", bee_strerror(rc));
    goto out;
  }
  if (read(in_fd, &r, sizeof r) != (ssize_t)sizeof r) {
    rc = BEE_ECLOSED;
    goto out;
  }
  if (r.bytes != o->bytes) {
    bee_err(COMP, "receiver counted %" PRIu64 " bytes, expected %" PRIu64,
            r.bytes, o->bytes);
    rc = BEE_ERANGE;
    goto out;
  }
  figures f = {.mode = "plain",
               .title = "plain TCP",
               .bytes = r.bytes,
               .ns = r.t_last_ns - t0,
               .tx_wall_ns = t1 - t0,
               .rx_wall_ns = r.t_last_ns - r.t_first_ns,
               .tx = {c1.user - c0.user, c1.sys - c0.sys},
               .rx = {r.user_us, r.sys_us}};
  report(o, &f);
out:
  for (int i = 0; i < nfd; i++)
    close(jobs[i].fd);
  return rc;
}

/* ---- crypto only -------------------------------------------------------- */

/* Runs the real handshake between two in-memory sides and keeps the
 * initiator's sending sealer and the responder's receiving one. */
static int mem_handshake(const world *w, int ciphers, proto_sealer *tx,
                         proto_sealer *rx, int *cipher) {
  proto_auth ai, ar;
  uint8_t in[PROTO_HS_OUT_MAX], out[PROTO_HS_OUT_MAX];
  size_t inlen = 0, outlen = 0;
  bool done_i = false, done_r = false, to_r = true;
  int remote = 0, rc;
  proto_peer peer;
  proto_sealer unused;
  uint64_t now = (uint64_t)time(NULL);
  auth_set(&ai, w, &w->tx_id, &w->tx_tok, ciphers);
  auth_set(&ar, w, &w->rx_id, &w->rx_tok, ciphers);
  proto_hs *hi = proto_hs_new(&ai, true, PROTO_PURPOSE_BULK, now);
  proto_hs *hr = proto_hs_new(&ar, false, 0, now);
  if (!hi || !hr) {
    rc = -ENOMEM;
    goto out;
  }
  rc = proto_hs_step(hi, NULL, 0, in, &inlen, &done_i, &remote);
  while (!rc && inlen > 0) {
    bool done = false;
    rc = proto_hs_step(to_r ? hr : hi, in, inlen, out, &outlen, &done, &remote);
    if (to_r)
      done_r = done_r || done;
    else
      done_i = done_i || done;
    memcpy(in, out, outlen);
    inlen = outlen;
    to_r = !to_r;
  }
  if (!rc && !(done_i && done_r))
    rc = BEE_EAUTH;
  if (!rc && !(rc = proto_hs_result(hi, &peer, tx, &unused))) {
    *cipher = peer.cipher;
    proto_sealer_clear(&unused);
    rc = proto_hs_result(hr, &peer, &unused, rx);
    proto_sealer_clear(&unused);
  }
out:
  proto_hs_free(hi);
  proto_hs_free(hr);
  return rc;
}

/* Does per chunk what the transport does to its bytes, timing each step:
 * copy the data behind the chunk header, seal, open, decode. */
static int crypto_only(const opts *o, const world *w, const uint8_t *pattern) {
  proto_sealer tx, rx;
  int cipher = 0, rc;
  uint64_t t_copy = 0, t_seal = 0, t_open = 0, t_decode = 0;
  uint8_t hdr[64];
  size_t hlen, plen;
  proto_msg m;
  if ((rc = mem_handshake(w, o->ciphers, &tx, &rx, &cipher))) {
    bee_err(COMP, "in-memory handshake failed: %s", bee_strerror(rc));
    return rc;
  }
  uint8_t *body = malloc(sizeof hdr + o->chunk + PROTO_TAG_BYTES);
  if (!body) {
    rc = -ENOMEM;
    goto out;
  }
  for (uint64_t done = 0; done < o->bytes;) {
    uint64_t left = o->bytes - done;
    size_t n = left < o->chunk ? (size_t)left : o->chunk;
    uint64_t t0 = now_ns();
    if ((rc = proto_chunk_header_encode(STREAM_ID, done, n, hdr, sizeof hdr,
                                        &hlen)))
      goto out;
    memcpy(body, hdr, hlen);
    memcpy(body + hlen, pattern, n);
    uint64_t t1 = now_ns();
    if ((rc = proto_seal(&tx, body, hlen + n)))
      goto out;
    uint64_t t2 = now_ns();
    if ((rc = proto_open(&rx, body, hlen + n + PROTO_TAG_BYTES, &plen)))
      goto out;
    uint64_t t3 = now_ns();
    if ((rc = proto_msg_decode(body, plen, &m)))
      goto out;
    uint64_t t4 = now_ns();
    if (m.payload.n != n || m.offset != done) {
      rc = BEE_ERANGE;
      goto out;
    }
    t_copy += t1 - t0;
    t_seal += t2 - t1;
    t_open += t3 - t2;
    t_decode += t4 - t3;
    done += n;
  }
  double b = (double)o->bytes;
  printf("crypto only: %s, %" PRIu64 " bytes in %zu-byte bodies, one core\n",
         cipher_name(cipher), o->bytes, o->chunk);
  printf("  copy into frame %6.2f GB/s\n", b / (double)t_copy);
  printf("  seal            %6.2f GB/s\n", b / (double)t_seal);
  printf("  open            %6.2f GB/s\n", b / (double)t_open);
  printf("  decode          %6.2f GB/s\n",
         b / (double)(t_decode ? t_decode : 1));
  printf("  seal+open       %6.2f GB/s (both ends on one core)\n",
         b / (double)(t_seal + t_open));
  printf("  sender ceiling  %6.2f GB/s (copy + seal, no syscalls)\n",
         b / (double)(t_copy + t_seal));
  printf("RESULT mode=crypto cipher=%s bytes=%" PRIu64 " chunk=%zu"
         " copy_gb_per_s=%.3f seal_gb_per_s=%.3f open_gb_per_s=%.3f"
         " gb_per_s=%.3f\n",
         cipher_name(cipher), o->bytes, o->chunk, b / (double)t_copy,
         b / (double)t_seal, b / (double)t_open, b / (double)(t_seal + t_open));
out:
  if (rc)
    bee_err(COMP, "crypto loop failed: %s", bee_strerror(rc));
  free(body);
  proto_sealer_clear(&tx);
  proto_sealer_clear(&rx);
  return rc;
}

/* ---- main --------------------------------------------------------------- */

int main(int argc, char **argv) {
  opts o;
  world w;
  pid_t pid = -1;
  int port = 0, in_fd = -1, rc;
  uint8_t *pattern = NULL;
  if (parse_opts(argc, argv, &o))
    return 2;
  bee_log_set_level(BEE_LOG_WARN);
  signal(SIGPIPE, SIG_IGN);
  signal(SIGALRM, on_alarm);
  alarm(o.timeout_s); /* a hung run dies rather than hang the runner */
  if ((rc = world_init(&w))) {
    bee_err(COMP, "cannot make the swarm: %s", bee_strerror(rc));
    return 1;
  }
  if (!(pattern = malloc(o.chunk))) {
    rc = -ENOMEM;
    goto out;
  }
  pattern_fill(pattern, o.chunk);
  if (o.crypto_only) {
    rc = crypto_only(&o, &w, pattern);
    goto out;
  }
  rc = spawn(o.plain ? plain_receiver : beed_receiver, &o, &w, pattern, &pid,
             &port, &in_fd);
  if (rc) {
    bee_err(COMP, "cannot start the receiver: %s", bee_strerror(rc));
    goto out;
  }
  rc = o.plain ? plain_sender(&o, pattern, port, in_fd)
               : beed_sender(&o, &w, pattern, port);
  close(in_fd);
  int rrc = reap(pid, rc != 0);
  pid = -1;
  if (!rc)
    rc = rrc;
out:
  if (pid > 0)
    reap(pid, true);
  free(pattern);
  world_clear(&w);
  return rc ? 1 : 0;
}
