#!/bin/bash
# test-net-delay.sh: two bees with --delay-averaging.
#
# At each epoch step a bee hands its mean gradient to the round and goes
# on computing the next epoch; the optimizer step comes when the round is
# over.  The parameters do not change between steps (gradients only
# accumulate), so both bees apply the same averaged gradient to the same
# parameters: after every step their parameters hash the same.  The step
# lines say the round ran behind the next epoch, the swarm keeps
# stepping, and the training loss falls.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/netlib.sh"

EPOCHS=5
train=(--open --run-id dly --target-batch-size 262144 --delay-averaging
  --eval-every 0 --min-peers 2)
for b in a1 a2; do key "$b"; done
start a1 "$base" "${train[@]}"
wait_log a1 'listening on' 10
start a2 $((base + 1)) "${train[@]}" --join "127.0.0.1:$base"
for b in a1 a2; do wait_log "$b" "train: epoch $EPOCHS done" 120; done
stop_all

grep -q "target 262144 samples per epoch (averaged behind the next)" \
  "$work/a1.log" || fail "the start line does not say the rounds are delayed"
loss() {
  sed -nE "s/.*train: epoch $2 done: [0-9]+ local samples, training loss ([0-9.]+),.*/\1/p" \
    "$work/$1.log" | head -n 1
}
in_step a1 a2 1 "$EPOCHS" \
  'averaged in a group of 2 .*MiB sent \(behind the next epoch\)'
l1=$(loss a1 1) l5=$(loss a1 "$EPOCHS")
awk -v a="$l1" -v b="$l5" 'BEGIN { exit !(b < a) }' ||
  fail "the training loss did not fall (epoch 1: $l1, epoch $EPOCHS: $l5)"
echo "delay: $EPOCHS epochs averaged behind the next, in step; loss $l1 -> $l5"
