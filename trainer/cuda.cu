/* cuda.cu: the CUDA side of device discovery.
 *
 * Counting, describing and binding CUDA devices through the runtime API, and
 * the cuDNN version.  Compiled by nvcc only in builds with the CUDA backend;
 * device.c holds the policy and calls in through trainer-int.h.
 *
 * Every runtime call goes through CUDA_CHECK, which logs the call with its
 * file and line (as llm.c's cudaCheck does) but returns -EIO instead of
 * exiting: the daemon must be able to checkpoint and leave the swarm
 * cleanly when a GPU fails under it.
 */
#include "trainer-int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

static_assert(CUDNN_MAJOR >= 9, "the trainer needs cuDNN 9 or later");

/* Returns 0 for cudaSuccess; otherwise logs call, file and line and returns
 * -EIO.  Clears the runtime's last-error slot so that a later, unrelated
 * cudaGetLastError does not report this failure again (sticky errors, which
 * poison the context, stay regardless). */
int trn__cuda_check(cudaError_t err, const char *call, const char *file,
                    int line) {
  if (err == cudaSuccess)
    return 0;
  (void)cudaGetLastError();
  trn__log(TRN_LOG_ERROR, "%s:%d: %s: %s (%s)", file, line, call,
           cudaGetErrorString(err), cudaGetErrorName(err));
  return -EIO;
}

int trn__blas_check(cublasStatus_t s, const char *call, const char *file,
                    int line) {
  if (s == CUBLAS_STATUS_SUCCESS)
    return 0;
  trn__log(TRN_LOG_ERROR, "%s:%d: %s: %s (%s)", file, line, call,
           cublasGetStatusString(s), cublasGetStatusName(s));
  return -EIO;
}

int trn__dnn_check(cudnnStatus_t s, const char *call, const char *file,
                   int line) {
  if (s == CUDNN_STATUS_SUCCESS)
    return 0;
  trn__log(TRN_LOG_ERROR, "%s:%d: %s: %s", file, line, call,
           cudnnGetErrorString(s));
  return -EIO;
}

#define CUDA_CHECK(call) trn__cuda_check((call), #call, __FILE__, __LINE__)

/* Writes a CUDA version number (1000 * major + 10 * minor) as "13.0". */
static void version_str(char *buf, size_t len, int v) {
  if (v <= 0)
    snprintf(buf, len, "none");
  else
    snprintf(buf, len, "%d.%d", v / 1000, v % 1000 / 10);
}

/* Explains why the runtime sees no device, in words an operator can act
 * on: cudaGetErrorString's "driver version is insufficient" is also what a
 * machine with no driver at all reports. */
static void explain_none(cudaError_t err, char *why, size_t why_len) {
  int rt = 0, drv = 0;
  char rts[16], drvs[16];
  (void)cudaRuntimeGetVersion(&rt);
  (void)cudaDriverGetVersion(&drv);
  version_str(rts, sizeof rts, rt);
  version_str(drvs, sizeof drvs, drv);
  const char *vis = getenv("CUDA_VISIBLE_DEVICES");
  if (err == cudaErrorInsufficientDriver && drv == 0)
    snprintf(why, why_len, "no CUDA driver is installed (runtime %s)", rts);
  else if (err == cudaErrorInsufficientDriver)
    snprintf(why, why_len,
             "the CUDA driver (%s) is older than the runtime (%s)", drvs, rts);
  else if (vis)
    snprintf(why, why_len,
             "the CUDA driver (%s) sees no device "
             "(CUDA_VISIBLE_DEVICES=\"%s\")",
             drvs, vis);
  else
    snprintf(why, why_len, "the CUDA driver (%s) sees no device", drvs);
}

int trn__cuda_count(int *n, char *why, size_t why_len) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  *n = 0;
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) {
    (void)cudaGetLastError();
    if (why_len > 0)
      explain_none(err, why, why_len);
    return 0;
  }
  int rc = trn__cuda_check(err, "cudaGetDeviceCount(&count)", __FILE__,
                           __LINE__);
  if (rc) {
    if (why_len > 0)
      snprintf(why, why_len, "cudaGetDeviceCount failed: %s (%s)",
               cudaGetErrorString(err), cudaGetErrorName(err));
    return rc;
  }
  if (count == 0 && why_len > 0)
    explain_none(cudaErrorNoDevice, why, why_len);
  *n = count;
  return 0;
}

int trn__cuda_props(int index, trn_device *out) {
  cudaDeviceProp p;
  int rc = CUDA_CHECK(cudaGetDeviceProperties(&p, index));
  if (rc)
    return rc;
  /* p.name is 256 bytes; ours is 128 (no GPU name comes close). */
  size_t len = strnlen(p.name, sizeof p.name);
  if (len >= sizeof out->name)
    len = sizeof out->name - 1;
  memcpy(out->name, p.name, len);
  out->name[len] = '\0';
  out->mem_bytes = p.totalGlobalMem;
  out->sm_major = p.major;
  out->sm_minor = p.minor;
  return 0;
}

int trn__cuda_bind(int index) { return CUDA_CHECK(cudaSetDevice(index)); }

size_t trn__cudnn_version(void) { return cudnnGetVersion(); }

int trn__cuda_host_alloc(size_t bytes, void **p) {
  /* Portable: pinned for every device's context, whichever is current. */
  if (cudaHostAlloc(p, bytes, cudaHostAllocPortable) == cudaSuccess)
    return 0;
  (void)cudaGetLastError(); /* not sticky: clear it for the next call */
  *p = NULL;
  return -ENOMEM;
}

void trn__cuda_host_free(void *p) { (void)cudaFreeHost(p); }
