#!/bin/bash
# test-net-rejoin.sh: a preempted bee on intercontinental links is back in
# line at its first step after its download, having downloaded once.
#
# The WAN lab of tools/wanlab/configs/4continents-stock.conf: one host per
# continent, the study's link figures, a stock kernel's TCP buffers.  A
# moderated swarm of one beed per host trains the cnn (25 MiB of state)
# with target 8,192 and a checkpoint every epoch.  Once the last host's
# bee (aus) has finished epoch 4, it is killed (SIGKILL, as a spot VM
# goes), its three newest checkpoints are removed (a checkpoint 3 epochs
# old, as with one every 3 epochs), and it is started again with
# --resume.  It loads its checkpoint, finds the swarm ahead, downloads the
# state from its peers (the steps the swarm took meanwhile with it), and:
#   - downloads the state once, and never steps alone or hears of a split;
#   - its first step after the download leaves it with the queen's
#     parameters at that epoch (by their hash), and so does the next, in
#     a group of four.
# Timings (restart to in line, the download's time) are printed, not
# asserted: tools/bench/run-rejoin measures them.  Exits 77 (skipped)
# without root, network namespaces or the lab's delayer.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/netlib.sh"

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
wanlab=$root/tools/wanlab/wanlab
. "$root/tests/lablib.sh"
lab_up rjtest "$root/tools/wanlab/configs/4continents-stock.conf" us eu asia aus
hosts=(us eu asia aus)
victim=aus

key mod --moderator
for h in "${hosts[@]}"; do
  key "$h"
  token "$h" mod rejoin 2h
  mkdir -p "$work/ck-$h"
done
train=(--moderator "$pk_mod" --swarm rejoin --run-id rj --model cnn
  --target-batch-size 8192 --threads 1 --status-interval 0 --eval-every 0
  --min-peers 4 --checkpoint-every 1 --keep-checkpoints 5)
# run_bee HOST LOG [FLAGS...]: HOST's beed in its namespace.
run_bee() {
  local h=$1 log=$2 j=()
  shift 2
  [ "$h" != us ] && j=(--join "${addr[us]}:45555")
  (cd "$work" && exec "$wanlab" --name "$lab" exec "$h" -- "$BEED" \
    --listen "${addr[$h]}:45555" --identity "$h.key" --token "$h.tok" \
    --checkpoint-dir "ck-$h" "${train[@]}" "${j[@]}" "$@") >"$work/$log.log" 2>&1 &
  pid[$log]=$!
}
run_bee us us
wait_log us 'listening on' 10
for h in eu asia aus; do run_bee "$h" "$h"; done
wait_log "$victim" 'train: epoch 4 done' 300

kill -KILL "${pid[$victim]}"
wait "${pid[$victim]}" 2>/dev/null || true
unset "pid[$victim]"
n=$(find "$work/ck-$victim" -name '*.ckpt' | wc -l)
[ "$n" -ge 4 ] || fail "$victim has $n checkpoints, want 4 or more"
find "$work/ck-$victim" -name '*.ckpt' | sort | tail -n 3 | xargs rm -f
resumed=$(find "$work/ck-$victim" -name '*.ckpt' | sort | tail -n 1)
sleep 2
t0=$(date +%s.%N)
run_bee "$victim" v2 --resume
wait_log v2 "train: state: loaded epoch [0-9]+ from" 90
t1=$(date +%s.%N)
L=$(sed -nE 's/.*train: state: loaded epoch ([0-9]+) from.*/\1/p' "$work/v2.log" | head -n 1)
dl=$(sed -nE 's/.*train: state: loaded epoch [0-9]+ from ([0-9]+ donors? in [0-9.]+ s \([0-9.]+ Mbit\/s\)).*/\1/p' \
  "$work/v2.log" | head -n 1)
# Its first step after the download: the swarm's parameters.
line=$(grep -n "train: state: loaded epoch" "$work/v2.log" | head -n 1 | cut -d: -f1)
for ((i = 0; i < 900; i++)); do
  E=$(tail -n "+$line" "$work/v2.log" | sed -nE 's/.*train: epoch ([0-9]+) done:.*/\1/p' | head -n 1)
  [ -n "$E" ] && break
  kill -0 "${pid[v2]}" 2>/dev/null || fail "the restarted bee exited"
  sleep 0.1
done
[ -n "$E" ] || fail "no step within 90 s of the download"
t2=$(date +%s.%N)
same_after v2 us "$E"
same_after v2 us $((E + 1))
[[ $(done_line v2 $((E + 1))) == *"averaged in a group of 4 ("* ]] ||
  fail "v2, epoch $((E + 1)): '$(done_line v2 $((E + 1)))'"
n=$(grep -c 'train: state: loaded epoch' "$work/v2.log")
[ "$n" = 1 ] || fail "the restarted bee downloaded the state $n times"
grep -Eq 'alone at its epoch|split' "$work/v2.log" &&
  fail "the restarted bee stepped alone or saw a split: $(grep -Em1 'alone at its epoch|split' "$work/v2.log")"
stop_all
printf 'rejoin: %s killed after epoch 4, resumed from %s; loaded epoch %s (%s) %.1f s after the restart, in line at its first step after it (epoch %s, %.1f s after the restart; %s), and at epoch %s in a group of 4; one download\n' \
  "$victim" "$(basename "$resumed")" "$L" "$dl" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" \
  "$E" "$(awk -v a="$t0" -v b="$t2" 'BEGIN { print b - a }')" \
  "$(done_line v2 "$E" | sed -E 's/^training loss [0-9.]+, //; s/, parameters.*//')" $((E + 1))
