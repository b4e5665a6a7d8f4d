/* state-msg.c: the payloads of a state download (docs/PROTOCOL.md,
 * section 12).
 *
 * A bee that joins a run behind the swarm asks a peer for the run's
 * training state (parameters, optimizer state, buffers) piece by piece
 * with the "state.get" request:
 *   REQUEST  [1, 70, run, offset, len]
 *   CHUNK    [1, 71, run, epoch, total, checksum, offset, data]
 * The donor answers each request with the bytes [offset, offset + len) of
 * its latest snapshot (fewer at the end), the snapshot's epoch, its total
 * size and its BLAKE2b-256 checksum, so the asker notices a snapshot that
 * changed under it and checks the whole before using it.  The same
 * request carries the swarm's steps since, so that a bee whose state is
 * an epoch or two old takes them instead of downloading again:
 *   STEP_REQ [1, 72, run, epoch, offset, len]
 *   STEP     [1, 73, run, epoch, total, checksum, offset, data]
 *
 * Strict in the way of dht-msg.c: exact field counts and msgpack types,
 * every range checked, the message must fill the buffer, views into the
 * input, no allocation.  The encoder refuses what the decoder would.
 */
#include "proto-int.h"

#include <string.h>

static const uint8_t nfields_of[] = {3, 6, 4, 6};

static bool is_request(int type) {
  return type == PROTO_T_STATE_REQ || type == PROTO_T_STATE_STEP_REQ;
}

static int check(const proto_state_msg *m, size_t *run_n) {
  if (m->type < PROTO_T_STATE_REQ || m->type > PROTO_T_STATE_STEP)
    return BEE_EUNKNOWN;
  int rc = proto__str_check(m->run, sizeof m->run, proto__run_ok, run_n);
  if (rc)
    return rc;
  if (is_request(m->type))
    return m->len >= 1 && m->len <= PROTO_STATE_CHUNK_MAX &&
                   m->offset < PROTO_STATE_MAX
               ? 0
               : BEE_ERANGE;
  if (m->data.n > PROTO_STATE_CHUNK_MAX)
    return BEE_ETOOBIG;
  if (m->total > PROTO_STATE_MAX || m->offset > m->total ||
      m->data.n > m->total - m->offset)
    return BEE_ERANGE;
  return 0;
}

int proto_state_encode(const proto_state_msg *m, uint8_t *buf, size_t cap,
                       size_t *len) {
  size_t run_n;
  int rc = check(m, &run_n);
  if (rc)
    return rc;
  proto_wr w;
  proto__wr_init(&w, buf, cap);
  proto__wr_head(&w, m->type, nfields_of[m->type - PROTO_T_STATE_REQ]);
  proto__wr_str(&w, m->run, run_n);
  if (m->type == PROTO_T_STATE_STEP_REQ)
    proto__wr_uint(&w, m->epoch);
  if (is_request(m->type)) {
    proto__wr_uint(&w, m->offset);
    proto__wr_uint(&w, m->len);
  } else {
    proto__wr_uint(&w, m->epoch);
    proto__wr_uint(&w, m->total);
    proto__wr_bin(&w, m->checksum, sizeof m->checksum);
    proto__wr_uint(&w, m->offset);
    proto__wr_bin(&w, m->data.p, m->data.n);
  }
  if (w.err)
    return w.err;
  *len = w.len;
  return 0;
}

int proto_state_decode(const uint8_t *buf, size_t len, proto_state_msg *m) {
  proto_rd r;
  int rc;
  memset(m, 0, sizeof *m);
  proto__rd_init(&r, buf, len);
  if ((rc = proto__rd_family_head(&r, PROTO_T_STATE_REQ, 4, nfields_of,
                                  &m->type)) ||
      (rc = proto__rd_cstr(&r, m->run, PROTO_RUN_MAX, proto__run_ok)))
    goto fail;
  if (m->type == PROTO_T_STATE_STEP_REQ && (rc = proto__rd_uint(&r, &m->epoch)))
    goto fail;
  if (is_request(m->type)) {
    if ((rc = proto__rd_uint(&r, &m->offset)) ||
        (rc = proto__rd_uint(&r, &m->len)))
      goto fail;
  } else {
    if ((rc = proto__rd_uint(&r, &m->epoch)) ||
        (rc = proto__rd_uint(&r, &m->total)) ||
        (rc = proto__rd_fixbin(&r, m->checksum, sizeof m->checksum)) ||
        (rc = proto__rd_uint(&r, &m->offset)) ||
        (rc = proto__rd_bin(&r, &m->data, PROTO_STATE_CHUNK_MAX)))
      goto fail;
  }
  if ((rc = proto__rd_end(&r)))
    goto fail;
  size_t run_n;
  if ((rc = check(m, &run_n)))
    goto fail;
  return 0;
fail:
  memset(m, 0, sizeof *m);
  return rc;
}
