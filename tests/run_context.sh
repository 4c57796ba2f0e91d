#!/usr/bin/env bash
# kvtrim run with a context and questions (issue 40), on a tiny qwen2 model (ChatML): the press
# compresses the context, never the question, and says so; several questions on one document
# each get the answer a run with that question alone gets; `--press none` is no press;
# --press-protect must not be negative; the compression's loss estimate and the --press-max-loss
# guard.
set -u
bin="${KVTRIM_BIN:?KVTRIM_BIN not set}"
writer="${KVTRIM_TINY_WRITER:?KVTRIM_TINY_WRITER not set}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "$0")/expect.sh"

model=$("$writer" qwen2 2048 "$tmp") || { echo "cannot write the tiny model"; exit 1; }
for i in $(seq 1 30); do printf 'Line %d of the document says something. ' "$i"; done > "$tmp/doc.txt"
run=(run -m "$model" -t 1 -n 6 --temp 0)

expect 0 "" "${run[@]}" -p "hello" --press none
expect 0 "" "${run[@]}" --chat -p "hello" --press none
expect 2 "press-protect" "${run[@]}" -p "hello" --press-protect -1
expect 1 "--press-protect is for raw prompts" "${run[@]}" --chat -p "hello" --press-protect 3
expect 1 "several prompts need --context or --chat" "${run[@]}" -p "a" -p "b"
# the compress line: the context's positions and tokens, the protected question
expect 0 "press snapkv:ratio=0.5: context [0-9]+ positions: [0-9]+ -> [0-9]+ tokens .*protected: [0-9]+ tokens \(the question, the end of the user turn and the generation prompt\), all kept" \
  "${run[@]}" --chat --context "$tmp/doc.txt" -p "What does line 3 say?" --press snapkv:0.5
# --context TEXT (no such file), raw layout
expect 0 "press knorm:ratio=0.5: context [0-9]+ positions: .*protected: [0-9]+ tokens \(the question\)" \
  "${run[@]}" --context "$(cat "$tmp/doc.txt")" -p "What does line 3 say?" --press knorm:0.5
# a raw prompt: its last --press-protect tokens are kept
expect 0 "context [0-9]+ positions: .*protected: 5 tokens \(the prompt's last 5 tokens" \
  "${run[@]}" -p "$(cat "$tmp/doc.txt")" --press streamingllm:0.5 --press-protect 5
# too short to compress: a note, not an error
expect 0 "context [0-9]+ positions not compressed: the context has [0-9]+ tokens, fewer than the 32" \
  "${run[@]}" --chat -p "hello" --press snapkv:0.5
# query-aware: scored with the question's queries
expect 0 "scored with the question's queries" \
  "${run[@]}" --chat --context "$tmp/doc.txt" -p "What does line 3 say?" --press snapkv:0.5,query_aware=true
# the loss estimate on the compress line, measured on the question's queries (snapkv is not
# query-aware: it still scores with the window); the guard: 0 leaves the context whole, each
# attempt listed
expect 0 "loss estimate [0-9.]+ \(attention output error over the question's last [0-9]+ queries.*evicted attention mass [0-9.]+" \
  "${run[@]}" --chat --context "$tmp/doc.txt" -p "What does line 3 say?" --press snapkv:0.5
expect 0 "not compressed: the loss estimate exceeded the limit 0 at every attempt \(snapkv:ratio=0.5: [0-9.]+, snapkv:ratio=0.25: [0-9.]+, snapkv:ratio=0.125: [0-9.]+\)" \
  "${run[@]}" --chat --context "$tmp/doc.txt" -p "What does line 3 say?" --press snapkv:0.5 --press-max-loss 0
expect 2 "'--press-max-loss' must be a loss estimate in \[0, 1\]" "${run[@]}" -p "hello" --press-max-loss 1.5
expect 2 "'--press-max-loss' must be a loss estimate in \[0, 1\]" "${run[@]}" -p "hello" --press-max-loss nan
expect 1 "--press-max-loss needs the loss estimate" \
  "${run[@]}" --chat -p "hello" --press snapkv:0.5 --press-max-loss 0.1 --no-loss-estimate
# a compression that grows the cache says so (SPARK's per-token index, signs and fill on q4 rows
# outweigh the pruned half of each row); one that shrinks it does not
expect 0 "KV [0-9.]+ KiB -> [0-9.]+ KiB .*WARNING: the cache grew by [0-9.]+ KiB" \
  "${run[@]}" --kv-type q4_0 --context "$tmp/doc.txt" -p "What?" --press spark:0.5
if "$bin" "${run[@]}" --kv-type q4_0 --context "$tmp/doc.txt" -p "What?" --press snapkv:0.5 2>&1 >/dev/null \
    | grep -q "WARNING: the cache grew"; then
  failed=$((failed + 1)); echo "FAIL [grew_warning]: snapkv:0.5 on q4 warned that the cache grew"
else pass=$((pass + 1)); fi

# One document, two questions: each answer is the answer of a run with that question alone.
for press in snapkv:0.5 snapkv:0.5,query_aware=true; do
  q1="What does line 3 say?"; q2="Which line is last?"
  "$bin" "${run[@]}" --chat --context "$tmp/doc.txt" -p "$q1" --press "$press" > "$tmp/a1" 2>/dev/null
  "$bin" "${run[@]}" --chat --context "$tmp/doc.txt" -p "$q2" --press "$press" > "$tmp/a2" 2>/dev/null
  "$bin" "${run[@]}" --chat --context "$tmp/doc.txt" -p "$q1" -p "$q2" --press "$press" > "$tmp/multi" 2>"$tmp/multi.err"
  { printf 'Q1: %s\nA1:' "$q1"; cat "$tmp/a1"; printf '\nQ2: %s\nA2:' "$q2"; cat "$tmp/a2"; } > "$tmp/want"
  if [ -s "$tmp/a1" ] && cmp -s "$tmp/multi" "$tmp/want"; then pass=$((pass + 1)); else
    failed=$((failed + 1)); echo "FAIL [multi_question $press]: got"; cat -A "$tmp/multi" | head -20
    echo "want"; cat -A "$tmp/want" | head -20; fi
  # the document was prefilled once
  if grep -q "\[Q2\] prompt: [0-9]* tokens (context [0-9]*, prefilled once" "$tmp/multi.err"; then pass=$((pass + 1)); else
    failed=$((failed + 1)); echo "FAIL [multi_question_prefilled_once $press]"; cat "$tmp/multi.err"; fi
done

echo "$pass passed, $failed failed"
[ "$failed" -eq 0 ]
