/* local-probe.c: a misbehaving trainer process, for
 * tests/test-net-external.sh: one wrong thing against beed's
 * --trainer-socket, then it prints what beed answered ("answer: REFUSED
 * <code> <text>", "answer: type N", or "answer: closed") and exits 0.
 *
 *   local-probe SOCKET RUN MODE
 * MODE: garbage (bytes that are no message), big (a length over the
 * limit), nofd (a HELLO without its memory), unsealed (memory that may
 * shrink), short (memory smaller than the tensors), twofds (two
 * descriptors), notfirst (a BATCH before any HELLO), nohello (nothing,
 * until beed gives up).
 */
#define _GNU_SOURCE /* memfd_create, the seals */
#include "proto.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static void send_fds(int fd, const uint8_t *p, size_t n, const int *fds,
                     int nfds) {
  union {
    struct cmsghdr h;
    char b[CMSG_SPACE(2 * sizeof(int))];
  } ctl;
  struct iovec iov = {(void *)p, n};
  struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
  if (nfds) {
    memset(&ctl, 0, sizeof ctl);
    mh.msg_control = ctl.b;
    mh.msg_controllen = CMSG_SPACE((size_t)nfds * sizeof(int));
    struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN((size_t)nfds * sizeof(int));
    memcpy(CMSG_DATA(c), fds, (size_t)nfds * sizeof(int));
  }
  if (sendmsg(fd, &mh, MSG_NOSIGNAL) < 0)
    fprintf(stderr, "local-probe: send: %s\n", strerror(errno));
}

/* A frame: length and body, with nfds descriptors. */
static void frame(int fd, const uint8_t *body, size_t n, const int *fds,
                  int nfds) {
  uint8_t *b = malloc(n + 4);
  b[0] = (uint8_t)(n >> 24), b[1] = (uint8_t)(n >> 16);
  b[2] = (uint8_t)(n >> 8), b[3] = (uint8_t)n;
  memcpy(b + 4, body, n);
  send_fds(fd, b, n + 4, fds, nfds);
  free(b);
}

/* The memory for one tensor of 10 floats, bytes long, sealed or not. */
static int memory(size_t bytes, bool seal) {
  int m = memfd_create("probe", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (m < 0 || ftruncate(m, (off_t)bytes) < 0 ||
      (seal && fcntl(m, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) < 0)) {
    perror("local-probe: memfd");
    exit(1);
  }
  return m;
}

static void hello(int fd, const char *run, const int *fds, int nfds) {
  proto_local_tensor t = {.name = {(const uint8_t *)"w", 1},
                          .role = PROTO_LOCAL_PARAM,
                          .ndim = 1,
                          .dims = {10},
                          .elems = 10};
  proto_local_msg m = {
      .type = PROTO_T_LOCAL_HELLO, .batch = 8, .list = &t, .n = 1};
  snprintf(m.run, sizeof m.run, "%s", run);
  uint8_t buf[256];
  size_t len;
  if (proto_local_encode(&m, buf, sizeof buf, &len))
    exit(1);
  frame(fd, buf, len, fds, nfds);
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: local-probe SOCKET RUN MODE\n");
    return 2;
  }
  const char *mode = argv[3];
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", argv[1]);
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
    perror("local-probe: connect");
    return 1;
  }
  size_t good = 2 * 10 * sizeof(float); /* the parameter and its gradient */
  if (strcmp(mode, "garbage") == 0) {
    static const uint8_t junk[] = {0, 0, 0, 5, 0xc1, 0xc1, 0xc1, 0xc1, 0xc1};
    send_fds(fd, junk, sizeof junk, NULL, 0);
  } else if (strcmp(mode, "big") == 0) {
    static const uint8_t len[] = {0x7f, 0xff, 0xff, 0xff, 1, 2, 3};
    send_fds(fd, len, sizeof len, NULL, 0);
  } else if (strcmp(mode, "nofd") == 0) {
    hello(fd, argv[2], NULL, 0);
  } else if (strcmp(mode, "unsealed") == 0) {
    int m = memory(good, false);
    hello(fd, argv[2], &m, 1);
  } else if (strcmp(mode, "short") == 0) {
    int m = memory(good / 2, true);
    hello(fd, argv[2], &m, 1);
  } else if (strcmp(mode, "twofds") == 0) {
    int m[2] = {memory(good, true), memory(good, true)};
    hello(fd, argv[2], m, 2);
  } else if (strcmp(mode, "notfirst") == 0) {
    proto_local_msg b = {.type = PROTO_T_LOCAL_BATCH, .samples = 8};
    uint8_t buf[64];
    size_t len;
    if (proto_local_encode(&b, buf, sizeof buf, &len))
      return 1;
    frame(fd, buf, len, NULL, 0);
  } else if (strcmp(mode, "nohello") != 0) {
    fprintf(stderr, "local-probe: no mode %s\n", mode);
    return 2;
  }
  /* beed's answer, within 20 s. */
  uint8_t buf[2048];
  size_t got = 0;
  for (;;) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, 20000) <= 0)
      break;
    ssize_t r = recv(fd, buf + got, sizeof buf - got, 0);
    if (r <= 0)
      break;
    got += (size_t)r;
  }
  if (got < 4) {
    printf("answer: closed\n");
    return 0;
  }
  size_t n = (size_t)buf[0] << 24 | (size_t)buf[1] << 16 | (size_t)buf[2] << 8 |
             buf[3];
  proto_local_msg m;
  if (n > got - 4 || proto_local_decode(buf + 4, n, &m)) {
    printf("answer: undecodable\n");
    return 0;
  }
  if (m.type == PROTO_T_LOCAL_REFUSED)
    printf("answer: REFUSED %s %s\n", bee_errname((int)m.code), m.text);
  else
    printf("answer: type %d\n", m.type);
  return 0;
}
