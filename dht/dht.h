/* dht.h: beed's Kademlia DHT, the swarm's shared memory.
 *
 * A dht_node is the protocol core of one node: its routing table, its
 * stored records and its lookups.  It does no I/O.  Time, randomness and
 * the sending of requests come in through dht_io; requests from peers go
 * in through dht_node_handle, answers to our requests through
 * dht_node_answer, and dht_node_tick runs the periodic work.  The glue in
 * dht/glue.c binds a node to proto's transport; tests bind hundreds of
 * nodes to a simulated network on a fake clock.  See dht/README.md.
 */
#ifndef BEE_DHT_H
#define BEE_DHT_H

#include "proto.h"

/* Parameters.  Each may be overridden at build time; the ones that make
 * sense per node are also fields of dht_config. */
#ifndef DHT_K
#define DHT_K 20 /* bucket size, and how many closest nodes a lookup finds */
#endif
#ifndef DHT_DEPTH_B
#define DHT_DEPTH_B 5 /* split far buckets while depth % b != 0 (4.2) */
#endif
#ifndef DHT_REPLACEMENTS
#define DHT_REPLACEMENTS 8 /* replacement list per bucket */
#endif
#ifndef DHT_SHORTLIST_MAX
#define DHT_SHORTLIST_MAX 64 /* candidates one lookup keeps */
#endif
#ifndef DHT_SUBKEYS_MAX
#define DHT_SUBKEYS_MAX PROTO_DHT_RECORDS_MAX /* subkeys under one key */
#endif
#ifndef DHT_KEY_BYTES_MAX
#define DHT_KEY_BYTES_MAX (1u << 20) /* all values under one key */
#endif
#ifndef DHT_TTL_MAX_S
#define DHT_TTL_MAX_S (7 * 86400) /* farthest expiration a store may ask */
#endif
#ifndef DHT_CLOCK_SKEW_S
#define DHT_CLOCK_SKEW_S 5 /* warn about peers whose clock is off more */
#endif

typedef struct dht_node dht_node;

/* Method names on the transport. */
#define DHT_METHOD_PING "dht.ping"
#define DHT_METHOD_STORE "dht.store"
#define DHT_METHOD_FIND "dht.find"

/* How the core reaches the world. */
typedef struct dht_io {
  void *ctx;
  /* Monotonic milliseconds. */
  uint64_t (*now_ms)(void *ctx);
  /* Wall clock, unix seconds: record expirations. */
  uint64_t (*wall_s)(void *ctx);
  /* n random bytes. */
  void (*random)(void *ctx, void *buf, size_t n);
  /* Sends a request (payload borrowed for the call) to the node at addr.
   * id is the node we expect there, or NULL when unknown (bootstrap).
   * Returns 0 and later calls dht_node_answer(req) exactly once, with
   * BEE_ETIMEOUT at the latest after timeout_ms; or returns an error and
   * never calls it. */
  int (*send)(void *ctx, const uint8_t *id, const char *addr,
              const char *method, const uint8_t *payload, size_t len,
              uint64_t timeout_ms, uint64_t req);
  /* Optional: a record of a known type (progress, metrics, matchmaking,
   * revocation...) must pass this check on every store and every value a
   * lookup returns.  Returns 0 or a BEE_E* reason. */
  int (*validate)(void *ctx, const proto_dht_record *r);
  /* Optional: the node wants dht_node_tick within ms (it just sent a
   * request that may stall).  Without it, tick at least every stall_ms
   * while requests are in flight. */
  void (*wake)(void *ctx, uint64_t ms);
} dht_io;

typedef struct dht_config {
  const proto_identity *id; /* our id is id->id; signs owned records */
  unsigned port;            /* listen port we announce; 0: client mode */
  unsigned alpha;           /* parallel requests per lookup, default 3 */
  unsigned replicas;        /* stores go to this many nodes, default 5 */
  uint64_t rpc_timeout_ms;  /* default 3000 */
  uint64_t stall_ms;        /* a request slower than this stops holding up
                               its lookup, default 400 */
  uint64_t refresh_ms;      /* refresh buckets quiet this long, 15 min */
  uint64_t republish_ms;    /* republish own records at most this often,
                               1 hour */
  size_t storage_max;       /* bytes of values stored, default 64 MiB */
  size_t keys_max;          /* keys stored, default 65536 */
  unsigned peer_stores_per_s; /* records one peer may store per second,
                                 default 200 (burst 4x) */
  uint64_t lost_retry_ms;   /* a contact dropped for silence: its address
                               is tried again after 2 s, then at doubling
                               intervals up to this, for an hour; default
                               60 s, 0: never */
} dht_config;

void dht_config_default(dht_config *cfg);

/* Creates a node.  cfg is copied; io and cfg->id are borrowed. */
int dht_node_new(const dht_config *cfg, const dht_io *io, dht_node **out);
/* Frees the node.  Pending lookups end with BEE_ECANCELED first; answers
 * still in flight must not be delivered afterwards (the glue drops
 * them).  Never call it from inside one of the node's own callbacks (as
 * with any object here); dht_glue_close defers it for you. */
void dht_node_free(dht_node *n);

/* ---- driving the core --------------------------------------------------- */

/* Handles a request from the peer with id from_id, whose connection comes
 * from IP from_ip ("1.2.3.4" or "::1"; the contact's port comes from the
 * request).  Writes the answer payload into out (cap bytes) and its
 * length into *out_len.  Returns 0, or a BEE_E* reason to send as an
 * error reply (malformed request, over a limit...). */
int dht_node_handle(dht_node *n, const uint8_t from_id[PROTO_ID_BYTES],
                    const char *from_ip, const char *method,
                    const uint8_t *payload, size_t len, uint8_t *out,
                    size_t cap, size_t *out_len);
/* Room an answer may need: give dht_node_handle at least this much. */
#define DHT_ANSWER_MAX (PROTO_FRAME_MAX - 4096)

/* The answer to request req: status 0 with the responder's id and payload
 * (borrowed), or a failure (BEE_ETIMEOUT, BEE_ECLOSED, BEE_EREMOTE...);
 * with a failure from_id and payload are ignored and may be NULL. */
void dht_node_answer(dht_node *n, uint64_t req, int status,
                     const uint8_t *from_id, const uint8_t *payload,
                     size_t len);

/* Periodic work: expiry, republishing, bucket refresh, stalled requests,
 * bootstrap retries.  Returns the milliseconds until it wants to run
 * again (call it at least that often; more often is harmless). */
uint64_t dht_node_tick(dht_node *n);

/* ---- operations --------------------------------------------------------- */

/* Statistics of one finished operation. */
typedef struct dht_stats {
  unsigned rounds;   /* longest chain of requests that led to the result */
  unsigned requests; /* requests sent */
  unsigned failures; /* requests that failed or timed out */
  uint64_t ms;       /* from start to callback */
} dht_stats;

/* A value as a get returns it: the key's live records, newest first per
 * subkey; views valid during the callback only. */
typedef struct dht_value {
  size_t n;
  const proto_dht_record *records;
} dht_value;

/* Result of dht_bootstrap: status 0 once at least one peer answered (or,
 * after a round where none did, some node has reached us meanwhile) and
 * the lookup of our own id is done. */
typedef void (*dht_done_cb)(dht_node *n, int status, const dht_stats *st,
                            void *arg);
/* status 0 and v (v->n >= 1) when found; -ENOENT when no node asked
 * holds a live value. */
typedef void (*dht_get_cb)(dht_node *n, int status, const dht_value *v,
                           const dht_stats *st, void *arg);
/* status 0 when at least one replica took the record; *stored how many. */
typedef void (*dht_put_cb)(dht_node *n, int status, unsigned stored,
                           const dht_stats *st, void *arg);

/* Joins through the nodes at addrs (ids unknown): pings each, then looks
 * up our own id to fill the routing table.  If none answers it retries
 * with backoff (1 s doubling to 60 s) from dht_node_tick, unless the
 * routing table has contacts by then (others joined through us): the
 * lookup then goes through them.  Calls cb once it succeeds (or when
 * the node is freed).  cb runs exactly once unless this returns an
 * error. */
int dht_bootstrap(dht_node *n, const char *const *addrs, size_t naddrs,
                  dht_done_cb cb, void *arg);
/* Adds a known node directly (tests, or a peer met elsewhere). */
void dht_node_add_contact(dht_node *n, const uint8_t id[PROTO_ID_BYTES],
                          const char *addr);

/* Finds key.  Without latest, the first node holding a live value ends the
 * lookup; with latest, the k closest are all asked and the newest record
 * per subkey wins.  Concurrent gets of one key are merged into one lookup.
 * cb runs exactly once unless this returns an error. */
int dht_get(dht_node *n, const uint8_t key[PROTO_DHT_KEY_BYTES], bool latest,
            dht_get_cb cb, void *arg);
/* Stores a record on the `replicas` closest nodes, and on this node too if
 * it is a server closer than the farthest of them (so `stored` may be one
 * more).  With an owned subkey (PROTO_DHT_OWNER_TAG and our own key) the
 * record is signed.  The node republishes it until it expires.  Bytes are
 * copied. */
int dht_put(dht_node *n, const uint8_t key[PROTO_DHT_KEY_BYTES],
            proto_bytes subkey, proto_bytes value, uint64_t expiration,
            dht_put_cb cb, void *arg);
/* Makes the owned subkey for our own identity (PROTO_DHT_OWNED_SUBKEY_BYTES). */
void dht_owned_subkey(const dht_node *n, uint8_t out[PROTO_DHT_OWNED_SUBKEY_BYTES]);
/* Key id of a name: BLAKE2b-160("beed dht key" || name). */
void dht_key(const char *name, uint8_t key[PROTO_DHT_KEY_BYTES]);

/* ---- inspection --------------------------------------------------------- */

typedef struct dht_info {
  size_t contacts;      /* in the routing table */
  size_t buckets;
  size_t keys;          /* stored */
  size_t records;
  size_t bytes;         /* of stored values */
  size_t lookups;       /* running */
  size_t blacklisted;
  size_t lost;          /* dropped contacts whose addresses are retried */
} dht_info;

void dht_node_info(const dht_node *n, dht_info *info);
/* Calls fn for each contact in the routing table, closest buckets first. */
void dht_node_foreach_contact(const dht_node *n,
                              void (*fn)(const uint8_t id[PROTO_ID_BYTES],
                                         const char *addr, void *arg),
                              void *arg);
/* Reads a stored record without the network (tests, beectl). */
int dht_node_local_get(dht_node *n, const uint8_t key[PROTO_DHT_KEY_BYTES],
                       dht_value *v);

/* ---- binding to the transport (glue.c) ---------------------------------- */

/* A node served over a proto_host: it answers the dht.* requests of every
 * connection, sends its own through the host (reusing the connection to a
 * peer, dialing its address when there is none), and runs the node's
 * timer on the loop. */
typedef struct dht_glue dht_glue;

/* Creates a node with cfg (as dht_node_new) bound to host on loop, with an
 * optional validator for records of known types.  host must outlive the
 * glue.  Returns 0 and *out, or an error. */
int dht_glue_new(uv_loop_t *loop, proto_host *host, const dht_config *cfg,
                 int (*validate)(void *ctx, const proto_dht_record *r),
                 void *validate_ctx, dht_glue **out);
dht_node *dht_glue_node(dht_glue *g);
/* Stops serving at once and frees the node on a later turn of the loop
 * (its operations still running end with BEE_ECANCELED then); the glue
 * itself goes once the calls still in flight have ended.  Safe from any
 * callback.  Call before proto_host_close. */
void dht_glue_close(dht_glue *g);

#endif /* BEE_DHT_H */
