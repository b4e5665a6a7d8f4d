/* proto-int.h: internals shared between proto/'s own files.
 *
 * The strict msgpack reader (a bounded cursor that never allocates), the
 * capped writer (msgpack-c's packer writing into a fixed buffer), and small
 * helpers.  Nothing outside proto/ includes this file.
 */
#ifndef BEE_PROTO_INT_H
#define BEE_PROTO_INT_H

#include "proto.h"

#include <msgpack.h>

/* ---- reader ------------------------------------------------------------ */

/* A cursor over one msgpack buffer.  Every read checks the bytes left
 * first; a read that fails leaves the cursor where it was. */
typedef struct proto_rd {
  const uint8_t *p;
  const uint8_t *end;
} proto_rd;

void proto__rd_init(proto_rd *r, const uint8_t *buf, size_t len);
static inline size_t proto__rd_left(const proto_rd *r) {
  return (size_t)(r->end - r->p);
}
/* Reads an array header.  A count larger than the bytes left (each element
 * takes at least one byte) is BEE_ETRUNCATED, so no caller ever sizes an
 * allocation from a count the data cannot back. */
int proto__rd_array(proto_rd *r, uint32_t *n);
int proto__rd_map(proto_rd *r, uint32_t *n);
/* Reads a non-negative integer of any msgpack width. */
int proto__rd_uint(proto_rd *r, uint64_t *v);
/* Reads any integer that fits int64_t. */
int proto__rd_int(proto_rd *r, int64_t *v);
int proto__rd_bool(proto_rd *r, bool *v);
/* Consumes a nil and returns 1; returns 0 (consuming nothing) when the
 * next value is not nil; negative on end of data. */
int proto__rd_nil(proto_rd *r);
/* Reads a str (or bin) of at most max bytes as a view. */
int proto__rd_str(proto_rd *r, proto_bytes *out, size_t max);
int proto__rd_bin(proto_rd *r, proto_bytes *out, size_t max);
/* Reads a bin of exactly n bytes into out. */
int proto__rd_fixbin(proto_rd *r, uint8_t *out, size_t n);
/* Skips one value of any type, nested at most depth levels. */
int proto__rd_skip(proto_rd *r, int depth);
/* BEE_ETRAILING if bytes are left. */
int proto__rd_end(const proto_rd *r);
/* Reads the common head [version, type, ...] of an array message with
 * exactly nfields fields after version and type.  Returns BEE_EVERSION,
 * BEE_EUNKNOWN (type differs from want, if want >= 0), BEE_EMISSING (too
 * few fields) or BEE_ETYPE (too many) as fits.  *type gets the type. */
int proto__rd_head(proto_rd *r, int want, uint32_t nfields, int *type);

/* ---- writer ------------------------------------------------------------ */

/* msgpack-c's packer writing into a caller's fixed buffer.  The first
 * write that does not fit sets err = BEE_ETOOBIG; later writes are
 * ignored, so callers check err once at the end. */
typedef struct proto_wr {
  uint8_t *buf;
  size_t cap;
  size_t len;
  int err;
  msgpack_packer pk;
} proto_wr;

void proto__wr_init(proto_wr *w, uint8_t *buf, size_t cap);
void proto__wr_array(proto_wr *w, uint32_t n);
void proto__wr_map(proto_wr *w, uint32_t n);
void proto__wr_uint(proto_wr *w, uint64_t v);
void proto__wr_int(proto_wr *w, int64_t v);
void proto__wr_bool(proto_wr *w, bool v);
void proto__wr_nil(proto_wr *w);
void proto__wr_str(proto_wr *w, const void *p, size_t n);
void proto__wr_bin(proto_wr *w, const void *p, size_t n);
/* Writes a bin header for n bytes the caller will place itself. */
void proto__wr_bin_head(proto_wr *w, size_t n);
/* [version, type] header of an array message with nfields more fields. */
void proto__wr_head(proto_wr *w, int type, uint32_t nfields);

/* ---- misc -------------------------------------------------------------- */

/* Unix time in seconds (wall clock). */
uint64_t proto__now_s(void);
/* Big-endian u32. */
static inline void proto__put_u32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)(v >> 24);
  p[1] = (uint8_t)(v >> 16);
  p[2] = (uint8_t)(v >> 8);
  p[3] = (uint8_t)v;
}
static inline uint32_t proto__get_u32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 |
         (uint32_t)p[3];
}
/* Reads a whole small file (at most max bytes) into a heap buffer. */
int proto__read_file(const char *path, size_t max, uint8_t **out, size_t *len);
/* Writes a file atomically (temp file + rename) with the given mode. */
int proto__write_file(const char *path, const void *p, size_t n, int mode,
                      bool exclusive);

/* Handshake messages (codec.c).  Views point into the decoded buffer. */
typedef struct proto_hello {
  proto_bytes swarm;
  int purpose;
  int ciphers;     /* PROTO_CIPHER_* offered */
  bool moderated;  /* sender runs a moderated swarm */
  uint8_t eph_pk[32];
} proto_hello;

/* AUTH from the responder carries its ephemeral key and chosen cipher;
 * from the initiator those are absent (eph_pk zero, cipher 0).  sealed is
 * the AEAD box holding the sender's identity, token and signature. */
typedef struct proto_auth_msg {
  int cipher;
  uint8_t eph_pk[32];
  bool has_eph;
  proto_bytes sealed;
} proto_auth_msg;

/* The plaintext inside proto_auth_msg.sealed. */
typedef struct proto_auth_inner {
  uint8_t id_pk[32];
  proto_bytes token; /* n == 0: none (open swarm) */
  uint8_t sig[64];
} proto_auth_inner;

int proto__hello_encode(const proto_hello *m, uint8_t *buf, size_t cap,
                        size_t *len);
int proto__hello_decode(const uint8_t *buf, size_t len, proto_hello *m);
int proto__auth_encode(const proto_auth_msg *m, uint8_t *buf, size_t cap,
                       size_t *len);
int proto__auth_decode(const uint8_t *buf, size_t len, proto_auth_msg *m);
int proto__auth_inner_encode(const proto_auth_inner *m, uint8_t *buf,
                             size_t cap, size_t *len);
int proto__auth_inner_decode(const uint8_t *buf, size_t len,
                             proto_auth_inner *m);
/* RESULT: the responder's verdict, code 0 = accepted. */
int proto__result_encode(int64_t code, const char *text, uint8_t *buf,
                         size_t cap, size_t *len);
int proto__result_decode(const uint8_t *buf, size_t len, int64_t *code,
                         proto_bytes *text);

#endif /* BEE_PROTO_INT_H */
