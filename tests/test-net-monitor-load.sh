#!/bin/bash
# test-net-monitor-load.sh: 100 websocket clients on trainmonitor for 30 s.
#
# One bee trains (so every scrape changes the snapshot) and trainmonitor
# scrapes it four times a second.  100 clients read every update and 5
# more connect and never read, so their sockets fill.  Each reader must
# get nearly every update (at least 100 of the 120 in 30 s); the monitor
# must skip updates for the slow ones (it says how many when it stops)
# rather than queue them: its resident memory grows by less than 16 MiB
# between the 8th and the 30th second; it still answers /api/snapshot at
# the end, and SIGTERM stops it with status 0.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/netlib.sh"

MON=${TRAINMONITOR:?TRAINMONITOR must name the trainmonitor binary}
LOAD="$(dirname "${BASH_SOURCE[0]}")/ws-load.py"
http=$((base + 10))
key b0
start b0 "$base" --open --run-id load --target-batch-size 65536 --eval-every 0
wait_log b0 'listening on' 10
(cd "$work" && exec "$MON" --open --join "127.0.0.1:$base" --run-id load \
  --http "127.0.0.1:$http" --scrape-interval 0.25) >"$work/mon.log" 2>&1 &
pid[mon]=$!
wait_log mon 'joined the swarm' 20
wait_log b0 'train: epoch 1 done' 60

rss_kib() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"; }
python3 "$LOAD" "ws://127.0.0.1:$http/ws" 100 5 30 >"$work/load.out" 2>&1 &
load=$!
sleep 8
rss8=$(rss_kib "${pid[mon]}")
sleep 20
rss28=$(rss_kib "${pid[mon]}")
wait "$load" || fail "the load clients failed: $(cat "$work/load.out")"
read -r _ _ fmin _ fmax _ slow_open <"$work/load.out"
[ "$fmin" -ge 100 ] || fail "a reader got only $fmin updates in 30 s (most: $fmax)"
growth=$(((rss28 - rss8) / 1024))
[ "$growth" -lt 16 ] ||
  fail "trainmonitor grew by $growth MiB with slow clients ($rss8 -> $rss28 KiB)"
curl -sS --fail --max-time 5 "http://127.0.0.1:$http/api/snapshot" >/dev/null ||
  fail "trainmonitor does not answer after the load"
stop_all
skipped=$(sed -nE 's/.*websocket clients, ([0-9]+) updates skipped.*/\1/p' "$work/mon.log")
[ "${skipped:-0}" -gt 0 ] || fail "no update was skipped for the clients that never read"
echo "load: 100 readers got $fmin to $fmax updates in 30 s; 5 that never read ($slow_open still open), $skipped updates skipped for them; RSS $((rss8 / 1024)) -> $((rss28 / 1024)) MiB"
