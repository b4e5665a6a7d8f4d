/* links.c: the table of a bee's links to its peers (bee.h), without I/O.
 *
 * The figures come in from the connections (round trips, and the rates
 * their reads measured); they go out as the links record.  All clocks are
 * the caller's, so the tests drive it on fake ones.
 */
#include "bee.h"

#include <math.h>
#include <string.h>

static bee_link *find(const bee_links *L, const uint8_t id[PROTO_ID_BYTES]) {
  for (size_t i = 0; i < BEE_LINKS_MAX; i++)
    if (L->v[i].used && memcmp(L->v[i].id, id, PROTO_ID_BYTES) == 0)
      return (bee_link *)&L->v[i];
  return NULL;
}

bee_link *bee_links_get(bee_links *L, const uint8_t id[PROTO_ID_BYTES]) {
  bee_link *e = find(L, id), *old = NULL;
  if (e)
    return e;
  for (size_t i = 0; i < BEE_LINKS_MAX && !e; i++) {
    bee_link *v = &L->v[i];
    if (!v->used)
      e = v;
    else if (!old || v->measured_ms < old->measured_ms)
      old = v;
  }
  if (!e)
    e = old; /* full: the least recently measured goes */
  memset(e, 0, sizeof *e);
  e->used = true;
  memcpy(e->id, id, PROTO_ID_BYTES);
  return e;
}

void bee_links_rtt(bee_links *L, const uint8_t id[PROTO_ID_BYTES],
                   uint64_t rtt_us, uint64_t now_ms) {
  if (rtt_us == 0 || rtt_us > PROTO_LINK_RTT_MAX_US)
    return;
  bee_link *e = bee_links_get(L, id);
  /* A connection's figure is already its least; a new connection's may
   * be larger (the path changed), and is taken. */
  if (e->rtt_us && e->rtt_ms == now_ms && e->rtt_us <= rtt_us)
    return; /* another connection to it saw less, at this tick */
  e->rtt_us = rtt_us;
  e->rtt_ms = now_ms;
  e->measured_ms = now_ms;
}

void bee_links_rate(bee_links *L, const uint8_t id[PROTO_ID_BYTES], double mbit,
                    uint64_t now_ms) {
  if (!(mbit > 0) || !isfinite(mbit))
    return;
  if (mbit > PROTO_LINK_MBIT_MAX)
    mbit = PROTO_LINK_MBIT_MAX;
  bee_link *e = bee_links_get(L, id);
  if (e->nrates && e->rate_ms == now_ms) { /* another connection's */
    size_t last = (e->next + BEE_LINK_RATES - 1) % BEE_LINK_RATES;
    if (mbit > e->rates[last])
      e->rates[last] = mbit;
    return;
  }
  e->rates[e->next] = mbit;
  e->next = (e->next + 1) % BEE_LINK_RATES;
  if (e->nrates < BEE_LINK_RATES)
    e->nrates++;
  e->rate_ms = e->measured_ms = now_ms;
}

static double best(const bee_link *e) {
  double b = 0;
  for (size_t i = 0; i < e->nrates; i++)
    if (e->rates[i] > b)
      b = e->rates[i];
  return b;
}

double bee_links_mbit(const bee_links *L, const uint8_t id[PROTO_ID_BYTES]) {
  const bee_link *e = find(L, id);
  return e ? best(e) : 0;
}

bool bee_links_probe_due(bee_links *L, const uint8_t id[PROTO_ID_BYTES],
                         uint64_t now_ms) {
  bee_link *e = bee_links_get(L, id);
  if (e->nrates > 0 ||
      (e->probed_ms && now_ms - e->probed_ms < BEE_LINK_PROBE_MS))
    return false;
  e->probed_ms = now_ms ? now_ms : 1;
  if (!e->measured_ms)
    e->measured_ms = now_ms; /* a fresh entry is not the first to go */
  return true;
}

size_t bee_links_list(const bee_links *L, uint64_t now_ms, proto_link *out,
                      size_t cap) {
  if (cap > PROTO_LINKS_MAX)
    cap = PROTO_LINKS_MAX;
  size_t n = 0;
  /* Most recent first: an insertion into out by measured_ms. */
  const bee_link *kept[BEE_LINKS_MAX];
  for (size_t i = 0; i < BEE_LINKS_MAX; i++) {
    const bee_link *e = &L->v[i];
    if (!e->used || (e->rtt_us == 0 && e->nrates == 0) ||
        now_ms - e->measured_ms > BEE_LINK_STALE_MS || e->measured_ms > now_ms)
      continue;
    size_t k = n++;
    while (k > 0 && kept[k - 1]->measured_ms < e->measured_ms) {
      kept[k] = kept[k - 1];
      k--;
    }
    kept[k] = e;
  }
  if (n > cap)
    n = cap;
  for (size_t i = 0; i < n; i++) {
    const bee_link *e = kept[i];
    memcpy(out[i].id, e->id, PROTO_ID_BYTES);
    out[i].rtt_us = e->rtt_us;
    out[i].mbit = best(e);
    uint64_t age = (now_ms - e->measured_ms) / 1000;
    out[i].age_s = age > PROTO_LINK_AGE_MAX_S ? PROTO_LINK_AGE_MAX_S : age;
  }
  return n;
}
