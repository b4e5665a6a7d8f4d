/* local-msg.c: the messages between beed and a trainer process on its
 * host (proto.h, "The local trainer protocol"; docs/PROTOCOL.md section
 * 13).
 *
 * Strict in the way of state-msg.c: exact field counts and msgpack
 * types, every range checked, the message must fill the buffer, views
 * into the input, no allocation.  A HELLO's tensor list is checked whole
 * when it is decoded (names, roles, types, dimensions, element counts and
 * their sum), so that proto_local_tensor_next, reading it again, cannot
 * fail.  The encoder refuses what the decoder would.
 */
#include "proto-int.h"

#include <math.h>
#include <string.h>

static const uint8_t nfields_of[PROTO_LOCAL_TYPES] = {
    4,  /* HELLO: run, mode, batch, tensors */
    10, /* WELCOME: epoch, loaded, mode, target, peers, inner_steps,
           outer_lr, outer_momentum, delayed, compression */
    2,  /* BATCH: samples, loss */
    3,  /* GO: epoch, samples, peers */
    2,  /* STEP: epoch, apply */
    1,  /* STEPPED: epoch */
    1,  /* LOADED: epoch */
    0,  /* BYE */
    2,  /* REFUSED: code, text */
    3,  /* EVAL: epoch, loss, accuracy */
};

static bool name_ok(const uint8_t *s, size_t n) {
  if (n < 1 || n > PROTO_LOCAL_NAME_MAX)
    return false;
  for (size_t i = 0; i < n; i++)
    if (s[i] < 0x21 || s[i] > 0x7e)
      return false;
  return true;
}

/* A refusal's text: no NUL (it is kept as a C string). */
static bool text_ok(const uint8_t *s, size_t n) {
  return n == 0 || memchr(s, 0, n) == NULL;
}

static bool mode_ok(int mode) {
  return mode == PROTO_LOCAL_GRADIENTS || mode == PROTO_LOCAL_DILOCO;
}

/* The element count of dims, or 0 when a dimension is 0 or the product
 * passes PROTO_LOCAL_ELEMS_MAX. */
static uint64_t elems_of(const uint64_t *dims, unsigned ndim) {
  uint64_t e = 1;
  for (unsigned i = 0; i < ndim; i++) {
    if (dims[i] == 0 || dims[i] > PROTO_LOCAL_ELEMS_MAX / e)
      return 0;
    e *= dims[i];
  }
  return e;
}

static bool tensor_ok(const proto_local_tensor *t) {
  return name_ok(t->name.p, t->name.n) && t->role >= PROTO_LOCAL_PARAM &&
         t->role <= PROTO_LOCAL_BUFFER && t->dtype == PROTO_LOCAL_F32 &&
         t->ndim <= PROTO_LOCAL_DIMS_MAX &&
         elems_of(t->dims, t->ndim) == t->elems && t->elems != 0;
}

/* One tensor, [name, role, dtype, [dims...]], checked. */
static int rd_tensor(proto_rd *r, proto_local_tensor *t) {
  uint32_t n, nd;
  uint64_t role, dtype;
  int rc;
  memset(t, 0, sizeof *t);
  if ((rc = proto__rd_array(r, &n)))
    return rc;
  if (n != 4)
    return n < 4 ? BEE_EMISSING : BEE_ETYPE;
  if ((rc = proto__rd_str(r, &t->name, PROTO_LOCAL_NAME_MAX)) ||
      (rc = proto__rd_uint_max(r, PROTO_LOCAL_BUFFER, &role)) ||
      (rc = proto__rd_uint_max(r, PROTO_LOCAL_F32, &dtype)) ||
      (rc = proto__rd_array(r, &nd)))
    return rc;
  if (nd > PROTO_LOCAL_DIMS_MAX)
    return BEE_ERANGE;
  t->role = (int)role;
  t->dtype = (int)dtype;
  t->ndim = nd;
  for (uint32_t i = 0; i < nd; i++)
    if ((rc = proto__rd_uint(r, &t->dims[i])))
      return rc;
  t->elems = elems_of(t->dims, t->ndim);
  return tensor_ok(t) ? 0 : BEE_ERANGE;
}

int proto_local_tensor_next(proto_bytes *it, proto_local_tensor *t) {
  if (it->n == 0)
    return 1;
  proto_rd r;
  proto__rd_init(&r, it->p, it->n);
  int rc = rd_tensor(&r, t);
  if (rc)
    return rc; /* not after a decode, which checked them all */
  it->n -= (size_t)(r.p - it->p);
  it->p = r.p;
  return 0;
}

/* "[10, 128]" */
static void dims_text(const proto_local_tensor *t, char *out, size_t cap) {
  size_t n = (size_t)snprintf(out, cap, "[");
  for (unsigned d = 0; d < t->ndim && n < cap; d++)
    n += (size_t)snprintf(out + n, cap - n, "%s%llu", d ? ", " : "",
                          (unsigned long long)t->dims[d]);
  if (n < cap)
    snprintf(out + n, cap - n, "]");
}

static const char *role_text(int role) {
  return role == PROTO_LOCAL_PARAM   ? "a parameter"
         : role == PROTO_LOCAL_STATE ? "optimizer state"
                                     : "a buffer";
}

int proto_local_tensors_diff(const proto_local_msg *ours,
                             const proto_local_msg *swarm, char *why,
                             size_t cap) {
  proto_bytes a = ours->tensors, b = swarm->tensors;
  proto_local_tensor x, y;
  for (size_t i = 0;; i++) {
    int ra = proto_local_tensor_next(&a, &x);
    int rb = proto_local_tensor_next(&b, &y);
    if (ra && rb)
      return 0;
    if (ra || rb) {
      const proto_local_tensor *more = ra ? &y : &x;
      snprintf(why, cap,
               "%zu tensors here, %zu in the swarm (the first %s: "
               "%.*s)",
               ours->n, swarm->n, ra ? "not here" : "not there",
               (int)more->name.n, (const char *)more->name.p);
      return 1;
    }
    char dx[128], dy[128];
    if (x.name.n != y.name.n || memcmp(x.name.p, y.name.p, x.name.n) != 0) {
      snprintf(why, cap, "tensor %zu is %.*s here and %.*s in the swarm", i,
               (int)x.name.n, (const char *)x.name.p, (int)y.name.n,
               (const char *)y.name.p);
      return 1;
    }
    if (x.role != y.role || x.dtype != y.dtype) {
      snprintf(why, cap, "tensor %zu (%.*s) is %s here and %s in the swarm", i,
               (int)x.name.n, (const char *)x.name.p, role_text(x.role),
               role_text(y.role));
      return 1;
    }
    if (x.ndim != y.ndim ||
        memcmp(x.dims, y.dims, x.ndim * sizeof x.dims[0]) != 0) {
      dims_text(&x, dx, sizeof dx);
      dims_text(&y, dy, sizeof dy);
      snprintf(why, cap, "tensor %zu (%.*s) is %s here and %s in the swarm", i,
               (int)x.name.n, (const char *)x.name.p, dx, dy);
      return 1;
    }
  }
}

/* Checks m for encoding; *run_n: HELLO's run's length, *text_n: the
 * length of REFUSED's text or WELCOME's compression. */
static int check(const proto_local_msg *m, size_t *run_n, size_t *text_n) {
  int rc;
  switch (m->type) {
  case PROTO_T_LOCAL_HELLO: {
    if ((rc = proto__str_check(m->run, sizeof m->run, proto__run_ok, run_n)))
      return rc;
    if (m->batch < 1 || m->n < 1 || m->n > PROTO_LOCAL_TENSORS_MAX)
      return BEE_ERANGE;
    bool param = false;
    uint64_t all = 0;
    for (size_t i = 0; i < m->n; i++) {
      if (!tensor_ok(&m->list[i]) ||
          m->list[i].elems > PROTO_LOCAL_ELEMS_MAX - all)
        return BEE_ERANGE;
      all += m->list[i].elems;
      param |= m->list[i].role == PROTO_LOCAL_PARAM;
    }
    return param && mode_ok(m->mode) ? 0 : BEE_ERANGE;
  }
  case PROTO_T_LOCAL_WELCOME:
    if ((rc = proto__str_check(m->compression, sizeof m->compression,
                               proto__run_ok, text_n)))
      return rc;
    return mode_ok(m->mode) && isfinite(m->outer_lr) && m->outer_lr >= 0 &&
                   isfinite(m->outer_momentum) && m->outer_momentum >= 0 &&
                   (!m->delayed || m->mode == PROTO_LOCAL_GRADIENTS)
               ? 0
               : BEE_ERANGE;
  case PROTO_T_LOCAL_BATCH: return m->samples >= 1 ? 0 : BEE_ERANGE;
  case PROTO_T_LOCAL_REFUSED:
    if ((rc = proto__str_check(m->text, sizeof m->text, text_ok, text_n)))
      return rc;
    return m->code < 0 ? 0 : BEE_ERANGE;
  case PROTO_T_LOCAL_EVAL:
    return m->accuracy >= 0 && m->accuracy <= 1 ? 0 : BEE_ERANGE;
  case PROTO_T_LOCAL_GO:
  case PROTO_T_LOCAL_STEP:
  case PROTO_T_LOCAL_STEPPED:
  case PROTO_T_LOCAL_LOADED:
  case PROTO_T_LOCAL_BYE: return 0;
  default: return BEE_EUNKNOWN;
  }
}

int proto_local_encode(const proto_local_msg *m, uint8_t *buf, size_t cap,
                       size_t *len) {
  size_t run_n = 0, text_n = 0;
  int rc = check(m, &run_n, &text_n);
  if (rc)
    return rc;
  proto_wr w;
  proto__wr_init(&w, buf, cap);
  proto__wr_head(&w, m->type, nfields_of[m->type - PROTO_T_LOCAL_HELLO]);
  switch (m->type) {
  case PROTO_T_LOCAL_HELLO:
    proto__wr_str(&w, m->run, run_n);
    proto__wr_uint(&w, (uint64_t)m->mode);
    proto__wr_uint(&w, m->batch);
    proto__wr_array(&w, (uint32_t)m->n);
    for (size_t i = 0; i < m->n; i++) {
      const proto_local_tensor *t = &m->list[i];
      proto__wr_array(&w, 4);
      proto__wr_str(&w, t->name.p, t->name.n);
      proto__wr_uint(&w, (uint64_t)t->role);
      proto__wr_uint(&w, (uint64_t)t->dtype);
      proto__wr_array(&w, t->ndim);
      for (unsigned d = 0; d < t->ndim; d++)
        proto__wr_uint(&w, t->dims[d]);
    }
    break;
  case PROTO_T_LOCAL_WELCOME:
    proto__wr_uint(&w, m->epoch);
    proto__wr_bool(&w, m->loaded);
    proto__wr_uint(&w, (uint64_t)m->mode);
    proto__wr_uint(&w, m->target);
    proto__wr_uint(&w, m->peers);
    proto__wr_uint(&w, m->inner_steps);
    proto__wr_f64(&w, m->outer_lr);
    proto__wr_f64(&w, m->outer_momentum);
    proto__wr_bool(&w, m->delayed);
    proto__wr_str(&w, m->compression, text_n);
    break;
  case PROTO_T_LOCAL_BATCH:
    proto__wr_uint(&w, m->samples);
    proto__wr_f64(&w, m->loss);
    break;
  case PROTO_T_LOCAL_GO:
    proto__wr_uint(&w, m->epoch);
    proto__wr_uint(&w, m->samples);
    proto__wr_uint(&w, m->peers);
    break;
  case PROTO_T_LOCAL_STEP:
    proto__wr_uint(&w, m->epoch);
    proto__wr_bool(&w, m->apply);
    break;
  case PROTO_T_LOCAL_STEPPED:
  case PROTO_T_LOCAL_LOADED: proto__wr_uint(&w, m->epoch); break;
  case PROTO_T_LOCAL_REFUSED:
    proto__wr_int(&w, m->code);
    proto__wr_str(&w, m->text, text_n);
    break;
  case PROTO_T_LOCAL_EVAL:
    proto__wr_uint(&w, m->epoch);
    proto__wr_f64(&w, m->loss);
    proto__wr_f64(&w, m->accuracy);
    break;
  default: /* BYE */ break;
  }
  if (w.err)
    return w.err;
  *len = w.len;
  return 0;
}

/* A HELLO's tensors: each checked, their sum bounded, at least one
 * parameter; m->tensors gets the list's bytes. */
static int rd_tensors(proto_rd *r, proto_local_msg *m) {
  uint32_t n;
  int rc;
  if ((rc = proto__rd_array(r, &n)))
    return rc;
  if (n < 1 || n > PROTO_LOCAL_TENSORS_MAX)
    return BEE_ERANGE;
  const uint8_t *start = r->p;
  uint64_t all = 0;
  bool param = false;
  for (uint32_t i = 0; i < n; i++) {
    proto_local_tensor t;
    if ((rc = rd_tensor(r, &t)))
      return rc;
    if (t.elems > PROTO_LOCAL_ELEMS_MAX - all)
      return BEE_ERANGE;
    all += t.elems;
    param |= t.role == PROTO_LOCAL_PARAM;
  }
  if (!param)
    return BEE_ERANGE;
  m->n = n;
  m->tensors = (proto_bytes){start, (size_t)(r->p - start)};
  return 0;
}

static int rd_mode(proto_rd *r, int *mode) {
  uint64_t v;
  int rc = proto__rd_uint_max(r, PROTO_LOCAL_DILOCO, &v);
  *mode = (int)v;
  return rc;
}

int proto_local_decode(const uint8_t *buf, size_t len, proto_local_msg *m) {
  proto_rd r;
  proto_bytes text;
  int rc;
  memset(m, 0, sizeof *m);
  if (len > PROTO_LOCAL_FRAME_MAX) {
    rc = BEE_ETOOBIG;
    goto fail;
  }
  proto__rd_init(&r, buf, len);
  if ((rc = proto__rd_family_head(&r, PROTO_T_LOCAL_HELLO, PROTO_LOCAL_TYPES,
                                  nfields_of, &m->type)))
    goto fail;
  switch (m->type) {
  case PROTO_T_LOCAL_HELLO:
    if ((rc = proto__rd_cstr(&r, m->run, PROTO_RUN_MAX, proto__run_ok)) ||
        (rc = rd_mode(&r, &m->mode)) || (rc = proto__rd_uint(&r, &m->batch)) ||
        (rc = rd_tensors(&r, m)))
      goto fail;
    if (m->batch < 1) {
      rc = BEE_ERANGE;
      goto fail;
    }
    break;
  case PROTO_T_LOCAL_WELCOME:
    if ((rc = proto__rd_uint(&r, &m->epoch)) ||
        (rc = proto__rd_bool(&r, &m->loaded)) || (rc = rd_mode(&r, &m->mode)) ||
        (rc = proto__rd_uint(&r, &m->target)) ||
        (rc = proto__rd_uint(&r, &m->peers)) ||
        (rc = proto__rd_uint(&r, &m->inner_steps)) ||
        (rc = proto__rd_f64(&r, &m->outer_lr)) ||
        (rc = proto__rd_f64(&r, &m->outer_momentum)) ||
        (rc = proto__rd_bool(&r, &m->delayed)) ||
        (rc = proto__rd_cstr(&r, m->compression, PROTO_LOCAL_CODEC_MAX,
                             proto__run_ok)))
      goto fail;
    break;
  case PROTO_T_LOCAL_BATCH:
    if ((rc = proto__rd_uint(&r, &m->samples)) ||
        (rc = proto__rd_f64(&r, &m->loss)))
      goto fail;
    break;
  case PROTO_T_LOCAL_GO:
    if ((rc = proto__rd_uint(&r, &m->epoch)) ||
        (rc = proto__rd_uint(&r, &m->samples)) ||
        (rc = proto__rd_uint(&r, &m->peers)))
      goto fail;
    break;
  case PROTO_T_LOCAL_STEP:
    if ((rc = proto__rd_uint(&r, &m->epoch)) ||
        (rc = proto__rd_bool(&r, &m->apply)))
      goto fail;
    break;
  case PROTO_T_LOCAL_STEPPED:
  case PROTO_T_LOCAL_LOADED:
    if ((rc = proto__rd_uint(&r, &m->epoch)))
      goto fail;
    break;
  case PROTO_T_LOCAL_REFUSED:
    if ((rc = proto__rd_int(&r, &m->code)) ||
        (rc = proto__rd_str(&r, &text, PROTO_TEXT_MAX)))
      goto fail;
    if (!text_ok(text.p, text.n)) {
      rc = BEE_ERANGE;
      goto fail;
    }
    if (text.n)
      memcpy(m->text, text.p, text.n);
    break;
  case PROTO_T_LOCAL_EVAL:
    if ((rc = proto__rd_uint(&r, &m->epoch)) ||
        (rc = proto__rd_f64(&r, &m->loss)) ||
        (rc = proto__rd_f64(&r, &m->accuracy)))
      goto fail;
    break;
  default: /* BYE */ break;
  }
  if ((rc = proto__rd_end(&r)))
    goto fail;
  size_t run_n, text_n;
  /* The tensors were checked as they were read; the rest here. */
  if (m->type != PROTO_T_LOCAL_HELLO && (rc = check(m, &run_n, &text_n)))
    goto fail;
  return 0;
fail:
  memset(m, 0, sizeof *m);
  return rc;
}
