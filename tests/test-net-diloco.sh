#!/bin/bash
# test-net-diloco.sh: two bees in DiLoCo mode, with state averaging.
#
# Each bee takes --inner-steps local AdamW steps, then the pair averages
# the change (weighted by samples) and both take the same outer Nesterov
# step from the same parameters: after every round their parameters are
# the same to the bit (the step lines print a hash of them).  Their AdamW
# moments stay their own, so their checkpoints differ, except after a
# state round (--average-state-every 2: after epochs 2, 4, ...), which
# averages parameters, moments and the outer momentum: then the two
# checkpoint files are the same bytes.  And the pair learns: mlp on
# Fashion-MNIST reaches 80% test accuracy after 6 rounds.  Both wait for
# each other before they train (--min-peers 2).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/netlib.sh"

EPOCHS=6
train=(--open --run-id dl --averaging diloco --inner-steps 150
  --optimizer adamw --lr 1e-3 --average-state-every 2 --eval-every "$EPOCHS"
  --matchmaking-time 5 --checkpoint-every 1 --keep-checkpoints 100
  --min-peers 2)
for b in a1 a2; do key "$b"; mkdir -p "$work/ck-$b"; done

start a1 "$base" "${train[@]}" --checkpoint-dir "ck-a1"
wait_log a1 'listening on' 10
sleep 4 # longer than a bee waits alone without --min-peers (3 s)
start a2 $((base + 1)) "${train[@]}" --checkpoint-dir "ck-a2" \
  --join "127.0.0.1:$base"
for b in a1 a2; do wait_log "$b" "train: epoch $EPOCHS: test accuracy" 180; done
stop_all

ckpt() { printf '%s/ck-%s/dl-%012d.ckpt' "$work" "$1" "$2"; }
grep -q "DiLoCo: 150 local steps per round" "$work/a1.log" ||
  fail "the start line does not name DiLoCo"
# --min-peers 2: a1 started first, and trained only once a2 was there.
t1=$(sed -nE 's/^([0-9:.]+) .*train: training starts at epoch 0.*/\1/p' "$work/a1.log")
t2=$(sed -nE 's/^([0-9:.]+) .*beed: listening on.*/\1/p' "$work/a2.log")
[ -n "$t1" ] && [ -n "$t2" ] && [[ ! $t1 < $t2 ]] ||
  fail "a1 started training at '$t1', before a2 was up at '$t2'"
# The states in two checkpoint files: past the file header (64 bytes and
# the run name, "dl"; its checksum covers the rest) and without the last
# 24 bytes, each bee's own (where its data order stands, its dropout
# count).
same_state() {
  cmp -s <(tail -c +67 "$1" | head -c -24) <(tail -c +67 "$2" | head -c -24)
}
for ((e = 1; e < EPOCHS; e++)); do
  for b in a1 a2; do
    grep -q "train: epoch $e done: .*averaged in a group of 2" "$work/$b.log" ||
      fail "$b: round $e was not averaged by the pair"
  done
  h1=$(hash_of a1 $e) h2=$(hash_of a2 $e)
  [ -n "$h1" ] && [ "$h1" = "$h2" ] ||
    fail "after round $e the parameters differ ($h1, $h2)"
  [ -f "$(ckpt a1 $((e + 1)))" ] && [ -f "$(ckpt a2 $((e + 1)))" ] ||
    fail "no checkpoint of epoch $((e + 1))"
  if (((e + 1) % 2 == 0)); then
    grep -q "train: epoch $e done: .*; state averaged in a group of 2" \
      "$work/a1.log" || fail "no state round after epoch $e"
    same_state "$(ckpt a1 $((e + 1)))" "$(ckpt a2 $((e + 1)))" ||
      fail "after the state round of epoch $((e + 1)) the states differ"
  else
    ! grep -q "train: epoch $e done: .*state" "$work/a1.log" ||
      fail "a state round after epoch $e, which is not due"
    ! same_state "$(ckpt a1 $((e + 1)))" "$(ckpt a2 $((e + 1)))" ||
      fail "without a state round the AdamW moments are the same"
  fi
done
acc=$(sed -nE "s/.*train: epoch $EPOCHS: test accuracy ([0-9.]+)%.*/\1/p" \
  "$work/a1.log" | head -n 1)
awk -v a="$acc" 'BEGIN { exit !(a >= 80) }' ||
  fail "test accuracy $acc% after $EPOCHS rounds, want 80% or more"
echo "diloco: $EPOCHS rounds in step, states equal after state rounds, accuracy $acc%"
