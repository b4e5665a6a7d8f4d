#!/bin/bash
# test-net-join.sh: a newcomer that would load the swarm's state after the
# epoch's group formed waits for the swarm's step and loads the next
# epoch's state instead, so that its first epoch is averaged with the
# swarm and it downloads once.
#
# Three bees train mlp with their groups formed ahead, --matchmaking-time
# 4 s before each epoch's target (epochs of about 8 s).  As soon as one of
# them leads a group formed for the epoch, a newcomer j starts: its first
# view comes about 1.5 s later, when the swarm expects its target in a
# few seconds and the group it would have to join has begun without it.
# Loaded then, its state would be that epoch's, the swarm would step
# without it, and it would step alone, out of line, and download again
# (two or three downloads in four joins at random points, before the
# wait).  Instead it logs that the download waits, loads the state of the
# epoch after the step, averages that epoch in a group of four with the
# parameters the others hold, and never downloads again.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/netlib.sh"

for b in b0 b1 b2 j; do key "$b"; done
train=(--open --run-id join --matchmaking-time 4
  --target-batch-size "$(epoch_target 1310720 786432)" --eval-every 0)
start_swarm 3 "${train[@]}" --min-peers 3
for b in b0 b1 b2; do wait_log "$b" 'train: epoch 1 done' 120; done

# The next group formed ahead: a "leading group" line in any of the three.
groups() { cat "$work"/b[012].log | grep -c 'match: .*: leading group' || true; }
g0=$(groups)
for ((i = 0; i < 300 && $(groups) == g0; i++)); do sleep 0.05; done
[ "$(groups)" -gt "$g0" ] || fail "no group formed within 15 s"
K=$(last_done b0)
K=$((K + 1)) # the epoch b0 trains, whose group just formed
start j $((base + 3)) "${train[@]}" --join "127.0.0.1:$base"

wait_log j 'state: .* the download waits for the swarm.s next step' 20
wait_log j 'state: loaded epoch' 30
L=$(sed -nE 's/.*state: loaded epoch ([0-9]+) .*/\1/p' "$work/j.log" | head -n 1)
[ "$L" -gt "$K" ] ||
  fail "j loaded epoch $L, the one whose group had formed ($K)"
same_after j b0 "$L"
[[ $(done_line j "$L") == *"averaged in a group of 4 ("* ]] ||
  fail "j's first epoch $L: '$(done_line j "$L")'"
same_after j b0 $((L + 1))
n=$(grep -c 'state: loaded epoch' "$work/j.log")
[ "$n" = 1 ] || fail "j downloaded the state $n times"
stop_all
echo "join: j started as epoch $K's group formed, waited, loaded epoch $L once, averaged it in a group of 4"
