#!/usr/bin/env bash
# Installs the Debian packages kvtrim builds with (only those missing; needs root or sudo).
set -euo pipefail
pkgs=(build-essential cmake ninja-build pkg-config ccache
      libhwy-dev libopenblas-dev libcli11-dev nlohmann-json3-dev libbz2-dev
      libcpp-httplib-dev  # kvtrim serve's HTTP server (as llama-server)
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
