/* swarmsim.h: a swarm of bees' run cores in one process (tests/).
 *
 * Each simulated bee is the daemon's own run core (daemon/run.h) with a
 * simulated world behind its bee_run_io, on one fake clock:
 *
 *   - the worker: samples at the bee's rate, a batch at a time; it takes
 *     its epoch step when bee_run_step_due says so, waits for the round,
 *     and steps as train.c does (a state that replaces the step, a state
 *     of the round's own epoch under the step, bee_run_step_diverges).
 *     Parameters are a 64-bit "line": a step with a round's mean turns
 *     line L into H(L, the round), so members of one round that came in
 *     on one line leave on one line, and a bee that steps alone leaves
 *     every other line;
 *   - the DHT: records (progress, donors, metrics, the matchmaking's
 *     declarations) stored and read back after dht_ms, kept until their
 *     expiration, as a DHT node keeps them;
 *   - the averager: the real matchmaking core (averager's avg_match),
 *     its messages carried with each pair's latency; the round a model:
 *     it runs once every member has begun (a member that does not begin
 *     within 5 s of the first, or of its last WAIT, is dropped, as the
 *     round's sender timeout drops it), and lasts what moving the
 *     buffer's bytes over the members' links takes (butterfly: each
 *     member sends and receives 2 (N-1)/N of it);
 *   - state downloads: chunk requests answered by the donor (with its
 *     upload slots, bee_uploads) after a round trip and the chunk's time
 *     on the link, a stream's rate capped at window / RTT as TCP's is.
 *
 * Links are per pair of regions: round-trip time and Mbit/s.  Bees can be
 * killed (gone at once, no goodbye; their connections close) or vanish
 * (their connections stay silent), restarted from a checkpoint some
 * epochs old, and started late.  Every step is recorded; swarmsim_check
 * says, per epoch, whether every bee that stepped took the same step, and
 * counts the waste: samples computed but not in the epoch's line,
 * downloads, splits.  Deterministic for a seed.
 */
#ifndef BEE_SWARMSIM_H
#define BEE_SWARMSIM_H

#include "run.h"

#include <stdio.h>

#define SWARMSIM_REGIONS_MAX 8
#define SWARMSIM_UNIX0 1800000000000ull /* wall clock at fake ms 0 */

typedef struct swarmsim swarmsim;

typedef struct swarmsim_config {
  const bee_config *cfg; /* every bee's flags (borrowed) */
  size_t bees;           /* started at 0 */
  size_t slots;          /* bees there may be in all (restarts take a new
                            slot); at least bees */
  uint64_t seed;
  /* Bee i lives in region i % nregions, unless region_of says. */
  size_t nregions;
  double rtt_ms[SWARMSIM_REGIONS_MAX][SWARMSIM_REGIONS_MAX];
  double mbit[SWARMSIM_REGIONS_MAX][SWARMSIM_REGIONS_MAX];
  double window_bytes;     /* one TCP stream's window (0: no cap) */
  double rate_lo, rate_hi; /* samples/s of each bee, drawn in [lo, hi] */
  double model_bytes;      /* the buffer a round moves */
  double state_bytes;      /* and a download (0: model_bytes) */
  size_t state_chunks;     /* chunks a download asks for */
  uint64_t dht_ms;         /* a DHT store or read */
} swarmsim_config;

/* Per-bee counters over its life (a restarted bee is a new life). */
typedef struct swarmsim_life {
  uint64_t started_ms;
  bool killed;
  uint64_t downloads; /* states it loaded */
  double download_s;  /* the last one took this long */
  uint64_t loaded_ms; /* when the last was loaded */
  uint64_t formed_ms; /* when its last group formed ahead (0: never) */
  uint64_t begun_ms;  /* when it last began a round (0: never) */
  uint64_t steps_polled;   /* its core's, kept when it died */
  uint64_t match_timeouts; /* matchmakings that ran to their deadline */
} swarmsim_life;

/* What swarmsim_check found over the epochs from..to. */
typedef struct swarmsim_report {
  uint64_t epochs;       /* epochs with at least one step */
  uint64_t steps;        /* steps taken */
  uint64_t split_epochs; /* epochs whose steps left more than one line */
  uint64_t alone;        /* steps without a round (not averaged) */
  uint64_t swarm_steps;  /* the swarm's step taken for a round missed */
  uint64_t off_line;     /* steps whose line is not the epoch's main one */
  uint64_t samples;      /* computed, in those epochs' steps */
  uint64_t wasted;       /* of them, in steps off the main line, left
                            out of the swarm's step taken instead, and
                            thrown away by loads */
  uint64_t downloads;    /* states loaded, all bees */
  uint64_t splits;       /* split verdicts, all bees */
  uint64_t orphans;      /* lines taken up with none in line, all bees */
  uint64_t max_group;    /* largest group */
  uint64_t min_group;    /* smallest group of an averaged step */
  uint64_t steps_polled; /* of the swarm's steps taken, those asked of the
                            donors while their records said they were
                            still at the epoch (all bees) */
} swarmsim_report;

/* Makes the swarm and starts c->bees bees at time 0 (the first one alone,
 * the others joining it).  Returns NULL on a bad config. */
swarmsim *swarmsim_new(const swarmsim_config *c);
void swarmsim_free(swarmsim *s);
/* Runs the events until the clock reaches until_ms. */
void swarmsim_run(swarmsim *s, uint64_t until_ms);
uint64_t swarmsim_now(const swarmsim *s);
/* The highest epoch a live bee has stepped to. */
uint64_t swarmsim_epoch(const swarmsim *s);
size_t swarmsim_alive(const swarmsim *s);
/* The live bees' x, a coordinate of their parameters that starts at each
 * bee's slot number and that a state round (--average-state-every) sets
 * to its round's mean: its largest less its smallest (0 when they
 * agree). */
double swarmsim_spread(const swarmsim *s);
bool swarmsim_is_alive(const swarmsim *s, size_t bee);
/* Kills bee (its records stay in the DHT until they expire).  Its
 * connections close (a process killed): a round it was in drops it at
 * once (avg_round_gone). */
void swarmsim_kill(swarmsim *s, size_t bee);
/* The same, but its connections do not close (a VM gone from the
 * network): a round it was in waits out its sender timeout, or its
 * reducer timeout if that round runs, and a download it served gets no
 * answer to the chunks asked of it. */
void swarmsim_vanish(swarmsim *s, size_t bee);
/* The next round of every live bee fails for it (BEE_ETIMEOUT, nothing
 * averaged), as when a member of their group vanished in the round on
 * links slow enough that the round's deadline came first. */
void swarmsim_fail_rounds(swarmsim *s);
/* Whether bee's worker is out of line now. */
bool swarmsim_diverged(const swarmsim *s, size_t bee);
/* Starts a bee in a new slot (returns it, SIZE_MAX when none is left):
 * fresh (behind = -1: no state), or as bee `of` restarted from its
 * checkpoint `behind` epochs before the last epoch it reached
 * (--resume).  region: SIZE_MAX for of's (or slot % nregions). */
size_t swarmsim_start(swarmsim *s, size_t of, int behind, size_t region);
/* The life of the bee in slot. */
const swarmsim_life *swarmsim_life_of(const swarmsim *s, size_t bee);
/* The first step of bee's that left its epoch's main line (the one most
 * of the epoch's steps left): its epoch and time.  False when none. */
bool swarmsim_in_line(const swarmsim *s, size_t bee, uint64_t *epoch,
                      uint64_t *ms);
/* When the first step at epoch was taken (ms); UINT64_MAX: none yet. */
uint64_t swarmsim_step_ms(const swarmsim *s, uint64_t epoch);
/* The steps of epochs from..to (inclusive) and the waste. */
void swarmsim_check(const swarmsim *s, uint64_t from, uint64_t to,
                    swarmsim_report *r);
/* Every step taken so far, one line each (time, bee, epoch, samples,
 * status, group, line), to f: for a case that fails.  With
 * SWARMSIM_TRACE=N in the environment, bee N's events and its core's
 * debug lines go to stderr as they happen. */
void swarmsim_dump(const swarmsim *s, FILE *f);
/* The four regions of the study's runs (us, eu, asia, aus): its
 * round-trip times and bandwidths, into c. */
void swarmsim_four_continents(swarmsim_config *c);

#endif /* BEE_SWARMSIM_H */
