#!/usr/bin/env bash
# llamacpp_kv_ppl.sh — reference perplexities from llama.cpp with quantized KV caches.
#
# An independent reference for kvtrim's KV cache types (--kv-type f16/q8/fp8/q4): llama.cpp's
# `llama-perplexity` on the same GGUF files and the same WikiText-2 windows that
# `kvtrim ppl -c 1024 --max-tokens <chunks*1024>` uses, once per (K type, V type) pair.
#
# What it does
#   1. Downloads the llama-cpp-python sdist (pinned: $LLAMACPP_PY_VERSION) from PyPI with
#      `pip download --no-deps --no-binary :all:` into $CACHE_DIR (~/.cache/kvtrim/llamacpp),
#      unpacks it, and builds ONLY the `llama-perplexity` target of the vendored llama.cpp
#      (vendor/llama.cpp) into $CACHE_DIR/build, under `nice -n 19`, `-j 2`. Nothing is written
#      inside the repository except the results file. The build is skipped when
#      $CACHE_DIR/build/bin/llama-perplexity exists (delete $CACHE_DIR/build to rebuild).
#      CPU flags are pinned (GGML_NATIVE=OFF, AVX2/FMA/F16C on, AVX-512/AMX off, no OpenMP):
#      llama.cpp's AMX/AVX-512 paths segfaulted on these VMs before.
#   2. For each model and each KV pair, runs
#        llama-perplexity -m M.gguf -f wikitext-2/test.txt -c CTX -b CTX --chunks N -t THREADS \
#                         -fa on -ctk K -ctv V
#      and parses llama.cpp's "Final estimate: PPL = x +/- y".
#   3. Appends one JSON line per (model, ctk, ctv, ctx, chunks) to $OUT. Resumable: a line
#      already in $OUT with the same (model, ctk, ctv, ctx, chunks) is not run again.
#      Full llama.cpp logs go to $CACHE_DIR/logs/.
#
# Windows (same as kvtrim's): the text is tokenized whole (BOS first when the model adds one),
# chunk i is tokens [i*CTX, (i+1)*CTX) with its first token replaced by BOS, evaluated from an
# empty cache; the logits at positions CTX/2 .. CTX-2 are scored (CTX/2 - 1 tokens per chunk).
# The kvtrim command over the same tokens is
#   kvtrim ppl -m MODEL -f ../shared/data/wikitext-2/test.txt -c CTX --max-tokens $((N*CTX))
#
# Usage
#   scripts/ref/llamacpp_kv_ppl.sh [options]
#     --models "A B ..."      models (kvtrim names; default: smollm2 gemma3-270m qwen2.5-coder-1.5b)
#     --pairs "K,V K,V ..."   KV type pairs (default: f16,f16 q8_0,q8_0 q4_0,q4_0;
#                             llama.cpp names: f32 f16 bf16 q8_0 q4_0 q4_1 iq4_nl q5_0 q5_1)
#     --chunks N              chunks of CTX tokens (default 8 -> 8192 tokens, 4088 scored)
#     --chunks-for MODEL=N    per-model override of --chunks (repeatable), e.g. for the slow Qwen
#     --ctx N                 window (default 1024)
#     --threads N             threads (default 2)
#     --data FILE             text (default /work/shared/data/wikitext-2/test.txt, or
#                             $KVTRIM_DATA_DIR/wikitext-2/test.txt)
#     --out FILE              results (default docs/results/kv_types/llamacpp_ppl.jsonl)
#     --build-only            build llama-perplexity and stop
#   Environment: LLAMACPP_PY_VERSION (default 0.3.36), KVTRIM_LLAMACPP_DIR (cache dir, default
#   ~/.cache/kvtrim/llamacpp), KVTRIM_MODELS_DIR (searched first for MODEL.gguf, then
#   <repo>/models, then ~/.local/share/kvtrim/models — as src/engine/model_path.cpp does).
#
# Everything heavy runs under `nice -n 19` (the machine is shared with compiles).
#
# docs/results/kv_types/llamacpp_ppl.jsonl was made with (Qwen at 4 chunks: ~65 s per chunk
# on 2 shared cores; its f16 pair was also run at 8 chunks once):
#   scripts/ref/llamacpp_kv_ppl.sh --pairs "f16,f16 q8_0,q8_0 q4_0,q4_0 q8_0,q4_0" \
#       --chunks-for qwen2.5-coder-1.5b=4
# Note: without --chunks-for, Qwen is keyed (and run) at --chunks 8, a separate entry.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

MODELS="smollm2 gemma3-270m qwen2.5-coder-1.5b"
PAIRS="f16,f16 q8_0,q8_0 q4_0,q4_0"
CHUNKS=8
CTX=1024
THREADS=2
DATA=""
OUT="$REPO/docs/results/kv_types/llamacpp_ppl.jsonl"
BUILD_ONLY=0
declare -A CHUNKS_FOR=()

die() { echo "llamacpp_kv_ppl: error: $*" >&2; exit 1; }
log() { echo "llamacpp_kv_ppl: $*" >&2; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    --models) MODELS="$2"; shift 2 ;;
    --pairs) PAIRS="$2"; shift 2 ;;
    --chunks) CHUNKS="$2"; shift 2 ;;
    --chunks-for) [[ "$2" == *=* ]] || die "--chunks-for wants MODEL=N"; CHUNKS_FOR["${2%%=*}"]="${2#*=}"; shift 2 ;;
    --ctx) CTX="$2"; shift 2 ;;
    --threads) THREADS="$2"; shift 2 ;;
    --data) DATA="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --build-only) BUILD_ONLY=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done

if [[ -z "$DATA" ]]; then
  for d in "${KVTRIM_DATA_DIR:-}" /work/shared/data "$REPO/../shared/data"; do
    [[ -n "$d" && -f "$d/wikitext-2/test.txt" ]] && { DATA="$d/wikitext-2/test.txt"; break; }
  done
fi
[[ -n "$DATA" && -f "$DATA" ]] || die "WikiText-2 test.txt not found (use --data FILE)"

# ---------------------------------------------------------------------------------------------
# 1. sdist -> vendored llama.cpp -> llama-perplexity (scripts/ref/llamacpp_build.sh)
source "$REPO/scripts/ref/llamacpp_build.sh"
llamacpp_build llama-perplexity || die "building llama-perplexity failed"
BIN="$BUILD/bin/llama-perplexity"
log "llama-perplexity: $BIN (llama-cpp-python $LLAMACPP_PY_VERSION, llama.cpp $LCPP_COMMIT)"
[[ "$BUILD_ONLY" == 1 ]] && exit 0

# ---------------------------------------------------------------------------------------------
# 2. runs
resolve_model() { llamacpp_resolve_model "$@"; }

mkdir -p "$(dirname "$OUT")"
touch "$OUT"

have_result() {  # model ctk ctv ctx chunks
  python3 - "$OUT" "$@" <<'PY'
import json, sys
out, model, ctk, ctv, ctx, chunks = sys.argv[1:]
for line in open(out):
    line = line.strip()
    if not line:
        continue
    try:
        r = json.loads(line)
    except ValueError:
        continue
    if (r.get("model"), r.get("ctk"), r.get("ctv"), str(r.get("ctx")), str(r.get("chunks_requested", r.get("chunks")))) == (model, ctk, ctv, ctx, chunks):
        sys.exit(0)
sys.exit(1)
PY
}

n_fail=0
for model in $MODELS; do
  gguf="$(resolve_model "$model")" || die "model '$model' not found (KVTRIM_MODELS_DIR, $REPO/models, ~/.local/share/kvtrim/models); install it with scripts/install_models.py"
  chunks="${CHUNKS_FOR[$model]:-$CHUNKS}"
  for pair in $PAIRS; do
    ctk="${pair%%,*}" ctv="${pair#*,}"
    [[ "$pair" == *,* && -n "$ctk" && -n "$ctv" ]] || die "bad pair '$pair' (want K,V)"
    if have_result "$model" "$ctk" "$ctv" "$CTX" "$chunks"; then
      log "skip $model ctk=$ctk ctv=$ctv ctx=$CTX chunks=$chunks (in $OUT)"
      continue
    fi
    logf="$CACHE_DIR/logs/${model}_${ctk}_${ctv}_c${CTX}_n${chunks}.log"
    log "run  $model ctk=$ctk ctv=$ctv ctx=$CTX chunks=$chunks -> $logf"
    t0=$(date +%s.%N)
    rc=0
    nice -n 19 "$BIN" -m "$gguf" -f "$DATA" -c "$CTX" -b "$CTX" --chunks "$chunks" \
      -t "$THREADS" -tb "$THREADS" -fa on -ctk "$ctk" -ctv "$ctv" -lv 4 >"$logf" 2>&1 || rc=$?
    t1=$(date +%s.%N)
    if [[ $rc -ne 0 ]] || ! grep -q "Final estimate: PPL = " "$logf"; then
      log "FAILED $model ctk=$ctk ctv=$ctv (rc=$rc); last lines of $logf:"
      tail -n 15 "$logf" >&2
      n_fail=$((n_fail + 1))
      continue
    fi
    python3 - "$logf" "$OUT" "$model" "$gguf" "$ctk" "$ctv" "$CTX" "$chunks" "$THREADS" "$DATA" \
      "$LLAMACPP_PY_VERSION" "$LCPP_COMMIT" "$t0" "$t1" <<'PY'
import json, re, sys, time
(logf, out, model, gguf, ctk, ctv, ctx, chunks, threads, data, pyver, commit, t0, t1) = sys.argv[1:]
text = open(logf, errors="replace").read()
ctx, chunks = int(ctx), int(chunks)
m = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", text)
ppl, err = float(m.group(1)), float(m.group(2))
m = re.search(r"calculating perplexity over (\d+) chunks", text)
n_chunks = int(m.group(1)) if m else chunks
m = re.search(r"\bbuild[:=] *(\S+) \(([^)]*)\)", text)
build = f"{m.group(1)} ({m.group(2)})" if m else "unknown"
# -lv 4 makes llama.cpp log its KV caches (two for sliding-window models such as Gemma 3)
kv = re.findall(r"llama_kv_cache: size = +([0-9.]+) MiB .*K \((\w+)\): .*V \((\w+)\):", text)
kv_mib = round(sum(float(k[0]) for k in kv), 2) if kv else None
kv_types = sorted({f"{k[1]}/{k[2]}" for k in kv})
if kv_types and kv_types != [f"{ctk}/{ctv}"]:
    sys.exit(f"llamacpp_kv_ppl: {logf}: KV cache types {kv_types} are not {ctk}/{ctv}")
m = re.search(r"flash_attn\s*=\s*(\S+)", text)
fa = m.group(1) if m else "on (requested)"
row = {
    "model": model, "ctk": ctk, "ctv": ctv, "ctx": ctx,
    "chunks": n_chunks, "chunks_requested": chunks,
    "n_tokens": n_chunks * ctx,                    # tokens evaluated (windows)
    "n_scored": n_chunks * (ctx - ctx // 2 - 1),   # tokens scored (second half of each window)
    "ppl": ppl, "ppl_err": err,
    "wall_s": round(float(t1) - float(t0), 1),
    "kv_cache_mib": kv_mib, "flash_attn": fa, "threads": int(threads), "batch": ctx,
    "model_file": gguf, "data": data,
    "llama_cpp_python": pyver, "llama_cpp_commit": commit, "llama_cpp_build": build,
    "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
}
with open(out, "a") as f:
    f.write(json.dumps(row) + "\n")
print(f"llamacpp_kv_ppl: {model:20s} {ctk:>5s}/{ctv:<5s} PPL = {ppl:.4f} +/- {err:.4f}  "
      f"({n_chunks} chunks, {row['n_scored']} scored, {row['wall_s']} s)", file=sys.stderr)
PY
  done
done
[[ $n_fail -eq 0 ]] || die "$n_fail run(s) failed"
log "results in $OUT"
