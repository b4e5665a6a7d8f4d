/* test-averager-round-fail.c: the butterfly round when members fail, on
 * the simulated network of roundsim.h.
 *
 * Failures (members killed at random times, a member that stops sending
 * or reducing, corrupt or huge contributions, full link queues,
 * deadlines, a member that begins late without saying WAIT) must leave
 * every span of every survivor either averaged over the contributions the
 * owner reports or exactly as it was (check_round); 200 rounds with
 * failures leak nothing and do not grow the resident set.
 */
#include "roundsim.h"
#include "test.h"
#include "testlib.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

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

/* A member killed mid-round, the others' timeouts 20 s: told that its
 * connection closed (avg_round_gone), they drop it at once and end the
 * round within milliseconds of the kill; not told, they wait out a
 * timeout.  Either way its span stays local unless it had done it, and
 * the rest is averaged (check_round). */
static void test_gone(void) {
  size_t told_ok = 0;
  uint64_t told_ms = 0, untold_ms = UINT64_MAX;
  for (uint64_t seed = 0; seed < 8; seed++) {
    for (int told = 0; told < 2; told++) {
      scen s = scen_make(4, 80000, 700 + seed);
      s.pf = 1024;
      s.window = 2;
      for (size_t i = 0; i < s.N; i++)
        s.bw[i] = 100;
      s.sender_ms = s.reducer_ms = 20000;
      s.deadline_ms = 60000;
      s.kill = 1 + seed % 3;
      s.kill_us = 2000 + seed * 1500; /* mid-round: it lasts about 10 ms */
      s.gone = told;
      net *n = run_check(&s, 0);
      for (size_t i = 0; i < s.N; i++) {
        const peer *p = &n->p[i];
        if (i == s.kill)
          continue;
        if (told) {
          ASSERT(p->members[s.kill].dropped == AVG_DROP_CLOSED ||
                 p->spans[s.kill].averaged);
          told_ms = p->ms > told_ms ? p->ms : told_ms;
          told_ok += p->members[s.kill].dropped == AVG_DROP_CLOSED;
        } else {
          untold_ms = p->ms < untold_ms ? p->ms : untold_ms;
        }
      }
      net_free(n);
    }
  }
  printf("gone: a member killed mid-round, dropped as its connection closed "
         "by %zu survivors, every round over in %" PRIu64 " ms (not told: "
         "%" PRIu64 " ms at the least, the timeouts)\n",
         told_ok, told_ms, untold_ms);
  ASSERT_GT(told_ok, 0);
  ASSERT_LT(told_ms, 1000);
  ASSERT_GE(untold_ms, 20000);
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

int main(int argc, char **argv) {
  static const rs_test tests[] = {
      /* loop first: its RSS check reads the peak, which later tests'
       * allocations would set */
      {"loop", test_loop},         {"kill", test_kill},
      {"gone", test_gone},         {"half_dead", test_half_dead},
      {"corrupt", test_corrupt},   {"backpressure", test_backpressure},
      {"deadline", test_deadline}, {"late", test_late},
  };
  return rs_main(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
