#!/bin/bash
# test-net-heal.sh: a swarm split by churn comes back together.
#
# b0 (the queen) and b1 train; b1 is killed, and b0's DHT drops it as
# lost.  Then b2 starts with b1's address as its only --join target: it
# must wait (training alone would start a run of its own).  b1 comes back
# at its address with its key, joining through b2.  The two now know
# only each other: a DHT apart from b0's, as tools/chaos first found (a
# queen left training alone while four others trained their own model
# from epoch 0).  b0 tries its lost contact's address again, finds b1
# there, and the DHTs become one: b1 and b2 see the swarm's epoch, load
# b0's state and step in line with it.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/netlib.sh"

for b in b0 b1 b2; do key "$b"; done
cp "$work/b1.key" "$work/b1r.key"
train=(--open --run-id heal --target-batch-size "$(epoch_target 1048576 655360)"
  --matchmaking-time 2 --eval-every 0)
start_swarm 2 "${train[@]}"
for b in b0 b1; do wait_log "$b" 'train: epoch 1 done' 90; done
kill -9 "${pid[b1]}"
wait "${pid[b1]}" 2>/dev/null || true
unset 'pid[b1]'
# b0's requests to b1 fail (its progress records go to b1 too): b1 is
# dropped from the routing table and kept as lost.
wait_log b0 'dht: .*, [1-9][0-9]* lost being retried' 40

# b2's only target is b1's address, where nothing listens yet.
start b2 $((base + 2)) "${train[@]}" --join "127.0.0.1:$((base + 1))"
wait_log b2 'training waits until a --join target or a known peer answers' 20
grep -q 'training starts' "$work/b2.log" && fail "b2 trained before it joined"
start b1r $((base + 1)) "${train[@]}" --join "127.0.0.1:$((base + 2))"
wait_log b2 'dht: joined in' 20

# b0 finds b1 at its address again; both newcomers load b0's line.
for b in b1r b2; do wait_log "$b" 'state: loaded epoch' 90; done
L=$(sed -nE 's/.*state: loaded epoch ([0-9]+) .*/\1/p' "$work/b2.log" | tail -n 1)
f=$(back_in_line b2 b0 "$L")
back_in_line b1r b0 "$L" >/dev/null
same_after b2 b0 $((f + 1))
same_after b1r b0 $((f + 1))
stop_all
echo "heal: b1 killed and lost to b0; b2 waited for its target; b1 and b2 joined only each other, were found by b0 again, loaded epoch $L and stepped in line with b0 from epoch $f"
