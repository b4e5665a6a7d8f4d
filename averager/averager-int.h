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
 * for the baseline version only.
 */
#ifndef BEE_AVERAGER_INT_H
#define BEE_AVERAGER_INT_H

#include "averager.h"

#if defined(__x86_64__) && defined(__ELF__) && defined(__GNUC__) &&            \
    !defined(AVG_NO_CLONES) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define AVG__CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#endif
#endif
#ifndef AVG__CLONES
#define AVG__CLONES
#endif

#endif /* BEE_AVERAGER_INT_H */
