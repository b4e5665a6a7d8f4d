/* test-daemon-links.c: a bee's table of its links (daemon/links.c) on
 * fake clocks.
 *
 * A link's figure is the best of its last BEE_LINK_RATES rates, so a
 * round paced by a slower member does not lower it and a link that got
 * slower shows after that many; a peer's connections at one tick count
 * as one figure; a probe is due once per BEE_LINK_PROBE_MS for a peer
 * without a rate; the record's
 * entries come most recent first, without stale or empty ones; a full
 * table gives up its least recently measured peer.
 */
#include "bee.h"
#include "test.h"

#include <math.h>
#include <string.h>

static bee_links L;

static const uint8_t *id(int k) {
  static uint8_t ids[BEE_LINKS_MAX + 8][PROTO_ID_BYTES];
  memset(ids[k], k + 1, PROTO_ID_BYTES);
  return ids[k];
}

static void test_rates(void) {
  memset(&L, 0, sizeof L);
  ASSERT(bee_links_mbit(&L, id(0)) == 0);
  bee_links_rate(&L, id(0), 80, 1000);
  bee_links_rate(&L, id(0), 30, 2000); /* a round a slower peer paced */
  ASSERT(bee_links_mbit(&L, id(0)) == 80);
  bee_links_rate(&L, id(0), NAN, 2100);
  bee_links_rate(&L, id(0), -5, 2100);
  bee_links_rate(&L, id(0), INFINITY, 2100);
  ASSERT(bee_links_mbit(&L, id(0)) == 80);
  /* The link got slower: BEE_LINK_RATES rounds later it shows. */
  for (int i = 0; i < BEE_LINK_RATES; i++) {
    ASSERT(bee_links_mbit(&L, id(0)) == (i < BEE_LINK_RATES - 1 ? 80 : 30));
    bee_links_rate(&L, id(0), 20, 3000 + (uint64_t)i);
  }
  ASSERT(bee_links_mbit(&L, id(0)) == 20);
  ASSERT(bee_links_mbit(&L, id(1)) == 0);
}

/* A peer's several connections at one tick count as one figure: the
 * least round trip, the best rate. */
static void test_tick(void) {
  memset(&L, 0, sizeof L);
  bee_links_rate(&L, id(0), 40, 1000);
  bee_links_rate(&L, id(0), 90, 1000); /* its stripe, the same tick */
  bee_links_rate(&L, id(0), 60, 1000);
  bee_links_rtt(&L, id(0), 120000, 1000);
  bee_links_rtt(&L, id(0), 103000, 1000);
  bee_links_rtt(&L, id(0), 110000, 1000);
  ASSERT(bee_links_mbit(&L, id(0)) == 90);
  ASSERT_UEQ(L.v[0].nrates, 1);
  ASSERT_UEQ(L.v[0].rtt_us, 103000);
  /* The next tick: a figure of its own, and the round trip as its
   * connection says (a new path may be longer). */
  bee_links_rate(&L, id(0), 50, 2000);
  bee_links_rtt(&L, id(0), 130000, 2000);
  ASSERT_UEQ(L.v[0].nrates, 2);
  ASSERT(bee_links_mbit(&L, id(0)) == 90);
  ASSERT_UEQ(L.v[0].rtt_us, 130000);
}

static void test_probe(void) {
  memset(&L, 0, sizeof L);
  ASSERT(bee_links_probe_due(&L, id(0), 5000));
  ASSERT(!bee_links_probe_due(&L, id(0), 5001));
  ASSERT(!bee_links_probe_due(&L, id(0), 5000 + BEE_LINK_PROBE_MS - 1));
  ASSERT(bee_links_probe_due(&L, id(0), 5000 + BEE_LINK_PROBE_MS));
  /* A peer with a rate is never probed. */
  bee_links_rate(&L, id(1), 5, 1);
  ASSERT(!bee_links_probe_due(&L, id(1), 10 * BEE_LINK_PROBE_MS));
}

static void test_list(void) {
  memset(&L, 0, sizeof L);
  proto_link out[PROTO_LINKS_MAX];
  ASSERT_UEQ(bee_links_list(&L, 1000, out, PROTO_LINKS_MAX), 0);
  bee_links_rtt(&L, id(0), 103000, 1000);
  bee_links_rate(&L, id(1), 60, 3000);
  bee_links_rtt(&L, id(1), 280000, 3000);
  bee_links_probe_due(&L, id(2), 3500); /* probed, nothing measured */
  bee_links_rate(&L, id(3), 9, 500);    /* stale by the time of the list */
  bee_links_rtt(&L, id(4), 0, 3000);    /* no figure: no entry */
  bee_links_rtt(&L, id(4), PROTO_LINK_RTT_MAX_US + 1, 3000);
  uint64_t now = 500 + BEE_LINK_STALE_MS + 1;
  bee_links_rtt(&L, id(0), 103000, now - 2500);
  size_t n = bee_links_list(&L, now, out, PROTO_LINKS_MAX);
  ASSERT_UEQ(n, 2);
  ASSERT_MEMEQ(out[0].id, id(0), PROTO_ID_BYTES);
  ASSERT_UEQ(out[0].rtt_us, 103000);
  ASSERT(out[0].mbit == 0);
  ASSERT_UEQ(out[0].age_s, 2);
  ASSERT_MEMEQ(out[1].id, id(1), PROTO_ID_BYTES);
  ASSERT_UEQ(out[1].rtt_us, 280000);
  ASSERT(out[1].mbit == 60);
  ASSERT_UEQ(bee_links_list(&L, now, out, 1), 1);
  /* The entries make a record that encodes. */
  proto_links rec = {.time_ms = 1, .n = n};
  strcpy(rec.run, "lab");
  memcpy(rec.links, out, n * sizeof *out);
  n = bee_links_list(&L, now, rec.links, PROTO_LINKS_MAX);
  uint8_t buf[PROTO_LINKS_RECORD_MAX];
  size_t len;
  ASSERT_OK(proto_links_encode(&rec, buf, sizeof buf, &len));
}

static void test_full(void) {
  memset(&L, 0, sizeof L);
  for (int k = 0; k < BEE_LINKS_MAX; k++)
    bee_links_rate(&L, id(k), 10 + k, 100 + (uint64_t)k);
  bee_links_rate(&L, id(0), 10, 1000); /* measured again: recent */
  /* One more peer: the least recently measured (1) gives way. */
  bee_links_rate(&L, id(BEE_LINKS_MAX), 99, 1001);
  ASSERT(bee_links_mbit(&L, id(BEE_LINKS_MAX)) == 99);
  ASSERT(bee_links_mbit(&L, id(1)) == 0);
  ASSERT(bee_links_mbit(&L, id(0)) == 10);
  ASSERT(bee_links_mbit(&L, id(2)) == 12);
  proto_link out[PROTO_LINKS_MAX];
  ASSERT_UEQ(bee_links_list(&L, 2000, out, PROTO_LINKS_MAX), BEE_LINKS_MAX);
  ASSERT_MEMEQ(out[0].id, id(BEE_LINKS_MAX), PROTO_ID_BYTES);
  ASSERT_MEMEQ(out[1].id, id(0), PROTO_ID_BYTES);
}

int main(void) {
  test_rates();
  test_tick();
  test_probe();
  test_list();
  test_full();
  return 0;
}
