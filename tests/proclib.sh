# proclib.sh: what the tests that run beed as a program without a network
# share.  Source it after `set -u`: it makes $tmp (a fresh directory,
# removed on exit with every process in $pids killed), and fail MESSAGE,
# which prints the message and the logs in $tmp and exits 1 (a test may
# define its own fail after sourcing).
BEED=$(realpath "${BEED:?set BEED to the beed binary}")
tmp=$(mktemp -d "${TMPDIR:-/tmp}/$(basename "$0" .sh).XXXXXX")
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  for f in "$tmp"/*.log "$tmp"/*.got; do
    [ -f "$f" ] && { echo "--- $f" >&2; cat "$f" >&2; }
  done
  exit 1
}
