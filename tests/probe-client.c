/* probe-client.c: a peer that asks a beed for link probes, well and
 * badly, for tests/test-net-probe.sh.
 *
 *   probe-client HOST:PORT
 *
 * Joins the open swarm "beed" as a bee with a throwaway identity and, on
 * its control connection to HOST:PORT:
 *   1. asks one probe with a payload: refused as malformed;
 *   2. asks one probe: answered with 65536 bytes;
 *   3. asks CALLS probes at once: at most the budget's worth (32 MiB a
 *      minute) answered, the rest refused with ELIMIT (over the budget, or
 *      while a probe's worth waits to go to it), none lost.
 * Prints one line per step; exits 0 when each went so, 1 otherwise.
 */
#include "proto.h"

#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CALLS 600
#define PROBE_BYTES 65536
#define BUDGET_CALLS 512 /* 32 MiB of 64 KiB answers */

static uv_loop_t loop;
static proto_host *host;
static int step, fails, answered, refused, other, pending;
static proto_conn *conn;

static void next(void);

static void done(void) { proto_host_close(host); }

static void one_cb(proto_conn *c, int status, int64_t remote_code,
                   proto_bytes payload, void *arg) {
  (void)c, (void)arg;
  if (step == 1) {
    bool ok = status == BEE_EREMOTE && remote_code == BEE_EMALFORMED;
    printf("probe with a payload: %s (%s)\n", ok ? "refused" : "NOT refused",
           status == BEE_EREMOTE ? bee_errname((int)remote_code)
                                 : bee_strerror(status));
    fails += !ok;
  } else {
    bool ok = status == 0 && payload.n == PROBE_BYTES;
    printf("probe: %s, %zu bytes\n", ok ? "answered" : "NOT answered",
           payload.n);
    fails += !ok;
  }
  next();
}

static void many_cb(proto_conn *c, int status, int64_t remote_code,
                    proto_bytes payload, void *arg) {
  (void)c, (void)arg;
  if (status == 0 && payload.n == PROBE_BYTES)
    answered++;
  else if (status == BEE_EREMOTE && remote_code == BEE_ELIMIT)
    refused++;
  else
    other++;
  if (--pending == 0) {
    bool ok = answered + refused == CALLS && answered <= BUDGET_CALLS &&
              refused >= CALLS - BUDGET_CALLS && other == 0;
    printf("%d probes at once: %d answered, %d refused (limit), %d other: "
           "%s\n",
           CALLS, answered, refused, other, ok ? "ok" : "NOT as expected");
    fails += !ok;
    next();
  }
}

static void next(void) {
  uint64_t id;
  step++;
  if (step == 1) {
    if (proto_conn_call(conn, "swarm.probe", (const uint8_t *)"x", 1, 10000,
                        one_cb, NULL, &id))
      fails++, done();
  } else if (step == 2) {
    if (proto_conn_call(conn, "swarm.probe", NULL, 0, 10000, one_cb, NULL, &id))
      fails++, done();
  } else if (step == 3) {
    for (int i = 0; i < CALLS; i++)
      if (proto_conn_call(conn, "swarm.probe", NULL, 0, 60000, many_cb, NULL,
                          &id) == 0)
        pending++;
      else
        other++;
    if (pending == 0)
      fails++, done();
  } else {
    done();
  }
}

static void connect_cb(proto_host *h, proto_conn *c, int status, void *arg) {
  (void)h, (void)arg;
  if (!c) {
    fprintf(stderr, "probe-client: cannot connect: %s\n", bee_strerror(status));
    fails++;
    done();
    return;
  }
  conn = c;
  next();
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: probe-client HOST:PORT\n");
    return 2;
  }
  if (sodium_init() < 0)
    return 1;
  uv_loop_init(&loop);
  proto_identity id;
  proto_identity_generate(&id);
  proto_host_config cfg;
  proto_host_config_default(&cfg);
  cfg.loop = &loop;
  cfg.auth = (proto_auth){.id = &id,
                          .swarm = "beed",
                          .accept_roles = PROTO_ROLES_ALL,
                          .ciphers = PROTO_CIPHERS_ALL};
  int rc = proto_host_new(&cfg, &host);
  if (rc == 0)
    rc = proto_host_connect(host, argv[1], PROTO_PURPOSE_CONTROL, connect_cb,
                            NULL);
  if (rc) {
    fprintf(stderr, "probe-client: %s\n", bee_strerror(rc));
    return 1;
  }
  uv_run(&loop, UV_RUN_DEFAULT);
  uv_loop_close(&loop);
  proto_identity_clear(&id);
  return fails ? 1 : 0;
}
