#!/usr/bin/env bash
# Regenerates the binary seeds of the fuzz corpora (the text seeds are written by hand):
# tiny models of each architecture (fuzz/corpus/model, also read by the tokenizer and
# press_spec targets), a GGUF with every value type (fuzz/corpus/gguf) and calibrations of
# the tiny models (fuzz/corpus/calibration). Needs a build with tests (default build/ci).
# Usage: fuzz/make_seeds.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build/ci}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$build/fuzz/fuzz_make_seeds" "$tmp"
cp "$tmp"/tiny_*.gguf fuzz/corpus/model/
cp "$tmp"/all_types.gguf fuzz/corpus/gguf/
cp "$tmp"/tiny_llama.gguf fuzz/corpus/gguf/
# Calibration text: a few sentences are enough for tiny models.
printf 'The quick brown fox jumps over the lazy dog. %.0s' $(seq 1 40) > "$tmp/calib.txt"
for a in llama qwen2 gemma3; do
  "$build/kvtrim" calibrate -m "$tmp/tiny_$a.gguf" -f "$tmp/calib.txt" --seqs 2 --seq-len 32 \
    --layer-io-rows 4 -t 1 -o "fuzz/corpus/calibration/tiny_$a.kvcalib" >/dev/null
done
# One with StiefAttention's section (format version 2): 6 x 16-token sequences from the text's end.
"$build/kvtrim" calibrate --stief --calib fuzz/corpus/calibration/tiny_llama.kvcalib -m "$tmp/tiny_llama.gguf" \
  -f "$tmp/calib.txt" --stief-seqs 6 --stief-len 16 --stief-epochs 1 --stief-rows 4 --stief-val-rows 4 \
  -t 1 -o fuzz/corpus/calibration/tiny_llama_stief.kvcalib >/dev/null
ls -l fuzz/corpus/model fuzz/corpus/gguf fuzz/corpus/calibration
