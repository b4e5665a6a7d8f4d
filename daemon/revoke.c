/* revoke.c: the moderator's revocation list, carried by the DHT.
 *
 * See bee.h for the layout.  A list is only ever taken from the DHT after
 * its signature checks against the moderator key this node was started
 * with, and only if its seq is higher than the one held, so neither a
 * forged list nor a replayed older one can change what a node refuses.
 */
#include "bee.h"
#include "dht.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define COMP "beed"
#define SEQ_BYTES 8

static void seq_subkey(uint64_t seq, uint8_t out[SEQ_BYTES]) {
  for (int i = 0; i < SEQ_BYTES; i++)
    out[i] = (uint8_t)(seq >> (8 * (SEQ_BYTES - 1 - i)));
}

void bee_revoke_init(bee_revoke *r, uv_loop_t *loop, proto_revocation *list,
                     const uint8_t *moderator_pk, const char *swarm,
                     unsigned interval_s) {
  char name[PROTO_SWARM_MAX + 16];
  memset(r, 0, sizeof *r);
  r->list = list;
  r->moderator_pk = moderator_pk;
  r->swarm = swarm;
  r->interval_ms = (uint64_t)interval_s * 1000;
  snprintf(name, sizeof name, "%s.revocation", swarm);
  dht_key(name, r->key);
  uv_timer_init(loop, &r->timer);
  r->timer.data = r;
}

int bee_revoke_validate(void *ctx, const proto_dht_record *rec) {
  bee_revoke *r = ctx;
  uint8_t want[SEQ_BYTES];
  if (memcmp(rec->key, r->key, sizeof r->key) != 0)
    return 0; /* not ours to judge */
  if (!r->moderator_pk || rec->subkey.n != SEQ_BYTES)
    return BEE_EAUTH;
  proto_revocation rl;
  proto_revocation_init(&rl);
  int rc = proto_revocation_decode(rec->value.p, rec->value.n, r->moderator_pk,
                                   r->swarm, &rl);
  if (rc == 0) {
    seq_subkey(rl.seq, want);
    if (memcmp(want, rec->subkey.p, SEQ_BYTES) != 0)
      rc = BEE_EAUTH; /* filed under another seq */
  }
  proto_revocation_close(&rl);
  return rc ? BEE_EAUTH : 0;
}

static void disconnect_revoked(proto_conn *c, void *arg) {
  bee_revoke *r = arg;
  char id8[9];
  if (!proto_revocation_has(r->list, proto_conn_peer(c)->pk))
    return;
  proto_hex(proto_conn_peer(c)->id, 4, id8);
  bee_warn(COMP, "revocation: disconnecting revoked peer %s", id8);
  proto_conn_close(c, BEE_EREVOKED, bee_strerror(BEE_EREVOKED));
}

/* Takes the newest valid list found, if it is newer than ours. */
static void got_lists(dht_node *n, int status, const dht_value *v,
                      const dht_stats *st, void *arg) {
  bee_revoke *r = arg;
  (void)n, (void)st;
  r->busy = false;
  bee_debug(COMP, "revocation: poll: %s, %zu lists", bee_strerror(status),
            status ? 0 : v->n);
  if (status || r->stopped)
    return;
  proto_revocation best;
  proto_revocation_init(&best);
  for (size_t i = 0; i < v->n; i++) {
    proto_revocation rl;
    proto_revocation_init(&rl);
    if (proto_revocation_decode(v->records[i].value.p, v->records[i].value.n,
                                r->moderator_pk, r->swarm, &rl) == 0 &&
        rl.seq > best.seq && rl.seq > r->list->seq) {
      proto_revocation_close(&best);
      best = rl;
    } else {
      proto_revocation_close(&rl);
    }
  }
  if (best.seq == 0)
    return;
  bee_info(COMP, "revocation: list %llu from the DHT replaces %llu: %zu "
           "revoked keys", (unsigned long long)best.seq,
           (unsigned long long)r->list->seq, best.n);
  proto_revocation_close(r->list);
  *r->list = best; /* the host's handshakes read it from here on */
  proto_host_foreach(r->host, disconnect_revoked, r);
}

static void publish(bee_revoke *r, const uint8_t *signed_list, size_t len);

static void poll_cb(uv_timer_t *t) {
  bee_revoke *r = t->data;
  if (r->stopped || r->busy)
    return;
  /* A list from our file goes out once the DHT has had a moment to fill
   * our routing table; the DHT republishes it from then on. */
  if (!r->published && r->list->seq && r->list->raw) {
    r->published = true;
    publish(r, r->list->raw, r->list->raw_len);
  }
  int rc = dht_get(dht_glue_node(r->dht), r->key, true, got_lists, r);
  if (rc == 0)
    r->busy = true;
  else
    bee_debug(COMP, "revocation: poll: %s", bee_strerror(rc));
}

static void put_cb(dht_node *n, int status, unsigned stored,
                   const dht_stats *st, void *arg) {
  bee_revoke *r = arg;
  (void)n, (void)st;
  if (r->stopped)
    return;
  if (status)
    bee_warn(COMP, "revocation: publishing list %llu: %s",
             (unsigned long long)r->list->seq, bee_strerror(status));
  else
    bee_info(COMP, "revocation: list %llu published on %u nodes",
             (unsigned long long)r->list->seq, stored);
}

/* Publishes our list as it came from the moderator: its signed bytes. */
static void publish(bee_revoke *r, const uint8_t *signed_list, size_t len) {
  uint8_t sub[SEQ_BYTES];
  seq_subkey(r->list->seq, sub);
  int rc = dht_put(dht_glue_node(r->dht), r->key,
                   (proto_bytes){sub, sizeof sub},
                   (proto_bytes){signed_list, len},
                   (uint64_t)time(NULL) + DHT_TTL_MAX_S - 3600, put_cb, r);
  if (rc)
    bee_warn(COMP, "revocation: cannot publish list %llu: %s",
             (unsigned long long)r->list->seq, bee_strerror(rc));
}

bool bee_revoke_offer(bee_revoke *r, proto_revocation *rl) {
  if (rl->seq <= r->list->seq)
    return false;
  proto_revocation_close(r->list);
  *r->list = *rl; /* the host's handshakes read it from here on */
  proto_revocation_init(rl);
  r->published = false;
  if (r->host && !r->stopped) {
    proto_host_foreach(r->host, disconnect_revoked, r);
    if (r->list->raw) {
      r->published = true;
      publish(r, r->list->raw, r->list->raw_len);
    }
  }
  return true;
}

void bee_revoke_start(bee_revoke *r, proto_host *host, struct dht_glue *dht) {
  r->host = host;
  r->dht = dht;
  uv_timer_start(&r->timer, poll_cb, 1000, r->interval_ms);
}

void bee_revoke_stop(bee_revoke *r) {
  r->stopped = true;
  if (!uv_is_closing((uv_handle_t *)&r->timer))
    uv_close((uv_handle_t *)&r->timer, NULL);
}
