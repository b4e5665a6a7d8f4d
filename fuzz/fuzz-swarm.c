/* fuzz-swarm.c: libFuzzer target for the membership payloads.
 *
 * The first byte picks swarm.hello or swarm.peers.  Whatever a decoder
 * accepts must encode again to bytes that decode to the same values.
 */
#include "proto.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char addrs[PROTO_PEERS_MAX][PROTO_ADDR_MAX];
static char again[PROTO_PEERS_MAX][PROTO_ADDR_MAX];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  bool peers = data[0] & 1;
  data++, size--;
  if (!peers) {
    unsigned port, port2;
    char ip[PROTO_IP_MAX], ip2[PROTO_IP_MAX];
    uint8_t buf[16 + PROTO_IP_MAX];
    size_t len;
    if (proto_swarm_hello_decode(data, size, &port, ip) != 0)
      return 0;
    if (proto_swarm_hello_encode(port, ip, buf, sizeof buf, &len) != 0 ||
        proto_swarm_hello_decode(buf, len, &port2, ip2) != 0 || port != port2 ||
        strcmp(ip, ip2) != 0)
      abort();
    return 0;
  }
  size_t n, n2, len;
  if (proto_swarm_peers_decode(data, size, addrs, PROTO_PEERS_MAX, &n) != 0)
    return 0;
  size_t cap = proto_swarm_peers_encoded_max(n);
  uint8_t *buf = malloc(cap);
  if (!buf ||
      proto_swarm_peers_encode((const char(*)[PROTO_ADDR_MAX])addrs, n, buf,
                               cap, &len) != 0 ||
      proto_swarm_peers_decode(buf, len, again, PROTO_PEERS_MAX, &n2) != 0 ||
      n2 != n)
    abort();
  for (size_t i = 0; i < n; i++)
    if (strcmp(addrs[i], again[i]) != 0)
      abort();
  free(buf);
  return 0;
}
