/* avg-msg.c: the payloads of the averaging round.
 *
 * The butterfly all-reduce of averager/round.c speaks four messages, each
 * a msgpack array [1, type, fields...] (docs/PROTOCOL.md, section 10):
 *   PART   [1, 60, group, sender, part, codec, weight, data or nil]
 *   RESULT [1, 61, group, part, codec, contributors, data or nil]
 *   ABORT  [1, 62, group, code, text]
 *   WAIT   [1, 67, group]
 * (63 to 66 are the matchmaking's, group-msg.c.)
 * group is a bin of 16 bytes, weight a float64, data a bin.
 *
 * Strict in the way of dht-msg.c: exact field counts and msgpack types,
 * every range checked, the message must fill the buffer, views into the
 * input, no allocation.  The data bytes are an averager part; whether they
 * decode under the codec is the averager's check (avg_decode), made where
 * the part is used.  The encoder refuses whatever the decoder would
 * refuse, so what it writes always decodes to the same message.  Parts are
 * large (512 KiB by default): proto_avg_header_encode writes everything
 * but the data, so the averager encodes a part straight into the message
 * buffer behind it.
 */
#include "proto-int.h"

#include <float.h>
#include <string.h>

/* Fields after [version, type], by type - PROTO_T_AVG_PART; the
 * matchmaking's types between are not ours (is_avg). */
static const uint8_t nfields_of[] = {6, 5, 3, 0, 0, 0, 0, 1};

static bool is_avg(int type) {
  return (type >= PROTO_T_AVG_PART && type <= PROTO_T_AVG_ABORT) ||
         type == PROTO_T_AVG_WAIT;
}

static size_t min_size(size_t a, size_t b) { return a < b ? a : b; }

/* ---- range checks, shared by encoder and decoder ----------------------- */

static int weight_check(double w) {
  /* -0.0 passes: it is >= 0.  NaN fails every comparison. */
  return w >= 0 && w <= FLT_MAX ? 0 : BEE_ERANGE;
}

static int code_check(int64_t code) {
  return code < 0 && code >= INT32_MIN ? 0 : BEE_ERANGE;
}

/* Everything the decoder would refuse in m.  Only the sizes of data and
 * text are looked at, never their bytes. */
static int msg_check(const proto_avg_msg *m) {
  if (!is_avg(m->type))
    return BEE_EUNKNOWN;
  if (m->type == PROTO_T_AVG_WAIT)
    return 0;
  if (m->type == PROTO_T_AVG_ABORT) {
    if (m->text.n > PROTO_TEXT_MAX)
      return BEE_ETOOBIG;
    return code_check(m->code);
  }
  if (m->codec > PROTO_AVG_CODEC_MAX)
    return BEE_ERANGE;
  if (m->type == PROTO_T_AVG_PART) {
    if (m->sender >= PROTO_GROUP_MAX)
      return BEE_ERANGE;
    if (weight_check(m->weight))
      return BEE_ERANGE;
  } else if (m->contributors > PROTO_GROUP_MAX) {
    return BEE_ERANGE;
  }
  if (!m->has_data && m->data.n > 0)
    return BEE_ERANGE;
  if (m->data.n > PROTO_AVG_DATA_MAX)
    return BEE_ETOOBIG;
  return 0;
}

/* ---- encoding ---------------------------------------------------------- */

size_t proto_avg_encoded_max(const proto_avg_msg *m) {
  /* fixarray, version, type, group (bin8 header + 16) */
  size_t max = 3 + 2 + PROTO_AVG_GROUP_BYTES;
  if (m->type == PROTO_T_AVG_ABORT)
    return max + 9 + 5 + min_size(m->text.n, PROTO_TEXT_MAX);
  if (!is_avg(m->type) || m->type == PROTO_T_AVG_WAIT)
    return max;
  /* sender, part, codec, weight or contributors, data header, data */
  return max + 9 + 9 + 9 + 9 + 5 + min_size(m->data.n, PROTO_AVG_DATA_MAX);
}

/* Writes the fields of a PART or RESULT up to the data, which follows
 * as nil or a bin header for m->data.n bytes. */
static void head_wr(proto_wr *w, const proto_avg_msg *m) {
  proto__wr_head(w, m->type, nfields_of[m->type - PROTO_T_AVG_PART]);
  proto__wr_bin(w, m->group, PROTO_AVG_GROUP_BYTES);
  if (m->type == PROTO_T_AVG_PART)
    proto__wr_uint(w, m->sender);
  proto__wr_uint(w, m->part);
  proto__wr_uint(w, m->codec);
  if (m->type == PROTO_T_AVG_PART)
    proto__wr_f64(w, m->weight);
  else
    proto__wr_uint(w, m->contributors);
  if (m->has_data)
    proto__wr_bin_head(w, m->data.n);
  else
    proto__wr_nil(w);
}

int proto_avg_encode(const proto_avg_msg *m, uint8_t *buf, size_t cap,
                     size_t *len) {
  int rc = msg_check(m);
  if (rc)
    return rc;
  proto_wr w;
  proto__wr_init(&w, buf, cap);
  if (m->type == PROTO_T_AVG_WAIT) {
    proto__wr_head(&w, m->type, nfields_of[m->type - PROTO_T_AVG_PART]);
    proto__wr_bin(&w, m->group, PROTO_AVG_GROUP_BYTES);
  } else if (m->type == PROTO_T_AVG_ABORT) {
    static const uint8_t none[1];
    proto__wr_head(&w, m->type, nfields_of[m->type - PROTO_T_AVG_PART]);
    proto__wr_bin(&w, m->group, PROTO_AVG_GROUP_BYTES);
    proto__wr_int(&w, m->code);
    proto__wr_str(&w, m->text.n ? m->text.p : none, m->text.n);
  } else {
    head_wr(&w, m);
    if (m->has_data && m->data.n > 0 && w.err == 0) {
      if (m->data.n > w.cap - w.len)
        w.err = BEE_ETOOBIG;
      else
        memcpy(w.buf + w.len, m->data.p, m->data.n), w.len += m->data.n;
    }
  }
  if (w.err)
    return w.err;
  *len = w.len;
  return 0;
}

int proto_avg_header_encode(const proto_avg_msg *m, uint8_t *buf, size_t cap,
                            size_t *len) {
  int rc = msg_check(m);
  if (rc)
    return rc;
  if (m->type == PROTO_T_AVG_ABORT || m->type == PROTO_T_AVG_WAIT ||
      !m->has_data)
    return BEE_ERANGE;
  proto_wr w;
  proto__wr_init(&w, buf, cap);
  head_wr(&w, m);
  if (w.err)
    return w.err;
  *len = w.len;
  return 0;
}

/* ---- decoding ---------------------------------------------------------- */

/* A uint no larger than max (else BEE_ERANGE) into *v. */
static int rd_small(proto_rd *r, uint64_t max, uint32_t *v) {
  uint64_t u;
  int rc = proto__rd_uint(r, &u);
  if (rc)
    return rc;
  if (u > max)
    return BEE_ERANGE;
  *v = (uint32_t)u;
  return 0;
}

/* data: nil, or a bin of at most PROTO_AVG_DATA_MAX bytes. */
static int rd_data(proto_rd *r, proto_avg_msg *m) {
  int rc = proto__rd_nil(r);
  if (rc < 0)
    return rc;
  m->has_data = rc == 0;
  return m->has_data ? proto__rd_bin(r, &m->data, PROTO_AVG_DATA_MAX) : 0;
}

/* The fields after the group, of a message of type m->type. */
static int fields_get(proto_rd *r, proto_avg_msg *m) {
  int rc;
  if (m->type == PROTO_T_AVG_WAIT)
    return 0;
  if (m->type == PROTO_T_AVG_ABORT) {
    if ((rc = proto__rd_int(r, &m->code)) || (rc = code_check(m->code)))
      return rc;
    return proto__rd_str(r, &m->text, PROTO_TEXT_MAX);
  }
  if (m->type == PROTO_T_AVG_PART &&
      (rc = rd_small(r, PROTO_GROUP_MAX - 1, &m->sender)))
    return rc;
  if ((rc = proto__rd_uint(r, &m->part)) ||
      (rc = rd_small(r, PROTO_AVG_CODEC_MAX, &m->codec)))
    return rc;
  if (m->type == PROTO_T_AVG_PART) {
    if ((rc = proto__rd_f64(r, &m->weight)) || (rc = weight_check(m->weight)))
      return rc;
  } else if ((rc = rd_small(r, PROTO_GROUP_MAX, &m->contributors))) {
    return rc;
  }
  return rd_data(r, m);
}

/* Error codes as in docs/PROTOCOL.md, section 2: a type other than the
 * four round messages (60 to 62, 67) is BEE_EUNKNOWN; a group id that is
 * not a bin of 16 bytes, a sender >= 65535, a codec > 255, contributors >
 * 65535, a weight that is NaN, infinite, negative or beyond FLT_MAX, an
 * ABORT code that is not negative or is below INT32_MIN BEE_ERANGE; data
 * or text over its limit BEE_ETOOBIG; a float32 weight BEE_ETYPE. */
int proto_avg_decode(const uint8_t *buf, size_t len, proto_avg_msg *m) {
  proto_rd r;
  int type = 0, rc;
  memset(m, 0, sizeof *m);
  proto__rd_init(&r, buf, len);
  rc = proto__rd_family_head(&r, PROTO_T_AVG_PART, (int)sizeof nfields_of,
                             nfields_of, &type);
  /* The family's range holds the matchmaking's types (their field counts
   * 0 here): another family's type is unknown, whatever its fields. */
  if ((rc == 0 || rc == BEE_EMISSING || rc == BEE_ETYPE) && !is_avg(type))
    rc = BEE_EUNKNOWN;
  if (rc == 0) {
    m->type = type;
    if ((rc = proto__rd_fixbin(&r, m->group, PROTO_AVG_GROUP_BYTES)) == 0 &&
        (rc = fields_get(&r, m)) == 0)
      rc = proto__rd_end(&r);
  }
  if (rc)
    memset(m, 0, sizeof *m);
  return rc;
}
