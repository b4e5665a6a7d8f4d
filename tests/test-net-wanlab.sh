#!/bin/bash
# test-net-wanlab.sh: the WAN lab (tools/wanlab) end to end.
#
# A 3-host lab: a and b on 100 Mbit/s with 100 ms round trip, c behind a
# 20 Mbit/s access link, 250 ms from a, and b-c losing 10% each way; TCP
# buffer ceilings of 6 and 4 MiB (the config's 'tcp' line) in every host.
# Checks: ping round trips (ping -U, see README) within 3 ms of the
# configured ones; TCP throughput (iperf3, or a python3 transfer when iperf3
# is missing) within 10% of 100 Mbit/s and of c's 20 Mbit/s cap; the lossy
# pair drops about its share; `exec` refuses an unknown host.  A second lab
# run under `wanlab run` is killed with SIGKILL mid-run: the next `down`
# of its name removes it, processes included, and leaves the first lab
# alone.  After `down` no namespace, link or rule with either prefix
# remains.  Exits 77 (skipped) where network namespaces cannot be made or
# the delayer is not built.  About 25 s.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
wanlab=$root/tools/wanlab/wanlab
lab=wltest     # fixed names: a crashed earlier run is cleaned by the next
kill_lab=wltkill

. "$root/tests/lablib.sh"
lab_require --delayer ping
unset WANLAB_NAME

work=$(mktemp -d "${TMPDIR:-/tmp}/beed-wanlab.XXXXXX")
bg=()
cleanup() {
  local p
  for p in "${bg[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  "$wanlab" --name "$kill_lab" down >/dev/null 2>&1 || true
  "$wanlab" --name "$lab" down >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

fail() {
  echo "FAIL: $*" >&2
  for f in "$work"/*.log /run/wanlab/"$lab"/*.log; do
    [ -f "$f" ] || continue
    echo "----- $(basename "$f") -----" >&2
    tail -n 20 "$f" >&2
  done
  exit 1
}
wl() { "$wanlab" --name "$lab" "$@"; }
# alive PID COMM: whether PID still runs COMM; a zombie (exited, its
# parent has not reaped it yet) does not count.
alive() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  [ "$(cat "/proc/$1/comm" 2>/dev/null)" = "$2" ] && [ "$(echo "${stat##*) }" | cut -d' ' -f1)" != Z ]
}
# within VALUE LOW HIGH: LOW <= VALUE <= HIGH (decimals).
within() { awk -v v="$1" -v lo="$2" -v hi="$3" 'BEGIN { exit !(v >= lo && v <= hi) }'; }

cat >"$work/lab.conf" <<'EOF'
host a east
host b east
host c west access 20mbit
between east east rate 100mbit rtt 100ms
between east west rate 500mbit rtt 250ms
link b c rtt 2ms loss 10%
tcp rmem 6m wmem 4m
EOF

# ---- up -------------------------------------------------------------------
"$wanlab" --name "$lab" down >/dev/null 2>&1 || true
wl up "$work/lab.conf" >"$work/up.log" 2>&1 || fail "wanlab up failed"
for h in a b c; do
  grep -Eq "^$h +$lab-$h +10\.77\.0\.[1-3]$" "$work/up.log" ||
    fail "up did not print host $h's namespace and address"
done
a=10.77.0.1 b=10.77.0.2 c=10.77.0.3

# ---- the 'tcp' line: the hosts' TCP buffer ceilings ----------------------
rmem=$(wl exec a -- sysctl -n net.ipv4.tcp_rmem | awk '{ print $3 }')
wmem=$(wl exec c -- sysctl -n net.ipv4.tcp_wmem | awk '{ print $3 }')
[ "$rmem" = 6291456 ] && [ "$wmem" = 4194304 ] ||
  fail "tcp rmem 6m wmem 4m gave tcp_rmem max $rmem, tcp_wmem max $wmem"
printf 'host a r\nhost b r\ndefault rate 1mbit rtt 1ms\ntcp rmem 6x\n' >"$work/bad.conf"
if "$wanlab" show "$work/bad.conf" >/dev/null 2>"$work/bad.err" ||
  ! grep -q "bad size '6x'" "$work/bad.err"; then
  fail "a bad tcp size was not refused with its reason: $(cat "$work/bad.err")"
fi

# ---- exec refuses what is not the lab's ---------------------------------
if wl exec nohost -- true 2>"$work/exec.err"; then
  fail "exec ran on an unknown host"
fi
grep -q "unknown host 'nohost'" "$work/exec.err" || fail "exec: $(cat "$work/exec.err")"
[ "$(wl exec a -- ip -o -4 addr show scope global | awk '{ print $4 }')" = "$a/24" ] ||
  fail "host a does not hold exactly its address"

# ---- round trips ----------------------------------------------------------
# rtt FROM TO: the median of 7 pings, user to user (-U: the delay is added
# after the kernel's receive timestamp, which plain ping reports).
rtt() {
  wl exec "$1" -- ping -U -n -c 7 -i 0.2 -W 2 "$2" 2>&1 |
    sed -n 's/.*time=\([0-9.]*\) ms.*/\1/p' | sort -g | awk '{ v[NR] = $1 }
      END { if (NR < 5) print "none"; else print v[int((NR + 1) / 2)] }'
}
r=$(rtt a "$b")
echo "rtt a-b: $r ms (configured 100)"
within "$r" 99.5 103 || fail "a-b round trip $r ms, want 100 (+3/-0.5)"
r=$(rtt a "$c")
echo "rtt a-c: $r ms (configured 250)"
within "$r" 249.5 253 || fail "a-c round trip $r ms, want 250 (+3/-0.5)"

# ---- throughput -----------------------------------------------------------
# mbit FROM TO SECONDS: TCP goodput from FROM to TO in Mbit/s, measured by
# the receiver after the first 2 s (slow start).
mbit() {
  local from=$1 to=$2 t=$3 to_addr i
  to_addr=$(wl exec "$to" -- ip -o -4 addr show scope global | awk '{ sub("/.*", "", $4); print $4 }')
  if command -v iperf3 >/dev/null; then
    wl exec "$to" -- iperf3 -s -1 -B "$to_addr" >"$work/iperf-$to.log" 2>&1 &
    bg+=($!)
    for ((i = 0; i < 50; i++)); do
      wl exec "$to" -- ss -Htln 'sport = :5201' | grep -q . && break
      sleep 0.1
    done
    wl exec "$from" -- iperf3 -c "$to_addr" -t "$t" -O 2 -f m 2>&1 |
      tee "$work/iperf-$from-$to.log" | awk '/receiver/ { print $(NF - 2) }'
    wait "${bg[-1]}" || true
    return
  fi
  # No iperf3: python3 moves bytes for 2 + t seconds and the receiver
  # counts those after its first 2 s.
  wl exec "$to" -- python3 -c '
import socket, sys, time
s = socket.socket(); s.bind((sys.argv[1], 5201)); s.listen(1)
c, _ = s.accept(); t0 = time.monotonic(); n = 0; start = None
while True:
    d = c.recv(1 << 20)
    if not d: break
    now = time.monotonic()
    if start is None and now - t0 >= 2: start, n = now, 0
    n += len(d); end = now
print("%.1f" % (n * 8 / (end - start) / 1e6))' "$to_addr" >"$work/py-$to.out" 2>"$work/py-$to.log" &
  bg+=($!)
  sleep 0.5
  wl exec "$from" -- python3 -c '
import socket, sys, time
s = socket.create_connection((sys.argv[1], 5201)); b = bytes(1 << 16)
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end: s.sendall(b)
s.close()' "$to_addr" $((t + 2)) 2>"$work/py-$from.log"
  wait "${bg[-1]}" || true
  cat "$work/py-$to.out"
}
if command -v iperf3 >/dev/null; then tool=iperf3; else tool=python3; fi
m=$(mbit a b 4)
echo "throughput a->b: $m Mbit/s (configured 100, $tool)"
within "${m:-0}" 90 110 || fail "a->b at $m Mbit/s, want 100 +-10%"
m=$(mbit c a 5)
echo "throughput c->a: $m Mbit/s (c's access cap 20, $tool)"
within "${m:-0}" 18 22 || fail "c->a at $m Mbit/s, want 20 +-10%"

# ---- loss -----------------------------------------------------------------
# 10% each way: a round trip is lost with 1 - 0.9^2 = 19%.  400 pings give
# a standard deviation of 2 points.
lost=$(wl exec b -- ping -q -n -c 400 -i 0.002 -W 1 "$c" 2>&1 |
  sed -n 's/.* \([0-9.]*\)% packet loss.*/\1/p')
echo "loss b-c: $lost% of round trips (configured 10% each way: 19%)"
within "${lost:-0}" 11 27 || fail "b-c lost $lost% of round trips, want about 19%"

# ---- a lab killed with SIGKILL is removed by the next down --------------
cat >"$work/small.conf" <<'EOF'
host x r1
host y r2
default rate 100mbit rtt 20ms
EOF
"$wanlab" --name "$kill_lab" down >/dev/null 2>&1 || true
"$wanlab" --name "$kill_lab" run "$work/small.conf" -- \
  "$wanlab" exec x -- sleep 60 >"$work/run.log" 2>&1 &
run_pid=$!
bg+=("$run_pid")
for ((i = 0; i < 100; i++)); do
  [ -n "$(ip netns pids "$kill_lab-x" 2>/dev/null | while read -r p; do
    grep -qx 'sleep' "/proc/$p/comm" 2>/dev/null && echo "$p"; done)" ] && break
  sleep 0.1
done
[ "$i" -lt 100 ] || fail "wanlab run did not start its command"
# Its processes (delayers, and sleep), by pid and name: a pid may be
# reused meanwhile, by something else.
victims=()
for p in $(ip netns pids "$kill_lab-x"; ip netns pids "$kill_lab-y"); do
  victims+=("$p:$(cat "/proc/$p/comm" 2>/dev/null)")
done
kill -KILL "$run_pid"
wait "$run_pid" 2>/dev/null || true
ip netns list | grep -q "^$kill_lab-x" || fail "the killed lab vanished by itself?"
"$wanlab" --name "$kill_lab" down >"$work/down.log" 2>&1 || fail "down after SIGKILL failed"
ip netns list | grep -q "^$kill_lab-" && fail "namespaces of $kill_lab left: $(ip netns list)"
for v in "${victims[@]}"; do
  alive "${v%%:*}" "${v#*:}" && fail "process ${v%%:*} (${v#*:}) of the killed lab still runs"
done
[ -e "/run/netns/$lab-a" ] || fail "down of $kill_lab removed lab $lab too"
wl exec a -- ping -q -c 1 -W 2 "$b" >/dev/null || fail "lab $lab broken by the other's down"
echo "SIGKILLed lab removed by the next down; the other lab untouched"

# ---- down leaves nothing ------------------------------------------------
delayers=()
for f in /run/wanlab/"$lab"/delayer-*.pid; do delayers+=("$(cat "$f")"); done
[ ${#delayers[@]} = 3 ] || fail "want 3 delayers, found ${#delayers[@]}"
wl down >"$work/down2.log" 2>&1 || fail "down failed"
wl down >"$work/down3.log" 2>&1 || fail "a second down failed (not idempotent)"
ip netns list | grep -Eq "^($lab|$kill_lab)-" && fail "namespaces left: $(ip netns list)"
ip -o link | grep -Eq "($lab|$kill_lab)-" && fail "links left in the root namespace"
for ipt in iptables-legacy-save iptables-nft-save; do
  command -v "$ipt" >/dev/null || continue
  "$ipt" 2>/dev/null | grep -Eq "$lab|$kill_lab" && fail "$ipt: rules left"
done
for p in "${delayers[@]}"; do
  alive "$p" wanlab-delayer && fail "delayer $p still runs"
done
[ -e "/run/wanlab/$lab" ] && fail "state directory /run/wanlab/$lab left"
echo "PASS (${SECONDS} s)"
