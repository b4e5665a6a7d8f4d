/* notify.c: the systemd notify protocol, spoken directly.
 *
 * Under a Type=notify unit, systemd names a unix datagram socket in
 * $NOTIFY_SOCKET (a path, or an abstract name after '@'); a service sends
 * it newline-separated "KEY=VALUE" assignments: READY=1 once it serves,
 * STATUS=... for `systemctl status`, STOPPING=1 when it begins to stop,
 * and WATCHDOG=1 at least every $WATCHDOG_USEC microseconds when the unit
 * has a watchdog ($WATCHDOG_PID, when set, must be ours).  Outside
 * systemd the variable is unset and every call does nothing.
 */
#include "bee.h"

#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

int bee_notify(const char *fmt, ...) {
  const char *path = getenv("NOTIFY_SOCKET");
  if (!path || !path[0])
    return 0;
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  size_t n = strlen(path);
  if ((path[0] != '/' && path[0] != '@') || n >= sizeof sa.sun_path)
    return -EINVAL;
  memcpy(sa.sun_path, path, n);
  if (path[0] == '@')
    sa.sun_path[0] = '\0'; /* abstract namespace */
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  int len = vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (len < 0 || (size_t)len >= sizeof msg)
    return -EINVAL;
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -errno;
  socklen_t salen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n);
  int rc = sendto(fd, msg, (size_t)len, MSG_NOSIGNAL, (struct sockaddr *)&sa,
                  salen) < 0
               ? -errno
               : 0;
  close(fd);
  return rc;
}

uint64_t bee_notify_watchdog_ms(void) {
  const char *us = getenv("WATCHDOG_USEC"), *pid = getenv("WATCHDOG_PID");
  if (!us || !us[0] || !getenv("NOTIFY_SOCKET"))
    return 0;
  if (pid && pid[0] && strtoll(pid, NULL, 10) != (long long)getpid())
    return 0; /* meant for another process */
  char *end;
  errno = 0;
  unsigned long long v = strtoull(us, &end, 10);
  if (errno || *end || v == 0)
    return 0;
  uint64_t ms = v / 2000; /* half the interval, as systemd advises */
  return ms ? ms : 1;
}
