#!/usr/bin/env bash
# The main job on a fresh machine: install what is missing (the program's packages only: the
# test tools are scripts/test.sh's), build the kvtrim program alone, fetch the default model and
# generate from a prompt. Extra arguments go to `kvtrim run`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
python3 scripts/install_models.py smollm2
scripts/build.sh release kvtrim
if [ $# -eq 0 ]; then
  set -- --chat -p "Explain in three sentences why the sky is blue." -n 96
fi
exec build/release/kvtrim run -m smollm2 "$@"
