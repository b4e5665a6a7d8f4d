#!/bin/bash
# test-net-dht.sh: the DHT across 20 real beed processes on loopback.
#
# A queen and 19 bees, all joining through the queen, form one moderated
# swarm.  Values stored through random bees are found through others.
# Then the queen dies (SIGKILL, as a preempted VM would): the swarm keeps
# working without it, a new bee joins through another peer, and both the
# values stored before and new ones are found, through the newcomer too.
# Every surviving daemon exits 0 on SIGTERM.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/netlib.sh"

N=20
KEYS=20
swarm=dht20

key mod --moderator
key client
token client mod "$swarm" 1d monitor
for ((i = 0; i < N; i++)); do
  key "b$i"
  token "b$i" mod "$swarm" 1d
done
key newbee
token newbee mod "$swarm" 1d

moderated=(--moderator "$pk_mod" --swarm "$swarm")
# dht OP ARGS... THROUGH-PORT: one beectl dht operation through a bee.
dht() {
  local port=${*: -1}
  (cd "$work" && "$BEECTL" dht "${@:1:$#-1}" --join "127.0.0.1:$port" \
    "${moderated[@]}" --token client.tok --identity client.key \
    2>>"$work/beectl.log")
}

start b0 "$base" "${moderated[@]}" --token b0.tok
for ((i = 1; i < N; i++)); do
  start "b$i" $((base + i)) "${moderated[@]}" --token "b$i.tok" \
    --join "127.0.0.1:$base"
done
for ((i = 1; i < N; i++)); do
  wait_log "b$i" 'dht: joined in' 20
done

# Store through random bees, then find each through another one.
for ((k = 0; k < KEYS; k++)); do
  via=$((1 + RANDOM % (N - 1)))
  out=$(dht put "key$k" "value-$k" --ttl 1h $((base + via))) ||
    fail "put key$k through b$via failed"
  [[ $out = "stored on "* ]] || fail "put key$k: '$out'"
done
found=0
for ((k = 0; k < KEYS; k++)); do
  via=$((1 + RANDOM % (N - 1)))
  out=$(dht get "key$k" $((base + via)) 2>/dev/null) || true
  [[ $out = *"value-$k"* ]] && found=$((found + 1))
done
[ "$found" = "$KEYS" ] || fail "found $found of $KEYS values"
echo "dht 20: $KEYS values stored and found through random bees"

# The queen dies.  The others go on; a newcomer joins through b7.
kill -9 "${pid[b0]}"
wait "${pid[b0]}" 2>/dev/null || true
unset "pid[b0]"
start newbee $((base + N)) "${moderated[@]}" --token newbee.tok \
  --join "127.0.0.1:$((base + 7))"
wait_log newbee 'dht: joined in' 20
found=0
for ((k = 0; k < KEYS; k++)); do
  via=$((k % 2 == 0 ? base + N : base + 1 + RANDOM % (N - 1)))
  out=$(dht get "key$k" "$via" 2>/dev/null) || true
  [[ $out = *"value-$k"* ]] && found=$((found + 1))
done
[ "$found" = "$KEYS" ] || fail "after the queen died: found $found of $KEYS values"
out=$(dht put after-queen "still-here" --ttl 1h $((base + N))) ||
  fail "put through the newcomer failed"
out=$(dht get after-queen $((base + 3))) || fail "get after the queen died failed"
[[ $out = *still-here* ]] || fail "get after-queen: '$out'"
echo "dht 20: queen gone; newcomer joined through b7; all $KEYS old values and a new one found"

stop_all
echo "dht processes: all checks passed"
