#!/bin/bash
# test-net-crowd.sh: 32 bees in one run, every epoch averaged by all.
#
# 32 bees on loopback (mlp, gradient averaging, --min-peers 32) train for
# a dozen epochs.  Every epoch is averaged in one group of all 32, and
# after it every bee holds the same parameters: none steps alone, none is
# told that the swarm split, none downloads the state.  A cap on the
# group below the swarm's size (there was one at 16) leaves the bees past
# it to groups of their own each epoch, out of line.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/netlib.sh"

N=32
EPOCHS=12
target=$(epoch_target 65536 32768)
for ((i = 0; i < N; i++)); do key "b$i"; done
start_swarm "$N" --open --run-id crowd --target-batch-size "$target" \
  --min-peers "$N" --eval-every 0
for ((i = 0; i < N; i++)); do wait_epoch "b$i" "$EPOCHS" 150; done
stop_all

for ((e = 0; e <= EPOCHS; e++)); do
  ref=$(hash_of b0 "$e")
  [ -n "$ref" ] || fail "b0 logged no step for epoch $e"
  for ((i = 0; i < N; i++)); do
    grep -Eq "train: epoch $e done: .*averaged in a group of $N " \
      "$work/b$i.log" ||
      fail "b$i: epoch $e was not averaged in a group of $N:
$(epoch_lines "$e")"
    h=$(hash_of "b$i" "$e")
    [ "$h" = "$ref" ] || fail "after epoch $e b$i holds $h, b0 $ref:
$(epoch_lines "$e")"
  done
done
bad=$(cat "$work"/b*.log | grep -cE 'alone at its epoch|the swarm split|state: loaded' || true)
[ "$bad" = 0 ] || fail "$bad lines of bees stepping alone, splits or downloads"
echo "crowd: $N bees, epochs 0 to $EPOCHS each averaged by all $N with one parameter hash"
