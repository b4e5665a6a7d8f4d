/* swarm.c: the membership payloads swarm.hello and swarm.peers.
 *
 * They ride inside ONEWAY and RESPONSE envelopes until the DHT takes over
 * peer discovery (issue 3); like every message they are arrays with a
 * version and a type, and are decoded by the strict cursor.
 */
#include "proto-int.h"

#include <string.h>

int proto_swarm_hello_encode(unsigned port, uint8_t *buf, size_t cap,
                             size_t *len) {
  proto_wr w;
  if (port > 65535)
    return BEE_ERANGE;
  proto__wr_init(&w, buf, cap);
  proto__wr_head(&w, PROTO_T_SWARM_HELLO, 1);
  proto__wr_uint(&w, port);
  *len = w.len;
  return w.err;
}

int proto_swarm_hello_decode(const uint8_t *buf, size_t len, unsigned *port) {
  proto_rd r;
  int type, rc;
  uint64_t v;
  proto__rd_init(&r, buf, len);
  if ((rc = proto__rd_head(&r, PROTO_T_SWARM_HELLO, 1, &type)) ||
      (rc = proto__rd_uint(&r, &v)) || (rc = proto__rd_end(&r)))
    return rc;
  if (v > 65535)
    return BEE_ERANGE;
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
