#!/bin/bash
# test-daemon-notify.sh: beed speaks systemd's notify protocol.
#
# A small receiver (python3) binds a unix datagram socket; beed runs with
# NOTIFY_SOCKET naming it (a path, then an abstract name) and a watchdog
# of 0.4 s.  It must send READY=1 with a STATUS line once it serves,
# WATCHDOG=1 at least every 0.4 s while it runs, and STOPPING=1 on
# SIGTERM, then exit 0.  Without NOTIFY_SOCKET nothing is sent and
# nothing breaks (test-daemon-cli runs it that way).  No network: the node
# runs with --no-listen and no --join.
set -u

. "$(dirname "${BASH_SOURCE[0]}")/proclib.sh"

# run ADDR NAME: the receiver on ADDR, beed for 1.5 s, then SIGTERM.
run() {
  local addr=$1 name=$2 rpid bpid rc i
  python3 - "$addr" "$tmp/$name.got" <<'PY' &
import socket, sys, time
addr, out = sys.argv[1], sys.argv[2]
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind("\0" + addr[1:] if addr.startswith("@") else addr)
open(out + ".ready", "w").close()
s.settimeout(0.2)
end = time.time() + 8
with open(out, "w") as f:
    while time.time() < end:
        try:
            msg = s.recv(4096).decode()
        except socket.timeout:
            continue
        f.write("%.3f %s\n" % (time.time(), msg.replace("\n", " | ")))
        f.flush()
        if "STOPPING=1" in msg:
            break
PY
  rpid=$!
  pids+=("$rpid")
  for ((i = 0; i < 50; i++)); do
    [ -f "$tmp/$name.got.ready" ] && break
    sleep 0.1
  done
  (cd "$tmp" && NOTIFY_SOCKET=$addr WATCHDOG_USEC=400000 exec "$BEED" --open \
    --no-listen --identity n.key --status-interval 0) >"$tmp/$name.log" 2>&1 &
  bpid=$!
  pids+=("$bpid")
  sleep 1.5
  kill -TERM "$bpid"
  rc=0
  wait "$bpid" || rc=$?
  [ "$rc" = 0 ] || fail "$name: beed exited $rc after SIGTERM"
  wait "$rpid" 2>/dev/null
  grep -q 'READY=1 | STATUS=0 peers' "$tmp/$name.got" ||
    fail "$name: no READY=1 with a STATUS line"
  grep -q 'STOPPING=1' "$tmp/$name.got" || fail "$name: no STOPPING=1"
  # WATCHDOG=1 at least every 0.4 s between READY and STOPPING.
  python3 - "$tmp/$name.got" <<'PY' || fail "$name: watchdog pings too rare"
import sys
t = [float(l.split()[0]) for l in open(sys.argv[1])
     if "READY=1" in l or "WATCHDOG=1" in l or "STOPPING=1" in l]
gaps = [b - a for a, b in zip(t, t[1:])]
wd = sum(1 for l in open(sys.argv[1]) if "WATCHDOG=1" in l)
sys.exit(0 if wd >= 3 and max(gaps) < 0.4 else 1)
PY
  echo "$name: READY, $(grep -c WATCHDOG=1 "$tmp/$name.got") watchdog pings, STOPPING"
}

run "$tmp/notify.sock" path
run "@beed-test-notify-$$" abstract
echo "beed speaks the notify protocol"
