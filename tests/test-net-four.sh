#!/bin/bash
# test-net-four.sh: four bees on loopback train mlp with target batch
# 4096 (issue 6's first end-to-end test).
#
# Four beeds start together (--min-peers 4) and train mlp on
# Fashion-MNIST with AdamW; the queen measures test accuracy every 5
# epochs.  The test runs until the queen reports 85% (at most 240 s),
# then checks that every epoch every bee finished was averaged in one
# group of four and left all four with the same parameters (the step
# lines' hashes).  Churn on the way: once every bee has finished epoch
# 10, b3 is killed with SIGKILL and b4 joins through b1.  b4 must load
# the state from a peer and then step in line with the others (averaged
# in a group of four, b0's hash) for 3 epochs before the run may end; the
# three that stay keep one hash every epoch throughout, and none waits
# longer between two steps than a round's matchmaking deadline allows.  Mlp is fast: 4096 samples take the swarm a few tens of
# milliseconds, less than progress records take to travel, so each bee
# gathers its 4096 before it sees the others' counts and an epoch holds
# about 4 x 4096 samples; the round keeps the bees in step all the same.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/netlib.sh"

ACC=85
# --matchmaking-time 5: the bees start training when each sees the other
# three, up to a few seconds apart under ASan; the first round waits for
# the last of them.
MM=5 # --matchmaking-time
common=(--open --run-id four --target-batch-size 4096 --optimizer adamw
  --lr 0.002 --matchmaking-time "$MM" --eval-every 0)
train=("${common[@]}" --min-peers 4)
for b in b0 b1 b2 b3 b4; do key "$b"; done
start b0 "$base" "${train[@]}" --eval-every 5
wait_log b0 'listening on' 10
for i in 1 2 3; do
  start "b$i" $((base + i)) "${train[@]}" --join "127.0.0.1:$base"
done

# A group of four, b4 in it, for 3 epochs: b4 steps in line.
b4_in_line() {
  [ "$(grep -c 'averaged in a group of 4 (100.0% by all)' "$work/b4.log" 2>/dev/null)" -ge 3 ]
}

# Until the queen's test accuracy reaches ACC and b4 has stepped in line;
# the churn once every bee has finished epoch 10.
reached= churn_at= kill_epoch=
alive=(b0 b1 b2 b3)
for ((t = 0; t < 3000; t++)); do
  if [ -z "$churn_at" ]; then
    low=$(for b in b0 b1 b2 b3; do last_done "$b"; done | sort -n | head -n 1)
    if [ "$low" -ge 10 ]; then
      kill_epoch=$low
      kill -9 "${pid[b3]}"
      wait "${pid[b3]}" 2>/dev/null || true
      unset 'pid[b3]'
      churn_at=$(last_done b0)
      start b4 $((base + 4)) "${common[@]}" --join "127.0.0.1:$((base + 1))"
      alive=(b0 b1 b2 b4)
    fi
  fi
  if [ -z "$reached" ] && acc=$(awk -v a="$ACC" '/train: epoch [0-9]+: test accuracy/ {
         v = $0; sub(/.*test accuracy /, "", v); sub(/%.*/, "", v)
         if (v + 0 >= a + 0) { print v; f = 1; exit } } END { exit !f }' \
      "$work/b0.log"); then
    reached=$acc
  fi
  [ -n "$reached" ] && [ -n "$churn_at" ] && b4_in_line && break
  for b in "${alive[@]}"; do kill -0 "${pid[$b]}" 2>/dev/null || fail "$b exited early"; done
  sleep 0.1
done
[ -n "$reached" ] || fail "test accuracy did not reach $ACC% within 300 s"
[ -n "$churn_at" ] || fail "the bees did not reach epoch 10"
b4_in_line || fail "b4 did not step in line with the others"
stop_all

# The newcomer loaded the state, and trained only from it.
grep -q 'state: loaded epoch' "$work/b4.log" || fail "b4 loaded no state"
grep -q 'training on from here' "$work/b4.log" && fail "b4 trained from its own weights"

# The three that stayed: one hash every epoch all three finished.
last3=$(for b in b0 b1 b2; do last_done "$b"; done | sort -n | head -n 1)
for ((e = 0; e <= last3; e++)); do
  hashes=$(for b in b0 b1 b2; do hash_of "$b" "$e"; done | sort -u)
  [ "$(wc -l <<<"$hashes")" = 1 ] && [ -n "$hashes" ] ||
    fail "epoch $e: b0, b1 and b2 hold different parameters: $hashes"
done
# b4, from its first step in a group of four: b0's hash.
first4=$(sed -nE 's/.*train: epoch ([0-9]+) done: .*averaged in a group of 4 .*/\1/p' \
  "$work/b4.log" | head -n 1)
last4=$(last_done b4)
[ "$last4" -le "$last3" ] || last4=$last3
for ((e = first4; e <= last4; e++)); do
  [ "$(hash_of b4 "$e")" = "$(hash_of b0 "$e")" ] ||
    fail "epoch $e: b4's parameters differ from b0's"
done
# No bee waited longer between two steps than a round's deadline
# (matchmaking time + 2 s) and 3 s of computing (ASan, a busy machine).
gap=$(for b in b0 b1 b2; do
  sed -nE 's/^([0-9]+):([0-9]+):([0-9.]+) .*train: epoch [0-9]+ done:.*/\1 \2 \3/p' \
    "$work/$b.log" | awk '{ t = $1 * 3600 + $2 * 60 + $3
      if (n++ && t - p > g) g = t - p; p = t } END { printf "%.1f\n", g }'
done | sort -n | tail -n 1)
awk -v g="$gap" -v lim="$((MM + 5))" 'BEGIN { exit !(g <= lim) }' ||
  fail "a bee waited $gap s between two steps (limit $((MM + 5)) s)"

# Before the churn, every epoch: a group of four, one hash for all four.
last=$kill_epoch
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
echo "four bees: epochs 0 to $last averaged by all four, identical parameters; b3 killed at epoch $churn_at, b4 $(sed -nE 's/.*state: (loaded epoch [0-9]+).*/\1/p' "$work/b4.log" | head -n 1) and stepped in line from epoch $first4; longest wait between steps $gap s; test accuracy $reached%"
