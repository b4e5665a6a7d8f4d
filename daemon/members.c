/* members.c: the set of connected peers, and swarm formation.
 *
 * Until the DHT lands this is how a swarm finds itself.  Every node keeps
 * its authenticated peers with the listen address each one advertised; on
 * every new connection it sends a one-way "swarm.hello" [listen_port], and
 * it answers the request "swarm.peers" with the addresses it knows.  A
 * joining node asks its join targets for their peers and dials the ones it
 * is not connected to yet, so the swarm becomes a full mesh.  This file is
 * meant to be replaced whole by the DHT's peer discovery.
 *
 * The two payloads are encoded and decoded by proto (proto_swarm_*).
 */
#include "bee.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define COMP "beed"
#define HELLO "swarm.hello"
#define PEERS "swarm.peers"
#define STATUS_IDS_MAX 32 /* ids listed in one status line */

/* An outgoing connection to an address learned from swarm.peers. */
struct bee_dial {
  bee_dial *next;
  bee_members *m;
  char addr[BEE_ADDR_MAX];
};

static void on_peers_request(proto_conn *c, uint64_t id, proto_bytes method,
                             proto_bytes payload, void *data);

void bee_id8(const uint8_t id[PROTO_ID_BYTES], char out[9]) {
  proto_hex(id, 4, out);
}

static bool method_is(proto_bytes method, const char *name) {
  size_t n = strlen(name);
  return method.n == n && memcmp(method.p, name, n) == 0;
}

/* ---- the member table -------------------------------------------------- */

void bee_members_init(bee_members *m, const uint8_t self_id[PROTO_ID_BYTES]) {
  memset(m, 0, sizeof *m);
  memcpy(m->self_id, self_id, PROTO_ID_BYTES);
}

int bee_members_start(bee_members *m, proto_host *host, unsigned listen_port) {
  m->host = host;
  m->listen_port = listen_port;
  return proto_host_on(host, PEERS, on_peers_request, m);
}

void bee_members_stop(bee_members *m) { m->host = NULL; }

void bee_members_close(bee_members *m) {
  while (m->dials) {
    bee_dial *d = m->dials;
    m->dials = d->next;
    free(d);
  }
  free(m->v);
  m->v = NULL;
  m->n = m->cap = 0;
}

static bee_member *find_id(const bee_members *m,
                           const uint8_t id[PROTO_ID_BYTES]) {
  for (size_t i = 0; i < m->n; i++)
    if (memcmp(m->v[i].id, id, PROTO_ID_BYTES) == 0)
      return &m->v[i];
  return NULL;
}

const bee_member *bee_members_find(const bee_members *m,
                                   const uint8_t id[PROTO_ID_BYTES]) {
  return find_id(m, id);
}

static bool has_conn(const bee_member *e, const proto_conn *c) {
  for (size_t i = 0; i < e->nconns; i++)
    if (e->conns[i] == c)
      return true;
  return false;
}

/* The IP of remote ("ip:port", the ip maybe in brackets) into ip, an
 * IPv4 peer on a dual-stack socket as IPv4. */
static int remote_ip(const char *remote, char ip[PROTO_IP_MAX]) {
  int rc = proto_addr_host(remote, ip, PROTO_IP_MAX, NULL);
  return rc ? rc : proto_ip_literal(ip) ? 0 : BEE_ERANGE;
}

const char *bee_seen_absurd(const char *from, const char *ip) {
  uint8_t a[16];
  static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  if (inet_pton(AF_INET, ip, a) == 1) {
    if (a[0] == 0 || (a[0] >= 224 && a[0] <= 239) ||
        memcmp(a, "\xff\xff\xff\xff", 4) == 0)
      return "no address a peer can dial";
  } else if (inet_pton(AF_INET6, ip, a) != 1 || a[0] == 0xff ||
             strcmp(ip, "::") == 0) {
    return "no address a peer can dial";
  } else if (memcmp(a, mapped, sizeof mapped) == 0) {
    return "an IPv4 address in IPv6 form (said plainly by a peer)";
  }
  if (from[0] && proto_host_loopback(from) != proto_host_loopback(ip))
    return proto_host_loopback(ip)
               ? "loopback, on a connection from another host"
               : "another host, on a loopback connection";
  return NULL;
}

bool bee_members_seen_at(const bee_members *m, char out[PROTO_IP_MAX]) {
  out[0] = '\0';
  for (int loop = 0; loop < 2 && !out[0]; loop++) {
    size_t best = 0, naming = 0;
    for (size_t i = 0; i < m->n; i++) {
      const char *ip = m->v[i].sees_us;
      if (!ip[0] || proto_host_loopback(ip) != (loop == 1))
        continue;
      naming++;
      size_t votes = 0;
      for (size_t j = 0; j < m->n; j++)
        votes += strcmp(m->v[j].sees_us, ip) == 0;
      if (votes > best) {
        best = votes;
        memcpy(out, ip, PROTO_IP_MAX);
      }
    }
    if (best < 2 && naming != 1)
      out[0] = '\0';
  }
  return out[0] != '\0';
}

static void send_hello(bee_members *m, proto_conn *c) {
  uint8_t buf[16 + PROTO_IP_MAX];
  size_t len;
  char ip[PROTO_IP_MAX];
  if (remote_ip(proto_conn_addr(c), ip))
    ip[0] = '\0';
  int rc = proto_swarm_hello_encode(m->listen_port, ip, buf, sizeof buf, &len);
  if (rc == 0)
    rc = proto_conn_oneway(c, HELLO, buf, len);
  if (rc) {
    char id8[9];
    bee_id8(proto_conn_peer(c)->id, id8);
    bee_warn(COMP, "swarm: cannot send %s to %s: %s", HELLO, id8,
             bee_strerror(rc));
  }
}

int bee_members_up(bee_members *m, proto_conn *c) {
  const proto_peer *p = proto_conn_peer(c);
  char id8[9];
  bee_id8(p->id, id8);
  if (!m->host || p->purpose != PROTO_PURPOSE_CONTROL)
    return 0; /* bulk connections carry tensors, not membership */
  if (memcmp(p->id, m->self_id, PROTO_ID_BYTES) == 0) {
    proto_conn_close(c, BEE_ESELF, "connected to self");
    return BEE_ESELF;
  }
  bee_member *e = find_id(m, p->id);
  if (e) {
    if (has_conn(e, c))
      return 0;
    if (e->nconns == BEE_PEER_CONNS_MAX) {
      bee_warn(COMP, "swarm: peer %s: more than %d connections, closing one",
               id8, BEE_PEER_CONNS_MAX);
      proto_conn_close(c, BEE_ELIMIT, "too many connections");
      return BEE_ELIMIT;
    }
    e->conns[e->nconns++] = c;
    bee_debug(COMP, "swarm: peer %s: another connection (%s)", id8,
              proto_conn_addr(c));
    send_hello(m, c);
    return 0;
  }
  if (m->n == m->cap) {
    size_t cap = m->cap ? 2 * m->cap : 16;
    bee_member *v = realloc(m->v, cap * sizeof *v);
    if (!v)
      abort(); /* small internal allocation: out of memory is fatal */
    m->v = v;
    m->cap = cap;
  }
  e = &m->v[m->n++];
  memset(e, 0, sizeof *e);
  memcpy(e->id, p->id, PROTO_ID_BYTES);
  e->role = p->role;
  e->conns[0] = c;
  e->nconns = 1;
  bee_info(COMP, "swarm: peer %s up (%s, %s)", id8, proto_role_name(p->role),
           proto_conn_addr(c));
  send_hello(m, c);
  return 1;
}

int bee_members_down(bee_members *m, proto_conn *c, int status,
                     uint8_t gone_id[PROTO_ID_BYTES]) {
  for (size_t i = 0; i < m->n; i++) {
    bee_member *e = &m->v[i];
    for (size_t j = 0; j < e->nconns; j++) {
      if (e->conns[j] != c)
        continue;
      e->conns[j] = e->conns[--e->nconns];
      if (e->nconns > 0)
        return 0;
      char id8[9];
      bee_id8(e->id, id8);
      bee_info(COMP, "swarm: peer %s down (%s)", id8,
               status ? bee_strerror(status) : "closed");
      memcpy(gone_id, e->id, PROTO_ID_BYTES);
      *e = m->v[--m->n];
      return 1;
    }
  }
  return 0;
}

/* ---- swarm.hello -------------------------------------------------------- */

/* Makes "host:port" from the remote end of c ("ip:port", the ip maybe in
 * brackets) and the port the peer listens on. */
static int advertised_addr(const char *remote, unsigned port, char *out,
                           size_t cap) {
  char ip[PROTO_IP_MAX];
  if (remote_ip(remote, ip))
    return BEE_ERANGE;
  int w = strchr(ip, ':') ? snprintf(out, cap, "[%s]:%u", ip, port)
                          : snprintf(out, cap, "%s:%u", ip, port);
  return w > 0 && (size_t)w < cap ? 0 : BEE_ERANGE;
}

static void on_hello(bee_members *m, proto_conn *c, proto_bytes payload) {
  const proto_peer *p = proto_conn_peer(c);
  char id8[9];
  unsigned port;
  bee_id8(p->id, id8);
  bee_member *e = find_id(m, p->id);
  char sees[PROTO_IP_MAX];
  int rc = proto_swarm_hello_decode(payload.p, payload.n, &port, sees);
  if (rc) {
    bee_warn(COMP, "swarm: ignoring a bad %s from %s: %s", HELLO, id8,
             bee_strerror(rc));
    return;
  }
  if (!e)
    return;
  char from[PROTO_IP_MAX];
  if (remote_ip(proto_conn_addr(c), from))
    from[0] = '\0';
  const char *absurd = sees[0] ? bee_seen_absurd(from, sees) : NULL;
  if (absurd)
    bee_warn(COMP, "swarm: peer %s says it sees this node at %s: %s; ignored",
             id8, sees, absurd);
  else if (sees[0] && strcmp(sees, e->sees_us) != 0) {
    memcpy(e->sees_us, sees, sizeof sees);
    char at[PROTO_IP_MAX];
    bee_members_seen_at(m, at);
    if (strcmp(at, m->seen_at) != 0) {
      memcpy(m->seen_at, at, sizeof at);
      if (at[0])
        bee_info(COMP, "swarm: peers reach this node at %s", at);
    }
  }
  if (port == 0) {
    bee_debug(COMP, "swarm: peer %s does not listen", id8);
    return;
  }
  char addr[BEE_ADDR_MAX];
  if (advertised_addr(proto_conn_addr(c), port, addr, sizeof addr)) {
    bee_warn(COMP, "swarm: peer %s: cannot use remote address %s", id8,
             proto_conn_addr(c));
    return;
  }
  if (strcmp(e->addr, addr) != 0)
    bee_debug(COMP, "swarm: peer %s listens on %s", id8, addr);
  memcpy(e->addr, addr, sizeof addr);
}

bool bee_members_oneway(bee_members *m, proto_conn *c, proto_bytes method,
                        proto_bytes payload) {
  if (!method_is(method, HELLO))
    return false;
  on_hello(m, c, payload);
  return true;
}

/* ---- swarm.peers -------------------------------------------------------- */

/* Answers swarm.peers with the listen addresses of our peers, leaving out
 * the asker's own. */
static void on_peers_request(proto_conn *c, uint64_t id, proto_bytes method,
                             proto_bytes payload, void *data) {
  bee_members *m = data;
  const proto_peer *asker = proto_conn_peer(c);
  char(*addrs)[BEE_ADDR_MAX] = malloc(BEE_PEERS_MAX * sizeof *addrs);
  size_t n = 0, len;
  uint8_t *buf = NULL;
  int rc = -ENOMEM;
  if (!addrs)
    goto out;
  for (size_t i = 0; i < m->n && n < BEE_PEERS_MAX; i++) {
    const bee_member *e = &m->v[i];
    if (e->addr[0] && memcmp(e->id, asker->id, PROTO_ID_BYTES) != 0)
      memcpy(addrs[n++], e->addr, BEE_ADDR_MAX);
  }
  size_t cap = proto_swarm_peers_encoded_max(n);
  if (!(buf = malloc(cap)))
    goto out;
  if ((rc = proto_swarm_peers_encode((const char(*)[BEE_ADDR_MAX])addrs, n,
                                     buf, cap, &len)) == 0)
    rc = proto_conn_reply(c, id, buf, len);
out:
  if (rc) {
    bee_warn(COMP, "swarm: cannot answer %s: %s", PEERS, bee_strerror(rc));
    proto_conn_reply_error(c, id, rc, bee_strerror(rc));
  }
  free(buf);
  free(addrs);
}

static void dial_cb(proto_host *h, proto_conn *c, int status, void *arg) {
  bee_dial *d = arg, **pp;
  bee_members *m = d->m;
  for (pp = &m->dials; *pp; pp = &(*pp)->next)
    if (*pp == d) {
      *pp = d->next;
      m->ndials--;
      break;
    }
  if (m->host && status == 0 && c)
    bee_members_up(m, c); /* on_up saw it first; this only makes sure */
  else if (m->host && status == BEE_ESELF)
    bee_debug(COMP, "swarm: %s is this node", d->addr);
  else if (m->host)
    bee_info(COMP, "swarm: cannot reach %s: %s", d->addr, bee_strerror(status));
  free(d);
}

/* Dials addr unless a peer already advertises it or a dial is under way. */
static void dial(bee_members *m, const char *addr) {
  for (size_t i = 0; i < m->n; i++)
    if (strcmp(m->v[i].addr, addr) == 0)
      return;
  for (bee_dial *d = m->dials; d; d = d->next)
    if (strcmp(d->addr, addr) == 0)
      return;
  if (m->ndials >= BEE_PEERS_MAX)
    return;
  bee_dial *d = calloc(1, sizeof *d);
  if (!d)
    abort();
  d->m = m;
  snprintf(d->addr, sizeof d->addr, "%s", addr);
  bee_debug(COMP, "swarm: dialing %s", addr);
  int rc = proto_host_connect(m->host, addr, PROTO_PURPOSE_CONTROL, dial_cb, d);
  if (rc) {
    bee_info(COMP, "swarm: cannot dial %s: %s", addr, bee_strerror(rc));
    free(d);
    return;
  }
  d->next = m->dials;
  m->dials = d;
  m->ndials++;
}

static void peers_cb(proto_conn *c, int status, int64_t remote_code,
                     proto_bytes payload, void *arg) {
  bee_members *m = arg;
  if (!m->host)
    return;
  if (status) {
    /* c may be on its way out; do not look at it. */
    bee_info(COMP, "swarm: %s failed: %s", PEERS,
             status == BEE_EREMOTE ? bee_strerror((int)remote_code)
                                   : bee_strerror(status));
    return;
  }
  char(*addrs)[BEE_ADDR_MAX] = malloc(BEE_PEERS_MAX * sizeof *addrs);
  size_t n;
  if (!addrs)
    abort();
  int rc = proto_swarm_peers_decode(payload.p, payload.n, addrs,
                                    BEE_PEERS_MAX, &n);
  for (size_t i = 0; rc == 0 && i < n; i++) {
    char host[BEE_HOST_MAX];
    unsigned port;
    if (bee_addr_parse(addrs[i], false, host, sizeof host, &port))
      rc = BEE_ERANGE;
  }
  if (rc) {
    char id8[9];
    bee_id8(proto_conn_peer(c)->id, id8);
    bee_warn(COMP, "swarm: ignoring a bad %s answer from %s: %s", PEERS, id8,
             bee_strerror(rc));
    n = 0;
  }
  for (size_t i = 0; i < n; i++)
    dial(m, addrs[i]);
  free(addrs);
}

int bee_members_ask(bee_members *m, proto_conn *c) {
  if (!m->host)
    return BEE_ECLOSED;
  return proto_conn_call(c, PEERS, NULL, 0, 0, peers_cb, m, NULL);
}

/* ---- status ------------------------------------------------------------- */

void bee_members_log_status(const bee_members *m) {
  char ids[STATUS_IDS_MAX * 9 + 32];
  size_t off = 0;
  ids[0] = '\0';
  for (size_t i = 0; i < m->n && i < STATUS_IDS_MAX; i++) {
    char id8[9];
    bee_id8(m->v[i].id, id8);
    off += (size_t)snprintf(ids + off, sizeof ids - off, "%s%s", i ? " " : "",
                            id8);
  }
  if (m->n > STATUS_IDS_MAX)
    snprintf(ids + off, sizeof ids - off, " +%zu more", m->n - STATUS_IDS_MAX);
  bee_info(COMP, "swarm: %zu peers [%s]", m->n, ids);
}
