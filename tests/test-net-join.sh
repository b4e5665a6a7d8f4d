#!/bin/bash
# test-net-join.sh: a newcomer that loads the swarm's state as the
# epoch's group forms without it is in line after that epoch's step,
# averages the next in a group of four and downloads once.
#
# Three bees train mlp with their groups formed ahead, --matchmaking-time
# 4 s before each epoch's target (epochs of about 8 s).  As soon as one of
# them leads a group formed for epoch K, a newcomer j starts: its first
# view comes about 1.5 s later, when the swarm expects its target in a
# few seconds and the group it would have to join has begun without it.
# It loads epoch K's state at once; its round of K misses the group, so
# it takes the swarm's step of K from a peer's kept steps (its own
# samples of K left out) and holds the others' parameters after K.
# (Stepped alone instead, it would be out of line and download again: two
# or three downloads in four joins at random points, before either this
# or the wait for the swarm's next step that came before it.)  Should its
# state come after K's step, it averages K + 1 in the group at once.
# Either way it averages an epoch in a group of four with the parameters
# the others hold, and never downloads again.
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

wait_log j 'state: loaded epoch' 30
L=$(sed -nE 's/.*state: loaded epoch ([0-9]+) .*/\1/p' "$work/j.log" | head -n 1)
[ "$L" -ge "$K" ] || fail "j loaded epoch $L, before the swarm's $K"
# In line from its first step; averaged in a group of four at the first
# epoch whose group it could join (L, or L + 1 where it loaded L after
# L's group formed and took the swarm's step of L).
same_after j b0 "$L"
A=$L
if [[ $(done_line j "$L") == *"took the swarm's step (its round missed it; its own gradients left out)"* ]]; then
  A=$((L + 1))
  same_after j b0 "$A"
fi
[[ $(done_line j "$A") == *"averaged in a group of 4 ("* ]] ||
  fail "j's epoch $A: '$(done_line j "$A")'"
same_after j b0 $((A + 1))
n=$(grep -c 'state: loaded epoch' "$work/j.log")
[ "$n" = 1 ] || fail "j downloaded the state $n times"
stop_all
echo "join: j started as epoch $K's group formed, loaded epoch $L once, $([ "$A" != "$L" ] && echo "took the swarm's step of $L, ")averaged epoch $A in a group of 4"
