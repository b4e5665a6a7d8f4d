/* fuzz-config.c: libFuzzer target for beed's config file parser.
 *
 * The input is the file's content, handed over through an anonymous
 * memory file so the parser reads it exactly as it reads a real one.  The
 * parser must accept or refuse with a message, never crash or leak, and
 * whatever it accepts must then pass or fail bee_config_check cleanly.
 */
#define _GNU_SOURCE /* memfd_create */
#include "bee.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char path[64], err[512];
  int fd = memfd_create("beed-config", 0);
  if (fd < 0)
    abort();
  if (size && write(fd, data, size) != (ssize_t)size)
    abort();
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  bee_config cfg;
  bee_config_init(&cfg);
  err[0] = 0;
  int rc = bee_config_load_file(&cfg, path, err, sizeof err);
  if (rc != 0 && err[0] == 0)
    abort(); /* a refusal always says why */
  if (rc == 0)
    bee_config_check(&cfg, err, sizeof err);
  close(fd);
  return 0;
}
