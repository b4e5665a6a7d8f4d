#!/bin/bash
# test-net-links.sh: bees measure their links, publish them, and
# `beectl links` prints the swarm's matrix; checked against the lab.
#
# The four-continent WAN lab with a stock kernel's TCP buffers
# (tools/wanlab/configs/4continents-stock.conf: round trips of 103 to
# 280 ms, 60 to 210 Mbit/s per pair), a bee on each host listening on
# 0.0.0.0:45555, training the cnn in groups of four.  After LINKS_S
# seconds of training, `beectl links --pairs` (a client node in the
# monitor's role) reads the links records from the DHT.  Checks:
#   - all twelve ordered pairs are measured, with a round trip and a rate;
#   - every round trip within 20% of the configured one (the lab's
#     delayer adds its own fraction of a millisecond);
#   - every rate between MIN_SHARE and MAX_SHARE of the configured one:
#     a burst read late by a busy loop, taken for the link, would be
#     several times it; a sender's pacing below the link (BBR's estimate
#     of a stripe's share) gives less.  The test prints how many pairs
#     came within 20%, the issue's aim, and docs/MEASUREMENTS.md keeps
#     the figures of several runs;
#   - the printed matrix names the four bees by their labels;
#   - trainmonitor (on eu's host) serves the same matrix in /api/links
#     and /metrics (beed_link_rtt_seconds, beed_link_bandwidth_bits);
#   - a bee declares the bandwidth its rounds measured ("bandwidth:
#     declares N Mbit/s (as its rounds measured it)").
# The figures it prints, measured against configured, go in
# docs/MEASUREMENTS.md.  Exits 77 (skipped) without root, network
# namespaces or the lab's delayer.  About LINKS_S + 40 s.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/netlib.sh"

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$root/tests/lablib.sh"
LINKS_S=${LINKS_S:-60}
MIN_SHARE=${MIN_SHARE:-0.3}
MAX_SHARE=${MAX_SHARE:-1.5}
conf=$root/tools/wanlab/configs/4continents-stock.conf
lab_up lktest "$conf" us eu asia aus

cd "$work"
"$BEECTL" keygen --moderator --out mod.key >mod.txt
mod_pk=$(awk '$1 == "public-key" { print $2 }' mod.txt)
for h in us eu asia aus mon; do
  "$BEECTL" keygen --out "$h.key" >"$h.txt"
  pk=$(awk '$1 == "public-key" { print $2 }' "$h.txt")
  role=bee
  [ "$h" = mon ] && role=monitor
  "$BEECTL" token issue --moderator-key mod.key --swarm lk --peer "$pk" \
    --role "$role" --expires 1h --out "$h.tok" >/dev/null
done
train=(--moderator "$mod_pk" --swarm lk --run-id lk --model cnn
  --target-batch-size "$(epoch_target 4096 2048)" --threads 1
  --status-interval 0 --eval-every 0 --min-peers 4)
declare -A pid
run_bee() {
  local h=$1 j=()
  shift
  [ "$h" != us ] && j=(--join "${addr[us]}:45555")
  wl exec "$h" -- "$BEED" --listen 0.0.0.0:45555 --identity "$h.key" \
    --token "$h.tok" --label "$h" "${train[@]}" "${j[@]}" "$@" \
    >"$work/$h.log" 2>&1 &
  pid[$h]=$!
}
run_bee us --log-level debug
wait_log us 'listening on' 10
for h in eu asia aus; do run_bee "$h"; done
MON=${TRAINMONITOR:?TRAINMONITOR must name the trainmonitor binary}
wl exec eu -- "$MON" --moderator "$mod_pk" --swarm lk --token mon.tok \
  --identity mon.key --join "${addr[us]}:45555" --run-id lk \
  --http 127.0.0.1:18080 >"$work/mon.log" 2>&1 &
pid[mon]=$!
for h in us eu asia aus; do
  wait_log "$h" 'train: epoch [0-9]+ done: .*averaged in a group of 4' 240
done
sleep "$LINKS_S"
links=(--join "${addr[us]}:45555" --swarm lk --moderator "$mod_pk"
  --token mon.tok --identity mon.key --run lk)
wl exec eu -- "$BEECTL" links "${links[@]}" --pairs >pairs.txt 2>pairs.err ||
  fail "beectl links --pairs: $(cat pairs.err)"
wl exec eu -- "$BEECTL" links "${links[@]}" >matrix.txt 2>matrix.err ||
  fail "beectl links: $(cat matrix.err)"
sleep 6 # trainmonitor reads the links every 5 scrapes
get() { wl exec eu -- curl -sS --fail --max-time 5 "http://127.0.0.1:18080$1"; }
get /api/links >links.json || fail "GET /api/links failed: $(tail -3 mon.log)"
get /metrics >metrics.txt || fail "GET /metrics failed"
for h in us eu asia aus mon; do kill -TERM "${pid[$h]}"; done
for h in us eu asia aus mon; do wait "${pid[$h]}" 2>/dev/null || true; done
cat matrix.txt
python3 - links.json <<'PYEOF2' || fail "/api/links: $(head -c 600 links.json)"
import json, sys
x = json.load(open(sys.argv[1]))
labels = sorted(b["label"] for b in x["bees"])
assert labels == ["asia", "aus", "eu", "us"], labels
assert len(x["links"]) == 12, len(x["links"])
for l in x["links"]:
    assert l["rtt_ms"] and l["rtt_ms"] > 50 and l["mbit"] and l["mbit"] > 1, l
PYEOF2
[ "$(grep -c '^beed_link_rtt_seconds{from=' metrics.txt)" -eq 12 ] ||
  fail "/metrics: not 12 beed_link_rtt_seconds lines"
[ "$(grep -c '^beed_link_bandwidth_bits{from=' metrics.txt)" -eq 12 ] ||
  fail "/metrics: not 12 beed_link_bandwidth_bits lines"

# The configured figures, both ways: "a b rate_mbit rtt_ms".
awk '$1 == "between" {
  r = $5; sub(/mbit/, "", r); t = $7; sub(/ms/, "", t)
  print $2, $3, r, t; print $3, $2, r, t }' "$conf" >want.txt
n=0 close=0
printf '%-5s %-5s %8s %8s %8s %8s\n' from to "rtt ms" want "Mbit/s" want
while IFS=$'\t' read -r _ from _ to rtt mbit _; do
  read -r wr wt < <(awk -v a="$from" -v b="$to" '$1 == a && $2 == b {
    print $3, $4 }' want.txt)
  [ -n "${wr:-}" ] || fail "pair $from -> $to is not a pair of the lab"
  printf '%-5s %-5s %8.1f %8s %8.1f %8s\n' "$from" "$to" "$rtt" "$wt" \
    "$mbit" "$wr"
  awk -v m="$rtt" -v w="$wt" 'BEGIN { exit !(m >= 0.8 * w && m <= 1.2 * w) }' ||
    fail "$from -> $to: round trip $rtt ms, configured $wt ms"
  awk -v m="$mbit" -v w="$wr" -v s="$MIN_SHARE" -v x="$MAX_SHARE" \
    'BEGIN { exit !(m >= s * w && m <= x * w) }' ||
    fail "$from -> $to: $mbit Mbit/s, configured $wr"
  awk -v m="$mbit" -v w="$wr" 'BEGIN { exit !(m >= 0.8 * w && m <= 1.2 * w) }' &&
    close=$((close + 1))
  n=$((n + 1))
done <pairs.txt
[ "$n" -eq 12 ] || fail "$n pairs measured, not 12: $(cat pairs.txt)"
for h in us eu asia aus; do
  grep -q "$h" matrix.txt || fail "the matrix does not name $h"
done
grep -qE 'bandwidth: declares [0-9.]+ Mbit/s \(as its rounds measured it\)' \
  us.log || fail "us never declared the bandwidth its rounds measured"
echo "12 pairs measured; round trips within 20% of the lab's; rates within" \
  "$MIN_SHARE..$MAX_SHARE of it, $close of 12 within 20%"
