#!/bin/bash
# test-net-catchup.sh: a bee that asks for the round of an epoch the swarm
# has left does not wait out its matchmaking for nobody.
#
# Three bees train mlp (gradient averaging, groups formed when the target
# is in: --no-match-ahead, a long --matchmaking-time of 10 s).  b2 is
# paused (SIGSTOP) early in epoch K+1, once it has counted the others
# there.  b0 and b1 wait the matchmaking out for it, step K+1 as two and
# go on to K+2.  Let go then, b2 sees the swarm past its epoch and asks
# for K+1's round, expecting the two it counted there; but nobody is left
# at K+1.  Two views in a row say so (or its first view already shows the
# swarm past its epoch), its matchmaking ends, and it takes the pair's
# step of K+1 from their kept steps: well within the 10 s (plus 2 s of
# grace) it would have waited for nobody, in line with them after it,
# and without a download.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/netlib.sh"

MM=10
for b in b0 b1 b2; do key "$b"; done
train=(--open --run-id catchup --no-match-ahead --matchmaking-time "$MM"
  --target-batch-size "$(epoch_target 1310720 786432)" --eval-every 0
  --min-peers 3)
start_swarm 3 "${train[@]}"

for b in b0 b1 b2; do wait_log "$b" 'train: epoch 1 done' 120; done
K=$(last_done b2)
# A second into K+1 its views have counted b0 and b1 there (a view a
# second), and it is far from the target (epochs of several seconds).
sleep 1.5
kill -STOP "${pid[b2]}"
grep -q "train: epoch $((K + 1)) done" "$work/b2.log" &&
  fail "b2 finished epoch $((K + 1)) before the pause: epochs too short"
wait_log b0 "train: epoch $((K + 1)) done" 120
wait_log b1 "train: epoch $((K + 1)) done" 30
for b in b0 b1; do
  [[ $(done_line "$b" $((K + 1))) == *"averaged in a group of 2 ("* ]] ||
    fail "$b, epoch $((K + 1)) without b2: '$(done_line "$b" $((K + 1)))'"
done
kill -CONT "${pid[b2]}"
# Within --matchmaking-time: the view at most a second old, two more to
# find nobody at its epoch.
t0=$(date +%s.%N)
wait_log b2 "train: epoch $((K + 1)) done" "$MM"
t1=$(date +%s.%N)
[[ $(done_line b2 $((K + 1))) == *"took the swarm's step (its round missed it; its own gradients left out)"* ]] ||
  fail "b2, epoch $((K + 1)): '$(done_line b2 $((K + 1)))'"
[ "$(hash_of b2 $((K + 1)))" = "$(hash_of b0 $((K + 1)))" ] ||
  fail "b2 and b0 differ after epoch $((K + 1)), the swarm's step"
same_after b2 b0 $((K + 2))
grep -q 'train: state: loaded epoch' "$work/b2.log" &&
  fail "b2 downloaded a state it did not need"
stop_all
echo "catchup: b2, let go in epoch $((K + 1)) after the others left it, took their step $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }') s later (its matchmaking: $MM s), in line after it without a download"
