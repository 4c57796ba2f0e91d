#!/usr/bin/env bash
# Installs the Debian packages kvtrim builds with (only those missing; needs root or sudo).
#   scripts/install_deps.sh          what the program needs (scripts/run_default.sh)
#   scripts/install_deps.sh --test   also what the tests need (scripts/test.sh): GoogleTest,
#                                    Google Benchmark, clang for the sanitizer / fuzzing build,
#                                    Chromium for the web page, nginx for the scale-out test,
#                                    and the openai Python client
set -euo pipefail
cd "$(dirname "$0")/.."
test_tools=0
for a in "$@"; do
  case "$a" in
    --test) test_tools=1 ;;
    *) echo "usage: $0 [--test]" >&2; exit 2 ;;
  esac
done
pkgs=(build-essential cmake ninja-build pkg-config ccache python3
      libhwy-dev libopenblas-dev libcli11-dev nlohmann-json3-dev libbz2-dev
      libcpp-httplib-dev  # kvtrim serve's HTTP server (as llama-server)
      libeigen3-dev  # eigen / Cholesky / SVD of the small per-head matrices (src/calib)
      wordnet-base scowl)  # word lists of the RULER-style tasks (src/eval/words.h)
if [ "$test_tools" = 1 ]; then
  pkgs+=(binutils  # objdump: tests/isa_encoding.sh (also pulled in by build-essential)
         clang libclang-rt-dev  # the debug preset: ASan + UBSan builds and the libFuzzer targets (fuzz/)
         lld                 # links the test builds' ~40 programs several times faster than GNU ld
         clang-format-14     # scripts/check_format.py (the version is pinned: its output differs by version)
         chromium            # tests/server_model.sh: the web page in a headless browser
         nginx               # tests/scale_out_model.sh and deploy/nginx/run_local.sh
         libgtest-dev libgmock-dev googletest libbenchmark-dev
         python3-venv python3-dev)  # scripts/test_python.sh: the Python package in a virtual environment
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ! python3 -m pip --version >/dev/null 2>&1; then missing+=(python3-pip); fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
[ "$test_tools" = 1 ] || exit 0
# The official openai Python client, for tests/server_model.sh only (never for the build):
# pinned, into build/pytools (ignored by git). Without network the test skips that check.
if [ ! -d build/pytools/openai ]; then
  python3 -m pip install --quiet --disable-pip-version-check --target build/pytools "openai==3.57.0" \
    || echo "warning: could not install the openai client (tests/server_model.sh will skip it)"
fi
