#!/usr/bin/env bash
# Configures and builds a CMake preset (default: release); further arguments are the targets to
# build (default: all), e.g. `scripts/build.sh release kvtrim` for the program alone.
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${1:-release}"
shift || true
cmake --preset "$preset" -G Ninja >/dev/null
targets=()
for t in "$@"; do targets+=(--target "$t"); done
cmake --build --preset "$preset" -j "$(nproc)" "${targets[@]}"
