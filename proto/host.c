/* host.c: a node's endpoint: listener, outgoing connects, limits, timers.
 *
 * The host owns every connection.  One timer, ticking every
 * PROTO_TICK_MS, enforces all deadlines (connect, handshake, keepalive,
 * idle, stalled writes, RPC timeouts, the peer's token expiry), so a
 * thousand connections cost one timer, not a thousand.  Incoming connections are capped in total and in
 * handshakes in flight per source address, so a single host cannot tie up
 * the daemon with half-finished handshakes.
 */
#include "proto-int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define COMP "net"
#ifndef PROTO_TICK_MS
#define PROTO_TICK_MS 100
#endif
#ifndef PROTO_RETIRE_MS
#define PROTO_RETIRE_MS 2000 /* a duplicate connection's grace */
#endif

void proto_host_config_default(proto_host_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->auth.accept_roles = PROTO_ROLES_ALL;
  cfg->auth.accept_bulk_roles = PROTO_ROLE_BEE | PROTO_ROLE_AUX;
  cfg->auth.ciphers = PROTO_CIPHERS_ALL;
  cfg->max_conns = 1024;
  cfg->max_pending_per_addr = 8;
  cfg->handshake_timeout_ms = 10000;
  cfg->connect_timeout_ms = 10000;
  cfg->idle_timeout_ms = 60000;
  cfg->keepalive_ms = 15000;
  cfg->rpc_timeout_ms = 10000;
  cfg->stall_timeout_ms = 30000;
  cfg->write_queue_max = 16u << 20;
}

uint64_t proto__now_ms(const proto_host *h) { return uv_now(h->loop); }

static void host_free(proto_host *h) {
  proto__conn_pool_free(h);
  while (h->methods) {
    proto_method *m = h->methods;
    h->methods = m->next;
    free(m);
  }
  free(h->byid);
  free(h);
}

void proto__host_handle_done(proto_host *h) {
  if (--h->handles == 0 && h->closing)
    host_free(h);
}

static void on_handle_closed(uv_handle_t *handle) {
  proto__host_handle_done(handle->data);
}

static void tick(uv_timer_t *t) {
  proto_host *h = t->data;
  uint64_t now = proto__now_ms(h), now_s = proto__now_s();
  for (proto_conn *c = h->conns, *next; c; c = next) {
    next = c->next; /* a tick never frees c: closing completes later */
    proto__conn_tick(c, now, now_s);
  }
  if (h->closing && h->nall == 0 && !uv_is_closing((uv_handle_t *)t))
    uv_close((uv_handle_t *)t, on_handle_closed);
}

int proto_host_new(const proto_host_config *cfg, proto_host **out) {
  if (!cfg->loop || !cfg->auth.id || !cfg->auth.swarm ||
      (cfg->auth.moderator_pk && !cfg->auth.token))
    return BEE_ECONFIG;
  proto_host *h = calloc(1, sizeof *h);
  if (!h)
    return -ENOMEM;
  h->cfg = *cfg;
  h->loop = cfg->loop;
  uv_timer_init(h->loop, &h->timer);
  h->timer.data = h;
  h->handles = 1;
  uv_timer_start(&h->timer, tick, PROTO_TICK_MS, PROTO_TICK_MS);
  uv_unref((uv_handle_t *)&h->timer); /* the timer alone keeps no loop alive */
  *out = h;
  return 0;
}

void proto_host_close(proto_host *h) {
  if (h->closing)
    return;
  h->closing = true;
  if (h->listening)
    uv_close((uv_handle_t *)&h->listener, on_handle_closed);
  for (proto_conn *c = h->conns, *next; c; c = next) {
    next = c->next;
    proto_conn_close(c, BEE_ECLOSED, "shutting down");
  }
  uv_ref((uv_handle_t *)&h->timer); /* keep ticking until conns are gone */
  if (h->nall == 0)
    uv_close((uv_handle_t *)&h->timer, on_handle_closed);
}

void proto__host_unlink(proto_host *h, proto_conn *c) {
  if (c->prev)
    c->prev->next = c->next;
  else
    h->conns = c->next;
  if (c->next)
    c->next->prev = c->prev;
  h->nall--;
  if (h->closing && h->nall == 0 && !uv_is_closing((uv_handle_t *)&h->timer))
    uv_close((uv_handle_t *)&h->timer, on_handle_closed);
}

size_t proto_host_conn_count(const proto_host *h) { return h->nup; }

/* The entry for method, made if need be (NULL: -ENOMEM), or NULL with
 * *pp at the link to it when make is false and there is none. */
static proto_method *method_entry(proto_host *h, const char *method,
                                  size_t n, bool make, proto_method ***link) {
  proto_method *m, **pp;
  for (pp = &h->methods; (m = *pp); pp = &m->next)
    if (strcmp(m->name, method) == 0)
      break;
  *link = pp;
  if (m || !make)
    return m;
  if (!(m = calloc(1, sizeof *m)))
    return NULL;
  memcpy(m->name, method, n + 1);
  m->next = h->methods;
  h->methods = m;
  *link = &h->methods;
  return m;
}

/* Sets one of the two handlers of method; an entry with neither goes. */
static int method_set(proto_host *h, const char *method, proto_request_cb cb,
                      proto_oneway_cb oneway, bool is_oneway, void *data) {
  size_t n = strlen(method);
  if (n == 0 || n > PROTO_METHOD_MAX)
    return BEE_ETOOBIG;
  bool set = is_oneway ? oneway != NULL : cb != NULL;
  proto_method **pp, *m = method_entry(h, method, n, set, &pp);
  if (!m)
    return set ? -ENOMEM : 0;
  if (is_oneway) {
    m->oneway = oneway;
    m->oneway_data = data;
  } else {
    m->cb = cb;
    m->data = data;
  }
  if (!m->cb && !m->oneway) {
    *pp = m->next;
    free(m);
  }
  return 0;
}

int proto_host_on(proto_host *h, const char *method, proto_request_cb cb,
                  void *data) {
  return method_set(h, method, cb, NULL, false, data);
}

int proto_host_on_oneway(proto_host *h, const char *method, proto_oneway_cb cb,
                         void *data) {
  return method_set(h, method, NULL, cb, true, data);
}

const proto_method *proto__host_method(const proto_host *h, proto_bytes name) {
  for (const proto_method *m = h->methods; m; m = m->next)
    if (strlen(m->name) == name.n && memcmp(m->name, name.p, name.n) == 0)
      return m;
  return NULL;
}

/* ---- index by peer id ---------------------------------------------------- */

static size_t id_slot(const proto_host *h, const uint8_t id[PROTO_ID_BYTES]) {
  uint64_t v; /* ids are hashes: any 8 bytes of one are uniform */
  memcpy(&v, id, sizeof v);
  return (size_t)(v & (h->byid_cap - 1));
}

static void index_add(proto_host *h, proto_conn *c) {
  if (h->byid_n + 1 > h->byid_cap / 2) { /* keep chains short: grow */
    size_t cap = h->byid_cap ? 2 * h->byid_cap : 64;
    proto_conn **t = calloc(cap, sizeof *t);
    if (!t)
      abort(); /* small internal allocation */
    proto_conn **old = h->byid;
    size_t ocap = h->byid_cap;
    h->byid = t;
    h->byid_cap = cap;
    for (size_t i = 0; i < ocap; i++)
      for (proto_conn *x = old[i], *nx; x; x = nx) {
        nx = x->id_next;
        size_t s = id_slot(h, x->peer.id);
        x->id_next = t[s];
        t[s] = x;
      }
    free(old);
  }
  size_t s = id_slot(h, c->peer.id);
  c->id_next = h->byid[s];
  h->byid[s] = c;
  c->indexed = true;
  h->byid_n++;
}

void proto__host_unindex(proto_host *h, proto_conn *c) {
  if (!c->indexed)
    return;
  for (proto_conn **pp = &h->byid[id_slot(h, c->peer.id)]; *pp;
       pp = &(*pp)->id_next)
    if (*pp == c) {
      *pp = c->id_next;
      break;
    }
  c->id_next = NULL;
  c->indexed = false;
  h->byid_n--;
}

proto_conn *proto_host_find(const proto_host *h, const uint8_t id[PROTO_ID_BYTES]) {
  if (!h->byid_cap)
    return NULL;
  for (proto_conn *c = h->byid[id_slot(h, id)]; c; c = c->id_next)
    if (c->up_reported && !c->retire_ms &&
        memcmp(c->peer.id, id, PROTO_ID_BYTES) == 0)
      return c;
  return NULL;
}

void proto_host_foreach(const proto_host *h, void (*fn)(proto_conn *c, void *arg),
                        void *arg) {
  for (proto_conn *c = h->conns, *next; c; c = next) {
    next = c->next;
    if (c->up_reported)
      fn(c, arg);
  }
}

/* The id of the peer that opened c. */
static const uint8_t *opener(const proto_host *h, const proto_conn *c) {
  return c->initiator ? h->cfg.auth.id->id : c->peer.id;
}

void proto__host_conn_up(proto_host *h, proto_conn *c) {
  char id[2 * PROTO_ID_BYTES + 1];
  c->purpose = c->peer.purpose;
  proto_conn *old = c->purpose == PROTO_PURPOSE_CONTROL
                        ? proto_host_find(h, c->peer.id)
                        : NULL;
  if (old) {
    /* Both ends apply the same rule, so they close the same connection:
     * keep the one opened by the smaller id; if one side opened both,
     * keep the older. */
    int cmp = memcmp(opener(h, c), opener(h, old), PROTO_ID_BYTES);
    proto_hex(c->peer.id, 4, id);
    bee_debug(COMP, "%s: duplicate control connection, keeping one", id);
    if (cmp >= 0) { /* the new one goes; the caller gets the old one */
      proto_connect_cb cb = c->connect_cb;
      c->connect_cb = NULL;
      /* Not used for sending from now on, but read for a grace: the peer
       * may have sent on it before it saw the other one come up, and
       * what it sent must not be lost. */
      c->retire_ms = proto__now_ms(h) + PROTO_RETIRE_MS;
      if (cb)
        cb(h, old, 0, c->connect_arg);
      return;
    }
  }
  /* The new connection is reported before its duplicate closes, so the
   * peer never looks gone in between. */
  c->up_reported = true;
  h->nup++;
  if (c->purpose == PROTO_PURPOSE_CONTROL)
    index_add(h, c);
  if (h->cfg.on_up)
    h->cfg.on_up(c, 0, h->cfg.data);
  /* The duplicate is no longer used, but closed only after a grace, so
   * the peer too has seen the winner by then and never misses us. */
  if (old && old->state == CONN_UP && c->state == CONN_UP)
    old->retire_ms = proto__now_ms(h) + PROTO_RETIRE_MS;
  /* Exactly once, even if a callback above closed c. */
  if (c->connect_cb) {
    proto_connect_cb cb = c->connect_cb;
    c->connect_cb = NULL;
    if (c->state == CONN_UP)
      cb(h, c, 0, c->connect_arg);
    else
      cb(h, NULL, c->close_code ? c->close_code : BEE_ECLOSED, c->connect_arg);
  }
}

/* ---- addresses ---------------------------------------------------------- */

/* Splits "host:port", "[v6]:port" or ":port" into host (may be empty)
 * and port. */
static int split_hostport(const char *s, char *host, size_t cap, int *port) {
  const char *colon = strrchr(s, ':');
  const char *hs = s, *he;
  if (!colon)
    return BEE_ECONFIG;
  he = colon;
  if (s[0] == '[') {
    const char *rb = strchr(s, ']');
    if (!rb || rb + 1 != colon)
      return BEE_ECONFIG;
    hs = s + 1;
    he = rb;
  } else if (memchr(s, ':', (size_t)(colon - s))) {
    return BEE_ECONFIG; /* bare IPv6 needs brackets */
  }
  if ((size_t)(he - hs) >= cap)
    return BEE_ETOOBIG;
  memcpy(host, hs, (size_t)(he - hs));
  host[he - hs] = 0;
  char *end;
  long p = strtol(colon + 1, &end, 10);
  if (colon[1] == 0 || *end || p < 0 || p > 65535)
    return BEE_ECONFIG;
  *port = (int)p;
  return 0;
}

static void addr_text(const struct sockaddr_storage *sa, char *ip, size_t ipcap,
                      char *addr, size_t addrcap) {
  int port = 0;
  ip[0] = 0;
  if (sa->ss_family == AF_INET) {
    const struct sockaddr_in *a = (const struct sockaddr_in *)sa;
    uv_ip4_name(a, ip, ipcap);
    port = ntohs(a->sin_port);
    snprintf(addr, addrcap, "%s:%d", ip, port);
  } else if (sa->ss_family == AF_INET6) {
    const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)sa;
    uv_ip6_name(a, ip, ipcap);
    port = ntohs(a->sin6_port);
    snprintf(addr, addrcap, "[%s]:%d", ip, port);
  } else {
    snprintf(addr, addrcap, "?");
  }
}

/* ---- incoming ----------------------------------------------------------- */

static size_t pending_from(const proto_host *h, const char *ip) {
  size_t n = 0;
  for (const proto_conn *c = h->conns; c; c = c->next)
    if (!c->initiator && c->state == CONN_HANDSHAKE && strcmp(c->ip, ip) == 0)
      n++;
  return n;
}

static void on_connection(uv_stream_t *server, int status) {
  proto_host *h = server->data;
  if (status < 0 || h->closing) {
    bee_warn(COMP, "accept failed: %s", uv_strerror(status));
    return;
  }
  proto_conn *c = proto__conn_new(h, false, 0);
  if (!c) {
    bee_err(COMP, "out of memory accepting a connection");
    return;
  }
  uv_tcp_init(h->loop, &c->tcp);
  c->tcp.data = c;
  c->has_tcp = true;
  h->handles++;
  c->state = CONN_HANDSHAKE;
  if (uv_accept(server, (uv_stream_t *)&c->tcp) < 0) {
    proto__conn_abort(c, BEE_ECLOSED, NULL);
    return;
  }
  struct sockaddr_storage sa;
  int len = sizeof sa;
  if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&sa, &len) == 0)
    addr_text(&sa, c->ip, sizeof c->ip, c->addr, sizeof c->addr);
  if (h->nall > h->cfg.max_conns) {
    bee_warn_burst(COMP, "refusing %s: %zu connections is the limit", c->addr,
                   h->cfg.max_conns);
    proto__conn_abort(c, BEE_ELIMIT, NULL);
    return;
  }
  if (pending_from(h, c->ip) > h->cfg.max_pending_per_addr) {
    bee_warn_burst(COMP, "refusing %s: %zu handshakes in flight from %s",
                   c->addr, h->cfg.max_pending_per_addr, c->ip);
    proto__conn_abort(c, BEE_ELIMIT, NULL);
    return;
  }
  int rc = proto__conn_start(c);
  if (rc < 0) {
    bee_warn(COMP, "%s: cannot start: %s", c->addr, bee_strerror(rc));
    proto__conn_abort(c, rc, NULL);
  }
}

size_t proto_host_token_renewed(proto_host *h) {
  size_t told = 0;
  h->token_gen++;
  for (proto_conn *c = h->conns, *next; c; c = next) {
    next = c->next; /* a failed send may close c, never free it here */
    if (c->state == CONN_UP) {
      proto__conn_send_token(c);
      told++;
    }
  }
  return told;
}

int proto_host_listen(proto_host *h, const char *addr, int *port) {
  char host[256];
  int p, rc;
  struct sockaddr_storage sa;
  if (h->listening)
    return -EALREADY;
  if ((rc = split_hostport(addr, host, sizeof host, &p)))
    return rc;
  if (uv_ip4_addr(host[0] ? host : "0.0.0.0", p, (struct sockaddr_in *)&sa) &&
      uv_ip6_addr(host, p, (struct sockaddr_in6 *)&sa))
    return BEE_ECONFIG;
  uv_tcp_init(h->loop, &h->listener);
  h->listener.data = h;
  h->listening = true;
  h->handles++;
  if ((rc = uv_tcp_bind(&h->listener, (struct sockaddr *)&sa, 0)) == 0)
    rc = uv_listen((uv_stream_t *)&h->listener, 256, on_connection);
  if (rc < 0) {
    h->listening = false;
    uv_close((uv_handle_t *)&h->listener, on_handle_closed);
    return rc;
  }
  if (port) {
    int len = sizeof sa;
    uv_tcp_getsockname(&h->listener, (struct sockaddr *)&sa, &len);
    *port = ntohs(sa.ss_family == AF_INET
                      ? ((struct sockaddr_in *)&sa)->sin_port
                      : ((struct sockaddr_in6 *)&sa)->sin6_port);
  }
  return 0;
}

/* ---- outgoing ----------------------------------------------------------- */

static void try_next(proto_conn *c, int last_error);

static void on_connect(uv_connect_t *req, int status) {
  proto_conn *c = req->data;
  if (c->state == CONN_CLOSING)
    return;
  if (status < 0) {
    try_next(c, status);
    return;
  }
  int rc = proto__conn_start(c);
  if (rc < 0)
    proto__conn_abort(c, rc, NULL);
}

/* Ends an outgoing connection that never got a live socket: tells the
 * caller (unless already told) and frees it. */
static void connect_failed(proto_conn *c, int code) {
  proto_host *h = c->h;
  proto_connect_cb cb = c->connect_cb;
  c->connect_cb = NULL;
  c->state = CONN_CLOSING;
  if (cb)
    cb(h, NULL, code, c->connect_arg);
  proto__host_unlink(h, c);
  if (c->ai)
    uv_freeaddrinfo(c->ai);
  free(c);
}

/* A failed attempt's handle is closed: try the next address. */
static void on_retry_closed(uv_handle_t *handle) {
  proto_conn *c = handle->data;
  c->has_tcp = false;
  proto__host_handle_done(c->h);
  if (c->state == CONN_CLOSING) /* aborted meanwhile; caller already told */
    connect_failed(c, BEE_ECLOSED);
  else
    try_next(c, c->close_code);
}

static void try_next(proto_conn *c, int last_error) {
  proto_host *h = c->h;
  if (c->has_tcp) {
    c->close_code = last_error;
    uv_close((uv_handle_t *)&c->tcp, on_retry_closed);
    return;
  }
  struct addrinfo *ai = c->ai_next;
  if (!ai) {
    /* The caller says what it was for, and whether it tries again. */
    bee_debug(COMP, "cannot connect to %s: %s", c->addr,
             last_error ? uv_strerror(last_error) : "no address");
    connect_failed(c, last_error ? last_error : -EHOSTUNREACH);
    return;
  }
  c->ai_next = ai->ai_next;
  c->state = CONN_CONNECTING;
  uv_tcp_init(h->loop, &c->tcp);
  c->tcp.data = c;
  c->has_tcp = true;
  h->handles++;
  struct sockaddr_storage sa;
  memcpy(&sa, ai->ai_addr, ai->ai_addrlen);
  addr_text(&sa, c->ip, sizeof c->ip, c->addr, sizeof c->addr);
  int rc = uv_tcp_connect(&c->creq, &c->tcp, ai->ai_addr, on_connect);
  if (rc < 0)
    try_next(c, rc);
}

static void on_resolved(uv_getaddrinfo_t *req, int status, struct addrinfo *res) {
  proto_conn *c = req->data;
  proto__host_handle_done(c->h);
  c->ai = res;
  c->ai_next = res;
  if (c->state == CONN_CLOSING || status < 0) {
    if (status < 0 && c->state != CONN_CLOSING)
      bee_warn_burst(COMP, "cannot resolve %s: %s", c->addr,
                     uv_strerror(status));
    connect_failed(c, status < 0 ? status : BEE_ECANCELED);
    return;
  }
  try_next(c, 0);
}

int proto_host_connect(proto_host *h, const char *hostport, int purpose,
                       proto_connect_cb cb, void *arg) {
  char host[256], port[8];
  int p, rc;
  if (h->closing)
    return BEE_ECLOSED;
  if (purpose != PROTO_PURPOSE_CONTROL && purpose != PROTO_PURPOSE_BULK)
    return BEE_ERANGE;
  if ((rc = split_hostport(hostport, host, sizeof host, &p)))
    return rc;
  if (!host[0] || p == 0)
    return BEE_ECONFIG;
  snprintf(port, sizeof port, "%d", p);
  proto_conn *c = proto__conn_new(h, true, purpose);
  if (!c)
    return -ENOMEM;
  snprintf(c->addr, sizeof c->addr, "%s", hostport);
  c->state = CONN_RESOLVING;
  c->deadline_ms = proto__now_ms(h) + h->cfg.connect_timeout_ms;
  c->connect_cb = cb;
  c->connect_arg = arg;
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
  rc = uv_getaddrinfo(h->loop, &c->gai, on_resolved, host, port, &hints);
  if (rc < 0) {
    proto__host_unlink(h, c);
    free(c);
    return rc;
  }
  h->handles++;
  return 0;
}
