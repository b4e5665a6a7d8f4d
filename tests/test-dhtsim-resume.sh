#!/usr/bin/env bash
# test-dhtsim-resume.sh: dhtsim-scale's checkpoints.  A run split in three
# processes (--stop-at, --checkpoint, --resume) must print the same rows,
# traffic lines and summary as the same run in one process, wall times and
# memory aside; bad checkpoint files and options must be refused with a
# clear reason.  Needs DHTSIM_SCALE (set by tests/meson.build).
set -u

SIM=${DHTSIM_SCALE:?DHTSIM_SCALE must name the dhtsim-scale binary}
dir=$(mktemp -d /tmp/beed-test-dhtsim-XXXXXX) || exit 1
trap 'rm -rf "$dir"' EXIT
cd "$dir" || exit 1

fails=0
fail() {
  echo "FAIL: $*" >&2
  fails=$((fails + 1))
}

# A small network with heavy churn (a third of it replaced every 20
# minutes), so that lookups, joins and deaths are in flight at every row.
RUN=(--nodes 400 --hours 3 --report 30 --keys 60 --control-keys 10
  --gets-per-hour 2000 --survey 100 --mean-lifetime 1)

"$SIM" "${RUN[@]}" --checkpoint ck.img --stop-at 1 >p1.md 2>p1.err
rc=$?
if [ "$rc" -eq 3 ]; then
  # No arena: an AddressSanitizer build, or a kernel that refuses to turn
  # address randomization off.  Nothing to test here.
  echo "SKIP: $(cat p1.err)"
  exit 77
fi
[ "$rc" -eq 0 ] || fail "first part exited $rc: $(cat p1.err)"
grep -q '^# stopped by --stop-at after 1.00 of 3 simulated hours' p1.md ||
  fail "first part did not stop at hour 1: $(grep '^# stopped' p1.md)"
[ -f ck.img ] || fail "no checkpoint written"
[ -e ck.img.tmp ] && fail "ck.img.tmp left behind"
cp ck.img hour1.img

"$SIM" --resume ck.img --checkpoint ck.img --stop-at 2 >p2.md 2>p2.err ||
  fail "second part exited $?: $(cat p2.err)"
grep -q '^# resumed from ck.img at hour 1.00 of 3' p2.md ||
  fail "second part: no resume line: $(head -3 p2.md)"
"$SIM" --resume ck.img >p3.md 2>p3.err ||
  fail "third part exited $?: $(cat p3.err)"
"$SIM" "${RUN[@]}" >whole.md 2>whole.err ||
  fail "whole run exited $?: $(cat whole.err)"

# Rows without their wall, cpu and RSS columns; traffic lines; the summary
# without wall_s and what follows (times and memory).
rows() { grep '^| [0-9]' "$@" | cut -d'|' -f1-17; }
traffic() { grep '^#   traffic' "$@"; }
summary() { grep '^SUMMARY' "$@" | sed 's/ wall_s=.*//'; }
[ "$(rows whole.md | wc -l)" -eq 6 ] ||
  fail "whole run: $(rows whole.md | wc -l) rows, want 6"
[ "$(rows p1.md p2.md p3.md | wc -l)" -eq 6 ] ||
  fail "split run: $(rows p1.md p2.md p3.md | wc -l) rows, want 6"
diff <(rows whole.md) <(cat p1.md p2.md p3.md | rows) >rows.diff ||
  fail "the split run's rows differ: $(cat rows.diff)"
diff <(traffic whole.md) <(cat p1.md p2.md p3.md | traffic) >traffic.diff ||
  fail "the split run's traffic differs: $(cat traffic.diff)"
[ -n "$(summary whole.md)" ] || fail "whole run: no summary"
[ "$(summary whole.md)" = "$(summary p3.md)" ] ||
  fail "summaries differ: $(summary whole.md) / $(summary p3.md)"

# refused WANT_TEXT ARGS...: dhtsim-scale must exit non-zero, print no row
# and say WANT_TEXT on stderr.
refused() {
  local want=$1
  shift
  "$SIM" "$@" >bad.md 2>bad.err && fail "dhtsim-scale $* succeeded"
  grep -q "$want" bad.err || fail "dhtsim-scale $*: no '$want' in: $(cat bad.err)"
  rows bad.md | grep -q . && fail "dhtsim-scale $*: printed rows"
}
refused 'belongs to the run' --resume hour1.img --nodes 5
refused 'need a file name' --checkpoint ''
refused 'cannot open it' --resume missing.img
echo 'not a checkpoint at all, and longer than a header is' >junk.img
refused 'not a dhtsim-scale checkpoint' --resume junk.img
head -c 1000000 hour1.img >short.img
refused 'it is truncated' --resume short.img
# A flipped byte in the data (past the 120-byte header), then in the
# binary's hash (at offset 56 of the header).
flip() { # FILE OFFSET
  local b
  b=$(od -An -tu1 -j "$2" -N1 "$1" | tr -d ' ')
  printf "$(printf '\\%03o' $(((b + 1) % 256)))" |
    dd of="$1" bs=1 seek="$2" conv=notrunc status=none
}
cp hour1.img corrupt.img
flip corrupt.img 400000
refused 'it is corrupt' --resume corrupt.img
cp hour1.img other.img
flip other.img 60
refused 'another build' --resume other.img
# The intact file still resumes after all that.
"$SIM" --resume hour1.img --stop-at 1.5 >again.md 2>again.err ||
  fail "resume after the refusals exited $?: $(cat again.err)"
diff <(rows again.md) <(rows p2.md | head -1) >/dev/null ||
  fail "resuming hour1.img again gave another first row"

if [ "$fails" -ne 0 ]; then
  echo "$fails failure(s)" >&2
  exit 1
fi
echo "ok: split run identical to the whole run ($(rows whole.md | wc -l) rows), bad files refused"
