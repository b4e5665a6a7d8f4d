#!/bin/bash
# test-deploy-unit.sh: beed@.service on a booted Debian 12 system, with
# systemd as PID 1 (systemd-nspawn --boot), as on a spot VM.
#
# The system is the minimal Debian 12 root of tests/rootlib.sh, made once
# and kept outside the repository.  Each run boots a throwaway copy of it
# (--ephemeral) without a network,
# with the built beed, the unit and a config bound in, and checks what
# the unit promises:
#   - it starts on a host without the GPU groups (a minimal Debian 12 has
#     no `render` group: a unit that named it failed with 216/GROUP);
#   - Type=notify: systemctl shows beed's STATUS line;
#   - SIGKILL: systemd restarts it after RestartSec, and it resumes from
#     its checkpoint;
#   - systemctl stop: exit 0 well within TimeoutStopSec, a checkpoint
#     written.
# Exits 77 (skipped) without root, systemd-nspawn or debootstrap, or when
# the root cannot be made (no archive).  BEED: the beed binary.
set -u
BEED=$(realpath "${BEED:?set BEED to the beed binary}")
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
[ "$(id -u)" = 0 ] || { echo "not root"; exit 77; }
for c in systemd-nspawn debootstrap nsenter; do
  command -v "$c" >/dev/null || { echo "no $c"; exit 77; }
done
data=/usr/share/datasets/fashion-mnist
[ -d "$data" ] || { echo "no $data"; exit 77; }

# ---- the cached root (tests/rootlib.sh) -------------------------------------
. "$src/tests/rootlib.sh"
debian_root

# ---- the run's files -----------------------------------------------------------
tmp=$(mktemp -d) # in $TMPDIR, else /tmp
cat >"$tmp/lab.conf" <<'EOF'
open = true
listen = 127.0.0.1:45555
status-interval = 5
control = beed.sock
run-id = boot
model = mlp
target-batch-size = 512
batch-size = 64
threads = 1
eval-every = 0
checkpoint-dir = checkpoints
checkpoint-every = 1
keep-checkpoints = 3
resume = true
EOF
binds=(--bind-ro="$BEED:/usr/local/bin/beed"
  --bind-ro="$src/tools/systemd/beed@.service:/etc/systemd/system/beed@.service"
  --bind-ro="$tmp/lab.conf:/etc/beed/lab.conf"
  --bind-ro=/usr/share/datasets)
# A build with the CUDA backend finds its libraries there (RUNPATH).
[ -d /usr/local/cuda ] && binds+=(--bind-ro=/usr/local/cuda)

nspawn_pid=
leader=
cleanup() {
  if [ -n "$leader" ] && kill -0 "$leader" 2>/dev/null; then
    nsenter -t "$leader" -a systemctl poweroff >/dev/null 2>&1
  fi
  if [ -n "$nspawn_pid" ]; then
    for _ in $(seq 1 100); do
      kill -0 "$nspawn_pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$nspawn_pid" 2>/dev/null
    wait "$nspawn_pid" 2>/dev/null
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT

fail() {
  echo "FAIL: $*"
  [ -n "$leader" ] &&
    nsenter -t "$leader" -a journalctl -u beed@lab --no-pager -n 40 2>&1
  exit 1
}

# inside CMD...: runs CMD inside the booted system.
inside() { nsenter -t "$leader" -a "$@"; }

# ---- boot -----------------------------------------------------------------------
timeout 600 systemd-nspawn -D "$root" --ephemeral --register=no --keep-unit \
  --boot --private-network --machine="beedtest$$" "${binds[@]}" \
  >"$tmp/console.log" 2>&1 &
nspawn_pid=$!
# The container's PID 1: the descendant of systemd-nspawn named systemd.
t0=$SECONDS
while [ -z "$leader" ] && [ $((SECONDS - t0)) -lt 60 ]; do
  kill -0 "$nspawn_pid" 2>/dev/null || {
    cat "$tmp/console.log"
    fail "systemd-nspawn ended during the boot"
  }
  for p in $(pgrep -P "$nspawn_pid") $(pgrep -P "$(pgrep -P "$nspawn_pid" |
    head -1)" 2>/dev/null); do
    [ "$(cat "/proc/$p/comm" 2>/dev/null)" = systemd ] && leader=$p
  done
  [ -z "$leader" ] && sleep 0.2
done
[ -n "$leader" ] || fail "no systemd in the container after 60 s"
# systemctl answers once PID 1's socket is up; until then, no bus.
state=
until [ "$state" = running ] || [ $((SECONDS - t0)) -ge 90 ]; do
  state=$(inside timeout 30 systemctl is-system-running --wait 2>&1)
  [ "$state" = running ] || sleep 0.5
done
[ "$state" = running ] || fail "the system is '$state', not running"
echo "booted in $((SECONDS - t0)) s: systemd $(inside systemctl --version |
  head -1 | awk '{print $2}'), is-system-running: $state"
inside getent group render >/dev/null &&
  echo "note: this root has a render group; the 216/GROUP case is not shown"

# show PROP: the unit's property.
show() { inside systemctl show -p "$1" --value beed@lab; }
# wait_for SECONDS CMD...: until CMD succeeds, at most SECONDS.
wait_for() {
  local until=$((SECONDS + $1))
  shift
  until "$@"; do
    [ $SECONDS -ge $until ] && return 1
    sleep 0.2
  done
}
journal_has() { inside journalctl -u beed@lab --no-pager -q | grep -q -- "$1"; }

# ---- start: active, with the STATUS line ------------------------------------
inside systemctl start beed@lab || fail "systemctl start beed@lab"
[ "$(show ActiveState)" = active ] || fail "beed@lab is $(show ActiveState)"
status_ok() { [ -n "$(show StatusText)" ]; }
wait_for 30 status_ok || fail "no STATUS line within 30 s"
echo "started; STATUS: $(show StatusText)"
wait_for 60 journal_has "checkpoint: epoch 3 " ||
  fail "no checkpoint of epoch 3 within 60 s"

# ---- SIGKILL: restarted after RestartSec, resumed from its checkpoint ------
pid1=$(show MainPID)
inside systemctl kill -s SIGKILL beed@lab
t1=$SECONDS
restarted() {
  local p
  p=$(show MainPID)
  [ "$(show NRestarts)" -ge 1 ] && [ "$p" != 0 ] && [ "$p" != "$pid1" ] &&
    [ "$(show ActiveState)" = active ]
}
wait_for 30 restarted || fail "not restarted within 30 s of a SIGKILL"
echo "SIGKILL: restarted after $((SECONDS - t1)) s (RestartSec=5)"
resumed() {
  inside journalctl -u beed@lab --no-pager -q |
    grep -q "resuming from checkpoints/boot-0*\([3-9]\|[1-9][0-9]\+\)\.ckpt"
}
wait_for 30 resumed ||
  fail "the restarted beed did not resume from its checkpoint (epoch 3 on)"

# ---- stop: exit 0 within the stop timeout, a checkpoint written ------------
wait_for 30 status_ok || fail "no STATUS line after the restart"
before=$(inside sh -c 'ls /var/lib/beed/lab/checkpoints | wc -l')
t2=$SECONDS
inside systemctl stop beed@lab
took=$((SECONDS - t2))
[ "$(show Result)" = success ] || fail "stop: Result=$(show Result)"
[ "$(show ExecMainStatus)" = 0 ] ||
  fail "stop: exit status $(show ExecMainStatus)"
[ "$took" -le 25 ] || fail "stop took $took s"
inside journalctl -u beed@lab --no-pager -q |
  awk '/shutting down \(SIGTERM\)/ { s = 1; c = 0 } s && /checkpoint: epoch/ { c = 1 }
       END { exit !c }' || fail "no checkpoint written after the SIGTERM"
echo "stop: exit 0 in $took s (checkpoints: $before before the stop)"
echo "beed@.service: booted, started, killed and restarted, stopped"
