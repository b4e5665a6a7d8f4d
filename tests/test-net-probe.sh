#!/bin/bash
# test-net-probe.sh: bees probe the links to peers they have no rate for,
# publish what they measured, and answer a misbehaving prober with clear
# refusals.
#
# Two bees on loopback in one run that never trains (--min-peers 3: they
# wait for a third), so no round and no download carries bytes: 20 s
# after its start each probes the other (16 "swarm.probe" requests of
# 64 KiB), and `beectl links --pairs` then shows both directions with a
# round trip and a rate.  Then tests/probe-client, a peer of its own,
# asks b0 for a probe with a payload (refused as malformed), for one
# probe (65536 bytes), and for 600 at once: at most 512 (32 MiB a minute)
# are answered and the rest refused with ELIMIT, and b0 goes on serving.
# About 35 s.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/netlib.sh"
: "${PROBE_CLIENT:?PROBE_CLIENT must name tests/probe-client}"

for b in b0 b1; do key "$b"; done
train=(--open --run-id pr --min-peers 3 --eval-every 0 --log-level debug)
start b0 "$base" "${train[@]}"
wait_log b0 'listening on' 10
start b1 $((base + 1)) "${train[@]}" --join "127.0.0.1:$base"
for b in b0 b1; do wait_log "$b" 'train: probe of [0-9a-f]+ done' 60; done
links=(--open --swarm beed --join "127.0.0.1:$base" --run pr)
# The links records: each bee's every 10 s.
for _ in $(seq 1 8); do
  sleep 4
  "$BEECTL" links "${links[@]}" --pairs >"$work/pairs.txt" 2>"$work/pairs.err" ||
    fail "beectl links: $(cat "$work/pairs.err")"
  n=$(awk -F'\t' '$5 > 0 && $6 > 0' "$work/pairs.txt" | wc -l)
  [ "$n" -eq 2 ] && break
done
[ "$n" -eq 2 ] || fail "not both directions measured: $(cat "$work/pairs.txt")"
"$PROBE_CLIENT" "127.0.0.1:$base" >"$work/client.txt" 2>&1 ||
  fail "probe-client: $(cat "$work/client.txt")"
cat "$work/client.txt"
# b0 still answers: its status and a DHT read through it.
"$BEECTL" links "${links[@]}" >/dev/null 2>"$work/again.err" ||
  fail "b0 no longer serves: $(cat "$work/again.err")"
kill -0 "${pid[b0]}" || fail "b0 died"
echo "probes measured both directions ($(cut -f2,4,5,6 "$work/pairs.txt" |
  tr '\t\n' ' ')); a bad and a greedy prober refused"
