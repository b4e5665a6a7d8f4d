#!/bin/bash
# test-net-split.sh: a run whose bees stepped in two lines of parameters
# comes back to one.
#
# Two pairs of bees train the same run (mlp, gradient averaging) in two
# DHTs that do not know each other: b0 and b1, b2 and b3.  Each pair
# averages in its own groups, so after a few epochs the run has two lines
# of parameters, each in line with itself; that is what a swarm is left
# with when two groups form for one epoch (bees that started or caught up
# late find the first group closed and form another), and no later round
# brings the lines together, since each member steps its own parameters
# with the common mean.  Then a fifth node (no training) joins both DHTs:
# the pairs see each other's records, and every bee compares the
# parameters' hash its peers published for the steps it took too.  The
# line that loses (the smaller group, on a tie the lower hash goes on)
# says "the swarm split", loads the other line's state, and the four end
# in line: the same parameters after the same epoch.  About 45 s.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/netlib.sh"

for b in b0 b1 b2 b3 b4; do key "$b"; done
train=(--open --run-id split --target-batch-size "$(epoch_target 917504 524288)"
  --eval-every 0)
start b0 "$base" "${train[@]}"
start b2 $((base + 2)) "${train[@]}"
wait_log b0 'listening on' 10
wait_log b2 'listening on' 10
start b1 $((base + 1)) "${train[@]}" --join "127.0.0.1:$base"
start b3 $((base + 3)) "${train[@]}" --join "127.0.0.1:$((base + 2))"
for b in b0 b1 b2 b3; do wait_log "$b" 'train: epoch 2 done' 120; done

a=$(hash_of b0 2) b=$(hash_of b2 2)
[ "$a" = "$(hash_of b1 2)" ] || fail "b0 and b1 differ after epoch 2"
[ "$b" = "$(hash_of b3 2)" ] || fail "b2 and b3 differ after epoch 2"
[ "$a" != "$b" ] || fail "the two pairs hold the same parameters ($a)"
echo "two lines: b0 and b1 at $a, b2 and b3 at $b after epoch 2"

# The bridge: a node of both DHTs.
start b4 $((base + 4)) --open --join "127.0.0.1:$base" \
  --join "127.0.0.1:$((base + 2))"
# One pair says the swarm split and loads the other's state.
loser= i=0
while [ -z "$loser" ] && [ $((i++)) -lt 900 ]; do
  for x in b0 b1 b2 b3; do
    grep -q 'train: epoch [0-9]*: the swarm split' "$work/$x.log" && loser=$x
  done
  [ -n "$loser" ] || sleep 0.1
done
[ -n "$loser" ] || fail "no bee saw the split within 90 s"
grep -h 'the swarm split' "$work"/b[0-3].log | sed 's/^/  /'
# Then the four step in line: one epoch after which all hold the same.
last() { sed -nE 's/.*train: epoch ([0-9]+) done:.*/\1/p' "$work/$1.log" | tail -n 1; }
F= i=0
while [ -z "$F" ] && [ $((i++)) -lt 60 ]; do
  e=$(last b0)
  for x in b1 b2 b3; do [ "$(last "$x")" -lt "$e" ] && e=$(last "$x"); done
  for ((f = e; f > e - 4 && f > 2; f--)); do
    h=$(hash_of b0 "$f")
    if [ -n "$h" ] && [ "$h" = "$(hash_of b1 "$f")" ] &&
      [ "$h" = "$(hash_of b2 "$f")" ] && [ "$h" = "$(hash_of b3 "$f")" ]; then
      F=$f
      break
    fi
  done
  [ -n "$F" ] || sleep 2
done
[ -n "$F" ] || fail "the four bees never held the same parameters after the split"
stop_all
echo "split: $loser's line loaded the other's; all four in line after epoch $F ($(hash_of b0 "$F"))"
