/* test-daemon-members.c: where a node's peers see it
 * (bee_members_seen_at, daemon/members.c).
 *
 * The table's members say, by their swarm.hello, the IP address they see
 * this node at.  The node takes the one most of them name where two name
 * it, or the only peer's; an address that is not loopback wins over
 * loopback ones, and a lone dissenter changes nothing.  What a peer may
 * not say it sees us at (bee_seen_absurd): unspecified, multicast and
 * broadcast addresses, an IPv4 address in IPv6 form, loopback over a
 * connection from another host and the reverse.
 */
#include "bee.h"
#include "test.h"

#include <string.h>

static bee_members m;
static bee_member v[8];

/* Sets the members' views: NULL ends the list, "" is a peer that named
 * none. */
static void views(const char *a, const char *b, const char *c, const char *d) {
  const char *s[] = {a, b, c, d};
  memset(v, 0, sizeof v);
  m.v = v;
  m.n = 0;
  for (size_t i = 0; i < 4 && s[i]; i++)
    snprintf(v[m.n++].sees_us, PROTO_IP_MAX, "%s", s[i]);
}

static const char *seen(void) {
  static char out[PROTO_IP_MAX];
  bool ok = bee_members_seen_at(&m, out);
  ASSERT_EQ(ok, out[0] != 0);
  return out;
}

int main(void) {
  views(NULL, NULL, NULL, NULL);
  ASSERT_STREQ(seen(), ""); /* no peer */
  views("", "", NULL, NULL);
  ASSERT_STREQ(seen(), ""); /* peers that named none (older ones) */
  views("10.77.0.4", NULL, NULL, NULL);
  ASSERT_STREQ(seen(), "10.77.0.4"); /* the only peer's word */
  views("10.77.0.4", "", NULL, NULL);
  ASSERT_STREQ(seen(), "10.77.0.4"); /* the only one that names one */
  views("10.77.0.4", "203.0.113.9", NULL, NULL);
  ASSERT_STREQ(seen(), ""); /* two that disagree: neither */
  views("10.77.0.4", "203.0.113.9", "203.0.113.9", NULL);
  ASSERT_STREQ(seen(), "203.0.113.9"); /* two of three */
  views("203.0.113.9", "10.77.0.4", "203.0.113.9", "10.0.0.5");
  ASSERT_STREQ(seen(), "203.0.113.9");
  /* A peer on this host sees loopback; a remote one's view wins. */
  views("127.0.0.1", "127.0.0.1", "10.77.0.4", NULL);
  ASSERT_STREQ(seen(), "10.77.0.4");
  views("127.0.0.1", "127.0.0.1", NULL, NULL);
  ASSERT_STREQ(seen(), "127.0.0.1"); /* a swarm on one host */
  views("::1", "2001:db8::7", "2001:db8::7", NULL);
  ASSERT_STREQ(seen(), "2001:db8::7");

  /* What a peer may not say it sees us at. */
  ASSERT(bee_seen_absurd("10.77.0.1", "10.77.0.4") == NULL);
  ASSERT(bee_seen_absurd("127.0.0.1", "127.0.0.1") == NULL);
  ASSERT(bee_seen_absurd("", "203.0.113.9") == NULL);
  ASSERT(bee_seen_absurd("2001:db8::1", "2001:db8::7") == NULL);
  const char *never[] = {
      "0.0.0.0",         "0.1.2.3", "224.0.0.1", "239.9.9.9",
      "255.255.255.255", "::",      "ff02::1",   "::ffff:10.0.0.4"};
  for (size_t i = 0; i < sizeof never / sizeof *never; i++)
    ASSERT(bee_seen_absurd("10.77.0.1", never[i]) != NULL);
  /* Loopback from another host, another host over loopback. */
  ASSERT(bee_seen_absurd("10.77.0.1", "127.0.0.1") != NULL);
  ASSERT(bee_seen_absurd("10.77.0.1", "::1") != NULL);
  ASSERT(bee_seen_absurd("127.0.0.1", "10.77.0.4") != NULL);
  printf("seen at: the majority of two or more, the only peer's, not "
         "loopback first; unspecified, multicast, broadcast, mapped and "
         "loopback across hosts refused\n");
  return 0;
}
