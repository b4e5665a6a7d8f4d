/* run-int.h: what the files of the run core share (daemon/).
 *
 * The core (run.h) owns its state in four parts, each in a file of its
 * own, and one file that ties them together:
 *
 *   run-view.c   bee_view: the swarm view from the others' progress
 *                records, the candidates for a round, the donors, the
 *                members of the last group counted at the epoch they
 *                stepped to, and the guide for the worker
 *   run-fetch.c  bee_fetch: a state download, chunk by chunk, from the
 *                donors in turn, and when one should wait
 *   run-line.c   bee_lines: the metrics record with this bee's last
 *                averaged steps, the split check and the resync (which
 *                peers to load the state from)
 *   run-round.c  bee_rounds: the group formed ahead, the round the
 *                worker asks for, and a matchmaking the swarm left
 *   run.c        bee_run: the events and the tick, the progress and
 *                donor records, when training starts; it routes one
 *                part's outcome to another
 *
 * Calls go one way: run.c calls the parts; run-round.c and run-fetch.c
 * read the view; no part calls run.c.  Nothing outside these files (and
 * the core's tests) includes this header.
 */
#ifndef BEE_DAEMON_RUN_INT_H
#define BEE_DAEMON_RUN_INT_H

#include "run.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define COMP "train"
#define VIEW_MS 1000 /* how often the swarm's records are read */
#define MATCH_GRACE_MS                                                         \
  2000 /* no group this long after --matchmaking-time:
                               the local step */
/* A group formed ahead whose round we have not begun hears from us this
 * often (WAIT), well within the round's sender timeout (5 s)... */
#define AHEAD_WAIT_MS 2000
/* ...and no longer than this after our round was expected. */
#define AHEAD_WAIT_LATE_MS 10000
/* Views in a row with nobody else at the epoch of a matchmaking: it ends
 * (a read of the DHT may miss a record now and then). */
#define DESERTED_VIEWS 2
#define ROUND_DEADLINE_MS 30000
#define MIN_EPOCH_S 2.0 /* epochs shorter than this are not shared */
/* A swarm whose epochs are shorter than this does not count a group's
 * members at the epoch they stepped to (bee__view_stepped): there the
 * members' start skew and a round's own time are the epoch. */
#define STEPPED_MIN_EPOCH_S 0.1
#define STATE_CHUNK (1u << 20)    /* bytes asked per request, by default */
#define FETCH_BACKOFF_MS 1000     /* every donor busy: the first wait */
#define FETCH_BACKOFF_MAX_MS 8000 /* and the longest */
#define FETCH_PASSES 3            /* failed passes before training on */
#define LAYOUT_WARNED_MAX 32      /* peers of another layout remembered */
#define DONOR_REFRESH_MS 10000    /* the donor record, at least this often */
#define DONOR_TTL_S 30            /* and it lives this long */
/* A loaded bee's record in the others' views: the next publish and read
 * (bee__fetch_join_s). */
#define FETCH_TRAVEL_S 1.5
/* After a download, catch up before another (or twice what the download
 * took). */
#define FETCH_SETTLE_MS 10000
#define DONORS_MAX 16
#define FETCH_DONORS 4      /* donors one download asks at once */
#define FETCH_WINDOW 4      /* chunk requests on their way to each */
/* A donor with requests on their way that answered none for this long
 * leaves the download (bee__fetch_tick).  Counted from its last answer,
 * not from each request: on a slow link the last of a window's requests
 * is answered a window's transfer time after it was asked. */
#define FETCH_STALL_MS 10000
#define FETCH_RESTARTS 2    /* starts over on a newer snapshot, at most */
#define START_WAIT_MS 3000  /* a first view before training, at most */
#define METRICS_TTL_S 300   /* a metrics record lives this long */
#define RESYNC_MS 2000      /* diverged: the peers' metrics, read this often */
#define ORPHAN_EPOCHS 2     /* a metrics record this near the view is live */
/* A round that missed the swarm's while its peers are still at the epoch
 * waits for their step this long at most: a round's end at the latest
 * (the daemon's ROUND_DEADLINE_MS). */
#define STEP_WAIT_MS 30000
/* Meanwhile the donors are asked for that step this often: their records
 * say they stepped a second or two after they did. */
#define STEP_POLL_MS 250
#define SPLIT_MS 4000       /* in line: the same, to see a split */
#define SPLIT_PEERS_STEP 32 /* and SPLIT_MS later per this many peers */
#define LINES_RING 16       /* own steps remembered for that */
/* DiLoCo: a bee more than this from its inner steps' end when the other
 * peers at its epoch have taken theirs takes its round with the steps it
 * has (bee_run_step_due). */
#define OUTER_LAG_MIN_S 1.0
#define READY_MAX_S 600.0 /* a group formed ahead waits at most this long */

/* ---- the view (run-view.c) ------------------------------------------- */

typedef struct bee_view {
  const bee_config *cfg;
  proto_swarm_view view;
  bool have;           /* a view was made */
  uint64_t cand_epoch; /* the epoch the candidates were counted for */
  size_t candidates;   /* bee_round_candidates, by the last view */
  /* --group-size: the ids of the peers at cand_epoch, one behind or one
   * ahead, this bee's too, sorted: the ranks of the run's grid
   * (bee_grid_group_of).  At one epoch the list only grows, as the
   * candidates' count does. */
  uint8_t (*grid_ids)[PROTO_ID_BYTES];
  size_t ngrid, grid_cap;
  /* This bee's group on that grid in turn grid_turn and its members'
   * ranks (grid_size of them), made by bee__view_grid once per list and
   * turn rather than at every tick. */
  bool grid_made;
  uint64_t grid_turn;
  bee_grid_group grid;
  size_t *grid_ranks;           /* (--group-size) */
  uint8_t self[PROTO_ID_BYTES]; /* this bee's id */
  /* Donors: peers at the swarm's epoch by the last view, the closest to
   * this bee's id first. */
  uint8_t donors[DONORS_MAX][PROTO_ID_BYTES];
  size_t ndonors;
  /* The others' records of the last read and their owners, for the view
   * taken again right after a step (run.c's view_again). */
  proto_progress *seen;
  uint8_t (*seen_ids)[PROTO_ID_BYTES];
  size_t nseen, seen_cap;
  /* The other members of the group of the last update round, stepping to
   * stepped_epoch at stepped_ms (unix ms), sorted by id:
   * bee_progress_stepped. */
  uint8_t (*stepped_ids)[PROTO_ID_BYTES];
  size_t nstepped, stepped_cap;
  uint64_t stepped_epoch, stepped_ms;
  /* DiLoCo: the others at the swarm's epoch will have taken their inner
   * steps then (monotonic ms; 0: unknown). */
  uint64_t swarm_due_ms;
  bee_run_guide guide; /* what the worker was told last */
} bee_view;

void bee__view_init(bee_view *v, const bee_config *cfg,
                    const uint8_t self[PROTO_ID_BYTES]);
void bee__view_close(bee_view *v);
/* Keeps the others' records of a read (owners in ids) for
 * the view taken again after a step; when memory runs short, none. */
void bee__view_keep(bee_view *v, const proto_progress *all,
                    const uint8_t (*ids)[PROTO_ID_BYTES], size_t n);
/* The view from the others' records all[0..n) and our own, own (written
 * at all[n]; all has room for n + 1): the group's members counted at the
 * epoch they stepped to, the candidates for the worker's round (w), the
 * donors (unless keep_donors: a download uses them), the guide (join_s:
 * what joining an epoch takes, for join_fits), written to *g.  rate is
 * ours.  Returns the candidates counted afresh. */
size_t bee__view_set(bee_view *v, proto_progress *all,
                     const uint8_t (*ids)[PROTO_ID_BYTES], size_t n,
                     const proto_progress *own, const bee_run_worker *w,
                     bool keep_donors, double join_s, uint64_t now_ms);
/* The group of an update round that stepped to epoch at unix_ms (g NULL:
 * none ran); forgets the last one. */
void bee__view_stepped(bee_view *v, const avg_group *g, uint64_t epoch,
                       uint64_t unix_ms);
/* --group-size in a run larger than a group, by the view at epoch: true,
 * with this bee's group *g in the grid's turn `turn` (run-round.c's
 * grid).  False where the run is one group of all, or no view at epoch
 * is there yet. */
bool bee__view_grid(bee_view *v, uint64_t epoch, uint64_t turn,
                    bee_grid_group *g);
/* In such a run, whether another member of this bee's group for the
 * state round of epoch (at its start, in turn `turn`) may still come to
 * it, by the last read: one at epoch - 1, or at epoch without samples
 * yet (the state round comes before them).  Members past it or
 * computing at it took theirs already, and a bee that came to the epoch
 * late would wait out a matchmaking for nobody. */
bool bee__view_state_due(bee_view *v, uint64_t epoch, uint64_t turn);
/* The swarm's epoch time by the view (DiLoCo: a round), -1 unknown. */
double bee__view_epoch_s(const bee_view *v);
/* Whether id a is closer to self than id b is, by XOR distance. */
bool bee__closer(const uint8_t self[PROTO_ID_BYTES], const uint8_t *a,
                 const uint8_t *b);
/* The others' samples at the view's epoch by now_ms (the guide's). */
double bee__guide_others_now(const bee_run_guide *g, uint64_t now_ms);

/* ---- the download (run-fetch.c) --------------------------------------- */

typedef struct bee_fetch {
  const bee_config *cfg;
  const bee_run_io *io;
  const bee_view *view; /* the swarm's epoch, for the steps to take */
  size_t state_bytes;
  size_t step_bytes; /* a step's: the parameters' (0: no steps) */
  uint32_t chunk;    /* bytes asked per request */
  size_t nchunks;    /* the blob's now */
  /* What the download fetches now: the state, or the swarm's step from
   * step_epoch; after the state, the steps that came meanwhile. */
  bool stepping;
  uint64_t step_epoch;
  bool for_round; /* one step, for the worker's round that missed */
  bool poll;      /* for_round, asked before its peers are known to have
                     stepped: a donor without it yet is no failure */
  uint8_t *state; /* the state, whole, while the steps come */
  uint64_t state_epoch;
  struct fetch_step {
    uint8_t *buf; /* NULL: a step that changed nothing */
    size_t len;
    uint64_t epoch;
  } steps[BEE_RUN_CATCHUP_MAX];
  size_t nsteps;
  bool on;      /* a download is under way */
  uint64_t gen; /* its pass, in its requests' tags */
  /* The donors offered (the view's, ranked by their records). */
  uint8_t cand[DONORS_MAX][PROTO_ID_BYTES];
  size_t ncand;
  /* The donors of this pass, in the candidates' order: at most
   * FETCH_DONORS in the download at once, the next candidate taking the
   * place of one that leaves.  An entry's index is in its requests'
   * tags, so entries are never reused within a pass. */
  struct fetch_donor {
    uint8_t id[PROTO_ID_BYTES];
    bool active;       /* in the download */
    bool ready;        /* its probe named the download's snapshot */
    bool admitted;     /* it answered the probe: it holds a slot for us */
    unsigned inflight; /* requests on their way */
    uint64_t heard_ms; /* its last answer, or the request that found none
                          on their way (monotonic ms) */
    size_t chunks;     /* chunks it served */
  } d[DONORS_MAX];
  size_t nd, next_cand; /* entries; the next to bring in */
  uint8_t self[PROTO_ID_BYTES]; /* this bee's: the candidates' order */
  bool single; /* this pass is from one donor (a whole that failed) */
  /* Each chunk: to ask, asked (of `by`, and a second time of `also`),
   * or in; done chunks keep who served them. */
  struct fetch_chunk {
    uint8_t state;
    size_t by, also;
  } *chunks;
  size_t next_todo, got;
  /* The snapshot assembled (by the first probe's answer). */
  bool have_ref;
  uint8_t *buf;
  uint64_t total, epoch;
  uint8_t sum[PROTO_STATE_SUM_BYTES];
  char why[160];
  unsigned restarts;     /* on a newer snapshot, this download */
  uint64_t shown;        /* percent last logged */
  unsigned busy;         /* donors of this pass that were busy */
  unsigned failed;       /* passes in a row that failed (none busy) */
  uint64_t start_ms;     /* this pass began */
  uint64_t settle_ms;    /* no new download for being behind before then */
  uint64_t retry_ms;     /* every donor busy: ask again from then */
  uint64_t backoff_ms;   /* and the wait after the next such pass */
  double last_s;         /* the last download took this long (0: none) */
  uint64_t loads, bytes; /* counters */
} bee_fetch;

/* What a download's answer came to. */
enum {
  FETCH_GOING = 0, /* it goes on */
  FETCH_LOADED,    /* done: *state (heap, the caller's) of *epoch, and
                      the steps after it in steps[0..nsteps) (the
                      caller's, and nsteps zeroed) */
  FETCH_WAITING,   /* no donor could serve it now: asked again later */
  FETCH_GAVE_UP,   /* no donor could serve it, FETCH_PASSES times */
  FETCH_STEP,      /* for_round: the step is steps[0] (the caller's) */
  FETCH_NO_STEP,   /* for_round: no donor had it */
  FETCH_NOT_YET    /* for_round, poll: no donor had it yet */
};

void bee__fetch_init(bee_fetch *f, const bee_config *cfg, const bee_run_io *io,
                     const bee_view *view, size_t state_bytes,
                     size_t step_bytes, uint32_t chunk,
                     const uint8_t self[PROTO_ID_BYTES]);
void bee__fetch_close(bee_fetch *f);
/* Starts a download from donors[0..n) (copied): their donor records
 * first, unless the DHT cannot be asked.  Returns as bee__fetch_chunk. */
int bee__fetch_start(bee_fetch *f, const uint8_t (*donors)[PROTO_ID_BYTES],
                     size_t n);
/* Fetches the swarm's step from epoch (for the worker's round that
 * missed it) from donors[0..n).  With poll, while the donors may still be
 * at the epoch: FETCH_NOT_YET where none has it, and their "no such step"
 * is not logged.  Returns as bee__fetch_chunk. */
int bee__fetch_step(bee_fetch *f, const uint8_t (*donors)[PROTO_ID_BYTES],
                    size_t n, uint64_t epoch, bool poll);
/* The donor records read (status 0): the donors with free slots first.
 * Returns as bee__fetch_chunk. */
int bee__fetch_donors(bee_fetch *f, int status, const proto_donor *v,
                      const uint8_t (*ids)[PROTO_ID_BYTES], size_t n);
/* The answer to the request tagged tag (io.chunk's).  Returns FETCH_*. */
int bee__fetch_chunk(bee_fetch *f, uint64_t tag, int status,
                     int64_t remote_code, const proto_state_msg *m);
/* What a bee that downloads the state needs before the swarm counts it
 * in an epoch's group: the last download's time, the matchmaking ahead
 * and the records' travel. */
double bee__fetch_join_s(const bee_fetch *f);
/* At each tick: donors silent for FETCH_STALL_MS leave the download, and
 * their chunks go to the others.  Returns as bee__fetch_chunk. */
int bee__fetch_tick(bee_fetch *f);

/* ---- the lines and the split check (run-line.c) ---------------------- */

typedef struct bee_lines {
  const bee_config *cfg;
  const bee_run_io *io;
  /* This bee's last averaged steps: the parameters' hash after each and
   * its group's size. */
  bee_line ring[LINES_RING];
  size_t n;
  bool split_busy, resync_busy;
  uint64_t split_ms, resync_ms;
  /* After a split: the peers of the line that won, the only donors. */
  uint8_t split_ids[DONORS_MAX][PROTO_ID_BYTES];
  size_t nsplit;
  /* Peers seen declaring another layout, warned about once each. */
  uint8_t layout_warned[LAYOUT_WARNED_MAX][PROTO_ID_BYTES];
  size_t nlayout_warned;
  uint64_t metrics_exp; /* the last metrics record's expiration */
  uint64_t splits;
} bee_lines;

void bee__lines_init(bee_lines *l, const bee_config *cfg, const bee_run_io *io);
void bee__lines_close(bee_lines *l);
/* The metrics record of one step; an averaged step joins the ring. */
void bee__lines_publish(bee_lines *l, const bee_run_step *s, double rate);
/* A peer that declared another layout (warned about once). */
void bee__lines_other_layout(bee_lines *l, const uint8_t id[PROTO_ID_BYTES]);
/* The split check's read (in line) or the resync's (out of line, from
 * epoch `from`), when due.  peers: the run's, by the view.  A run in
 * groups of --group-size (grouped: the guide's) has a line per group by
 * design: no split check there. */
void bee__lines_check(bee_lines *l, bool diverged, bool grouped, uint64_t peers,
                      uint64_t now_ms, uint64_t every_ms);
/* The split check's answer: true when this bee's line lost (it is to be
 * marked out of line at *epoch). */
bool bee__lines_split(bee_lines *l, const proto_metrics *v,
                      const uint8_t (*ids)[PROTO_ID_BYTES], size_t n,
                      uint64_t *epoch);
/* When the resync finds no donor: whether no peer of the run is in line
 * at all (each recent metrics record, within ORPHAN_EPOCHS of the view's
 * epoch, out of line too; a swarm whose round failed for every member
 * at once, each then stepping alone) and this bee is the lowest id of
 * those out of line, of which it sees one at least: its line becomes
 * the run's, and the others load its state.  *others: the other peers
 * out of line. */
bool bee__lines_orphaned(const bee_lines *l, const proto_metrics *v,
                         const uint8_t (*ids)[PROTO_ID_BYTES], size_t n,
                         uint64_t view_epoch,
                         const uint8_t self[PROTO_ID_BYTES], size_t *others);
/* The resync's answer: the donors to load from (out, of the view's
 * donors), their number; 0: none yet. */
size_t bee__lines_resync(bee_lines *l, const proto_metrics *v,
                         const uint8_t (*ids)[PROTO_ID_BYTES], size_t n,
                         uint64_t from, const bee_view *view,
                         uint8_t out[DONORS_MAX][PROTO_ID_BYTES]);

/* ---- the rounds (run-round.c) ------------------------------------------ */

/* AHEAD_MISSED: the matchmaking ahead learnt that the epoch's group had
 * formed without this bee (BEE_EMISSED). */
enum { AHEAD_NONE, AHEAD_MATCHING, AHEAD_HELD, AHEAD_FAILED, AHEAD_MISSED };

typedef struct bee_rounds {
  const bee_config *cfg;
  const bee_run_io *io;
  void (*over)(void *ctx, const bee_run_result *r);
  void *over_ctx;
  /* The round's end is held while the swarm's step for its epoch is
   * fetched (run.c): no other round meanwhile. */
  bool taking_step;
  bool take_steps;  /* the swarm's steps can be taken (peers keep them) */
  bool averaging;   /* a round (or its matchmaking) is under way */
  bool round_ahead; /* and its group formed ahead */
  bool stopped;
  /* The group for the coming epoch's round, formed ahead: from
   * --matchmaking-time before the swarm's estimated end of the epoch,
   * while the worker computes its last batches. */
  struct {
    int state; /* AHEAD_* */
    uint64_t epoch;
    uint64_t t0_ms;    /* the matchmaking began */
    uint64_t wait_ms;  /* our last WAIT to its members */
    uint64_t ready_ms; /* when its round was expected to run */
    avg_group g;
    proto_group_member *gm; /* g's members (gm_cap) */
    size_t gm_cap;
  } ahead;
  /* A matchmaking whose epoch the swarm left (bee__rounds_deserted): the
   * views in a row that found nobody else for it, the epoch they were
   * for, and whether the cancel that ends it is ours (its answer then
   * says alone). */
  unsigned deserted;
  uint64_t deserted_epoch;
  bool deserted_cancel;
} bee_rounds;

/* The end of every round the worker asked for goes to over(over_ctx,
 * result), which hands it to the worker (run.c: or first fetches the
 * swarm's step for a round that missed it). */
void bee__rounds_init(bee_rounds *o, const bee_config *cfg,
                      const bee_run_io *io,
                      void (*over)(void *ctx, const bee_run_result *r),
                      void *over_ctx);
void bee__rounds_close(bee_rounds *o);
/* Matchmaking ahead, when the swarm is expected at the target within
 * --matchmaking-time. */
void bee__rounds_ahead(bee_rounds *o, bee_view *v, double rate,
                       uint64_t now_ms);
/* Starts the round the worker asked for, if it asked and none runs. */
void bee__rounds_start(bee_rounds *o, bee_view *v);
/* Answers. */
void bee__rounds_matched(bee_rounds *o, bee_view *v, int status,
                         const avg_group *g);
void bee__rounds_done(bee_rounds *o, bee_view *v, const avg_node_result *res);
/* A view from a read (others: the others' records): ends a matchmaking
 * for an epoch nobody else may come to any more; fresh is the candidates
 * counted afresh. */
void bee__rounds_deserted(bee_rounds *o, bee_view *v,
                          const proto_progress *others, size_t n, size_t fresh);
/* A state of load_epoch was loaded: a matchmaking the worker waits on for
 * it or an earlier epoch ends. */
void bee__rounds_moot(bee_rounds *o, uint64_t load_epoch);
/* Leaves the group formed ahead, with why. */
void bee__rounds_drop(bee_rounds *o, const char *why);
/* Every tick: WAIT to the group formed ahead while it waits for us. */
void bee__rounds_tick(bee_rounds *o, uint64_t now_ms);

/* ---- the core ---------------------------------------------------------- */

struct bee_run {
  const bee_config *cfg;
  bee_run_io io;
  bee_view view;
  bee_fetch fetch;
  bee_lines lines;
  bee_rounds rounds;
  bool started, stopped;
  bee_rate rate;
  bee_publisher pub;
  bool put_busy, put_warned, get_busy;
  uint64_t last_get_ms;
  uint64_t behind_warned; /* the swarm epoch last warned about */
  bool short_warned;      /* epochs too short to share: said once */
  uint64_t started_ms;
  /* In the DHT through a --join target (or none was given, or every one
   * was this node): only then may the bee find itself alone and start
   * the run; and since when. */
  bool joined, expect_join;
  uint64_t joined_ms;
  uint64_t wait_logged_ms; /* --min-peers, --join: the last "waiting" */
  uint64_t status_ms;      /* the last status line */
  /* Our donor record under "<run>_donors": what we serve, and how many
   * more downloads we would start now. */
  bool donor_busy, donor_any;
  uint64_t donor_epoch, donor_slots, donor_ms, donor_exp;
  uint64_t resyncs;
  uint64_t orphans;      /* bee__lines_orphaned's verdicts for this bee */
  uint64_t steps_taken;  /* the swarm's steps taken instead of downloads */
  uint64_t steps_polled; /* of them, by step_poll */
  bee_run_result missed; /* a round's end held while its step comes */
  /* Its peers still at the missed round's epoch: the step is waited for
   * until they step past it, or until step_wait_until; the donors are
   * asked for it from step_poll_ms, every STEP_POLL_MS. */
  bool step_waits;
  uint64_t step_wait_epoch, step_wait_until, step_poll_ms;
  /* The other peers of its layout at the view's epoch, by the last
   * read (alike_epoch). */
  uint64_t alike_epoch;
  size_t alike_at_epoch;
};

#endif /* BEE_DAEMON_RUN_INT_H */
