/* roundsim.h: the butterfly round (averager/round.c) on a simulated
 * network, for test-averager-round and test-averager-round-fail.
 *
 * Up to 16 members run avg_round in one process over a fake network: each
 * member's uplink serializes its messages at its own rate, each link adds
 * a latency and optional jitter (which reorders messages), a link's queue
 * can be capped so that sends meet BEE_EQUEUE, and the clock is fake.
 * Jobs run inline, deferred to random later times in random order, or on
 * two real worker threads.  check_round compares every survivor's result
 * with a reference built from the public codec and mean functions, part by
 * part, in member order.
 */
#ifndef BEE_TESTS_ROUNDSIM_H
#define BEE_TESTS_ROUNDSIM_H

#include "averager.h"

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define NMAX 16
#define NONE SIZE_MAX

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
  /* and the others told at once (avg_round_gone), as when its connection
   * closes */
  bool gone;
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


/* malloc that fails the test when it fails. */
void *xmalloc(size_t n);
/* A scenario of N members and P floats: defaults a test changes. */
scen scen_make(size_t N, size_t P, uint64_t seed);
/* The members' rounds over the fake network, not started. */
net *net_new(const scen *s);
/* Starts every member (the late one at late_us) and runs until every
 * live member has its callback. */
void net_run(net *n);
void net_free(net *n);
/* What member m sends for the floats [off, off + len) of a part: its
 * values through the codec, with error feedback from its original
 * residual (into res, when given). */
void sent_values(const net *n, size_t m, size_t off, size_t len, float *out,
                 float *res);
/* Checks every survivor: status, and each span either averaged (bit for
 * bit as the reference, within the bound of the exact mean) or exactly as
 * it was, as its summary says.  Returns the number of spans averaged. */
size_t check_round(const net *n, int want_status);
/* Runs a scenario and checks it; returns the net for more checks. */
net *run_check(const scen *s, int want_status);

/* A test's name and body; rs_main runs them in order, or the one named
 * by argv[1], timing each. */
typedef struct rs_test {
  const char *name;
  void (*fn)(void);
} rs_test;
int rs_main(int argc, char **argv, const rs_test *tests, size_t n);

#endif
