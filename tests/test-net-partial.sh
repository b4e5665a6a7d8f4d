#!/bin/bash
# test-net-partial.sh: a round that a member left half done keeps the
# others in line.
#
# Three bees train mlp (gradient averaging, epochs of several seconds,
# the group formed ahead of each epoch's end).  Once b2 has joined the
# group for an epoch, it is paused (SIGSTOP, as a VM the host stalls)
# before the round begins: b0 and b1 drop its gradients after the
# sender timeout and, after the reducer timeout, hold the part it owns
# unaveraged.  They leave that part out of the step (its gradient zeroed
# on both, as by every member) rather than step it each with its own
# gradients, so they end the epoch with the same parameters.  (Should b2
# be paused too late, after the round began, the next epoch is tried.)
# Let go, b2 sees that the group went on without it and takes the step
# the others took from their kept steps (its own gradients left out): it
# holds their parameters after epoch E without a download.  (b0 and b1
# are an epoch further by then; where b2's view shows that before its
# round is over, it loads their state instead, once.)
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/netlib.sh"

for b in b0 b1 b2; do key "$b"; done
# Epochs of several seconds.  b2, let go, may find itself in a
# matchmaking for an epoch the others have left: it ends within two views
# (test-net-catchup), not after --matchmaking-time + 2 s, so b2 keeps up.
train=(--open --run-id partial
  --target-batch-size "$(epoch_target 1310720 786432)" --eval-every 0
  --matchmaking-time 4 --min-peers 3)
start b0 "$base" "${train[@]}"
wait_log b0 'listening on' 10
start b1 $((base + 1)) "${train[@]}" --join "127.0.0.1:$base"
start b2 $((base + 2)) "${train[@]}" --join "127.0.0.1:$base" \
  --log-level debug

for b in b0 b1 b2; do wait_log "$b" 'train: epoch 1 done' 120; done
E=
for try in 1 2 3; do
  K=$(last_done b2)
  wait_log b2 "epoch $((K + 1)): a group of 3 formed ahead" 60
  kill -STOP "${pid[b2]}"
  wait_log b0 "train: epoch $((K + 1)) done" 90
  wait_log b1 "train: epoch $((K + 1)) done" 30
  if [[ $(done_line b0 $((K + 1))) != *"(100.0% by all)"* ]]; then
    E=$((K + 1))
    break
  fi
  # The round had begun before the pause: b2 took part in full.
  kill -CONT "${pid[b2]}"
  wait_log b2 "train: epoch $((K + 1)) done" 60
done
[ -n "$E" ] || fail "b2 was never paused between its group and its round"

for b in b0 b1; do
  [[ $(done_line "$b" "$E") == *"averaged in a group of 3 ("* ]] ||
    fail "$b, epoch $E: '$(done_line "$b" "$E")'"
  wait_log "$b" "train: epoch $E: [0-9.]+% of the round stayed local" 5
done
[ "$(hash_of b0 "$E")" = "$(hash_of b1 "$E")" ] ||
  fail "b0 and b1 differ after epoch $E: $(hash_of b0 "$E") $(hash_of b1 "$E")"
# And they go on together.
for b in b0 b1; do wait_log "$b" "train: epoch $((E + 1)) done" 90; done
[ "$(hash_of b0 $((E + 1)))" = "$(hash_of b1 $((E + 1)))" ] ||
  fail "b0 and b1 differ after epoch $((E + 1))"
kill -CONT "${pid[b2]}"
# b2, let go, finds the others' ABORTs: they went on without it.  It says
# so at once and takes their step of epoch E, which leaves it with their
# parameters; or, where its view shows it two epochs behind before its
# round is over, it loads their state (one download) and steps in line
# from there.
wait_log b2 "train: epoch $E done" 60
wait_log b2 "train: epoch $E: 2 of the 2 other members of the group went on without this bee" 5
if [[ $(done_line b2 "$E") == *"took the swarm's step (its round missed it; its own gradients left out)"* ]]; then
  how="took their step of epoch $E"
  [ "$(hash_of b2 "$E")" = "$(hash_of b0 "$E")" ] ||
    fail "b2 and b0 differ after epoch $E, the swarm's step"
else
  how="two epochs behind, loaded their state"
  wait_log b2 "train: state: loaded epoch" 60
fi
F=$(back_in_line b2 b0 "$E")
n=$(grep -c 'train: state: loaded epoch' "$work/b2.log" || true)
[ "$n" -le 1 ] || fail "b2 downloaded the state $n times"
stop_all
echo "partial: b2 paused in the group of epoch $E; b0 and b1: '$(done_line b0 "$E" | sed -E 's/, parameters.*//')', the same parameters ($(hash_of b0 "$E")), and after epoch $((E + 1)); b2 let go, $how, in line again after epoch $F"
