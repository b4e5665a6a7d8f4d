#!/bin/bash
# test-deploy.sh: the ansible kit (tools/deploy) deploys a moderated swarm
# onto booted Debian 12 systems, as a user deploys it onto VMs.
#
# Three containers booted with systemd as PID 1 (systemd-nspawn --boot,
# from the Debian 12 root of tests/rootlib.sh, with sshd and python3)
# sit in three hosts of a WAN lab: a queen, a bee and a monitor host.
# ansible runs from a fourth lab host, the controller, over ssh, with
# every address inside the lab.  site.yml installs the controller's
# build, makes each node's key on the node, signs the tokens, writes the
# configs, starts beed@lab and trainmonitor@lab and waits for the swarm.
# Checks:
#   - site.yml ends well, and a second run changes nothing;
#   - `systemctl status beed@lab` on the queen shows beed's STATUS line;
#   - the dashboard served from the monitor host lists both bees, and its
#     /api/links their links;
#   - each node's key is on the node only (the controller has tokens and
#     the moderator key, no node key);
#   - each bee gives its lab address, repeats no warning, closed no
#     handshake;
#   - a SIGKILLed beed is restarted, resumes from its checkpoint and
#     averages again; `systemctl stop` ends it with status 0 within 25 s;
#   - renew.yml with every token due issues new ones and nothing drops;
#   - stop.yml stops every unit, and each bee wrote a checkpoint.
# Exits 77 (skipped) without root, network namespaces, systemd-nspawn,
# debootstrap or ansible.  About 90 s (the root, once: 1 to 3 min more).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/netlib.sh"
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$src/tests/lablib.sh"
skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root"
for c in systemd-nspawn debootstrap nsenter ansible-playbook ssh ssh-keygen curl; do
  command -v "$c" >/dev/null || skip "no $c (tools/setup)"
done

# ---- the cached root (tests/rootlib.sh) ---------------------------------------
. "$src/tests/rootlib.sh"
debian_root

cat >"$work/lab.conf" <<'EOF'
host ctrl r0
host queen r1
host bee r2
host mon r3
default rate 1gbit rtt 2ms
EOF
lab_up dptest "$work/lab.conf" ctrl queen bee mon

# ---- boot the three systems -------------------------------------------------------
mkdir -p "$work/ssh" "$work/state"
ssh-keygen -q -t ed25519 -N '' -f "$work/ssh/id"
install -m 0600 "$work/ssh/id.pub" "$work/ssh/authorized_keys"
declare -A nspawn leader
stop_systems() {
  local h
  for h in "${!leader[@]}"; do
    nsenter -t "${leader[$h]}" -a systemctl poweroff >/dev/null 2>&1 || true
  done
  for h in "${!nspawn[@]}"; do
    for _ in $(seq 1 100); do
      kill -0 "${nspawn[$h]}" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "${nspawn[$h]}" 2>/dev/null || true
  done
}
trap 'stop_systems; cleanup; wl down >/dev/null 2>&1 || true' EXIT
binds=(--bind-ro="$work/ssh/authorized_keys:/root/.ssh/authorized_keys"
  --bind-ro=/usr/share/datasets)
# A build with the CUDA backend finds its libraries there (RUNPATH).
[ -d /usr/local/cuda ] && binds+=(--bind-ro=/usr/local/cuda)
for h in queen bee mon; do
  timeout 900 systemd-nspawn -D "$root" --ephemeral --register=no \
    --keep-unit --boot --network-namespace-path="/run/netns/$lab-$h" \
    --machine="dp-$h-$$" "${binds[@]}" >"$work/$h.console" 2>&1 &
  nspawn[$h]=$!
done
inside() { local h=$1; shift; nsenter -t "${leader[$h]}" -a "$@"; }
t0=$SECONDS
for h in queen bee mon; do
  while [ -z "${leader[$h]:-}" ] && [ $((SECONDS - t0)) -lt 90 ]; do
    kill -0 "${nspawn[$h]}" 2>/dev/null ||
      fail "systemd-nspawn of $h ended: $(tail -5 "$work/$h.console")"
    for p in $(pgrep -P "${nspawn[$h]}") $(pgrep -P "$(pgrep -P \
      "${nspawn[$h]}" | head -1)" 2>/dev/null); do
      [ "$(cat "/proc/$p/comm" 2>/dev/null)" = systemd ] && leader[$h]=$p
    done
    [ -z "${leader[$h]:-}" ] && sleep 0.2
  done
  [ -n "${leader[$h]:-}" ] || fail "no systemd in $h after 90 s"
  state=
  until [[ $state =~ ^(running|degraded)$ ]] || [ $((SECONDS - t0)) -ge 150 ]; do
    state=$(inside "$h" timeout 30 systemctl is-system-running --wait 2>&1 ||
      true)
    [[ $state =~ ^(running|degraded)$ ]] || sleep 0.5
  done
  # Three systems booting at once on two cores: a unit of the boot's own
  # (utmp, user sessions) may time out; beed's do not depend on those.
  [[ $state =~ ^(running|degraded)$ ]] || fail "$h is '$state'"
  [ "$state" = running ] || echo "note: $h booted '$state':" \
    "$(inside "$h" systemctl --failed --no-pager --plain --no-legend | awk '{ print $1 }' | tr '\n' ' ')"
done
echo "three systems booted in $((SECONDS - t0)) s"

# ---- ansible from the controller's host -------------------------------------------
build=$(cd "$(dirname "$BEED")/.." && pwd)
cat >"$work/inventory.ini" <<EOF
[queen]
vm-queen ansible_host=${addr[queen]} label=r1 threads=1
[bees]
vm-bee ansible_host=${addr[bee]} label=r2 threads=1
[monitor]
vm-mon ansible_host=${addr[mon]}
[all:vars]
ansible_user=root
ansible_ssh_private_key_file=$work/ssh/id
ansible_python_interpreter=/usr/bin/python3
EOF
play() { # PLAYBOOK LOG [ARGS...]
  local p=$1 log=$2
  shift 2
  (cd "$src/tools/deploy" && wl exec ctrl -- env HOME="$work" \
    ANSIBLE_HOST_KEY_CHECKING=False ANSIBLE_NOCOLOR=1 \
    ANSIBLE_LOCAL_TEMP="$work/ansible-tmp" \
    ANSIBLE_SSH_CONTROL_PATH_DIR="$work/cp" \
    timeout 900 ansible-playbook -i "$work/inventory.ini" "$p" \
    -e "run_id=lab swarm=deploytest model=mlp target_batch_size=2048" \
    -e "deploy_dir=$work/state moderator_key=$work/state/moderator.key" \
    -e "beed_build_dir=$build swarm_wait_s=300" "$@") >"$log" 2>&1
}
recap_changed() { # LOG: the changes the recap counts, summed
  awk '/PLAY RECAP/ { r = 1 } r && /changed=/ {
    for (i = 1; i <= NF; i++) if ($i ~ /^changed=/) { split($i, a, "="); s += a[2] } }
    END { print s + 0 }' "$1"
}
# journals: each system's beed or trainmonitor journal, into $work/*.log
# (netlib's fail prints their ends).
journals() {
  local h
  for h in queen bee; do
    inside "$h" journalctl -u beed@lab --no-pager >"$work/$h-beed.log" 2>&1 || true
  done
  inside mon journalctl -u trainmonitor@lab --no-pager >"$work/mon-trainmonitor.log" 2>&1 || true
}
t1=$SECONDS
play site.yml "$work/site1.log" ||
  { journals; fail "site.yml: $(tail -30 "$work/site1.log")"; }
echo "site.yml deployed the swarm in $((SECONDS - t1)) s:" \
  "$(grep -o '[0-9]* bees in run lab; the dashboard: [^"]*' "$work/site1.log" |
    sed 's/token=.*/token=.../')"
play site.yml "$work/site2.log" ||
  fail "site.yml, again: $(tail -30 "$work/site2.log")"
n=$(recap_changed "$work/site2.log")
[ "$n" -eq 0 ] || fail "a second site.yml changed $n things:" \
  "$(grep -B3 '^changed:' "$work/site2.log" | head -40)"

# ---- what runs ----------------------------------------------------------------------
inside queen systemctl status beed@lab --no-pager >"$work/status.txt" 2>&1 || true
grep -qE 'Status: ".*epoch' "$work/status.txt" ||
  fail "no STATUS line in systemctl status: $(cat "$work/status.txt")"
token=$(cat "$work/state/http-token")
wl exec ctrl -- curl -sS --fail --max-time 5 \
  "http://${addr[mon]}:8080/api/snapshot?token=$token" >"$work/snap.json" ||
  fail "the dashboard's snapshot"
python3 - "$work/snap.json" <<'EOF' || fail "the snapshot: $(head -c 400 "$work/snap.json")"
import json, sys
x = json.load(open(sys.argv[1]))
assert sorted(p["label"] for p in x["peers"]) == ["r1", "r2"], x["peers"]
EOF
links=
for _ in $(seq 1 30); do # a links record every 10 s, read every 5 scrapes
  links=$(wl exec ctrl -- curl -sS --fail --max-time 5 \
    "http://${addr[mon]}:8080/api/links?token=$token") || fail "/api/links"
  python3 -c 'import json, sys
x = json.loads(sys.argv[1])
sys.exit(not (len(x["bees"]) == 2 and len(x["links"]) == 2 and
              all(l["rtt_ms"] for l in x["links"])))' "$links" && break
  sleep 2
done
python3 -c 'import json, sys; x = json.loads(sys.argv[1]); assert len(x["links"]) == 2' \
  "$links" || fail "/api/links has not both links: $links"
for h in queen bee; do
  inside "$h" test -s /var/lib/beed/lab/node.key || fail "$h has no key"
done
inside mon test -s /var/lib/trainmonitor/lab/node.key || fail "mon has no key"
if find "$work/state" -name '*.key' ! -name moderator.key | grep -q .; then
  fail "a node key on the controller: $(find "$work/state" -name '*.key')"
fi

# ---- the journal: where peers reach each bee, and no repeated warning ----------------
for h in queen bee; do
  inside "$h" journalctl -u beed@lab --no-pager -o cat >"$work/$h-journal.txt"
  grep -q "peers are given the address ${addr[$h]}:45555" "$work/$h-journal.txt" ||
    fail "$h does not give its lab address: $(grep 'peers are given' "$work/$h-journal.txt")"
  grep -E "closed during the handshake|connected to self" "$work/$h-journal.txt" |
    head -3 | grep -q . && fail "$h: handshakes closed or self-dials"
  # A warning line repeated more than 3 times (bursts are logged with a
  # count, once a minute at most).
  rep=$(grep '^WARN' "$work/$h-journal.txt" | sort | uniq -c | awk '$1 > 3' | head -3)
  [ -z "$rep" ] || fail "$h repeats warnings: $rep"
done

# ---- a spot VM's failures ---------------------------------------------------------------
# A beed killed: systemd restarts it (RestartSec=5), it resumes from its
# checkpoint and trains in the swarm again.
restarts=$(inside bee systemctl show -p NRestarts --value beed@lab)
t2=$SECONDS
inside bee systemctl kill --kill-whom=main -s SIGKILL beed@lab
back=
for _ in $(seq 1 120); do
  if [ "$(inside bee systemctl show -p NRestarts --value beed@lab)" -gt "$restarts" ] &&
    inside bee journalctl -u beed@lab --no-pager -o cat --since "-60s" |
    grep -q "resuming from checkpoints/" &&
    inside bee journalctl -u beed@lab --no-pager -o cat --since "-20s" |
    grep -qE "epoch [0-9]+ done: .*averaged in a group of 2"; then
    back=$((SECONDS - t2))
    break
  fi
  sleep 0.5
done
[ -n "$back" ] || fail "the killed bee is not back in the swarm within 60 s"
echo "SIGKILL: restarted, resumed from its checkpoint, averaging again after ${back} s"
# systemctl stop: exit 0 within 25 s, a checkpoint written.
t3=$SECONDS
inside bee systemctl stop beed@lab
took=$((SECONDS - t3))
[ "$took" -le 25 ] || fail "systemctl stop took $took s"
[ "$(inside bee systemctl show -p ExecMainStatus --value beed@lab)" = 0 ] ||
  fail "beed exited $(inside bee systemctl show -p ExecMainStatus --value beed@lab) on stop"
inside bee systemctl start beed@lab
echo "systemctl stop: exit 0 after ${took} s"

# ---- renewal and stop -----------------------------------------------------------------
before=$(inside bee systemctl show -p NRestarts --value beed@lab)
play renew.yml "$work/renew.log" -e token_renew_days=100000 ||
  fail "renew.yml: $(tail -30 "$work/renew.log")"
[ "$(grep -c 'changed: \[.*\]' "$work/renew.log")" -ge 3 ] ||
  fail "renew.yml renewed nothing: $(grep -E 'changed|ok:' "$work/renew.log" | head)"
sleep 7 # beed looks at its token file every 5 s
inside bee journalctl -u beed@lab --no-pager | grep -q "token .* renewed: role bee" ||
  fail "the bee did not take its new token: $(inside bee journalctl -u beed@lab --no-pager | tail -5)"
[ "$(inside bee systemctl show -p NRestarts --value beed@lab)" = "$before" ] ||
  fail "the bee restarted on a renewal"
play stop.yml "$work/stop.log" || fail "stop.yml: $(tail -30 "$work/stop.log")"
for h in queen bee; do
  [ "$(inside "$h" systemctl is-active beed@lab || true)" = inactive ] ||
    fail "beed@lab on $h is still $(inside "$h" systemctl is-active beed@lab)"
  inside "$h" sh -c 'ls /var/lib/beed/lab/checkpoints | grep -q .' ||
    fail "$h wrote no checkpoint"
done
echo "the kit deployed, changed nothing the second time, renewed the" \
  "tokens without a restart and stopped the run with checkpoints"
