/* test-proto-log.c: lines that come in bursts (bee_log_burst_at), on a
 * fake clock.
 *
 * The first of a kind (the same text) is logged; the same text again
 * within BEE_LOG_BURST_MS only counted; the first after that logged with
 * the count and the seconds since; other texts logged on their own; a
 * ninth kind takes the place of the one logged longest ago.
 */
#include "proto.h"
#include "test.h"

#include <string.h>

static bee_log_burst b;
static char more[64];

static bool at(const char *line, uint64_t ms) {
  return bee_log_burst_at(&b, line, ms, more, sizeof more);
}

int main(void) {
  const char *x = "127.0.0.1:45555: closed during the handshake (eof)";
  ASSERT(at(x, 1000) && more[0] == 0);
  for (int i = 0; i < 37; i++)
    ASSERT(!at(x, 1000 + 1000 * (uint64_t)i));
  /* Another line of the same place is its own kind. */
  ASSERT(at("10.0.0.9:45555: closed during the handshake (eof)", 2000));
  ASSERT(more[0] == 0);
  ASSERT(!at(x, 1000 + BEE_LOG_BURST_MS - 1));
  ASSERT(at(x, 1000 + BEE_LOG_BURST_MS));
  ASSERT(strcmp(more, " (38 more in the last 60 s)") == 0);
  /* Quiet since: logged plain. */
  ASSERT(at(x, 1000 + 3 * BEE_LOG_BURST_MS) && more[0] == 0);

  /* Eight kinds fit; a ninth evicts the one logged longest ago, which
   * is then new again. */
  memset(&b, 0, sizeof b);
  char k[BEE_LOG_BURST_KINDS + 1][16];
  for (int i = 0; i <= BEE_LOG_BURST_KINDS; i++)
    snprintf(k[i], sizeof k[i], "kind %d", i);
  for (int i = 0; i < BEE_LOG_BURST_KINDS; i++)
    ASSERT(at(k[i], 100 + (uint64_t)i));
  for (int i = 0; i < BEE_LOG_BURST_KINDS; i++)
    ASSERT(!at(k[i], 200));
  ASSERT(at(k[BEE_LOG_BURST_KINDS], 300)); /* takes kind 0's place */
  ASSERT(at(k[0], 301));                   /* so kind 0 is new, and takes 1's */
  ASSERT(!at(k[2], 302));
  ASSERT(!at(k[BEE_LOG_BURST_KINDS], 303));
  printf("log bursts: counted, told with the next line, eight kinds a "
         "place\n");
  return 0;
}
