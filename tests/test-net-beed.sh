#!/bin/bash
# test-net-beed.sh: real beed processes on loopback.
#
# A queen and a good bee form a swarm.  Then peers that must be refused
# try to join: a token that expires while the bee runs, a bee that trusts
# another moderator, a bee of another swarm, an open-swarm bee, a revoked
# bee, and a raw socket sending an oversized frame.  Each refusal must be
# logged on both sides with its reason, no bad peer may ever count as a
# member, and the queen must go on serving: a second good bee joins and
# all three see each other.  Every daemon must exit 0 on SIGTERM.
set -euo pipefail

. "$(dirname "${BASH_SOURCE[0]}")/netlib.sh"
queen_port=$base

peers_now() { grep -o 'swarm: [0-9]* peers' "$work/$1.log" | tail -n 1 | awk '{print $2}'; }

key mod --moderator
key mod2 --moderator
for n in queen good1 good2 expiring wrongmod wrongswarm open revoked; do key $n; done
token queen mod net 1d
token good1 mod net 1d
token good2 mod net 1d
token wrongmod mod2 net 1d
token wrongswarm mod elsewhere 1d
token revoked mod net 1d
"$BEECTL" revoke --moderator-key "$work/mod.key" --swarm net --peer "$pk_revoked" \
  --list "$work/revoked.list" >/dev/null

moderated=(--moderator "$pk_mod" --swarm net)
join=(--join "127.0.0.1:$queen_port")
start queen $queen_port "${moderated[@]}" --token queen.tok --revocations revoked.list
start good1 $((base + 1)) "${moderated[@]}" --token good1.tok "${join[@]}"
wait_log queen 'swarm: 1 peers'
wait_log good1 'swarm: 1 peers'

# A token that expires while its bee is running: the queen closes the
# connection at expiry and refuses the bee's reconnects.  (Issued just
# before the start, with room for a slow machine to get the bee going.)
token expiring mod net 4s
start expiring $((base + 2)) "${moderated[@]}" --token expiring.tok "${join[@]}"
wait_log queen 'access token expired, closing \(ETOKEN_EXPIRED\)|failed: .*ETOKEN_EXPIRED'
wait_log expiring 'access token expired'
kill -TERM "${pid[expiring]}"
wait "${pid[expiring]}" || fail "expiring bee did not exit 0 on SIGTERM"
unset "pid[expiring]"
# Restarted with its expired token, beed refuses to start at all.
rc=0
(cd "$work" && exec "$BEED" --listen "127.0.0.1:$((base + 2))" \
  --identity expiring.key "${moderated[@]}" --token expiring.tok) \
  >"$work/expiring-restart.log" 2>&1 || rc=$?
[ "$rc" != 0 ] || fail "beed started with an expired token of its own"
grep -q 'expired' "$work/expiring-restart.log" ||
  fail "beed did not say its token expired"

start wrongmod $((base + 3)) --moderator "$pk_mod2" --swarm net \
  --token wrongmod.tok "${join[@]}"
wait_log wrongmod 'handshake with .* failed: .*ETOKEN_MODERATOR'
wait_log queen 'refused by the peer: .*ETOKEN_MODERATOR'

start wrongswarm $((base + 4)) --moderator "$pk_mod" --swarm elsewhere \
  --token wrongswarm.tok "${join[@]}"
wait_log queen 'handshake with .* failed: .*ETOKEN_SWARM'
wait_log wrongswarm 'refused by the peer: .*ETOKEN_SWARM'

start open $((base + 5)) --open --swarm net "${join[@]}"
wait_log open 'WARN.*open'
wait_log queen 'handshake with .* failed: .*EOPEN_MISMATCH'
wait_log open 'refused by the peer: .*EOPEN_MISMATCH'

start revoked $((base + 6)) "${moderated[@]}" --token revoked.tok "${join[@]}"
wait_log queen 'handshake with .* failed: .*EREVOKED'
wait_log revoked 'refused by the peer: .*EREVOKED'

# A raw client announcing a 4 GiB frame is closed at once.
exec 3<>"/dev/tcp/127.0.0.1/$queen_port"
printf '\xff\xff\xff\xff' >&3
wait_log queen 'frame of 4294967295 bytes is over'
exec 3<&- 3>&-

# The queen keeps serving: a second good bee joins and all three meet.
start good2 $((base + 7)) "${moderated[@]}" --token good2.tok "${join[@]}"
wait_log queen 'swarm: 2 peers'
wait_log good1 'swarm: 2 peers'
wait_log good2 'swarm: 2 peers'
# No bad peer ever counted as a member of the queen's swarm.
max=$(grep -o 'swarm: [0-9]* peers' "$work/queen.log" | awk '{print $2}' | sort -n | tail -n 1)
[ "$max" = 2 ] || fail "queen counted $max peers at some point, expected at most 2"
for n in wrongmod wrongswarm open revoked; do
  [ "$(peers_now "$n")" = 0 ] || fail "$n reports peers"
done

stop_all
echo "beed processes: all checks passed"
