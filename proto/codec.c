/* codec.c: the envelope and handshake message codecs.
 *
 * Every message is a msgpack array [version, type, fields...].  The eleven
 * envelope types share one table-driven codec: each type is a short list
 * of field kinds, and each kind knows its msgpack type, its limit and the
 * proto_msg member it maps onto.  The handshake messages (HELLO, AUTH and
 * its sealed inner part, RESULT) have their own small codecs.
 *
 * Decoders are strict: the field count must match the type exactly, every
 * field must have its own msgpack type and fit its limit, and the message
 * must fill the buffer.  They read through the bounded cursor of wire.c,
 * return views into the input, never allocate and never recurse (all
 * fields are scalars, str or bin, so a nested container is BEE_ETYPE
 * without being walked).  Encoders check the same limits, so whatever they
 * produce decodes again.
 */
#include "proto-int.h"

#include <assert.h>
#include <string.h>

/* Largest REQUEST/RESPONSE/ONEWAY payload and STREAM_OPEN meta: leaves
 * room for the envelope around it in one frame. */
#define PAYLOAD_MAX (PROTO_FRAME_MAX - 1024)
/* Largest sealed box in an AUTH message (identity, token, signature and
 * the AEAD tag, with room to spare). */
#define AUTH_SEALED_MAX 1536
/* Bytes one msgpack int or uint takes at most. */
#define INT_BYTES 9
/* Bytes a str or bin header takes at most. */
#define BLOB_HDR_BYTES 5

/* ---- envelope ----------------------------------------------------------- */

/* Kinds of envelope field. */
enum field {
  F_END = 0,
  F_ID,      /* uint -> id */
  F_OFFSET,  /* uint -> offset */
  F_CODE,    /* int -> code */
  F_NAME,    /* str of 1..PROTO_METHOD_MAX bytes -> name */
  F_TEXT,    /* str of up to PROTO_TEXT_MAX bytes -> payload */
  F_PAYLOAD, /* bin of up to PAYLOAD_MAX bytes -> payload */
  F_DATA,    /* bin of up to PROTO_CHUNK_MAX bytes -> payload */
};

#define FIELDS_MAX 4

/* The fields after [version, type], by type (see enum proto_type). */
static const uint8_t layouts[PROTO_T_CLOSE + 1][FIELDS_MAX] = {
    [PROTO_T_REQUEST] = {F_ID, F_NAME, F_PAYLOAD},
    [PROTO_T_RESPONSE] = {F_ID, F_PAYLOAD},
    [PROTO_T_ERROR] = {F_ID, F_CODE, F_TEXT},
    [PROTO_T_CANCEL] = {F_ID},
    [PROTO_T_ONEWAY] = {F_NAME, F_PAYLOAD},
    [PROTO_T_STREAM_OPEN] = {F_ID, F_NAME, F_OFFSET, F_PAYLOAD},
    [PROTO_T_STREAM_CHUNK] = {F_ID, F_OFFSET, F_DATA},
    [PROTO_T_STREAM_END] = {F_ID, F_CODE},
    [PROTO_T_PING] = {F_ID},
    [PROTO_T_PONG] = {F_ID},
    [PROTO_T_CLOSE] = {F_CODE, F_TEXT},
};

/* The field list of an envelope type and its length; NULL for a type that
 * is not an envelope (handshake and token types included). */
static const uint8_t *layout(int type, uint32_t *nfields) {
  if (type < PROTO_T_REQUEST || type > PROTO_T_CLOSE)
    return NULL;
  const uint8_t *l = layouts[type];
  uint32_t n = 0;
  while (n < FIELDS_MAX && l[n] != F_END)
    n++;
  *nfields = n;
  return l;
}

static bool is_blob(int f) { return f >= F_NAME; }

/* Byte limit of a str or bin field. */
static size_t blob_max(int f) {
  switch (f) {
  case F_NAME: return PROTO_METHOD_MAX;
  case F_TEXT: return PROTO_TEXT_MAX;
  case F_PAYLOAD: return PAYLOAD_MAX;
  default: return PROTO_CHUNK_MAX;
  }
}

/* The member a str or bin field maps onto. */
static const proto_bytes *blob_of(const proto_msg *m, int f) {
  return f == F_NAME ? &m->name : &m->payload;
}

/* Counts only the fields m's type carries, each at most at its limit; a
 * type that is not an envelope gets the size of a bare head. */
size_t proto_msg_encoded_max(const proto_msg *m) {
  uint32_t n;
  const uint8_t *l = layout(m->type, &n);
  size_t max = 3; /* fixarray header, version, type */
  if (!l)
    return max;
  for (uint32_t i = 0; i < n; i++) {
    if (!is_blob(l[i])) {
      max += INT_BYTES;
      continue;
    }
    /* An oversized field makes encoding fail, so it adds no more. */
    size_t len = blob_of(m, l[i])->n;
    size_t cap = blob_max(l[i]);
    max += BLOB_HDR_BYTES + (len < cap ? len : cap);
  }
  return max;
}

/* Checks one field of m against its limits before anything is written. */
static int field_check(const proto_msg *m, int f) {
  if (!is_blob(f))
    return 0;
  const proto_bytes *b = blob_of(m, f);
  assert(b->p || b->n == 0);
  if (b->n > blob_max(f))
    return BEE_ETOOBIG;
  if (f == F_NAME && b->n == 0)
    return BEE_ERANGE;
  return 0;
}

static void field_put(proto_wr *w, const proto_msg *m, int f) {
  const proto_bytes *b = blob_of(m, f);
  switch (f) {
  case F_ID: proto__wr_uint(w, m->id); break;
  case F_OFFSET: proto__wr_uint(w, m->offset); break;
  case F_CODE: proto__wr_int(w, m->code); break;
  case F_NAME:
  case F_TEXT: proto__wr_str(w, b->p, b->n); break;
  default: proto__wr_bin(w, b->p, b->n); break;
  }
}

/* Ends an encoding: the writer's error, or 0 and the length. */
static int wr_done(const proto_wr *w, size_t *len) {
  if (w->err)
    return w->err;
  *len = w->len;
  return 0;
}

/* The whole message, or with head_only everything up to and including
 * the bin header of its last field, which must be a payload. */
static int encode(const proto_msg *m, uint8_t *buf, size_t cap, size_t *len,
                  bool head_only) {
  uint32_t n;
  const uint8_t *l = layout(m->type, &n);
  if (!l)
    return BEE_EUNKNOWN;
  if (head_only && (n == 0 || (l[n - 1] != F_PAYLOAD && l[n - 1] != F_DATA)))
    return BEE_ERANGE;
  for (uint32_t i = 0; i < n; i++) {
    int rc = field_check(m, l[i]);
    if (rc)
      return rc;
  }
  proto_wr w;
  proto__wr_init(&w, buf, cap);
  proto__wr_head(&w, m->type, n);
  for (uint32_t i = 0; i < n; i++) {
    if (head_only && i + 1 == n)
      proto__wr_bin_head(&w, blob_of(m, l[i])->n);
    else
      field_put(&w, m, l[i]);
  }
  return wr_done(&w, len);
}

/* Beyond proto.h: a type that is not an envelope is BEE_EUNKNOWN and an
 * empty method or kind name BEE_ERANGE, checked before anything is
 * written.  Fields the type does not carry are ignored. */
int proto_msg_encode(const proto_msg *m, uint8_t *buf, size_t cap,
                     size_t *len) {
  return encode(m, buf, cap, len, false);
}

int proto__msg_head_encode(const proto_msg *m, uint8_t *buf, size_t cap,
                           size_t *len) {
  return encode(m, buf, cap, len, true);
}

/* data_len over PROTO_CHUNK_MAX, or a small buf, is BEE_ETOOBIG. */
int proto_chunk_header_encode(uint64_t stream_id, uint64_t offset,
                              size_t data_len, uint8_t *buf, size_t cap,
                              size_t *len) {
  if (data_len > PROTO_CHUNK_MAX)
    return BEE_ETOOBIG;
  /* The same writer calls as field_put for [id, offset, data], minus the
   * data bytes themselves. */
  proto_wr w;
  proto__wr_init(&w, buf, cap);
  proto__wr_head(&w, PROTO_T_STREAM_CHUNK, 3);
  proto__wr_uint(&w, stream_id);
  proto__wr_uint(&w, offset);
  proto__wr_bin_head(&w, data_len);
  return wr_done(&w, len);
}

/* Reads [version, type, ...] up to the fields, whatever their number,
 * which goes to *nfields.  Peeking at the array count first lets
 * proto__rd_head check version and type before the count is known. */
static int rd_msg_head(proto_rd *r, uint32_t *nfields, int *type) {
  proto_rd peek = *r;
  uint32_t n;
  int rc = proto__rd_array(&peek, &n);
  if (rc)
    return rc;
  *nfields = n < 2 ? 0 : n - 2;
  return proto__rd_head(r, -1, *nfields, type);
}

static int field_get(proto_rd *r, proto_msg *m, int f) {
  int rc;
  switch (f) {
  case F_ID: return proto__rd_uint(r, &m->id);
  case F_OFFSET: return proto__rd_uint(r, &m->offset);
  case F_CODE: return proto__rd_int(r, &m->code);
  case F_NAME:
    rc = proto__rd_str(r, &m->name, PROTO_METHOD_MAX);
    return rc == 0 && m->name.n == 0 ? BEE_ERANGE : rc;
  case F_TEXT: return proto__rd_str(r, &m->payload, PROTO_TEXT_MAX);
  default: return proto__rd_bin(r, &m->payload, blob_max(f));
  }
}

/* Error codes as listed in proto.h's enum; handshake and token types are
 * BEE_EUNKNOWN here.  On failure *m is all zero. */
int proto_msg_decode(const uint8_t *buf, size_t len, proto_msg *m) {
  proto_rd r;
  uint32_t got, want;
  int type;
  memset(m, 0, sizeof *m);
  proto__rd_init(&r, buf, len);
  int rc = rd_msg_head(&r, &got, &type);
  if (rc)
    goto out;
  const uint8_t *l = layout(type, &want);
  if (!l) {
    rc = BEE_EUNKNOWN;
    goto out;
  }
  if (got != want) {
    rc = got < want ? BEE_EMISSING : BEE_ETYPE;
    goto out;
  }
  m->type = type;
  for (uint32_t i = 0; i < want && rc == 0; i++)
    rc = field_get(&r, m, l[i]);
  if (rc == 0)
    rc = proto__rd_end(&r);
out:
  if (rc)
    memset(m, 0, sizeof *m);
  return rc;
}

/* ---- handshake ---------------------------------------------------------- */

static bool purpose_ok(uint64_t v) {
  return v == PROTO_PURPOSE_CONTROL || v == PROTO_PURPOSE_BULK;
}

static bool ciphers_ok(uint64_t v) {
  return v != 0 && (v & ~(uint64_t)PROTO_CIPHERS_ALL) == 0;
}

static bool cipher_ok(uint64_t v) {
  return v == PROTO_CIPHER_AES256GCM || v == PROTO_CIPHER_XCHACHA20POLY1305;
}

/* HELLO = [1, 20, swarm, purpose, ciphers, moderated, eph_pk].  A swarm
 * name over PROTO_SWARM_MAX is BEE_ETOOBIG; an empty one, a purpose other
 * than PROTO_PURPOSE_*, or a cipher set that is empty or has unknown bits
 * is BEE_ERANGE.  The decoder checks the same, and a key of any size but
 * 32 bytes is BEE_ERANGE; on failure *m is all zero. */
int proto__hello_encode(const proto_hello *m, uint8_t *buf, size_t cap,
                        size_t *len) {
  assert(m->swarm.p || m->swarm.n == 0);
  if (m->swarm.n > PROTO_SWARM_MAX)
    return BEE_ETOOBIG;
  if (m->swarm.n == 0 || m->purpose < 0 || !purpose_ok((uint64_t)m->purpose) ||
      m->ciphers < 0 || !ciphers_ok((uint64_t)m->ciphers))
    return BEE_ERANGE;
  proto_wr w;
  proto__wr_init(&w, buf, cap);
  proto__wr_head(&w, PROTO_T_HELLO, 5);
  proto__wr_str(&w, m->swarm.p, m->swarm.n);
  proto__wr_uint(&w, (uint64_t)m->purpose);
  proto__wr_uint(&w, (uint64_t)m->ciphers);
  proto__wr_bool(&w, m->moderated);
  proto__wr_bin(&w, m->eph_pk, sizeof m->eph_pk);
  return wr_done(&w, len);
}

/* Reads HELLO's fields after the head into m. */
/* Decodes a handshake message [1, type, nfields fields] whose fields
 * fields() reads into m (msize bytes); m is all zero on failure. */
static int decode(const uint8_t *buf, size_t len, int type, uint32_t nfields,
                  int (*fields)(proto_rd *r, void *m), void *m, size_t msize) {
  proto_rd r;
  int t;
  memset(m, 0, msize);
  proto__rd_init(&r, buf, len);
  int rc = proto__rd_head(&r, type, nfields, &t);
  if (rc == 0)
    rc = fields(&r, m);
  if (rc == 0)
    rc = proto__rd_end(&r);
  if (rc)
    memset(m, 0, msize);
  return rc;
}

static int hello_fields(proto_rd *r, void *out) {
  proto_hello *m = out;
  uint64_t purpose, ciphers;
  int rc;
  if ((rc = proto__rd_str(r, &m->swarm, PROTO_SWARM_MAX)))
    return rc;
  if (m->swarm.n == 0)
    return BEE_ERANGE;
  if ((rc = proto__rd_uint(r, &purpose)))
    return rc;
  if (!purpose_ok(purpose))
    return BEE_ERANGE;
  if ((rc = proto__rd_uint(r, &ciphers)))
    return rc;
  if (!ciphers_ok(ciphers))
    return BEE_ERANGE;
  m->purpose = (int)purpose;
  m->ciphers = (int)ciphers;
  if ((rc = proto__rd_bool(r, &m->moderated)))
    return rc;
  return proto__rd_fixbin(r, m->eph_pk, sizeof m->eph_pk);
}

int proto__hello_decode(const uint8_t *buf, size_t len, proto_hello *m) {
  return decode(buf, len, PROTO_T_HELLO, 5, hello_fields, m, sizeof *m);
}

/* AUTH = [1, 21, cipher, eph_pk or nil, sealed].  With has_eph the cipher
 * must be exactly one PROTO_CIPHER_*, without it 0 (else BEE_ERANGE); a
 * sealed box over AUTH_SEALED_MAX is BEE_ETOOBIG.  The decoder sets
 * has_eph from whether eph_pk is nil; on failure *m is all zero. */
int proto__auth_encode(const proto_auth_msg *m, uint8_t *buf, size_t cap,
                       size_t *len) {
  assert(m->sealed.p || m->sealed.n == 0);
  if (m->sealed.n > AUTH_SEALED_MAX)
    return BEE_ETOOBIG;
  if (m->has_eph ? m->cipher < 0 || !cipher_ok((uint64_t)m->cipher)
                 : m->cipher != 0)
    return BEE_ERANGE;
  proto_wr w;
  proto__wr_init(&w, buf, cap);
  proto__wr_head(&w, PROTO_T_AUTH, 3);
  proto__wr_uint(&w, (uint64_t)m->cipher);
  if (m->has_eph)
    proto__wr_bin(&w, m->eph_pk, sizeof m->eph_pk);
  else
    proto__wr_nil(&w);
  proto__wr_bin(&w, m->sealed.p, m->sealed.n);
  return wr_done(&w, len);
}

/* Reads AUTH's fields after the head into m. */
static int auth_fields(proto_rd *r, void *out) {
  proto_auth_msg *m = out;
  uint64_t cipher;
  int rc;
  if ((rc = proto__rd_uint(r, &cipher)))
    return rc;
  if ((rc = proto__rd_nil(r)) < 0)
    return rc;
  m->has_eph = rc == 0;
  if (m->has_eph && (rc = proto__rd_fixbin(r, m->eph_pk, sizeof m->eph_pk)))
    return rc;
  if (m->has_eph ? !cipher_ok(cipher) : cipher != 0)
    return BEE_ERANGE;
  m->cipher = (int)cipher;
  return proto__rd_bin(r, &m->sealed, AUTH_SEALED_MAX);
}

int proto__auth_decode(const uint8_t *buf, size_t len, proto_auth_msg *m) {
  return decode(buf, len, PROTO_T_AUTH, 3, auth_fields, m, sizeof *m);
}

/* AUTH inner = [1, 21, id_pk, token or nil, sig].  token.n == 0 is sent
 * as nil; a token over PROTO_TOKEN_MAX is BEE_ETOOBIG.  The decoder refuses
 * an empty bin token and keys or signatures of the wrong size with
 * BEE_ERANGE; on failure *m is all zero. */
int proto__auth_inner_encode(const proto_auth_inner *m, uint8_t *buf,
                             size_t cap, size_t *len) {
  assert(m->token.p || m->token.n == 0);
  if (m->token.n > PROTO_TOKEN_MAX)
    return BEE_ETOOBIG;
  proto_wr w;
  proto__wr_init(&w, buf, cap);
  proto__wr_head(&w, PROTO_T_AUTH, 3);
  proto__wr_bin(&w, m->id_pk, sizeof m->id_pk);
  if (m->token.n > 0)
    proto__wr_bin(&w, m->token.p, m->token.n);
  else
    proto__wr_nil(&w);
  proto__wr_bin(&w, m->sig, sizeof m->sig);
  return wr_done(&w, len);
}

/* Reads the inner AUTH fields after the head into m.  "No token" has one
 * encoding, nil; an empty bin is refused. */
static int auth_inner_fields(proto_rd *r, void *out) {
  proto_auth_inner *m = out;
  int rc;
  if ((rc = proto__rd_fixbin(r, m->id_pk, sizeof m->id_pk)))
    return rc;
  if ((rc = proto__rd_nil(r)) < 0)
    return rc;
  if (rc == 0) {
    if ((rc = proto__rd_bin(r, &m->token, PROTO_TOKEN_MAX)))
      return rc;
    if (m->token.n == 0)
      return BEE_ERANGE;
  }
  return proto__rd_fixbin(r, m->sig, sizeof m->sig);
}

int proto__auth_inner_decode(const uint8_t *buf, size_t len,
                             proto_auth_inner *m) {
  return decode(buf, len, PROTO_T_AUTH, 3, auth_inner_fields, m, sizeof *m);
}

/* RESULT = [1, 22, code, text].  A NULL text is sent as ""; one over
 * PROTO_TEXT_MAX bytes is BEE_ETOOBIG. */
int proto__result_encode(int64_t code, const char *text, uint8_t *buf,
                         size_t cap, size_t *len) {
  size_t n = text ? strnlen(text, PROTO_TEXT_MAX + 1) : 0;
  if (n > PROTO_TEXT_MAX)
    return BEE_ETOOBIG;
  proto_wr w;
  proto__wr_init(&w, buf, cap);
  proto__wr_head(&w, PROTO_T_RESULT, 2);
  proto__wr_int(&w, code);
  proto__wr_str(&w, text, n);
  return wr_done(&w, len);
}

typedef struct result_msg {
  int64_t code;
  proto_bytes text;
} result_msg;

static int result_fields(proto_rd *r, void *out) {
  result_msg *m = out;
  int rc = proto__rd_int(r, &m->code);
  return rc ? rc : proto__rd_str(r, &m->text, PROTO_TEXT_MAX);
}

/* *text is a view into buf (not NUL-terminated); *code and *text are set
 * only on success. */
int proto__result_decode(const uint8_t *buf, size_t len, int64_t *code,
                         proto_bytes *text) {
  result_msg m;
  int rc = decode(buf, len, PROTO_T_RESULT, 2, result_fields, &m, sizeof m);
  if (rc)
    return rc;
  *code = m.code;
  *text = m.text;
  return 0;
}
