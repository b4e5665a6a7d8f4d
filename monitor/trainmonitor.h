/* trainmonitor.h: what trainmonitor's own files share (the program, not
 * the monitor library: monitor.h is that). */
#ifndef BEE_TRAINMONITOR_H
#define BEE_TRAINMONITOR_H

#include "monitor.h"

#include <uv.h>

/* The dashboard: its page, script and style (dashboard.html, .js, .css,
 * embedded at build time). */
extern const char mon_dashboard_html[];
extern const char mon_dashboard_js[];
extern const char mon_dashboard_css[];

typedef struct mon_http mon_http;

typedef struct mon_http_config {
  uv_loop_t *loop;
  const char *host; /* address to bind, e.g. "127.0.0.1" */
  int port;
  const char *token; /* NULL or "": no access control */
  mon *m;            /* borrowed: what the pages show */
} mon_http_config;

/* Serves HTTP and websockets on cfg->loop (cfg->host numeric).  Returns 0,
 * BEE_ECONFIG (a token over 127 bytes, a host that is not an address), or
 * -errno when the address cannot be bound (-EADDRINUSE, -EACCES...). */
int mon_http_start(const mon_http_config *cfg, mon_http **out);
/* A scrape happened: the websocket clients get the new snapshot. */
void mon_http_update(mon_http *h);
/* Websocket clients now, and updates skipped for slow ones so far. */
void mon_http_counts(const mon_http *h, unsigned *clients, uint64_t *skipped);
/* Closes the server: its connections and handles close as the loop runs
 * on.  Accepts NULL. */
void mon_http_stop(mon_http *h);
/* Frees h once the loop has run out (after mon_http_stop).  Accepts NULL. */
void mon_http_free(mon_http *h);

#endif /* BEE_TRAINMONITOR_H */
