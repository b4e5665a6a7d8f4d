/* render.c: the monitor's state as JSON and as Prometheus text.
 *
 * JSON numbers that are not finite (a loss not known yet, a noise scale
 * without data) are written as null; strings are escaped per RFC 8259
 * (labels come from peers and may hold any UTF-8 but control
 * characters, which the record decoder already refuses).
 */
#include "monitor.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void mon_buf_free(mon_buf *b) {
  free(b->p);
  memset(b, 0, sizeof *b);
}

static bool buf_room(mon_buf *b, size_t more) {
  if (b->oom)
    return false;
  if (b->len + more + 1 <= b->cap)
    return true;
  size_t cap = b->cap ? b->cap : 1024;
  while (cap < b->len + more + 1)
    cap *= 2;
  char *p = realloc(b->p, cap);
  if (!p) {
    b->oom = true;
    return false;
  }
  b->p = p;
  b->cap = cap;
  return true;
}

void mon_buf_printf(mon_buf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0 || !buf_room(b, (size_t)n))
    return;
  va_start(ap, fmt);
  vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
  va_end(ap);
  b->len += (size_t)n;
}

void mon_buf_json_str(mon_buf *b, const char *s) {
  mon_buf_printf(b, "\"");
  for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
    if (*c == '"' || *c == '\\')
      mon_buf_printf(b, "\\%c", *c);
    else if (*c < 0x20)
      mon_buf_printf(b, "\\u%04x", *c);
    else
      mon_buf_printf(b, "%c", *c);
  }
  mon_buf_printf(b, "\"");
}

/* A number, or null when it is not finite. */
static void num(mon_buf *b, const char *key, double x, bool comma) {
  if (isfinite(x))
    mon_buf_printf(b, "\"%s\":%.6g%s", key, x, comma ? "," : "");
  else
    mon_buf_printf(b, "\"%s\":null%s", key, comma ? "," : "");
}

static void point_json(mon_buf *b, const mon_point *p) {
  mon_buf_printf(b, "{\"t\":%llu,\"epoch\":%llu,\"samples\":%llu,",
                 (unsigned long long)p->time_ms, (unsigned long long)p->epoch,
                 (unsigned long long)p->samples);
  mon_buf_printf(b, "\"target\":%llu,\"peers\":%u,",
                 (unsigned long long)p->target, p->peers);
  num(b, "samples_per_second", p->samples_per_second, true);
  num(b, "eta_s", p->eta_s >= 0 ? p->eta_s : NAN, true);
  num(b, "loss", p->loss, true);
  num(b, "group", p->group, true);
  num(b, "round_s", p->round_s, true);
  num(b, "compute_s", p->compute_s, true);
  num(b, "granularity", p->granularity, true);
  num(b, "mib_sent", p->mib_sent, true);
  num(b, "averaged", p->averaged, true);
  num(b, "noise_scale", p->noise_scale, false);
  mon_buf_printf(b, "}");
}

static const char *mode_name(int mode) {
  return mode == PROTO_MODE_CLIENT ? "client"
         : mode == PROTO_MODE_AUX  ? "aux"
                                   : "node";
}

static void peer_json(mon_buf *b, const mon_peer *p) {
  char id[2 * PROTO_ID_BYTES + 1];
  proto_hex(p->id, PROTO_ID_BYTES, id);
  const proto_progress *g = &p->progress;
  const proto_metrics *x = &p->metrics;
  mon_buf_printf(b, "{\"id\":\"%s\",\"label\":", id);
  mon_buf_json_str(b, p->has_progress ? g->label : "");
  mon_buf_printf(b, ",\"addr\":");
  mon_buf_json_str(b, p->has_donor ? p->addr : "");
  if (p->has_donor)
    mon_buf_printf(b, ",\"slots\":%llu,\"donor_epoch\":%llu",
                   (unsigned long long)p->slots,
                   (unsigned long long)p->donor_epoch);
  else
    mon_buf_printf(b, ",\"slots\":null,\"donor_epoch\":null");
  mon_buf_printf(b, ",\"mode\":\"%s\",\"epoch\":%llu,\"samples\":%llu,",
                 mode_name(g->mode), (unsigned long long)g->epoch,
                 (unsigned long long)g->samples);
  num(b, "samples_per_second", g->samples_per_second, true);
  mon_buf_printf(b, "\"record_ms\":%llu,\"seen_ms\":%llu,\"first_ms\":%llu,",
                 (unsigned long long)g->time_ms, (unsigned long long)p->seen_ms,
                 (unsigned long long)p->first_ms);
  if (p->has_metrics) {
    mon_buf_printf(b, "\"step\":%llu,", (unsigned long long)x->step);
    num(b, "loss", x->has_loss ? x->loss : NAN, true);
    num(b, "compute_s", x->compute_s, true);
    num(b, "round_s", x->averaging_s, true);
    num(b, "averaged", x->has_by_all ? x->by_all : NAN, true);
    num(b, "loss_scale", x->has_loss_scale ? x->loss_scale : NAN, true);
    if (x->has_loss_scale)
      mon_buf_printf(b, "\"dropped\":%llu,", (unsigned long long)x->dropped);
    else
      mon_buf_printf(b, "\"dropped\":null,");
    mon_buf_printf(b,
                   "\"group\":%llu,\"bytes_sent\":%llu,"
                   "\"bytes_received\":%llu,\"diverged\":%s}",
                   (unsigned long long)x->group_size,
                   (unsigned long long)x->bytes_sent,
                   (unsigned long long)x->bytes_received,
                   x->diverged ? "true" : "false");
  } else { /* the same keys, unknown yet */
    mon_buf_printf(b, "\"step\":null,\"loss\":null,\"compute_s\":null,"
                      "\"round_s\":null,\"averaged\":null,"
                      "\"loss_scale\":null,\"dropped\":null,\"group\":null,"
                      "\"bytes_sent\":null,\"bytes_received\":null,"
                      "\"diverged\":null}");
  }
}

static const char *event_name(int type) {
  switch (type) {
  case MON_EV_JOIN: return "join";
  case MON_EV_LEAVE: return "leave";
  case MON_EV_EPOCH: return "epoch";
  case MON_EV_STATE: return "state";
  case MON_EV_ROUND: return "round";
  default: return "bad";
  }
}

int mon_snapshot_json(const mon *m, mon_buf *b) {
  uint64_t joined, left, scrapes;
  mon_counts(m, &joined, &left, &scrapes);
  const mon_point *pt = mon_last(m);
  mon_buf_printf(b, "{\"run\":");
  mon_buf_json_str(b, mon_run(m));
  size_t n;
  const mon_peer *peers = mon_peers(m, &n);
  mon_buf_printf(b,
                 ",\"scrapes\":%llu,\"joined\":%llu,\"left\":%llu,"
                 "\"now\":",
                 (unsigned long long)scrapes, (unsigned long long)joined,
                 (unsigned long long)left);
  if (pt)
    point_json(b, pt);
  else
    mon_buf_printf(b, "null");
  mon_buf_printf(b, ",\"peers\":[");
  for (size_t i = 0; i < n; i++) {
    if (i)
      mon_buf_printf(b, ",");
    peer_json(b, &peers[i]);
  }
  mon_buf_printf(b, "],\"events\":[");
  const mon_event *ev[50];
  size_t k = mon_events(m, 0, ev, 50);
  for (size_t i = 0; i < k && i < 50; i++) {
    char id[2 * PROTO_ID_BYTES + 1] = "";
    if (ev[i]->type != MON_EV_EPOCH)
      proto_hex(ev[i]->id, PROTO_ID_BYTES, id);
    mon_buf_printf(b, "%s{\"t\":%llu,\"type\":\"%s\",\"id\":\"%s\",\"text\":",
                   i ? "," : "", (unsigned long long)ev[i]->time_ms,
                   event_name(ev[i]->type), id);
    mon_buf_json_str(b, ev[i]->text);
    mon_buf_printf(b, "}");
  }
  mon_buf_printf(b, "]}");
  return b->oom ? -ENOMEM : 0;
}

int mon_history_json(const mon *m, uint64_t since_ms, size_t max_points,
                     mon_buf *b) {
  size_t n = mon_history_n(m), first = n;
  for (size_t i = 0; i < n && first == n; i++)
    if (mon_history_at(m, i)->time_ms > since_ms)
      first = i;
  size_t k = n - first;
  double step =
      max_points && k > max_points ? (double)k / (double)max_points : 1.0;
  mon_buf_printf(b, "[");
  size_t out = 0;
  for (double f = (double)first; (size_t)f < n; f += step) {
    mon_buf_printf(b, "%s", out++ ? "," : "");
    point_json(b, mon_history_at(m, (size_t)f));
  }
  mon_buf_printf(b, "]");
  return b->oom ? -ENOMEM : 0;
}

int mon_line_json(const mon *m, mon_buf *b) {
  const mon_point *pt = mon_last(m);
  mon_buf_printf(b, "{\"run\":");
  mon_buf_json_str(b, mon_run(m));
  mon_buf_printf(b, ",\"point\":");
  if (pt)
    point_json(b, pt);
  else
    mon_buf_printf(b, "null");
  size_t n;
  const mon_peer *peers = mon_peers(m, &n);
  mon_buf_printf(b, ",\"peers\":[");
  for (size_t i = 0; i < n; i++) {
    const mon_peer *p = &peers[i];
    char id[2 * PROTO_ID_BYTES + 1];
    proto_hex(p->id, PROTO_ID_BYTES, id);
    mon_buf_printf(b, "%s{\"id\":\"%s\",\"label\":", i ? "," : "", id);
    mon_buf_json_str(b, p->progress.label);
    mon_buf_printf(b, ",\"epoch\":%llu,",
                   (unsigned long long)p->progress.epoch);
    num(b, "samples_per_second", p->progress.samples_per_second, true);
    num(b, "loss",
        p->has_metrics && p->metrics.has_loss ? p->metrics.loss : NAN, false);
    mon_buf_printf(b, "}");
  }
  mon_buf_printf(b, "]}");
  return b->oom ? -ENOMEM : 0;
}

/* A label value for Prometheus: backslash, quote and newline escaped. */
static void prom_label(mon_buf *b, const char *s) {
  for (; *s; s++) {
    if (*s == '\\' || *s == '"')
      mon_buf_printf(b, "\\%c", *s);
    else if (*s == '\n')
      mon_buf_printf(b, "\\n");
    else
      mon_buf_printf(b, "%c", *s);
  }
}

static void gauge(mon_buf *b, const char *name, const char *help, double x) {
  mon_buf_printf(b, "# HELP %s %s\n# TYPE %s gauge\n", name, help, name);
  if (isfinite(x))
    mon_buf_printf(b, "%s %.9g\n", name, x);
  else
    mon_buf_printf(b, "%s NaN\n", name);
}

static void links_prometheus(mon_buf *b, const mon_peer *peers, size_t n);

int mon_prometheus(const mon *m, mon_buf *b) {
  const mon_point *p = mon_last(m);
  mon_point zero = {
      .loss = NAN, .noise_scale = NAN, .averaged = NAN, .eta_s = -1};
  if (!p)
    p = &zero;
  uint64_t joined, left, scrapes;
  mon_counts(m, &joined, &left, &scrapes);
  gauge(b, "beed_swarm_epoch", "The swarm's epoch.", (double)p->epoch);
  gauge(b, "beed_swarm_samples", "Samples gathered toward the epoch's target.",
        (double)p->samples);
  gauge(b, "beed_swarm_target_samples", "The target batch (0: unknown).",
        (double)p->target);
  gauge(b, "beed_swarm_samples_per_second", "The swarm's training throughput.",
        p->samples_per_second);
  gauge(b, "beed_swarm_peers", "Peers with a live progress record.",
        (double)p->peers);
  gauge(b, "beed_swarm_loss", "Mean of the peers' last training losses.",
        p->loss);
  gauge(b, "beed_swarm_round_seconds", "Mean averaging time per epoch.",
        p->round_s);
  gauge(b, "beed_swarm_averaged_share",
        "Mean share of the tensor the last rounds averaged by all.",
        p->averaged);
  gauge(b, "beed_swarm_granularity",
        "Computing time over averaging time per epoch.", p->granularity);
  gauge(b, "beed_swarm_noise_scale",
        "Gradient noise scale (critical batch size estimate).", p->noise_scale);
  mon_buf_printf(b,
                 "# HELP beed_peers_joined_total Peers seen joining.\n"
                 "# TYPE beed_peers_joined_total counter\n"
                 "beed_peers_joined_total %llu\n"
                 "# HELP beed_peers_left_total Peers seen leaving.\n"
                 "# TYPE beed_peers_left_total counter\n"
                 "beed_peers_left_total %llu\n",
                 (unsigned long long)joined, (unsigned long long)left);
  size_t n;
  const mon_peer *peers = mon_peers(m, &n);
  static const struct {
    const char *name, *help;
  } per[] = {{"beed_peer_epoch", "A peer's epoch."},
             {"beed_peer_samples_per_second", "A peer's throughput."},
             {"beed_peer_loss", "A peer's last training loss."}};
  for (size_t k = 0; k < sizeof per / sizeof *per; k++) {
    mon_buf_printf(b, "# HELP %s %s\n# TYPE %s gauge\n", per[k].name,
                   per[k].help, per[k].name);
    for (size_t i = 0; i < n; i++) {
      const mon_peer *q = &peers[i];
      double x = k == 0   ? (double)q->progress.epoch
                 : k == 1 ? q->progress.samples_per_second
                 : q->has_metrics && q->metrics.has_loss ? q->metrics.loss
                                                         : NAN;
      char id[2 * PROTO_ID_BYTES + 1];
      proto_hex(q->id, PROTO_ID_BYTES, id);
      mon_buf_printf(b, "%s{peer=\"%s\",label=\"", per[k].name, id);
      prom_label(b, q->progress.label);
      if (isfinite(x))
        mon_buf_printf(b, "\"} %.9g\n", x);
      else
        mon_buf_printf(b, "\"} NaN\n");
    }
  }
  links_prometheus(b, peers, n);
  return b->oom ? -ENOMEM : 0;
}

/* The entries of the known peers' links records whose other end is a
 * known peer too: fn(from, to, entry) for each. */
static void each_link(const mon_peer *peers, size_t n,
                      void (*fn)(mon_buf *b, const mon_peer *from,
                                 const mon_peer *to, const proto_link *l),
                      mon_buf *b) {
  for (size_t j = 0; j < n; j++) {
    const proto_links *r = peers[j].links;
    for (size_t e = 0; r && e < r->n; e++)
      for (size_t i = 0; i < n; i++)
        if (i != j && memcmp(peers[i].id, r->links[e].id, PROTO_ID_BYTES) == 0)
          fn(b, &peers[i], &peers[j], &r->links[e]);
  }
}

static void link_json(mon_buf *b, const mon_peer *from, const mon_peer *to,
                      const proto_link *l) {
  char a[2 * PROTO_ID_BYTES + 1], c[2 * PROTO_ID_BYTES + 1];
  proto_hex(from->id, PROTO_ID_BYTES, a);
  proto_hex(to->id, PROTO_ID_BYTES, c);
  if (b->len && b->p[b->len - 1] == '}') /* not the list's first */
    mon_buf_printf(b, ",");
  mon_buf_printf(b, "{\"from\":\"%s\",\"to\":\"%s\",", a, c);
  num(b, "rtt_ms", l->rtt_us ? (double)l->rtt_us / 1000 : NAN, true);
  num(b, "mbit", l->mbit > 0 ? l->mbit : NAN, true);
  mon_buf_printf(b, "\"age_s\":%llu}", (unsigned long long)l->age_s);
}

int mon_links_json(const mon *m, mon_buf *b) {
  size_t n;
  const mon_peer *peers = mon_peers(m, &n);
  mon_buf_printf(b, "{\"run\":");
  mon_buf_json_str(b, mon_run(m));
  mon_buf_printf(b, ",\"bees\":[");
  for (size_t i = 0; i < n; i++) {
    char id[2 * PROTO_ID_BYTES + 1];
    proto_hex(peers[i].id, PROTO_ID_BYTES, id);
    mon_buf_printf(b, "%s{\"id\":\"%s\",\"label\":", i ? "," : "", id);
    mon_buf_json_str(b, peers[i].progress.label);
    mon_buf_printf(b, "}");
  }
  mon_buf_printf(b, "],\"links\":[");
  each_link(peers, n, link_json, b);
  mon_buf_printf(b, "]}");
  return b->oom ? -ENOMEM : 0;
}

static void link_rtt(mon_buf *b, const mon_peer *from, const mon_peer *to,
                     const proto_link *l) {
  char a[2 * PROTO_ID_BYTES + 1], c[2 * PROTO_ID_BYTES + 1];
  if (!l->rtt_us)
    return;
  proto_hex(from->id, PROTO_ID_BYTES, a);
  proto_hex(to->id, PROTO_ID_BYTES, c);
  mon_buf_printf(b, "beed_link_rtt_seconds{from=\"%s\",to=\"%s\"} %.9g\n", a, c,
                 (double)l->rtt_us / 1e6);
}

static void link_bits(mon_buf *b, const mon_peer *from, const mon_peer *to,
                      const proto_link *l) {
  char a[2 * PROTO_ID_BYTES + 1], c[2 * PROTO_ID_BYTES + 1];
  if (!(l->mbit > 0))
    return;
  proto_hex(from->id, PROTO_ID_BYTES, a);
  proto_hex(to->id, PROTO_ID_BYTES, c);
  mon_buf_printf(b, "beed_link_bandwidth_bits{from=\"%s\",to=\"%s\"} %.9g\n", a,
                 c, l->mbit * 1e6);
}

static void links_prometheus(mon_buf *b, const mon_peer *peers, size_t n) {
  mon_buf_printf(b, "# HELP beed_link_rtt_seconds The least round trip "
                    "from one peer to another, as the receiving peer "
                    "measured it.\n"
                    "# TYPE beed_link_rtt_seconds gauge\n");
  each_link(peers, n, link_rtt, b);
  mon_buf_printf(b, "# HELP beed_link_bandwidth_bits The rate data from one "
                    "peer reached another at, bits per second, as the "
                    "receiving peer measured it.\n"
                    "# TYPE beed_link_bandwidth_bits gauge\n");
  each_link(peers, n, link_bits, b);
}
