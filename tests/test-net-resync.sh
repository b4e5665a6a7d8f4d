#!/bin/bash
# test-net-resync.sh [--delay-averaging]: a bee that missed a round its
# peers averaged steps in line with them again.
#
# Three bees train mlp (gradient averaging, epochs of several seconds).
# Once all three have finished epoch K (K >= 1), b2 is paused (SIGSTOP,
# as a VM the host stalls) until b0 has finished epoch K + 1, which b0
# and b1 average as a pair.  Resumed, b2 finds the swarm past its epoch
# and its round finds nobody.
#
# By default it takes the swarm's step of K + 1 instead, fetched from a
# peer's kept steps (its own gradients left out): it holds b0's
# parameters after K + 1, steps K + 2 in a group of three, and nobody
# downloads a state.
#
# With --delay-averaging (no kept steps) it steps K + 1 with its own
# gradients and so holds parameters the swarm never had.  Its metrics
# record says so (diverged); it reads its peers' and loads the state from
# one that averaged that round in full and is not diverged, and from then
# on steps with b0's parameters, in a group of three from the epoch
# after its first.  A group formed ahead before the peers saw b2 at its
# new epoch (its record comes up to a second after the load) leaves it
# out: then it steps alone and loads again, as many as five times in a
# row in the runs seen, or pairs with one of them (a split, resolved by a
# load); the test allows six epochs.  b0 and b1 load only after a split.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/netlib.sh"

delayed=
case ${1:-} in
--delay-averaging) delayed=1 ;;
'') ;;
*) echo "usage: test-net-resync.sh [--delay-averaging]" >&2; exit 2 ;;
esac

for b in b0 b1 b2; do key "$b"; done
# An epoch (about 3 s with gcc) must outlast b2's failed round after the
# pause, or b2 would be two epochs behind and load the state for that
# reason instead: nobody else is at its epoch, so its matchmaking ends
# within two views (test-net-catchup).
train=(--open --run-id resync
  --target-batch-size "$(epoch_target 1310720 786432)" --eval-every 0
  --matchmaking-time 1 --min-peers 3 ${delayed:+--delay-averaging})
start_swarm 3 "${train[@]}"

# K: the first epoch from 1 on that all three finished.
for b in b0 b1 b2; do wait_log "$b" 'train: epoch 1 done' 120; done
K=$(last_done b2)
kill -STOP "${pid[b2]}"
wait_log b0 "train: epoch $((K + 1)) done" 120
kill -CONT "${pid[b2]}"

# b0 and b1 averaged K + 1 as a pair, with the same parameters after it.
for b in b0 b1; do
  [[ $(done_line "$b" $((K + 1))) == *"averaged in a group of 2 (100.0% by all)"* ]] ||
    fail "$b, epoch $((K + 1)): '$(done_line "$b" $((K + 1)))'"
done
[ "$(hash_of b0 $((K + 1)))" = "$(hash_of b1 $((K + 1)))" ] ||
  fail "b0 and b1 differ after epoch $((K + 1))"

wait_log b2 "train: epoch $((K + 1)) done" 60
if [ -z "$delayed" ]; then
  # b2 took the pair's step of K + 1 and holds their parameters.
  [[ $(done_line b2 $((K + 1))) == *"took the swarm's step (its round missed it; its own gradients left out)"* ]] ||
    fail "b2, epoch $((K + 1)): '$(done_line b2 $((K + 1)))'"
  [ "$(hash_of b2 $((K + 1)))" = "$(hash_of b0 $((K + 1)))" ] ||
    fail "b2 and b0 differ after epoch $((K + 1)), the swarm's step"
  E=$((K + 2))
else
  # b2 stepped K + 1 alone, then loaded the state of a peer at the
  # swarm's epoch.
  [[ $(done_line b2 $((K + 1))) == *"not averaged"* ||
    $(done_line b2 $((K + 1))) == *"alone at its epoch"* ]] ||
    fail "b2, epoch $((K + 1)): '$(done_line b2 $((K + 1)))'"
  wait_log b2 "train: epoch $((K + 1)) was stepped here without the round its peers averaged: loading their state" 30
  wait_log b2 'train: state: loaded epoch [0-9]+ from' 30
  E=$(sed -nE 's/.*train: state: loaded epoch ([0-9]+) from.*/\1/p' \
    "$work/b2.log" | tail -n 1)
  [ "$E" -ge $((K + 2)) ] || fail "b2 loaded epoch $E, not past $((K + 1))"
fi
if [ -z "$delayed" ]; then
  # In line: its next step is b0's, in a group of three.
  for b in b0 b2; do wait_log "$b" "train: epoch $E done" 90; done
  [ "$(hash_of b2 "$E")" = "$(hash_of b0 "$E")" ] ||
    fail "b2 and b0 differ after epoch $E"
  G=$E
  [[ $(done_line b2 "$G") == *"averaged in a group of 3 (100.0% by all)"* ]] ||
    fail "b2, epoch $G: '$(done_line b2 "$G")'"
  for b in b0 b1 b2; do
    grep -q 'train: state: loaded epoch' "$work/$b.log" &&
      fail "$b loaded a state it did not need"
  done
else
  # Back in line within six epochs of the load: an epoch G that b2
  # averaged in a group of three, with b0's and b1's parameters after it,
  # and the next one too.  Usually G is E + 1 (the group of E may have
  # formed ahead before the state came).  But the peers see b2 at its
  # new epoch only with its next record, up to a second after the load:
  # a group formed ahead meanwhile leaves it out, and it steps alone and
  # loads again, or pairs with one of them (a split, which the line
  # check resolves with a load).  b0 and b1 load only after such a split.
  G=
  for ((F = E; F <= E + 6; F++)); do
    for b in b0 b1 b2; do wait_log "$b" "train: epoch $F done" 90; done
    if [[ $(done_line b2 "$F") == *"averaged in a group of 3 (100.0% by all)"* ]] &&
      [ "$(hash_of b2 "$F")" = "$(hash_of b0 "$F")" ] &&
      [ "$(hash_of b1 "$F")" = "$(hash_of b0 "$F")" ]; then
      G=$F
      break
    fi
  done
  [ -n "$G" ] || fail "b2 not back in line by epoch $((E + 6)):
$(N=3 epoch_lines $((E + 6)))"
  F=$((G + 1))
  for b in b0 b1 b2; do wait_log "$b" "train: epoch $F done" 90; done
  for b in b1 b2; do
    [[ $(done_line "$b" "$F") == *"averaged in a group of 3 (100.0% by all)"* ]] &&
      [ "$(hash_of "$b" "$F")" = "$(hash_of b0 "$F")" ] ||
      fail "epoch $F, after b2 came back at $G: $(N=3 epoch_lines "$F")"
  done
  for b in b0 b1; do
    grep -q 'train: state: loaded epoch' "$work/$b.log" &&
      ! grep -q 'the swarm split' "$work/$b.log" &&
      fail "$b loaded a state it did not need"
  done
  loads=$(grep -c 'train: state: loaded epoch' "$work/b2.log" || true)
  E=$(sed -nE 's/.*train: state: loaded epoch ([0-9]+) from.*/\1/p' \
    "$work/b2.log" | tail -n 1)
fi
stop_all
if [ -z "$delayed" ]; then
  echo "resync: b2 paused over epoch $((K + 1)), took the pair's step of it (no download) and stepped epoch $E in a group of 3 (parameters $(hash_of b0 "$E"))"
else
  echo "resync (--delay-averaging): b2 paused over epoch $((K + 1)), stepped it alone, loaded a peer's state $loads time(s) (the last of epoch $E), and stepped in line in a group of 3 from epoch $G (parameters $(hash_of b0 "$G"))"
fi
