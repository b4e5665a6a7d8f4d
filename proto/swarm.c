/* swarm.c: the membership payloads swarm.hello and swarm.peers.
 *
 * They ride inside ONEWAY and RESPONSE envelopes until the DHT takes over
 * peer discovery (issue 3); like every message they are arrays with a
 * version and a type, and are decoded by the strict cursor.
 */
#include "proto-int.h"

#include <arpa/inet.h>
#include <string.h>

int proto_addr_host(const char *addr, char *host, size_t cap,
                    const char **port) {
  const char *colon = strrchr(addr, ':');
  if (!colon || !colon[1])
    return BEE_ERANGE;
  const char *s = addr;
  size_t n = (size_t)(colon - addr);
  if (n >= 2 && s[0] == '[' && s[n - 1] == ']')
    s++, n -= 2;
  if (n == 0 || n >= cap)
    return BEE_ERANGE;
  memcpy(host, s, n);
  host[n] = '\0';
  if (strncmp(host, "::ffff:", 7) == 0 && strchr(host + 7, '.'))
    memmove(host, host + 7, strlen(host + 7) + 1);
  if (port)
    *port = colon + 1;
  return 0;
}

bool proto_host_loopback(const char *host) {
  return strncmp(host, "127.", 4) == 0 || strcmp(host, "::1") == 0 ||
         strcmp(host, "localhost") == 0;
}

bool proto_ip_literal(const char *s) {
  uint8_t a[16];
  return s && strnlen(s, PROTO_IP_MAX) < PROTO_IP_MAX &&
         (inet_pton(AF_INET, s, a) == 1 || inet_pton(AF_INET6, s, a) == 1);
}

int proto_swarm_hello_encode(unsigned port, const char *observed, uint8_t *buf,
                             size_t cap, size_t *len) {
  proto_wr w;
  if (!observed)
    observed = "";
  if (port > 65535 || (observed[0] && !proto_ip_literal(observed)))
    return BEE_ERANGE;
  proto__wr_init(&w, buf, cap);
  proto__wr_head(&w, PROTO_T_SWARM_HELLO, 2);
  proto__wr_uint(&w, port);
  proto__wr_str(&w, observed, strlen(observed));
  *len = w.len;
  return w.err;
}

int proto_swarm_hello_decode(const uint8_t *buf, size_t len, unsigned *port,
                             char observed[PROTO_IP_MAX]) {
  proto_rd r, peek;
  int type, rc;
  uint64_t v;
  uint32_t n;
  proto_bytes ip = {NULL, 0};
  proto__rd_init(&r, buf, len);
  /* Two fields, or one from a peer that predates the observed address. */
  peek = r;
  if ((rc = proto__rd_array(&peek, &n)))
    return rc;
  uint32_t fields = n == 3 ? 1 : 2;
  if ((rc = proto__rd_head(&r, PROTO_T_SWARM_HELLO, fields, &type)) ||
      (rc = proto__rd_uint(&r, &v)) ||
      (fields == 2 && (rc = proto__rd_str(&r, &ip, PROTO_IP_MAX - 1))) ||
      (rc = proto__rd_end(&r)))
    return rc;
  if (v > 65535)
    return BEE_ERANGE;
  memcpy(observed, ip.p ? ip.p : (const uint8_t *)"", ip.n);
  observed[ip.n] = '\0';
  if (ip.n && (memchr(ip.p, 0, ip.n) || !proto_ip_literal(observed))) {
    observed[0] = '\0';
    return BEE_ERANGE;
  }
  *port = (unsigned)v;
  return 0;
}

size_t proto_swarm_peers_encoded_max(size_t n) {
  return 16 + n * (PROTO_ADDR_MAX + 5);
}

int proto_swarm_peers_encode(const char (*addrs)[PROTO_ADDR_MAX], size_t n,
                             uint8_t *buf, size_t cap, size_t *len) {
  proto_wr w;
  if (n > PROTO_PEERS_MAX)
    return BEE_ETOOBIG;
  proto__wr_init(&w, buf, cap);
  proto__wr_head(&w, PROTO_T_SWARM_PEERS, 1);
  proto__wr_array(&w, (uint32_t)n);
  for (size_t i = 0; i < n; i++) {
    size_t l = strnlen(addrs[i], PROTO_ADDR_MAX);
    if (l == 0 || l == PROTO_ADDR_MAX)
      return BEE_ERANGE;
    proto__wr_str(&w, addrs[i], l);
  }
  *len = w.len;
  return w.err;
}

int proto_swarm_peers_decode(const uint8_t *buf, size_t len,
                             char (*addrs)[PROTO_ADDR_MAX], size_t max,
                             size_t *n) {
  proto_rd r;
  int type, rc;
  uint32_t count;
  *n = 0;
  proto__rd_init(&r, buf, len);
  if ((rc = proto__rd_head(&r, PROTO_T_SWARM_PEERS, 1, &type)) ||
      (rc = proto__rd_array(&r, &count)))
    return rc;
  if (count > max || count > PROTO_PEERS_MAX)
    return BEE_ETOOBIG;
  for (uint32_t i = 0; i < count; i++) {
    proto_bytes a;
    if ((rc = proto__rd_str(&r, &a, PROTO_ADDR_MAX - 1)))
      return rc == BEE_ETOOBIG ? BEE_ERANGE : rc;
    if (a.n == 0 || memchr(a.p, 0, a.n))
      return BEE_ERANGE;
    memcpy(addrs[i], a.p, a.n);
    addrs[i][a.n] = 0;
  }
  if ((rc = proto__rd_end(&r)))
    return rc;
  *n = count;
  return 0;
}
