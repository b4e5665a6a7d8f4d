/* bench-dht.h: what the DHT benchmark's coordinator and its node workers
 * say to each other, and the keys and values they store.
 *
 * bench-dht runs the coordinator: it chooses every operation and its node,
 * keeps --concurrency of them in flight and computes the statistics, the
 * same code whichever DHT is measured.  The nodes live in worker
 * processes, --per-proc each: forked from bench-dht for beed, or
 * bench-opendht started with its socket on BENCH_WORKER_FD.  Each worker
 * talks to the coordinator over one SOCK_SEQPACKET socket pair, one
 * bench_msg per packet, and times each operation itself, from its call to
 * its callback, so the coordinator's own latency never enters a figure.
 */
#ifndef BENCH_DHT_H
#define BENCH_DHT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define BENCH_WORKER_FD 3 /* an exec'd worker's socket */
#define BENCH_VERSION 1   /* in BM_READY: both programs from one build */

enum bench_msg_type {
  /* coordinator to worker */
  BM_BOOT = 1, /* node joins through 127.0.0.1:arg, then looks itself up */
  BM_PUT,      /* node puts key (a plain value) */
  BM_GET,      /* node gets key */
  BM_KILL,     /* node goes away without a word */
  BM_HOLES,    /* arg 1: a listener that never answers takes each dead
                  node's port; arg 0: ports stay closed */
  BM_STATS,
  BM_EXIT,
  BM_PROBE, /* beed only: every live node says whether it holds key */
  /* worker to coordinator */
  BM_PORT = 100, /* node listens on port arg */
  BM_READY,      /* every node of the worker is up; arg: BENCH_VERSION */
  BM_BOOTED,     /* node's bootstrap ended with status */
  BM_DONE,       /* an operation ended */
  BM_HOLED,      /* BM_HOLES done */
  BM_STATS_ANS,
  BM_PROBE_ANS, /* ok: holds key; ns: first 8 bytes of id XOR key */
  BM_FAILED, /* the worker cannot go on: status, and it exits */
};

typedef struct bench_msg {
  uint32_t type;
  uint32_t node;     /* global node index */
  uint64_t key;      /* key index */
  uint64_t ns;       /* BM_DONE: latency from call to callback */
  uint64_t arg;      /* see the types; BM_DONE: replicas a put stored;
                        BM_STATS_ANS: live connections (beed) */
  int32_t status;    /* 0, or the implementation's error code */
  uint32_t ok;       /* BM_DONE: stored, or found the value that was put;
                        BM_STATS_ANS: open file descriptors */
  uint32_t requests; /* BM_DONE: requests the operation sent (0: unknown);
                        BM_STATS_ANS: threads */
  uint32_t rss_kb;   /* BM_STATS_ANS: peak resident memory */
} bench_msg;

/* The value under key index k: n bytes that depend on seed and k only,
 * so every worker can check what a get returns. */
static inline void bench_value(uint64_t seed, uint64_t k, uint8_t *out,
                               size_t n) {
  uint64_t x = seed ^ (k * 0x9e3779b97f4a7c15ull);
  for (size_t i = 0; i < n; i += 8) {
    uint64_t z = (x += 0x9e3779b97f4a7c15ull); /* splitmix64 */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    for (size_t j = 0; j < 8 && i + j < n; j++)
      out[i + j] = (uint8_t)(z >> (8 * j));
  }
}

/* The name each implementation hashes into key k's id. */
static inline int bench_key_name(uint64_t seed, uint64_t k, char *buf,
                                 size_t cap) {
  return snprintf(buf, cap, "bench-%llu-%llu", (unsigned long long)seed,
                  (unsigned long long)k);
}

#endif /* BENCH_DHT_H */
