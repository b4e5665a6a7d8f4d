/* trainer-int.h: internals shared between trainer/'s own files.
 *
 * The log hook, and the seam between the CPU side (device.c, plain C) and
 * the CUDA side (cuda.cu, compiled by nvcc as C++).  In a build without
 * CUDA, device.c supplies the trn__cuda_* functions itself: they see no
 * devices.  Nothing outside trainer/ includes this file.
 */
#ifndef BEE_TRAINER_INT_H
#define BEE_TRAINER_INT_H

#include "trainer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Formats one line and hands it to the hook set by trn_log_set. */
void trn__log(int level, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Counts visible CUDA devices into *n.  "No driver" and "no device" are
 * not errors: *n = 0, and why (when why_len > 0) says which.  Returns 0 or
 * -EIO (logged, with why set). */
int trn__cuda_count(int *n, char *why, size_t why_len);

/* Fills the CUDA fields of *out (name, mem_bytes, sm_major, sm_minor) for
 * device index, which the caller has checked against trn__cuda_count.
 * Returns 0 or -EIO (logged). */
int trn__cuda_props(int index, trn_device *out);

/* Makes device index current for the calling thread.  Returns 0 or -EIO. */
int trn__cuda_bind(int index);

/* Returns cudnnGetVersion(), or 0 without CUDA. */
size_t trn__cudnn_version(void);

#ifdef __cplusplus
}
#endif

#endif /* BEE_TRAINER_INT_H */
