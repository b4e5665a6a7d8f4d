/* trainer.h: the trainer library's one public header.
 *
 * The trainer runs the local half of a training step: it owns the compute
 * device, the model and its optimizer, and hands flat gradient buffers to
 * whoever averages them.  It knows nothing of the network; the daemon ties
 * it to the swarm.  For now it holds device discovery and selection: parse
 * a "--device" spec, count CUDA devices, open one (or the CPU).
 *
 * Functions return 0 or a negative errno.  See trainer/README.md.
 */
#ifndef BEE_TRAINER_H
#define BEE_TRAINER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Logging.  The trainer writes one line per event through a hook, so the    */
/* daemon can route it into its own logger; by default lines go to stderr as */
/* "LEVEL trainer: message".  Levels match the daemon's (error = 0).         */

enum { TRN_LOG_ERROR = 0, TRN_LOG_WARN, TRN_LOG_INFO, TRN_LOG_DEBUG };

/* Receives one finished log line (no trailing newline), borrowed for the
 * duration of the call.  May be called from any thread that calls into the
 * trainer. */
typedef void (*trn_log_cb)(int level, const char *msg, void *data);

/* Routes the trainer's log lines to cb (NULL restores the stderr default).
 * Call it once at start-up, before any other thread uses the trainer: the
 * hook itself is not synchronized. */
void trn_log_set(trn_log_cb cb, void *data);

/* ------------------------------------------------------------------------ */
/* Devices.                                                                 */

enum {
  TRN_DEV_AUTO = 0, /* only as a parsed spec: CUDA if present, else CPU */
  TRN_DEV_CPU,
  TRN_DEV_CUDA,
};

/* Highest CUDA index a spec may name ("cuda:4095"). */
#ifndef TRN_DEV_INDEX_MAX
#define TRN_DEV_INDEX_MAX 4095
#endif

typedef struct trn_device {
  int kind;               /* TRN_DEV_CPU / TRN_DEV_CUDA */
  int index;              /* CUDA ordinal (as CUDA_VISIBLE_DEVICES numbers
                             them); 0 for the CPU */
  char name[128];         /* "NVIDIA H100 80GB HBM3", or the CPU model */
  uint64_t mem_bytes;     /* device memory; physical RAM for the CPU */
  int sm_major, sm_minor; /* compute capability; 0.0 for the CPU */
  int cpu_threads;        /* online CPUs (compute threads for TRN_DEV_CPU,
                             host threads for data loading either way) */
} trn_device;

/* Parses a device spec: "auto", "cpu", "cuda" (same as "cuda:0") or
 * "cuda:N" with N decimal, without sign or leading zeros, at most
 * TRN_DEV_INDEX_MAX.  NULL means "auto".  Sets *kind to TRN_DEV_AUTO,
 * TRN_DEV_CPU or TRN_DEV_CUDA and *index to N (0 otherwise).  Returns 0, or
 * -EINVAL (outputs untouched) for anything else. */
int trn_device_parse(const char *spec, int *kind, int *index);

/* Returns whether this build has the CUDA backend (meson -Dcuda, nvcc). */
bool trn_cuda_built(void);

/* Counts the CUDA devices this process can see into *n.  A build without
 * CUDA, a machine without a driver and a driver without devices all give 0
 * and *n = 0.  Returns -EIO (logged with the failing call) when the runtime
 * fails in any other way. */
int trn_device_count_cuda(int *n);

/* Returns the cuDNN version loaded at run time (e.g. 91300 for 9.13.0), or
 * 0 in a build without CUDA.  Needs no GPU. */
size_t trn_cudnn_version(void);

/* Resolves spec (see trn_device_parse) to a device and fills *out.
 *
 *   auto     the first CUDA device when one is present, else the CPU;
 *   cpu      the CPU, with cpu_threads = online CPUs;
 *   cuda[:N] CUDA device N, which must exist.
 *
 * On success a CUDA device is also made current for the calling thread
 * (see trn_device_bind).  why (may be NULL when why_len is 0) receives one
 * line saying what was chosen and why, or what went wrong; it is always
 * NUL-terminated and truncated to fit.  Returns 0, or:
 *   -EINVAL   spec is malformed;
 *   -ENOTSUP  spec asks for CUDA but this build has no CUDA backend;
 *   -ENODEV   cuda:N with N >= the number of devices (why names N and the
 *             count);
 *   -EIO      the CUDA runtime failed (also logged). */
int trn_device_open(const char *spec, trn_device *out, char *why,
                    size_t why_len);

/* Makes dev current for the calling thread.  CUDA keeps the current device
 * per thread, so each worker thread that launches work calls this first.
 * A no-op for the CPU.  Returns 0 or -EIO. */
int trn_device_bind(const trn_device *dev);

#ifdef __cplusplus
}
#endif

#endif /* BEE_TRAINER_H */
