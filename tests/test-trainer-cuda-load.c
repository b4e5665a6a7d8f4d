/* test-trainer-cuda-load.c: finding and opening the CUDA module
 * (trainer/cuda-load.c), without a GPU.
 *
 * Each case runs in a child of its own, since a process looks for the
 * module once: no module, a file that is not a library, a library
 * without the entry, a module of another layout (each: no backend, the
 * reason said, auto on the CPU, cuda:0 refused with it), the fake
 * module (tests/cuda-fake-module.c: its device seen, calls forwarded
 * both ways, each of the table's functions reached through its own
 * forwarder), and the build tree's own module where the build has one.
 * argv: the fake module built working, of another layout, without the
 * entry. */
#include "test.h"

#include "cuda-abi.h"

#include "bee-config.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
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

/* As tests/cuda-fake-module.c notes them. */
typedef struct fake_seen {
  int fn;
  uintptr_t a, b;
} fake_seen;

static const fake_seen *seen;

/* The call just made reached the module's function number fn (its place
 * in trn__cuda_api), with the arguments that give a and b there. */
static void saw(int line, int fn, uintptr_t a, uintptr_t b) {
  if (seen->fn != fn || seen->a != a || seen->b != b)
    FAIL("line %d: the module saw function %d (%#jx, %#jx), not %d "
         "(%#jx, %#jx)",
         line, seen->fn, (uintmax_t)seen->a, (uintmax_t)seen->b, fn,
         (uintmax_t)a, (uintmax_t)b);
}
#define SAW(fn, a, b) saw(__LINE__, fn, (uintptr_t)(a), (uintptr_t)(b))

/* Every function of the table, called through its forwarder: each
 * reaches its own, arguments and result carried both ways. */
static void check_forwarding(const char *module) {
  void *h = dlopen(module, RTLD_NOW | RTLD_NOLOAD);
  ASSERT(h != NULL);
  seen = dlsym(h, "trn__fake_seen");
  ASSERT(seen != NULL);
  trn__gpu *g = (trn__gpu *)(uintptr_t)0x5000;
  trn__dbuf *db = (trn__dbuf *)(uintptr_t)0x6000;
  float buf[8], x[4];
  char why[64];
  int n = 0;
  ASSERT_EQ(trn__cuda_count(&n, why, sizeof why), 0);
  SAW(1, &n, sizeof why);
  trn_device d;
  ASSERT_EQ(trn__cuda_props(0, &d), 0);
  SAW(2, 0, &d);
  ASSERT_EQ(trn__cuda_bind(3), 0);
  SAW(3, 3, 0);
  void *p = NULL;
  ASSERT_EQ(trn__cuda_host_alloc(4096, &p), -ENOMEM);
  SAW(4, 4096, &p);
  trn__cuda_host_free(buf);
  SAW(5, buf, 0);
  trn__bn bn;
  ASSERT_EQ(trn__cuda_bn_run(2, &bn, 5, x, x, x, buf, buf, buf, buf, x, buf,
                             true, buf, buf + 1),
            -107);
  SAW(7, 7, buf + 1);
  char err[64];
  ASSERT_EQ(trn__gpu_new(1, NULL, 0, 10, 0, 1, TRN_FP32, &g, err, sizeof err),
            -ENOMEM);
  SAW(8, 11, sizeof err);
  trn_model_config mc;
  g = (trn__gpu *)(uintptr_t)0x5000;
  ASSERT_EQ(trn__gpu_new_gpt(4, &mc, 99, TRN_FP32, &g, err, sizeof err), -109);
  ASSERT(g == NULL && strcmp(err, "fake: gpt") == 0);
  SAW(9, 103, &mc);
  g = (trn__gpu *)(uintptr_t)0x5000;
  trn__gpu_free(g);
  SAW(10, g, 0);
  ASSERT_UEQ(trn__gpu_bytes(g), 1011);
  SAW(11, g, 0);
  ASSERT_EQ(trn__gpu_put(g, 2, buf), -112);
  SAW(12, g, buf + 2);
  ASSERT_EQ(trn__gpu_get(g, 3, buf), -113);
  SAW(13, g, buf + 3);
  ASSERT_EQ(trn__gpu_zero_grads(g), -114);
  SAW(14, g, 0);
  uint32_t arg[2];
  ASSERT_EQ(trn__gpu_layer_out(g, 5, 6, buf, arg), -115);
  SAW(15, g, (uintptr_t)arg + 11);
  int32_t y[2];
  uint64_t calls = 0;
  double loss = 0;
  size_t correct = 0;
  ASSERT_EQ(trn__gpu_pass(g, x, y, 7, true, 40, &calls, buf, &loss, &correct),
            -116);
  SAW(16, g, (uintptr_t)&correct + 47);
  ASSERT_EQ(trn__gpu_set_scale(g, 256.0f, err, sizeof err), -117);
  SAW(17, g, 1024 + sizeof err);
  ASSERT(trn__gpu_overflow(g));
  SAW(18, g, 0);
  ASSERT_EQ(trn__gpu_tokens(g, y, y, 3, 5, false, &loss, &correct), -119);
  SAW(19, g, (uintptr_t)&correct + 15);
  size_t nl = 0;
  ASSERT_EQ(trn__gpu_logits(g, buf, &nl), -120);
  ASSERT_UEQ(nl, 20);
  SAW(20, g, buf);
  trn__step st;
  ASSERT_EQ(trn__gpu_step(g, buf, &st), -121);
  SAW(21, g, &st);
  ASSERT_EQ(trn__gpu_index(g), 22);
  SAW(22, g, 0);
  ASSERT_EQ(trn__dbuf_put(db, 1, buf, 4), -123);
  SAW(23, db, (uintptr_t)buf + 5);
  ASSERT_EQ(trn__dbuf_get(db, buf), -124);
  SAW(24, db, buf);
  trn__dbuf_free(db);
  SAW(25, db, 0);
  dlclose(h);
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
  check_forwarding(module);
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
