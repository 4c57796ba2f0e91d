#!/usr/bin/env bash
# Bad input at the command line gets a clear message and a non-zero exit, never a crash.
# Each case: expected exit code, a regex the stderr must match, then the arguments.
set -u
bin="${KVTRIM_BIN:?KVTRIM_BIN not set}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "$0")/expect.sh"

printf 'NOPE\x03\x00\x00\x00' > "$tmp/wrong_magic.gguf"
printf 'GGUF\x03\x00\x00\x00\x01' > "$tmp/truncated.gguf"
printf 'GGUF\x09\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00' > "$tmp/bad_version.gguf"
: > "$tmp/empty.gguf"
# v3 header claiming 1 kv pair whose key length is 2^62
printf 'GGUF\x03\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x40' > "$tmp/huge_key.gguf"

expect 2 "" nosuchverb
expect 2 "" run --no-such-flag
expect 2 "threads" run -t -3 -p hi
expect 2 "excludes" run --f32-prefill --int8-prefill -p hi
expect 1 "unknown model 'no-such-model'" run -m no-such-model -p hi
expect 1 "does not exist" run -m "$tmp/missing.gguf" -p hi
expect 1 "magic" inspect "$tmp/wrong_magic.gguf"
expect 1 "truncated|too small|end of file" inspect "$tmp/truncated.gguf"
expect 1 "truncated|too small|end of file" inspect "$tmp/empty.gguf"
expect 1 "version" inspect "$tmp/bad_version.gguf"
expect 1 "length|truncated|exceeds" inspect "$tmp/huge_key.gguf"
expect 1 "magic" run -m "$tmp/wrong_magic.gguf" -p hi
expect 1 "cannot read file" ppl -m "$tmp/wrong_magic.gguf" -f "$tmp/no_such_text.txt"
# eval sweep: a bad grid fails before any model loads
expect 1 "unknown press 'nosuchpress'" eval sweep ruler --presses snapkv,nosuchpress --out-dir "$tmp/sweep"
expect 1 "--ratios '0.5,1.5': '1.5' is not a compression ratio" eval sweep ruler --presses snapkv --ratios 0.5,1.5 --out-dir "$tmp/sweep"
# a composition sweeps its last press's ratio; its fixed part must parse before any model loads
expect 1 "unknown option 'nosuch'|nosuch" eval sweep mc --bench piqa --presses "snapkv:nosuch=1+spark" --out-dir "$tmp/sweep"
expect 2 "" eval sweep ruler --presses snapkv
# eval gsm8k: a malformed data file is named before any model loads
printf '%s\n' '{"question": "q", "answer": "x\n#### 1"}' 'not json' > "$tmp/gsm8k_bad.jsonl"
printf '%s\n' '{"question": "q", "answer": "no final line"}' > "$tmp/gsm8k_nofinal.jsonl"
expect 1 "gsm8k_bad.jsonl:2: not valid JSON" eval gsm8k -m "$tmp/missing.gguf" --data "$tmp/gsm8k_bad.jsonl"
expect 1 "cannot read GSM8K file" eval gsm8k -m "$tmp/missing.gguf" --data "$tmp/no_such.jsonl"
expect 1 "gsm8k_nofinal.jsonl:1: the answer has no final '#### <number>'" eval sweep gsm8k -m "$tmp/missing.gguf" --data "$tmp/gsm8k_nofinal.jsonl" --presses snapkv --out-dir "$tmp/sweep"
printf '%s\n' '{"question": "q", "answer": "x\n#### 1"}' > "$tmp/gsm8k_one.jsonl"
expect 1 "1 items cannot give 5 shots" eval gsm8k -m "$tmp/missing.gguf" --data "$tmp/gsm8k_one.jsonl" --shots 5
expect 2 "" eval gsm8k --shots 0
# calibrate: a missing model, a damaged calibration file, an unknown method
echo "some calibration text" > "$tmp/calib.txt"
expect 1 "model file '.*missing.gguf' does not exist" calibrate -m "$tmp/missing.gguf" -f "$tmp/calib.txt"
expect 1 "calibration file '.*wrong_magic.gguf' is not a readable GGUF" calibrate --report --calib "$tmp/wrong_magic.gguf" -m "$tmp/missing.gguf" -f "$tmp/calib.txt"
expect 1 "unknown basis method 'nosuch'" calibrate --methods ksvd,nosuch -m "$tmp/missing.gguf" -f "$tmp/calib.txt"
expect 1 "--stief needs the EigenAttention fits" calibrate --stief --methods ksvd -m "$tmp/missing.gguf" -f "$tmp/calib.txt"
expect 1 "--calib needs --report, or --stief" calibrate --calib "$tmp/wrong_magic.gguf" -m "$tmp/missing.gguf" -f "$tmp/calib.txt"
expect 1 "calibration file '.*wrong_magic.gguf' is not a readable GGUF" calibrate --stief --calib "$tmp/wrong_magic.gguf" -m "$tmp/missing.gguf" -f "$tmp/calib.txt"
expect 2 "--stief-init: zero not in" calibrate --stief --stief-init zero -m "$tmp/missing.gguf" -f "$tmp/calib.txt"
# kvtrim serve: options checked before the model loads
expect 1 "'12XB': unknown unit 'xb'" serve -m "$tmp/missing.gguf" --kv-budget 12XB
expect 1 "'lots' is not a size" serve -m "$tmp/missing.gguf" --kv-budget lots
expect 1 "nosuch" serve -m "$tmp/missing.gguf" --press nosuch:0.5
expect 1 "nosuch" serve -m "$tmp/missing.gguf" --pressure-press nosuch:0.5
expect 1 "model file '.*missing.gguf' does not exist" serve -m "$tmp/missing.gguf" --kv-budget 1GiB
expect 2 "" serve -m "$tmp/missing.gguf" --parallel 0
expect 2 "" serve -m "$tmp/missing.gguf" -np 100000
expect 2 "" serve -m "$tmp/missing.gguf" --port 70000

echo "$pass passed, $failed failed"
[ "$failed" -eq 0 ]
