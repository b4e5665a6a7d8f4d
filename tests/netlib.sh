# netlib.sh: helpers for the tests that run real beed processes.
# Source it after `set -euo pipefail`; it makes $work (removed on exit),
# a random port base $base, and the pid table the helpers keep.

: "${BEED:?BEED must name the beed binary}" "${BEECTL:?BEECTL must name beectl}"
work=$(mktemp -d "${TMPDIR:-/tmp}/beed-net.XXXXXX")
declare -A pid
# Below the ephemeral range (32768+), where outgoing connections get their
# local ports, so a listen port is never taken by some connection.
base=$((20000 + RANDOM % 12000))

cleanup() {
  local n
  for n in "${!pid[@]}"; do kill -9 "${pid[$n]}" 2>/dev/null || true; done
  wait 2>/dev/null || true
  # BEE_TEST_KEEP=DIR: the logs are copied there, passed or failed.
  if [ -n "${BEE_TEST_KEEP:-}" ]; then cp "$work"/*.log "$BEE_TEST_KEEP"/ 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

fail() {
  echo "FAIL: $*" >&2
  for f in "$work"/*.log; do
    [ -f "$f" ] || continue
    echo "----- $(basename "$f") -----" >&2
    tail -n 40 "$f" >&2
  done
  # Again after the logs: a runner that keeps only the output's end
  # (CI) still shows why.
  echo "FAIL: $*" >&2
  [ -n "${BEE_TEST_KEEP:-}" ] && cp "$work"/*.log "$BEE_TEST_KEEP"/ 2>/dev/null
  exit 1
}

# epoch_target FAST SANITIZED: the --target-batch-size for epochs of a few
# seconds, FAST in a plain build, SANITIZED in an ASan/UBSan one (meson
# sets BEE_TEST_SANITIZED).  There beed trains at about 0.6 of the plain
# build's speed (its trainer's arithmetic is built uninstrumented,
# trainer/meson.build), so SANITIZED is about 0.6 of FAST and the epochs
# last about as long in both.
epoch_target() {
  if [ "${BEE_TEST_SANITIZED:-0}" = 1 ]; then echo "$2"; else echo "$1"; fi
}

field() { awk -v k="$1" '$1 == k { print $2; exit }' "$2"; }

# key NAME [--moderator]: makes NAME.key, sets pk_NAME.
key() {
  "$BEECTL" keygen ${2:-} --out "$work/$1.key" >"$work/$1.txt"
  printf -v "pk_$1" '%s' "$(field public-key "$work/$1.txt")"
}

# token NAME MODERATOR SWARM EXPIRES [ROLE]
token() {
  local pkvar=pk_$1
  "$BEECTL" token issue --moderator-key "$work/$2.key" --swarm "$3" \
    --peer "${!pkvar}" --role "${5:-bee}" --expires "$4" \
    --out "$work/$1.tok" >/dev/null
}

# start NAME PORT [FLAGS...]
start() {
  local n=$1 p=$2
  shift 2
  (cd "$work" && exec "$BEED" --listen "127.0.0.1:$p" --identity "$n.key" \
    --status-interval 1 "$@") >"$work/$n.log" 2>&1 &
  pid[$n]=$!
}

# start_swarm N [FLAGS...]: b0 on $base, then b1 .. b(N-1) on the next
# ports joining through it, all with FLAGS (their keys made beforehand).
start_swarm() {
  local n=$1 i
  shift
  start b0 "$base" "$@"
  wait_log b0 'listening on' 10
  for ((i = 1; i < n; i++)); do
    start "b$i" $((base + i)) "$@" --join "127.0.0.1:$base"
  done
}

# wait_log NAME PATTERN [SECONDS]: waits for an extended regex in the log.
wait_log() {
  local i
  for ((i = 0; i < ${3:-10} * 10; i++)); do
    grep -Eq "$2" "$work/$1.log" 2>/dev/null && return 0
    kill -0 "${pid[$1]}" 2>/dev/null || fail "$1 exited early"
    sleep 0.1
  done
  fail "$1: no log line matching '$2' within ${3:-10} s"
}

# done_line NAME EPOCH: the epoch's step line in NAME's log, from
# "training loss" on; hash_of NAME EPOCH: the parameters' hash it ends with.
done_line() {
  sed -nE "s/.*train: epoch $2 done: [0-9]+ local samples, (.*)/\1/p" \
    "$work/$1.log" | head -n 1
}
hash_of() { local l; l=$(done_line "$1" "$2"); echo "${l##*parameters }"; }

# epoch_lines E: the step at epoch E of every bee b0..b$((N - 1)) (N: the
# test's count of bees) and the first warnings of all, for a failure's
# report (the logs' tails show only the shutdown).
epoch_lines() {
  local i
  for ((i = 0; i < N; i++)); do
    echo "b$i: $(done_line "b$i" "$1" | cut -c1-110)"
  done
  grep -h ' WARN ' "$work"/b*.log | cut -c1-160 | head -n 10
}

# in_line E BEES...: the bees' steps of epoch E (waited for) averaged in
# one group of them all, to the same parameters; says so.
in_line() {
  local e=$1 b n=$(($# - 1))
  shift
  for b in "$@"; do wait_log "$b" "train: epoch $e done" 60; done
  for b in "$@"; do
    [[ $(done_line "$b" "$e") = *"averaged in a group of $n "* ]] ||
      fail "epoch $e: $b's step: '$(done_line "$b" "$e")'"
    [ "$(hash_of "$b" "$e")" = "$(hash_of "$1" "$e")" ] ||
      fail "epoch $e: $b's parameters $(hash_of "$b" "$e") differ from $1's $(hash_of "$1" "$e")"
  done
  echo "epoch $e: $(hash_of "$1" "$e") on $*"
}

# in_step A B FROM TO [ERE]: every epoch FROM..TO, both A's and B's step
# lines match ERE (default: averaged in a group of 2) and both hold the
# same parameters after it; fails naming the first that does not.
in_step() {
  local e b h1 h2 how=${5:-averaged in a group of 2 }
  for ((e = $3; e <= $4; e++)); do
    for b in "$1" "$2"; do
      grep -Eq "train: epoch $e done: .*$how" "$work/$b.log" ||
        fail "$b: epoch $e's step is not '$how'"
    done
    h1=$(hash_of "$1" "$e") h2=$(hash_of "$2" "$e")
    [ -n "$h1" ] && [ "$h1" = "$h2" ] ||
      fail "after epoch $e the parameters differ ($h1, $h2)"
  done
}

# last_done NAME: the latest epoch NAME has logged a step for (-1 before
# the first).  wait_epoch NAME EPOCH [SECONDS]: waits (10 s by
# default) for a step at EPOCH or later: a bee that takes a later state
# from its peers (catching up, or two halves of a swarm joining again)
# logs no step for the epochs it skipped.
last_done() {
  local e=
  [ -f "$work/$1.log" ] &&
    e=$(sed -nE 's/.*train: epoch ([0-9]+) done:.*/\1/p' "$work/$1.log" |
      sort -n | tail -n 1)
  echo "${e:--1}"
}
wait_epoch() {
  local i e
  for ((i = 0; i < ${3:-10} * 10; i++)); do
    e=$(last_done "$1")
    [ "$e" -ge "$2" ] && return 0
    kill -0 "${pid[$1]}" 2>/dev/null || fail "$1 exited early"
    sleep 0.1
  done
  fail "$1: no step at epoch $2 or later within ${3:-10} s"
}

# back_in_line NAME REF FROM: the first epoch after FROM (up to FROM + 12)
# after which NAME holds REF's parameters, waiting up to 90 s for each
# epoch to be reached in both logs (an epoch either skipped, taking a
# later state, does not count); fails if none.
back_in_line() {
  local f=$3 h1 h2
  while [ "$f" -lt $(($3 + 12)) ]; do
    f=$((f + 1))
    wait_epoch "$1" "$f" 90
    wait_epoch "$2" "$f" 90
    h1=$(hash_of "$1" "$f" || true) h2=$(hash_of "$2" "$f" || true)
    if [ -n "$h1" ] && [ "$h1" = "$h2" ]; then
      echo "$f"
      return 0
    fi
  done
  fail "$1 never came back in line with $2 after epoch $3"
}

# same_after NAME REF EPOCH: waits for EPOCH's step in both logs (60 s,
# then 30); fails unless NAME holds REF's parameters after it.
same_after() {
  wait_log "$1" "train: epoch $3 done" 60
  wait_log "$2" "train: epoch $3 done" 30
  [ "$(hash_of "$1" "$3")" = "$(hash_of "$2" "$3")" ] ||
    fail "$1 and $2 apart after epoch $3: $(hash_of "$1" "$3"), $(hash_of "$2" "$3")"
}

# exit_text RC: a wait status as "1" or "134 (SIGABRT)".
exit_text() {
  if [ "$1" -gt 128 ] && [ "$1" -lt 160 ]; then
    echo "$1 (SIG$(kill -l "$(($1 - 128))"))"
  else
    echo "$1"
  fi
}

# trainer_pair A B PORT FLAGS...: beeds A (at PORT) and B (at PORT + 1,
# joining A) with --model external's FLAGS, a new key and the trainer
# socket A.sock / B.sock each, both waiting for their trainer process.
trainer_pair() {
  local a=$1 b=$2 p=$3
  shift 3
  key "$a"
  key "$b"
  start "$a" "$p" "$@" --trainer-socket "$a.sock"
  wait_log "$a" 'waiting for a trainer process on' 10
  start "$b" $((p + 1)) "$@" --trainer-socket "$b.sock" --join "127.0.0.1:$p"
  wait_log "$b" 'waiting for a trainer process on' 10
}

# stop NAME: SIGTERM to one node, which must exit 0.
stop() {
  local rc=0
  kill -TERM "${pid[$1]}"
  wait "${pid[$1]}" || rc=$?
  [ "$rc" = 0 ] || fail "$1 exited with $(exit_text "$rc") after SIGTERM"
  unset "pid[$1]"
}

# stop_all: SIGTERM to every node; each must exit 0.
stop_all() {
  local n rc
  for n in "${!pid[@]}"; do kill -TERM "${pid[$n]}"; done
  for n in "${!pid[@]}"; do
    rc=0
    wait "${pid[$n]}" || rc=$?
    [ "$rc" = 0 ] || fail "$n exited with $(exit_text "$rc") after SIGTERM"
    unset "pid[$n]"
  done
}
