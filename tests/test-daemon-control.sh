#!/bin/bash
# test-daemon-control.sh: beed's control socket and beectl status/leave.
#
# beed --control PATH listens on a unix socket of mode 0600.  beectl
# status prints the daemon's state (its id, with --run-id the run's);
# an unknown command gets an error line; a client that sends a long line
# without a newline is cut off; a second beed on the same path refuses to
# start (exit 1) while the first answers, but a socket file left by a
# killed one is taken over; a regular file there is refused.  beectl
# leave stops the daemon cleanly (exit 0, socket file removed); with no
# daemon beectl status exits 1 and says why.  No network: --no-listen.
set -u

. "$(dirname "${BASH_SOURCE[0]}")/proclib.sh"
BEECTL=$(realpath "${BEECTL:?set BEECTL to the beectl binary}")
# start NAME ARGS: beed in $tmp; sets $bpid.
start() {
  local name=$1
  shift
  (cd "$tmp" && exec "$BEED" --open --no-listen --identity n.key "$@") \
    >"$tmp/$name.log" 2>&1 &
  bpid=$!
  pids+=("$bpid")
}
wait_for() { # FILE PATTERN
  local i
  for ((i = 0; i < 100; i++)); do
    grep -Eq "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  fail "no '$2' in $1"
}
ctl() { (cd "$tmp" && "$BEECTL" "$@"); }

start one --control ctl.sock --run-id ctl-run --eval-every 0
wait_for "$tmp/one.log" 'control: listening on ctl.sock'
first=$bpid
[ "$(stat -c %a "$tmp/ctl.sock")" = 600 ] || fail "socket mode $(stat -c %a "$tmp/ctl.sock")"
wait_for "$tmp/one.log" 'train: run'
out=$(ctl status --control ctl.sock) || fail "beectl status failed: $out"
grep -q '^peer-id [0-9a-f]\{40\}$' <<<"$out" || fail "status: no peer-id: $out"
grep -q '^run ctl-run$' <<<"$out" || fail "status: no run: $out"
grep -q '^samples-per-second ' <<<"$out" || fail "status: no rate: $out"
grep -q '^compression none$' <<<"$out" || fail "status: no compression: $out"
grep -q '^out-of-line no$' <<<"$out" || fail "status: no out-of-line: $out"

# Bad clients.
reply=$(python3 - "$tmp/ctl.sock" <<'PY'
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall(b"reboot\n")
print(s.recv(200).decode().strip())
t = socket.socket(socket.AF_UNIX)
t.connect(sys.argv[1])
t.sendall(b"x" * 100)
t.settimeout(3)
try:
    print("closed" if t.recv(200) == b"" else "open")
except ConnectionResetError:  # closed with our bytes unread
    print("closed")
PY
) || fail "the bad clients' script failed"
[ "$reply" = $'error unknown command\nclosed' ] || fail "bad clients: '$reply'"
kill -0 "$first" || fail "beed died of a bad client"

# A second beed on the same path while the first answers: refused.
start two --control ctl.sock
rc=0
wait "$bpid" || rc=$?
[ "$rc" = 1 ] || fail "a second beed on a live socket exited $rc, want 1"
grep -q 'another beed answers there' "$tmp/two.log" || fail "no reason given"

# leave: a clean stop, the socket file gone.
out=$(ctl leave --control ctl.sock) || fail "beectl leave failed: $out"
[ "$out" = leaving ] || fail "leave said '$out'"
rc=0
wait "$first" || rc=$?
[ "$rc" = 0 ] || fail "beed exited $rc after beectl leave"
[ ! -e "$tmp/ctl.sock" ] || fail "the socket file is still there"
out=$(ctl status --control ctl.sock 2>&1) && fail "status with no daemon: $out"
grep -q 'is beed running' <<<"$out" || fail "no hint: $out"

# A socket file left by a killed beed is taken over; a regular file is not.
start three --control ctl.sock
wait_for "$tmp/three.log" 'control: listening'
kill -9 "$bpid"
wait "$bpid" 2>/dev/null
[ -S "$tmp/ctl.sock" ] || fail "no stale socket file to test with"
start four --control ctl.sock
wait_for "$tmp/four.log" 'control: listening'
ctl status --control ctl.sock >/dev/null || fail "status after the takeover"
ctl leave --control ctl.sock >/dev/null
wait "$bpid" || fail "four did not stop cleanly"
echo "not a socket" >"$tmp/file.sock"
start five --control file.sock
rc=0
wait "$bpid" || rc=$?
[ "$rc" = 1 ] || fail "a regular file at the path: exit $rc, want 1"
grep -q 'exists and is not a socket' "$tmp/five.log" || fail "no reason given"
echo "control socket: status, leave, bad clients, a live and a stale socket"
