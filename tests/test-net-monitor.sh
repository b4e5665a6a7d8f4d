#!/bin/bash
# test-net-monitor.sh: trainmonitor attached to a small swarm on loopback.
#
# Three bees (an open swarm) train mlp; trainmonitor joins through the
# queen as a DHT client with --http-token.  Its snapshot must show the
# three peers (their ids and labels), the swarm's epoch as the bees log
# it and the configured target; /metrics the same as Prometheus text; a
# request without the token, or with a wrong one, gets 401; a record that
# is not a progress record, put under the run's key by another client,
# never shows as a peer; b2's loss scale (it scales from 2^127) shows
# below 2^127, the others' none; a websocket client gets the snapshot at
# once and then one per scrape, the history when it asks, an error for a
# request it cannot have; the log file holds one JSON line per scrape.  Then
# b2 is killed (SIGKILL): it leaves the snapshot once its records go
# stale, and the events say so.  SIGTERM stops trainmonitor with status 0.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/netlib.sh"

MON=${TRAINMONITOR:?TRAINMONITOR must name the trainmonitor binary}
WSC="$(dirname "${BASH_SOURCE[0]}")/ws-client.py"
RUN=mon
# Epochs of 2 s or more (records take 1 to 2 s to travel).
TARGET=$(epoch_target 655360 393216)
TOKEN=s3cret-token
http=$((base + 10))

for b in b0 b1 b2 client; do key "$b"; done
train=(--open --run-id "$RUN" --target-batch-size "$TARGET" --eval-every 0)
start b0 "$base" "${train[@]}" --label "queen"
wait_log b0 'listening on' 10
start b1 $((base + 1)) "${train[@]}" --join "127.0.0.1:$base" --label 'bee "one"'
# b2 scales its loss from 2^127 (fp16's loss scaling, which the CPU runs
# too): its first batches overflow and the scale halves.
start b2 $((base + 2)) "${train[@]}" --join "127.0.0.1:$base" --label "bee two" \
  --precision fp16 --loss-scale dynamic:2^127
(cd "$work" && exec "$MON" --open --join "127.0.0.1:$base" --run-id "$RUN" \
  --http "127.0.0.1:$http" --http-token "$TOKEN" --target-batch-size "$TARGET" \
  --log-file mon.jsonl) >"$work/mon.log" 2>&1 &
pid[mon]=$!
# Bad flags, and an address that is taken (the queen's port): clear
# errors, status 2 and 1.
bad() { # STATUS TEXT ARGS...
  local want=$1 text=$2 rc=0
  shift 2
  timeout 10 "$MON" "$@" >"$work/bad.out" 2>&1 || rc=$?
  [ "$rc" = "$want" ] || fail "trainmonitor $*: status $rc, want $want"
  grep -q -- "$text" "$work/bad.out" || fail "trainmonitor $*: no '$text' in $(cat "$work/bad.out")"
}
bad 2 '--run-id NAME' --open --join "127.0.0.1:$base"
bad 2 'give either --open or --moderator' --join "127.0.0.1:$base" --run-id x
bad 2 'bad --scrape-interval' --open --join "127.0.0.1:$base" --run-id x --scrape-interval 0
bad 1 "bad --http 'nowhere'" --open --join "127.0.0.1:$base" --run-id x --http nowhere
bad 1 'cannot serve on .*: Address already in use' --open --join "127.0.0.1:$base" \
  --run-id x --http "127.0.0.1:$base"
for b in b0 b1 b2; do wait_log "$b" 'train: epoch 2 done' 60; done
wait_log mon 'joined the swarm' 20

get() { # PATH [CURL ARGS...]: the body; fails on HTTP errors
  local p=$1
  shift
  curl -sS --fail --max-time 5 -H "Authorization: Bearer $TOKEN" "$@" \
    "http://127.0.0.1:$http$p"
}
py() { python3 -c "import json,sys; s=json.load(sys.stdin); $1"; }

# A snapshot with all three peers (the DHT takes a scrape or two).
for ((i = 0; i < 50; i++)); do
  snap=$(get /api/snapshot) || fail "GET /api/snapshot failed"
  [ "$(py 'print(len(s["peers"]))' <<<"$snap")" = 3 ] && break
  sleep 0.2
done
[ "$(py 'print(len(s["peers"]))' <<<"$snap")" = 3 ] ||
  fail "the snapshot shows $(py 'print(len(s["peers"]))' <<<"$snap") peers, want 3: $snap"
for b in b0 b1 b2; do
  id=$(sed -nE 's/.*peer id ([0-9a-f]{40}).*/\1/p' "$work/$b.log" | head -n 1)
  grep -q "\"id\":\"$id\"" <<<"$snap" || fail "$b ($id) is not in the snapshot"
done
# Addresses from the donor records (they come a scrape or two later).
for ((i = 0; i < 30; i++)); do
  addrs=$(py 'print(" ".join(sorted(p["addr"] for p in s["peers"])))' <<<"$snap")
  [ "$addrs" = "127.0.0.1:$base 127.0.0.1:$((base + 1)) 127.0.0.1:$((base + 2))" ] && break
  sleep 0.3
  snap=$(get /api/snapshot)
done
[ "$addrs" = "127.0.0.1:$base 127.0.0.1:$((base + 1)) 127.0.0.1:$((base + 2))" ] ||
  fail "addresses: '$addrs'"
labels=$(py 'print("|".join(sorted(p["label"] for p in s["peers"])))' <<<"$snap")
[ "$labels" = 'bee "one"|bee two|queen' ] || fail "labels: $labels"
[ "$(py 'print(s["run"], s["now"]["target"], s["now"]["peers"])' <<<"$snap")" = "$RUN $TARGET 3" ] ||
  fail "run, target, peers: $(py 'print(s["run"], s["now"]["target"], s["now"]["peers"])' <<<"$snap")"
# The swarm's epoch: the queen's, as far as a scrape (a second) and the
# records' travel (a second or two) lag behind it.
q1=$(last_done b0)
snap=$(get /api/snapshot)
q2=$(last_done b0)
mon_epoch=$(py 'print(s["now"]["epoch"])' <<<"$snap")
[ "$mon_epoch" -ge $((q1 - 1)) ] && [ "$mon_epoch" -le $((q2 + 1)) ] ||
  fail "the monitor's epoch $mon_epoch, the queen's last steps $q1 to $q2"
q_epoch=$q2
# The rounds' share averaged by all (the metrics' by_all): the three
# average in full groups.
avg=$(py 'print(s["now"]["averaged"])' <<<"$snap")
awk -v a="$avg" 'BEGIN { exit !(a > 0.5 && a <= 1) }' ||
  fail "the share averaged by all is $avg"

# The loss scale, from the metrics records: b2's below 2^127 (it halved
# at its overflows), none for the queen.
scales=$(py 'by = {p["label"]: p for p in s["peers"]}
print(by["bee two"]["loss_scale"], by["bee two"]["dropped"], by["queen"]["loss_scale"])' <<<"$snap")
read -r sc2 dr2 sc0 <<<"$scales"
[ "$sc0" = None ] && [ "$dr2" != None ] &&
  awk -v a="$sc2" 'BEGIN { exit !(a > 0 && a < 2^126) }' ||
  fail "the loss scales (bee two, its dropped batches, queen): $scales"

# Prometheus text.
metrics=$(get /metrics)
grep -qx 'beed_swarm_peers 3' <<<"$metrics" || fail "/metrics: $(grep peers <<<"$metrics")"
grep -q "^beed_peer_epoch{peer=\"[0-9a-f]\{40\}\",label=\"bee \\\\\"one\\\\\"\"} [0-9]" <<<"$metrics" ||
  fail "/metrics: no per-peer epoch for bee \"one\""
# The dashboard, and access control.
page=$(get /) || fail "GET / failed"
grep -q '<title>beed trainmonitor</title>' <<<"$page" || fail "GET / is not the dashboard"
# The page's Content-Security-Policy (script-src and style-src 'self')
# forbids inline script and style: it has none, and its own load.
grep -Eq '<script>|<style|style="' <<<"$page" && fail "the page has inline script or style"
for f in dashboard.js:application/javascript dashboard.css:text/css; do
  type=$(curl -sS --fail -o /dev/null -w '%{content_type}' \
    -H "Authorization: Bearer $TOKEN" "http://127.0.0.1:$http/${f%%:*}") ||
    fail "GET /${f%%:*} failed"
  [ "$type" = "${f#*:}" ] || fail "/${f%%:*} is $type"
done
csp=$(curl -sS -D - -o /dev/null -H "Authorization: Bearer $TOKEN" "http://127.0.0.1:$http/")
grep -qi "content-security-policy:.*script-src 'self'" <<<"$csp" ||
  fail "no Content-Security-Policy on the page"
code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$http/api/snapshot")
[ "$code" = 401 ] || fail "no token: HTTP $code, want 401"
# The page, its script and its style hold no data: they load without it
# (a browser fetches the script and style without the page's ?token=).
for p in / /dashboard.js /dashboard.css; do
  code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$http$p")
  [ "$code" = 200 ] || fail "$p without a token: HTTP $code, want 200"
done
code=$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer nope" \
  "http://127.0.0.1:$http/metrics")
[ "$code" = 401 ] || fail "a wrong token: HTTP $code, want 401"
code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$http/api/snapshot?token=$TOKEN")
[ "$code" = 200 ] || fail "?token=: HTTP $code, want 200"
get /nowhere >/dev/null 2>&1 && fail "GET /nowhere succeeded"

# A value under the run's progress key that is not a progress record.
(cd "$work" && "$BEECTL" dht put "${RUN}_progress" "not a progress record" \
  --ttl 60s --join "127.0.0.1:$base" --open --swarm beed \
  --identity client.key) >"$work/put.log" 2>&1 || true
sleep 3
snap=$(get /api/snapshot)
[ "$(py 'print(len(s["peers"]))' <<<"$snap")" = 3 ] ||
  fail "after a bad record: $(py 'print(len(s["peers"]))' <<<"$snap") peers"
kill -0 "${pid[mon]}" || fail "trainmonitor died"
# It is not a bee's record (the DHT judges only "bee." typed values), so
# the monitor gets it, skips it and says so once, not once per scrape.
n=$(grep -c 'a malformed progress record' "$work/mon.log" || true)
[ "$n" = 1 ] || fail "the bad record was reported $n times, want once"

# Websocket: the snapshot on connect, then updates.
ws=$(python3 "$WSC" "ws://127.0.0.1:$http/ws?token=$TOKEN" 3) ||
  fail "websocket: $ws"
[ "$(grep -c '^snapshot [0-9]* 3$' <<<"$ws")" = 3 ] || fail "websocket: $ws"
ws_bad=$(python3 "$WSC" "ws://127.0.0.1:$http/ws" 1) &&
  fail "a websocket without the token was accepted: $ws_bad"
# History on request: at most the points asked for, in time order.
ws=$(python3 "$WSC" "ws://127.0.0.1:$http/ws?token=$TOKEN" 2 \
  '{"type":"history","since":0,"points":5}') || fail "websocket history: $ws"
hist=$(grep '^history ' <<<"$ws") || fail "no history answer: $ws"
read -r _ hn h1 h2 <<<"$hist"
[ "$hn" -ge 2 ] && [ "$hn" -le 5 ] && [ "$h1" -lt "$h2" ] || fail "history: $hist"
ws=$(python3 "$WSC" "ws://127.0.0.1:$http/ws?token=$TOKEN" 2 '{"type":"nonsense"}') ||
  fail "websocket: $ws"
grep -q '^error unknown request' <<<"$ws" || fail "a bad request was not answered: $ws"

# A peer that dies leaves the snapshot once its records are stale.
kill -9 "${pid[b2]}"
wait "${pid[b2]}" 2>/dev/null || true
unset 'pid[b2]'
for ((i = 0; i < 60; i++)); do
  snap=$(get /api/snapshot)
  [ "$(py 'print(len(s["peers"]))' <<<"$snap")" = 2 ] && break
  sleep 1
done
[ "$(py 'print(len(s["peers"]), s["left"])' <<<"$snap")" = "2 1" ] ||
  fail "after b2's death: peers and left $(py 'print(len(s["peers"]), s["left"])' <<<"$snap")"
grep -q 'went quiet' <<<"$snap" || fail "no event for b2's death"

# The log file: one JSON line per scrape.
lines=$(wc -l <"$work/mon.jsonl")
[ "$lines" -ge 10 ] || fail "the log file has $lines lines"
python3 -c '
import json, sys
for line in open(sys.argv[1]):
    j = json.loads(line)
    assert j["run"] == "mon" and "point" in j and "peers" in j
' "$work/mon.jsonl" || fail "the log file holds a line that is not a JSON point"
stop_all
e2=$(awk -v a="$sc2" 'BEGIN { printf "%.0f", log(a) / log(2) }')
echo "monitor: 3 peers, epoch $mon_epoch (queen $q_epoch), token enforced, bad record ignored, b2's loss scale 2^$e2 ($dr2 dropped in its last epoch), websocket updates, b2's death seen; $lines log lines"
