/* train-links.c: a training bee's links to its peers, measured, used and
 * published (the table's decisions are links.c's).
 *
 * What feeds the table, every LINKS_TICK_MS, from each connection to a
 * bee: the least round trip it saw (handshake, keepalive pings) and the
 * rate its reads measured (proto_conn_take_rx_mbit), whatever carried the
 * bytes: rounds, stripes, state downloads, or a probe.  A probe goes once
 * per BEE_LINK_PROBE_MS to a connected bee the table has no rate of yet
 * (a bee that just joined, or one whose rounds with us move too little to
 * tell): PROBE_CALLS "swarm.probe" calls at once, each answered with
 * PROBE_BYTES, while the links are quiet: PROBE_AFTER_MS after this bee
 * started (a newcomer's state download comes first), neither during a
 * download nor during a round, and one probe per PROBE_EVERY_MS at most,
 * so that a bee among many peers measures them in turn instead of
 * loading the swarm.
 * What it gives: the links record under "<run>_links" every
 * LINKS_PUBLISH_MS (what `beectl links` and trainmonitor show), and the
 * bandwidth this bee declares with `--bandwidth auto`.
 *
 * A peer may ask for probes, but not without bound: this bee answers at
 * most PROBE_BUDGET bytes of them a minute, none while it serves a state
 * download, none while a probe's worth of answers waits to go to the
 * asker, and refuses the rest with BEE_ELIMIT.  A probe request carries
 * no payload; one that does is refused as malformed.
 */
#include "train-int.h"

#define PROBE_METHOD "swarm.probe"
#define PROBE_BYTES (64u << 10) /* one answer */
#define PROBE_CALLS 16          /* in flight at once: a MiB */
#define PROBE_CALL_MS 20000
#define PROBE_BUDGET (32u << 20) /* answered a minute, bytes */
#define PROBE_AFTER_MS 20000
#define PROBE_EVERY_MS 10000
#define LINKS_TICK_MS 1000
#define LINKS_PUBLISH_MS 10000
#define LINKS_TTL_S 60
/* --bandwidth auto before any round measured the link. */
#define DECLARED_UNKNOWN_MBIT 100

static const uint8_t probe_zeros[PROBE_BYTES];

/* A connection's figures: its least round trip, and the best rate its
 * reads measured since the last tick (a peer's several connections count
 * as one: the least round trip, the best rate). */
static void conn_links(proto_conn *c, void *arg) {
  bee_train *t = arg;
  const proto_peer *p = proto_conn_peer(c);
  double mbit = proto_conn_take_rx_mbit(c);
  if (p->role != PROTO_ROLE_BEE)
    return;
  bee_links_rtt(&t->links, p->id, proto_conn_rtt_us(c), t->links_now);
  bee_links_rate(&t->links, p->id, mbit, t->links_now);
}

static void probe_cb(proto_conn *c, int status, int64_t remote_code,
                     proto_bytes payload, void *arg) {
  bee_train *t = arg;
  (void)c, (void)remote_code, (void)payload;
  if (t->stopped || t->probe_left == 0 || --t->probe_left > 0)
    return;
  t->probing = false; /* the connection's meter has the figure */
  char hex[16];
  proto_hex(t->probe_id, 6, hex);
  bee_debug(COMP, "probe of %s done%s%s", hex, status ? ": " : "",
            status ? bee_strerror(status) : "");
}

static void probe_start(bee_train *t, proto_conn *c) {
  const proto_peer *p = proto_conn_peer(c);
  unsigned sent = 0;
  memcpy(t->probe_id, p->id, PROTO_ID_BYTES);
  for (unsigned i = 0; i < PROBE_CALLS; i++) {
    uint64_t call;
    if (proto_conn_call(c, PROBE_METHOD, NULL, 0, PROBE_CALL_MS, probe_cb, t,
                        &call) == 0)
      sent++;
  }
  t->probe_left = sent;
  t->probing = sent > 0;
}

struct pick {
  bee_train *t;
  proto_conn *c;
};

static void probe_pick(proto_conn *c, void *arg) {
  struct pick *k = arg;
  const proto_peer *p = proto_conn_peer(c);
  if (k->c || p->role != PROTO_ROLE_BEE || p->purpose != PROTO_PURPOSE_CONTROL)
    return;
  if (bee_links_probe_due(&k->t->links, p->id, k->t->links_now))
    k->c = c;
}

static void links_put_cb(dht_node *n, int status, unsigned stored,
                         const dht_stats *st, void *arg) {
  (void)n, (void)stored, (void)st, (void)arg;
  if (status && status != BEE_ECANCELED)
    bee_debug(COMP, "links not published: %s", bee_strerror(status));
}

static void publish(bee_train *t) {
  proto_links *rec = malloc(sizeof *rec);
  uint8_t *buf = malloc(PROTO_LINKS_RECORD_MAX);
  size_t len;
  if (!rec || !buf || !t->dht)
    goto out;
  memset(rec, 0, sizeof *rec);
  snprintf(rec->run, sizeof rec->run, "%s", t->cfg->run);
  rec->time_ms = wall_ms();
  rec->n = bee_links_list(&t->links, t->links_now, rec->links, PROTO_LINKS_MAX);
  if (rec->n == 0)
    goto out;
  int rc = proto_links_encode(rec, buf, PROTO_LINKS_RECORD_MAX, &len);
  if (rc) { /* our own figures, checked where they came in: a bug */
    bee_err(COMP, "links record: %s", bee_strerror(rc));
    goto out;
  }
  uint64_t exp = rec->time_ms / 1000 + LINKS_TTL_S;
  if (exp <= t->links_exp)
    exp = t->links_exp + 1; /* a store wins only with a later expiration */
  if (dht_put(t->dht, t->lkey, (proto_bytes){t->sub, sizeof t->sub},
              (proto_bytes){buf, len}, exp, links_put_cb, t) == 0)
    t->links_exp = exp;
out:
  free(rec);
  free(buf);
}

void bee__links_tick(bee_train *t) {
  uint64_t now = mono_ms();
  if (t->stopped || !t->host || now - t->links_tick_ms < LINKS_TICK_MS)
    return;
  t->links_tick_ms = now;
  t->links_now = now;
  proto_host_foreach(t->host, conn_links, t);
  if (!t->probing && now - t->links_start_ms >= PROBE_AFTER_MS &&
      now - t->probe_ms >= PROBE_EVERY_MS && !bee_run_downloading(t->run) &&
      !avg_node_in_round(t->avg)) {
    struct pick k = {t, NULL};
    proto_host_foreach(t->host, probe_pick, &k);
    if (k.c) {
      probe_start(t, k.c);
      t->probe_ms = now;
    }
  }
  if (now - t->links_pub_ms >= LINKS_PUBLISH_MS) {
    t->links_pub_ms = now;
    publish(t);
  }
}

double bee__links_declared(bee_train *t) {
  double m = t->cfg->bandwidth_mbit;
  const char *why = "--bandwidth";
  if (!(m > 0)) {
    m = t->avg ? avg_node_bandwidth_mbit(t->avg) : 0;
    why = "as its rounds measured it";
    if (!(m > 0)) {
      m = DECLARED_UNKNOWN_MBIT;
      why = "its rounds have not measured it yet";
    }
  }
  /* A line when it first changes by a tenth or more. */
  if (!(t->declared_said > 0) ||
      fabs(m - t->declared_said) >= 0.1 * t->declared_said) {
    bee_info(COMP, "bandwidth: declares %.1f Mbit/s (%s)", m, why);
    t->declared_said = m;
  }
  return m;
}

/* Answers a probe with PROBE_BYTES, within the budget. */
static void probe_req_cb(proto_conn *c, uint64_t id, proto_bytes method,
                         proto_bytes payload, void *data) {
  bee_train *t = data;
  (void)method;
  if (payload.n) {
    proto_conn_reply_error(c, id, BEE_EMALFORMED, "a probe has no payload");
    return;
  }
  uint64_t now = uv_now(t->loop);
  if (now - t->probe_budget_ms >= 60000) {
    t->probe_budget_ms = now;
    t->probe_served = 0;
  }
  if (t->probe_served + PROBE_BYTES > PROBE_BUDGET) {
    proto_conn_reply_error(c, id, BEE_ELIMIT, "probe budget spent");
    return;
  }
  if (bee_uploads_active(&t->uploads, now) > 0) { /* they come first */
    proto_conn_reply_error(c, id, BEE_ELIMIT, "serving the state");
    return;
  }
  /* A prober that asks faster than its link takes the answers: refused
   * while a probe's worth is queued to it, so that nothing is lost to a
   * full write queue (and no answer is owed that never comes). */
  if (proto_conn_queued(c) > PROBE_CALLS * PROBE_BYTES ||
      proto_conn_reply(c, id, probe_zeros, sizeof probe_zeros) != 0) {
    proto_conn_reply_error(c, id, BEE_ELIMIT, "too many probes queued");
    return;
  }
  t->probe_served += PROBE_BYTES;
}

int bee__links_start(bee_train *t) {
  proto_record_key(PROTO_REC_LINKS, t->cfg->run, 0, NULL, t->lkey);
  t->links_start_ms = mono_ms();
  t->probe_budget_ms = uv_now(t->loop);
  return proto_host_on(t->host, PROBE_METHOD, probe_req_cb, t);
}

void bee__links_stop(bee_train *t) {
  if (t->host)
    proto_host_on(t->host, PROBE_METHOD, NULL, NULL);
}
