#!/bin/bash
# test-deploy.sh: the ansible kit (tools/deploy) deploys a moderated swarm
# onto booted Debian 12 systems, as a user deploys it onto VMs.
#
#   test-deploy.sh            three systems in a lab of 2 ms links (CI)
#   test-deploy.sh --long     six, in the four-continent lab (long suite)
#
# Containers booted with systemd as PID 1 (systemd-nspawn --boot, from
# the Debian 12 root of tests/rootlib.sh, with sshd and python3) sit in
# hosts of a WAN lab: a queen, a bee and a monitor host; with --long a
# queen and three bees, one on each continent of
# tools/wanlab/configs/4continents-stock.conf (its rates, round trips and
# stock TCP buffers), a monitor host, and a late bee that the inventory
# gets only at the end.  The CUDA libraries are not in them: a build with
# the CUDA module trains on their CPUs, from the same binaries.  ansible
# runs from one more lab host, the controller, over ssh, with every
# address inside the lab.  site.yml installs the controller's build,
# makes each node's key on the node, signs the tokens, writes the
# configs, starts beed@lab and trainmonitor@lab and waits for the swarm.
# Checks:
#   - site.yml ends well, and a second run changes nothing;
#   - each bee says in one line that it trains on the CPU, and why (the
#     CUDA module's libraries missing, or no module);
#   - the bees average in one group of all, to one parameter hash;
#   - `systemctl status beed@lab` on the queen shows beed's STATUS line;
#   - the dashboard served from the monitor host lists the bees, and its
#     /api/links every pair's link;
#   - each node's key is on the node only (the controller has tokens and
#     the moderator key, no node key);
#   - each bee gives its lab address, repeats no warning, closed no
#     handshake;
#   - a SIGKILLed beed is restarted, resumes from its checkpoint and
#     averages again; `systemctl stop` ends it with status 0 within 25 s;
#   - renew.yml with every token due issues new ones and nothing drops;
#   - with --long, a spot VM's end: a bee's system powered off at once
#     (its network gone silent): the others average on without it within
#     a round's deadline; then the queen's, for good: a bee added to the
#     inventory and deployed alone joins through the other bees, loads
#     the swarm's state and averages with them;
#   - stop.yml stops every unit, and each bee wrote a checkpoint.
# Exits 77 (skipped) without root, network namespaces, systemd-nspawn,
# debootstrap or ansible.  About 75 s; with --long about 10 min (the root,
# once: 1 to 3 min more).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/netlib.sh"
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$src/tests/lablib.sh"
skip() { echo "SKIP: $*"; exit 77; }
long=
case ${1:-} in
--long) long=1 ;;
'') ;;
*) echo "usage: $0 [--long]" >&2; exit 2 ;;
esac
[ "$(id -u)" = 0 ] || skip "needs root"
for c in systemd-nspawn debootstrap nsenter ansible-playbook ssh ssh-keygen curl; do
  command -v "$c" >/dev/null || skip "no $c (tools/setup)"
done

# ---- the cached root (tests/rootlib.sh) ---------------------------------------
. "$src/tests/rootlib.sh"
debian_root

# bees: the inventory's queen and bees (the first is the queen); victim:
# the bee killed and stopped; systems: every container.
# target: the run's batch.  Across continents an epoch must outlast the
# ~2 s its progress takes through the DHT (beed warns otherwise): the mlp
# gathers about 150,000 samples/s on four bees here.
if [ -z "$long" ]; then
  bees=(queen bee) victim=bee systems=(queen bee mon) target=2048
  cat >"$work/lab.conf" <<'EOF'
host ctrl r0
host queen r1
host bee r2
host mon r3
default rate 1gbit rtt 2ms
EOF
else
  bees=(queen bee1 bee2 bee3) victim=bee1 systems=(queen bee1 bee2 bee3 mon late)
  target=1048576
  { sed -n '/^between\|^tcp/p' "$src/tools/wanlab/configs/4continents-stock.conf"
    cat <<'EOF'
host ctrl us
host queen us
host bee1 eu
host bee2 asia
host bee3 aus
host mon us
host late eu
between us us rate 1gbit rtt 2ms
between eu eu rate 1gbit rtt 2ms
EOF
  } >"$work/lab.conf"
fi
lab_up dptest "$work/lab.conf" ctrl "${systems[@]}"

# ---- boot the systems ---------------------------------------------------------------
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
for h in "${systems[@]}"; do
  timeout 900 systemd-nspawn -D "$root" --ephemeral --register=no \
    --keep-unit --boot --network-namespace-path="/run/netns/$lab-$h" \
    --machine="dp-$h-$$" "${binds[@]}" >"$work/$h.console" 2>&1 &
  nspawn[$h]=$!
done
inside() { local h=$1; shift; nsenter -t "${leader[$h]}" -a "$@"; }
t0=$SECONDS
for h in "${systems[@]}"; do
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
  until [[ $state =~ ^(running|degraded)$ ]] || [ $((SECONDS - t0)) -ge 240 ]; do
    state=$(inside "$h" timeout 30 systemctl is-system-running --wait 2>&1 ||
      true)
    [[ $state =~ ^(running|degraded)$ ]] || sleep 0.5
  done
  # Systems booting at once on two cores: a unit of the boot's own
  # (utmp, user sessions) may time out; beed's do not depend on those.
  [[ $state =~ ^(running|degraded)$ ]] || fail "$h is '$state'"
  [ "$state" = running ] || echo "note: $h booted '$state':" \
    "$(inside "$h" systemctl --failed --no-pager --plain --no-legend | awk '{ print $1 }' | tr '\n' ' ')"
done
echo "${#systems[@]} systems booted in $((SECONDS - t0)) s"

# ---- ansible from the controller's host -------------------------------------------
build=$(cd "$(dirname "$BEED")/.." && pwd)
# inventory [EXTRA-BEE]: the inventory, with EXTRA-BEE among the bees.
inventory() {
  local h
  {
    echo "[queen]"
    echo "vm-queen ansible_host=${addr[queen]} label=queen threads=1"
    echo "[bees]"
    for h in "${bees[@]:1}" "$@"; do
      echo "vm-$h ansible_host=${addr[$h]} label=$h threads=1"
    done
    echo "[monitor]"
    echo "vm-mon ansible_host=${addr[mon]}"
    echo "[all:vars]"
    echo "ansible_user=root"
    echo "ansible_ssh_private_key_file=$work/ssh/id"
    echo "ansible_python_interpreter=/usr/bin/python3"
  } >"$work/inventory.ini"
}
inventory
play() { # PLAYBOOK LOG [ARGS...]
  local p=$1 log=$2
  shift 2
  (cd "$src/tools/deploy" && wl exec ctrl -- env HOME="$work" \
    ANSIBLE_HOST_KEY_CHECKING=False ANSIBLE_NOCOLOR=1 \
    ANSIBLE_LOCAL_TEMP="$work/ansible-tmp" \
    ANSIBLE_SSH_CONTROL_PATH_DIR="$work/cp" \
    timeout 900 ansible-playbook -i "$work/inventory.ini" "$p" \
    -e "run_id=lab swarm=deploytest model=mlp target_batch_size=$target" \
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
  for h in "${bees[@]}" late; do
    [ -n "${leader[$h]:-}" ] || continue
    inside "$h" journalctl -u beed@lab --no-pager >"$work/$h-beed.log" 2>&1 || true
  done
  inside mon journalctl -u trainmonitor@lab --no-pager >"$work/mon-trainmonitor.log" 2>&1 || true
}
# From here on a failure shows the systems' journals too.
eval "netlib_$(declare -f fail)"
fail() { journals; netlib_fail "$@"; }
t1=$SECONDS
play site.yml "$work/site1.log" || fail "site.yml: $(tail -30 "$work/site1.log")"
echo "site.yml deployed the swarm in $((SECONDS - t1)) s:" \
  "$(grep -o '[0-9]* bees in run lab; the dashboard: [^"]*' "$work/site1.log" |
    sed 's/token=.*/token=.../')"
play site.yml "$work/site2.log" ||
  fail "site.yml, again: $(tail -30 "$work/site2.log")"
n=$(recap_changed "$work/site2.log")
[ "$n" -eq 0 ] || fail "a second site.yml changed $n things:" \
  "$(grep -B3 '^changed:' "$work/site2.log" | head -40)"

# ---- what runs ----------------------------------------------------------------------
n=${#bees[@]}
inside queen systemctl status beed@lab --no-pager >"$work/status.txt" 2>&1 || true
grep -qE 'Status: ".*epoch' "$work/status.txt" ||
  fail "no STATUS line in systemctl status: $(cat "$work/status.txt")"
token=$(cat "$work/state/http-token")
wl exec ctrl -- curl -sS --fail --max-time 5 \
  "http://${addr[mon]}:8080/api/snapshot?token=$token" >"$work/snap.json" ||
  fail "the dashboard's snapshot"
python3 - "$work/snap.json" "${bees[@]}" <<'EOF' || fail "the snapshot: $(head -c 400 "$work/snap.json")"
import json, sys
x = json.load(open(sys.argv[1]))
assert sorted(p["label"] for p in x["peers"]) == sorted(sys.argv[2:]), x["peers"]
EOF
links=
for _ in $(seq 1 60); do # a links record every 10 s, read every 5 scrapes
  links=$(wl exec ctrl -- curl -sS --fail --max-time 5 \
    "http://${addr[mon]}:8080/api/links?token=$token") || fail "/api/links"
  python3 -c 'import json, sys
x, n = json.loads(sys.argv[1]), int(sys.argv[2])
sys.exit(not (len(x["bees"]) == n and len(x["links"]) == n * (n - 1) and
              all(l["rtt_ms"] for l in x["links"])))' "$links" "$n" && break
  sleep 2
done
python3 -c 'import json, sys
x, n = json.loads(sys.argv[1]), int(sys.argv[2])
assert len(x["links"]) == n * (n - 1)' "$links" "$n" ||
  fail "/api/links has not every pair's link: $links"
for h in "${bees[@]}"; do
  inside "$h" test -s /var/lib/beed/lab/node.key || fail "$h has no key"
done
inside mon test -s /var/lib/trainmonitor/lab/node.key || fail "mon has no key"
if find "$work/state" -name '*.key' ! -name moderator.key | grep -q .; then
  fail "a node key on the controller: $(find "$work/state" -name '*.key')"
fi

# ---- one binary for every host: no CUDA libraries here, so the CPU -----------------
for h in "${bees[@]}"; do
  dev=$(inside "$h" journalctl -u beed@lab --no-pager -o cat | grep -m1 'train: device: ' || true)
  if [ -f "$build/trainer/beed-cuda.so" ]; then
    inside "$h" test -f /usr/local/lib/beed/beed-cuda.so ||
      fail "$h: the kit did not install the CUDA module"
    want='using the CPU, .*no usable CUDA device: the CUDA backend /usr/local/lib/beed/beed-cuda.so cannot load: .*cannot open shared object file'
  else
    want='using the CPU, .*no usable CUDA device: this build has no CUDA backend'
  fi
  [[ $dev =~ $want ]] || fail "$h's device line: '$dev'"
done
echo "each bee: ${dev#*train: }"

# ---- one swarm: every bee averages in one group, to one parameter hash ---------------
# together N [HOST...]: the first epoch after those already done (as
# $after, an epoch) that every HOST ended averaged in a group of N, to
# the same parameters; "" when there is none yet.
together() {
  local k=$1 h
  shift
  for h in "$@"; do
    inside "$h" journalctl -u beed@lab --no-pager -o cat |
      sed -nE "s/.*train: epoch ([0-9]+) done: .*averaged in a group of $k .*, parameters ([0-9a-f]+)$/\1 \2/p" |
      sort -u
  done | awk -v n=$# -v after="${after:-0}" '$1 > after { c[$1 " " $2]++ }
    END { for (e in c) if (c[e] == n) print e }' | sort -n | head -1
}
wait_together() { # SECONDS N HOST...: together's line, or fail
  local until=$((SECONDS + $1)) got h
  shift
  while :; do
    got=$(together "$@")
    [ -n "$got" ] && { echo "$got"; return; }
    [ "$SECONDS" -lt "$until" ] || break
    sleep 1
  done
  # Into the failure's message: where each of them is.
  for h in "${@:2}"; do
    echo "$h: $(inside "$h" journalctl -u beed@lab --no-pager -o cat |
      grep 'train: epoch .* done' | tail -1)" >&2
  done
  return 1
}
after=0
got=$(wait_together 240 "$n" "${bees[@]}") ||
  fail "the $n bees never averaged one epoch in a group of $n to one hash"
echo "one swarm: epoch ${got% *} averaged by all $n bees, parameters ${got#* }"

# ---- the journal: where peers reach each bee, and no repeated warning ----------------
for h in "${bees[@]}"; do
  inside "$h" journalctl -u beed@lab --no-pager -o cat >"$work/$h-journal.txt"
  grep -q "peers are given the address ${addr[$h]}:45555" "$work/$h-journal.txt" ||
    fail "$h does not give its lab address: $(grep 'peers are given' "$work/$h-journal.txt")"
  bad=$(grep -E "closed during the handshake|connected to self" "$work/$h-journal.txt" |
    head -3 || true)
  [ -z "$bad" ] || fail "$h: handshakes closed or self-dials: $bad"
  # A warning line repeated more than 3 times (bursts are logged with a
  # count, once a minute at most).
  rep=$(grep '^WARN' "$work/$h-journal.txt" | sort | uniq -c | awk '$1 > 3' | head -3 ||
    true)
  [ -z "$rep" ] || fail "$h repeats warnings: $rep"
done

# ---- a spot VM's failures ---------------------------------------------------------------
# A beed killed: systemd restarts it (RestartSec=5), it resumes from its
# checkpoint and trains in the swarm again.
restarts=$(inside "$victim" systemctl show -p NRestarts --value beed@lab)
t2=$SECONDS
inside "$victim" systemctl kill --kill-whom=main -s SIGKILL beed@lab
back=
for _ in $(seq 1 240); do
  if [ "$(inside "$victim" systemctl show -p NRestarts --value beed@lab)" -gt "$restarts" ] &&
    inside "$victim" journalctl -u beed@lab --no-pager -o cat --since "-90s" |
    grep -q "resuming from checkpoints/" &&
    inside "$victim" journalctl -u beed@lab --no-pager -o cat --since "-20s" |
    grep -qE "epoch [0-9]+ done: .*averaged in a group of [2-9]"; then
    back=$((SECONDS - t2))
    break
  fi
  sleep 0.5
done
[ -n "$back" ] || fail "the killed bee is not back in the swarm within 120 s"
echo "SIGKILL: restarted, resumed from its checkpoint, averaging again after ${back} s"
# systemctl stop: exit 0 within 25 s, a checkpoint written.
t3=$SECONDS
inside "$victim" systemctl stop beed@lab
took=$((SECONDS - t3))
[ "$took" -le 25 ] || fail "systemctl stop took $took s"
[ "$(inside "$victim" systemctl show -p ExecMainStatus --value beed@lab)" = 0 ] ||
  fail "beed exited $(inside "$victim" systemctl show -p ExecMainStatus --value beed@lab) on stop"
inside "$victim" systemctl start beed@lab
echo "systemctl stop: exit 0 after ${took} s"

# ---- renewal ------------------------------------------------------------------------------
before=$(inside "$victim" systemctl show -p NRestarts --value beed@lab)
play renew.yml "$work/renew.log" -e token_renew_days=100000 ||
  fail "renew.yml: $(tail -30 "$work/renew.log")"
[ "$(grep -c 'changed: \[.*\]' "$work/renew.log")" -ge $((n + 1)) ] ||
  fail "renew.yml renewed nothing: $(grep -E 'changed|ok:' "$work/renew.log" | head)"
# beed looks at its token file every 5 s.
renewed=
for _ in $(seq 1 60); do
  inside "$victim" journalctl -u beed@lab --no-pager | grep -q "token .* renewed: role bee" &&
    { renewed=1; break; }
  sleep 0.5
done
[ -n "$renewed" ] ||
  fail "the bee did not take its new token within 30 s: $(inside "$victim" journalctl -u beed@lab --no-pager | grep -i token | tail -5)"
[ "$(inside "$victim" systemctl show -p NRestarts --value beed@lab)" = "$before" ] ||
  fail "the bee restarted on a renewal"

# ---- with --long: systems that vanish ---------------------------------------------------
live=("${bees[@]}")
if [ -n "$long" ]; then
  # power_off HOST: the plug pulled: the host's network goes silent and
  # its PID 1 is killed, and every process of the system with it.
  power_off() {
    local h=$1 d
    for d in $(wl exec "$h" -- ip -o link show | awk -F': ' '{ sub(/@.*/, "", $2); print $2 }'); do
      [ "$d" = lo ] || wl exec "$h" -- ip link set dev "$d" down
    done
    kill -KILL "${leader[$h]}"
    for _ in $(seq 1 100); do
      kill -0 "${nspawn[$h]}" 2>/dev/null || break
      sleep 0.1
    done
    unset "leader[$h]" "nspawn[$h]"
    local l=() x
    for x in "${live[@]}"; do [ "$x" = "$h" ] || l+=("$x"); done
    live=("${l[@]}")
  }
  # A bee's system off: the other three average on without it.  The
  # round under way when it went ends by its deadline (30 s) at the
  # latest; the test allows that plus an epoch.
  after=$(together "$n" "${bees[@]}" | cut -d' ' -f1)
  after=${after:-0}
  for h in "${live[@]}"; do
    e=$(inside "$h" journalctl -u beed@lab --no-pager -o cat |
      sed -nE 's/.*train: epoch ([0-9]+) done: .*/\1/p' | tail -1)
    [ "${e:-0}" -gt "$after" ] && after=$e
  done
  t4=$SECONDS
  power_off bee3
  got=$(wait_together 90 $((n - 1)) "${live[@]}") ||
    fail "after bee3's system went off, the others did not average on in a group of $((n - 1))"
  echo "bee3's system off: ${live[*]} averaged epoch ${got% *} in a group of" \
    "$((n - 1)) after $((SECONDS - t4)) s"

  # The queen's system off for good; a bee added to the inventory joins
  # through the bees that are left.
  after=${got% *}
  power_off queen
  got=$(wait_together 90 $((n - 2)) "${live[@]}") ||
    fail "after the queen's system went off, ${live[*]} did not average on"
  after=${got% *}
  inventory late
  t5=$SECONDS
  play site.yml "$work/site-late.log" --limit 'localhost,vm-late' ||
    fail "site.yml for the late bee: $(tail -30 "$work/site-late.log")"
  live+=(late)
  got=$(wait_together 240 "${#live[@]}" "${live[@]}") || {
    inside late journalctl -u beed@lab --no-pager -o cat >"$work/late-journal.log" || true
    fail "the late bee did not average with ${live[*]}"
  }
  echo "the queen's system off for good: a late bee deployed alone joined" \
    "through the others and averaged epoch ${got% *} with them after $((SECONDS - t5)) s"
  inside late journalctl -u beed@lab --no-pager -o cat >"$work/late-journal.txt"
  bad=$(grep -E "closed during the handshake|connected to self" "$work/late-journal.txt" |
    head -3 || true)
  [ -z "$bad" ] || fail "late: handshakes closed or self-dials: $bad"
fi

# ---- stop ---------------------------------------------------------------------------------
limit=()
[ -n "$long" ] && limit=(--limit 'all:!vm-queen:!vm-bee3')
play stop.yml "$work/stop.log" "${limit[@]}" || fail "stop.yml: $(tail -30 "$work/stop.log")"
for h in "${live[@]}"; do
  [ "$(inside "$h" systemctl is-active beed@lab || true)" = inactive ] ||
    fail "beed@lab on $h is still $(inside "$h" systemctl is-active beed@lab)"
  inside "$h" sh -c 'ls /var/lib/beed/lab/checkpoints | grep -q .' ||
    fail "$h wrote no checkpoint"
done
echo "the kit deployed, changed nothing the second time, renewed the" \
  "tokens without a restart and stopped the run with checkpoints"
