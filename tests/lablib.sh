# lablib.sh: what a test in the WAN lab (tools/wanlab) needs, or a skip.
# Source it after `set -euo pipefail`.
#
# lab_require [--delayer] [TOOL...]: root, network namespaces, ip, tc,
# iptables and the TOOLs, else the test exits 77 (skipped) saying which
# is missing.  With --delayer, WANLAB_DELAYER too (meson sets it, empty
# where the delayer is not built; run by hand, the newest build's),
# exported.
lab_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

lab_skip() {
  echo "SKIP: $*"
  exit 77
}

lab_require() {
  local delayer=0 t
  if [ "${1:-}" = --delayer ]; then
    delayer=1
    shift
  fi
  [ "$(id -u)" = 0 ] || lab_skip "needs root for network namespaces"
  unshare -n true 2>/dev/null || lab_skip "cannot create network namespaces here"
  for t in ip tc "$@"; do
    command -v "$t" >/dev/null || lab_skip "$t is not installed (tools/setup)"
  done
  command -v iptables-legacy >/dev/null || command -v iptables >/dev/null ||
    lab_skip "iptables is not installed (tools/setup)"
  [ "$delayer" = 1 ] || return 0
  if [ -z "${WANLAB_DELAYER+set}" ]; then
    # shellcheck disable=SC2012 # our own build directories
    WANLAB_DELAYER=$(ls -t "$lab_root"/build*/tools/wanlab/wanlab-delayer 2>/dev/null | head -n1 || true)
  fi
  [ -x "${WANLAB_DELAYER:-}" ] ||
    lab_skip "wanlab-delayer is not built (needs libnetfilter-queue-dev, tools/setup)"
  export WANLAB_DELAYER
}

# wl ARGS...: tools/wanlab/wanlab on the lab $lab.
wl() { "$lab_root/tools/wanlab/wanlab" --name "$lab" "$@"; }

# lab_up NAME CONFIG HOST...: for a test that runs beeds in the lab (after
# netlib.sh, whose work, fail and cleanup it uses): the lab NAME (a fixed
# name: a crashed earlier run is cleaned by the next) up from CONFIG, and
# down again at exit; addr[HOST] gets each HOST's address.  Skips (77) as
# lab_require --delayer.
lab_up() {
  lab=$1
  local conf=$2 h a
  shift 2
  lab_require --delayer
  unset WANLAB_NAME
  trap 'cleanup; wl down >/dev/null 2>&1 || true' EXIT
  wl down >/dev/null 2>&1 || true
  wl up "$conf" >"$work/up.log" 2>&1 ||
    fail "wanlab up failed: $(cat "$work/up.log")"
  declare -gA addr
  while read -r h _ a; do addr[$h]=$a; done <"$work/up.log"
  for h in "$@"; do
    [ -n "${addr[$h]:-}" ] || fail "wanlab up named no address for $h"
  done
}
