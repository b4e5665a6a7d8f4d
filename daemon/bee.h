/* bee.h: the daemon's internal header.
 *
 * beed ties the libraries together.  Its files:
 *   main.c       the loop, the signals, the join targets, the start-up
 *                checks, a trainer process's arrival and leaving
 *   config.c     flags and the config file into a bee_config
 *   members.c    the authenticated peers and the addresses they give
 *   peers.c      the known-peers file (--peers-file)
 *   revoke.c     the moderator's revocation list from the DHT
 *   control.c    the local control socket (--control)
 *   notify.c     the systemd notify protocol
 *   ckpt.c       checkpoint files
 *   uploads.c    the state downloads a donor serves at once
 *   links.c      the table of a bee's links to its peers, without I/O
 *   progress.c   what the progress records say and when, without I/O
 *   local.c      a trainer process's session (--model external)
 *   train.c      the bee's training: its threads and the epoch step, with
 *                train-init.c, train-swarm.c, train-state.c and
 *                train-links.c (train-int.h says what goes where)
 *   run.c        the run core, decisions without I/O (run.h), with
 *                run-view.c, run-round.c, run-fetch.c and run-line.c
 *                (run-int.h)
 * Nothing outside daemon/ (except its tests) includes this file.
 */
#ifndef BEE_DAEMON_BEE_H
#define BEE_DAEMON_BEE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "proto.h"

/* ------------------------------------------------------------------------ */
/* Limits.  Each may be overridden at build time.                            */

#ifndef BEE_JOIN_MAX
#define BEE_JOIN_MAX 64 /* --join targets */
#endif
#ifndef BEE_ANNOUNCE_MAX
#define BEE_ANNOUNCE_MAX 4 /* --announce addresses */
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
#define BEE_DEFAULT_DATA "/usr/share/datasets/fashion-mnist"
#define BEE_DEFAULT_BATCH 64
#define BEE_DEFAULT_TARGET_BATCH 4096
#define BEE_DEFAULT_LR 0.05      /* SGD's; AdamW and LAMB: 1e-3 */
#define BEE_DEFAULT_INNER_STEPS 50
#define BEE_DEFAULT_OUTER_LR 0.7 /* DiLoCo's (Douillard et al. 2023) */
#define BEE_DEFAULT_OUTER_MOMENTUM 0.9
#define BEE_DEFAULT_MATCHMAKING_S 2.0
#define BEE_DEFAULT_STATE_UPLOADS 2 /* state downloads a donor serves at once */
#define BEE_STATE_UPLOADS_MAX 64

enum { BEE_OPT_SGD = 1, BEE_OPT_ADAMW, BEE_OPT_LAMB };
enum { BEE_AVG_GRADIENTS = 1, BEE_AVG_DILOCO };
enum { BEE_SCHED_CONSTANT = 0, BEE_SCHED_COSINE, BEE_SCHED_LINEAR };
#define BEE_BATCH_MAX 4096 /* samples per local step */
#define BEE_CLIP_AUTO 10.0 /* --clip auto */

/* ------------------------------------------------------------------------ */
/* Configuration (config.c).                                                 */

/* Everything beed is told at start-up.  Empty strings mean "not given".
 * Plain data: no heap, so it may be copied and needs no close. */
typedef struct bee_config {
  char listen[BEE_ADDR_MAX];
  char join[BEE_JOIN_MAX][BEE_ADDR_MAX];
  size_t njoin;
  /* Where peers reach this node, first the one to give them (the
   * matchmaking and donor records carry one address). */
  char announce[BEE_ANNOUNCE_MAX][BEE_ADDR_MAX];
  size_t nannounce;
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
  /* Training (train.c): on when run is set. */
  char run[PROTO_RUN_MAX + 1];
  char model[16];                    /* "mlp", "cnn", "resnet", "gpt", or
                                   "external": a trainer process's */
  char trainer_socket[BEE_PATH_MAX]; /* --model external: where it comes */
  char data[BEE_PATH_MAX];      /* images: IDX or CIFAR-10 directory */
  bool batchnorm;               /* cnn: its batch-norm variant */
  bool augment;                 /* images: random crop (pad 4) and flip */
  unsigned depth, width;        /* resnet; 0: the trainer's default */
  char tokens[BEE_PATH_MAX];    /* gpt: the training token file */
  char val_tokens[BEE_PATH_MAX]; /* gpt: the held-out one ("": no test) */
  unsigned vocab, ctx, layers, heads, embd; /* gpt; 0: the default */
  unsigned batch_size;          /* samples per local step */
  unsigned target_batch_size;   /* samples the swarm gathers per epoch */
  double lr;                    /* 0: the optimizer's default (bee_config_lr) */
  int optimizer;                /* BEE_OPT_* */
  int lr_schedule;              /* BEE_SCHED_*, by epoch */
  unsigned warmup_epochs;       /* linear warmup from lr / warmup */
  unsigned total_epochs;        /* cosine, linear: min_lr from then on */
  double min_lr;
  bool min_lr_set;
  int averaging;                /* BEE_AVG_* */
  unsigned inner_steps;         /* diloco: local steps per round; 0: unset */
  double outer_lr;              /* diloco: Nesterov outer step; 0: unset */
  double outer_momentum;        /* diloco; < 0: unset */
  unsigned average_state_every; /* epochs; 0: never */
  double matchmaking_s;         /* the longest a round waits for its peers */
  unsigned min_peers;           /* training waits for this many in the run */
  unsigned group_size;          /* a group's members at most; 0: all */
  unsigned max_state_uploads;   /* state downloads served at once */
  bool delay_averaging;         /* the round runs behind the next epoch */
  bool no_match_ahead;          /* matchmaking once the target is reached,
                                   not --matchmaking-time ahead of it */
  int compression;              /* avg_codec of the gradient (DiLoCo: the
                                   change) rounds; AVG_NONE by default */
  bool error_feedback;          /* carry each round's coding error into the
                                   next (lossy compression only) */
  /* --clip: an update round's contribution whose norm (per part) is more
   * than clip times the median of the group's is scaled down to it; 0:
   * off.  BEE_CLIP_AUTO by default. */
  double clip;
  /* --bandwidth: what this bee declares as its link in matchmaking,
   * Mbit/s; 0 (auto, the default): as its rounds measured it. */
  double bandwidth_mbit;
  char label[PROTO_LABEL_MAX + 1];
  unsigned threads;
  char device[32];              /* trainer device spec: auto, cpu, cuda:N */
  char precision[8];            /* --precision fp32, tf32, bf16, fp16 */
  /* --loss-scale (trn_loss_scale_parse's syntax): 0 for auto (fp16 on
   * CUDA: dynamic from 2^15), else the scale to start from, fixed or
   * not */
  float loss_scale;
  bool loss_scale_fixed;
  unsigned eval_every;          /* epochs; 0: never */
  char checkpoint_dir[BEE_PATH_MAX]; /* "": no checkpoints */
  unsigned checkpoint_every;    /* epochs */
  unsigned keep_checkpoints;
  bool resume;
  char control[BEE_PATH_MAX];   /* "": no control socket */
  char peers_file[BEE_PATH_MAX]; /* "": known peers not kept */
  bool check;   /* --check: load and check everything, start nothing */
  bool help;    /* --help was given: print usage, nothing else is checked */
  bool version; /* --version was given */
} bee_config;

/* Whether the model is a trainer process's (--model external). */
static inline bool bee_external(const bee_config *cfg) {
  return strcmp(cfg->model, "external") == 0;
}

/* Formats an error line into err (errlen bytes; NULL or 0: none) and
 * returns code: how config.c and ckpt.c report what went wrong. */
int bee_failf(char *err, size_t errlen, int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

/* Fills cfg with the defaults. */
void bee_config_init(bee_config *cfg);

/* The learning rate, the inner steps and the outer step that apply: the
 * flags', or the defaults of the optimizer and averaging chosen. */
double bee_config_lr(const bee_config *cfg);
unsigned bee_config_inner_steps(const bee_config *cfg);
double bee_config_outer_lr(const bee_config *cfg);
double bee_config_outer_momentum(const bee_config *cfg);
/* "sgd", "adamw", "lamb"; "gradients", "diloco". */
const char *bee_optimizer_name(int optimizer);
const char *bee_averaging_name(int averaging);
const char *bee_schedule_name(int schedule);

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
  char sees_us[PROTO_IP_MAX]; /* the IP it sees us at (its hello), or "" */
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
  char seen_at[PROTO_IP_MAX]; /* bee_members_seen_at's last answer */
} bee_members;

void bee_members_init(bee_members *m, const uint8_t self_id[PROTO_ID_BYTES]);
/* The IP address this node's peers reach it at, by their swarm.hello:
 * the one most of them name, where two name it (or the only peer that
 * names one); one that is not loopback before loopback ones (a peer on
 * this host sees 127.0.0.1).  False, with out "", when none is. */
bool bee_members_seen_at(const bee_members *m, char out[PROTO_IP_MAX]);
/* Why ip, the address a peer says it sees this node at over a connection
 * from IP from ("" when unknown), cannot be one: unspecified, multicast,
 * broadcast, an IPv4 address in IPv6 form, or loopback on a connection
 * from another host (or the reverse).  NULL when it can be. */
const char *bee_seen_absurd(const char *from, const char *ip);
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
/* A list read from the --revocations file again (the moderator added a
 * key): when its seq is higher than the one held it replaces it (rl is
 * moved into the held list and left empty), the connected peers it
 * revokes are disconnected, and it is published in the DHT (at once once
 * started, else at start).  Returns whether it was taken; rl is left as it
 * was otherwise. */
bool bee_revoke_offer(bee_revoke *r, proto_revocation *rl);
/* Stops polling; closes the timer. */
void bee_revoke_stop(bee_revoke *r);

/* ------------------------------------------------------------------------ */
/* A run's progress (progress.c): pure functions, no I/O.                   */

#ifndef BEE_PROGRESS_MIN_MS
#define BEE_PROGRESS_MIN_MS 500 /* publish no more often while it changes */
#endif
#ifndef BEE_PROGRESS_MAX_MS
#define BEE_PROGRESS_MAX_MS 10000 /* and at least this often */
#endif
#ifndef BEE_PROGRESS_TTL_S
#define BEE_PROGRESS_TTL_S 30 /* a record's lifetime from its publication */
#endif
#ifndef BEE_LEAVE_GRACE_MS
#define BEE_LEAVE_GRACE_MS 10000 /* a peer that left may restart so soon */
#endif
#ifndef BEE_RATE_TAU_S
#define BEE_RATE_TAU_S 10.0 /* the rate's memory, seconds of computing */
#endif

/* Samples per second of computing: an exponential average whose weights
 * decay with computing time (tau BEE_RATE_TAU_S), so pauses to average
 * or wait never lower it.  Zero-initialise. */
typedef struct bee_rate {
  double ema;     /* not yet corrected for its start at 0 */
  double seconds; /* computing time seen */
} bee_rate;
/* Adds samples computed in compute_s seconds (ignored unless > 0). */
void bee_rate_add(bee_rate *r, uint64_t samples, double compute_s);
/* The rate, 0 before any sample. */
double bee_rate_get(const bee_rate *r);

/* When to publish the progress record again.  Zero-initialise. */
typedef struct bee_publisher {
  bool published;
  uint64_t last_ms;  /* monotonic ms of the last publication */
  uint64_t last_exp; /* its expiration, unix seconds */
  uint64_t epoch, samples;
} bee_publisher;
/* True when a record should go out now (now_ms monotonic, wall_s the
 * wall clock): none yet; BEE_PROGRESS_MAX_MS since the last; or
 * BEE_PROGRESS_MIN_MS since the last and the epoch or samples changed; or
 * the monotonic clock went back.  Never when the next expiration (later
 * than the last: the DHT keeps the later) would have to run more than a
 * second ahead of wall_s + BEE_PROGRESS_TTL_S. */
bool bee_progress_due(const bee_publisher *p, uint64_t now_ms,
                      uint64_t wall_s, uint64_t epoch, uint64_t samples);
/* Notes a publication of (epoch, samples); returns the expiration the
 * record must carry. */
uint64_t bee_progress_published(bee_publisher *p, uint64_t now_ms,
                                uint64_t wall_s, uint64_t epoch,
                                uint64_t samples);

/* The peers of run among v[0..n) expected in the group of the step that
 * ends epoch: those at epoch, and those at epoch - 1 (they see the swarm
 * past them and step at once); one whose last record says it left only
 * for BEE_LEAVE_GRACE_MS after it (now_ms, unix ms).  The caller's own
 * record counts. */
size_t bee_round_candidates(const proto_progress *v, size_t n,
                            const char *run, uint64_t epoch,
                            uint64_t now_ms);
/* Whether v is one of them. */
bool bee_round_candidate(const proto_progress *v, const char *run,
                         uint64_t epoch, uint64_t now_ms);
/* --group-size: Moshpit's grid.  The n bees of a run, ranked by id, sit
 * in a grid of the fewest dimensions whose lines hold cap bees at most,
 * the dimensions about as long as each other (64 bees in groups of 8:
 * 8 x 8; 100 bees: 5 x 5 x 4).  Turn t groups the bees whose coordinates
 * agree in every dimension but t mod dims: after dims turns of averaging
 * every bee of a full grid holds the mean of all, and of one with holes
 * (n short of the grid's product) nearly. */
typedef struct bee_grid_group {
  size_t dims;    /* the grid's */
  size_t dim;     /* the turn's */
  uint64_t index; /* the group's among the turn's (its first rank) */
  size_t size;    /* its members, the caller too; 1: alone this turn */
  char bits[PROTO_BITS_MAX + 1]; /* the index as matchmaking group bits */
} bee_grid_group;
/* The group of the bee of rank `rank` (0..n-1) in turn `turn` of a grid
 * of n bees in groups of cap (2 or more), and when ranks is not NULL its
 * members' ranks, g->size of them, ascending (ranks has cap slots).
 * -EINVAL for a rank past n, a cap below 2, or n past what the group
 * bits can name (65536); -ENOMEM. */
int bee_grid_group_of(size_t n, size_t rank, size_t cap, uint64_t turn,
                      bee_grid_group *g, size_t *ranks);

/* Whether nobody among v[0..n) (the others' records, not the caller's)
 * may still come to the group of the step that ends epoch: no peer of run
 * that bee_round_candidates expects there, nor, with delayed
 * (--delay-averaging: a peer averages an epoch while it computes the
 * next), one at epoch + 1.  A matchmaking for such an epoch waits for
 * nobody: the swarm has left it. */
bool bee_round_deserted(const proto_progress *v, size_t n, const char *run,
                        uint64_t epoch, bool delayed, uint64_t now_ms);
/* After a round: the members of the group that averaged epoch - 1 step
 * to epoch right away, but their records say epoch - 1 for a second or
 * two more (a record goes out at most every BEE_PROGRESS_MIN_MS and is
 * read once a second), and a view that took them as they read would have
 * each bee gather the next target alone.  Rewrites v[i] (whose owner is
 * ids[i]) for every member among members[0..nmembers) (sorted by id,
 * memcmp's order: a group of hundreds is looked up, not scanned) whose
 * record of run
 * is behind epoch, not a leaving one, and older than the step (time_ms,
 * unix ms, this bee's clock) as the record it will write: at epoch, no
 * samples yet, at time_ms, at its rate.  Only within BEE_STEPPED_MS of the
 * step (now_ms): a member whose own record at epoch has not come by then
 * is not counted there on our word.  Returns how many it rewrote. */
#define BEE_STEPPED_MS 4000
size_t bee_progress_stepped(proto_progress *v,
                            const uint8_t (*ids)[PROTO_ID_BYTES], size_t n,
                            const char *run, uint64_t epoch,
                            uint64_t time_ms,
                            const uint8_t (*members)[PROTO_ID_BYTES],
                            size_t nmembers, uint64_t now_ms);
/* DiLoCo: seconds from now_ms until every other peer of run at epoch
 * (records v[0..n), not leaving, with a known rate) has taken its inner
 * steps, want samples each: each one's samples grow at its rate from its
 * record's time (for at most PROTO_PROGRESS_EXTRAP_S).  0 when they all
 * have; -1 when no such peer is there.  *first (NULL: not wanted) gets
 * the same for the
 * first of them to be done (-1 likewise): the round's group forms by
 * then, its leader the first to declare.  A bee that has much more to go
 * than that (one that loaded the state late in the round, or a slow one)
 * joins the group ahead of the first and takes its round with the steps
 * it has once the last is done, instead of stepping alone after them
 * (train.c). */
double bee_outer_due(const proto_progress *v, size_t n, const char *run,
                     uint64_t epoch, uint64_t want, uint64_t now_ms,
                     double *first);
/* DiLoCo: seconds from now_ms until the round at epoch comes, by the
 * others' records (v[0..n), counted as bee_outer_due counts them) and our
 * own inner steps' end (own_left seconds from now; < 0: not known): the
 * last of all those ends, unless it is more than lag_s after the one
 * before it, whose end it then is, as that last bee takes the round with
 * the steps it has (train.c's outer_lags).  -1 when no end is known.  A
 * group formed ahead declares this start, so that it waits for the bees
 * that will come (run-round.c). */
double bee_outer_round(const proto_progress *v, size_t n, const char *run,
                       uint64_t epoch, uint64_t want, uint64_t now_ms,
                       double own_left, double lag_s);
/* A line of parameters: their hash after a bee's step at epoch, averaged
 * in a group of group members. */
typedef struct bee_line {
  uint64_t epoch;
  uint64_t group;
  uint8_t hash[PROTO_PARAMS_HASH_BYTES];
} bee_line;

/* The split check.  ours[0..nours): this bee's lines of late (steps it
 * averaged in a group); seen[0..nseen): the other peers' last ones and
 * the earlier ones their metrics carry (of the run, in groups of 2 or
 * more, not out of line; at most one per peer and step).  The swarm split at
 * the latest of our epochs where some peer's hash differs from ours; of
 * the lines there, the one that goes on has the larger group, then more
 * holders (the peers seen with that hash at that epoch, this bee for its
 * own: within one group, whose members came in with different
 * parameters, the majority), then the lower hash.  Returns the line of
 * ours that lost, with *winner the one that goes on; NULL when there is
 * no split or ours goes on. */
const bee_line *bee_split_loser(const bee_line *ours, size_t nours,
                                const bee_line *seen, size_t nseen,
                                bee_line *winner);
/* Whether a bee at epoch with samples gathered takes the epoch step, by
 * the last view v and the samples others had gathered at v's epoch then
 * (v->samples less its own share): when the swarm's epoch is past its
 * own, or when its samples and the others' (at its epoch) reach target. */
bool bee_epoch_ready(uint64_t epoch, uint64_t samples,
                     const proto_swarm_view *v, uint64_t others,
                     uint64_t target);

/* ------------------------------------------------------------------------ */
/* State uploads a donor is serving (uploads.c).                             */

/* A download is a run of "state.get" requests from one peer; it is over
 * when the peer has its last chunk, or has asked nothing for
 * BEE_UPLOAD_IDLE_MS (it gave up, or died). */
#define BEE_UPLOAD_IDLE_MS 15000 /* beyond an asker's chunk timeout */

typedef struct bee_upload {
  uint8_t id[PROTO_ID_BYTES];
  uint64_t start_ms, last_ms; /* the loop's clock */
  uint64_t bytes;             /* sent so far */
  void *pin; /* the caller's: what the download is served from */
  /* Its asker began with the header alone: it asks for several chunks
   * at once (and of several donors), so the last chunk's request does
   * not end it; its request at the state's end does. */
  bool until_release;
} bee_upload;

typedef struct bee_uploads {
  bee_upload u[BEE_STATE_UPLOADS_MAX];
  size_t n;
} bee_uploads;

/* A chunk request from peer id at now_ms, with at most max downloads at
 * once.  Returns the peer's upload (*fresh set when it starts one now,
 * with pin NULL), or NULL when max others are running: the peer is told
 * it is busy.  An upload that lapses here is passed to unpin(pin, arg)
 * first when its pin is set (unpin may be NULL). */
bee_upload *bee_uploads_admit(bee_uploads *u, const uint8_t id[PROTO_ID_BYTES],
                              uint64_t now_ms, unsigned max, bool *fresh,
                              void (*unpin)(void *pin, void *arg), void *arg);
/* Downloads running at now_ms: those whose peer asked within
 * BEE_UPLOAD_IDLE_MS (lapsed ones go at the next admit). */
size_t bee_uploads_active(const bee_uploads *u, uint64_t now_ms);
/* The upload of up is over (its peer has the last chunk); the caller has
 * released its pin. */
void bee_uploads_end(bee_uploads *u, bee_upload *up);

/* ------------------------------------------------------------------------ */
/* The links to the peers, as measured (links.c): no I/O.                    */

/* A bee keeps, for each peer it is connected to, the least round trip its
 * connections saw and the rates data from that peer reached it at, as its
 * connections measured them (proto_conn_take_rx_mbit: the rate of the
 * slowest link on the path, from the spacing of TCP's flights) while
 * rounds, downloads and probes ran.  The link's figure is the best of the
 * last BEE_LINK_RATES: a loop busy elsewhere or a stream sharing the link
 * says less than the link carries, never more; a link that got slower
 * shows within that many.  The table is what the bee publishes as its
 * links record. */
#define BEE_LINKS_MAX PROTO_LINKS_MAX /* peers kept: the least recent goes */
#define BEE_LINK_RATES 32
#define BEE_LINK_PROBE_MS 600000  /* a peer with no rate: probed this often */
#define BEE_LINK_STALE_MS 3600000 /* not measured since: not published */

typedef struct bee_link {
  uint8_t id[PROTO_ID_BYTES];
  bool used;
  uint64_t rtt_us;              /* 0: none */
  double rates[BEE_LINK_RATES]; /* Mbit/s, a ring */
  size_t nrates, next;
  uint64_t measured_ms;     /* the last figure (the caller's clock) */
  uint64_t rtt_ms, rate_ms; /* the last round trip's, the last rate's */
  uint64_t probed_ms;       /* the last probe begun; 0: never */
} bee_link;

typedef struct bee_links {
  bee_link v[BEE_LINKS_MAX];
} bee_links;

/* The entry of peer id, made (in a free slot, or over the least recently
 * measured) when missing. */
bee_link *bee_links_get(bee_links *L, const uint8_t id[PROTO_ID_BYTES]);
/* A round trip to id, microseconds (0: ignored).  Several at one now_ms
 * (the peer's connections, at one tick) count as their least. */
void bee_links_rtt(bee_links *L, const uint8_t id[PROTO_ID_BYTES],
                   uint64_t rtt_us, uint64_t now_ms);
/* A rate of the link from id, Mbit/s (not > 0 or not finite: ignored).
 * Several at one now_ms count as one, their largest. */
void bee_links_rate(bee_links *L, const uint8_t id[PROTO_ID_BYTES], double mbit,
                    uint64_t now_ms);
/* The link's figure from id, Mbit/s; 0: none. */
double bee_links_mbit(const bee_links *L, const uint8_t id[PROTO_ID_BYTES]);
/* Whether to probe id now: no rate yet and no probe within
 * BEE_LINK_PROBE_MS; marks it probed when so. */
bool bee_links_probe_due(bee_links *L, const uint8_t id[PROTO_ID_BYTES],
                         uint64_t now_ms);
/* The links record's entries: the links measured within
 * BEE_LINK_STALE_MS, the most recently measured first, at most cap
 * (<= PROTO_LINKS_MAX).  Returns how many. */
size_t bee_links_list(const bee_links *L, uint64_t now_ms, proto_link *out,
                      size_t cap);

/* ------------------------------------------------------------------------ */
/* A trainer process's session (local.c): --model external.                  */

/* The trainer's tensors live in memory it shares with beed (a memfd that
 * came with its HELLO, sealed against shrinking), float32, in regions:
 * the parameters, their gradients (the same layout), the optimizer's
 * state, the buffers; each the tensors of its role in HELLO's order.
 * Whoever waits for the other's message leaves the memory alone: the
 * trainer between sending a BATCH (or STEPPED) and its answer, beed
 * (the worker) between answering and the next. */
typedef struct bee_local {
  int fd;   /* the connection, blocking: the worker's once it trains */
  long pid; /* the trainer's, and its user's (SO_PEERCRED) */
  unsigned uid;
  uint8_t *mem; /* the mapping */
  size_t mem_len;
  float *params, *grads, *state, *buffers;
  size_t nparams, nstate, nbuffers, ntensors;
  int mode;           /* PROTO_LOCAL_GRADIENTS or _DILOCO */
  uint64_t batch;     /* samples a BATCH counts, as the trainer said */
  uint8_t schema[32]; /* BLAKE2b-256 of the tensors' names, roles, shapes */
  char desc[48];      /* "external:" and the schema's first bytes in hex */
  uint8_t *rbuf;      /* its messages, as they come */
  size_t rcap;
  uint8_t *hello; /* its HELLO's body, as it came (the model's tensors) */
  size_t hello_len;
  bool owe;      /* a message of the trainer waits for beed's answer */
  bool welcomed; /* the answer to HELLO went */
  bool loaded;   /* a state went into the memory since the last answer */
  /* The trainer's last EVAL, for the worker to pass on. */
  bool evaluated;
  uint64_t eval_epoch;
  double eval_loss, eval_acc;
} bee_local;

typedef struct bee_local_server bee_local_server;

/* Listens on cfg->trainer_socket (mode 0600; a socket file no daemon
 * answers on is replaced) for trainer processes, one at a time: each
 * HELLO is read and checked off the loop (a trainer that sends none in
 * BEE_LOCAL_HELLO_MS is dropped), and a good one, with its memory
 * mapped, goes to on_session(l, arg) on the loop, which owns it from
 * then on.  A trainer that comes while a session is on is refused.
 * Errors are logged; returns 0 or an error. */
#define BEE_LOCAL_HELLO_MS 10000
int bee_local_listen(uv_loop_t *loop, const bee_config *cfg,
                     void (*on_session)(bee_local *l, void *arg), void *arg,
                     bee_local_server **out);
/* Closes the socket and removes its file; NULL is ignored. */
void bee_local_close(bee_local_server *s);
/* The session handed out is over: the next trainer may come. */
void bee_local_idle(bee_local_server *s);

/* The worker's side of a session; each call blocks, polling stopped(arg)
 * every BEE_LOCAL_POLL_MS, and returns 1 when it says stop, 0 when done,
 * or an error: the trainer left (BEE_ECLOSED), sent what it may not
 * (BEE_EMALFORMED, -EPROTO), logged with the reason. */
#define BEE_LOCAL_POLL_MS 100
/* Answers the trainer's last message, if it waits for one, from what w
 * says of the run (epoch, target, peers, samples, mode and DiLoCo's
 * settings): WELCOME the first time (and whether a state was loaded),
 * then LOADED when a state was loaded since, else GO. */
int bee_local_answer(bee_local *l, const proto_local_msg *w);
/* Waits for the trainer's next BATCH (EVALs on the way are kept in l):
 * its samples and mean loss. */
int bee_local_batch(bee_local *l, bool (*stopped)(void *arg), void *arg,
                    uint64_t *samples, double *loss);
/* The step of epoch: STEP (apply: the trainer's optimizer steps with the
 * mean gradients in the memory; else beed stepped the parameters), then
 * its STEPPED, which waits for an answer in turn. */
int bee_local_step(bee_local *l, uint64_t epoch, bool apply,
                   bool (*stopped)(void *arg), void *arg);
/* Refuses the session (the loop's, before training took it): REFUSED
 * with code and text to the trainer, and a line in the log. */
void bee_local_refuse(bee_local *l, int code, const char *text);
/* Unmaps the memory and closes the connection, keeping l's counts;
 * then frees l too.  NULL is ignored. */
void bee_local_release(bee_local *l);
void bee_local_free(bee_local *l);

/* ------------------------------------------------------------------------ */
/* The bee's training and its progress in the DHT (train.c).                 */

typedef struct bee_train bee_train;

/* Loads the data and builds the model and optimizer that cfg names (cfg
 * and id are borrowed and must outlive t).  Errors are logged with the
 * file or setting at fault.  *out is set even on failure, for
 * bee_train_free.  Returns 0 or a negative error. */
int bee_train_new(uv_loop_t *loop, const bee_config *cfg,
                  const proto_identity *id, bee_train **out);
/* The same for --model external: the model is the trainer's of session
 * l, which t owns from now on (freed with it, even on failure).  state
 * (len bytes, of epoch; NULL: none) is what bee_train_last_state gave
 * of the session before, taken over: the trainer goes on from it when
 * its model is the same. */
int bee_train_new_local(uv_loop_t *loop, const bee_config *cfg,
                        const proto_identity *id, bee_local *l, uint8_t *state,
                        size_t len, uint64_t epoch, bee_train **out);
/* A copy of the latest state (a snapshot: its len and epoch), or NULL:
 * for the session after this one.  Loop thread, the threads stopped. */
uint8_t *bee_train_last_state(bee_train *t, size_t *len, uint64_t *epoch);
/* After bee_train_stop: lets go of what the stopped training holds that
 * is large (the trainer's memory, snapshots, steps), keeping what a DHT
 * answer still under way may reach, until bee_train_free. */
void bee_train_shed(bee_train *t);
/* Starts the averager on host (its "avg.m" and "avg.r" methods), the
 * worker and evaluator threads and the progress timer; publishes under
 * dht's node; port is the one we listen on (0: none).  on_fatal(arg) runs
 * on the loop if training fails. */
int bee_train_start(bee_train *t, proto_host *host, unsigned port,
                    struct dht_node *dht, void (*on_fatal)(void *arg),
                    void *arg);
/* The peers the node is connected to (borrowed; before bee_train_start):
 * the address they see it at is the one its records give, where no
 * --announce is. */
void bee_train_set_members(bee_train *t, const bee_members *members);
/* The address this bee's matchmaking declarations and donor record give
 * peers to dial: the first --announce; else the IP its peers see it at
 * (bee_members_seen_at) with its listen port; else a specific --listen
 * address; else loopback (a swarm on one host).  Returns where it came
 * from, in words. */
const char *bee_train_self_addr(const bee_train *t, char out[PROTO_ADDR_MAX]);
/* The host's on_drain and on_down, for the averager's round. */
/* The node joined the DHT through a --join target, or found that every
 * target is itself.  Until then a bee with --join targets does not start
 * training alone (it would start a run of its own, apart from the
 * swarm's); it waits, with a line every 10 s.  NULL is ignored. */
void bee_train_joined(bee_train *t);
/* Called before bee_train_start: this bee has no --join targets but
 * known peers (--peers-file) to join through, so it waits for
 * bee_train_joined too before it may start a run of its own. */
void bee_train_expect_join(bee_train *t);
void bee_train_drain(bee_train *t, proto_conn *c);
void bee_train_conn_down(bee_train *t, proto_conn *c);
/* Leaves the run: stops the threads (the last state goes to disk), then
 * publishes a last progress record that says the bee is leaving, so the
 * others stop counting it at once; done(arg) runs once it is stored, or
 * after 2 s, or at once when there is nothing to publish. */
void bee_train_leave(bee_train *t, void (*done)(void *arg), void *arg);
/* Stops the worker (waits for the batch in hand) and closes the handles.
 * Call before closing the DHT. */
void bee_train_stop(bee_train *t);
/* Frees t once the loop has ended.  Accepts NULL. */
void bee_train_free(bee_train *t);

/* ------------------------------------------------------------------------ */
/* Known peers (peers.c): the DHT contacts' addresses in --peers-file, so  */
/* that a restarted bee finds its swarm when its --join targets are gone.  */

#ifndef BEE_KNOWN_MAX
#define BEE_KNOWN_MAX 32 /* addresses kept and read back */
#endif

typedef struct bee_known {
  char addr[BEE_KNOWN_MAX][BEE_ADDR_MAX];
  size_t n;
} bee_known;

/* Adds addr (1 to BEE_ADDR_MAX - 1 bytes) unless it is there already or
 * the list is full; returns whether it did. */
bool bee_known_add(bee_known *k, const char *addr);
bool bee_known_has(const bee_known *k, const char *addr);
/* Whether a and b hold the same addresses, in any order. */
bool bee_known_same(const bee_known *a, const bee_known *b);
/* Checks, at start-up, that path is not a directory or some other thing
 * than a file, and that its directory exists and may be written in.
 * Returns 0, or an error with err naming the file and why. */
int bee_known_prepare(const char *path, char *err, size_t errlen);
/* Reads the file at path into k: one HOST:PORT per line, '#' comments and
 * blank lines skipped, duplicates and entries past BEE_KNOWN_MAX ignored.
 * Lines that are not addresses are skipped and counted in *bad, the first
 * one's number in *bad_line.  Returns 0; -ENOENT when there is no file (a
 * first start); or another error with err naming the file. */
int bee_known_load(bee_known *k, const char *path, size_t *bad,
                   size_t *bad_line, char *err, size_t errlen);
/* Replaces the file at path with k's addresses (mode 0600; a reader sees
 * the old file or the new one).  Returns 0 or an error with err set. */
int bee_known_save(const bee_known *k, const char *path, char *err,
                   size_t errlen);

/* ------------------------------------------------------------------------ */
/* Checkpoint files (ckpt.c): a state snapshot behind a header (magic,     */
/* version, run, epoch, length, BLAKE2b-256), written atomically.           */

/* 0 when dir is a directory this process may write in, else -errno
 * (-ENOTDIR for another kind of file). */
int bee_dir_check(const char *dir);
/* The directory part of path into out (cap bytes): "." for a bare name,
 * "/" for a name at the root. */
void bee_dir_of(const char *path, char *out, size_t cap);
/* Makes dir (and its missing parents, mode 0700) unless it is there, and
 * checks that it is a directory this process may write in.  Returns 0, or
 * -errno with err naming the directory and why. */
int bee_ckpt_prepare(const char *dir, char *err, size_t errlen);
/* Writes payload (len bytes) as run's checkpoint of epoch in dir, then
 * removes all but the newest keep of run's; the file's path goes to path.
 * Returns 0, or -errno / BEE_ERANGE / BEE_ETOOBIG with err set. */
int bee_ckpt_write(const char *dir, const char *run, uint64_t epoch,
                   const uint8_t *payload, size_t len, unsigned keep,
                   char *path, size_t pathcap, char *err, size_t errlen);
/* Reads the checkpoint at path, which must be run's and hold min_len or
 * max_len bytes of state (the payload's two layouts this model takes; the
 * same twice for one): 0 and *payload (heap, the caller frees), *len and
 * *epoch; or -errno, -EBADMSG (not a checkpoint, another version,
 * damaged, short), -EINVAL (another run or model), with err naming the
 * file and why. */
int bee_ckpt_read(const char *path, const char *run, size_t min_len,
                  size_t max_len, uint8_t **payload, size_t *len,
                  uint64_t *epoch, char *err, size_t errlen);
/* The newest valid checkpoint of run in dir (the ones refused on the way
 * are logged); -ENOENT when there is none. */
int bee_ckpt_newest(const char *dir, const char *run, size_t min_len,
                    size_t max_len, uint8_t **payload, size_t *len,
                    uint64_t *epoch, char *path, size_t pathcap, char *err,
                    size_t errlen);

/* ------------------------------------------------------------------------ */
/* The systemd notify protocol (notify.c).                                  */

/* Sends one datagram of "KEY=VALUE" lines (printf-style) to
 * $NOTIFY_SOCKET; 0 and nothing sent when it is unset, -errno on
 * failure. */
int bee_notify(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;
/* How often to send WATCHDOG=1: half of $WATCHDOG_USEC in ms, or 0 when
 * the unit has no watchdog for this process (or no notify socket). */
uint64_t bee_notify_watchdog_ms(void);

/* A one-line summary of the training for STATUS= (loop thread). */
void bee_train_status(const bee_train *t, char *buf, size_t cap);

/* ------------------------------------------------------------------------ */
/* The local control socket (control.c).                                    */

typedef struct bee_control {
  uv_loop_t *loop;
  uv_pipe_t pipe;
  bool open, bound;
  char path[BEE_PATH_MAX];
  /* Writes "key value" lines into buf (cap bytes); returns their length. */
  size_t (*status)(void *arg, char *buf, size_t cap);
  void (*leave)(void *arg); /* stop as on SIGTERM */
  void *arg;
} bee_control;

/* Makes path ready for a unix socket of ours to be bound there: a path
 * too long, a file that is no socket, or a socket a live daemon answers
 * on are refused (logged under comp); a socket file left by a daemon
 * that died is removed.  Returns 0 or an error. */
int bee_unix_path_claim(const char *comp, const char *path);
/* Listens on the unix socket path (mode 0600), replacing a socket file no
 * daemon answers on.  Errors are logged; returns 0 or an error. */
int bee_control_start(bee_control *c, uv_loop_t *loop, const char *path,
                      size_t (*status)(void *arg, char *buf, size_t cap),
                      void (*leave)(void *arg), void *arg);
/* Closes the socket and removes its file. */
void bee_control_stop(bee_control *c);

/* "key value" lines on the training for `beectl status` (loop thread);
 * returns their length. */
size_t bee_train_report(const bee_train *t, char *buf, size_t cap);

/* First 8 hex digits of a peer id (out: 9 bytes). */
void bee_id8(const uint8_t id[PROTO_ID_BYTES], char out[9]);

#endif /* BEE_DAEMON_BEE_H */
