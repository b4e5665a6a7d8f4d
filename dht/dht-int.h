/* dht-int.h: internals shared between dht/'s own files.
 *
 * routing.c  the routing table (k-buckets, splitting, replacements) and
 *            the blacklist of peers that do not answer
 * storage.c  stored records: newest expiration wins, subkeys, owned
 *            records, limits, per-peer store rates
 * lookup.c   iterative lookups (nodes, value, latest), puts, bootstrap
 * node.c     the node: requests in, answers in, periodic work
 */
#ifndef BEE_DHT_INT_H
#define BEE_DHT_INT_H

#include "dht.h"

#define COMP "dht"
#define ID_BYTES PROTO_ID_BYTES

/* ---- routing.c ---------------------------------------------------------- */

typedef struct dht_contact {
  uint8_t id[ID_BYTES];
  char *addr;       /* heap "host:port" */
  uint64_t seen_ms; /* last request from it or answer by it */
  unsigned fails;   /* failed requests since its last answer */
  uint16_t addr_n;  /* strlen(addr): answers name contacts by the dozen */
} dht_contact;

typedef struct dht_bucket {
  uint8_t lo[ID_BYTES]; /* the range: ids sharing lo's first depth bits */
  unsigned depth;
  size_t n;                 /* contacts, least recently seen first */
  dht_contact c[DHT_K];
  size_t nrep;              /* replacement candidates, newest last */
  dht_contact rep[DHT_REPLACEMENTS];
  uint64_t touched_ms;      /* last lookup or contact in the range */
  uint64_t evict_req;       /* an eviction ping of c[0] is out (its req) */
  bool due;                 /* refresh it soon, quiet or not (after joining) */
} dht_bucket;

typedef struct dht_ban {
  uint8_t id[ID_BYTES];
  uint64_t until_ms;
  uint64_t backoff_ms;
} dht_ban;

#define DHT_BANS_MAX 256

/* A contact the table dropped because it stopped answering.  Its address
 * is tried again, with backoff, for an hour: a node that comes back there
 * (a restarted peer, a preempted VM given its address back) finds this
 * node again, and through it this part of the DHT.  Without it a swarm
 * whose links all broke at once (every node a newcomer had joined through
 * was gone) stays two DHTs for good, each training its own model. */
typedef struct dht_lost {
  uint8_t id[ID_BYTES];
  char *addr;       /* heap "host:port" */
  uint64_t lost_ms; /* when the table dropped it */
  uint64_t retry_ms, backoff_ms;
  bool asking;      /* a ping to addr is out */
} dht_lost;

#define DHT_LOST_MAX 32                  /* the oldest goes when full */
#define DHT_LOST_KEEP_MS (3600 * 1000)   /* then it is forgotten */
#define DHT_LOST_FIRST_MS 2000           /* first try after the drop */

typedef struct dht_table {
  uint8_t self[ID_BYTES];
  dht_bucket **b; /* sorted by range */
  uint64_t *lo64; /* the first 8 bytes of each b[i]->lo, big-endian: the
                     search for an id's bucket reads this one array */
  size_t nb;
  size_t ncontacts;
  dht_ban bans[DHT_BANS_MAX];
  size_t nbans;
  dht_lost lost[DHT_LOST_MAX]; /* dropped contacts, oldest first */
  size_t nlost;
} dht_table;

void dht__table_init(dht_table *t, const uint8_t self[ID_BYTES]);
void dht__table_close(dht_table *t);
/* XOR distance comparison: <0 if a is closer to target than b. */
int dht__cmp_dist(const uint8_t target[ID_BYTES], const uint8_t a[ID_BYTES],
                  const uint8_t b[ID_BYTES]);
dht_bucket *dht__bucket_for(const dht_table *t, const uint8_t id[ID_BYTES]);
/* id answered us or sent us a request from addr.  Returns 1 when it is new
 * to the table, 0 when known or parked as a replacement, and sets *evict
 * to a bucket whose least recently seen contact should be pinged. */
int dht__table_seen(dht_table *t, const uint8_t id[ID_BYTES], const char *addr,
                    uint64_t now, dht_bucket **evict);
/* A request to id failed: it loses its place after two failures in a
 * row, or at once when a replacement is waiting or it was last heard from
 * DHT_STALE_MS or more ago. */
#define DHT_STALE_MS 60000
void dht__table_failed(dht_table *t, const uint8_t id[ID_BYTES], uint64_t now);
/* Forgets the lost entries for id or, with addr, every one at addr (a
 * string of the caller's, not an entry's); or the entry at index i. */
void dht__lost_drop(dht_table *t, const uint8_t *id, const char *addr);
void dht__lost_remove(dht_table *t, size_t i);
/* Up to max contacts closest to target, closest first; max is clipped to
 * DHT_CLOSEST_MAX (callers ask for k and a few more). */
#define DHT_CLOSEST_MAX 64
size_t dht__table_closest(const dht_table *t, const uint8_t target[ID_BYTES],
                          const dht_contact **out, size_t max);
const dht_contact *dht__table_find(const dht_table *t,
                                   const uint8_t id[ID_BYTES]);
bool dht__banned(const dht_table *t, const uint8_t id[ID_BYTES], uint64_t now);
void dht__ban(dht_table *t, const uint8_t id[ID_BYTES], uint64_t now);
void dht__unban(dht_table *t, const uint8_t id[ID_BYTES]);
/* A random id inside bucket b's range. */
void dht__bucket_random_id(const dht_bucket *b, const uint8_t rnd[ID_BYTES],
                           uint8_t out[ID_BYTES]);

/* ---- storage.c ---------------------------------------------------------- */

typedef struct dht_rec {
  uint8_t *subkey; /* heap; NULL with subkey_n 0 for the plain value */
  size_t subkey_n;
  uint8_t *value; /* heap */
  size_t value_n;
  uint64_t expiration;
  bool has_sig;
  uint8_t sig[PROTO_SIG_BYTES];
} dht_rec;

typedef struct dht_entry {
  struct dht_entry *next; /* hash chain */
  uint8_t key[PROTO_DHT_KEY_BYTES];
  size_t n, cap;
  dht_rec *recs;
  size_t bytes;
  uint64_t replicate_s; /* wall time this holder copies it on, unless a
                           store of the key comes first (node.c) */
} dht_entry;

typedef struct dht_rate {
  uint8_t id[ID_BYTES];
  double tokens;
  uint64_t at_ms;
} dht_rate;

#define DHT_RATES_MAX 256

typedef struct dht_store {
  dht_entry **tab;
  size_t tabsize; /* power of two */
  size_t keys, records, bytes;
  uint64_t next_exp_s; /* no record expires before (UINT64_MAX: none) */
  dht_rate rates[DHT_RATES_MAX];
  size_t nrates;
} dht_store;

void dht__store_init(dht_store *s);
void dht__store_close(dht_store *s);
dht_entry *dht__store_find(const dht_store *s,
                           const uint8_t key[PROTO_DHT_KEY_BYTES]);
/* Checks r fully (expiry, ttl, owner signature, the validator) and keeps it
 * if it is newer than what is held.  Returns 0, or the reason. */
int dht__store_put(dht_node *n, const proto_dht_record *r, uint64_t now_s);
/* Drops expired records; returns how many. */
size_t dht__store_expire(dht_store *s, uint64_t now_s);
/* Views of the live records of e into out (max). */
size_t dht__entry_view(const dht_entry *e, uint64_t now_s,
                       proto_dht_record *out, size_t max);
/* Token bucket: may the peer store `count` more records now? */
bool dht__rate_take(dht_node *n, const uint8_t id[ID_BYTES], size_t count,
                    uint64_t now_ms);
/* Checks a record as it comes from the network, before keeping or
 * returning it: expiry, owned-subkey signature, the validator. */
int dht__record_check(dht_node *n, const proto_dht_record *r, uint64_t now_s);

/* ---- lookup.c ----------------------------------------------------------- */

enum { LK_NODES, LK_VALUE, LK_LATEST };
enum { C_NEW, C_INFLIGHT, C_STALLED, C_DONE, C_FAILED };

typedef struct dht_cand {
  uint8_t id[ID_BYTES];
  char *addr; /* heap */
  uint8_t state;
  uint8_t hop;  /* requests before this one was learned of */
  bool had_value;
  uint64_t sent_ms;
} dht_cand;

typedef struct dht_waiter {
  struct dht_waiter *next;
  dht_get_cb cb;
  void *arg;
  uint64_t start_ms;
} dht_waiter;

typedef struct dht_lookup dht_lookup;
typedef void (*dht_lookup_done)(dht_lookup *l, int status);

struct dht_lookup {
  dht_lookup *next;
  dht_node *n;
  uint8_t target[ID_BYTES];
  int kind;
  dht_cand c[DHT_SHORTLIST_MAX];
  size_t nc;
  unsigned active; /* in flight and not yet stalled */
  unsigned pending; /* in flight, stalled or not */
  dht_stats st;
  uint64_t start_ms;
  /* values found, merged: newest record per subkey */
  dht_rec *found;
  size_t nfound, capfound;
  unsigned found_hop;
  dht_waiter *waiters;      /* gets */
  dht_lookup_done done;     /* nodes lookups: what follows */
  void *op;                 /* the put or bootstrap it serves */
  bool finished;
  bool starting;    /* inside the call that created it: never finish here */
  bool finish_due;  /* finished while starting: the next tick completes it */
};

/* A request in flight: what its answer is for. */
enum { P_LOOKUP, P_STORE, P_PING_BOOT, P_PING_EVICT, P_CACHE, P_PING_LOST };

typedef struct dht_pending {
  struct dht_pending *next;
  uint64_t req;
  int type;
  uint8_t id[ID_BYTES]; /* who we asked (zero for bootstrap pings) */
  bool has_id;
  char *addr;
  void *op;             /* dht_lookup, dht_put_op, dht_boot */
  uint64_t sent_ms;     /* loop time it went out */
} dht_pending;

typedef struct dht_put_op {
  dht_put_cb cb;
  void *arg;
  dht_rec rec;
  uint8_t key[PROTO_DHT_KEY_BYTES];
  unsigned waiting, stored;
  int first_error;
  dht_stats st;
  uint64_t start_ms;
} dht_put_op;

typedef struct dht_boot {
  dht_done_cb cb;
  void *arg;
  char **addrs;
  size_t naddrs;
  unsigned waiting, answered;
  unsigned tries; /* rounds of pings sent; each address is logged once */
  uint64_t retry_ms, backoff_ms;
  uint64_t start_ms;
  bool looking; /* the self lookup is running */
} dht_boot;

/* Own records, republished until they expire. */
typedef struct dht_own {
  struct dht_own *next;
  uint8_t key[PROTO_DHT_KEY_BYTES];
  dht_rec rec;
  uint64_t due_ms;
} dht_own;

dht_lookup *dht__lookup_start(dht_node *n, const uint8_t target[ID_BYTES],
                              int kind);
void dht__lookup_step(dht_lookup *l);
/* Takes the first steps of a new lookup without ever running a callback
 * before the caller has returned (a lookup with nothing to ask finishes on
 * the next tick instead). */
void dht__lookup_begin(dht_lookup *l);
/* Finishes lookups that completed while starting. */
void dht__lookup_deferred(dht_node *n);
/* Adds a found record, keeping the newest per subkey (copied). */
void dht__lookup_merge(dht_lookup *l, const proto_dht_record *r);
void dht__lookup_answer(dht_lookup *l, dht_pending *p, int status,
                        const proto_dht_msg *m);
/* Marks stalled requests; returns ms until the next one would stall. */
uint64_t dht__lookup_stalls(dht_node *n, uint64_t now);
void dht__lookups_free(dht_node *n);
void dht__put_answer(dht_node *n, dht_pending *p, int status,
                     const proto_dht_msg *m);
int dht__put_start(dht_node *n, const uint8_t key[PROTO_DHT_KEY_BYTES],
                   const dht_rec *rec, dht_put_cb cb, void *arg);
void dht__boot_answer(dht_node *n, dht_pending *p, int status,
                      const uint8_t *from_id);
void dht__boot_tick(dht_node *n, uint64_t now);
void dht__rec_free(dht_rec *r);
int dht__rec_copy(dht_rec *dst, const proto_dht_record *src);
void dht__rec_view(const dht_rec *r, const uint8_t key[PROTO_DHT_KEY_BYTES],
                   proto_dht_record *out);

/* ---- node.c ------------------------------------------------------------- */

struct dht_node {
  dht_config cfg;
  dht_io io;
  uint8_t self[ID_BYTES];
  dht_table table;
  dht_store store;
  dht_lookup *lookups;
  dht_pending *pend[64]; /* by req % 64 */
  uint64_t next_req;
  dht_own *own;
  dht_boot *boot;
  uint64_t expire_ms, refresh_ms;
  unsigned refreshing; /* refresh lookups in flight */
  unsigned replicating; /* replication lookups in flight */
  uint64_t replicate_check_ms;
  uint64_t skew_warned_ms;
};

/* How far a peer's clock reading `their` (Unix seconds, written into its
 * answer) lies outside the time between our request and its answer,
 * [ours - elapsed, ours], in whole seconds; 0 when inside.  Only answers
 * are judged: a request may have waited in a stalled connection (a
 * partition that healed delivers it late), an answer to a request that
 * timed out is never taken. */
static inline uint64_t dht__clock_skew(uint64_t their, uint64_t ours,
                                       uint64_t elapsed_ms) {
  uint64_t back = (elapsed_ms + 999) / 1000 + 1; /* in s granules */
  uint64_t earliest = ours > back ? ours - back : 0;
  if (their > ours + 1)
    return their - ours - 1;
  return their < earliest ? earliest - their : 0;
}

static inline uint64_t dht__now(const dht_node *n) {
  return n->io.now_ms(n->io.ctx);
}
static inline uint64_t dht__wall(const dht_node *n) {
  return n->io.wall_s(n->io.ctx);
}
/* Encodes m and sends it; registers the pending answer.  Takes nothing:
 * addr and op are copied or borrowed as dht_pending says.  Returns 0 or
 * the send error (and registers nothing). */
int dht__send(dht_node *n, const uint8_t *id, const char *addr,
              const proto_dht_msg *m, int ptype, void *op);
/* Fills the sender fields (port, now) of an outgoing request. */
void dht__request_init(dht_node *n, proto_dht_msg *m, int type);
/* A scratch message for encoding (one per thread; the core is not
 * re-entered while it is in use). */
proto_dht_msg *dht__scratch(void);
/* Contact seen: routing table, eviction pings, handing over keys. */
void dht__seen(dht_node *n, const uint8_t id[ID_BYTES], const char *addr);
void dht__failed(dht_node *n, const uint8_t id[ID_BYTES]);
/* A store of e's key arrived (or we made e): this holder copies e to the
 * key's nearest nodes one republish interval later, with jitter, unless
 * another store of the key comes first. */
void dht__replicate_later(dht_node *n, dht_entry *e, uint64_t now_s);
/* After joining, every bucket but our own is refreshed (Kademlia 2.3):
 * without it the ranges far from us stay empty, and lookups for keys
 * there converge on the wrong nodes.  The refresh runs a few buckets at a
 * time, from the next tick on. */
void dht__refresh_far(dht_node *n);
/* Sends STORE of records to one node, fire and forget (caching, handover). */
void dht__store_to(dht_node *n, const uint8_t id[ID_BYTES], const char *addr,
                   const proto_dht_record *recs, size_t nrecs);
char *dht__strdup(const char *s);

#endif /* BEE_DHT_INT_H */
