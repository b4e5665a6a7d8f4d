/* test-averager-round.c: the butterfly round on a simulated network.
 *
 * Up to 16 members run avg_round in one process over a fake network: each
 * member's uplink serializes its messages at its own rate, each link adds
 * a latency and optional jitter (which reorders messages), a link's queue
 * can be capped so that sends meet BEE_EQUEUE, and the clock is fake.
 * Jobs run inline, deferred to random later times in random order, or on
 * two real worker threads.
 *
 * Every result is checked against a reference built here from the public
 * codec and mean functions, part by part, in member order: bit for bit
 * for every codec (the round adopts what the receivers decode), and
 * against the exact mean in double within the codecs' documented bounds.
 * Failures (members killed at random times, corrupt or huge contributions,
 * deadlines, a member that begins late without saying WAIT) must leave
 * every span of every survivor either averaged over the contributions the
 * owner reports or exactly as it was.
 */
#include "averager.h"
#include "test.h"
#include "testlib.h"

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define NMAX 16
#define NONE SIZE_MAX

/* ---- randomness -------------------------------------------------------- */

static double rng_normal(uint64_t *s) {
  double u = test_rng_unit(s) + 0x1p-54, v = test_rng_unit(s);
  return sqrt(-2 * log(u)) * cos(2 * M_PI * v);
}

static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  ASSERT(p);
  return p;
}

/* ---- a scenario -------------------------------------------------------- */

enum { JOBS_INLINE, JOBS_DEFERRED, JOBS_THREADS };
/* What the network does to the messages of one member. */
enum {
  T_NONE,
  T_NAN,       /* its PARTs carry a NaN */
  T_SHORT,     /* its PARTs lose their last data byte */
  T_CODEC,     /* its PARTs name another codec */
  T_MUTE,      /* its PARTs are lost (it still reduces) */
  T_NO_RESULT, /* its RESULTs are lost (it still sends) */
};

typedef struct scen {
  size_t N, P;
  avg_mode modes[NMAX];
  double bw[NMAX]; /* uplink, bytes per microsecond */
  double weight[NMAX];
  double scale[NMAX]; /* of its values */
  avg_codec codec;
  size_t pf;
  unsigned window;
  unsigned windows[NMAX]; /* per member, where not 0 (else window) */
  bool ef;
  avg_clip_mode clip_mode;
  double clip;
  uint64_t sender_ms, reducer_ms, deadline_ms;
  uint64_t lat_us, jitter_us;
  size_t link_cap;
  int jobs;
  uint64_t seed;
  size_t kill; /* member killed at kill_us, or NONE */
  uint64_t kill_us;
  size_t tamper; /* member whose messages are tampered with */
  int tamper_kind;
  bool free_in_cb;
  bool spans_by_bw; /* pass bw to avg_spans (else equal) */
  /* A member that begins its round at late_us (a group formed ahead whose
   * buffer comes later), its messages kept till then as avg_node keeps
   * them, and until then says WAIT to the others every wait_us (0:
   * never).  late NONE: everyone begins at 0. */
  size_t late;
  uint64_t late_us, wait_us;
} scen;

static scen scen_make(size_t N, size_t P, uint64_t seed) {
  scen s = {.N = N,
            .P = P,
            .codec = AVG_NONE,
            .pf = 4096,
            .window = 4,
            .clip = 10,
            .sender_ms = 300,
            .reducer_ms = 800,
            .deadline_ms = 20000,
            .lat_us = 2000,
            .seed = seed,
            .kill = NONE,
            .tamper = NONE,
            .late = NONE};
  for (size_t i = 0; i < N; i++) {
    s.modes[i] = AVG_MODE_NODE;
    s.bw[i] = 1000; /* 1 GB/s */
    s.weight[i] = (double)(1 + i % 5);
    s.scale[i] = 1;
  }
  return s;
}

/* ---- the fake network -------------------------------------------------- */

enum { EV_MSG, EV_TXDONE, EV_JOB };

typedef struct ev {
  uint64_t at, seq;
  int kind;
  size_t from, to;
  uint8_t *buf;
  size_t len;
  avg_job *job;
} ev;

struct net;
struct peer;

/* A job and the member it belongs to. */
typedef struct task {
  avg_job *j;
  struct peer *p;
} task;

typedef struct peer {
  struct net *net;
  size_t idx;
  avg_round *r;
  float *x, *x0, *res, *res0; /* buffer, original, residual, original */
  bool dead, done, started;
  uint64_t next_tick; /* us */
  uint64_t busy_until;
  size_t queued[NMAX];
  bool want_drain[NMAX];
  uint64_t net_bytes, equeues;
  uint64_t parts_out, results_out; /* messages that left before it died */
  /* the summary, copied */
  int cb_count, status;
  avg_span_info spans[NMAX];
  avg_member_info members[NMAX];
  size_t by_k[NMAX + 1];
  uint32_t *part_k;
  size_t nparts;
  uint64_t msgs_sent, payload_sent, bytes_sent, bytes_recv, ms;
  char name[16];
} peer;

typedef struct net {
  scen s;
  peer p[NMAX];
  uint64_t now, seq, rng;
  ev *heap;
  size_t nheap, capheap;
  avg_job **left; /* jobs of dead members, run at the end */
  size_t nleft;
  /* JOBS_THREADS */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  task work[4096], fin[4096];
  size_t nwork, nfin, out;
  bool stop;
  pthread_t th[2];
} net;

static bool ev_before(const ev *a, const ev *b) {
  return a->at < b->at || (a->at == b->at && a->seq < b->seq);
}

static void push(net *n, ev e) {
  if (n->nheap == n->capheap) {
    n->capheap = n->capheap ? 2 * n->capheap : 256;
    n->heap = realloc(n->heap, n->capheap * sizeof *n->heap);
    ASSERT(n->heap);
  }
  e.seq = n->seq++;
  size_t i = n->nheap++;
  while (i > 0 && ev_before(&e, &n->heap[(i - 1) / 2])) {
    n->heap[i] = n->heap[(i - 1) / 2];
    i = (i - 1) / 2;
  }
  n->heap[i] = e;
}

static ev pop(net *n) {
  ev top = n->heap[0], last = n->heap[--n->nheap];
  size_t i = 0;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= n->nheap)
      break;
    if (c + 1 < n->nheap && ev_before(&n->heap[c + 1], &n->heap[c]))
      c++;
    if (!ev_before(&n->heap[c], &last))
      break;
    n->heap[i] = n->heap[c];
    i = c;
  }
  if (n->nheap)
    n->heap[i] = last;
  return top;
}

static uint64_t io_now(void *ctx) {
  peer *p = ctx;
  return p->net->now / 1000;
}

static const char *io_name(void *ctx, size_t member) {
  peer *p = ctx;
  return p->net->p[member].name;
}

/* Rewrites a PART from the tampered member as the scenario says.  Returns
 * false when the message is lost. */
static bool tamper(net *n, size_t from, uint8_t **buf, size_t *len) {
  if (from != n->s.tamper || n->s.tamper_kind == T_NONE)
    return true;
  /* The message type is the third byte: [fixarray, 1, type, ...]. */
  int type = (*buf)[2];
  if (n->s.tamper_kind == T_NO_RESULT)
    return type != PROTO_T_AVG_RESULT;
  if (type != PROTO_T_AVG_PART)
    return true;
  if (n->s.tamper_kind == T_MUTE)
    return false;
  /* The data is the message's tail. */
  uint8_t *b = *buf;
  size_t L = *len;
  if (n->s.tamper_kind == T_NAN) {
    /* The last four bytes are the part's last float (AVG_NONE). */
    static const uint8_t nan[4] = {0x00, 0x00, 0xc0, 0x7f};
    if (L > 64)
      memcpy(b + L - 4, nan, 4);
  } else if (n->s.tamper_kind == T_SHORT || n->s.tamper_kind == T_CODEC) {
    /* Rebuild the message: the tests only tamper with parts of known
     * layout, so go through the real codec of the payload. */
    proto_avg_msg m;
    ASSERT_OK(proto_avg_decode(b, L, &m));
    if (!m.has_data)
      return true;
    uint8_t *nb = xmalloc(L + 16);
    if (n->s.tamper_kind == T_SHORT)
      m.data.n--;
    else
      m.codec = (m.codec + 1) % AVG_CODEC_COUNT;
    size_t nl;
    ASSERT_OK(proto_avg_encode(&m, nb, L + 16, &nl));
    free(b);
    *buf = nb;
    *len = nl;
  }
  return true;
}

static int io_send(void *ctx, size_t to, const uint8_t *msg, size_t len) {
  peer *p = ctx;
  net *n = p->net;
  ASSERT(to < n->s.N && to != p->idx);
  if (p->dead)
    return 0;
  if (n->s.link_cap && p->queued[to] > 0 &&
      p->queued[to] + len > n->s.link_cap) {
    p->want_drain[to] = true;
    p->equeues++;
    return BEE_EQUEUE;
  }
  p->net_bytes += len;
  p->parts_out += msg[2] == PROTO_T_AVG_PART;
  p->results_out += msg[2] == PROTO_T_AVG_RESULT;
  uint64_t start = p->busy_until > n->now ? p->busy_until : n->now;
  p->busy_until = start + (uint64_t)((double)len / n->s.bw[p->idx]) + 1;
  p->queued[to] += len;
  push(n, (ev){.at = p->busy_until,
               .kind = EV_TXDONE,
               .from = p->idx,
               .to = to,
               .len = len});
  uint8_t *copy = xmalloc(len);
  memcpy(copy, msg, len);
  size_t clen = len;
  if (!tamper(n, p->idx, &copy, &clen)) {
    free(copy);
    return 0;
  }
  uint64_t at =
      p->busy_until + n->s.lat_us + test_rng_below(&n->rng, n->s.jitter_us + 1);
  push(n, (ev){.at = at,
               .kind = EV_MSG,
               .from = p->idx,
               .to = to,
               .buf = copy,
               .len = clen});
  return 0;
}

static void *worker(void *arg) {
  net *n = arg;
  pthread_mutex_lock(&n->mu);
  for (;;) {
    while (!n->stop && n->nwork == 0)
      pthread_cond_wait(&n->cv, &n->mu);
    if (n->stop)
      break;
    task t = n->work[--n->nwork];
    pthread_mutex_unlock(&n->mu);
    avg_job_run(t.j);
    pthread_mutex_lock(&n->mu);
    n->fin[n->nfin++] = t;
    pthread_cond_broadcast(&n->cv);
  }
  pthread_mutex_unlock(&n->mu);
  return NULL;
}

static void io_submit(void *ctx, avg_job *j) {
  peer *p = ctx;
  net *n = p->net;
  if (n->s.jobs == JOBS_THREADS) {
    pthread_mutex_lock(&n->mu);
    ASSERT(n->nwork < 4096);
    n->work[n->nwork++] = (task){j, p};
    n->out++;
    pthread_cond_broadcast(&n->cv);
    pthread_mutex_unlock(&n->mu);
    return;
  }
  push(n, (ev){.at = n->now + test_rng_below(&n->rng, 3000),
               .kind = EV_JOB,
               .from = p->idx,
               .job = j});
}

static void tick(peer *p) {
  if (!p->r || p->dead || p->done) {
    p->next_tick = UINT64_MAX;
    return;
  }
  uint64_t ms = avg_round_tick(p->r);
  if (p->done || ms == UINT64_MAX)
    p->next_tick = UINT64_MAX;
  else
    p->next_tick = (p->net->now / 1000 + ms) * 1000;
}

static void on_done(avg_round *r, const avg_round_summary *s, void *arg) {
  peer *p = arg;
  p->cb_count++;
  p->done = true;
  p->status = s->status;
  ASSERT_UEQ(s->nmembers, p->net->s.N);
  memcpy(p->spans, s->spans, s->nmembers * sizeof *s->spans);
  memcpy(p->members, s->members, s->nmembers * sizeof *s->members);
  memcpy(p->by_k, s->floats_by_k, (s->nmembers + 1) * sizeof *s->floats_by_k);
  p->nparts = s->nparts;
  p->part_k = xmalloc(s->nparts * sizeof *p->part_k);
  memcpy(p->part_k, s->part_k, s->nparts * sizeof *p->part_k);
  p->msgs_sent = s->msgs_sent;
  p->payload_sent = s->payload_sent;
  p->bytes_sent = s->bytes_sent;
  p->bytes_recv = s->bytes_recv;
  p->ms = s->ms;
  if (p->net->s.free_in_cb) {
    avg_round_free(r); /* deferred by the round */
    p->r = NULL;
  }
}

static void fill(net *n, peer *p) {
  const scen *s = &n->s;
  for (size_t t = 0; t < s->P; t++) {
    double v = s->scale[p->idx] * rng_normal(&n->rng);
    if (t % 97 == 5)
      v += 0.5 * s->scale[p->idx] * (double)p->idx; /* member offsets */
    p->x0[t] = p->x[t] = (float)v;
    if (p->res)
      p->res0[t] = p->res[t] = (float)(1e-3 * rng_normal(&n->rng));
  }
}

static net *net_new(const scen *s) {
  net *n = calloc(1, sizeof *n);
  ASSERT(n);
  n->s = *s;
  n->rng = s->seed * 0x9e3779b97f4a7c15u + 1;
  avg_io io = {.now_ms = io_now,
               .send = io_send,
               .name = io_name,
               .submit = s->jobs == JOBS_INLINE ? NULL : io_submit};
  for (size_t i = 0; i < s->N; i++) {
    peer *p = &n->p[i];
    p->net = n;
    p->idx = i;
    snprintf(p->name, sizeof p->name, "peer-%zu", i);
    bool data = s->modes[i] != AVG_MODE_AUX;
    if (data) {
      p->x = xmalloc(s->P * sizeof *p->x);
      p->x0 = xmalloc(s->P * sizeof *p->x0);
      if (s->ef) {
        p->res = xmalloc(s->P * sizeof *p->res);
        p->res0 = xmalloc(s->P * sizeof *p->res0);
      }
      fill(n, p);
    }
    avg_round_config c;
    avg_round_config_default(&c);
    memset(c.group, 0xa5, sizeof c.group);
    c.group[0] = (uint8_t)s->seed;
    c.nmembers = s->N;
    c.self = i;
    c.modes = s->modes;
    c.bandwidth = s->spans_by_bw ? s->bw : NULL;
    c.x = p->x;
    c.n = s->P;
    c.residual = p->res;
    c.weight = data ? s->weight[i] : 0;
    c.codec = s->codec;
    c.part_floats = s->pf;
    c.window = s->windows[i] ? s->windows[i] : s->window;
    c.clip = s->clip;
    c.clip_mode = s->clip_mode;
    c.sender_timeout_ms = s->sender_ms;
    c.reducer_timeout_ms = s->reducer_ms;
    c.deadline_ms = s->deadline_ms;
    io.ctx = p;
    ASSERT_OK(avg_round_new(&c, &io, &p->r));
  }
  if (s->jobs == JOBS_THREADS) {
    pthread_mutex_init(&n->mu, NULL);
    pthread_cond_init(&n->cv, NULL);
    for (int t = 0; t < 2; t++)
      ASSERT_EQ(pthread_create(&n->th[t], NULL, worker, n), 0);
  }
  return n;
}

static void run_job(net *n, avg_job *j, peer *p) {
  if (p->dead) {
    n->left = realloc(n->left, (n->nleft + 1) * sizeof *n->left);
    ASSERT(n->left);
    n->left[n->nleft++] = j;
    return;
  }
  avg_job_run(j);
  avg_job_done(j);
  tick(p);
}

/* Hands the threads' finished jobs back, waiting for them when nothing
 * else can happen. */
static void reap(net *n, bool wait) {
  if (n->s.jobs != JOBS_THREADS)
    return;
  for (;;) {
    pthread_mutex_lock(&n->mu);
    while (wait && n->out > 0 && n->nfin == 0)
      pthread_cond_wait(&n->cv, &n->mu);
    if (n->nfin == 0) {
      pthread_mutex_unlock(&n->mu);
      return;
    }
    task t = n->fin[--n->nfin];
    n->out--;
    pthread_mutex_unlock(&n->mu);
    avg_job_done(t.j);
    tick(t.p);
    wait = false;
  }
}

/* The late member begins its round. */
static void begin_late(net *n) {
  peer *p = &n->p[n->s.late];
  p->started = true;
  ASSERT_OK(avg_round_start(p->r, on_done, p));
  tick(p);
}

static void process(net *n, ev e) {
  peer *from = &n->p[e.from], *to = e.to < n->s.N ? &n->p[e.to] : NULL;
  switch (e.kind) {
  case EV_MSG:
    if (!to->started && !to->dead && n->now < n->s.late_us) {
      e.at = n->s.late_us; /* kept till it begins, in order */
      push(n, e);
      break;
    }
    if (!to->started)
      begin_late(n);
    if (!to->dead && to->r && !to->done) {
      avg_round_handle(to->r, e.from, e.buf, e.len);
      tick(to);
    }
    free(e.buf);
    break;
  case EV_TXDONE:
    from->queued[e.to] -= e.len;
    if (from->want_drain[e.to] && 2 * from->queued[e.to] <= n->s.link_cap) {
      from->want_drain[e.to] = false;
      if (!from->dead && from->r && !from->done) {
        avg_round_drain(from->r, e.to);
        tick(from);
      }
    }
    break;
  default: run_job(n, e.job, from); break;
  }
}

static bool all_done(const net *n) {
  for (size_t i = 0; i < n->s.N; i++)
    if (!n->p[i].dead && !n->p[i].done)
      return false;
  return true;
}

/* Runs until every live member has its callback. */
/* The late member's WAIT to every other member. */
static void say_wait(net *n, peer *p) {
  proto_avg_msg m = {.type = PROTO_T_AVG_WAIT};
  memset(m.group, 0xa5, sizeof m.group);
  m.group[0] = (uint8_t)n->s.seed;
  uint8_t buf[64];
  size_t len;
  ASSERT_OK(proto_avg_encode(&m, buf, sizeof buf, &len));
  for (size_t j = 0; j < n->s.N; j++)
    if (j != p->idx)
      ASSERT_OK(io_send(p, j, buf, len));
}

static void net_run(net *n) {
  unsigned still = 0; /* turns without the clock moving */
  size_t late = n->s.late;
  uint64_t next_wait = n->s.wait_us ? n->s.wait_us : UINT64_MAX;
  for (size_t i = 0; i < n->s.N; i++) {
    if (i == late)
      continue;
    n->p[i].started = true;
    ASSERT_OK(avg_round_start(n->p[i].r, on_done, &n->p[i]));
    tick(&n->p[i]);
  }
  while (!all_done(n)) {
    if (late < n->s.N && !n->p[late].started) {
      if (n->now >= n->s.late_us) {
        begin_late(n);
      } else if (n->now >= next_wait) {
        say_wait(n, &n->p[late]);
        next_wait += n->s.wait_us;
      }
    }
    reap(n, n->out > 0);
    if (all_done(n))
      break;
    uint64_t t = n->nheap ? n->heap[0].at : UINT64_MAX;
    for (size_t i = 0; i < n->s.N; i++) {
      peer *p = &n->p[i];
      if (!p->dead && p->next_tick < t)
        t = p->next_tick;
      if (!p->dead && i == n->s.kill && n->s.kill_us < t)
        t = n->s.kill_us;
    }
    if (late < n->s.N && !n->p[late].started) {
      if (n->s.late_us < t)
        t = n->s.late_us;
      if (next_wait < t)
        t = next_wait;
    }
    if (t == UINT64_MAX)
      FAIL("the network is stuck at %" PRIu64 " us", n->now);
    ASSERT(t <= (n->s.deadline_ms + 1000) * 1000);
    if (t > n->now) {
      n->now = t;
      still = 0;
    } else if (++still > 1000000) {
      FAIL("the network spins at %" PRIu64 " us", n->now);
    }
    if (n->s.kill < n->s.N && n->s.kill_us <= n->now)
      n->p[n->s.kill].dead = true;
    while (n->nheap && n->heap[0].at <= n->now)
      process(n, pop(n));
    for (size_t i = 0; i < n->s.N; i++)
      if (!n->p[i].dead && n->p[i].next_tick <= n->now)
        tick(&n->p[i]);
  }
}

static void net_free(net *n) {
  /* Rounds not freed by their callback (and the dead ones) go now; the
   * dead members' jobs are handed back so their memory goes too. */
  for (size_t i = 0; i < n->s.N; i++) {
    peer *p = &n->p[i];
    if (p->r) {
      bool dead = p->dead;
      p->dead = true; /* its ABORTs go nowhere */
      avg_round_free(p->r);
      p->r = NULL;
      p->dead = dead;
    }
  }
  for (size_t i = 0; i < n->nleft; i++) {
    avg_job_run(n->left[i]);
    avg_job_done(n->left[i]);
  }
  free(n->left);
  reap(n, true);
  while (n->nheap) {
    ev e = pop(n);
    if (e.kind == EV_JOB) {
      avg_job_run(e.job);
      avg_job_done(e.job);
    }
    free(e.buf);
  }
  if (n->s.jobs == JOBS_THREADS) {
    pthread_mutex_lock(&n->mu);
    n->stop = true;
    pthread_cond_broadcast(&n->cv);
    pthread_mutex_unlock(&n->mu);
    for (int t = 0; t < 2; t++)
      pthread_join(n->th[t], NULL);
    pthread_mutex_destroy(&n->mu);
    pthread_cond_destroy(&n->cv);
  }
  for (size_t i = 0; i < n->s.N; i++) {
    peer *p = &n->p[i];
    ASSERT_EQ(p->cb_count, 1); /* exactly once, dead members too */
    free(p->x);
    free(p->x0);
    free(p->res);
    free(p->res0);
    free(p->part_k);
  }
  free(n->heap);
  free(n);
}

/* ---- the reference ----------------------------------------------------- */

/* What member m sends for the floats [off, off + len) of a part: its
 * values through the codec, with error feedback from its original
 * residual (into res, when given). */
static void sent_values(const net *n, size_t m, size_t off, size_t len,
                        float *out, float *res) {
  const scen *s = &n->s;
  const peer *p = &n->p[m];
  size_t cap = avg_encoded_size(s->codec, len), got;
  uint8_t *buf = xmalloc(cap);
  if (s->ef) {
    memcpy(res, p->res0 + off, len * sizeof *res);
    ASSERT_OK(avg_encode_ef(s->codec, p->x0 + off, len, res, buf, cap, &got));
  } else {
    ASSERT_OK(avg_encode(s->codec, p->x0 + off, len, buf, cap, &got));
  }
  ASSERT_OK(avg_decode(s->codec, buf, got, len, out));
  free(buf);
}

/* The result of one part of owner j's span as the round must compute it
 * from the members in `in`: contributions in member order (the owner's
 * own exactly, the others through the codec), the clip rule, the mean,
 * then the result through the codec.  Returns false when there is
 * nothing to average (every member keeps its own values). */
static bool reference(const net *n, size_t j, size_t off, size_t len,
                      const bool *in, float *out) {
  const scen *s = &n->s;
  float *vals = xmalloc(s->N * len * sizeof *vals), *res = xmalloc(len * 4);
  double norm[NMAX], sorted[NMAX], W = 0;
  float f[NMAX];
  size_t k = 0;
  for (size_t m = 0; m < s->N; m++) {
    if (!in[m])
      continue;
    if (m == j)
      memcpy(vals + m * len, n->p[m].x0 + off, len * sizeof *vals);
    else
      sent_values(n, m, off, len, vals + m * len, res);
    double sq;
    ASSERT_OK(avg_check(vals + m * len, len, &sq));
    sorted[k++] = norm[m] = sqrt(sq);
  }
  double median = avg_median(sorted, k);
  float *sum = xmalloc(len * sizeof *sum);
  memset(sum, 0, len * sizeof *sum);
  for (size_t m = 0; m < s->N; m++) {
    if (!in[m])
      continue;
    f[m] = s->clip_mode == AVG_CLIP_OFF
               ? 1.0f
               : (float)avg_clip_factor(norm[m], median, s->clip, s->clip_mode);
    if (f[m] == 0.0f)
      continue;
    float w = (float)s->weight[m];
    for (size_t t = 0; t < len; t++) {
      float x = vals[m * len + t];
      if (f[m] != 1.0f)
        x = x * f[m];
      float prod = w * x;
      sum[t] = sum[t] + prod;
    }
    W += w;
  }
  bool any = W > 0;
  if (any) {
    for (size_t t = 0; t < len; t++)
      sum[t] = sum[t] / (float)W;
    size_t cap = avg_encoded_size(s->codec, len), got;
    uint8_t *buf = xmalloc(cap);
    ASSERT_OK(avg_encode(s->codec, sum, len, buf, cap, &got));
    ASSERT_OK(avg_decode(s->codec, buf, got, len, out));
    free(buf);
  }
  free(sum);
  free(vals);
  free(res);
  return any;
}

/* The documented bound of one codec step on a part whose largest |value|
 * is M (docs/AVERAGING.md, section 2), a little generously. */
static double codec_bound(avg_codec c, double M) {
  switch (c) {
  case AVG_FP16: return 0x1p-11 * M + 0x1p-25;
  case AVG_BF16: return 0x1p-8 * M + 0x1p-134;
  case AVG_U8: return 2 * M / 510 * (1 + 0x1p-12) + 0x1p-22 * M + 0x1p-141;
  case AVG_B8: return M / 254 * (1 + 0x1p-12) + 0x1p-143;
  default: return 0;
  }
}

/* Checks one part of a lossy round against the exact mean in double. */
static void check_bound(const net *n, size_t off, size_t len, const bool *in,
                        const float *got) {
  const scen *s = &n->s;
  double M = 0, W = 0;
  for (size_t m = 0; m < s->N; m++)
    if (in[m]) {
      W += (float)s->weight[m];
      for (size_t t = 0; t < len; t++) {
        double a = fabs((double)n->p[m].x0[off + t]);
        if (s->ef)
          a += fabs((double)n->p[m].res0[off + t]);
        M = a > M ? a : M;
      }
    }
  /* Each contribution and the result go through the codec once. */
  double bound = 2 * codec_bound(s->codec, M) + 64 * 0x1p-24 * M;
  for (size_t t = 0; t < len; t++) {
    double exact = 0;
    for (size_t m = 0; m < s->N; m++)
      if (in[m]) {
        double x = n->p[m].x0[off + t];
        exact += (float)s->weight[m] * x;
      }
    exact /= W;
    if (!(fabs(got[t] - exact) <= bound))
      FAIL("float %zu: %.9g vs exact %.9g, beyond the bound %.3g", off + t,
           got[t], exact, bound);
  }
}

/* The members whose contributions count: data, weight > 0, neither
 * killed nor tampered with; with_failed, the failing member too (it may
 * have sent a part before it was dropped). */
static void included(const net *n, bool with_failed, bool *in) {
  const scen *s = &n->s;
  for (size_t m = 0; m < s->N; m++)
    in[m] = s->modes[m] != AVG_MODE_AUX && (float)s->weight[m] > 0 &&
            ((m != s->kill && m != s->tamper) || with_failed);
}

static size_t count(const bool *in, size_t N) {
  size_t c = 0;
  for (size_t m = 0; m < N; m++)
    c += in[m];
  return c;
}

/* Checks every survivor: status, and each span either averaged (bit for
 * bit as the reference, within the bound of the exact mean) or exactly as
 * it was, as its summary says.  Returns the number of spans averaged. */
static size_t check_round(const net *n, int want_status) {
  const scen *s = &n->s;
  size_t averaged = 0;
  float *want = xmalloc(s->pf * sizeof *want);
  for (size_t i = 0; i < s->N; i++) {
    const peer *p = &n->p[i];
    if (p->dead)
      continue;
    ASSERT_EQ(p->cb_count, 1);
    ASSERT_RC(p->status, want_status);
    if (want_status == 0)
      ASSERT(p->ms < s->deadline_ms);
    for (size_t m = 0; m < s->N; m++)
      if (m != s->kill && m != s->tamper && !n->p[m].dead)
        ASSERT_EQ(p->members[m].dropped, AVG_DROP_NONE);
  }
  /* Every member lays the spans out alike. */
  const peer *first = NULL;
  for (size_t i = 0; i < s->N; i++) {
    const peer *p = &n->p[i];
    if (p->dead || s->modes[i] == AVG_MODE_AUX)
      continue;
    size_t total = 0;
    for (size_t k = 0; k <= s->N; k++)
      total += p->by_k[k];
    ASSERT_UEQ(total, s->P);
    if (!first)
      first = p;
    for (size_t j = 0; j < s->N; j++) {
      ASSERT_UEQ(p->spans[j].owner, j);
      ASSERT_UEQ(p->spans[j].start, first->spans[j].start);
      ASSERT_UEQ(p->spans[j].len, first->spans[j].len);
      averaged += p->spans[j].averaged && p->spans[j].len > 0;
    }
  }
  uint64_t part = 0;
  for (size_t j = 0; first && j < s->N; j++) {
    const avg_span_info *sp = &first->spans[j];
    for (size_t at = 0; at < sp->len; at += s->pf, part++) {
      size_t off = sp->start + at;
      size_t len = sp->len - at < s->pf ? sp->len - at : s->pf;
      /* The reference depends on the part and on the contributions its
       * owner took (k, from its RESULT, the same for every member). */
      uint32_t have = 0;
      for (size_t i = 0; i < s->N; i++) {
        const peer *p = &n->p[i];
        if (p->dead || s->modes[i] == AVG_MODE_AUX)
          continue;
        uint32_t k = p->part_k[part];
        if (!p->spans[j].averaged || k == 0) {
          ASSERT(memcmp(p->x + off, p->x0 + off, len * sizeof *p->x) == 0);
          continue;
        }
        if (k != have) {
          bool in[NMAX];
          included(n, false, in);
          if (k != count(in, s->N))
            included(n, true, in);
          if (s->clip_mode != AVG_CLIP_DROP)
            ASSERT_EQ(k, count(in, s->N));
          ASSERT(reference(n, j, off, len, in, want));
          if (s->codec != AVG_NONE && s->clip_mode == AVG_CLIP_OFF)
            check_bound(n, off, len, in, want);
          have = k;
        }
        if (memcmp(p->x + off, want, len * sizeof *want) != 0) {
          for (size_t t = 0; t < len; t++)
            if (memcmp(&p->x[off + t], &want[t], 4) != 0)
              FAIL("member %zu, float %zu (span %zu): %.9g vs reference "
                   "%.9g",
                   i, off + t, j, p->x[off + t], want[t]);
        }
      }
    }
  }
  free(want);
  return averaged;
}

/* Runs a scenario and checks it; returns the net for more checks. */
static net *run_check(const scen *s, int want_status) {
  net *n = net_new(s);
  net_run(n);
  check_round(n, want_status);
  return n;
}

/* ---- tests ------------------------------------------------------------- */

/* Exact mean, bit for bit, for every group size and odd sizes. */
static void test_exact(void) {
  static const size_t sizes[] = {2, 3, 4, 8, 16};
  for (size_t a = 0; a < 5; a++) {
    size_t N = sizes[a];
    size_t Ps[] = {1, 7, 4095, 4096, 4097, 3 * 4096 * N + 11};
    for (size_t b = 0; b < 6; b++) {
      scen s = scen_make(N, Ps[b], 100 * a + b);
      net *n = run_check(&s, 0);
      /* Everyone averaged everything, with all N contributions. */
      for (size_t i = 0; i < N; i++) {
        ASSERT_UEQ(n->p[i].by_k[N], Ps[b]);
        /* The bytes the network carried are the summary's. */
        ASSERT_UEQ(n->p[i].bytes_sent,
                   n->p[i].net_bytes + AVG_MSG_OVERHEAD * n->p[i].msgs_sent);
      }
      net_free(n);
    }
  }
}

/* Unequal bandwidths give spans of different sizes; the result is the
 * same bits. */
static void test_unequal(void) {
  for (uint64_t seed = 1; seed <= 3; seed++) {
    scen s = scen_make(8, 200003, seed);
    s.spans_by_bw = true;
    for (size_t i = 0; i < 8; i++)
      s.bw[i] = 250.0 * (double)(1 + i % 4);
    s.bw[3] = 125; /* slow enough to own nothing */
    net *n = run_check(&s, 0);
    size_t start[8], len[8];
    bool red[8];
    for (size_t i = 0; i < 8; i++)
      red[i] = true;
    ASSERT_OK(avg_spans(s.P, 8, s.bw, red, AVG_SPAN_ALIGN, start, len));
    size_t lmin = SIZE_MAX, lmax = 0;
    for (size_t i = 0; i < 8; i++) {
      ASSERT_UEQ(n->p[0].spans[i].len, len[i]);
      lmin = len[i] < lmin ? len[i] : lmin;
      lmax = len[i] > lmax ? len[i] : lmax;
    }
    ASSERT(lmax > 2 * lmin + AVG_SPAN_ALIGN);
    net_free(n);
  }
}

/* Members whose windows differ (each sizes its own from its links) finish
 * the round with the same bits as with one window: an owner takes what a
 * sender with a larger window sends ahead. */
static void test_windows(void) {
  static const unsigned w[6] = {2, AVG_WINDOW_MAX, 4, 17, 1, 40};
  scen s = scen_make(6, 300007, 11);
  s.pf = 1000;
  net *ref = run_check(&s, 0);
  for (size_t i = 0; i < 6; i++)
    s.windows[i] = w[i];
  s.jitter_us = 20000;
  net *n = run_check(&s, 0);
  for (size_t i = 0; i < s.N; i++) {
    ASSERT_UEQ(n->p[i].by_k[s.N], s.P);
    ASSERT(memcmp(n->p[i].x, ref->p[i].x, s.P * sizeof(float)) == 0);
  }
  net_free(n);
  net_free(ref);
}

/* The same inputs under shuffled arrivals and jobs run late in random
 * order (or on threads) give the same bits as in order. */
static void test_shuffled(void) {
  scen s = scen_make(6, 50021, 7);
  s.pf = 1000;
  s.window = 3;
  net *ref = run_check(&s, 0);
  for (int run = 0; run < 6; run++) {
    scen t = s;
    t.jitter_us = 40000; /* far beyond a part's time: arrival order is random */
    t.jobs = run < 3 ? JOBS_DEFERRED : run < 5 ? JOBS_INLINE : JOBS_THREADS;
    t.sender_ms = 3000;
    t.reducer_ms = 8000;
    net *n = net_new(&t);
    n->rng ^= (uint64_t)run * 7919; /* other jitter, the same data */
    net_run(n);
    check_round(n, 0);
    for (size_t i = 0; i < s.N; i++)
      ASSERT(memcmp(n->p[i].x, ref->p[i].x, s.P * sizeof(float)) == 0);
    net_free(n);
  }
  net_free(ref);
}

/* Lossy codecs: bit for bit as the reference, within the bound of the
 * exact mean, every member the same; with and without error feedback. */
static void test_codecs(void) {
  for (int c = AVG_FP16; c < AVG_CODEC_COUNT; c++)
    for (int ef = 0; ef < 2; ef++) {
      scen s = scen_make(5, 30011, 50 + (uint64_t)c);
      s.codec = (avg_codec)c;
      s.ef = ef;
      s.jobs = ef ? JOBS_DEFERRED : JOBS_INLINE;
      net *n = run_check(&s, 0);
      for (size_t i = 1; i < s.N; i++)
        ASSERT(memcmp(n->p[i].x, n->p[0].x, s.P * sizeof(float)) == 0);
      if (ef) {
        /* The residual of each part sent is the reference's; the own
         * span's stays as it was. */
        float *res = xmalloc(s.pf * sizeof *res), *tmp = xmalloc(s.pf * 4);
        for (size_t i = 0; i < s.N; i++)
          for (size_t j = 0; j < s.N; j++) {
            const avg_span_info *sp = &n->p[i].spans[j];
            for (size_t at = 0; at < sp->len; at += s.pf) {
              size_t off = sp->start + at;
              size_t len = sp->len - at < s.pf ? sp->len - at : s.pf;
              if (i == j) {
                ASSERT(memcmp(n->p[i].res + off, n->p[i].res0 + off, len * 4) ==
                       0);
                continue;
              }
              sent_values(n, i, off, len, tmp, res);
              ASSERT(memcmp(n->p[i].res + off, res, len * 4) == 0);
            }
          }
        free(res);
        free(tmp);
      }
      net_free(n);
    }
}

/* Zero weights, CLIENT and AUX members. */
static void test_modes(void) {
  scen s = scen_make(7, 40009, 9);
  s.modes[1] = AVG_MODE_CLIENT;
  s.modes[4] = AVG_MODE_CLIENT;
  s.modes[2] = AVG_MODE_AUX;
  s.modes[6] = AVG_MODE_AUX;
  s.weight[3] = 0;
  s.weight[4] = 0; /* a client with no samples still gets the mean */
  s.jobs = JOBS_DEFERRED;
  net *n = run_check(&s, 0);
  const avg_span_info *sp = n->p[0].spans;
  ASSERT(sp[1].len == 0 && sp[4].len == 0 && sp[2].len > 0 && sp[6].len > 0);
  for (size_t i = 0; i < 7; i++) {
    /* Averaged by the three with samples; AUX reports its own span. */
    bool aux = s.modes[i] == AVG_MODE_AUX;
    ASSERT_UEQ(n->p[i].by_k[3], aux ? n->p[i].spans[i].len : s.P);
    ASSERT(!aux || (n->p[i].spans[i].averaged && n->p[i].payload_sent > 0));
  }
  net_free(n);
  /* Nobody has samples: every member keeps its own values. */
  for (size_t i = 0; i < 7; i++)
    s.weight[i] = 0;
  n = run_check(&s, 0);
  for (size_t i = 0; i < 7; i++)
    if (s.modes[i] != AVG_MODE_AUX) {
      ASSERT_UEQ(n->p[i].by_k[0], s.P);
      ASSERT_UEQ(n->p[i].payload_sent, 0);
    }
  net_free(n);
}

/* A member killed at a random time: the others finish before the
 * deadline, each span averaged over the contributions its owner took or
 * left as it was, the dead member's span local unless it had finished. */
static void test_kill(void) {
  static const size_t sizes[] = {2, 3, 4, 8};
  size_t before = 0, mid_send = 0, mid_reduce = 0, after = 0, local = 0;
  for (size_t a = 0; a < 4; a++) {
    size_t N = sizes[a];
    scen s = scen_make(N, 20000 * N + 333, 1000 + N);
    s.pf = 1024;
    s.window = 2;
    for (size_t i = 0; i < N; i++)
      s.bw[i] = 100; /* 100 MB/s: a round takes tens of ms */
    /* How long the round takes without failures, and how many parts and
     * results each member sends. */
    net *n = run_check(&s, 0);
    uint64_t T = 0, parts[NMAX], results[NMAX];
    for (size_t i = 0; i < N; i++) {
      T = n->p[i].ms > T ? n->p[i].ms : T;
      parts[i] = n->p[i].parts_out;
      results[i] = n->p[i].results_out;
    }
    net_free(n);
    for (uint64_t seed = 0; seed < 10; seed++) {
      uint64_t rng = seed * 1000 + N;
      s.seed = 2000 + seed;
      s.jobs = seed % 3 == 0 ? JOBS_DEFERRED : JOBS_INLINE;
      s.free_in_cb = seed % 2;
      s.kill = (size_t)test_rng_below(&rng, N);
      /* Before it sends anything, then anywhere in the round. */
      s.kill_us = seed == 0 ? 0 : test_rng_below(&rng, T * 1000);
      n = run_check(&s, 0);
      const peer *v = &n->p[s.kill];
      before += v->parts_out == 0;
      mid_send += v->parts_out > 0 && v->parts_out < parts[s.kill];
      mid_reduce += v->results_out > 0 && v->results_out < results[s.kill];
      after += v->results_out == results[s.kill];
      for (size_t i = 0; i < N; i++)
        if (i != s.kill) {
          /* The dead member was dropped, unless it had done its part. */
          ASSERT(n->p[i].members[s.kill].dropped != AVG_DROP_NONE ||
                 n->p[i].spans[s.kill].averaged);
          if (v->results_out < results[s.kill])
            ASSERT(!n->p[i].spans[s.kill].averaged);
          local += !n->p[i].spans[s.kill].averaged;
        }
      net_free(n);
    }
  }
  printf("kill: %zu before sending, %zu mid-send, %zu mid-reduce, %zu after "
         "reducing; the dead member's span local at %zu survivors\n",
         before, mid_send, mid_reduce, after, local);
  ASSERT(before >= 3 && mid_send >= 3 && mid_reduce >= 3);
}

/* A member that stops sending (its parts are lost) but still reduces, and
 * one that stops reducing (its results are lost) but still sends. */
static void test_half_dead(void) {
  for (int kind = T_MUTE; kind <= T_NO_RESULT; kind++) {
    scen s = scen_make(5, 60000, 300 + (uint64_t)kind);
    s.tamper = 2;
    s.tamper_kind = kind;
    net *n = net_new(&s);
    net_run(n);
    for (size_t i = 0; i < s.N; i++) {
      const peer *p = &n->p[i];
      ASSERT_RC(p->status, 0);
      if (i == 2)
        continue;
      ASSERT_EQ(p->members[2].dropped, kind == T_MUTE
                                           ? AVG_DROP_SENDER_TIMEOUT
                                           : AVG_DROP_REDUCER_TIMEOUT);
      /* A member that stops sending may have finished reducing first. */
      if (kind == T_NO_RESULT)
        ASSERT(!p->spans[2].averaged);
      for (size_t j = 0; j < s.N; j++)
        if (j != 2)
          ASSERT(p->spans[j].averaged);
    }
    /* The survivors' spans hold their four contributions. */
    n->p[2].dead = true;
    check_round(n, 0);
    n->p[2].dead = false;
    net_free(n);
  }
}

/* Reads what the round logged while fn ran. */
static char *capture(void (*fn)(net **), net **n) {
  char path[] = "/tmp/beed-round-log-XXXXXX";
  int fd = mkstemp(path), saved = dup(2);
  ASSERT(fd >= 0 && saved >= 0);
  fflush(stderr);
  dup2(fd, 2);
  int level = bee_log_get_level();
  bee_log_set_level(BEE_LOG_WARN);
  fn(n);
  bee_log_set_level(level);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  FILE *f = fopen(path, "r");
  ASSERT(f);
  static char text[1 << 16];
  size_t got = fread(text, 1, sizeof text - 1, f);
  text[got] = 0;
  fclose(f);
  close(fd);
  unlink(path);
  return text;
}

static scen corrupt_scen;
static void run_corrupt(net **n) {
  *n = net_new(&corrupt_scen);
  net_run(*n);
}

/* Corrupt contributions are refused, with a log line naming the sender,
 * and the means go on without them. */
static void test_corrupt(void) {
  for (int kind = T_NAN; kind <= T_CODEC; kind++) {
    scen s = scen_make(4, 30000, 400 + (uint64_t)kind);
    s.tamper = 1;
    s.tamper_kind = kind;
    corrupt_scen = s;
    net *n;
    char *log = capture(run_corrupt, &n);
    ASSERT(strstr(log, "contribution of member 1 (peer-1)"));
    ASSERT(strstr(log, "refused"));
    check_round(n, 0);
    for (size_t i = 0; i < 4; i++)
      if (i != 1) {
        ASSERT_GT(n->p[i].members[1].refused, 0);
        ASSERT(n->p[i].spans[1].averaged); /* the sender's own span is fine */
        ASSERT_EQ(n->p[i].members[1].dropped, AVG_DROP_NONE);
      }
    net_free(n);
  }
}

/* A contribution with a huge norm is scaled down (or dropped) by the clip
 * rule, part by part, against the median of the part's norms. */
static void test_clip(void) {
  for (int mode = AVG_CLIP_SCALE; mode <= AVG_CLIP_DROP; mode++) {
    scen s = scen_make(6, 25000, 500 + (uint64_t)mode);
    s.scale[4] = 1e6;
    s.clip_mode = (avg_clip_mode)mode;
    s.clip = 3;
    net *n = run_check(&s, 0);
    for (size_t i = 0; i < s.N; i++)
      if (i != 4 && n->p[i].spans[i].len > 0)
        ASSERT_EQ(n->p[i].members[4].clipped,
                  (int64_t)((n->p[i].spans[i].len + s.pf - 1) / s.pf));
    /* The mean stays at the scale of the others. */
    float worst = 0;
    for (size_t t = 0; t < s.P; t++)
      worst = fabsf(n->p[0].x[t]) > worst ? fabsf(n->p[0].x[t]) : worst;
    ASSERT(worst < 100);
    net_free(n);
  }
}

/* A small link queue: sends meet BEE_EQUEUE and wait for the drain. */
static void test_backpressure(void) {
  scen s = scen_make(5, 70001, 600);
  s.link_cap = 6000; /* about one part */
  s.window = 3;
  net *n = run_check(&s, 0);
  uint64_t equeues = 0;
  for (size_t i = 0; i < s.N; i++)
    equeues += n->p[i].equeues;
  ASSERT_GT(equeues, 20);
  net_free(n);
}

/* Bytes sent per member: 2 (N - 1) / N x payload x ratio within 2%,
 * message headers and the transport's overhead included. */
static void test_bytes(void) {
  static const avg_codec codecs[] = {AVG_NONE, AVG_FP16, AVG_B8};
  static const double ratio[] = {1, 0.5, 0.25};
  for (size_t N = 4; N <= 8; N += 4)
    for (size_t c = 0; c < 3; c++) {
      /* A few million floats once. */
      size_t P = N == 4 && c == 0 ? 3000017 : 1000003;
      scen s = scen_make(N, P, 700 + N + c);
      s.pf = AVG_PART_FLOATS;
      s.codec = codecs[c];
      net *n = net_new(&s);
      net_run(n);
      /* The reference costs more than the round: once is enough here
       * (every codec is checked on smaller rounds above). */
      if (c == 0 || !TEST_ASAN)
        check_round(n, 0);
      double want =
          2.0 * (double)(N - 1) / (double)N * 4.0 * (double)P * ratio[c];
      double lo = 1e30, hi = 0, mean = 0;
      for (size_t i = 0; i < N; i++) {
        double q = (double)n->p[i].bytes_sent / want;
        lo = q < lo ? q : lo;
        hi = q > hi ? q : hi;
        mean += q / (double)N;
        ASSERT(fabs(q - 1) <= 0.02);
      }
      printf("bytes: N=%zu P=%zu %-4s: bytes sent / (2(N-1)/N x 4P x r) = "
             "%.5f .. %.5f (mean %.5f), headers %.0f bytes per message\n",
             N, P, avg_codec_name(codecs[c]), lo, hi, mean,
             (double)(n->p[0].bytes_sent - n->p[0].payload_sent) /
                 (double)n->p[0].msgs_sent);
      net_free(n);
    }
}

/* The deadline cuts a round short: every span is averaged or local. */
static void test_deadline(void) {
  scen s = scen_make(4, 40000, 800);
  s.bw[3] = 0.05; /* member 3's uplink: 50 kB/s */
  s.sender_ms = 5000;
  s.reducer_ms = 10000;
  s.deadline_ms = 1500;
  net *n = net_new(&s);
  net_run(n);
  for (size_t i = 0; i < 4; i++) {
    ASSERT_RC(n->p[i].status, BEE_ETIMEOUT);
    ASSERT(n->p[i].ms >= 1500 && n->p[i].ms < 2600);
  }
  n->p[3].dead = true; /* its contributions count for no part */
  s.kill = 3;
  n->s.kill = 3;
  check_round(n, BEE_ETIMEOUT);
  net_free(n);
}

/* A member that begins 2 s after the others (a group formed ahead whose
 * buffer comes late), sender timeout 300 ms: its WAITs every 100 ms keep
 * it in, and the round is exact over all three; without them the others
 * drop it at their sender timeout.  Each way with every member late once
 * and with deferred jobs. */
static void test_late(void) {
  for (size_t late = 0; late < 3; late++)
    for (int waits = 0; waits < 2; waits++) {
      scen s = scen_make(3, 30000, 3100 + late);
      s.jobs = late == 1 ? JOBS_DEFERRED : JOBS_INLINE;
      s.late = late;
      s.late_us = 2000000;
      s.wait_us = waits ? 100000 : 0;
      net *n = net_new(&s);
      net_run(n);
      if (waits) {
        check_round(n, 0);
        for (size_t i = 0; i < 3; i++)
          if (i != late) /* it waited for the late one */
            ASSERT_GE(n->p[i].ms, 2000);
      } else {
        for (size_t i = 0; i < 3; i++)
          if (i != late)
            ASSERT_EQ(n->p[i].members[late].dropped,
                      AVG_DROP_SENDER_TIMEOUT);
      }
      net_free(n);
    }
}

static int cb_calls;
static int cb_status;
static void count_cb(avg_round *r, const avg_round_summary *s, void *arg) {
  (void)r, (void)arg;
  cb_calls++;
  cb_status = s->status;
}
static uint64_t fixed_now(void *ctx) { return *(uint64_t *)ctx; }
static int sink(void *ctx, size_t m, const uint8_t *p, size_t n) {
  (void)ctx, (void)m, (void)p, (void)n;
  return 0;
}

static void test_api(void) {
  uint64_t t = 1000;
  avg_io io = {.ctx = &t, .now_ms = fixed_now, .send = sink};
  avg_mode modes[4] = {AVG_MODE_NODE, AVG_MODE_NODE, AVG_MODE_CLIENT,
                       AVG_MODE_AUX};
  float x[5000];
  for (size_t i = 0; i < 5000; i++)
    x[i] = (float)i;
  avg_round_config c;
  avg_round_config_default(&c);
  c.nmembers = 4;
  c.modes = modes;
  c.x = x;
  c.n = 5000;
  c.weight = 1;
  c.part_floats = 1000;
  avg_round *r;
  avg_round_config b;
#define BAD(set, code)                                                         \
  do {                                                                         \
    b = c, set;                                                                \
    ASSERT_RC(avg_round_new(&b, &io, &r), code);                               \
  } while (0)
  avg_mode clients[4] = {AVG_MODE_CLIENT, AVG_MODE_CLIENT, AVG_MODE_CLIENT,
                         AVG_MODE_CLIENT};
  BAD(b.nmembers = 0, BEE_ERANGE);
  BAD(b.nmembers = AVG_GROUP_MAX + 1, BEE_ETOOBIG);
  BAD(b.self = 4, BEE_ERANGE);
  BAD(b.weight = NAN, BEE_ERANGE);
  BAD(b.weight = -1, BEE_ERANGE);
  BAD(b.x = NULL, BEE_ERANGE);
  BAD(b.window = AVG_WINDOW_MAX + 1, BEE_ERANGE);
  BAD(b.part_floats = PROTO_AVG_DATA_MAX, BEE_ERANGE);
  BAD(b.reducer_timeout_ms = b.sender_timeout_ms - 1, BEE_ERANGE);
  BAD(b.codec = AVG_CODEC_COUNT, BEE_ERANGE);
  BAD(b.modes = clients, BEE_ERANGE); /* nobody reduces */
#undef BAD
  b = c, b.self = 3, b.x = NULL; /* AUX needs no buffer */
  ASSERT_OK(avg_round_new(&b, &io, &r));
  avg_round_free(r);
  avg_round_free(NULL);

  /* Messages the round must refuse. */
  ASSERT_OK(avg_round_new(&c, &io, &r));
  uint8_t buf[8192];
  size_t len;
  float part[1000] = {0};
  proto_avg_msg m = {.type = PROTO_T_AVG_PART,
                     .sender = 1,
                     .part = 0,
                     .codec = AVG_NONE,
                     .weight = 1,
                     .has_data = true,
                     .data = {(const uint8_t *)part, sizeof part}};
  memcpy(m.group, c.group, sizeof m.group);
  ASSERT_OK(proto_avg_encode(&m, buf, sizeof buf, &len));
  int lvl = bee_log_get_level();
  bee_log_set_level(BEE_LOG_ERROR);
  ASSERT_RC(avg_round_handle(r, 4, buf, len), BEE_ERANGE); /* no such member */
  ASSERT_RC(avg_round_handle(r, 0, buf, len), BEE_ERANGE); /* ourselves */
  ASSERT_RC(avg_round_handle(r, 2, buf, len), BEE_EAUTH);  /* sender field */
  ASSERT_RC(avg_round_handle(r, 1, buf, len - 1), BEE_ETRUNCATED);
  ASSERT_RC(avg_round_handle(r, 3, buf, len), BEE_ERANGE); /* AUX sends none */
  m.group[0] ^= 1;
  ASSERT_OK(proto_avg_encode(&m, buf, sizeof buf, &len));
  ASSERT_RC(avg_round_handle(r, 1, buf, len), BEE_ESTALE);
  m.group[0] ^= 1;
  m.part = 99; /* not ours: beyond the buffer */
  ASSERT_OK(proto_avg_encode(&m, buf, sizeof buf, &len));
  ASSERT_RC(avg_round_handle(r, 1, buf, len), BEE_ERANGE);
  {
    /* An owner takes AVG_WINDOW_MAX parts ahead of its head from a
     * sender, whatever its own window: each member sizes its window from
     * its own links, so a sender's may be larger than ours. */
    avg_round_config w = c;
    avg_round *r2;
    w.window = 2;
    w.part_floats = 16; /* our span holds more than AVG_WINDOW_MAX parts */
    ASSERT_OK(avg_round_new(&w, &io, &r2));
    proto_avg_msg m2 = m;
    m2.data.n = 16 * sizeof(float);
    m2.part = AVG_WINDOW_MAX; /* beyond what we take ahead */
    ASSERT_OK(proto_avg_encode(&m2, buf, sizeof buf, &len));
    ASSERT_RC(avg_round_handle(r2, 1, buf, len), BEE_ELIMIT);
    m2.part = AVG_WINDOW_MAX - 1; /* far beyond our window of 2, taken */
    ASSERT_OK(proto_avg_encode(&m2, buf, sizeof buf, &len));
    ASSERT_OK(avg_round_handle(r2, 1, buf, len));
    avg_round_free(r2);
  }
  m.part = 1; /* within: taken before the start */
  ASSERT_OK(proto_avg_encode(&m, buf, sizeof buf, &len));
  ASSERT_OK(avg_round_handle(r, 1, buf, len));
  ASSERT_RC(avg_round_handle(r, 1, buf, len), BEE_ERANGE); /* twice */
  m.type = PROTO_T_AVG_RESULT, m.part = 3, m.contributors = 1;
  ASSERT_OK(proto_avg_encode(&m, buf, sizeof buf, &len));
  /* member 1 owns parts 3..; we have sent none of them */
  ASSERT_RC(avg_round_handle(r, 1, buf, len), BEE_ERANGE);
  bee_log_set_level(lvl);
  /* Freed before the start: no callback was promised. */
  avg_round_free(r);

  /* Started, then freed: the callback says canceled, x is as it was. */
  cb_calls = 0;
  ASSERT_OK(avg_round_new(&c, &io, &r));
  ASSERT_OK(avg_round_start(r, count_cb, NULL));
  ASSERT_RC(avg_round_start(r, count_cb, NULL), BEE_ERANGE);
  ASSERT_EQ(cb_calls, 0); /* never inside start */
  avg_round_tick(r);
  bee_log_set_level(BEE_LOG_ERROR);
  avg_round_free(r);
  bee_log_set_level(lvl);
  ASSERT_EQ(cb_calls, 1);
  ASSERT_RC(cb_status, BEE_ECANCELED);
  for (size_t i = 0; i < 5000; i++)
    ASSERT(x[i] == (float)i);

  /* A group of one completes at its first tick, with its own mean. */
  c.nmembers = 1;
  c.weight = 3;
  cb_calls = 0;
  ASSERT_OK(avg_round_new(&c, &io, &r));
  ASSERT_OK(avg_round_start(r, count_cb, NULL));
  ASSERT_EQ(cb_calls, 0);
  ASSERT_UEQ(avg_round_tick(r), UINT64_MAX);
  ASSERT_EQ(cb_calls, 1);
  ASSERT_RC(cb_status, 0);
  for (size_t i = 0; i < 5000; i++)
    ASSERT(x[i] == (3.0f * (float)i) / 3.0f);
  avg_round_free(r);
}

/* Rounds with failures in a loop: no leak (ASan's leak check) and no
 * growth of the resident set. */
static void test_loop(void) {
  long rss_warm = 0;
  uint64_t rng = 4242;
  for (int round = 0; round < 200; round++) {
    size_t N = 3 + (size_t)test_rng_below(&rng, 4);
    scen s =
        scen_make(N, 3000 + (size_t)test_rng_below(&rng, 6000), 5000 + round);
    s.pf = 700;
    s.window = 1 + (unsigned)test_rng_below(&rng, 3);
    s.codec = (avg_codec)test_rng_below(&rng, AVG_CODEC_COUNT);
    s.jobs = (int)test_rng_below(&rng, 2);
    s.free_in_cb = round % 2;
    s.link_cap = round % 3 == 0 ? 4000 : 0;
    s.kill = (size_t)test_rng_below(&rng, N + 1); /* N: nobody */
    if (s.kill == N)
      s.kill = NONE;
    s.kill_us = test_rng_below(&rng, 30000);
    if (round % 5 == 0) {
      s.tamper = (size_t)test_rng_below(&rng, N);
      s.tamper_kind = (int)(1 + test_rng_below(&rng, 5));
      if (s.tamper == s.kill)
        s.tamper = NONE;
    }
    net *n = net_new(&s);
    net_run(n);
    for (size_t i = 0; i < N; i++)
      if (!n->p[i].dead)
        ASSERT_RC(n->p[i].status, 0);
    net_free(n);
    if (round == 40 || round == 199) {
      struct rusage ru;
      getrusage(RUSAGE_SELF, &ru);
      if (round == 40) {
        rss_warm = ru.ru_maxrss;
      } else if (!TEST_ASAN) {
        printf("loop: peak RSS %ld KiB after 40 rounds, %ld KiB after 200\n",
               rss_warm, ru.ru_maxrss);
        ASSERT_LT(ru.ru_maxrss - rss_warm, 2048); /* KiB */
      }
    }
  }
}

static double seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
  bee_log_set_level(getenv("BEE_TEST_VERBOSE") ? BEE_LOG_DEBUG : BEE_LOG_ERROR);
  struct {
    const char *name;
    void (*fn)(void);
  } tests[] = {
      /* loop first: its RSS check reads the peak, which the big
       * allocations below would set */
      {"loop", test_loop},           {"api", test_api},
      {"exact", test_exact},         {"unequal", test_unequal},
      {"windows", test_windows},
      {"shuffled", test_shuffled},   {"codecs", test_codecs},
      {"modes", test_modes},         {"kill", test_kill},
      {"half_dead", test_half_dead}, {"corrupt", test_corrupt},
      {"clip", test_clip},           {"backpressure", test_backpressure},
      {"bytes", test_bytes},         {"deadline", test_deadline},
      {"late", test_late},
  };
  for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
    if (argc > 1 && strcmp(argv[1], tests[i].name) != 0)
      continue; /* one test by name, when debugging */
    double t0 = seconds();
    tests[i].fn();
    printf("%-12s ok  %.2f s\n", tests[i].name, seconds() - t0);
    fflush(stdout);
  }
  return 0;
}
