/* test-swarm-sim.c: many bees' run cores on a fake clock (swarmsim.h).
 *
 * What is checked, each case deterministic for its seed:
 *   - swarms of 10, 17, 64 and 256 bees on fast links, and 1,000 for a
 *     few epochs (in the plain build; under the sanitizers it takes
 *     minutes): from the first epoch on, every epoch is averaged in one
 *     group of all of them, and every bee holds the same line after it:
 *     none alone, no split, no download, nothing wasted;
 *   - the lab of issue 29 (four bees, one per continent, 25 MiB of
 *     state, epochs of about 6.5 s): a bee killed and restarted five
 *     times from a checkpoint three epochs old downloads the state once
 *     each time (from the other three at once) and is on the swarm's line
 *     by the end of the epoch it loaded the state in, at most 10 s after
 *     its restart, and the swarm never stays split;
 *   - 256 bees, 10% of them replaced every 10 epochs by fresh bees, on
 *     the four continents (downloads of about a second) and on slower
 *     links with a larger state (downloads of about two epochs): every
 *     newcomer downloads the state once and comes to the swarm's line
 *     (taking the swarm's steps that came while its state did), the
 *     swarm's last epochs are one line, and less than 5% of the samples
 *     are wasted.
 * The figures (downloads per restart, the time back in line, the waste)
 * are printed: the targets of issue 29's part 3 are measured here.
 *
 * SWARMSIM_DUMP=1 prints every step of a case that fails an assertion's
 * neighbourhood (all of them, in fact); SWARMSIM_TRACE=N prints bee N's
 * events and its core's debug lines.
 */
#include "swarmsim.h"
#include "test.h"
#include "testlib.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void base_cfg(bee_config *cfg, unsigned target, unsigned min_peers) {
  bee_config_init(cfg);
  snprintf(cfg->run, sizeof cfg->run, "sim");
  cfg->target_batch_size = target;
  cfg->min_peers = min_peers;
  cfg->status_interval_s = 0;
}

static void print_report(const char *what, const swarmsim_report *r) {
  printf("%s: %llu epochs, %llu steps, groups %llu..%llu, %llu alone, %llu "
         "the swarm's step, %llu off the line, %llu split epochs, %llu "
         "downloads, %llu splits, wasted %.2f%%\n",
         what, (unsigned long long)r->epochs, (unsigned long long)r->steps,
         (unsigned long long)r->min_group, (unsigned long long)r->max_group,
         (unsigned long long)r->alone, (unsigned long long)r->swarm_steps,
         (unsigned long long)r->off_line, (unsigned long long)r->split_epochs,
         (unsigned long long)r->downloads, (unsigned long long)r->splits,
         r->samples ? 100.0 * (double)r->wasted / (double)r->samples : 0);
}

static double waste(const swarmsim_report *r) {
  return r->samples ? (double)r->wasted / (double)r->samples : 0;
}

static void finish(swarmsim *s) {
  if (getenv("SWARMSIM_DUMP"))
    swarmsim_dump(s, stderr);
  swarmsim_free(s);
}

/* bees on one fast link (1 ms, 10 Gbit/s), each 1,500 to 2,500
 * samples/s, in `slots` places (room for bees started later). */
static swarmsim_config fast_link(const bee_config *cfg, size_t bees,
                                 size_t slots, uint64_t seed) {
  return (swarmsim_config){.cfg = cfg,
                           .bees = bees,
                           .slots = slots,
                           .seed = seed,
                           .nregions = 1,
                           .rtt_ms = {{1}},
                           .mbit = {{10000}},
                           .rate_lo = 1500,
                           .rate_hi = 2500,
                           .model_bytes = 400e3,
                           .state_chunks = 1,
                           .dht_ms = 50};
}

/* bees on one fast link, target 8,000 per bee: epochs of about 4 s. */
static void one_group(size_t bees, uint64_t seed, uint64_t run_ms) {
  bee_config cfg;
  base_cfg(&cfg, (unsigned)(bees * 2000 * 4), (unsigned)bees);
  swarmsim_config c = fast_link(&cfg, bees, bees, seed);
  swarmsim *s = swarmsim_new(&c);
  ASSERT(s);
  swarmsim_run(s, run_ms);
  uint64_t last = swarmsim_epoch(s);
  swarmsim_report r;
  swarmsim_check(s, 0, last - 1, &r);
  char what[32];
  snprintf(what, sizeof what, "%4zu bees", bees);
  print_report(what, &r);
  ASSERT_GE(r.epochs, 4);
  ASSERT_UEQ(r.steps, r.epochs * bees);
  ASSERT_UEQ(r.min_group, bees);
  ASSERT_UEQ(r.max_group, bees);
  ASSERT_UEQ(r.alone, 0);
  ASSERT_UEQ(r.split_epochs, 0);
  ASSERT_UEQ(r.downloads, 0);
  ASSERT_UEQ(r.wasted, 0);
  finish(s);
}

/* --group-size g in a run of `bees` (one region, as one_group), with a
 * state round every epoch, gradient averaging or DiLoCo (inner steps of
 * about a second): groups of at most g form at every epoch, nobody steps
 * alone or downloads, and the turns of the grid mix the groups: the
 * spread of the bees' x (their slot numbers at first; the state rounds
 * average it) is 0 (to rounding) after `turns` epochs, where groups that
 * stayed the same would keep it. */
static void grouped(size_t bees, unsigned g, uint64_t seed, unsigned turns,
                    bool diloco) {
  bee_config cfg;
  base_cfg(&cfg, (unsigned)(bees * 2000 * 4), (unsigned)bees);
  cfg.group_size = g;
  cfg.average_state_every = 1;
  if (diloco) {
    cfg.averaging = BEE_AVG_DILOCO;
    cfg.inner_steps = 64;
  }
  swarmsim_config c = fast_link(&cfg, bees, bees, seed);
  swarmsim *s = swarmsim_new(&c);
  ASSERT(s);
  double first = swarmsim_spread(s);
  char spreads[256] = "";
  size_t used = 0;
  double at[10];
  /* After the steps of epoch e - 1 (all bees at e). */
  for (uint64_t e = 1; e <= 10; e++) {
    uint64_t until = swarmsim_now(s) + 60000;
    while (swarmsim_epoch(s) < e + 1 && swarmsim_now(s) < until)
      swarmsim_run(s, swarmsim_now(s) + 100);
    double sp = at[e - 1] = swarmsim_spread(s) / first;
    if (used < sizeof spreads)
      used += (size_t)snprintf(spreads + used, sizeof spreads - used, "%s%.2g",
                               e > 1 ? ", " : "", sp);
  }
  uint64_t last = swarmsim_epoch(s);
  swarmsim_report r;
  swarmsim_check(s, 0, last - 2, &r);
  char what[48];
  snprintf(what, sizeof what, "%zu bees, groups of %u%s", bees, g,
           diloco ? ", DiLoCo" : "");
  /* Each group's step is its own: lines part by design, so the lines'
   * figures say nothing here. */
  printf("%s: %llu epochs, %llu steps, groups %llu..%llu, %llu alone, %llu "
         "the swarm's step, %llu downloads, %llu splits\n",
         what, (unsigned long long)r.epochs, (unsigned long long)r.steps,
         (unsigned long long)r.min_group, (unsigned long long)r.max_group,
         (unsigned long long)r.alone, (unsigned long long)r.swarm_steps,
         (unsigned long long)r.downloads, (unsigned long long)r.splits);
  printf("%s: the spread of x after each of the first 10 epochs, of the "
         "first: %s\n",
         what, spreads);
  if (getenv("GDEBUG"))
    swarmsim_dump(s, stdout);
  ASSERT_GE(r.epochs, 8);
  ASSERT_UEQ(r.steps, r.epochs * bees);
  ASSERT_GE(r.min_group, 2);
  ASSERT_LE(r.max_group, g);
  ASSERT_UEQ(r.alone, 0);
  ASSERT_UEQ(r.swarm_steps, 0);
  ASSERT_UEQ(r.downloads, 0);
  ASSERT_UEQ(r.splits, 0);
  ASSERT(at[turns - 1] < 1e-12);
  finish(s);
}

/* --group-size 8 in a run of 64 (gradient averaging, a state round
 * every epoch) with churn: at epoch 4, 4 bees are killed, 2 of them
 * restart from checkpoints 2 epochs old, and 4 new bees join; the grid
 * changes under the bees (a new rank for most).  Groups stay within the
 * cap, each new or restarted bee downloads once, hardly any step goes
 * without a group, and the turns mix the newcomers' x in: 66 bees make
 * a 5 x 4 x 4 grid with holes, whose turns bring the spread down by
 * more than a thousand in 12 epochs (a full grid: to 0 in its dims). */
static void grouped_churn(uint64_t seed) {
  const size_t bees = 64;
  bee_config cfg;
  base_cfg(&cfg, (unsigned)(bees * 2000 * 4), (unsigned)bees);
  cfg.group_size = 8;
  cfg.average_state_every = 1;
  swarmsim_config c = fast_link(&cfg, bees, bees + 8, seed);
  swarmsim *s = swarmsim_new(&c);
  ASSERT(s);
  double first = swarmsim_spread(s);
  uint64_t until = swarmsim_now(s) + 120000;
  while (swarmsim_epoch(s) < 4 && swarmsim_now(s) < until)
    swarmsim_run(s, swarmsim_now(s) + 100);
  ASSERT_GE(swarmsim_epoch(s), 4);
  uint64_t churned = swarmsim_epoch(s);
  for (size_t b = 0; b < 4; b++)
    swarmsim_kill(s, b * 16);
  size_t started = 0;
  for (size_t b = 0; b < 2; b++)
    started += swarmsim_start(s, b * 16, 2, SIZE_MAX) != SIZE_MAX;
  for (size_t b = 0; b < 4; b++)
    started += swarmsim_start(s, SIZE_MAX, -1, SIZE_MAX) != SIZE_MAX;
  ASSERT_UEQ(started, 6);
  /* Still from here: every bee in, the records of the dead expired. */
  until = swarmsim_now(s) + 240000;
  while (swarmsim_epoch(s) < churned + 12 && swarmsim_now(s) < until)
    swarmsim_run(s, swarmsim_now(s) + 100);
  uint64_t last = swarmsim_epoch(s);
  ASSERT_GE(last, churned + 12);
  double sp = swarmsim_spread(s) / first;
  swarmsim_report r;
  swarmsim_check(s, 0, last - 1, &r);
  uint64_t downloads = 0;
  for (size_t b = bees; b < bees + 6; b++)
    downloads += swarmsim_life_of(s, b)->downloads;
  printf("64 bees, groups of 8, churn at epoch %llu: %llu epochs, %llu "
         "steps, groups %llu..%llu, %llu alone, %llu downloads (%llu by "
         "the 6 started), %llu splits, spread of x at the end %.2g of the "
         "first\n",
         (unsigned long long)churned, (unsigned long long)r.epochs,
         (unsigned long long)r.steps, (unsigned long long)r.min_group,
         (unsigned long long)r.max_group, (unsigned long long)r.alone,
         (unsigned long long)r.downloads, (unsigned long long)downloads,
         (unsigned long long)r.splits, sp);
  if (getenv("GDEBUG"))
    swarmsim_dump(s, stdout);
  ASSERT_LE(r.max_group, 8);
  ASSERT_UEQ(r.downloads, 6);
  ASSERT_UEQ(downloads, 6);
  ASSERT_UEQ(r.splits, 0);
  ASSERT_LE(r.alone, r.steps / 50);
  ASSERT(sp < 1e-3);
  finish(s);
}

/* The links and the state of the lab: the four continents' figures
 * (tools/wanlab/configs/paper-4continents.conf), a stock kernel's stream
 * window, the cnn's 25 MiB of state in 25 chunks. */
static void lab(swarmsim_config *c) {
  swarmsim_four_continents(c);
  c->model_bytes = 25.0 * (1 << 20);
  c->state_chunks = 25;
  c->window_bytes = 3.5 * (1 << 20);
  c->dht_ms = 150;
}

/* The lab's four bees, one per continent, 460 to 560 samples/s each, in
 * `slots` places (room for restarts). */
static swarmsim_config lab_swarm(const bee_config *cfg, size_t slots,
                                 uint64_t seed) {
  swarmsim_config c = {.cfg = cfg,
                       .bees = 4,
                       .slots = slots,
                       .seed = seed,
                       .rate_lo = 460,
                       .rate_hi = 560};
  lab(&c);
  return c;
}

/* Four bees, one per continent, target 8,192 in epochs of about 6 s (4
 * s of computing, 2 of round); the
 * bee in the fourth region killed and restarted (5 s later, as systemd's
 * RestartSec) from its checkpoint `behind` epochs old, `times` times.
 * KILL_IN_GROUP: each kill comes as soon as the bee is in a group formed
 * ahead for its epoch; its connections close, and the others' round drops
 * it at once.  VANISH_IN_ROUND: the bee vanishes from the network 0.8 s
 * into a round, and the others' round waits out its reducer timeout
 * while the restarted bee's state comes: its round of that epoch finds
 * nobody while they still average it, and it waits for their step
 * rather than step alone. */
enum kill_mode { KILL, KILL_IN_GROUP, VANISH_IN_ROUND };

static void rejoin(uint64_t seed, int behind, int times, enum kill_mode how) {
  static const char *const names[] = {
      [KILL] = "rejoin lab",
      [KILL_IN_GROUP] = "rejoin lab, killed in a group",
      [VANISH_IN_ROUND] = "rejoin lab, vanished in a round"};
  const char *what = names[how];
  bee_config cfg;
  base_cfg(&cfg, 8192, 4);
  swarmsim_config c = lab_swarm(&cfg, 4 + (size_t)times, seed);
  swarmsim *s = swarmsim_new(&c);
  ASSERT(s);
  swarmsim_run(s, 40000);
  size_t victim = 3;
  double over = 0; /* the most past its download and an epoch */
  double worst = 0;
  uint64_t downloads = 0, timeouts = 0;
  for (int k = 0; k < times; k++) {
    if (how != KILL) {
      const swarmsim_life *l = swarmsim_life_of(s, victim);
      uint64_t since = swarmsim_now(s), until = since + 60000;
      const uint64_t *at = how == KILL_IN_GROUP ? &l->formed_ms : &l->begun_ms;
      while (*at <= since && swarmsim_now(s) < until)
        swarmsim_run(s, swarmsim_now(s) + 50);
      ASSERT(*at > since);
      if (how == VANISH_IN_ROUND)
        swarmsim_run(s, *at + 800);
    }
    if (how == VANISH_IN_ROUND)
      swarmsim_vanish(s, victim);
    else
      swarmsim_kill(s, victim);
    swarmsim_run(s, swarmsim_now(s) + 5000);
    size_t nb = swarmsim_start(s, victim, behind, SIZE_MAX);
    ASSERT(nb != SIZE_MAX);
    uint64_t start_ms = swarmsim_now(s);
    swarmsim_run(s, start_ms + 60000);
    uint64_t e, ms;
    ASSERT(swarmsim_in_line(s, nb, &e, &ms));
    double back = (double)(ms - start_ms) / 1000;
    const swarmsim_life *l = swarmsim_life_of(s, nb);
    /* The swarm's epoch then: the mean of the last five. */
    double epoch_s =
        (double)(swarmsim_step_ms(s, e) - swarmsim_step_ms(s, e - 5)) / 5000;
    double loaded = (double)(l->loaded_ms - start_ms) / 1000;
    printf("%s, restart %d: %llu downloads (%.1f s; the state loaded %.1f s "
           "after the restart), on the swarm's line %.1f s after the "
           "restart (epoch %llu; epochs of %.1f s)\n",
           what, k, (unsigned long long)l->downloads, l->download_s, loaded,
           back, (unsigned long long)e, epoch_s);
    /* In line by the end of the epoch it loaded in, where that epoch
     * is as long as the last ones (not one held by a dead member), and
     * before the swarm's next step in any case. */
    if (how != VANISH_IN_ROUND)
      ASSERT(back <= loaded + epoch_s + 0.5);
    ASSERT(ms < swarmsim_step_ms(s, e + 1));
    if (back - l->download_s - epoch_s > over)
      over = back - l->download_s - epoch_s;
    worst = back > worst ? back : worst;
    downloads += swarmsim_life_of(s, nb)->downloads;
    timeouts += swarmsim_life_of(s, nb)->match_timeouts;
    victim = nb;
  }
  swarmsim_report r;
  uint64_t last = swarmsim_epoch(s);
  swarmsim_check(s, 0, last - 1, &r);
  print_report(what, &r);
  printf("%s: %.1f downloads a restart, the slowest back in %.1f "
         "s, at most %.1f s past its download and an epoch, %llu "
         "matchmakings of the restarted bees ran to their deadline\n",
         what, (double)downloads / times, worst, over,
         (unsigned long long)timeouts);
  /* One download a restart, no step alone or off the line, at most 10 s
   * from the restart to the swarm's line (issue 29's target for this
   * lab; not where a vanished member holds the swarm's own step for the
   * reducer timeout), and the swarm did not stay split: its last epochs
   * are one line. */
  ASSERT_UEQ(downloads, (uint64_t)times);
  ASSERT_UEQ(r.off_line, 0);
  ASSERT_UEQ(r.alone, 0);
  if (how != VANISH_IN_ROUND)
    ASSERT(worst <= 10.0);
  /* Where the others' group formed without it, the restarted bee learns
   * it (from the matchmaking, or the first record past its epoch)
   * rather than wait out its matchmaking.  Not where a vanished member
   * holds the others' round: their declarations are gone, and their
   * records stay at the epoch. */
  if (how != VANISH_IN_ROUND)
    ASSERT_UEQ(timeouts, 0);
  /* Where the others' round runs on without it, the bee asks the donors
   * for their step while it waits, rather than wait for their records. */
  if (how == VANISH_IN_ROUND) {
    printf("%s: %llu of the swarm's steps asked of the donors while they "
           "still averaged\n",
           what, (unsigned long long)r.steps_polled);
    ASSERT_GE(r.steps_polled, (uint64_t)times);
  }
  swarmsim_report tail;
  swarmsim_check(s, last - 3, last - 1, &tail);
  ASSERT_UEQ(tail.split_epochs, 0);
  finish(s);
}

/* Kills bee and starts it again from its checkpoint `behind` epochs old
 * 5 s later (systemd's RestartSec): the new slot, and when it started. */
static size_t restart(swarmsim *s, size_t bee, int behind, uint64_t *start_ms) {
  swarmsim_kill(s, bee);
  swarmsim_run(s, swarmsim_now(s) + 5000);
  size_t nb = swarmsim_start(s, bee, behind, SIZE_MAX);
  ASSERT(nb != SIZE_MAX);
  *start_ms = swarmsim_now(s);
  return nb;
}

/* A donor that vanishes during a download (the lab; the last host's bee
 * restarted from a checkpoint 3 epochs old, the first host gone silent
 * 0.8 s later, while the chunks it was asked for are on their way): the
 * others serve the rest and then ask its chunks again, and the bee loads
 * the state once and is in line with the swarm that is left. */
static void donor_vanishes(uint64_t seed) {
  bee_config cfg;
  base_cfg(&cfg, 8192, 3);
  swarmsim_config c = lab_swarm(&cfg, 5, seed);
  swarmsim *s = swarmsim_new(&c);
  ASSERT(s);
  swarmsim_run(s, 40000);
  uint64_t start_ms;
  size_t nb = restart(s, 3, 3, &start_ms);
  swarmsim_run(s, start_ms + 800);
  ASSERT_UEQ(swarmsim_life_of(s, nb)->downloads, 0); /* still under way */
  swarmsim_vanish(s, 0);
  swarmsim_run(s, start_ms + 60000);
  const swarmsim_life *l = swarmsim_life_of(s, nb);
  uint64_t e, ms;
  bool in = swarmsim_in_line(s, nb, &e, &ms);
  double loaded = (double)(l->loaded_ms - start_ms) / 1000;
  printf("a donor vanished in a download: %llu downloads, the state loaded "
         "%.1f s after the restart, on the swarm's line %.1f s after it\n",
         (unsigned long long)l->downloads, loaded,
         in ? (double)(ms - start_ms) / 1000 : -1.0);
  ASSERT_UEQ(l->downloads, 1);
  ASSERT(loaded <= 10);
  ASSERT(in);
  finish(s);
}

/* A download over a slow link: two bees, the second behind a 1 Mbit/s,
 * 100 ms link, restarted from a checkpoint 2 epochs old; 5 MB of state
 * in 8 chunks of 0.6 MB, 5 s each on that link, 4 asked at once, so the
 * last of a window is answered 20 s after it was asked while a chunk
 * comes every 5 s.  The bee loads the state once, in about 40 s.  (A
 * timeout per request shorter than a window's transfer, as the 10 s of
 * before, failed every pass on such a link.) */
static void slow_link(uint64_t seed) {
  bee_config cfg;
  base_cfg(&cfg, 200000, 2);
  swarmsim_config c = {.cfg = &cfg,
                       .bees = 2,
                       .slots = 3,
                       .seed = seed,
                       .nregions = 2,
                       .rtt_ms = {{1, 100}, {100, 1}},
                       .mbit = {{10000, 1}, {1, 10000}},
                       .rate_lo = 1500,
                       .rate_hi = 2500,
                       .model_bytes = 0.1e6,
                       .state_bytes = 5e6,
                       .state_chunks = 8,
                       .dht_ms = 50};
  swarmsim *s = swarmsim_new(&c);
  ASSERT(s);
  swarmsim_run(s, 150000);
  ASSERT_GE(swarmsim_epoch(s), 2);
  uint64_t start_ms;
  size_t nb = restart(s, 1, 2, &start_ms);
  swarmsim_run(s, start_ms + 120000);
  const swarmsim_life *l = swarmsim_life_of(s, nb);
  double loaded = (double)(l->loaded_ms - start_ms) / 1000;
  printf("a download over 1 Mbit/s: %llu downloads, %.1f s, the state "
         "loaded %.1f s after the restart\n",
         (unsigned long long)l->downloads, l->download_s,
         l->downloads ? loaded : -1.0);
  ASSERT_UEQ(l->downloads, 1);
  ASSERT(l->download_s >= 35 && l->download_s <= 60);
  finish(s);
}

/* 256 bees on the four continents, each 250 to 350 samples/s, epochs of
 * about 6 s; every 10 epochs 26 of them (10%) killed and as many fresh
 * bees started, six times. */
static void churn(uint64_t seed, bool slow) {
  bee_config cfg;
  base_cfg(&cfg, 256 * 300 * 6, 256);
  swarmsim_config c = {.cfg = &cfg,
                       .bees = 256,
                       .slots = 256 + 26 * 6,
                       .seed = seed,
                       .rate_lo = 250,
                       .rate_hi = 350};
  lab(&c);
  if (slow) {
    /* Every pair 100 Mbit/s and 60 ms apart, and 600 MiB of state: its
     * download takes about two epochs. */
    c.nregions = 1;
    c.rtt_ms[0][0] = 60;
    c.mbit[0][0] = 100;
    c.state_bytes = 600.0 * (1 << 20);
    c.state_chunks = 600;
  }
  swarmsim *s = swarmsim_new(&c);
  ASSERT(s);
  uint64_t next = 10;
  size_t *alive = calloc(c.slots, sizeof *alive);
  ASSERT(alive);
  size_t fresh[26 * 6], nfresh = 0;
  for (int round = 0; round < 6; round++) {
    while (swarmsim_epoch(s) < next)
      swarmsim_run(s, swarmsim_now(s) + 1000);
    size_t n = 0;
    for (size_t i = 0; i < c.slots; i++)
      if (swarmsim_is_alive(s, i))
        alive[n++] = i;
    for (int k = 0; k < 26; k++)
      swarmsim_kill(s, alive[(size_t)(k * 9 + round) % n]);
    for (int k = 0; k < 26; k++)
      fresh[nfresh++] = swarmsim_start(s, SIZE_MAX, -1, SIZE_MAX);
    next += 10;
  }
  swarmsim_run(s, swarmsim_now(s) + 60000);
  free(alive);
  uint64_t loads = 0, worst = 0;
  double dl_s = 0;
  size_t in_line = 0;
  for (size_t i = 0; i < nfresh; i++) {
    uint64_t e, ms;
    in_line += swarmsim_in_line(s, fresh[i], &e, &ms);
    uint64_t d = swarmsim_life_of(s, fresh[i])->downloads;
    dl_s += swarmsim_life_of(s, fresh[i])->download_s;
    loads += d;
    worst = d > worst ? d : worst;
  }
  swarmsim_report r;
  uint64_t last = swarmsim_epoch(s);
  swarmsim_check(s, 0, last - 1, &r);
  const char *what = slow ? "churn 256, slow downloads" : "churn 256";
  print_report(what, &r);
  printf("%s: %zu newcomers, %zu on the swarm's line, %.2f "
         "downloads each (at most %llu), the last of each %.1f s on "
         "average\n",
         what, nfresh, in_line, (double)loads / (double)nfresh,
         (unsigned long long)worst, dl_s / (double)nfresh);
  /* Every newcomer on the line after one download, and less than 5% of
   * the samples wasted (issue 29's part 3). */
  ASSERT_UEQ(in_line, nfresh);
  ASSERT_LE(worst, 1);
  swarmsim_report tail;
  swarmsim_check(s, last - 3, last - 1, &tail);
  char last3[64];
  snprintf(last3, sizeof last3, "%s, the last 3 epochs", what);
  print_report(last3, &tail);
  ASSERT_UEQ(tail.off_line, 0);
  ASSERT(waste(&r) < 0.05);
  finish(s);
}

/* argv[1], when given, runs only the cases whose name it is: one_group,
 * grouped, rejoin or churn. */
static bool wanted(int argc, char **argv, const char *name) {
  return argc < 2 || strcmp(argv[1], name) == 0;
}

/* Every member's round failed at once and each stepped alone (the lab of
 * test-deploy --long with 2 s epochs, a member of a group of 4 powered
 * off in a round): all are out of line, so none is a donor for the
 * others' resync.  The lowest id takes up its own line and the others
 * load its state: one line again, with one verdict and a download per
 * other bee. */
static void all_out_of_line(uint64_t seed) {
  bee_config cfg;
  base_cfg(&cfg, 8192, 3);
  swarmsim_config c = lab_swarm(&cfg, 4, seed);
  swarmsim *s = swarmsim_new(&c);
  ASSERT(s);
  swarmsim_run(s, 40000);
  swarmsim_report before;
  swarmsim_check(s, 0, swarmsim_epoch(s), &before);
  uint64_t t0 = swarmsim_now(s);
  swarmsim_fail_rounds(s);
  /* out: every bee out of line (the failed round stepped); back: none. */
  uint64_t out = 0, back = 0;
  while (!back && swarmsim_now(s) < t0 + 60000) {
    swarmsim_run(s, swarmsim_now(s) + 100);
    size_t k = 0;
    for (size_t i = 0; i < 4; i++)
      k += swarmsim_diverged(s, i);
    if (!out && k == 4)
      out = swarmsim_now(s);
    else if (out && k == 0)
      back = swarmsim_now(s);
  }
  ASSERT(out != 0);
  ASSERT(back != 0);
  uint64_t e_back = swarmsim_epoch(s);
  swarmsim_run(s, back + 30000);
  uint64_t e1 = swarmsim_epoch(s);
  swarmsim_report r;
  swarmsim_check(s, e_back + 1, e1 - 1, &r);
  print_report("all out of line, the epochs after", &r);
  printf("all out of line %.1f s after the failed round: in line again %.1f "
         "s later (epoch %llu), %llu line taken up, %llu downloads\n",
         (double)(out - t0) / 1000, (double)(back - out) / 1000,
         (unsigned long long)e_back, (unsigned long long)r.orphans,
         (unsigned long long)(r.downloads - before.downloads));
  ASSERT_UEQ(r.orphans, 1);
  ASSERT_UEQ(r.downloads - before.downloads, 3);
  ASSERT_GE(r.epochs, 3);
  ASSERT_UEQ(r.split_epochs, 0);
  ASSERT_UEQ(r.off_line, 0);
  finish(s);
}

int main(int argc, char **argv) {
  bee_log_set_level(BEE_LOG_ERROR);
  bool sanitized = getenv("BEE_TEST_SANITIZED") &&
                   strcmp(getenv("BEE_TEST_SANITIZED"), "1") == 0;
  if (wanted(argc, argv, "one_group")) {
    one_group(10, 1, 60000);
    one_group(17, 2, 60000);
    one_group(64, 3, 60000);
    one_group(256, 4, 60000);
    if (sanitized)
      printf("1000 bees: left to the plain build (minutes here)\n");
    else
      one_group(1000, 5, 25000);
  }
  if (wanted(argc, argv, "grouped")) {
    /* 8 x 8 and 5 x 5 x 4: one mean after 2 and 3 turns. */
    grouped(64, 8, 11, 2, false);
    grouped(100, 8, 12, 3, false);
    grouped(64, 8, 13, 2, true);
    grouped_churn(14);
  }
  if (wanted(argc, argv, "rejoin")) {
    rejoin(6, 3, 5, KILL);
    rejoin(7, 3, 5, KILL_IN_GROUP);
    rejoin(7, 3, 5, VANISH_IN_ROUND);
    donor_vanishes(9);
    slow_link(10);
    all_out_of_line(11);
  }
  if (wanted(argc, argv, "churn")) {
    churn(7, false);
    churn(8, true);
  }
  return 0;
}
