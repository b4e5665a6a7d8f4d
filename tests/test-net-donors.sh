#!/bin/bash
# test-net-donors.sh: a donor serves at most --max-state-uploads state
# downloads at once, and the newcomers it turns away come back.
#
# Runs in a network namespace of its own whose loopback is shaped to
# 4 Mbit/s (tc tbf), so that a state download (mlp with AdamW: 2.4 MiB)
# takes seconds.  A queen trains alone with --max-state-uploads 1; once it
# is past epoch 2, two newcomers start together.  The queen serves one and
# tells the other it is busy; that one waits and asks again, and both load
# the state.  Neither trains from its own first weights meanwhile ("training
# on from here" never appears), and the queen logs each download's start,
# its end and the refusal.  Exits 77 (skipped) where a namespace cannot be
# made or tc cannot shape it.  About 30 s.
set -euo pipefail

skip() {
  echo "SKIP: $*"
  exit 77
}
if [ -z "${BEE_TEST_NETNS:-}" ]; then
  [ "$(id -u)" = 0 ] || skip "needs root for a network namespace"
  command -v tc >/dev/null || skip "tc is not installed (tools/setup)"
  unshare -n true 2>/dev/null || skip "cannot create network namespaces here"
  exec unshare -n env BEE_TEST_NETNS=1 bash "${BASH_SOURCE[0]}" "$@"
fi
ip link set lo mtu 1500 up # tbf drops packets bigger than its burst
tc qdisc add dev lo root tbf rate 4mbit burst 32kb latency 200ms 2>/dev/null ||
  skip "tc cannot shape the loopback here"
. "$(dirname "${BASH_SOURCE[0]}")/netlib.sh"

RUN=don
for b in q n1 n2; do key "$b"; done
train=(--open --run-id "$RUN" --optimizer adamw
  --target-batch-size "$(epoch_target 262144 163840)" --eval-every 0)
start q "$base" "${train[@]}" --max-state-uploads 1
wait_log q 'train: epoch 3 done' 60
start n1 $((base + 1)) "${train[@]}" --join "127.0.0.1:$base"
start n2 $((base + 2)) "${train[@]}" --join "127.0.0.1:$base"
wait_log n1 'state: loaded epoch' 60
wait_log n2 'state: loaded epoch' 60

# The queen served them one at a time: a refusal while the first ran.
grep -q 'told it is busy' "$work/q.log" || fail "the queen turned nobody away"
n=$(grep -c 'state: serving ' "$work/q.log" || true)
done_n=$(grep -c 'state: done serving' "$work/q.log" || true)
# The second newcomer may have loaded from the first instead, once that
# one was at the swarm's epoch: the queen served one or more downloads,
# never two at once, and finished them.
[ "$n" -ge 1 ] || fail "the queen served nobody"
serving=$(grep 'state: serving ' "$work/q.log" || true)
grep -qv '(1 of at most 1 downloads)' <<<"$serving" &&
  fail "the queen served more than one at once: $(grep 'state' "$work/q.log")"
[ "$done_n" -ge 1 ] || fail "the queen finished none of $n downloads"
# The newcomers read the donor records before they asked.
grep -q "state: [0-9]* donors at the swarm's epoch, [0-9]* with a free download slot" \
  "$work/n1.log" "$work/n2.log" || fail "no newcomer read the donor records"
# One newcomer was told to come back, and came back.
waited=$(grep -l 'donors busy serving others; asking again' \
  "$work/n1.log" "$work/n2.log" | wc -l || true)
[ "$waited" -ge 1 ] || fail "no newcomer waited for a busy donor: $(grep -h 'state' "$work/n1.log" "$work/n2.log")"
for b in n1 n2; do
  grep -q 'training on from here' "$work/$b.log" &&
    fail "$b trained on from its own weights"
  # It trained only from the state it loaded: its first step is after it.
  first=$(grep -n 'train: epoch [0-9]* done' "$work/$b.log" | head -1 |
    cut -d: -f1 || true)
  loaded=$(grep -n 'state: loaded epoch' "$work/$b.log" | head -1 |
    cut -d: -f1 || true)
  [ -z "$first" ] || [ "$first" -gt "$loaded" ] ||
    fail "$b stepped before it loaded the state"
done
echo "donors: queen served $n download(s), $waited newcomer(s) waited and loaded"
stop_all
