#!/bin/bash
# test-net-browser.sh: trainmonitor's dashboard in a real browser.
#
# Four bees train on loopback (labels us, eu, asia, aus) and trainmonitor
# serves the dashboard with a token.  tests/browser-check.py opens it in
# headless Chromium (Debian's chromium) through the DevTools protocol and
# checks that the page loads without a script error, lists the four bees,
# draws its four charts, shows the link matrix (colored cells) and that
# the swarm's progress moves.  The screenshot stays in the build
# directory (dashboard.png) for people to look at.  Exits 77 (skipped)
# without chromium.  About 40 s.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/netlib.sh"
: "${TRAINMONITOR:?TRAINMONITOR must name the trainmonitor binary}"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
command -v chromium >/dev/null || { echo "SKIP: no chromium"; exit 77; }
shot=${BEE_SHOT_DIR:-$work}/dashboard.png
TOKEN=browser-$RANDOM$RANDOM
http=$((base + 10))

labels=(us eu asia aus)
for i in 0 1 2 3; do key "b$i"; done
train=(--open --run-id br --target-batch-size "$(epoch_target 2048 1024)"
  --eval-every 0 --min-peers 4)
start b0 "$base" "${train[@]}" --label us
wait_log b0 'listening on' 10
for i in 1 2 3; do
  start "b$i" $((base + i)) "${train[@]}" --label "${labels[$i]}" \
    --join "127.0.0.1:$base"
done
(cd "$work" && exec "$TRAINMONITOR" --open --join "127.0.0.1:$base" \
  --run-id br --http "127.0.0.1:$http" --http-token "$TOKEN") \
  >"$work/mon.log" 2>&1 &
pid[mon]=$!
for i in 0 1 2 3; do wait_log "b$i" 'train: epoch 1 done' 120; done
# The link records: each bee's every 10 s, read every 5 scrapes.
for _ in $(seq 1 40); do
  n=$(curl -sS --max-time 5 "http://127.0.0.1:$http/api/links?token=$TOKEN" |
    python3 -c 'import json, sys; print(len(json.load(sys.stdin)["links"]))') || n=0
  [ "$n" -ge 12 ] && break
  sleep 1
done
[ "$n" -ge 12 ] || fail "/api/links has $n links, not 12"
python3 "$here/browser-check.py" "http://127.0.0.1:$http/?token=$TOKEN" 4 \
  "$shot" >"$work/browser.txt" 2>&1 || {
  rc=$?
  [ "$rc" -eq 77 ] && { cat "$work/browser.txt"; exit 77; }
  fail "the dashboard in Chromium: $(cat "$work/browser.txt")"
}
cat "$work/browser.txt"
echo "Chromium showed the four bees, the charts and the link matrix," \
  "without a script error; the screenshot: $shot"
