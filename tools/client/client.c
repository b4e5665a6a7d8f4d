/* client.c: the trainer's side of the local trainer protocol
 * (beed-client.h; the messages are proto's local-msg.c).
 *
 * The memory is a memfd laid out as beed lays it out (daemon/local.c):
 * the parameters in the tensors' order, their gradients in the same
 * order, the optimizer's state, the buffers.  It is sealed against
 * changes of size before beed sees it, so that beed can map it safely.
 * The connection is blocking; every wait for beed's answer is bounded
 * by poll().
 */
#define _GNU_SOURCE /* memfd_create, the seals */
#include "beed-client.h"

#include "proto.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define ANSWER_MAX 4096 /* bytes of any answer of beed's */
#define TIMEOUT_MS_DEFAULT 600000

struct beed_client {
  int fd;  /* the connection to beed, -1 before hello */
  int mfd; /* the memory */
  uint8_t *mem;
  size_t len;
  size_t n;
  proto_local_tensor *t; /* names point into names */
  char *names;
  uint64_t *off, *goff; /* floats into mem; goff UINT64_MAX: none */
  unsigned timeout_ms;
  char err[PROTO_TEXT_MAX + 128];
};

static int fail(beed_client *c, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(beed_client *c, int rc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->err, sizeof c->err, fmt, ap);
  va_end(ap);
  return rc;
}

static void free_client(beed_client *c) {
  if (c->mem && c->mem != MAP_FAILED)
    munmap(c->mem, c->len);
  if (c->mfd >= 0)
    close(c->mfd);
  if (c->fd >= 0)
    close(c->fd);
  free(c->t);
  free(c->names);
  free(c->off);
  free(c->goff);
  free(c);
}

int beed_client_new(size_t n, const char *const *names, const int *roles,
                    const unsigned *ndims, const uint64_t *dims,
                    beed_client **out, char *err, size_t errlen) {
  *out = NULL;
  beed_client *c = calloc(1, sizeof *c);
  if (!c)
    return -ENOMEM;
  c->fd = c->mfd = -1;
  c->n = n;
  size_t chars = 0;
  for (size_t i = 0; i < n; i++)
    chars += strlen(names[i]) + 1;
  c->t = calloc(n ? n : 1, sizeof *c->t);
  c->names = malloc(chars ? chars : 1);
  c->off = calloc(n ? n : 1, sizeof *c->off);
  c->goff = calloc(n ? n : 1, sizeof *c->goff);
  int rc = 0;
  if (!c->t || !c->names || !c->off || !c->goff) {
    rc = -ENOMEM;
    goto out;
  }
  /* The tensors as HELLO will carry them, checked as beed checks them
   * (an encode of the message does). */
  uint64_t count[3] = {0, 0, 0};
  char *p = c->names;
  for (size_t i = 0, d = 0; i < n; i++) {
    proto_local_tensor *t = &c->t[i];
    size_t k = strlen(names[i]);
    memcpy(p, names[i], k + 1);
    t->name = (proto_bytes){(const uint8_t *)p, k};
    p += k + 1;
    t->role = roles[i];
    t->dtype = PROTO_LOCAL_F32;
    t->ndim = ndims[i];
    t->elems = 1;
    if (t->ndim > PROTO_LOCAL_DIMS_MAX || t->role < BEED_PARAM ||
        t->role > BEED_BUFFER) {
      rc = fail(c, BEE_ERANGE, "tensor %zu (%s): %s", i, names[i],
                t->ndim > PROTO_LOCAL_DIMS_MAX ? "more than 8 dimensions"
                                               : "no such role");
      goto out;
    }
    for (unsigned j = 0; j < t->ndim; j++) {
      t->dims[j] = dims[d++];
      t->elems = t->dims[j] && t->elems <= PROTO_LOCAL_ELEMS_MAX / t->dims[j]
                     ? t->elems * t->dims[j]
                     : 0;
    }
    c->off[i] = count[t->role];
    count[t->role] += t->elems;
  }
  proto_local_msg h = {.type = PROTO_T_LOCAL_HELLO,
                       .run = "x",
                       .batch = 1,
                       .list = c->t,
                       .n = n};
  size_t need;
  uint8_t *probe = malloc(PROTO_LOCAL_FRAME_MAX);
  if (!probe) {
    rc = -ENOMEM;
    goto out;
  }
  rc = proto_local_encode(&h, probe, PROTO_LOCAL_FRAME_MAX, &need);
  free(probe);
  if (rc) {
    fail(c, rc,
         "the tensors cannot be said to beed: %s (names of 1 to "
         "%d printable bytes without spaces, dimensions of at least 1, at "
         "most %d tensors, a parameter among them)",
         bee_strerror(rc), PROTO_LOCAL_NAME_MAX, PROTO_LOCAL_TENSORS_MAX);
    goto out;
  }
  /* Regions: parameters, gradients, state, buffers. */
  uint64_t base[3] = {0, 2 * count[0], 2 * count[0] + count[1]};
  for (size_t i = 0; i < n; i++) {
    c->goff[i] = c->t[i].role == BEED_PARAM ? count[0] + c->off[i] : UINT64_MAX;
    c->off[i] += base[c->t[i].role];
  }
  c->len = (size_t)(2 * count[0] + count[1] + count[2]) * sizeof(float);
  c->mfd = memfd_create("beed-tensors", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (c->mfd < 0 || ftruncate(c->mfd, (off_t)c->len) < 0 ||
      fcntl(c->mfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) <
          0) {
    rc = fail(c, -errno, "shared memory of %zu bytes: %s", c->len,
              strerror(errno));
    goto out;
  }
  c->mem = mmap(NULL, c->len, PROT_READ | PROT_WRITE, MAP_SHARED, c->mfd, 0);
  if (c->mem == MAP_FAILED) {
    c->mem = NULL;
    rc = fail(c, -errno, "cannot map %zu bytes: %s", c->len, strerror(errno));
    goto out;
  }
  c->timeout_ms = TIMEOUT_MS_DEFAULT;
  *out = c;
  return 0;
out:
  if (err && errlen)
    snprintf(err, errlen, "%s", c->err[0] ? c->err : strerror(-rc));
  free_client(c);
  return rc;
}

float *beed_client_data(beed_client *c, size_t i) {
  return i < c->n ? (float *)c->mem + c->off[i] : NULL;
}

float *beed_client_grad(beed_client *c, size_t i) {
  return i < c->n && c->goff[i] != UINT64_MAX ? (float *)c->mem + c->goff[i]
                                              : NULL;
}

uint64_t beed_client_elems(const beed_client *c, size_t i) {
  return i < c->n ? c->t[i].elems : 0;
}

const char *beed_client_error(const beed_client *c) { return c->err; }

/* ---- messages ----------------------------------------------------------- */

/* Sends a frame: its length and body; with the memory's descriptor on
 * its first bytes when mfd >= 0. */
static int send_frame(beed_client *c, const uint8_t *body, size_t len,
                      int mfd) {
  uint8_t hdr[4] = {(uint8_t)(len >> 24), (uint8_t)(len >> 16),
                    (uint8_t)(len >> 8), (uint8_t)len};
  struct iovec iov[2] = {{hdr, 4}, {(void *)body, len}};
  union {
    struct cmsghdr h;
    char b[CMSG_SPACE(sizeof(int))];
  } ctl;
  struct msghdr mh = {.msg_iov = iov, .msg_iovlen = 2};
  if (mfd >= 0) {
    memset(&ctl, 0, sizeof ctl);
    mh.msg_control = ctl.b;
    mh.msg_controllen = sizeof ctl.b;
    struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &mfd, sizeof mfd);
  }
  size_t left = len + 4;
  while (left > 0) {
    ssize_t w = sendmsg(c->fd, &mh, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR)
      continue;
    if (w < 0)
      return fail(c, -errno, "cannot write to beed: %s", strerror(errno));
    left -= (size_t)w;
    mh.msg_control = NULL; /* the descriptor went with the first bytes */
    mh.msg_controllen = 0;
    while (w > 0) {
      size_t k =
          (size_t)w < mh.msg_iov[0].iov_len ? (size_t)w : mh.msg_iov[0].iov_len;
      mh.msg_iov[0].iov_base = (uint8_t *)mh.msg_iov[0].iov_base + k;
      mh.msg_iov[0].iov_len -= k;
      w -= (ssize_t)k;
      if (mh.msg_iov[0].iov_len == 0 && mh.msg_iovlen > 1) {
        mh.msg_iov++;
        mh.msg_iovlen--;
      }
    }
  }
  return 0;
}

static int send_msg(beed_client *c, const proto_local_msg *m) {
  uint8_t buf[256];
  size_t len;
  int rc = proto_local_encode(m, buf, sizeof buf, &len);
  if (rc)
    return fail(c, rc, "cannot encode a message: %s", bee_strerror(rc));
  return send_frame(c, buf, len, -1);
}

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static int read_full(beed_client *c, uint8_t *buf, size_t n, uint64_t end) {
  size_t got = 0;
  while (got < n) {
    uint64_t now = now_ms();
    if (now >= end)
      return fail(c, -ETIMEDOUT, "no answer from beed in %u s",
                  c->timeout_ms / 1000);
    struct pollfd p = {.fd = c->fd, .events = POLLIN};
    int k = poll(&p, 1, (int)(end - now));
    if (k < 0 && errno == EINTR)
      continue;
    if (k < 0)
      return fail(c, -errno, "waiting for beed: %s", strerror(errno));
    if (k == 0)
      continue;
    ssize_t r = recv(c->fd, buf + got, n - got, 0);
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0)
      return fail(c, -errno, "reading from beed: %s", strerror(errno));
    if (r == 0)
      return fail(c, BEE_ECLOSED,
                  "beed closed the connection (it stopped, "
                  "or ended the session: its log says why)");
    got += (size_t)r;
  }
  return 0;
}

/* beed's answer: WELCOME, GO, STEP or LOADED into *a; REFUSED is an
 * error with beed's reason. */
static int answer(beed_client *c, beed_answer *a) {
  uint8_t hdr[4], buf[ANSWER_MAX];
  uint64_t end = now_ms() + c->timeout_ms;
  int rc = read_full(c, hdr, 4, end);
  if (rc)
    return rc;
  uint32_t len = (uint32_t)hdr[0] << 24 | (uint32_t)hdr[1] << 16 |
                 (uint32_t)hdr[2] << 8 | hdr[3];
  if (len > sizeof buf)
    return fail(c, BEE_ETOOBIG, "beed sent %u bytes: no answer is so long",
                len);
  if ((rc = read_full(c, buf, len, end)))
    return rc;
  proto_local_msg m;
  if ((rc = proto_local_decode(buf, len, &m)))
    return fail(c, rc, "beed's answer does not decode: %s", bee_strerror(rc));
  if (m.type == PROTO_T_LOCAL_REFUSED)
    return fail(c, (int)m.code, "beed refused: %s", m.text);
  if (m.type != PROTO_T_LOCAL_WELCOME && m.type != PROTO_T_LOCAL_GO &&
      m.type != PROTO_T_LOCAL_STEP && m.type != PROTO_T_LOCAL_LOADED)
    return fail(c, -EPROTO, "beed sent message %d, not an answer", m.type);
  *a = (beed_answer){.type = m.type,
                     .epoch = m.epoch,
                     .loaded = m.loaded,
                     .apply = m.apply,
                     .mode = m.mode,
                     .target = m.target,
                     .samples = m.samples,
                     .peers = m.peers,
                     .inner_steps = m.inner_steps,
                     .outer_lr = m.outer_lr,
                     .outer_momentum = m.outer_momentum,
                     .delayed = m.delayed};
  _Static_assert(sizeof a->compression > PROTO_LOCAL_CODEC_MAX,
                 "a codec's name fits beed_answer");
  snprintf(a->compression, sizeof a->compression, "%s", m.compression);
  return 0;
}

static int connected(beed_client *c) {
  return c->fd >= 0 ? 0 : fail(c, BEE_ECLOSED, "not connected to beed");
}

int beed_client_hello(beed_client *c, const char *socket_path, const char *run,
                      int mode, uint64_t batch, unsigned timeout_ms,
                      beed_answer *a) {
  if (c->fd >= 0)
    return fail(c, -EISCONN, "already connected to beed");
  c->timeout_ms = timeout_ms ? timeout_ms : TIMEOUT_MS_DEFAULT;
  proto_local_msg h = {.type = PROTO_T_LOCAL_HELLO,
                       .mode = mode,
                       .batch = batch,
                       .list = c->t,
                       .n = c->n};
  if (strlen(run) >= sizeof h.run)
    return fail(c, BEE_ETOOBIG, "run name '%s' is too long", run);
  strcpy(h.run, run);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  if (strlen(socket_path) >= sizeof sa.sun_path)
    return fail(c, BEE_ETOOBIG, "%s: too long for a unix socket", socket_path);
  strcpy(sa.sun_path, socket_path);
  uint8_t *buf = malloc(PROTO_LOCAL_FRAME_MAX);
  if (!buf)
    return fail(c, -ENOMEM, "out of memory");
  size_t len;
  int rc = proto_local_encode(&h, buf, PROTO_LOCAL_FRAME_MAX, &len);
  if (rc) {
    free(buf);
    return fail(c, rc,
                "HELLO: %s (a run name of [A-Za-z0-9._-], a batch of "
                "at least 1, mode 0 or 1)",
                bee_strerror(rc));
  }
  c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (c->fd < 0 || connect(c->fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
    rc = fail(c, -errno, "cannot connect to beed at %s: %s", socket_path,
              strerror(errno));
    free(buf);
    if (c->fd >= 0)
      close(c->fd);
    c->fd = -1;
    return rc;
  }
  rc = send_frame(c, buf, len, c->mfd);
  free(buf);
  if (rc == -EPIPE || rc == -ECONNRESET) {
    /* beed closed early: a refusal sent before it read us waits here */
    char sent[sizeof c->err];
    memcpy(sent, c->err, sizeof sent);
    int r = answer(c, a);
    if (r && strncmp(c->err, "beed refused", 12) == 0)
      rc = r;
    else
      memcpy(c->err, sent, sizeof sent);
  } else if (rc == 0) {
    rc = answer(c, a);
  }
  if (rc == 0 && a->type != BEED_WELCOME)
    rc = fail(c, -EPROTO, "beed answered HELLO with message %d", a->type);
  if (rc) {
    close(c->fd);
    c->fd = -1;
  }
  return rc;
}

int beed_client_batch(beed_client *c, uint64_t samples, double loss,
                      beed_answer *a) {
  proto_local_msg m = {
      .type = PROTO_T_LOCAL_BATCH, .samples = samples, .loss = loss};
  int rc = connected(c);
  if (rc == 0)
    rc = send_msg(c, &m);
  return rc ? rc : answer(c, a);
}

int beed_client_stepped(beed_client *c, uint64_t epoch, beed_answer *a) {
  proto_local_msg m = {.type = PROTO_T_LOCAL_STEPPED, .epoch = epoch};
  int rc = connected(c);
  if (rc == 0)
    rc = send_msg(c, &m);
  return rc ? rc : answer(c, a);
}

int beed_client_eval(beed_client *c, uint64_t epoch, double loss,
                     double accuracy) {
  proto_local_msg m = {.type = PROTO_T_LOCAL_EVAL,
                       .epoch = epoch,
                       .loss = loss,
                       .accuracy = accuracy};
  int rc = connected(c);
  return rc ? rc : send_msg(c, &m);
}

void beed_client_close(beed_client *c) {
  if (!c)
    return;
  if (c->fd >= 0) {
    proto_local_msg m = {.type = PROTO_T_LOCAL_BYE};
    send_msg(c, &m);
  }
  free_client(c);
}
