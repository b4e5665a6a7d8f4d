#!/bin/bash
# test-net-train.sh: three beed processes on loopback train one run.
#
# A queen and two bees (an open swarm) train mlp on Fashion-MNIST with
# --run-id.  Each publishes its progress and metrics records in the DHT;
# beectl finds all three of each under "<run>_progress" and
# "<run>_metrics".  The epoch ends for the swarm when the
# three together have gathered the target batch: for every epoch after
# the first, the samples the three gathered add up to the target (give or
# take what a second of stale records lets through), and no bee gathered
# the target alone.  At each step the three average their gradients in
# one group (matchmaking through the DHT, formed ahead of the epoch's
# end, butterfly all-reduce) and take the same optimizer step: their
# parameters hash the same after every epoch.  Test accuracy is reported and rises.  Then churn: one bee is
# killed, a newcomer downloads the state from a peer and steps in line
# with the others.  Then preemption: SIGTERM to a bee writes its checkpoint
# and it exits 0 within 25 s; restarted with --resume it steps in line
# again.  Every bee left exits 0 on SIGTERM.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/netlib.sh"

RUN=t3
# An epoch of 2.5 s or more: the view travels in 1 to 2 s.
TARGET=$(epoch_target 655360 393216)
EPOCHS=4 # epochs every bee must finish

for b in b0 b1 b2; do key "$b"; done
key client
train=(--open --run-id "$RUN" --target-batch-size "$TARGET" --eval-every 2)
start b0 "$base" "${train[@]}" --label "queen"
wait_log b0 'listening on' 10
mkdir "$work/ck-b1"
start b1 $((base + 1)) "${train[@]}" --join "127.0.0.1:$base" --label "bee 1" \
  --checkpoint-dir ck-b1
start b2 $((base + 2)) "${train[@]}" --join "127.0.0.1:$base" --label "bee 2"
for b in b0 b1 b2; do wait_log "$b" "train: epoch $EPOCHS done" 120; done

# The three progress records, and each bee's metrics record of its last
# epoch, found through a bee (a few tries: a lookup may miss a replica on
# a loaded machine).
records() { # NAME TAG-HEX: how many records of three owners
  local i n out
  for ((i = 0; i < 5; i++)); do
    out=$(cd "$work" && "$BEECTL" dht get "${RUN}_$1" --latest \
      --join "127.0.0.1:$((base + 2))" --open --swarm beed \
      --identity client.key 2>>"$work/beectl.log") || true
    n=$(grep -c "^owner .*$2" <<<"$out" || true)
    [ "$n" = 3 ] && break
    sleep 1
  done
  echo "$n"
}
n=$(records progress 6265652e70726f6772657373)
[ "$n" = 3 ] || fail "found $n progress records, want 3"
n=$(records metrics 6265652e6d657472696373)
[ "$n" = 3 ] || fail "found $n metrics records, want 3"

# same_step WHEN EPOCH: b0, b1 and b3 stepped alike, in one group of
# three; sets h0 to how.
same_step() {
  local b
  h0=$(step_how b0 "$2")
  for b in b1 b3; do
    [ "$(step_how "$b" "$2")" = "$h0" ] ||
      fail "$1, epoch $2: $b's step '$(step_how "$b" "$2")' differs from b0's '$h0'"
  done
  [[ $h0 = "averaged in a group of 3 "* ]] || fail "$1, epoch $2: b0's step: '$h0'"
}

# Samples per epoch: "epoch E done: N local samples, ...".
samples() { # LOG EPOCH
  sed -nE "s/.*train: epoch $2 done: ([0-9]+) local samples.*/\1/p" \
    "$work/$1.log"
}
# How the epoch's step went and the parameters' hash after it.
step_how() { # LOG EPOCH: how it stepped; the round's time and bytes, and
  # whether this bee's group had formed ahead, left out
  sed -nE "s/.*train: epoch $2 done: [0-9]+ local samples, [^,]*, (.*)/\1/p" \
    "$work/$1.log" |
    sed -E 's/ in [0-9]+\.[0-9]+ s, [0-9.]+ MiB sent(, group formed ahead)?//'
}
for ((e = 1; e <= EPOCHS; e++)); do
  sum=0
  for b in b0 b1 b2; do
    s=$(samples "$b" "$e")
    [ -n "$s" ] || fail "$b: no step for epoch $e"
    [ "$s" -lt "$TARGET" ] || fail "$b gathered epoch $e alone ($s samples)"
    sum=$((sum + s))
  done
  # At least 90% of the target (the others' counts are extrapolated), at
  # most 60% over it (records are up to a second or two old).
  [ $((sum * 10)) -ge $((TARGET * 9)) ] ||
    fail "epoch $e: $sum samples in all, under 90% of $TARGET"
  [ $((sum * 10)) -le $((TARGET * 16)) ] ||
    fail "epoch $e: $sum samples in all, over 160% of $TARGET"
  # One group of three, the whole tensor averaged by all, the same
  # parameters everywhere.
  h0=$(step_how b0 "$e")
  [[ $h0 = "averaged in a group of 3 (100.0% by all), parameters "* ]] ||
    fail "epoch $e: b0's step: '$h0'"
  for b in b1 b2; do
    [ "$(step_how "$b" "$e")" = "$h0" ] ||
      fail "epoch $e: $b's step '$(step_how "$b" "$e")' differs from b0's '$h0'"
  done
  echo "epoch $e: $sum samples over 3 bees (target $TARGET), ${h0}"
done

# Epochs of 2.5 s or more: the groups form while the last batches are
# computed (the matchmaking ahead of the swarm's estimated end), for most
# epochs at least.
ahead=0
for ((e = 1; e <= EPOCHS; e++)); do
  grep -q "train: epoch $e done: .*, group formed ahead, parameters" "$work/b0.log" &&
    ahead=$((ahead + 1))
done
[ "$ahead" -ge $((EPOCHS / 2)) ] ||
  fail "b0's group formed ahead in $ahead of epochs 1 to $EPOCHS"
echo "groups formed ahead at b0: $ahead of epochs 1 to $EPOCHS"

# Accuracy on the test set, every second epoch, rising from epoch 2 to 4.
acc() { # LOG EPOCH -> percent times 100
  sed -nE "s/.*train: epoch $2: test accuracy ([0-9]+)\.([0-9]+)%.*/\1\2/p" \
    "$work/$1.log"
}
for b in b0 b1 b2; do
  a2=$(acc "$b" 2) a4=$(acc "$b" 4)
  [ -n "$a2" ] && [ -n "$a4" ] || fail "$b: no test accuracy for epochs 2 and 4"
  [ "$a4" -gt "$a2" ] || fail "$b: test accuracy fell from epoch 2 to 4"
  [ "$a4" -gt 3000 ] || fail "$b: test accuracy at epoch 4 only $a4/100 %"
done
echo "test accuracy at epoch 4: $(acc b0 4) $(acc b1 4) $(acc b2 4) (% x 100)"

# Churn: b2 dies between two rounds (SIGKILL, as a preempted VM) and a
# newcomer joins through b1.  It downloads the state from a peer at the
# swarm's epoch, and from its first step on holds the same parameters as
# the others; b0 and b1 go on.
wait_log b2 "train: epoch $((EPOCHS + 1)) done" 60
kill -9 "${pid[b2]}"
wait "${pid[b2]}" 2>/dev/null || true
unset "pid[b2]"
key b3
start b3 $((base + 3)) "${train[@]}" --join "127.0.0.1:$((base + 1))" \
  --label "newcomer"
wait_log b3 'train: state: loaded epoch [0-9]+ from' 60
loaded=$(sed -nE 's/.*train: state: loaded epoch ([0-9]+) from.*/\1/p' \
  "$work/b3.log" | head -n 1)
[ "$loaded" -gt "$EPOCHS" ] || fail "b3 loaded epoch $loaded, not the swarm's"
# Its first epoch may be partial (it joined midway); from the next on, the
# step is shared and the parameters are the same as b0's.
e=$((loaded + 1))
for b in b0 b1 b3; do wait_log "$b" "train: epoch $e done" 90; done
same_step "after the churn" "$e"
echo "churn: b2 killed, b3 loaded epoch $loaded; epoch $e: $h0"

# Preemption: SIGTERM to b1 (started with a checkpoint directory below):
# it exits 0 well within 25 s, with its state on disk, after a last
# progress record that says it left was stored (its log says so, and a
# read of the DHT finds it); restarted with --resume it loads its
# checkpoint, catches up with the swarm and steps in line.
t0=$(date +%s%N)
kill -TERM "${pid[b1]}"
rc=0
wait "${pid[b1]}" || rc=$?
unset "pid[b1]"
ms=$((($(date +%s%N) - t0) / 1000000))
[ "$rc" = 0 ] || fail "b1 exited $rc after SIGTERM"
[ "$ms" -lt 25000 ] || fail "b1 took $ms ms to stop"
ls "$work"/ck-b1/"$RUN"-*.ckpt >/dev/null 2>&1 || fail "b1 left no checkpoint"
grep -q 'train: left the run: the last progress record says so' "$work/b1.log" ||
  fail "b1 did not tell the run it left"
# A read of the run's records now finds b1's last one, which says it
# left: an eighth field, true (0xc3).  A lookup may miss a replica on a
# loaded machine: a few tries.
id_b1=$(field peer-id "$work/b1.txt")
for ((i = 0; i < 5; i++)); do
  out=$(cd "$work" && "$BEECTL" dht get "${RUN}_progress" --latest \
    --join "127.0.0.1:$base" --open --swarm beed --identity client.key \
    2>>"$work/beectl.log") || true
  grep -q "^owner $id_b1.*c3 (hex)\$" <<<"$out" && break
  sleep 1
done
grep -q "^owner $id_b1.*c3 (hex)\$" <<<"$out" ||
  fail "no read found b1's leaving record: $out"
mv "$work/b1.log" "$work/b1-first.log"
start b1 $((base + 1)) "${train[@]}" --join "127.0.0.1:$base" \
  --checkpoint-dir ck-b1 --resume
wait_log b1 'train: resuming from .*ck-b1/' 20
now=$(last_done b0)
e=$((now + 2))
for b in b0 b1 b3; do wait_log "$b" "train: epoch $e done" 90; done
same_step "after the restart" "$e"
echo "preemption: b1 stopped in $ms ms with a checkpoint, resumed; epoch $e: $h0"

stop_all
for b in b0 b1 b3; do
  grep -q 'train: stopped at epoch' "$work/$b.log" || fail "$b: no stop line"
done
echo "train 3: epochs shared and averaged by 3 bees (the same parameters), progress in the DHT, a newcomer after a death in line, clean stops"
