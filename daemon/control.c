/* control.c: the local control socket (--control PATH).
 *
 * A unix stream socket, mode 0600, on the daemon's loop.  A client sends
 * one line, "status" or "leave", and gets lines of text back, then the
 * connection closes:
 *   status  "key value" lines (see bee_control_cb), then "end"
 *   leave   "leaving", and the daemon stops as on SIGTERM
 *   other   "error unknown command"
 * A client that sends nothing within CLIENT_MS, or more than LINE_MAX
 * bytes without a newline, is closed.  beectl status and beectl leave
 * are the clients.  A socket file left by a daemon that died is replaced;
 * one that a live daemon answers on is not.
 */
#include "bee.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define COMP "control"
#define LINE_MAX_BYTES 64
#define CLIENT_MS 2000
#define REPLY_MAX 4096

typedef struct client {
  uv_pipe_t pipe;
  uv_timer_t timer;
  bee_control *c;
  char line[LINE_MAX_BYTES + 1];
  size_t n;
  int closing; /* handles still to close */
  uv_write_t wr;
  char *reply;
} client;

static void client_closed(uv_handle_t *h) {
  client *k = h->data;
  if (--k->closing == 0) {
    free(k->reply);
    free(k);
  }
}

static void client_close(client *k) {
  if (k->closing)
    return;
  k->closing = 2;
  uv_timer_stop(&k->timer);
  uv_close((uv_handle_t *)&k->timer, client_closed);
  uv_close((uv_handle_t *)&k->pipe, client_closed);
}

static void written(uv_write_t *w, int status) {
  (void)status;
  client_close(w->data);
}

static void reply(client *k, const char *text) {
  size_t n = strlen(text);
  k->reply = malloc(n ? n : 1);
  if (!k->reply) {
    client_close(k);
    return;
  }
  memcpy(k->reply, text, n);
  uv_buf_t b = uv_buf_init(k->reply, (unsigned)n);
  k->wr.data = k;
  uv_read_stop((uv_stream_t *)&k->pipe);
  if (uv_write(&k->wr, (uv_stream_t *)&k->pipe, &b, 1, written))
    client_close(k);
}

static void command(client *k) {
  bee_control *c = k->c;
  k->line[k->n] = '\0';
  if (strcmp(k->line, "status") == 0) {
    char *buf = malloc(REPLY_MAX);
    if (!buf) {
      client_close(k);
      return;
    }
    size_t n = c->status(c->arg, buf, REPLY_MAX - 8);
    snprintf(buf + n, REPLY_MAX - n, "end\n");
    reply(k, buf);
    free(buf);
  } else if (strcmp(k->line, "leave") == 0) {
    bee_info(COMP, "asked to leave");
    reply(k, "leaving\n");
    c->leave(c->arg);
  } else {
    char safe[LINE_MAX_BYTES + 1];
    bee_printable(k->line, k->n, safe, sizeof safe);
    bee_info(COMP, "unknown command '%s'", safe);
    reply(k, "error unknown command\n");
  }
}

static void alloc_cb(uv_handle_t *h, size_t want, uv_buf_t *b) {
  client *k = h->data;
  (void)want;
  b->base = k->line + k->n;
  b->len = LINE_MAX_BYTES - k->n;
}

static void read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *b) {
  client *k = s->data;
  (void)b;
  if (nread < 0) {
    client_close(k);
    return;
  }
  size_t start = k->n;
  k->n += (size_t)nread;
  for (size_t i = start; i < k->n; i++)
    if (k->line[i] == '\n') {
      k->n = i > 0 && k->line[i - 1] == '\r' ? i - 1 : i;
      command(k);
      return;
    }
  if (k->n >= LINE_MAX_BYTES) {
    bee_info(COMP, "a client sent %d bytes without a newline; closed",
             LINE_MAX_BYTES);
    client_close(k);
  }
}

static void timeout_cb(uv_timer_t *t) {
  client_close(t->data);
}

static void connection_cb(uv_stream_t *server, int status) {
  bee_control *c = server->data;
  if (status < 0)
    return;
  client *k = calloc(1, sizeof *k);
  if (!k)
    return;
  k->c = c;
  uv_pipe_init(c->loop, &k->pipe, 0);
  uv_timer_init(c->loop, &k->timer);
  k->pipe.data = k->timer.data = k;
  if (uv_accept(server, (uv_stream_t *)&k->pipe) ||
      uv_read_start((uv_stream_t *)&k->pipe, alloc_cb, read_cb)) {
    client_close(k);
    return;
  }
  uv_timer_start(&k->timer, timeout_cb, CLIENT_MS, 0);
}

/* Is a daemon answering on path?  (A connect that works says yes.) */
static bool live(const char *path) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof sa.sun_path)
    return false;
  strcpy(sa.sun_path, path);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return false;
  bool up = connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
  close(fd);
  return up;
}

int bee_unix_path_claim(const char *comp, const char *path) {
  struct sockaddr_un sa;
  if (strlen(path) >= sizeof sa.sun_path) {
    bee_err(comp, "%s: longer than a unix socket path may be (%zu bytes)", path,
            sizeof sa.sun_path - 1);
    return BEE_ETOOBIG;
  }
  struct stat st;
  if (lstat(path, &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      bee_err(comp, "%s exists and is not a socket", path);
      return -EEXIST;
    }
    if (live(path)) {
      bee_err(comp, "%s: another beed answers there", path);
      return -EADDRINUSE;
    }
    unlink(path); /* left by a daemon that died */
  }
  return 0;
}

int bee_control_start(bee_control *c, uv_loop_t *loop, const char *path,
                      size_t (*status)(void *arg, char *buf, size_t cap),
                      void (*leave)(void *arg), void *arg) {
  memset(c, 0, sizeof *c);
  c->loop = loop;
  c->status = status;
  c->leave = leave;
  c->arg = arg;
  snprintf(c->path, sizeof c->path, "%s", path);
  int rc = bee_unix_path_claim(COMP, path);
  if (rc)
    return rc;
  uv_pipe_init(loop, &c->pipe, 0);
  c->pipe.data = c;
  c->open = true;
  mode_t old = umask(0077); /* owner only from the start, no window */
  rc = uv_pipe_bind(&c->pipe, path);
  umask(old);
  if (rc == 0 && chmod(path, 0600) < 0)
    rc = uv_translate_sys_error(errno);
  if (rc == 0)
    rc = uv_listen((uv_stream_t *)&c->pipe, 8, connection_cb);
  if (rc) {
    bee_err(COMP, "%s: %s", path, uv_strerror(rc));
    return rc;
  }
  c->bound = true;
  bee_info(COMP, "listening on %s (beectl status, beectl leave)", path);
  return 0;
}

void bee_control_stop(bee_control *c) {
  if (!c->open)
    return;
  c->open = false;
  uv_close((uv_handle_t *)&c->pipe, NULL);
  if (c->bound)
    unlink(c->path);
}
