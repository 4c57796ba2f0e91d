#!/usr/bin/env bash
# Interrupted work loses nothing: each long-running command is killed with SIGKILL at
# several points of its run, then rerun until it finishes; its final results must equal an
# uninterrupted run's (timing fields aside), and between kills every results file must be
# readable: complete JSON lines, with at most a torn last line (which the resume cuts off and
# reruns), summaries either absent or whole (written to a temporary file, then renamed).
# Commands: eval ruler, eval sweep ruler, eval ppl, calibrate (which keeps nothing partial:
# a rerun starts over and must write the same file; the file it replaces is never torn).
# Runs on a tiny random model (about 30 s). The kills wait for events, not for time: the i-th
# killed run (KVTRIM_KILLS of them, default 4) is killed once its progress output (one stderr line
# per 5 % when stderr is not a terminal) shows i lines, i.e. part way through what was left, so a
# kill lands on a busy machine as on a quiet one; a run that ends before its event is not a kill.
set -u
bin="${KVTRIM_BIN:?KVTRIM_BIN not set}"
writer="${KVTRIM_TINY_WRITER:?KVTRIM_TINY_WRITER not set}"
n_kills="${KVTRIM_KILLS:-4}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failed=0
fail() { echo "FAIL: $*"; failed=$((failed + 1)); }

model=$("$writer" llama 4096 "$tmp") || { echo "cannot write the tiny model"; exit 1; }
text="$tmp/text.txt"  # ~700 KB of words: long enough for a calibration that runs a few seconds
python3 -c "
import random
random.seed(1)
w = 'fox dog river stone light number green quick lazy jumps over the a of and'.split()
print(' '.join(random.choice(w) for _ in range(150000)))" > "$text"

# Rows of a results JSONL with timing fields removed, sorted: what must not change.
normalize() {
  python3 - "$1" <<'PY'
import json, re, sys
vol = re.compile(r'(_s|_tps|seconds|date)$')
def clean(x):
    if isinstance(x, dict):
        return {k: clean(v) for k, v in x.items() if not vol.search(k)}
    if isinstance(x, list):
        return [clean(v) for v in x]
    if isinstance(x, str) and x.startswith('{'):
        try:
            return clean(json.loads(x))
        except ValueError:
            return x
    return x
rows = [json.dumps(clean(json.loads(l)), sort_keys=True) for l in open(sys.argv[1]) if l.strip()]
print('\n'.join(sorted(rows)))
PY
}

# Every line but a torn last one (no '\n') must be JSON.
check_jsonl() {  # FILE WHAT
  [ -f "$1" ] || return 0
  python3 - "$1" <<'PY' || fail "$2: $1 has a damaged line before its end"
import json, sys
data = open(sys.argv[1], 'rb').read().decode('utf-8', 'replace')
lines = data.split('\n')
for l in lines[:-1]:
    if l.strip():
        json.loads(l)
PY
}

# progress_lines FILE: how many progress lines ("ruler [###...] 15% 3/20 q | ...") a run's stderr holds.
progress_lines() {
  local n
  n=$(grep -cE '\] +[0-9]+% [0-9]+/' "$1" 2>/dev/null)
  echo "${n:-0}"
}

# run_killed NAME OUTFILE CHECK CMD...: reference run, then runs killed (SIGKILL) at progress
# events, then a final run; compares. CHECK is a function run on the outputs after every kill.
run_killed() {
  local name="$1" out="$2" check="$3"; shift 3
  local ref="$tmp/ref_$name" t0 t1 dur
  rm -rf "$ref"; mkdir -p "$ref"
  t0=$(date +%s.%N)
  (cd "$ref" && "$@" >/dev/null 2>"$ref/.stderr") || { fail "$name: the uninterrupted run failed: $(tail -3 "$ref/.stderr")"; return; }
  t1=$(date +%s.%N)
  dur=$(python3 -c "print(round($t1 - $t0, 1))")
  local run="$tmp/run_$name" kills=0 i
  rm -rf "$run"; mkdir -p "$run"
  for ((i = 1; i <= n_kills; i++)); do
    local err="$run/.stderr_$i"
    (cd "$run" && exec "$@" >/dev/null 2>"$err") &
    local pid=$!
    # the event: the i-th progress line of this run, or the run's end (an upper bound of 30 min
    # only catches a hang)
    local end=$((SECONDS + 1800))
    while kill -0 "$pid" 2>/dev/null && [ "$(progress_lines "$err")" -lt "$i" ]; do
      if [ "$SECONDS" -ge "$end" ]; then fail "$name: no progress line $i after 30 min"; break; fi
      sleep 0.05
    done
    if kill -9 "$pid" 2>/dev/null; then kills=$((kills + 1)); fi
    wait "$pid" 2>/dev/null
    cat "$err" >> "$run/.stderr"
    "$check" "$run" "$name"
  done
  (cd "$run" && "$@" >/dev/null 2>>"$run/.stderr") || { fail "$name: the resumed run failed: $(tail -3 "$run/.stderr")"; return; }
  if [ "$kills" -eq 0 ]; then fail "$name: no kill landed while the command ran (the run is too short)"; fi
  if [ "$out" = "-calib" ]; then
    diff <("$bin" inspect "$ref/out.kvcalib" | grep -v 'meta.date\|^file:') \
         <("$bin" inspect "$run/out.kvcalib" | grep -v 'meta.date\|^file:') >/dev/null \
      || fail "$name: the calibration written after $kills kills differs from the uninterrupted run's"
  else
    diff <(normalize "$ref/$out") <(normalize "$run/$out") > "$tmp/diff_$name" \
      || fail "$name: results after $kills kills differ from the uninterrupted run's: $(head -c 400 "$tmp/diff_$name")"
  fi
  echo "$name: $kills kills, uninterrupted run ${dur}s"
}

check_ruler() { check_jsonl "$1/out.jsonl" "$2"; }
check_sweep() {
  check_jsonl "$1/sweep/results.jsonl" "$2"
  if [ -f "$1/sweep/summary.csv" ]; then
    python3 -c "import csv,sys; list(csv.reader(open(sys.argv[1])))" "$1/sweep/summary.csv" || fail "$2: summary.csv is damaged"
  fi
}
check_ppl() { check_jsonl "$1/out.jsonl" "$2"; }
check_calib() {
  if [ -f "$1/out.kvcalib" ]; then "$bin" inspect "$1/out.kvcalib" >/dev/null 2>&1 || fail "$2: a torn calibration file was left behind"; fi
}

common=(-m "$model" -t 2)
run_killed ruler out.jsonl check_ruler "$bin" eval ruler "${common[@]}" --ctx-len 1024 --samples 40 \
  --tasks niah_single_1,niah_multikey_1,fwe --press snapkv:0.5 --out out.jsonl
run_killed sweep sweep/results.jsonl check_sweep "$bin" eval sweep ruler "${common[@]}" --ctx-len 1024 --samples 12 \
  --tasks niah_single_1,niah_multikey_1 --presses snapkv,streamingllm --ratios 0.25,0.75 --out-dir sweep
run_killed ppl out.jsonl check_ppl "$bin" eval ppl "${common[@]}" -f "$text" -c 128 --max-tokens 12000 \
  --press snapkv:0.5 --mode throughout --out out.jsonl
run_killed calibrate -calib check_calib "$bin" calibrate "${common[@]}" -f "$text" --seqs 600 --seq-len 256 \
  --layer-io-rows 16 -o out.kvcalib

if [ "$failed" -ne 0 ]; then echo "$failed failure(s)"; exit 1; fi
echo "kill_resume: all commands resumed to the uninterrupted results"
