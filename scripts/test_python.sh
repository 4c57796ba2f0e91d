#!/usr/bin/env bash
# The Python package's tests: `pip install .` into a virtual environment (build/pyvenv, made
# once; the wheel's CMake build directory build/py-<tag>/ is kept, so a rebuild compiles only what
# changed) with numpy and pytest from PyPI, then pytest tests/python against the installed
# package (run from the repository root, so the evaluation finds ../shared/data), with the
# kvtrim program of the ci build for the command-line comparisons (KVTRIM_BIN).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=build/pyvenv
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check)
if ! "${pip[@]}" download --no-deps -q -d "$(mktemp -d)" pytest >/dev/null 2>&1 \
   && ! "$venv/bin/python" -c "import pytest, numpy, nanobind, scikit_build_core" 2>/dev/null; then
  echo "SKIPPED: PyPI is not reachable and the test environment lacks pytest / numpy / nanobind / scikit-build-core"
  exit 0
fi
"${pip[@]}" install -q "numpy" "pytest" "scikit-build-core>=0.10" "nanobind>=2.0"
# No build isolation: the build tools come from the environment above (installed once), not
# fetched again for every build. Warnings are errors, as in the ci preset (whose flags these then
# equal: -Werror, position-independent code), so ccache serves the libraries from the ci build.
# The ci build's compilers too: scikit-build-core would otherwise take Python's (g++ where CMake
# found c++), and ccache keys its objects on the compiler's name.
if [ -f build/ci/CMakeCache.txt ]; then
  CXX="${CXX:-$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' build/ci/CMakeCache.txt)}"
  CC="${CC:-$(sed -n 's/^CMAKE_C_COMPILER:[A-Z]*=//p' build/ci/CMakeCache.txt)}"
  export CXX CC
fi
"${pip[@]}" install -q --no-build-isolation -C cmake.define.KVTRIM_WERROR=ON .
export KVTRIM_BIN="${KVTRIM_BIN:-$PWD/build/ci/kvtrim}"
export KVTRIM_MODELS_DIR="${KVTRIM_MODELS_DIR:-$PWD/models}"
# the installed package, not the source tree's python/ (which has no compiled module)
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/python "$@"
