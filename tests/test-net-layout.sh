#!/bin/bash
# test-net-layout.sh: bees of one run that step with different optimizers
# are never grouped, and say why.
#
# b0 trains with AdamW and b1 with LAMB in the same run (the same model,
# so the same gradient layout): averaging their gradients would have each
# take another step from them.  The optimizer is part of a round's layout
# (schema hash), so neither step is averaged in a group of two, and each
# bee warns once that the other trains with another model, averaging mode,
# optimizer or compression.  Then a LAMB bee joining behind an AdamW bee refuses its
# state (same size, another meaning).  About 30 s.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/netlib.sh"

for b in b0 b1; do key "$b"; done
train=(--open --run-id layout --target-batch-size 262144 --eval-every 0
  --matchmaking-time 1)
start b0 "$base" "${train[@]}" --optimizer adamw
wait_log b0 'listening on' 10
start b1 $((base + 1)) "${train[@]}" --optimizer lamb --join "127.0.0.1:$base"
for b in b0 b1; do wait_log "$b" 'train: epoch 3 done' 90; done
stop_all
id0=$(sed -nE 's/.*peer id ([0-9a-f]{8}).*/\1/p' "$work/b0.log" | head -n 1)
id1=$(sed -nE 's/.*peer id ([0-9a-f]{8}).*/\1/p' "$work/b1.log" | head -n 1)
w0=$(grep -c "$id1 trains run 'layout' with another model, averaging mode, optimizer or compression" "$work/b0.log" || true)
w1=$(grep -c "$id0 trains run 'layout' with another model, averaging mode, optimizer or compression" "$work/b1.log" || true)
[ "$w0" = 1 ] || fail "b0 warned $w0 times about b1, want once"
[ "$w1" = 1 ] || fail "b1 warned $w1 times about b0, want once"
grep -q 'averaged in a group of 2' "$work/b0.log" "$work/b1.log" &&
  fail "the AdamW bee and the LAMB bee averaged together"
echo "layout: an AdamW bee and a LAMB bee of one run were never grouped; each warned once"

# A LAMB bee that joins behind an AdamW bee does not load its state: the
# two states have the same size, and the snapshot's schema tells them
# apart on the first chunk.
for b in b2 b3; do key "$b"; done
train=(--open --run-id late --target-batch-size 32768 --eval-every 0)
start b2 $((base + 2)) "${train[@]}" --optimizer adamw
wait_log b2 'train: epoch 2 done' 90
start b3 $((base + 3)) "${train[@]}" --optimizer lamb \
  --join "127.0.0.1:$((base + 2))"
wait_log b3 'state from [0-9a-f]{8}: a state for another model, optimizer or averaging mode' 60
grep -q 'state: loaded epoch' "$work/b3.log" &&
  fail "the LAMB bee loaded the AdamW bee's state"
stop_all
echo "layout: a LAMB bee refused an AdamW bee's state at its first chunk"
