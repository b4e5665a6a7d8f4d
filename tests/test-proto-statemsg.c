/* test-proto-statemsg.c: the state download's payloads (proto/state-msg.c).
 *
 * Round trips of the four messages at their limits (a state's request and
 * chunk, an epoch step's request and piece), and every refusal the
 * decoder makes: a bad run name, len 0 or over a chunk, data past the
 * snapshot's end, a checksum of the wrong size, a float where a uint goes,
 * trailing bytes, a truncated message, another type.
 */
#include "proto.h"
#include "test.h"

#include <stdlib.h>
#include <string.h>

static uint8_t buf[PROTO_STATE_CHUNK_MAX + 256];

static void test_roundtrip(void) {
  proto_state_msg q = {.type = PROTO_T_STATE_REQ, .offset = 0,
                       .len = PROTO_STATE_CHUNK_MAX},
                  d;
  snprintf(q.run, sizeof q.run, "run-1.a_B");
  size_t len;
  ASSERT_OK(proto_state_encode(&q, buf, sizeof buf, &len));
  ASSERT_OK(proto_state_decode(buf, len, &d));
  ASSERT_EQ(d.type, PROTO_T_STATE_REQ);
  ASSERT_STREQ(d.run, "run-1.a_B");
  ASSERT_UEQ(d.offset, 0);
  ASSERT_UEQ(d.len, PROTO_STATE_CHUNK_MAX);

  static uint8_t data[PROTO_STATE_CHUNK_MAX];
  for (size_t i = 0; i < sizeof data; i++)
    data[i] = (uint8_t)(i * 31 + 7);
  proto_state_msg c = {.type = PROTO_T_STATE_CHUNK, .epoch = 1234567,
                       .total = 3 * (uint64_t)PROTO_STATE_CHUNK_MAX,
                       .offset = 2 * (uint64_t)PROTO_STATE_CHUNK_MAX,
                       .data = {data, sizeof data}};
  snprintf(c.run, sizeof c.run, "r");
  memset(c.checksum, 0x5a, sizeof c.checksum);
  ASSERT_OK(proto_state_encode(&c, buf, sizeof buf, &len));
  ASSERT_OK(proto_state_decode(buf, len, &d));
  ASSERT_EQ(d.type, PROTO_T_STATE_CHUNK);
  ASSERT_UEQ(d.epoch, 1234567);
  ASSERT_UEQ(d.total, c.total);
  ASSERT_UEQ(d.offset, c.offset);
  ASSERT_MEMEQ(d.checksum, c.checksum, sizeof c.checksum);
  ASSERT_UEQ(d.data.n, sizeof data);
  ASSERT_MEMEQ(d.data.p, data, sizeof data);
  /* The view points into the input. */
  ASSERT(d.data.p >= buf && d.data.p + d.data.n <= buf + len);
  /* An empty chunk at the very end. */
  c.offset = c.total, c.data.n = 0;
  ASSERT_OK(proto_state_encode(&c, buf, sizeof buf, &len));
  ASSERT_OK(proto_state_decode(buf, len, &d));
  ASSERT_UEQ(d.data.n, 0);
  /* Every shorter prefix is refused, the message left zero. */
  for (size_t n = 0; n < len; n++) {
    ASSERT(proto_state_decode(buf, n, &d) != 0);
    ASSERT_EQ(d.type, 0);
  }
  /* A byte more is trailing. */
  buf[len] = 0xc0;
  ASSERT_RC(proto_state_decode(buf, len + 1, &d), BEE_ETRAILING);

  /* An epoch's step: the request names the epoch, the answer is shaped
   * as a chunk; an empty step (total 0) is a step that changed nothing. */
  proto_state_msg sq = {.type = PROTO_T_STATE_STEP_REQ,
                        .epoch = UINT64_MAX,
                        .offset = PROTO_STATE_MAX - 1,
                        .len = 1};
  snprintf(sq.run, sizeof sq.run, "r");
  ASSERT_OK(proto_state_encode(&sq, buf, sizeof buf, &len));
  ASSERT_OK(proto_state_decode(buf, len, &d));
  ASSERT_EQ(d.type, PROTO_T_STATE_STEP_REQ);
  ASSERT_UEQ(d.epoch, UINT64_MAX);
  ASSERT_UEQ(d.offset, PROTO_STATE_MAX - 1);
  ASSERT_UEQ(d.len, 1);
  proto_state_msg st = {.type = PROTO_T_STATE_STEP,
                        .epoch = 41,
                        .total = 8,
                        .offset = 4,
                        .data = {data, 4}};
  snprintf(st.run, sizeof st.run, "r");
  memset(st.checksum, 0x11, sizeof st.checksum);
  ASSERT_OK(proto_state_encode(&st, buf, sizeof buf, &len));
  ASSERT_OK(proto_state_decode(buf, len, &d));
  ASSERT_EQ(d.type, PROTO_T_STATE_STEP);
  ASSERT_UEQ(d.epoch, 41);
  ASSERT_UEQ(d.total, 8);
  ASSERT_UEQ(d.offset, 4);
  ASSERT_MEMEQ(d.data.p, data, 4);
  st.total = 0, st.offset = 0, st.data.n = 0;
  ASSERT_OK(proto_state_encode(&st, buf, sizeof buf, &len));
  ASSERT_OK(proto_state_decode(buf, len, &d));
  ASSERT_UEQ(d.total, 0);
  for (size_t n = 0; n < len; n++)
    ASSERT(proto_state_decode(buf, n, &d) != 0);
}

static void test_refused(void) {
  size_t len;
  proto_state_msg q = {.type = PROTO_T_STATE_REQ, .len = 0};
  snprintf(q.run, sizeof q.run, "r");
  ASSERT_RC(proto_state_encode(&q, buf, sizeof buf, &len), BEE_ERANGE);
  q.len = PROTO_STATE_CHUNK_MAX + 1;
  ASSERT_RC(proto_state_encode(&q, buf, sizeof buf, &len), BEE_ERANGE);
  q.len = 1, q.offset = PROTO_STATE_MAX;
  ASSERT_RC(proto_state_encode(&q, buf, sizeof buf, &len), BEE_ERANGE);
  q.offset = 0;
  snprintf(q.run, sizeof q.run, "a b");
  ASSERT_RC(proto_state_encode(&q, buf, sizeof buf, &len), BEE_ERANGE);
  q.run[0] = '\0';
  ASSERT_RC(proto_state_encode(&q, buf, sizeof buf, &len), BEE_ERANGE);
  q.type = PROTO_T_AVG_PART;
  ASSERT_RC(proto_state_encode(&q, buf, sizeof buf, &len), BEE_EUNKNOWN);

  uint8_t d4[4] = {1, 2, 3, 4};
  proto_state_msg c = {.type = PROTO_T_STATE_CHUNK, .total = 10, .offset = 8,
                       .data = {d4, 4}};
  snprintf(c.run, sizeof c.run, "r");
  ASSERT_RC(proto_state_encode(&c, buf, sizeof buf, &len), BEE_ERANGE);
  c.offset = 11, c.data.n = 0;
  ASSERT_RC(proto_state_encode(&c, buf, sizeof buf, &len), BEE_ERANGE);
  c.total = PROTO_STATE_MAX + 1, c.offset = 0;
  ASSERT_RC(proto_state_encode(&c, buf, sizeof buf, &len), BEE_ERANGE);
  c.total = 10;
  ASSERT_RC(proto_state_encode(&c, buf, 8, &len), BEE_ETOOBIG);

  /* Hand-made: [1, 70, "r", 0, 0] (len 0), [1, 70, "r", 0.0, 1] (a
   * float), [1, 71, "r", 0, 1, bin 31, 0, bin 0] (short checksum),
   * [1, 74, ...] (another type), [1, 72, "r", 0, 1] (a step request
   * without its epoch). */
  proto_state_msg d;
  const uint8_t len0[] = {0x95, 1, 70, 0xa1, 'r', 0, 0};
  ASSERT_RC(proto_state_decode(len0, sizeof len0, &d), BEE_ERANGE);
  ASSERT_EQ(d.type, 0);
  const uint8_t flt[] = {0x95, 1, 70, 0xa1, 'r', 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  ASSERT_RC(proto_state_decode(flt, sizeof flt, &d), BEE_ETYPE);
  uint8_t shortsum[64] = {0x98, 1, 71, 0xa1, 'r', 0, 1, 0xc4, 31};
  size_t n = 9 + 31;
  shortsum[n++] = 0;
  shortsum[n++] = 0xc4;
  shortsum[n++] = 0;
  ASSERT_RC(proto_state_decode(shortsum, n, &d), BEE_ERANGE);
  const uint8_t other[] = {0x95, 1, 74, 0xa1, 'r', 0, 1};
  ASSERT_RC(proto_state_decode(other, sizeof other, &d), BEE_EUNKNOWN);
  const uint8_t noepoch[] = {0x95, 1, 72, 0xa1, 'r', 0, 1};
  ASSERT_RC(proto_state_decode(noepoch, sizeof noepoch, &d), BEE_EMISSING);
  proto_state_msg sq = {.type = PROTO_T_STATE_STEP_REQ, .epoch = 3, .len = 0};
  snprintf(sq.run, sizeof sq.run, "r");
  ASSERT_RC(proto_state_encode(&sq, buf, sizeof buf, &len), BEE_ERANGE);
  proto_state_msg st = {
      .type = PROTO_T_STATE_STEP, .total = 10, .offset = 8, .data = {d4, 4}};
  snprintf(st.run, sizeof st.run, "r");
  ASSERT_RC(proto_state_encode(&st, buf, sizeof buf, &len), BEE_ERANGE);
}

int main(void) {
  test_roundtrip();
  test_refused();
  return 0;
}
