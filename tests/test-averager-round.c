/* test-averager-round.c: the butterfly round's results, on the
 * simulated network of roundsim.h.
 *
 * Every result is checked against a reference built from the public
 * codec and mean functions, part by part, in member order: bit for bit
 * for every codec (the round adopts what the receivers decode), and
 * against the exact mean in double within the codecs' documented bounds;
 * for every group size, unequal weights, windows, shuffled jobs, member
 * modes, the clip rule and the bytes each member sends; and the API's
 * edges.  Failures are test-averager-round-fail.c's.
 */
#include "roundsim.h"
#include "test.h"
#include "testlib.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int main(int argc, char **argv) {
  static const rs_test tests[] = {
      {"api", test_api},         {"exact", test_exact},
      {"unequal", test_unequal}, {"windows", test_windows},
      {"shuffled", test_shuffled}, {"codecs", test_codecs},
      {"modes", test_modes},     {"clip", test_clip},
      {"bytes", test_bytes},
  };
  return rs_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
