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
