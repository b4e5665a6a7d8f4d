/* proto.h: the floor of beed.
 *
 * Everything two peers need to talk: error codes and logging, the msgpack
 * wire format with its strict decoders, node identities, moderator-signed
 * access tokens and revocation lists, the handshake and sealed-frame session
 * core (no I/O), and the libuv transport that runs that core over TCP.
 *
 * Other modules include only this header.  See proto/README.md and
 * docs/PROTOCOL.md for the wire format and the handshake.
 */
#ifndef BEE_PROTO_H
#define BEE_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

/* ------------------------------------------------------------------------ */
/* Errors.  Functions return 0 or a negative code: -errno, or one of these. */

enum {
  BEE_EBASE = -20000,
  BEE_EMALFORMED,    /* not valid msgpack */
  BEE_ETRUNCATED,    /* message ends early */
  BEE_ETRAILING,     /* bytes after the message */
  BEE_ETYPE,         /* a field has the wrong msgpack type */
  BEE_EMISSING,      /* a required field is absent */
  BEE_EUNKNOWN,      /* unknown message type */
  BEE_EVERSION,      /* unsupported protocol version */
  BEE_EDEPTH,        /* nesting deeper than PROTO_DEPTH_MAX */
  BEE_ETOOBIG,       /* a size is over its limit */
  BEE_ERANGE,        /* a value is outside its allowed range */
  BEE_EAUTH,         /* signature or MAC check failed */
  BEE_ENOTOKEN,      /* moderated swarm, but no token presented */
  BEE_ETOKEN_FORGED, /* token signature does not verify */
  BEE_ETOKEN_EXPIRED,
  BEE_ETOKEN_EARLY,  /* token issued in the future */
  BEE_ETOKEN_SWARM,  /* token is for another swarm */
  BEE_ETOKEN_ROLE,   /* token role not accepted here */
  BEE_ETOKEN_PEER,   /* token names another peer key */
  BEE_ETOKEN_MODERATOR, /* token signed by another moderator */
  BEE_EREVOKED,      /* peer is on the revocation list */
  BEE_EOPEN_MISMATCH,/* one side moderated, the other open */
  BEE_ECIPHER,       /* no common cipher */
  BEE_EKEYPERM,      /* key file is group- or world-readable */
  BEE_EKEYFILE,      /* key or token file unreadable or malformed */
  BEE_ETIMEOUT,
  BEE_ECLOSED,       /* connection closed */
  BEE_ECANCELED,
  BEE_ENOMETHOD,     /* no handler for this RPC method */
  BEE_EQUEUE,        /* write queue full (backpressure) */
  BEE_ELIMIT,        /* a connection or rate limit refused the request */
  BEE_ESELF,         /* connected to ourselves */
  BEE_ECONFIG,       /* bad flag or config line */
  BEE_EREMOTE,       /* the peer answered with an error */
  BEE_EEXPIRED,      /* a record's expiration has passed */
  BEE_ESTALE,        /* a record older than the one held */
  BEE_EMISSED,       /* the round's group formed without us */
  BEE_ELAST
};

/* Returns a static English description of code (negative errno or BEE_E*). */
const char *bee_strerror(int code);
/* Returns the short symbolic name of code, e.g. "ETOKEN_EXPIRED". */
const char *bee_errname(int code);

/* ------------------------------------------------------------------------ */
/* Logging: one line per event, "LEVEL component: message", to stderr.      */

enum { BEE_LOG_ERROR = 0, BEE_LOG_WARN, BEE_LOG_INFO, BEE_LOG_DEBUG };

void bee_log_set_level(int level);
int bee_log_get_level(void);
/* Parses "error|warn|info|debug" into *level.  Returns 0 or BEE_ECONFIG. */
int bee_log_level_parse(const char *s, int *level);
void bee_log(int level, const char *component, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* Copies n bytes of text from a peer into out (cap bytes, NUL-terminated)
 * for a log line: every byte outside printable ASCII becomes '?', so a
 * peer can never forge lines or send terminal escapes.  Returns out. */
char *bee_printable(const void *p, size_t n, char *out, size_t cap);
#define bee_err(comp, ...) bee_log(BEE_LOG_ERROR, comp, __VA_ARGS__)
#define bee_warn(comp, ...) bee_log(BEE_LOG_WARN, comp, __VA_ARGS__)
#define bee_info(comp, ...) bee_log(BEE_LOG_INFO, comp, __VA_ARGS__)
#define bee_debug(comp, ...)                                                   \
  do {                                                                         \
    if (bee_log_get_level() >= BEE_LOG_DEBUG)                                  \
      bee_log(BEE_LOG_DEBUG, comp, __VA_ARGS__);                               \
  } while (0)

/* Lines that come in bursts (a peer that keeps failing the same way):
 * the first of a kind (the same text) is logged, the same line again
 * within BEE_LOG_BURST_MS of it only counted, and the first after that
 * logged with their count.  One state per place such a line is written
 * (static, zeroed), remembering BEE_LOG_BURST_KINDS kinds; the loop
 * thread's. */
#ifndef BEE_LOG_BURST_MS
#define BEE_LOG_BURST_MS 60000
#endif
#define BEE_LOG_BURST_KINDS 8
typedef struct bee_log_burst {
  struct {
    uint64_t hash;    /* of the line's text; 0: a free slot */
    uint64_t last_ms; /* when it was last logged (monotonic ms) */
    uint64_t held;    /* the same line since, not logged */
  } kind[BEE_LOG_BURST_KINDS];
} bee_log_burst;
/* Whether to log line at now_ms (monotonic); if so, more (cap bytes)
 * gets "" or " (N more in the last S s)" to end it with. */
bool bee_log_burst_at(bee_log_burst *b, const char *line, uint64_t now_ms,
                      char *more, size_t cap);
/* The same, now. */
bool bee_log_burst_now(bee_log_burst *b, const char *line, char *more,
                       size_t cap);
/* bee_warn for a line that may come in bursts (at least one argument
 * after fmt). */
#define bee_warn_burst(comp, fmt, ...)                                         \
  do {                                                                         \
    static bee_log_burst burst_;                                               \
    char line_[512], more_[64];                                                \
    snprintf(line_, sizeof line_, fmt, __VA_ARGS__);                           \
    if (bee_log_burst_now(&burst_, line_, more_, sizeof more_))                \
      bee_warn(comp, "%s%s", line_, more_);                                    \
  } while (0)

/* ------------------------------------------------------------------------ */
/* Wire limits.  Each may be overridden at build time.                       */

#define PROTO_VERSION 1
#ifndef PROTO_FRAME_MAX
#define PROTO_FRAME_MAX (4u << 20) /* largest frame body (sealed), bytes */
#endif
#ifndef PROTO_CHUNK_MAX
#define PROTO_CHUNK_MAX (1u << 20) /* largest bulk stream chunk, bytes */
#endif
#ifndef PROTO_METHOD_MAX
#define PROTO_METHOD_MAX 64 /* RPC method / stream kind name, bytes */
#endif
#ifndef PROTO_TOKEN_METHOD
/* The one-way message that carries a renewed access token; the transport
 * handles it, never the application (proto_host_token_renewed). */
#define PROTO_TOKEN_METHOD "proto.token"
#endif
#ifndef PROTO_TOKEN_RENEW_MS
#define PROTO_TOKEN_RENEW_MS 1000 /* after a refused renewal, the next ones
                                     a connection brings are not looked at
                                     for so long */
#endif
#ifndef PROTO_TEXT_MAX
#define PROTO_TEXT_MAX 512 /* error and close reason text, bytes */
#endif
#ifndef PROTO_DEPTH_MAX
#define PROTO_DEPTH_MAX 8 /* msgpack nesting */
#endif
#ifndef PROTO_SWARM_MAX
#define PROTO_SWARM_MAX 64 /* swarm name, bytes */
#endif
#ifndef PROTO_TOKEN_MAX
#define PROTO_TOKEN_MAX 512 /* encoded access token, bytes */
#endif
#ifndef PROTO_REVOKED_MAX
#define PROTO_REVOKED_MAX 65536 /* keys in one revocation list */
#endif
#define PROTO_FRAME_HDR 4   /* big-endian u32 body length */
#define PROTO_TAG_BYTES 16  /* AEAD tag appended to every sealed body */

#define PROTO_PK_BYTES 32
#define PROTO_SK_BYTES 64
#define PROTO_SIG_BYTES 64
#define PROTO_ID_BYTES 20 /* peer id: BLAKE2b-160 of the public key */

/* Borrowed bytes: a view into a buffer someone else owns. */
typedef struct proto_bytes {
  const uint8_t *p;
  size_t n;
} proto_bytes;

/* ------------------------------------------------------------------------ */
/* Messages.  Every message is a msgpack array [version, type, fields...].   */

enum proto_type {
  PROTO_T_REQUEST = 1,      /* [v, t, id, method, payload]        */
  PROTO_T_RESPONSE = 2,     /* [v, t, id, payload]                */
  PROTO_T_ERROR = 3,        /* [v, t, id, code, text]             */
  PROTO_T_CANCEL = 4,       /* [v, t, id]                         */
  PROTO_T_ONEWAY = 5,       /* [v, t, method, payload]            */
  PROTO_T_STREAM_OPEN = 6,  /* [v, t, id, kind, total, meta]      */
  PROTO_T_STREAM_CHUNK = 7, /* [v, t, id, offset, data]           */
  PROTO_T_STREAM_END = 8,   /* [v, t, id, code]                   */
  PROTO_T_PING = 9,         /* [v, t, nonce]                      */
  PROTO_T_PONG = 10,        /* [v, t, nonce]                      */
  PROTO_T_CLOSE = 11,       /* [v, t, code, text]                 */
  PROTO_T_HELLO = 20,       /* handshake, see proto_hello         */
  PROTO_T_AUTH = 21,        /* handshake, see proto_auth_msg      */
  PROTO_T_RESULT = 22,      /* handshake verdict [v, t, code, text] */
  PROTO_T_TOKEN = 30,       /* access token, see proto_token      */
  PROTO_T_REVOCATION = 31,  /* revocation list                    */
  PROTO_T_SWARM_HELLO = 40, /* swarm.hello [v, t, port, observed] */
  PROTO_T_SWARM_PEERS = 41, /* swarm.peers answer [v, t, [addr..]] */
  PROTO_T_DHT_PING = 50,    /* DHT payloads, see proto_dht_msg    */
  PROTO_T_DHT_PONG = 51,
  PROTO_T_DHT_STORE = 52,
  PROTO_T_DHT_STORED = 53,
  PROTO_T_DHT_FIND = 54,
  PROTO_T_DHT_FOUND = 55,
  PROTO_T_AVG_PART = 60, /* averaging round, see proto_avg_msg */
  PROTO_T_AVG_RESULT = 61,
  PROTO_T_AVG_ABORT = 62,
  PROTO_T_AVG_JOIN = 63, /* matchmaking, see proto_group_msg */
  PROTO_T_AVG_REPLY = 64,
  PROTO_T_AVG_BEGIN = 65,
  PROTO_T_AVG_LEAVE = 66,
  PROTO_T_AVG_WAIT = 67,  /* averaging round, see proto_avg_msg */
  PROTO_T_STATE_REQ = 70, /* state download, see proto_state_msg */
  PROTO_T_STATE_CHUNK = 71,
  PROTO_T_STATE_STEP_REQ = 72, /* an epoch's step, see proto_state_msg */
  PROTO_T_STATE_STEP = 73,
};

/* One envelope message, decoded.  Views point into the decoded buffer.
 * Fields a type does not use are zero.  Meanings by type:
 *   id:      request id (REQUEST..CANCEL), stream id (STREAM_*), nonce (PING/PONG)
 *   name:    method (REQUEST, ONEWAY), kind (STREAM_OPEN)
 *   payload: payload (REQUEST, RESPONSE, ONEWAY), meta (STREAM_OPEN),
 *            data (STREAM_CHUNK), text (ERROR, CLOSE)
 *   code:    error code (ERROR, CLOSE), status (STREAM_END)
 *   offset:  total bytes (STREAM_OPEN), byte offset (STREAM_CHUNK) */
typedef struct proto_msg {
  int type;
  uint64_t id;
  proto_bytes name;
  proto_bytes payload;
  int64_t code;
  uint64_t offset;
} proto_msg;

/* Upper bound on proto_msg_encode's output for m. */
size_t proto_msg_encoded_max(const proto_msg *m);
/* Encodes m into buf (cap bytes).  Returns 0 and the length in *len,
 * BEE_ETOOBIG when a field is over its limit or buf is too small,
 * BEE_EUNKNOWN for a type that is not an envelope message, BEE_ERANGE for
 * an empty method or kind name. */
int proto_msg_encode(const proto_msg *m, uint8_t *buf, size_t cap, size_t *len);
/* Strictly decodes one envelope message that fills buf exactly.  On success
 * *m holds views into buf.  Never allocates. */
int proto_msg_decode(const uint8_t *buf, size_t len, proto_msg *m);

/* Encodes only the header of a STREAM_CHUNK whose data (data_len bytes)
 * the caller places right after it, so a chunk is built without copying the
 * data twice.  Returns 0 and the header length in *len. */
int proto_chunk_header_encode(uint64_t stream_id, uint64_t offset,
                              size_t data_len, uint8_t *buf, size_t cap,
                              size_t *len);

/* ------------------------------------------------------------------------ */
/* Membership payloads, until the DHT finds peers (issue 3).  swarm.hello
 * is a one-way message telling a peer the port we listen on (0: none)
 * and the IP address its connection comes from as we see it (so that a
 * node listening on every address learns one its peers reach it at);
 * swarm.peers answers a request with the listen addresses we know.       */

#define PROTO_ADDR_MAX 262 /* "host:port" with its NUL: 253-byte name */
#define PROTO_IP_MAX 46    /* an IPv4 or IPv6 literal with its NUL */
#ifndef PROTO_PEERS_MAX
#define PROTO_PEERS_MAX 256 /* addresses in one swarm.peers answer */
#endif

/* observed: an IP literal without brackets, or "" (or NULL) when not
 * known; anything else is BEE_ERANGE. */
int proto_swarm_hello_encode(unsigned port, const char *observed, uint8_t *buf,
                             size_t cap, size_t *len);
/* Strict; a port over 65535, or an observed address that is not an IP
 * literal, is BEE_ERANGE.  An older peer's hello, without the observed
 * address, gives "".  observed: PROTO_IP_MAX bytes. */
int proto_swarm_hello_decode(const uint8_t *buf, size_t len, unsigned *port,
                             char observed[PROTO_IP_MAX]);
/* Whether s is an IPv4 or IPv6 literal (no brackets, no port). */
bool proto_ip_literal(const char *s);
/* Whether host (no brackets, no port) names this host's loopback:
 * 127.0.0.0/8, ::1 or "localhost". */
bool proto_host_loopback(const char *host);
/* The host of addr, "host:port" or "[v6]:port", into host (cap bytes):
 * without brackets, and an IPv4 peer on a dual-stack socket
 * ("::ffff:a.b.c.d") as IPv4; *port (when port is not NULL) points at
 * the port's text inside addr.  0, or BEE_ERANGE for no host or port, or
 * a host longer than cap - 1. */
int proto_addr_host(const char *addr, char *host, size_t cap,
                    const char **port);
/* Encodes n NUL-terminated addresses (n <= PROTO_PEERS_MAX). */
int proto_swarm_peers_encode(const char (*addrs)[PROTO_ADDR_MAX], size_t n,
                             uint8_t *buf, size_t cap, size_t *len);
/* Upper bound on the encoding of n addresses. */
size_t proto_swarm_peers_encoded_max(size_t n);
/* Strictly decodes into addrs (room for max), NUL-terminated; *n gets the
 * count.  An empty address, one with a NUL byte or one of PROTO_ADDR_MAX
 * bytes or more is BEE_ERANGE; more than max entries BEE_ETOOBIG.  The
 * caller still checks that each is an address it wants to dial. */
int proto_swarm_peers_decode(const uint8_t *buf, size_t len,
                             char (*addrs)[PROTO_ADDR_MAX], size_t max,
                             size_t *n);

/* ------------------------------------------------------------------------ */
/* Identity: an Ed25519 key pair; the peer id is BLAKE2b-160(public key).    */

typedef struct proto_identity {
  uint8_t pk[PROTO_PK_BYTES];
  uint8_t sk[PROTO_SK_BYTES];
  uint8_t id[PROTO_ID_BYTES];
} proto_identity;

/* Makes a fresh identity. */
void proto_identity_generate(proto_identity *out);
/* Loads the identity key file at path.  With create set, a missing file is
 * created (mode 0600) with a fresh key.  A file that is group- or
 * world-readable is refused with BEE_EKEYPERM; a malformed one with
 * BEE_EKEYFILE; other failures are -errno. */
int proto_identity_load(proto_identity *out, const char *path, bool create);
/* Writes id's secret key to a new file at path, mode 0600.  Fails with
 * -EEXIST rather than overwrite. */
int proto_identity_save(const proto_identity *id, const char *path);
/* Wipes the secret key. */
void proto_identity_clear(proto_identity *id);
/* id = BLAKE2b-160(pk). */
void proto_peer_id(const uint8_t pk[PROTO_PK_BYTES], uint8_t id[PROTO_ID_BYTES]);

/* Lowercase hex of n bytes into out (2n+1 bytes with the NUL). */
void proto_hex(const uint8_t *p, size_t n, char *out);
/* Parses exactly 2n hex digits into out.  Returns 0 or BEE_ERANGE. */
int proto_unhex(const char *s, uint8_t *out, size_t n);

/* Small files (keys, tokens, beed's known peers).  proto_read_file reads
 * the whole regular file at path, at most max bytes, into a heap buffer
 * with a NUL after the last byte (*out, to free()); BEE_EKEYFILE when it
 * is not a regular file, BEE_ETOOBIG when longer.  proto_write_file writes
 * p under a fresh temporary name, fsyncs it, then renames it over path
 * (with exclusive, links it and fails with -EEXIST if path exists), so a
 * reader sees the old file or the new one, never a part.  Both return 0
 * or those codes or -errno. */
int proto_read_file(const char *path, size_t max, uint8_t **out, size_t *len);
int proto_write_file(const char *path, const void *p, size_t n, int mode,
                     bool exclusive);

/* ------------------------------------------------------------------------ */
/* Access tokens and revocation lists, signed by the swarm's moderator.      */

enum proto_role {
  PROTO_ROLE_BEE = 1,     /* trains and averages */
  PROTO_ROLE_MONITOR = 2, /* reads the DHT only (trainmonitor) */
  PROTO_ROLE_AUX = 4,     /* averages without data of its own */
};
#define PROTO_ROLES_ALL (PROTO_ROLE_BEE | PROTO_ROLE_MONITOR | PROTO_ROLE_AUX)

/* A swarm name: 1..PROTO_SWARM_MAX characters of [A-Za-z0-9._-]. */
bool proto_swarm_valid(const char *name);

/* Returns "bee", "monitor", "aux" or "?". */
const char *proto_role_name(int role);
/* Parses one role name.  Returns 0 or BEE_ECONFIG. */
int proto_role_parse(const char *s, int *role);

/* A decoded access token.  raw holds the exact encoding that was signed
 * over (and is what a peer sends in its handshake). */
typedef struct proto_token {
  char swarm[PROTO_SWARM_MAX + 1];
  uint8_t peer_pk[PROTO_PK_BYTES];
  uint8_t moderator_pk[PROTO_PK_BYTES];
  int role;
  uint64_t issued;  /* unix seconds */
  uint64_t expires; /* unix seconds */
  uint8_t sig[PROTO_SIG_BYTES];
  uint8_t raw[PROTO_TOKEN_MAX];
  size_t raw_len;
} proto_token;

/* Makes and signs a token for peer_pk with the moderator's key. */
int proto_token_issue(proto_token *out, const proto_identity *moderator,
                      const char *swarm, const uint8_t peer_pk[PROTO_PK_BYTES],
                      int role, uint64_t issued, uint64_t expires);
/* Strictly decodes a token's encoding (no signature check). */
int proto_token_decode(const uint8_t *buf, size_t len, proto_token *out);

/* A moderator-signed list of revoked peer keys, kept sorted. */
typedef struct proto_revocation {
  char swarm[PROTO_SWARM_MAX + 1];
  uint8_t moderator_pk[PROTO_PK_BYTES];
  uint64_t seq;    /* newer lists have larger seq */
  uint64_t issued; /* unix seconds */
  size_t n;
  uint8_t (*keys)[PROTO_PK_BYTES]; /* heap, n entries, sorted */
  uint8_t *raw; /* heap: the signed bytes it was decoded from, so it can be
                   passed on (the DHT); NULL once changed or if built here */
  size_t raw_len;
} proto_revocation;

void proto_revocation_init(proto_revocation *rl);
void proto_revocation_close(proto_revocation *rl);
bool proto_revocation_has(const proto_revocation *rl,
                          const uint8_t pk[PROTO_PK_BYTES]);
/* Adds pk (idempotent).  Returns 0, BEE_ETOOBIG or -ENOMEM. */
int proto_revocation_add(proto_revocation *rl, const uint8_t pk[PROTO_PK_BYTES]);
/* Encodes and signs rl with the moderator key into a heap buffer (*out,
 * freed by the caller with free()).  The list's moderator becomes the
 * signer; a list already bound to another moderator is refused with
 * BEE_ETOKEN_MODERATOR, keys out of order with BEE_ERANGE. */
int proto_revocation_encode(const proto_revocation *rl,
                            const proto_identity *moderator, uint8_t **out,
                            size_t *len);
/* Decodes a list and checks it is signed by moderator_pk for swarm.
 * rl is overwritten (not freed first: pass an empty or closed list).  On
 * success rl owns its keys; on failure rl is left empty. */
int proto_revocation_decode(const uint8_t *buf, size_t len,
                            const uint8_t moderator_pk[PROTO_PK_BYTES],
                            const char *swarm, proto_revocation *rl);

/* Checks tok against what this node accepts: signed by moderator_pk, for
 * swarm, naming peer_pk, a role in accept_roles, issued no later than
 * now + PROTO_CLOCK_SKEW_S, not expired at now, peer not in rl (rl may be
 * NULL).  Returns 0 or the BEE_ETOKEN_* / BEE_EREVOKED reason. */
#define PROTO_CLOCK_SKEW_S 300
int proto_token_verify(const proto_token *tok,
                       const uint8_t moderator_pk[PROTO_PK_BYTES],
                       const char *swarm, const uint8_t peer_pk[PROTO_PK_BYTES],
                       int accept_roles, uint64_t now,
                       const proto_revocation *rl);

/* Files.  Key and token files are short text files (see docs/PROTOCOL.md).
 * Public keys travel as 64 hex digits. */
int proto_token_save(const proto_token *tok, const char *path);
int proto_token_load(proto_token *out, const char *path);
int proto_revocation_save(const proto_revocation *rl,
                          const proto_identity *moderator, const char *path);
int proto_revocation_load(proto_revocation *rl, const char *path,
                          const uint8_t moderator_pk[PROTO_PK_BYTES],
                          const char *swarm);

/* Renewal.  A long run outlives its token: beed and trainmonitor look at
 * their token file every few seconds (and at SIGHUP) and take a renewed
 * token without a restart (proto_host_token_renewed tells the peers).
 *
 * proto_file_watch remembers how a file looked (device, inode, size,
 * modification time); zero it, and proto_file_changed(w, path, &err)
 * says whether the file looks different since the last call (the first
 * call after zeroing does).  When it cannot be looked at, it returns
 * false and sets err to -errno the first time in a row, 0 after, so a
 * caller warns once. */
typedef struct proto_file_watch {
  uint64_t dev, ino, size, mtime_s, mtime_ns;
  bool failed; /* the last look failed, with -errno error */
  int error;
} proto_file_watch;
bool proto_file_changed(proto_file_watch *w, const char *path, int *err);
/* Reads the token at path as a renewal of cur: it must load and pass
 * proto_token_verify for this node (moderator_pk, swarm, pk, accept_roles,
 * now, rl) and carry cur's role (else BEE_ETOKEN_ROLE).  Returns 1 when it
 * does and differs from cur, 0 when the file holds cur itself, or the
 * refusal.  *out holds the token read whenever it could be decoded (even
 * when refused), zeros otherwise; wipe it when done. */
int proto_token_renewal(const char *path, const proto_token *cur,
                        const uint8_t moderator_pk[PROTO_PK_BYTES],
                        const char *swarm, const uint8_t pk[PROTO_PK_BYTES],
                        int accept_roles, uint64_t now,
                        const proto_revocation *rl, proto_token *out);
/* Expiry warnings come a day, 6 h, 1 h and 10 min before, and at expiry:
 * how many of those moments lie behind a token with left seconds to go
 * (0 to 5).  A caller warns when this grows, and starts from its value
 * for a token it takes. */
unsigned proto_token_warnings_due(int64_t left);

/* ------------------------------------------------------------------------ */
/* DHT payloads (issue 3): the requests and answers of the RPC methods
 * "dht.ping", "dht.store" and "dht.find".  docs/PROTOCOL.md has the
 * layouts.  Every request carries the sender's listen port (0: a client
 * that must never enter routing tables) and its wall clock, so the
 * receiver learns its contact and can warn about clock skew.            */

#define PROTO_DHT_KEY_BYTES 20   /* keys live in the peer-id space */
#ifndef PROTO_DHT_SUBKEY_MAX
#define PROTO_DHT_SUBKEY_MAX 64  /* subkey, bytes */
#endif
#ifndef PROTO_DHT_VALUE_MAX
#define PROTO_DHT_VALUE_MAX (16u << 10) /* one value, bytes */
#endif
#ifndef PROTO_DHT_RECORDS_MAX
#define PROTO_DHT_RECORDS_MAX 1024 /* records in one STORE or FOUND */
#endif
#ifndef PROTO_DHT_NODES_MAX
#define PROTO_DHT_NODES_MAX 32 /* contacts in one FOUND */
#endif
/* An owned subkey is this byte followed by the owner's Ed25519 public key;
 * only the owner may write it, and its value must carry the owner's
 * signature.  No other subkey may start with this byte. */
#define PROTO_DHT_OWNER_TAG 0x01
#define PROTO_DHT_OWNED_SUBKEY_BYTES (1 + PROTO_PK_BYTES)

/* One record.  subkey.n == 0: the key's plain value.  Views point into
 * the decoded buffer. */
typedef struct proto_dht_record {
  uint8_t key[PROTO_DHT_KEY_BYTES];
  proto_bytes subkey;
  proto_bytes value;
  uint64_t expiration; /* unix seconds */
  bool has_sig;
  uint8_t sig[PROTO_SIG_BYTES];
} proto_dht_record;

/* A node as other nodes know it: id and "host:port" to dial. */
typedef struct proto_dht_contact {
  uint8_t id[PROTO_ID_BYTES];
  proto_bytes addr;
} proto_dht_contact;

/* One DHT payload, decoded.  Which fields a type uses:
 *   PING   port, now
 *   PONG   now, observed (the requester's address as the answerer sees it)
 *   STORE  port, now, records[nrecords]
 *   STORED now, results[nresults]: 0 or a BEE_E* reason per record
 *   FIND   port, now, key, want_value
 *   FOUND  now, found + records[nrecords] (all of the key's live subkeys,
 *          or its plain value), nodes[nnodes] (the closest it knows)
 * The struct is large (fixed arrays); keep it off small stacks. */
typedef struct proto_dht_msg {
  int type;
  uint32_t port;
  uint64_t now;
  uint8_t key[PROTO_DHT_KEY_BYTES];
  bool want_value;
  bool found;
  proto_bytes observed;
  size_t nrecords;
  proto_dht_record records[PROTO_DHT_RECORDS_MAX];
  size_t nresults;
  int32_t results[PROTO_DHT_RECORDS_MAX];
  size_t nnodes;
  proto_dht_contact nodes[PROTO_DHT_NODES_MAX];
} proto_dht_msg;

/* Upper bound on the encoding of m. */
size_t proto_dht_encoded_max(const proto_dht_msg *m);
/* Refuses what proto_dht_decode would refuse; a small buffer is
 * BEE_ETOOBIG.  Counts alone do not keep a message inside one frame: the
 * DHT bounds the bytes under one key (DHT_KEY_BYTES_MAX) so an answer
 * always fits, and splits what it sends in batches. */
int proto_dht_encode(const proto_dht_msg *m, uint8_t *buf, size_t cap,
                     size_t *len);
/* Strict decode of one DHT payload; views into buf, never allocates. */
int proto_dht_decode(const uint8_t *buf, size_t len, proto_dht_msg *m);

/* If subkey is an owned subkey, returns true and points *pk at the owner's
 * key inside it. */
bool proto_dht_subkey_owner(proto_bytes subkey, const uint8_t **pk);
/* Signs r (key, subkey, value, expiration) with id; sets has_sig.  r must
 * be within the limits above; out of memory aborts (small allocation). */
void proto_dht_record_sign(proto_dht_record *r, const proto_identity *id);
/* Checks an owned record's signature against the key in its subkey.
 * Returns 0, BEE_EAUTH (missing or forged signature) or BEE_ERANGE (the
 * subkey is not an owned subkey). */
int proto_dht_record_verify(const proto_dht_record *r);

/* ------------------------------------------------------------------------ */
/* Typed DHT records: what the swarm publishes under well-known names
 * (docs/PROTOCOL.md, section 9).  Each value is one msgpack array
 * [tag, version, fields...] with a str tag ("bee.progress"...) and version
 * 1.  A record of a known type is published under an owned subkey (the
 * publishing peer signs it) and under the key its name derives from its
 * own fields, so no peer can file it elsewhere.  The limits below are part
 * of the format and cannot be overridden.                                 */

#define PROTO_RECORD_VERSION 1
#define PROTO_RUN_MAX 64          /* run name, bytes: [A-Za-z0-9._-] */
#define PROTO_LABEL_MAX 64        /* progress label, bytes of UTF-8 */
#define PROTO_BITS_MAX 16         /* matchmaking group bits, '0'/'1' */
#define PROTO_SCHEMA_HASH_BYTES 32
#define PROTO_GROUP_MAX 65535     /* peers in one averaging group */
#define PROTO_DONOR_SLOTS_MAX 1024
/* No typed record this version writes is longer than this, bytes, but a
 * links record (PROTO_LINKS_RECORD_MAX). */
#define PROTO_RECORD_MAX 512
#define PROTO_LINKS_MAX 64 /* peers in one links record */
#define PROTO_LINKS_RECORD_MAX 4096
#define PROTO_LINK_RTT_MAX_US 60000000u /* a round trip past a minute: absurd */
#define PROTO_LINK_MBIT_MAX 1e6         /* a terabit per second */
#define PROTO_LINK_AGE_MAX_S 86400

enum proto_record_type {
  PROTO_REC_NONE = 0, /* untyped, or a type this version does not know */
  PROTO_REC_PROGRESS, /* "bee.progress" under "<run>_progress" */
  PROTO_REC_METRICS,  /* "bee.metrics" under "<run>_metrics" */
  PROTO_REC_MATCH,    /* "bee.match" under "<run>.avg.<round>.<bits>" */
  PROTO_REC_DONOR,    /* "bee.donor" under "<run>_donors" */
  PROTO_REC_LINKS,    /* "bee.links" under "<run>_links" */
};

/* How a peer takes part in a run. */
enum proto_peer_mode {
  PROTO_MODE_NODE = 0,   /* trains, averages and serves the DHT */
  PROTO_MODE_CLIENT = 1, /* trains and averages; requests only */
  PROTO_MODE_AUX = 2,    /* averages without data of its own */
};

/* Decoded records own their data: strings are NUL-terminated copies.
 * Floats are finite; those said to be rates, times or squares are >= 0. */
typedef struct proto_progress {
  char run[PROTO_RUN_MAX + 1]; /* 1..64 bytes */
  uint64_t epoch;
  uint64_t samples;            /* accumulated in this epoch */
  double samples_per_second;
  uint64_t time_ms;            /* unix ms */
  int mode;                    /* PROTO_MODE_* */
  char label[PROTO_LABEL_MAX + 1]; /* 0..64 bytes, no control chars */
  bool leaving;                /* an optional eighth field: the peer has
                                  left the run (its last record) */
} proto_progress;

#define PROTO_PARAMS_HASH_BYTES 8

/* One averaged step of a peer's: the step, its group's size, and the
 * parameters' hash after it. */
#define PROTO_METRICS_LINES_MAX 4
typedef struct proto_metrics_line {
  uint64_t step;
  uint64_t group_size; /* 2..PROTO_GROUP_MAX */
  uint8_t params[PROTO_PARAMS_HASH_BYTES];
} proto_metrics_line;

typedef struct proto_metrics {
  char run[PROTO_RUN_MAX + 1];
  uint64_t step;
  bool has_loss;               /* false: loss unknown (nil on the wire) */
  double loss;                 /* any finite value when has_loss */
  double samples_per_second;
  double compute_s;
  double averaging_s;
  uint64_t bytes_sent;
  uint64_t bytes_received;
  uint64_t group_size;         /* <= PROTO_GROUP_MAX */
  double grad_sq_local;        /* squared gradient norm, this peer */
  uint64_t batch_local;
  double grad_sq_avg;          /* the same after averaging */
  uint64_t batch_avg;
  uint64_t time_ms;
  bool has_by_all;             /* an optional fifteenth field: */
  double by_all;               /* the share of the tensor the whole group
                                  averaged in the epoch's round, [0, 1] (0:
                                  not averaged) */
  bool diverged;               /* an optional sixteenth field, after
                                  by_all: this peer's parameters left its
                                  swarm's (it stepped without a round its
                                  peers averaged) and it has not loaded
                                  theirs since; written only when true */
  bool has_params;             /* an optional seventeenth field, after */
  uint8_t params[PROTO_PARAMS_HASH_BYTES]; /* diverged (then written even
                                  when false): BLAKE2b-64 of the parameters
                                  after the step, so that peers at one step
                                  can see a swarm split in two lines */
  size_t nlines;               /* an optional eighteenth field, after */
  proto_metrics_line lines[PROTO_METRICS_LINES_MAX]; /* params: this
                                  peer's earlier averaged steps (newest
                                  first, steps below step), so that a peer
                                  that looks after others moved on still
                                  counts every line of a step */
  bool has_loss_scale;         /* optional nineteenth and twentieth fields,
                                  after lines (then written, empty
                                  included): */
  double loss_scale;           /* the peer's loss scale after the step,
                                  finite, > 0 */
  uint64_t dropped;            /* and the batches it dropped in the step
                                  because their scaled gradients
                                  overflowed */
} proto_metrics;

typedef struct proto_match {
  char run[PROTO_RUN_MAX + 1];
  uint64_t round;
  char bits[PROTO_BITS_MAX + 1]; /* 0..16 of '0'/'1', may be empty */
  char addr[PROTO_ADDR_MAX];     /* "host:port", no control chars */
  uint8_t schema_hash[PROTO_SCHEMA_HASH_BYTES];
  int mode;                      /* PROTO_MODE_* */
  double bandwidth_mbit;         /* > 0 */
  double weight;
} proto_match;

typedef struct proto_donor {
  char run[PROTO_RUN_MAX + 1];
  char addr[PROTO_ADDR_MAX];
  uint64_t epoch;
  uint64_t slots;                /* free download slots, <= 1024 */
} proto_donor;

/* What a peer measured of its links to others: for each, the least round
 * trip and the rate data from that peer reached it at, as its rounds,
 * downloads and probes measured them (daemon/links.c). */
typedef struct proto_link {
  uint8_t id[PROTO_ID_BYTES]; /* the other peer; distinct in a record */
  uint64_t rtt_us;            /* <= PROTO_LINK_RTT_MAX_US; 0: not measured */
  double mbit;                /* from it to the publisher, Mbit/s, finite,
                                 0..PROTO_LINK_MBIT_MAX; 0: not measured */
  uint64_t age_s;             /* since last measured, <= PROTO_LINK_AGE_MAX_S */
} proto_link;

typedef struct proto_links {
  char run[PROTO_RUN_MAX + 1];
  uint64_t time_ms; /* unix ms, when written */
  size_t n;         /* <= PROTO_LINKS_MAX */
  proto_link links[PROTO_LINKS_MAX];
} proto_links;

/* The encoders refuse what the decoders would refuse, before writing
 * anything: a string over its limit (or not NUL-terminated inside its
 * array) is BEE_ETOOBIG, any other value out of its range BEE_ERANGE.  A
 * buf smaller than the encoding is BEE_ETOOBIG; PROTO_RECORD_MAX bytes are
 * always enough (PROTO_LINKS_RECORD_MAX for a links record).  They write the current version, minimal-width integers
 * and float64 floats. */
int proto_progress_encode(const proto_progress *p, uint8_t *buf, size_t cap,
                          size_t *len);
int proto_metrics_encode(const proto_metrics *m, uint8_t *buf, size_t cap,
                         size_t *len);
int proto_match_encode(const proto_match *m, uint8_t *buf, size_t cap,
                       size_t *len);
int proto_donor_encode(const proto_donor *d, uint8_t *buf, size_t cap,
                       size_t *len);
int proto_links_encode(const proto_links *l, uint8_t *buf, size_t cap,
                       size_t *len);
/* Strict decoders, with the codes of docs/PROTOCOL.md sections 2 and 9:
 * a tag that is not a str BEE_ETYPE, another tag BEE_EUNKNOWN, a version
 * other than 1 BEE_EVERSION, too few fields BEE_EMISSING, a float32 or
 * any other wrong msgpack type BEE_ETYPE, a string over its limit or a
 * value over PROTO_DHT_VALUE_MAX bytes BEE_ETOOBIG, a value out of its
 * range (NaN, infinity, a negative rate, a bad character) BEE_ERANGE.
 * Fields after the known ones are skipped (how later versions extend a
 * record), nested at most PROTO_DEPTH_MAX - 1 levels (BEE_EDEPTH).  On
 * failure *out is all zero. */
int proto_progress_decode(const uint8_t *buf, size_t len, proto_progress *out);

/* What the progress records of a run say of the swarm: what a bee steps
 * by and what trainmonitor shows, computed the same way by both. */
#ifndef PROTO_PROGRESS_EXTRAP_S
#define PROTO_PROGRESS_EXTRAP_S 3 /* a record's samples grow this long at most */
#endif
typedef struct proto_swarm_view {
  uint64_t epoch;            /* the highest among non-client peers */
  uint64_t samples;          /* accumulated at that epoch, all peers there */
  double samples_per_second; /* every peer's, summed */
  double rate_at_epoch;      /* the same, of the peers at the epoch */
  double eta_s;              /* until target; 0 reached; -1 unknown (rate 0) */
  size_t peers;              /* records of this run */
  size_t peers_at_epoch;
  bool target_reached;
} proto_swarm_view;
/* The view at wall-clock now_ms (unix ms) from the records v[0..n) of
 * run (others are skipped; so are records that say their peer left), as
 * read from the DHT (signatures and schema checked there); a bee puts its
 * own up-to-date progress among them in place of its published one.  Each
 * peer's samples are extrapolated at its rate from its record's time_ms,
 * for at most PROTO_PROGRESS_EXTRAP_S. */
void proto_swarm_view_compute(const proto_progress *v, size_t n,
                              const char *run, uint64_t target,
                              uint64_t now_ms, proto_swarm_view *out);
int proto_metrics_decode(const uint8_t *buf, size_t len, proto_metrics *out);
int proto_match_decode(const uint8_t *buf, size_t len, proto_match *out);
int proto_donor_decode(const uint8_t *buf, size_t len, proto_donor *out);
/* Also BEE_ERANGE for an entry whose peer an earlier one names; an entry
 * is [id, rtt_us, mbit, age_s] followed by any later fields (skipped). */
int proto_links_decode(const uint8_t *buf, size_t len, proto_links *out);

/* The DHT key of a name: BLAKE2b-160("beed dht key" || name), name without
 * its NUL.  Every well-known key of the swarm derives from a name so. */
void proto_dht_key(const char *name, uint8_t key[PROTO_DHT_KEY_BYTES]);
/* The key a typed record of type (a PROTO_REC_* other than NONE) belongs
 * under: the proto_dht_key of "<run>_progress", "<run>_metrics",
 * "<run>_donors" or "<run>.avg.<round>.<bits>" (round in decimal).  round
 * and bits count for PROTO_REC_MATCH only; bits NULL reads as "". */
void proto_record_key(int type, const char *run, uint64_t round,
                      const char *bits, uint8_t key[PROTO_DHT_KEY_BYTES]);
/* The schema check of one DHT record, for every record a node stores or a
 * lookup returns.  A value that is not a msgpack array starting with a str
 * tag "bee.<...>", or whose "bee." tag this version does not know (a
 * newer peer's type), is not judged: 0 with *type PROTO_REC_NONE.  A known
 * type sets *type, pass or fail, and must decode (else the decoder's
 * code), sit under an owned subkey and under the key proto_record_key
 * derives from its decoded fields (else BEE_EAUTH).  The owner's signature
 * is the DHT's to verify (proto_dht_record_verify). */
int proto_record_check(const proto_dht_record *r, int *type);

/* ------------------------------------------------------------------------ */
/* Averaging round payloads (issue 4): the messages of the butterfly
 * all-reduce between the members of one group (averager/round.c).
 * docs/PROTOCOL.md, section 10, has the layouts:
 *   PART   [1, 60, group, sender, part, codec, weight, data or nil]
 *   RESULT [1, 61, group, part, codec, contributors, data or nil]
 *   ABORT  [1, 62, group, code, text]
 * A PART carries one member's piece of one part of the buffer to the
 * part's owner; a RESULT carries the owner's mean of that part back; an
 * ABORT tells a member that the sender has left the round (or dropped the
 * receiver from it).  data is an averager part (docs/AVERAGING.md,
 * section 2), checked by the averager, not here.                         */

#define PROTO_AVG_GROUP_BYTES 16 /* group id, chosen by the matchmaking */
#ifndef PROTO_AVG_DATA_MAX
#define PROTO_AVG_DATA_MAX (PROTO_FRAME_MAX - 1024) /* one part, bytes */
#endif
#define PROTO_AVG_CODEC_MAX 255 /* codec numbers are bytes on the wire */
/* No PART or RESULT header (everything before the data bytes) is longer. */
#define PROTO_AVG_HDR_MAX 64

/* One round message, decoded.  Which fields a type uses:
 *   PART    group, sender, part, codec, weight, has_data + data
 *   RESULT  group, part, codec, contributors, has_data + data
 *   ABORT   group, code, text
 *   WAIT    group: a member of a group formed ahead that has not begun
 *           its round yet is still coming (it resets the receiver's
 *           timeouts for it)
 * has_data false is nil on the wire: PART, "no contribution from me for
 * this part"; RESULT, "nothing was averaged, keep your own values".
 * Views point into the decoded buffer. */
typedef struct proto_avg_msg {
  int type;
  uint8_t group[PROTO_AVG_GROUP_BYTES];
  uint32_t sender;       /* member index, < PROTO_GROUP_MAX */
  uint64_t part;         /* part number within the buffer */
  uint32_t codec;        /* <= PROTO_AVG_CODEC_MAX */
  double weight;         /* finite, >= 0, <= FLT_MAX */
  uint32_t contributors; /* <= PROTO_GROUP_MAX */
  bool has_data;
  proto_bytes data; /* <= PROTO_AVG_DATA_MAX bytes; empty when nil */
  int64_t code;     /* ABORT: a negative BEE_E* or -errno, >= INT32_MIN */
  proto_bytes text; /* ABORT: <= PROTO_TEXT_MAX bytes */
} proto_avg_msg;

/* Upper bound on the encoding of m (its data counted at most at
 * PROTO_AVG_DATA_MAX). */
size_t proto_avg_encoded_max(const proto_avg_msg *m);
/* Refuses, before writing anything, what proto_avg_decode would refuse:
 * another type (BEE_EUNKNOWN), a field out of its range or data while
 * has_data is false (BEE_ERANGE), data or text over its limit
 * (BEE_ETOOBIG).  A buf smaller than the encoding is BEE_ETOOBIG;
 * proto_avg_encoded_max(m) bytes are always enough.  Writes minimal-width
 * integers and a float64 weight.  Fields m's type does not carry are
 * ignored. */
int proto_avg_encode(const proto_avg_msg *m, uint8_t *buf, size_t cap,
                     size_t *len);
/* Encodes a PART or RESULT with has_data set, except its data bytes:
 * everything up to and including the bin header for m->data.n bytes
 * (m->data.p is not read), at most PROTO_AVG_HDR_MAX bytes.  The caller
 * places the data right after it, so a part is encoded straight into the
 * message buffer.  Errors as proto_avg_encode; an ABORT or has_data false
 * is BEE_ERANGE. */
int proto_avg_header_encode(const proto_avg_msg *m, uint8_t *buf, size_t cap,
                            size_t *len);
/* Strict decode of one round message that fills buf exactly, with the
 * codes of docs/PROTOCOL.md sections 2 and 10; views into buf, never
 * allocates.  On failure *m is all zero. */
int proto_avg_decode(const uint8_t *buf, size_t len, proto_avg_msg *m);

/* ------------------------------------------------------------------------ */
/* Matchmaking payloads (issue 4): how peers that declared themselves under
 * one group key (a PROTO_REC_MATCH record) form a group with a leader
 * (averager/match.c).  docs/PROTOCOL.md, section 11, has the layouts:
 *   JOIN  [1, 63, nonce, expiration, run, round, bits, addr, schema_hash,
 *          mode, bandwidth, weight]
 *   REPLY [1, 64, nonce, code, leader or nil, leader_addr or nil]
 *   BEGIN [1, 65, group, round, [[id, addr, mode, bandwidth, weight]...]]
 *   LEAVE [1, 66, code, leader or nil, leader_addr or nil]
 * The sender of each is the authenticated peer the transport says it came
 * from; no message names its own sender.                                  */

/* Members a BEGIN lists, at most (the averager's AVG_GROUP_MAX). */
#define PROTO_GROUP_MEMBERS_MAX 1024

/* REPLY codes: why a would-be leader accepted or refused a JOIN. */
enum proto_join_code {
  PROTO_JOIN_ACCEPTED = 0,
  PROTO_JOIN_NOT_LOOKING = 1,  /* not matchmaking for this round now */
  PROTO_JOIN_BAD_SCHEMA = 2,   /* another tensor layout */
  PROTO_JOIN_BAD_KEY = 3,      /* another run, round or group bits */
  PROTO_JOIN_GROUP_FULL = 4,
  PROTO_JOIN_NOT_A_LEADER = 5, /* a follower itself: leader = its leader */
  PROTO_JOIN_YOU_LEAD = 6,     /* the asker comes first in the order */
  PROTO_JOIN_BAD_EXPIRATION = 7, /* not the expiration the asker declared
                                    could be, or already past */
  PROTO_JOIN_CODE_MAX = 7,
};
/* LEAVE codes: why a leader let its followers go, or a follower left. */
enum proto_leave_code {
  PROTO_LEAVE_DISBANDED = 1, /* leader: too few members at its start */
  PROTO_LEAVE_MOVED = 2,     /* leader: joined another leader (leader set) */
  PROTO_LEAVE_GONE = 3,      /* either side: stopped matchmaking */
  PROTO_LEAVE_CODE_MAX = 3,
};

typedef struct proto_group_member {
  uint8_t id[PROTO_ID_BYTES];
  char addr[PROTO_ADDR_MAX];     /* as in proto_match */
  int mode;                      /* PROTO_MODE_* */
  double bandwidth_mbit;         /* finite, > 0 */
  double weight;                 /* finite, >= 0 */
} proto_group_member;

/* One matchmaking message.  Which fields a type uses:
 *   JOIN   nonce, expiration (the asker's declared start, unix seconds),
 *          info (the asker's proto_match fields)
 *   REPLY  nonce (the JOIN's), code (PROTO_JOIN_*), has_leader + leader +
 *          leader_addr (with NOT_A_LEADER: the one to ask instead)
 *   BEGIN  group, round, nmembers + members (the order of the round)
 *   LEAVE  code (PROTO_LEAVE_*), has_leader + leader + leader_addr (with
 *          MOVED: where the group went)
 * Strings are NUL-terminated copies; the decoder owns nothing else. */
typedef struct proto_group_msg {
  int type;
  uint64_t nonce;
  uint64_t expiration;
  proto_match info;
  uint32_t code;
  bool has_leader;
  uint8_t leader[PROTO_ID_BYTES];
  char leader_addr[PROTO_ADDR_MAX];
  uint8_t group[PROTO_AVG_GROUP_BYTES];
  uint64_t round;
  size_t nmembers;            /* 1..PROTO_GROUP_MEMBERS_MAX */
  proto_group_member *members; /* encode: read; decode: the caller's */
} proto_group_msg;

/* Upper bound on the encoding of m. */
size_t proto_group_encoded_max(const proto_group_msg *m);
/* Refuses, before writing anything, what proto_group_decode would refuse
 * (BEE_EUNKNOWN, BEE_ERANGE, BEE_ETOOBIG as for the records); a buf
 * smaller than the encoding is BEE_ETOOBIG. */
int proto_group_encode(const proto_group_msg *m, uint8_t *buf, size_t cap,
                       size_t *len);
/* Strict decode of one matchmaking message that fills buf exactly, with
 * the codes of docs/PROTOCOL.md sections 2 and 11.  A BEGIN's members go
 * into members (cap entries; more is BEE_ETOOBIG), which m->members then
 * points to; other types leave them alone (cap may be 0).  A BEGIN that
 * lists one id twice is BEE_ERANGE.  On failure *m is all zero. */
int proto_group_decode(const uint8_t *buf, size_t len, proto_group_msg *m,
                       proto_group_member *members, size_t cap);

/* ------------------------------------------------------------------------ */
/* State download (issue 6): a bee behind the swarm fetches the run's
 * training state from a peer with "state.get" requests (state-msg.c,
 * docs/PROTOCOL.md section 12):
 *   REQUEST  [1, 70, run, offset, len]
 *   CHUNK    [1, 71, run, epoch, total, checksum, offset, data]
 *   STEP_REQ [1, 72, run, epoch, offset, len]
 *   STEP     [1, 73, run, epoch, total, checksum, offset, data]
 * checksum is the BLAKE2b-256 of the whole snapshot of total bytes.  A
 * STEP is the update a peer stepped with from epoch to epoch + 1 (the
 * round's mean, as its optimizer took it), so that a bee with the state
 * of epoch takes the same step; total 0: that step changed nothing.     */

#define PROTO_STATE_CHUNK_MAX (1u << 20) /* bytes of one chunk */
#define PROTO_STATE_MAX (1ull << 40)     /* bytes of one snapshot */
#define PROTO_STATE_SUM_BYTES 32

typedef struct proto_state_msg {
  int type; /* PROTO_T_STATE_REQ, _CHUNK, _STEP_REQ or _STEP */
  char run[PROTO_RUN_MAX + 1]; /* all */
  uint64_t offset;             /* all: where the bytes start */
  uint64_t len;                /* REQ, STEP_REQ: bytes asked, 1..CHUNK_MAX */
  /* CHUNK: the snapshot's epoch; STEP_REQ, STEP: the step's (from epoch) */
  uint64_t epoch;
  uint64_t total;                          /* CHUNK, STEP: the whole's size */
  uint8_t checksum[PROTO_STATE_SUM_BYTES]; /* CHUNK, STEP */
  proto_bytes data; /* CHUNK, STEP: a view, at most CHUNK_MAX */
} proto_state_msg;

/* Encodes m; BEE_EUNKNOWN for another type, BEE_ERANGE or BEE_ETOOBIG for
 * what the decoder would refuse (a bad run name, len 0 or over the
 * chunk, an offset past the end, data past total), BEE_ETOOBIG for a
 * small buf. */
int proto_state_encode(const proto_state_msg *m, uint8_t *buf, size_t cap,
                       size_t *len);
/* Strictly decodes one state message that fills buf; data is a view into
 * buf.  On failure *m is all zero. */
int proto_state_decode(const uint8_t *buf, size_t len, proto_state_msg *m);

/* ------------------------------------------------------------------------ */
/* The local trainer protocol (issue 31): a trainer process on beed's host
 * (PyTorch, or any program, through the client library) and its beed,
 * over a unix stream socket (local-msg.c, docs/PROTOCOL.md section 13).
 * Frames as on the network, a big-endian u32 length then the body, not
 * sealed: the socket's mode and the peer's credentials guard it.  The
 * tensors live in memory the trainer shares with beed (a memfd sent with
 * HELLO), never in messages:
 *   HELLO    [1, 80, run, mode, batch, tensors]  trainer, with the fd
 *   WELCOME  [1, 81, epoch, loaded, mode, target, peers, inner_steps,
 *             outer_lr, outer_momentum, delayed, compression]
 *   BATCH    [1, 82, samples, loss]          trainer: gradients added
 *   GO       [1, 83, epoch, samples, peers]  beed: train on
 *   STEP     [1, 84, epoch, apply]           beed: the round is in place
 *   STEPPED  [1, 85, epoch]                  trainer: stepped
 *   LOADED   [1, 86, epoch]                  beed: the swarm's state in place
 *   BYE      [1, 87]                         trainer: leaving
 *   REFUSED  [1, 88, code, text]             beed, then it closes
 *   EVAL     [1, 89, epoch, loss, accuracy]  trainer: a test result
 * A tensor is [name, role, dtype, [dims...]].                             */

enum {
  PROTO_T_LOCAL_HELLO = 80,
  PROTO_T_LOCAL_WELCOME = 81,
  PROTO_T_LOCAL_BATCH = 82,
  PROTO_T_LOCAL_GO = 83,
  PROTO_T_LOCAL_STEP = 84,
  PROTO_T_LOCAL_STEPPED = 85,
  PROTO_T_LOCAL_LOADED = 86,
  PROTO_T_LOCAL_BYE = 87,
  PROTO_T_LOCAL_REFUSED = 88,
  PROTO_T_LOCAL_EVAL = 89,
};
#define PROTO_LOCAL_TYPES 10

/* How the swarm averages (HELLO asks, WELCOME says). */
enum { PROTO_LOCAL_GRADIENTS = 0, PROTO_LOCAL_DILOCO = 1 };
/* What a tensor is to the run. */
enum {
  PROTO_LOCAL_PARAM = 0,  /* a parameter: it has a gradient too */
  PROTO_LOCAL_STATE = 1,  /* the optimizer's state */
  PROTO_LOCAL_BUFFER = 2, /* neither (batch norm's running statistics) */
};
enum { PROTO_LOCAL_F32 = 0 };

#define PROTO_LOCAL_FRAME_MAX (4u << 20) /* bytes of one message */
#define PROTO_LOCAL_TENSORS_MAX 16384
#define PROTO_LOCAL_NAME_MAX 200 /* bytes of a tensor's name */
#define PROTO_LOCAL_DIMS_MAX 8
#define PROTO_LOCAL_CODEC_MAX 15           /* bytes of WELCOME's compression */
#define PROTO_LOCAL_ELEMS_MAX (1ull << 38) /* of one tensor, and of all */

typedef struct proto_local_tensor {
  proto_bytes name; /* 1..NAME_MAX printable ASCII bytes; a view */
  int role;         /* PROTO_LOCAL_PARAM, _STATE, _BUFFER */
  int dtype;        /* PROTO_LOCAL_F32 */
  unsigned ndim;    /* 0 (a scalar) .. DIMS_MAX */
  uint64_t dims[PROTO_LOCAL_DIMS_MAX]; /* each >= 1 */
  uint64_t elems;                      /* their product */
} proto_local_tensor;

typedef struct proto_local_msg {
  int type;                    /* PROTO_T_LOCAL_* */
  char run[PROTO_RUN_MAX + 1]; /* HELLO */
  int mode;                    /* HELLO, WELCOME */
  uint64_t batch;              /* HELLO: samples a BATCH counts, >= 1 */
  /* HELLO, to encode: the tensors, list[0..n); decoded: n and tensors,
   * the list as it came (checked whole; proto_local_tensor_next reads
   * it), list NULL. */
  const proto_local_tensor *list;
  size_t n;
  proto_bytes tensors;
  uint64_t epoch;  /* WELCOME, GO, STEP, STEPPED, LOADED, EVAL */
  bool loaded;     /* WELCOME: the memory holds a state beed loaded */
  uint64_t target; /* WELCOME: the run's global batch */
  uint64_t peers;  /* WELCOME, GO: bees in the swarm's view */
  /* WELCOME, in DiLoCo mode (else 0): the local steps between rounds
   * and the outer step's rate and momentum, finite and >= 0 */
  uint64_t inner_steps;
  double outer_lr, outer_momentum;
  /* WELCOME, gradient averaging only: --delay-averaging, each epoch's
   * STEP comes while the next epoch's batches add up (after one of its
   * BATCHes), and the gradients the trainer added are still there after
   * its STEPPED */
  bool delayed;
  /* WELCOME: the round's codec by name ("none", "fp16", ...; --compression),
   * 1..PROTO_LOCAL_CODEC_MAX printable bytes without spaces */
  char compression[PROTO_LOCAL_CODEC_MAX + 1];
  uint64_t samples; /* BATCH: this batch's; GO: the swarm's in the epoch */
  double loss;      /* BATCH: the batch's mean; EVAL */
  bool apply;       /* STEP: the trainer's optimizer steps with the mean
                       gradients; false: beed stepped the parameters */
  double accuracy;  /* EVAL: 0..1 */
  int64_t code;     /* REFUSED: a BEE_E* code */
  char text[PROTO_TEXT_MAX + 1]; /* REFUSED */
} proto_local_msg;

/* Encodes m; BEE_EUNKNOWN for another type, BEE_ERANGE for what the
 * decoder would refuse, BEE_ETOOBIG for a small buf. */
int proto_local_encode(const proto_local_msg *m, uint8_t *buf, size_t cap,
                       size_t *len);
/* Strictly decodes one message that fills buf (views into buf).  On
 * failure *m is all zero. */
int proto_local_decode(const uint8_t *buf, size_t len, proto_local_msg *m);
/* The next of a decoded HELLO's tensors: *it starts at m->tensors and
 * moves on; returns 0 with *t filled, 1 after the last. */
int proto_local_tensor_next(proto_bytes *it, proto_local_tensor *t);
/* Whether two decoded HELLOs' tensor lists (ours, and the swarm's from
 * a peer) describe the same model: 0, or 1 with why (cap bytes) naming
 * the first difference, e.g. "tensor 2 (fc.weight) is [10, 128] here
 * and [10, 64] in the swarm". */
int proto_local_tensors_diff(const proto_local_msg *ours,
                             const proto_local_msg *swarm, char *why,
                             size_t cap);

/* ------------------------------------------------------------------------ */
/* Session core: handshake and sealed frames, no I/O.                        */

enum proto_cipher {
  PROTO_CIPHER_AES256GCM = 1,
  PROTO_CIPHER_XCHACHA20POLY1305 = 2,
};
#define PROTO_CIPHERS_ALL (PROTO_CIPHER_AES256GCM | PROTO_CIPHER_XCHACHA20POLY1305)

/* What a connection is for; a peer's role decides which it may open. */
enum proto_purpose {
  PROTO_PURPOSE_CONTROL = 1, /* RPC, one per peer */
  PROTO_PURPOSE_BULK = 2,    /* tensor streams, several per peer */
};

/* A node's side of every handshake.  Borrowed; must outlive the sessions
 * and connections that use it. */
typedef struct proto_auth {
  const proto_identity *id;
  const proto_token *token;        /* our token; NULL in an open swarm */
  const uint8_t *moderator_pk;     /* NULL: open swarm (needs --open) */
  const char *swarm;               /* swarm name */
  const proto_revocation *revoked; /* may be NULL */
  int accept_roles;                /* roles accepted on control conns */
  int accept_bulk_roles;           /* roles accepted on bulk conns */
  int ciphers;                     /* PROTO_CIPHER_* we offer/accept */
} proto_auth;

/* The authenticated peer, known once a handshake completes. */
typedef struct proto_peer {
  uint8_t pk[PROTO_PK_BYTES];
  uint8_t id[PROTO_ID_BYTES];
  int role;     /* from its token; PROTO_ROLE_BEE in an open swarm */
  int purpose;  /* PROTO_PURPOSE_* */
  int cipher;   /* negotiated PROTO_CIPHER_* */
  uint64_t token_expires; /* 0 in an open swarm */
} proto_peer;

/* One direction of sealed traffic: key plus a nonce counter that only
 * grows, so no nonce repeats under one key.  A sealer owns a cipher
 * context once used: release it with proto_sealer_clear.  It may be moved
 * by value, but only one copy may be cleared. */
typedef struct proto_sealer {
  int cipher;
  uint64_t counter;
  uint8_t key[32];
  void *ctx; /* AES-256-GCM: the libcrypto context, made on first use */
} proto_sealer;

/* Seals buf[0..len) in place and appends the PROTO_TAG_BYTES tag, so buf
 * must have len + PROTO_TAG_BYTES bytes.  Returns 0, or BEE_ELIMIT when the
 * nonce counter would wrap. */
int proto_seal(proto_sealer *s, uint8_t *buf, size_t len);
/* Opens a sealed body of len bytes in place (tag included).  On success the
 * plaintext is buf[0..*plain_len).  BEE_EAUTH on a forged, replayed,
 * reordered or corrupted body. */
int proto_open(proto_sealer *s, uint8_t *buf, size_t len, size_t *plain_len);
/* Frees the sealer's context and wipes its key. */
void proto_sealer_clear(proto_sealer *s);

/* Handshake state machine.  The initiator calls proto_hs_step with no input
 * to get its first frame; afterwards each side feeds every frame body it
 * receives and sends every body the step produces, until proto_hs_step
 * reports done or fails.  See docs/PROTOCOL.md for the messages. */
typedef struct proto_hs proto_hs;
#define PROTO_HS_OUT_MAX 2048 /* no handshake frame body is larger */

/* Creates a handshake for one connection.  now is unix seconds (token
 * checks).  Returns NULL on out-of-memory. */
proto_hs *proto_hs_new(const proto_auth *auth, bool initiator, int purpose,
                       uint64_t now);
void proto_hs_free(proto_hs *hs);
/* Feeds one received frame body (NULL/0 to start as initiator).  Writes the
 * next frame body to send, if any, into out (PROTO_HS_OUT_MAX bytes) and
 * its length into *out_len (0: nothing to send).  Sets *done once the
 * session is established.  On failure returns the reason; *out_len may
 * still be non-zero: a verdict for the peer to send before closing.
 * The peer's own refusal comes back as BEE_EREMOTE with its code in
 * *remote_code and its text from proto_hs_remote_text. */
int proto_hs_step(proto_hs *hs, const uint8_t *in, size_t in_len, uint8_t *out,
                  size_t *out_len, bool *done, int *remote_code);
const char *proto_hs_remote_text(const proto_hs *hs);
/* After done: the peer and the two traffic sealers (moved out of hs). */
int proto_hs_result(proto_hs *hs, proto_peer *peer, proto_sealer *tx,
                    proto_sealer *rx);

/* ------------------------------------------------------------------------ */
/* Transport: authenticated connections over libuv TCP, with RPC.            */

typedef struct proto_host proto_host;
typedef struct proto_conn proto_conn;

/* A request arrived.  payload is borrowed for the call; answer with
 * proto_conn_reply or proto_conn_reply_error now or later, or not at all
 * (the caller then times out). */
typedef void (*proto_request_cb)(proto_conn *c, uint64_t id, proto_bytes method,
                                 proto_bytes payload, void *data);
/* A one-way message arrived (borrowed). */
typedef void (*proto_oneway_cb)(proto_conn *c, proto_bytes method,
                                proto_bytes payload, void *data);
/* A stream event: open (kind, total, meta), chunk (offset, data) or end
 * (status).  Bytes are borrowed for the call. */
typedef void (*proto_stream_cb)(proto_conn *c, const proto_msg *m, void *data);
/* A connection came up (handshake done) or went down (status says why). */
typedef void (*proto_conn_cb)(proto_conn *c, int status, void *data);
/* The answer to proto_conn_call: status 0 with the payload, BEE_EREMOTE with
 * the peer's code and text in payload, or a local failure (BEE_ETIMEOUT,
 * BEE_ECLOSED, BEE_ECANCELED).  Called exactly once. */
typedef void (*proto_reply_cb)(proto_conn *c, int status, int64_t remote_code,
                               proto_bytes payload, void *arg);
/* The result of proto_host_connect: c is NULL on failure. */
typedef void (*proto_connect_cb)(proto_host *h, proto_conn *c, int status,
                                 void *arg);
/* A queued send left the write queue (for callers pacing bulk data). */
typedef void (*proto_drain_cb)(proto_conn *c, void *data);

typedef struct proto_host_config {
  uv_loop_t *loop;
  proto_auth auth;
  size_t max_conns;           /* all connections, default 1024 */
  size_t max_pending_per_addr;/* handshakes in flight per source address, default 8 */
  uint64_t handshake_timeout_ms; /* default 10000 */
  uint64_t connect_timeout_ms;   /* default 10000 */
  uint64_t idle_timeout_ms;      /* no frame received for this long: close; default 60000 */
  uint64_t keepalive_ms;         /* ping after this much silence; default 15000 */
  uint64_t rpc_timeout_ms;       /* default per-call timeout, default 10000 */
  uint64_t stall_timeout_ms;     /* write queue makes no progress: close; default 30000 */
  size_t write_queue_max;        /* memory queued per connection, default 16 MiB */
  proto_request_cb on_request;
  proto_oneway_cb on_oneway;
  proto_stream_cb on_stream;
  proto_conn_cb on_up;
  proto_conn_cb on_down;
  proto_drain_cb on_drain;
  void *data;
} proto_host_config;

/* Fills cfg with defaults (all callbacks NULL, ciphers all, roles all). */
void proto_host_config_default(proto_host_config *cfg);

/* Creates a host on cfg->loop.  The config is copied; auth's pointers are
 * borrowed.  Returns 0 and *out, or a negative code. */
int proto_host_new(const proto_host_config *cfg, proto_host **out);
/* Closes every connection and the listener; frees the host once the loop
 * has closed the handles.  Safe to call from any callback. */
void proto_host_close(proto_host *h);

/* The token that cfg.auth.token points to was replaced by a renewed one
 * (same key and role, a later expiry): every connection up now sends it
 * to its peer (the one-way PROTO_TOKEN_METHOD), and one whose handshake
 * is running sends it once up, so that the peers move their connections'
 * expiry to the new token's instead of closing them at the old one's.
 * New handshakes send the new token anyway.  Returns how many
 * connections were told. */
size_t proto_host_token_renewed(proto_host *h);

/* Listens on "ADDR:PORT", "[V6ADDR]:PORT" or ":PORT" (all addresses).
 * Returns 0 or a negative code; the bound port goes to *port if non-NULL. */
int proto_host_listen(proto_host *h, const char *addr, int *port);
/* Resolves "HOST:PORT" (uv_getaddrinfo), connects and handshakes for
 * purpose.  cb runs exactly once unless this returns an error.  For a
 * control connection to a peer we already have one with, cb gets that
 * existing connection (see proto_host_find), which may be one the peer
 * opened to us. */
int proto_host_connect(proto_host *h, const char *hostport, int purpose,
                       proto_connect_cb cb, void *arg);
/* Number of live authenticated connections. */
size_t proto_host_conn_count(const proto_host *h);
/* Registers the handler for one RPC method (copied name, at most
 * PROTO_METHOD_MAX bytes; a later call replaces it, a NULL cb removes it).
 * Requests for methods with no handler go to cfg.on_request if set, else
 * get a BEE_ENOMETHOD error reply.  Returns 0, BEE_ETOOBIG or -ENOMEM. */
int proto_host_on(proto_host *h, const char *method, proto_request_cb cb,
                  void *data);
/* The same for one-way messages of one method: they go to cb instead of
 * cfg.on_oneway.  A method may have both handlers. */
int proto_host_on_oneway(proto_host *h, const char *method, proto_oneway_cb cb,
                         void *data);
/* The live control connection to the peer with this id, or NULL.  There is
 * at most one: when two peers connect to each other at once, both keep the
 * connection opened by the peer with the smaller id. */
proto_conn *proto_host_find(const proto_host *h, const uint8_t id[PROTO_ID_BYTES]);
/* Calls fn for every live authenticated connection. */
void proto_host_foreach(const proto_host *h, void (*fn)(proto_conn *c, void *arg),
                        void *arg);

/* The authenticated peer on c. */
const proto_peer *proto_conn_peer(const proto_conn *c);
/* "ip:port" of the remote end ("[ip]:port" for IPv6). */
const char *proto_conn_addr(const proto_conn *c);
void proto_conn_set_data(proto_conn *c, void *data);
void *proto_conn_get_data(const proto_conn *c);
/* The least round trip seen on c, ms (from the handshake, then keepalive
 * pings): 0 when under a millisecond or not known yet. */
uint64_t proto_conn_rtt_ms(const proto_conn *c);
/* The same in microseconds: 0 when not known yet. */
uint64_t proto_conn_rtt_us(const proto_conn *c);
/* The rate data reached us at on c, Mbit/s, since the last call (0: no
 * measure): the best of its flights (a window's worth of segments, timed
 * from the reads; proto/meter.c) that moved 256 KiB or more.  On a
 * control connection, flights over all our connections to its peer
 * (stripes) count too.  It is the rate of the slowest link on the path,
 * or what the sender's pacing allows of it (one stream of several that
 * share the link: its share), also while TCP's window is still growing;
 * a loop busy elsewhere can lower it, never raise it. */
double proto_conn_take_rx_mbit(proto_conn *c);
/* Memory held by c's write queue: queued frames and their bookkeeping. */
size_t proto_conn_queued(const proto_conn *c);

/* Sends a request; cb runs exactly once unless this returns an error.
 * timeout_ms 0 means the host default.  The request id goes to *id.
 * This and every send below copy the payload before returning: the
 * caller keeps its buffer. */
int proto_conn_call(proto_conn *c, const char *method, const uint8_t *payload,
                    size_t len, uint64_t timeout_ms, proto_reply_cb cb,
                    void *arg, uint64_t *id);
/* Cancels a call: its cb runs now with BEE_ECANCELED, and the peer is told. */
int proto_conn_cancel(proto_conn *c, uint64_t id);
int proto_conn_reply(proto_conn *c, uint64_t id, const uint8_t *payload,
                     size_t len);
int proto_conn_reply_error(proto_conn *c, uint64_t id, int code,
                           const char *text);
int proto_conn_oneway(proto_conn *c, const char *method,
                      const uint8_t *payload, size_t len);
/* Sends any envelope message (streams use this).  BEE_EQUEUE when the
 * write queue is over its limit: wait for on_drain and retry. */
int proto_conn_send(proto_conn *c, const proto_msg *m);
/* Sends one stream chunk of up to PROTO_CHUNK_MAX bytes (copied). */
int proto_conn_send_chunk(proto_conn *c, uint64_t stream_id, uint64_t offset,
                          const uint8_t *data, size_t len);
/* Closes c with a reason the peer logs.  Pending calls fail with
 * BEE_ECLOSED and on_down runs before this returns (if on_up ran); the
 * memory goes back to the loop later, so c stays valid until the current
 * callback returns, but must not be used after that. */
void proto_conn_close(proto_conn *c, int code, const char *text);

#endif /* BEE_PROTO_H */
