/* test-proto-links.c: the links record ("bee.links"), what a peer
 * measured of its links to others, as the DHT carries it.
 *
 * It round-trips at its edges (no entry, PROTO_LINKS_MAX entries, the
 * largest figures) within PROTO_LINKS_RECORD_MAX bytes, matches a vector
 * written by hand, skips later fields in an entry and in the record, and
 * refuses each malformed class with its code, on both sides: a repeated
 * peer, an absurd round trip, rate or age, a NaN, an id of another size,
 * too many entries, a cut anywhere.  proto_record_check takes it only
 * under an owned subkey and the key "<run>_links". */
#define _GNU_SOURCE /* memmem */
#include "proto.h"
#include "test.h"
#include "testlib.h"

#include <math.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>

static proto_links sample(size_t n) {
  proto_links l;
  memset(&l, 0, sizeof l);
  strcpy(l.run, "lab");
  l.time_ms = 1700000000123ull;
  l.n = n;
  for (size_t i = 0; i < n; i++) {
    memset(l.links[i].id, (int)(i + 1), PROTO_ID_BYTES);
    l.links[i].rtt_us = 1000 * (i + 1);
    l.links[i].mbit = 12.5 * (double)i;
    l.links[i].age_s = i;
  }
  return l;
}

static void same(const proto_links *a, const proto_links *b) {
  ASSERT_STREQ(a->run, b->run);
  ASSERT_UEQ(a->time_ms, b->time_ms);
  ASSERT_UEQ(a->n, b->n);
  for (size_t i = 0; i < a->n; i++) {
    ASSERT_MEMEQ(a->links[i].id, b->links[i].id, PROTO_ID_BYTES);
    ASSERT_UEQ(a->links[i].rtt_us, b->links[i].rtt_us);
    ASSERT(a->links[i].mbit == b->links[i].mbit);
    ASSERT_UEQ(a->links[i].age_s, b->links[i].age_s);
  }
}

static void test_roundtrip(void) {
  static uint8_t buf[PROTO_LINKS_RECORD_MAX];
  size_t sizes[] = {0, 1, 3, PROTO_LINKS_MAX};
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
    proto_links in = sample(sizes[s]), out;
    if (sizes[s] == PROTO_LINKS_MAX) { /* every field at its largest */
      memset(in.run, 'r', PROTO_RUN_MAX);
      in.run[PROTO_RUN_MAX] = 0;
      in.time_ms = UINT64_MAX;
      in.links[0].rtt_us = PROTO_LINK_RTT_MAX_US;
      in.links[0].mbit = PROTO_LINK_MBIT_MAX;
      in.links[0].age_s = PROTO_LINK_AGE_MAX_S;
      for (size_t i = 1; i < in.n; i++) {
        in.links[i].rtt_us = UINT32_MAX < PROTO_LINK_RTT_MAX_US
                                 ? UINT32_MAX
                                 : PROTO_LINK_RTT_MAX_US;
        in.links[i].mbit = PROTO_LINK_MBIT_MAX / 3;
        in.links[i].age_s = PROTO_LINK_AGE_MAX_S;
      }
    }
    size_t len;
    ASSERT_OK(proto_links_encode(&in, buf, sizeof buf, &len));
    ASSERT_LE(len, PROTO_LINKS_RECORD_MAX);
    ASSERT_OK(proto_links_decode(buf, len, &out));
    same(&in, &out);
    /* Every cut is BEE_ETRUNCATED, in a buffer of its own size. */
    for (size_t i = 0; i < len; i++) {
      uint8_t *part = malloc(i ? i : 1);
      ASSERT(part);
      memcpy(part, buf, i);
      ASSERT_CODE(proto_links_decode(part, i, &out), BEE_ETRUNCATED,
                  "%zu entries cut at %zu", sizes[s], i);
      ASSERT_UEQ(out.n, 0);
      free(part);
    }
  }
}

static void test_vector(void) {
  /* clang-format off */
  static const uint8_t want[] =
      "\x95\xa9" "bee.links" "\x01\xa1" "r" "\x07"
      "\x91\x94\xc4\x14" "\x11\x11\x11\x11\x11\x11\x11\x11\x11\x11"
                         "\x11\x11\x11\x11\x11\x11\x11\x11\x11\x11"
      "\xcd\x03\xe8" "\xcb\x40\x59\x00\x00\x00\x00\x00\x00" "\x05";
  /* clang-format on */
  proto_links l = {.time_ms = 7, .n = 1};
  strcpy(l.run, "r");
  memset(l.links[0].id, 0x11, PROTO_ID_BYTES);
  l.links[0].rtt_us = 1000;
  l.links[0].mbit = 100;
  l.links[0].age_s = 5;
  uint8_t buf[128];
  size_t len;
  ASSERT_OK(proto_links_encode(&l, buf, sizeof buf, &len));
  ASSERT_UEQ(len, sizeof want - 1);
  ASSERT_MEMEQ(buf, want, len);
  /* A later version's fields: one more in the entry, one in the record. */
  uint8_t more[128];
  size_t k = 0;
  memcpy(more, want, sizeof want - 1);
  more[0] = 0x96;  /* six fields */
  more[16] = 0x95; /* an entry of five */
  k = sizeof want - 1;
  more[k++] = 0xc0; /* the entry's fifth: nil */
  more[k++] = 0xa1; /* the record's sixth: "x" */
  more[k++] = 'x';
  proto_links out;
  ASSERT_OK(proto_links_decode(more, k, &out));
  same(&l, &out);
  ASSERT_RC(proto_links_decode(more, k - 2, &out), BEE_ETRUNCATED);
  /* An entry of three fields lacks one. */
  memcpy(more, want, sizeof want - 1);
  more[16] = 0x93;
  ASSERT_RC(proto_links_decode(more, sizeof want - 2, &out), BEE_EMISSING);
  /* An id of 19 bytes. */
  memcpy(more, want, sizeof want - 1);
  more[18] = 0x13;
  ASSERT(proto_links_decode(more, sizeof want - 1, &out) != 0);
  /* A float32 rate: one encoding per value. */
  static const uint8_t f32[] = "\x95\xa9"
                               "bee.links"
                               "\x01\xa1"
                               "r"
                               "\x07"
                               "\x91\x94\xc4\x14"
                               "\x11\x11\x11\x11\x11\x11\x11\x11\x11\x11"
                               "\x11\x11\x11\x11\x11\x11\x11\x11\x11\x11"
                               "\xcd\x03\xe8"
                               "\xca\x42\xc8\x00\x00"
                               "\x05";
  ASSERT_RC(proto_links_decode(f32, sizeof f32 - 1, &out), BEE_ETYPE);
}

/* The encoder refuses what the decoder would; the decoder refuses it in
 * bytes written by hand (the encoder's output, patched). */
static void test_refusals(void) {
  static uint8_t buf[PROTO_LINKS_RECORD_MAX], junk[PROTO_LINKS_RECORD_MAX];
  size_t len;
  memset(junk, 0x3c, sizeof junk);
#define REFUSE(l, want)                                                        \
  ASSERT_REFUSES(proto_links_encode(&(l), buf, sizeof buf, &len), want, buf,   \
                 junk, sizeof buf, len)
  proto_links l = sample(3);
  memcpy(l.links[2].id, l.links[0].id, PROTO_ID_BYTES);
  REFUSE(l, BEE_ERANGE); /* one peer twice */
  l = sample(3);
  l.links[1].rtt_us = PROTO_LINK_RTT_MAX_US + 1;
  REFUSE(l, BEE_ERANGE);
  l = sample(3);
  l.links[1].age_s = PROTO_LINK_AGE_MAX_S + 1;
  REFUSE(l, BEE_ERANGE);
  static const double bad[] = {-1, NAN, INFINITY, PROTO_LINK_MBIT_MAX * 2};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    l = sample(3);
    l.links[2].mbit = bad[i];
    REFUSE(l, BEE_ERANGE);
  }
  l = sample(3);
  l.n = PROTO_LINKS_MAX + 1;
  REFUSE(l, BEE_ERANGE);
  l = sample(3);
  strcpy(l.run, "a b");
  REFUSE(l, BEE_ERANGE);
  l = sample(3);
  ASSERT_RC(proto_links_encode(&l, buf, 40, &len), BEE_ETOOBIG);

  /* The decoder, on patched bytes: a repeated peer, an absurd rate. */
  proto_links out;
  l = sample(2);
  ASSERT_OK(proto_links_encode(&l, buf, sizeof buf, &len));
  uint8_t *second = memmem(buf, len, l.links[1].id, PROTO_ID_BYTES);
  ASSERT(second);
  memcpy(second, l.links[0].id, PROTO_ID_BYTES);
  ASSERT_RC(proto_links_decode(buf, len, &out), BEE_ERANGE);
  ASSERT_UEQ(out.n, 0);
  l = sample(2);
  l.links[1].mbit = 1;
  ASSERT_OK(proto_links_encode(&l, buf, sizeof buf, &len));
  uint8_t one[] = "\xcb\x3f\xf0\x00\x00\x00\x00\x00\x00"; /* 1.0 */
  uint8_t *f = memmem(buf, len, one, 9);
  ASSERT(f);
  memcpy(f, "\xcb\x7f\xf8\x00\x00\x00\x00\x00\x00", 9); /* NaN */
  ASSERT_RC(proto_links_decode(buf, len, &out), BEE_ERANGE);
  memcpy(f, "\xcb\x41\x3e\x84\x80\x00\x00\x00\x00", 9); /* 2e6 */
  ASSERT_RC(proto_links_decode(buf, len, &out), BEE_ERANGE);
  memcpy(f, "\xcb\xbf\xf0\x00\x00\x00\x00\x00\x00", 9); /* -1 */
  ASSERT_RC(proto_links_decode(buf, len, &out), BEE_ERANGE);
  /* More entries than a record may hold: refused before any is read. */
  uint8_t many[100] = "\x95\xa9"
                      "bee.links"
                      "\x01\xa1"
                      "r"
                      "\x07\xdc\x00\x41";
  ASSERT_RC(proto_links_decode(many, sizeof many, &out), BEE_ERANGE);
}

static void test_check(void) {
  static uint8_t buf[PROTO_LINKS_RECORD_MAX];
  uint8_t owned[PROTO_DHT_OWNED_SUBKEY_BYTES], key[PROTO_DHT_KEY_BYTES];
  owned[0] = PROTO_DHT_OWNER_TAG;
  memset(owned + 1, 0x77, PROTO_PK_BYTES);
  proto_links l = sample(PROTO_LINKS_MAX);
  size_t len;
  ASSERT_OK(proto_links_encode(&l, buf, sizeof buf, &len));
  proto_record_key(PROTO_REC_LINKS, "lab", 0, NULL, key);
  uint8_t named[PROTO_DHT_KEY_BYTES];
  proto_dht_key("lab_links", named);
  ASSERT_MEMEQ(key, named, sizeof key);
  proto_dht_record r = {.value = {buf, len}, .expiration = 1700000000};
  memcpy(r.key, key, sizeof key);
  r.subkey = (proto_bytes){owned, sizeof owned};
  int type = -1;
  ASSERT_OK(proto_record_check(&r, &type));
  ASSERT_EQ(type, PROTO_REC_LINKS);
  /* Under another run's key, or a plain subkey: refused. */
  proto_record_key(PROTO_REC_LINKS, "other", 0, NULL, r.key);
  ASSERT_RC(proto_record_check(&r, &type), BEE_EAUTH);
  memcpy(r.key, key, sizeof key);
  r.subkey = (proto_bytes){(const uint8_t *)"x", 1};
  ASSERT_RC(proto_record_check(&r, &type), BEE_EAUTH);
  /* A forged one (a peer twice) fails its schema, whoever signed it. */
  r.subkey = (proto_bytes){owned, sizeof owned};
  uint8_t *second = memmem(buf, len, l.links[1].id, PROTO_ID_BYTES);
  ASSERT(second);
  memcpy(second, l.links[0].id, PROTO_ID_BYTES);
  ASSERT_RC(proto_record_check(&r, &type), BEE_ERANGE);
  ASSERT_EQ(type, PROTO_REC_LINKS);
}

int main(void) {
  if (sodium_init() < 0)
    FAIL("sodium_init");
  test_roundtrip();
  test_vector();
  test_refusals();
  test_check();
  return 0;
}
