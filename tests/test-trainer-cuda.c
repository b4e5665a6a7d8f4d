/* test-trainer-cuda.c: opening a real CUDA device.
 *
 * Skips (exit 77) without the CUDA backend (test-trainer-cuda-load fails
 * when a CUDA build's own module does not load) and on machines without a
 * driver or a device.  With the backend it always checks first that cuDNN
 * loads, which needs no GPU.  With a device it opens
 * cuda:0, checks what the runtime reports, and checks that the first index
 * past the end is -ENODEV.
 */
#include "test.h"

#include "trainer.h"

#include <errno.h>

int main(void) {
  if (!trn_cuda_available()) {
    trn_device d;
    char why[512];
    ASSERT_EQ(trn_device_open("cuda:0", &d, why, sizeof why), -ENOTSUP);
    printf("skip: %s\n", why);
    return TEST_SKIP;
  }
  size_t cudnn = trn_cudnn_version();
  printf("cuDNN %zu.%zu.%zu\n", cudnn / 10000, cudnn / 100 % 100, cudnn % 100);
  ASSERT_GE(cudnn, 90000);

  int n = -1;
  ASSERT_EQ(trn_device_count_cuda(&n), 0);
  if (n == 0) {
    trn_device d;
    char why[256];
    ASSERT_EQ(trn_device_open("cuda:0", &d, why, sizeof why), -ENODEV);
    printf("skip: %s\n", why);
    return TEST_SKIP;
  }
  ASSERT_GT(n, 0);

  trn_device d;
  char why[256];
  memset(&d, 0, sizeof d);
  ASSERT_EQ(trn_device_open("cuda:0", &d, why, sizeof why), 0);
  printf("%s\n", why);
  ASSERT_EQ(d.kind, TRN_DEV_CUDA);
  ASSERT_EQ(d.index, 0);
  ASSERT(memchr(d.name, '\0', sizeof d.name) != NULL);
  ASSERT_GT(strlen(d.name), 0);
  ASSERT_GT(d.mem_bytes, 0);
  ASSERT_GE(d.sm_major, 7);
  ASSERT_GE(d.cpu_threads, 1);
  ASSERT_EQ(trn_device_bind(&d), 0);

  /* "cuda" is cuda:0, and auto picks it too. */
  trn_device d2;
  ASSERT_EQ(trn_device_open("cuda", &d2, why, sizeof why), 0);
  ASSERT_STREQ(d2.name, d.name);
  ASSERT_EQ(trn_device_open("auto", &d2, why, sizeof why), 0);
  ASSERT_EQ(d2.kind, TRN_DEV_CUDA);
  ASSERT_EQ(d2.index, 0);

  /* Every present device opens; the first index past the end does not. */
  for (int i = 1; i < n; i++) {
    char spec[32];
    snprintf(spec, sizeof spec, "cuda:%d", i);
    ASSERT_EQ(trn_device_open(spec, &d2, why, sizeof why), 0);
    printf("%s\n", why);
  }
  char spec[32], count[32];
  snprintf(spec, sizeof spec, "cuda:%d", n);
  snprintf(count, sizeof count, "only %d CUDA", n);
  ASSERT_EQ(trn_device_open(spec, &d2, why, sizeof why), -ENODEV);
  printf("%s\n", why);
  ASSERT(strstr(why, spec) != NULL);
  ASSERT(strstr(why, count) != NULL);
  return 0;
}
