#!/bin/bash
# test-net-torch.sh: PyTorch trainers in a beed swarm (beed.Optimizer,
# tools/client/python), three beeds on loopback with --model external.
#
# Each trainer (tests/torch-trainer.py) trains a small conv net with
# batch norm, a model beed's own trainer does not have, on its shard of
# Fashion-MNIST, read by the test itself, with AdamW through
# beed.Optimizer.  Checks:
#   - every epoch is averaged in one group of three, and the parameters'
#     hash after each step is the same on the three beeds (beed hashes
#     the torch tensors where they live), but while one trainer is away:
#     SIGKILLed after epoch 3, its beed stays up, keeps its state, and a
#     new PyTorch trainer there starts from it (WELCOME with a state
#     loaded into its torch tensors) and is in the group of three again
#     by the last two epochs;
#   - each trainer's own hash of its parameters at the end is its beed's
#     of the last step, and its optimizer's state_dict, loaded back,
#     lands in the shared memory unchanged;
#   - the training loss falls, and the test accuracy each trainer
#     reports (in its own log and its beed's) is over 70%;
#   - a trainer whose target_batch_size is not the run's is told so;
#   - then DiLoCo (beed.DiLoCo) with two: beed's outer steps give one
#     hash on both, which is each trainer's own at the end, and a trainer
#     that says other inner steps than the run's is told so.
# Exits 77 (skipped) without Debian's python3-torch or the data set.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/netlib.sh"
: "${CLIENT_LIB:?CLIENT_LIB must name libbeed-client.so}"
PY=/usr/bin/python3
DATA=/usr/share/datasets/fashion-mnist
if ! "$PY" -c 'import torch' 2>/dev/null; then
  echo "SKIP: no python3-torch"
  exit 77
fi
[ -f "$DATA/train-images-idx3-ubyte.gz" ] || {
  echo "SKIP: no $DATA"
  exit 77
}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export BEED_CLIENT_LIB=$CLIENT_LIB PYTHONPATH=$here/../tools/client/python
py=("$PY")
if [ "${BEE_TEST_SANITIZED:-0}" = 1 ]; then
  # The sanitized client library in a Python that is not: its runtime
  # goes first (and Python's own allocations are not leaks to report).
  rt=$(clang -print-file-name="libclang_rt.asan-$(uname -m).so" 2>/dev/null || true)
  [ -f "$rt" ] || rt=$(gcc -print-file-name=libasan.so 2>/dev/null || true)
  [ -f "$rt" ] || { echo "SKIP: no sanitizer runtime for Python"; exit 77; }
  py=(env LD_PRELOAD="$rt" ASAN_OPTIONS=detect_leaks=0 "$PY")
fi

RUN=torch
EPOCHS=10
# Batches of 32 in 40 ms at least: about 800 samples/s a trainer, so
# that an epoch of the three takes about 2.5 s.
TARGET=2048
for b in b0 b1 b2; do key "$b"; done
common=(--open --run-id "$RUN" --model external --eval-every 0
  --target-batch-size "$TARGET")
start b0 "$base" "${common[@]}" --trainer-socket b0.sock
wait_log b0 'waiting for a trainer process on' 10
for i in 1 2; do
  start "b$i" $((base + i)) "${common[@]}" --trainer-socket "b$i.sock" \
    --join "127.0.0.1:$base"
done
for i in 1 2; do wait_log "b$i" 'waiting for a trainer process on' 10; done

# target_batch_size must be the run's.
"${py[@]}" "$here/torch-trainer.py" --socket "$work/b0.sock" --run "$RUN" \
  --data "$DATA" --shard 0 --shards 3 --target 4096 >"$work/wrong.out" 2>&1 &&
  fail "a trainer with another target was taken"
grep -q "beed.BeedError: target_batch_size=4096, but beed's run 'torch' gathers $TARGET samples an epoch" \
  "$work/wrong.out" || fail "the trainer with another target heard: $(tail -3 "$work/wrong.out")"
wait_log b0 'the trainer is gone; this beed left the run' 10

declare -A tpid
trainer() { # NAME BEE SHARD: a PyTorch trainer at BEE's socket
  "${py[@]}" "$here/torch-trainer.py" --socket "$work/$2.sock" --run "$RUN" \
    --data "$DATA" --shard "$3" --shards 3 --epochs $((EPOCHS + 1)) \
    --target "$TARGET" --lr 0.01 --batch-ms 40 >"$work/$1.out" 2>&1 &
  tpid[$1]=$!
}
for i in 0 1 2; do trainer "t$i" "b$i" "$i"; done
# t2 is SIGKILLed after epoch 3: b2 stays up and keeps its state; a new
# PyTorch trainer there goes on from it (or the swarm's) into its torch
# tensors and is back in line with the others.
wait_log b2 'train: epoch 3 done' 60
kill -9 "${tpid[t2]}"
wait "${tpid[t2]}" 2>/dev/null || true
wait_log b2 'the trainer is gone; this beed left the run and keeps its state of epoch [0-9]+' 10
trainer t3 b2 2
wait_log b2 'the trainer goes on from the state of epoch [0-9]+ this beed kept' 20
for n in t0 t1 t3; do
  rc=0
  wait "${tpid[$n]}" || rc=$?
  [ "$rc" = 0 ] || fail "trainer $n exited $rc: $(tail -5 "$work/$n.out")"
done
grep -q '^torch: welcome at epoch [0-9]*, a state loaded' "$work/t3.out" ||
  fail "t3 heard: $(head -3 "$work/t3.out")"
# in_line E BEES...: one group of them all at epoch E, one hash.
in_line() {
  local e=$1 b n=$(($# - 1))
  shift
  for b in "$@"; do
    [[ $(done_line "$b" "$e") = *"averaged in a group of $n "* ]] ||
      fail "epoch $e: $b's step: '$(done_line "$b" "$e")'"
    [ "$(hash_of "$b" "$e")" = "$(hash_of "$1" "$e")" ] ||
      fail "epoch $e: $b's parameters $(hash_of "$b" "$e") differ from $1's $(hash_of "$1" "$e")"
  done
}
for e in 1 2 3; do in_line "$e" b0 b1 b2; done
for ((e = 4; e < EPOCHS - 1; e++)); do
  [ "$(hash_of b1 "$e")" = "$(hash_of b0 "$e")" ] ||
    fail "epoch $e: b1's parameters $(hash_of b1 "$e") differ from b0's $(hash_of b0 "$e")"
done
for ((e = EPOCHS - 1; e <= EPOCHS; e++)); do in_line "$e" b0 b1 b2; done
echo "t2 killed after epoch 3; $(sed -n 's/^torch: welcome/t3: welcome/p' "$work/t3.out"); epochs $((EPOCHS - 1)) and $EPOCHS in one group of three again"
echo "epochs 1 to $EPOCHS: one hash on b0 and b1 each time, on all three but while t2 was away; the last $(hash_of b0 "$EPOCHS")"
for i in 0 1 3; do
  b=b$i
  [ "$i" = 3 ] && b=b2
  grep -q '^torch: state_dict round trip ok' "$work/t$i.out" ||
    fail "t$i: $(grep 'state_dict' "$work/t$i.out")"
  th=$(sed -nE 's/^torch: parameters ([0-9a-f]+)$/\1/p' "$work/t$i.out")
  [ "$th" = "$(hash_of "$b" "$EPOCHS")" ] ||
    fail "t$i's parameters '$th' are not $b's of epoch $EPOCHS ($(hash_of "$b" "$EPOCHS"))"
done
loss() { sed -nE "s/.*train: epoch $2 done: [0-9]+ local samples, training loss ([0-9.]+),.*/\1/p" "$work/$1.log"; }
awk -v a="$(loss b0 1)" -v b="$(loss b0 "$EPOCHS")" 'BEGIN { exit !(b < a) }' ||
  fail "b0's training loss went from $(loss b0 1) to $(loss b0 "$EPOCHS")"
# One model, but each trainer's batch-norm statistics are its own data's
# (buffers are not averaged): the accuracies differ a little.
accs=
for i in 0 1 3; do
  b=b$i
  [ "$i" = 3 ] && b=b2
  acc=$(sed -nE 's/^torch: test accuracy ([0-9.]+)%.*/\1/p' "$work/t$i.out")
  awk -v a="$acc" 'BEGIN { exit !(a > 70) }' || fail "t$i: test accuracy '$acc'%"
  wait_log "$b" "train: epoch $((EPOCHS + 1)): test accuracy $acc%" 10
  accs+=" $acc%"
done
echo "torch: loss at b0 $(loss b0 1) -> $(loss b0 "$EPOCHS"), test accuracy$accs"

# DiLoCo (beed.DiLoCo): two beeds, each trainer's AdamW the inner
# optimizer, beed's outer steps alike on both; a trainer that says other
# inner steps than the run's is told so.
for i in 0 1 2; do stop "b$i"; done
RUN=tdl
dl=(--open --run-id "$RUN" --model external --eval-every 0 --averaging diloco
  --inner-steps 60 --outer-lr 0.7)
key d0
key d1
start d0 $((base + 4)) "${dl[@]}" --trainer-socket d0.sock
wait_log d0 'waiting for a trainer process on' 10
start d1 $((base + 5)) "${dl[@]}" --trainer-socket d1.sock \
  --join "127.0.0.1:$((base + 4))"
wait_log d1 'waiting for a trainer process on' 10
"${py[@]}" "$here/torch-trainer.py" --socket "$work/d0.sock" --run "$RUN" \
  --data "$DATA" --shard 0 --shards 2 --diloco 50 >"$work/wrong-dl.out" 2>&1 &&
  fail "a DiLoCo trainer of 50 inner steps was taken"
grep -q "beed.BeedError: inner_steps=50, but beed's run has 60 (--inner-steps)" \
  "$work/wrong-dl.out" || fail "the 50-step trainer heard: $(tail -3 "$work/wrong-dl.out")"
wait_log d0 'the trainer is gone; this beed left the run' 10
for i in 0 1; do
  "${py[@]}" "$here/torch-trainer.py" --socket "$work/d$i.sock" --run "$RUN" \
    --data "$DATA" --shard "$i" --shards 2 --epochs 4 --diloco 60 \
    --lr 0.002 --batch-ms 40 >"$work/u$i.out" 2>&1 &
  tpid[u$i]=$!
done
for i in 0 1; do
  rc=0
  wait "${tpid[u$i]}" || rc=$?
  [ "$rc" = 0 ] || fail "trainer u$i exited $rc: $(tail -5 "$work/u$i.out")"
done
for e in 1 2 3; do
  l=$(done_line d0 "$e")
  [[ $l = *"averaged in a group of 2"* ]] || fail "DiLoCo epoch $e: d0: '$l'"
  [ "$(hash_of d1 "$e")" = "$(hash_of d0 "$e")" ] ||
    fail "DiLoCo epoch $e: d1 $(hash_of d1 "$e"), d0 $(hash_of d0 "$e")"
done
for i in 0 1; do
  th=$(sed -nE 's/^torch: parameters ([0-9a-f]+)$/\1/p' "$work/u$i.out")
  [ "$th" = "$(hash_of "d$i" 3)" ] ||
    fail "u$i's parameters '$th' are not d$i's of outer step 3 ($(hash_of "d$i" 3))"
done
echo "DiLoCo: outer steps 1 to 3 alike on both, the last $(hash_of d0 3); test accuracy $(sed -nE 's/^torch: test accuracy ([0-9.]+%).*/\1/p' "$work/u0.out")"
