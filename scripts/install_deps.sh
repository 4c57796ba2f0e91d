#!/usr/bin/env bash
# Installs the Debian packages kvtrim builds with (only those missing; needs root or sudo).
set -euo pipefail
pkgs=(build-essential cmake ninja-build pkg-config ccache
      binutils  # objdump: tests/isa_encoding.sh (also pulled in by build-essential)
      clang libclang-rt-dev  # the debug preset: ASan + UBSan builds and the libFuzzer targets (fuzz/)
      libhwy-dev libopenblas-dev libcli11-dev nlohmann-json3-dev libbz2-dev
      libcpp-httplib-dev  # kvtrim serve's HTTP server (as llama-server)
      chromium            # tests/server_model.sh: the web page in a headless browser
      nginx               # tests/scale_out_model.sh and deploy/nginx/run_local.sh (test-only, like chromium)
      libeigen3-dev  # eigen / Cholesky / SVD of the small per-head matrices (src/calib)
      libgtest-dev libgmock-dev googletest libbenchmark-dev python3
      wordnet-base scowl)  # word lists of the RULER-style tasks (src/eval/words.h)
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
# The official openai Python client, for tests/server_model.sh only (never for the build):
# pinned, into build/pytools (ignored by git). Without network the test skips that check.
if [ ! -d build/pytools/openai ]; then
  python3 -m pip install --quiet --disable-pip-version-check --target build/pytools "openai==3.57.0" \
    || echo "warning: could not install the openai client (tests/server_model.sh will skip it)"
fi
