/* test-daemon-progress.c: the run's progress decisions (daemon/progress.c)
 * on a fake clock: the local rate, when a progress record goes out, the
 * swarm view from everyone's records, and when a bee takes the epoch
 * step.
 */
#include "bee.h"
#include "test.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static bool near(double a, double b, double tol) { return fabs(a - b) <= tol; }

static void test_rate(void) {
  bee_rate r = {0};
  ASSERT(bee_rate_get(&r) == 0);
  /* The first measurement is the rate, whatever its duration. */
  bee_rate_add(&r, 500, 0.25);
  ASSERT(near(bee_rate_get(&r), 2000, 1e-9));
  /* A steady rate stays exactly that. */
  for (int i = 0; i < 100; i++)
    bee_rate_add(&r, 200, 0.1);
  ASSERT(near(bee_rate_get(&r), 2000, 1e-6));
  /* Time not spent computing is never given: pauses change nothing, and
   * calls with no time (or nonsense) are ignored. */
  bee_rate_add(&r, 0, 0);
  bee_rate_add(&r, 1000, -1);
  bee_rate_add(&r, 1000, NAN);
  bee_rate_add(&r, 1000, INFINITY);
  ASSERT(near(bee_rate_get(&r), 2000, 1e-6));
  /* A change of pace: the weights fall by e per time constant of
   * computing, and the start's weight is divided out.  After 10.25 s at
   * 2000/s and one time constant at 1000/s: */
  int steps = (int)(BEE_RATE_TAU_S / 0.1 + 0.5);
  for (int i = 0; i < steps; i++)
    bee_rate_add(&r, 100, 0.1); /* 1000 samples/s */
  double s_all = (10.25 + BEE_RATE_TAU_S) / BEE_RATE_TAU_S;
  double want = (2000 * (exp(-1) - exp(-s_all)) + 1000 * (1 - exp(-1))) /
                (1 - exp(-s_all));
  ASSERT(near(bee_rate_get(&r), want, 1e-6));
  ASSERT(bee_rate_get(&r) > 1200 && bee_rate_get(&r) < 1400);
  for (int i = 0; i < 900; i++)
    bee_rate_add(&r, 100, 0.1);
  ASSERT(near(bee_rate_get(&r), 1000, 0.1));
}

static void test_publisher(void) {
  bee_publisher p = {0};
  uint64_t wall = 1700000000;
  /* The first record goes out at once. */
  ASSERT(bee_progress_due(&p, 1000, wall, 0, 0));
  ASSERT_UEQ(bee_progress_published(&p, 1000, wall, 0, 0),
             wall + BEE_PROGRESS_TTL_S);
  /* Nothing changed: not before BEE_PROGRESS_MAX_MS. */
  ASSERT(!bee_progress_due(&p, 1000 + BEE_PROGRESS_MAX_MS - 1, wall + 9, 0, 0));
  ASSERT(bee_progress_due(&p, 1000 + BEE_PROGRESS_MAX_MS, wall + 10, 0, 0));
  /* Changes: not before BEE_PROGRESS_MIN_MS. */
  ASSERT(!bee_progress_due(&p, 1000 + BEE_PROGRESS_MIN_MS - 1, wall + 1, 0, 64));
  ASSERT(bee_progress_due(&p, 1000 + BEE_PROGRESS_MIN_MS, wall + 1, 0, 64));
  ASSERT(bee_progress_due(&p, 1000 + BEE_PROGRESS_MIN_MS, wall + 1, 1, 0));
  /* Within one second of the wall clock: the second record expires a
   * second after the first, a third must wait for the next second. */
  ASSERT(bee_progress_due(&p, 1500, wall, 0, 64));
  ASSERT_UEQ(bee_progress_published(&p, 1500, wall, 0, 64),
             wall + BEE_PROGRESS_TTL_S + 1);
  ASSERT(!bee_progress_due(&p, 2000, wall, 0, 128));
  ASSERT(!bee_progress_due(&p, 1500 + BEE_PROGRESS_MAX_MS, wall, 0, 128));
  ASSERT(bee_progress_due(&p, 2000, wall + 1, 0, 128));
  ASSERT_UEQ(bee_progress_published(&p, 2000, wall + 1, 0, 128),
             wall + BEE_PROGRESS_TTL_S + 2);
  /* Every expiration is later than the one before, and never more than a
   * second ahead of its time, however often records are due. */
  uint64_t last = p.last_exp, now = 2000;
  for (int i = 0; i < 1000; i++) {
    now += BEE_PROGRESS_MIN_MS;
    uint64_t w = wall + 1 + (now - 2000) / 1000;
    if (!bee_progress_due(&p, now, w, 0, (uint64_t)i + 1000))
      continue;
    uint64_t e = bee_progress_published(&p, now, w, 0, (uint64_t)i + 1000);
    ASSERT(e > last);
    ASSERT(e <= w + BEE_PROGRESS_TTL_S + 1);
    last = e;
  }
  /* The monotonic clock going back (a new loop): publish again. */
  ASSERT(bee_progress_due(&p, 10, wall + 1000, 0, 0));
}

static proto_progress rec(const char *run, uint64_t epoch, uint64_t samples,
                          double sps, uint64_t time_ms, int mode) {
  proto_progress p;
  memset(&p, 0, sizeof p);
  snprintf(p.run, sizeof p.run, "%s", run);
  p.epoch = epoch;
  p.samples = samples;
  p.samples_per_second = sps;
  p.time_ms = time_ms;
  p.mode = mode;
  return p;
}

static void test_view(void) {
  const uint64_t now = 1700000000000ull;
  proto_swarm_view v;
  /* Nobody: epoch 0, nothing gathered, no estimate. */
  proto_swarm_view_compute(NULL, 0, "r", 1000, now, &v);
  ASSERT_UEQ(v.epoch, 0);
  ASSERT_UEQ(v.peers, 0);
  ASSERT(v.eta_s == -1 && !v.target_reached);

  proto_progress p[6] = {
      rec("r", 4, 300, 100, now, PROTO_MODE_NODE),
      rec("r", 4, 200, 50, now, PROTO_MODE_AUX),
      rec("r", 3, 900, 25, now, PROTO_MODE_NODE),   /* behind */
      rec("r", 9, 999, 10, now, PROTO_MODE_CLIENT), /* a client ahead */
      rec("other", 7, 5000, 1000, now, PROTO_MODE_NODE),
      rec("r", 4, 100, 0, now, PROTO_MODE_CLIENT),
  };
  proto_swarm_view_compute(p, 6, "r", 1000, now, &v);
  /* The epoch is the highest of the non-clients; the other run counts
   * for nothing; the samples are those at the epoch, clients' too. */
  ASSERT_UEQ(v.epoch, 4);
  ASSERT_UEQ(v.peers, 5);
  ASSERT_UEQ(v.peers_at_epoch, 3);
  ASSERT_UEQ(v.samples, 600);
  ASSERT(near(v.samples_per_second, 185, 1e-9));
  ASSERT(near(v.rate_at_epoch, 150, 1e-9));
  ASSERT(near(v.eta_s, 400.0 / 185, 1e-9));
  ASSERT(!v.target_reached);
  proto_swarm_view_compute(p, 6, "r", 600, now, &v);
  ASSERT(v.target_reached && v.eta_s == 0);

  /* Only clients: the highest of them. */
  proto_swarm_view_compute(&p[3], 1, "r", 1000, now, &v);
  ASSERT_UEQ(v.epoch, 9);
  ASSERT_UEQ(v.samples, 999);

  /* Old records are extrapolated at their rate, for at most
   * PROTO_PROGRESS_EXTRAP_S; a record from the future counts as it is. */
  proto_progress q[3] = {
      rec("r", 1, 100, 50, now - 2000, PROTO_MODE_NODE), /* +100 */
      rec("r", 1, 0, 10, now - 3600000, PROTO_MODE_NODE), /* +10 x3 */
      rec("r", 1, 7, 1e6, now + 5000, PROTO_MODE_NODE),
  };
  proto_swarm_view_compute(q, 3, "r", 1000000, now, &v);
  ASSERT_UEQ(v.samples, 200 + 10 * PROTO_PROGRESS_EXTRAP_S + 7);

  /* Forged numbers cannot wrap the sums around. */
  proto_progress f[2] = {
      rec("r", 2, UINT64_MAX - 5, 1e300, now - 1000, PROTO_MODE_NODE),
      rec("r", 2, 100, 0, now, PROTO_MODE_NODE),
  };
  proto_swarm_view_compute(f, 2, "r", 1000, now, &v);
  ASSERT_UEQ(v.samples, UINT64_MAX);
  ASSERT(v.target_reached);

  /* A peer's last record, saying it left, counts for nothing. */
  proto_progress l[2] = {rec("r", 9, 500, 100, now, PROTO_MODE_NODE),
                         rec("r", 2, 100, 10, now, PROTO_MODE_NODE)};
  l[0].leaving = true;
  proto_swarm_view_compute(l, 2, "r", 1000, now, &v);
  ASSERT_UEQ(v.epoch, 2);
  ASSERT_UEQ(v.peers, 1);
  ASSERT_UEQ(v.samples, 100);
  /* ... but it is expected in a round for a while: it may be back. */
  ASSERT_EQ(bee_round_candidates(l, 2, "r", 9, now), 1);
  ASSERT_EQ(bee_round_candidates(l, 2, "r", 9,
                                 now + BEE_LEAVE_GRACE_MS - 1), 1);
  ASSERT_EQ(bee_round_candidates(l, 2, "r", 9, now + BEE_LEAVE_GRACE_MS), 0);

  /* No rate: the time to the target is unknown. */
  proto_progress z = rec("r", 0, 10, 0, now, PROTO_MODE_NODE);
  proto_swarm_view_compute(&z, 1, "r", 1000, now, &v);
  ASSERT(v.eta_s == -1);
}

static void test_epoch_ready(void) {
  proto_swarm_view v;
  memset(&v, 0, sizeof v);
  v.epoch = 5;
  /* At the swarm's epoch: ours and the others' against the target. */
  ASSERT(!bee_epoch_ready(5, 100, &v, 899, 1000));
  ASSERT(bee_epoch_ready(5, 100, &v, 900, 1000));
  ASSERT(bee_epoch_ready(5, 1000, &v, 0, 1000));
  ASSERT(bee_epoch_ready(5, 2000, &v, UINT64_MAX, 1000));
  /* The swarm stepped past us: step now, whatever we gathered. */
  ASSERT(bee_epoch_ready(4, 0, &v, 0, 1000));
  ASSERT(bee_epoch_ready(1, 0, &v, 0, 1000));
  /* We stepped first, the view is older: the others' samples were for
   * the epoch before, so only ours count. */
  ASSERT(!bee_epoch_ready(6, 10, &v, 5000, 1000));
  ASSERT(bee_epoch_ready(6, 1000, &v, 5000, 1000));
}

static void test_candidates(void) {
  const uint64_t now = 1700000000000ull;
  proto_progress p[6] = {
      rec("r", 5, 0, 0, now, PROTO_MODE_NODE),
      rec("r", 5, 0, 0, now, PROTO_MODE_CLIENT),
      rec("r", 4, 0, 0, now, PROTO_MODE_NODE), /* one behind: steps soon */
      rec("r", 3, 0, 0, now, PROTO_MODE_NODE), /* too far behind */
      rec("r", 6, 0, 0, now, PROTO_MODE_NODE), /* ahead: its round is over */
      rec("q", 5, 0, 0, now, PROTO_MODE_NODE), /* another run */
  };
  ASSERT_EQ(bee_round_candidates(p, 6, "r", 5, now), 3);
  ASSERT_EQ(bee_round_candidates(p, 6, "r", 0, now), 0);
  ASSERT_EQ(bee_round_candidates(p, 6, "r", 6, now), 3);
  ASSERT_EQ(bee_round_candidates(p, 6, "q", 5, now), 1);
}

/* Nobody left to come to an epoch's group: the others all past it (or
 * two and more behind), or of another run. */
static void test_deserted(void) {
  const uint64_t now = 1700000000000ull;
  proto_progress p[4] = {
      rec("r", 7, 0, 0, now, PROTO_MODE_NODE),
      rec("r", 7, 0, 0, now, PROTO_MODE_CLIENT),
      rec("r", 3, 0, 0, now, PROTO_MODE_NODE), /* loads the swarm's state */
      rec("q", 6, 0, 0, now, PROTO_MODE_NODE), /* another run */
  };
  ASSERT(bee_round_deserted(p, 4, "r", 5, false, now));
  ASSERT(!bee_round_deserted(p, 4, "r", 7, false, now));
  ASSERT(!bee_round_deserted(p, 4, "r", 8, false, now)); /* 7 step soon */
  ASSERT(!bee_round_deserted(p, 4, "r", 4, false, now)); /* 3 steps to 4 */
  ASSERT(bee_round_deserted(p, 4, "r", 9, false, now));
  ASSERT(bee_round_deserted(p, 4, "q", 8, false, now));
  ASSERT(!bee_round_deserted(p, 4, "q", 6, false, now));
  /* With delayed averaging a peer one epoch ahead still averages ours. */
  ASSERT(bee_round_deserted(p, 4, "r", 5, true, now));
  ASSERT(!bee_round_deserted(p, 4, "r", 6, true, now));
  ASSERT(bee_round_deserted(p, 4, "r", 6, false, now));
  ASSERT(bee_round_deserted(p, 4, "r", UINT64_MAX, true, now));
  /* No one else at all. */
  ASSERT(bee_round_deserted(p, 0, "r", 7, true, now));
  /* One that left is awaited for a while: it may be back. */
  proto_progress l = rec("r", 5, 0, 0, now, PROTO_MODE_NODE);
  l.leaving = true;
  ASSERT(!bee_round_deserted(&l, 1, "r", 5, false, now));
  ASSERT(bee_round_deserted(&l, 1, "r", 5, false, now + BEE_LEAVE_GRACE_MS));
}

/* Right after a round: the group's members at the next epoch, though
 * their records still say the last one; the view then counts their
 * samples at their rates from the step on. */
static void test_stepped(void) {
  const uint64_t step = 1700000000000ull;
  uint8_t ids[7][PROTO_ID_BYTES], members[3][PROTO_ID_BYTES];
  for (int i = 0; i < 7; i++)
    memset(ids[i], 'a' + i, PROTO_ID_BYTES);
  memcpy(members[0], ids[0], PROTO_ID_BYTES);
  memcpy(members[1], ids[1], PROTO_ID_BYTES);
  memcpy(members[2], ids[2], PROTO_ID_BYTES);
  proto_progress p[7] = {
      rec("r", 4, 3000, 1000, step - 1500, PROTO_MODE_NODE), /* member */
      rec("r", 4, 2500, 2000, step - 800, PROTO_MODE_NODE),  /* member */
      rec("r", 5, 700, 1000, step + 300, PROTO_MODE_NODE),   /* its own, new */
      rec("r", 4, 2000, 1000, step - 500, PROTO_MODE_NODE),  /* not a member */
      rec("q", 4, 2000, 1000, step - 500, PROTO_MODE_NODE),  /* another run */
      rec("r", 4, 2000, 1000, step + 100, PROTO_MODE_NODE),  /* after: not */
      rec("r", 4, 2000, 1000, step - 500, PROTO_MODE_NODE),  /* left */
  };
  p[6].leaving = true;
  memcpy(ids[4], ids[0], PROTO_ID_BYTES); /* a member, of another run */
  memcpy(ids[5], ids[1], PROTO_ID_BYTES); /* a member that did not step */
  memcpy(ids[6], ids[2], PROTO_ID_BYTES); /* a member that left */
  proto_progress q[7];
  memcpy(q, p, sizeof p);
  ASSERT_EQ(bee_progress_stepped(q, (const uint8_t(*)[PROTO_ID_BYTES])ids, 7,
                                 "r", 5, step,
                                 (const uint8_t(*)[PROTO_ID_BYTES])members, 3,
                                 step + 200),
            2);
  for (int i = 0; i < 2; i++) {
    ASSERT_EQ(q[i].epoch, 5);
    ASSERT_EQ(q[i].samples, 0);
    ASSERT_EQ(q[i].time_ms, step);
    ASSERT(q[i].samples_per_second == p[i].samples_per_second);
  }
  ASSERT(memcmp(&q[2], &p[2], 5 * sizeof p[0]) == 0); /* the rest as read */
  /* The view a second after the step: the two at their rates since it,
   * and the member's own record as written. */
  proto_swarm_view v;
  proto_swarm_view_compute(q, 3, "r", 10000, step + 1000, &v);
  ASSERT_EQ(v.epoch, 5);
  ASSERT_EQ(v.peers_at_epoch, 3);
  ASSERT(near((double)v.samples, 1000 + 2000 + 700 + 1000 * 0.7, 2));
  /* Taken as read, the view would count only the one at epoch 5. */
  proto_swarm_view_compute(p, 3, "r", 10000, step + 1000, &v);
  ASSERT_EQ(v.peers_at_epoch, 1);
  /* Past BEE_STEPPED_MS the records speak for themselves; with no group,
   * nothing to rewrite. */
  memcpy(q, p, sizeof p);
  ASSERT_EQ(bee_progress_stepped(q, (const uint8_t(*)[PROTO_ID_BYTES])ids, 7,
                                 "r", 5, step,
                                 (const uint8_t(*)[PROTO_ID_BYTES])members, 3,
                                 step + BEE_STEPPED_MS),
            0);
  ASSERT_EQ(bee_progress_stepped(q, (const uint8_t(*)[PROTO_ID_BYTES])ids, 7,
                                 "r", 5, step, NULL, 0, step),
            0);
  ASSERT(memcmp(q, p, sizeof p) == 0);
}

static bee_line line(uint64_t epoch, uint64_t group, uint8_t h) {
  bee_line l = {.epoch = epoch, .group = group};
  memset(l.hash, h, sizeof l.hash);
  return l;
}

/* Which line of parameters goes on after a split. */
static void test_split(void) {
  bee_line won;
  bee_line ours[3] = {line(4, 3, 0x40), line(5, 2, 0x50), line(6, 3, 0x60)};
  /* Everyone on our lines, or at epochs we did not average: no split. */
  bee_line same[3] = {line(5, 2, 0x50), line(6, 3, 0x60), line(9, 3, 0x01)};
  ASSERT(bee_split_loser(ours, 3, same, 3, &won) == NULL);
  ASSERT(bee_split_loser(ours, 3, same, 0, &won) == NULL);
  ASSERT(bee_split_loser(ours, 0, same, 3, &won) == NULL);
  /* Two groups at epoch 5: ours of 2, theirs of 3 (a higher hash): we
   * lose, whatever the hashes. */
  bee_line two[3] = {line(5, 2, 0x50), line(5, 3, 0x70), line(5, 3, 0x70)};
  const bee_line *l = bee_split_loser(ours, 2, two, 3, &won);
  ASSERT(l == &ours[1]);
  ASSERT_UEQ(won.group, 3);
  ASSERT_EQ(won.hash[0], 0x70);
  /* Seen from the group of 3: it goes on. */
  bee_line big[1] = {line(5, 3, 0x70)}, small[2] = {line(5, 2, 0x50),
                                                     line(5, 2, 0x50)};
  ASSERT(bee_split_loser(big, 1, small, 2, &won) == NULL);
  /* One group of 3 whose members came in with different parameters:
   * the two that agree go on, also with the higher hash. */
  bee_line g3[1] = {line(7, 3, 0x10)};
  bee_line pair[2] = {line(7, 3, 0x90), line(7, 3, 0x90)};
  l = bee_split_loser(g3, 1, pair, 2, &won);
  ASSERT(l == &g3[0]);
  ASSERT_EQ(won.hash[0], 0x90);
  bee_line g3b[1] = {line(7, 3, 0x90)};
  bee_line mixed[2] = {line(7, 3, 0x90), line(7, 3, 0x10)};
  ASSERT(bee_split_loser(g3b, 1, mixed, 2, &won) == NULL);
  /* Groups and holders alike: the lower hash. */
  bee_line hi[1] = {line(8, 2, 0x90)}, lo[1] = {line(8, 2, 0x10)};
  ASSERT(bee_split_loser(hi, 1, lo, 1, &won) == &hi[0]);
  ASSERT_EQ(won.hash[0], 0x10);
  ASSERT(bee_split_loser(lo, 1, hi, 1, &won) == NULL);
  /* One more peer on the higher hash outweighs it. */
  bee_line with_hi[2] = {line(8, 2, 0x10), line(8, 2, 0x90)};
  ASSERT(bee_split_loser(hi, 1, with_hi, 2, &won) == NULL);
  bee_line hi2[2] = {line(8, 2, 0x90), line(8, 2, 0x90)};
  ASSERT(bee_split_loser(lo, 1, hi2, 2, &won) == &lo[0]);
  ASSERT_EQ(won.hash[0], 0x90);
  /* The latest epoch that split decides: lost at 5, won at 6. */
  bee_line late[4] = {line(5, 3, 0x70), line(5, 3, 0x70), line(6, 2, 0x61),
                      line(6, 2, 0x61)};
  ASSERT(bee_split_loser(ours, 3, late, 4, &won) == NULL);
  /* And the strongest of several other lines at that epoch. */
  bee_line three[4] = {line(6, 2, 0x05), line(6, 4, 0x80), line(6, 4, 0x80),
                       line(6, 4, 0x81)};
  l = bee_split_loser(ours, 3, three, 4, &won);
  ASSERT(l == &ours[2]);
  ASSERT_UEQ(won.group, 4);
  ASSERT_EQ(won.hash[0], 0x80);
}

static void count_unpin(void *pin, void *arg) {
  (*(int *)pin)++;
  (*(unsigned *)arg)++;
}

/* The downloads a donor serves at once: at most max peers, a peer that
 * keeps asking stays in, one that is done or idle makes room. */
static void test_uploads(void) {
  bee_uploads u = {0};
  uint8_t a[PROTO_ID_BYTES] = {1}, b[PROTO_ID_BYTES] = {2},
          c[PROTO_ID_BYTES] = {3};
  bool fresh;
  bee_upload *ua = bee_uploads_admit(&u, a, 1000, 2, &fresh, NULL, NULL);
  ASSERT(ua && fresh);
  ASSERT(bee_uploads_admit(&u, a, 1100, 2, &fresh, NULL, NULL) == ua && !fresh);
  ASSERT_EQ(ua->start_ms, 1000);
  ASSERT_EQ(ua->last_ms, 1100);
  ASSERT(bee_uploads_admit(&u, b, 1200, 2, &fresh, NULL, NULL) && fresh);
  ASSERT_EQ(bee_uploads_active(&u, 1200), 2);
  ASSERT_EQ(bee_uploads_active(&u, 1100 + BEE_UPLOAD_IDLE_MS), 1); /* b */
  ASSERT_EQ(bee_uploads_active(&u, 1200 + BEE_UPLOAD_IDLE_MS), 0);
  /* Two running: a third is refused, the two keep going. */
  ASSERT(bee_uploads_admit(&u, c, 1300, 2, &fresh, NULL, NULL) == NULL &&
         !fresh);
  ASSERT(bee_uploads_admit(&u, a, 1400, 2, &fresh, NULL, NULL) && !fresh);
  ASSERT(bee_uploads_admit(&u, b, 1400, 2, &fresh, NULL, NULL) && !fresh);
  ASSERT_EQ(u.n, 2);
  /* a has its last chunk: c gets its place. */
  bee_uploads_end(&u, bee_uploads_admit(&u, a, 1500, 2, &fresh, NULL, NULL));
  ASSERT_EQ(u.n, 1);
  bee_upload *uc = bee_uploads_admit(&u, c, 1600, 2, &fresh, NULL, NULL);
  ASSERT(uc && fresh);
  ASSERT(memcmp(uc->id, c, PROTO_ID_BYTES) == 0);
  /* b stops asking: after BEE_UPLOAD_IDLE_MS it no longer counts, while c,
   * still asking, does. */
  ASSERT(bee_uploads_admit(&u, a, 1700, 2, &fresh, NULL, NULL) == NULL);
  ASSERT(bee_uploads_admit(&u, c, 1400 + BEE_UPLOAD_IDLE_MS - 1, 2, &fresh,
                           NULL, NULL));
  ASSERT(bee_uploads_admit(&u, a, 1400 + BEE_UPLOAD_IDLE_MS - 1, 2, &fresh,
                           NULL, NULL) == NULL);
  /* b lapses with its pin released; c's stays. */
  int pin_b = 0, pin_c = 0;
  for (size_t i = 0; i < u.n; i++)
    u.u[i].pin = memcmp(u.u[i].id, b, PROTO_ID_BYTES) == 0 ? &pin_b : &pin_c;
  unsigned unpins = 0;
  bee_upload *ua2 = bee_uploads_admit(&u, a, 1400 + BEE_UPLOAD_IDLE_MS, 2,
                                      &fresh, count_unpin, &unpins);
  ASSERT(ua2 && fresh && ua2->pin == NULL);
  ASSERT_EQ(unpins, 1);
  ASSERT_EQ(pin_b, 1);
  ASSERT_EQ(pin_c, 0);
  ASSERT_EQ(u.n, 2);
  /* A limit over the table's size is the table's size. */
  bee_uploads big = {0};
  for (unsigned i = 0; i < BEE_STATE_UPLOADS_MAX + 5; i++) {
    uint8_t id[PROTO_ID_BYTES] = {(uint8_t)i, (uint8_t)(i >> 8), 7};
    bee_upload *up =
        bee_uploads_admit(&big, id, 5000, 1000, &fresh, NULL, NULL);
    ASSERT(i < BEE_STATE_UPLOADS_MAX ? up != NULL : up == NULL);
  }
  ASSERT_EQ(big.n, BEE_STATE_UPLOADS_MAX);
}

/* DiLoCo: when the others at an epoch will have taken their inner
 * steps: the last of them, each at its rate from its record's time. */
static void test_outer_due(void) {
  const uint64_t now = 1700000000000ull;
  proto_progress p[6] = {
      /* 1000 samples/s, 6,000 of 10,000, written 1 s ago: 3 s left */
      rec("r", 5, 6000, 1000, now - 1000, PROTO_MODE_NODE),
      /* 2000 samples/s, 2,000 written now: 4 s left (the last) */
      rec("r", 5, 2000, 2000, now, PROTO_MODE_NODE),
      rec("r", 4, 0, 1000, now, PROTO_MODE_NODE),     /* another epoch */
      rec("q", 5, 0, 100, now, PROTO_MODE_NODE),      /* another run */
      rec("r", 5, 0, 0, now, PROTO_MODE_NODE),        /* no rate yet */
      rec("r", 5, 0, 10, now - 500, PROTO_MODE_NODE), /* left the run */
  };
  p[5].leaving = true;
  double first;
  ASSERT(fabs(bee_outer_due(p, 6, "r", 5, 10000, now, &first) - 4.0) < 1e-9);
  ASSERT(fabs(first - 3.0) < 1e-9); /* the first of the two */
  ASSERT(fabs(bee_outer_due(p, 6, "r", 5, 10000, now, NULL) - 4.0) < 1e-9);
  ASSERT(fabs(bee_outer_due(p, 1, "r", 5, 10000, now, &first) - 3.0) < 1e-9);
  ASSERT(fabs(first - 3.0) < 1e-9);
  /* A record's samples grow for PROTO_PROGRESS_EXTRAP_S at most. */
  ASSERT(fabs(bee_outer_due(p, 1, "r", 5, 10000, now + 20000, &first) -
              (4.0 - PROTO_PROGRESS_EXTRAP_S)) < 1e-9);
  /* Done already (or past it): 0; the one done counts as the first. */
  ASSERT(bee_outer_due(p, 1, "r", 5, 5000, now, &first) == 0);
  ASSERT(first == 0);
  ASSERT(fabs(bee_outer_due(p, 2, "r", 5, 8000, now, &first) - 3.0) < 1e-9);
  ASSERT(fabs(first - 1.0) < 1e-9);
  /* Nobody to wait for: -1. */
  ASSERT(bee_outer_due(p + 2, 4, "r", 5, 10000, now, &first) == -1);
  ASSERT(first == -1);
  ASSERT(bee_outer_due(p, 6, "r", 6, 10000, now, &first) == -1);
  ASSERT(bee_outer_due(p, 0, "r", 5, 10000, now, &first) == -1);
}

/* DiLoCo: when the round comes, this bee and the others counted: the
 * last end, or the one before it when the last bee lags by more than
 * lag_s (it takes the round with the steps it has). */
static void test_outer_round(void) {
  const uint64_t now = 1700000000000ull;
  proto_progress p[5] = {
      rec("r", 5, 6000, 1000, now - 1000, PROTO_MODE_NODE), /* 3 s left */
      rec("r", 5, 2000, 2000, now, PROTO_MODE_NODE),        /* 4 s left */
      rec("r", 5, 0, 500, now, PROTO_MODE_NODE),            /* 20 s left */
      rec("r", 4, 0, 1000, now, PROTO_MODE_NODE),           /* not counted */
      rec("r", 5, 0, 10, now, PROTO_MODE_NODE),             /* leaving */
  };
  p[4].leaving = true;
  static const struct {
    size_t from, n; /* the records p[from..from+n) */
    double own, want;
  } cases[] = {
      /* Others at 3 and 4 s.  Slower than us: the round waits for them. */
      {0, 2, 1.0, 4.0},
      {0, 2, 0.0, 4.0},
      /* Within lag_s (1 s) of the one before: the last of us all; exactly
       * lag_s is not a laggard. */
      {0, 2, 4.5, 4.5},
      {0, 2, 5.0, 5.0},
      /* More than lag_s behind: our round is the last of the others'. */
      {0, 2, 5.5, 4.0},
      {0, 2, 60, 4.0},
      /* Another bee lags (20 s): the round is at 4 s for us too, and at
       * our own end when that is later. */
      {0, 5, 2.0, 4.0},
      {0, 5, 7.0, 7.0},
      /* Our end unknown (-1, NaN): the others'. */
      {0, 2, -1, 4.0},
      {0, 3, NAN, 4.0},
      /* Alone: our end. */
      {0, 0, 2.5, 2.5},
      /* One other, far behind us: it lags, so the round is ours. */
      {2, 1, 3.0, 3.0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    double got = bee_outer_round(p + cases[i].from, cases[i].n, "r", 5, 10000,
                                 now, cases[i].own, 1.0);
    if (!(fabs(got - cases[i].want) < 1e-9))
      FAIL("case %zu: %g, not %g", i, got, cases[i].want);
  }
  /* Nobody known: -1. */
  ASSERT(bee_outer_round(p + 3, 2, "r", 5, 10000, now, -1, 1.0) == -1);
  ASSERT(bee_outer_round(p, 3, "r", 6, 10000, now, -1, 1.0) == -1);
}

/* Averages x[] over the groups of turn `turn` of a grid of n in groups of
 * cap, checking each group's members and size; returns the dims. */
static size_t grid_turn(double *x, size_t n, size_t cap, uint64_t turn,
                        size_t *singles) {
  bee_grid_group *g = calloc(n, sizeof *g);
  double *sum = calloc(n, sizeof *sum);
  size_t *cnt = calloc(n, sizeof *cnt);
  ASSERT(g && sum && cnt);
  for (size_t r = 0; r < n; r++) {
    ASSERT_EQ(bee_grid_group_of(n, r, cap, turn, &g[r], NULL), 0);
    /* The members' ranks: this one among them, ascending. */
    size_t ranks[16];
    bee_grid_group h;
    ASSERT(cap <= 16);
    ASSERT_EQ(bee_grid_group_of(n, r, cap, turn, &h, ranks), 0);
    ASSERT_UEQ(h.index, g[r].index);
    bool self = false;
    for (size_t i = 0; i < h.size; i++) {
      self |= ranks[i] == r;
      ASSERT(i == 0 || ranks[i] > ranks[i - 1]);
    }
    ASSERT(self);
    ASSERT(g[r].index < n);
    ASSERT(g[r].size >= 1 && g[r].size <= cap);
    ASSERT_UEQ(g[r].dim, turn % g[r].dims);
    sum[g[r].index] += x[r];
    cnt[g[r].index]++;
  }
  for (size_t r = 0; r < n; r++) {
    /* The size each member is told is the group's own, and its members
     * are those told its index. */
    ASSERT_UEQ(cnt[g[r].index], g[r].size);
    size_t ranks[16];
    bee_grid_group h;
    ASSERT_EQ(bee_grid_group_of(n, r, cap, turn, &h, ranks), 0);
    for (size_t i = 0; i < h.size; i++)
      ASSERT_UEQ(g[ranks[i]].index, g[r].index);
    *singles += g[r].size == 1;
    /* Groups apart have bits apart. */
    for (size_t q = 0; q < r; q++)
      ASSERT((g[q].index == g[r].index) == (strcmp(g[q].bits, g[r].bits) == 0));
  }
  for (size_t r = 0; r < n; r++)
    x[r] = sum[g[r].index] / (double)cnt[g[r].index];
  size_t dims = g[0].dims;
  free(g);
  free(sum);
  free(cnt);
  return dims;
}

static double spread(const double *x, size_t n) {
  double lo = x[0], hi = x[0];
  for (size_t i = 1; i < n; i++) {
    lo = x[i] < lo ? x[i] : lo;
    hi = x[i] > hi ? x[i] : hi;
  }
  return hi - lo;
}

/* --group-size's grid: groups within the cap, nobody alone (but cap 2
 * with an odd run), and the turns' averages mix every bee's value into
 * every other's: exactly (to rounding) after dims turns where the grid is
 * full, within a fifth of the spread where it has holes. */
static void test_grid(void) {
  static const size_t caps[] = {2, 3, 4, 8, 16};
  for (size_t c = 0; c < sizeof caps / sizeof *caps; c++)
    for (size_t n = 2; n <= 300; n += caps[c] == 2 ? 7 : 1) {
      double *x = malloc(n * sizeof *x);
      ASSERT(x);
      for (size_t r = 0; r < n; r++)
        x[r] = (double)r;
      size_t singles = 0, dims = 0;
      for (uint64_t t = 0; t == 0 || t < dims; t++)
        dims = grid_turn(x, n, caps[c], t, &singles);
      size_t cells = 1;
      for (size_t i = 0; i < dims; i++)
        cells *= caps[c];
      ASSERT(cells >= n && cells / caps[c] < n); /* the fewest dims */
      if (caps[c] > 2 || n % 2 == 0)
        ASSERT_UEQ(singles, 0);
      ASSERT(spread(x, n) <= 0.4 * (double)(n - 1));
      free(x);
    }
  /* Full grids: 64 in groups of 8 (8 x 8), 100 (5 x 5 x 4), 1000 (10^3 in
   * groups of 10): one mean after dims turns. */
  static const size_t full[][3] = {{64, 8, 2}, {100, 8, 3}, {1000, 10, 3}};
  for (size_t f = 0; f < 3; f++) {
    size_t n = full[f][0];
    double *x = malloc(n * sizeof *x);
    ASSERT(x);
    for (size_t r = 0; r < n; r++)
      x[r] = (double)r;
    size_t singles = 0;
    for (uint64_t t = 0; t < full[f][2]; t++)
      ASSERT_UEQ(grid_turn(x, n, full[f][1], t + 7 * full[f][2], &singles),
                 full[f][2]);
    ASSERT(spread(x, n) < 1e-9 * (double)n);
    ASSERT_UEQ(singles, 0);
    free(x);
  }
  /* One group of all where the run fits the cap. */
  bee_grid_group g;
  ASSERT_EQ(bee_grid_group_of(5, 3, 8, 9, &g, NULL), 0);
  ASSERT_UEQ(g.dims, 1);
  ASSERT_UEQ(g.size, 5);
  ASSERT_UEQ(g.index, 0);
  /* Bad arguments. */
  ASSERT_EQ(bee_grid_group_of(5, 5, 8, 0, &g, NULL), -EINVAL);
  ASSERT_EQ(bee_grid_group_of(5, 0, 1, 0, &g, NULL), -EINVAL);
  ASSERT_EQ(bee_grid_group_of((size_t)1 << 17, 0, 8, 0, &g, NULL), -EINVAL);
  ASSERT_EQ(bee_grid_group_of((size_t)1 << 16, 65535, 2, 3, &g, NULL), 0);
  ASSERT_UEQ(strlen(g.bits), 16);
}

int main(void) {
  test_rate();
  test_uploads();
  test_publisher();
  test_view();
  test_epoch_ready();
  test_candidates();
  test_deserted();
  test_stepped();
  test_outer_due();
  test_outer_round();
  test_split();
  test_grid();
  return 0;
}
