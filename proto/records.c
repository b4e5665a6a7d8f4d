/* records.c: the swarm's typed DHT records and the keys of DHT names.
 *
 * Besides the revocation list, the swarm publishes five kinds of records
 * in the DHT (docs/PROTOCOL.md, section 9), each value one msgpack array:
 *   ["bee.progress", 1, run, epoch, samples, samples_per_second, time_ms,
 *    mode, label, leaving (optional: only true is written)]
 *   ["bee.metrics", 1, run, step, loss, samples_per_second, compute_s,
 *    averaging_s, bytes_sent, bytes_received, group_size, grad_sq_local,
 *    batch_local, grad_sq_avg, batch_avg, time_ms, by_all, diverged,
 *    params, lines, loss_scale, dropped (the last six optional, each only
 *    after the one before)]
 *   ["bee.match", 1, run, round, bits, addr, schema_hash, mode,
 *    bandwidth_mbit, weight]
 *   ["bee.donor", 1, run, addr, epoch, slots]
 *   ["bee.links", 1, run, time_ms, [[id, rtt_us, mbit, age_s]...]]
 * The head is a str tag rather than the numeric [version, type] of the RPC
 * payloads because the DHT also holds plain values put by hand: a tag in
 * the reserved "bee." namespace tells a typed value from any other without
 * a registry, and a "bee." tag this version does not know is a newer
 * peer's type, let through rather than refused.
 *
 * The decoders are as strict as codec.c (exact msgpack types, limits
 * checked before anything is copied, one code per malformed class; floats
 * only as float64, so each value has one encoding) with one exception:
 * fields after the known ones are skipped.  That is how a later version
 * adds fields without a version bump, and it keeps nodes of this version
 * storing an upgraded peer's records instead of refusing them.  Decoded
 * structs own their strings, so a record outlives the buffer it came in.
 * The encoders refuse whatever the decoders would refuse, with the same
 * predicates, so everything they write decodes to the same values.
 *
 * A typed record is trusted only as far as the DHT's checks reach: it must
 * sit under an owned subkey (so it carries its publisher's signature) and
 * under the key its own fields name, so no peer can file a progress
 * report under another run or a matchmaking entry under another round.
 */
#include "proto-int.h"

#include <assert.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <sodium.h>

#define KEY_DOMAIN "beed dht key"
/* Skipped trailing fields nest at most this deep, so the whole value
 * stays within PROTO_DEPTH_MAX like every other message. */
#define SKIP_DEPTH (PROTO_DEPTH_MAX - 1)

/* Tag and number of fields after [tag, version], by PROTO_REC_*. */
static const struct {
  const char *tag;
  uint32_t nfields;
} schemas[] = {
    [PROTO_REC_PROGRESS] = {"bee.progress", 7},
    [PROTO_REC_METRICS] = {"bee.metrics", 14},
    [PROTO_REC_MATCH] = {"bee.match", 8},
    [PROTO_REC_DONOR] = {"bee.donor", 4},
    [PROTO_REC_LINKS] = {"bee.links", 3},
};

/* The PROTO_REC_* a tag names, or PROTO_REC_NONE. */
static int tag_type(proto_bytes tag) {
  for (int t = PROTO_REC_PROGRESS; t <= PROTO_REC_LINKS; t++) {
    size_t n = strlen(schemas[t].tag);
    if (tag.n == n && memcmp(tag.p, schemas[t].tag, n) == 0)
      return t;
  }
  return PROTO_REC_NONE;
}

/* ---- value checks, shared by encoders and decoders --------------------- */

/* A run name, as a swarm name: 1..PROTO_RUN_MAX bytes of [A-Za-z0-9._-],
 * safe in a DHT name, a file name and a log line. */
bool proto__run_ok(const uint8_t *s, size_t n) {
  if (n == 0)
    return false;
  for (size_t i = 0; i < n; i++) {
    uint8_t c = s[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
          (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-'))
      return false;
  }
  return true;
}

/* Printable UTF-8: well formed (no overlong forms, surrogates or code
 * points past U+10FFFF) and free of control characters (C0, DEL, C1), so
 * a monitor can show a label as it is, without escapes or line breaks.
 * bee_printable does not fit here: it rewrites text for a log line,
 * ASCII only, where this judges text that keeps its non-ASCII letters. */
static bool text_ok(const uint8_t *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    uint32_t c = s[i], min;
    size_t len;
    if (c < 0x80) {
      if (c < 0x20 || c == 0x7f)
        return false;
      i++;
      continue;
    }
    if (c >= 0xc2 && c <= 0xdf)
      len = 2, c &= 0x1f, min = 0x80;
    else if (c >= 0xe0 && c <= 0xef)
      len = 3, c &= 0x0f, min = 0x800;
    else if (c >= 0xf0 && c <= 0xf4)
      len = 4, c &= 0x07, min = 0x10000;
    else
      return false; /* a continuation byte, 0xc0, 0xc1 or 0xf5..0xff */
    if (len > n - i)
      return false;
    for (size_t k = 1; k < len; k++) {
      if ((s[i + k] & 0xc0) != 0x80)
        return false;
      c = c << 6 | (s[i + k] & 0x3f);
    }
    if (c < min || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff) ||
        (c >= 0x80 && c <= 0x9f))
      return false;
    i += len;
  }
  return true;
}

/* Matchmaking group bits: '0' and '1' only, possibly none. */
bool proto__bits_ok(const uint8_t *s, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (s[i] != '0' && s[i] != '1')
      return false;
  return true;
}

/* An address to dial, "host:port": non-empty printable ASCII without
 * spaces.  Host names travel in their ASCII form (IDNs as punycode), so
 * nothing else is ever a valid address, and a peer cannot put control
 * characters into the logs of the nodes that dial it. */
bool proto__addr_ok(const uint8_t *s, size_t n) {
  if (n == 0)
    return false;
  for (size_t i = 0; i < n; i++)
    if (s[i] <= 0x20 || s[i] >= 0x7f)
      return false;
  return true;
}

static bool mode_ok(uint64_t mode) { return mode <= PROTO_MODE_AUX; }

/* What a float field takes: any finite value, finite and >= 0 (rates,
 * durations, squares, weights) or finite and > 0 (a bandwidth, which
 * matchmaking divides by).  NaN and infinities never: they compare false
 * with everything and would poison every average they enter. */
enum { F_ANY, F_NONNEG, F_POS };

static bool f64_ok(double v, int cls) {
  if (!isfinite(v))
    return false;
  switch (cls) {
  case F_NONNEG: return v >= 0;
  case F_POS: return v > 0;
  default: return true;
  }
}

/* Length of the C string s kept in an array of cap bytes, checked with ok:
 * BEE_ETOOBIG when the array holds no NUL (the string would be over its
 * limit of cap - 1 bytes), BEE_ERANGE when ok refuses it. */
int proto__str_check(const char *s, size_t cap,
                     bool (*ok)(const uint8_t *, size_t), size_t *n) {
  *n = strnlen(s, cap);
  if (*n == cap)
    return BEE_ETOOBIG;
  return ok((const uint8_t *)s, *n) ? 0 : BEE_ERANGE;
}

/* ---- reading ----------------------------------------------------------- */

/* Reads [tag, version, ...] of a value of the given type, leaving the
 * cursor at the first field and *extra at the number of fields after the
 * known ones.  Checks in the order proto__rd_head does: the tag (type)
 * first, then the version, then the field count. */
static int rd_head(proto_rd *r, const uint8_t *buf, size_t len, int type,
                   uint32_t *extra) {
  proto_bytes tag;
  uint32_t n;
  uint64_t v;
  int rc;
  if (len > PROTO_DHT_VALUE_MAX)
    return BEE_ETOOBIG; /* no DHT would carry it */
  proto__rd_init(r, buf, len);
  if ((rc = proto__rd_array(r, &n)))
    return rc;
  if (n < 1)
    return BEE_EMISSING;
  if ((rc = proto__rd_str(r, &tag, PROTO_DHT_VALUE_MAX)))
    return rc;
  if (tag_type(tag) != type)
    return BEE_EUNKNOWN;
  if (n < 2)
    return BEE_EMISSING;
  if ((rc = proto__rd_uint(r, &v)))
    return rc == BEE_ERANGE ? BEE_EVERSION : rc;
  if (v != PROTO_RECORD_VERSION)
    return BEE_EVERSION;
  if (n - 2 < schemas[type].nfields)
    return BEE_EMISSING;
  *extra = n - 2 - schemas[type].nfields;
  return 0;
}

/* Skips the fields of later versions; then the value must end. */
static int rd_tail(proto_rd *r, uint32_t extra) {
  for (; extra > 0; extra--) {
    int rc = proto__rd_skip(r, SKIP_DEPTH);
    if (rc)
      return rc;
  }
  return proto__rd_end(r);
}

/* Reads a str of at most max bytes that ok accepts into out (max + 1
 * bytes), NUL-terminated.  None of the strings may hold a NUL: each
 * predicate refuses it. */
int proto__rd_cstr(proto_rd *r, char *out, size_t max,
                   bool (*ok)(const uint8_t *, size_t)) {
  proto_bytes b;
  int rc = proto__rd_str(r, &b, max);
  if (rc)
    return rc;
  if (!ok(b.p, b.n))
    return BEE_ERANGE;
  memcpy(out, b.p, b.n);
  out[b.n] = 0;
  return 0;
}

static int rd_run(proto_rd *r, char out[PROTO_RUN_MAX + 1]) {
  return proto__rd_cstr(r, out, PROTO_RUN_MAX, proto__run_ok);
}

static int rd_addr(proto_rd *r, char out[PROTO_ADDR_MAX]) {
  return proto__rd_cstr(r, out, PROTO_ADDR_MAX - 1, proto__addr_ok);
}

int proto__rd_uint_max(proto_rd *r, uint64_t max, uint64_t *v) {
  int rc = proto__rd_uint(r, v);
  if (rc)
    return rc;
  return *v > max ? BEE_ERANGE : 0;
}

int proto__rd_mode(proto_rd *r, int *mode) {
  uint64_t v;
  int rc = proto__rd_uint_max(r, PROTO_MODE_AUX, &v);
  if (rc == 0)
    *mode = (int)v;
  return rc;
}

static int rd_float(proto_rd *r, int cls, double *v) {
  int rc = proto__rd_f64(r, v);
  if (rc)
    return rc;
  return f64_ok(*v, cls) ? 0 : BEE_ERANGE;
}

/* The loss is nil while unknown (before the first step ends). */
static int rd_loss(proto_rd *r, proto_metrics *m) {
  int rc = proto__rd_nil(r);
  if (rc != 0)
    return rc < 0 ? rc : 0;
  m->has_loss = true;
  return rd_float(r, F_ANY, &m->loss);
}

/* ---- writing ----------------------------------------------------------- */

static void wr_head(proto_wr *w, int type, uint32_t more) {
  proto__wr_array(w, 2 + schemas[type].nfields + more);
  proto__wr_str(w, schemas[type].tag, strlen(schemas[type].tag));
  proto__wr_uint(w, PROTO_RECORD_VERSION);
}

static int wr_done(const proto_wr *w, size_t *len) {
  if (w->err)
    return w->err;
  *len = w->len;
  return 0;
}

/* ---- progress ---------------------------------------------------------- */

int proto_progress_encode(const proto_progress *p, uint8_t *buf, size_t cap,
                          size_t *len) {
  size_t run_n, label_n;
  proto_wr w;
  int rc;
  if ((rc = proto__str_check(p->run, sizeof p->run, proto__run_ok, &run_n)))
    return rc;
  if (!f64_ok(p->samples_per_second, F_NONNEG) || p->mode < 0 ||
      !mode_ok((uint64_t)p->mode))
    return BEE_ERANGE;
  if ((rc = proto__str_check(p->label, sizeof p->label, text_ok, &label_n)))
    return rc;
  proto__wr_init(&w, buf, cap);
  wr_head(&w, PROTO_REC_PROGRESS, p->leaving ? 1 : 0);
  proto__wr_str(&w, p->run, run_n);
  proto__wr_uint(&w, p->epoch);
  proto__wr_uint(&w, p->samples);
  proto__wr_f64(&w, p->samples_per_second);
  proto__wr_uint(&w, p->time_ms);
  proto__wr_uint(&w, (uint64_t)p->mode);
  proto__wr_str(&w, p->label, label_n);
  if (p->leaving) /* an eighth field, written only when true */
    proto__wr_bool(&w, true);
  return wr_done(&w, len);
}

int proto_progress_decode(const uint8_t *buf, size_t len, proto_progress *out) {
  proto_rd r;
  uint32_t extra;
  int rc;
  memset(out, 0, sizeof *out);
  if ((rc = rd_head(&r, buf, len, PROTO_REC_PROGRESS, &extra)) ||
      (rc = rd_run(&r, out->run)) || (rc = proto__rd_uint(&r, &out->epoch)) ||
      (rc = proto__rd_uint(&r, &out->samples)) ||
      (rc = rd_float(&r, F_NONNEG, &out->samples_per_second)) ||
      (rc = proto__rd_uint(&r, &out->time_ms)) ||
      (rc = proto__rd_mode(&r, &out->mode)) ||
      (rc = proto__rd_cstr(&r, out->label, PROTO_LABEL_MAX, text_ok)))
    goto fail;
  /* An eighth field that is a bool says whether the peer is leaving;
   * anything else there is a later version's field, skipped as such. */
  if (extra) {
    rc = proto__rd_bool(&r, &out->leaving);
    if (rc == 0)
      extra--;
    else if (rc != BEE_ETYPE)
      goto fail;
  }
  if ((rc = rd_tail(&r, extra)) == 0)
    return 0;
fail:
  memset(out, 0, sizeof *out);
  return rc;
}

/* ---- metrics ----------------------------------------------------------- */

static int metrics_check(const proto_metrics *m, size_t *run_n) {
  int rc = proto__str_check(m->run, sizeof m->run, proto__run_ok, run_n);
  if (rc)
    return rc;
  if ((m->has_loss && !f64_ok(m->loss, F_ANY)) ||
      !f64_ok(m->samples_per_second, F_NONNEG) ||
      !f64_ok(m->compute_s, F_NONNEG) || !f64_ok(m->averaging_s, F_NONNEG) ||
      m->group_size > PROTO_GROUP_MAX || !f64_ok(m->grad_sq_local, F_NONNEG) ||
      !f64_ok(m->grad_sq_avg, F_NONNEG) ||
      (m->has_by_all && !(m->by_all >= 0 && m->by_all <= 1)) ||
      ((m->diverged || m->has_params) && !m->has_by_all) ||
      m->nlines > PROTO_METRICS_LINES_MAX ||
      ((m->nlines || m->has_loss_scale) && !m->has_params) ||
      (m->has_loss_scale && !f64_ok(m->loss_scale, F_POS)))
    return BEE_ERANGE;
  for (size_t i = 0; i < m->nlines; i++)
    if (m->lines[i].step >= m->step || m->lines[i].group_size < 2 ||
        m->lines[i].group_size > PROTO_GROUP_MAX)
      return BEE_ERANGE;
  return 0;
}

int proto_metrics_encode(const proto_metrics *m, uint8_t *buf, size_t cap,
                         size_t *len) {
  size_t run_n;
  proto_wr w;
  int rc = metrics_check(m, &run_n);
  if (rc)
    return rc;
  proto__wr_init(&w, buf, cap);
  wr_head(&w, PROTO_REC_METRICS,
          (m->has_by_all ? 1u : 0u) +
              (m->diverged || m->has_params ? 1u : 0u) +
              (m->has_params ? 1u : 0u) +
              (m->nlines || m->has_loss_scale ? 1u : 0u) +
              (m->has_loss_scale ? 2u : 0u));
  proto__wr_str(&w, m->run, run_n);
  proto__wr_uint(&w, m->step);
  if (m->has_loss)
    proto__wr_f64(&w, m->loss);
  else
    proto__wr_nil(&w);
  proto__wr_f64(&w, m->samples_per_second);
  proto__wr_f64(&w, m->compute_s);
  proto__wr_f64(&w, m->averaging_s);
  proto__wr_uint(&w, m->bytes_sent);
  proto__wr_uint(&w, m->bytes_received);
  proto__wr_uint(&w, m->group_size);
  proto__wr_f64(&w, m->grad_sq_local);
  proto__wr_uint(&w, m->batch_local);
  proto__wr_f64(&w, m->grad_sq_avg);
  proto__wr_uint(&w, m->batch_avg);
  proto__wr_uint(&w, m->time_ms);
  if (m->has_by_all) /* a fifteenth field, written when known */
    proto__wr_f64(&w, m->by_all);
  if (m->diverged || m->has_params) /* a sixteenth: when true, or when */
    proto__wr_bool(&w, m->diverged); /* a seventeenth follows */
  if (m->has_params)
    proto__wr_bin(&w, m->params, sizeof m->params);
  if (m->nlines || m->has_loss_scale) { /* an eighteenth: [[step, group,
                                            hash], ...] */
    proto__wr_array(&w, (uint32_t)m->nlines);
    for (size_t i = 0; i < m->nlines; i++) {
      proto__wr_array(&w, 3);
      proto__wr_uint(&w, m->lines[i].step);
      proto__wr_uint(&w, m->lines[i].group_size);
      proto__wr_bin(&w, m->lines[i].params, sizeof m->lines[i].params);
    }
  }
  if (m->has_loss_scale) { /* a nineteenth and a twentieth */
    proto__wr_f64(&w, m->loss_scale);
    proto__wr_uint(&w, m->dropped);
  }
  return wr_done(&w, len);
}

int proto_metrics_decode(const uint8_t *buf, size_t len, proto_metrics *out) {
  proto_rd r;
  uint32_t extra;
  int rc;
  memset(out, 0, sizeof *out);
  if ((rc = rd_head(&r, buf, len, PROTO_REC_METRICS, &extra)) ||
      (rc = rd_run(&r, out->run)) || (rc = proto__rd_uint(&r, &out->step)) ||
      (rc = rd_loss(&r, out)) ||
      (rc = rd_float(&r, F_NONNEG, &out->samples_per_second)) ||
      (rc = rd_float(&r, F_NONNEG, &out->compute_s)) ||
      (rc = rd_float(&r, F_NONNEG, &out->averaging_s)) ||
      (rc = proto__rd_uint(&r, &out->bytes_sent)) ||
      (rc = proto__rd_uint(&r, &out->bytes_received)) ||
      (rc = proto__rd_uint_max(&r, PROTO_GROUP_MAX, &out->group_size)) ||
      (rc = rd_float(&r, F_NONNEG, &out->grad_sq_local)) ||
      (rc = proto__rd_uint(&r, &out->batch_local)) ||
      (rc = rd_float(&r, F_NONNEG, &out->grad_sq_avg)) ||
      (rc = proto__rd_uint(&r, &out->batch_avg)) ||
      (rc = proto__rd_uint(&r, &out->time_ms)))
    goto fail;
  /* A fifteenth field that is a float is the share the round averaged, in
   * [0, 1]; anything else there is a later version's field, skipped. */
  if (extra) {
    rc = proto__rd_f64(&r, &out->by_all);
    if (rc == 0 && !(out->by_all >= 0 && out->by_all <= 1))
      rc = BEE_ERANGE;
    if (rc == 0) {
      out->has_by_all = true;
      extra--;
    } else if (rc != BEE_ETYPE) {
      goto fail;
    }
  }
  /* After by_all, a sixteenth field that is a bool says whether the
   * peer's parameters left its swarm's. */
  bool sixteenth = false;
  if (extra && out->has_by_all) {
    rc = proto__rd_bool(&r, &out->diverged);
    if (rc == 0)
      extra--, sixteenth = true;
    else if (rc != BEE_ETYPE)
      goto fail;
  }
  /* After diverged, a seventeenth that is a bin is the parameters' hash
   * (of its size exactly). */
  if (extra && sixteenth) {
    rc = proto__rd_fixbin(&r, out->params, sizeof out->params);
    if (rc == 0)
      extra--, out->has_params = true;
    else if (rc != BEE_ETYPE)
      goto fail;
  }
  /* After the hash, an eighteenth that is an array holds the peer's
   * earlier averaged steps: up to PROTO_METRICS_LINES_MAX of [step below
   * this one, group of 2..PROTO_GROUP_MAX, hash]. */
  bool eighteenth = false;
  if (extra && out->has_params) {
    uint32_t n;
    rc = proto__rd_array(&r, &n);
    if (rc == 0) {
      if (n > PROTO_METRICS_LINES_MAX) {
        rc = BEE_ERANGE;
        goto fail;
      }
      for (uint32_t i = 0; i < n; i++) {
        proto_metrics_line *l = &out->lines[i];
        uint32_t k;
        if ((rc = proto__rd_array(&r, &k)))
          goto fail;
        if (k != 3) {
          rc = BEE_ETYPE;
          goto fail;
        }
        if ((rc = proto__rd_uint(&r, &l->step)) ||
            (rc = proto__rd_uint_max(&r, PROTO_GROUP_MAX, &l->group_size)) ||
            (rc = proto__rd_fixbin(&r, l->params, sizeof l->params)))
          goto fail;
        if (l->step >= out->step || l->group_size < 2) {
          rc = BEE_ERANGE;
          goto fail;
        }
      }
      out->nlines = n;
      extra--, eighteenth = true;
    } else if (rc != BEE_ETYPE) {
      goto fail;
    }
  }
  /* After lines (written, empty or not, when these follow), a nineteenth
   * that is a float is the peer's loss scale (> 0), and after it a
   * twentieth that is a uint the batches it dropped in the step: the two
   * come together (a scale alone would re-encode longer than it came). */
  if (extra && eighteenth) {
    rc = rd_float(&r, F_POS, &out->loss_scale);
    if (rc == 0 && extra == 1)
      rc = BEE_EMISSING;
    if (rc == 0)
      extra--, out->has_loss_scale = true;
    else if (rc != BEE_ETYPE)
      goto fail;
  }
  if (extra && out->has_loss_scale) {
    rc = proto__rd_uint(&r, &out->dropped);
    if (rc == 0)
      extra--;
    else if (rc != BEE_ETYPE)
      goto fail;
  }
  if ((rc = rd_tail(&r, extra)) == 0)
    return 0;
fail:
  memset(out, 0, sizeof *out);
  return rc;
}

/* ---- matchmaking ------------------------------------------------------- */

static int match_check(const proto_match *m, size_t *run_n, size_t *bits_n,
                       size_t *addr_n) {
  int rc;
  if ((rc = proto__str_check(m->run, sizeof m->run, proto__run_ok, run_n)) ||
      (rc =
           proto__str_check(m->bits, sizeof m->bits, proto__bits_ok, bits_n)) ||
      (rc = proto__str_check(m->addr, sizeof m->addr, proto__addr_ok, addr_n)))
    return rc;
  if (m->mode < 0 || !mode_ok((uint64_t)m->mode) ||
      !f64_ok(m->bandwidth_mbit, F_POS) || !f64_ok(m->weight, F_NONNEG))
    return BEE_ERANGE;
  return 0;
}

int proto_match_encode(const proto_match *m, uint8_t *buf, size_t cap,
                       size_t *len) {
  size_t run_n, bits_n, addr_n;
  proto_wr w;
  int rc = match_check(m, &run_n, &bits_n, &addr_n);
  if (rc)
    return rc;
  proto__wr_init(&w, buf, cap);
  wr_head(&w, PROTO_REC_MATCH, 0);
  proto__wr_str(&w, m->run, run_n);
  proto__wr_uint(&w, m->round);
  proto__wr_str(&w, m->bits, bits_n);
  proto__wr_str(&w, m->addr, addr_n);
  proto__wr_bin(&w, m->schema_hash, PROTO_SCHEMA_HASH_BYTES);
  proto__wr_uint(&w, (uint64_t)m->mode);
  proto__wr_f64(&w, m->bandwidth_mbit);
  proto__wr_f64(&w, m->weight);
  return wr_done(&w, len);
}

int proto_match_decode(const uint8_t *buf, size_t len, proto_match *out) {
  proto_rd r;
  uint32_t extra;
  int rc;
  memset(out, 0, sizeof *out);
  if ((rc = rd_head(&r, buf, len, PROTO_REC_MATCH, &extra)) ||
      (rc = rd_run(&r, out->run)) || (rc = proto__rd_uint(&r, &out->round)) ||
      (rc = proto__rd_cstr(&r, out->bits, PROTO_BITS_MAX, proto__bits_ok)) ||
      (rc = rd_addr(&r, out->addr)) ||
      (rc = proto__rd_fixbin(&r, out->schema_hash, PROTO_SCHEMA_HASH_BYTES)) ||
      (rc = proto__rd_mode(&r, &out->mode)) ||
      (rc = rd_float(&r, F_POS, &out->bandwidth_mbit)) ||
      (rc = rd_float(&r, F_NONNEG, &out->weight)) || (rc = rd_tail(&r, extra)))
    memset(out, 0, sizeof *out);
  return rc;
}

/* ---- state donors ------------------------------------------------------ */

int proto_donor_encode(const proto_donor *d, uint8_t *buf, size_t cap,
                       size_t *len) {
  size_t run_n, addr_n;
  proto_wr w;
  int rc;
  if ((rc = proto__str_check(d->run, sizeof d->run, proto__run_ok, &run_n)) ||
      (rc = proto__str_check(d->addr, sizeof d->addr, proto__addr_ok, &addr_n)))
    return rc;
  if (d->slots > PROTO_DONOR_SLOTS_MAX)
    return BEE_ERANGE;
  proto__wr_init(&w, buf, cap);
  wr_head(&w, PROTO_REC_DONOR, 0);
  proto__wr_str(&w, d->run, run_n);
  proto__wr_str(&w, d->addr, addr_n);
  proto__wr_uint(&w, d->epoch);
  proto__wr_uint(&w, d->slots);
  return wr_done(&w, len);
}

int proto_donor_decode(const uint8_t *buf, size_t len, proto_donor *out) {
  proto_rd r;
  uint32_t extra;
  int rc;
  memset(out, 0, sizeof *out);
  if ((rc = rd_head(&r, buf, len, PROTO_REC_DONOR, &extra)) ||
      (rc = rd_run(&r, out->run)) || (rc = rd_addr(&r, out->addr)) ||
      (rc = proto__rd_uint(&r, &out->epoch)) ||
      (rc = proto__rd_uint_max(&r, PROTO_DONOR_SLOTS_MAX, &out->slots)) ||
      (rc = rd_tail(&r, extra)))
    memset(out, 0, sizeof *out);
  return rc;
}

/* ---- links ------------------------------------------------------------- */

static bool link_ok(const proto_link *l) {
  return l->rtt_us <= PROTO_LINK_RTT_MAX_US && isfinite(l->mbit) &&
         l->mbit >= 0 && l->mbit <= PROTO_LINK_MBIT_MAX &&
         l->age_s <= PROTO_LINK_AGE_MAX_S;
}

/* Whether entry i names a peer an earlier entry names. */
static bool link_repeats(const proto_link *v, size_t i) {
  for (size_t k = 0; k < i; k++)
    if (memcmp(v[k].id, v[i].id, PROTO_ID_BYTES) == 0)
      return true;
  return false;
}

int proto_links_encode(const proto_links *l, uint8_t *buf, size_t cap,
                       size_t *len) {
  size_t run_n;
  proto_wr w;
  int rc;
  if ((rc = proto__str_check(l->run, sizeof l->run, proto__run_ok, &run_n)))
    return rc;
  if (l->n > PROTO_LINKS_MAX)
    return BEE_ERANGE;
  for (size_t i = 0; i < l->n; i++)
    if (!link_ok(&l->links[i]) || link_repeats(l->links, i))
      return BEE_ERANGE;
  proto__wr_init(&w, buf, cap);
  wr_head(&w, PROTO_REC_LINKS, 0);
  proto__wr_str(&w, l->run, run_n);
  proto__wr_uint(&w, l->time_ms);
  proto__wr_array(&w, (uint32_t)l->n);
  for (size_t i = 0; i < l->n; i++) {
    const proto_link *e = &l->links[i];
    proto__wr_array(&w, 4);
    proto__wr_bin(&w, e->id, PROTO_ID_BYTES);
    proto__wr_uint(&w, e->rtt_us);
    proto__wr_f64(&w, e->mbit);
    proto__wr_uint(&w, e->age_s);
  }
  return wr_done(&w, len);
}

/* One entry: [id, rtt_us, mbit, age_s, later fields...]. */
static int rd_link(proto_rd *r, proto_link *e) {
  uint32_t k;
  int rc;
  if ((rc = proto__rd_array(r, &k)))
    return rc;
  if (k < 4)
    return BEE_EMISSING;
  if ((rc = proto__rd_fixbin(r, e->id, PROTO_ID_BYTES)) ||
      (rc = proto__rd_uint_max(r, PROTO_LINK_RTT_MAX_US, &e->rtt_us)) ||
      (rc = rd_float(r, F_NONNEG, &e->mbit)) ||
      (rc = proto__rd_uint_max(r, PROTO_LINK_AGE_MAX_S, &e->age_s)))
    return rc;
  if (e->mbit > PROTO_LINK_MBIT_MAX)
    return BEE_ERANGE;
  for (k -= 4; k > 0; k--)
    if ((rc = proto__rd_skip(r,
                             SKIP_DEPTH - 2))) /* in the list, in the record */
      return rc;
  return 0;
}

int proto_links_decode(const uint8_t *buf, size_t len, proto_links *out) {
  proto_rd r;
  uint32_t extra, n;
  int rc;
  memset(out, 0, sizeof *out);
  if ((rc = rd_head(&r, buf, len, PROTO_REC_LINKS, &extra)) ||
      (rc = rd_run(&r, out->run)) || (rc = proto__rd_uint(&r, &out->time_ms)) ||
      (rc = proto__rd_array(&r, &n)))
    goto fail;
  if (n > PROTO_LINKS_MAX) {
    rc = BEE_ERANGE;
    goto fail;
  }
  for (uint32_t i = 0; i < n; i++) {
    if ((rc = rd_link(&r, &out->links[i])))
      goto fail;
    if (link_repeats(out->links, i)) {
      rc = BEE_ERANGE;
      goto fail;
    }
  }
  out->n = n;
  if ((rc = rd_tail(&r, extra)))
    goto fail;
  return 0;
fail:
  memset(out, 0, sizeof *out);
  return rc;
}

/* ---- keys -------------------------------------------------------------- */

/* BLAKE2b-160 of the domain followed by the concatenated parts: the key of
 * the name they spell, hashed in pieces so no name is ever cut short. */
static void key_of(const char *const *parts, size_t n,
                   uint8_t key[PROTO_DHT_KEY_BYTES]) {
  crypto_generichash_state st;
  crypto_generichash_init(&st, NULL, 0, PROTO_DHT_KEY_BYTES);
  crypto_generichash_update(&st, (const uint8_t *)KEY_DOMAIN,
                            sizeof KEY_DOMAIN - 1);
  for (size_t i = 0; i < n; i++)
    crypto_generichash_update(&st, (const uint8_t *)parts[i], strlen(parts[i]));
  crypto_generichash_final(&st, key, PROTO_DHT_KEY_BYTES);
}

void proto_dht_key(const char *name, uint8_t key[PROTO_DHT_KEY_BYTES]) {
  key_of(&name, 1, key);
}

/* An unknown type is our own bug: asserted, and an all-zero key in a build
 * without asserts (no record derives to it). */
void proto_record_key(int type, const char *run, uint64_t round,
                      const char *bits, uint8_t key[PROTO_DHT_KEY_BYTES]) {
  char num[24];
  switch (type) {
  case PROTO_REC_PROGRESS:
    key_of((const char *const[]){run, "_progress"}, 2, key);
    return;
  case PROTO_REC_METRICS:
    key_of((const char *const[]){run, "_metrics"}, 2, key);
    return;
  case PROTO_REC_MATCH:
    snprintf(num, sizeof num, "%" PRIu64, round);
    key_of((const char *const[]){run, ".avg.", num, ".", bits ? bits : ""}, 5,
           key);
    return;
  case PROTO_REC_DONOR:
    key_of((const char *const[]){run, "_donors"}, 2, key);
    return;
  case PROTO_REC_LINKS:
    key_of((const char *const[]){run, "_links"}, 2, key);
    return;
  default: assert(!"not a typed record"); memset(key, 0, PROTO_DHT_KEY_BYTES);
  }
}

/* ---- the DHT's schema check -------------------------------------------- */

/* The type a value names: PROTO_REC_NONE unless it starts as a typed
 * record does, with the header of a non-empty array and a str tag of a
 * known type.  The array's count is not held against the bytes that
 * follow: a value that names a type is judged as one, so a cut or
 * oversized header is refused by the decoder instead of passing as a
 * plain value. */
static int value_type(proto_bytes v) {
  proto_rd r;
  proto_bytes tag;
  uint8_t t;
  size_t hdr;
  uint64_t count;
  if (v.n == 0)
    return PROTO_REC_NONE; /* (and v.p may be NULL) */
  t = v.p[0];
  if (t >= 0x90 && t <= 0x9f) {
    hdr = 1;
    count = t & 0x0f;
  } else if (t == 0xdc && v.n >= 3) {
    hdr = 3;
    count = (uint64_t)v.p[1] << 8 | v.p[2];
  } else if (t == 0xdd && v.n >= 5) {
    hdr = 5;
    count = proto__get_u32(v.p + 1);
  } else {
    return PROTO_REC_NONE;
  }
  if (count == 0)
    return PROTO_REC_NONE;
  proto__rd_init(&r, v.p + hdr, v.n - hdr);
  if (proto__rd_str(&r, &tag, PROTO_DHT_VALUE_MAX))
    return PROTO_REC_NONE;
  return tag_type(tag);
}

int proto_record_check(const proto_dht_record *r, int *type) {
  union {
    proto_progress progress;
    proto_metrics metrics;
    proto_match match;
    proto_donor donor;
    proto_links links;
  } u;
  uint8_t want[PROTO_DHT_KEY_BYTES];
  const char *run, *bits = NULL;
  uint64_t round = 0;
  int rc;
  /* A plain value put by hand, or another tag, in the "bee." namespace or
   * not: nothing this version can judge.  A newer peer's type must still
   * spread through older nodes. */
  if ((*type = value_type(r->value)) == PROTO_REC_NONE)
    return 0;
  switch (*type) {
  case PROTO_REC_PROGRESS:
    rc = proto_progress_decode(r->value.p, r->value.n, &u.progress);
    run = u.progress.run;
    break;
  case PROTO_REC_METRICS:
    rc = proto_metrics_decode(r->value.p, r->value.n, &u.metrics);
    run = u.metrics.run;
    break;
  case PROTO_REC_MATCH:
    rc = proto_match_decode(r->value.p, r->value.n, &u.match);
    run = u.match.run;
    round = u.match.round;
    bits = u.match.bits;
    break;
  case PROTO_REC_LINKS:
    rc = proto_links_decode(r->value.p, r->value.n, &u.links);
    run = u.links.run;
    break;
  default:
    rc = proto_donor_decode(r->value.p, r->value.n, &u.donor);
    run = u.donor.run;
    break;
  }
  if (rc)
    return rc;
  /* Signed by its publisher (the DHT verifies the signature itself). */
  if (!proto_dht_subkey_owner(r->subkey, NULL))
    return BEE_EAUTH;
  proto_record_key(*type, run, round, bits, want);
  return memcmp(want, r->key, PROTO_DHT_KEY_BYTES) == 0 ? 0 : BEE_EAUTH;
}

/* ---- the swarm view ------------------------------------------------------ */

/* A peer's samples now: its record's count, plus its rate over the time
 * since it wrote the record, for at most PROTO_PROGRESS_EXTRAP_S: a peer
 * that trains publishes every second or so, so an older record is a peer
 * that stopped (averaging, or gone), and a clock far off must not make
 * up an epoch. */
static uint64_t samples_now(const proto_progress *p, uint64_t now_ms) {
  if (now_ms <= p->time_ms)
    return p->samples;
  double age = (double)(now_ms - p->time_ms) / 1000;
  if (age > PROTO_PROGRESS_EXTRAP_S)
    age = PROTO_PROGRESS_EXTRAP_S;
  double more = p->samples_per_second * age;
  if (more >= (double)(UINT64_MAX - p->samples))
    return UINT64_MAX;
  return p->samples + (uint64_t)more;
}

void proto_swarm_view_compute(const proto_progress *v, size_t n,
                              const char *run, uint64_t target,
                              uint64_t now_ms, proto_swarm_view *out) {
  memset(out, 0, sizeof *out);
  out->eta_s = -1;
  bool any_node = false;
  uint64_t top_all = 0, top_nodes = 0;
  for (size_t i = 0; i < n; i++) {
    const proto_progress *p = &v[i];
    if (strcmp(p->run, run) != 0 || p->leaving)
      continue;
    out->peers++;
    out->samples_per_second += p->samples_per_second;
    if (p->epoch > top_all)
      top_all = p->epoch;
    if (p->mode != PROTO_MODE_CLIENT) {
      if (!any_node || p->epoch > top_nodes)
        top_nodes = p->epoch;
      any_node = true;
    }
  }
  out->epoch = any_node ? top_nodes : top_all;
  for (size_t i = 0; i < n; i++) {
    const proto_progress *p = &v[i];
    if (strcmp(p->run, run) != 0 || p->leaving || p->epoch != out->epoch)
      continue;
    out->peers_at_epoch++;
    out->rate_at_epoch += p->samples_per_second;
    /* Saturating: a forged record cannot wrap the sum around. */
    uint64_t k = samples_now(p, now_ms);
    out->samples = k > UINT64_MAX - out->samples ? UINT64_MAX
                                                 : out->samples + k;
  }
  if (out->samples >= target) {
    out->target_reached = true;
    out->eta_s = 0;
  } else if (out->samples_per_second > 0) {
    out->eta_s = (double)(target - out->samples) / out->samples_per_second;
  }
}
