#!/bin/bash
# test-net-token.sh: a bee renews its access token while it runs.
#
# In a moderated swarm, bee "renew" (and trainmonitor) start with tokens
# good for 12 s.
# Its file is first replaced by a token for another key (read at SIGHUP:
# refused, the current one stays), then by a good one for a day (found by
# the periodic look at the file, no signal): the bee takes it and tells
# its peers, and the queen keeps its connection open past the old token's
# expiry.  A token with another role is refused; SIGHUP with the file
# unchanged says so; SIGHUP never stops beed.  Then the moderator revokes
# bee "rogue" in the queen's --revocations file: the queen reads it again,
# disconnects rogue and publishes the list, which renew gets from the DHT.  Beside it, bee "lapse"
# keeps a 6 s token: the queen closes its connection at expiry and the
# bee says its token has expired.  Every daemon exits 0 on SIGTERM.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/netlib.sh"

key mod --moderator
MON=${TRAINMONITOR:?TRAINMONITOR must name the trainmonitor binary}
for n in queen renew lapse rogue nobody mon; do key "$n"; done
token queen mod net 1d
token rogue mod net 1d
revoke() {
  "$BEECTL" revoke --moderator-key "$work/mod.key" --swarm net --peer "$1" \
    --list "$work/revoked.list" >/dev/null
}
revoke "$pk_nobody"
moderated=(--moderator "$pk_mod" --swarm net --revocation-interval 2)
join=(--join "127.0.0.1:$base")
start queen "$base" "${moderated[@]}" --token queen.tok --revocations revoked.list
wait_log queen 'listening on' 10
start rogue $((base + 3)) "${moderated[@]}" --token rogue.tok "${join[@]}"
token renew mod net 12s
t0=$(date +%s)
token lapse mod net 6s
token mon mod net 12s monitor
(cd "$work" && exec "$MON" --moderator "$pk_mod" --swarm net --token mon.tok \
  --identity mon.key "${join[@]}" --run-id none --http "127.0.0.1:$((base + 10))") \
  >"$work/mon.log" 2>&1 &
pid[mon]=$!
start renew $((base + 1)) "${moderated[@]}" --token renew.tok "${join[@]}" \
  --control renew.sock
start lapse $((base + 2)) "${moderated[@]}" --token lapse.tok "${join[@]}"
wait_log renew 'swarm: [1-9][0-9]* peers' 10
wait_log lapse 'swarm: [1-9][0-9]* peers' 10
wait_log mon 'joined the swarm' 10

# A token for another key, read at once on SIGHUP: refused.
cp "$work/queen.tok" "$work/renew.tok"
kill -HUP "${pid[renew]}"
wait_log renew 'token renew.tok: access token names another peer; the current one stays' 5
# A good one for a day, found without a signal.
token renew mod net 1d
token mon mod net 1d monitor
wait_log mon 'mon.tok renewed: expires in 2[34]\.[0-9] h; [1-9][0-9]* connections? told' 8
wait_log renew 'token renew.tok renewed: role bee, expires in 2[34]\.[0-9] h; [1-9][0-9]* connections? told' 8
took=$(($(date +%s) - t0))
st=$(cd "$work" && "$BEECTL" status --control renew.sock)
exp=$(awk '$1 == "token-expires" { print $2 }' <<<"$st")
[ -n "$exp" ] && [ $((exp - t0)) -ge 86000 ] ||
  fail "beectl status does not show the renewed token's expiry: $st"
[ "$took" -lt 12 ] || fail "the renewal came after the old token expired: too slow a machine for this test"

# lapse's token runs out: the queen closes it, and the bee says so.
wait_log queen 'access token expired, closing' 15
wait_log lapse 'token lapse.tok has expired: peers refuse this node' 10
# Past renew's old expiry (12 s and a tick): still connected.
while [ $(($(date +%s) - t0)) -lt 15 ]; do sleep 0.5; done
n=$(grep -c 'access token expired, closing' "$work/queen.log")
[ "$n" = 1 ] || fail "the queen closed $n connections at token expiry, want 1 (lapse's; not renew's or the monitor's)"
grep -q 'closed the connection: access token expired' "$work/mon.log" &&
  fail "the monitor's connection was closed at its old token's expiry"
grep -q "renewed token refused" "$work/queen.log" && fail "the queen refused the renewal"
grep -q 'token renew.tok has expired\|token renew.tok expires in' "$work/renew.log" &&
  fail "renew warned of the token it had replaced"
queen_id=$(field peer-id "$work/queen.txt")
p=$(grep 'swarm: [0-9]* peers' "$work/renew.log" | tail -n 1)
grep -q "${queen_id:0:8}" <<<"$p" || fail "renew is not connected to the queen after its old token's expiry: $p"

# Another role is refused; the same file again is no change.
token renew mod net 1d aux
kill -HUP "${pid[renew]}"
wait_log renew 'token renew.tok: role aux, but this node runs as bee: restart beed' 5
token renew mod net 1d
kill -HUP "${pid[renew]}"
for i in $(seq 50); do
  [ "$(grep -c 'token renew.tok renewed:' "$work/renew.log")" -ge 2 ] && break
  sleep 0.1
done
[ "$(grep -c 'token renew.tok renewed:' "$work/renew.log")" -ge 2 ] ||
  fail "renew did not take a second renewal at SIGHUP"
kill -HUP "${pid[renew]}"
wait_log renew 'token renew.tok: unchanged' 5
kill -0 "${pid[renew]}" || fail "SIGHUP stopped beed"

# The moderator revokes rogue in the queen's list file: the queen takes
# it without a restart, disconnects rogue, publishes the list, and renew
# gets it from the DHT.
wait_log renew 'revocation: list 1 from the DHT replaces 0' 10
revoke "$pk_rogue"
wait_log queen 'revocations revoked.list: list 2 replaces 1: 2 revoked keys' 8
wait_log queen 'revocation: disconnecting revoked peer' 5
wait_log renew 'revocation: list 2 from the DHT replaces 1' 10
wait_log rogue 'refused by the peer: .*EREVOKED' 40
kill -HUP "${pid[queen]}"
wait_log queen 'revocations revoked.list: unchanged \(seq 2\)' 5
st=$(cd "$work" && "$BEECTL" status --control renew.sock)
grep -qx 'revocations-seq 2' <<<"$st" || fail "beectl status: no revocations-seq 2: $st"
stop_all
echo "token: a bee renewed its 12 s token within $took s of its issue and stayed connected past the old expiry; a token for another key and one with another role were refused; a bee whose token lapsed was closed; a list revoking rogue, put in the queen's file, reached renew through the DHT"
