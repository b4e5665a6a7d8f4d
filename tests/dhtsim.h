/* dhtsim.h: a simulated network for the DHT core.
 *
 * Drives many dht_nodes in one process on a fake clock.  Each node gets a
 * deterministic identity, the address "10.X.Y.Z:45555" derived from its
 * index, and a dht_io whose requests become events in one queue ordered
 * by (time, sequence), so a run with the same seed is reproducible bit for
 * bit.  A request travels with a one-way latency fixed per pair of nodes;
 * a request to a dead or unknown address, or one that is lost, ends in
 * BEE_ETIMEOUT after its timeout, as a dead port on the internet does; one
 * to the sender's own address fails with BEE_ESELF.
 *
 * The simulator stands in for dht/glue.c: it calls dht_node_tick when the
 * node asked (clamped to [DHTSIM_TICK_MIN_MS, DHTSIM_TICK_MAX_MS]), and,
 * because a request sent after a tick can stall before the delay that
 * tick returned, also stall_ms after each request a node sends.
 *
 * Used by tests/test-dht-sim.c and by the internet-scale tool in tools/.
 * Per node it keeps a small struct (about 200 bytes); the cores' own
 * memory is theirs.  Nothing here is thread-safe.
 */
#ifndef BEE_DHTSIM_H
#define BEE_DHTSIM_H

#include "dht.h"

#define DHTSIM_PORT 45555
#define DHTSIM_CLOCK_START_MS 1000000u /* fake monotonic clock at start */
#define DHTSIM_EPOCH_S 1800000000u     /* wall clock at fake ms 0 */
#define DHTSIM_TICK_MIN_MS 10
#define DHTSIM_TICK_MAX_MS 60000
#define DHTSIM_ADDR_MAX 24                /* "10.255.255.255:45555" + NUL */
#define DHTSIM_NODES_MAX ((1u << 24) - 1) /* addresses 10.0.0.1 and up */

/* Pass as `via` to join through a random live node that joined earlier
 * (a lower index) instead of a fixed one. */
#define DHTSIM_VIA_RANDOM SIZE_MAX

typedef struct dhtsim dhtsim;

/* Whole-run counters.  Messages are requests plus answers. */
typedef struct dhtsim_counters {
  uint64_t requests;    /* send() calls */
  uint64_t answers;     /* answers a live node sent, errors included */
  uint64_t errors;      /* answers that were error replies (BEE_EREMOTE) */
  uint64_t timeouts;    /* requests that ended in BEE_ETIMEOUT */
  uint64_t lost;        /* requests dropped by the loss rate */
  uint64_t dropped;     /* answers not delivered: their sender had died */
  uint64_t late;        /* round trips longer than their timeout */
  uint64_t id_mismatch; /* requests whose expected id was not the node's */
  uint64_t self_sends;  /* requests to the own address (BEE_ESELF) */
  uint64_t bytes;       /* payload bytes, both ways */
  uint64_t ticks;       /* dht_node_tick calls */
  uint64_t events;      /* events processed */
  uint64_t joins_ok;
  uint64_t joins_failed;
  uint64_t joins_pending;
} dhtsim_counters;

/* Makes a network of n nodes (none joined yet; see dhtsim_join*).  tmpl
 * gives every node's parameters (NULL: dht_config_default); its id and
 * port are replaced per node.  seed fixes identities, latencies and all
 * randomness.  Returns NULL on a bad argument (n over DHTSIM_NODES_MAX) or
 * when a node cannot be created; aborts when memory runs out. */
dhtsim *dhtsim_new(size_t n, uint64_t seed, const dht_config *tmpl);
/* Frees every live node (their pending operations end with BEE_ECANCELED,
 * so the callbacks' arguments must still be valid), then the network.
 * Accepts NULL. */
void dhtsim_free(dhtsim *s);

/* One-way latency of each pair is drawn once, uniformly in [min_ms,
 * max_ms] (default 5..60), from the seed and the pair. */
void dhtsim_set_latency(dhtsim *s, uint64_t min_ms, uint64_t max_ms);
/* Drops each request with probability permille / 1000 (default 0); the
 * sender sees BEE_ETIMEOUT. */
void dhtsim_set_loss(dhtsim *s, unsigned permille);
/* Installs fn as every node's dht_io.validate (NULL: accept all).  node is
 * the index of the node that asks. */
void dhtsim_set_validate(dhtsim *s,
                         int (*fn)(void *arg, size_t node,
                                   const proto_dht_record *r),
                         void *arg);

/* ---- nodes -------------------------------------------------------------- */

size_t dhtsim_size(const dhtsim *s); /* nodes ever made, dead ones too */
size_t dhtsim_live(const dhtsim *s); /* nodes alive */
bool dhtsim_alive(const dhtsim *s, size_t i);
/* The node's core, or NULL once it was killed. */
dht_node *dhtsim_node(const dhtsim *s, size_t i);
/* Index of a node's core, or SIZE_MAX for a core not of this network. */
size_t dhtsim_index(const dhtsim *s, const dht_node *n);
const proto_identity *dhtsim_identity(const dhtsim *s, size_t i);
/* Writes "10.X.Y.Z:45555" (with_port) or "10.X.Y.Z" into out
 * (DHTSIM_ADDR_MAX bytes). */
void dhtsim_addr(size_t i, bool with_port, char out[DHTSIM_ADDR_MAX]);

/* Frees node i's core (its pending operations end with BEE_ECANCELED) and
 * marks it dead: requests to it time out, answers to it are dropped.  Do
 * not call it from one of that node's callbacks. */
void dhtsim_kill(dhtsim *s, size_t i);
/* Adds a node (not joined yet) and returns its index, or SIZE_MAX when the
 * core refused to create it or the network is full. */
size_t dhtsim_add(dhtsim *s);
/* Node i, killed, comes back: a new core (nothing remembered, not joined)
 * with the same identity at the same address, as a restarted peer.
 * Returns 0, -EINVAL when i is alive or unknown, or BEE_ECONFIG. */
int dhtsim_revive(dhtsim *s, size_t i);

/* Node i bootstraps now through node via (or DHTSIM_VIA_RANDOM).  The
 * result goes to dhtsim_join_status and the joins_* counters.  Returns 0
 * or the error of dht_bootstrap (then nothing is pending). */
int dhtsim_join(dhtsim *s, size_t i, size_t via);
/* Schedules the join of every node from 1 to the last, node k at
 * now + (k - 1) * stagger_ms, through via as in dhtsim_join. */
void dhtsim_join_all(dhtsim *s, size_t via, uint64_t stagger_ms);
/* 1 while node i has not joined (or never tried), 0 once it joined, or
 * the status its bootstrap failed with. */
int dhtsim_join_status(const dhtsim *s, size_t i);
/* A done function for dhtsim_run_until: true when no join is scheduled or
 * pending.  arg is the dhtsim. */
bool dhtsim_joined(void *arg);

/* ---- time --------------------------------------------------------------- */

uint64_t dhtsim_now(const dhtsim *s);  /* fake monotonic ms */
uint64_t dhtsim_wall(const dhtsim *s); /* fake unix seconds */
/* Runs events until done(arg) holds (checked before the first event and
 * after each), or until max_ms have passed, when the clock is left at the
 * end of that span.  done may be NULL (run the whole span).  Returns
 * whether done held. */
bool dhtsim_run_until(dhtsim *s, bool (*done)(void *arg), void *arg,
                      uint64_t max_ms);
/* Runs the next ms of simulated time. */
void dhtsim_run_for(dhtsim *s, uint64_t ms);

/* ---- figures ------------------------------------------------------------ */

void dhtsim_counters_get(const dhtsim *s, dhtsim_counters *out);
/* A random number from the network's generator: test choices drawn from it
 * keep a run reproducible. */
uint64_t dhtsim_rand(dhtsim *s);
/* Uniform in [0, n); n > 0. */
size_t dhtsim_rand_below(dhtsim *s, size_t n);
/* A random live node other than except (SIZE_MAX: any), or SIZE_MAX when
 * there is none. */
size_t dhtsim_rand_live(dhtsim *s, size_t except);

#endif /* BEE_DHTSIM_H */
