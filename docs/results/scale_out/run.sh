#!/usr/bin/env bash
# The scale-out runs of docs/results/scale_out/README.md: 3 replicas of kvtrim serve (smollm2,
# 1 thread, 4 slots, 32 MiB KV budget each) behind nginx on loopback (deploy/nginx/run_local.sh),
# the multi-turn load test (scripts/load_test.py --multi-turn) with consistent hashing on the
# conversation key (affinity) and with round robin, then with affinity while one replica is
# killed (SIGKILL) and another drained (SIGTERM) mid-run. Results: results.jsonl (one line per
# run) beside this script. A few minutes on a 2-core machine.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=docs/results/scale_out/results.jsonl
: > "$out"
serve=(-m smollm2 -t 1 --parallel 4 -c 2048 --kv-budget 32MiB)
load=(--conversations "${CONVERSATIONS:-24}" --concurrency 6 --max-tokens 16 --stream-every 3 --seed 1 --out "$out")
dir=$(mktemp -d)
trap 'deploy/nginx/run_local.sh stop -d "$dir" 2>/dev/null || true; rm -rf "$dir"' EXIT
run() {  # run LABEL [--round-robin] -- LOAD_ARGS...
  local label="$1"; shift
  local lb=()
  [ "${1:-}" = --round-robin ] && { lb=(--round-robin); shift; }
  [ "${1:-}" = -- ] && shift
  deploy/nginx/run_local.sh start -n 3 -d "$dir" "${lb[@]}" -- "${serve[@]}"
  source "$dir/env"
  python3 scripts/load_test.py --multi-turn --url "$LB_URL" --replicas "${REPLICA_URLS// /,}" --label "$label" \
    "${load[@]}" "$@"
  deploy/nginx/run_local.sh stop -d "$dir"
  # the replicas exit once drained (nothing runs now): wait for them before the next run
  for p in $REPLICA_PIDS $NGINX_PID; do while kill -0 "$p" 2>/dev/null; do sleep 0.2; done; done
}
run affinity
run round_robin --round-robin
# no key sent on a conversation's first turn; its reply's derived key on the next ones
run affinity_derived_key -- --key-in derived
# the failures: replica r0 killed 10 s in, replica r1 sent SIGTERM 20 s in (pids from the env
# file the start writes: read them after it by a wrapper that starts the load with --signal)
deploy/nginx/run_local.sh start -n 3 -d "$dir" -- "${serve[@]}"
source "$dir/env"
read -r -a pids <<< "$REPLICA_PIDS"
python3 scripts/load_test.py --multi-turn --url "$LB_URL" --replicas "${REPLICA_URLS// /,}" --label kill_and_drain \
  "${load[@]}" --signal "10:${pids[0]}:KILL" --signal "20:${pids[1]}:TERM"
deploy/nginx/run_local.sh stop -d "$dir"
cp "$dir"/nginx_error.log docs/results/scale_out/kill_and_drain_nginx_error.log 2>/dev/null || true
grep -h "signal\|draining" "$dir"/replica_1.log > docs/results/scale_out/kill_and_drain_r1_drain.log || true
