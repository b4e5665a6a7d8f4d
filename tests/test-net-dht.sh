#!/bin/bash
# test-net-dht.sh: the DHT across 20 real beed processes on loopback.
#
# A queen and 19 bees, all joining through the queen, form one moderated
# swarm.  Values stored through random bees are found through others.
# Then the queen dies (SIGKILL, as a preempted VM would): the swarm keeps
# working without it, a new bee joins through another peer, and both the
# values stored before and new ones are found, through the newcomer too.
# Last, a node started with a revocation list naming b5 publishes it in the
# DHT: the others pick it up, drop b5 and refuse it from then on.  Every
# surviving daemon exits 0 on SIGTERM.
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

auth=(--moderator "$pk_mod" --swarm "$swarm")
moderated=("${auth[@]}" --revocation-interval 1)
# dht OP ARGS... THROUGH-PORT: one beectl dht operation through a bee.
dht() {
  local port=${*: -1}
  (cd "$work" && "$BEECTL" dht "${@:1:$#-1}" --join "127.0.0.1:$port" \
    "${auth[@]}" --token client.tok --identity client.key \
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

# Revocation through the DHT.
key revoker
token revoker mod "$swarm" 1d
"$BEECTL" revoke --moderator-key "$work/mod.key" --swarm "$swarm" \
  --peer "$pk_b5" --list "$work/revoked.list" >/dev/null
id_b5=$(field peer-id "$work/b5.txt")
start revoker $((base + N + 1)) "${moderated[@]}" --token revoker.tok \
  --revocations revoked.list --join "127.0.0.1:$((base + 3))"
wait_log revoker 'revocation: list 1 published on [1-9]' 20
for ((i = 1; i < N; i++)); do
  [ "$i" = 5 ] && continue
  wait_log "b$i" 'revocation: list 1 from the DHT replaces 0' 20
done
wait_log newbee 'revocation: list 1 from the DHT replaces 0' 20
# b5 loses its connections and cannot make new ones.
wait_log b5 'refused by the peer: .*EREVOKED|closed the connection: peer is revoked' 20
for ((i = 1; i < N; i++)); do
  [ "$i" = 5 ] && continue
  if grep -q "swarm: peer ${id_b5:0:8} up" "$work/b$i.log" &&
    ! grep -q "disconnecting revoked peer ${id_b5:0:8}" "$work/b$i.log" &&
    ! grep -q "failed: .*EREVOKED" "$work/b$i.log"; then
    fail "b$i knew b5 but neither dropped nor refused it"
  fi
done
echo "dht 20: a revocation published in the DHT reached every node; b5 dropped"

stop_all
echo "dht processes: all checks passed"
