/* routing.c: the routing table and the blacklist.
 *
 * Buckets partition the 160-bit id space as the leaves of a binary trie,
 * kept in an array sorted by range.  A full bucket splits when its range
 * holds our own id, or when its depth is not a multiple of DHT_DEPTH_B
 * (Kademlia 4.2: this keeps more contacts in ranges far from us, which
 * makes lookups in unbalanced trees converge in fewer rounds).  Otherwise
 * the newcomer waits in the bucket's replacement list while the least
 * recently seen contact is pinged; a contact that fails twice in a row
 * (or once, when a replacement waits) gives its place to the newest
 * replacement.  Only authenticated peers enter: contacts that answered us
 * or sent us a request, never names heard from third parties.  A contact
 * dropped for silence is kept in a short list of lost contacts whose
 * addresses the node tries again for an hour (node.c, lost_tick).
 */
#include "dht-int.h"

#include <stdlib.h>
#include <string.h>

static bool bit(const uint8_t *id, unsigned i) {
  return id[i / 8] >> (7 - i % 8) & 1;
}

static uint64_t be64(const uint8_t *p) {
  uint64_t v;
  memcpy(&v, p, sizeof v);
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  v = __builtin_bswap64(v);
#endif
  return v;
}

/* Two ids equal?  Random ids differ in their first word almost always. */
static bool id_eq(const uint8_t a[ID_BYTES], const uint8_t b[ID_BYTES]) {
  uint64_t x, y;
  memcpy(&x, a, sizeof x);
  memcpy(&y, b, sizeof y);
  return x == y && memcmp(a + 8, b + 8, ID_BYTES - 8) == 0;
}

static void set_addr(dht_contact *c, const char *addr) {
  c->addr = dht__strdup(addr);
  c->addr_n = (uint16_t)strlen(addr);
}

/* Does id fall in b's range (share lo's first depth bits)? */
static bool in_range(const dht_bucket *b, const uint8_t id[ID_BYTES]) {
  unsigned full = b->depth / 8, rest = b->depth % 8;
  if (memcmp(b->lo, id, full) != 0)
    return false;
  if (!rest)
    return true;
  uint8_t mask = (uint8_t)(0xff << (8 - rest));
  return (b->lo[full] & mask) == (id[full] & mask);
}

void dht__table_init(dht_table *t, const uint8_t self[ID_BYTES]) {
  memset(t, 0, sizeof *t);
  memcpy(t->self, self, ID_BYTES);
  t->b = calloc(1, sizeof *t->b);
  t->lo64 = calloc(1, sizeof *t->lo64);
  if (!t->b || !t->lo64 || !(t->b[0] = calloc(1, sizeof **t->b)))
    abort(); /* small internal allocation */
  t->nb = 1;
}

static void contact_free(dht_contact *c) {
  free(c->addr);
  c->addr = NULL;
}

void dht__table_close(dht_table *t) {
  for (size_t i = 0; i < t->nb; i++) {
    for (size_t j = 0; j < t->b[i]->n; j++)
      contact_free(&t->b[i]->c[j]);
    for (size_t j = 0; j < t->b[i]->nrep; j++)
      contact_free(&t->b[i]->rep[j]);
    free(t->b[i]);
  }
  for (size_t i = 0; i < t->nlost; i++)
    free(t->lost[i].addr);
  free(t->b);
  free(t->lo64);
  memset(t, 0, sizeof *t);
}

/* ---- lost contacts ------------------------------------------------------ */

void dht__lost_remove(dht_table *t, size_t i) {
  free(t->lost[i].addr);
  memmove(&t->lost[i], &t->lost[i + 1], (t->nlost - i - 1) * sizeof *t->lost);
  t->nlost--;
}

void dht__lost_drop(dht_table *t, const uint8_t *id, const char *addr) {
  for (size_t i = t->nlost; i-- > 0;)
    if (addr ? strcmp(t->lost[i].addr, addr) == 0
             : memcmp(t->lost[i].id, id, ID_BYTES) == 0)
      dht__lost_remove(t, i);
}

/* c leaves the table for silence: remember where it was. */
static void lost_add(dht_table *t, const dht_contact *c, uint64_t now) {
  char *addr = dht__strdup(c->addr);
  dht__lost_drop(t, c->id, NULL);
  dht__lost_drop(t, NULL, c->addr);
  if (t->nlost == DHT_LOST_MAX)
    dht__lost_remove(t, 0);
  dht_lost *l = &t->lost[t->nlost++];
  memcpy(l->id, c->id, ID_BYTES);
  l->addr = addr;
  l->lost_ms = now;
  l->retry_ms = now + DHT_LOST_FIRST_MS;
  l->backoff_ms = DHT_LOST_FIRST_MS;
  l->asking = false;
}

/* Called for every contact a lookup or an answer weighs: compared in
 * three 64-bit words rather than byte by byte; the last covers bytes 12 to
 * 19, whose first four the second word already found equal. */
int dht__cmp_dist(const uint8_t target[ID_BYTES], const uint8_t a[ID_BYTES],
                  const uint8_t b[ID_BYTES]) {
  _Static_assert(ID_BYTES == 20, "the words below cover 20 bytes");
  static const size_t at[] = {0, 8, 12};
  for (size_t i = 0; i < 3; i++) {
    size_t o = at[i];
    uint64_t t = be64(target + o), da = be64(a + o) ^ t, db = be64(b + o) ^ t;
    if (da != db)
      return da < db ? -1 : 1;
  }
  return 0;
}

/* The buckets are sorted by range and lo is the lowest id of its range:
 * the bucket for id is the last whose lo is not above id. */
dht_bucket *dht__bucket_for(const dht_table *t, const uint8_t id[ID_BYTES]) {
  uint64_t w = be64(id);
  size_t lo = 0, hi = t->nb; /* answer in [lo, hi) */
  while (hi - lo > 1) {
    size_t mid = lo + (hi - lo) / 2;
    /* lo64 decides unless the bucket sits deeper than 64 bits. */
    if (t->lo64[mid] < w ||
        (t->lo64[mid] == w && memcmp(t->b[mid]->lo, id, ID_BYTES) <= 0))
      lo = mid;
    else
      hi = mid;
  }
  return t->b[lo];
}

static size_t bucket_index(const dht_table *t, const dht_bucket *b) {
  for (size_t i = 0; i < t->nb; i++)
    if (t->b[i] == b)
      return i;
  return 0;
}

/* Splits b in two at bit b->depth. */
static void split(dht_table *t, dht_bucket *b) {
  dht_bucket *hi = calloc(1, sizeof *hi);
  dht_bucket **nbv = realloc(t->b, (t->nb + 1) * sizeof *t->b);
  if (nbv)
    t->b = nbv;
  uint64_t *nlo = realloc(t->lo64, (t->nb + 1) * sizeof *t->lo64);
  if (nlo)
    t->lo64 = nlo;
  if (!hi || !nbv || !nlo)
    abort();
  unsigned d = b->depth;
  memcpy(hi->lo, b->lo, ID_BYTES);
  hi->lo[d / 8] |= (uint8_t)(0x80 >> (d % 8));
  hi->depth = b->depth = d + 1;
  hi->touched_ms = b->touched_ms;
  /* Move the contacts and replacements of the upper half, keeping order. */
  size_t keep = 0, krep = 0;
  for (size_t i = 0; i < b->n; i++) {
    if (bit(b->c[i].id, d))
      hi->c[hi->n++] = b->c[i];
    else
      b->c[keep++] = b->c[i];
  }
  b->n = keep;
  for (size_t i = 0; i < b->nrep; i++) {
    if (bit(b->rep[i].id, d))
      hi->rep[hi->nrep++] = b->rep[i];
    else
      b->rep[krep++] = b->rep[i];
  }
  b->nrep = krep;
  b->evict_req = 0;
  size_t at = bucket_index(t, b) + 1;
  memmove(&t->b[at + 1], &t->b[at], (t->nb - at) * sizeof *t->b);
  memmove(&t->lo64[at + 1], &t->lo64[at], (t->nb - at) * sizeof *t->lo64);
  t->b[at] = hi;
  t->lo64[at] = be64(hi->lo);
  t->nb++;
}

static bool splittable(const dht_table *t, const dht_bucket *b) {
  if (b->depth >= ID_BYTES * 8)
    return false;
  return in_range(b, t->self) || b->depth % DHT_DEPTH_B != 0;
}

static int find_in(const dht_contact *v, size_t n, const uint8_t id[ID_BYTES]) {
  for (size_t i = 0; i < n; i++)
    if (id_eq(v[i].id, id))
      return (int)i;
  return -1;
}

/* Refreshes a known contact: newest address, seen now, moved to the tail
 * (most recently seen). */
static void touch(dht_contact *v, size_t n, size_t i, const char *addr,
                  uint64_t now) {
  dht_contact c = v[i];
  if (addr && strcmp(c.addr, addr) != 0) {
    free(c.addr);
    set_addr(&c, addr);
  }
  c.seen_ms = now;
  c.fails = 0;
  memmove(&v[i], &v[i + 1], (n - i - 1) * sizeof *v);
  v[n - 1] = c;
}

int dht__table_seen(dht_table *t, const uint8_t id[ID_BYTES], const char *addr,
                    uint64_t now, dht_bucket **evict) {
  *evict = NULL;
  if (memcmp(id, t->self, ID_BYTES) == 0 || !addr || !*addr)
    return 0;
  if (t->nlost)
    dht__lost_drop(t, id, NULL); /* back */
  for (;;) {
    dht_bucket *b = dht__bucket_for(t, id);
    b->touched_ms = now;
    int i = find_in(b->c, b->n, id);
    if (i >= 0) {
      touch(b->c, b->n, (size_t)i, addr, now);
      return 0;
    }
    if (b->n < DHT_K) {
      dht_contact *c = &b->c[b->n++];
      memset(c, 0, sizeof *c);
      memcpy(c->id, id, ID_BYTES);
      set_addr(c, addr);
      c->seen_ms = now;
      t->ncontacts++;
      /* It may have been waiting as a replacement. */
      int r = find_in(b->rep, b->nrep, id);
      if (r >= 0) {
        contact_free(&b->rep[r]);
        memmove(&b->rep[r], &b->rep[r + 1], (b->nrep - (size_t)r - 1) * sizeof *b->rep);
        b->nrep--;
      }
      return 1;
    }
    if (splittable(t, b)) {
      split(t, b);
      continue;
    }
    /* Full: park it as a replacement and question the oldest contact. */
    int r = find_in(b->rep, b->nrep, id);
    if (r >= 0) {
      touch(b->rep, b->nrep, (size_t)r, addr, now);
    } else {
      if (b->nrep == DHT_REPLACEMENTS) {
        contact_free(&b->rep[0]);
        memmove(&b->rep[0], &b->rep[1], (b->nrep - 1) * sizeof *b->rep);
        b->nrep--;
      }
      dht_contact *c = &b->rep[b->nrep++];
      memset(c, 0, sizeof *c);
      memcpy(c->id, id, ID_BYTES);
      set_addr(c, addr);
      c->seen_ms = now;
    }
    if (!b->evict_req)
      *evict = b;
    return 0;
  }
}

void dht__table_failed(dht_table *t, const uint8_t id[ID_BYTES], uint64_t now) {
  dht_bucket *b = dht__bucket_for(t, id);
  int i = find_in(b->c, b->n, id);
  if (i < 0) {
    int r = find_in(b->rep, b->nrep, id);
    if (r >= 0) { /* a dead replacement is no replacement */
      contact_free(&b->rep[r]);
      memmove(&b->rep[r], &b->rep[r + 1], (b->nrep - (size_t)r - 1) * sizeof *b->rep);
      b->nrep--;
    }
    return;
  }
  /* One failure is forgiven a contact heard from within DHT_STALE_MS (a
   * loaded peer); one silent for longer is presumed gone, as most are
   * under churn, and a second failure removes any. */
  dht_contact *c = &b->c[i];
  if (++c->fails < 2 && b->nrep == 0 && now - c->seen_ms < DHT_STALE_MS)
    return;
  lost_add(t, c, now);
  contact_free(c);
  memmove(&b->c[i], &b->c[i + 1], (b->n - (size_t)i - 1) * sizeof *b->c);
  b->n--;
  t->ncontacts--;
  if (b->nrep) { /* the newest replacement takes the place */
    b->c[b->n++] = b->rep[--b->nrep];
    t->ncontacts++;
  }
}

const dht_contact *dht__table_find(const dht_table *t,
                                   const uint8_t id[ID_BYTES]) {
  const dht_bucket *b = dht__bucket_for(t, id);
  int i = find_in(b->c, b->n, id);
  return i >= 0 ? &b->c[i] : NULL;
}

/* The closest contacts found so far, nearest first, each with the first
 * word of its distance to the target (which orders all but near-ties). */
typedef struct closest_acc {
  const uint8_t *target;
  uint64_t t64;
  const dht_contact **out;
  uint64_t *d64;
  size_t n, max;
} closest_acc;

static bool nearer(const closest_acc *a, const dht_contact *c, uint64_t d,
                   size_t k) {
  if (d != a->d64[k])
    return d < a->d64[k];
  return dht__cmp_dist(a->target, c->id, a->out[k]->id) < 0;
}

/* Adds b's contacts to the accumulator (sorted, at most max). */
static void closest_add(const dht_bucket *b, closest_acc *a) {
  for (size_t j = 0; j < b->n; j++) {
    const dht_contact *c = &b->c[j];
    uint64_t d = be64(c->id) ^ a->t64;
    if (a->n == a->max && !nearer(a, c, d, a->n - 1))
      continue;
    size_t k = a->n < a->max ? a->n++ : a->n - 1; /* insertion sort, bounded */
    while (k > 0 && nearer(a, c, d, k - 1)) {
      a->out[k] = a->out[k - 1];
      a->d64[k] = a->d64[k - 1];
      k--;
    }
    a->out[k] = c;
    a->d64[k] = d;
  }
}

/* Buckets [i, j) are the leaves under one trie node at depth d, in order.
 * Every id under the child on target's side of bit d is nearer to target
 * than every id under the other child, so the near child is visited first
 * and the far one only while out has room.  Returns true once out is full. */
static bool closest_walk(const dht_table *t, size_t i, size_t j, unsigned d,
                         closest_acc *a) {
  const uint8_t *target = a->target;
  while (j - i > 1 && d < ID_BYTES * 8) {
    size_t lo = i, hi = j; /* first bucket with bit d set, in [i, j] */
    while (lo < hi) {
      size_t mid = lo + (hi - lo) / 2;
      if (bit(t->b[mid]->lo, d))
        hi = mid;
      else
        lo = mid + 1;
    }
    if (lo == i || lo == j) { /* one child only: go down */
      d++;
      continue;
    }
    bool one = bit(target, d);
    if (closest_walk(t, one ? lo : i, one ? j : lo, d + 1, a))
      return true;
    i = one ? i : lo;
    j = one ? lo : j;
    d++;
  }
  for (size_t b = i; b < j; b++)
    closest_add(t->b[b], a);
  return a->n == a->max;
}

size_t dht__table_closest(const dht_table *t, const uint8_t target[ID_BYTES],
                          const dht_contact **out, size_t max) {
  uint64_t d64[DHT_CLOSEST_MAX];
  closest_acc a = {.target = target,
                   .t64 = be64(target),
                   .out = out,
                   .d64 = d64,
                   .max = max < DHT_CLOSEST_MAX ? max : DHT_CLOSEST_MAX};
  if (a.max)
    closest_walk(t, 0, t->nb, 0, &a);
  return a.n;
}

void dht__bucket_random_id(const dht_bucket *b, const uint8_t rnd[ID_BYTES],
                           uint8_t out[ID_BYTES]) {
  for (unsigned i = 0; i < ID_BYTES * 8; i++) {
    uint8_t m = (uint8_t)(0x80 >> (i % 8));
    bool v = i < b->depth ? bit(b->lo, i) : bit(rnd, i);
    out[i / 8] = (uint8_t)(v ? out[i / 8] | m : out[i / 8] & ~m);
  }
}

/* ---- blacklist ---------------------------------------------------------- */

static dht_ban *ban_find(const dht_table *t, const uint8_t id[ID_BYTES]) {
  for (size_t i = 0; i < t->nbans; i++)
    if (memcmp(t->bans[i].id, id, ID_BYTES) == 0)
      return (dht_ban *)&t->bans[i];
  return NULL;
}

bool dht__banned(const dht_table *t, const uint8_t id[ID_BYTES], uint64_t now) {
  const dht_ban *b = ban_find(t, id);
  return b && now < b->until_ms;
}

void dht__ban(dht_table *t, const uint8_t id[ID_BYTES], uint64_t now) {
  dht_ban *b = ban_find(t, id);
  if (!b) {
    if (t->nbans == DHT_BANS_MAX) { /* forget the ban that ends first */
      size_t old = 0;
      for (size_t i = 1; i < t->nbans; i++)
        if (t->bans[i].until_ms < t->bans[old].until_ms)
          old = i;
      t->bans[old] = t->bans[--t->nbans];
    }
    b = &t->bans[t->nbans++];
    memcpy(b->id, id, ID_BYTES);
    b->backoff_ms = 0;
  }
  /* 1 s, doubling to 5 minutes while it keeps failing. */
  b->backoff_ms = b->backoff_ms ? b->backoff_ms * 2 : 1000;
  if (b->backoff_ms > 300000)
    b->backoff_ms = 300000;
  b->until_ms = now + b->backoff_ms;
}

void dht__unban(dht_table *t, const uint8_t id[ID_BYTES]) {
  dht_ban *b = ban_find(t, id);
  if (b)
    *b = t->bans[--t->nbans];
}
