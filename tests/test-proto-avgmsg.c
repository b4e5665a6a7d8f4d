/* test-proto-avgmsg.c: the averaging round's payloads (proto/avg-msg.c).
 *
 * The example of docs/PROTOCOL.md section 10, round trips, and one error
 * code per malformed class, WAIT's and the matchmaking's types between
 * included.
 */
#include "proto.h"
#include "test.h"
#include "testlib.h"

#define CODEC_NONE 0 /* averager's AVG_NONE: the codec is a plain number here */


#define G "c4 10 5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a "

static void test_msg(void) {
  static const struct {
    const char *hex;
    int rc;
  } cases[] = {
      {"98 01 3c " G "03 11 00 cb 4040000000000000 c0", 0},
      {"97 01 3d " G "11 04 05 c0", 0},
      {"95 01 3e " G "e7 a3 616263", 0},
      {"98 02 3c " G "03 11 00 cb 4040000000000000 c0", BEE_EVERSION},
      {"98 01 3f " G "03 11 00 cb 4040000000000000 c0", BEE_EUNKNOWN},
      {"97 01 3c " G "03 11 00 cb 4040000000000000 c0", BEE_EMISSING},
      {"99 01 3c " G "03 11 00 cb 4040000000000000 c0 c0", BEE_ETYPE},
      {"98 01 3c c4 0f 5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a 03 11 00 cb "
       "4040000000000000 c0",
       BEE_ERANGE},
      {"98 01 3c " G "cd ffff 11 00 cb 4040000000000000 c0", BEE_ERANGE},
      {"98 01 3c " G "03 11 cd 0100 cb 4040000000000000 c0", BEE_ERANGE},
      {"98 01 3c " G "03 11 00 cb 7ff8000000000000 c0", BEE_ERANGE},
      {"98 01 3c " G "03 11 00 cb 7ff0000000000000 c0", BEE_ERANGE},
      {"98 01 3c " G "03 11 00 cb bff0000000000000 c0", BEE_ERANGE},
      {"98 01 3c " G "03 11 00 cb 4810000000000000 c0", BEE_ERANGE},
      {"98 01 3c " G "03 11 00 cb 8000000000000000 c0", 0}, /* -0.0 */
      {"98 01 3c " G "03 11 00 ca 42000000 c0", BEE_ETYPE},
      {"98 01 3c " G "03 11 00 cb 4040000000000000 a3 616263", BEE_ETYPE},
      {"98 01 3c " G "ff 11 00 cb 4040000000000000 c0", BEE_ERANGE},
      {"98 01 3c " G "03 11 00 cb 4040000000000000 c0 00", BEE_ETRAILING},
      {"98 01 3c " G "03 11 00 cb 4040000000000000", BEE_ETRUNCATED},
      {"97 01 3d " G "11 04 ce 00010000 c0", BEE_ERANGE},
      {"97 01 3d " G "11 04 05 c4 05 0102", BEE_ETRUNCATED},
      {"95 01 3e " G "00 a0", BEE_ERANGE},
      {"95 01 3e " G "01 a0", BEE_ERANGE},
      {"95 01 3e " G "d3 ffffffff7fffffff a0", BEE_ERANGE},
      {"95 01 3e " G "d2 80000000 a0", 0},
      /* WAIT: the group alone. */
      {"93 01 43 " G, 0},
      {"92 01 43", BEE_EMISSING},
      {"94 01 43 " G "00", BEE_ETYPE},
      {"93 01 43 c4 0f 5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a", BEE_ERANGE},
      /* The matchmaking's types between ABORT and WAIT, and past WAIT,
       * are unknown whatever their field count. */
      {"92 01 3f", BEE_EUNKNOWN},
      {"93 01 40 " G, BEE_EUNKNOWN},
      {"92 01 42", BEE_EUNKNOWN},
      {"93 01 44 " G, BEE_EUNKNOWN},
      {"c1", BEE_EMALFORMED},
  };
  uint8_t buf[256], again[256];
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    size_t n = test_unhex(cases[i].hex, buf), len;
    proto_avg_msg m;
    int rc = proto_avg_decode(buf, n, &m);
    if (rc != cases[i].rc)
      FAIL("case %zu: %s vs %s", i, bee_errname(rc), bee_errname(cases[i].rc));
    if (rc) {
      static const proto_avg_msg zero;
      ASSERT(memcmp(&m, &zero, sizeof m) == 0);
      continue;
    }
    ASSERT_OK(proto_avg_encode(&m, again, sizeof again, &len));
    ASSERT_UEQ(len, n);
    ASSERT_MEMEQ(again, buf, n);
  }
  /* The example of docs/PROTOCOL.md. */
  float x[4] = {1.5f, -2.0f, 0.25f, 3.0f};
  proto_avg_msg m = {.type = PROTO_T_AVG_PART,
                     .sender = 3,
                     .part = 17,
                     .codec = CODEC_NONE,
                     .weight = 32,
                     .has_data = true,
                     .data = {(const uint8_t *)x, sizeof x}};
  memset(m.group, 0x5a, sizeof m.group);
  size_t len, hlen;
  ASSERT_OK(proto_avg_encode(&m, buf, sizeof buf, &len));
  size_t n = test_unhex("98 01 3c " G "03 11 00 cb 4040000000000000 c4 10 "
                   "0000c03f 000000c0 0000803e 00004040",
                   again);
  ASSERT_UEQ(len, n);
  ASSERT_MEMEQ(buf, again, n);
  ASSERT_OK(proto_avg_header_encode(&m, again, sizeof again, &hlen));
  ASSERT_UEQ(hlen + sizeof x, len);
  ASSERT_MEMEQ(again, buf, hlen);
  /* The encoder refuses what the decoder refuses. */
  proto_avg_msg b = m;
  b.weight = -1;
  ASSERT_RC(proto_avg_encode(&b, buf, sizeof buf, &len), BEE_ERANGE);
  b = m, b.has_data = false;
  ASSERT_RC(proto_avg_encode(&b, buf, sizeof buf, &len), BEE_ERANGE);
  b = m, b.codec = 256;
  ASSERT_RC(proto_avg_encode(&b, buf, sizeof buf, &len), BEE_ERANGE);
  b = m, b.sender = 65535;
  ASSERT_RC(proto_avg_encode(&b, buf, sizeof buf, &len), BEE_ERANGE);
  b = m, b.data.n = PROTO_AVG_DATA_MAX + 1;
  ASSERT_RC(proto_avg_header_encode(&b, buf, sizeof buf, &len), BEE_ETOOBIG);
  b = m, b.type = PROTO_T_AVG_ABORT, b.code = 0;
  ASSERT_RC(proto_avg_encode(&b, buf, sizeof buf, &len), BEE_ERANGE);
  b = m, b.type = 63;
  ASSERT_RC(proto_avg_encode(&b, buf, sizeof buf, &len), BEE_EUNKNOWN);
  b = m, b.type = 66;
  ASSERT_RC(proto_avg_encode(&b, buf, sizeof buf, &len), BEE_EUNKNOWN);
  /* A WAIT carries the group only, and has no header of its own. */
  b = m, b.type = PROTO_T_AVG_WAIT;
  ASSERT_OK(proto_avg_encode(&b, buf, sizeof buf, &len));
  ASSERT_UEQ(len, test_unhex("93 01 43 " G, again));
  ASSERT_MEMEQ(buf, again, len);
  ASSERT_UEQ(proto_avg_encoded_max(&b), 3 + 2 + PROTO_AVG_GROUP_BYTES);
  ASSERT_RC(proto_avg_header_encode(&b, buf, sizeof buf, &len), BEE_ERANGE);
  ASSERT_RC(proto_avg_encode(&m, buf, 20, &len), BEE_ETOOBIG);
  /* Data over the limit, with its bytes there. */
  size_t big = PROTO_AVG_DATA_MAX + 1;
  uint8_t *huge = malloc(big + 64);
  ASSERT(huge != NULL);
  memset(huge, 0, big + 64);
  n = test_unhex("97 01 3d " G "11 04 05 c6", huge);
  huge[n++] = (uint8_t)(big >> 24), huge[n++] = (uint8_t)(big >> 16);
  huge[n++] = (uint8_t)(big >> 8), huge[n++] = (uint8_t)big;
  ASSERT_RC(proto_avg_decode(huge, n + big, &m), BEE_ETOOBIG);
  ASSERT_RC(proto_avg_decode(huge, n + big - 1, &m), BEE_ETRUNCATED);
  free(huge);
}

/* The API's edges: bad configs, bad messages, free at any point. */

int main(void) {
  test_msg();
  printf("avg msg: all checks passed\n");
  return 0;
}
