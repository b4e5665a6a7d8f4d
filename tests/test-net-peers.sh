#!/bin/bash
# test-net-peers.sh: restarted bees find their swarm through --peers-file.
#
# b0 (the queen, no --join) and b1 keep their DHT contacts in a peers
# file; b2 does not.  b1, then b0, stop cleanly: each file must list b2.
# b1 comes back at a new address whose only --join target is the queen's
# dead address: without the file it would wait forever; with it, it joins
# through b2, loads b2's state and steps in line with it.  Then the queen
# comes back with no --join at all: without the file it would start a run
# of its own at epoch 0 (the survivors' lost-contact pings find it only
# later); with it, it joins through the others and loads their state.
# Last, with every peer in its file gone, the queen trains on its own
# after a few seconds.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/netlib.sh"

for b in b0 b1 b2; do key "$b"; done
train=(--open --run-id peers --target-batch-size "$(epoch_target 1048576 655360)"
  --matchmaking-time 2 --eval-every 0)
start b0 "$base" "${train[@]}" --peers-file p0.peers
wait_log b0 'peers file p0.peers: none yet' 10
wait_log b0 'listening on' 10
start b1 $((base + 1)) "${train[@]}" --join "127.0.0.1:$base" --peers-file p1.peers
start b2 $((base + 2)) "${train[@]}" --join "127.0.0.1:$base"
for b in b0 b1 b2; do wait_log "$b" 'train: epoch 1 done' 90; done

# Clean stops write the files: both list b2, the one that stays.
for b in b1 b0; do stop "$b"; done
for f in p0 p1; do
  [ "$(stat -c %a "$work/$f.peers")" = 600 ] || fail "$f.peers is not mode 600"
  grep -qx "127.0.0.1:$((base + 2))" "$work/$f.peers" ||
    fail "$f.peers does not list b2: $(cat "$work/$f.peers")"
done

# b1 at a new address; its --join target is dead.
start b1r $((base + 3)) "${train[@]}" --join "127.0.0.1:$base" --peers-file p1.peers
wait_log b1r 'peers file p1.peers: [1-9][0-9]* known peers? to join through' 10
wait_log b1r 'dht: joined in' 20
wait_log b1r 'state: loaded epoch' 90
L=$(sed -nE 's/.*state: loaded epoch ([0-9]+) .*/\1/p' "$work/b1r.log" | head -n 1)
f=$(back_in_line b1r b2 "$L")
same_after b1r b2 $((f + 1))

# The queen again, at its address, with no --join.  An address nobody
# answers at, put in its file, must stay there behind the contacts it
# writes (a crash right after a join must not cost a bee the addresses
# it knew).
echo "127.0.0.1:$((base + 9))" >>"$work/p0.peers"
start b0r "$base" "${train[@]}" --peers-file p0.peers
wait_log b0r 'dht: joined in' 20
wait_log b0r 'training starts at epoch' 90
grep -q 'training starts at epoch 0$' "$work/b0r.log" &&
  fail "the queen started a run of its own: $(grep 'training starts' "$work/b0r.log")"
grep -q 'state: loaded epoch' "$work/b0r.log" || fail "the queen did not load the swarm's state"
Q=$(sed -nE 's/.*state: loaded epoch ([0-9]+) .*/\1/p' "$work/b0r.log" | head -n 1)
g=$(back_in_line b0r b2 "$Q")
same_after b0r b2 $((g + 1))
same_after b1r b2 $((g + 1))
# The queen stops first, while its peers run (a peer gone before the
# queen's last write may have left its routing table already).
stop b0r
stop_all
grep -qx "127.0.0.1:$((base + 3))" "$work/p0.peers" ||
  fail "p0.peers does not list b1's new address: $(cat "$work/p0.peers")"
grep -qx "127.0.0.1:$((base + 9))" "$work/p0.peers" ||
  fail "p0.peers lost the address it held before: $(cat "$work/p0.peers")"

# A whole swarm gone: the queen waits a few seconds for its known peers,
# then trains on its own.
start b0s "$base" "${train[@]}" --peers-file p0.peers
wait_log b0s 'no known peer answered in 5 s; training may start on its own' 15
wait_log b0s 'training starts at epoch 0$' 15
stop_all
echo "peers: b1 at a new address with a dead --join target joined through its peers file, loaded epoch $L and stepped in line from $f; the queen restarted without --join loaded epoch $Q and stepped in line from $g"
