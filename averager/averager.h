/* averager.h: beed's averager, the group all-reduce of gradients and
 * parameters.
 *
 * A group of peers averages one flat fp32 buffer with a butterfly
 * all-reduce: the buffer is cut into contiguous spans, one per member that
 * reduces; every member sends its piece of each span to the span's owner,
 * the owner takes the weighted mean in fp32 and sends the result back.
 * Pieces travel in parts, each part encoded with one of the codecs below.
 *
 * Two layers, neither with sockets, clock or threads of its own: the
 * arithmetic core (the part codecs with their exact byte layouts in
 * docs/AVERAGING.md, the checks and the weighted mean an owner runs, the
 * clip rule against outliers, the bandwidth-aware split into spans) and
 * the protocol cores: the round (avg_round), which runs one all-reduce
 * among a group, and the matchmaking (avg_match), which forms the group
 * through the DHT; avg_node ties them to a loop and the network.
 * See averager/README.md.
 *
 * Everything here is deterministic: the same inputs give the same bits on
 * every peer, whatever the CPU or compiler, because the library uses only
 * IEEE-754 binary32/binary64 +, -, *, / in a fixed order, is built with
 * -ffp-contract=off (no fused multiply-add) and without -ffast-math.
 */
#ifndef BEE_AVERAGER_H
#define BEE_AVERAGER_H

#include "proto.h"

#include <limits.h>

/* ------------------------------------------------------------------------ */
/* Codecs.  A part of n floats becomes avg_encoded_size(c, n) bytes.        */

/* The codec numbers are wire values: they will name a part's encoding in
 * the round messages, so they never change. */
typedef enum avg_codec {
  AVG_NONE = 0, /* fp32, lossless */
  AVG_FP16 = 1, /* IEEE binary16, round to nearest even */
  AVG_BF16 = 2, /* bfloat16 (the top half of binary32), nearest even */
  AVG_U8 = 3,   /* uniform 8-bit over the part: fp32 min and scale, u8 */
  AVG_B8 = 4,   /* per block of AVG_B8_BLOCK: fp32 absmax/127, int8 */
  AVG_CODEC_COUNT
} avg_codec;

/* Values per AVG_B8 block.  Part of the wire format, so not overridable. */
#define AVG_B8_BLOCK 4096

/* Returns the codec's name ("none", "fp16", "bf16", "u8", "b8"), or "?" for
 * a value outside the enum. */
const char *avg_codec_name(avg_codec c);
/* Parses a codec name as avg_codec_name writes it.  Returns 0 or
 * BEE_ECONFIG. */
int avg_codec_parse(const char *s, avg_codec *c);

/* Returns the exact encoded size in bytes of n floats under c, headers
 * included, or SIZE_MAX when c is not a codec or the size does not fit in
 * a size_t.  n = 0 encodes to 0 bytes, except AVG_U8 which always carries
 * its 8-byte header. */
size_t avg_encoded_size(avg_codec c, size_t n);

/* Encodes the n floats x (host order) into out (cap bytes) and sets *len to
 * avg_encoded_size(c, n).  Every x must be finite.  Returns 0, BEE_ERANGE
 * when c is not a codec, when an x is NaN or infinite, when a value
 * overflows the target format (|x| >= 65520 for fp16, >= 2^128 (1 - 2^-9)
 * for bf16) or when max - min of the part overflows fp32 (u8), and
 * BEE_ETOOBIG when cap is too small.  On error *len is untouched and out
 * holds garbage. */
int avg_encode(avg_codec c, const float *x, size_t n, uint8_t *out, size_t cap,
               size_t *len);

/* Encodes x + residual (n floats each) as avg_encode would, then stores the
 * error of that encoding, x + residual - decoded, back into residual: the
 * error feedback of the lossy codecs, which carries what one round lost
 * into the next.  residual starts as zeros and belongs to the caller; with
 * AVG_NONE it stays zero.  Errors as avg_encode; on error residual is
 * untouched. */
int avg_encode_ef(avg_codec c, const float *x, size_t n, float *residual,
                  uint8_t *out, size_t cap, size_t *len);

/* Decodes the part in (len bytes from a peer) holding n floats into out.
 * Strict: len must be exactly avg_encoded_size(c, n) (BEE_ETRUNCATED if
 * shorter, BEE_ETRAILING if longer); a NaN or infinite value or scale, or
 * a header whose largest value is not finite in fp32, is BEE_ERANGE; a
 * negative scale or the int8 -128 (never written by the encoder) is
 * BEE_EMALFORMED; c outside the enum is BEE_ERANGE.  Every decoded value
 * is finite.  On error out holds garbage. */
int avg_decode(avg_codec c, const uint8_t *in, size_t len, size_t n,
               float *out);

/* The owner's hot path: checks the part as avg_decode does, then adds
 * weight * decoded into acc (n floats), one fp32 multiply and one fp32 add
 * per value, with no temporary buffer.  weight must be finite and >= 0
 * (BEE_ERANGE).  On any error acc is untouched: the whole part is checked
 * before the first value is added. */
int avg_decode_add(avg_codec c, const uint8_t *in, size_t len, size_t n,
                   float weight, float *acc);

/* ------------------------------------------------------------------------ */
/* Reduction: the checks and the weighted mean an owner runs on its span.   */

/* Checks that the n floats x are all finite and sets *sq_norm to the sum of
 * their squares, accumulated in double in a fixed order (so it is the same
 * on every peer).  Returns 0 or BEE_ERANGE when some x is NaN or infinite;
 * *sq_norm is set either way (non-finite on error). */
int avg_check(const float *x, size_t n, double *sq_norm);

/* A weighted mean under construction, embedded by the caller.  sum is the
 * caller's buffer of n floats; weight is the total weight added so far,
 * summed in double; count the contributions added (weight 0 included).
 * Contributions must be added in the group's member order, whatever the
 * order they arrived in: fp32 addition is not associative, and only a
 * fixed order makes the result the same bits on every peer. */
typedef struct avg_acc {
  float *sum; /* (n) borrowed: weighted sum, then the mean */
  size_t n;
  double weight;
  size_t count;
} avg_acc;

/* Starts a mean over n floats in buf (the caller's, zeroed here). */
void avg_acc_init(avg_acc *a, float *buf, size_t n);
/* Adds weight * x (n floats in host order, e.g. our own contribution).
 * Returns 0, or BEE_ERANGE when weight is negative or not finite or some x
 * is not finite; on error nothing is added. */
int avg_acc_add(avg_acc *a, const float *x, float weight);
/* Adds a part encoded with c (len bytes from a peer), as avg_decode_add.
 * Errors as avg_decode_add; on error nothing is added and the caller drops
 * the sender's contribution and logs it. */
int avg_acc_add_encoded(avg_acc *a, avg_codec c, const uint8_t *in, size_t len,
                        float weight);
/* Turns the sum into the mean in place: sum[i] / (float)weight.  When the
 * total weight is 0 (every member that sent had weight 0, or none sent)
 * there is nothing to average, and the local values (n floats, required)
 * are copied into sum instead, so the caller keeps what it had.  Returns 0,
 * or BEE_ERANGE when some mean is not finite (the weighted sum overflowed
 * fp32); sum then holds the local values too. */
int avg_acc_finish(avg_acc *a, const float *local);

/* ------------------------------------------------------------------------ */
/* Clipping: a contribution whose norm is far beyond the group's.           */

typedef enum avg_clip_mode {
  AVG_CLIP_OFF = 0, /* take every finite contribution as it is */
  AVG_CLIP_SCALE,   /* scale it down to clip x median */
  AVG_CLIP_DROP,    /* drop it */
} avg_clip_mode;

/* Returns the median of the n values v (sorted in place), the mean of the
 * two middle ones for even n, 0 for n = 0.  NaNs sort last. */
double avg_median(double *v, size_t n);

/* Returns the factor to multiply a contribution of L2 norm `norm` by, given
 * the median norm of the group's contributions and the limit `clip`
 * (e.g. 10): 1 when norm <= clip x median; beyond it clip x median / norm
 * under AVG_CLIP_SCALE and 0 (drop) under AVG_CLIP_DROP.  A norm that is
 * NaN, infinite or negative always gets 0.  With AVG_CLIP_OFF, or clip NaN
 * or <= 0, or a median that is NaN or negative, every finite norm gets 1.
 * A median of 0 (at least half the group sent zeros) makes every nonzero
 * contribution "far beyond". */
double avg_clip_factor(double norm, double median_norm, double clip,
                       avg_clip_mode mode);

/* ------------------------------------------------------------------------ */
/* Spans: who owns which floats of the buffer.                              */

#ifndef AVG_GROUP_MAX
#define AVG_GROUP_MAX 1024 /* members of one group */
#endif

/* Splits total floats among nmembers members, in member order, into
 * contiguous spans start[i], len[i] (start[i] + len[i] = start[i + 1]).
 * Members with reduces[i] false (CLIENT mode) or bandwidth[i] == 0 own
 * nothing (len 0).  The others get the shares that minimize the round's
 * time when each member's link carries bandwidth[i] (any unit, the same up
 * and down) and every member sends and receives: the water-filling of
 * docs/AVERAGING.md section 3, rounded to whole multiples of align floats
 * by taking the cheapest units first.  Every span starts at a multiple of
 * align; the last owner's span also takes the total % align floats left
 * over (members after it get start = total and len 0).  Equal bandwidths give lengths that differ by at most align.
 * Every peer computes the same spans from the same inputs.
 * Returns 0; BEE_ERANGE when nmembers or align is 0, a bandwidth is
 * negative, NaN or infinite, or no member reduces; BEE_ETOOBIG when
 * nmembers > AVG_GROUP_MAX; -ENOMEM.  On error start and len are
 * untouched. */
int avg_spans(size_t total, size_t nmembers, const double *bandwidth,
              const bool *reduces, size_t align, size_t *start, size_t *len);

/* ------------------------------------------------------------------------ */
/* The round: one butterfly all-reduce among a group, as a protocol core.   */
/*
 * A group of N members, in an order every member agrees on, averages one
 * flat buffer of n floats.  avg_spans cuts it into one span per member
 * that reduces; each span into parts of part_floats floats (the last part
 * of a span shorter).  Every member with data sends its piece of each part
 * to the part's owner in a PART message, at most `window` parts ahead of
 * the results it has back from that owner; the owner waits until every
 * member has sent the part (or has been dropped), takes the weighted mean
 * in member order, adopts it and sends it back to every member with data
 * in a RESULT.  Spans are committed whole: a member writes a result into
 * its buffer only with a backup of what was there, and a span whose
 * results did not all arrive is put back as it was, so every span ends
 * either averaged or local.  docs/AVERAGING.md, section 7, and
 * averager/README.md have the protocol; docs/PROTOCOL.md, section 10, the
 * messages.
 *
 * Like dht_node, the round does no I/O: the clock and the sending come in
 * through avg_io, messages through avg_round_handle, time through
 * avg_round_tick.  The heavy arithmetic (encoding a part, reducing a part,
 * decoding a result) runs as jobs the caller may hand to worker threads.
 */

/* How a member takes part.  The values are those of PROTO_MODE_*. */
typedef enum avg_mode {
  AVG_MODE_NODE = 0,   /* sends its data and reduces a span */
  AVG_MODE_CLIENT = 1, /* sends its data, never reduces (behind NAT) */
  AVG_MODE_AUX = 2,    /* no data of its own (weight 0): reduces only */
} avg_mode;

#ifndef AVG_PART_FLOATS
#define AVG_PART_FLOATS 131072 /* default part: 512 KiB of fp32 */
#endif
#ifndef AVG_WINDOW_MAX
#define AVG_WINDOW_MAX 64 /* parts in flight to one owner, at most */
#endif
#ifndef AVG_SPAN_ALIGN
#define AVG_SPAN_ALIGN 1024 /* spans start at multiples of this, floats */
#endif
#ifndef AVG_MSG_OVERHEAD
/* Bytes the transport adds to each message, counted in the byte totals
 * (not sent by the round): a ONEWAY envelope in one sealed frame, 4 bytes
 * of frame length + 17 of envelope + 16 of AEAD tag, rounded up. */
#define AVG_MSG_OVERHEAD 40
#endif

typedef struct avg_round avg_round;
/* One piece of heavy arithmetic: encoding a part, reducing a part or
 * decoding a result.  Opaque; see avg_io.submit. */
typedef struct avg_job avg_job;

/* How the round reaches the world.  Every function is called on the
 * loop's thread, never re-entered, and must not call into the round. */
typedef struct avg_io {
  void *ctx;
  /* Monotonic milliseconds. */
  uint64_t (*now_ms)(void *ctx);
  /* Sends one message (len bytes, borrowed for the call) to member.
   * Returns 0 when the transport took it; BEE_EQUEUE when its queue to
   * that member is full: the round keeps this message and everything
   * after it for that member until avg_round_drain(member).  Any other
   * error drops the member from the round. */
  int (*send)(void *ctx, size_t member, const uint8_t *msg, size_t len);
  /* Optional: runs job elsewhere.  The callee calls avg_job_run(job) on
   * any thread, then avg_job_done(job) back on the loop's thread.  NULL:
   * the round runs its jobs itself, at once. */
  void (*submit)(void *ctx, avg_job *job);
  /* Optional: a member's name for log lines (a peer id, an address);
   * NULL or a NULL return: "member <index>". */
  const char *(*name)(void *ctx, size_t member);
} avg_io;

typedef struct avg_round_config {
  uint8_t group[PROTO_AVG_GROUP_BYTES]; /* the group's id, the same for all */
  size_t nmembers;                      /* N, 1..AVG_GROUP_MAX */
  size_t self;                          /* our index in the member order */
  const avg_mode *modes;       /* (N) copied; every member agrees on them */
  const double *bandwidth;     /* (N) copied, for avg_spans; NULL: equal */
  float *x;                    /* (n) in: our values; out: the result.
                                Borrowed until the callback.  NULL for AUX */
  size_t n;                    /* floats; the same for every member */
  float *residual;             /* (n) error feedback, the caller's, zeros at
                                first; NULL: none.  Borrowed as x */
  float *scratch;              /* (n) optional: room for the backups of
                                the spans being received, each at its own
                                offset; borrowed as x.  NULL: the round
                                allocates them as results arrive, fresh
                                pages every round */
  double weight;               /* our sample count, finite, 0..FLT_MAX;
                                ignored for AUX (0) */
  avg_codec codec;             /* default AVG_NONE */
  size_t part_floats;          /* default AVG_PART_FLOATS */
  unsigned window;             /* parts in flight per owner, default 4 */
  double clip;                 /* limit for avg_clip_factor, default 10 */
  avg_clip_mode clip_mode;     /* default AVG_CLIP_OFF */
  uint64_t sender_timeout_ms;  /* default 5000 */
  uint64_t reducer_timeout_ms; /* >= sender_timeout_ms, default 15000 */
  uint64_t deadline_ms;        /* from avg_round_start, default 60000 */
  size_t msg_overhead;         /* default AVG_MSG_OVERHEAD */
} avg_round_config;

/* Fills cfg with the defaults above; the group, members, buffer and
 * weight are the caller's to set. */
void avg_round_config_default(avg_round_config *cfg);

/* Why a member was dropped from the round. */
enum avg_drop {
  AVG_DROP_NONE = 0,
  AVG_DROP_SENDER_TIMEOUT,  /* sent no part of our span for
                               sender_timeout_ms while we waited on it */
  AVG_DROP_REDUCER_TIMEOUT, /* no result (nor any send to it) for
                               reducer_timeout_ms while we waited on it */
  AVG_DROP_STALLED,         /* our sends to it were blocked
                               (BEE_EQUEUE) for reducer_timeout_ms */
  AVG_DROP_SEND_FAILED,     /* the transport refused a send to it */
  AVG_DROP_BAD_RESULT,      /* it sent a result that does not decode */
  AVG_DROP_ABORTED,         /* it sent ABORT: it left or dropped us */
  AVG_DROP_CLOSED,          /* its last connection to us closed
                               (avg_round_gone) */
};
/* "sender timeout", "reducer timeout"...; "?" for other values. */
const char *avg_drop_name(int reason);

typedef struct avg_member_info {
  int dropped;         /* AVG_DROP_*; NONE: stayed to the end */
  uint64_t dropped_ms; /* when, from the start */
  uint32_t refused;    /* its contributions to our span refused (NaN,
                          infinity, wrong codec or length) */
  uint32_t clipped;    /* its contributions scaled down or dropped by the
                          clip rule */
  double weight;       /* the weight its parts to our span carried (ours:
                          our own); 0 when none came */
} avg_member_info;

typedef struct avg_span_info {
  size_t owner, start, len; /* floats */
  bool averaged;  /* every part got its result; false: stayed local (an
                      AUX member reports only its own span) */
  uint32_t min_k; /* contributions averaged into its parts, least */
  uint32_t max_k; /* and most (they differ when a member failed midway) */
} avg_span_info;

/* What a round did, from one member's side.  Arrays are borrowed for the
 * duration of the callback. */
typedef struct avg_round_summary {
  int status; /* 0, BEE_ETIMEOUT (the deadline cut it short), BEE_ECANCELED
                 (freed before the end), -ENOMEM */
  size_t nmembers;
  const avg_span_info *spans;     /* (N) in member order */
  const avg_member_info *members; /* (N); ours is all zero */
  /* (N + 1): floats of the buffer whose mean took k contributions, for
   * each k; k = 0: stayed local (a failed span, or nothing to average).
   * An AUX member counts its own span only. */
  const size_t *floats_by_k;
  size_t nparts;          /* parts of the whole buffer */
  const uint32_t *part_k; /* (nparts) k of each part, 0: local */
  uint64_t msgs_sent, msgs_recv;
  uint64_t payload_sent, payload_recv; /* encoded part bytes only */
  uint64_t bytes_sent, bytes_recv;     /* whole messages, each with
                                          msg_overhead bytes added */
  uint64_t ms;                         /* from start to the end */
} avg_round_summary;

/* The round ended.  s is borrowed for the call; x holds the result. */
typedef void (*avg_round_cb)(avg_round *r, const avg_round_summary *s,
                             void *arg);

/* Creates a round from cfg (copied; modes and bandwidth too) and io
 * (copied; io->ctx borrowed), and works out the spans and parts.  Messages
 * may be handed to it from now on: parts that arrive before
 * avg_round_start are kept.  Returns 0 and *out; BEE_ERANGE for a config
 * out of range (sizes, timeouts, a weight that is not finite, x NULL for a
 * member with data, no member that reduces) or one whose parts do not fit
 * a message; BEE_ETOOBIG when N > AVG_GROUP_MAX; -ENOMEM. */
int avg_round_new(const avg_round_config *cfg, const avg_io *io,
                  avg_round **out);
/* Starts sending.  cb runs exactly once, never inside this call: call
 * avg_round_tick after it.  Returns 0, or BEE_ERANGE when already
 * started (cb is then not kept). */
int avg_round_start(avg_round *r, avg_round_cb cb, void *arg);
/* A message from member `from` (len bytes, borrowed for the call).
 * Returns 0 when it was taken; otherwise it is dropped with a log line
 * naming the sender, and the code says why: a decoder code
 * (proto_avg_decode), BEE_ESTALE for another group, BEE_EAUTH for a PART
 * whose sender field is not `from`, BEE_ERANGE for a message that `from`
 * has no business sending (a part it does not owe us, a result for a part
 * we have not sent, a duplicate; also a contribution refused for its codec
 * or length, BEE_ETRUNCATED / BEE_ETRAILING), BEE_ELIMIT for a part beyond
 * the window, BEE_ECANCELED after the end or from a dropped member. */
int avg_round_handle(avg_round *r, size_t from, const uint8_t *msg, size_t len);
/* Runs the timeouts and the deadline.  Returns the milliseconds until it
 * wants to run again, UINT64_MAX when it needs no more ticks.  Call it
 * after avg_round_start and after every other call into the round (they
 * may start a wait), and when that time has passed; more often is
 * harmless. */
uint64_t avg_round_tick(avg_round *r);
/* The transport's queue to member has room again: resume sending. */
void avg_round_drain(avg_round *r, size_t member);
/* The transport's last connection to member closed (its process is
 * gone, or it closed the link): it is dropped now (AVG_DROP_CLOSED), its
 * span left local unless it was done, rather than after its timeouts.
 * A member that returns holds a new connection; its messages to this
 * round are refused as a dropped member's are. */
void avg_round_gone(avg_round *r, size_t member);
/* Frees r; NULL is fine.  Safe at any point, from the callback too.
 * Before the end, it sends ABORT to the members still in the round, puts
 * back every span not yet committed and runs the callback with
 * BEE_ECANCELED (a round never started has no callback to run).  With
 * jobs submitted and not yet done, the memory (and x and residual) stay
 * the round's until the last one's avg_job_done. */
void avg_round_free(avg_round *r);

/* Runs job's arithmetic; any thread, once.  It touches only the job's own
 * part of the buffers. */
void avg_job_run(avg_job *job);
/* Hands a run job back to its round, on the loop's thread. */
void avg_job_done(avg_job *job);

/* ------------------------------------------------------------------------ */
/* Matchmaking: forming a group through the DHT (match.c).
 *
 * Peers that want to average in a round declare themselves under the
 * group key "<run>.avg.<round>.<bits>" (a PROTO_REC_MATCH record, owned
 * and signed, whose expiration is the time the peer wants to start).  A
 * peer asks the earliest declared peer before it, in the order of
 * (expiration, peer id), to lead it; a leader takes followers until the
 * group has target_size members, or its start comes with at least
 * min_size, and sends everyone BEGIN: a random group id and the member
 * order of the round (the leader first, then the followers by id).
 * docs/AVERAGING.md, section 8, has the protocol and why it neither
 * deadlocks nor puts a peer in two groups; docs/PROTOCOL.md, section 11,
 * the messages.
 *
 * Like the round, the core does no I/O: the DHT and the transport are
 * the caller's, behind avg_match_io.                                      */

typedef struct avg_match avg_match;

/* One declaration read from the group key: the record's owner, its
 * expiration and its decoded value. */
typedef struct avg_decl {
  uint8_t id[PROTO_ID_BYTES];
  uint64_t expiration; /* unix seconds: when it wants to start */
  proto_match info;
} avg_decl;

/* A group that formed.  members is borrowed for the callback. */
typedef struct avg_group {
  uint8_t id[PROTO_AVG_GROUP_BYTES];
  uint8_t leader[PROTO_ID_BYTES];
  size_t nmembers;                   /* 1..AVG_GROUP_MAX */
  size_t self;                       /* our index in members */
  const proto_group_member *members; /* the round's order */
} avg_group;

typedef struct avg_match_io {
  void *ctx;
  /* Monotonic milliseconds, for the timeouts. */
  uint64_t (*now_ms)(void *ctx);
  /* Wall-clock unix milliseconds, for the declared starts. */
  uint64_t (*unix_ms)(void *ctx);
  /* Publishes info under the group key until expiration (unix seconds),
   * owned and signed by us.  Fire and forget: a lost declaration only
   * means no follower finds us. */
  void (*declare)(void *ctx, const proto_match *info, uint64_t expiration);
  /* Reads the group key (latest); the caller hands what it found to
   * avg_match_declared, whenever it comes, or never. */
  void (*fetch)(void *ctx);
  /* Sends one message (len bytes, borrowed) to the peer id, over an
   * existing connection or one dialled at addr (NULL: an existing one
   * only).  Returns 0 when the transport took it; an error makes a JOIN
   * count as refused. */
  int (*send)(void *ctx, const uint8_t id[PROTO_ID_BYTES], const char *addr,
              const uint8_t *msg, size_t len);
  /* n random bytes (group ids). */
  void (*random)(void *ctx, void *buf, size_t n);
} avg_match_io;

typedef struct avg_match_config {
  uint8_t self_id[PROTO_ID_BYTES];
  /* What we declare: run, round, bits, addr, schema hash, mode,
   * bandwidth and weight; must encode as a proto_match.  A CLIENT
   * declares nothing (no one could dial it) and never leads. */
  proto_match info;
  /* Leading: the members the group begins with at once, without waiting
   * for our start, 2..AVG_GROUP_MAX (default 16). */
  size_t target_size;
  /* Members a group may have at most, target_size..AVG_GROUP_MAX (0:
   * target_size): a leader refuses JOINs past it, a follower a BEGIN that
   * lists more.  A follower that expects fewer peers than its leader
   * does (its view of the swarm missed some) still takes the leader's
   * larger group. */
  size_t max_size;
  size_t min_size;             /* to begin at our start, default 2 */
  uint64_t matchmaking_ms;     /* our start, from now, default 5000 */
  /* Our first declaration's start, from now, when later than
   * matchmaking_ms (0: matchmaking_ms; at most 30 minutes, well inside
   * the hour a start may be ahead): a peer that looks early but cannot
   * average before then (a group formed ahead of its round) declares when
   * it will be ready, so that the order makes a peer ready sooner its
   * leader, and it does not lead a group that begins before the others
   * are there.  Declarations after the first (a start that passed alone)
   * take matchmaking_ms; deadline_ms still counts from avg_match_start. */
  uint64_t first_start_ms;
  uint64_t request_timeout_ms; /* a JOIN's answer, default 3000 */
  uint64_t fetch_interval_ms;  /* re-reading the key, default 1000 */
  uint64_t deadline_ms;        /* no group by then: give up, 30000 */
  /* End the search (BEE_EMISSED) as soon as a group of the key is known
   * to have formed without us and no peer that could take us still looks
   * (default false: wait for the deadline, as a peer that may average in
   * a later group of the same key should).  A peer that expects one group
   * of every peer, as beed's rounds do, has missed its round then. */
  bool end_when_formed;
} avg_match_config;

typedef struct avg_match_stats {
  uint64_t msgs_sent, msgs_recv;
  uint64_t joins_sent, joins_accepted, joins_refused;
  /* Our JOINs refused by a leader whose group had formed without us (it
   * began, or it was full): a group of the round runs without us. */
  uint64_t refused_formed;
  uint64_t probes; /* end_when_formed: JOINs to later declared peers */
  uint64_t declarations, fetches, redeclared;
  /* The most declarations of other peers for our key (run, round, bits,
   * schema) that one read returned. */
  uint64_t declared_max;
  uint64_t ms; /* from start to the end */
} avg_match_stats;

/* status 0 and g: a group formed (g borrowed for the call).  Otherwise g
 * is NULL and status BEE_ETIMEOUT (no group by the deadline),
 * BEE_EMISSED (end_when_formed: a group formed without us), BEE_ECANCELED
 * (freed before the end) or -ENOMEM.  Runs once; the
 * callback may free m. */
typedef void (*avg_match_cb)(avg_match *m, int status, const avg_group *g,
                             void *arg);

/* "accepted", "group full"...: a PROTO_JOIN_* code's name; "?" else. */
const char *avg_join_code_name(int code);
void avg_match_config_default(avg_match_config *cfg);
/* Returns 0 and *out; BEE_ERANGE for sizes or timeouts out of range or an
 * io without one of its functions; a proto_match_encode code for info
 * that is not a valid record; -ENOMEM. */
int avg_match_new(const avg_match_config *cfg, const avg_match_io *io,
                  avg_match **out);
/* Declares us and reads the key.  cb may run inside any later call
 * (avg_match_handle, _declared, _tick), never inside this one. */
int avg_match_start(avg_match *m, avg_match_cb cb, void *arg);
/* What a fetch found under the group key (copied; at most 4096 kept).
 * Declarations for another run, round, bits or schema, and CLIENTs',
 * are left out. */
void avg_match_declared(avg_match *m, const avg_decl *v, size_t n);
/* A matchmaking message from the authenticated peer `from`.  Returns 0,
 * a proto_group_decode code (logged, dropped), BEE_EAUTH for a BEGIN from
 * a peer that does not lead us, BEE_ERANGE for a BEGIN that does not fit
 * our round (we leave that group), BEE_ECANCELED after the end. */
int avg_match_handle(avg_match *m, const uint8_t from[PROTO_ID_BYTES],
                     const uint8_t *msg, size_t len);
/* The transport lost the peer id (its connection closed): a leader we
 * follow or ask is given up at once instead of at its timeout, a
 * follower is dropped from our group. */
void avg_match_peer_gone(avg_match *m, const uint8_t id[PROTO_ID_BYTES]);
/* Runs the timeouts.  Returns the milliseconds until it wants to run
 * again, UINT64_MAX when it is over.  Call it after start and every other
 * call, and when that time has passed. */
uint64_t avg_match_tick(avg_match *m);
void avg_match_stats_get(const avg_match *m, avg_match_stats *st);
/* Frees m; NULL is fine, from the callback too.  Before the end it tells
 * its leader or followers it left and runs cb with BEE_ECANCELED. */
void avg_match_free(avg_match *m);

/* Moshpit averaging: a peer's group bits for the next round.  The members
 * of a group that formed (group id, nmembers, our index) each take a
 * distinct cell of 0..target_size-1, drawn from the group id; the new
 * bits are ours shifted left by ceil(log2(target_size)) with the cell's
 * bits appended, the length kept.  So peers that averaged together go to
 * different groups next round: with G peers per group and bits = log2(G)
 * per dimension, a grid of G^d peers reaches the exact mean in d rounds.
 * Returns 0, or BEE_ERANGE for arguments out of range. */
int avg_moshpit_bits(const char *bits,
                     const uint8_t group[PROTO_AVG_GROUP_BYTES], size_t index,
                     size_t nmembers, size_t target_size,
                     char out[PROTO_BITS_MAX + 1]);

/* ------------------------------------------------------------------------ */
/* The averager on the transport (glue.c): matchmaking, then the round, for
 * one buffer at a time, over proto's connections on a libuv loop.  Their
 * messages are one-way messages on the control connection to each peer
 * ("avg.m", "avg.r", docs/PROTOCOL.md sections 10 and 11); the round's
 * arithmetic runs on libuv's thread pool.  The DHT is the caller's.      */

typedef struct avg_node avg_node;

/* The group key in the caller's DHT. */
typedef struct avg_node_dht {
  void *ctx;
  /* As avg_match_io.declare: publish info, owned and signed, under its
   * group key until expiration (unix seconds). */
  void (*declare)(void *ctx, const proto_match *info, uint64_t expiration);
  /* Read the group key of info (latest) and hand the valid
   * PROTO_REC_MATCH records found to avg_node_declared(node, ...). */
  void (*fetch)(void *ctx, avg_node *node, const proto_match *info);
} avg_node_dht;

typedef struct avg_node_config {
  uv_loop_t *loop;
  proto_host *host; /* its one-way methods "avg.m" and "avg.r" are ours */
  const uint8_t *self_id; /* copied */
  avg_node_dht dht;
  /* One TCP stream's largest window, bytes, for AVG_STRIPES_AUTO; 0: read
   * from this host's kernel at avg_node_new (min(tcp_rmem max / 2,
   * tcp_wmem max), in the caller's network namespace). */
  size_t stream_window_bytes;
} avg_node_config;

#define AVG_STRIPES_AUTO UINT_MAX
#ifndef AVG_STRIPES_AUTO_MAX
#define AVG_STRIPES_AUTO_MAX 8
#endif
/* The streams AVG_STRIPES_AUTO opens to a peer: min(a, b) Mbit/s x rtt
 * (the bandwidth-delay product) over one stream's window, rounded up; 0
 * (the control connection alone) when one stream covers it, at most
 * AVG_STRIPES_AUTO_MAX; 0 for a window of 0 or bandwidths not > 0. */
unsigned avg_stripes_auto(double a_mbit, double b_mbit, uint64_t rtt_ms,
                          size_t window_bytes);

/* One averaging.  match: as avg_match_config (self_id is filled in);
 * info.weight should be round.weight.  round: as avg_round_config, with
 * the buffer, weight, codec and timeouts set by the caller; the group,
 * members, modes and bandwidths come from the matchmaking.  round.window
 * 0 (the default here) sizes the window to the links: enough parts in
 * flight per owner to cover min(both declared bandwidths) x the round
 * trip the transport measured, within 4..AVG_WINDOW_MAX. */
typedef struct avg_node_request {
  avg_match_config match;
  avg_round_config round;
  bool equal_spans; /* ignore the declared bandwidths */
  /* Bulk connections per member to spread the round's bytes over (a
   * high bandwidth-delay link caps one TCP stream at its window / RTT),
   * opened at the round's start and kept from round to round; up to 16.
   * 0 or 1: the control connection only.  AVG_STRIPES_AUTO (the
   * default): per member, enough streams for min(both declared
   * bandwidths) x the measured round trip to fit in windows of
   * avg_node_config.stream_window_bytes, at most AVG_STRIPES_AUTO_MAX;
   * none to a member we have no connection to yet.  Needs
   * avg_node_conn_down on the host's on_down. */
  unsigned stripes;
  /* The auto window and stripes cover this many times min(both declared
   * bandwidths) x the round trip (below 1: once).  A member that declares
   * what its rounds measured (`--bandwidth auto`) sets 2: a round that
   * under-used the link, for want of streams, would otherwise measure
   * less, declare less and get fewer streams in turn. */
  double headroom;
} avg_node_request;

typedef struct avg_node_result {
  /* 0: the round ran (see summary for how much was averaged); else the
   * matchmaking's or the round's code (BEE_ETIMEOUT: no group). */
  int status;
  const avg_group *group;            /* NULL when no group formed */
  const avg_round_summary *summary;  /* NULL when no round ran */
  avg_match_stats match;
} avg_node_result;

/* r and what it points to are borrowed for the call.  The callback may
 * start the next averaging or close the node. */
typedef void (*avg_node_cb)(avg_node *n, const avg_node_result *r, void *arg);

/* Returns 0 and *out; BEE_ERANGE for a config without loop, host, id or
 * DHT functions; -ENOMEM. */
int avg_node_new(const avg_node_config *cfg, avg_node **out);
/* Defaults of both cores, nothing else set. */
void avg_node_request_default(avg_node_request *req);
/* Starts matchmaking, then the round; cb runs once, never inside this
 * call.  round.x (and residual) are borrowed until then.  BEE_ERANGE
 * while another averaging runs or after close; avg_match_new's codes. */
int avg_node_average(avg_node *n, const avg_node_request *req, avg_node_cb cb,
                     void *arg);
/* The matchmaking alone, ahead of the buffer: cb gets the group
 * (r->group, borrowed for the call; r->summary NULL) or why none formed,
 * and the caller runs the round with avg_node_round once its buffer is
 * ready (req.round is not used here).  The members may begin the round
 * at different times: round messages for a group we have not begun yet
 * are kept (within bounds, 30 s), also while another round runs.  Errors
 * as avg_node_average. */
int avg_node_match(avg_node *n, const avg_node_request *req, avg_node_cb cb,
                   void *arg);
/* Leaves the group g (one avg_node_match gave, whose round we will not
 * run): its members get ABORT with why, and drop us at once instead of at
 * their timeouts, also those that begin its round later. */
void avg_node_leave(avg_node *n, const avg_group *g, const char *why);
/* Tells the members of g (one avg_node_match gave, whose round we will
 * run but have not begun: our buffer is not ready) that we are coming:
 * WAIT, which starts their timeouts for us again (a round's sender
 * timeout would drop a member that begins later than that after the
 * others).  Call it more often than the members' sender_timeout_ms; their
 * round's deadline still holds.  Ignored by a node that runs no round for
 * g. */
void avg_node_wait(avg_node *n, const avg_group *g);
/* Ends the averaging under way, matchmaking or round, with its callback
 * run now with BEE_ECANCELED (a round's members see us leave); the node
 * stays open.  Nothing under way, or NULL: nothing happens. */
void avg_node_cancel(avg_node *n);
/* Whether the averaging under way is still in its matchmaking: no group
 * has formed yet (an avg_node_average or avg_node_match call whose
 * callback has not run, and no round begun).  False for NULL. */
bool avg_node_matching(const avg_node *n);
/* Whether a round is under way (its bytes on the links).  False for
 * NULL. */
bool avg_node_in_round(const avg_node *n);
/* The round alone, for a group formed elsewhere (the same group id,
 * member list and order at every member; g->self is us): no matchmaking.
 * g is copied.  Errors as avg_node_average, and BEE_ERANGE for a group
 * that does not list us at g->self. */
int avg_node_round(avg_node *n, const avg_group *g,
                   const avg_node_request *req, avg_node_cb cb, void *arg);
/* Our link's rate as the rounds measured it, Mbit/s: the best half
 * second of round messages reaching us, the best over the last 4 rounds
 * that moved enough to tell (at least 256 KiB in half a second); 0 before
 * any has.  What a member declares as its bandwidth with `--bandwidth
 * auto`, so that spans follow the links as they are. */
double avg_node_bandwidth_mbit(const avg_node *n);
/* What a fetch found (see avg_match_declared). */
void avg_node_declared(avg_node *n, const avg_decl *v, size_t count);
/* The host's on_drain for connection c: the round sends again. */
void avg_node_drain(avg_node *n, proto_conn *c);
/* The host's on_down for connection c: once no connection to that peer
 * is left, the matchmaking stops waiting on it (avg_match_peer_gone) and
 * the round under way drops it, if a member (avg_round_gone). */
void avg_node_conn_down(avg_node *n, proto_conn *c);
/* Ends the averaging under way (its callback runs now, BEE_ECANCELED) and
 * frees n on a later turn of the loop.  NULL is fine. */
void avg_node_close(avg_node *n);

#endif /* BEE_AVERAGER_H */
