/* test-proto-meter.c: the rate data reaches us at on a connection, from
 * the times of its reads (proto/meter.c), on a fake clock (the WAN lab's
 * tests/test-net-links.sh measures live links with it).
 *
 * A flight's rate is its bytes after the first read over the time to the
 * last; a pause over the gap ends a flight; a flight of too few bytes
 * counts for nothing; the best since the last take is what a take gives,
 * and the next starts from nothing; what waited in the kernel when a
 * flight began (a busy loop reading it late, in a burst) is passed over,
 * so that a burst never reads as a fast link.  A meter fed by several
 * connections (a peer's stripes) counts them together, and passes over
 * each one's first read in a flight and its backlog.
 */
#include "proto-int.h"
#include "test.h"

#include <math.h>
#include <string.h>

#define MS 1000000ull
#define GAP (20 * MS)

static void add(proto__flight *f, uint64_t t, size_t bytes, uint64_t backlog) {
  proto__flight_add(f, t, bytes, GAP, backlog, false);
}

int main(void) {
  proto__flight f;
  memset(&f, 0, sizeof f);
  ASSERT(proto__flight_take(&f, 0, GAP) == 0);
  /* A slow link's flight: 64 KiB every 8 ms, 9 reads: 512 KiB in 64 ms
   * after the first; then a pause (the window's wait), a shorter flight
   * of 5 reads, and a take. */
  for (uint64_t i = 0; i < 9; i++)
    add(&f, (100 + 8 * i) * MS, 64u << 10, 0);
  for (uint64_t i = 0; i < 5; i++)
    add(&f, (300 + 8 * i) * MS, 64u << 10, 0);
  double want = (512.0 * 1024) / 0.064;
  ASSERT(fabs(proto__flight_take(&f, 400 * MS, GAP) - want) < 1e-6 * want);
  ASSERT(proto__flight_take(&f, 401 * MS, GAP) == 0); /* taken: none since */
  /* A flight under way is not taken until it pauses. */
  for (uint64_t i = 0; i < 9; i++)
    add(&f, (500 + 8 * i) * MS, 64u << 10, 0);
  ASSERT(proto__flight_take(&f, 565 * MS, GAP) == 0);
  ASSERT(fabs(proto__flight_take(&f, 600 * MS, GAP) - want) < 1e-6 * want);
  /* A loop busy for 300 ms reads 4 MiB that waited in the kernel in a
   * burst, then the link goes on at 512 KiB per 64 ms: the burst is
   * passed over, the figure is the link's. */
  ASSERT(proto__flight_starts(&f, 1000 * MS, GAP));
  add(&f, 1000 * MS, 64u << 10, 4u << 20);
  ASSERT(!proto__flight_starts(&f, 1000 * MS + 1, GAP));
  for (int i = 0; i < 64; i++)
    add(&f, 1000 * MS + 1000 * (uint64_t)(i + 1), 64u << 10, 0);
  for (uint64_t i = 1; i <= 8; i++)
    add(&f, 1000 * MS + 8 * i * MS, 64u << 10, 0);
  want = (512.0 * 1024) / 0.064;
  ASSERT(fabs(proto__flight_take(&f, 2000 * MS, GAP) - want) < 1e-6 * want);
  /* Without the backlog passed over, that burst would have read as
   * 4.5 MiB in 64 ms: the meter's reason to ask the kernel. */
  /* Too few bytes after the first read: nothing. */
  add(&f, 3000 * MS, 8u << 20, 0);
  add(&f, 3001 * MS, 128u << 10, 0);
  ASSERT(proto__flight_take(&f, 4000 * MS, GAP) == 0);
  /* A clock that went back ends the flight before. */
  add(&f, 5000 * MS, 1, 0);
  add(&f, 5010 * MS, 1u << 20, 0);
  add(&f, 4000 * MS, 1u << 20, 0);
  want = (1u << 20) / 0.010;
  ASSERT(fabs(proto__flight_take(&f, 6000 * MS, GAP) - want) < 1e-6 * want);

  /* One meter fed by three connections to a peer (stripes paced at a
   * third of the link each): together they show the link, where each
   * one's own meter shows its share.  Each sends 64 KiB every 12 ms,
   * the three offset by 4 ms: the link delivers 64 KiB every 4 ms. */
  proto__flight own[3];
  memset(own, 0, sizeof own);
  memset(&f, 0, sizeof f);
  for (uint64_t i = 0; i < 24; i++) {
    uint64_t t = 7000 * MS + 4 * i * MS;
    size_t s = i % 3;
    proto__flight_add(&own[s], t, 64u << 10, GAP, 0, false);
    proto__flight_add(&f, t, 64u << 10, GAP, 0, i < 3);
  }
  /* Passed over: the first read of each (3 x 64 KiB); counted: 21 reads
   * from the first at 7000 ms to the last at 7092 ms. */
  want = (21.0 * 65536) / 0.092;
  ASSERT(fabs(proto__flight_take(&f, 8000 * MS, GAP) - want) < 1e-6 * want);
  double share = (7.0 * 65536) / 0.084; /* 8 reads, 12 ms apart */
  for (int s = 0; s < 3; s++)
    ASSERT(fabs(proto__flight_take(&own[s], 8000 * MS, GAP) - share) <
           1e-6 * share);
  /* A connection that joins a flight with 4 MiB waiting in its socket
   * (read late by a busy loop): its first read and that backlog are
   * passed over, so the burst adds nothing. */
  proto__flight_add(&f, 9000 * MS, 64u << 10, GAP, 0, false);
  for (uint64_t i = 1; i <= 8; i++)
    proto__flight_add(&f, 9000 * MS + 8 * i * MS, 64u << 10, GAP, 0, false);
  proto__flight_add(&f, 9064 * MS + 1000, 64u << 10, GAP, 4u << 20, true);
  for (int i = 0; i < 64; i++)
    proto__flight_add(&f, 9064 * MS + 2000 + 1000 * (uint64_t)i, 64u << 10, GAP,
                      0, false);
  want = (512.0 * 1024) / (0.064 + 65e-6);
  ASSERT(fabs(proto__flight_take(&f, 10000 * MS, GAP) - want) < 1e-6 * want);
  return 0;
}
