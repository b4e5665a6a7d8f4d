/* test-trainer-device.c: device specs, the CPU device, and auto.
 *
 * Runs everywhere: on a machine without a GPU (or a build without CUDA)
 * auto must fall back to the CPU and say why; with a GPU it must pick
 * cuda:0.  Specs that name CUDA must fail cleanly when CUDA is absent.
 */
#include "test.h"

#include "trainer.h"

#include <errno.h>

static void parses(const char *spec, int kind, int index) {
  int k = -1, i = -1;
  if (trn_device_parse(spec, &k, &i) != 0)
    FAIL("\"%s\" should parse", spec ? spec : "(null)");
  ASSERT_EQ(k, kind);
  ASSERT_EQ(i, index);
}

static void rejects(const char *spec) {
  int k = -1, i = -1;
  int rc = trn_device_parse(spec, &k, &i);
  if (rc != -EINVAL)
    FAIL("\"%s\" should be -EINVAL, got %d", spec, rc);
  /* Outputs stay untouched on failure. */
  ASSERT_EQ(k, -1);
  ASSERT_EQ(i, -1);
}

static void test_parse(void) {
  parses("auto", TRN_DEV_AUTO, 0);
  parses(NULL, TRN_DEV_AUTO, 0);
  parses("cpu", TRN_DEV_CPU, 0);
  parses("cuda", TRN_DEV_CUDA, 0);
  parses("cuda:0", TRN_DEV_CUDA, 0);
  parses("cuda:1", TRN_DEV_CUDA, 1);
  parses("cuda:15", TRN_DEV_CUDA, 15);
  parses("cuda:4095", TRN_DEV_CUDA, TRN_DEV_INDEX_MAX);

  rejects("");
  rejects("gpu");
  rejects("CPU");
  rejects("Auto");
  rejects("cpu:0");
  rejects("cpu ");
  rejects(" cpu");
  rejects("autox");
  rejects("cud");
  rejects("cudax");
  rejects("cuda:");
  rejects("cuda:-1");
  rejects("cuda:+1");
  rejects("cuda: 1");
  rejects("cuda:1 ");
  rejects("cuda:01");
  rejects("cuda:00");
  rejects("cuda:1a");
  rejects("cuda:0x1");
  rejects("cuda:4096");
  rejects("cuda:99999999999999999999");
  rejects("cuda::1");
  rejects("cuda:1:2");
}

static void test_cpu(void) {
  trn_device d;
  char why[256];
  memset(&d, 0xa5, sizeof d);
  ASSERT_EQ(trn_device_open("cpu", &d, why, sizeof why), 0);
  ASSERT_EQ(d.kind, TRN_DEV_CPU);
  ASSERT_EQ(d.index, 0);
  ASSERT_GE(d.cpu_threads, 1);
  ASSERT_GT(d.mem_bytes, 0);
  ASSERT_EQ(d.sm_major, 0);
  ASSERT(memchr(d.name, '\0', sizeof d.name) != NULL);
  ASSERT_GT(strlen(d.name), 0);
  ASSERT(strncmp(why, "cpu: ", 5) == 0);
  ASSERT_EQ(trn_device_bind(&d), 0);
  printf("cpu: %s\n", why);

  /* A NULL why is allowed when why_len is 0. */
  ASSERT_EQ(trn_device_open("cpu", &d, NULL, 0), 0);
}

static void test_bad_spec(void) {
  trn_device d;
  char why[256] = "x";
  memset(&d, 0x5a, sizeof d);
  trn_device before = d;
  ASSERT_EQ(trn_device_open("gpu0", &d, why, sizeof why), -EINVAL);
  ASSERT(strstr(why, "gpu0") != NULL);
  ASSERT_MEMEQ(&d, &before, sizeof d);

  /* A tiny why buffer is truncated, still terminated. */
  char tiny[4] = "xyz";
  ASSERT_EQ(trn_device_open("gpu0", &d, tiny, sizeof tiny), -EINVAL);
  ASSERT_EQ(strlen(tiny), 3);
}

static void test_auto(int n) {
  trn_device d;
  char why[256];
  ASSERT_EQ(trn_device_open("auto", &d, why, sizeof why), 0);
  printf("auto: %s\n", why);
  ASSERT(strncmp(why, "auto: ", 6) == 0);
  if (n > 0) {
    ASSERT_EQ(d.kind, TRN_DEV_CUDA);
    ASSERT_EQ(d.index, 0);
  } else {
    ASSERT_EQ(d.kind, TRN_DEV_CPU);
    ASSERT_GE(d.cpu_threads, 1);
    ASSERT(strstr(why, "no usable CUDA device") != NULL);
    ASSERT(strstr(why, "using the CPU") != NULL);
  }
}

/* Specs naming CUDA: absent devices are -ENODEV (or -ENOTSUP without the
 * backend), and why names the index. */
static void test_cuda_absent(int n) {
  trn_device d;
  char why[256], spec[32];
  snprintf(spec, sizeof spec, "cuda:%d", n);
  int rc = trn_device_open(spec, &d, why, sizeof why);
  printf("%s: %s\n", spec, why);
  ASSERT_EQ(rc, trn_cuda_available() ? -ENODEV : -ENOTSUP);
  ASSERT(strstr(why, spec) != NULL);
  if (n == 0) {
    rc = trn_device_open("cuda", &d, why, sizeof why);
    ASSERT_EQ(rc, trn_cuda_available() ? -ENODEV : -ENOTSUP);
  }
}

int main(void) {
  int n = -1;
  ASSERT_EQ(trn_device_count_cuda(&n), 0);
  ASSERT_GE(n, 0);
  if (!trn_cuda_available()) {
    ASSERT_EQ(n, 0);
    ASSERT_UEQ(trn_cudnn_version(), 0);
  }
  printf("cuda built: %d, devices: %d\n", trn_cuda_available(), n);

  test_parse();
  test_cpu();
  test_bad_spec();
  test_auto(n);
  test_cuda_absent(n);
  return 0;
}
