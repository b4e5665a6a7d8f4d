/* test-averager-node.c: matchmaking and the round over real connections.
 *
 * N members (2 to 16), each a proto_host with an avg_node, on one libuv
 * loop in this process, over loopback, moderated and encrypted as in
 * production.  The DHT is a table in this process that answers a read a
 * few milliseconds later.  Each case starts every member at once and
 * checks that one group of N forms, that every member ends with the same
 * bits, and that they are the weighted mean of the inputs within fp32
 * rounding; then that a member whose host dies mid-round leaves the others
 * with a result that is, span by span, averaged or their own.
 */
#include "averager-int.h"
#include "test.h"
#include "testlib.h"

#include <math.h>
#include <sys/resource.h>
#include <time.h>

#define NMAX 16

static uv_loop_t *loop;
static proto_identity moderator;

typedef struct member {
  test_node tn;
  proto_host *h;
  int port;
  avg_node *node;
  float *x, *x0;
  double weight;
  bool done;
  int status;
  size_t nmembers;
  size_t by_all; /* floats averaged over every member */
  size_t by_k[NMAX + 1];
  uint64_t bytes_sent, payload_sent;
  uint64_t ms;
  double weights[NMAX]; /* each member's weight, as the round saw it */
  int dropped[NMAX];    /* and why it dropped each (AVG_DROP_*) */
  uint8_t ids[NMAX][PROTO_ID_BYTES]; /* the group's members, in order */
  /* avg_node_match: the group that formed */
  bool matched;
  avg_group g;
  proto_group_member gm[NMAX];
} member;

static member mem[NMAX];
static int nmem;

/* ---- the DHT: a table, read back after a few milliseconds -------------- */

typedef struct decl {
  char key[128];
  avg_decl d;
} decl;
static decl table[256];
static size_t ntable;

typedef struct fetch {
  uv_timer_t t;
  avg_node *node;
  char key[128];
} fetch;

static void key_of(const proto_match *i, char *out, size_t cap) {
  snprintf(out, cap, "%s.avg.%" PRIu64 ".%s", i->run, i->round, i->bits);
}

static void dht_declare(void *ctx, const proto_match *info, uint64_t exp) {
  member *m = ctx;
  char key[128];
  key_of(info, key, sizeof key);
  for (size_t i = 0; i < ntable; i++)
    if (strcmp(table[i].key, key) == 0 &&
        memcmp(table[i].d.id, m->tn.id.id, PROTO_ID_BYTES) == 0) {
      table[i].d.expiration = exp;
      table[i].d.info = *info;
      return;
    }
  ASSERT(ntable < sizeof table / sizeof table[0]);
  decl *d = &table[ntable++];
  snprintf(d->key, sizeof d->key, "%s", key);
  memcpy(d->d.id, m->tn.id.id, PROTO_ID_BYTES);
  d->d.expiration = exp;
  d->d.info = *info;
}

static void fetch_closed(uv_handle_t *h) { free(h->data); }

static void fetch_fire(uv_timer_t *t) {
  fetch *f = t->data;
  avg_decl v[256];
  size_t n = 0;
  uint64_t now = (uint64_t)time(NULL);
  for (size_t i = 0; i < ntable; i++)
    if (strcmp(table[i].key, f->key) == 0 && table[i].d.expiration > now)
      v[n++] = table[i].d;
  for (int i = 0; i < nmem; i++)
    if (mem[i].node == f->node) /* still alive */
      avg_node_declared(f->node, v, n);
  uv_close((uv_handle_t *)&f->t, fetch_closed);
}

static void dht_fetch(void *ctx, avg_node *node, const proto_match *info) {
  (void)ctx;
  fetch *f = calloc(1, sizeof *f);
  ASSERT(f);
  f->node = node;
  key_of(info, f->key, sizeof f->key);
  ASSERT_RC(uv_timer_init(loop, &f->t), 0);
  f->t.data = f;
  ASSERT_RC(uv_timer_start(&f->t, fetch_fire, 3, 0), 0);
}

/* ---- members ----------------------------------------------------------- */

static void on_drain(proto_conn *c, void *data) {
  member *m = data;
  if (m->node)
    avg_node_drain(m->node, c);
}

static void on_down(proto_conn *c, int status, void *data) {
  member *m = data;
  (void)status;
  if (m->node)
    avg_node_conn_down(m->node, c);
}

static void member_start(member *m) {
  uint64_t now = (uint64_t)time(NULL);
  test_node_init(&m->tn, &moderator, "test", PROTO_ROLE_BEE, now - 60,
                 now + 3600);
  proto_host_config hc;
  proto_host_config_default(&hc);
  hc.loop = loop;
  hc.auth = m->tn.auth;
  hc.on_drain = on_drain;
  hc.on_down = on_down;
  /* Every member dials from 127.0.0.1: the per-address handshake limit
   * (against floods from one host) would refuse most of a group of 16. */
  hc.max_pending_per_addr = 64;
  hc.data = m;
  ASSERT_RC(proto_host_new(&hc, &m->h), 0);
  ASSERT_RC(proto_host_listen(m->h, "127.0.0.1:0", &m->port), 0);
  avg_node_config nc = {
      .loop = loop,
      .host = m->h,
      .self_id = m->tn.id.id,
      .dht = {.ctx = m, .declare = dht_declare, .fetch = dht_fetch}};
  ASSERT_RC(avg_node_new(&nc, &m->node), 0);
}

static void member_stop(member *m) {
  avg_node_close(m->node);
  m->node = NULL;
  if (m->h)
    proto_host_close(m->h);
  m->h = NULL;
}

static void on_done(avg_node *n, const avg_node_result *r, void *arg) {
  member *m = arg;
  (void)n;
  ASSERT(!m->done);
  m->done = true;
  m->status = r->status;
  m->nmembers = r->group ? r->group->nmembers : 0;
  if (r->summary) {
    m->by_all = r->summary->floats_by_k[r->summary->nmembers];
    for (size_t k = 0; k <= r->summary->nmembers && k <= NMAX; k++)
      m->by_k[k] = r->summary->floats_by_k[k];
    m->bytes_sent = r->summary->bytes_sent;
    m->payload_sent = r->summary->payload_sent;
    m->ms = r->summary->ms;
    for (size_t k = 0; k < r->summary->nmembers && k < NMAX; k++) {
      m->weights[k] = r->summary->members[k].weight;
      m->dropped[k] = r->summary->members[k].dropped;
    }
  }
  if (r->group) {
    for (size_t k = 0; k < r->group->nmembers && k < NMAX; k++)
      memcpy(m->ids[k], r->group->members[k].id, PROTO_ID_BYTES);
  }
}

static bool all_done(void *arg) {
  (void)arg;
  for (int i = 0; i < nmem; i++)
    if (mem[i].h && !mem[i].done)
      return false;
  return true;
}

static uint64_t rng = 12345;
static double unit(void) { return test_rng_unit(&rng); }

static void request(member *m, int i, size_t n, uint64_t round,
                    avg_node_request *req) {
  avg_node_request_default(req);
  avg_match_config *mc = &req->match;
  snprintf(mc->info.run, sizeof mc->info.run, "node-test");
  mc->info.round = round;
  snprintf(mc->info.addr, sizeof mc->info.addr, "127.0.0.1:%d", m->port);
  memset(mc->info.schema_hash, 0x33, sizeof mc->info.schema_hash);
  mc->info.bandwidth_mbit = 100 + 10 * i;
  mc->info.weight = m->weight;
  mc->target_size = (size_t)nmem;
  mc->min_size = (size_t)nmem;
  mc->matchmaking_ms = 1500;
  mc->fetch_interval_ms = 200;
  mc->deadline_ms = 15000;
  req->round.x = m->x;
  req->round.n = n;
  req->round.weight = m->weight;
  req->round.part_floats = 16384; /* several parts per span */
}

/* ---- cases ------------------------------------------------------------- */

/* N fresh members with n random values each; member 1 has weight 0
 * when zero_weight, and the weights differ otherwise. */
static void members_new(int N, size_t n, bool zero_weight) {
  nmem = N;
  ntable = 0;
  for (int i = 0; i < N; i++) {
    member *m = &mem[i];
    memset(m, 0, sizeof *m);
    member_start(m);
    m->x = malloc(n * sizeof *m->x);
    m->x0 = malloc(n * sizeof *m->x0);
    ASSERT(m->x && m->x0);
    for (size_t j = 0; j < n; j++)
      m->x[j] = m->x0[j] = (float)(unit() * 4 - 1);
    m->weight = zero_weight && i == 1 ? 0 : 1 + (double)i * 0.5;
  }
}

static void members_free(void) {
  for (int i = 0; i < nmem; i++) {
    member_stop(&mem[i]);
    free(mem[i].x);
    free(mem[i].x0);
  }
  uv_run(loop, UV_RUN_DEFAULT);
}

static void run_case(int N, size_t n, bool zero_weight, uint64_t round,
                     unsigned stripes) {
  members_new(N, n, zero_weight);
  for (int i = 0; i < N; i++) {
    avg_node_request req;
    request(&mem[i], i, n, round, &req);
    req.stripes = stripes;
    ASSERT_RC(avg_node_average(mem[i].node, &req, on_done, &mem[i]), 0);
  }
  ASSERT(test_run_until(loop, all_done, NULL, 40000));
  if (stripes > 1) /* the stripes came up: more than one connection each */
    for (int i = 0; i < N; i++)
      ASSERT_GT(proto_host_conn_count(mem[i].h), (size_t)(N - 1));
  /* A round of 4 MiB or more measures every member's link. */
  for (int i = 0; i < N && n * sizeof(float) >= (4u << 20); i++)
    ASSERT_GT(avg_node_bandwidth_mbit(mem[i].node), 1.0);
  double wsum = 0;
  for (int i = 0; i < N; i++) {
    ASSERT_RC(mem[i].status, 0);
    ASSERT(!avg_node_matching(mem[i].node));
    ASSERT_UEQ(mem[i].nmembers, (uint64_t)N);
    /* A zero-weight member sends no data: every mean has N - 1. */
    ASSERT_UEQ(mem[i].by_k[zero_weight ? N - 1 : N], n);
    wsum += mem[i].weight;
  }
  /* The same bits everywhere, and the weighted mean. */
  double worst = 0;
  for (size_t j = 0; j < n; j++) {
    double ref = 0, mag = 0;
    for (int i = 0; i < N; i++) {
      ref += mem[i].weight * mem[i].x0[j];
      mag += mem[i].weight * fabs(mem[i].x0[j]);
    }
    ref /= wsum;
    mag /= wsum;
    for (int i = 1; i < N; i++)
      ASSERT(memcmp(&mem[i].x[j], &mem[0].x[j], sizeof(float)) == 0);
    double err = fabs(mem[0].x[j] - ref) / (mag + 1e-30);
    if (err > worst)
      worst = err;
  }
  /* N additions and a division in fp32: a few units of 2^-24 each. */
  ASSERT(worst <= (N + 2) * 0x1p-23);
  /* Bytes against the butterfly's 2(N-1)/N of the buffer. */
  double bound = 2.0 * (N - 1) / N * (double)n * 4, lo = INFINITY, hi = 0;
  for (int i = 0; i < N; i++)
    if (mem[i].weight > 0) {
      double r = (double)mem[i].bytes_sent / bound;
      lo = fmin(lo, r);
      hi = fmax(hi, r);
    }
  printf(
      "N=%2d n=%zu%s%s: one group, same bits, error %.2g of the mean's scale, "
      "bytes sent / (2(N-1)/N x buffer) %.3f to %.3f (spans sized by the "
      "declared bandwidths), %" PRIu64 " ms\n",
      N, n, zero_weight ? " (a zero-weight member)" : "",
      stripes > 1 ? " (4 stripes)" : "", worst, lo, hi, mem[0].ms);
  members_free();
}

/* A group formed elsewhere (avg_node_round): two members start, and the
 * third only 100 ms later, so the parts sent to it wait in its node until
 * its round starts. */
static uv_timer_t late_timer;
static avg_group fixed;
static avg_node_request late_req;
static void late_start(uv_timer_t *t) {
  (void)t;
  ASSERT_RC(avg_node_round(mem[0].node, &fixed, &late_req, on_done, &mem[0]),
            0);
}

static void run_fixed(void) {
  const int N = 3;
  const size_t n = 200003;
  proto_group_member list[3];
  members_new(N, n, false);
  memset(list, 0, sizeof list);
  for (int i = 0; i < N; i++) {
    memcpy(list[i].id, mem[i].tn.id.id, PROTO_ID_BYTES);
    snprintf(list[i].addr, sizeof list[i].addr, "127.0.0.1:%d", mem[i].port);
    list[i].mode = PROTO_MODE_NODE;
    list[i].bandwidth_mbit = 100;
    list[i].weight = mem[i].weight;
  }
  fixed = (avg_group){.nmembers = (size_t)N, .members = list};
  memset(fixed.id, 0x77, sizeof fixed.id);
  memcpy(fixed.leader, list[0].id, PROTO_ID_BYTES);
  /* A group that does not list us where it says is refused. */
  avg_node_request req;
  request(&mem[1], 1, n, 0, &req);
  fixed.self = 0;
  ASSERT_RC(avg_node_round(mem[1].node, &fixed, &req, on_done, &mem[1]),
            BEE_ERANGE);
  for (int i = 1; i < N; i++) {
    request(&mem[i], i, n, 0, &req);
    fixed.self = (size_t)i;
    ASSERT_RC(avg_node_round(mem[i].node, &fixed, &req, on_done, &mem[i]), 0);
    /* One averaging at a time. */
    ASSERT_RC(avg_node_round(mem[i].node, &fixed, &req, on_done, &mem[i]),
              BEE_ERANGE);
  }
  request(&mem[0], 0, n, 0, &late_req);
  fixed.self = 0;
  ASSERT_RC(uv_timer_init(loop, &late_timer), 0);
  ASSERT_RC(uv_timer_start(&late_timer, late_start, 100, 0), 0);
  ASSERT(test_run_until(loop, all_done, NULL, 30000));
  for (int i = 0; i < N; i++) {
    ASSERT_RC(mem[i].status, 0);
    ASSERT_UEQ(mem[i].by_k[N], n);
    ASSERT(memcmp(mem[i].x, mem[0].x, n * sizeof *mem[0].x) == 0);
  }
  printf("a fixed group of 3, one member 100 ms late: same bits everywhere\n");
  uv_close((uv_handle_t *)&late_timer, NULL);
  members_free();
}

/* The matchmaking alone (avg_node_match), then each member's round when
 * its buffer is "ready": member 0 at once, the others 60 and 150 ms
 * later, so members 1 and 2 get parts before they begin.  The declared
 * weights are guesses (1 each); the round weighs by what the members
 * give it, and each member's summary says so. */
static void on_matched(avg_node *n, const avg_node_result *r, void *arg) {
  member *m = arg;
  (void)n;
  ASSERT(!m->matched);
  ASSERT_RC(r->status, 0);
  ASSERT(r->group && !r->summary);
  m->matched = true;
  m->g = *r->group;
  memcpy(m->gm, r->group->members, r->group->nmembers * sizeof *m->gm);
  m->g.members = m->gm;
}

static bool all_matched(void *arg) {
  (void)arg;
  for (int i = 0; i < nmem; i++)
    if (!mem[i].matched)
      return false;
  return true;
}

static size_t ahead_n;
static uint64_t ahead_timeout_ms; /* the round's timeouts; 0: defaults */
static uv_timer_t ahead_timer[3];
static void ahead_go(uv_timer_t *t) {
  member *m = t->data;
  avg_node_request req;
  request(m, (int)(m - mem), ahead_n, 0, &req);
  if (ahead_timeout_ms) {
    req.round.sender_timeout_ms = ahead_timeout_ms;
    req.round.reducer_timeout_ms = ahead_timeout_ms;
    req.round.deadline_ms = ahead_timeout_ms + 10000;
  }
  ASSERT_RC(avg_node_round(m->node, &m->g, &req, on_done, m), 0);
  ASSERT(!avg_node_matching(m->node)); /* a round, not a matchmaking */
}

static void run_ahead(void) {
  const int N = 3;
  const size_t n = ahead_n = 300007;
  members_new(N, n, false);
  for (int i = 0; i < N; i++) {
    avg_node_request req;
    request(&mem[i], i, n, 7, &req);
    req.match.info.weight = 1; /* a guess made before the buffer */
    ASSERT_RC(avg_node_match(mem[i].node, &req, on_matched, &mem[i]), 0);
    ASSERT(avg_node_matching(mem[i].node));
    ASSERT_RC(avg_node_average(mem[i].node, &req, on_done, &mem[i]),
              BEE_ERANGE); /* one at a time */
  }
  ASSERT(test_run_until(loop, all_matched, NULL, 20000));
  for (int i = 0; i < N; i++) {
    ASSERT(!avg_node_matching(mem[i].node)); /* the group is ours now */
    ASSERT_UEQ(mem[i].g.nmembers, (uint64_t)N);
    ASSERT(memcmp(mem[i].g.id, mem[0].g.id, sizeof mem[0].g.id) == 0);
    ASSERT(!mem[i].done); /* no round yet */
  }
  const uint64_t at[3] = {0, 60, 150};
  for (int i = 0; i < N; i++) {
    ASSERT_RC(uv_timer_init(loop, &ahead_timer[i]), 0);
    ahead_timer[i].data = &mem[i];
    ASSERT_RC(uv_timer_start(&ahead_timer[i], ahead_go, at[i], 0), 0);
  }
  ASSERT(test_run_until(loop, all_done, NULL, 30000));
  double wsum = 0;
  for (int i = 0; i < N; i++)
    wsum += mem[i].weight;
  double worst = 0;
  for (int i = 0; i < N; i++) {
    ASSERT_RC(mem[i].status, 0);
    ASSERT_UEQ(mem[i].by_k[N], n);
    ASSERT(memcmp(mem[i].x, mem[0].x, n * sizeof *mem[0].x) == 0);
    for (int k = 0; k < N; k++) { /* by the round's member order */
      size_t who = 0;
      while (memcmp(mem[who].tn.id.id, mem[i].gm[k].id, PROTO_ID_BYTES))
        who++;
      ASSERT(mem[i].weights[k] == mem[who].weight);
    }
  }
  for (size_t j = 0; j < n; j++) {
    double ref = 0, mag = 0;
    for (int i = 0; i < N; i++) {
      ref += mem[i].weight * mem[i].x0[j];
      mag += mem[i].weight * fabs(mem[i].x0[j]);
    }
    double err = fabs(mem[0].x[j] - ref / wsum) / (mag / wsum + 1e-30);
    worst = err > worst ? err : worst;
  }
  ASSERT(worst <= (N + 2) * 0x1p-23);
  printf("a group matched ahead, rounds begun 0, 60 and 150 ms after: the "
         "weighted mean by the rounds' weights (error %.2g), same bits\n",
         worst);
  for (int i = 0; i < N; i++)
    uv_close((uv_handle_t *)&ahead_timer[i], NULL);
  members_free();
}

/* A member that leaves a group formed ahead (avg_node_leave) instead of
 * running its round: the two others, who begin 50 ms later, drop it at
 * once (their timeouts are 20 s; the run is bounded at 10 s): its span
 * stays local, the rest is averaged by both. */
static void run_leave(void) {
  const int N = 3;
  const size_t n = ahead_n = 100003;
  ahead_timeout_ms = 20000;
  members_new(N, n, false);
  for (int i = 0; i < N; i++) {
    avg_node_request req;
    request(&mem[i], i, n, 8, &req);
    ASSERT_RC(avg_node_match(mem[i].node, &req, on_matched, &mem[i]), 0);
  }
  ASSERT(test_run_until(loop, all_matched, NULL, 20000));
  avg_node_leave(mem[2].node, &mem[2].g, "the epoch moved on");
  mem[2].done = true; /* it runs no round */
  for (int i = 0; i < 2; i++) {
    ASSERT_RC(uv_timer_init(loop, &ahead_timer[i]), 0);
    ahead_timer[i].data = &mem[i];
    ASSERT_RC(uv_timer_start(&ahead_timer[i], ahead_go, 50, 0), 0);
  }
  ASSERT(test_run_until(loop, all_done, NULL, 10000));
  for (int i = 0; i < 2; i++) {
    ASSERT_RC(mem[i].status, 0);
    ASSERT_GT(mem[i].by_k[0], 0); /* member 2's span */
    ASSERT_UEQ(mem[i].by_k[0] + mem[i].by_k[2], n);
  }
  /* Where both averaged they agree; member 2's span kept each its own. */
  size_t same = 0, own = 0;
  for (size_t j = 0; j < n; j++) {
    same += memcmp(&mem[0].x[j], &mem[1].x[j], sizeof(float)) == 0;
    own += memcmp(&mem[0].x[j], &mem[0].x0[j], sizeof(float)) == 0;
  }
  ASSERT_GE(same, mem[0].by_k[2]);
  ASSERT_GE(own, mem[0].by_k[0]);
  printf("a member that left its group formed ahead: the others dropped it at "
         "once (%" PRIu64 " ms), %zu of %zu floats averaged by both\n",
         mem[0].ms, mem[0].by_k[2], n);
  for (int i = 0; i < 2; i++)
    uv_close((uv_handle_t *)&ahead_timer[i], NULL);
  ahead_timeout_ms = 0;
  members_free();
}

/* A member of a group formed ahead whose buffer comes 1.5 s after the
 * others' (a slower bee), with the round's timeouts at 400 ms: it says
 * WAIT every 150 ms until it begins (avg_node_wait), and the round
 * averages all three, same bits everywhere. */
static uv_timer_t wait_timer;
static bool late_begun;
static void say_wait(uv_timer_t *t) {
  (void)t;
  if (!late_begun)
    avg_node_wait(mem[2].node, &mem[2].g);
}
static void late_go(uv_timer_t *t) {
  late_begun = true;
  ahead_go(t);
}

static void run_wait(void) {
  const int N = 3;
  const size_t n = ahead_n = 100003;
  ahead_timeout_ms = 400;
  members_new(N, n, false);
  for (int i = 0; i < N; i++) {
    avg_node_request req;
    request(&mem[i], i, n, 9, &req);
    ASSERT_RC(avg_node_match(mem[i].node, &req, on_matched, &mem[i]), 0);
  }
  ASSERT(test_run_until(loop, all_matched, NULL, 20000));
  late_begun = false;
  for (int i = 0; i < N; i++) {
    ASSERT_RC(uv_timer_init(loop, &ahead_timer[i]), 0);
    ahead_timer[i].data = &mem[i];
    ASSERT_RC(uv_timer_start(&ahead_timer[i], i == 2 ? late_go : ahead_go,
                             i == 2 ? 1500 : 50, 0),
              0);
  }
  ASSERT_RC(uv_timer_init(loop, &wait_timer), 0);
  ASSERT_RC(uv_timer_start(&wait_timer, say_wait, 0, 150), 0);
  ASSERT(test_run_until(loop, all_done, NULL, 10000));
  uv_timer_stop(&wait_timer);
  for (int i = 0; i < N; i++) {
    ASSERT_RC(mem[i].status, 0);
    ASSERT_UEQ(mem[i].by_k[N], n); /* every float averaged by all three */
    ASSERT(memcmp(mem[i].x, mem[0].x, n * sizeof *mem[0].x) == 0);
  }
  ASSERT_GE(mem[0].ms, 1400); /* it waited for member 2 */
  printf("a member that began its round 1.5 s after the others (timeouts "
         "400 ms) said WAIT: averaged by all three, same bits (%" PRIu64
         " ms)\n",
         mem[0].ms);
  for (int i = 0; i < N; i++)
    uv_close((uv_handle_t *)&ahead_timer[i], NULL);
  uv_close((uv_handle_t *)&wait_timer, NULL);
  ahead_timeout_ms = 0;
  members_free();
}

/* Member 0 is in a round of group A with member 2, which never comes;
 * member 2 and member 1 begin group B's round meanwhile and send member 0
 * their parts.  Member 0 keeps them until A ends (member 2 dropped at the
 * sender timeout), then begins B: B averages everything over all three. */
static avg_group grp_b;
static proto_group_member list_b[3];
static size_t other_n;
static void other_next(avg_node *n, const avg_node_result *r, void *arg) {
  member *m = arg;
  ASSERT_RC(r->status, 0);
  ASSERT(r->summary &&
         r->summary->members[1].dropped == AVG_DROP_SENDER_TIMEOUT);
  avg_node_request req;
  request(m, 0, other_n, 0, &req);
  grp_b.self = 0;
  ASSERT_RC(avg_node_round(n, &grp_b, &req, on_done, m), 0);
}

static void run_other_group(void) {
  const int N = 3;
  const size_t n = other_n = 100003;
  members_new(N, n, false);
  memset(list_b, 0, sizeof list_b);
  for (int i = 0; i < N; i++) {
    memcpy(list_b[i].id, mem[i].tn.id.id, PROTO_ID_BYTES);
    snprintf(list_b[i].addr, sizeof list_b[i].addr, "127.0.0.1:%d",
             mem[i].port);
    list_b[i].mode = PROTO_MODE_NODE;
    list_b[i].bandwidth_mbit = 100;
    list_b[i].weight = mem[i].weight;
  }
  grp_b = (avg_group){.nmembers = 3, .members = list_b};
  memset(grp_b.id, 0xbb, sizeof grp_b.id);
  memcpy(grp_b.leader, list_b[0].id, PROTO_ID_BYTES);
  proto_group_member list_a[2] = {list_b[0], list_b[2]};
  avg_group grp_a = {.nmembers = 2, .self = 0, .members = list_a};
  memset(grp_a.id, 0xaa, sizeof grp_a.id);
  memcpy(grp_a.leader, list_a[0].id, PROTO_ID_BYTES);
  avg_node_request req;
  request(&mem[0], 0, n, 0, &req);
  req.round.sender_timeout_ms = 800;
  req.round.reducer_timeout_ms = 1000;
  req.round.deadline_ms = 1500;
  float *a = malloc(n * sizeof *a); /* A's buffer: member 0's stays put */
  ASSERT(a);
  memcpy(a, mem[0].x, n * sizeof *a);
  req.round.x = a;
  ASSERT_RC(avg_node_round(mem[0].node, &grp_a, &req, other_next, &mem[0]),
            0);
  for (int i = 1; i < N; i++) {
    request(&mem[i], i, n, 0, &req);
    grp_b.self = (size_t)i;
    ASSERT_RC(avg_node_round(mem[i].node, &grp_b, &req, on_done, &mem[i]), 0);
  }
  ASSERT(test_run_until(loop, all_done, NULL, 30000));
  for (int i = 0; i < N; i++) {
    ASSERT_RC(mem[i].status, 0);
    ASSERT_UEQ(mem[i].by_k[N], n);
    ASSERT(memcmp(mem[i].x, mem[0].x, n * sizeof *mem[0].x) == 0);
  }
  printf("parts for a group not begun yet, sent while another round ran: "
         "kept, and that round averaged over all 3\n");
  free(a);
  members_free();
}

/* avg_node_cancel: a matchmaking alone is ended at once (callback with
 * BEE_ECANCELED), and the node takes the next averaging. */
static void run_cancel(void) {
  members_new(1, 16, false);
  avg_node_request req;
  request(&mem[0], 0, 16, 9, &req);
  req.match.min_size = 2;
  req.match.target_size = 2;
  ASSERT(!avg_node_matching(mem[0].node));
  ASSERT(!avg_node_matching(NULL));
  ASSERT_RC(avg_node_match(mem[0].node, &req, on_done, &mem[0]), 0);
  ASSERT(avg_node_matching(mem[0].node));
  avg_node_cancel(mem[0].node);
  ASSERT(mem[0].done);
  ASSERT_RC(mem[0].status, BEE_ECANCELED);
  ASSERT(!avg_node_matching(mem[0].node));
  avg_node_cancel(mem[0].node); /* nothing under way */
  avg_node_cancel(NULL);
  mem[0].done = false;
  ASSERT_RC(avg_node_average(mem[0].node, &req, on_done, &mem[0]), 0);
  ASSERT(avg_node_matching(mem[0].node));
  avg_node_cancel(mem[0].node);
  ASSERT(!avg_node_matching(mem[0].node));
  ASSERT(mem[0].done);
  ASSERT_RC(mem[0].status, BEE_ECANCELED);
  printf("cancel: a matchmaking ends at once, the node takes the next\n");
  members_free();
}

/* One member's host dies once the round is under way: when the first
 * round message reaches it (others are sending to it and wait for its
 * results), it stops, at once or kill_delay_ms later.  Its round messages
 * go nowhere meanwhile: it reduces nothing and returns no result, as a
 * process that is gone, so the others would wait out their timeouts. */
static member *victim;
static uv_timer_t kill_timer;
static bool killed;
static uint64_t kill_delay_ms;
static void kill_fire(uv_timer_t *t) {
  (void)t;
  /* As SIGKILL: the connections go first, so no ABORT goes out. */
  proto_host_close(victim->h);
  victim->h = NULL;
  member_stop(victim);
}
static void kill_on_first(proto_conn *c, proto_bytes method, proto_bytes p,
                          void *data) {
  (void)c, (void)method, (void)p, (void)data;
  if (!killed) {
    killed = true;
    uv_timer_start(&kill_timer, kill_fire, kill_delay_ms, 0);
  }
}

static void run_kill(int N, size_t n, bool quiet, uint64_t delay_ms) {
  kill_delay_ms = delay_ms;
  members_new(N, n, false);
  for (int i = 0; i < N; i++) {
    avg_node_request req;
    request(&mem[i], i, n, 99, &req);
    req.match.matchmaking_ms = 1000;
    req.round.part_floats = 4096; /* many parts: the kill lands mid-round */
    req.round.window = 1;
    req.round.sender_timeout_ms = 2000;
    req.round.reducer_timeout_ms = 3000;
    ASSERT_RC(avg_node_average(mem[i].node, &req, on_done, &mem[i]), 0);
  }
  victim = &mem[2];
  killed = false;
  ASSERT_RC(uv_timer_init(loop, &kill_timer), 0);
  /* Its round messages now come here, not to its node. */
  ASSERT_RC(proto_host_on_oneway(victim->h, "avg.r", kill_on_first, NULL), 0);
  ASSERT(test_run_until(loop, all_done, NULL, 40000));
  int ok = 0;
  for (int i = 0; i < N; i++) {
    member *m = &mem[i];
    if (m == victim)
      continue;
    ASSERT(m->done);
    ASSERT_RC(m->status, 0);
    /* The victim's span stays local; the rest is the mean of the
     * survivors, or of everyone for the parts the victim had sent
     * before it stopped. */
    ASSERT_GT(m->by_k[0], 0);
    ASSERT_UEQ(m->by_k[0] + m->by_k[N - 1] + m->by_k[N], n);
    /* What stayed local is exactly what was there (put back from the
     * backup where results had arrived). */
    size_t same = 0;
    for (size_t j = 0; j < n; j++)
      same += memcmp(&m->x[j], &m->x0[j], sizeof(float)) == 0;
    ASSERT_GE(same, m->by_k[0]);
    /* Dropped because its connection closed (or a send to it failed),
     * not after a timeout (2 s and 3 s): a dead process is not waited
     * for. */
    size_t v = 0;
    while (v < (size_t)N && memcmp(m->ids[v], victim->tn.id.id, PROTO_ID_BYTES))
      v++;
    ASSERT(v < (size_t)N);
    ASSERT(m->dropped[v] == AVG_DROP_CLOSED ||
           m->dropped[v] == AVG_DROP_SEND_FAILED ||
           m->dropped[v] == AVG_DROP_ABORTED);
    ok++;
  }
  /* Where survivors were averaged over the same members they agree; a
   * float either kept its own value or is a mean of some of the inputs,
   * within their range. */
  for (size_t j = 0; j < n; j += 97) {
    float lo = INFINITY, hi = -INFINITY;
    for (int i = 0; i < N; i++) {
      lo = fminf(lo, mem[i].x0[j]);
      hi = fmaxf(hi, mem[i].x0[j]);
    }
    for (int i = 0; i < N; i++)
      if (&mem[i] != victim)
        ASSERT(mem[i].x[j] >= lo && mem[i].x[j] <= hi);
  }
  ASSERT(killed);
  if (!quiet)
    printf("N=4, a member's host closed %" PRIu64 " ms after its first round "
           "message: %d survivors done in %" PRIu64 " ms, floats averaged "
           "over 3 / kept local at member 0: %zu / %zu of %zu\n",
           delay_ms, ok, mem[0].ms, mem[0].by_k[N - 1], mem[0].by_k[0], n);
  uv_close((uv_handle_t *)&kill_timer, NULL);
  members_free();
}

/* How many streams AVG_STRIPES_AUTO opens to a peer. */
static void test_stripes_auto(void) {
  /* 500 Mbit/s x 250 ms = 15.6 MB; a stock kernel's stream: 3 MiB. */
  ASSERT_UEQ(avg_stripes_auto(500, 500, 250, 3u << 20), 5);
  /* Tuned buffers: one stream covers it, no stripes. */
  ASSERT_UEQ(avg_stripes_auto(500, 500, 250, 32u << 20), 0);
  /* The slower side's bandwidth counts: 100 Mbit/s x 100 ms = 1.25 MB. */
  ASSERT_UEQ(avg_stripes_auto(1000, 100, 100, 1u << 20), 2);
  ASSERT_UEQ(avg_stripes_auto(100, 1000, 100, 1u << 20), 2);
  ASSERT_UEQ(avg_stripes_auto(10000, 10000, 250, 64u << 10),
             AVG_STRIPES_AUTO_MAX);
  ASSERT_UEQ(avg_stripes_auto(500, 500, 0, 3u << 20), 0); /* loopback */
  ASSERT_UEQ(avg_stripes_auto(500, 500, 250, 0), 0);      /* unknown */
  ASSERT_UEQ(avg_stripes_auto(0, 500, 250, 3u << 20), 0);
  ASSERT_UEQ(avg_stripes_auto(NAN, 500, 250, 3u << 20), 0);
  printf("auto stripes: 5 for 500 Mbit/s x 250 ms on 3 MiB windows, none "
         "when one stream covers the link\n");
}

/* The link meter on a fake clock: the second best half second of a round,
 * the best of the last 4 rounds, windows too small to tell left out. */
static void test_meter(void) {
  avg__meter m;
  memset(&m, 0, sizeof m);
  ASSERT(avg__meter_mbit(&m) == 0);
  /* 128 KiB every 50 ms for half a second: 2.5 MiB/s, 20.97 Mbit/s; then
   * a window of 64 KiB, too little to count. */
  avg__meter_start(&m, 0);
  for (uint64_t t = 0; t < 500; t += 50)
    avg__meter_add(&m, t, 128u << 10);
  avg__meter_add(&m, 500, 64u << 10);
  avg__meter_end(&m, 1000);
  double hi = 1280.0 * 1024 * 2 * 8 / 1e6;
  ASSERT(fabs(avg__meter_mbit(&m) - hi) < 1e-9);
  /* A round of small messages changes nothing. */
  avg__meter_start(&m, 2000);
  avg__meter_add(&m, 2000, 4);
  avg__meter_end(&m, 2100);
  ASSERT(fabs(avg__meter_mbit(&m) - hi) < 1e-9);
  /* Messages outside a round do not count. */
  avg__meter_add(&m, 2200, 100u << 20);
  ASSERT(fabs(avg__meter_mbit(&m) - hi) < 1e-9);
  /* Four slower rounds (512 KiB per half second) push the fast one out. */
  double lo = 512.0 * 1024 * 2 * 8 / 1e6;
  for (int r = 0; r < AVG__METER_ROUNDS; r++) {
    uint64_t t0 = 10000 + (uint64_t)r * 10000;
    avg__meter_start(&m, t0);
    avg__meter_add(&m, t0, 512u << 10);
    avg__meter_add(&m, t0 + 500, 1);
    avg__meter_end(&m, t0 + 600);
    ASSERT(fabs(avg__meter_mbit(&m) - (r < AVG__METER_ROUNDS - 1 ? hi : lo)) <
           1e-9);
  }
  /* A burst read in one window (a busy loop) is not taken: the second
   * best window is.  Windows of 1, 4 and 1.5 MiB per half second. */
  memset(&m, 0, sizeof m);
  avg__meter_start(&m, 0);
  avg__meter_add(&m, 0, 1u << 20);
  avg__meter_add(&m, 500, 4u << 20);
  avg__meter_add(&m, 1000, 3u << 19);
  avg__meter_add(&m, 1500, 1);
  avg__meter_end(&m, 4000); /* the whole round: 1.6 MiB/s */
  ASSERT(fabs(avg__meter_mbit(&m) - 3.0 * 1048576 * 8 / 1e6) < 1e-9);
  /* A round shorter than a window: its whole rate. */
  memset(&m, 0, sizeof m);
  avg__meter_start(&m, 0);
  avg__meter_add(&m, 10, 1u << 20);
  avg__meter_end(&m, 100);
  ASSERT(fabs(avg__meter_mbit(&m) - 10.0 * 1048576 * 8 / 1e6) < 1e-9);
  printf("meter: second best half second per round, best of the last %d "
         "rounds\n",
         AVG__METER_ROUNDS);
}

int main(void) {
  test_stripes_auto();
  test_meter();
  loop = uv_default_loop();
  test_moderator(0, &moderator);
  bee_log_set_level(BEE_LOG_WARN);
  run_case(2, 100003, false, 1, 0);
  run_case(3, 65537, false, 2, 0);
  run_case(4, 300007, true, 3, 0);
  run_case(8, 250001, false, 4, 0);
  run_case(16, 100000, false, 5, 0);
  run_case(4, 2000003, false, 6, 4);
  run_fixed();
  run_ahead();
  run_leave();
  run_wait();
  run_other_group();
  run_cancel();
  run_kill(4, 1u << 20, false, 0);
  run_kill(4, 1u << 20, false, 300);
  /* Failing rounds in a loop: no leak (ASan's leak check at exit) and
   * no growth of the peak RSS after a warm-up. */
  long warm = 0;
  for (int k = 0; k < 100; k++) {
    run_kill(3, 200000, true, 0);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    if (k == 19)
      warm = ru.ru_maxrss;
    if (k == 99) {
      printf("100 rounds that lost a member: peak RSS %ld KiB after 20, %ld "
             "KiB after 100\n",
             warm, ru.ru_maxrss);
      if (!TEST_ASAN)
        ASSERT_LT(ru.ru_maxrss - warm, 4096);
    }
  }
  return 0;
}
