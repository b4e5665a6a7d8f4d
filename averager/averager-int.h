/* averager-int.h: internals shared by the averager's files.
 *
 * AVG__CLONES marks the loops that carry the bulk of the work (the codec
 * kernels, the norm, the weighted sum).  On x86-64 with GCC or clang they
 * are compiled twice, for baseline x86-64 (SSE2) and for x86-64-v3 (AVX2),
 * and the loader picks one per CPU (an ifunc).  Nothing else changes: no
 * intrinsics, the same C; the wider vectors give 1.1 to 2.5 times the
 * throughput (docs/AVERAGING.md, section 6).  Both versions compute the
 * same bits, because the library is built with -ffp-contract=off
 * (x86-64-v3 has FMA, which would otherwise fuse a * b + c) and every
 * operation is an IEEE one that SSE and AVX round alike.  Only static
 * functions are cloned: clang 14 fails to emit the resolver of an
 * exported clone called from another file.  Build with -DAVG_NO_CLONES
 * for the baseline version only; ThreadSanitizer builds get only it too
 * (the loader runs the resolver, instrumented, before TSan is set up).
 */
#ifndef BEE_AVERAGER_INT_H
#define BEE_AVERAGER_INT_H

#include "averager.h"

#if defined(__has_feature)
#if __has_feature(thread_sanitizer) && !defined(AVG_NO_CLONES)
#define AVG_NO_CLONES 1
#endif
#endif
#if defined(__SANITIZE_THREAD__) && !defined(AVG_NO_CLONES)
#define AVG_NO_CLONES 1
#endif
#if defined(__x86_64__) && defined(__ELF__) && defined(__GNUC__) &&            \
    !defined(AVG_NO_CLONES) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define AVG__CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#endif
#endif
#ifndef AVG__CLONES
#define AVG__CLONES
#endif

/* ---- meter.c: a member's link rate, measured ---------------------------- */

/* The rate at which round messages reach us, in whole windows of
 * AVG__METER_WINDOW_MS: a round's second-best window (its best, if only
 * one counts) is that round's estimate of our link, a window in which the
 * peers sent as fast as they could; not the best, because a loop kept
 * busy reads what waited in the socket buffers in one burst, and one such
 * window can show far more than the link carries.  The rate over the
 * whole round, never above the link's, is the floor (and all a round
 * shorter than a window gives).  The estimate is the best of the last
 * AVG__METER_ROUNDS rounds, so a round slowed by a slow peer does not
 * pull it down for long, and a link that got slower shows within that
 * many rounds.  Windows (and rounds) holding less than
 * AVG__METER_MIN_BYTES say more about round trips than about bandwidth
 * and do not count. */
#define AVG__METER_WINDOW_MS 500
#define AVG__METER_MIN_BYTES (256u << 10)
#define AVG__METER_ROUNDS 4

typedef struct avg__meter {
  bool on;                   /* a round is being measured */
  uint64_t win_ms, win_bytes; /* the current window: start, bytes */
  uint64_t start_ms, bytes;   /* the round: start, bytes */
  double best, second;       /* bytes/s, this round's two best windows */
  double past[AVG__METER_ROUNDS]; /* the last rounds' best, bytes/s */
  size_t npast, next;
} avg__meter;

void avg__meter_start(avg__meter *m, uint64_t now_ms);
void avg__meter_add(avg__meter *m, uint64_t now_ms, size_t bytes);
void avg__meter_end(avg__meter *m, uint64_t now_ms);
/* Mbit/s, or 0 before a round has given a window that counts. */
double avg__meter_mbit(const avg__meter *m);

#endif /* BEE_AVERAGER_INT_H */
