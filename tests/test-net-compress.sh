#!/bin/bash
# test-net-compress.sh: gradients averaged in 8 bits (--compression b8,
# with --error-feedback) keep the members identical and cost a quarter of
# the bytes.
#
# b0 and b1 train mlp with --compression b8 --error-feedback; every epoch
# from 1 to 4 is averaged by both (the round's result is the same bits at
# every member whatever the codec, so the parameters hash the same), each
# sends at most 0.25 MiB a round (mlp's 203,530 floats in fp32 are 0.78
# MiB: 2(N-1)/N of it for N = 2), and the model learns: the training
# loss falls every epoch and the test accuracy after 4 steps is over 40%
# (58% in the run that set this bound).  b2, started with --compression
# fp16 in the same run, is never in their group (the encoding is part of
# a round's layout): each of the pair warns about it at most once, one at
# least, and b2 never averages; having seen the pair declare another
# layout, b2 never loads their state to get back in line.  The pair
# clips at the default 10 times the median norm (in the round with each
# other, neither is near it); b2 was started with --clip off.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/netlib.sh"

EPOCHS=4
for b in b0 b1 b2; do key "$b"; done
train=(--open --run-id squeeze --target-batch-size 393216 --eval-every 0
  --matchmaking-time 1)
b8=(--compression b8 --error-feedback)
start b0 "$base" "${train[@]}" "${b8[@]}"
wait_log b0 'listening on' 10
start b1 $((base + 1)) "${train[@]}" "${b8[@]}" --eval-every "$EPOCHS" \
  --join "127.0.0.1:$base"
start b2 $((base + 2)) "${train[@]}" --compression fp16 --clip off \
  --join "127.0.0.1:$base"
wait_log b0 'train: rounds send gradients as b8, with error feedback' 10
wait_log b2 'train: rounds send gradients as fp16$' 10
# --clip: on by default, at 10 times the median; off on b2.
wait_log b0 'train: clip: gradients beyond 10 times the group.s median norm' 10
wait_log b2 'train: clip: off' 10
for b in b0 b1; do wait_log "$b" "train: epoch $EPOCHS done" 150; done
wait_log b1 "train: epoch $EPOCHS: test accuracy" 60
stop_all

# step LOG EPOCH: the epoch's step line, from "training loss" on.
step() {
  sed -nE "s/.*train: epoch $2 done: [0-9]+ local samples, (.*)/\1/p" \
    "$work/$1.log" | head -n 1
}
for ((e = 1; e <= EPOCHS; e++)); do
  s0=$(step b0 "$e") s1=$(step b1 "$e")
  [[ $s0 == *"averaged in a group of 2 (100.0% by all)"* ]] ||
    fail "b0, epoch $e: '$s0'"
  [[ $s1 == *"averaged in a group of 2 (100.0% by all)"* ]] ||
    fail "b1, epoch $e: '$s1'"
  [ "${s0##*parameters }" = "${s1##*parameters }" ] ||
    fail "epoch $e: b0 and b1 hold different parameters"
  for s in "$s0" "$s1"; do
    mib=$(sed -nE 's/.* ([0-9.]+) MiB sent.*/\1/p' <<<"$s")
    python3 -c "import sys; sys.exit(0 if 0 < $mib <= 0.25 else 1)" ||
      fail "epoch $e: $mib MiB sent, more than b8 should"
  done
done
loss() { sed -nE 's/^training loss ([0-9.]+),.*/\1/p' <<<"$(step b0 "$1")"; }
for ((e = 2; e <= EPOCHS; e++)); do
  python3 -c "import sys; sys.exit(0 if $(loss $e) < $(loss $((e - 1))) else 1)" ||
    fail "b0's training loss rose from epoch $((e - 1)) to $e"
done
acc=$(sed -nE "s/.*train: epoch $EPOCHS: test accuracy ([0-9]+)\..*/\1/p" \
  "$work/b1.log")
[ "${acc:-0}" -gt 40 ] || fail "test accuracy $acc% after epoch $EPOCHS"
id() { sed -nE 's/.*peer id ([0-9a-f]{8}).*/\1/p' "$work/$1.log" | head -n 1; }
id0=$(id b0) id1=$(id b1) id2=$(id b2)
warned=0
for b in b0 b1; do
  n=$(grep -c "$id2 trains run 'squeeze' with another model, averaging mode, optimizer or compression" \
    "$work/$b.log" || true)
  [ "$n" -le 1 ] || fail "$b warned $n times about b2, want once at most"
  warned=$((warned + n))
done
[ "$warned" -ge 1 ] || fail "neither b0 nor b1 warned about b2"
grep -q 'train: epoch [0-9]* done: .*averaged in a group' "$work/b2.log" &&
  fail "b2 (fp16) averaged with the b8 pair"
# Once b2 has seen both declare another layout, it never tries to load
# their state to get back in line.
line_of() { grep -n "$1" "$work/b2.log" | head -n 1 | cut -d: -f1; }
w0=$(line_of "$id0 trains run 'squeeze' with another")
w1=$(line_of "$id1 trains run 'squeeze' with another")
if [ -n "$w0" ] && [ -n "$w1" ]; then
  seen=$((w0 > w1 ? w0 : w1))
  tail -n +"$seen" "$work/b2.log" |
    grep -q 'stepped here without the round its peers averaged' &&
    fail "b2 tried to load the state of bees it can never average with"
fi
echo "compress: b8 rounds with error feedback, $EPOCHS epochs averaged by both with the same parameters, $mib MiB a round, ${acc}% test accuracy; an fp16 bee kept apart"
