/* test-monitor-aggregate.c: trainmonitor's core on made-up scrapes.
 *
 * Three peers of run "r" (one a client) and one of another run: the
 * point's epoch, samples, rate, ETA and means; joins, a peer that says
 * it left and one that goes quiet; a malformed record reported once per
 * peer; the inferred target; the noise scale against its formula; the
 * history's thinning; the JSON and Prometheus texts; the link matrix.
 */
#define _GNU_SOURCE /* memmem */
#include "monitor.h"
#include "test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define NOW 1800000000000ull /* unix ms */

typedef struct rec {
  uint8_t id[PROTO_ID_BYTES];
  uint8_t buf[512];
  size_t n;
} rec;

static void progress(rec *r, int who, const char *run, uint64_t epoch,
                     uint64_t samples, double rate, uint64_t t, int mode,
                     const char *label, bool leaving) {
  memset(r->id, 0, sizeof r->id);
  r->id[0] = (uint8_t)who;
  proto_progress p = {.epoch = epoch,
                      .samples = samples,
                      .samples_per_second = rate,
                      .time_ms = t,
                      .mode = mode,
                      .leaving = leaving};
  snprintf(p.run, sizeof p.run, "%s", run);
  snprintf(p.label, sizeof p.label, "%s", label);
  ASSERT_OK(proto_progress_encode(&p, r->buf, sizeof r->buf, &r->n));
}

/* The by_all field metrics() writes; < 0: none. */
static double g_by_all = -1;
static bool g_diverged; /* the next metrics record says diverged */
static double g_scale;  /* its loss scale (0: none), with its hash */
static uint64_t g_dropped; /* and its batches dropped for overflow */

static void metrics(rec *r, int who, uint64_t step, double loss, double comp,
                    double avg, uint64_t group, double gl, uint64_t bl,
                    double ga, uint64_t ba, uint64_t t) {
  memset(r->id, 0, sizeof r->id);
  r->id[0] = (uint8_t)who;
  proto_metrics x = {.step = step,
                     .has_loss = true,
                     .loss = loss,
                     .samples_per_second = 100,
                     .compute_s = comp,
                     .averaging_s = avg,
                     .bytes_sent = 2u << 20,
                     .bytes_received = 2u << 20,
                     .group_size = group,
                     .grad_sq_local = gl,
                     .batch_local = bl,
                     .grad_sq_avg = ga,
                     .batch_avg = ba,
                     .time_ms = t,
                     .has_by_all = g_by_all >= 0,
                     .by_all = g_by_all >= 0 ? g_by_all : 0,
                     .diverged = g_diverged && g_by_all >= 0,
                     .has_params = g_scale > 0,
                     .has_loss_scale = g_scale > 0,
                     .loss_scale = g_scale,
                     .dropped = g_dropped};
  snprintf(x.run, sizeof x.run, "r");
  ASSERT_OK(proto_metrics_encode(&x, r->buf, sizeof r->buf, &r->n));
}

static mon_record view(const rec *r) {
  return (mon_record){r->id, r->buf, r->n};
}

static bool has_event(const mon *m, int type, const char *text) {
  const mon_event *ev[MON_EVENTS_MAX];
  size_t n = mon_events(m, 0, ev, MON_EVENTS_MAX);
  for (size_t i = 0; i < n; i++)
    if (ev[i]->type == type && strstr(ev[i]->text, text))
      return true;
  return false;
}

/* How many events of a type the monitor keeps. */
static size_t events_of(const mon *m, int type) {
  const mon_event *ev[MON_EVENTS_MAX];
  size_t n = mon_events(m, 0, ev, MON_EVENTS_MAX), k = 0;
  for (size_t i = 0; i < n; i++)
    k += ev[i]->type == type;
  return k;
}

static void test_scrapes(void) {
  mon_config cfg = {.run = "r", .target = 1000};
  mon *m;
  ASSERT_OK(mon_new(&cfg, &m));
  rec p[4], x[3];
  /* Peers 1 and 2 at epoch 5, the client 3 at epoch 7 (a client's epoch
   * is not the swarm's), peer 4 of another run. */
  progress(&p[0], 1, "r", 5, 300, 100, NOW, PROTO_MODE_NODE, "eu \"west\"",
           false);
  progress(&p[1], 2, "r", 5, 200, 50, NOW, PROTO_MODE_NODE, "us", false);
  progress(&p[2], 3, "r", 7, 10, 10, NOW, PROTO_MODE_CLIENT, "nat", false);
  progress(&p[3], 4, "other", 9, 10, 10, NOW, PROTO_MODE_NODE, "", false);
  metrics(&x[0], 1, 5, 1.0, 2.0, 1.0, 2, 4.0, 100, 2.5, 200, NOW);
  metrics(&x[1], 2, 5, 2.0, 4.0, 1.0, 2, 4.0, 100, 2.5, 200, NOW);
  mon_record pr[4] = {view(&p[0]), view(&p[1]), view(&p[2]), view(&p[3])};
  mon_record mr[2] = {view(&x[0]), view(&x[1])};
  const mon_point *pt = mon_scrape(m, NOW, pr, 4, mr, 2);
  ASSERT_UEQ(pt->epoch, 5);
  ASSERT_UEQ(pt->samples, 500);
  ASSERT_UEQ(pt->target, 1000);
  ASSERT_EQ(pt->peers, 3);
  ASSERT(fabs(pt->samples_per_second - 160) < 1e-9);
  ASSERT(fabs(pt->eta_s - 500.0 / 160) < 1e-9);
  ASSERT(fabs(pt->loss - 1.5) < 1e-12);
  ASSERT(fabs(pt->compute_s - 3.0) < 1e-12);
  ASSERT(fabs(pt->round_s - 1.0) < 1e-12);
  ASSERT(fabs(pt->granularity - 3.0) < 1e-12);
  ASSERT(fabs(pt->group - 2.0) < 1e-12);
  ASSERT(fabs(pt->mib_sent - 2.0) < 1e-12);
  /* Noise scale: |G|^2 = (200 x 2.5 - 100 x 4) / 100 = 1; tr(Sigma) =
   * (4 - 2.5) / (1/100 - 1/200) = 300; B = 300. */
  ASSERT(fabs(pt->noise_scale - 300) < 1e-9);
  size_t n;
  mon_peers(m, &n);
  ASSERT_EQ(n, 3); /* the other run's peer is not kept as a peer */
  uint64_t joined, left, scrapes;
  mon_counts(m, &joined, &left, &scrapes);
  ASSERT_UEQ(joined, 3);
  ASSERT_UEQ(left, 0);
  ASSERT(has_event(m, MON_EV_JOIN, "01000000 joined"));

  /* A second scrape: peer 2 says it left, peer 1 moves to epoch 6, the
   * client's record turns malformed (twice: one event). */
  progress(&p[0], 1, "r", 6, 100, 100, NOW + 1000, PROTO_MODE_NODE, "eu",
           false);
  progress(&p[1], 2, "r", 5, 200, 50, NOW + 1000, PROTO_MODE_NODE, "us", true);
  p[2].buf[0] ^= 0xff;
  pr[0] = view(&p[0]);
  pr[1] = view(&p[1]);
  pr[2] = view(&p[2]);
  pt = mon_scrape(m, NOW + 1000, pr, 3, mr, 0);
  pt = mon_scrape(m, NOW + 2000, pr, 3, mr, 0);
  ASSERT_UEQ(pt->epoch, 6);
  mon_counts(m, &joined, &left, &scrapes);
  ASSERT_UEQ(left, 1);
  ASSERT(has_event(m, MON_EV_LEAVE, "02000000 left"));
  ASSERT(has_event(m, MON_EV_EPOCH, "epoch 6"));
  ASSERT_EQ(events_of(m, MON_EV_BAD), 1);
  const mon_event *ev[MON_EVENTS_MAX];
  size_t nev = mon_events(m, 0, ev, MON_EVENTS_MAX);
  /* Since a time: only the newer events; max keeps the newest. */
  ASSERT_EQ(mon_events(m, NOW + 1000, NULL, 0), 0);
  ASSERT_EQ(mon_events(m, NOW, ev, 1), nev - 3);
  ASSERT(ev[0]->time_ms == NOW + 1000);

  /* Nothing new for MON_GONE_MS: peer 1 (its record stays the same) and
   * the client go quiet. */
  pr[0] = view(&p[0]);
  pt = mon_scrape(m, NOW + 1000 + MON_GONE_MS, pr, 1, mr, 0);
  mon_peers(m, &n);
  ASSERT_EQ(n, 0);
  mon_counts(m, &joined, &left, &scrapes);
  ASSERT_UEQ(left, 3);
  ASSERT(has_event(m, MON_EV_LEAVE, "01000000 went quiet"));
  ASSERT_EQ(pt->peers, 0);
  ASSERT(isnan(pt->loss));
  ASSERT(isnan(pt->noise_scale));
  ASSERT_UEQ(scrapes, 4);
  mon_free(m);
}

/* Without --target-batch-size: the samples an epoch held when the swarm
 * moved past it. */
static void test_inferred_target(void) {
  mon_config cfg = {.run = "r"};
  mon *m;
  ASSERT_OK(mon_new(&cfg, &m));
  rec p;
  progress(&p, 1, "r", 0, 4000, 1000, NOW, PROTO_MODE_NODE, "", false);
  mon_record r = view(&p);
  const mon_point *pt = mon_scrape(m, NOW, &r, 1, NULL, 0);
  ASSERT_UEQ(pt->target, 0);
  ASSERT(pt->eta_s < 0);
  progress(&p, 1, "r", 1, 1000, 1000, NOW + 1000, PROTO_MODE_NODE, "", false);
  r = view(&p);
  pt = mon_scrape(m, NOW + 1000, &r, 1, NULL, 0);
  ASSERT_UEQ(pt->target, 4000);
  ASSERT(fabs(pt->eta_s - 3.0) < 1e-9);
  mon_free(m);
}

/* History: history_max points as they are, older ones one in 60. */
static void test_history(void) {
  mon_config cfg = {.run = "r", .history_max = 100};
  mon *m;
  ASSERT_OK(mon_new(&cfg, &m));
  for (uint64_t i = 0; i < 100 + 600; i++)
    mon_scrape(m, NOW + i * 1000, NULL, 0, NULL, 0);
  ASSERT_EQ(mon_history_n(m), 100 + 10);
  ASSERT_UEQ(mon_history_at(m, 0)->time_ms, NOW);
  ASSERT_UEQ(mon_history_at(m, 1)->time_ms, NOW + 60000);
  ASSERT_UEQ(mon_history_at(m, 109)->time_ms, NOW + 699000);
  mon_buf b = {0};
  ASSERT_OK(mon_history_json(m, NOW + 689000, 0, &b));
  ASSERT_EQ(strncmp(b.p, "[{\"t\":1800000690000,", 20), 0);
  size_t points = 0;
  for (const char *c = b.p; (c = strstr(c, "\"t\":")); c++)
    points++;
  ASSERT_EQ(points, 10);
  mon_buf_free(&b);
  ASSERT_OK(mon_history_json(m, 0, 11, &b));
  points = 0;
  for (const char *c = b.p; (c = strstr(c, "\"t\":")); c++)
    points++;
  ASSERT_LE(points, 11);
  ASSERT_GE(points, 10);
  mon_buf_free(&b);
  mon_free(m);
}

static void test_render(void) {
  mon_config cfg = {.run = "r\"q", .target = 1000};
  mon *m;
  ASSERT_OK(mon_new(&cfg, &m));
  mon_buf b = {0};
  ASSERT_OK(mon_snapshot_json(m, &b));
  ASSERT(strstr(b.p, "\"run\":\"r\\\"q\"") != NULL);
  ASSERT(strstr(b.p, "\"now\":null") != NULL);
  mon_buf_free(&b);
  mon_free(m);
  snprintf(cfg.run, sizeof cfg.run, "r");
  ASSERT_OK(mon_new(&cfg, &m));
  rec p, x;
  progress(&p, 1, "r", 2, 10, 5, NOW, PROTO_MODE_NODE, "a\\b \"c\"", false);
  metrics(&x, 1, 2, 0.5, 1, 0.5, 1, 1, 64, 1, 64, NOW);
  mon_record pr = view(&p), mr = view(&x);
  mon_scrape(m, NOW, &pr, 1, &mr, 1);
  ASSERT_OK(mon_snapshot_json(m, &b));
  ASSERT(strstr(b.p, "\"label\":\"a\\\\b \\\"c\\\"\"") != NULL);
  ASSERT(strstr(b.p, "\"loss\":0.5,") != NULL);
  ASSERT(strstr(b.p, "\"noise_scale\":null") != NULL); /* one batch size */
  ASSERT(strstr(b.p, "\"epoch\":2,") != NULL);
  ASSERT(strstr(b.p, "\"type\":\"join\"") != NULL);
  mon_buf_free(&b);
  ASSERT_OK(mon_prometheus(m, &b));
  ASSERT(strstr(b.p, "# TYPE beed_swarm_epoch gauge\nbeed_swarm_epoch 2\n"));
  ASSERT(strstr(b.p, "beed_swarm_loss 0.5\n"));
  ASSERT(strstr(b.p, "beed_swarm_noise_scale NaN\n"));
  ASSERT(strstr(b.p, "beed_peers_joined_total 1\n"));
  ASSERT(strstr(b.p, "beed_peer_epoch{peer=\"01000000"));
  ASSERT(strstr(b.p, "label=\"a\\\\b \\\"c\\\"\"} 2\n"));
  mon_buf_free(&b);
  mon_free(m);
  mon_config bad = {.run = ""};
  ASSERT_EQ(mon_new(&bad, &m), BEE_ECONFIG);
  ASSERT(m == NULL);
}

/* Donor records give a peer its address and free slots; a malformed one
 * is reported once; one of a peer not known is dropped. */
static void test_donors(void) {
  mon_config cfg = {.run = "r"};
  mon *m;
  ASSERT_OK(mon_new(&cfg, &m));
  rec p, d[3];
  progress(&p, 1, "r", 4, 0, 10, NOW, PROTO_MODE_NODE, "", false);
  mon_record pr = view(&p);
  mon_scrape(m, NOW, &pr, 1, NULL, 0);
  proto_donor x = {.epoch = 4, .slots = 2};
  snprintf(x.run, sizeof x.run, "r");
  snprintf(x.addr, sizeof x.addr, "10.0.0.7:45555");
  for (int i = 0; i < 3; i++) {
    memset(d[i].id, 0, sizeof d[i].id);
    d[i].id[0] = (uint8_t)(i + 1); /* peers 1 (known), 2 and 3 (not) */
    ASSERT_OK(proto_donor_encode(&x, d[i].buf, sizeof d[i].buf, &d[i].n));
  }
  d[2].buf[0] ^= 0xff;
  mon_record dr[3] = {view(&d[0]), view(&d[1]), view(&d[2])};
  mon_donors(m, NOW, dr, 3);
  mon_donors(m, NOW + 1000, dr, 3);
  size_t n;
  const mon_peer *peers = mon_peers(m, &n);
  ASSERT_EQ(n, 1);
  ASSERT(peers[0].has_donor);
  ASSERT(strcmp(peers[0].addr, "10.0.0.7:45555") == 0);
  ASSERT_UEQ(peers[0].slots, 2);
  ASSERT(has_event(m, MON_EV_BAD, "03000000 sent a malformed donor record"));
  ASSERT_EQ(events_of(m, MON_EV_BAD), 1);
  mon_buf b = {0};
  ASSERT_OK(mon_snapshot_json(m, &b));
  ASSERT(strstr(b.p, "\"addr\":\"10.0.0.7:45555\",\"slots\":2,") != NULL);
  mon_buf_free(&b);
  mon_free(m);
}

/* Links records: each known peer's kept and shown as a matrix (JSON and
 * Prometheus) among the known peers; a forged one (a peer named twice)
 * reported once and dropped; one not found for MON_GONE_MS dropped. */
static void test_links(void) {
  mon_config cfg = {.run = "r"};
  mon *m;
  ASSERT_OK(mon_new(&cfg, &m));
  rec p[2];
  progress(&p[0], 1, "r", 4, 0, 10, NOW, PROTO_MODE_NODE, "us", false);
  progress(&p[1], 2, "r", 4, 0, 10, NOW, PROTO_MODE_NODE, "eu", false);
  mon_record pr[2] = {view(&p[0]), view(&p[1])};
  mon_scrape(m, NOW, pr, 2, NULL, 0);
  /* Peer 2's record: from peer 1 at 210 Mbit/s over 103 ms, from peer 9
   * (not known) too.  Peer 3's is forged. */
  static uint8_t lb[2][PROTO_LINKS_RECORD_MAX];
  mon_record lr[2];
  proto_links l = {.time_ms = NOW, .n = 2};
  snprintf(l.run, sizeof l.run, "r");
  memset(l.links[0].id, 0, PROTO_ID_BYTES);
  l.links[0].id[0] = 1;
  l.links[0].rtt_us = 103000;
  l.links[0].mbit = 210;
  memset(l.links[1].id, 0, PROTO_ID_BYTES);
  l.links[1].id[0] = 9;
  l.links[1].rtt_us = 5000;
  static uint8_t ids[2][PROTO_ID_BYTES] = {{2}, {3}};
  size_t len[2];
  ASSERT_OK(proto_links_encode(&l, lb[0], sizeof lb[0], &len[0]));
  memcpy(lb[1], lb[0], len[0]);
  len[1] = len[0];
  /* the second entry's id becomes the first's: a peer twice */
  uint8_t *second = memmem(lb[1], len[1], l.links[1].id, PROTO_ID_BYTES);
  ASSERT(second);
  second[0] = 1;
  for (int i = 0; i < 2; i++)
    lr[i] = (mon_record){ids[i], lb[i], len[i]};
  ASSERT_OK(mon_links(m, NOW, lr, 2));
  ASSERT_OK(mon_links(m, NOW + 1000, lr, 2));
  ASSERT_EQ(events_of(m, MON_EV_BAD), 1);
  ASSERT(has_event(m, MON_EV_BAD, "03000000 sent a malformed links record"));
  mon_buf b = {0};
  ASSERT_OK(mon_links_json(m, &b));
  ASSERT(strstr(
      b.p, "\"bees\":[{\"id\":\"0100000000000000000000000000000000000000\","
           "\"label\":\"us\"},"));
  ASSERT(strstr(
      b.p, "\"links\":[{\"from\":\"0100000000000000000000000000000000000000\","
           "\"to\":\"0200000000000000000000000000000000000000\","
           "\"rtt_ms\":103,\"mbit\":210,\"age_s\":0}]}"));
  mon_buf_free(&b);
  ASSERT_OK(mon_prometheus(m, &b));
  ASSERT(strstr(
      b.p,
      "# TYPE beed_link_rtt_seconds gauge\n"
      "beed_link_rtt_seconds{from=\"0100000000000000000000000000000000000000\","
      "to=\"0200000000000000000000000000000000000000\"} 0.103\n"));
  ASSERT(strstr(
      b.p, "beed_link_bandwidth_bits{from="
           "\"0100000000000000000000000000000000000000\","
           "to=\"0200000000000000000000000000000000000000\"} 210000000\n"));
  ASSERT(!strstr(b.p, "from=\"09")); /* not a known peer */
  mon_buf_free(&b);
  /* Not found again for MON_GONE_MS: gone from the matrix. */
  mon_scrape(m, NOW + MON_GONE_MS / 2, pr, 2, NULL, 0);
  ASSERT_OK(mon_links(m, NOW + MON_GONE_MS + 1000, NULL, 0));
  ASSERT_OK(mon_links_json(m, &b));
  ASSERT(strstr(b.p, "\"links\":[]}"));
  mon_buf_free(&b);
  mon_free(m);
}

/* The mean loss weighs each peer's by the samples of its epoch. */
static void test_loss_weights(void) {
  mon_config cfg = {.run = "r"};
  mon *m;
  ASSERT_OK(mon_new(&cfg, &m));
  rec p[2], x[2];
  progress(&p[0], 1, "r", 1, 0, 10, NOW, PROTO_MODE_NODE, "", false);
  progress(&p[1], 2, "r", 1, 0, 10, NOW, PROTO_MODE_NODE, "", false);
  g_by_all = 1;
  metrics(&x[0], 1, 1, 1.0, 1, 1, 2, 0, 100, 0, 400, NOW);
  g_by_all = 0.5;
  metrics(&x[1], 2, 1, 2.0, 1, 1, 2, 0, 300, 0, 400, NOW);
  g_by_all = -1;
  mon_record pr[2] = {view(&p[0]), view(&p[1])};
  mon_record mr[2] = {view(&x[0]), view(&x[1])};
  const mon_point *pt = mon_scrape(m, NOW, pr, 2, mr, 2);
  ASSERT(fabs(pt->loss - 1.75) < 1e-12);
  ASSERT(fabs(pt->averaged - 0.75) < 1e-12); /* the rounds' shares */
  mon_buf b = {0};
  ASSERT_OK(mon_prometheus(m, &b));
  ASSERT(strstr(b.p, "beed_swarm_averaged_share 0.75\n") != NULL);
  mon_buf_free(&b);
  mon_free(m);
}

/* A newcomer that loads the state, a round a member left, and a bee
 * that stepped alone: one event each, at the step they happened, and
 * none for steps that went well or for the first record of a peer. */
/* Peer 1's metrics for step (its group of group, the by_all, diverged
 * and loss-scale settings above) scraped times times, 1 s apart from at,
 * with the progress records pr of both peers. */
static void peer1_step(mon *m, rec *x, const mon_record *pr, mon_record *mr,
                       uint64_t step, uint64_t group, uint64_t at, int times) {
  metrics(x, 1, step, 1.0, 1, 1, group, 1, 1, 1, 1, at);
  mr[0] = view(x);
  for (int i = 0; i < times; i++)
    mon_scrape(m, at + 1000 * (uint64_t)i, pr, 2, mr, 1);
}

static void test_round_events(void) {
  mon_config cfg = {.run = "r"};
  mon *m;
  ASSERT_OK(mon_new(&cfg, &m));
  rec p[2], x[2];
  mon_record pr[2], mr[2];
  uint64_t t = NOW;
  /* Scrape 1: peer 1 at epoch 9 (its first metrics said it stepped alone
   * long ago: not an event), peer 2 just started at epoch 0. */
  progress(&p[0], 1, "r", 9, 10, 100, t, PROTO_MODE_NODE, "", false);
  progress(&p[1], 2, "r", 0, 10, 100, t, PROTO_MODE_NODE, "", false);
  metrics(&x[0], 1, 8, 1.0, 1, 1, 1, 1, 1, 1, 1, t);
  for (int i = 0; i < 2; i++)
    pr[i] = view(&p[i]), mr[i] = view(&x[i]);
  mon_scrape(m, t, pr, 2, mr, 1);
  ASSERT_EQ(events_of(m, MON_EV_STATE), 0);
  ASSERT_EQ(events_of(m, MON_EV_ROUND), 0);
  /* Scrape 2: peer 2 jumped to epoch 9 (it loaded the state); peer 1's
   * step 9 was averaged by a group of 2 in full. */
  t += 1000;
  progress(&p[0], 1, "r", 10, 10, 100, t, PROTO_MODE_NODE, "", false);
  progress(&p[1], 2, "r", 9, 10, 100, t, PROTO_MODE_NODE, "", false);
  g_by_all = 1;
  metrics(&x[0], 1, 9, 1.0, 1, 1, 2, 1, 1, 1, 1, t);
  for (int i = 0; i < 2; i++)
    pr[i] = view(&p[i]), mr[i] = view(&x[i]);
  mon_scrape(m, t, pr, 2, mr, 1);
  ASSERT(has_event(m, MON_EV_STATE, "02000000 loaded the state: epoch 0 to 9"));
  ASSERT_EQ(events_of(m, MON_EV_ROUND), 0);
  /* Scrape 3: peer 1's step 10 lost a member (60% averaged by all), the
   * same record again a scrape later (one event), then step 11 alone. */
  g_by_all = 0.6;
  peer1_step(m, &x[0], pr, mr, 10, 2, t + 1000, 2);
  ASSERT(has_event(m, MON_EV_ROUND,
                   "01000000 epoch 10: the group of 2 averaged 60% by all"));
  g_by_all = 0;
  peer1_step(m, &x[0], pr, mr, 11, 1, t + 3000, 1);
  g_by_all = -1;
  ASSERT(has_event(m, MON_EV_ROUND,
                   "01000000 stepped alone at epoch 11 (no group)"));
  ASSERT_EQ(events_of(m, MON_EV_ROUND), 2);
  ASSERT_EQ(events_of(m, MON_EV_STATE), 1);
  /* Scrape 4: peer 1's step 12 says its parameters left the swarm's (one
   * event, the same record again adds none); the JSON says so. */
  g_by_all = 0;
  g_diverged = true;
  peer1_step(m, &x[0], pr, mr, 12, 1, t + 4000, 2);
  ASSERT(has_event(m, MON_EV_ROUND, "01000000 out of line from epoch 12: "
                                    "stepped without its peers' round"));
  mon_buf b = {0};
  ASSERT_OK(mon_snapshot_json(m, &b));
  ASSERT(strstr(b.p, "\"diverged\":true") != NULL);
  mon_buf_free(&b);
  /* Scrape 5: step 13 averaged in full, no longer diverged: back. */
  g_by_all = 1;
  g_diverged = false;
  peer1_step(m, &x[0], pr, mr, 13, 2, t + 6000, 1);
  g_by_all = -1;
  ASSERT(has_event(m, MON_EV_ROUND, "01000000 back in line at epoch 13"));
  ASSERT_EQ(events_of(m, MON_EV_ROUND), 5);
  ASSERT_OK(mon_snapshot_json(m, &b));
  ASSERT(strstr(b.p, "\"diverged\":true") == NULL);
  ASSERT(strstr(b.p, "\"diverged\":false") != NULL);
  ASSERT(strstr(b.p, "\"type\":\"state\"") != NULL);
  ASSERT(strstr(b.p, "\"type\":\"round\"") != NULL);
  ASSERT(strstr(b.p, "\"loss_scale\":null,\"dropped\":null") != NULL);
  mon_buf_free(&b);
  /* Scrape 6: step 14 with loss scaling, 3 batches dropped (one event,
   * the same record again adds none), then step 15 with none dropped. */
  g_by_all = 1;
  g_scale = 32768;
  g_dropped = 3;
  peer1_step(m, &x[0], pr, mr, 14, 2, t + 7000, 2);
  ASSERT(has_event(m, MON_EV_ROUND,
                   "01000000 epoch 14: 3 batches dropped for overflow, loss "
                   "scale now 2^15"));
  ASSERT_EQ(events_of(m, MON_EV_ROUND), 6);
  ASSERT_OK(mon_snapshot_json(m, &b));
  ASSERT(strstr(b.p, "\"loss_scale\":32768,\"dropped\":3,") != NULL);
  mon_buf_free(&b);
  g_dropped = 0;
  peer1_step(m, &x[0], pr, mr, 15, 2, t + 9000, 1);
  ASSERT_EQ(events_of(m, MON_EV_ROUND), 6);
  ASSERT_OK(mon_snapshot_json(m, &b));
  ASSERT(strstr(b.p, "\"loss_scale\":32768,\"dropped\":0,") != NULL);
  mon_buf_free(&b);
  /* A line longer than an event holds (numbers this wide come only from
   * a peer that lies): cut to the field, ending "...". */
  g_dropped = 1000000000000000000ull;
  peer1_step(m, &x[0], pr, mr, 1000000000000000000ull, 2, t + 11000, 1);
  ASSERT_EQ(events_of(m, MON_EV_ROUND), 7);
  const mon_event *ev[MON_EVENTS_MAX];
  size_t nev = mon_events(m, 0, ev, MON_EVENTS_MAX);
  const char *cut = ev[nev - 1]->text;
  ASSERT_EQ(strlen(cut), sizeof ev[0]->text - 1);
  ASSERT(strncmp(cut, "01000000 epoch 1000000000000000000: "
                      "1000000000000000000 batches dropped",
                 71) == 0);
  ASSERT(strcmp(cut + strlen(cut) - 3, "...") == 0);
  g_by_all = -1, g_scale = 0, g_dropped = 0;
  mon_free(m);
}

int main(void) {
  test_round_events();
  test_loss_weights();
  test_donors();
  test_links();
  test_scrapes();
  test_inferred_target();
  test_history();
  test_render();
  return 0;
}
