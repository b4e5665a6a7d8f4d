#!/bin/bash
# test-net-batch.sh: an epoch holds the target batch even when the swarm
# gathers it faster than progress records travel.
#
# Three bees train mlp with a target the three gather in about 0.4 s,
# while a progress record takes a second or two to reach the others.
# Right after a round each bee counts the group's other members at the
# epoch they stepped to with it, at their rates since the step
# (bee_progress_stepped), instead of at the epoch their records still
# name; so the swarm's epochs hold about the target.  Taking the records
# as read, each bee gathered about the target alone before it saw the
# others there: epochs held 1.75 to 2.6 times it (2.25 on average over
# 20 epochs).  Over the epochs from the fourth on (the first few start
# as the bees do), all but at most one must be averaged by the three
# (one bee late for one group, back by the others' state, showed once
# in a full ASan suite), the median of the swarm's samples over those
# must lie within 0.6 to 1.3 times the target and none may hold 1.6
# times it (medians measured: 0.93 to 1.01
# with gcc, 0.85 to 0.93 under ASan, where the estimate runs short).
# The bees count their group so only in epochs of 0.1 s or more
# (STEPPED_MIN_EPOCH_S); these last 0.23 to 0.37 s on 2 cores.  The
# bound was 0.25 s, and in CI three epochs held 1.57 to 2.23 times the
# target: the rate estimate there had passed 163,840 samples/s (40,960
# in 0.25 s); here, at a target that put it so (30,720), 9 of 13 epochs
# held 1.6 to 2.7 times it.
# About 10 s.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/netlib.sh"

T=$(epoch_target 65536 40960)
LAST=15
for b in b0 b1 b2; do key "$b"; done
train=(--open --run-id batch --target-batch-size "$T" --eval-every 0
  --min-peers 3)
start_swarm 3 "${train[@]}"
for b in b0 b1 b2; do wait_log "$b" "train: epoch $LAST done" 90; done
stop_all

# epoch, the swarm's samples, and how many of the three averaged it in a
# group of three; then the verdict.
for ((e = 3; e <= LAST; e++)); do
  sum=0 three=0
  for b in b0 b1 b2; do
    n=$(sed -nE "s/.*train: epoch $e done: ([0-9]+) local samples.*/\1/p" \
      "$work/$b.log" | head -n 1)
    # A bee that missed the epoch's group and took the others' state
    # instead has no step line for it (counted below as not averaged).
    [ -n "$n" ] || grep -q "epoch $e: not averaged, and the state of epoch" \
      "$work/$b.log" || fail "$b: no step line for epoch $e"
    n=${n:-0}
    line=$(done_line "$b" "$e")
    sum=$((sum + n))
    [[ $line == *"averaged in a group of 3 ("* ]] && three=$((three + 1))
  done
  echo "$e $sum $three"
done >"$work/epochs"
python3 - "$work/epochs" "$T" <<'PY' || fail "epochs against the target $T: $(tr '\n' ' ' <"$work/epochs")"
import statistics, sys
rows = [tuple(map(int, l.split())) for l in open(sys.argv[1])]
t = int(sys.argv[2])
ratios = [s / t for _, s, _ in rows]
bad = [e for e, _, k in rows if k != 3]
med = statistics.median([s / t for _, s, k in rows if k == 3])
print("batch: epochs 3 to %d hold %s of the target (median %.2f%s)"
      % (rows[-1][0], " ".join("%.2f" % r for r in ratios), med,
         ", not averaged by all three: %s" % bad if bad else ""))
# One miss is a hiccup of a loaded machine (a bee late for one group,
# back by the others' state: seen once in a full ASan suite); more is a
# swarm that does not hold together.
assert len(bad) <= 1, "epochs not averaged by all three: %s" % bad
assert 0.6 <= med <= 1.3, "median %.2f" % med
assert max(ratios) < 1.6, "an epoch held %.2f times the target" % max(ratios)
PY
