#!/bin/bash
# test-net-diloco-slow.sh: DiLoCo rounds among bees of different speeds.
#
# Three bees train mlp in DiLoCo mode; b1 runs 45% of the time and b2
# 25% (SIGSTOP and SIGCONT every 100 ms, as a slower machine would).  b2
# is the laggard: it takes each round with the steps it has once b0 and
# b1 are done.  b1 is not: it takes all its steps and begins its round
# seconds after b0.  Every round from epoch 1 to 4 must be averaged by
# all three over the whole tensor, with the same parameters after it.
# The groups form ahead, declaring the start the round can keep
# (bee_outer_round), and until its round begins a member says WAIT
# (avg_node_wait), which keeps the others from dropping it at their 5 s
# sender timeout.  Without WAIT, b0 dropped b1 and b2 in every round of a
# 150 s run and averaged 0.0% of the tensor with them (still reported as
# "a group of 3").
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/netlib.sh"

# duty PID RUN_MS STOP_MS: runs PID RUN_MS out of every RUN_MS + STOP_MS
# (both under 1000) while it lives.
duty() {
  while kill -0 "$1" 2>/dev/null; do
    sleep "0.$(printf %03d "$2")"
    kill -STOP "$1" 2>/dev/null || break
    sleep "0.$(printf %03d "$3")"
    kill -CONT "$1" 2>/dev/null || break
  done
}
duties=()
unthrottle() {
  local d b
  for d in "${duties[@]}"; do kill "$d" 2>/dev/null || true; done
  for d in "${duties[@]}"; do wait "$d" 2>/dev/null || true; done
  duties=()
  for b in b1 b2; do kill -CONT "${pid[$b]}" 2>/dev/null || true; done
}

H=$(epoch_target 3000 1800)
train=(--open --run-id ds --averaging diloco --inner-steps "$H"
  --optimizer adamw --lr 1e-3 --eval-every 0 --min-peers 3)
for b in b0 b1 b2; do key "$b"; done
start_swarm 3 "${train[@]}"
duty "${pid[b1]}" 45 55 &
duties+=($!)
duty "${pid[b2]}" 25 75 &
duties+=($!)
for b in b0 b1 b2; do wait_log "$b" 'train: epoch 4 done' 240; done
unthrottle
in_step b0 b1 1 4 'averaged in a group of 3 \(100\.0% by all\)'
in_step b0 b2 1 4 'averaged in a group of 3 \(100\.0% by all\)'
! grep -h 'sender timeout\|reducer timeout' "$work"/b*.log ||
  fail "a member was dropped for its timeouts"
early=$(grep -c 'epoch [1-4] done: .*after [0-9]* of its' "$work/b2.log" || true)
waited=$(grep -h 'epoch [1-4] done:' "$work/b0.log" |
  sed -nE 's/.* in ([0-9.]+) s, .*/\1/p' | tr '\n' ' ')
stop_all
echo "diloco-slow: epochs 1 to 4 averaged by all three, 100% of the tensor, same parameters; b2 took $early of them early; b0's rounds took $waited s"
