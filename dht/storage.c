/* storage.c: the records a node holds for the swarm.
 *
 * A key holds a plain value and/or a dictionary of subkeys, each record
 * with its own expiration.  A store replaces a record only with a strictly
 * later expiration (newest expiration wins; the same record again is
 * accepted and changes nothing), and expired records disappear.  Every
 * record is checked before it is kept: its expiration is in the future and
 * not too far, an owned subkey carries its owner's signature, and the
 * daemon's validator accepts records of the swarm's known types.  Records
 * per key, bytes per key, keys and total bytes are bounded, and so is the
 * rate at which one peer may store; over a limit a store is refused with
 * BEE_ELIMIT.
 */
#include "dht-int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

void dht__store_init(dht_store *s) {
  memset(s, 0, sizeof *s);
  s->tabsize = 256;
  s->next_exp_s = UINT64_MAX;
  s->tab = calloc(s->tabsize, sizeof *s->tab);
  if (!s->tab)
    abort();
}

void dht__rec_free(dht_rec *r) {
  free(r->subkey);
  free(r->value);
  memset(r, 0, sizeof *r);
}

static void entry_free(dht_entry *e) {
  for (size_t i = 0; i < e->n; i++)
    dht__rec_free(&e->recs[i]);
  free(e->recs);
  free(e);
}

void dht__store_close(dht_store *s) {
  for (size_t i = 0; i < s->tabsize; i++)
    while (s->tab[i]) {
      dht_entry *e = s->tab[i];
      s->tab[i] = e->next;
      entry_free(e);
    }
  free(s->tab);
  memset(s, 0, sizeof *s);
}

static size_t slot(const dht_store *s, const uint8_t key[PROTO_DHT_KEY_BYTES]) {
  uint64_t h;
  memcpy(&h, key, sizeof h); /* keys are hashes already */
  return (size_t)(h & (s->tabsize - 1));
}

dht_entry *dht__store_find(const dht_store *s,
                           const uint8_t key[PROTO_DHT_KEY_BYTES]) {
  for (dht_entry *e = s->tab[slot(s, key)]; e; e = e->next)
    if (memcmp(e->key, key, PROTO_DHT_KEY_BYTES) == 0)
      return e;
  return NULL;
}

/* Doubles the hash table once keys outnumber its slots. */
static void grow(dht_store *s) {
  size_t size = s->tabsize * 2;
  dht_entry **tab = calloc(size, sizeof *tab);
  if (!tab)
    return; /* stay at the old size: only slower */
  dht_entry **old = s->tab;
  size_t oldsize = s->tabsize;
  s->tab = tab;
  s->tabsize = size;
  for (size_t i = 0; i < oldsize; i++)
    while (old[i]) {
      dht_entry *e = old[i];
      old[i] = e->next;
      size_t k = slot(s, e->key);
      e->next = s->tab[k];
      s->tab[k] = e;
    }
  free(old);
}

static void unlink_entry(dht_store *s, dht_entry *e) {
  for (dht_entry **pp = &s->tab[slot(s, e->key)]; *pp; pp = &(*pp)->next)
    if (*pp == e) {
      *pp = e->next;
      break;
    }
  s->keys--;
}

int dht__rec_copy(dht_rec *dst, const proto_dht_record *src) {
  memset(dst, 0, sizeof *dst);
  if (src->subkey.n && !(dst->subkey = malloc(src->subkey.n)))
    return -ENOMEM;
  if (!(dst->value = malloc(src->value.n ? src->value.n : 1))) {
    free(dst->subkey);
    return -ENOMEM;
  }
  if (src->subkey.n)
    memcpy(dst->subkey, src->subkey.p, src->subkey.n);
  if (src->value.n)
    memcpy(dst->value, src->value.p, src->value.n);
  dst->subkey_n = src->subkey.n;
  dst->value_n = src->value.n;
  dst->expiration = src->expiration;
  dst->has_sig = src->has_sig;
  memcpy(dst->sig, src->sig, sizeof dst->sig);
  return 0;
}

void dht__rec_view(const dht_rec *r, const uint8_t key[PROTO_DHT_KEY_BYTES],
                   proto_dht_record *out) {
  memset(out, 0, sizeof *out);
  memcpy(out->key, key, PROTO_DHT_KEY_BYTES);
  out->subkey = (proto_bytes){r->subkey, r->subkey_n};
  out->value = (proto_bytes){r->value, r->value_n};
  out->expiration = r->expiration;
  out->has_sig = r->has_sig;
  memcpy(out->sig, r->sig, sizeof out->sig);
}

int dht__record_check(dht_node *n, const proto_dht_record *r, uint64_t now_s) {
  if (r->expiration <= now_s)
    return BEE_EEXPIRED;
  if (r->expiration > now_s + DHT_TTL_MAX_S)
    return BEE_ERANGE;
  int rc, type;
  if (r->subkey.n && r->subkey.p[0] == PROTO_DHT_OWNER_TAG &&
      (rc = proto_dht_record_verify(r)))
    return rc;
  /* The swarm's typed records (progress, metrics, matchmaking, donors)
   * are checked by every node, whatever it runs for; the owner decides
   * the rest (the revocation list). */
  if ((rc = proto_record_check(r, &type)))
    return rc;
  return n->io.validate ? n->io.validate(n->io.ctx, r) : 0;
}

static int find_rec(const dht_entry *e, proto_bytes subkey) {
  for (size_t i = 0; i < e->n; i++)
    if (e->recs[i].subkey_n == subkey.n &&
        (subkey.n == 0 || memcmp(e->recs[i].subkey, subkey.p, subkey.n) == 0))
      return (int)i;
  return -1;
}

int dht__store_put(dht_node *n, const proto_dht_record *r, uint64_t now_s) {
  dht_store *s = &n->store;
  int rc = dht__record_check(n, r, now_s);
  if (rc)
    return rc;
  dht_entry *e = dht__store_find(s, r->key);
  int i = e ? find_rec(e, r->subkey) : -1;
  size_t old_bytes = i >= 0 ? e->recs[i].value_n + e->recs[i].subkey_n : 0;
  size_t new_bytes = r->value.n + r->subkey.n;
  if (i >= 0) {
    const dht_rec *o = &e->recs[i];
    if (r->expiration < o->expiration)
      return BEE_ESTALE;
    if (r->expiration == o->expiration) {
      if (o->value_n != r->value.n ||
          memcmp(o->value, r->value.p, r->value.n) != 0)
        return BEE_ESTALE; /* a rival with the same expiration */
      dht__replicate_later(n, e, now_s); /* another holder copied it */
      return 0;                          /* the same record again */
    }
  }
  /* Limits, counting what the store would hold afterwards. */
  if (s->bytes - old_bytes + new_bytes > n->cfg.storage_max ||
      (!e && s->keys >= n->cfg.keys_max) ||
      (e && i < 0 && e->n >= DHT_SUBKEYS_MAX) ||
      (e ? e->bytes : 0) - old_bytes + new_bytes > DHT_KEY_BYTES_MAX)
    return BEE_ELIMIT;
  dht_rec copy;
  if ((rc = dht__rec_copy(&copy, r)))
    return rc;
  if (!e) {
    if (!(e = calloc(1, sizeof *e))) {
      dht__rec_free(&copy);
      return -ENOMEM;
    }
    memcpy(e->key, r->key, PROTO_DHT_KEY_BYTES);
    size_t k = slot(s, e->key);
    e->next = s->tab[k];
    s->tab[k] = e;
    if (++s->keys > s->tabsize)
      grow(s);
  }
  if (i >= 0) {
    dht__rec_free(&e->recs[i]);
    e->recs[i] = copy;
  } else {
    if (e->n == e->cap) {
      size_t cap = e->cap ? 2 * e->cap : 2;
      dht_rec *v = realloc(e->recs, cap * sizeof *v);
      if (!v) {
        dht__rec_free(&copy);
        if (e->n == 0) {
          unlink_entry(s, e);
          entry_free(e);
        }
        return -ENOMEM;
      }
      e->recs = v;
      e->cap = cap;
    }
    e->recs[e->n++] = copy;
    s->records++;
  }
  e->bytes = e->bytes - old_bytes + new_bytes;
  s->bytes = s->bytes - old_bytes + new_bytes;
  if (r->expiration < s->next_exp_s)
    s->next_exp_s = r->expiration;
  dht__replicate_later(n, e, now_s);
  return 0;
}

size_t dht__store_expire(dht_store *s, uint64_t now_s) {
  size_t gone = 0;
  if (now_s < s->next_exp_s)
    return 0; /* nothing is due: no walk over every key */
  s->next_exp_s = UINT64_MAX;
  for (size_t t = 0; t < s->tabsize; t++)
    for (dht_entry **pp = &s->tab[t]; *pp;) {
      dht_entry *e = *pp;
      size_t keep = 0;
      for (size_t i = 0; i < e->n; i++) {
        if (e->recs[i].expiration > now_s) {
          if (e->recs[i].expiration < s->next_exp_s)
            s->next_exp_s = e->recs[i].expiration;
          e->recs[keep++] = e->recs[i];
          continue;
        }
        size_t b = e->recs[i].value_n + e->recs[i].subkey_n;
        e->bytes -= b;
        s->bytes -= b;
        s->records--;
        gone++;
        dht__rec_free(&e->recs[i]);
      }
      e->n = keep;
      if (e->n == 0) {
        *pp = e->next;
        s->keys--;
        entry_free(e);
      } else {
        pp = &e->next;
      }
    }
  return gone;
}

size_t dht__entry_view(const dht_entry *e, uint64_t now_s,
                       proto_dht_record *out, size_t max) {
  size_t k = 0;
  for (size_t i = 0; i < e->n && k < max; i++)
    if (e->recs[i].expiration > now_s)
      dht__rec_view(&e->recs[i], e->key, &out[k++]);
  return k;
}

bool dht__rate_take(dht_node *n, const uint8_t id[ID_BYTES], size_t count,
                    uint64_t now_ms) {
  dht_store *s = &n->store;
  double rate = n->cfg.peer_stores_per_s, burst = 4 * rate;
  dht_rate *r = NULL;
  for (size_t i = 0; i < s->nrates; i++)
    if (memcmp(s->rates[i].id, id, ID_BYTES) == 0)
      r = &s->rates[i];
  if (!r) {
    if (s->nrates < DHT_RATES_MAX) {
      r = &s->rates[s->nrates++];
    } else { /* reuse the one quiet the longest */
      r = &s->rates[0];
      for (size_t i = 1; i < s->nrates; i++)
        if (s->rates[i].at_ms < r->at_ms)
          r = &s->rates[i];
    }
    memcpy(r->id, id, ID_BYTES);
    r->tokens = burst;
    r->at_ms = now_ms;
  }
  r->tokens += (double)(now_ms - r->at_ms) * rate / 1000;
  if (r->tokens > burst)
    r->tokens = burst;
  r->at_ms = now_ms;
  if (r->tokens < (double)count)
    return false;
  r->tokens -= (double)count;
  return true;
}
