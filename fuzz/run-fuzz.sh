#!/bin/sh
# run-fuzz.sh: one bounded libFuzzer run, as a meson test.
#
#   run-fuzz.sh BINARY CORPUS_DIR SECONDS
#
# The seed corpus is copied to a fresh temporary directory, so the run
# never writes into the source tree.  Exits 0 when the fuzzer ran clean
# for SECONDS; 1 on any crash, leak, timeout, out-of-memory or sanitizer
# report (never 77, which meson would count as skipped).  A failing input
# is copied into the current directory and dumped in hex into the log.
set -u

if [ $# -ne 3 ]; then
  echo "usage: $0 BINARY CORPUS_DIR SECONDS" >&2
  exit 1
fi
bin=$1 seeds=$2 secs=$3

tmp=$(mktemp -d "${TMPDIR:-/tmp}/beed-fuzz.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM
mkdir "$tmp/corpus" "$tmp/artifacts"
if [ -d "$seeds" ]; then
  cp -R "$seeds"/. "$tmp/corpus/" || exit 1
fi

# Sanitizer reports must stop the run, not scroll past.
: "${ASAN_OPTIONS:=abort_on_error=1:detect_leaks=1}"
: "${UBSAN_OPTIONS:=print_stacktrace=1:halt_on_error=1}"
export ASAN_OPTIONS UBSAN_OPTIONS

"$bin" -max_total_time="$secs" -timeout=5 -rss_limit_mb=2048 \
  -error_exitcode=1 -timeout_exitcode=1 -print_final_stats=1 \
  -artifact_prefix="$tmp/artifacts/" "$tmp/corpus" >"$tmp/log" 2>&1
rc=$?
cat "$tmp/log"

if grep -q -e 'runtime error:' -e '^SUMMARY: ' "$tmp/log"; then
  echo "run-fuzz: sanitizer report" >&2
  rc=1
fi
for f in "$tmp"/artifacts/*; do
  [ -f "$f" ] || continue
  keep="$(basename "$bin")-$(basename "$f")"
  cp "$f" "./$keep"
  echo "run-fuzz: failing input saved as $(pwd)/$keep:" >&2
  od -A x -t x1z -v "$f" | head -n 64 >&2
  rc=1
done
if [ "$rc" -ne 0 ]; then
  echo "run-fuzz: $(basename "$bin") FAILED" >&2
  exit 1
fi
exit 0
