/* local.c: a trainer process's session with beed (--model external;
 * the messages are proto's local-msg.c, docs/PROTOCOL.md section 13).
 *
 * The loop listens on --trainer-socket, a unix socket of mode 0600, and
 * takes one trainer at a time.  A connection's peer must run as beed's
 * user or as root (SO_PEERCRED); its HELLO is read on libuv's thread
 * pool, blocking, within BEE_LOCAL_HELLO_MS, and checked against this
 * beed's run: the run's name, the averaging mode, the tensors, and the
 * memory that came with it (SCM_RIGHTS): as large as the tensors take,
 * sealed against shrinking (a file that shrank under the mapping would
 * fault beed).  Whatever is wrong goes back as REFUSED with the reason,
 * and in the log.  A good HELLO's memory is mapped and the session goes
 * to the caller.
 *
 * Then the worker thread owns the connection and talks in turn with the
 * trainer, blocking (bee.h says who may touch the memory when).  It
 * polls its stop flag while it waits; its answers are sent without
 * blocking, so a trainer that does not read them ends its session
 * instead of stopping the worker.
 */
#define _GNU_SOURCE /* accept4, struct ucred, memfd seals */
#include "bee.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define COMP "trainer"
#define ANSWER_MAX 1024 /* bytes of any message beed sends */

struct bee_local_server {
  uv_loop_t *loop;
  const bee_config *cfg;
  int fd; /* listening */
  uv_poll_t poll;
  bool polling;
  bool closed;        /* the handle is: s is freed with the last HELLO read */
  bool busy;          /* a HELLO being read, or a session given out */
  bee_local *reading; /* the trainer whose HELLO is being read */
  char path[BEE_PATH_MAX];
  void (*on_session)(bee_local *l, void *arg);
  void *arg;
};

/* ---- frames ------------------------------------------------------------- */

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Waits until fd is readable: 0; 1 when stopped(arg) says stop; a
 * timeout past deadline (0: none). */
static int wait_readable(int fd, bool (*stopped)(void *), void *arg,
                         uint64_t deadline) {
  for (;;) {
    if (stopped && stopped(arg))
      return 1;
    int ms = BEE_LOCAL_POLL_MS;
    if (deadline) {
      uint64_t now = now_ms();
      if (now >= deadline)
        return BEE_ETIMEOUT;
      if (deadline - now < (uint64_t)ms)
        ms = (int)(deadline - now);
    }
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int n = poll(&p, 1, ms);
    if (n > 0)
      return 0;
    if (n < 0 && errno != EINTR)
      return -errno;
  }
}

/* Reads exactly n bytes; a descriptor that comes with them goes to *rfd
 * when rfd is given (any other is closed: -EPROTO). */
static int read_full(int fd, uint8_t *buf, size_t n, int *rfd,
                     bool (*stopped)(void *), void *arg, uint64_t deadline) {
  size_t got = 0;
  while (got < n) {
    int rc = wait_readable(fd, stopped, arg, deadline);
    if (rc)
      return rc;
    union {
      struct cmsghdr h;
      char b[CMSG_SPACE(4 * sizeof(int))];
    } ctl;
    struct iovec iov = {buf + got, n - got};
    struct msghdr mh = {.msg_iov = &iov,
                        .msg_iovlen = 1,
                        .msg_control = ctl.b,
                        .msg_controllen = sizeof ctl.b};
    ssize_t r = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (r < 0 && (errno == EINTR || errno == EAGAIN))
      continue;
    if (r < 0)
      return -errno;
    bool stray = (mh.msg_flags & MSG_CTRUNC) != 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
        continue;
      size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      int fds[4];
      memcpy(fds, CMSG_DATA(c), k * sizeof(int));
      for (size_t i = 0; i < k; i++) {
        if (rfd && *rfd < 0 && i == 0) {
          *rfd = fds[i];
        } else {
          close(fds[i]);
          stray = true;
        }
      }
    }
    if (stray)
      return -EPROTO;
    if (r == 0)
      return BEE_ECLOSED;
    got += (size_t)r;
  }
  return 0;
}

/* One message: its length, then its body into *buf (grown as needed,
 * up to PROTO_LOCAL_FRAME_MAX). */
static int read_frame(int fd, uint8_t **buf, size_t *cap, size_t *len, int *rfd,
                      bool (*stopped)(void *), void *arg, uint64_t deadline) {
  uint8_t hdr[4];
  int rc = read_full(fd, hdr, 4, rfd, stopped, arg, deadline);
  if (rc)
    return rc;
  uint32_t n = (uint32_t)hdr[0] << 24 | (uint32_t)hdr[1] << 16 |
               (uint32_t)hdr[2] << 8 | hdr[3];
  if (n > PROTO_LOCAL_FRAME_MAX)
    return BEE_ETOOBIG;
  if (n > *cap) {
    uint8_t *b = realloc(*buf, n);
    if (!b)
      return -ENOMEM;
    *buf = b;
    *cap = n;
  }
  *len = n;
  return read_full(fd, *buf, n, rfd, stopped, arg, deadline);
}

/* Sends m without blocking: a trainer that does not read its answers
 * gets no more. */
static int send_msg(int fd, const proto_local_msg *m) {
  uint8_t buf[4 + ANSWER_MAX];
  size_t len;
  int rc = proto_local_encode(m, buf + 4, ANSWER_MAX, &len);
  if (rc)
    return rc;
  buf[0] = (uint8_t)(len >> 24), buf[1] = (uint8_t)(len >> 16);
  buf[2] = (uint8_t)(len >> 8), buf[3] = (uint8_t)len;
  size_t off = 0, n = len + 4;
  while (off < n) {
    ssize_t w = send(fd, buf + off, n - off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0 && errno == EINTR)
      continue;
    if (w < 0)
      return errno == EAGAIN ? BEE_EQUEUE : -errno;
    off += (size_t)w;
  }
  return 0;
}

/* REFUSED with the reason, logged too. */
static void refuse(int fd, int code, const char *text) {
  proto_local_msg m = {.type = PROTO_T_LOCAL_REFUSED, .code = code};
  snprintf(m.text, sizeof m.text, "%s", text);
  bee_warn(COMP, "refused: %s", m.text);
  send_msg(fd, &m);
}

/* ---- HELLO -------------------------------------------------------------- */

static const char *role_name(int role) {
  return role == PROTO_LOCAL_PARAM   ? "parameter"
         : role == PROTO_LOCAL_STATE ? "optimizer state"
                                     : "buffer";
}

/* The regions' sizes and the schema from a checked HELLO. */
static void layout(bee_local *l, const proto_local_msg *m) {
  crypto_generichash_state h;
  crypto_generichash_init(&h, NULL, 0, sizeof l->schema);
  proto_bytes it = m->tensors;
  proto_local_tensor t;
  while (proto_local_tensor_next(&it, &t) == 0) {
    size_t *n = t.role == PROTO_LOCAL_PARAM   ? &l->nparams
                : t.role == PROTO_LOCAL_STATE ? &l->nstate
                                              : &l->nbuffers;
    *n += (size_t)t.elems;
    char line[96];
    int k = snprintf(line, sizeof line, " %d %d %u", t.role, t.dtype, t.ndim);
    crypto_generichash_update(&h, t.name.p, t.name.n);
    crypto_generichash_update(&h, (const uint8_t *)line, (size_t)k);
    for (unsigned d = 0; d < t.ndim; d++) {
      k = snprintf(line, sizeof line, " %llu", (unsigned long long)t.dims[d]);
      crypto_generichash_update(&h, (const uint8_t *)line, (size_t)k);
    }
    crypto_generichash_update(&h, (const uint8_t *)"\n", 1);
  }
  crypto_generichash_final(&h, l->schema, sizeof l->schema);
  char hex[17];
  proto_hex(l->schema, 8, hex);
  snprintf(l->desc, sizeof l->desc, "external:%s", hex);
  l->ntensors = m->n;
  l->mode = m->mode;
  l->batch = m->batch;
}

/* Maps the memory that came with HELLO: the size the tensors take,
 * sealed against shrinking.  why gets the reason of a refusal. */
static int map_memory(bee_local *l, int mfd, char *why, size_t cap) {
  size_t floats = 2 * l->nparams + l->nstate + l->nbuffers;
  uint64_t want = (uint64_t)floats * sizeof(float);
  struct stat st;
  if (fstat(mfd, &st) < 0)
    return bee_failf(why, cap, -errno, "the memory: %s", strerror(errno));
  if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size != want)
    return bee_failf(why, cap, BEE_ERANGE,
                     "the memory holds %lld bytes; the tensors take %llu "
                     "(parameters and their gradients, %zu floats each, "
                     "optimizer state %zu, buffers %zu)",
                     (long long)st.st_size, (unsigned long long)want,
                     l->nparams, l->nstate, l->nbuffers);
  int seals = fcntl(mfd, F_GET_SEALS);
  if (seals < 0 || !(seals & F_SEAL_SHRINK))
    return bee_failf(why, cap, BEE_ERANGE,
                     "the memory is not sealed against shrinking "
                     "(a memfd with F_SEAL_SHRINK)");
  void *p =
      mmap(NULL, (size_t)want, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
  if (p == MAP_FAILED)
    return bee_failf(why, cap, -errno, "cannot map %llu bytes: %s",
                     (unsigned long long)want, strerror(errno));
  l->mem = p;
  l->mem_len = (size_t)want;
  l->params = (float *)p;
  l->grads = l->params + l->nparams;
  l->state = l->grads + l->nparams;
  l->buffers = l->state + l->nstate;
  return 0;
}

/* A trainer's HELLO, read and checked on the thread pool. */
typedef struct hello_job {
  uv_work_t req;
  bee_local_server *s;
  bee_local *l;
  int rc;
} hello_job;

static void hello_work(uv_work_t *req) {
  hello_job *j = req->data;
  bee_local *l = j->l;
  const bee_config *cfg = j->s->cfg;
  uint8_t *buf = NULL;
  size_t cap = 0, len = 0;
  int mfd = -1;
  char why[PROTO_TEXT_MAX];
  proto_local_msg m;
  int rc = read_frame(l->fd, &buf, &cap, &len, &mfd, NULL, NULL,
                      now_ms() + BEE_LOCAL_HELLO_MS);
  if (rc) {
    bee_warn(COMP, "a trainer (pid %ld) sent no HELLO: %s", l->pid,
             rc == BEE_ETOOBIG ? "a message over the size limit"
                               : bee_strerror(rc));
    if (rc == BEE_ETOOBIG || rc == -EPROTO || rc == BEE_ETIMEOUT)
      refuse(l->fd, rc,
             rc == BEE_ETIMEOUT ? "no HELLO in time"
                                : "not a HELLO beed can read");
    goto out;
  }
  if ((rc = proto_local_decode(buf, len, &m)) ||
      m.type != PROTO_T_LOCAL_HELLO) {
    snprintf(why, sizeof why, "the first message is %s, not a HELLO",
             rc ? bee_strerror(rc) : "another message");
    rc = rc ? rc : -EPROTO;
    refuse(l->fd, rc, why);
    goto out;
  }
  int want_mode = cfg->averaging == BEE_AVG_DILOCO ? PROTO_LOCAL_DILOCO
                                                   : PROTO_LOCAL_GRADIENTS;
  if (strcmp(m.run, cfg->run) != 0) {
    snprintf(why, sizeof why,
             "the trainer's run is '%s'; this beed trains "
             "run '%s'",
             m.run, cfg->run);
    rc = BEE_ERANGE;
  } else if (m.mode != want_mode) {
    snprintf(why, sizeof why,
             "the trainer asks for %s; this beed's run "
             "averages %s (--averaging)",
             m.mode == PROTO_LOCAL_DILOCO ? "DiLoCo" : "gradients",
             bee_averaging_name(cfg->averaging));
    rc = BEE_ERANGE;
  } else if (mfd < 0) {
    snprintf(why, sizeof why,
             "no memory came with HELLO (a memfd, as "
             "SCM_RIGHTS)");
    rc = BEE_EMISSING;
  } else {
    layout(l, &m);
    rc = map_memory(l, mfd, why, sizeof why);
  }
  if (rc) {
    refuse(l->fd, rc, why);
    goto out;
  }
  if ((l->hello = malloc(len))) {
    memcpy(l->hello, buf, len);
    l->hello_len = len;
  }
  l->owe = true;
  proto_local_tensor t;
  proto_bytes it = m.tensors;
  size_t shown = 0;
  while (proto_local_tensor_next(&it, &t) == 0 && shown < 3)
    bee_debug(COMP, "tensor %zu: %.*s, %s, %llu floats", shown++, (int)t.name.n,
              (const char *)t.name.p, role_name(t.role),
              (unsigned long long)t.elems);
out:
  if (mfd >= 0)
    close(mfd); /* the mapping holds it */
  free(buf);
  j->rc = rc;
}

static void hello_done(uv_work_t *req, int status) {
  hello_job *j = req->data;
  bee_local_server *s = j->s;
  bee_local *l = j->l;
  free(j);
  s->reading = NULL;
  if (s->closed) { /* closed while the HELLO was read: the last user */
    bee_local_free(l);
    free(s);
    return;
  }
  if (status || !l->mem || !s->polling) { /* refused, or closing */
    bee_local_free(l);
    s->busy = false;
    return;
  }
  bee_info(COMP,
           "trainer pid %ld (uid %u): %zu tensors, %zu parameters, %zu "
           "floats of optimizer state, %zu of buffers, %llu samples a "
           "batch, %s; schema %s",
           l->pid, l->uid, l->ntensors, l->nparams, l->nstate, l->nbuffers,
           (unsigned long long)l->batch,
           l->mode == PROTO_LOCAL_DILOCO ? "DiLoCo" : "gradient averaging",
           l->desc);
  s->on_session(l, s->arg);
}

/* ---- the listener ------------------------------------------------------- */

static void accept_cb(uv_poll_t *p, int status, int events) {
  bee_local_server *s = p->data;
  (void)events;
  if (status < 0)
    return;
  int fd = accept4(s->fd, NULL, NULL, SOCK_CLOEXEC);
  if (fd < 0)
    return;
  struct ucred cr;
  socklen_t crl = sizeof cr;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &crl) < 0) {
    close(fd);
    return;
  }
  char why[160];
  if (cr.uid != 0 && cr.uid != geteuid()) {
    snprintf(why, sizeof why,
             "pid %ld runs as uid %u; this beed serves its "
             "own user (uid %u) and root",
             (long)cr.pid, (unsigned)cr.uid, (unsigned)geteuid());
    refuse(fd, BEE_EAUTH, why);
    close(fd);
    return;
  }
  if (s->busy) {
    snprintf(why, sizeof why, "pid %ld: another trainer is this beed's",
             (long)cr.pid);
    refuse(fd, BEE_ELIMIT, why);
    close(fd);
    return;
  }
  bee_local *l = calloc(1, sizeof *l);
  hello_job *j = calloc(1, sizeof *j);
  if (!l || !j) {
    free(l);
    free(j);
    close(fd);
    return;
  }
  l->fd = fd;
  l->pid = (long)cr.pid;
  l->uid = (unsigned)cr.uid;
  j->s = s;
  j->l = l;
  j->req.data = j;
  if (uv_queue_work(s->loop, &j->req, hello_work, hello_done)) {
    bee_local_free(l);
    free(j);
    return;
  }
  s->busy = true;
  s->reading = l;
}

int bee_local_listen(uv_loop_t *loop, const bee_config *cfg,
                     void (*on_session)(bee_local *l, void *arg), void *arg,
                     bee_local_server **out) {
  *out = NULL;
  const char *path = cfg->trainer_socket;
  int rc = bee_unix_path_claim(COMP, path);
  if (rc)
    return rc;
  bee_local_server *s = calloc(1, sizeof *s);
  if (!s)
    return -ENOMEM;
  s->loop = loop;
  s->cfg = cfg;
  s->on_session = on_session;
  s->arg = arg;
  snprintf(s->path, sizeof s->path, "%s", path);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  memcpy(sa.sun_path, path, strlen(path) + 1);
  s->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (s->fd < 0) {
    rc = -errno;
    free(s);
    bee_err(COMP, "%s: %s", path, strerror(-rc));
    return rc;
  }
  mode_t old = umask(0077); /* owner only from the start, no window */
  rc = bind(s->fd, (struct sockaddr *)&sa, sizeof sa) < 0 ? -errno : 0;
  umask(old);
  if (rc == 0 && chmod(path, 0600) < 0)
    rc = -errno;
  if (rc == 0 && listen(s->fd, 4) < 0)
    rc = -errno;
  if (rc == 0)
    rc = uv_poll_init(loop, &s->poll, s->fd);
  if (rc) {
    bee_err(COMP, "%s: %s", path, bee_strerror(rc));
    close(s->fd);
    unlink(path);
    free(s);
    return rc;
  }
  s->poll.data = s;
  s->polling = true;
  uv_poll_start(&s->poll, UV_READABLE, accept_cb);
  bee_info(COMP, "waiting for a trainer process on %s", path);
  *out = s;
  return 0;
}

void bee_local_idle(bee_local_server *s) {
  if (s)
    s->busy = false;
}

static void server_closed(uv_handle_t *h) {
  bee_local_server *s = h->data;
  close(s->fd);
  s->closed = true;
  if (!s->reading)
    free(s);
}

void bee_local_close(bee_local_server *s) {
  if (!s || !s->polling)
    return;
  s->polling = false;
  unlink(s->path);
  /* A HELLO being read ends now (its read sees the end of the stream),
   * so that a stop does not wait for it; the job frees s after it. */
  if (s->reading)
    shutdown(s->reading->fd, SHUT_RDWR);
  uv_close((uv_handle_t *)&s->poll, server_closed);
}

/* ---- the session, on the worker ----------------------------------------- */

void bee_local_release(bee_local *l) {
  if (!l)
    return;
  if (l->mem)
    munmap(l->mem, l->mem_len);
  l->mem = NULL;
  l->params = l->grads = l->state = l->buffers = NULL;
  if (l->fd >= 0)
    close(l->fd);
  l->fd = -1;
  free(l->rbuf);
  l->rbuf = NULL;
  l->rcap = 0;
  free(l->hello);
  l->hello = NULL;
}

void bee_local_refuse(bee_local *l, int code, const char *text) {
  if (l->fd >= 0)
    refuse(l->fd, code, text);
}

void bee_local_free(bee_local *l) {
  bee_local_release(l);
  free(l);
}

int bee_local_answer(bee_local *l, const proto_local_msg *w) {
  if (!l->owe)
    return 0;
  proto_local_msg m = {.epoch = w->epoch, .peers = w->peers};
  if (!l->welcomed) {
    m = *w;
    m.type = PROTO_T_LOCAL_WELCOME;
    m.loaded = l->loaded;
    m.samples = 0;
  } else if (l->loaded) {
    m.type = PROTO_T_LOCAL_LOADED;
  } else {
    m.type = PROTO_T_LOCAL_GO;
    m.samples = w->samples;
  }
  int rc = send_msg(l->fd, &m);
  if (rc) {
    bee_warn(COMP, "trainer pid %ld: cannot answer: %s", l->pid,
             rc == BEE_EQUEUE ? "it does not read its answers"
                              : bee_strerror(rc));
    return rc;
  }
  l->owe = l->loaded = false;
  l->welcomed = true;
  return 0;
}

/* The trainer's next message of type want (EVALs on the way are kept);
 * a BYE, anything else, or a closed connection end the session. */
static int next(bee_local *l, int want, proto_local_msg *m,
                bool (*stopped)(void *), void *arg) {
  for (;;) {
    size_t len;
    int rc = read_frame(l->fd, &l->rbuf, &l->rcap, &len, NULL, stopped, arg, 0);
    if (rc == 1)
      return 1;
    if (rc == 0)
      rc = proto_local_decode(l->rbuf, len, m);
    if (rc == 0 && m->type == PROTO_T_LOCAL_EVAL) {
      l->evaluated = true;
      l->eval_epoch = m->epoch;
      l->eval_loss = m->loss;
      l->eval_acc = m->accuracy;
      continue;
    }
    if (rc == 0 && m->type == want)
      return 0;
    if (rc == 0 && m->type == PROTO_T_LOCAL_BYE) {
      bee_info(COMP, "trainer pid %ld said goodbye", l->pid);
      return BEE_ECLOSED;
    }
    if (rc == BEE_ECLOSED)
      bee_warn(COMP, "trainer pid %ld closed its connection", l->pid);
    else if (rc)
      bee_warn(COMP, "trainer pid %ld: %s", l->pid,
               rc == -EPROTO ? "a descriptor where none belongs"
                             : bee_strerror(rc));
    else
      bee_warn(COMP, "trainer pid %ld: message %d out of turn", l->pid,
               m->type);
    return rc ? rc : -EPROTO;
  }
}

int bee_local_batch(bee_local *l, bool (*stopped)(void *arg), void *arg,
                    uint64_t *samples, double *loss) {
  proto_local_msg m;
  int rc = next(l, PROTO_T_LOCAL_BATCH, &m, stopped, arg);
  if (rc)
    return rc;
  l->owe = true;
  *samples = m.samples;
  *loss = m.loss;
  return 0;
}

int bee_local_step(bee_local *l, uint64_t epoch, bool apply,
                   bool (*stopped)(void *arg), void *arg) {
  proto_local_msg m = {
      .type = PROTO_T_LOCAL_STEP, .epoch = epoch, .apply = apply};
  int rc = send_msg(l->fd, &m);
  if (rc) {
    bee_warn(COMP, "trainer pid %ld: cannot send the step: %s", l->pid,
             bee_strerror(rc));
    return rc;
  }
  l->owe = false;
  if ((rc = next(l, PROTO_T_LOCAL_STEPPED, &m, stopped, arg)))
    return rc;
  if (m.epoch != epoch) {
    bee_warn(COMP, "trainer pid %ld stepped epoch %llu, not %llu", l->pid,
             (unsigned long long)m.epoch, (unsigned long long)epoch);
    return -EPROTO;
  }
  l->owe = true;
  return 0;
}
