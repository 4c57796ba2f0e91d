#!/usr/bin/env bash
# Runs the libFuzzer targets (fuzz/, built by the debug preset: clang + ASan + UBSan).
#
#   scripts/fuzz.sh [-t SECONDS] [-j JOBS] [--seed N] [--build DIR] [--ledger FILE] [TARGET ...]
#
# Each target runs for SECONDS (default 20) over its working corpus build/fuzz/corpus/<t>
# (kept between runs, so longer runs build on earlier ones) seeded from fuzz/corpus/<t>.
# Crash, leak and timeout inputs land in build/fuzz/artifacts/<t>/; the script then fails
# and names them: fix the bug, then copy the input into fuzz/regressions/<t>/ (replayed by
# ctest in every build). One line per run (time, executions, exec/s, coverage, result) is
# appended to FILE (default build/fuzz/runs.jsonl; docs/results/fuzz/runs.jsonl is the
# record of the long runs). JOBS targets run at once (default: the number of cores). --seed N:
# libFuzzer's random seed (default 0: a new one each run; CI passes 1 so that its runs mutate
# the same way each time).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=20
jobs=$(nproc)
build=build/debug
ledger=build/fuzz/runs.jsonl
seed=0
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    -t) secs="$2"; shift 2 ;;
    -j) jobs="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    --ledger) ledger="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
all=$(sed -n 's/^set(KVTRIM_FUZZ_TARGETS \(.*\))$/\1/p' fuzz/CMakeLists.txt)
[ ${#targets[@]} -eq 0 ] && read -r -a targets <<<"$all"
for t in "${targets[@]}"; do
  [[ " $all " == *" $t "* ]] || { echo "fuzz.sh: unknown target '$t' (targets: $all)" >&2; exit 2; }
  [ -x "$build/fuzz/fuzz_$t" ] || { echo "fuzz.sh: $build/fuzz/fuzz_$t is not built (scripts/build.sh debug)" >&2; exit 2; }
done
[[ "$secs" =~ ^[1-9][0-9]*$ ]] || { echo "fuzz.sh: -t wants a positive number of seconds" >&2; exit 2; }
[[ "$seed" =~ ^[0-9]+$ ]] || { echo "fuzz.sh: --seed wants a non-negative integer" >&2; exit 2; }
mkdir -p build/fuzz/logs "$(dirname "$ledger")"

run_one() {
  local t="$1" secs="$2" build="$3" ledger="$4" seed="$5"
  local corpus=build/fuzz/corpus/$t art=build/fuzz/artifacts/$t/ log=build/fuzz/logs/$t.log
  mkdir -p "$corpus" "$art"
  local rc=0 t0=$SECONDS
  # -timeout: one input taking 10 s is a hang; -rss_limit_mb / -malloc_limit_mb: memory blowups.
  "$build/fuzz/fuzz_$t" "$corpus" "fuzz/corpus/$t" -max_total_time="$secs" -timeout=10 \
    -rss_limit_mb=2048 -malloc_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$art" -seed="$seed" \
    >"$log" 2>&1 || rc=$?
  local ran=$((SECONDS - t0))  # what it ran, not what was asked (a failure stops it early)
  local execs eps cov ft corp
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  eps=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | cut -d' ' -f2)
  ft=$(grep -oE 'ft: [0-9]+' "$log" | tail -1 | cut -d' ' -f2)
  corp=$(find "$corpus" -type f | wc -l)
  local result=ok
  [ "$rc" -ne 0 ] && result="FAILED (exit $rc, see $log)"
  printf '{"date": "%s", "target": "%s", "seconds": %s, "execs": %s, "exec_per_s": %s, "cov": %s, "ft": %s, "corpus": %s, "result": "%s"}\n' \
    "$(date -u +%FT%TZ)" "$t" "$ran" "${execs:-0}" "${eps:-0}" "${cov:-0}" "${ft:-0}" "$corp" "$result" >>"$ledger"
  printf '%-14s %4ss  %10s execs  %7s exec/s  cov %6s  ft %6s  corpus %5s  %s\n' \
    "$t" "$ran" "${execs:-0}" "${eps:-0}" "${cov:-0}" "${ft:-0}" "$corp" "$result"
  return "$rc"
}
export -f run_one
stamp=$(mktemp)
trap 'rm -f "$stamp"' EXIT
echo "fuzzing ${#targets[@]} targets for ${secs}s each, $jobs at a time (logs: build/fuzz/logs/)"
status=0
printf '%s\n' "${targets[@]}" | xargs -P "$jobs" -I{} bash -c 'run_one "$@"' _ {} "$secs" "$build" "$ledger" "$seed" || status=$?
if [ "$status" -ne 0 ]; then
  echo "fuzz.sh: a target failed; inputs that reproduce it:" >&2
  find build/fuzz/artifacts -type f -newer "$stamp" >&2 || true
  exit 1
fi
