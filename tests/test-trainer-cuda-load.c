/* test-trainer-cuda-load.c: finding and opening the CUDA module
 * (trainer/cuda-load.c), without a GPU.
 *
 * Each case runs in a child of its own, since a process looks for the
 * module once: no module, a file that is not a library, a library
 * without the entry, a module of another layout (each: no backend, the
 * reason said, auto on the CPU, cuda:0 refused with it), the fake
 * module (tests/cuda-fake-module.c: its device seen, calls forwarded
 * both ways), and the build tree's own module where the build has one.
 * argv: the fake module built working, of another layout, without the
 * entry. */
#include "test.h"

#include "cuda-abi.h"

#include "bee-config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char logged[4096];

static void on_log(int level, const char *line, void *data) {
  size_t n = strlen(logged);
  snprintf(logged + n, sizeof logged - n, "%s\n", line);
}

/* No backend: the reason contains want, everywhere it is told. */
static void check_absent(const char *want) {
  ASSERT(!trn_cuda_available());
  printf("  missing: %s\n", trn__cuda_missing());
  ASSERT(strstr(trn__cuda_missing(), want) != NULL);
  int n = -1;
  char why[1024];
  ASSERT_EQ(trn__cuda_count(&n, why, sizeof why), 0);
  ASSERT_EQ(n, 0);
  ASSERT(strstr(why, want) != NULL);
  ASSERT_UEQ(trn_cudnn_version(), 0);

  trn_device d;
  ASSERT_EQ(trn_device_open("auto", &d, why, sizeof why), 0);
  ASSERT_EQ(d.kind, TRN_DEV_CPU);
  printf("  auto: %s\n", why);
  ASSERT(strstr(why, "using the CPU") != NULL);
  ASSERT(strstr(why, want) != NULL);
  ASSERT_EQ(trn_device_open("cuda:0", &d, why, sizeof why), -ENOTSUP);
  ASSERT(strstr(why, "cuda:0") != NULL && strstr(why, want) != NULL);

  void *p = trn_host_alloc(4096, true);
  ASSERT(p != NULL && !trn_host_pinned(p));
  trn_host_free(p);
  trn__gpu *g = (trn__gpu *)1;
  char err[1024];
  ASSERT_EQ(trn__gpu_new(0, NULL, 0, 10, 0, 1, TRN_FP32, &g, err, sizeof err),
            -ENOTSUP);
  ASSERT(g == NULL && strstr(err, want) != NULL);
}

static void case_none(void) {
  setenv(TRN__CUDA_MODULE_ENV, "/nonexistent/beed-cuda.so", 1);
  check_absent("BEE_CUDA_MODULE=/nonexistent/beed-cuda.so: no such file");
}

/* A file that is there but no library. */
static void case_garbage(void) {
  setenv(TRN__CUDA_MODULE_ENV, "/dev/null", 1);
  check_absent("the CUDA backend /dev/null cannot load: ");
}

static void case_no_entry(const char *module) {
  setenv(TRN__CUDA_MODULE_ENV, module, 1);
  check_absent("is not a beed CUDA backend (no trn__cuda_module)");
}

static void case_other_layout(const char *module) {
  setenv(TRN__CUDA_MODULE_ENV, module, 1);
  check_absent("is from beed 9.9.9, built for another layout");
}

static void case_fake(const char *module) {
  setenv(TRN__CUDA_MODULE_ENV, module, 1);
  trn_log_set(on_log, NULL);
  ASSERT(trn_cuda_available());
  ASSERT_EQ(strcmp(trn__cuda_missing(), ""), 0);
  int n = 0;
  ASSERT_EQ(trn_device_count_cuda(&n), 0);
  ASSERT_EQ(n, 1);
  ASSERT_UEQ(trn_cudnn_version(), 91234);

  trn_device d;
  char why[512];
  ASSERT_EQ(trn_device_open("auto", &d, why, sizeof why), 0);
  printf("  auto: %s\n", why);
  ASSERT_EQ(d.kind, TRN_DEV_CUDA);
  ASSERT_EQ(strcmp(d.name, "fake GPU 0"), 0);
  ASSERT(strstr(why, "cuda:0: fake GPU 0, 1.0 GiB, sm_90") != NULL);
  /* The module logged through the program's hook. */
  ASSERT(strstr(logged, "fake: props of 0\n") != NULL);

  /* A call with arguments both ways, and the module's use of the
   * program's table (the dropout draw). */
  trn__gpu *g = (trn__gpu *)1;
  char err[256];
  ASSERT_EQ(trn__gpu_new(0, NULL, 0, 10, 0, 1, TRN_FP32, &g, err, sizeof err),
            -ENOMEM);
  ASSERT(g == NULL);
  ASSERT_EQ(strcmp(err, "fake: no memory for 10 parameters (cut set)"), 0);
  /* Pinned memory refused by the module: plain memory instead. */
  void *p = trn_host_alloc(4096, true);
  ASSERT(p != NULL && !trn_host_pinned(p));
  trn_host_free(p);
}

/* No variable: a program in the build tree opens the build's module. */
static void case_build_tree(void) {
  unsetenv(TRN__CUDA_MODULE_ENV);
  if (!BEE_HAVE_CUDA) {
    check_absent("this build has no CUDA backend");
    return;
  }
  if (!trn_cuda_available())
    FAIL("the build's CUDA module did not load: %s", trn__cuda_missing());
  ASSERT_GE(trn_cudnn_version(), 90000);
}

static void run(const char *name, void (*fn)(const char *), const char *arg) {
  printf("%s\n", name);
  fflush(stdout);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    fn(arg);
    fflush(stdout);
    _exit(0);
  }
  int st = 0;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
    FAIL("case %s failed (status %d)", name, st);
}

static void none(const char *a) { case_none(); }
static void garbage(const char *a) { case_garbage(); }
static void build_tree(const char *a) { case_build_tree(); }

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s FAKE OTHER-LAYOUT NO-ENTRY\n", argv[0]);
    return 2;
  }
  run("no module", none, NULL);
  run("not a library", garbage, NULL);
  run("no entry", case_no_entry, argv[3]);
  run("another layout", case_other_layout, argv[2]);
  run("the fake module", case_fake, argv[1]);
  run("the build tree's", build_tree, NULL);
  printf("ok\n");
  return 0;
}
