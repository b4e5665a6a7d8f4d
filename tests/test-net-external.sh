#!/bin/bash
# test-net-external.sh: beeds whose model is a trainer process's
# (--model external), on loopback.
#
# Three beeds of an open swarm, each with --trainer-socket, and a C
# trainer each (tests/local-trainer.c, on tools/client's library):
# softmax regression with momentum SGD, its tensors in memory shared
# with its beed.  Checks:
#   - each beed takes its trainer's HELLO (its tensors and schema in the
#     log) and trains in the run;
#   - every epoch is averaged in one group of three, and the parameters'
#     hash after each step is the same on the three beeds: the trainers'
#     own optimizers took the same step from the same mean;
#   - a trainer that dies (no goodbye) leaves its beed up: the beed
#     leaves the run, the others go on in a group of two, and a new
#     trainer at that beed goes on from the state it kept, back in line
#     with the others;
#   - each trainer's parameters at the end, hashed by the trainer over
#     its memory, are what its beed hashed after the last step;
#   - the training loss falls;
#   - a trainer whose model is not the swarm's is refused, with the
#     first difference its beed's peers show;
#   - a trainer that asks for another run, or for DiLoCo in a gradient
#     run, or that comes while the beed has one, is refused with the
#     reason, and so is each misbehaving client of tests/local-probe.c
#     (bytes that are no message, a length over the limit, a HELLO
#     without memory, with memory unsealed or too small, with two
#     descriptors, another message first, nothing for 10 s); the beed
#     goes on and takes a good trainer after them, and a client that
#     says nothing does not hold up its stop;
#   - then a DiLoCo run of two: the same hash at every outer step;
#   - then a run of two with --delay-averaging: each round behind the
#     next epoch's batches, the same hash on both at every step and each
#     trainer's own at the end, and after every delayed STEP the
#     gradients the trainer had added since its epoch began are in its
#     memory again, bit for bit (the trainer checks).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/netlib.sh"
: "${LOCAL_TRAINER:?LOCAL_TRAINER must name tests/local-trainer}"
: "${LOCAL_PROBE:?LOCAL_PROBE must name tests/local-probe}"

RUN=ext
EPOCHS=8
# Batches of 32 in 5 ms at least: about 6,400 samples/s a trainer, so
# that an epoch of the three takes about 3 s.
TARGET=57600
for b in b0 b1 b2; do key "$b"; done
common=(--open --run-id "$RUN" --model external --eval-every 0)
start b0 "$base" "${common[@]}" --target-batch-size "$TARGET" \
  --trainer-socket b0.sock
wait_log b0 'waiting for a trainer process on' 10
for i in 1 2; do
  start "b$i" $((base + i)) "${common[@]}" --target-batch-size "$TARGET" \
    --trainer-socket "b$i.sock" --join "127.0.0.1:$base"
done
for i in 1 2; do wait_log "b$i" 'waiting for a trainer process on' 10; done

declare -A tpid
trainer() { # NAME BEE [FLAGS...]: a trainer for BEE's socket
  local n=$1 b=$2
  shift 2
  "$LOCAL_TRAINER" --socket "$work/$b.sock" --run "$RUN" --batch 32 \
    --batch-ms 5 "$@" >"$work/$n.out" 2>&1 &
  tpid[$n]=$!
}
trainer_ok() { # NAME: waits for its exit 0
  local rc=0
  wait "${tpid[$1]}" || rc=$?
  [ "$rc" = 0 ] || fail "trainer $1 exited $rc: $(tail -3 "$work/$1.out")"
}
trainer t0 b0 --epochs $((EPOCHS + 1)) --seed 0
trainer t1 b1 --epochs $((EPOCHS + 1)) --seed 1
trainer t2 b2 --epochs $((EPOCHS + 1)) --seed 2 --kill-at 3
for i in 0 1 2; do
  wait_log "b$i" 'trainer: trainer pid [0-9]+ \(uid [0-9]+\): 6 tensors, 68 parameters, 69 floats of optimizer state, 16 of buffers, 32 samples a batch, gradient averaging; schema external:[0-9a-f]{16}' 20
done

# A second trainer at b0 while its own trains: refused, b0 goes on.
"$LOCAL_TRAINER" --socket "$work/b0.sock" --run "$RUN" --epochs 1 \
  >"$work/busy.out" 2>&1 && fail "a second trainer at b0 was taken"
grep -q 'beed refused: pid [0-9]*: another trainer is this beed.s' \
  "$work/busy.out" || fail "the second trainer heard: $(cat "$work/busy.out")"

# A bee whose trainer's model is another (8 features, not 16): the
# swarm's peers say theirs, and it is refused with the first difference.
key b4
start b4 $((base + 6)) "${common[@]}" --target-batch-size "$TARGET" \
  --trainer-socket b4.sock --join "127.0.0.1:$base"
wait_log b4 'waiting for a trainer process on' 10
wait_log b4 'swarm: peer [0-9a-f]+ up' 10
"$LOCAL_TRAINER" --socket "$work/b4.sock" --run "$RUN" --features 8 \
  --epochs 1 >"$work/schema.out" 2>&1 && fail "a trainer of another model was taken"
grep -Eq "beed refused: the swarm's model is another: tensor 0 \(fc.weight\) is \[4, 8\] here and \[4, 16\] in the swarm \(as peer [0-9a-f]{8} has it\)" \
  "$work/schema.out" || fail "the trainer of another model heard: $(cat "$work/schema.out")"
echo "another model: $(sed -n 's/^local-trainer: //p' "$work/schema.out")"
stop b4

for e in 1 2; do in_line "$e" b0 b1 b2; done

# t2 dies at epoch 3 (SIGKILL's effect: no goodbye): b2 leaves the run
# and stays up, keeping its state; b0 and b1 go on in a group of two.
rc=0
wait "${tpid[t2]}" || rc=$?
[ "$rc" = 3 ] || fail "t2 exited $rc, not as killed: $(cat "$work/t2.out")"
wait_log b2 'trainer pid [0-9]+ closed its connection' 10
wait_log b2 'the trainer is gone; this beed left the run and keeps its state of epoch [0-9]+ for the next trainer on b2.sock' 10
kill -0 "${pid[b2]}" || fail "b2 died with its trainer"
e=$(($(last_done b0) + 2))
in_line "$e" b0 b1
# A new trainer at b2 goes on from the state b2 kept (or the swarm's),
# and is back in line.
trainer t3 b2 --epochs $((EPOCHS + 1)) --seed 3
wait_log b2 'the trainer goes on from the state of epoch [0-9]+ this beed kept' 20
for ((i = 0; i < 300; i++)); do
  grep -q 'trainer: welcome' "$work/t3.out" && break
  sleep 0.1
done
grep -q 'trainer: welcome at epoch [0-9]* (a state loaded)' "$work/t3.out" ||
  fail "t3 heard: $(cat "$work/t3.out")"
echo "b2: trainer killed at epoch 3; $(grep -o 'the trainer goes on from the state of epoch [0-9]*' "$work/b2.log")"
for ((e = EPOCHS - 1; e <= EPOCHS; e++)); do in_line "$e" b0 b1 b2; done
for n in t0 t1 t3; do trainer_ok "$n"; done
# The trainers' own view of their memory after the last step.
for i in 0 1 3; do
  b=b$i
  [ "$i" = 3 ] && b=b2
  th=$(sed -nE 's/^trainer: epoch [0-9]+ loss [0-9.]+ parameters ([0-9a-f]+).*/\1/p' \
    "$work/t$i.out")
  [ -n "$th" ] || fail "t$i printed no parameters: $(cat "$work/t$i.out")"
  [ "$th" = "$(hash_of "$b" "$EPOCHS")" ] ||
    fail "t$i's parameters $th are not $b's of epoch $EPOCHS ($(hash_of "$b" "$EPOCHS"))"
done
loss() { sed -nE "s/.*train: epoch $2 done: [0-9]+ local samples, training loss ([0-9.]+),.*/\1/p" "$work/$1.log"; }
awk -v a="$(loss b0 1)" -v b="$(loss b0 "$EPOCHS")" 'BEGIN { exit !(b < a) }' ||
  fail "b0's training loss went from $(loss b0 1) to $(loss b0 "$EPOCHS")"
echo "loss at b0: epoch 1 $(loss b0 1), epoch $EPOCHS $(loss b0 "$EPOCHS")"

# The trainers said goodbye: each beed says so, leaves the run and waits
# for the next; SIGTERM stops it cleanly.
for i in 0 1 2; do
  wait_log "b$i" 'trainer pid [0-9]+ said goodbye' 10
  wait_log "b$i" 'the trainer is gone; this beed left the run' 10
done
for i in 0 1 2; do stop "b$i"; done

# Refusals: another run's trainer, a DiLoCo trainer in a gradient run.
start b3 $((base + 3)) "${common[@]}" --target-batch-size "$TARGET" \
  --trainer-socket b3.sock
wait_log b3 'waiting for a trainer process on' 10
"$LOCAL_TRAINER" --socket "$work/b3.sock" --run other --epochs 1 \
  >"$work/other.out" 2>&1 && fail "a trainer of another run was taken"
grep -q "beed refused: the trainer's run is 'other'; this beed trains run '$RUN'" \
  "$work/other.out" || fail "the other run's trainer heard: $(cat "$work/other.out")"
"$LOCAL_TRAINER" --socket "$work/b3.sock" --run "$RUN" --diloco --epochs 1 \
  >"$work/mode.out" 2>&1 && fail "a DiLoCo trainer was taken in a gradient run"
grep -q "beed refused: the trainer asks for DiLoCo; this beed's run averages gradients" \
  "$work/mode.out" || fail "the DiLoCo trainer heard: $(cat "$work/mode.out")"
# Misbehaving clients (tests/local-probe.c): each gets its reason, and
# b3 takes a good trainer after them all.
probe() { # MODE PATTERN
  local out
  out=$("$LOCAL_PROBE" "$work/b3.sock" "$RUN" "$1") || fail "local-probe $1 failed"
  grep -Eq "$2" <<<"$out" || fail "probe $1: beed answered '$out'"
  echo "probe $1: $out"
}
probe garbage "answer: REFUSED EMALFORMED the first message is .*, not a HELLO"
probe big "answer: REFUSED ETOOBIG not a HELLO beed can read"
probe nofd "answer: REFUSED EMISSING no memory came with HELLO"
probe unsealed "answer: REFUSED ERANGE the memory is not sealed against shrinking"
probe short "answer: REFUSED ERANGE the memory holds 40 bytes; the tensors take 80"
probe twofds "answer: REFUSED .* not a HELLO beed can read"
probe notfirst "answer: REFUSED .*the first message is another message, not a HELLO"
probe nohello "answer: REFUSED ETIMEOUT no HELLO in time"
kill -0 "${pid[b3]}" || fail "b3 died of the refusals"
"$LOCAL_TRAINER" --socket "$work/b3.sock" --run "$RUN" --epochs 0 \
  >"$work/late.out" 2>&1 || fail "b3 refused a good trainer: $(cat "$work/late.out")"
grep -q "trainer: welcome at epoch 0 (fresh)" "$work/late.out" ||
  fail "the good trainer heard: $(cat "$work/late.out")"
# A client that says nothing does not hold up a stop.
wait_log b3 'the trainer is gone; this beed left the run' 10
"$LOCAL_PROBE" "$work/b3.sock" "$RUN" nohello >"$work/silent.out" 2>&1 &
silent=$!
sleep 0.5
t0=$(date +%s%N)
stop b3
ms=$((($(date +%s%N) - t0) / 1000000))
[ "$ms" -lt 3000 ] || fail "b3 took $ms ms to stop with a silent client"
wait "$silent" || true
echo "b3 stopped in $ms ms with a silent client connected ($(cat "$work/silent.out"))"

# DiLoCo: two beeds, each trainer taking its own inner steps; beed takes
# the outer steps, the same on both.
RUN=dl
dl=(--open --run-id "$RUN" --model external --eval-every 0 --averaging diloco
  --inner-steps 400 --outer-lr 0.7)
trainer_pair d0 d1 $((base + 4)) "${dl[@]}"
trainer u0 d0 --diloco --epochs 4 --seed 5 --lr 0.05
trainer u1 d1 --diloco --epochs 4 --seed 6 --lr 0.05
for n in u0 u1; do
  rc=0
  wait "${tpid[$n]}" || rc=$?
  [ "$rc" = 0 ] || fail "trainer $n exited $rc: $(tail -3 "$work/$n.out")"
done
for e in 1 2 3; do
  h=$(done_line d0 "$e")
  [[ $h = *"averaged in a group of 2"* ]] || fail "DiLoCo epoch $e: d0: '$h'"
  [ "$(hash_of d1 "$e")" = "$(hash_of d0 "$e")" ] ||
    fail "DiLoCo epoch $e: d1 $(hash_of d1 "$e"), d0 $(hash_of d0 "$e")"
  echo "DiLoCo outer step $e: $(hash_of d0 "$e") on both"
done

# --delay-averaging: the round of each epoch runs while the trainers go
# on with the next; its STEP comes amid their batches.
stop d0
stop d1
RUN=dly
dy=(--open --run-id "$RUN" --model external --eval-every 0 --delay-averaging
  --target-batch-size 19200)
trainer_pair y0 y1 $((base + 6)) "${dy[@]}"
trainer v0 y0 --epochs 6 --seed 7
trainer v1 y1 --epochs 6 --seed 8
for n in v0 v1; do
  rc=0
  wait "${tpid[$n]}" || rc=$?
  [ "$rc" = 0 ] || fail "trainer $n exited $rc: $(tail -3 "$work/$n.out")"
done
for e in 1 2 3 4; do
  h=$(done_line y0 "$e")
  [[ $h = *"averaged in a group of 2"*"behind the next epoch"* ]] ||
    fail "delayed epoch $e: y0: '$h'"
  [ "$(hash_of y1 "$e")" = "$(hash_of y0 "$e")" ] ||
    fail "delayed epoch $e: y1 $(hash_of y1 "$e"), y0 $(hash_of y0 "$e")"
done
for i in 0 1; do
  l=$(sed -nE 's/^trainer: epoch [0-9]+ loss [0-9.]+ parameters ([0-9a-f]+).*/\1/p' "$work/v$i.out")
  e=$(sed -nE 's/^trainer: epoch ([0-9]+) loss.*/\1/p' "$work/v$i.out")
  [ -n "$e" ] && [ "$l" = "$(hash_of "y$i" $((e - 1)))" ] ||
    fail "v$i ends with '$l' at epoch '$e', y$i stepped to '$(hash_of "y$i" $((e - 1)))'"
  n=$(sed -nE 's/^trainer: ([0-9]+) delayed steps, the gradients added before each kept through it$/\1/p' "$work/v$i.out")
  [ "${n:-0}" -ge 3 ] || fail "v$i checked ${n:-no} delayed steps: $(tail -2 "$work/v$i.out")"
  echo "delayed: v$i checked its gradients after $n delayed steps"
done
echo "delayed: epochs 1 to 4 behind the next epoch, one hash on both, the last $(hash_of y0 4)"
echo "external: three trainers' models averaged to one hash every epoch; refusals said; DiLoCo's outer steps alike; delayed rounds kept the next epoch's gradients"
