#!/bin/bash
# test-net-diloco-join.sh: in DiLoCo mode a bee that loads the state in
# the middle of a round takes that round with the local steps it has.
#
# Two bees train mlp in DiLoCo mode (AdamW inner steps, rounds of about
# 10 s).  A newcomer j starts 3 s after a round: it loads the
# state of the epoch the two are in, whose inner steps they are halfway
# through.  Its own --inner-steps would end seconds after theirs, when
# their round is over; stepped then, alone, it would be out of line and
# load their state again, in the middle of the next round, and so on (a
# run measured 10 downloads before one landed at a round's start).
# Instead, once its view says the other two are done, it takes the round
# with the steps it has ("after N of its H local steps"), weighed by its
# samples: averaged in a group of three, the same parameters as b0 after
# it and after the next round, and it downloads the state once.  (On two
# cores three bees do not train at one rate: j may get its steps done in
# the others' matchmaking after all, and b0 or b1, lagging, may be the one
# that takes the round early.  Either way, the round is the three's.
# Without the rule j stepped alone in 2 runs of 3 starting a second into
# the round; 3 s in, it lags by about 4 s.)
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/netlib.sh"

# Rounds of about 10 s in either build, so that j's first view (4 to 5 s
# into the round) comes well before the others form their group (about
# --matchmaking-time, 2 s, before their steps end): it loads the round
# under way and takes part in it.
H=$(epoch_target 8000 4800)
train=(--open --run-id dj --averaging diloco --inner-steps "$H"
  --optimizer adamw --lr 1e-3 --eval-every 0)
for b in b0 b1 j; do key "$b"; done
start_swarm 2 "${train[@]}" --min-peers 2
for b in b0 b1; do wait_log "$b" 'train: epoch 0 done' 120; done
K=$(last_done b0)
sleep 3
grep -q "train: epoch $((K + 1)) done" "$work/b0.log" &&
  fail "b0 finished round $((K + 1)) 3 s after $K: rounds too short"
start j $((base + 2)) "${train[@]}" --join "127.0.0.1:$base"
wait_log j 'state: loaded epoch' 30
L=$(sed -nE 's/.*state: loaded epoch ([0-9]+) .*/\1/p' "$work/j.log" | head -n 1)
[ "$L" = $((K + 1)) ] || fail "j loaded epoch $L, not the round under way ($((K + 1)))"
same_after j b0 "$L"
line=$(done_line j "$L")
[[ $line == *"averaged in a group of 3 ("* ]] || fail "j's first round $L: '$line'"
same_after j b0 $((L + 1))
n=$(grep -c 'state: loaded epoch' "$work/j.log")
[ "$n" = 1 ] || fail "j downloaded the state $n times"
steps=$(sed -nE 's/.*after ([0-9]+) of its.*/\1/p' <<<"$line")
stop_all
echo "diloco-join: j loaded round $L under way, took it after ${steps:-all} of its $H steps in a group of 3, in line after it; one download"
