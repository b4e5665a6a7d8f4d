/* group-msg.c: the payloads of matchmaking.
 *
 * Peers that declared themselves under one group key form a group by
 * asking a leader to take them (averager/match.c).  Four messages, each a
 * msgpack array [1, type, fields...] (docs/PROTOCOL.md, section 11):
 *   JOIN  [1, 63, nonce, expiration, run, round, bits, addr, schema_hash,
 *          mode, bandwidth, weight]
 *   REPLY [1, 64, nonce, code, leader or nil, leader_addr or nil]
 *   BEGIN [1, 65, group, round, [[id, addr, mode, bandwidth, weight]...]]
 *   LEAVE [1, 66, code, leader or nil, leader_addr or nil]
 *
 * Strict in the way of avg-msg.c: exact field counts and msgpack types,
 * every range checked, the message must fill the buffer.  The strings are
 * those of the matchmaking record (records.c) and pass the same checks.
 * The encoder refuses whatever the decoder would refuse.
 */
#include "proto-int.h"

#include <math.h>
#include <string.h>

/* Fields after [version, type], by type - PROTO_T_AVG_JOIN. */
static const uint8_t nfields_of[] = {10, 4, 3, 3};
enum { MEMBER_FIELDS = 5 };

static bool is_group(int type) {
  return type >= PROTO_T_AVG_JOIN && type <= PROTO_T_AVG_LEAVE;
}

/* ---- range checks, shared by encoder and decoder ----------------------- */

static bool mode_ok(int64_t mode) {
  return mode >= PROTO_MODE_NODE && mode <= PROTO_MODE_AUX;
}
static bool bandwidth_ok(double v) { return isfinite(v) && v > 0; }
static bool weight_ok(double v) { return isfinite(v) && v >= 0; }

/* Whether code may carry a leader, and must: REPLY NOT_A_LEADER and LEAVE
 * MOVED, which name where to go instead. */
static bool wants_leader(int type, uint32_t code) {
  return type == PROTO_T_AVG_REPLY ? code == PROTO_JOIN_NOT_A_LEADER
                                   : code == PROTO_LEAVE_MOVED;
}

static int code_check(int type, uint32_t code) {
  if (type == PROTO_T_AVG_REPLY)
    return code <= PROTO_JOIN_CODE_MAX ? 0 : BEE_ERANGE;
  return code >= PROTO_LEAVE_DISBANDED && code <= PROTO_LEAVE_CODE_MAX
             ? 0
             : BEE_ERANGE;
}

static int member_check(const proto_group_member *g, size_t *addr_n) {
  int rc = proto__str_check(g->addr, sizeof g->addr, proto__addr_ok, addr_n);
  if (rc)
    return rc;
  if (!mode_ok(g->mode) || !bandwidth_ok(g->bandwidth_mbit) ||
      !weight_ok(g->weight))
    return BEE_ERANGE;
  return 0;
}

static bool ids_unique(const proto_group_member *v, size_t n) {
  for (size_t i = 1; i < n; i++)
    for (size_t j = 0; j < i; j++)
      if (memcmp(v[i].id, v[j].id, PROTO_ID_BYTES) == 0)
        return false;
  return true;
}

/* Everything the decoder would refuse in m. */
static int msg_check(const proto_group_msg *m) {
  size_t n;
  int rc;
  if (!is_group(m->type))
    return BEE_EUNKNOWN;
  switch (m->type) {
  case PROTO_T_AVG_JOIN: {
    const proto_match *i = &m->info;
    if ((rc = proto__str_check(i->run, sizeof i->run, proto__run_ok, &n)) ||
        (rc = proto__str_check(i->bits, sizeof i->bits, proto__bits_ok, &n)) ||
        (rc = proto__str_check(i->addr, sizeof i->addr, proto__addr_ok, &n)))
      return rc;
    if (!mode_ok(i->mode) || !bandwidth_ok(i->bandwidth_mbit) ||
        !weight_ok(i->weight))
      return BEE_ERANGE;
    return 0;
  }
  case PROTO_T_AVG_BEGIN:
    if (m->nmembers == 0 || !m->members)
      return BEE_ERANGE;
    if (m->nmembers > PROTO_GROUP_MEMBERS_MAX)
      return BEE_ETOOBIG;
    for (size_t k = 0; k < m->nmembers; k++)
      if ((rc = member_check(&m->members[k], &n)))
        return rc;
    return ids_unique(m->members, m->nmembers) ? 0 : BEE_ERANGE;
  default: /* REPLY, LEAVE */
    if ((rc = code_check(m->type, m->code)))
      return rc;
    if (m->has_leader != wants_leader(m->type, m->code))
      return BEE_ERANGE;
    if (m->has_leader)
      return proto__str_check(m->leader_addr, sizeof m->leader_addr,
                              proto__addr_ok, &n);
    return 0;
  }
}

/* ---- encoding ---------------------------------------------------------- */

/* A str header is at most 5 bytes, a uint or float64 9, a bin8 header 2. */
size_t proto_group_encoded_max(const proto_group_msg *m) {
  size_t max = 3 + 2; /* array header, version, type */
  switch (m->type) {
  case PROTO_T_AVG_JOIN:
    return max + 9 + 9 + (5 + PROTO_RUN_MAX) + 9 + (5 + PROTO_BITS_MAX) +
           (5 + PROTO_ADDR_MAX) + (2 + PROTO_SCHEMA_HASH_BYTES) + 9 + 9 + 9;
  case PROTO_T_AVG_BEGIN: {
    size_t n = m->nmembers < PROTO_GROUP_MEMBERS_MAX ? m->nmembers
                                                     : PROTO_GROUP_MEMBERS_MAX;
    size_t member = 1 + (2 + PROTO_ID_BYTES) + (5 + PROTO_ADDR_MAX) + 9 + 9 + 9;
    return max + (2 + PROTO_AVG_GROUP_BYTES) + 9 + 3 + n * member;
  }
  case PROTO_T_AVG_REPLY:
  case PROTO_T_AVG_LEAVE:
    return max + 9 + 9 + (2 + PROTO_ID_BYTES) + (5 + PROTO_ADDR_MAX);
  default: return max;
  }
}

static void wr_cstr(proto_wr *w, const char *s) {
  proto__wr_str(w, s, strlen(s));
}

static void wr_leader(proto_wr *w, const proto_group_msg *m) {
  if (m->has_leader) {
    proto__wr_bin(w, m->leader, PROTO_ID_BYTES);
    wr_cstr(w, m->leader_addr);
  } else {
    proto__wr_nil(w);
    proto__wr_nil(w);
  }
}

int proto_group_encode(const proto_group_msg *m, uint8_t *buf, size_t cap,
                       size_t *len) {
  int rc = msg_check(m);
  if (rc)
    return rc;
  proto_wr w;
  proto__wr_init(&w, buf, cap);
  proto__wr_head(&w, m->type, nfields_of[m->type - PROTO_T_AVG_JOIN]);
  switch (m->type) {
  case PROTO_T_AVG_JOIN:
    proto__wr_uint(&w, m->nonce);
    proto__wr_uint(&w, m->expiration);
    wr_cstr(&w, m->info.run);
    proto__wr_uint(&w, m->info.round);
    wr_cstr(&w, m->info.bits);
    wr_cstr(&w, m->info.addr);
    proto__wr_bin(&w, m->info.schema_hash, PROTO_SCHEMA_HASH_BYTES);
    proto__wr_uint(&w, (uint64_t)m->info.mode);
    proto__wr_f64(&w, m->info.bandwidth_mbit);
    proto__wr_f64(&w, m->info.weight);
    break;
  case PROTO_T_AVG_REPLY:
    proto__wr_uint(&w, m->nonce);
    proto__wr_uint(&w, m->code);
    wr_leader(&w, m);
    break;
  case PROTO_T_AVG_BEGIN:
    proto__wr_bin(&w, m->group, PROTO_AVG_GROUP_BYTES);
    proto__wr_uint(&w, m->round);
    proto__wr_array(&w, (uint32_t)m->nmembers);
    for (size_t k = 0; k < m->nmembers; k++) {
      const proto_group_member *g = &m->members[k];
      proto__wr_array(&w, MEMBER_FIELDS);
      proto__wr_bin(&w, g->id, PROTO_ID_BYTES);
      wr_cstr(&w, g->addr);
      proto__wr_uint(&w, (uint64_t)g->mode);
      proto__wr_f64(&w, g->bandwidth_mbit);
      proto__wr_f64(&w, g->weight);
    }
    break;
  default: /* LEAVE */
    proto__wr_uint(&w, m->code);
    wr_leader(&w, m);
    break;
  }
  if (w.err)
    return w.err;
  *len = w.len;
  return 0;
}

/* ---- decoding ---------------------------------------------------------- */

static int rd_float(proto_rd *r, bool (*ok)(double), double *v) {
  int rc = proto__rd_f64(r, v);
  if (rc)
    return rc;
  return ok(*v) ? 0 : BEE_ERANGE;
}

static int rd_code(proto_rd *r, proto_group_msg *m) {
  uint64_t v;
  int rc = proto__rd_uint(r, &v);
  if (rc)
    return rc;
  if (v > UINT32_MAX || code_check(m->type, (uint32_t)v))
    return BEE_ERANGE;
  m->code = (uint32_t)v;
  return 0;
}

/* leader and leader_addr: both nil, or a 20-byte id and an address, as
 * the code wants. */
static int rd_leader(proto_rd *r, proto_group_msg *m) {
  int rc = proto__rd_nil(r);
  if (rc < 0)
    return rc;
  m->has_leader = rc == 0; /* 1: it was nil */
  if (m->has_leader != wants_leader(m->type, m->code))
    return BEE_ERANGE;
  if (!m->has_leader) {
    if ((rc = proto__rd_nil(r)) < 0)
      return rc;
    return rc == 1 ? 0 : BEE_ERANGE;
  }
  if ((rc = proto__rd_fixbin(r, m->leader, PROTO_ID_BYTES)))
    return rc;
  /* A nil address after a leader is a missing half, as a nil leader for
   * a code that wants one: BEE_ERANGE, not BEE_ETYPE. */
  if ((rc = proto__rd_nil(r)) != 0)
    return rc < 0 ? rc : BEE_ERANGE;
  return proto__rd_cstr(r, m->leader_addr, PROTO_ADDR_MAX - 1, proto__addr_ok);
}

static int rd_join(proto_rd *r, proto_group_msg *m) {
  proto_match *i = &m->info;
  int rc;
  if ((rc = proto__rd_uint(r, &m->nonce)) ||
      (rc = proto__rd_uint(r, &m->expiration)) ||
      (rc = proto__rd_cstr(r, i->run, sizeof i->run - 1, proto__run_ok)) ||
      (rc = proto__rd_uint(r, &i->round)) ||
      (rc = proto__rd_cstr(r, i->bits, sizeof i->bits - 1, proto__bits_ok)) ||
      (rc = proto__rd_cstr(r, i->addr, sizeof i->addr - 1, proto__addr_ok)) ||
      (rc = proto__rd_fixbin(r, i->schema_hash, PROTO_SCHEMA_HASH_BYTES)) ||
      (rc = proto__rd_mode(r, &i->mode)) ||
      (rc = rd_float(r, bandwidth_ok, &i->bandwidth_mbit)))
    return rc;
  return rd_float(r, weight_ok, &i->weight);
}

static int rd_member(proto_rd *r, proto_group_member *g) {
  uint32_t n;
  int rc = proto__rd_array(r, &n);
  if (rc)
    return rc;
  if (n != MEMBER_FIELDS)
    return n < MEMBER_FIELDS ? BEE_EMISSING : BEE_ETYPE;
  if ((rc = proto__rd_fixbin(r, g->id, PROTO_ID_BYTES)) ||
      (rc = proto__rd_cstr(r, g->addr, sizeof g->addr - 1, proto__addr_ok)) ||
      (rc = proto__rd_mode(r, &g->mode)) ||
      (rc = rd_float(r, bandwidth_ok, &g->bandwidth_mbit)))
    return rc;
  return rd_float(r, weight_ok, &g->weight);
}

static int rd_begin(proto_rd *r, proto_group_msg *m, proto_group_member *v,
                    size_t cap) {
  uint32_t n;
  int rc;
  if ((rc = proto__rd_fixbin(r, m->group, PROTO_AVG_GROUP_BYTES)) ||
      (rc = proto__rd_uint(r, &m->round)) || (rc = proto__rd_array(r, &n)))
    return rc;
  if (n == 0)
    return BEE_ERANGE;
  if (n > PROTO_GROUP_MEMBERS_MAX || n > cap)
    return BEE_ETOOBIG;
  /* Each member takes at least 2 + 20 + 2 + 1 + 9 + 9 bytes: a count the
   * rest of the buffer cannot hold is refused before any is read. */
  if ((size_t)n * 43 > proto__rd_left(r))
    return BEE_ETRUNCATED;
  for (uint32_t k = 0; k < n; k++)
    if ((rc = rd_member(r, &v[k])))
      return rc;
  if (!ids_unique(v, n))
    return BEE_ERANGE;
  m->members = v;
  m->nmembers = n;
  return 0;
}

/* Error codes as in docs/PROTOCOL.md, sections 2 and 11. */
int proto_group_decode(const uint8_t *buf, size_t len, proto_group_msg *m,
                       proto_group_member *members, size_t cap) {
  proto_rd r;
  int type, rc;
  memset(m, 0, sizeof *m);
  proto__rd_init(&r, buf, len);
  rc = proto__rd_family_head(&r, PROTO_T_AVG_JOIN, (int)sizeof nfields_of,
                             nfields_of, &type);
  if (rc == 0) {
    m->type = type;
    switch (type) {
    case PROTO_T_AVG_JOIN: rc = rd_join(&r, m); break;
    case PROTO_T_AVG_BEGIN: rc = rd_begin(&r, m, members, cap); break;
    case PROTO_T_AVG_REPLY:
      if ((rc = proto__rd_uint(&r, &m->nonce)) == 0 &&
          (rc = rd_code(&r, m)) == 0)
        rc = rd_leader(&r, m);
      break;
    default: /* LEAVE */
      if ((rc = rd_code(&r, m)) == 0)
        rc = rd_leader(&r, m);
      break;
    }
    if (rc == 0)
      rc = proto__rd_end(&r);
  }
  if (rc)
    memset(m, 0, sizeof *m);
  return rc;
}
