/* conn.c: one connection: framing, handshake, sealed traffic, dispatch, RPC.
 *
 * Frames are a big-endian u32 body length and the body.  During the
 * handshake bodies are the plaintext handshake messages (at most
 * PROTO_HS_OUT_MAX bytes); afterwards every body is one envelope message
 * sealed with the session's traffic key.  The receive buffer grows with
 * the bytes that actually arrive, never with a length a peer announces,
 * and a length over the limit closes the connection before anything is
 * allocated for it.
 *
 * Lifetime: a connection is freed by the close callback of its TCP handle
 * (or, before it has one, when its address lookup returns), never inside
 * one of its own callbacks, so callers may close it from any callback.
 */
#include "proto-int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>

#define COMP "net"
#define RBUF_STEP (64u << 10)
#define CLOSE_GRACE_MS 2000

typedef struct wreq {
  uv_write_t req;
  proto_conn *c;
  size_t len;        /* frame bytes */
  bool pooled;       /* chunk-sized: goes back to the host's pool */
  struct wreq *next; /* in the pool */
  uint8_t buf[];     /* the whole frame: header, body, tag */
} wreq;

/* Frames of bulk chunks are all about one size; reusing their buffers
 * spares a fresh 1 MiB allocation, and its page faults, per chunk. */
#define POOL_BODY (64 + PROTO_CHUNK_MAX)

static void on_close(uv_handle_t *handle);
static void conn_down(proto_conn *c, int code);
static void wreq_free(proto_host *h, wreq *w);

proto_conn *proto__conn_new(proto_host *h, bool initiator, int purpose) {
  proto_conn *c = calloc(1, sizeof *c);
  if (!c)
    return NULL;
  c->h = h;
  c->initiator = initiator;
  c->purpose = purpose;
  c->token_gen = h->token_gen;
  c->last_rx_ms = proto__now_ms(h);
  c->next = h->conns;
  if (h->conns)
    h->conns->prev = c;
  h->conns = c;
  h->nall++;
  c->tcp.data = c;
  c->gai.data = c;
  c->creq.data = c;
  return c;
}

const proto_peer *proto_conn_peer(const proto_conn *c) { return &c->peer; }
const char *proto_conn_addr(const proto_conn *c) { return c->addr; }
void proto_conn_set_data(proto_conn *c, void *data) { c->data = data; }
void *proto_conn_get_data(const proto_conn *c) { return c->data; }
size_t proto_conn_queued(const proto_conn *c) { return c->queued; }

/* Short hex peer id for log lines. */
static const char *who(const proto_conn *c, char buf[24]) {
  if (c->state == CONN_UP || c->up_reported) {
    proto_hex(c->peer.id, 4, buf);
    return buf;
  }
  return c->addr;
}

/* ---- writing ------------------------------------------------------------ */

static void write_cb(uv_write_t *req, int status) {
  wreq *w = (wreq *)req;
  proto_conn *c = w->c;
  proto_host *h = c->h;
  c->queued -= sizeof(wreq) + w->len;
  c->last_write_ms = proto__now_ms(h);
  wreq_free(h, w);
  if (status < 0 && status != UV_ECANCELED && c->state != CONN_CLOSING) {
    proto__conn_abort(c, status, "write failed");
    return;
  }
  if (c->state == CONN_CLOSING) {
    if (c->queued == 0 && c->has_tcp && !uv_is_closing((uv_handle_t *)&c->tcp))
      uv_close((uv_handle_t *)&c->tcp, on_close);
    return;
  }
  if (c->want_drain && c->queued <= h->cfg.write_queue_max / 2) {
    c->want_drain = false;
    if (h->cfg.on_drain)
      h->cfg.on_drain(c, h->cfg.data);
  }
}

/* Queues a frame whose body (body_len bytes, sealed already or plaintext
 * handshake) is at w->buf + PROTO_FRAME_HDR.  Takes w. */
static int write_frame(proto_conn *c, wreq *w, size_t body_len) {
  proto__put_u32(w->buf, (uint32_t)body_len);
  w->c = c;
  w->len = PROTO_FRAME_HDR + body_len;
  uv_buf_t b = uv_buf_init((char *)w->buf, (unsigned)w->len);
  int rc = uv_write(&w->req, (uv_stream_t *)&c->tcp, &b, 1, write_cb);
  if (rc < 0) {
    wreq_free(c->h, w);
    return rc;
  }
  if (c->queued == 0)
    c->last_write_ms = proto__now_ms(c->h);
  /* The queue counts what a write costs in memory, not just its frame:
   * for tiny messages the request itself is most of it. */
  c->queued += sizeof(wreq) + w->len;
  return 0;
}

static wreq *wreq_new(proto_host *h, size_t body_cap) {
  bool pooled = body_cap > POOL_BODY / 2 && body_cap <= POOL_BODY;
  wreq *w = NULL;
  if (pooled && h->wpool) {
    w = h->wpool;
    h->wpool = w->next;
    h->nwpool--;
  } else {
    w = malloc(sizeof(wreq) + PROTO_FRAME_HDR +
               (pooled ? POOL_BODY : body_cap) + PROTO_TAG_BYTES);
  }
  if (w)
    w->pooled = pooled;
  return w;
}

/* Returns w to the pool, which holds at most a write queue's worth. */
static void wreq_free(proto_host *h, wreq *w) {
  if (w->pooled && h->nwpool < h->cfg.write_queue_max / PROTO_CHUNK_MAX + 2) {
    w->next = h->wpool;
    h->wpool = w;
    h->nwpool++;
    return;
  }
  free(w);
}

void proto__conn_pool_free(proto_host *h) {
  while (h->wpool) {
    wreq *w = h->wpool;
    h->wpool = w->next;
    free(w);
  }
  h->nwpool = 0;
}

/* Sends one sealed message.  Control messages (pongs, error replies,
 * cancels, CLOSE) may pass the queue limit by CONTROL_SLACK, so they are
 * not lost behind bulk data; a peer that makes us queue more than that
 * (say, by sending pings it never reads the answers to) is closed. */
#define CONTROL_SLACK (1u << 20)
/* Payloads from this size on are sealed from where they are, not copied
 * into the frame first. */
#define SEAL_FROM_SOURCE 4096
static int send_msg(proto_conn *c, const proto_msg *m, bool control) {
  if (c->state != CONN_UP)
    return BEE_ECLOSED;
  size_t max = proto_msg_encoded_max(m);
  size_t limit = c->h->cfg.write_queue_max + (control ? CONTROL_SLACK : 0);
  if (c->queued > 0 && c->queued + max > limit) {
    if (control) {
      char id[24];
      bee_warn(COMP,
               "%s: peer does not read what it asks for (%zu bytes "
               "queued), closing",
               who(c, id), c->queued);
      proto__conn_abort(c, BEE_EQUEUE, NULL);
      return BEE_ECLOSED;
    }
    c->want_drain = true;
    return BEE_EQUEUE;
  }
  wreq *w = wreq_new(c->h, max);
  if (!w)
    return -ENOMEM;
  uint8_t *body = w->buf + PROTO_FRAME_HDR;
  size_t len;
  int rc;
  if (m->payload.n >= SEAL_FROM_SOURCE &&
      proto__msg_head_encode(m, body, max, &len) == 0) {
    /* A large payload is encrypted straight from the caller's buffer
     * into the frame, behind its head: one pass over it, no copy. */
    rc = proto__seal_parts(&c->tx, body, body, len, m->payload.p, m->payload.n);
    len += m->payload.n;
  } else {
    rc = proto_msg_encode(m, body, max, &len);
    if (!rc)
      rc = proto_seal(&c->tx, body, len);
  }
  if (rc) {
    wreq_free(c->h, w);
    return rc;
  }
  return write_frame(c, w, len + PROTO_TAG_BYTES);
}

int proto_conn_send(proto_conn *c, const proto_msg *m) {
  return send_msg(c, m, false);
}

int proto_conn_send_chunk(proto_conn *c, uint64_t stream_id, uint64_t offset,
                          const uint8_t *data, size_t len) {
  uint8_t hdr[64];
  size_t hlen;
  if (c->state != CONN_UP)
    return BEE_ECLOSED;
  if (len > PROTO_CHUNK_MAX)
    return BEE_ETOOBIG;
  int rc =
      proto_chunk_header_encode(stream_id, offset, len, hdr, sizeof hdr, &hlen);
  if (rc)
    return rc;
  if (c->queued > 0 && c->queued + hlen + len > c->h->cfg.write_queue_max) {
    c->want_drain = true;
    return BEE_EQUEUE;
  }
  wreq *w = wreq_new(c->h, hlen + len);
  if (!w)
    return -ENOMEM;
  /* Encrypted straight from the caller's buffer into the frame. */
  if ((rc = proto__seal_parts(&c->tx, w->buf + PROTO_FRAME_HDR, hdr, hlen, data,
                              len))) {
    wreq_free(c->h, w);
    return rc;
  }
  return write_frame(c, w, hlen + len + PROTO_TAG_BYTES);
}

static int send_plain(proto_conn *c, const uint8_t *body, size_t len) {
  wreq *w = wreq_new(c->h, len);
  if (!w)
    return -ENOMEM;
  memcpy(w->buf + PROTO_FRAME_HDR, body, len);
  return write_frame(c, w, len);
}

/* ---- RPC ---------------------------------------------------------------- */

int proto_conn_call(proto_conn *c, const char *method, const uint8_t *payload,
                    size_t len, uint64_t timeout_ms, proto_reply_cb cb,
                    void *arg, uint64_t *id) {
  if (c->state != CONN_UP)
    return BEE_ECLOSED;
  proto_call *call = malloc(sizeof *call);
  if (!call)
    return -ENOMEM;
  proto_msg m = {.type = PROTO_T_REQUEST,
                 .id = ++c->next_call_id,
                 .name = {(const uint8_t *)method, strlen(method)},
                 .payload = {payload, len}};
  int rc = send_msg(c, &m, false);
  if (rc) {
    free(call);
    return rc;
  }
  call->id = m.id;
  call->deadline_ms = proto__now_ms(c->h) +
                      (timeout_ms ? timeout_ms : c->h->cfg.rpc_timeout_ms);
  call->cb = cb;
  call->arg = arg;
  call->next = c->calls;
  c->calls = call;
  if (id)
    *id = m.id;
  return 0;
}

/* Unlinks and returns the pending call with this id, or NULL. */
static proto_call *call_take(proto_conn *c, uint64_t id) {
  for (proto_call **pp = &c->calls; *pp; pp = &(*pp)->next)
    if ((*pp)->id == id) {
      proto_call *call = *pp;
      *pp = call->next;
      return call;
    }
  return NULL;
}

static void call_finish(proto_conn *c, proto_call *call, int status,
                        int64_t code, proto_bytes payload) {
  proto_reply_cb cb = call->cb;
  void *arg = call->arg;
  free(call);
  cb(c, status, code, payload, arg);
}

int proto_conn_cancel(proto_conn *c, uint64_t id) {
  proto_call *call = call_take(c, id);
  if (!call)
    return BEE_ERANGE;
  proto_msg m = {.type = PROTO_T_CANCEL, .id = id};
  send_msg(c, &m, true); /* best effort: the peer may be gone */
  call_finish(c, call, BEE_ECANCELED, 0, (proto_bytes){NULL, 0});
  return 0;
}

int proto_conn_reply(proto_conn *c, uint64_t id, const uint8_t *payload,
                     size_t len) {
  proto_msg m = {.type = PROTO_T_RESPONSE, .id = id, .payload = {payload, len}};
  return send_msg(c, &m, false);
}

int proto_conn_reply_error(proto_conn *c, uint64_t id, int code,
                           const char *text) {
  size_t n = strlen(text);
  proto_msg m = {.type = PROTO_T_ERROR,
                 .id = id,
                 .code = code,
                 .payload = {(const uint8_t *)text,
                             n < PROTO_TEXT_MAX ? n : PROTO_TEXT_MAX}};
  return send_msg(c, &m, true);
}

int proto_conn_oneway(proto_conn *c, const char *method, const uint8_t *payload,
                      size_t len) {
  proto_msg m = {.type = PROTO_T_ONEWAY,
                 .name = {(const uint8_t *)method, strlen(method)},
                 .payload = {payload, len}};
  return send_msg(c, &m, false);
}

static void fail_calls(proto_conn *c, int status) {
  while (c->calls) {
    proto_call *call = c->calls;
    c->calls = call->next;
    call_finish(c, call, status, 0, (proto_bytes){NULL, 0});
  }
}

/* A round trip began at sent_ns (uv_hrtime) and ended now: the least one
 * seen is the path's.  Timed with the high-resolution clock rather than
 * the loop's, which is a millisecond and a loop turn coarse. */
static void rtt_sample(proto_conn *c, uint64_t sent_ns) {
  uint64_t now = uv_hrtime();
  uint64_t us = now > sent_ns ? (now - sent_ns) / 1000 : 0;
  if (!c->has_rtt || us < c->rtt_us)
    c->rtt_us = us;
  c->has_rtt = true;
}

uint64_t proto_conn_rtt_ms(const proto_conn *c) {
  return c->has_rtt ? c->rtt_us / 1000 : 0;
}

uint64_t proto_conn_rtt_us(const proto_conn *c) {
  return c->has_rtt ? c->rtt_us : 0;
}

/* Bytes in the kernel's receive queue of c, not read yet. */
static size_t kernel_queued(const proto_conn *c) {
  uv_os_fd_t fd;
  int queued = 0;
  if (uv_fileno((const uv_handle_t *)&c->tcp, &fd) != 0 ||
      ioctl(fd, FIONREAD, &queued) != 0 || queued < 0)
    queued = 0;
  return (size_t)queued;
}

/* A pause that ends a flight (meter.c): half the round trip, at least
 * 10 ms (a loop busy elsewhere for a few ms must not cut a fast link's
 * transfer into pieces too small to count) and at most 50 ms (the
 * spacing of 64 KB segments under 11 Mbit/s is more). */
static uint64_t flight_gap_ns(const proto_conn *c) {
  uint64_t g = c->rtt_us * 500;
  return g < 10000000 ? 10000000 : g > 50000000 ? 50000000 : g;
}

double proto_conn_take_rx_mbit(proto_conn *c) {
  uint64_t now = uv_hrtime(), gap = flight_gap_ns(c);
  double own = proto__flight_take(&c->flight, now, gap);
  double peer = proto__flight_take(&c->peer_flight, now, gap);
  return (own > peer ? own : peer) * 8 / 1e6;
}

/* A read of bytes on c: into its own meter and, when its peer has a
 * control connection with us, into that one's meter of the peer. */
static void meter_read(proto_conn *c, size_t bytes) {
  uint64_t now = uv_hrtime(), gap = flight_gap_ns(c);
  proto_conn *pc = proto_host_find(c->h, c->peer.id);
  uint64_t pgap = pc ? flight_gap_ns(pc) : 0;
  bool starts = proto__flight_starts(&c->flight, now, gap);
  bool joins = pc && (proto__flight_starts(&pc->peer_flight, now, pgap) ||
                      pc->peer_flight.start_ns != c->peer_joined_ns);
  size_t queued = starts || joins ? kernel_queued(c) : 0;
  proto__flight_add(&c->flight, now, bytes, gap, starts ? queued : 0, false);
  if (pc) {
    proto__flight_add(&pc->peer_flight, now, bytes, pgap, queued, joins);
    c->peer_joined_ns = pc->peer_flight.start_ns;
  }
}

/* ---- receiving ---------------------------------------------------------- */

static void dispatch_request(proto_conn *c, const proto_msg *m) {
  proto_host *h = c->h;
  const proto_method *md = proto__host_method(h, m->name);
  if (md && md->cb) {
    md->cb(c, m->id, m->name, m->payload, md->data);
  } else if (h->cfg.on_request) {
    h->cfg.on_request(c, m->id, m->name, m->payload, h->cfg.data);
  } else {
    char text[PROTO_METHOD_MAX + 32];
    snprintf(text, sizeof text, "unknown method '%.*s'", (int)m->name.n,
             (const char *)m->name.p);
    proto_conn_reply_error(c, m->id, BEE_ENOMETHOD, text);
  }
}

/* The peer renewed its access token (PROTO_TOKEN_METHOD): a new one that
 * passes the handshake's checks for this peer, with the role it has,
 * moves the connection's expiry to the new token's.  Anything else is
 * logged and changes nothing: the old expiry still closes the
 * connection. */
static void token_renewed(proto_conn *c, proto_bytes raw) {
  const proto_auth *a = &c->h->cfg.auth;
  char id[24];
  proto_token tok;
  /* A signature check each, so a flood costs little: the renewal taken
   * last, sent again, is skipped unchecked, and after a refusal the next
   * PROTO_TOKEN_RENEW_MS bring nothing new (only the moderator can make
   * another valid token; a real renewal comes once in hours). */
  uint64_t now = proto__now_ms(c->h), fnv = 14695981039346656037ull;
  for (size_t i = 0; i < raw.n; i++)
    fnv = (fnv ^ raw.p[i]) * 1099511628211ull;
  if (fnv == c->token_taken)
    return;
  if (c->token_refused &&
      now - c->token_refused_ms < PROTO_TOKEN_RENEW_MS) {
    bee_debug(COMP, "%s: another renewed token within %d ms of a refusal, "
              "ignored", who(c, id), PROTO_TOKEN_RENEW_MS);
    return;
  }
  if (!a->moderator_pk) {
    bee_log(c->token_refused ? BEE_LOG_DEBUG : BEE_LOG_WARN, COMP,
            "%s: a renewed token in an open swarm, ignored", who(c, id));
    c->token_refused = true;
    return;
  }
  int roles = c->peer.purpose == PROTO_PURPOSE_BULK ? a->accept_bulk_roles
                                                    : a->accept_roles;
  int rc = proto_token_decode(raw.p, raw.n, &tok);
  if (!rc)
    rc = proto_token_verify(&tok, a->moderator_pk, a->swarm, c->peer.pk,
                            roles, proto__now_s(), a->revoked);
  if (!rc && tok.role != c->peer.role)
    rc = BEE_ETOKEN_ROLE;
  if (rc) {
    double left = (double)c->peer.token_expires - (double)proto__now_s();
    bee_log(c->token_refused ? BEE_LOG_DEBUG : BEE_LOG_WARN, COMP,
            "%s: renewed token refused (%s); the old one expires in %.1f h",
            who(c, id), bee_strerror(rc), left / 3600);
    c->token_refused = true; /* a peer that keeps trying is not news */
    c->token_refused_ms = now;
    return;
  }
  bee_debug(COMP, "%s: access token renewed, expires in %.1f h", who(c, id),
            ((double)tok.expires - (double)proto__now_s()) / 3600);
  c->peer.token_expires = tok.expires;
  c->token_taken = fnv;
}

void proto__conn_send_token(proto_conn *c) {
  const proto_token *t = c->h->cfg.auth.token;
  c->token_gen = c->h->token_gen;
  if (t && c->h->cfg.auth.moderator_pk) {
    proto_msg m = {.type = PROTO_T_ONEWAY,
                   .name = {(const uint8_t *)PROTO_TOKEN_METHOD,
                            sizeof PROTO_TOKEN_METHOD - 1},
                   .payload = {t->raw, t->raw_len}};
    send_msg(c, &m, true); /* a failure closes c, or it was closing */
  }
}

/* Handles one decoded message on an established connection. */
static void dispatch(proto_conn *c, const proto_msg *m) {
  proto_host *h = c->h;
  proto_call *call;
  char id[24];
  switch (m->type) {
  case PROTO_T_REQUEST: dispatch_request(c, m); break;
  case PROTO_T_RESPONSE:
  case PROTO_T_ERROR:
    if (!(call = call_take(c, m->id))) {
      bee_debug(COMP, "%s: late answer to request %llu dropped", who(c, id),
                (unsigned long long)m->id);
      break;
    }
    if (m->type == PROTO_T_RESPONSE)
      call_finish(c, call, 0, 0, m->payload);
    else
      call_finish(c, call, BEE_EREMOTE, m->code, m->payload);
    break;
  case PROTO_T_CANCEL:
    bee_debug(COMP, "%s: request %llu canceled by peer", who(c, id),
              (unsigned long long)m->id);
    break;
  case PROTO_T_ONEWAY: {
    if (m->name.n == sizeof PROTO_TOKEN_METHOD - 1 &&
        memcmp(m->name.p, PROTO_TOKEN_METHOD, m->name.n) == 0) {
      token_renewed(c, m->payload);
      break;
    }
    const proto_method *md = proto__host_method(h, m->name);
    if (md && md->oneway)
      md->oneway(c, m->name, m->payload, md->oneway_data);
    else if (h->cfg.on_oneway)
      h->cfg.on_oneway(c, m->name, m->payload, h->cfg.data);
    break;
  }
  case PROTO_T_STREAM_OPEN:
  case PROTO_T_STREAM_CHUNK:
  case PROTO_T_STREAM_END:
    if (h->cfg.on_stream)
      h->cfg.on_stream(c, m, h->cfg.data);
    break;
  case PROTO_T_PING: {
    proto_msg pong = {.type = PROTO_T_PONG, .id = m->id};
    send_msg(c, &pong, true);
    break;
  }
  case PROTO_T_PONG:
    if (c->ping_sent_ms)
      rtt_sample(c, c->ping_sent_ns);
    c->ping_sent_ms = 0;
    break;
  case PROTO_T_CLOSE: {
    char text[200];
    bee_info(COMP, "%s closed the connection: %s", who(c, id),
             bee_printable(m->payload.p, m->payload.n, text, sizeof text));
    proto__conn_abort(c, BEE_ECLOSED, NULL);
    break;
  }
  default: break;
  }
}

/* Handles one handshake frame body.  Each handshake message answers the
 * other side's last one, so the time from ours to theirs is a round trip
 * (plus the peer's few microseconds of key agreement). */
static void handshake(proto_conn *c, const uint8_t *body, size_t len) {
  uint8_t out[PROTO_HS_OUT_MAX];
  size_t olen;
  bool done;
  int remote;
  uint64_t now = proto__now_ms(c->h);
  if (c->hs_sent_ms) {
    rtt_sample(c, c->hs_sent_ns);
    c->hs_sent_ms = 0;
  }
  int rc = proto_hs_step(c->hs, body, len, out, &olen, &done, &remote);
  if (olen && send_plain(c, out, olen) != 0 && !rc)
    rc = BEE_ECLOSED;
  if (olen && !done) {
    c->hs_sent_ms = now;
    c->hs_sent_ns = uv_hrtime();
  }
  if (rc == BEE_EREMOTE) {
    bee_warn_burst(COMP, "handshake with %s refused by the peer: %s (%s)",
                   c->addr, proto_hs_remote_text(c->hs), bee_errname(remote));
    rc = remote < 0 ? remote : rc;
  } else if (rc) {
    bee_warn_burst(COMP, "handshake with %s failed: %s (%s)", c->addr,
                   bee_strerror(rc), bee_errname(rc));
  }
  if (rc) {
    /* Let the verdict reach the peer before the socket closes. */
    proto__conn_abort(c, rc, olen ? "" : NULL);
    return;
  }
  if (!done)
    return;
  proto_hs_result(c->hs, &c->peer, &c->tx, &c->rx);
  proto_hs_free(c->hs);
  c->hs = NULL;
  c->state = CONN_UP;
  /* Our token was renewed while the handshake ran on the old one. */
  if (c->token_gen != c->h->token_gen)
    proto__conn_send_token(c);
  if (c->state == CONN_UP)
    proto__host_conn_up(c->h, c);
}

/* Handles one complete frame body; false once the connection is closing. */
static bool frame(proto_conn *c, uint8_t *body, size_t len) {
  char id[24];
  if (c->state == CONN_HANDSHAKE) {
    handshake(c, body, len);
    return c->state != CONN_CLOSING;
  }
  size_t plen;
  proto_msg m;
  int rc = proto_open(&c->rx, body, len, &plen);
  if (rc) {
    bee_warn(COMP, "%s: frame failed authentication, closing", who(c, id));
    proto__conn_abort(c, rc, NULL);
    return false;
  }
  if ((rc = proto_msg_decode(body, plen, &m))) {
    bee_warn(COMP, "%s: bad message (%s), closing", who(c, id),
             bee_errname(rc));
    proto_conn_close(c, rc, bee_strerror(rc));
    return false;
  }
  dispatch(c, &m);
  return c->state != CONN_CLOSING;
}

static void alloc_cb(uv_handle_t *handle, size_t suggested, uv_buf_t *buf) {
  proto_conn *c = handle->data;
  size_t max = PROTO_FRAME_HDR + PROTO_FRAME_MAX + RBUF_STEP;
  (void)suggested;
  if (c->rcap - c->rlen < RBUF_STEP && c->rcap < max) {
    size_t cap = c->rcap ? c->rcap * 2 : RBUF_STEP;
    if (cap < c->rlen + RBUF_STEP)
      cap = c->rlen + RBUF_STEP;
    if (cap > max)
      cap = max;
    uint8_t *p = realloc(c->rbuf, cap);
    if (p) {
      c->rbuf = p;
      c->rcap = cap;
    }
  }
  size_t room = c->rcap - c->rlen;
  /* The buffer starts with a frame (read_cb moves what is left of one to
   * the front).  While much of it is still to come, read no further than
   * its end, so that once it is handled little or nothing is left to
   * move: reading on into the next large frame would move up to a
   * frame's worth of bytes per frame. */
  if (c->rlen >= PROTO_FRAME_HDR) {
    size_t end = PROTO_FRAME_HDR + (size_t)proto__get_u32(c->rbuf);
    if (end > c->rlen && end - c->rlen >= RBUF_STEP && end - c->rlen < room)
      room = end - c->rlen;
  }
  *buf = uv_buf_init((char *)c->rbuf + c->rlen, (unsigned)room);
}

static void read_cb(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf) {
  proto_conn *c = stream->data;
  char id[24];
  (void)buf;
  if (nread == UV_ENOBUFS) {
    proto__conn_abort(c, -ENOMEM, "out of memory for the receive buffer");
    return;
  }
  if (nread < 0) {
    if (c->state == CONN_HANDSHAKE)
      bee_warn_burst(COMP, "%s: closed during the handshake (%s)", c->addr,
                     nread == UV_EOF ? "end of stream"
                                     : uv_strerror((int)nread));
    proto__conn_abort(c, nread == UV_EOF ? BEE_ECLOSED : (int)nread, NULL);
    return;
  }
  c->rlen += (size_t)nread;
  c->last_rx_ms = proto__now_ms(c->h);
  if (c->state != CONN_HANDSHAKE)
    meter_read(c, (size_t)nread);
  size_t off = 0;
  while (c->rlen - off >= PROTO_FRAME_HDR) {
    uint32_t blen = proto__get_u32(c->rbuf + off);
    size_t limit =
        c->state == CONN_HANDSHAKE ? PROTO_HS_OUT_MAX : PROTO_FRAME_MAX;
    if (blen > limit) {
      bee_warn(COMP,
               "%s: frame of %u bytes is over the %zu-byte limit, closing",
               who(c, id), blen, limit);
      proto__conn_abort(c, BEE_ETOOBIG, NULL);
      return;
    }
    if (c->rlen - off - PROTO_FRAME_HDR < blen)
      break;
    uint8_t *body = c->rbuf + off + PROTO_FRAME_HDR;
    off += PROTO_FRAME_HDR + blen;
    if (!frame(c, body, blen))
      return;
  }
  if (off) {
    memmove(c->rbuf, c->rbuf + off, c->rlen - off);
    c->rlen -= off;
  }
}

/* ---- life cycle --------------------------------------------------------- */

int proto__conn_start(proto_conn *c) {
  proto_host *h = c->h;
  c->state = CONN_HANDSHAKE;
  c->deadline_ms = proto__now_ms(h) + h->cfg.handshake_timeout_ms;
  c->hs = proto_hs_new(&h->cfg.auth, c->initiator, c->purpose, proto__now_s());
  if (!c->hs)
    return -ENOMEM;
  uv_tcp_nodelay(&c->tcp, 1);
  int rc = uv_read_start((uv_stream_t *)&c->tcp, alloc_cb, read_cb);
  if (rc < 0 || !c->initiator)
    return rc;
  uint8_t out[PROTO_HS_OUT_MAX];
  size_t olen;
  bool done;
  int remote;
  rc = proto_hs_step(c->hs, NULL, 0, out, &olen, &done, &remote);
  if (!rc)
    rc = send_plain(c, out, olen);
  c->hs_sent_ms = proto__now_ms(h);
  c->hs_sent_ns = uv_hrtime();
  return rc;
}

static void on_close(uv_handle_t *handle) {
  proto_conn *c = handle->data;
  proto_host *h = c->h;
  proto__host_unindex(h, c); /* normally done when it went down */
  proto__host_unlink(h, c);
  if (c->ai)
    uv_freeaddrinfo(c->ai);
  proto_hs_free(c->hs);
  proto_sealer_clear(&c->tx);
  proto_sealer_clear(&c->rx);
  free(c->rbuf);
  free(c);
  proto__host_handle_done(h);
}

/* Runs the callbacks a connection owes when it ends: its pending calls,
 * on_down if on_up ran, or the connect callback if it never came up. */
static void conn_down(proto_conn *c, int code) {
  proto_host *h = c->h;
  fail_calls(c, BEE_ECLOSED);
  if (c->up_reported) {
    c->up_reported = false;
    proto__host_unindex(h, c);
    h->nup--;
    if (h->cfg.on_down)
      h->cfg.on_down(c, code, h->cfg.data);
  } else if (c->connect_cb) {
    proto_connect_cb cb = c->connect_cb;
    c->connect_cb = NULL;
    cb(h, NULL, code ? code : BEE_ECLOSED, c->connect_arg);
  }
}

void proto__conn_abort(proto_conn *c, int code, const char *why) {
  if (c->state == CONN_CLOSING &&
      (!c->has_tcp || uv_is_closing((uv_handle_t *)&c->tcp)))
    return;
  bool graceful = why && c->queued > 0; /* flush what is queued first */
  int was = c->state;
  c->state = CONN_CLOSING;
  c->close_code = code;
  if (why && *why)
    bee_info(COMP, "closing %s: %s", c->addr, why);
  conn_down(c, code);
  if (was == CONN_RESOLVING) {
    uv_cancel((uv_req_t *)&c->gai); /* its callback frees c */
    return;
  }
  if (!c->has_tcp)
    return;
  uv_read_stop((uv_stream_t *)&c->tcp);
  if (graceful) {
    c->deadline_ms = proto__now_ms(c->h) + CLOSE_GRACE_MS;
    return; /* write_cb closes once the queue drains; the tick enforces */
  }
  if (!uv_is_closing((uv_handle_t *)&c->tcp))
    uv_close((uv_handle_t *)&c->tcp, on_close);
}

void proto_conn_close(proto_conn *c, int code, const char *text) {
  if (c->state == CONN_UP) {
    size_t n = text ? strlen(text) : 0;
    proto_msg m = {.type = PROTO_T_CLOSE,
                   .code = code,
                   .payload = {(const uint8_t *)text,
                               n < PROTO_TEXT_MAX ? n : PROTO_TEXT_MAX}};
    send_msg(c, &m, true);
  }
  proto__conn_abort(c, code ? code : BEE_ECLOSED, "");
}

void proto__conn_tick(proto_conn *c, uint64_t now, uint64_t now_s) {
  proto_host_config *cfg = &c->h->cfg;
  char id[24];
  if (c->state == CONN_CLOSING) {
    if (c->has_tcp && !uv_is_closing((uv_handle_t *)&c->tcp) &&
        now >= c->deadline_ms)
      uv_close((uv_handle_t *)&c->tcp, on_close);
    return;
  }
  if (c->state != CONN_UP) {
    if (now >= c->deadline_ms) {
      bee_warn(COMP, "%s: %s timed out", c->addr,
               c->state == CONN_HANDSHAKE ? "handshake" : "connect");
      proto__conn_abort(c, BEE_ETIMEOUT, NULL);
    }
    return;
  }
  if (c->retire_ms && now >= c->retire_ms) {
    proto_conn_close(c, 0, "duplicate connection");
    return;
  }
  if (c->peer.token_expires && now_s >= c->peer.token_expires) {
    bee_warn(COMP, "%s: access token expired, closing (%s)", who(c, id),
             bee_errname(BEE_ETOKEN_EXPIRED));
    proto_conn_close(c, BEE_ETOKEN_EXPIRED, bee_strerror(BEE_ETOKEN_EXPIRED));
    return;
  }
  if (c->queued > 0 && now - c->last_write_ms >= cfg->stall_timeout_ms) {
    bee_warn(COMP, "%s: peer stopped reading (%zu bytes queued), closing",
             who(c, id), c->queued);
    proto__conn_abort(c, BEE_ETIMEOUT, NULL);
    return;
  }
  if (now - c->last_rx_ms >= cfg->idle_timeout_ms) {
    bee_warn(COMP, "%s: silent for %llu ms, closing", who(c, id),
             (unsigned long long)(now - c->last_rx_ms));
    proto__conn_abort(c, BEE_ETIMEOUT, NULL);
    return;
  }
  /* A receive buffer grown for big frames goes back once the connection
   * has been quiet for a second, not between two frames of a stream. */
  if (c->rlen == 0 && c->rcap > 4 * RBUF_STEP && now - c->last_rx_ms >= 1000) {
    free(c->rbuf);
    c->rbuf = NULL;
    c->rcap = 0;
  }
  if (now - c->last_rx_ms >= cfg->keepalive_ms && !c->ping_sent_ms) {
    proto_msg ping = {.type = PROTO_T_PING, .id = now};
    if (send_msg(c, &ping, true) == 0) {
      c->ping_sent_ms = now;
      c->ping_sent_ns = uv_hrtime();
    }
  } else if (c->ping_sent_ms && now - c->ping_sent_ms >= cfg->keepalive_ms) {
    c->ping_sent_ms = 0; /* allow another ping next interval */
  }
  for (proto_call **pp = &c->calls; *pp;) {
    proto_call *call = *pp;
    if (now < call->deadline_ms) {
      pp = &call->next;
      continue;
    }
    *pp = call->next;
    proto_msg m = {.type = PROTO_T_CANCEL, .id = call->id};
    send_msg(c, &m, true);
    call_finish(c, call, BEE_ETIMEOUT, 0, (proto_bytes){NULL, 0});
    if (c->state != CONN_UP)
      return;
    pp = &c->calls; /* the callback may have changed the list */
  }
}
