#!/bin/bash
# test-net-torch.sh: PyTorch trainers in a beed swarm (beed.Optimizer,
# tools/client/python), three beeds on loopback with --model external.
#
# Each trainer (tests/torch-trainer.py) trains a small conv net with
# batch norm, a model beed's own trainer does not have, on its shard of
# Fashion-MNIST, read by the test itself, with AdamW through
# beed.Optimizer.  Checks:
#   - epochs 1 to 3 are averaged in one group of three, and the
#     parameters' hash after each step is the same on the three beeds
#     (beed hashes the torch tensors where they live) at every epoch but
#     while one trainer is away:
#     SIGKILLed in epoch 8, its beed stays up, keeps its state, and a
#     new PyTorch trainer there starts from it (WELCOME with a state
#     loaded into its torch tensors), has the others' parameters from
#     its first step on, and is in a group of three again before the end;
#   - each trainer's own hash of its parameters at the end is its beed's
#     of the last step, and its optimizer's state_dict, loaded back,
#     lands in the shared memory unchanged;
#   - the training loss falls, and the test accuracy each trainer
#     reports (in its own log and its beed's) is over 70%;
#   - each trainer's test accuracy at epoch 8 is within 0.5 points of one
#     PyTorch process's (tests/torch-reference.py) trained with the same
#     optimizer on the very batches the swarm averaged (each trainer
#     writes down its batches' epochs, each beed's log says how many of
#     them went into each step);
#   - a trainer whose target_batch_size is not the run's is told so, and
#     one that asks for delay_averaging of a beed without it, or for
#     another compression than the rounds';
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
EPOCHS=14
Q=8 # the epoch of the quality check, then t2's end
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
# So must delay_averaging.
"${py[@]}" "$here/torch-trainer.py" --socket "$work/b0.sock" --run "$RUN" \
  --data "$DATA" --shard 0 --shards 3 --delay >"$work/wrong-delay.out" 2>&1 &&
  fail "a trainer with delay_averaging was taken"
grep -q "beed.BeedError: delay_averaging=True, but beed does not run with --delay-averaging" \
  "$work/wrong-delay.out" || fail "the delaying trainer heard: $(tail -3 "$work/wrong-delay.out")"
gone() { # N: b0 has left the run for the Nth trainer
  local i
  for ((i = 0; i < 100; i++)); do
    [ "$(grep -c 'the trainer is gone; this beed left the run' "$work/b0.log" || true)" -ge "$1" ] && return 0
    sleep 0.1
  done
  fail "b0 did not leave the run after trainer $1"
}
gone 2
# And compression.
"${py[@]}" "$here/torch-trainer.py" --socket "$work/b0.sock" --run "$RUN" \
  --data "$DATA" --shard 0 --shards 3 --compression b8 >"$work/wrong-codec.out" 2>&1 &&
  fail "a trainer with compression b8 was taken"
grep -q "beed.BeedError: compression='b8', but beed's rounds use 'none' (--compression)" \
  "$work/wrong-codec.out" || fail "the b8 trainer heard: $(tail -3 "$work/wrong-codec.out")"
gone 3

declare -A tpid
trainer() { # NAME BEE SHARD: a PyTorch trainer at BEE's socket
  "${py[@]}" "$here/torch-trainer.py" --socket "$work/$2.sock" --run "$RUN" \
    --data "$DATA" --shard "$3" --shards 3 --epochs $((EPOCHS + 1)) \
    --target "$TARGET" --compression none --lr 0.01 --batch-ms 40 --eval-at "$Q" \
    --batches "$work/$1.batches.log" >"$work/$1.out" 2>&1 &
  tpid[$1]=$!
}
for i in 0 1 2; do trainer "t$i" "b$i" "$i"; done
# t2 is SIGKILLed once it has tested the model of epoch Q: b2 stays up
# and keeps its state; a new PyTorch trainer there goes on from it (or
# the swarm's) into its torch tensors and is back in line with the
# others.
for ((i = 0; i < 600; i++)); do
  grep -q "^torch: test accuracy at epoch $Q:" "$work/t2.out" && break
  kill -0 "${tpid[t2]}" 2>/dev/null || fail "t2 exited: $(tail -3 "$work/t2.out")"
  sleep 0.1
done
[ "$i" -lt 600 ] || fail "t2 did not reach epoch $Q in 60 s"
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
# Epochs 1 to 3 in one group of three; to Q - 1 one hash on all three
# (a bee that fell behind on busy cores may take the swarm's step).
for e in 1 2 3; do in_line "$e" b0 b1 b2; done
for ((e = 4; e < Q; e++)); do
  for b in b1 b2; do
    [ "$(hash_of "$b" "$e")" = "$(hash_of b0 "$e")" ] ||
      fail "epoch $e: $b's parameters '$(hash_of "$b" "$e")' differ from b0's $(hash_of b0 "$e"):
$(N=3 epoch_lines "$e")"
  done
done
for ((e = Q; e <= EPOCHS; e++)); do
  [ "$(hash_of b1 "$e")" = "$(hash_of b0 "$e")" ] ||
    fail "epoch $e: b1's parameters $(hash_of b1 "$e") differ from b0's $(hash_of b0 "$e"):
$(N=3 epoch_lines "$e")"
done
# Back in line: from b2's first step after t3 came (a state loaded, or
# the swarm's step taken) its parameters are the others' at every epoch.
# Back in a group of three: a bee that came late steps with the swarm's
# steps until it is at an epoch before its group forms, which on two busy
# cores may take a few epochs; one of the last three is enough here.
back=
for ((e = Q + 1; e <= EPOCHS; e++)); do
  [ -n "$(done_line b2 "$e")" ] && { back=$e; break; }
done
[ -n "$back" ] && [ "$back" -le $((EPOCHS - 3)) ] ||
  fail "b2's first step after t3 came is at epoch '${back}' of $EPOCHS"
three=
for ((e = back; e <= EPOCHS; e++)); do
  for b in b1 b2; do
    [ "$(hash_of "$b" "$e")" = "$(hash_of b0 "$e")" ] ||
      fail "epoch $e: $b's parameters '$(hash_of "$b" "$e")' differ from b0's $(hash_of b0 "$e") after t3 came"
  done
  [[ $(done_line b2 "$e") = *"averaged in a group of 3 "* ]] && three+=" $e"
done
[[ " $three" = *" $((EPOCHS - 2))"* || " $three" = *" $((EPOCHS - 1))"* ||
  " $three" = *" $EPOCHS"* ]] ||
  fail "b2 was not in a group of three in the last three epochs (only at:${three:- none})"
echo "t2 killed in epoch $Q; $(sed -n 's/^torch: welcome/t3: welcome/p' "$work/t3.out"); b2 in line from epoch $back, in a group of three at epochs$three"
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
# One PyTorch process on the batches the swarm averaged (each trainer's
# at each epoch, tests/torch-reference.py), the same optimizer: each
# trainer's test accuracy at epoch Q within 0.5 points of its.
"$PY" "$here/torch-reference.py" --data "$DATA" --shards 3 --epochs "$Q" \
  --lr 0.01 --logs "$work/b0.log,$work/b1.log,$work/b2.log" \
  --batches "$work/t0.batches.log,$work/t1.batches.log,$work/t2.batches.log" \
  >"$work/reference.out" 2>&1 || fail "the reference: $(tail -3 "$work/reference.out")"
ref=$(sed -nE 's/^reference: test accuracy ([0-9.]+)%.*/\1/p' "$work/reference.out")
qaccs=
for i in 0 1 2; do
  a=$(sed -nE "s/^torch: test accuracy at epoch $Q: ([0-9.]+)%/\1/p" "$work/t$i.out")
  awk -v a="$a" -v r="$ref" 'BEGIN { d = a - r; exit !(a != "" && d <= 0.5 && d >= -0.5) }' ||
    fail "t$i's test accuracy at epoch $Q '$a'%, one PyTorch process's $ref% ($(head -1 "$work/reference.out"))"
  qaccs+=" $a%"
done
echo "torch: at epoch $Q test accuracy$qaccs; one PyTorch process on the same batches $ref% ($(sed -n 's/^reference: batches/batches/p' "$work/reference.out"))"

# DiLoCo (beed.DiLoCo): two beeds, each trainer's AdamW the inner
# optimizer, beed's outer steps alike on both; a trainer that says other
# inner steps than the run's is told so.
for i in 0 1 2; do stop "b$i"; done
RUN=tdl
dl=(--open --run-id "$RUN" --model external --eval-every 0 --averaging diloco
  --inner-steps 60 --outer-lr 0.7)
trainer_pair d0 d1 $((base + 4)) "${dl[@]}"
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
