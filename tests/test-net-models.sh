#!/bin/bash
# test-net-models.sh: beed trains the trainer's other models with their
# data: gpt on token files and resnet on CIFAR-10's binary format.
#
# gpt (2 layers of 4 heads, 32 wide, windows of 32 tokens) on the token
# files tools/train/tokenize makes of a text Debian ships: two bees
# average every epoch in a group of two, hold the same parameters after
# each step, and report the held-out tokens' perplexity, which falls.  A
# bee of the same run whose gpt has 2 heads (the same parameter count,
# another meaning) refuses their state at its first chunk.  Then resnet
# (ResNet-8, width 4) with --augment on a made-up set in CIFAR-10's
# format (each class its own brightness): two bees in line every epoch,
# test lines, the training loss falling.  About 25 s (90 s under ASan).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/netlib.sh"

text=/usr/share/common-licenses/GPL-3 # base-files: on every Debian
python3 "$(dirname "${BASH_SOURCE[0]}")/../tools/train/tokenize" \
  "$work/tok" "$text" >/dev/null

# step_how LOG EPOCH: how the epoch's step went, the parameters' hash.
step_how() {
  sed -nE "s/.*train: epoch $2 done: [0-9]+ local samples, [^,]*, (.*)/\1/p" \
    "$work/$1.log" |
    sed -E 's/ in [0-9]+\.[0-9]+ s, [0-9.]+ MiB sent(, group formed ahead)?//'
}
# in_line A B EPOCHS: both averaged each epoch in one group of two and
# hold the same parameters after it.
in_line() {
  local e h
  for ((e = 1; e <= $3; e++)); do
    h=$(step_how "$1" "$e")
    [[ $h = "averaged in a group of 2 (100.0% by all), parameters "* ]] ||
      fail "epoch $e: $1's step: '$h'"
    [ "$(step_how "$2" "$e")" = "$h" ] ||
      fail "epoch $e: $2's step '$(step_how "$2" "$e")' differs from $1's '$h'"
  done
}

for b in b0 b1 b2 b3 b4; do key "$b"; done
gpt=(--open --run-id lm --model gpt --tokens tok.train.bin --val-tokens
  tok.val.bin --ctx 32 --layers 2 --embd 32 --batch-size 16
  --target-batch-size 4096 --optimizer adamw --lr 3e-3)
start b0 "$base" "${gpt[@]}" --heads 4
wait_log b0 'listening on' 10
start b1 $((base + 1)) "${gpt[@]}" --heads 4 --join "127.0.0.1:$base"
for b in b0 b1; do wait_log "$b" 'train: epoch 4: test next-token' 120; done
grep -qE "train: run 'lm': gpt vocab 256 ctx 32 layers 2 heads 4 embd 32 \(34688 parameters\), tokens: [0-9]+ training and [0-9]+ test windows" "$work/b0.log" ||
  fail "b0 did not say which gpt it trains"
in_line b0 b1 3
ppl() { # LOG EPOCH: the test perplexity at its start
  sed -nE "s/.*train: epoch $2: test next-token accuracy [0-9.]+%, loss [0-9.]+, perplexity ([0-9.]+).*/\1/p" \
    "$work/$1.log"
}
p1=$(ppl b0 1) p4=$(ppl b0 4)
[ -n "$p1" ] && [ -n "$p4" ] || fail "b0: no perplexity after epoch 1 or 4"
awk -v a="$p1" -v b="$p4" 'BEGIN { exit !(b < a) }' ||
  fail "perplexity rose: $p1 at epoch 1, $p4 at epoch 4"
echo "gpt: two bees in line for 3 epochs; test perplexity $p1 -> $p4"

# The same run with 2 heads: as many parameters, not the same model.
start b2 $((base + 2)) "${gpt[@]}" --heads 2 --join "127.0.0.1:$base"
wait_log b2 'state from [0-9a-f]{8}: a state for another model, optimizer or averaging mode' 60
grep -q '(34688 parameters)' "$work/b2.log" ||
  fail "b2's gpt has another parameter count than the others'"
grep -q 'state: loaded epoch' "$work/b2.log" &&
  fail "the 2-head bee loaded the 4-head bees' state"
stop_all
echo "gpt: a bee with 2 heads refused the 4-head bees' state"

# A made-up set in CIFAR-10's format: 5 training files of 100 records, a
# test file of 100; the pixels of class c around 30 + 20 c.
mkdir "$work/cifar"
python3 - "$work/cifar" <<'EOF'
import random, sys
r = random.Random(7)
def records(n):
    out = bytearray()
    for _ in range(n):
        c = r.randrange(10)
        out.append(c)
        out += bytes(max(0, min(255, 30 + 20 * c + r.randrange(-40, 40)))
                     for _ in range(3072))
    return out
for i in range(1, 6):
    open(f"{sys.argv[1]}/data_batch_{i}.bin", "wb").write(records(100))
open(f"{sys.argv[1]}/test_batch.bin", "wb").write(records(100))
EOF
res=(--open --run-id img --model resnet --depth 8 --width 4 --augment
  --data cifar --batch-size 32 --lr 0.2 --target-batch-size 4096)
start b3 $((base + 3)) "${res[@]}"
wait_log b3 'listening on' 10
start b4 $((base + 4)) "${res[@]}" --join "127.0.0.1:$((base + 3))"
for b in b3 b4; do wait_log "$b" 'train: epoch 4 done' 120; done
stop_all
grep -qE "train: run 'img': resnet-8 width 4 3x32x32 classes 10 \([0-9]+ parameters\), CIFAR-10: 500 training and 100 test images" "$work/b3.log" ||
  fail "b3 did not say it trains ResNet-8 on CIFAR-10"
in_line b3 b4 4
grep -q 'train: epoch 4: test accuracy' "$work/b3.log" ||
  fail "b3: no test line after epoch 4"
loss() { # LOG EPOCH: the bee's training loss in that epoch
  sed -nE "s/.*train: epoch $2 done: [0-9]+ local samples, training loss ([0-9.]+),.*/\1/p" \
    "$work/$1.log"
}
l1=$(loss b3 1) l4=$(loss b3 4)
awk -v a="$l1" -v b="$l4" 'BEGIN { exit !(b < a) }' ||
  fail "resnet's training loss rose: $l1 in epoch 1, $l4 in epoch 4"
echo "resnet: two bees in line for 4 epochs on CIFAR-10's format; training loss $l1 -> $l4"
