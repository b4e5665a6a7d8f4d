#!/usr/bin/env bash
# test-beectl.sh: beectl end to end.  Keys, a token, its checks, a
# revocation, and the usage errors, all in a scratch directory.
# Needs BEECTL (set by tests/meson.build) to point at the beectl binary.
set -u

BEECTL=${BEECTL:?BEECTL must name the beectl binary}
"$BEECTL" --version >/dev/null || { echo "cannot run $BEECTL" >&2; exit 1; }
dir=$(mktemp -d /tmp/beed-test-beectl-XXXXXX) || exit 1
trap 'rm -rf "$dir"' EXIT
cd "$dir" || exit 1

fails=0
fail() {
  echo "FAIL: $*" >&2
  fails=$((fails + 1))
}

# run WANT_RC CMD...: runs beectl, keeps stdout in $out and stderr in $err.
run() {
  local want=$1
  shift
  "$BEECTL" "$@" >out.txt 2>err.txt
  local rc=$?
  out=$(cat out.txt)
  err=$(cat err.txt)
  if [ "$rc" -ne "$want" ]; then
    fail "beectl $* exited $rc, want $want; stdout: $out; stderr: $err"
  fi
}

expect_out() { # PATTERN (grep -E on stdout)
  grep -Eq -- "$1" out.txt || fail "stdout lacks /$1/: $out"
}
expect_err() { # PATTERN (grep -E on stderr)
  grep -Eq -- "$1" err.txt || fail "stderr lacks /$1/: $err"
}
field() { # NAME: the value of the first "NAME value" line of stdout
  awk -v k="$1" '$1 == k { print $2; exit }' out.txt
}

hex64='^[0-9a-f]{64}$'

# --- help and version
run 0 --help
expect_out '^usage: beectl'
run 0 --version
expect_out '^beectl [0-9]+\.[0-9]+'
run 2
expect_err 'usage: beectl'

# --- keys
run 0 keygen --moderator --out mod.key
expect_out '^public-key [0-9a-f]{64}$'
expect_out '^peer-id [0-9a-f]{40}$'
expect_out 'moderator'
mod=$(field public-key)
[[ $mod =~ $hex64 ]] || fail "moderator key '$mod'"
[ "$(stat -c %a mod.key)" = 600 ] || fail "mod.key mode $(stat -c %a mod.key)"
grep -Eq '^beed-secret-key-v1 [0-9a-f]{64}$' mod.key || fail "mod.key format"

run 0 keygen --out peer.key
peer=$(field public-key)
peer_id=$(field peer-id)
run 0 keygen --out other.key
other=$(field public-key)
[ "$peer" != "$mod" ] && [ "$peer" != "$other" ] || fail "keys repeat"

run 0 pubkey --key peer.key
[ "$(field public-key)" = "$peer" ] || fail "pubkey disagrees with keygen"
[ "$(field peer-id)" = "$peer_id" ] || fail "peer-id disagrees with keygen"

# keygen never overwrites
cp peer.key peer.key.bak
run 1 keygen --out peer.key
expect_err '^beectl: peer.key: .*exists'
cmp -s peer.key peer.key.bak || fail "keygen overwrote peer.key"

# a readable key file is refused
cp mod.key open.key
chmod 644 open.key
run 1 pubkey --key open.key
expect_err '^beectl: open.key: .*accessible to group or others'
run 1 pubkey --key missing.key
expect_err '^beectl: missing.key: '

# --- tokens
run 0 token issue --moderator-key mod.key --swarm test-swarm --peer "$peer" \
  --role bee --expires 30d --out peer.token
grep -Eq '^beed-token-v1 [A-Za-z0-9+/]+=*$' peer.token ||
  fail "token file format: $(cat peer.token)"

run 0 token show peer.token
expect_out '^swarm test-swarm$'
expect_out "^peer $peer\$"
expect_out '^role bee$'
expect_out "^moderator $mod\$"
expect_out '^issued [0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:]{8}Z$'
expect_out '^expires [0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:]{8}Z$'
grep -q verify out.txt && fail "show without --moderator verified"

run 0 token show peer.token --moderator "$mod" --swarm test-swarm \
  --peer "$peer"
expect_out '^verify ok$'
run 0 token show peer.token --moderator "$mod"
expect_out '^verify ok$'

run 1 token show peer.token --moderator "$other" --swarm test-swarm \
  --peer "$peer"
expect_out '^verify failed: .*another moderator'
run 1 token show peer.token --moderator "$mod" --swarm other-swarm
expect_out '^verify failed: .*another swarm'
run 1 token show peer.token --moderator "$mod" --peer "$other"
expect_out '^verify failed: .*another peer'

run 0 token issue --moderator-key mod.key --swarm test-swarm --peer "$peer" \
  --role=monitor --expires=90m --out mon.token
run 0 token show mon.token
expect_out '^role monitor$'

# a token tampered with no longer verifies
payload=$(sed -n 's/^beed-token-v1 //p' peer.token)
c=${payload:30:1}
[ "$c" = A ] && r=B || r=A
echo "beed-token-v1 ${payload:0:30}$r${payload:31}" >bad.token
run 1 token show bad.token --moderator "$mod"
expect_out '^verify failed: .*signature'
echo 'beed-token-v1 !!!' >junk.token
run 1 token show junk.token
expect_err '^beectl: junk.token: '

# --- revocation
run 0 revoke --moderator-key mod.key --swarm test-swarm --peer "$peer" \
  --list revoked.list
expect_out '^seq 1$'
grep -Eq '^beed-revocation-v1 ' revoked.list || fail "list file format"
run 0 revoke --moderator-key mod.key --swarm test-swarm --peer "$other" \
  --list revoked.list
expect_out '^seq 2$'
expect_out '^keys 2$'

run 0 revocation show revoked.list --moderator "$mod" --swarm test-swarm
expect_out '^seq 2$'
expect_out "^revoked $peer\$"
expect_out "^revoked $other\$"
expect_out '^keys 2$'
run 1 revocation show revoked.list --moderator "$other" --swarm test-swarm
expect_err '^beectl: revoked.list: '
run 1 revocation show revoked.list --moderator "$mod" --swarm other-swarm
expect_err '^beectl: revoked.list: '
# another moderator cannot extend the list
run 1 revoke --moderator-key other.key --swarm test-swarm --peer "$mod" \
  --list revoked.list

# --- usage errors name the flag
run 2 keygen
expect_err 'missing --out'
run 2 keygen --out x.key --bogus
expect_err "unknown flag '--bogus'"
run 2 keygen --out
expect_err '--out needs a value'
run 2 pubkey --key a --key b
expect_err '--key given twice'
run 2 token issue --moderator-key mod.key --swarm s --peer nothex \
  --role bee --expires 1d --out t
expect_err '--peer'
run 2 token issue --moderator-key mod.key --swarm s --peer "$peer" \
  --role queen --expires 1d --out t
expect_err '--role'
for d in 0d 10 1w -1d 1.5h 36525d 99999999999999999999s d 1dd; do
  run 2 token issue --moderator-key mod.key --swarm s --peer "$peer" \
    --role bee --expires "$d" --out t
  expect_err '--expires'
done
long=$(printf 's%.0s' $(seq 65))
run 2 token issue --moderator-key mod.key --swarm "$long" --peer "$peer" \
  --role bee --expires 1d --out t
expect_err '--swarm'
[ -e t ] && fail "a refused issue wrote a token"
run 2 token show
expect_err 'FILE'
run 2 token show peer.token --swarm test-swarm
expect_err '--swarm needs --moderator'
run 2 token show peer.token --moderator abc
expect_err '--moderator'
run 2 token frobnicate
expect_err "unknown token command 'frobnicate'"
run 2 revocation show revoked.list --moderator "$mod"
expect_err 'missing --swarm'
run 2 revoke --moderator-key mod.key --swarm s --peer "$peer"
expect_err 'missing --list'
run 2 frobnicate
expect_err "unknown command 'frobnicate'"

if [ "$fails" -ne 0 ]; then
  echo "$fails check(s) failed" >&2
  exit 1
fi
echo ok
