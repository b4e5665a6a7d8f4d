/* swarmsim-int.h: what the two files of the swarm simulator share
 * (tests/).  swarmsim.c holds the world (the event queue, the DHT's
 * records, the worker, the bees, the checks); swarmsim-avg.c the
 * averager's part (the matchmaking core and its messages, the round's
 * model) and the state downloads.  Nothing else includes it.
 */
#ifndef BEE_SWARMSIM_INT_H
#define BEE_SWARMSIM_INT_H

#include "swarmsim.h"
#include "testlib.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SENDER_TIMEOUT_MS 5000   /* the round's sender timeout */
#define REDUCER_TIMEOUT_MS 15000 /* and its reducer timeout */
#define CALL_TIMEOUT_MS 10000  /* a chunk request's */
#define SCHEMA_BYTE 0xab

/* ---- the world ------------------------------------------------------------ */

enum {
  EV_TICK,   /* the bee's tick */
  EV_BATCH,  /* a batch computed */
  EV_WORKER, /* the worker wakes (a round over, a go) */
  EV_ASYNC,  /* the worker's news reach the loop */
  EV_PUT_PROGRESS,
  EV_GET_PROGRESS,
  EV_PUT_DONOR,
  EV_GET_DONORS,
  EV_GET_METRICS, /* arg: which */
  EV_MATCH_MSG,   /* a matchmaking message, from `from` */
  EV_MATCH_FETCH, /* the declarations read */
  EV_MATCH_TICK,
  EV_MATCH_DONE,  /* a matchmaking's answer to the core (ahead) */
  EV_ROUND_CHECK, /* a round's timeouts; arg: round id */
  EV_ROUND_DONE,  /* arg: round id */
  EV_CHUNK,       /* a chunk's answer */
  EV_ROUND_BEGIN  /* a round with a group formed ahead begins */
};

typedef struct event {
  uint64_t at, seq;
  int kind;
  size_t bee;
  unsigned gen;
  size_t from;
  uint64_t arg;
  uint8_t *data; /* heap, freed after delivery */
  size_t len;
  int status;
  int64_t code;
  uint64_t tag; /* a chunk request's */
  proto_state_msg chunk;
} event;

/* A round of a group, shared by its members. */
typedef struct sround {
  uint8_t gid[PROTO_AVG_GROUP_BYTES];
  uint64_t id; /* the simulator's */
  size_t n;
  size_t *bee;        /* (n) slots */
  unsigned *gen;      /* (n) their generations */
  double *weight;     /* (n) */
  int *st;            /* (n) RS_* */
  uint64_t *start_ms; /* (n) */
  uint64_t *wait_ms;  /* (n) the last WAIT */
  uint64_t first_ms;  /* the first member began; UINT64_MAX: none yet */
  bool done;
  uint64_t done_ms; /* an EV_ROUND_DONE before it is stale */
  uint64_t key; /* the mean's identity: the line step's input */
  double x;     /* the mean of its members' x */
  bool live;
} sround;

enum { RS_WAITING, RS_STARTED, RS_LEFT, RS_DROPPED, RS_DEAD };

/* One recorded step. */
typedef struct srec {
  uint64_t epoch, line, samples;
  uint64_t ms; /* when it was taken */
  size_t bee;
  int status;
  size_t group;
} srec;

/* A snapshot a donor serves (and a checkpoint): epoch and line. */
typedef struct ssnap {
  uint64_t epoch, line;
} ssnap;

/* Samples a load threw away: computed at epoch, not stepped with. */
typedef struct sthrow {
  uint64_t epoch, samples;
} sthrow;

#define SNAPS_KEPT 32
/* Steps a bee keeps for peers, at most (the room; s->steps_kept: as
 * train.c, within two states' bytes). */
#define SIM_STEPS_KEPT 8

/* A record in the DHT, in two copies: [0] stored, [1] on its way (stored
 * from vis_ms on).  A read sees the newer once it is stored, the older
 * until then, as a DHT node keeps the old value until a new one
 * replaces it. */
typedef struct sslot {
  bool has, pending;
  uint64_t vis_ms;
  uint64_t exp_ms[2]; /* fake ms */
} sslot;

typedef struct sbee {
  swarmsim *s;
  size_t idx;
  unsigned gen;
  bool alive;
  bool vanished; /* died without its connections closing */
  bool fail_round; /* its next round fails (swarmsim_fail_rounds) */
  uint8_t id[PROTO_ID_BYTES];
  size_t region;
  double rate;
  bee_run *core;
  bee_run_io io;
  swarmsim_life life;
  /* A coordinate of its parameters beside the line, one the gradient
   * steps move alike for every bee: a state round sets it to the round's
   * mean, so the spread over the bees says how far groups of
   * --group-size have mixed.  Loads leave it. */
  double x;
  /* the worker */
  struct {
    uint64_t epoch, samples;
    bool go, waiting, computing;
    bool load;
    uint64_t load_epoch, load_line;
    bool diverged;
    uint64_t diverged_epoch;
    bool avg_req, avg_done, avg_state;
    uint64_t avg_epoch;
    double avg_weight;
    bee_run_result res;
    uint64_t n_at_step; /* the step's own samples */
    uint64_t mean_key;  /* what the step adds: the round's mean or ours */
    double mean_x;      /* and x after a state round */
    bool mean_round;    /* the round's mean (not ours, nor the swarm's) */
    bee_run_guide guide;
    uint64_t line;
    bool snap;
    ssnap snapshot;
    uint64_t pend_samples;
    double pend_s;
    /* the steps it took, the newest last, for peers to take (a step of
     * key 0 changed nothing) */
    ssnap steps[SIM_STEPS_KEPT];
    size_t nsteps;
    /* the swarm's steps to take after a load */
    ssnap replay[BEE_RUN_CATCHUP_MAX];
    size_t nreplay;
  } w;
  ssnap kept[SNAPS_KEPT]; /* the last checkpoints, by epoch */
  /* the averager */
  avg_match *m;
  bool m_ahead;    /* a matchmaking for bee_run_matched (else a round) */
  bool cancelling; /* the matchmaking is being freed (io.cancel, a kill):
                     its answer comes inside */
  bee_run_avg req;
  uint64_t m_tick_seq; /* the queued tick's, to drop stale ones */
  sround *round;       /* the round we are in */
  bool beginning;      /* and one to begin (EV_ROUND_BEGIN) */
  size_t round_member;
  /* uploads served */
  bee_uploads uploads;
  /* when the stream from each donor (by slot) is free again: chunks on
   * one connection come one after the other */
  uint64_t *stream_free;
  /* its records in the DHT: each the one stored and the one on its way */
  sslot progress_slot, donor_slot, metrics_slot, decl_slot;
  proto_progress progress[2];
  proto_donor donor[2];
  proto_metrics metrics[2];
  avg_decl decl[2];
} sbee;

struct swarmsim {
  swarmsim_config c;
  uint64_t now;
  uint64_t seq;
  uint64_t rng;
  event *q; /* heap */
  size_t nq, capq;
  sbee *b;   /* (c.slots) */
  size_t nb; /* slots used */
  sround **rounds;
  size_t nrounds, caprounds;
  uint64_t round_ids;
  srec *recs;
  size_t nrecs, caprecs;
  sthrow *thrown; /* samples loads threw away */
  size_t nthrown, capthrown;
  size_t state_bytes;
  size_t step_bytes; /* a step's, as the cores see it */
  size_t steps_kept; /* steps a bee keeps for peers */
  /* Scratch for the reads (slots entries each). */
  proto_progress *rd_progress;
  proto_donor *rd_donors;
  proto_metrics *rd_metrics;
  avg_decl *rd_decls;
  uint8_t (*rd_ids)[PROTO_ID_BYTES];
};

/* ---- swarmsim.c ------------------------------------------------------- */

/* calloc and realloc that abort when memory runs out. */
void *sim__xcalloc(size_t n, size_t size);
void *sim__xrealloc(void *p, size_t size);
uint64_t sim__unix_ms(const swarmsim *s);
/* Queues e (its seq is set here). */
void sim__push(swarmsim *s, event e);
/* Queues an event of kind for b at when. */
void sim__at(swarmsim *s, uint64_t when, int kind, const sbee *b, uint64_t arg);
/* The pair's round trip, ms, and one stream's rate, bytes per ms. */
double sim__rtt(const swarmsim *s, const sbee *a, const sbee *b);
double sim__stream_bpms(const swarmsim *s, const sbee *a, const sbee *b);
/* The bee whose id this is, or NULL. */
sbee *sim__by_id(swarmsim *s, const uint8_t id[PROTO_ID_BYTES]);
uint64_t sim__mix(uint64_t a, uint64_t b);
/* A record's two copies: stores the one on its way (returned, to be
 * filled), reads the one a read at now sees (NULL: none). */
void *sim__slot_store(sslot *sl, void *copies, size_t size, uint64_t now,
                      uint64_t vis, uint64_t exp);
const void *sim__slot_read(const sslot *sl, const void *copies, size_t size,
                           uint64_t now);
/* A step's bytes (s->step_bytes at out): its epoch and key. */
void sim__step_bytes_of(const swarmsim *s, uint64_t epoch, uint64_t key,
                        uint8_t *out);
/* A snapshot's bytes (s->state_bytes at out). */
void sim__state_bytes_of(const swarmsim *s, const ssnap *sn, uint8_t *out);

/* ---- swarmsim-avg.c --------------------------------------------------- */

/* The averager's part of a bee's bee_run_io. */
int sim__io_match(void *ctx, const bee_run_avg *a);
int sim__io_average(void *ctx, const bee_run_avg *a);
int sim__io_round(void *ctx, const avg_group *g, const bee_run_avg *a);
void sim__io_cancel(void *ctx);
bool sim__io_matching(void *ctx);
void sim__io_leave(void *ctx, const avg_group *g, const char *why);
void sim__io_wait(void *ctx, const avg_group *g);
int sim__io_chunk(void *ctx, const uint8_t id[PROTO_ID_BYTES], uint64_t step,
                  uint64_t offset, uint32_t len, uint64_t tag);
uint64_t sim__io_free_slots(void *ctx);
/* Events: a message for b's matchmaking sent (its answer), the
 * declarations read, the matchmaking's tick; a round's check and end, a
 * round begun with a group formed ahead. */
int sim__match_send(void *ctx, const uint8_t id[PROTO_ID_BYTES],
                    const char *addr, const uint8_t *msg, size_t len);
void sim__deliver_decls(swarmsim *s, sbee *b);
void sim__rearm_match(swarmsim *s, sbee *b);
void sim__round_check(swarmsim *s, sround *r);
void sim__round_done(swarmsim *s, sround *r);
void sim__round_begin(swarmsim *s, sbee *b, const avg_group *g);
void sim__round_free(sround *r);

#endif /* BEE_SWARMSIM_INT_H */
