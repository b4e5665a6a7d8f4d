/* bee.h: the daemon's internal header.
 *
 * beed ties the libraries together: config.c turns flags and a config file
 * into a bee_config, members.c keeps the set of authenticated peers and
 * forms the swarm (until the DHT replaces it), main.c owns the loop, the
 * signals, the join targets and the start-up checks.  Nothing outside
 * daemon/ (except its tests) includes this file.
 */
#ifndef BEE_DAEMON_BEE_H
#define BEE_DAEMON_BEE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "proto.h"

/* ------------------------------------------------------------------------ */
/* Limits.  Each may be overridden at build time.                            */

#ifndef BEE_JOIN_MAX
#define BEE_JOIN_MAX 64 /* --join targets */
#endif
#ifndef BEE_LINE_MAX
#define BEE_LINE_MAX 4096 /* config file line, bytes without the newline */
#endif
#ifndef BEE_PATH_MAX
#define BEE_PATH_MAX 1024 /* file names in flags, bytes with the NUL */
#endif
#define BEE_PEERS_MAX PROTO_PEERS_MAX /* entries in one swarm.peers answer */
#ifndef BEE_PEER_CONNS_MAX
#define BEE_PEER_CONNS_MAX 4 /* control connections kept to one peer */
#endif
/* "host:port": a 253-byte DNS name, the colon, 5 digits and the NUL. */
#define BEE_ADDR_MAX PROTO_ADDR_MAX
#define BEE_HOST_MAX 254 /* host part with its NUL */

#define BEE_DEFAULT_PORT 45555
#define BEE_DEFAULT_LISTEN "0.0.0.0:45555"
#define BEE_DEFAULT_IDENTITY "beed.key"
#define BEE_DEFAULT_SWARM "beed"
#define BEE_DEFAULT_MAX_CONNS 1024
#define BEE_DEFAULT_STATUS_S 10
#define BEE_STATUS_MAX_S 86400

/* ------------------------------------------------------------------------ */
/* Configuration (config.c).                                                 */

/* Everything beed is told at start-up.  Empty strings mean "not given".
 * Plain data: no heap, so it may be copied and needs no close. */
typedef struct bee_config {
  char listen[BEE_ADDR_MAX];
  char join[BEE_JOIN_MAX][BEE_ADDR_MAX];
  size_t njoin;
  char identity[BEE_PATH_MAX];
  bool moderated; /* moderator_pk is set */
  uint8_t moderator_pk[PROTO_PK_BYTES];
  char token[BEE_PATH_MAX];
  char swarm[PROTO_SWARM_MAX + 1];
  bool open;
  char revocations[BEE_PATH_MAX];
  char config[BEE_PATH_MAX];
  int log_level; /* BEE_LOG_* */
  unsigned max_conns;
  bool no_listen;
  bool client; /* DHT client mode: never in routing tables */
  unsigned status_interval_s; /* 0: no status lines */
  unsigned revocation_interval_s; /* poll the DHT's revocation list */
  bool help;    /* --help was given: print usage, nothing else is checked */
  bool version; /* --version was given */
} bee_config;

/* Fills cfg with the defaults. */
void bee_config_init(bee_config *cfg);

/* Parses beed's command line (argv[0] is the program name) into cfg: the
 * defaults, then the --config file if one is named, then the flags, which
 * override the file (given --join flags replace the file's join list).
 * Finally checks that the result makes sense as a whole.
 *
 * Never exits and prints nothing.  Returns 0, or BEE_ECONFIG for a bad
 * flag, value or config line, or -errno when the config file cannot be
 * read; err (errlen bytes) then holds one line naming the flag ("--listen:
 * ...") or the place in the file ("FILE:LINE: ...").  With --help or
 * --version it returns 0 at once with cfg->help or cfg->version set. */
int bee_config_parse(bee_config *cfg, int argc, char *const argv[], char *err,
                     size_t errlen);

/* Applies the "key = value" lines of the file at path onto cfg, in order.
 * Lines longer than BEE_LINE_MAX bytes are refused.  Returns as
 * bee_config_parse; cfg may be partly changed on failure. */
int bee_config_load_file(bee_config *cfg, const char *path, char *err,
                         size_t errlen);

/* Checks the settings that depend on each other (--open / --moderator /
 * --token / --revocations).  Returns 0 or BEE_ECONFIG with err set. */
int bee_config_check(const bee_config *cfg, char *err, size_t errlen);

/* Writes the --help text to f. */
void bee_config_usage(FILE *f);

/* Splits "HOST:PORT", "[V6ADDR]:PORT" or ":PORT" into host (without the
 * brackets, "" for ":PORT"; hostcap bytes) and port.  With listen set the
 * host must be a numeric address or empty and the port may be 0; otherwise
 * the host may be a DNS name but not empty and the port is 1..65535.
 * Returns 0 or BEE_ECONFIG. */
int bee_addr_parse(const char *s, bool listen, char *host, size_t hostcap,
                   unsigned *port);

/* ------------------------------------------------------------------------ */
/* Swarm membership (members.c).                                             */

/* One authenticated peer and the control connections open to it. */
typedef struct bee_member {
  uint8_t id[PROTO_ID_BYTES];
  int role;
  char addr[BEE_ADDR_MAX]; /* its listen address from swarm.hello, or "" */
  proto_conn *conns[BEE_PEER_CONNS_MAX];
  size_t nconns;
} bee_member;

typedef struct bee_dial bee_dial;

/* The set of peers this node is connected to, and the swarm formation that
 * fills it: every new connection gets a swarm.hello with our listen port,
 * and swarm.peers answers with the listen addresses we know. */
typedef struct bee_members {
  proto_host *host; /* NULL until started and after stopping */
  uint8_t self_id[PROTO_ID_BYTES];
  unsigned listen_port; /* advertised in swarm.hello; 0: not listening */
  bee_member *v;        /* heap, n used of cap */
  size_t n, cap;
  bee_dial *dials; /* outgoing connections to learned addresses */
  size_t ndials;
} bee_members;

void bee_members_init(bee_members *m, const uint8_t self_id[PROTO_ID_BYTES]);
/* Starts using host (borrowed): registers the swarm.peers handler and
 * dials learned peers from now on.  listen_port goes into our
 * swarm.hello.  Returns 0 or the error of proto_host_on. */
int bee_members_start(bee_members *m, proto_host *host, unsigned listen_port);
/* Stops dialing; callbacks still pending find nothing more to do.  Call
 * before proto_host_close. */
void bee_members_stop(bee_members *m);
/* Frees the table once the loop has finished (no callback can come). */
void bee_members_close(bee_members *m);

/* Records the authenticated control connection c (bulk connections are
 * ignored).  Idempotent, so it may be called both from on_up and from a
 * connect callback.  The first time a connection is seen it gets our
 * swarm.hello; the first connection of a peer logs "peer up".  The
 * transport keeps one control connection per peer; the list per peer only
 * matters while a duplicate is being replaced.  Returns 1 when the peer is
 * new, 0 otherwise, or BEE_ELIMIT / BEE_ESELF when c was closed. */
int bee_members_up(bee_members *m, proto_conn *c);
/* Forgets c.  Returns 1 and copies the peer id to gone_id when that was
 * the peer's last connection (logged as "peer down"), else 0. */
int bee_members_down(bee_members *m, proto_conn *c, int status,
                     uint8_t gone_id[PROTO_ID_BYTES]);
/* The peer with this id, or NULL. */
const bee_member *bee_members_find(const bee_members *m,
                                   const uint8_t id[PROTO_ID_BYTES]);
/* Handles a one-way message; returns false if the method is not ours. */
bool bee_members_oneway(bee_members *m, proto_conn *c, proto_bytes method,
                        proto_bytes payload);
/* Asks c for its peers and dials every listed address we are not connected
 * to yet.  Returns 0 or the error from proto_conn_call. */
int bee_members_ask(bee_members *m, proto_conn *c);
/* Logs "swarm: N peers [id8 ...]". */
void bee_members_log_status(const bee_members *m);

/* ------------------------------------------------------------------------ */
/* The revocation list in the DHT (revoke.c).                                */

struct dht_glue;
struct dht_node;

/* Lists live under the DHT key "<swarm>.revocation", one record per list
 * with the list's seq (8 bytes, big-endian) as its subkey, so that an old
 * list replayed with a later expiration can never displace a newer one.
 * Every node publishes the newest list it holds and polls the key; a list
 * with a higher seq replaces its own, and every connected peer the new list
 * revokes is disconnected at once (the handshake refuses it from then on,
 * since the host reads the same list). */
typedef struct bee_revoke {
  proto_revocation *list; /* the daemon's list, borrowed (host auth reads it) */
  const uint8_t *moderator_pk;
  const char *swarm;
  uint8_t key[20];
  proto_host *host;
  struct dht_glue *dht;
  uv_timer_t timer;
  uint64_t interval_ms;
  bool busy, stopped, published;
} bee_revoke;

/* Sets up r (its timer on loop) for a moderated swarm.  Nothing runs until
 * bee_revoke_start. */
void bee_revoke_init(bee_revoke *r, uv_loop_t *loop, proto_revocation *list,
                     const uint8_t *moderator_pk, const char *swarm,
                     unsigned interval_s);
/* The DHT validator for records under the revocation key: the value must be
 * a list signed by the moderator for this swarm, its seq equal to the
 * subkey.  Records under other keys pass.  ctx is the bee_revoke. */
int bee_revoke_validate(void *ctx, const proto_dht_record *rec);
/* Publishes the list we hold (if any) and starts polling. */
void bee_revoke_start(bee_revoke *r, proto_host *host, struct dht_glue *dht);
/* Stops polling; closes the timer. */
void bee_revoke_stop(bee_revoke *r);

/* First 8 hex digits of a peer id (out: 9 bytes). */
void bee_id8(const uint8_t id[PROTO_ID_BYTES], char out[9]);

#endif /* BEE_DAEMON_BEE_H */
