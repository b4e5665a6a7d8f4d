/* delayer.c: wanlab's delay line, an NFQUEUE program.
 *
 * Kernel netem is not available on the machines wanlab runs on, so the
 * one-way delay of an emulated link is added here.  wanlab starts one
 * delayer in each host's network namespace and sends every IPv4 packet
 * arriving on the host's link to it (iptables raw PREROUTING, target
 * NFQUEUE with --queue-bypass).  The delayer reads the packet's source
 * address, looks up the one-way delay of the link from that source, and
 * gives the kernel its verdict (NF_ACCEPT) once the delay has passed.
 * Packets from sources it does not know are accepted at once.
 *
 * Only the verdict waits: the packet itself stays in the kernel, and the
 * delayer copies just the first 20 bytes (the IPv4 header) of each.  Every
 * link from one source has one delay, so the packets of a source leave in
 * the order they came: each source keeps a FIFO of (packet id, due time),
 * threaded through one pool of --maxlen entries, the same bound the kernel
 * puts on the queue.  Memory is therefore fixed at start (16 bytes per
 * entry), and every operation is O(1) but the choice of the next due
 * source, which scans the sources (at most DLY_MAX_PEERS).
 *
 * For high packet rates it reads with recvmmsg() and sends the verdicts
 * that fall due together as one batch of netlink messages in one send().
 * It asks the kernel for whole GSO packets (NFQA_CFG_F_GSO), so a 64 KB
 * TCP burst costs one verdict, not 45.
 *
 * Failure modes never blackhole the lab for good: the queue is configured
 * fail-open (a full queue, or a message the kernel cannot deliver, lets the
 * packet through undelayed), and the iptables rule carries --queue-bypass,
 * so once the delayer is gone packets pass without delay.  Packets held
 * when a delayer dies are dropped by the kernel; TCP resends them.  On
 * SIGTERM or SIGINT the delayer accepts everything it holds, prints its
 * statistics and exits 0.  SIGUSR1 prints the statistics and goes on.
 *
 *   wanlab-delayer [--queue N] [--maxlen N] [--ready FILE]
 *                  --peer ADDR=USEC [--peer ADDR=USEC ...]
 *
 * Exit status: 0 after SIGTERM/SIGINT, 1 on a runtime failure (the message
 * says which call failed), 2 on bad usage.
 */
#define _GNU_SOURCE /* ppoll, recvmmsg */

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <linux/netfilter.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_queue.h>
#include <linux/netlink.h>

#include <libnetfilter_queue/libnetfilter_queue.h>

#ifndef DLY_MAX_PEERS
#define DLY_MAX_PEERS 256 /* a /24 of hosts */
#endif
#ifndef DLY_MAXLEN_DEFAULT
#define DLY_MAXLEN_DEFAULT 65536 /* packets held at most, kernel and here */
#endif
#ifndef DLY_MAX_DELAY_US
#define DLY_MAX_DELAY_US 10000000 /* 10 s one way */
#endif
#define DLY_COPY_BYTES 20     /* the IPv4 header without options */
#define DLY_RX_BATCH 64       /* messages per recvmmsg() */
#define DLY_RX_MSG 4096       /* one packet message with 20 bytes copied */
#define DLY_RX_ROUNDS 16      /* recvmmsg() calls before releasing again */
#define DLY_TX_BYTES 65536    /* verdict batch: about 2000 verdicts */
#define DLY_RCVBUF (32 << 20) /* socket receive buffer, bytes */
#define NONE UINT32_MAX

/* One held packet, in its source's FIFO or in the free list. */
typedef struct {
  uint64_t due_ns; /* CLOCK_MONOTONIC */
  uint32_t id;     /* the kernel's packet id */
  uint32_t next;   /* pool index, or NONE */
} held;

typedef struct {
  uint32_t addr;     /* IPv4, network order */
  uint64_t delay_ns; /* one way */
  uint32_t head, tail;
  uint64_t packets;
} peer;

typedef struct {
  int fd;
  uint32_t portid; /* ours, given by the kernel at bind */
  uint32_t queue;
  uint32_t seq;
  peer peers[DLY_MAX_PEERS];
  size_t npeers;
  held *pool;
  uint32_t maxlen, free_head, nheld;
  char *tx;
  size_t tx_len;
  /* config acknowledgement being waited for */
  uint32_t ack_seq;
  int ack_err, ack_seen;
  /* statistics */
  uint64_t packets, delayed, passed, overflow, errors, late_count;
  uint64_t late_sum_ns, late_max_ns;
  uint32_t max_held;
} delayer;

static volatile sig_atomic_t stop_flag, stats_flag;

static void on_signal(int sig) {
  if (sig == SIGUSR1)
    stats_flag = 1;
  else
    stop_flag = 1;
}

__attribute__((format(printf, 1, 2))) static void errorf(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("wanlab-delayer: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- netlink ------------------------------------------------------------ */

/* Appends a u32 attribute (network order) to nlh: libnetfilter_queue's
 * new API has no setter for the queue flags. */
static void attr_put_u32(struct nlmsghdr *nlh, uint16_t type, uint32_t v) {
  struct nlattr *a =
      (struct nlattr *)((char *)nlh + NLMSG_ALIGN(nlh->nlmsg_len));
  a->nla_type = type;
  a->nla_len = NLA_HDRLEN + sizeof v;
  v = htonl(v);
  memcpy((char *)a + NLA_HDRLEN, &v, sizeof v);
  nlh->nlmsg_len = NLMSG_ALIGN(nlh->nlmsg_len) + NLA_ALIGN(a->nla_len);
}

/* Sends len bytes of netlink messages to the kernel.  Returns 0 or
 * -errno. */
static int nl_send(delayer *d, const void *buf, size_t len) {
  struct sockaddr_nl to = {.nl_family = AF_NETLINK};
  for (;;) {
    ssize_t n = sendto(d->fd, buf, len, 0, (struct sockaddr *)&to, sizeof to);
    if (n >= 0)
      return 0;
    if (errno != EINTR)
      return -errno;
  }
}

/* Queues a verdict for packet id in the outgoing batch, sending the batch
 * first when it is full.  Returns 0 or -errno. */
static int verdict_add(delayer *d, uint32_t id) {
  int rc;
  if (d->tx_len + 64 > DLY_TX_BYTES && (rc = nl_send(d, d->tx, d->tx_len)))
    return rc;
  if (d->tx_len + 64 > DLY_TX_BYTES)
    d->tx_len = 0;
  struct nlmsghdr *nlh =
      nfq_nlmsg_put(d->tx + d->tx_len, NFQNL_MSG_VERDICT, d->queue);
  nfq_nlmsg_verdict_put(nlh, (int)id, NF_ACCEPT);
  d->tx_len += NLMSG_ALIGN(nlh->nlmsg_len);
  return 0;
}

/* Sends the batched verdicts.  Returns 0 or -errno. */
static int verdict_flush(delayer *d) {
  int rc = 0;
  if (d->tx_len)
    rc = nl_send(d, d->tx, d->tx_len);
  d->tx_len = 0;
  return rc;
}

/* ---- the delay line ----------------------------------------------------- */

static peer *peer_find(delayer *d, uint32_t addr) {
  for (size_t i = 0; i < d->npeers; i++)
    if (d->peers[i].addr == addr)
      return &d->peers[i];
  return NULL;
}

/* Holds packet id from p until now + p's delay; accepts it at once when
 * the pool is exhausted (which the kernel's own maxlen should prevent). */
static int hold(delayer *d, peer *p, uint32_t id, uint64_t now) {
  if (d->free_head == NONE) {
    d->overflow++;
    return verdict_add(d, id);
  }
  uint32_t i = d->free_head;
  d->free_head = d->pool[i].next;
  d->pool[i] = (held){.due_ns = now + p->delay_ns, .id = id, .next = NONE};
  if (p->tail == NONE)
    p->head = i;
  else
    d->pool[p->tail].next = i;
  p->tail = i;
  if (++d->nheld > d->max_held)
    d->max_held = d->nheld;
  d->delayed++;
  return 0;
}

/* Accepts every held packet due by now (all of them when all is set) and
 * returns the earliest due time left in *next (UINT64_MAX when none). */
static int release(delayer *d, uint64_t now, int all, uint64_t *next) {
  int rc;
  *next = UINT64_MAX;
  for (size_t s = 0; s < d->npeers; s++) {
    peer *p = &d->peers[s];
    while (p->head != NONE && (all || d->pool[p->head].due_ns <= now)) {
      uint32_t i = p->head;
      if (!all) {
        uint64_t late = now - d->pool[i].due_ns;
        d->late_sum_ns += late;
        d->late_count++;
        if (late > d->late_max_ns)
          d->late_max_ns = late;
      }
      if ((rc = verdict_add(d, d->pool[i].id)))
        return rc;
      p->head = d->pool[i].next;
      if (p->head == NONE)
        p->tail = NONE;
      d->pool[i].next = d->free_head;
      d->free_head = i;
      d->nheld--;
    }
    if (p->head != NONE && d->pool[p->head].due_ns < *next)
      *next = d->pool[p->head].due_ns;
  }
  return 0;
}

/* Handles one packet message: hold it or accept it now. */
static int on_packet(delayer *d, const struct nlmsghdr *nlh, uint64_t now) {
  struct nlattr *attr[NFQA_MAX + 1] = {0};
  if (nfq_nlmsg_parse(nlh, attr) < 0 || !attr[NFQA_PACKET_HDR]) {
    d->errors++;
    return 0;
  }
  struct nfqnl_msg_packet_hdr ph;
  memcpy(&ph, (char *)attr[NFQA_PACKET_HDR] + NLA_HDRLEN, sizeof ph);
  uint32_t id = ntohl(ph.packet_id);
  d->packets++;

  peer *p = NULL;
  struct nlattr *pl = attr[NFQA_PAYLOAD];
  if (pl && pl->nla_len >= NLA_HDRLEN + 20) {
    const unsigned char *ip = (const unsigned char *)pl + NLA_HDRLEN;
    uint32_t src;
    memcpy(&src, ip + 12, sizeof src);
    if ((ip[0] >> 4) == 4)
      p = peer_find(d, src);
  }
  if (!p || p->delay_ns == 0) {
    d->passed++;
    return verdict_add(d, id);
  }
  p->packets++;
  return hold(d, p, id, now);
}

/* Handles every netlink message in one datagram of len bytes; a message
 * that claims more than the datagram holds ends it. */
static int on_datagram(delayer *d, const char *buf, size_t len) {
  uint64_t now = now_ns();
  size_t off = 0;
  int rc;
  while (len - off >= sizeof(struct nlmsghdr)) {
    const struct nlmsghdr *nlh = (const struct nlmsghdr *)(buf + off);
    if (nlh->nlmsg_len < sizeof *nlh || nlh->nlmsg_len > len - off)
      break;
    if (nlh->nlmsg_type == NLMSG_ERROR &&
        nlh->nlmsg_len >= NLMSG_LENGTH(sizeof(struct nlmsgerr))) {
      const struct nlmsgerr *e = NLMSG_DATA(nlh);
      if (d->ack_seq && nlh->nlmsg_seq == d->ack_seq) {
        d->ack_seen = 1;
        d->ack_err = e->error;
      } else if (e->error) {
        d->errors++; /* a verdict for a packet the kernel no longer has */
      }
    } else if (nlh->nlmsg_type ==
               ((NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET)) {
      if ((rc = on_packet(d, nlh, now)))
        return rc;
    }
    if (NLMSG_ALIGN(nlh->nlmsg_len) >= len - off)
      break;
    off += NLMSG_ALIGN(nlh->nlmsg_len);
  }
  return 0;
}

/* Reads every datagram waiting, DLY_RX_BATCH at a time, at most
 * DLY_RX_ROUNDS batches, so that due packets are released in time even
 * under a flood.  Returns 0 or -errno. */
static int receive(delayer *d) {
  static char bufs[DLY_RX_BATCH][DLY_RX_MSG];
  struct mmsghdr msgs[DLY_RX_BATCH];
  struct iovec iov[DLY_RX_BATCH];
  int rc;
  for (int round = 0; round < DLY_RX_ROUNDS; round++) {
    for (int i = 0; i < DLY_RX_BATCH; i++) {
      iov[i] = (struct iovec){.iov_base = bufs[i], .iov_len = DLY_RX_MSG};
      msgs[i] =
          (struct mmsghdr){.msg_hdr = {.msg_iov = &iov[i], .msg_iovlen = 1}};
    }
    int n = recvmmsg(d->fd, msgs, DLY_RX_BATCH, MSG_DONTWAIT, NULL);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
        return 0;
      if (errno == ENOBUFS) { /* lost messages: fail-open let them by */
        d->errors++;
        continue;
      }
      return -errno;
    }
    for (int i = 0; i < n; i++) {
      if (msgs[i].msg_hdr.msg_flags & MSG_TRUNC)
        d->errors++; /* cannot happen with 20 bytes copied; never parse */
      else if ((rc = on_datagram(d, bufs[i], msgs[i].msg_len)))
        return rc;
    }
    if (n < DLY_RX_BATCH)
      return 0;
  }
  return 0;
}

/* Sends one config message and waits for the kernel's acknowledgement,
 * handling any packets that arrive meanwhile.  Returns 0 or -errno. */
static int config_send(delayer *d, struct nlmsghdr *nlh) {
  nlh->nlmsg_flags |= NLM_F_ACK;
  nlh->nlmsg_seq = d->ack_seq = ++d->seq;
  d->ack_seen = 0;
  int rc = nl_send(d, nlh, nlh->nlmsg_len);
  while (!rc && !d->ack_seen) {
    struct pollfd pfd = {.fd = d->fd, .events = POLLIN};
    if (poll(&pfd, 1, 2000) == 0)
      rc = -ETIMEDOUT;
    else if (!(rc = receive(d)))
      rc = verdict_flush(d);
  }
  d->ack_seq = 0;
  return rc ? rc : d->ack_err;
}

/* Binds the queue: copy 20 bytes, whole GSO packets, fail open, maxlen. */
static int queue_setup(delayer *d) {
  char buf[256] __attribute__((aligned(8)));
  int rc, one = 1, rcvbuf = DLY_RCVBUF;
  struct sockaddr_nl me = {.nl_family = AF_NETLINK};
  socklen_t len = sizeof me;

  d->fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_NETFILTER);
  if (d->fd < 0)
    return -errno;
  if (setsockopt(d->fd, SOL_SOCKET, SO_RCVBUFFORCE, &rcvbuf, sizeof rcvbuf))
    setsockopt(d->fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
  /* A full socket buffer then drops messages quietly (fail-open passes
   * their packets) instead of failing every later read. */
  setsockopt(d->fd, SOL_NETLINK, NETLINK_NO_ENOBUFS, &one, sizeof one);
  if (bind(d->fd, (struct sockaddr *)&me, sizeof me) ||
      getsockname(d->fd, (struct sockaddr *)&me, &len))
    return -errno;
  d->portid = me.nl_pid;

  struct nlmsghdr *nlh = nfq_nlmsg_put(buf, NFQNL_MSG_CONFIG, d->queue);
  nfq_nlmsg_cfg_put_cmd(nlh, AF_INET, NFQNL_CFG_CMD_BIND);
  if ((rc = config_send(d, nlh)))
    return rc;
  nlh = nfq_nlmsg_put(buf, NFQNL_MSG_CONFIG, d->queue);
  nfq_nlmsg_cfg_put_params(nlh, NFQNL_COPY_PACKET, DLY_COPY_BYTES);
  nfq_nlmsg_cfg_put_qmaxlen(nlh, d->maxlen);
  attr_put_u32(nlh, NFQA_CFG_FLAGS, NFQA_CFG_F_FAIL_OPEN | NFQA_CFG_F_GSO);
  attr_put_u32(nlh, NFQA_CFG_MASK, NFQA_CFG_F_FAIL_OPEN | NFQA_CFG_F_GSO);
  return config_send(d, nlh);
}

/* ---- main --------------------------------------------------------------- */

static void stats_print(const delayer *d) {
  fprintf(stderr,
          "wanlab-delayer: queue=%" PRIu32 " packets=%" PRIu64
          " delayed=%" PRIu64 " passed=%" PRIu64 " held=%" PRIu32
          " max_held=%" PRIu32 " overflow=%" PRIu64 " errors=%" PRIu64
          " late_mean_us=%.1f late_max_us=%.1f\n",
          d->queue, d->packets, d->delayed, d->passed, d->nheld, d->max_held,
          d->overflow, d->errors,
          d->late_count ? (double)d->late_sum_ns / (double)d->late_count / 1e3
                        : 0.0,
          (double)d->late_max_ns / 1e3);
}

static int usage(FILE *f) {
  fputs("usage: wanlab-delayer [--queue N] [--maxlen N] [--ready FILE]\n"
        "                      --peer ADDR=USEC ...\n"
        "  Holds each IPv4 packet of NFQUEUE queue N (default 0) from a\n"
        "  peer ADDR for USEC microseconds, then accepts it.  Run by\n"
        "  wanlab inside a lab host's network namespace; see README.md.\n",
        f);
  return f == stderr ? 2 : 0;
}

/* Parses a whole unsigned decimal number no larger than max. */
static int parse_u64(const char *s, uint64_t max, uint64_t *out) {
  char *end;
  if (*s < '0' || *s > '9')
    return -1;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || *end || v > max)
    return -1;
  *out = v;
  return 0;
}

static int parse_peer(delayer *d, const char *arg) {
  char addr[INET_ADDRSTRLEN];
  const char *eq = strchr(arg, '=');
  uint64_t us;
  struct in_addr in;
  if (!eq || (size_t)(eq - arg) >= sizeof addr)
    return -1;
  memcpy(addr, arg, (size_t)(eq - arg));
  addr[eq - arg] = 0;
  if (inet_pton(AF_INET, addr, &in) != 1 ||
      parse_u64(eq + 1, DLY_MAX_DELAY_US, &us))
    return -1;
  if (peer_find(d, in.s_addr) || d->npeers == DLY_MAX_PEERS)
    return -1;
  d->peers[d->npeers++] = (peer){
      .addr = in.s_addr, .delay_ns = us * 1000, .head = NONE, .tail = NONE};
  return 0;
}

int main(int argc, char **argv) {
  static delayer d;
  const char *ready = NULL;
  uint64_t v;
  int rc = 0;

  d.maxlen = DLY_MAXLEN_DEFAULT;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "-h") || !strcmp(a, "--help"))
      return usage(stdout);
    if (!val) {
      errorf("%s: unknown flag, or its value is missing", a);
      return usage(stderr);
    }
    i++;
    if (!strcmp(a, "--queue") && !parse_u64(val, 65535, &v))
      d.queue = (uint32_t)v;
    else if (!strcmp(a, "--maxlen") && !parse_u64(val, 1u << 22, &v) && v)
      d.maxlen = (uint32_t)v;
    else if (!strcmp(a, "--ready"))
      ready = val;
    else if (!strcmp(a, "--peer") && !parse_peer(&d, val))
      ;
    else {
      errorf("%s %s: bad flag or value", a, val);
      return usage(stderr);
    }
  }

  d.pool = calloc(d.maxlen, sizeof *d.pool);
  d.tx = aligned_alloc(8, DLY_TX_BYTES);
  if (!d.pool || !d.tx) {
    errorf("out of memory for %" PRIu32 " entries", d.maxlen);
    return 1;
  }
  for (uint32_t i = 0; i < d.maxlen; i++)
    d.pool[i].next = i + 1 < d.maxlen ? i + 1 : NONE;
  d.free_head = 0;

  /* Signals arrive only inside ppoll(), so the loop never loses one. */
  sigset_t block, wait_mask;
  sigemptyset(&block);
  sigaddset(&block, SIGTERM);
  sigaddset(&block, SIGINT);
  sigaddset(&block, SIGUSR1);
  sigprocmask(SIG_BLOCK, &block, &wait_mask);
  sigdelset(&wait_mask, SIGTERM);
  sigdelset(&wait_mask, SIGINT);
  sigdelset(&wait_mask, SIGUSR1);
  struct sigaction sa = {.sa_handler = on_signal};
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGUSR1, &sa, NULL);

  /* Wake on time: the default 50 us timer slack would be added to every
   * delay. */
  prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);

  if ((rc = queue_setup(&d))) {
    errorf("binding NFQUEUE %" PRIu32 ": %s%s", d.queue, strerror(-rc),
           rc == -EPERM   ? " (needs CAP_NET_ADMIN)"
           : rc == -EBUSY ? " (another program holds the queue)"
                          : "");
    return 1;
  }
  if (ready) {
    FILE *f = fopen(ready, "w");
    if (!f || fprintf(f, "%ld\n", (long)getpid()) < 0 || fclose(f)) {
      errorf("%s: %s", ready, strerror(errno));
      return 1;
    }
  }

  while (!stop_flag) {
    uint64_t next, now = now_ns();
    if ((rc = release(&d, now, 0, &next)) || (rc = verdict_flush(&d)))
      break;
    struct timespec ts, *tsp = NULL;
    if (next != UINT64_MAX) {
      uint64_t wait = next > now ? next - now : 0;
      ts.tv_sec = (time_t)(wait / 1000000000u);
      ts.tv_nsec = (long)(wait % 1000000000u);
      tsp = &ts;
    }
    struct pollfd pfd = {.fd = d.fd, .events = POLLIN};
    int n = ppoll(&pfd, 1, tsp, &wait_mask);
    if (n < 0 && errno != EINTR) {
      rc = -errno;
      break;
    }
    if (stats_flag) {
      stats_flag = 0;
      stats_print(&d);
    }
    if (n > 0 && (rc = receive(&d)))
      break;
  }
  if (rc)
    errorf("netlink: %s", strerror(-rc));

  uint64_t next;
  if (!release(&d, now_ns(), 1, &next))
    verdict_flush(&d);
  stats_print(&d);
  close(d.fd);
  return rc ? 1 : 0;
}
