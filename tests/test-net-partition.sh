#!/bin/bash
# test-net-partition.sh: a swarm cut in two by the network, then healed.
#
# Four bees train one run, each in its own network namespace (a WAN lab
# without delays: tools/wanlab).  Then the network between {a, b} and
# {c, d} drops every packet (iptables in each namespace), as when a link
# between two regions fails: no process dies, every connection across
# goes silent.  Both halves must go on training on their own (each steps
# at least twice in groups of two, apart from the other half).  Then the
# network heals: the halves must find each other again (the DHT's lost
# contacts, the join targets' redials) and end on one line of
# parameters, all four bees with the same hash after some epoch.  No bee
# may exit by itself, and every bee exits 0 on SIGTERM.  Exits 77
# (skipped) where network namespaces or iptables are missing.  About a
# minute and a half.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
wanlab=$root/tools/wanlab/wanlab
lab=wlpart

if [ "${1:-}" != --inner ]; then
  . "$root/tests/lablib.sh"
  lab_require
  conf=$(mktemp "${TMPDIR:-/tmp}/beed-partition.XXXXXX")
  trap 'rm -f "$conf"' EXIT
  printf '%s\n' 'host a left' 'host b left' 'host c right' 'host d right' \
    'default rate 1000mbit rtt 1ms' >"$conf"
  rc=0
  "$wanlab" --name "$lab" run "$conf" --no-delay -- bash "$0" --inner || rc=$?
  exit "$rc"
fi

# ---- inside the lab -------------------------------------------------------
. "$root/tests/netlib.sh"
ipt=$(command -v iptables-legacy || command -v iptables)
declare -A ip
for h in a b c d; do
  v=WANLAB_ADDR_$h
  ip[$h]=${!v}
  key "$h"
done
# start_ns NAME [FLAGS...]: beed in host NAME's namespace, its log and pid
# where netlib's helpers find them.
start_ns() {
  local n=$1
  shift
  "$WANLAB" exec "$n" -- sh -c 'cd "$1" && shift && exec "$@"' _ "$work" \
    "$BEED" --listen "${ip[$n]}:45555" --identity "$n.key" \
    --status-interval 1 "$@" >"$work/$n.log" 2>&1 &
  pid[$n]=$!
}
# cut HOST PEER...: HOST's namespace drops whatever comes from the peers.
cut() {
  local h=$1 p
  shift
  for p in "$@"; do "$WANLAB" exec "$h" -- "$ipt" -I INPUT -s "${ip[$p]}" -j DROP; done
}
heal() {
  local h=$1 p
  shift
  for p in "$@"; do "$WANLAB" exec "$h" -- "$ipt" -D INPUT -s "${ip[$p]}" -j DROP; done
}

train=(--open --run-id part --target-batch-size "$(epoch_target 524288 327680)"
  --matchmaking-time 2 --eval-every 0 --min-peers 4)
start_ns a "${train[@]}"
wait_log a 'listening on' 10
for h in b c d; do start_ns "$h" "${train[@]}" --join "${ip[a]}:45555"; done
for h in a b c d; do wait_log "$h" 'train: epoch 2 done' 120; done

# The cut.
cut a c d
cut b c d
cut c a b
cut d a b
E=$(last_done c)
echo "partition: cut after epoch $E"
# Both halves go on: c and d step twice more in a group of two, and so do
# a and b.
for h in a b c d; do
  wait_log "$h" "train: epoch $((E + 3)) done: .*averaged in a group of 2 " 120
done
hl=$(hash_of a $((E + 3)))
hr=$(hash_of c $((E + 3)))
[ "$hl" != "$hr" ] || fail "the halves stepped alike while cut apart"
[ "$(hash_of b $((E + 3)))" = "$hl" ] || fail "a and b apart while cut from c and d"
[ "$(hash_of d $((E + 3)))" = "$hr" ] || fail "c and d apart while cut from a and b"
echo "partition: each half stepped on its own to epoch $((E + 3))"

# The heal.
heal a c d
heal b c d
heal c a b
heal d a b
H=$(last_done a)
echo "partition: healed after epoch $H"
# Each bee's first epoch in line with a (one left out of the first group
# after the heal takes an epoch or two longer), then all three two
# epochs after the last of them.
f=$H
for h in c d b; do
  e=$(back_in_line "$h" a "$H")
  if [ "$e" -gt "$f" ]; then f=$e; fi
done
g=$((f + 2))
for h in b c d; do same_after "$h" a "$g"; done
# Messages held up by the cut arrive late once it heals: no peer's clock
# may be judged off by them (all four share this machine's).
grep -h 'clock is' "$work"/[abcd].log && fail "a clock called off after the heal"
stop_all
echo "partition: cut at epoch $E, each half went on alone; healed at epoch $H, all four in line from epoch $f (checked at $g)"
