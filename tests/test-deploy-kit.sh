#!/bin/bash
# test-deploy-kit.sh: the ansible kit (tools/deploy) as ansible itself
# judges it, and its refusal of an inventory without a queen.
#
#   - every playbook passes `ansible-playbook --syntax-check` and
#     `ansible-lint` (the production profile, offline);
#   - site.yml run on an inventory without a [queen] group stops at its
#     first play, on the controller, with a message that says so, before
#     any host is contacted (the inventory's hosts are documentation
#     addresses nobody answers at).
# The kit run on booted Debian systems is tests/test-deploy.sh's.
# Exits 77 (skipped) without ansible-playbook or ansible-lint (Debian's
# ansible and ansible-lint; tools/setup installs them).  About 20 s.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
kit=$here/../tools/deploy
for c in ansible-playbook ansible-lint; do
  command -v "$c" >/dev/null || { echo "SKIP: no $c"; exit 77; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
export ANSIBLE_LOCAL_TEMP=$work/tmp ANSIBLE_HOME=$work/home
export ANSIBLE_LOCALHOST_WARNING=False ANSIBLE_NOCOLOR=1

cd "$kit"
for p in site.yml tokens.yml renew.yml revoke.yml stop.yml; do
  ansible-playbook -i inventory.example.ini --syntax-check "$p" \
    >"$work/syntax.log" 2>&1 || fail "$p: $(cat "$work/syntax.log")"
done
ansible-lint --offline --profile production site.yml tokens.yml renew.yml \
  revoke.yml stop.yml tasks/build.yml >"$work/lint.log" 2>&1 ||
  fail "ansible-lint: $(tail -30 "$work/lint.log")"

cat >"$work/no-queen.ini" <<'INI'
[bees]
bee-a ansible_host=192.0.2.1
[monitor]
mon ansible_host=192.0.2.2
INI
rc=0
timeout 120 ansible-playbook -i "$work/no-queen.ini" site.yml \
  -e "deploy_dir=$work/state" >"$work/no-queen.log" 2>&1 || rc=$?
[ "$rc" -ne 0 ] || fail "site.yml went on without a queen"
grep -q "the inventory needs a group \[queen\] with exactly one host" \
  "$work/no-queen.log" || fail "no message about the queen: $(tail -20 "$work/no-queen.log")"
grep -q "Install beed" "$work/no-queen.log" &&
  fail "site.yml went past its check: $(grep -n TASK "$work/no-queen.log")"
[ ! -e "$work/state" ] || fail "site.yml wrote $work/state before refusing"
echo "the kit passes ansible-lint (production) and its syntax check;" \
  "an inventory without a queen is refused before any host is contacted"
