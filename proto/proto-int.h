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
/* Reads a float64 (0xcb) only: a float32 is BEE_ETYPE, so each value has
 * one encoding.  NaN and infinities come back as they are; the caller's
 * schema says which values it takes. */
int proto__rd_f64(proto_rd *r, double *v);
/* Consumes a nil and returns 1; returns 0 (consuming nothing) when the
 * next value is not nil; negative on end of data. */
int proto__rd_nil(proto_rd *r);
/* Reads a str (or bin) of at most max bytes as a view. */
int proto__rd_str(proto_rd *r, proto_bytes *out, size_t max);
int proto__rd_bin(proto_rd *r, proto_bytes *out, size_t max);
/* Reads a bin of exactly n bytes (a key, a signature) into out; any
 * other size is BEE_ERANGE. */
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

/* Reads the head of a message of one family: types first..first+count-1,
 * type t with exactly nfields[t - first] fields after version and type.
 * Errors as proto__rd_head, and BEE_EUNKNOWN for a type outside the
 * family. */
int proto__rd_family_head(proto_rd *r, int first, int count,
                          const uint8_t *nfields, int *type);

/* String checks shared by the records (records.c) and the group messages
 * (group-msg.c): a run name ([A-Za-z0-9._-], 1..PROTO_RUN_MAX bytes),
 * matchmaking group bits ('0' and '1', possibly none), an address to dial
 * (non-empty printable ASCII without spaces). */
bool proto__run_ok(const uint8_t *s, size_t n);
bool proto__bits_ok(const uint8_t *s, size_t n);
bool proto__addr_ok(const uint8_t *s, size_t n);
/* The length of the C string s kept in an array of cap bytes, checked
 * with ok: BEE_ETOOBIG when the array holds no NUL, BEE_ERANGE when ok
 * refuses it. */
int proto__str_check(const char *s, size_t cap,
                     bool (*ok)(const uint8_t *, size_t), size_t *n);
/* Reads a str of at most max bytes that ok accepts into out (max + 1
 * bytes), NUL-terminated. */
int proto__rd_cstr(proto_rd *r, char *out, size_t max,
                   bool (*ok)(const uint8_t *, size_t));
/* A uint no larger than max (else BEE_ERANGE). */
int proto__rd_uint_max(proto_rd *r, uint64_t max, uint64_t *v);
/* A PROTO_MODE_* (a uint up to PROTO_MODE_AUX). */
int proto__rd_mode(proto_rd *r, int *mode);

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
/* Always a float64 (0xcb), never narrowed: what proto__rd_f64 reads. */
void proto__wr_f64(proto_wr *w, double v);
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
/* Finds the one content line "magic <payload>" of a small text file
 * (keys, tokens, lists): '#' comments and blank lines are skipped,
 * trailing blanks ignored, a second content line refused.  The payload is
 * buf[*off, *off + *n).  BEE_EKEYFILE when there is no such line. */
int proto__text_line(const char *buf, size_t len, const char *magic,
                     size_t *off, size_t *n);

/* seal.c: sets up one direction of sealed traffic. */
int proto__sealer_init(proto_sealer *s, int cipher, const uint8_t key[32]);
/* Encodes envelope message m up to and including the bin header of its
 * last field, a payload (REQUEST, RESPONSE, ONEWAY, STREAM_OPEN, CHUNK),
 * whose bytes the caller places (or seals) right after it: the same bytes
 * proto_msg_encode writes, in two pieces.  BEE_ERANGE for a type whose
 * last field is not a payload; else as proto_msg_encode. */
int proto__msg_head_encode(const proto_msg *m, uint8_t *buf, size_t cap,
                           size_t *len);
/* Seals the concatenation hdr || data into out (hlen + len bytes, then
 * the tag), reading the parts where they are: no copy first.  hdr may be
 * out itself (in place); data may be out + hlen. */
int proto__seal_parts(proto_sealer *s, uint8_t *out, const uint8_t *hdr,
                      size_t hlen, const uint8_t *data, size_t len);
/* The PROTO_CIPHER_* this CPU runs (AES-GCM only with AES-NI). */
int proto__ciphers_local(void);

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

/* ---- transport (host.c, conn.c) ------------------------------------- */

enum {
  CONN_RESOLVING,  /* outgoing: waiting for uv_getaddrinfo */
  CONN_CONNECTING, /* outgoing: TCP connect in flight */
  CONN_HANDSHAKE,
  CONN_UP,
  CONN_CLOSING, /* CLOSE queued or handle closing */
};

typedef struct proto_call {
  struct proto_call *next;
  uint64_t id;
  uint64_t deadline_ms;
  proto_reply_cb cb;
  void *arg;
} proto_call;

typedef struct proto_method {
  struct proto_method *next;
  char name[PROTO_METHOD_MAX + 1];
  proto_request_cb cb;     /* requests, or NULL */
  void *data;
  proto_oneway_cb oneway;  /* one-way messages, or NULL */
  void *oneway_data;
} proto_method;

/* The rate data reaches us at on a connection (meter.c): reads grouped
 * into flights, the best flight's bytes/s since last taken. */
#define PROTO__FLIGHT_MIN (256u << 10) /* bytes after a flight's first read */
typedef struct proto__flight {
  uint64_t start_ns, last_ns; /* the flight under way; 0: none */
  uint64_t bytes;             /* its bytes after the first read */
  uint64_t skip;              /* of those, the backlog still to pass */
  double best;                /* bytes/s, the best flight closed */
} proto__flight;
/* Whether a read at now_ns starts a flight: then pass its backlog. */
bool proto__flight_starts(const proto__flight *f, uint64_t now_ns,
                          uint64_t gap_ns);
/* A read of bytes at now_ns.  joins: the first read of one of several
 * sources feeding f (a peer's connections) in the flight under way: its
 * bytes and its backlog may have come before the flight began, so they
 * are passed over as a flight's first read's are. */
void proto__flight_add(proto__flight *f, uint64_t now_ns, size_t bytes,
                       uint64_t gap_ns, uint64_t backlog, bool joins);
/* The best since the last take (closing a flight paused over the gap),
 * bytes/s, or 0; starts again from nothing. */
double proto__flight_take(proto__flight *f, uint64_t now_ns, uint64_t gap_ns);

struct proto_conn {
  proto_host *h;
  proto_conn *prev, *next; /* host's list of all connections */
  proto_conn *id_next;     /* chain in the host's index by peer id */
  bool indexed;            /* in that index: an up control connection */
  int state;
  bool initiator;
  bool has_tcp;     /* tcp handle initialised (close it to free) */
  bool up_reported; /* on_up ran, so on_down must run */
  bool want_drain;  /* a send hit BEE_EQUEUE */
  uint64_t retire_ms; /* a duplicate: unused, closed at this time */
  unsigned token_gen; /* the host's when the handshake began */
  bool token_refused; /* a renewal of the peer's was refused (logged once) */
  uint64_t token_refused_ms; /* loop time of the last refusal */
  uint64_t token_taken;      /* FNV-1a of the last renewal taken */
  int purpose;
  char addr[64]; /* "ip:port" or the name being resolved */
  char ip[48];
  uv_tcp_t tcp;
  uv_getaddrinfo_t gai;
  uv_connect_t creq;
  struct addrinfo *ai, *ai_next;
  uint64_t deadline_ms; /* resolve/connect/handshake/close deadline */
  proto_connect_cb connect_cb;
  void *connect_arg;
  proto_hs *hs;
  proto_peer peer;
  proto_sealer tx, rx;
  uint8_t *rbuf; /* frames being received */
  size_t rcap, rlen;
  size_t queued; /* bytes handed to uv_write, not yet completed */
  uint64_t last_rx_ms, last_write_ms, ping_sent_ms;
  uint64_t hs_sent_ms; /* a handshake message of ours awaits the next */
  uint64_t ping_sent_ns, hs_sent_ns; /* the same two, uv_hrtime */
  uint64_t rtt_us;      /* least round trip seen (handshake, ping) */
  proto__flight flight; /* the rate data reaches us at (meter.c) */
  /* A control connection's: the rate its peer's data reaches us at on
   * all our connections to it together (stripes share one link). */
  proto__flight peer_flight;
  uint64_t peer_joined_ns; /* start of the peer flight c last fed */
  bool has_rtt;
  uint64_t next_call_id;
  proto_call *calls;
  int close_code;
  void *data;
};

struct proto_host {
  proto_host_config cfg;
  uv_loop_t *loop;
  uv_tcp_t listener;
  bool listening;
  uv_timer_t timer;
  bool closing;
  int handles; /* open uv handles and in-flight requests; free at 0 */
  proto_conn *conns;
  void *wpool;   /* free chunk-sized write buffers (conn.c) */
  size_t nwpool;
  size_t nall; /* every connection object, any state */
  size_t nup;
  proto_method *methods;
  /* Up control connections by peer id (retiring duplicates included),
   * so that proto_host_find costs the same with 5 peers or 5,000. */
  proto_conn **byid;
  size_t byid_cap, byid_n; /* cap is 0 or a power of two */
  unsigned token_gen; /* proto_host_token_renewed calls so far */
};

/* conn.c */
proto_conn *proto__conn_new(proto_host *h, bool initiator, int purpose);
/* Starts reading and, for an initiator, sends the HELLO. */
int proto__conn_start(proto_conn *c);
/* Checks c's deadlines at now_ms (loop clock) and its peer's token
 * expiry at now_s (wall clock); run by the host timer. */
void proto__conn_tick(proto_conn *c, uint64_t now_ms, uint64_t now_s);
/* Sends our token to c's peer as a renewal (PROTO_TOKEN_METHOD) and marks
 * c as having the host's present one. */
void proto__conn_send_token(proto_conn *c);
/* Tears c down at once with code; runs the callbacks that are due. */
void proto__conn_abort(proto_conn *c, int code, const char *why);
/* Frees the host's pool of write buffers. */
void proto__conn_pool_free(proto_host *h);
/* host.c */
void proto__host_unlink(proto_host *h, proto_conn *c);
/* Takes c out of the index by peer id, if it is in. */
void proto__host_unindex(proto_host *h, proto_conn *c);
void proto__host_handle_done(proto_host *h);
/* Handshake done on c: dedupe, then on_up / connect_cb. */
void proto__host_conn_up(proto_host *h, proto_conn *c);
const proto_method *proto__host_method(const proto_host *h, proto_bytes name);
uint64_t proto__now_ms(const proto_host *h);

#endif /* BEE_PROTO_INT_H */
