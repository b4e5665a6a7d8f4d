#!/bin/bash
# test-net-equiv.sh: two bees that share each epoch learn what one bee
# learns alone with the same batch.
#
# A bee alone with --target-batch-size B takes one optimizer step per B
# samples; two bees with the same target gather B together and average
# their mean gradients weighted by samples, which is the mean over the
# same B samples.  So over the same epochs their training losses (each
# epoch's mean over its samples) and their test accuracy must agree,
# within what different data orders give: here 3% on the loss of epochs
# 2 to 5 and 1.5 points of accuracy after epoch 6 (mlp on Fashion-MNIST,
# B = 131,072, lr 0.05).  Both runs start from the same weights (the
# run's name seeds them).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/netlib.sh"

B=131072
EPOCHS=6
train=(--open --run-id equiv --target-batch-size "$B" --eval-every "$EPOCHS")
for b in solo a1 a2; do key "$b"; done

# loss LOG EPOCH: the epoch's mean training loss.
loss() {
  sed -nE "s/.*train: epoch $2 done: [0-9]+ local samples, training loss ([0-9.]+),.*/\1/p" \
    "$work/$1.log" | head -n 1
}
acc() {
  sed -nE "s/.*train: epoch $2: test accuracy ([0-9.]+)%.*/\1/p" "$work/$1.log" |
    head -n 1
}

start solo "$base" "${train[@]}"
wait_log solo "train: epoch $EPOCHS: test accuracy" 120
stop_all

start a1 $((base + 1)) "${train[@]}"
wait_log a1 'listening on' 10
start a2 $((base + 2)) "${train[@]}" --join "127.0.0.1:$((base + 1))"
for b in a1 a2; do wait_log "$b" "train: epoch $EPOCHS: test accuracy" 120; done
stop_all

# In the pair, every epoch from 1 on was averaged by both.
for ((e = 1; e < EPOCHS; e++)); do
  grep -q "train: epoch $e done: .*averaged in a group of 2" "$work/a1.log" ||
    fail "epoch $e was not averaged by the pair"
done
python3 - "$(for ((e = 2; e < EPOCHS; e++)); do echo "$(loss solo $e) $(loss a1 $e) $(loss a2 $e)"; done)" \
  "$(acc solo $EPOCHS) $(acc a1 $EPOCHS)" <<'PY' || fail "the pair did not learn what the solo bee learned"
import sys
ok = True
for line in sys.argv[1].splitlines():
    s, a, b = (float(x) for x in line.split())
    pair = (a + b) / 2  # each bee's loss is over its own half
    print(f"loss solo {s:.4f} pair {pair:.4f} ({100 * (pair - s) / s:+.1f}%)")
    ok &= abs(pair - s) <= 0.03 * s
sa, pa = (float(x) for x in sys.argv[2].split())
print(f"test accuracy solo {sa:.2f}% pair {pa:.2f}%")
ok &= abs(sa - pa) <= 1.5
sys.exit(0 if ok else 1)
PY
echo "equivalence: two bees sharing target $B learn as one bee with batch $B"
