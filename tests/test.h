/* test.h: the tiny assertion kit every test program uses.
 *
 * Each test is its own program (one meson test() each).  A failed
 * assertion prints the file, line, expression and both sides, then exits
 * 1.  A test that cannot run here (no GPU, no namespaces) exits 77, which
 * meson counts as skipped.
 */
#ifndef BEE_TEST_H
#define BEE_TEST_H

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TEST_SKIP 77

/* True in AddressSanitizer builds, where memory figures (RSS) include the
 * sanitizer's redzones and quarantine and say little about our code. */
#if defined(__SANITIZE_ADDRESS__)
#define TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TEST_ASAN 1
#endif
#endif
#ifndef TEST_ASAN
#define TEST_ASAN 0
#endif

#define FAIL(...)                                                              \
  do {                                                                         \
    fprintf(stderr, "%s:%d: ", __FILE__, __LINE__);                            \
    fprintf(stderr, __VA_ARGS__);                                              \
    fputc('\n', stderr);                                                       \
    exit(1);                                                                   \
  } while (0)

#define ASSERT(x)                                                              \
  do {                                                                         \
    if (!(x))                                                                  \
      FAIL("assertion failed: %s", #x);                                        \
  } while (0)

#define ASSERT_CMP_(a, op, b, T, fmt)                                          \
  do {                                                                         \
    T a_ = (a), b_ = (b);                                                      \
    if (!(a_ op b_))                                                           \
      FAIL("%s %s %s: %" fmt " vs %" fmt, #a, #op, #b, a_, b_);                \
  } while (0)

#define ASSERT_EQ(a, b) ASSERT_CMP_(a, ==, b, int64_t, PRId64)
#define ASSERT_NE(a, b) ASSERT_CMP_(a, !=, b, int64_t, PRId64)
#define ASSERT_LT(a, b) ASSERT_CMP_(a, <, b, int64_t, PRId64)
#define ASSERT_LE(a, b) ASSERT_CMP_(a, <=, b, int64_t, PRId64)
#define ASSERT_GT(a, b) ASSERT_CMP_(a, >, b, int64_t, PRId64)
#define ASSERT_GE(a, b) ASSERT_CMP_(a, >=, b, int64_t, PRId64)
#define ASSERT_UEQ(a, b) ASSERT_CMP_(a, ==, b, uint64_t, PRIu64)

/* Compares a return code, printing both codes by name. */
#define ASSERT_RC(a, b)                                                        \
  do {                                                                         \
    int a_ = (a), b_ = (b);                                                    \
    if (a_ != b_)                                                              \
      FAIL("%s == %s: %d (%s) vs %d (%s)", #a, #b, a_, bee_errname(a_), b_,    \
           bee_errname(b_));                                                   \
  } while (0)
#define ASSERT_OK(a) ASSERT_RC(a, 0)

/* ASSERT_RC with a printf-style context for table-driven checks. */
#define ASSERT_CODE(rc, want, ...)                                             \
  do {                                                                         \
    int rc_ = (rc), want_ = (want);                                            \
    if (rc_ != want_) {                                                        \
      char ctx_[256];                                                          \
      snprintf(ctx_, sizeof ctx_, __VA_ARGS__);                                \
      FAIL("%s: %s, want %s", ctx_, bee_errname(rc_), bee_errname(want_));     \
    }                                                                          \
  } while (0)

#define ASSERT_STREQ(a, b)                                                     \
  do {                                                                         \
    const char *a_ = (a), *b_ = (b);                                           \
    if (strcmp(a_, b_) != 0)                                                   \
      FAIL("%s == %s: \"%s\" vs \"%s\"", #a, #b, a_, b_);                      \
  } while (0)

#define ASSERT_MEMEQ(a, b, n)                                                  \
  do {                                                                         \
    if (memcmp((a), (b), (n)) != 0)                                            \
      FAIL("%s and %s differ in their first %zu bytes", #a, #b, (size_t)(n));  \
  } while (0)

/* An encoder's refusal writes nothing: call (which writes into buf, n
 * bytes, and its length into len) must return want and leave buf as junk
 * (n bytes) made it and len at 777. */
#define ASSERT_REFUSES(call, want, buf, junk, n, len)                          \
  do {                                                                         \
    memcpy((buf), (junk), (n));                                                \
    (len) = 777;                                                               \
    ASSERT_RC(call, want);                                                     \
    ASSERT_MEMEQ((buf), (junk), (n));                                          \
    ASSERT_UEQ((len), 777);                                                    \
  } while (0)

#endif /* BEE_TEST_H */
