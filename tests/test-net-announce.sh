#!/bin/bash
# test-net-announce.sh: bees that listen on every address, as on VMs,
# give their peers an address that reaches them.
#
# A WAN lab of three hosts (100 ms round trips and a stock kernel's TCP
# buffers: a stream's window covers less than the bandwidth the bees
# declare, --bandwidth 1000, so the averager opens bulk stripes); every
# beed listens on 0.0.0.0:45555, the same port on every host, and joins
# the first by its lab address.  Before, each bee declared 127.0.0.1:45555
# to its group, and every stripe dialled there reached the bee itself
# ("closed during the handshake", hundreds of times).  Checks:
#   - a and b learn from their peers' swarm.hello the address they are
#     seen at, and give it ("peers are given the address 10.77.0.N:45555
#     (where its peers see it)"); c gives its first --announce address,
#     and warns that its second names a port it does not listen on and
#     that its third names a host that does not resolve;
#   - the three average in groups of three, with stripes between the
#     hosts' own addresses (b's debug log: "stripe N to 10.77.0.M:..."),
#     never to a loopback address;
#   - no handshake closes, no connection to self.
# Exits 77 (skipped) without root, network namespaces or the lab's
# delayer.  About 40 s.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/netlib.sh"

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
wanlab=$root/tools/wanlab/wanlab
. "$root/tests/lablib.sh"
cat >"$work/lab.conf" <<'EOF'
host a r1
host b r2
host c r3
default rate 100mbit rtt 100ms
tcp rmem 6m wmem 4m
EOF
lab_up antest "$work/lab.conf" a b c

train=(--open --run-id an --model mlp --target-batch-size "$(epoch_target 16384 8192)"
  --threads 1 --status-interval 0 --eval-every 0 --min-peers 3
  --bandwidth 1000)
# run_bee HOST [FLAGS...]: HOST's beed in its namespace, on every address.
run_bee() {
  local h=$1 j=()
  shift
  [ "$h" != a ] && j=(--join "${addr[a]}:45555")
  (cd "$work" && exec "$wanlab" --name "$lab" exec "$h" -- "$BEED" \
    --listen 0.0.0.0:45555 --identity "$h.key" "${train[@]}" "${j[@]}" \
    "$@") >"$work/$h.log" 2>&1 &
  pid[$h]=$!
}
run_bee a
wait_log a 'listening on' 10
run_bee b --log-level debug
run_bee c --announce "${addr[c]}:45555" --announce "${addr[c]}:46000" \
  --announce no-such-bee.invalid:45555
for h in a b c; do
  wait_log "$h" 'train: epoch [0-9]+ done: .*averaged in a group of 3' 120
done
# Two more rounds of three, so that stripes had their chance.
for h in a b c; do
  n=$(grep -cE 'train: epoch [0-9]+ done: .*averaged in a group of 3' \
    "$work/$h.log" || true)
  until [ "$n" -ge 3 ]; do
    sleep 1
    n=$(grep -cE 'train: epoch [0-9]+ done: .*averaged in a group of 3' \
      "$work/$h.log" || true)
    [ $SECONDS -lt 300 ] || fail "$h averaged $n rounds of three"
  done
done
for h in a b c; do kill -TERM "${pid[$h]}"; done
for h in a b c; do wait "${pid[$h]}" 2>/dev/null || true; done

for h in a b c; do
  if grep -E "closed during the handshake|connected to self" "$work/$h.log" |
    head -3 | grep -q .; then
    fail "$h: $(grep -cE 'closed during the handshake|connected to self' \
      "$work/$h.log") handshakes closed or connections to self"
  fi
done

stripes=$(grep -cE 'avg: stripe [0-9]+ to 10\.77\.0\.[0-9]+:[0-9]+ up' \
  "$work/b.log" || true)
[ "$stripes" -ge 1 ] || fail "b opened no stripe to another host"
if grep -qE 'avg: stripe [0-9]+ to (127\.|\[::1\])' "$work/b.log"; then
  fail "b opened a stripe to a loopback address"
fi
grep -q "peers are given the address ${addr[a]}:45555 (where its peers see it)" \
  "$work/a.log" || fail "a does not give the address its peers see it at"
grep -q "peers are given the address ${addr[b]}:45555 (where its peers see it)" \
  "$work/b.log" || fail "b does not give the address its peers see it at"
grep -q "peers are given the address ${addr[c]}:45555 (--announce)" \
  "$work/c.log" || fail "c does not give its --announce address"
grep -q -- "--announce ${addr[c]}:46000: this bee listens on port 45555, not 46000" \
  "$work/c.log" || fail "c did not warn of its --announce on another port"
grep -q -- "--announce no-such-bee.invalid:45555: the name does not resolve here" \
  "$work/c.log" || fail "c did not warn of its --announce name that does not resolve"
echo "a, b and c gave ${addr[a]}, ${addr[b]} (seen by their peers) and" \
  "${addr[c]} (--announce); b opened $stripes stripes to the others'" \
  "addresses; no handshake closed"
