#!/usr/bin/env bash
# Reproduces docs/results/stiefattention.md's perplexity table: StiefAttention (Uniform, Pareto,
# Weighted Pareto) and EigenAttention's procedure at the same error budgets, compressed
# throughout, on WikiText-2 test and a held-apart book, with the KV bytes measured by the cache;
# then Palu (fixed ratios PALU_RATIOS, whitened; two of them also unwhitened and with its bases
# on the post-RoPE keys) and K-SVD at the same ratios.
# Needs a calibration made with `kvtrim calibrate -m MODEL --stief` and the book from
# scripts/install_books.sh. Every run appends to its own JSONL (rerunning resumes).
#   scripts/results_stiefattention.sh [MODEL] [EPS...]
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
model="${1:-smollm2}"
shift || true
eps_list=("$@")
[[ ${#eps_list[@]} -gt 0 ]] || eps_list=(0.05 0.1 0.2 0.4)
bin="${KVTRIM_BIN:-$repo/build/ci/kvtrim}"
out="$repo/docs/results/stiefattention"
mkdir -p "$out"
data="${KVTRIM_SHARED_DATA:-$repo/../shared/data}"
declare -A texts=([wiki]="$data/wikitext-2/test.txt" [book]="$repo/data/books/sherlock_holmes.txt")
for t in wiki book; do
  [[ -s "${texts[$t]}" ]] || { echo "results_stiefattention: ${texts[$t]} is missing" >&2; exit 2; }
done
run() {  # text tag spec
  local text="$1" tag="$2" spec="$3"
  echo "== $model $text $spec" >&2
  "$bin" eval ppl -m "$model" -t "${THREADS:-1}" -b 512 -f "${texts[$text]}" --ctx 512 \
    --max-tokens 4096 --mode throughout --press "$spec" --out "$out/${model}_${text}_${tag}.jsonl" \
    2> "$out/${model}_${text}_${tag}.log" | grep '^| throughout' || true
}
for text in wiki book; do
  for eps in "${eps_list[@]}"; do
    for alloc in uniform pareto wpareto; do
      run "$text" "stief_${alloc}_${eps}" "stiefattention:eps=$eps,alloc=$alloc"
    done
    run "$text" "eigen_${eps}" "eigenattention:eps=$eps"
  done
done
palu_ratios=(${PALU_RATIOS:-0.125 0.25 0.375 0.5})
for text in wiki book; do
  for r in "${palu_ratios[@]}"; do
    run "$text" "palu_$r" "palu:ratio=$r"
    run "$text" "ksvd_$r" "ksvd:ratio=$r"
  done
  for r in "${palu_ratios[@]:1:2}"; do
    run "$text" "palu_none_$r" "palu:ratio=$r,whiten=none"
    run "$text" "palu_post_$r" "palu:ratio=$r,rope=post"
  done
done
