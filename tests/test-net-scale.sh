#!/bin/bash
# test-net-scale.sh: loss scaling in a swarm.
#
# a1 scales its loss dynamically from 2^127 (--precision fp16 --loss-scale
# dynamic:2^127: on the CPU the products stay fp32, the scaling runs as
# on a GPU), so its first batches overflow and are dropped while the
# scale halves; a2 does not scale.  The drops are reported in a1's epoch
# lines with the scale they left, a1's dropped batches do not count as
# samples, and every epoch is still averaged by both with the same
# parameters after it: a dropped batch changes what one bee contributes,
# never the swarm's step.  beectl status shows each bee's precision, and
# a1's scale and dropped batches.  Then a1 is stopped and resumed from its
# checkpoint: the scale goes on where it was (not 2^127 again, which
# would drop its first batches anew), and it trains on.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/netlib.sh"

EPOCHS=4
train=(--open --run-id lsc --target-batch-size 4096 --eval-every 2
  --min-peers 2)
for b in a1 a2; do key "$b"; done
mkdir "$work/ck"
a1=(--precision fp16 --loss-scale dynamic:2^127 --checkpoint-dir ck
  --checkpoint-every 1)
start a1 "$base" "${train[@]}" "${a1[@]}" --control a1.sock
wait_log a1 'listening on' 10
start a2 $((base + 1)) "${train[@]}" --join "127.0.0.1:$base" \
  --control a2.sock
for b in a1 a2; do wait_log "$b" "train: epoch $EPOCHS done" 120; done
st=$(cd "$work" && "$BEECTL" status --control a1.sock)
st2=$(cd "$work" && "$BEECTL" status --control a2.sock)
stop_all
mv "$work/a1.log" "$work/a1-first.log"
mv "$work/a2.log" "$work/a2-first.log"
start a1 "$base" "${train[@]}" "${a1[@]}" --resume
wait_log a1 'listening on' 10
start a2 $((base + 1)) "${train[@]}" --join "127.0.0.1:$base"
wait_log a1 'train: --resume: the loss scale goes on at 2\^' 30
C=$(sed -nE 's/.*train: resuming from .* \(epoch ([0-9]+);.*/\1/p' "$work/a1.log")
again=$(sed -nE 's/.*train: --resume: the loss scale goes on at 2\^([0-9]+)$/\1/p' \
  "$work/a1.log")
[ -n "$C" ] && [ -n "$again" ] && [ "$again" -lt 127 ] ||
  fail "a1 resumed from epoch '$C' at loss scale 2^$again"
grep -q "train: loss scale 2^$again, dynamic" "$work/a1.log" ||
  fail "a1's start after --resume does not name the scale it resumed at"
wait_log a1 "train: epoch $((C + 1)) done" 60 # it trains on
stop_all
mv "$work/a1.log" "$work/a1-resumed.log"
mv "$work/a1-first.log" "$work/a1.log"
mv "$work/a2-first.log" "$work/a2.log"

grep -q "train: precision fp16 (the CPU computes in fp32), loss scaled" \
  "$work/a1.log" || fail "a1's start does not say how it computes"
grep -q "train: loss scale 2^127, dynamic" "$work/a1.log" ||
  fail "a1's start does not name its loss scale"
if grep -q "loss scale" "$work/a2.log"; then
  fail "a2 scales its loss without being asked"
fi
drops=$(sed -nE 's/.*train: epoch [0-9]+ done: .*; ([0-9]+) batch(es)? dropped for overflow, loss scale now 2\^([0-9]+),.*/\1 \3/p' \
  "$work/a1.log")
[ -n "$drops" ] || fail "a1 reported no dropped batch"
read -r n at <<<"$(head -n 1 <<<"$drops")"
[ "$n" -ge 1 ] && [ "$at" -lt 127 ] ||
  fail "a1's first drops: $n batches, scale 2^$at (want the scale halved)"
in_step a1 a2 0 "$EPOCHS"
grep -q 'train: epoch 2: test accuracy' "$work/a1.log" ||
  fail "a1 did not evaluate (its test model does not scale)"
grep -qx 'precision fp16' <<<"$st" || fail "beectl status: no precision: $st"
grep -qE '^loss-scale 2\^([0-9]|[1-9][0-9]|1[01][0-9]|12[0-6])$' <<<"$st" ||
  fail "beectl status: no loss scale below 2^127: $st"
grep -qx 'precision fp32' <<<"$st2" && ! grep -q '^loss-scale' <<<"$st2" ||
  fail "beectl status of a2 (no scaling): $st2"
d=$(sed -nE 's/^batches-dropped ([0-9]+)$/\1/p' <<<"$st")
[ -n "$d" ] && [ "$d" -ge "$n" ] ||
  fail "beectl status: batches-dropped '$d', the first epoch line said $n"
echo "scale: a1 dropped $(awk '{ s += $1 } END { print s }' <<<"$drops") batches (the first $n, leaving 2^$at); $((EPOCHS + 1)) epochs averaged by both, in step; resumed from epoch $C at 2^$again"
