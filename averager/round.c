/* round.c: the butterfly all-reduce of one group, as a socket-free core.
 *
 * Every member plays up to three roles at once, each a small state
 * machine over the parts of the buffer:
 *   sender    to each other owner, its piece of that owner's span, part by
 *             part, at most `window` parts ahead of the results back
 *             (mem.sent, .base, .mask, the encode slot .enc);
 *   owner     of its own span: per sender a ring of `window` slots for the
 *             parts that arrived; the head part is reduced, in member
 *             order, once every sender still in the round has sent it;
 *             the results wait in a ring of `window` messages until every
 *             receiver's transport took them (head, ring, mem.rsent);
 *   receiver  of every other span: results are decoded into the buffer
 *             behind a backup of what was there, and the span is committed
 *             (the backup dropped) when its last part is in, or put back
 *             from the backup when it fails (mem.span, .backup).
 * The window is the whole flow control: a sender sends part k to an owner
 * only after the result of part k - window came back, and an owner takes
 * nothing beyond head + window; so an owner holds at most window parts per
 * sender, and a receiver whose link is slow holds back the head, hence
 * the results waiting for it, to window as well.  Memory is bounded by the
 * config whatever the peers do; the largest item is the backups, up to one
 * float per float of the buffer, for the spans whose results are arriving.
 *
 * Arithmetic runs in jobs (avg_job): ENCODE (our part for one owner,
 * error feedback included), REDUCE (the owner's mean of the head part,
 * the clip rule, the encoding of the result and its adoption into our own
 * buffer) and DECODE (a result into the buffer, behind its backup).  A job
 * reads and writes only buffers the loop thread leaves alone while it is
 * out, so the caller may run it on a worker (avg_io.submit).
 *
 * Failures end in drops: a member is dropped when it stops sending
 * (sender_timeout_ms), stops answering (reducer_timeout_ms), cannot be
 * sent to, sends a result that does not decode, or says ABORT; a member
 * of a group formed ahead that has not begun yet says WAIT now and then,
 * and its timeouts start again.  A dropped
 * member is out for the rest of the round, both ways: its contributions
 * are no longer waited for nor used, its span is put back, and it gets an
 * ABORT so that it drops us at once too.  At the deadline every open span
 * is put back and the round ends.
 */
#include "averager-int.h"

#include <assert.h>
#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HDR PROTO_AVG_HDR_MAX /* room left before the data of a message */

enum { SLOT_EMPTY, SLOT_DATA, SLOT_NONE }; /* NONE: nil, weight 0, refused */
enum { SPAN_OPEN, SPAN_DONE, SPAN_FAILED, SPAN_NA };
enum { ENC_IDLE, ENC_BUSY, ENC_READY };
enum { JOB_ENCODE, JOB_REDUCE, JOB_DECODE };
enum { SRC_NONE, SRC_OWN, SRC_DATA };

struct avg_job {
  avg_round *r;
  int kind;
  size_t member;   /* ENCODE: the owner; DECODE: the owner; REDUCE: self */
  uint64_t k;      /* part within that member's span */
  size_t off, len; /* floats of the buffer */
  int rc;
  /* ENCODE: writes at out + HDR.  DECODE: reads data. */
  uint8_t *out;
  size_t out_len;
  const uint8_t *data;
  size_t data_len;
  uint8_t *copy; /* DECODE on a worker: our copy of data */
  float *backup; /* DECODE and REDUCE: where x's old values go */
};

/* A part that arrived at its owner. */
typedef struct slot {
  int state;
  float weight;
  uint8_t *buf; /* our copy of the data */
  size_t len;
} slot;

/* A result, encoded once for every receiver. */
typedef struct result {
  uint8_t *buf; /* HDR + the largest encoded part */
  const uint8_t *msg;
  size_t len, payload;
} result;

/* Everything we know of one member, ourselves included. */
typedef struct mem {
  avg_mode mode;
  size_t start, len;      /* its span, floats */
  uint64_t part0, nparts; /* its parts' numbers */
  int dropped;
  uint64_t dropped_ms;
  uint32_t refused, clipped;
  double weight; /* the weight its last part to our span carried */
  bool warned; /* its first refusal or clip was logged */
  /* Its span as we receive it (ours: as we reduce it). */
  int span;
  unsigned jobs; /* jobs writing into the span */
  uint64_t done; /* parts in */
  float *backup; /* (len) the span's old values */
  /* The link. */
  bool blocked;
  uint64_t blocked_ms, progress_ms;
  /* Our parts of its span: sent, results back below base + mask. */
  uint64_t sent, base, mask;
  int enc;
  uint8_t *encbuf;
  const uint8_t *encmsg;
  size_t enclen, encpayload;
  avg_job encjob;
  /* Our results to it. */
  uint64_t rsent;
  /* Its parts of our span. */
  slot *slots; /* (window) ring, by part % window */
  uint64_t last_part_ms;
  uint64_t waited; /* its WAITs: not begun yet, coming */
} mem;

struct avg_round {
  avg_round_config cfg;
  avg_io io;
  size_t N, self;
  /* W: parts we send ahead of the results back from an owner (our own
   * window); Wo: parts we take from a sender ahead of our head, the
   * protocol's AVG_WINDOW_MAX whatever our W, since each member sizes its
   * W from its own links and a sender's may be larger than ours. */
  size_t W, Wo;
  mem *m;
  avg_mode *modes;
  uint64_t nparts;
  uint32_t *part_k;
  uint8_t *written; /* (nparts) the part is in x, its old values in backup */
  char gname[9];
  /* Life. */
  bool started, starting, ended, completed, free_pending, busy, again;
  int depth;
  unsigned jobs;
  int status;
  uint64_t start_ms, end_at;
  avg_round_cb cb;
  void *arg;
  size_t rr; /* where the next pump starts */
  /* Owner. */
  uint64_t head, head_since, rbase;
  bool reducing;
  avg_job rjob;
  int *src;       /* (N) what REDUCE takes from each member */
  int *verdict;   /* (N) its verdict: 0 or why refused */
  double *norm;   /* (N) contribution norms (clip) */
  double *sorted; /* (N) */
  float *factor;  /* (N) clip factors */
  uint32_t contributors;
  float *sum, *tmp; /* (part_floats) */
  result *ring;     /* (window) */
  /* Counters and the summary. */
  uint64_t msgs_sent, msgs_recv, payload_sent, payload_recv, bytes_sent,
      bytes_recv;
  avg_span_info *spans;
  avg_member_info *info;
  size_t *by_k;
};

/* ---- small things ------------------------------------------------------ */

static uint64_t now(const avg_round *r) { return r->io.now_ms(r->io.ctx); }

static const char *who(const avg_round *r, size_t j, char *buf, size_t cap) {
  const char *n = r->io.name ? r->io.name(r->io.ctx, j) : NULL;
  if (n)
    snprintf(buf, cap, "member %zu (%s)", j, n);
  else
    snprintf(buf, cap, "member %zu", j);
  return buf;
}
#define WHO(j) who(r, (j), namebuf, sizeof namebuf)

const char *avg_drop_name(int reason) {
  static const char *const names[] = {
      [AVG_DROP_NONE] = "none",
      [AVG_DROP_SENDER_TIMEOUT] = "sender timeout",
      [AVG_DROP_REDUCER_TIMEOUT] = "reducer timeout",
      [AVG_DROP_STALLED] = "sends stalled",
      [AVG_DROP_SEND_FAILED] = "send failed",
      [AVG_DROP_BAD_RESULT] = "bad result",
      [AVG_DROP_ABORTED] = "aborted",
      [AVG_DROP_CLOSED] = "connection closed",
  };
  return reason >= 0 && reason <= AVG_DROP_CLOSED ? names[reason] : "?";
}

/* Members that send data and get results: all but AUX. */
static bool has_data(const avg_round *r, size_t j) {
  return r->m[j].mode != AVG_MODE_AUX;
}

static size_t part_len(const avg_round *r, size_t j, uint64_t k) {
  size_t pf = r->cfg.part_floats, at = (size_t)k * pf;
  return r->m[j].len - at < pf ? r->m[j].len - at : pf;
}

static size_t part_off(const avg_round *r, size_t j, uint64_t k) {
  return r->m[j].start + (size_t)k * r->cfg.part_floats;
}

static float own_weight(const avg_round *r) {
  return has_data(r, r->self) ? (float)r->cfg.weight : 0.0f;
}

/* Allocation in the middle of a round: a failure ends it with -ENOMEM. */
static void end_round(avg_round *r, int status);
static void *grab(avg_round *r, size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) {
    bee_err("avg", "group %s: out of memory (%zu bytes)", r->gname, n);
    end_round(r, -ENOMEM);
  }
  return p;
}

/* ---- sending ----------------------------------------------------------- */

static void drop(avg_round *r, size_t j, int reason, const char *why);

/* Sends msg to j.  0: taken; BEE_EQUEUE: j is blocked; else j dropped. */
static int send_msg(avg_round *r, size_t j, const uint8_t *msg, size_t len,
                    size_t payload) {
  mem *d = &r->m[j];
  int rc = r->io.send(r->io.ctx, j, msg, len);
  if (rc == 0) {
    r->msgs_sent++;
    r->bytes_sent += len + r->cfg.msg_overhead;
    r->payload_sent += payload;
    d->progress_ms = now(r);
    return 0;
  }
  if (rc == BEE_EQUEUE) {
    if (!d->blocked)
      d->blocked_ms = now(r);
    d->blocked = true;
    return rc;
  }
  drop(r, j, AVG_DROP_SEND_FAILED, bee_strerror(rc));
  return rc;
}

/* Tells j we are leaving it, once and best effort. */
static void send_abort(avg_round *r, size_t j, int code, const char *text) {
  uint8_t buf[PROTO_AVG_HDR_MAX + PROTO_TEXT_MAX];
  size_t len;
  proto_avg_msg m = {.type = PROTO_T_AVG_ABORT,
                     .code = code,
                     .text = {(const uint8_t *)text, strlen(text)}};
  memcpy(m.group, r->cfg.group, sizeof m.group);
  if (proto_avg_encode(&m, buf, sizeof buf, &len) == 0 &&
      r->io.send(r->io.ctx, j, buf, len) == 0) {
    r->msgs_sent++;
    r->bytes_sent += len + r->cfg.msg_overhead;
  }
}

/* ---- spans: commit or put back ----------------------------------------- */

/* The backup goes: back to the heap, unless it is the caller's scratch. */
static void drop_backup(avg_round *r, mem *d) {
  if (!r->cfg.scratch)
    free(d->backup);
  d->backup = NULL;
}

/* Puts back every part of j's span that was written, once no job is
 * writing into it any more. */
static void restore(avg_round *r, size_t j) {
  mem *d = &r->m[j];
  if (d->jobs > 0)
    return;
  for (uint64_t k = 0; k < d->nparts; k++) {
    uint64_t p = d->part0 + k;
    if (r->written[p]) {
      size_t off = part_off(r, j, k);
      memcpy(r->cfg.x + off, d->backup + (off - d->start),
             part_len(r, j, k) * sizeof(float));
      r->written[p] = 0;
    }
    r->part_k[p] = 0;
  }
  drop_backup(r, d);
}

static void fail_span(avg_round *r, size_t j) {
  mem *d = &r->m[j];
  if (d->span != SPAN_OPEN)
    return;
  d->span = SPAN_FAILED;
  restore(r, j);
}

/* The span's last part is in: the backup goes. */
static void maybe_commit(avg_round *r, size_t j) {
  mem *d = &r->m[j];
  if (d->span != SPAN_OPEN || d->done < d->nparts || d->jobs > 0)
    return;
  d->span = SPAN_DONE;
  drop_backup(r, d);
  memset(r->written + d->part0, 0, d->nparts);
}

/* A span's backup sits at the span's own offset in the caller's scratch,
 * or in memory of its own. */
static bool ensure_backup(avg_round *r, size_t j) {
  mem *d = &r->m[j];
  if (!d->backup)
    d->backup = r->cfg.scratch ? r->cfg.scratch + d->start
                               : grab(r, d->len * sizeof(float));
  return d->backup != NULL;
}

/* ---- drops and the end ------------------------------------------------- */

static void drop(avg_round *r, size_t j, int reason, const char *why) {
  char namebuf[96];
  mem *d = &r->m[j];
  if (d->dropped || j == r->self)
    return;
  d->dropped = reason;
  d->dropped_ms = r->started ? now(r) - r->start_ms : 0;
  bee_warn("avg", "group %s: dropped %s: %s%s%s", r->gname, WHO(j),
           avg_drop_name(reason), why ? ": " : "", why ? why : "");
  if (reason != AVG_DROP_ABORTED && reason != AVG_DROP_SEND_FAILED &&
      reason != AVG_DROP_CLOSED) {
    char text[64];
    snprintf(text, sizeof text, "dropped: %s", avg_drop_name(reason));
    send_abort(r, j, reason == AVG_DROP_BAD_RESULT ? BEE_ERANGE : BEE_ETIMEOUT,
               text);
  }
  if (d->span == SPAN_OPEN)
    fail_span(r, j);
  if (d->enc == ENC_READY)
    d->enc = ENC_IDLE;
  if (d->enc == ENC_IDLE) {
    free(d->encbuf);
    d->encbuf = NULL;
  }
  r->again = true;
}

/* Stops the round where it is: every open span is put back (ours too),
 * the members still in get an ABORT.  The callback comes once no job is
 * out any more. */
static void end_round(avg_round *r, int status) {
  if (r->ended || r->completed)
    return;
  r->ended = true;
  r->status = status;
  for (size_t j = 0; j < r->N; j++) {
    mem *d = &r->m[j];
    if (j != r->self && !d->dropped && r->started)
      send_abort(r, j, status, status == BEE_ETIMEOUT ? "deadline" : "left");
    fail_span(r, j);
  }
  r->again = true;
}

/* ---- jobs -------------------------------------------------------------- */

static void encode_done(avg_round *r, avg_job *j);
static void reduce_done(avg_round *r, avg_job *j);
static void decode_done(avg_round *r, avg_job *j);

static void job_finish(avg_job *j) {
  avg_round *r = j->r;
  assert(r->jobs > 0);
  r->jobs--;
  switch (j->kind) {
  case JOB_ENCODE: encode_done(r, j); break;
  case JOB_REDUCE: reduce_done(r, j); break;
  default: decode_done(r, j); break;
  }
  r->again = true;
}

static void job_submit(avg_round *r, avg_job *j) {
  j->r = r;
  r->jobs++;
  if (r->io.submit) {
    r->io.submit(r->io.ctx, j);
    return;
  }
  avg_job_run(j);
  job_finish(j);
}

/* ENCODE: our piece of part k of j's span, with error feedback. */
static void run_encode(avg_job *j) {
  const avg_round *r = j->r;
  size_t cap = avg_encoded_size(r->cfg.codec, r->cfg.part_floats);
  const float *x = r->cfg.x + j->off;
  if (r->cfg.residual)
    j->rc = avg_encode_ef(r->cfg.codec, x, j->len, r->cfg.residual + j->off,
                          j->out + HDR, cap, &j->out_len);
  else
    j->rc = avg_encode(r->cfg.codec, x, j->len, j->out + HDR, cap, &j->out_len);
}

/* The norms of the contributions and their clip factors.  A contribution
 * that does not decode gets its verdict here. */
static void clip_factors(avg_job *j) {
  avg_round *r = j->r;
  size_t n = 0;
  for (size_t i = 0; i < r->N; i++) {
    double sq = 0;
    if (r->src[i] == SRC_NONE)
      continue;
    if (r->src[i] == SRC_OWN) {
      r->verdict[i] = avg_check(r->cfg.x + j->off, j->len, &sq);
    } else {
      slot *s = &r->m[i].slots[j->k % r->Wo];
      r->verdict[i] = avg_decode(r->cfg.codec, s->buf, s->len, j->len, r->tmp);
      if (r->verdict[i] == 0)
        r->verdict[i] = avg_check(r->tmp, j->len, &sq);
    }
    if (r->verdict[i] == 0)
      r->sorted[n++] = r->norm[i] = sqrt(sq);
  }
  double median = avg_median(r->sorted, n);
  for (size_t i = 0; i < r->N; i++)
    if (r->src[i] != SRC_NONE && r->verdict[i] == 0)
      r->factor[i] = (float)avg_clip_factor(r->norm[i], median, r->cfg.clip,
                                            r->cfg.clip_mode);
}

/* Adds member i's contribution, scaled by its clip factor. */
static int add_one(avg_job *j, avg_acc *a, size_t i) {
  avg_round *r = j->r;
  float f = r->factor[i], w;
  const float *v;
  if (r->src[i] == SRC_OWN) {
    v = r->cfg.x + j->off;
    w = own_weight(r);
    if (f == 1.0f)
      return avg_acc_add(a, v, w);
  } else {
    slot *s = &r->m[i].slots[j->k % r->Wo];
    w = s->weight;
    if (f == 1.0f)
      return avg_acc_add_encoded(a, r->cfg.codec, s->buf, s->len, w);
    int rc = avg_decode(r->cfg.codec, s->buf, s->len, j->len, r->tmp);
    if (rc)
      return rc;
    v = r->tmp;
  }
  if (v != r->tmp)
    memcpy(r->tmp, v, j->len * sizeof *v);
  for (size_t t = 0; t < j->len; t++)
    r->tmp[t] *= f;
  return avg_acc_add(a, r->tmp, w);
}

/* REDUCE: the mean of part k of our span, in member order, its encoding
 * into the result message (at out + HDR; out_len 0: nothing to average)
 * and, for a member with data, its adoption into x behind the backup. */
static void run_reduce(avg_job *j) {
  avg_round *r = j->r;
  avg_acc a;
  bool clip = r->cfg.clip_mode != AVG_CLIP_OFF;
  for (size_t i = 0; i < r->N; i++) {
    r->verdict[i] = 0;
    r->factor[i] = 1.0f;
  }
  if (clip)
    clip_factors(j);
  avg_acc_init(&a, r->sum, j->len);
  for (size_t i = 0; i < r->N; i++) {
    if (r->src[i] == SRC_NONE || r->verdict[i] || r->factor[i] == 0.0f)
      continue;
    r->verdict[i] = add_one(j, &a, i);
  }
  r->contributors = (uint32_t)a.count;
  j->out_len = 0;
  j->rc = 0;
  if (a.weight == 0)
    return;
  const float *local = r->cfg.x ? r->cfg.x + j->off : r->tmp;
  size_t cap = avg_encoded_size(r->cfg.codec, r->cfg.part_floats);
  if ((j->rc = avg_acc_finish(&a, local)) ||
      (j->rc = avg_encode(r->cfg.codec, r->sum, j->len, j->out + HDR, cap,
                          &j->out_len))) {
    j->out_len = 0;
    return;
  }
  if (!r->cfg.x)
    return;
  /* Adopt what the receivers will decode, so that every member ends with
   * the same bits whatever the codec. */
  float *x = r->cfg.x + j->off;
  memcpy(j->backup, x, j->len * sizeof *x);
  if (avg_decode(r->cfg.codec, j->out + HDR, j->out_len, j->len, x))
    memcpy(x, j->backup, j->len * sizeof *x); /* cannot happen */
}

/* DECODE: a result into x, behind the backup.  A result that does not
 * decode leaves x as it was. */
static void run_decode(avg_job *j) {
  float *x = j->r->cfg.x + j->off;
  memcpy(j->backup, x, j->len * sizeof *x);
  j->rc = avg_decode(j->r->cfg.codec, j->data, j->data_len, j->len, x);
  if (j->rc)
    memcpy(x, j->backup, j->len * sizeof *x);
}

void avg_job_run(avg_job *j) {
  switch (j->kind) {
  case JOB_ENCODE: run_encode(j); break;
  case JOB_REDUCE: run_reduce(j); break;
  default: run_decode(j); break;
  }
}

/* ---- sender: our parts to each owner ----------------------------------- */

/* Writes the PART header in front of the data the job left at buf + HDR
 * (or a nil PART at buf) and points d's message at it. */
static void part_message(avg_round *r, size_t j, bool data) {
  mem *d = &r->m[j];
  uint8_t head[HDR];
  size_t hlen;
  proto_avg_msg m = {.type = PROTO_T_AVG_PART,
                     .sender = (uint32_t)r->self,
                     .part = d->part0 + d->sent,
                     .codec = (uint32_t)r->cfg.codec,
                     .weight = data ? (double)own_weight(r) : 0,
                     .has_data = data,
                     .data = {NULL, data ? d->encjob.out_len : 0}};
  memcpy(m.group, r->cfg.group, sizeof m.group);
  if (data) {
    int rc = proto_avg_header_encode(&m, head, sizeof head, &hlen);
    assert(rc == 0);
    (void)rc;
    memcpy(d->encbuf + HDR - hlen, head, hlen);
    d->encmsg = d->encbuf + HDR - hlen;
    d->enclen = hlen + m.data.n;
    d->encpayload = m.data.n;
  } else {
    int rc = proto_avg_encode(&m, d->encbuf, HDR, &hlen);
    assert(rc == 0);
    (void)rc;
    d->encmsg = d->encbuf;
    d->enclen = hlen;
    d->encpayload = 0;
  }
  d->enc = ENC_READY;
}

static void encode_done(avg_round *r, avg_job *j) {
  char namebuf[96];
  mem *d = &r->m[j->member];
  if (d->dropped || r->ended) {
    d->enc = ENC_IDLE;
    free(d->encbuf);
    d->encbuf = NULL;
    return;
  }
  if (j->rc)
    bee_warn("avg",
             "group %s: our values for part %" PRIu64 " (%s's span) "
             "cannot be sent (%s): no contribution from us",
             r->gname, d->part0 + j->k, WHO(j->member), bee_strerror(j->rc));
  part_message(r, j->member, j->rc == 0);
}

/* Prepares the next part for owner j: encoded by a job, or a nil PART
 * when we have nothing to add (weight 0). */
static void next_part(avg_round *r, size_t j) {
  mem *d = &r->m[j];
  bool data = own_weight(r) > 0.0f;
  if (!d->encbuf) {
    size_t cap = HDR;
    if (data)
      cap += avg_encoded_size(r->cfg.codec, r->cfg.part_floats);
    if (!(d->encbuf = grab(r, cap)))
      return;
  }
  if (!data) {
    part_message(r, j, false);
    return;
  }
  avg_job *job = &d->encjob;
  *job = (avg_job){.kind = JOB_ENCODE,
                   .member = j,
                   .k = d->sent,
                   .off = part_off(r, j, d->sent),
                   .len = part_len(r, j, d->sent),
                   .out = d->encbuf};
  d->enc = ENC_BUSY;
  job_submit(r, job);
}

/* Sends what j is owed: our results first (they unblock others), then our
 * parts of its span, as far as the window and the transport allow. */
static void pump(avg_round *r, size_t j) {
  mem *d = &r->m[j], *me = &r->m[r->self];
  if (j == r->self || d->dropped || d->blocked || r->ended)
    return;
  if (has_data(r, j) && me->span != SPAN_FAILED) {
    while (d->rsent < r->head) {
      result *res = &r->ring[d->rsent % r->Wo];
      if (send_msg(r, j, res->msg, res->len, res->payload))
        return;
      d->rsent++;
    }
  }
  if (!has_data(r, r->self) || d->span != SPAN_OPEN || !r->started)
    return;
  for (;;) {
    if (d->enc == ENC_READY) {
      if (send_msg(r, j, d->encmsg, d->enclen, d->encpayload))
        return;
      /* The transport has its own copy: the buffer goes, so that we hold
       * one only for the owners whose part is being encoded or blocked. */
      d->enc = ENC_IDLE;
      d->sent++;
      free(d->encbuf);
      d->encbuf = NULL;
    }
    if (d->enc != ENC_IDLE || d->sent == d->nparts ||
        d->sent - d->base >= r->W || r->ended)
      return;
    next_part(r, j);
  }
}

/* ---- owner: the head part ---------------------------------------------- */

/* Frees the results every receiver's transport has taken. */
static void release_results(avg_round *r) {
  uint64_t low = r->head;
  for (size_t j = 0; j < r->N; j++)
    if (j != r->self && has_data(r, j) && !r->m[j].dropped &&
        r->m[j].rsent < low)
      low = r->m[j].rsent;
  if (low > r->rbase)
    r->rbase = low;
}

/* Whether we are waiting on sender i for the head part (and it is not
 * held back by our own results still queued for it). */
static bool waits_on(const avg_round *r, size_t i) {
  const mem *s = &r->m[i], *me = &r->m[r->self];
  return i != r->self && has_data(r, i) && !s->dropped &&
         me->span == SPAN_OPEN && !r->reducing && r->head < me->nparts &&
         s->slots[r->head % r->Wo].state == SLOT_EMPTY &&
         r->head - s->rsent < r->Wo;
}

static void try_reduce(avg_round *r) {
  mem *me = &r->m[r->self];
  if (!r->started || r->ended || r->reducing || me->span != SPAN_OPEN ||
      r->head >= me->nparts || r->head - r->rbase >= r->Wo)
    return;
  for (size_t i = 0; i < r->N; i++)
    if (i != r->self && has_data(r, i) && !r->m[i].dropped &&
        r->m[i].slots[r->head % r->Wo].state == SLOT_EMPTY)
      return;
  result *res = &r->ring[r->head % r->Wo];
  if (!res->buf &&
      !(res->buf =
            grab(r, HDR + avg_encoded_size(r->cfg.codec, r->cfg.part_floats))))
    return;
  if (r->cfg.x && !ensure_backup(r, r->self))
    return;
  for (size_t i = 0; i < r->N; i++) {
    if (i == r->self)
      r->src[i] = has_data(r, i) && own_weight(r) > 0 ? SRC_OWN : SRC_NONE;
    else
      r->src[i] = has_data(r, i) && !r->m[i].dropped &&
                          r->m[i].slots[r->head % r->Wo].state == SLOT_DATA
                      ? SRC_DATA
                      : SRC_NONE;
  }
  avg_job *j = &r->rjob;
  size_t off = part_off(r, r->self, r->head);
  *j = (avg_job){.kind = JOB_REDUCE,
                 .member = r->self,
                 .k = r->head,
                 .off = off,
                 .len = part_len(r, r->self, r->head),
                 .out = res->buf,
                 .backup = r->cfg.x ? me->backup + (off - me->start) : NULL};
  r->reducing = true;
  me->jobs++;
  job_submit(r, j);
}

/* Logs the head's refused and clipped contributions, once per member at
 * warn level, then at debug level. */
static void log_verdicts(avg_round *r, uint64_t p) {
  char namebuf[96];
  for (size_t i = 0; i < r->N; i++) {
    mem *s = &r->m[i];
    if (r->src[i] == SRC_NONE)
      continue;
    int level = s->warned ? BEE_LOG_DEBUG : BEE_LOG_WARN;
    if (r->verdict[i]) {
      s->refused += i != r->self;
      if (level <= bee_log_get_level())
        bee_log(level, "avg",
                "group %s: contribution of %s to part %" PRIu64 " refused: %s",
                r->gname, i == r->self ? "ours" : WHO(i), p,
                bee_strerror(r->verdict[i]));
      s->warned = true;
    } else if (r->factor[i] != 1.0f) {
      s->clipped += i != r->self;
      if (level <= bee_log_get_level())
        bee_log(level, "avg",
                "group %s: contribution of %s to part %" PRIu64
                " %s: norm %.4g",
                r->gname, i == r->self ? "ours" : WHO(i), p,
                r->factor[i] == 0.0f ? "dropped by the clip rule" : "clipped",
                r->norm[i]);
      s->warned = true;
    }
  }
}

static void reduce_done(avg_round *r, avg_job *j) {
  mem *me = &r->m[r->self];
  uint64_t p = me->part0 + j->k;
  result *res = &r->ring[j->k % r->Wo];
  r->reducing = false;
  me->jobs--;
  log_verdicts(r, p);
  if (j->rc)
    bee_warn("avg",
             "group %s: part %" PRIu64 " has no mean (%s): every "
             "member keeps its own values",
             r->gname, p, bee_strerror(j->rc));
  proto_avg_msg m = {.type = PROTO_T_AVG_RESULT,
                     .part = p,
                     .codec = (uint32_t)r->cfg.codec,
                     .contributors = r->contributors,
                     .has_data = j->out_len > 0,
                     .data = {NULL, j->out_len}};
  memcpy(m.group, r->cfg.group, sizeof m.group);
  uint8_t head[HDR];
  size_t hlen;
  if (m.has_data) {
    int rc = proto_avg_header_encode(&m, head, sizeof head, &hlen);
    assert(rc == 0);
    (void)rc;
    memcpy(res->buf + HDR - hlen, head, hlen);
    res->msg = res->buf + HDR - hlen;
    res->len = hlen + j->out_len;
    res->payload = j->out_len;
    r->part_k[p] = r->contributors;
    r->written[p] = r->cfg.x != NULL;
  } else {
    int rc = proto_avg_encode(&m, res->buf, HDR, &res->len);
    assert(rc == 0);
    (void)rc;
    res->msg = res->buf;
    res->payload = 0;
    r->part_k[p] = 0;
  }
  for (size_t i = 0; i < r->N; i++) {
    if (i == r->self || !has_data(r, i))
      continue;
    slot *s = &r->m[i].slots[j->k % r->Wo];
    free(s->buf);
    *s = (slot){0};
  }
  r->head++;
  r->head_since = now(r);
  me->done++;
  if (me->span == SPAN_FAILED)
    restore(r, r->self);
  else
    maybe_commit(r, r->self);
}

/* ---- receiver: results into the buffer --------------------------------- */

static void decode_done(avg_round *r, avg_job *j) {
  mem *d = &r->m[j->member];
  uint64_t p = d->part0 + j->k;
  int rc = j->rc;
  d->jobs--;
  free(j->copy);
  free(j);
  if (rc == 0) {
    r->written[p] = 1;
    d->done++;
  }
  if (rc && !d->dropped) {
    char why[80];
    snprintf(why, sizeof why, "part %" PRIu64 ": %s", p, bee_strerror(rc));
    drop(r, (size_t)(d - r->m), AVG_DROP_BAD_RESULT, why);
  }
  if (d->span == SPAN_FAILED)
    restore(r, (size_t)(d - r->m));
  else
    maybe_commit(r, (size_t)(d - r->m));
}

/* ---- messages ---------------------------------------------------------- */

static int on_part(avg_round *r, size_t from, const proto_avg_msg *m) {
  char namebuf[96];
  mem *s = &r->m[from], *me = &r->m[r->self];
  const char *bad = NULL;
  int rc = BEE_ERANGE;
  uint64_t k = m->part - me->part0;
  if (!has_data(r, from))
    bad = "a part from an aux member";
  else if (m->part < me->part0 || k >= me->nparts)
    bad = "a part we do not own";
  else if (m->sender != from)
    bad = "a part under another member's index", rc = BEE_EAUTH;
  else if (k >= r->head + r->Wo)
    bad = "a part beyond the window", rc = BEE_ELIMIT;
  else if (k < r->head || s->slots[k % r->Wo].state != SLOT_EMPTY)
    bad = "a part it already sent";
  if (bad) {
    bee_warn("avg", "group %s: %s sent %s (part %" PRIu64 "): ignored",
             r->gname, WHO(from), bad, m->part);
    return rc;
  }
  slot *sl = &s->slots[k % r->Wo];
  s->last_part_ms = now(r);
  sl->state = SLOT_NONE;
  if (m->has_data)
    s->weight = m->weight;
  if (!m->has_data || m->weight == 0)
    return 0;
  size_t want = avg_encoded_size(r->cfg.codec, part_len(r, r->self, k));
  rc = m->codec != (uint32_t)r->cfg.codec ? BEE_ERANGE
       : m->data.n < want                 ? BEE_ETRUNCATED
       : m->data.n > want                 ? BEE_ETRAILING
                                          : 0;
  if (rc) {
    int level = s->warned ? BEE_LOG_DEBUG : BEE_LOG_WARN;
    s->refused++;
    s->warned = true;
    if (level <= bee_log_get_level())
      bee_log(level, "avg",
              "group %s: contribution of %s to part %" PRIu64
              " refused: %s (codec %" PRIu32 ", %zu bytes; the round's: %s, "
              "%zu bytes)",
              r->gname, WHO(from), m->part, bee_strerror(rc), m->codec,
              m->data.n, avg_codec_name(r->cfg.codec), want);
    return rc;
  }
  if (!(sl->buf = grab(r, want)))
    return -ENOMEM;
  memcpy(sl->buf, m->data.p, want);
  sl->len = want;
  sl->weight = (float)m->weight;
  sl->state = SLOT_DATA;
  return 0;
}

static int on_result(avg_round *r, size_t from, const proto_avg_msg *m) {
  char namebuf[96];
  mem *d = &r->m[from];
  const char *bad = NULL;
  uint64_t k = m->part - d->part0;
  if (!has_data(r, r->self))
    bad = "a result to an aux member";
  else if (m->part < d->part0 || k >= d->nparts)
    bad = "a result for a part it does not own";
  else if (d->span != SPAN_OPEN)
    return BEE_ECANCELED;
  else if (k >= d->sent)
    bad = "a result for a part we have not sent";
  else if (k < d->base || (d->mask >> (k - d->base) & 1))
    bad = "a result it already sent";
  if (bad) {
    bee_warn("avg", "group %s: %s sent %s (part %" PRIu64 "): ignored",
             r->gname, WHO(from), bad, m->part);
    return BEE_ERANGE;
  }
  size_t len = part_len(r, from, k);
  if (m->contributors > r->N || (m->has_data && m->contributors == 0) ||
      (m->has_data && (m->codec != (uint32_t)r->cfg.codec ||
                       m->data.n != avg_encoded_size(r->cfg.codec, len)))) {
    char why[96];
    snprintf(why, sizeof why,
             "part %" PRIu64 ": codec %" PRIu32 ", %zu bytes, "
             "%" PRIu32 " contributors",
             m->part, m->codec, m->data.n, m->contributors);
    drop(r, from, AVG_DROP_BAD_RESULT, why);
    return BEE_ERANGE;
  }
  d->mask |= (uint64_t)1 << (k - d->base);
  while (d->mask & 1)
    d->mask >>= 1, d->base++;
  d->progress_ms = now(r);
  r->part_k[m->part] = m->has_data ? m->contributors : 0;
  if (!m->has_data) {
    d->done++;
    maybe_commit(r, from);
    return 0;
  }
  if (!ensure_backup(r, from))
    return -ENOMEM;
  avg_job *j = grab(r, sizeof *j);
  if (!j)
    return -ENOMEM;
  size_t off = part_off(r, from, k);
  *j = (avg_job){.kind = JOB_DECODE,
                 .member = from,
                 .k = k,
                 .off = off,
                 .len = len,
                 .data = m->data.p,
                 .data_len = m->data.n,
                 .backup = d->backup + (off - d->start)};
  if (r->io.submit) { /* the message is ours only for this call */
    if (!(j->copy = grab(r, m->data.n))) {
      free(j);
      return -ENOMEM;
    }
    memcpy(j->copy, m->data.p, m->data.n);
    j->data = j->copy;
  }
  d->jobs++;
  job_submit(r, j);
  return 0;
}

/* ---- the loop ---------------------------------------------------------- */

/* Whether everything we owe and are owed is settled. */
static bool settled(const avg_round *r) {
  const mem *me = &r->m[r->self];
  if (r->jobs > 0)
    return false;
  if (r->ended)
    return true;
  for (size_t j = 0; j < r->N; j++)
    if (r->m[j].span == SPAN_OPEN)
      return false;
  if (me->span == SPAN_DONE)
    for (size_t j = 0; j < r->N; j++)
      if (j != r->self && has_data(r, j) && !r->m[j].dropped &&
          r->m[j].rsent < me->nparts)
        return false;
  return true;
}

static void complete(avg_round *r) {
  bool aux = !has_data(r, r->self);
  r->completed = true;
  memset(r->by_k, 0, (r->N + 1) * sizeof *r->by_k);
  for (size_t j = 0; j < r->N; j++) {
    const mem *d = &r->m[j];
    avg_span_info *sp = &r->spans[j];
    bool counted = !aux || j == r->self;
    *sp = (avg_span_info){.owner = j,
                          .start = d->start,
                          .len = d->len,
                          .averaged = d->span == SPAN_DONE && counted,
                          .min_k = d->nparts ? UINT32_MAX : 0};
    for (uint64_t k = 0; k < d->nparts; k++) {
      uint32_t c = sp->averaged ? r->part_k[d->part0 + k] : 0;
      sp->min_k = c < sp->min_k ? c : sp->min_k;
      sp->max_k = c > sp->max_k ? c : sp->max_k;
      if (counted)
        r->by_k[c] += part_len(r, j, k);
    }
    if (!sp->averaged)
      for (uint64_t k = 0; k < d->nparts; k++)
        r->part_k[d->part0 + k] = 0;
    r->info[j] = (avg_member_info){.dropped = d->dropped,
                                   .dropped_ms = d->dropped_ms,
                                   .refused = d->refused,
                                   .clipped = d->clipped,
                                   .weight = j == r->self
                                                 ? (double)own_weight(r)
                                                 : d->weight};
  }
  avg_round_summary s = {
      .status = r->ended ? r->status : 0,
      .nmembers = r->N,
      .spans = r->spans,
      .members = r->info,
      .floats_by_k = r->by_k,
      .nparts = r->nparts,
      .part_k = r->part_k,
      .msgs_sent = r->msgs_sent,
      .msgs_recv = r->msgs_recv,
      .payload_sent = r->payload_sent,
      .payload_recv = r->payload_recv,
      .bytes_sent = r->bytes_sent,
      .bytes_recv = r->bytes_recv,
      .ms = r->started ? now(r) - r->start_ms : 0,
  };
  if (s.status)
    bee_info("avg", "group %s: round ended: %s", r->gname,
             bee_strerror(s.status));
  if (r->cb)
    r->cb(r, &s, r->arg);
}

/* Moves everything that can move, until nothing does; the callback comes
 * from here.  Re-entry (a job finishing inline) just asks for one more
 * pass. */
static void progress(avg_round *r) {
  if (r->busy) {
    r->again = true;
    return;
  }
  r->busy = true;
  do {
    r->again = false;
    if (r->completed)
      break;
    try_reduce(r);
    for (size_t t = 0; t < r->N; t++)
      pump(r, (r->rr + t) % r->N);
    release_results(r);
    try_reduce(r);
    if (!r->again && !r->starting && (r->started || r->ended) && settled(r))
      complete(r);
  } while (r->again);
  r->rr = (r->rr + 1) % r->N;
  r->busy = false;
}

static void really_free(avg_round *r);

static void enter(avg_round *r) { r->depth++; }

static void leave(avg_round *r) {
  if (--r->depth == 0 && r->free_pending && r->jobs == 0)
    really_free(r);
}

/* ---- the API ----------------------------------------------------------- */

void avg_round_config_default(avg_round_config *cfg) {
  *cfg = (avg_round_config){
      .codec = AVG_NONE,
      .part_floats = AVG_PART_FLOATS,
      .window = 4,
      .clip = 10,
      .clip_mode = AVG_CLIP_OFF,
      .sender_timeout_ms = 5000,
      .reducer_timeout_ms = 15000,
      .deadline_ms = 60000,
      .msg_overhead = AVG_MSG_OVERHEAD,
  };
}

static int config_check(const avg_round_config *c, const avg_io *io) {
  if (!io || !io->now_ms || !io->send || !c->modes)
    return BEE_ERANGE;
  if (c->nmembers > AVG_GROUP_MAX)
    return BEE_ETOOBIG;
  if (c->nmembers == 0 || c->self >= c->nmembers)
    return BEE_ERANGE;
  for (size_t i = 0; i < c->nmembers; i++)
    if ((unsigned)c->modes[i] > AVG_MODE_AUX)
      return BEE_ERANGE;
  bool aux = c->modes[c->self] == AVG_MODE_AUX;
  if (!aux &&
      ((!c->x && c->n > 0) || !(c->weight >= 0 && c->weight <= FLT_MAX)))
    return BEE_ERANGE;
  if ((unsigned)c->codec >= AVG_CODEC_COUNT || c->part_floats == 0 ||
      avg_encoded_size(c->codec, c->part_floats) > PROTO_AVG_DATA_MAX ||
      c->window == 0 || c->window > AVG_WINDOW_MAX ||
      (unsigned)c->clip_mode > AVG_CLIP_DROP || c->sender_timeout_ms == 0 ||
      c->reducer_timeout_ms < c->sender_timeout_ms || c->deadline_ms == 0)
    return BEE_ERANGE;
  return 0;
}

/* The spans, the parts and the per-member state. */
static int layout(avg_round *r, const avg_round_config *c) {
  size_t N = r->N, *start = calloc(N, sizeof *start),
         *len = calloc(N, sizeof *len);
  bool *reduces = calloc(N, sizeof *reduces);
  double *bw = calloc(N, sizeof *bw);
  int rc = -ENOMEM;
  if (!start || !len || !reduces || !bw)
    goto out;
  for (size_t i = 0; i < N; i++) {
    reduces[i] = c->modes[i] != AVG_MODE_CLIENT;
    bw[i] = c->bandwidth ? c->bandwidth[i] : 1.0;
  }
  if ((rc = avg_spans(c->n, N, bw, reduces, AVG_SPAN_ALIGN, start, len)))
    goto out;
  for (size_t i = 0; i < N; i++)
    r->m[i].mode = c->modes[i];
  uint64_t p = 0;
  for (size_t i = 0; i < N; i++) {
    mem *d = &r->m[i];
    d->start = start[i];
    d->len = len[i];
    d->part0 = p;
    d->nparts = len[i] / c->part_floats + (len[i] % c->part_floats != 0);
    p += d->nparts;
    bool theirs = i != r->self && has_data(r, r->self);
    d->span = d->nparts == 0           ? SPAN_DONE
              : i == r->self || theirs ? SPAN_OPEN
                                       : SPAN_NA;
  }
  r->nparts = p;
out:
  free(start);
  free(len);
  free(reduces);
  free(bw);
  return rc;
}

int avg_round_new(const avg_round_config *cfg, const avg_io *io,
                  avg_round **out) {
  int rc = config_check(cfg, io);
  if (rc)
    return rc;
  avg_round *r = calloc(1, sizeof *r);
  if (!r)
    return -ENOMEM;
  size_t N = cfg->nmembers;
  r->cfg = *cfg;
  r->cfg.modes = NULL;
  r->cfg.bandwidth = NULL;
  r->io = *io;
  r->N = N;
  r->self = cfg->self;
  r->W = cfg->window;
  r->Wo = AVG_WINDOW_MAX;
  r->m = calloc(N, sizeof *r->m);
  r->src = calloc(N, sizeof *r->src);
  r->verdict = calloc(N, sizeof *r->verdict);
  r->norm = calloc(N, sizeof *r->norm);
  r->sorted = calloc(N, sizeof *r->sorted);
  r->factor = calloc(N, sizeof *r->factor);
  r->spans = calloc(N, sizeof *r->spans);
  r->info = calloc(N, sizeof *r->info);
  r->by_k = calloc(N + 1, sizeof *r->by_k);
  rc = -ENOMEM;
  if (!r->m || !r->src || !r->verdict || !r->norm || !r->sorted || !r->factor ||
      !r->spans || !r->info || !r->by_k)
    goto fail;
  if (cfg->modes[cfg->self] == AVG_MODE_AUX) {
    r->cfg.x = r->cfg.residual = NULL;
    r->cfg.weight = 0;
  }
  if ((rc = layout(r, cfg)))
    goto fail;
  rc = -ENOMEM;
  r->part_k = calloc(r->nparts ? r->nparts : 1, sizeof *r->part_k);
  r->written = calloc(r->nparts ? r->nparts : 1, 1);
  if (!r->part_k || !r->written)
    goto fail;
  if (r->m[r->self].nparts > 0) {
    r->sum = malloc(cfg->part_floats * sizeof *r->sum);
    r->tmp = malloc(cfg->part_floats * sizeof *r->tmp);
    r->ring = calloc(r->Wo, sizeof *r->ring);
    if (!r->sum || !r->tmp || !r->ring)
      goto fail;
    for (size_t i = 0; i < N; i++)
      if (i != r->self && has_data(r, i) &&
          !(r->m[i].slots = calloc(r->Wo, sizeof(slot))))
        goto fail;
  }
  for (size_t i = 0; i < PROTO_AVG_GROUP_BYTES && i < 4; i++)
    snprintf(r->gname + 2 * i, 3, "%02x", cfg->group[i]);
  *out = r;
  return 0;
fail:
  really_free(r);
  return rc;
}

int avg_round_start(avg_round *r, avg_round_cb cb, void *arg) {
  if (r->started || r->ended || r->free_pending)
    return BEE_ERANGE;
  enter(r);
  r->cb = cb;
  r->arg = arg;
  r->started = r->starting = true;
  r->start_ms = r->head_since = now(r);
  r->end_at = r->start_ms + r->cfg.deadline_ms;
  for (size_t j = 0; j < r->N; j++)
    r->m[j].progress_ms = r->start_ms;
  r->rr = (r->self + 1) % r->N;
  progress(r);
  r->starting = false;
  leave(r);
  return 0;
}

/* WAIT: j, in a group formed ahead, has not begun its round yet (its
 * buffer is not ready) and is still coming.  Its sender timeout starts
 * again, and so does every member's reducer timeout: no owner can finish
 * a part without j's contribution, so the results we wait for from the
 * others are held up by j too.  The round's deadline still holds. */
static void on_wait(avg_round *r, size_t j) {
  char namebuf[96];
  uint64_t t = now(r);
  if (!r->m[j].waited)
    bee_debug("avg", "group %s: %s has not begun yet: waiting for it",
              r->gname, WHO(j));
  r->m[j].waited++;
  r->m[j].last_part_ms = t;
  for (size_t k = 0; k < r->N; k++)
    r->m[k].progress_ms = t;
}

int avg_round_handle(avg_round *r, size_t from, const uint8_t *msg,
                     size_t len) {
  char namebuf[96];
  proto_avg_msg m;
  int rc;
  enter(r);
  r->msgs_recv++;
  r->bytes_recv += len + r->cfg.msg_overhead;
  if (from >= r->N || from == r->self) {
    bee_warn("avg", "group %s: a message from member %zu, not in the group",
             r->gname, from);
    rc = BEE_ERANGE;
    goto out;
  }
  if (r->completed || r->ended || r->free_pending || r->m[from].dropped) {
    rc = BEE_ECANCELED;
    goto out;
  }
  if ((rc = proto_avg_decode(msg, len, &m))) {
    bee_warn("avg", "group %s: malformed message from %s: %s", r->gname,
             WHO(from), bee_strerror(rc));
    goto out;
  }
  r->payload_recv += m.data.n;
  if (memcmp(m.group, r->cfg.group, sizeof m.group) != 0) {
    bee_warn("avg", "group %s: %s sent a message for another group", r->gname,
             WHO(from));
    rc = BEE_ESTALE;
    goto out;
  }
  switch (m.type) {
  case PROTO_T_AVG_PART: rc = on_part(r, from, &m); break;
  case PROTO_T_AVG_RESULT: rc = on_result(r, from, &m); break;
  case PROTO_T_AVG_WAIT: on_wait(r, from); break;
  default: {
    char text[PROTO_TEXT_MAX + 1], why[PROTO_TEXT_MAX + 64];
    bee_printable(m.text.p, m.text.n, text, sizeof text);
    snprintf(why, sizeof why, "%s (%s)", text, bee_errname((int)m.code));
    drop(r, from, AVG_DROP_ABORTED, why);
    rc = 0;
    break;
  }
  }
  progress(r);
out:
  leave(r);
  return rc;
}

/* Checks member j's timeouts at t; returns when they next fall due. */
static uint64_t timeouts(avg_round *r, size_t j, uint64_t t) {
  mem *d = &r->m[j];
  uint64_t next = UINT64_MAX, due;
  if (waits_on(r, j)) {
    due = (d->last_part_ms > r->head_since ? d->last_part_ms : r->head_since) +
          r->cfg.sender_timeout_ms;
    if (t >= due) {
      drop(r, j, AVG_DROP_SENDER_TIMEOUT, NULL);
      return UINT64_MAX;
    }
    next = due;
  }
  if (d->span == SPAN_OPEN && d->base < d->nparts) { /* results missing */
    due = d->progress_ms + r->cfg.reducer_timeout_ms;
    if (t >= due) {
      drop(r, j, AVG_DROP_REDUCER_TIMEOUT, NULL);
      return UINT64_MAX;
    }
    next = due < next ? due : next;
  }
  if (d->blocked) {
    due = d->blocked_ms + r->cfg.reducer_timeout_ms;
    if (t >= due) {
      drop(r, j, AVG_DROP_STALLED, NULL);
      return UINT64_MAX;
    }
    next = due < next ? due : next;
  }
  return next;
}

uint64_t avg_round_tick(avg_round *r) {
  uint64_t t = now(r), next = UINT64_MAX;
  enter(r);
  if (!r->started || r->completed || r->free_pending)
    goto out;
  if (!r->ended && t >= r->end_at)
    end_round(r, BEE_ETIMEOUT);
  if (!r->ended) {
    next = r->end_at;
    for (size_t j = 0; j < r->N; j++) {
      if (j == r->self || r->m[j].dropped)
        continue;
      uint64_t due = timeouts(r, j, t);
      next = due < next ? due : next;
    }
  }
  progress(r);
  if (r->completed || r->ended)
    next = UINT64_MAX;
out:
  leave(r);
  return next == UINT64_MAX ? UINT64_MAX : next > t ? next - t : 0;
}

void avg_round_drain(avg_round *r, size_t member) {
  enter(r);
  if (member < r->N && r->m[member].blocked) {
    r->m[member].blocked = false;
    progress(r);
  }
  leave(r);
}

void avg_round_gone(avg_round *r, size_t member) {
  enter(r);
  if (member < r->N && r->started && !r->completed && !r->ended) {
    drop(r, member, AVG_DROP_CLOSED, NULL);
    progress(r);
  }
  leave(r);
}

void avg_job_done(avg_job *j) {
  avg_round *r = j->r;
  enter(r);
  job_finish(j);
  progress(r);
  leave(r);
}

static void really_free(avg_round *r) {
  if (r->m) {
    for (size_t i = 0; i < r->N; i++) {
      mem *d = &r->m[i];
      if (d->slots)
        for (size_t k = 0; k < r->Wo; k++)
          free(d->slots[k].buf);
      free(d->slots);
      drop_backup(r, d);
      free(d->encbuf);
    }
  }
  if (r->ring)
    for (size_t k = 0; k < r->Wo; k++)
      free(r->ring[k].buf);
  free(r->ring);
  free(r->sum);
  free(r->tmp);
  free(r->part_k);
  free(r->written);
  free(r->src);
  free(r->verdict);
  free(r->norm);
  free(r->sorted);
  free(r->factor);
  free(r->spans);
  free(r->info);
  free(r->by_k);
  free(r->m);
  free(r);
}

void avg_round_free(avg_round *r) {
  if (!r || r->free_pending)
    return;
  enter(r);
  r->free_pending = true;
  if (!r->completed) {
    if (r->started)
      end_round(r, BEE_ECANCELED);
    else
      r->completed = true; /* never started: no callback was promised */
    progress(r);
  }
  leave(r);
}
