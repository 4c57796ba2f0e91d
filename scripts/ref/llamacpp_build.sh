# llamacpp_build.sh — sourced by the llama.cpp reference scripts (scripts/ref/llamacpp_*.sh).
#
#   llamacpp_fetch             downloads the llama-cpp-python sdist (pinned: $LLAMACPP_PY_VERSION)
#                              from PyPI into $CACHE_DIR and unpacks it
#                              (once); sets LCPP_COMMIT (the upstream commit, from the sdist's
#                              CHANGELOG). Nothing is written in the repository.
#   llamacpp_commit            prints LCPP_COMMIT.
#   llamacpp_build TARGET...   llamacpp_fetch, then builds the named targets of the vendored
#                              llama.cpp into $BUILD = $CACHE_DIR/build under nice -n 19, -j 2.
#                              A target whose binary exists is not rebuilt (delete $BUILD to
#                              rebuild).
#   llamacpp_bin NAME          prints the path of a built tool (the variant's build directory).
#   llamacpp_resolve_model M   kvtrim model name/alias or a file -> GGUF path (as
#                              src/engine/model_path.cpp searches).
#
# CPU flags: KVTRIM_LLAMACPP_CPU=avx2 (default) pins GGML_NATIVE=OFF, AVX2/FMA/F16C on,
# AVX-512/AMX off, no OpenMP: llama.cpp's AMX/AVX-512 paths segfaulted on an earlier VM, and every
# machine the team uses has AVX2. KVTRIM_LLAMACPP_CPU=native builds for the host CPU
# (GGML_NATIVE=ON: AVX-512 / VNNI / BF16 where the CPU has them) into its own build directory;
# use it for a side-by-side on a machine where kvtrim itself runs AVX-512 kernels, so that each
# tool gets its best code. The caller sets REPO, and may set LLAMACPP_PY_VERSION /
# KVTRIM_LLAMACPP_DIR / KVTRIM_LLAMACPP_CPU.

LLAMACPP_PY_VERSION="${LLAMACPP_PY_VERSION:-0.3.36}"
CACHE_DIR="${KVTRIM_LLAMACPP_DIR:-$HOME/.cache/kvtrim/llamacpp}"
SRC="$CACHE_DIR/llama_cpp_python-$LLAMACPP_PY_VERSION"
LCPP="$SRC/vendor/llama.cpp"
LLAMACPP_CPU="${KVTRIM_LLAMACPP_CPU:-avx2}"
case "$LLAMACPP_CPU" in
  avx2) BUILD="$CACHE_DIR/build" ;;
  native) BUILD="$CACHE_DIR/build-native" ;;
  *) echo "llamacpp_build: error: KVTRIM_LLAMACPP_CPU must be avx2 or native, not '$LLAMACPP_CPU'" >&2
     return 1 2>/dev/null || exit 1 ;;
esac
LCPP_COMMIT=unknown

llamacpp_fetch() {
  local log_prefix="llamacpp_build:"
  mkdir -p "$CACHE_DIR" "$CACHE_DIR/logs"
  if [[ ! -d "$LCPP/tools" ]]; then
    local sdist="$CACHE_DIR/llama_cpp_python-$LLAMACPP_PY_VERSION.tar.gz"
    if [[ ! -f "$sdist" ]]; then
      echo "$log_prefix downloading llama-cpp-python==$LLAMACPP_PY_VERSION (sdist) from PyPI" >&2
      nice -n 19 python3 -m pip download --no-deps --no-binary :all: \
        "llama-cpp-python==$LLAMACPP_PY_VERSION" -d "$CACHE_DIR" >&2
    fi
    [[ -f "$sdist" ]] || { echo "$log_prefix error: sdist $sdist not downloaded" >&2; return 1; }
    echo "$log_prefix unpacking $sdist" >&2
    nice -n 19 tar -xzf "$sdist" -C "$CACHE_DIR"
    [[ -d "$LCPP/tools" ]] || { echo "$log_prefix error: no vendor/llama.cpp/tools in the sdist" >&2; return 1; }
  fi
  # The sdist carries no git metadata (llama.cpp prints "build: 0 (unknown)"); the upstream
  # commit is in llama-cpp-python's CHANGELOG entry for this version.
  LCPP_COMMIT="$(awk -v v="## [$LLAMACPP_PY_VERSION]" '
      index($0, v) == 1 { on = 1; next }
      on && /^## \[/ { exit }
      on && match($0, /llama\.cpp@[0-9a-f]+/) { print substr($0, RSTART + 10, RLENGTH - 10); exit }
    ' "$SRC/CHANGELOG.md" 2>/dev/null || true)"
  LCPP_COMMIT="${LCPP_COMMIT:-unknown}"
}

llamacpp_commit() { llamacpp_fetch && echo "$LCPP_COMMIT"; }

llamacpp_bin() { echo "$BUILD/bin/$1"; }

llamacpp_build() {
  local log_prefix="llamacpp_build:"
  llamacpp_fetch || return 1
  local missing=() t
  for t in "$@"; do [[ -x "$BUILD/bin/$t" ]] || missing+=("$t"); done
  [[ ${#missing[@]} -eq 0 ]] && return 0
  if [[ ! -f "$BUILD/CMakeCache.txt" ]]; then
    echo "$log_prefix configuring llama.cpp ($LCPP_COMMIT) in $BUILD" >&2
    local cpu_flags=(-DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_BMI2=ON
      -DGGML_FMA=ON -DGGML_F16C=ON
      -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF
      -DGGML_AVX_VNNI=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
    [[ "$LLAMACPP_CPU" == native ]] && cpu_flags=(-DGGML_NATIVE=ON)
    echo "$log_prefix CPU flags ($LLAMACPP_CPU): ${cpu_flags[*]}" >&2
    nice -n 19 cmake -S "$LCPP" -B "$BUILD" \
      -DCMAKE_BUILD_TYPE=Release \
      -DBUILD_SHARED_LIBS=OFF \
      "${cpu_flags[@]}" \
      -DGGML_OPENMP=OFF -DGGML_CCACHE=OFF -DGGML_BACKEND_DL=OFF -DGGML_CPU_ALL_VARIANTS=OFF \
      -DLLAMA_OPENSSL=OFF \
      -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_COMMON=ON \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
      -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF >&2 || return 1
    # (LLAMA_CURL is deprecated in this llama.cpp — LLAMA_OPENSSL=OFF is the no-network switch.)
  fi
  echo "$log_prefix building ${missing[*]} (-j 2, nice 19)" >&2
  nice -n 19 cmake --build "$BUILD" --target "${missing[@]}" -j 2 >&2 || return 1
  for t in "${missing[@]}"; do
    [[ -x "$BUILD/bin/$t" ]] || { echo "$log_prefix error: build finished but $BUILD/bin/$t is missing" >&2; return 1; }
  done
}

llamacpp_resolve_model() {
  local arg="$1" name d
  [[ -f "$arg" ]] && { echo "$arg"; return 0; }
  case "$arg" in
    smollm2|smollm2-135m) name=smollm2 ;;
    qwen|qwen2.5|qwen2.5-1.5b|qwen2.5-coder-1.5b) name=qwen2.5-coder-1.5b ;;
    gemma|gemma3|gemma3-270m) name=gemma3-270m ;;
    *) name="$arg" ;;
  esac
  for d in "${KVTRIM_MODELS_DIR:-}" "$REPO/models" "$HOME/.local/share/kvtrim/models"; do
    [[ -n "$d" && -f "$d/$name.gguf" ]] && { echo "$d/$name.gguf"; return 0; }
  done
  return 1
}
