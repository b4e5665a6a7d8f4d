/* dht-msg.c: the DHT payloads and the signatures of owned records.
 *
 * The RPC methods dht.ping, dht.store and dht.find carry six payloads,
 * each a msgpack array [1, type, fields...] (docs/PROTOCOL.md, section 8):
 *   PING   [1, 50, port, now]
 *   PONG   [1, 51, now, observed]
 *   STORE  [1, 52, port, now, [RECORD...]]
 *   STORED [1, 53, now, [result...]]
 *   FIND   [1, 54, port, now, key, want_value]
 *   FOUND  [1, 55, now, [RECORD...] or nil, [CONTACT...]]
 * with RECORD = [key, subkey or nil, value, expiration, sig or nil] and
 * CONTACT = [id, addr].  Every message has `now` right after the head,
 * preceded by `port` in the three requests.
 *
 * The decoder is strict in the way of codec.c: exact field counts, exact
 * msgpack types, limits checked against the header before any element is
 * read, and the message must fill the buffer.  It fills the fixed arrays
 * of proto_dht_msg with views into the input and never allocates.  It
 * checks the shape of records (an owned subkey has its exact length and a
 * signature) but never verifies signatures: that costs a public-key
 * operation per record, which the DHT pays only for records it keeps.
 * The encoder refuses whatever the decoder would refuse, with the same
 * checks, so everything it writes decodes to the same message.
 *
 * An owned record is signed with Ed25519 over "beed dht record v1"
 * followed by the canonical encoding of [key, subkey or nil, value,
 * expiration].  Verification rebuilds that encoding from the decoded
 * fields, so a non-canonical encoding on the wire cannot carry a valid
 * signature for values other than those we act on.
 */
#include "proto-int.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#define RECORD_DOMAIN "beed dht record v1"
/* Bytes one msgpack int or uint takes at most. */
#define INT_BYTES 9
/* Bytes a str, bin or array header takes at most. */
#define HDR_BYTES 5
/* Fields after [version, type], by type - PROTO_T_DHT_PING. */
static const uint8_t nfields_of[] = {2, 2, 3, 2, 4, 3};

static bool is_dht(int type) {
  return type >= PROTO_T_DHT_PING && type <= PROTO_T_DHT_FOUND;
}

/* The requests carry the sender's listen port before `now`. */
static bool has_port(int type) {
  return type == PROTO_T_DHT_PING || type == PROTO_T_DHT_STORE ||
         type == PROTO_T_DHT_FIND;
}

static size_t min_size(size_t a, size_t b) { return a < b ? a : b; }

/* ---- shape checks, shared by encoder and decoder ----------------------- */

/* An address: a str of at most PROTO_ADDR_MAX - 1 bytes without NUL (it
 * becomes a C string), empty only where allow_empty says so. */
static int addr_check(proto_bytes a, bool allow_empty) {
  assert(a.p || a.n == 0);
  if (a.n > PROTO_ADDR_MAX - 1)
    return BEE_ETOOBIG;
  if (a.n == 0)
    return allow_empty ? 0 : BEE_ERANGE;
  return memchr(a.p, 0, a.n) ? BEE_ERANGE : 0;
}

/* A record's sizes and the owned-subkey rules.  The signature itself is
 * not looked at; only that an owned subkey comes with one. */
static int record_check(const proto_dht_record *r) {
  assert(r->subkey.p || r->subkey.n == 0);
  assert(r->value.p || r->value.n == 0);
  if (r->subkey.n > PROTO_DHT_SUBKEY_MAX || r->value.n > PROTO_DHT_VALUE_MAX)
    return BEE_ETOOBIG;
  if (r->subkey.n > 0 && r->subkey.p[0] == PROTO_DHT_OWNER_TAG) {
    if (r->subkey.n != PROTO_DHT_OWNED_SUBKEY_BYTES)
      return BEE_ERANGE;
    if (!r->has_sig)
      return BEE_EMISSING;
  }
  return 0;
}

/* A record list of min..PROTO_DHT_RECORDS_MAX records, each well shaped. */
static int records_check(const proto_dht_msg *m, size_t min) {
  if (m->nrecords > PROTO_DHT_RECORDS_MAX)
    return BEE_ETOOBIG;
  if (m->nrecords < min)
    return BEE_ERANGE;
  for (size_t i = 0; i < m->nrecords; i++) {
    int rc = record_check(&m->records[i]);
    if (rc)
      return rc;
  }
  return 0;
}

/* Everything the decoder would refuse in m, before anything is written. */
static int msg_check(const proto_dht_msg *m) {
  int rc;
  if (!is_dht(m->type))
    return BEE_EUNKNOWN;
  if (has_port(m->type) && m->port > 65535)
    return BEE_ERANGE;
  switch (m->type) {
  case PROTO_T_DHT_PONG: return addr_check(m->observed, true);
  case PROTO_T_DHT_STORE: return records_check(m, 1);
  case PROTO_T_DHT_STORED:
    if (m->nresults > PROTO_DHT_RECORDS_MAX)
      return BEE_ETOOBIG;
    for (size_t i = 0; i < m->nresults; i++)
      if (m->results[i] > 0)
        return BEE_ERANGE;
    return 0;
  case PROTO_T_DHT_FOUND:
    /* "Not found" has one encoding, nil: no records may ride along. */
    if (!m->found && m->nrecords > 0)
      return BEE_ERANGE;
    if (m->found && (rc = records_check(m, 1)))
      return rc;
    if (m->nnodes > PROTO_DHT_NODES_MAX)
      return BEE_ETOOBIG;
    for (size_t i = 0; i < m->nnodes; i++)
      if ((rc = addr_check(m->nodes[i].addr, false)))
        return rc;
    return 0;
  default: return 0;
  }
}

/* ---- encoding ---------------------------------------------------------- */

/* Largest encoding of one record, each blob counted at most at its limit
 * (an oversized one makes encoding fail, so it adds no more). */
static size_t record_max(const proto_dht_record *r) {
  return 1 + 2 + PROTO_DHT_KEY_BYTES + HDR_BYTES +
         min_size(r->subkey.n, PROTO_DHT_SUBKEY_MAX) + HDR_BYTES +
         min_size(r->value.n, PROTO_DHT_VALUE_MAX) + INT_BYTES + 2 +
         PROTO_SIG_BYTES;
}

static size_t records_max(const proto_dht_msg *m) {
  size_t n = min_size(m->nrecords, PROTO_DHT_RECORDS_MAX), max = HDR_BYTES;
  for (size_t i = 0; i < n; i++)
    max += record_max(&m->records[i]);
  return max;
}

/* Counts only the fields m's type carries; a type that is not a DHT
 * payload gets the size of a bare head (encoding it fails anyway).  The
 * sum stays small however wrong m's counts are: every count and size is
 * capped at its limit first. */
size_t proto_dht_encoded_max(const proto_dht_msg *m) {
  size_t max = 3; /* fixarray header, version, type */
  if (!is_dht(m->type))
    return max;
  max += INT_BYTES; /* now */
  if (has_port(m->type))
    max += INT_BYTES;
  switch (m->type) {
  case PROTO_T_DHT_PONG:
    max += HDR_BYTES + min_size(m->observed.n, PROTO_ADDR_MAX - 1);
    break;
  case PROTO_T_DHT_STORE: max += records_max(m); break;
  case PROTO_T_DHT_STORED:
    max += HDR_BYTES + min_size(m->nresults, PROTO_DHT_RECORDS_MAX) * INT_BYTES;
    break;
  case PROTO_T_DHT_FIND: max += 2 + PROTO_DHT_KEY_BYTES + 1; break;
  case PROTO_T_DHT_FOUND:
    max += records_max(m) + HDR_BYTES;
    for (size_t i = 0; i < min_size(m->nnodes, PROTO_DHT_NODES_MAX); i++)
      max += 1 + 2 + PROTO_ID_BYTES + HDR_BYTES +
             min_size(m->nodes[i].addr.n, PROTO_ADDR_MAX - 1);
    break;
  default: break;
  }
  return max;
}

/* Writes a record; with_sig false gives the array of four that the
 * signature covers.  An empty subkey is nil, as is a missing signature. */
static void record_wr(proto_wr *w, const proto_dht_record *r, bool with_sig) {
  proto__wr_array(w, with_sig ? 5 : 4);
  proto__wr_bin(w, r->key, PROTO_DHT_KEY_BYTES);
  if (r->subkey.n > 0)
    proto__wr_bin(w, r->subkey.p, r->subkey.n);
  else
    proto__wr_nil(w);
  proto__wr_bin(w, r->value.p, r->value.n);
  proto__wr_uint(w, r->expiration);
  if (!with_sig)
    return;
  if (r->has_sig)
    proto__wr_bin(w, r->sig, PROTO_SIG_BYTES);
  else
    proto__wr_nil(w);
}

static void records_wr(proto_wr *w, const proto_dht_msg *m) {
  proto__wr_array(w, (uint32_t)m->nrecords);
  for (size_t i = 0; i < m->nrecords; i++)
    record_wr(w, &m->records[i], true);
}

/* Refuses, before writing anything, whatever proto_dht_decode would
 * refuse: a type other than the six DHT payloads (BEE_EUNKNOWN), a port
 * over 65535, a STORE without records, a FOUND whose `found` disagrees
 * with its record count, a positive STORED result, an empty contact
 * address, an address with a NUL byte or a malformed owned subkey
 * (BEE_ERANGE), an owned subkey without a signature (BEE_EMISSING), a
 * count, blob or address over its limit (BEE_ETOOBIG).  A buf smaller
 * than the encoding is BEE_ETOOBIG too; proto_dht_encoded_max(m) bytes
 * are always enough.  Fields m's type does not carry are ignored. */
int proto_dht_encode(const proto_dht_msg *m, uint8_t *buf, size_t cap,
                     size_t *len) {
  int rc = msg_check(m);
  if (rc)
    return rc;
  proto_wr w;
  proto__wr_init(&w, buf, cap);
  proto__wr_head(&w, m->type, nfields_of[m->type - PROTO_T_DHT_PING]);
  if (has_port(m->type))
    proto__wr_uint(&w, m->port);
  proto__wr_uint(&w, m->now);
  switch (m->type) {
  case PROTO_T_DHT_PONG: proto__wr_str(&w, m->observed.p, m->observed.n); break;
  case PROTO_T_DHT_STORE: records_wr(&w, m); break;
  case PROTO_T_DHT_STORED:
    proto__wr_array(&w, (uint32_t)m->nresults);
    for (size_t i = 0; i < m->nresults; i++)
      proto__wr_int(&w, m->results[i]);
    break;
  case PROTO_T_DHT_FIND:
    proto__wr_bin(&w, m->key, PROTO_DHT_KEY_BYTES);
    proto__wr_bool(&w, m->want_value);
    break;
  case PROTO_T_DHT_FOUND:
    if (m->found)
      records_wr(&w, m);
    else
      proto__wr_nil(&w);
    proto__wr_array(&w, (uint32_t)m->nnodes);
    for (size_t i = 0; i < m->nnodes; i++) {
      proto__wr_array(&w, 2);
      proto__wr_bin(&w, m->nodes[i].id, PROTO_ID_BYTES);
      proto__wr_str(&w, m->nodes[i].addr.p, m->nodes[i].addr.n);
    }
    break;
  default: break;
  }
  if (w.err)
    return w.err;
  *len = w.len;
  return 0;
}

/* ---- decoding ---------------------------------------------------------- */

/* Reads the header of a fixed-shape array (RECORD, CONTACT) of exactly n
 * elements: fewer is BEE_EMISSING, more BEE_ETYPE, as for messages. */
static int rd_tuple(proto_rd *r, uint32_t n) {
  uint32_t got;
  int rc = proto__rd_array(r, &got);
  if (rc)
    return rc;
  if (got != n)
    return got < n ? BEE_EMISSING : BEE_ETYPE;
  return 0;
}

/* Reads the header of a list of min..max elements into *n. */
static int rd_list(proto_rd *r, uint32_t min, uint32_t max, size_t *n) {
  uint32_t got;
  int rc = proto__rd_array(r, &got);
  if (rc)
    return rc;
  if (got > max)
    return BEE_ETOOBIG;
  if (got < min)
    return BEE_ERANGE;
  *n = got;
  return 0;
}

static int rd_addr(proto_rd *r, proto_bytes *out, bool allow_empty) {
  int rc = proto__rd_str(r, out, PROTO_ADDR_MAX - 1);
  return rc ? rc : addr_check(*out, allow_empty);
}

/* RECORD.  "No subkey" and "no signature" have one encoding each, nil:
 * an empty bin subkey is BEE_ERANGE. */
static int rd_record(proto_rd *r, proto_dht_record *rec) {
  int rc;
  *rec = (proto_dht_record){0};
  if ((rc = rd_tuple(r, 5)) ||
      (rc = proto__rd_fixbin(r, rec->key, PROTO_DHT_KEY_BYTES)))
    return rc;
  if ((rc = proto__rd_nil(r)) < 0)
    return rc;
  if (rc == 0) {
    if ((rc = proto__rd_bin(r, &rec->subkey, PROTO_DHT_SUBKEY_MAX)))
      return rc;
    if (rec->subkey.n == 0)
      return BEE_ERANGE;
  }
  if ((rc = proto__rd_bin(r, &rec->value, PROTO_DHT_VALUE_MAX)) ||
      (rc = proto__rd_uint(r, &rec->expiration)))
    return rc;
  if ((rc = proto__rd_nil(r)) < 0)
    return rc;
  rec->has_sig = rc == 0;
  if (rec->has_sig && (rc = proto__rd_fixbin(r, rec->sig, PROTO_SIG_BYTES)))
    return rc;
  return record_check(rec);
}

static int rd_records(proto_rd *r, proto_dht_msg *m) {
  int rc = rd_list(r, 1, PROTO_DHT_RECORDS_MAX, &m->nrecords);
  for (size_t i = 0; rc == 0 && i < m->nrecords; i++)
    rc = rd_record(r, &m->records[i]);
  return rc;
}

static int rd_results(proto_rd *r, proto_dht_msg *m) {
  int rc = rd_list(r, 0, PROTO_DHT_RECORDS_MAX, &m->nresults);
  for (size_t i = 0; rc == 0 && i < m->nresults; i++) {
    int64_t v;
    if ((rc = proto__rd_int(r, &v)))
      return rc;
    if (v > 0 || v < INT32_MIN)
      return BEE_ERANGE;
    m->results[i] = (int32_t)v;
  }
  return rc;
}

static int rd_nodes(proto_rd *r, proto_dht_msg *m) {
  int rc = rd_list(r, 0, PROTO_DHT_NODES_MAX, &m->nnodes);
  for (size_t i = 0; rc == 0 && i < m->nnodes; i++) {
    proto_dht_contact *c = &m->nodes[i];
    if ((rc = rd_tuple(r, 2)) ||
        (rc = proto__rd_fixbin(r, c->id, PROTO_ID_BYTES)))
      return rc;
    rc = rd_addr(r, &c->addr, false);
  }
  return rc;
}

/* Reads the fields after the head of a message of type m->type. */
static int fields_get(proto_rd *r, proto_dht_msg *m) {
  int rc;
  if (has_port(m->type)) {
    uint64_t port;
    if ((rc = proto__rd_uint(r, &port)))
      return rc;
    if (port > 65535)
      return BEE_ERANGE;
    m->port = (uint32_t)port;
  }
  if ((rc = proto__rd_uint(r, &m->now)))
    return rc;
  switch (m->type) {
  case PROTO_T_DHT_PONG: return rd_addr(r, &m->observed, true);
  case PROTO_T_DHT_STORE: return rd_records(r, m);
  case PROTO_T_DHT_STORED: return rd_results(r, m);
  case PROTO_T_DHT_FIND:
    if ((rc = proto__rd_fixbin(r, m->key, PROTO_DHT_KEY_BYTES)))
      return rc;
    return proto__rd_bool(r, &m->want_value);
  case PROTO_T_DHT_FOUND:
    if ((rc = proto__rd_nil(r)) < 0)
      return rc;
    m->found = rc == 0;
    if (m->found && (rc = rd_records(r, m)))
      return rc;
    return rd_nodes(r, m);
  default: return 0;
  }
}

/* Error codes as in docs/PROTOCOL.md, section 2: a type other than the
 * six DHT payloads is BEE_EUNKNOWN; a list over its limit BEE_ETOOBIG; an
 * empty STORE or FOUND record list, a port over 65535, a STORED result
 * that is positive or below INT32_MIN, a key, id or signature of the wrong
 * size, an empty subkey or contact address, an address with a NUL byte, or
 * a subkey starting with PROTO_DHT_OWNER_TAG that is not exactly
 * PROTO_DHT_OWNED_SUBKEY_BYTES long BEE_ERANGE; an owned subkey without a
 * signature BEE_EMISSING.  Signatures are not verified.  On failure *m
 * reads as empty: type 0 and every count 0. */
/* Clears what a decode sets besides the arrays: the arrays are valid up
 * to their counts, and the struct is too large to clear per message. */
static void msg_reset(proto_dht_msg *m) {
  m->type = 0;
  m->port = 0;
  m->now = 0;
  memset(m->key, 0, sizeof m->key);
  m->want_value = m->found = false;
  m->observed = (proto_bytes){NULL, 0};
  m->nrecords = m->nresults = m->nnodes = 0;
}

int proto_dht_decode(const uint8_t *buf, size_t len, proto_dht_msg *m) {
  proto_rd r;
  int type, rc;
  msg_reset(m);
  proto__rd_init(&r, buf, len);
  rc = proto__rd_family_head(&r, PROTO_T_DHT_PING, (int)sizeof nfields_of,
                             nfields_of, &type);
  if (rc == 0) {
    m->type = type;
    if ((rc = fields_get(&r, m)) == 0)
      rc = proto__rd_end(&r);
  }
  if (rc)
    msg_reset(m);
  return rc;
}

/* ---- owned records ----------------------------------------------------- */

/* *pk is set to NULL when subkey is not owned; pk itself may be NULL. */
bool proto_dht_subkey_owner(proto_bytes subkey, const uint8_t **pk) {
  bool owned = subkey.n == PROTO_DHT_OWNED_SUBKEY_BYTES &&
               subkey.p[0] == PROTO_DHT_OWNER_TAG;
  if (pk)
    *pk = owned ? subkey.p + 1 : NULL;
  return owned;
}

/* Builds the signed message of r (domain, then the canonical array of
 * four) in a heap buffer: the value alone may be 16 KiB, too much for a
 * small stack.  Aborts on out-of-memory, as the buffer is small and of a
 * size our own limits bound. */
static uint8_t *signed_msg(const proto_dht_record *r, size_t *len) {
  size_t dl = sizeof RECORD_DOMAIN - 1;
  size_t cap = dl + record_max(r);
  uint8_t *buf = malloc(cap);
  proto_wr w;
  if (!buf)
    abort();
  memcpy(buf, RECORD_DOMAIN, dl);
  proto__wr_init(&w, buf + dl, cap - dl);
  record_wr(&w, r, false);
  assert(w.err == 0);
  *len = dl + w.len;
  return buf;
}

/* r's subkey and value must be within their limits (our own record); the
 * subkey need not be owned, but only an owned one is ever verified. */
void proto_dht_record_sign(proto_dht_record *r, const proto_identity *id) {
  size_t len;
  assert(r->subkey.n <= PROTO_DHT_SUBKEY_MAX);
  assert(r->value.n <= PROTO_DHT_VALUE_MAX);
  uint8_t *msg = signed_msg(r, &len);
  crypto_sign_detached(r->sig, NULL, msg, len, id->sk);
  r->has_sig = true;
  free(msg);
}

/* A value over its limit was never signed by anyone's encoder
 * and is BEE_EAUTH, like any other forgery. */
int proto_dht_record_verify(const proto_dht_record *r) {
  const uint8_t *pk;
  size_t len;
  if (!proto_dht_subkey_owner(r->subkey, &pk))
    return BEE_ERANGE;
  if (!r->has_sig || r->value.n > PROTO_DHT_VALUE_MAX)
    return BEE_EAUTH;
  uint8_t *msg = signed_msg(r, &len);
  int rc =
      crypto_sign_verify_detached(r->sig, msg, len, pk) == 0 ? 0 : BEE_EAUTH;
  free(msg);
  return rc;
}
