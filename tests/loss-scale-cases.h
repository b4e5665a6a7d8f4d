/* loss-scale-cases.h: the loss-scale specs beed's --loss-scale (config.c)
 * and the trainer's trn_loss_scale_parse must take and refuse alike
 * (test-daemon-config and test-trainer-scale include it). */
#ifndef BEE_TEST_LOSS_SCALE_CASES_H
#define BEE_TEST_LOSS_SCALE_CASES_H

#include <stdbool.h>

static const struct {
  const char *spec;
  bool fixed;
  float scale; /* 0: auto */
} loss_scale_good[] = {{"auto", false, 0},
                       {"dynamic", false, 32768},
                       {"dynamic:2^127", false, 0x1p127f},
                       {"dynamic:1024", false, 1024},
                       {"2^-24", true, 0x1p-24f},
                       {"2^0", true, 1},
                       {"1", true, 1},
                       {"2147483648", true, 0x1p31f}};

static const char *const loss_scale_bad[] = {
    "3",    "0",        "2^128",     "2^-25",    "-2",    "2^",         "2^+3",
    "2^1x", "dynamic:", "dynamic:3", "dynamicx", "fixed", "4294967296", "1e3",
    "",     "2^07",     "01",        "auto:2",   "2^-",   " 2^3",       "2^3 "};

#endif
