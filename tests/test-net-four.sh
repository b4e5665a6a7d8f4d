#!/bin/bash
# test-net-four.sh: four bees on loopback train mlp with target batch
# 4096 (issue 6's first end-to-end test).
#
# Four beeds start together (--min-peers 4) and train mlp on
# Fashion-MNIST with AdamW; the queen measures test accuracy every 5
# epochs.  The test runs until the queen reports 85% (at most 240 s),
# then checks that every epoch every bee finished was averaged in one
# group of four and left all four with the same parameters (the step
# lines' hashes).  Mlp is fast: 4096 samples take the swarm a few tens of
# milliseconds, less than progress records take to travel, so each bee
# gathers its 4096 before it sees the others' counts and an epoch holds
# about 4 x 4096 samples; the round keeps the bees in step all the same.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/netlib.sh"

ACC=85
# --matchmaking-time 5: the bees start training when each sees the other
# three, up to a few seconds apart under ASan; the first round waits for
# the last of them.
train=(--open --run-id four --target-batch-size 4096 --optimizer adamw
  --lr 0.002 --min-peers 4 --matchmaking-time 5)
for b in b0 b1 b2 b3; do key "$b"; done
start b0 "$base" "${train[@]}" --eval-every 5
wait_log b0 'listening on' 10
for i in 1 2 3; do
  start "b$i" $((base + i)) "${train[@]}" --eval-every 0 --join "127.0.0.1:$base"
done

# Until the queen's test accuracy reaches ACC.
reached=
for ((t = 0; t < 2400; t++)); do
  if acc=$(awk -v a="$ACC" '/train: epoch [0-9]+: test accuracy/ {
         v = $0; sub(/.*test accuracy /, "", v); sub(/%.*/, "", v)
         if (v + 0 >= a + 0) { print v; f = 1; exit } } END { exit !f }' \
      "$work/b0.log"); then
    reached=$acc
    break
  fi
  for b in b0 b1 b2 b3; do kill -0 "${pid[$b]}" 2>/dev/null || fail "$b exited early"; done
  sleep 0.1
done
[ -n "$reached" ] || fail "test accuracy did not reach $ACC% within 240 s"
stop_all

# Every epoch each bee finished: a group of four, one hash for all four.
last=$(for b in b0 b1 b2 b3; do
  sed -nE 's/.*train: epoch ([0-9]+) done:.*/\1/p' "$work/$b.log" | tail -n 1
done | sort -n | head -n 1)
[ "$last" -ge 10 ] || fail "only $last epochs done by every bee"
for ((e = 0; e <= last; e++)); do
  hashes=$(for b in b0 b1 b2 b3; do
    sed -nE "s/.*train: epoch $e done: .*averaged in a group of 4 \(100\.0% by all\).*, parameters ([0-9a-f]+)$/\1/p" \
      "$work/$b.log"
  done | sort -u)
  if [ "$(wc -l <<<"$hashes")" != 1 ] || [ -z "$hashes" ]; then
    grep -h "train: epoch $e done\|training starts" "$work"/b?.log >&2 || true
    fail "epoch $e: not averaged by all four into one state"
  fi
done
echo "four bees: epochs 0 to $last averaged by all four, identical parameters; test accuracy $reached%"
