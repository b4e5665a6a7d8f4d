/* dhtsim.c: a simulated network for the DHT core: nodes, a fake clock and
 * one deterministic event queue (see dhtsim.h). */
#include "dhtsim.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#define METHODS_MAX 16

enum { EV_REQUEST = 1, EV_ANSWER, EV_TICK, EV_JOIN };

/* One event.  REQUEST: node receives peer's request req; ANSWER: node
 * (the sender) gets the answer to req from peer; TICK: node's tick
 * number gen; JOIN: node bootstraps through peer (UINT32_MAX: random). */
typedef struct event {
  uint64_t at;
  uint64_t seq;
  uint64_t req;      /* REQUEST, ANSWER: the sender's request id; TICK: gen */
  uint64_t deadline; /* REQUEST: when the sender gives up */
  uint8_t *payload;  /* owned copy, or NULL */
  uint32_t len;
  uint32_t node;
  uint32_t peer;
  int32_t status; /* ANSWER */
  uint8_t type;
  uint8_t method; /* REQUEST: index into dhtsim.methods */
  bool no_answer; /* REQUEST: the sender's timeout fires first */
} event;

/* One millisecond's events in the wheel: v[head..n) wait, in seq order. */
typedef struct ev_slot {
  event *v;
  uint32_t head, n, cap;
} ev_slot;

#define WHEEL_MS 4096u /* covers latencies, stalls and RPC timeouts */

typedef struct sim_node {
  proto_identity id;
  dht_io io;
  dhtsim *sim;
  dht_node *dn;     /* NULL once killed */
  uint64_t tick_at; /* time of the live tick event, UINT64_MAX: none */
  uint64_t tick_gen;
  uint32_t index;
  int32_t join; /* 1: not joined, 0: joined, < 0: failed */
} sim_node;

struct dhtsim {
  dht_config cfg;
  uint64_t seed;
  uint64_t rng[4]; /* xoshiro256** */
  uint64_t now;
  uint64_t seq;
  uint64_t lat_min, lat_max;
  unsigned loss;
  uint64_t stall_ms;
  int (*validate)(void *arg, size_t node, const proto_dht_record *r);
  void *validate_arg;

  sim_node **nodes;
  size_t n, cap, live;

  /* The event queue: events due within WHEEL_MS of the wheel's cursor
   * sit in the wheel's slot for their millisecond, in push order; later
   * ones (and any pushed behind the cursor) in the heap. */
  event *heap;
  size_t heap_n, heap_cap;
  ev_slot *wheel; /* WHEEL_MS */
  size_t wheel_n;
  uint64_t cursor;

  char *methods[METHODS_MAX];
  size_t nmethods;

  uint8_t *out; /* DHT_ANSWER_MAX: every node's answers are written here */
  uint64_t joins_scheduled, joins_pending;
  dhtsim_counters c;
};

/* ---- small helpers ------------------------------------------------------ */

static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) {
    fprintf(stderr, "dhtsim: out of memory (%zu bytes)\n", n);
    abort();
  }
  return p;
}

static void *xrealloc(void *p, size_t n) {
  p = realloc(p, n ? n : 1);
  if (!p) {
    fprintf(stderr, "dhtsim: out of memory (%zu bytes)\n", n);
    abort();
  }
  return p;
}

static uint64_t splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t dhtsim_rand(dhtsim *s) {
  uint64_t *r = s->rng;
  uint64_t out = rotl(r[1] * 5, 7) * 9;
  uint64_t t = r[1] << 17;
  r[2] ^= r[0];
  r[3] ^= r[1];
  r[1] ^= r[2];
  r[0] ^= r[3];
  r[2] ^= t;
  r[3] = rotl(r[3], 45);
  return out;
}

size_t dhtsim_rand_below(dhtsim *s, size_t n) {
  /* The modulo bias is below 2^-40 for any n a simulation uses. */
  return (size_t)(dhtsim_rand(s) % n);
}

static bool alive(const dhtsim *s, size_t i) {
  return i < s->n && s->nodes[i]->dn != NULL;
}

size_t dhtsim_rand_live(dhtsim *s, size_t except) {
  size_t others = s->live - (alive(s, except) ? 1 : 0);
  if (others == 0)
    return SIZE_MAX;
  for (int tries = 0; tries < 64; tries++) {
    size_t i = dhtsim_rand_below(s, s->n);
    if (i != except && alive(s, i))
      return i;
  }
  size_t start = dhtsim_rand_below(s, s->n);
  for (size_t k = 0; k < s->n; k++) {
    size_t i = (start + k) % s->n;
    if (i != except && alive(s, i))
      return i;
  }
  return SIZE_MAX;
}

/* One-way latency between a and b, the same both ways and for the whole
 * run. */
static uint64_t latency(const dhtsim *s, size_t a, size_t b) {
  uint64_t lo = a < b ? a : b, hi = a < b ? b : a;
  uint64_t x = s->seed ^ ((lo << 32) | hi);
  uint64_t h = splitmix64(&x);
  return s->lat_min + h % (s->lat_max - s->lat_min + 1);
}

void dhtsim_addr(size_t i, bool with_port, char out[DHTSIM_ADDR_MAX]) {
  uint32_t v = (uint32_t)(i + 1);
  snprintf(out, DHTSIM_ADDR_MAX, "10.%u.%u.%u%s", (v >> 16) & 255u,
           (v >> 8) & 255u, v & 255u, with_port ? ":45555" : "");
}

static bool parse_octet(const char **p, uint32_t *v) {
  const char *q = *p;
  uint32_t x = 0;
  int digits = 0;
  while (*q >= '0' && *q <= '9' && digits < 4) {
    x = x * 10 + (uint32_t)(*q - '0');
    q++;
    digits++;
  }
  if (digits == 0 || digits > 3 || x > 255)
    return false;
  *v = x;
  *p = q;
  return true;
}

/* Index of the node at "10.X.Y.Z:45555", or SIZE_MAX for any other
 * address (the core may be handed garbage by a peer). */
static size_t addr_index(const char *addr) {
  uint32_t a, b, c;
  const char *p = addr;
  if (!p || strncmp(p, "10.", 3) != 0)
    return SIZE_MAX;
  p += 3;
  if (!parse_octet(&p, &a) || *p++ != '.' || !parse_octet(&p, &b) ||
      *p++ != '.' || !parse_octet(&p, &c) || strcmp(p, ":45555") != 0)
    return SIZE_MAX;
  uint32_t v = (a << 16) | (b << 8) | c;
  return v == 0 ? SIZE_MAX : (size_t)v - 1;
}

/* ---- event queue: a timing wheel and a heap, in (at, seq) order -------- */

/* Every event of the heap due at t was pushed before every event of the
 * wheel due at t: the heap takes t only while t >= cursor + WHEEL_MS (or
 * t < cursor, when no wheel slot before the cursor holds anything), the
 * wheel only once the cursor has passed t - WHEEL_MS, and the cursor never
 * moves back.  So at equal times the heap goes first, and the order is
 * (at, seq) exactly, as a single heap would give it. */

static bool ev_less(const event *x, const event *y) {
  return x->at < y->at || (x->at == y->at && x->seq < y->seq);
}

static void heap_push(dhtsim *s, event ev) {
  if (s->heap_n == s->heap_cap) {
    s->heap_cap = s->heap_cap ? s->heap_cap * 2 : 1024;
    s->heap = xrealloc(s->heap, s->heap_cap * sizeof *s->heap);
  }
  size_t i = s->heap_n++;
  while (i > 0) {
    size_t up = (i - 1) / 2;
    if (!ev_less(&ev, &s->heap[up]))
      break;
    s->heap[i] = s->heap[up];
    i = up;
  }
  s->heap[i] = ev;
}

static event heap_pop(dhtsim *s) {
  event top = s->heap[0];
  event last = s->heap[--s->heap_n];
  size_t i = 0, n = s->heap_n;
  for (;;) {
    size_t l = 2 * i + 1, r = l + 1, m = i;
    const event *best = &last;
    if (l < n && ev_less(&s->heap[l], best)) {
      m = l;
      best = &s->heap[l];
    }
    if (r < n && ev_less(&s->heap[r], best))
      m = r;
    if (m == i)
      break;
    s->heap[i] = s->heap[m];
    i = m;
  }
  if (n > 0)
    s->heap[i] = last;
  return top;
}

static void push(dhtsim *s, event ev) {
  ev.seq = s->seq++;
  if (s->wheel_n == 0 && s->cursor < s->now)
    s->cursor = s->now; /* an idle wheel catches up */
  if (ev.at < s->cursor || ev.at - s->cursor >= WHEEL_MS) {
    heap_push(s, ev);
    return;
  }
  ev_slot *sl = &s->wheel[ev.at % WHEEL_MS];
  if (sl->n == sl->cap) {
    sl->cap = sl->cap ? sl->cap * 2 : 16;
    sl->v = xrealloc(sl->v, sl->cap * sizeof *sl->v);
  }
  sl->v[sl->n++] = ev;
  s->wheel_n++;
}

/* The next event's time, or false when none is queued.  Moves the cursor
 * over empty slots (never past a slot with events, or past the heap's
 * first event). */
static bool next_at(dhtsim *s, uint64_t *at) {
  for (;;) {
    bool heap = s->heap_n > 0;
    if (s->wheel_n == 0) {
      if (heap)
        *at = s->heap[0].at;
      return heap;
    }
    if (heap && s->heap[0].at <= s->cursor) {
      *at = s->heap[0].at;
      return true;
    }
    const ev_slot *sl = &s->wheel[s->cursor % WHEEL_MS];
    if (sl->head < sl->n) {
      *at = s->cursor;
      return true;
    }
    s->cursor++;
  }
}

/* Takes the next event; next_at must have found one. */
static event pop(dhtsim *s) {
  if (s->heap_n > 0 && (s->wheel_n == 0 || s->heap[0].at <= s->cursor))
    return heap_pop(s);
  ev_slot *sl = &s->wheel[s->cursor % WHEEL_MS];
  event ev = sl->v[sl->head++];
  if (sl->head == sl->n)
    sl->head = sl->n = 0;
  s->wheel_n--;
  return ev;
}

static uint8_t *copy_bytes(const uint8_t *p, size_t n) {
  if (n == 0)
    return NULL;
  uint8_t *q = xmalloc(n);
  memcpy(q, p, n);
  return q;
}

/* Makes sure sn ticks no later than at; a later tick event it had becomes
 * stale (its gen no longer matches). */
static void schedule_tick(dhtsim *s, sim_node *sn, uint64_t at) {
  if (at >= sn->tick_at)
    return;
  sn->tick_at = at;
  sn->tick_gen++;
  event ev = {
      .at = at, .type = EV_TICK, .node = sn->index, .req = sn->tick_gen};
  push(s, ev);
}

static void push_answer(dhtsim *s, size_t to, size_t from, uint64_t req,
                        int status, uint64_t at, const uint8_t *payload,
                        size_t len) {
  if (status == BEE_ETIMEOUT)
    s->c.timeouts++;
  push(s, (event){.at = at,
                  .type = EV_ANSWER,
                  .node = (uint32_t)to,
                  .peer = (uint32_t)from,
                  .req = req,
                  .status = status,
                  .payload = copy_bytes(payload, len),
                  .len = (uint32_t)len});
}

static uint8_t method_index(dhtsim *s, const char *method) {
  for (size_t i = 0; i < s->nmethods; i++)
    if (strcmp(s->methods[i], method) == 0)
      return (uint8_t)i;
  if (s->nmethods == METHODS_MAX) {
    fprintf(stderr, "dhtsim: more than %d distinct methods\n", METHODS_MAX);
    abort();
  }
  size_t n = strlen(method) + 1;
  s->methods[s->nmethods] = xmalloc(n);
  memcpy(s->methods[s->nmethods], method, n);
  return (uint8_t)s->nmethods++;
}

/* ---- dht_io ------------------------------------------------------------- */

static uint64_t io_now_ms(void *ctx) { return ((sim_node *)ctx)->sim->now; }

static uint64_t io_wall_s(void *ctx) {
  return dhtsim_wall(((sim_node *)ctx)->sim);
}

static void io_random(void *ctx, void *buf, size_t n) {
  dhtsim *s = ((sim_node *)ctx)->sim;
  uint8_t *p = buf;
  while (n > 0) {
    uint64_t r = dhtsim_rand(s);
    size_t k = n < sizeof r ? n : sizeof r;
    memcpy(p, &r, k);
    p += k;
    n -= k;
  }
}

/* The core asks for a tick within ms (a lookup finished while starting,
 * the next refresh due, a request that may stall), as the glue's timer
 * gives it. */
static void io_wake(void *ctx, uint64_t ms) {
  sim_node *sn = ctx;
  schedule_tick(sn->sim, sn, sn->sim->now + ms);
}

static int io_validate(void *ctx, const proto_dht_record *r) {
  sim_node *sn = ctx;
  dhtsim *s = sn->sim;
  return s->validate ? s->validate(s->validate_arg, sn->index, r) : 0;
}

/* A request leaves src: it reaches a live node after the pair's latency,
 * and its answer comes back after the same; everything else (dead or
 * unknown address, loss, a round trip longer than the timeout) ends in
 * BEE_ETIMEOUT at now + timeout_ms.  A request to our own address fails
 * with BEE_ESELF, as the transport's handshake does. */
static int io_send(void *ctx, const uint8_t *id, const char *addr,
                   const char *method, const uint8_t *payload, size_t len,
                   uint64_t timeout_ms, uint64_t req) {
  sim_node *src = ctx;
  dhtsim *s = src->sim;
  uint64_t now = s->now;
  s->c.requests++;
  s->c.bytes += len;
  schedule_tick(s, src, now + s->stall_ms + 1);
  size_t dst = addr_index(addr);
  if (dst == src->index) {
    /* The transport's handshake meets our own key. */
    s->c.self_sends++;
    push_answer(s, src->index, dst, req, BEE_ESELF, now + 1, NULL, 0);
    return 0;
  }
  if (!alive(s, dst)) {
    push_answer(s, src->index, dst, req, BEE_ETIMEOUT, now + timeout_ms, NULL,
                0);
    return 0;
  }
  uint64_t lat = latency(s, src->index, dst);
  if (id && memcmp(id, s->nodes[dst]->id.id, PROTO_ID_BYTES) != 0) {
    /* The transport's handshake would find another node there. */
    s->c.id_mismatch++;
    push_answer(s, src->index, dst, req, BEE_ECLOSED, now + 2 * lat, NULL, 0);
    return 0;
  }
  if (s->loss && dhtsim_rand_below(s, 1000) < s->loss) {
    s->c.lost++;
    push_answer(s, src->index, dst, req, BEE_ETIMEOUT, now + timeout_ms, NULL,
                0);
    return 0;
  }
  event ev = {.at = now + lat,
              .type = EV_REQUEST,
              .node = (uint32_t)dst,
              .peer = src->index,
              .req = req,
              .deadline = now + timeout_ms,
              .method = method_index(s, method),
              .payload = copy_bytes(payload, len),
              .len = (uint32_t)len};
  if (2 * lat > timeout_ms) {
    s->c.late++;
    ev.no_answer = true;
    push_answer(s, src->index, dst, req, BEE_ETIMEOUT, ev.deadline, NULL, 0);
  }
  push(s, ev);
  return 0;
}

/* ---- events ------------------------------------------------------------- */

static void on_request(dhtsim *s, event *ev) {
  sim_node *dst = s->nodes[ev->node], *src = s->nodes[ev->peer];
  if (!dst->dn) {
    /* Died while the request was on its way. */
    if (!ev->no_answer)
      push_answer(s, ev->peer, ev->node, ev->req, BEE_ETIMEOUT, ev->deadline,
                  NULL, 0);
    return;
  }
  char ip[DHTSIM_ADDR_MAX];
  dhtsim_addr(ev->peer, false, ip);
  size_t out_len = 0;
  int rc =
      dht_node_handle(dst->dn, src->id.id, ip, s->methods[ev->method],
                      ev->payload, ev->len, s->out, DHT_ANSWER_MAX, &out_len);
  if (rc == 0 && out_len > DHT_ANSWER_MAX) {
    fprintf(stderr, "dhtsim: node %u wrote a %zu-byte answer\n", ev->node,
            out_len);
    abort();
  }
  if (ev->no_answer)
    return;
  s->c.answers++;
  uint64_t at = s->now + latency(s, ev->node, ev->peer);
  if (rc == 0) {
    s->c.bytes += out_len;
    push_answer(s, ev->peer, ev->node, ev->req, 0, at, s->out, out_len);
  } else {
    s->c.errors++;
    push_answer(s, ev->peer, ev->node, ev->req, BEE_EREMOTE, at, NULL, 0);
  }
}

static void on_answer(dhtsim *s, event *ev) {
  sim_node *sn = s->nodes[ev->node];
  if (!sn->dn) {
    s->c.dropped++;
    return;
  }
  /* The responder's id is known when it answered, even with an error. */
  const uint8_t *from = NULL;
  if ((ev->status == 0 || ev->status == BEE_EREMOTE) && ev->peer < s->n)
    from = s->nodes[ev->peer]->id.id;
  dht_node_answer(sn->dn, ev->req, ev->status, from, ev->payload, ev->len);
}

static void on_tick(dhtsim *s, event *ev) {
  sim_node *sn = s->nodes[ev->node];
  if (!sn->dn || ev->req != sn->tick_gen)
    return; /* dead, or superseded by an earlier tick */
  sn->tick_at = UINT64_MAX;
  s->c.ticks++;
  uint64_t d = dht_node_tick(sn->dn);
  if (d < DHTSIM_TICK_MIN_MS)
    d = DHTSIM_TICK_MIN_MS;
  if (d > DHTSIM_TICK_MAX_MS)
    d = DHTSIM_TICK_MAX_MS;
  schedule_tick(s, sn, s->now + d);
}

static void dispatch(dhtsim *s, event *ev) {
  switch (ev->type) {
  case EV_REQUEST: on_request(s, ev); break;
  case EV_ANSWER: on_answer(s, ev); break;
  case EV_TICK: on_tick(s, ev); break;
  case EV_JOIN:
    s->joins_scheduled--;
    dhtsim_join(s, ev->node,
                ev->peer == UINT32_MAX ? DHTSIM_VIA_RANDOM : ev->peer);
    break;
  default: break;
  }
  free(ev->payload);
}

/* ---- network ------------------------------------------------------------ */

/* tick_gen: where the node's tick generation starts (past a dead
 * predecessor's, so its stale tick events stay ignored). */
static sim_node *node_new(dhtsim *s, size_t i, uint64_t tick_gen) {
  sim_node *sn = xmalloc(sizeof *sn);
  memset(sn, 0, sizeof *sn);
  sn->tick_gen = tick_gen;
  uint8_t seed[32];
  uint64_t x = s->seed + i;
  for (size_t k = 0; k < 4; k++) {
    uint64_t w = splitmix64(&x);
    memcpy(seed + 8 * k, &w, 8);
  }
  crypto_sign_seed_keypair(sn->id.pk, sn->id.sk, seed);
  sodium_memzero(seed, sizeof seed);
  proto_peer_id(sn->id.pk, sn->id.id);
  sn->sim = s;
  sn->index = (uint32_t)i;
  sn->join = 1;
  sn->tick_at = UINT64_MAX;
  sn->io = (dht_io){.ctx = sn,
                    .now_ms = io_now_ms,
                    .wall_s = io_wall_s,
                    .random = io_random,
                    .send = io_send,
                    .wake = io_wake,
                    .validate = s->validate ? io_validate : NULL};
  dht_config cfg = s->cfg;
  cfg.id = &sn->id;
  cfg.port = DHTSIM_PORT;
  int rc = dht_node_new(&cfg, &sn->io, &sn->dn);
  if (rc != 0) {
    fprintf(stderr, "dhtsim: dht_node_new for node %zu: %s\n", i,
            bee_strerror(rc));
    free(sn);
    return NULL;
  }
  /* Spread the first ticks over a second, as real nodes start. */
  schedule_tick(s, sn, s->now + dhtsim_rand_below(s, 1000));
  return sn;
}

size_t dhtsim_add(dhtsim *s) {
  if (s->n >= DHTSIM_NODES_MAX)
    return SIZE_MAX;
  if (s->n == s->cap) {
    s->cap = s->cap ? s->cap * 2 : 64;
    s->nodes = xrealloc(s->nodes, s->cap * sizeof *s->nodes);
  }
  sim_node *sn = node_new(s, s->n, 0);
  if (!sn)
    return SIZE_MAX;
  s->nodes[s->n] = sn;
  s->live++;
  return s->n++;
}

dhtsim *dhtsim_new(size_t n, uint64_t seed, const dht_config *tmpl) {
  if (n > DHTSIM_NODES_MAX)
    return NULL;
  if (sodium_init() < 0)
    return NULL;
  dhtsim *s = xmalloc(sizeof *s);
  memset(s, 0, sizeof *s);
  if (tmpl)
    s->cfg = *tmpl;
  else
    dht_config_default(&s->cfg);
  s->stall_ms = s->cfg.stall_ms ? s->cfg.stall_ms : 400;
  s->seed = seed;
  uint64_t x = seed;
  for (size_t k = 0; k < 4; k++)
    s->rng[k] = splitmix64(&x);
  s->now = DHTSIM_CLOCK_START_MS;
  s->cursor = s->now;
  s->wheel = xmalloc(WHEEL_MS * sizeof *s->wheel);
  memset(s->wheel, 0, WHEEL_MS * sizeof *s->wheel);
  s->lat_min = 5;
  s->lat_max = 60;
  s->out = xmalloc(DHT_ANSWER_MAX);
  s->cap = n > 0 ? n : 64;
  s->nodes = xmalloc(s->cap * sizeof *s->nodes);
  for (size_t i = 0; i < n; i++) {
    if (dhtsim_add(s) == SIZE_MAX) {
      dhtsim_free(s);
      return NULL;
    }
  }
  return s;
}

void dhtsim_free(dhtsim *s) {
  if (!s)
    return;
  for (size_t i = 0; i < s->n; i++)
    if (s->nodes[i]->dn)
      dhtsim_kill(s, i);
  for (size_t i = 0; i < s->n; i++)
    free(s->nodes[i]);
  for (size_t i = 0; i < s->heap_n; i++)
    free(s->heap[i].payload);
  for (size_t i = 0; s->wheel && i < WHEEL_MS; i++) {
    for (uint32_t j = s->wheel[i].head; j < s->wheel[i].n; j++)
      free(s->wheel[i].v[j].payload);
    free(s->wheel[i].v);
  }
  free(s->wheel);
  for (size_t i = 0; i < s->nmethods; i++)
    free(s->methods[i]);
  free(s->nodes);
  free(s->heap);
  free(s->out);
  free(s);
}

void dhtsim_set_latency(dhtsim *s, uint64_t min_ms, uint64_t max_ms) {
  s->lat_min = min_ms;
  s->lat_max = max_ms < min_ms ? min_ms : max_ms;
}

void dhtsim_set_loss(dhtsim *s, unsigned permille) {
  s->loss = permille > 1000 ? 1000 : permille;
}

void dhtsim_set_validate(dhtsim *s,
                         int (*fn)(void *arg, size_t node,
                                   const proto_dht_record *r),
                         void *arg) {
  s->validate = fn;
  s->validate_arg = arg;
  for (size_t i = 0; i < s->n; i++)
    s->nodes[i]->io.validate = fn ? io_validate : NULL;
}

size_t dhtsim_size(const dhtsim *s) { return s->n; }
size_t dhtsim_live(const dhtsim *s) { return s->live; }
bool dhtsim_alive(const dhtsim *s, size_t i) { return alive(s, i); }

dht_node *dhtsim_node(const dhtsim *s, size_t i) {
  return i < s->n ? s->nodes[i]->dn : NULL;
}

size_t dhtsim_index(const dhtsim *s, const dht_node *n) {
  for (size_t i = 0; i < s->n; i++)
    if (n && s->nodes[i]->dn == n)
      return i;
  return SIZE_MAX;
}

const proto_identity *dhtsim_identity(const dhtsim *s, size_t i) {
  return i < s->n ? &s->nodes[i]->id : NULL;
}

void dhtsim_kill(dhtsim *s, size_t i) {
  if (!alive(s, i))
    return;
  sim_node *sn = s->nodes[i];
  dht_node_free(sn->dn);
  sn->dn = NULL;
  sn->tick_at = UINT64_MAX;
  sn->tick_gen++;
  s->live--;
}

int dhtsim_revive(dhtsim *s, size_t i) {
  if (i >= s->n || alive(s, i))
    return -EINVAL;
  sim_node *old = s->nodes[i];
  sim_node *sn = node_new(s, i, old->tick_gen + 1);
  if (!sn)
    return BEE_ECONFIG;
  free(old);
  s->nodes[i] = sn;
  s->live++;
  return 0;
}

/* ---- joining ------------------------------------------------------------ */

static void join_cb(dht_node *n, int status, const dht_stats *st, void *arg) {
  sim_node *sn = arg;
  dhtsim *s = sn->sim;
  sn->join = status;
  s->joins_pending--;
  if (status == 0)
    s->c.joins_ok++;
  else
    s->c.joins_failed++;
}

/* A random live node with a lower index than i, else any other live
 * node. */
static size_t pick_via(dhtsim *s, size_t i) {
  for (int tries = 0; tries < 64 && i > 0; tries++) {
    size_t v = dhtsim_rand_below(s, i);
    if (alive(s, v))
      return v;
  }
  for (size_t v = i; v-- > 0;)
    if (alive(s, v))
      return v;
  return dhtsim_rand_live(s, i);
}

int dhtsim_join(dhtsim *s, size_t i, size_t via) {
  int rc = -ENOENT;
  if (!alive(s, i))
    goto out;
  if (via == DHTSIM_VIA_RANDOM)
    via = pick_via(s, i);
  if (via >= s->n)
    goto out;
  char addr[DHTSIM_ADDR_MAX];
  dhtsim_addr(via, true, addr);
  const char *addrs[1] = {addr};
  sim_node *sn = s->nodes[i];
  sn->join = 1;
  s->joins_pending++;
  rc = dht_bootstrap(sn->dn, addrs, 1, join_cb, sn);
  if (rc != 0)
    s->joins_pending--;
out:
  if (rc != 0) {
    if (i < s->n)
      s->nodes[i]->join = rc;
    s->c.joins_failed++;
  }
  return rc;
}

void dhtsim_join_all(dhtsim *s, size_t via, uint64_t stagger_ms) {
  for (size_t i = 1; i < s->n; i++) {
    s->joins_scheduled++;
    push(s, (event){.at = s->now + (i - 1) * stagger_ms,
                    .type = EV_JOIN,
                    .node = (uint32_t)i,
                    .peer =
                        via == DHTSIM_VIA_RANDOM ? UINT32_MAX : (uint32_t)via});
  }
}

int dhtsim_join_status(const dhtsim *s, size_t i) {
  return i < s->n ? s->nodes[i]->join : -ENOENT;
}

bool dhtsim_joined(void *arg) {
  const dhtsim *s = arg;
  return s->joins_scheduled == 0 && s->joins_pending == 0;
}

/* ---- time --------------------------------------------------------------- */

uint64_t dhtsim_now(const dhtsim *s) { return s->now; }

uint64_t dhtsim_wall(const dhtsim *s) { return DHTSIM_EPOCH_S + s->now / 1000; }

bool dhtsim_run_until(dhtsim *s, bool (*done)(void *arg), void *arg,
                      uint64_t max_ms) {
  uint64_t end = s->now + max_ms;
  if (done && done(arg))
    return true;
  uint64_t at;
  while (next_at(s, &at) && at <= end) {
    event ev = pop(s);
    if (ev.at > s->now)
      s->now = ev.at;
    s->c.events++;
    dispatch(s, &ev);
    if (done && done(arg))
      return true;
  }
  s->now = end;
  return false;
}

void dhtsim_run_for(dhtsim *s, uint64_t ms) {
  (void)dhtsim_run_until(s, NULL, NULL, ms);
}

void dhtsim_counters_get(const dhtsim *s, dhtsim_counters *out) {
  *out = s->c;
  out->joins_pending = s->joins_scheduled + s->joins_pending;
}
