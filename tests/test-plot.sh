#!/bin/bash
# test-plot.sh: tools/plot on made-up trainmonitor logs.
#
# Two logs (a swarm that grows from 1 to 8 peers, and one that shrinks),
# one with a line that is not JSON: four PNG files come out, each a PNG of
# some size, the bad line is counted; a missing log, an empty one and an
# --out that is not a directory are refused.  Exits 77 (skipped) where
# Debian's python3-matplotlib is not installed.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
/usr/bin/python3 -c 'import matplotlib' 2>/dev/null ||
  { echo "SKIP: python3-matplotlib is not installed (tools/setup)"; exit 77; }
work=$(mktemp -d "${TMPDIR:-/tmp}/beed-plot.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

/usr/bin/python3 - "$work" <<'PY'
import json, math, sys
work = sys.argv[1]
for name, grow in (("grow", True), ("shrink", False)):
    with open(f"{work}/{name}.jsonl", "w") as f:
        for i in range(600):
            n = 1 + (i // 75 if grow else 7 - i // 75)
            sps = 900.0 * n * (1 - 0.03 * n)
            pt = {"t": 1795660000000 + i * 1000, "epoch": i // 20, "samples": 0,
                  "target": 32768, "peers": n, "samples_per_second": sps,
                  "eta_s": None, "loss": 2.3 * math.exp(-i / 300), "group": n,
                  "round_s": 0.2 * n, "compute_s": 2.0, "granularity": 10.0 / n,
                  "mib_sent": 1.0, "noise_scale": None}
            peers = [{"id": "%040x" % k, "label": f"bee{k}", "epoch": i // 20,
                      "samples_per_second": sps / n, "loss": pt["loss"] + 0.01 * k}
                     for k in range(n)]
            f.write(json.dumps({"run": name, "point": pt, "peers": peers}) + "\n")
        if grow:
            f.write("not json at all\n")
PY
mkdir "$work/out"
"$root/tools/plot" --out "$work/out" "$work/grow.jsonl" "$work/shrink.jsonl" \
  >"$work/plot.out" 2>"$work/plot.err" || fail "tools/plot failed: $(cat "$work/plot.err")"
for f in throughput-vs-peers granularity peer-throughput loss; do
  p=$work/out/$f.png
  grep -qx "$p" "$work/plot.out" || fail "$f.png not printed"
  [ "$(head -c 8 "$p" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] ||
    fail "$f.png is not a PNG"
  [ "$(stat -c %s "$p")" -gt 10000 ] || fail "$f.png is only $(stat -c %s "$p") bytes"
done
grep -q 'grow.jsonl: 1 lines skipped' "$work/plot.err" || fail "the bad line was not counted"
: >"$work/empty.jsonl"
for args in "$work/missing.jsonl" "$work/empty.jsonl" "--out $work/grow.jsonl $work/grow.jsonl"; do
  # shellcheck disable=SC2086 # the words are meant to split
  "$root/tools/plot" $args >"$work/x.out" 2>"$work/x.err" && fail "tools/plot $args succeeded"
  grep -q '^plot: ' "$work/x.err" || fail "tools/plot $args: no reason: $(cat "$work/x.err")"
done
echo "plot: 4 figures from 2 logs ($(du -ch "$work"/out/*.png | tail -n 1 | cut -f1)), bad input refused"
