#!/usr/bin/env bash
# Limits that fail cleanly (issue: reliability): a context or prompt whose KV cache would not fit
# the memory limit is refused before allocation with the numbers; thread counts and batch sizes
# are bounded; a server budget larger than the machine's memory is refused at start; a model
# file truncated while kvtrim runs ends in a clear message, not "Bus error". On a tiny model.
set -u
bin="${KVTRIM_BIN:?KVTRIM_BIN not set}"
writer="${KVTRIM_TINY_WRITER:?KVTRIM_TINY_WRITER not set}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "$0")/expect.sh"
source "$(dirname "$0")/wait.sh"

model=$("$writer" llama 65536 "$tmp") || { echo "cannot write the tiny model"; exit 1; }
long=$(for i in $(seq 1 300); do printf 'word%d ' "$i"; done)

# The whole context's uncompressed cache against --mem-limit: refused at once, with the numbers.
expect 1 "a context of 65536 tokens would need .* of uncompressed KV cache .*more than the KV memory limit of 1.00 MiB" \
  run -m "$model" -c 65536 --mem-limit 1MiB -p hi -n 1
expect 1 "a context of 65536 tokens would need" run -m "$model" -c 65536 --mem-limit 1MiB -ctk q4_0 -ctv q4_0 -p hi -n 1
# Default context (the model's): the prompt is checked before its prefill.
expect 1 "adding [0-9]+ tokens would need .* more than the KV memory limit of 64.0 KiB" \
  run -m "$model" --mem-limit 64KiB -p "$long" -n 1
# The same prompt fits without the limit, and with a limit that holds it.
expect 0 "" run -m "$model" -p "$long" -n 2
expect 0 "" run -m "$model" --mem-limit 64MiB -p "$long" -n 2
expect 0 "" run -m "$model" -c 65536 --mem-limit off -p hi -n 1
expect 1 "not a size" run -m "$model" --mem-limit lots -p hi
expect 1 "unknown unit" run -m "$model" --mem-limit 5parsecs -p hi
# Bounds on threads and batch sizes (command-line errors, exit 2).
expect 2 "threads" run -m "$model" -t 100000 -p hi
expect 2 "batch" run -m "$model" -b 0 -p hi
expect 2 "batch" run -m "$model" -b 100000000 -p hi
# A server budget the machine cannot hold.
expect 1 "--kv-budget .* is more than the .* of memory available" serve -m "$model" --port 0 --kv-budget 900000GiB
# A model truncated while in use: SIGBUS becomes a clear error. Truncated once the run is
# generating (its first token printed: the model is mapped and read), not at a guessed time.
cp "$model" "$tmp/victim.gguf"
"$bin" run -m "$tmp/victim.gguf" -p hi -n 60000 -t 1 >"$tmp/bus.out" 2>"$tmp/bus.err" &
pid=$!
wait_for 300 "the run's first generated token" test -s "$tmp/bus.out"
truncate -s 4096 "$tmp/victim.gguf"
wait "$pid"; rc=$?
if [ "$rc" -eq 1 ] && grep -q "truncated or rewritten while kvtrim was using it" "$tmp/bus.err"; then
  pass=$((pass + 1))
else
  failed=$((failed + 1))
  echo "FAIL: truncated model in use -> exit $rc, stderr: $(head -c 600 "$tmp/bus.err")"
fi

echo "limits: $pass passed, $failed failed"
[ "$failed" -eq 0 ]
