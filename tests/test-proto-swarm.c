/* test-proto-swarm.c: the membership payloads swarm.hello and swarm.peers. */
#include "proto.h"
#include "test.h"

#include <string.h>

static char addrs[PROTO_PEERS_MAX + 1][PROTO_ADDR_MAX];
static char out[PROTO_PEERS_MAX][PROTO_ADDR_MAX];
static uint8_t buf[PROTO_PEERS_MAX * (PROTO_ADDR_MAX + 8)];

static void test_hello(void) {
  size_t len;
  unsigned port;
  char ip[PROTO_IP_MAX];
  ASSERT_OK(
      proto_swarm_hello_encode(45555, "10.77.0.4", buf, sizeof buf, &len));
  ASSERT_OK(proto_swarm_hello_decode(buf, len, &port, ip));
  ASSERT_EQ(port, 45555);
  ASSERT(strcmp(ip, "10.77.0.4") == 0);
  ASSERT_OK(proto_swarm_hello_encode(1, "2001:db8::7", buf, sizeof buf, &len));
  ASSERT_OK(proto_swarm_hello_decode(buf, len, &port, ip));
  ASSERT(strcmp(ip, "2001:db8::7") == 0);
  ASSERT_OK(proto_swarm_hello_encode(0, NULL, buf, sizeof buf, &len));
  ASSERT_OK(proto_swarm_hello_decode(buf, len, &port, ip));
  ASSERT(port == 0 && ip[0] == 0);
  ASSERT_RC(proto_swarm_hello_encode(65536, "", buf, sizeof buf, &len),
            BEE_ERANGE);
  /* Not an IP literal: a name, a port, brackets. */
  ASSERT_RC(proto_swarm_hello_encode(1, "queen", buf, sizeof buf, &len),
            BEE_ERANGE);
  ASSERT_RC(proto_swarm_hello_encode(1, "10.0.0.1:5", buf, sizeof buf, &len),
            BEE_ERANGE);
  ASSERT_RC(proto_swarm_hello_encode(1, "[::1]", buf, sizeof buf, &len),
            BEE_ERANGE);
  /* An older peer's [1, 40, port]: no observed address. */
  const uint8_t old[] = {0x93, 1, 40, 5};
  strcpy(ip, "x");
  ASSERT_OK(proto_swarm_hello_decode(old, sizeof old, &port, ip));
  ASSERT(port == 5 && ip[0] == 0);
  /* [1, 40, 70000] */
  const uint8_t big[] = {0x93, 1, 40, 0xce, 0x00, 0x01, 0x11, 0x70};
  ASSERT_RC(proto_swarm_hello_decode(big, sizeof big, &port, ip), BEE_ERANGE);
  const uint8_t neg[] = {0x93, 1, 40, 0xff};
  ASSERT_RC(proto_swarm_hello_decode(neg, sizeof neg, &port, ip), BEE_ERANGE);
  const uint8_t wrongtype[] = {0x93, 1, 41, 5};
  ASSERT_RC(proto_swarm_hello_decode(wrongtype, sizeof wrongtype, &port, ip),
            BEE_EUNKNOWN);
  /* The second field must be a string; no third. */
  const uint8_t notstr[] = {0x94, 1, 40, 5, 6};
  ASSERT(proto_swarm_hello_decode(notstr, sizeof notstr, &port, ip) != 0);
  const uint8_t extra[] = {0x95, 1, 40, 5, 0xa0, 6};
  ASSERT_RC(proto_swarm_hello_decode(extra, sizeof extra, &port, ip),
            BEE_ETYPE);
  /* An observed address that is no IP: "a.b", "1.2.3.4\0x", too long. */
  const uint8_t name[] = {0x94, 1, 40, 5, 0xa3, 'a', '.', 'b'};
  ASSERT_RC(proto_swarm_hello_decode(name, sizeof name, &port, ip), BEE_ERANGE);
  ASSERT(ip[0] == 0);
  const uint8_t nul[] = {0x94, 1,   40,  5,   0xa9, '1', '.',
                         '2',  '.', '3', '.', '4',  0,   'x'};
  ASSERT_RC(proto_swarm_hello_decode(nul, sizeof nul, &port, ip), BEE_ERANGE);
  uint8_t long_ip[4 + 2 + 60] = {0x94, 1, 40, 5, 0xd9, 60};
  memset(long_ip + 6, '1', 60);
  ASSERT(proto_swarm_hello_decode(long_ip, sizeof long_ip, &port, ip) != 0);
  const uint8_t trailing[] = {0x93, 1, 40, 5, 0};
  ASSERT_RC(proto_swarm_hello_decode(trailing, sizeof trailing, &port, ip),
            BEE_ETRAILING);
  ASSERT_OK(proto_swarm_hello_encode(7, "127.0.0.1", buf, sizeof buf, &len));
  for (size_t i = 0; i < len; i++)
    ASSERT(proto_swarm_hello_decode(buf, i, &port, ip) != 0);
}

static void test_addr_host(void) {
  char h[PROTO_IP_MAX];
  const char *port;
  ASSERT_OK(proto_addr_host("10.77.0.4:45555", h, sizeof h, &port));
  ASSERT(strcmp(h, "10.77.0.4") == 0 && strcmp(port, "45555") == 0);
  ASSERT_OK(proto_addr_host("[2001:db8::7]:1", h, sizeof h, &port));
  ASSERT(strcmp(h, "2001:db8::7") == 0 && strcmp(port, "1") == 0);
  ASSERT_OK(proto_addr_host("[::ffff:10.0.0.9]:2", h, sizeof h, NULL));
  ASSERT(strcmp(h, "10.0.0.9") == 0);
  ASSERT_OK(proto_addr_host("queen.example.org:45555", h, sizeof h, NULL));
  ASSERT(strcmp(h, "queen.example.org") == 0 && !proto_ip_literal(h));
  ASSERT_RC(proto_addr_host("10.0.0.1", h, sizeof h, NULL), BEE_ERANGE);
  ASSERT_RC(proto_addr_host("10.0.0.1:", h, sizeof h, NULL), BEE_ERANGE);
  ASSERT_RC(proto_addr_host(":5", h, sizeof h, NULL), BEE_ERANGE);
  ASSERT_RC(proto_addr_host("[]:5", h, sizeof h, NULL), BEE_ERANGE);
  ASSERT_RC(proto_addr_host("10.0.0.1:5", h, 8, NULL), BEE_ERANGE);
  ASSERT(proto_ip_literal("127.0.0.1") && proto_ip_literal("::1"));
  ASSERT(proto_host_loopback("127.0.0.1") && proto_host_loopback("127.9.9.9") &&
         proto_host_loopback("::1") && proto_host_loopback("localhost"));
  ASSERT(!proto_host_loopback("10.0.0.1") && !proto_host_loopback("::") &&
         !proto_host_loopback("0.0.0.0") && !proto_host_loopback("128.0.0.1"));
  ASSERT(!proto_ip_literal("") && !proto_ip_literal("1.2.3") &&
         !proto_ip_literal("[::1]") && !proto_ip_literal(NULL));
}

static void test_peers(void) {
  size_t len, n;
  for (int i = 0; i < PROTO_PEERS_MAX + 1; i++)
    snprintf(addrs[i], PROTO_ADDR_MAX, "10.0.%d.%d:45555", i / 250, i % 250);
  /* The longest allowed address: a 253-byte name and a port. */
  memset(addrs[1], 'a', PROTO_ADDR_MAX - 7);
  memcpy(addrs[1] + PROTO_ADDR_MAX - 7, ":45555", 7);
  const char(*a)[PROTO_ADDR_MAX] = (const char(*)[PROTO_ADDR_MAX])addrs;
  ASSERT_OK(proto_swarm_peers_encode(a, PROTO_PEERS_MAX, buf, sizeof buf, &len));
  ASSERT_LE(len, proto_swarm_peers_encoded_max(PROTO_PEERS_MAX));
  ASSERT_OK(proto_swarm_peers_decode(buf, len, out, PROTO_PEERS_MAX, &n));
  ASSERT_EQ(n, PROTO_PEERS_MAX);
  for (size_t i = 0; i < n; i++)
    ASSERT_STREQ(out[i], addrs[i]);
  /* More than the caller has room for. */
  ASSERT_RC(proto_swarm_peers_decode(buf, len, out, 10, &n), BEE_ETOOBIG);
  ASSERT_EQ(n, 0);
  ASSERT_RC(proto_swarm_peers_encode(a, PROTO_PEERS_MAX + 1, buf, sizeof buf, &len),
            BEE_ETOOBIG);
  /* An empty list is fine. */
  ASSERT_OK(proto_swarm_peers_encode(a, 0, buf, sizeof buf, &len));
  ASSERT_OK(proto_swarm_peers_decode(buf, len, out, PROTO_PEERS_MAX, &n));
  ASSERT_EQ(n, 0);
  /* Bad entries: empty, a NUL inside, not a string, too long. */
  const uint8_t empty[] = {0x93, 1, 41, 0x91, 0xa0};
  ASSERT_RC(proto_swarm_peers_decode(empty, sizeof empty, out, 8, &n), BEE_ERANGE);
  const uint8_t nul[] = {0x93, 1, 41, 0x91, 0xa3, 'a', 0, 'b'};
  ASSERT_RC(proto_swarm_peers_decode(nul, sizeof nul, out, 8, &n), BEE_ERANGE);
  const uint8_t notstr[] = {0x93, 1, 41, 0x91, 0x05};
  ASSERT_RC(proto_swarm_peers_decode(notstr, sizeof notstr, out, 8, &n), BEE_ETYPE);
  uint8_t longone[8 + PROTO_ADDR_MAX] = {0x93, 1, 41, 0x91, 0xda,
                                         PROTO_ADDR_MAX >> 8,
                                         PROTO_ADDR_MAX & 0xff};
  memset(longone + 7, 'x', PROTO_ADDR_MAX);
  ASSERT_RC(proto_swarm_peers_decode(longone, 7 + PROTO_ADDR_MAX, out, 8, &n),
            BEE_ERANGE);
  /* A count the bytes cannot back. */
  const uint8_t lying[] = {0x93, 1, 41, 0xdd, 0xff, 0xff, 0xff, 0xff};
  ASSERT_RC(proto_swarm_peers_decode(lying, sizeof lying, out, 8, &n),
            BEE_ETRUNCATED);
  ASSERT_OK(proto_swarm_peers_encode(a, 3, buf, sizeof buf, &len));
  for (size_t i = 0; i < len; i++)
    ASSERT(proto_swarm_peers_decode(buf, i, out, 8, &n) != 0);
}

int main(void) {
  test_hello();
  test_addr_host();
  test_peers();
  printf("swarm payloads: all checks passed\n");
  return 0;
}
