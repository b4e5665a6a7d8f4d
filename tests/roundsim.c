/* roundsim.c: the simulated network and the reference of roundsim.h. */
#include "roundsim.h"
#include "test.h"
#include "testlib.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- randomness -------------------------------------------------------- */

static double rng_normal(uint64_t *s) {
  double u = test_rng_unit(s) + 0x1p-54, v = test_rng_unit(s);
  return sqrt(-2 * log(u)) * cos(2 * M_PI * v);
}

void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  ASSERT(p);
  return p;
}


/* ---- a scenario -------------------------------------------------------- */

scen scen_make(size_t N, size_t P, uint64_t seed) {
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

net *net_new(const scen *s) {
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

void net_run(net *n) {
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
    if (n->s.kill < n->s.N && n->s.kill_us <= n->now && !n->p[n->s.kill].dead) {
      n->p[n->s.kill].dead = true;
      for (size_t i = 0; i < n->s.N && n->s.gone; i++)
        if (i != n->s.kill && n->p[i].r && !n->p[i].done)
          avg_round_gone(n->p[i].r, n->s.kill);
    }
    while (n->nheap && n->heap[0].at <= n->now)
      process(n, pop(n));
    for (size_t i = 0; i < n->s.N; i++)
      if (!n->p[i].dead && n->p[i].next_tick <= n->now)
        tick(&n->p[i]);
  }
}

void net_free(net *n) {
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
void sent_values(const net *n, size_t m, size_t off, size_t len,
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
size_t check_round(const net *n, int want_status) {
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
net *run_check(const scen *s, int want_status) {
  net *n = net_new(s);
  net_run(n);
  check_round(n, want_status);
  return n;
}


/* ---- running tests ----------------------------------------------------- */

static double seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int rs_main(int argc, char **argv, const rs_test *tests, size_t n) {
  bee_log_set_level(getenv("BEE_TEST_VERBOSE") ? BEE_LOG_DEBUG : BEE_LOG_ERROR);
  for (size_t i = 0; i < n; i++) {
    if (argc > 1 && strcmp(argv[1], tests[i].name) != 0)
      continue; /* one test by name, when debugging */
    double t0 = seconds();
    tests[i].fn();
    printf("%-12s ok  %.2f s\n", tests[i].name, seconds() - t0);
    fflush(stdout);
  }
  return 0;
}
