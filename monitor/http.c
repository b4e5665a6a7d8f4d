/* http.c: trainmonitor's web server (libwebsockets on the program's
 * libuv loop).
 *
 *   GET /                   the dashboard (dashboard.html, compiled in),
 *   GET /dashboard.js, .css its script and style (no inline ones: the
 *                           page's Content-Security-Policy forbids them)
 *   GET /api/snapshot       mon_snapshot_json
 *   GET /api/history?since=MS[&points=N]  mon_history_json
 *   GET /favicon.svg        the page's icon
 *   GET /api/links          mon_links_json
 *   GET /metrics            mon_prometheus
 *   /ws (websocket)         the snapshot on connect, then one per scrape;
 *                           {"type":"history","since":MS,"points":N}
 *                           asked of it gets {"type":"history","data":[...]}
 *
 * With a token every request for data (/api/..., /metrics, /ws) must
 * carry "Authorization: Bearer TOKEN" or "?token=TOKEN" (browsers cannot
 * set headers on a websocket), compared in constant time; the page and
 * its script and style hold no data and load without it.  A websocket client that has not taken the last
 * update when the next one comes skips to the newest: a slow client costs
 * one pending message and a capped kernel buffer (WS_SNDBUF), never a
 * queue.
 */
#include "trainmonitor.h"

#include <arpa/inet.h>
#include <errno.h>
#include <libwebsockets.h>
#include <netinet/in.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define COMP "http"
#define CHUNK 16384 /* bytes written per HTTP writeable callback */
/* A websocket client's kernel send buffer (the kernel doubles it): what a
 * client that does not read can hold up, beside its one pending update.
 * Without a cap Linux grows it to megabytes per client. */
#define WS_SNDBUF (32 * 1024)
#define WS_REQ_MAX 256       /* the longest request a client may send */
#define WS_HISTORY_MAX 20000 /* points one history answer may hold */

/* One update, shared by the websocket clients that have yet to send it. */
typedef struct msg {
  unsigned refs;
  size_t len;
  unsigned char data[]; /* LWS_PRE bytes of room, then len bytes */
} msg;

typedef struct session {
  /* HTTP: the response body being written */
  mon_buf body;
  size_t sent;
  /* websocket: the update to send next, the answer to a request, what
   * the client has sent of its request so far, and the list of clients */
  msg *pending;
  msg *reply;
  char req[WS_REQ_MAX];
  size_t reqn;
  bool req_over;
  struct lws *wsi;
  struct session *prev, *next;
} session;

struct mon_http {
  struct lws_context *ctx;
  mon *m;
  char token[128];
  bool has_token;
  session *clients; /* websocket sessions */
  unsigned nclients;
  uint64_t skipped; /* updates a slow client never sent */
  bool stopping;
};

static void msg_unref(msg *g) {
  if (g && --g->refs == 0)
    free(g);
}

static msg *msg_of(const mon_buf *b) {
  msg *g = malloc(sizeof *g + LWS_PRE + b->len);
  if (!g)
    return NULL;
  g->refs = 1;
  g->len = b->len;
  memcpy(g->data + LWS_PRE, b->p, b->len);
  return g;
}

static bool token_ok(mon_http *h, struct lws *wsi) {
  if (!h->has_token)
    return true;
  char got[160] = "";
  size_t want = strlen(h->token);
  if (lws_hdr_copy(wsi, got, sizeof got, WSI_TOKEN_HTTP_AUTHORIZATION) > 0 &&
      strncmp(got, "Bearer ", 7) == 0 && strlen(got + 7) == want &&
      sodium_memcmp(got + 7, h->token, want) == 0)
    return true;
  const char *arg = lws_get_urlarg_by_name(wsi, "token=", got, sizeof got);
  return arg && strlen(arg) == want && sodium_memcmp(arg, h->token, want) == 0;
}

/* Starts an HTTP response of body b (taken) with the type; the writeable
 * callback sends it.  Returns -1 to close the connection. */
static int respond(struct lws *wsi, session *s, unsigned status,
                   const char *type, mon_buf *b) {
  unsigned char hdr[LWS_PRE + 512], *start = hdr + LWS_PRE, *p = start,
                                    *end = hdr + sizeof hdr - 1;
  s->body = *b;
  s->sent = 0;
  memset(b, 0, sizeof *b);
  if (lws_add_http_common_headers(wsi, status, type, s->body.len, &p, end) ||
      lws_add_http_header_by_token(wsi, WSI_TOKEN_HTTP_CACHE_CONTROL,
                                   (const unsigned char *)"no-store", 8, &p,
                                   end) ||
      lws_finalize_write_http_header(wsi, start, &p, end))
    return -1;
  lws_callback_on_writable(wsi);
  return 0;
}

static int respond_text(struct lws *wsi, session *s, unsigned status,
                        const char *text) {
  mon_buf b = {0};
  mon_buf_printf(&b, "%s\n", text);
  if (b.oom)
    return -1;
  return respond(wsi, s, status, "text/plain", &b);
}

static int on_http(mon_http *h, struct lws *wsi, session *s, const char *uri) {
  /* The page, its script and its style hold no data and load without the
   * token (a browser asks for the script and the style without the
   * page's ?token=); the data needs it. */
  bool page = !strcmp(uri, "/") || !strcmp(uri, "/index.html") ||
              !strcmp(uri, "/dashboard.js") || !strcmp(uri, "/dashboard.css") ||
              !strcmp(uri, "/favicon.svg");
  if (!page && !token_ok(h, wsi))
    return respond_text(wsi, s, HTTP_STATUS_UNAUTHORIZED,
                        "a token is needed (--http-token)");
  mon_buf b = {0};
  int rc = 0;
  const char *type = "application/json";
  if (strcmp(uri, "/") == 0 || strcmp(uri, "/index.html") == 0) {
    mon_buf_printf(&b, "%s", mon_dashboard_html);
    type = "text/html";
  } else if (strcmp(uri, "/dashboard.js") == 0) {
    mon_buf_printf(&b, "%s", mon_dashboard_js);
    type = "application/javascript";
  } else if (strcmp(uri, "/dashboard.css") == 0) {
    mon_buf_printf(&b, "%s", mon_dashboard_css);
    type = "text/css";
  } else if (strcmp(uri, "/favicon.svg") == 0) { /* the page's icon: a cell */
    mon_buf_printf(&b,
                   "<svg xmlns='http://www.w3.org/2000/svg' "
                   "viewBox='0 0 16 16'><path d='M8 1l6 3.5v7L8 15l-6-3.5v-7z' "
                   "fill='#d99a1c'/></svg>\n");
    type = "image/svg+xml";
  } else if (strcmp(uri, "/api/snapshot") == 0) {
    rc = mon_snapshot_json(h->m, &b);
  } else if (strcmp(uri, "/api/history") == 0) {
    char v[32];
    const char *since = lws_get_urlarg_by_name(wsi, "since=", v, sizeof v);
    uint64_t since_ms = since ? strtoull(since, NULL, 10) : 0;
    const char *pts = lws_get_urlarg_by_name(wsi, "points=", v, sizeof v);
    size_t points = pts ? (size_t)strtoull(pts, NULL, 10) : 2000;
    rc = mon_history_json(h->m, since_ms, points, &b);
  } else if (strcmp(uri, "/api/links") == 0) {
    rc = mon_links_json(h->m, &b);
  } else if (strcmp(uri, "/metrics") == 0) {
    rc = mon_prometheus(h->m, &b);
    type = "text/plain; version=0.0.4";
  } else {
    return respond_text(wsi, s, HTTP_STATUS_NOT_FOUND, "not found");
  }
  if (rc || b.oom) {
    mon_buf_free(&b);
    return respond_text(wsi, s, HTTP_STATUS_INTERNAL_SERVER_ERROR,
                        "out of memory");
  }
  return respond(wsi, s, HTTP_STATUS_OK, type, &b);
}

static int http_writeable(struct lws *wsi, session *s) {
  size_t n = s->body.len - s->sent;
  if (n > CHUNK)
    n = CHUNK;
  unsigned char buf[LWS_PRE + CHUNK];
  memcpy(buf + LWS_PRE, s->body.p + s->sent, n);
  bool last = s->sent + n == s->body.len;
  if (lws_write(wsi, buf + LWS_PRE, n,
                last ? LWS_WRITE_HTTP_FINAL : LWS_WRITE_HTTP) != (int)n)
    return -1;
  s->sent += n;
  if (!last) {
    lws_callback_on_writable(wsi);
    return 0;
  }
  mon_buf_free(&s->body);
  return lws_http_transaction_completed(wsi) ? -1 : 0;
}

/* The snapshot as a websocket message: {"type":"snapshot",...}. */
static msg *snapshot_msg(mon_http *h) {
  mon_buf b = {0};
  mon_buf_printf(&b, "{\"type\":\"snapshot\",\"data\":");
  mon_snapshot_json(h->m, &b);
  mon_buf_printf(&b, "}");
  msg *g = b.oom ? NULL : msg_of(&b);
  mon_buf_free(&b);
  return g;
}

/* A number after "key": in the request, or def when there is none. */
static uint64_t req_num(const char *req, const char *key, uint64_t def) {
  const char *p = strstr(req, key);
  if (!p)
    return def;
  p += strlen(key);
  while (*p == ' ' || *p == ':')
    p++;
  char *end;
  unsigned long long v = strtoull(p, &end, 10);
  return end == p || *p == '-' ? def : (uint64_t)v;
}

/* Answers a request a websocket client sent: {"type":"history",
 * "since":MS,"points":N} gets the history; anything else an error.  One
 * answer waits at a time: a new request replaces an unsent answer. */
static void answer(mon_http *h, session *s, struct lws *wsi) {
  mon_buf b = {0};
  if (!s->req_over && strstr(s->req, "\"type\"") &&
      strstr(s->req, "\"history\"")) {
    uint64_t since = req_num(s->req, "\"since\"", 0);
    uint64_t points = req_num(s->req, "\"points\"", 2000);
    if (points == 0 || points > WS_HISTORY_MAX)
      points = WS_HISTORY_MAX;
    mon_buf_printf(&b, "{\"type\":\"history\",\"data\":");
    mon_history_json(h->m, since, (size_t)points, &b);
    mon_buf_printf(&b, "}");
  } else {
    mon_buf_printf(&b, "{\"type\":\"error\",\"error\":\"%s\"}",
                   s->req_over ? "request too long"
                               : "unknown request: ask for type history");
  }
  msg *g = b.oom ? NULL : msg_of(&b);
  mon_buf_free(&b);
  if (!g)
    return;
  msg_unref(s->reply);
  s->reply = g;
  lws_callback_on_writable(wsi);
}

static int callback(struct lws *wsi, enum lws_callback_reasons reason,
                    void *user, void *in, size_t len) {
  struct lws_context *ctx = lws_get_context(wsi);
  mon_http *h = ctx ? lws_context_user(ctx) : NULL;
  session *s = user;
  (void)len;
  switch (reason) {
  case LWS_CALLBACK_HTTP: return on_http(h, wsi, s, in);
  case LWS_CALLBACK_HTTP_WRITEABLE:
    return s->body.p ? http_writeable(wsi, s) : 0;
  case LWS_CALLBACK_FILTER_PROTOCOL_CONNECTION:
    return token_ok(h, wsi) ? 0 : 1; /* websocket: the same token */
  case LWS_CALLBACK_ESTABLISHED: {
    int fd = (int)lws_get_socket_fd(wsi), sz = WS_SNDBUF;
    if (fd >= 0)
      setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
    s->wsi = wsi;
    s->pending = snapshot_msg(h);
    s->prev = NULL;
    s->next = h->clients;
    if (h->clients)
      h->clients->prev = s;
    h->clients = s;
    h->nclients++;
    lws_callback_on_writable(wsi);
    return 0;
  }
  case LWS_CALLBACK_SERVER_WRITEABLE: {
    /* An answer first; the newest update after it. */
    msg **slot = s->reply ? &s->reply : &s->pending, *g = *slot;
    if (!g)
      return 0;
    *slot = NULL;
    int n = lws_write(wsi, g->data + LWS_PRE, g->len, LWS_WRITE_TEXT);
    bool ok = n == (int)g->len;
    msg_unref(g);
    if (ok && s->pending)
      lws_callback_on_writable(wsi);
    return ok ? 0 : -1;
  }
  case LWS_CALLBACK_RECEIVE:
    if (s->reqn + len > sizeof s->req - 1)
      s->req_over = true;
    else {
      memcpy(s->req + s->reqn, in, len);
      s->reqn += len;
    }
    if (!lws_is_final_fragment(wsi))
      return 0;
    s->req[s->reqn] = 0;
    answer(h, s, wsi);
    s->reqn = 0;
    s->req_over = false;
    return 0;
  case LWS_CALLBACK_CLOSED:
    msg_unref(s->pending);
    msg_unref(s->reply);
    s->pending = s->reply = NULL;
    if (s->prev)
      s->prev->next = s->next;
    else if (h->clients == s)
      h->clients = s->next;
    if (s->next)
      s->next->prev = s->prev;
    h->nclients--;
    return 0;
  case LWS_CALLBACK_HTTP_DROP_PROTOCOL:
  case LWS_CALLBACK_CLOSED_HTTP: mon_buf_free(&s->body); return 0;
  default: return lws_callback_http_dummy(wsi, reason, user, in, len);
  }
}

static const struct lws_protocols protocols[] = {
    {"beed-monitor", callback, sizeof(session), 65536, 0, NULL, 0},
    {NULL, NULL, 0, 0, 0, NULL, 0}};

/* Whether host:port can be bound, tried with a socket of our own first:
 * libwebsockets cannot recover from a failed bind (above). */
static int can_bind(const char *host, int port) {
  struct sockaddr_storage ss;
  memset(&ss, 0, sizeof ss);
  socklen_t len;
  struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
  struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&ss;
  if (inet_pton(AF_INET, host, &a4->sin_addr) == 1) {
    a4->sin_family = AF_INET;
    a4->sin_port = htons((uint16_t)port);
    len = sizeof *a4;
  } else if (inet_pton(AF_INET6, host, &a6->sin6_addr) == 1) {
    a6->sin6_family = AF_INET6;
    a6->sin6_port = htons((uint16_t)port);
    len = sizeof *a6;
  } else {
    return BEE_ECONFIG;
  }
  int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -errno;
  int one = 1, rc = 0;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(fd, (struct sockaddr *)&ss, len) != 0 || listen(fd, 1) != 0)
    rc = -errno;
  close(fd);
  return rc;
}

int mon_http_start(const mon_http_config *cfg, mon_http **out) {
  *out = NULL;
  int rc = can_bind(cfg->host, cfg->port);
  if (rc)
    return rc;
  mon_http *h = calloc(1, sizeof *h);
  if (!h)
    return -ENOMEM;
  h->m = cfg->m;
  if (cfg->token && cfg->token[0]) {
    if (strlen(cfg->token) >= sizeof h->token) {
      free(h);
      return BEE_ECONFIG;
    }
    snprintf(h->token, sizeof h->token, "%s", cfg->token);
    h->has_token = true;
  }
  void *loops[1] = {cfg->loop};
  struct lws_context_creation_info info;
  memset(&info, 0, sizeof info);
  info.port = cfg->port;
  info.iface = cfg->host;
  info.protocols = protocols;
  info.user = h;
  info.options = LWS_SERVER_OPTION_LIBUV |
                 LWS_SERVER_OPTION_HTTP_HEADERS_SECURITY_BEST_PRACTICES_ENFORCE;
  info.foreign_loops = loops;
  info.pcontext = &h->ctx; /* lws clears it once the context is gone */
  lws_set_log_level(LLL_ERR, NULL);
  h->ctx = lws_create_context(&info);
  if (h->ctx && !lws_get_vhost_by_name(h->ctx, "default")) {
    /* The bind failed after our own try succeeded (a race).  libwebsockets
     * 4.1 leaves handles on the loop that call into its unloaded event
     * library plugin then, so neither running the loop nor destroying
     * the context is safe: stop here. */
    bee_err(COMP, "cannot listen on %s:%d (libwebsockets has logged why)",
            cfg->host, cfg->port);
    _exit(1);
  }
  if (!h->ctx) {
    /* Our own bind above succeeded: the likely cause is libwebsockets'
     * libuv support, a plugin ldd does not show, missing. */
    bee_err(COMP, "libwebsockets could not start (it logged why): its libuv "
                  "event library plugin (Debian: libwebsockets-evlib-uv) is "
                  "needed");
    free(h);
    return -ELIBACC;
  }
  *out = h;
  return 0;
}

void mon_http_update(mon_http *h) {
  if (!h || !h->clients)
    return;
  msg *g = snapshot_msg(h);
  if (!g)
    return;
  /* Each client gets the newest; one that still holds an older update
   * skips it for this one. */
  for (session *s = h->clients; s; s = s->next) {
    if (s->pending) {
      msg_unref(s->pending);
      h->skipped++;
    }
    g->refs++;
    s->pending = g;
    lws_callback_on_writable(s->wsi);
  }
  msg_unref(g);
}

void mon_http_counts(const mon_http *h, unsigned *clients, uint64_t *skipped) {
  *clients = h ? h->nclients : 0;
  *skipped = h ? h->skipped : 0;
}

void mon_http_stop(mon_http *h) {
  if (h && h->ctx && !h->stopping) {
    h->stopping = true;
    lws_context_destroy(h->ctx); /* finishes on the loop */
  }
}

void mon_http_free(mon_http *h) {
  if (!h)
    return;
  if (h->ctx) /* what the loop did not finish */
    lws_context_destroy(h->ctx);
  free(h);
}
