#!/bin/bash
# test-net-schedule.sh: --lr-schedule reaches the optimizer's steps.
#
# One bee trains mlp with SGD under a linear schedule that ends at 0 at
# epoch 3 (--total-epochs 3, --min-lr 0 by default): the steps of epochs
# 0 to 2 move the parameters (the step lines' hashes all differ), and
# from epoch 3 on the learning rate is 0, so the steps of epochs 3 to 5
# leave them as epoch 2's left them (momentum and all: SGD's update is
# the learning rate times its velocity).  The start line describes the
# schedule.  About 10 s.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/netlib.sh"

key b0
start b0 "$base" --open --run-id sched --target-batch-size 4096 \
  --eval-every 0 --lr-schedule linear --total-epochs 3
wait_log b0 'learning rate: 0 epochs of warmup, then linear to 0 at epoch 3' 20
wait_log b0 'train: epoch 5 done' 60
stop_all
for e in 0 1 2 3 4 5; do
  printf -v "h$e" '%s' "$(hash_of b0 "$e")"
  [ -n "$(hash_of b0 "$e")" ] || fail "no step line for epoch $e"
done
[ "$h0" != "$h1" ] && [ "$h1" != "$h2" ] && [ "$h0" != "$h2" ] ||
  fail "epochs 0 to 2 did not all move the parameters: $h0 $h1 $h2"
for e in 3 4 5; do
  h=h$e
  [ "${!h}" = "$h2" ] || fail "epoch $e moved the parameters at learning rate 0: ${!h}, not $h2"
done
echo "schedule: epochs 0-2 moved the parameters, epochs 3-5 (lr 0) left them at $h2"
