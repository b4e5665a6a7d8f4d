#!/bin/bash
# test-net-groups.sh: --group-size, groups that mix across rounds.
#
# 8 bees on loopback (mlp, gradient averaging, a state round every epoch,
# --min-peers 8) train with --group-size 4 for a dozen epochs: a grid of
# 3 x 3 with a hole (bee_grid_group_of), whose rows average one epoch and
# whose columns the next.  No group, of an update round or a state
# round, ever has more than 4 members.  A step line's parameters are
# those after the next epoch's state round, in the next turn's groups:
# each of its groups holds one bee of every group of the turn before
# (two of them a bee of all three rows, one a bee of two), so the bees
# hold two or three sets of parameters after every epoch, never one (the
# groups step apart) and never more than the grid's three lines, and the
# sets change from epoch to epoch (fixed groups would train as three
# swarms apart).  Nobody is told the swarm split (the split check is off
# in such a run) and nobody downloads the state.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/netlib.sh"

N=8
G=4
EPOCHS=12
target=$(epoch_target 524288 262144)
for ((i = 0; i < N; i++)); do key "b$i"; done
start_swarm "$N" --open --run-id groups --target-batch-size "$target" \
  --min-peers "$N" --group-size "$G" --average-state-every 1 --eval-every 0
for ((i = 0; i < N; i++)); do wait_epoch "b$i" "$EPOCHS" 150; done
stop_all

# partition E: the bees grouped by the parameters they hold after epoch
# E, as "b0 b3 b5|b1 b2..." sorted, one word per group.
partition() {
  local i
  for ((i = 0; i < N; i++)); do echo "$(hash_of "b$i" "$1") b$i"; done |
    sort | awk '{ if ($1 != h && NR > 1) printf "|"; else if (NR > 1) printf ","
                  printf "%s", $2; h = $1 } END { print "" }'
}

averaged=0 steps=0 changed=0 prev=
for ((e = 0; e <= EPOCHS; e++)); do
  full=1 # every bee averaged both rounds (a late one may step alone)
  for ((i = 0; i < N; i++)); do
    l=$(done_line "b$i" "$e")
    [ -n "$l" ] || fail "b$i logged no step for epoch $e"
    steps=$((steps + 1))
    if [[ $l =~ averaged\ in\ a\ group\ of\ ([0-9]+) ]]; then
      k=${BASH_REMATCH[1]}
      [ "$k" -le "$G" ] || fail "b$i: epoch $e averaged in a group of $k:
$(epoch_lines "$e")"
      averaged=$((averaged + 1))
    else
      full=0
    fi
    if [[ $l =~ state\ averaged\ in\ a\ group\ of\ ([0-9]+) ]]; then
      k=${BASH_REMATCH[1]}
      [ "$k" -le "$G" ] || fail "b$i: epoch $e's state in a group of $k:
$(epoch_lines "$e")"
    else
      full=0
    fi
  done
  p=$(partition "$e")
  groups=$(echo "$p" | tr '|' '\n' | wc -l)
  [ "$groups" -ge 2 ] && { [ "$full" = 0 ] || [ "$groups" -le 3 ]; } ||
    fail "epoch $e: $groups sets of parameters among $N bees in groups of $G:
$(epoch_lines "$e")"
  [ -n "$prev" ] && [ "$p" != "$prev" ] && changed=$((changed + 1))
  prev=$p
  echo "epoch $e: $p"
done
# A late bee may miss its group's round now and then: it steps alone.
[ $((averaged * 10)) -ge $((steps * 9)) ] ||
  fail "only $averaged of $steps steps averaged"
[ "$changed" -ge $((EPOCHS / 2)) ] ||
  fail "the groups changed only $changed times in $EPOCHS epochs"
bad=$(cat "$work"/b*.log | grep -cE 'the swarm split|state: loaded' || true)
[ "$bad" = 0 ] || fail "$bad lines of splits or downloads"
echo "groups: $N bees in groups of at most $G, $averaged of $steps steps averaged, the groups changed $changed times in $EPOCHS epochs"
