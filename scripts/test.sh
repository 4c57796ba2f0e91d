#!/usr/bin/env bash
# Builds and runs every test: quick tests (tiny models made by the tests) and the tests on
# the real models (label "model"), after installing the Debian packages and the models; then the
# Python package's tests (scripts/test_python.sh: pip install . and pytest).
# Then the quick tests again under AddressSanitizer + UBSan (clang; skip with KVTRIM_NO_ASAN=1),
# and every libFuzzer target of that build for KVTRIM_FUZZ_SECONDS (default 20) each.
# Every phase runs even when an earlier one failed (a failed build skips only its own tests), so
# one failing test cannot hide the sanitizer and fuzzing results; at the end a table gives each
# phase's result (with ctest's passed/total), and its minutes; the exit status is 1 if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."

rows=()     # "phase|result|minutes" per phase, for the summary
failed=0
log=$(mktemp)
trap 'rm -f "$log"' EXIT

# phase NAME CMD...: runs CMD (its output shown as it comes), records its result and minutes.
# Returns CMD's status, so that a build's tests can be skipped when it failed.
phase() {
  local name="$1"; shift
  local t0=$SECONDS rc result counts
  echo "==== $name: $*"
  "$@" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  # ctest's last line: "99% tests passed, 1 tests failed out of 570"
  counts=$(sed -n 's/.*tests passed, \([0-9]*\) tests\{0,1\} failed out of \([0-9]*\).*/\1 \2/p' "$log" | tail -1)
  if [ "$rc" -eq 0 ]; then result="pass"; else result="FAIL (exit $rc)"; failed=1; fi
  if [ -n "$counts" ]; then
    set -- $counts
    result="$result, $(($2 - $1))/$2 tests passed"
  fi
  rows+=("$name|$result|$(awk -v s=$((SECONDS - t0)) 'BEGIN { printf "%.1f", s / 60 }')")
  return "$rc"
}
skip() {  # skip NAME WHY
  rows+=("$1|skipped: $2|-")
}

phase "install deps" scripts/install_deps.sh --test
phase "models" python3 scripts/install_models.py all
if phase "ci build" scripts/build.sh ci; then
  phase "ci tests" ctest --preset ci -j 2
  phase "python" scripts/test_python.sh
else
  skip "ci tests" "the ci build failed"
  skip "python" "the ci build failed"
fi
if [ "${KVTRIM_NO_ASAN:-0}" != "1" ]; then
  if phase "debug build" scripts/build.sh debug; then
    phase "debug quick tests" ctest --preset debug -L quick -j 2
    phase "fuzzers" scripts/fuzz.sh -t "${KVTRIM_FUZZ_SECONDS:-20}" --seed 1
  else
    skip "debug quick tests" "the debug build failed"
    skip "fuzzers" "the debug build failed"
  fi
else
  for p in "debug build" "debug quick tests" "fuzzers"; do skip "$p" "KVTRIM_NO_ASAN=1"; done
fi

echo
echo "==== summary (minutes: $(awk -v s=$SECONDS 'BEGIN { printf "%.1f", s / 60 }') in all)"
printf '%-18s  %-40s  %7s\n' phase result minutes
for r in "${rows[@]}"; do
  IFS='|' read -r name result minutes <<< "$r"
  printf '%-18s  %-40s  %7s\n' "$name" "$result" "$minutes"
done
exit "$failed"
