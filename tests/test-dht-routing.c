/* test-dht-routing.c: the routing table's answers against brute force.
 *
 * The table finds the bucket for an id by binary search and the closest
 * contacts by walking the bucket trie nearest side first; both must agree
 * exactly with a plain scan.  Tables are filled with random ids (and with
 * ids crowded near our own, which makes the tree deep on one side), and
 * every answer is checked for many random targets and for every count
 * from 1 to k + 1.
 */
#include "dht-int.h"
#include "test.h"

#include <sodium.h>

/* Byte by byte, as the distance is defined. */
static int ref_cmp(const uint8_t *t, const uint8_t *a, const uint8_t *b) {
  for (size_t i = 0; i < ID_BYTES; i++) {
    uint8_t da = a[i] ^ t[i], db = b[i] ^ t[i];
    if (da != db)
      return da < db ? -1 : 1;
  }
  return 0;
}

static int sign(int v) { return (v > 0) - (v < 0); }

static void test_cmp(void) {
  uint8_t t[ID_BYTES], a[ID_BYTES], b[ID_BYTES];
  for (int i = 0; i < 20000; i++) {
    randombytes_buf(t, sizeof t);
    randombytes_buf(a, sizeof a);
    memcpy(b, a, sizeof b);
    /* Differ in one random byte (often none), so every word is reached. */
    if (i % 4)
      b[randombytes_uniform(ID_BYTES)] ^= (uint8_t)(1 + randombytes_uniform(255));
    ASSERT_EQ(sign(dht__cmp_dist(t, a, b)), ref_cmp(t, a, b));
    ASSERT_EQ(sign(dht__cmp_dist(t, b, a)), ref_cmp(t, b, a));
  }
}

static bool in_bucket(const dht_bucket *b, const uint8_t *id) {
  for (unsigned i = 0; i < b->depth; i++) {
    unsigned byte = i / 8, sh = 7 - i % 8;
    if ((b->lo[byte] >> sh & 1) != (id[byte] >> sh & 1))
      return false;
  }
  return true;
}

static const dht_contact *all[4096];

static void check_table(const dht_table *t, int targets) {
  size_t n = 0;
  for (size_t i = 0; i < t->nb; i++)
    for (size_t j = 0; j < t->b[i]->n; j++)
      all[n++] = &t->b[i]->c[j];
  ASSERT_EQ(n, t->ncontacts);
  /* Every contact's bucket is the one bucket_for names. */
  for (size_t i = 0; i < n; i++)
    ASSERT(in_bucket(dht__bucket_for(t, all[i]->id), all[i]->id));
  const dht_contact *got[DHT_K + 1];
  for (int r = 0; r < targets; r++) {
    uint8_t target[ID_BYTES];
    randombytes_buf(target, sizeof target);
    if (r % 3 == 0 && n) /* sometimes a known id, or one next to it */
      memcpy(target, all[randombytes_uniform((uint32_t)n)]->id, ID_BYTES);
    if (r % 6 == 0)
      target[ID_BYTES - 1] ^= 1;
    ASSERT(in_bucket(dht__bucket_for(t, target), target));
    for (size_t max = 1; max <= DHT_K + 1; max++) {
      size_t k = dht__table_closest(t, target, got, max);
      ASSERT_EQ(k, n < max ? n : max);
      for (size_t i = 1; i < k; i++)
        ASSERT_LT(ref_cmp(target, got[i - 1]->id, got[i]->id), 0);
      /* Nothing left out is nearer than the farthest returned. */
      for (size_t i = 0; k == max && i < n; i++) {
        bool taken = false;
        for (size_t j = 0; j < k; j++)
          taken |= got[j] == all[i];
        if (!taken)
          ASSERT_GT(ref_cmp(target, all[i]->id, got[k - 1]->id), 0);
      }
    }
  }
}

static void fill(dht_table *t, size_t ids, unsigned near_bits) {
  char addr[32];
  for (size_t i = 0; i < ids; i++) {
    uint8_t id[ID_BYTES];
    randombytes_buf(id, sizeof id);
    /* A share of the ids shares a prefix with ours: a deep tree. */
    unsigned keep = i % 2 ? (unsigned)randombytes_uniform(near_bits + 1) : 0;
    for (unsigned b = 0; b < keep; b++) {
      uint8_t m = (uint8_t)(0x80 >> (b % 8));
      id[b / 8] = (uint8_t)((id[b / 8] & ~m) | (t->self[b / 8] & m));
    }
    snprintf(addr, sizeof addr, "10.0.%zu.%zu:1", i / 250, i % 250);
    dht_bucket *evict;
    dht__table_seen(t, id, addr, 1000 + i, &evict);
  }
}

/* A peer's clock is judged by its answers only, against the time between
 * our request and the answer (whole seconds, one of slack each way). */
static void test_clock_skew(void) {
  ASSERT_UEQ(dht__clock_skew(100, 100, 50), 0);
  ASSERT_UEQ(dht__clock_skew(99, 100, 50), 0);  /* a second boundary */
  ASSERT_UEQ(dht__clock_skew(101, 100, 50), 0);
  ASSERT_UEQ(dht__clock_skew(110, 100, 10), 9); /* ahead */
  ASSERT_UEQ(dht__clock_skew(40, 100, 100), 58); /* behind */
  /* An answer that took 5 s may carry a reading 5 s old. */
  ASSERT_UEQ(dht__clock_skew(95, 100, 5000), 0);
  ASSERT_UEQ(dht__clock_skew(90, 100, 5000), 4);
  /* A clock near its zero (a simulation's) or a wait longer than it:
   * the window stops at 0 rather than wrapping round. */
  ASSERT_UEQ(dht__clock_skew(0, 3, 10000), 0);
  ASSERT_UEQ(dht__clock_skew(5, 3, 10000), 1);
}

int main(void) {
  ASSERT(sodium_init() >= 0);
  test_cmp();
  test_clock_skew();
  static const unsigned near[] = {0, 16, 40, 159};
  static const size_t sizes[] = {0, 1, 5, 30, 400, 3000};
  for (size_t a = 0; a < sizeof near / sizeof *near; a++)
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
      dht_table t;
      uint8_t self[ID_BYTES];
      randombytes_buf(self, sizeof self);
      dht__table_init(&t, self);
      fill(&t, sizes[s], near[a]);
      ASSERT_LE(t.ncontacts, sizeof all / sizeof *all);
      check_table(&t, 200);
      dht__table_close(&t);
    }
  printf("dht routing: all checks passed\n");
  return 0;
}
