#!/usr/bin/env bash
# Builds and runs every test: quick tests (tiny models made by the tests) and the tests on
# the real models (label "model"), after installing the Debian packages and the models.
# Then the quick tests again under AddressSanitizer + UBSan (clang; skip with KVTRIM_NO_ASAN=1),
# and every libFuzzer target of that build for KVTRIM_FUZZ_SECONDS (default 20) each.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
python3 scripts/install_models.py all
scripts/build.sh ci
ctest --preset ci -j 2
if [ "${KVTRIM_NO_ASAN:-0}" != "1" ]; then
  scripts/build.sh debug
  ctest --preset debug -L quick -j 2
  scripts/fuzz.sh -t "${KVTRIM_FUZZ_SECONDS:-20}" --seed 1
fi
