#!/bin/bash
# test-systemd-unit.sh: tools/systemd/beed@.service passes
# `systemd-analyze verify` (as beed@test.service, with beed's path pointed
# at the built binary), alone and with the GPU drop-in beed-gpu.conf; and
# the unit itself names no supplementary group (a group the host lacks
# stops it from starting: status=216/GROUP).  Exits 77 (skipped) where
# systemd-analyze is missing.
set -u
dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/tools/systemd
if grep -q '^SupplementaryGroups=' "$dir/beed@.service"; then
  echo "FAIL: beed@.service names supplementary groups; they belong in beed-gpu.conf"
  exit 1
fi
grep -q '^SupplementaryGroups=video render$' "$dir/beed-gpu.conf" ||
  { echo "FAIL: beed-gpu.conf does not add the GPU groups"; exit 1; }
command -v systemd-analyze >/dev/null || { echo "no systemd-analyze"; exit 77; }
BEED=$(realpath "${BEED:?set BEED to the beed binary}")
src=$dir/beed@.service
tmp=$(mktemp -d "${TMPDIR:-/tmp}/test-systemd-unit.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
sed "s#/usr/local/bin/beed#$BEED#" "$src" >"$tmp/beed@test.service"
mkdir "$tmp/beed@test.service.d"
cp "$dir/beed-gpu.conf" "$tmp/beed@test.service.d/gpu.conf"
out=$(cd "$tmp" && SYSTEMD_LOG_LEVEL=warning systemd-analyze verify \
  --man=no "$tmp/beed@test.service" 2>&1)

# Lines about the host's own units are not ours to judge.
ours=$(grep -F 'beed@' <<<"$out" || true)
if [ -n "$ours" ]; then
  echo "FAIL: systemd-analyze verify:"
  echo "$out"
  exit 1
fi
echo "beed@.service verifies${out:+ (host notes: $(wc -l <<<"$out") lines)}"
