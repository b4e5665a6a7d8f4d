#!/bin/bash
# test-daemon-cli.sh: beed's command line, run as a real program.
#
# Bad flags and config lines exit 2 with the flag or FILE:LINE named on
# stderr; --help and --version exit 0; a node that cannot start (key file,
# token, a peers file's place) exits 1; SIGTERM and SIGINT stop a running node with status 0.
# No sockets: running nodes use --no-listen and no --join.
# Needs $BEED (and $BEECTL for the token checks) from meson's test_env.
set -u

. "$(dirname "${BASH_SOURCE[0]}")/proclib.sh"
BEECTL=${BEECTL:+$(realpath "$BEECTL")}

# Every check runs; failures are counted and reported at the end.
failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

# expect CODE PATTERN ARGS...: runs beed ARGS in $tmp; the exit status
# must be CODE and stderr (stdout for status 0) must match the extended
# regular expression PATTERN.
expect() {
  local want=$1 pat=$2 rc out
  shift 2
  (cd "$tmp" && exec "$BEED" "$@") >"$tmp/stdout" 2>"$tmp/stderr"
  rc=$?
  if [ "$want" = 0 ]; then out=$tmp/stdout; else out=$tmp/stderr; fi
  if [ "$rc" != "$want" ]; then
    fail "beed $* exited $rc, want $want; stderr:"
    sed 's/^/    /' "$tmp/stderr" >&2
  elif ! grep -Eq -- "$pat" "$out"; then
    fail "beed $*: output does not match '$pat':"
    sed 's/^/    /' "$out" >&2
  fi
  if [ "$want" = 2 ] && [ -s "$tmp/stdout" ]; then
    fail "beed $*: wrote to stdout on a usage error"
  fi
}

MOD=00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff

# ---- --help and --version ----------------------------------------------
expect 0 '^usage: beed' --help
expect 0 '--status-interval' --help
expect 0 '^usage: beed' -h
expect 0 '^beed [0-9]+\.[0-9]+\.[0-9]+$' --version
expect 0 '^usage: beed' --bogus --help

# ---- bad flags -----------------------------------------------------------
expect 2 "unknown flag '--bogus'" --open --bogus
expect 2 "unexpected argument 'extra'" --open extra
expect 2 'missing value for --join' --open --join
expect 2 'missing value for --swarm' --swarm --open
expect 2 '--max-conns: bad number' --open --max-conns abc
expect 2 '--max-conns: bad number' --open --max-conns 0
expect 2 '--status-interval: bad number' --open --status-interval -5
expect 2 '--listen: bad address' --open --listen 1.2.3.4
expect 2 '--listen: bad address' --open --listen '[::1]:99999'
expect 2 '--join: bad address' --open --join :45555
expect 2 '--moderator: bad public key' --moderator zz --token t
expect 2 '--swarm: bad swarm name' --open --swarm 'two words'
expect 2 '--log-level: bad log level' --open --log-level loud
expect 2 '--open and --moderator' --open --moderator "$MOD"
expect 2 '--token FILE is required' --moderator "$MOD"
expect 2 '--moderator PUBKEY .* or --open' --listen :0
expect 2 '--open takes no value' --open=yes

# ---- config files --------------------------------------------------------
printf '# test\nopen = true\nmax-conns = many\n' >"$tmp/bad.conf"
expect 2 "bad.conf:3: max-conns: bad number" --config bad.conf
printf 'open = true\r\nbogus = 1\r\n' >"$tmp/crlf.conf"
expect 2 "crlf.conf:2: unknown setting 'bogus'" --config crlf.conf
printf 'open = true\nlisten 1.2.3.4:5\n' >"$tmp/noeq.conf"
expect 2 "noeq.conf:2: expected 'key = value'" --config noeq.conf
head -c 5000 /dev/zero | tr '\0' '#' >"$tmp/long.conf"
expect 2 'long.conf:1: line longer than 4096 bytes' --config long.conf
expect 2 'config file missing.conf: No such file or directory' \
  --config missing.conf
printf 'moderator = %s\n' "$MOD" >"$tmp/mod.conf"
expect 2 '--token FILE is required' --config mod.conf
printf 'open = true\nswarm = ok\n' >"$tmp/good.conf"
expect 2 "--swarm: bad swarm name" --config good.conf --swarm 'a/b'

# ---- a node that cannot start exits 1 -------------------------------------
expect 1 'nonexistent-dir/node.key' --open --no-listen \
  --identity "$tmp/nonexistent-dir/node.key"
echo "not a key" >"$tmp/open.key"
chmod 0644 "$tmp/open.key"
expect 1 'open.key' --open --no-listen --identity open.key
# A peers file that could never be written (a missing directory, a
# directory in its place).
expect 1 '--peers-file .*nonexistent-dir/peers: No such file or directory' \
  --open --no-listen --identity t.key --peers-file "$tmp/nonexistent-dir/peers"
expect 1 '--peers-file .*: Is a directory' --open --no-listen --identity t.key \
  --peers-file "$tmp"

# Training data that cannot be read: the file is named, nothing starts.
expect 1 'data .*nonexistent-data' --open --no-listen --identity t.key \
  --run-id r --data "$tmp/nonexistent-data"
# A truncated CIFAR-10 batch; a token file that is not one; gpt without
# its tokens, a model's setting given to another.
mkdir "$tmp/cifar"
head -c 5000 /dev/zero >"$tmp/cifar/data_batch_1.bin"
expect 1 'data_batch_1.bin: offset 3073: truncated record 1' --open \
  --no-listen --identity t.key --run-id r --model resnet --data "$tmp/cifar"
printf 'not tokens' >"$tmp/bad.tok"
expect 1 'data .*bad.tok: .*' --open --no-listen --identity t.key \
  --run-id r --model gpt --tokens "$tmp/bad.tok"
expect 2 '--model gpt trains on --tokens FILE' --open --run-id r --model gpt
expect 2 '--depth and --width are for --model resnet' --open --run-id r \
  --model cnn --depth 20
fm=/usr/share/datasets/fashion-mnist
if [ -r "$fm/train-images-idx3-ubyte.gz" ]; then
  mkdir -p "$tmp/cut"
  # The images file cut short; the labels whole.
  gzip -dc "$fm/train-images-idx3-ubyte.gz" | head -c 100000 |
    gzip >"$tmp/cut/train-images-idx3-ubyte.gz"
  cp "$fm/train-labels-idx1-ubyte.gz" "$tmp/cut/"
  expect 1 'train-images-idx3-ubyte.gz' --open --no-listen --identity t.key \
    --run-id r --data "$tmp/cut"
  # Devices are checked when training starts: a spec that means nothing,
  # and a GPU no machine has.
  expect 1 'device gpu: bad device "gpu": expected auto, cpu, cuda' --open \
    --no-listen --identity t.key --run-id r --device gpu
  expect 1 'device cuda:4095: ' --open --no-listen --identity t.key \
    --run-id r --device cuda:4095
  # A checkpoint directory with a file in the way (one that is missing is
  # made, with its parents: test-daemon-ckpt).
  echo file >"$tmp/in-the-way"
  expect 1 '--checkpoint-dir .*in-the-way/ck: Not a directory' --open \
    --no-listen --identity t.key --run-id r --checkpoint-dir "$tmp/in-the-way/ck"
fi
expect 2 "--precision: bad precision 'fp8' .want fp32, tf32, bf16 or fp16." \
  --open --run-id r --precision fp8
expect 2 "--model: bad model 'vgg' .want mlp, cnn, resnet, gpt or external." \
  --open --run-id r --model vgg
expect 2 "--model external needs --trainer-socket PATH" --open --run-id r \
  --model external
expect 2 "--trainer-socket is for --model external" --open --run-id r \
  --trainer-socket /tmp/t.sock
expect 2 "--run-id: bad run name" --open --run-id 'a b'

# ---- --check: everything loaded and checked, nothing made, no socket -------
expect 0 "beed: would start: swarm 'beed' \(open\), not listening, 0 join targets" \
  --check --open --no-listen --identity check-new.key --peers-file check.peers \
  --control check.sock
for f in check-new.key check.peers check.sock; do
  [ ! -e "$tmp/$f" ] || fail "--check made $f"
done
expect 0 "listening on 127.0.0.1:1, 1 join target$" --check --open \
  --identity check-new.key --listen 127.0.0.1:1 --join 127.0.0.1:2
expect 1 'peers-file .*: Is a directory' --check --open --no-listen \
  --identity check-new.key --peers-file "$tmp"
expect 1 'control .*nonexistent-dir: No such file or directory' --check --open \
  --no-listen --identity check-new.key --control "$tmp/nonexistent-dir/s.sock"
expect 1 'token none.tok: No such file' --check --identity check-new.key \
  --moderator 00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff \
  --token none.tok
printf 'open = true\ncheck = true\n' >"$tmp/check.conf"
expect 2 'check.conf:2: .*check' --config check.conf
if [ -r /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  expect 0 "run 'r': mlp, gradients averaging" --check --open --no-listen \
    --identity check-new.key --run-id r --checkpoint-dir "$tmp/check-ck/sub" \
    --resume
  [ ! -e "$tmp/check-ck" ] || fail "--check made the checkpoint directory"
  expect 1 'data .*nonexistent-data' --check --open --no-listen \
    --identity check-new.key --run-id r --data "$tmp/nonexistent-data"
fi

# ---- SIGTERM and SIGINT stop a running node with status 0 -----------------
# stop_check NAME SIGNAL ARGS...: starts beed ARGS, waits until it runs,
# sends SIGNAL and wants status 0 and "shutting down" in its log.
stop_check() {
  local name=$1 sig=$2 pid rc i
  shift 2
  (cd "$tmp" && exec "$BEED" "$@") >"$tmp/$name.log" 2>&1 &
  pid=$!
  pids+=("$pid")
  for i in $(seq 100); do
    grep -q 'not listening' "$tmp/$name.log" && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if ! grep -q 'not listening' "$tmp/$name.log"; then
    fail "$name: beed did not come up:"
    sed 's/^/    /' "$tmp/$name.log" >&2
    kill -9 "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    return
  fi
  kill "-$sig" "$pid"
  for i in $(seq 100); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    fail "$name: beed still running 10 s after SIG$sig"
    kill -9 "$pid"
  fi
  wait "$pid"
  rc=$?
  [ "$rc" = 0 ] || fail "$name: beed exited $rc after SIG$sig"
  grep -q "beed: shutting down (SIG$sig)" "$tmp/$name.log" ||
    fail "$name: no 'shutting down' line after SIG$sig"
}

stop_check term TERM --open --no-listen --identity node.key \
  --status-interval 0
stop_check int INT --open --no-listen --identity node.key
# A peers file with lines that are not addresses is a cache gone bad: a
# warning naming the first such line, and beed runs.
printf '# known peers\nnot an address\n127.0.0.1:0\n' >"$tmp/bad.peers"
stop_check badpeers TERM --open --no-listen --identity node.key \
  --status-interval 0 --peers-file bad.peers
grep -q 'peers file bad.peers:2: not HOST:PORT; 2 such lines skipped' \
  "$tmp/badpeers.log" || fail "a bad peers file: no warning naming its line"
[ "$(stat -c %a "$tmp/node.key")" = 600 ] ||
  fail "beed created node.key with mode $(stat -c %a "$tmp/node.key")"
# A stop that comes while beed is still starting (as soon as it logs its
# first line, while it loads the training data) is held until beed
# watches for it: status 0 and a clean stop, never the default action's
# death (status 143, as before: 3 of 3).
if [ -r /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  for try in 1 2 3; do
    (cd "$tmp" && exec "$BEED" --open --no-listen --identity node.key \
      --status-interval 0 --run-id early --eval-every 0) >"$tmp/early.log" 2>&1 &
    pid=$!
    for i in $(seq 2000); do
      grep -q 'beed .* starting' "$tmp/early.log" && break
      sleep 0.005
    done
    kill -TERM "$pid"
    rc=0
    wait "$pid" || rc=$?
    [ "$rc" = 0 ] || fail "SIGTERM as beed started: it exited $rc"
    grep -q 'shutting down (SIGTERM)' "$tmp/early.log" ||
      fail "SIGTERM as beed started: no clean stop"
  done
fi

# ---- tokens: a node with a bad token refuses to start ---------------------
# pubkey FILE: the public key that beectl keygen printed into FILE.
pubkey() { awk '$1 == "public-key" { print $2 }' "$1"; }

if [ -n "$BEECTL" ] &&
  "$BEECTL" keygen --moderator --out "$tmp/mod.key" >"$tmp/mod.txt" 2>&1 &&
  "$BEECTL" keygen --out "$tmp/bee.key" >"$tmp/bee.txt" 2>&1 &&
  "$BEECTL" keygen --out "$tmp/other.key" >"$tmp/other.txt" 2>&1 &&
  "$BEECTL" keygen --moderator --out "$tmp/mod2.key" >"$tmp/mod2.txt" 2>&1
then
  mod=$(pubkey "$tmp/mod.txt")
  mod2=$(pubkey "$tmp/mod2.txt")
  issue() { # issue OUT PEER_TXT [SWARM]
    "$BEECTL" token issue --moderator-key "$tmp/mod.key" \
      --swarm "${3:-lab}" --peer "$(pubkey "$2")" --role bee \
      --expires 1d --out "$tmp/$1" >/dev/null
  }
  if issue bee.tok "$tmp/bee.txt" && issue other.tok "$tmp/other.txt" &&
    issue swarm.tok "$tmp/bee.txt" elsewhere; then
    common=(--no-listen --swarm lab --identity bee.key)
    expect 1 'token other.tok refused: .*another peer' \
      "${common[@]}" --moderator "$mod" --token other.tok
    expect 1 'token bee.tok refused: .*another moderator' \
      "${common[@]}" --moderator "$mod2" --token bee.tok
    expect 1 'token swarm.tok refused: .*another swarm' \
      "${common[@]}" --moderator "$mod" --token swarm.tok
    expect 1 'token missing.tok' \
      "${common[@]}" --moderator "$mod" --token missing.tok
    stop_check token TERM "${common[@]}" --moderator "$mod" --token bee.tok
    grep -q 'token bee.tok: role bee' "$tmp/token.log" ||
      fail "token: no 'role bee' line"
    # Revocation lists: one naming another key lets us start, one naming
    # ours does not, and a forged one is refused.
    echo "garbage" >"$tmp/bad.rev"
    expect 1 'revocations bad.rev' "${common[@]}" --moderator "$mod" \
      --token bee.tok --revocations bad.rev
    if "$BEECTL" revoke --moderator-key "$tmp/mod.key" --swarm lab \
      --peer "$(pubkey "$tmp/other.txt")" --list "$tmp/lab.rev" >/dev/null
    then
      stop_check revoked-other TERM "${common[@]}" --moderator "$mod" \
        --token bee.tok --revocations lab.rev
      expect 1 'revocations lab.rev' "${common[@]}" --moderator "$mod2" \
        --token bee.tok --revocations lab.rev
      "$BEECTL" revoke --moderator-key "$tmp/mod.key" --swarm lab \
        --peer "$(pubkey "$tmp/bee.txt")" --list "$tmp/lab.rev" >/dev/null ||
        fail "beectl revoke failed"
      expect 1 'token bee.tok refused: peer is revoked' "${common[@]}" \
        --moderator "$mod" --token bee.tok --revocations lab.rev
    else
      fail "beectl revoke failed"
    fi
  else
    fail "beectl token issue failed"
  fi
else
  echo "note: beectl keygen unavailable, token checks skipped" >&2
fi

if [ "$failures" != 0 ]; then
  echo "$failures check(s) failed" >&2
  exit 1
fi
echo "all beed command line checks passed"
