/* averager.h: beed's averager, the group all-reduce of gradients and
 * parameters.
 *
 * A group of peers averages one flat fp32 buffer with a butterfly
 * all-reduce: the buffer is cut into contiguous spans, one per member that
 * reduces; every member sends its piece of each span to the span's owner,
 * the owner takes the weighted mean in fp32 and sends the result back.
 * Pieces travel in parts, each part encoded with one of the codecs below.
 *
 * This increment is the arithmetic core, with no sockets, clock or
 * threads: the part codecs (exact byte layouts in docs/AVERAGING.md), the
 * checks and the weighted mean an owner runs, the clip rule against
 * outliers, and the bandwidth-aware split into spans.  The matchmaking
 * and the round protocol will build on it.  See averager/README.md.
 *
 * Everything here is deterministic: the same inputs give the same bits on
 * every peer, whatever the CPU or compiler, because the library uses only
 * IEEE-754 binary32/binary64 +, -, *, / in a fixed order, is built with
 * -ffp-contract=off (no fused multiply-add) and without -ffast-math.
 */
#ifndef BEE_AVERAGER_H
#define BEE_AVERAGER_H

#include "proto.h"

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

#endif /* BEE_AVERAGER_H */
