/* control.c: beectl status and beectl leave, through a running beed's
 * control socket (beed --control PATH; daemon/control.c).
 *
 * One line out ("status" or "leave"), the daemon's lines back until it
 * closes; 5 s at most.  Exit status 0 when the daemon answered as it
 * should, 1 when it could not be reached or answered otherwise, 2 for bad
 * usage.
 */
#include "beectl.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#define DEFAULT_SOCKET "beed.sock"

int beectl_control(const char *cmd, int argc, char **argv) {
  flag flags[] = {{.name = "--control", .has_value = true}};
  args a = {.flags = flags, .nflags = 1};
  if (beectl_parse_args(&a, argc, argv, 0))
    return EXIT_USAGE;
  const char *path = flags[0].set ? flags[0].value : DEFAULT_SOCKET;
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof sa.sun_path) {
    beectl_errorf("--control: '%s' is longer than a unix socket path may be",
                  path);
    return EXIT_USAGE;
  }
  strcpy(sa.sun_path, path);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    beectl_errorf("socket: %s", strerror(errno));
    return 1;
  }
  struct timeval tv = {.tv_sec = 5};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
    beectl_errorf("%s: %s (is beed running with --control %s?)", path,
                  strerror(errno), path);
    close(fd);
    return 1;
  }
  char line[16];
  int n = snprintf(line, sizeof line, "%s\n", cmd);
  if (write(fd, line, (size_t)n) != n) {
    beectl_errorf("%s: %s", path, strerror(errno));
    close(fd);
    return 1;
  }
  char buf[8192];
  size_t got = 0;
  for (;;) {
    ssize_t k = read(fd, buf + got, sizeof buf - 1 - got);
    if (k < 0 && errno == EINTR)
      continue;
    if (k < 0) {
      beectl_errorf("%s: %s", path,
                    errno == EAGAIN ? "no answer within 5 s" : strerror(errno));
      close(fd);
      return 1;
    }
    if (k == 0 || (got += (size_t)k) == sizeof buf - 1)
      break;
  }
  close(fd);
  buf[got] = '\0';
  bool ok = strcmp(cmd, "status") == 0
                ? got >= 4 && strcmp(buf + got - 4, "end\n") == 0
                : strcmp(buf, "leaving\n") == 0;
  if (!ok) {
    beectl_errorf("%s: unexpected answer: %.200s", path, buf);
    return 1;
  }
  if (strcmp(cmd, "status") == 0)
    fwrite(buf, 1, got - 4, stdout); /* without the "end" line */
  else
    fputs(buf, stdout);
  return 0;
}
