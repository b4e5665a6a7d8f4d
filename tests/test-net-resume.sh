#!/bin/bash
# test-net-resume.sh: a bee stopped and resumed from its checkpoint trains
# the same bits as one that never stopped.
#
# A lone bee trains cnn (dropout on) for 6 short epochs, checkpointing
# every epoch: its parameter hash after each is the reference.  The same
# bee (the same key, so the same data order) trains again, is stopped with
# SIGTERM after epoch 3 and restarted with --resume: the checkpoint holds
# the state and also where its data order stands and how many dropout
# masks it has drawn, so every epoch after the restart must end with the
# reference's hash.  About 30 s.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/netlib.sh"

key a # one identity, two names: the same peer id, the same data order
cp "$work/a.key" "$work/ref.key"
cp "$work/a.key" "$work/run.key"
train=(--open --run-id rs --model cnn --target-batch-size 512 --eval-every 0
  --checkpoint-every 1)
hashes() { # LOG: "epoch hash" lines
  sed -nE 's/.*train: epoch ([0-9]+) done: .* parameters ([0-9a-f]+).*/\1 \2/p' \
    "$work/$1.log"
}
mkdir "$work/ck-ref" "$work/ck-run"
start ref "$base" "${train[@]}" --checkpoint-dir ck-ref
wait_log ref 'train: epoch 6 done' 120
stop_all
[ "$(hashes ref | wc -l)" -ge 6 ] || fail "the reference did not log 6 epochs"

start run "$base" "${train[@]}" --checkpoint-dir ck-run
wait_log run 'train: epoch 3 done' 120
kill -TERM "${pid[run]}"
rc=0
wait "${pid[run]}" || rc=$?
unset "pid[run]"
[ "$rc" = 0 ] || fail "the bee exited $rc after SIGTERM"
mv "$work/run.log" "$work/run-first.log"
start run "$base" "${train[@]}" --checkpoint-dir ck-run --resume
wait_log run 'train: resuming from .*ck-run/' 20
grep -E 'train: resuming from' "$work/run.log" | sed 's/^/  /'
from=$(sed -nE 's/.*train: resuming from .* \(epoch ([0-9]+);.*/\1/p' "$work/run.log")
[ -n "$from" ] && [ "$from" -ge 3 ] || fail "resumed from epoch '$from'"
grep -qE "train: resuming from .*data pass 0 at [1-9][0-9]* of" "$work/run.log" ||
  fail "the checkpoint did not carry the data position"
last=$((from + 3))
wait_log run "train: epoch $last done" 120
stop_all
# Before the stop, and after the restart: the reference's hashes.
n=0
while read -r e h; do
  want=$(hashes ref | awk -v e="$e" '$1 == e {print $2}')
  [ -n "$want" ] || continue
  [ "$h" = "$want" ] || fail "epoch $e: $h, the reference $want"
  n=$((n + 1))
done < <(hashes run-first; hashes run)
[ "$n" -ge 6 ] || fail "only $n epochs compared"
echo "resume: stopped after epoch 3, resumed from epoch $from: $n epochs with the reference's parameters, bit for bit"
