#!/usr/bin/env bash
# kvtrim serve on the real default model, black box over loopback: chat, stream, a press that
# frees bytes, bad inputs (4xx with an OpenAI error object), a client that hangs up mid-stream,
# the official openai Python client, and the web page in headless Chromium (DOM checked after
# one chat turn, and after two with a press and the quality guard; the screenshots go to
# $KVTRIM_TEST_LOG_DIR), a second server on the port in use,
# and a clean stop on SIGINT. Every wait is for the state it checks (tests/wait.sh), bounded by
# minutes only to catch a hang.
set -u
bin="${KVTRIM_BIN:?KVTRIM_BIN not set}"
here=$(cd "$(dirname "$0")" && pwd)
logdir="${KVTRIM_TEST_LOG_DIR:-$(mktemp -d)}"
mkdir -p "$logdir"
tmp=$(mktemp -d)
source "$here/wait.sh"
pass=0; failed=0
ok() { pass=$((pass + 1)); }
bad() { failed=$((failed + 1)); echo "FAIL [$1]: $2"; }

"$bin" serve -m smollm2 --port 0 -c 512 --parallel 2 -t 2 > "$tmp/serve.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$tmp"' EXIT
url=""
up() {  # the server printed its address and answers /health (or it has exited)
  kill -0 $pid 2>/dev/null || return 0
  url=$(grep -o 'http://127.0.0.1:[0-9]*' "$tmp/serve.log" | head -1)
  [ -n "$url" ] && curl -sf "$url/health" > /dev/null
}
wait_for 300 "kvtrim serve to answer /health" up && kill -0 $pid 2>/dev/null ||
  { cat "$tmp/serve.log"; echo "server did not start"; exit 1; }

post() {  # post PATH BODY -> "STATUS BODY"
  curl -s -o "$tmp/body" -w '%{http_code}' -H 'Content-Type: application/json' -d "$2" "$url$1"
  printf ' '; cat "$tmp/body"
}
expect() {  # expect NAME STATUS REGEX PATH BODY
  local out; out=$(post "$4" "$5")
  if [[ "$out" =~ ^$2\ .*$3 ]]; then ok; else bad "$1" "$(echo "$out" | head -c 400)"; fi
}

q='{"role":"user","content":"What is the capital of France? Answer in one sentence."}'
expect chat 200 '"content":"[^"]*Paris' /v1/chat/completions "{\"messages\":[$q],\"max_tokens\":24,\"temperature\":0}"
expect stream 200 'data: \[DONE\]' /v1/chat/completions "{\"messages\":[$q],\"max_tokens\":8,\"stream\":true}"
long=$(for i in $(seq 1 30); do printf 'The quick brown fox jumps over the lazy dog. '; done)
out=$(post /v1/completions "{\"prompt\":\"$long\",\"max_tokens\":4,\"kv_press\":\"snapkv:0.5\"}")
held=$(echo "$out" | grep -o '"kv_bytes":[0-9]*' | cut -d: -f2)
dense=$(echo "$out" | grep -o '"kv_bytes_dense":[0-9]*' | cut -d: -f2)
if [ -n "$held" ] && [ -n "$dense" ] && [ "$held" -lt $((dense * 7 / 10)) ]; then ok; else bad press_frees_bytes "$out"; fi
expect malformed 400 'malformed JSON' /v1/chat/completions '{"messages": ['
expect wrong_type 400 '"param":"max_tokens"' /v1/chat/completions "{\"messages\":[$q],\"max_tokens\":\"many\"}"
expect unknown_press 400 'nosuch' /v1/chat/completions "{\"messages\":[$q],\"kv_press\":\"nosuch:0.5\"}"
expect past_context 400 'context_length_exceeded' /v1/completions "{\"prompt\":\"$long $long\",\"max_tokens\":4}"
expect absurd_max_tokens 400 'max_tokens' /v1/chat/completions "{\"messages\":[$q],\"max_tokens\":100000000}"
expect no_route 404 'no route' /v1/embeddings '{}'

# a client that hangs up after the first event of a long stream (head takes one byte and exits,
# curl's next write fails): the job is cancelled, the server serves on (a raw completion of a
# story opening: unlike a chat answer it rarely ends early, and 400 tokens take far longer than
# the next token)
curl -sN -H 'Content-Type: application/json' \
  -d '{"prompt":"Once upon a time, in a land far away, there lived","max_tokens":400,"stream":true,"temperature":1}' \
  "$url/v1/completions" | head -c 1 > /dev/null
cancelled_job() {
  local n; n=$(curl -s "$url/metrics" | grep '^kvtrim_jobs_total{outcome="cancelled"}' | awk '{print $2}')
  [ "${n:-0}" != "0" ]
}
if wait_for 300 'a cancelled job in /metrics' cancelled_job; then ok; else bad client_gone "no cancelled job in /metrics"; fi
expect after_client_gone 200 'Paris' /v1/chat/completions "{\"messages\":[$q],\"max_tokens\":24,\"temperature\":0}"

# the official openai client (skipped where it is not installed)
PYTHONPATH="$here/../build/pytools${PYTHONPATH:+:$PYTHONPATH}" python3 "$here/server_openai.py" "$url" > "$tmp/openai.log" 2>&1
rc=$?
if [ $rc -eq 0 ]; then ok; elif [ $rc -eq 77 ]; then echo "skip: $(cat "$tmp/openai.log")"; else bad openai "$(tail -5 "$tmp/openai.log")"; fi

# the web page in headless Chromium: one chat turn; once the page says the reply is over and the
# heat map is drawn (web_page.py waits for that), the DOM has the reply and the heat map
browser=$(command -v chromium || command -v chromium-browser || true)
if [ -n "$browser" ]; then
  page="$url/?autosend=What%20is%20the%20capital%20of%20France%3F%20Answer%20in%20one%20sentence.&max_tokens=16&temperature=0"
  rm -f "$logdir/serve_page.png"
  python3 "$here/web_page.py" "$browser" "$page" "$tmp/dom.html" "$logdir/serve_page.png" 300 > "$tmp/chrome.log" 2>&1
  if grep -q 'data-done="1"' "$tmp/dom.html" && grep -q 'class="msg assistant' "$tmp/dom.html" &&
     grep -q 'class="cell"' "$tmp/dom.html" && grep -q 'Paris' "$tmp/dom.html"; then ok; else
    bad web_page "DOM after one turn lacks the reply or the heat map: $(grep -o 'id="status"[^<]*<' "$tmp/dom.html" | head -1) $(tail -5 "$tmp/chrome.log")"; fi
  if [ -s "$logdir/serve_page.png" ]; then ok; echo "screenshot: $logdir/serve_page.png"; else bad screenshot "$(tail -3 "$tmp/chrome.log")"; fi
  # the quality guard on the page: two turns with a press and a limit no compression of this
  # conversation meets (0), so the second turn's context (the first turn and its reply) is
  # compressed, refused, retried at half the ratio, and finally left whole; the compression line
  # shows the press, the loss estimate and every attempt
  doc="The%20lighthouse%20keeper%20of%20the%20northern%20island%20kept%20a%20log%20of%20every%20ship%20that%20passed%2C%20the%20weather%20at%20dawn%20and%20at%20dusk%2C%20and%20the%20number%20of%20gulls%20on%20the%20rocks.%20Summarise%20this%20in%20one%20sentence."
  page="$url/?autosend=$doc&autosend=What%20did%20the%20keeper%20count%3F&max_tokens=24&temperature=0&kv_press=snapkv:0.5&kv_press_max_loss=0"
  rm -f "$logdir/serve_page_guard.png"
  python3 "$here/web_page.py" "$browser" "$page" "$tmp/dom2.html" "$logdir/serve_page_guard.png" 300 > "$tmp/chrome2.log" 2>&1
  comp=$(grep -o '<div id="compression">[^<]*<' "$tmp/dom2.html" | head -1)
  if [ "$(grep -o 'class="msg assistant' "$tmp/dom2.html" | wc -l)" -eq 2 ] &&
     [[ "$comp" == *"compression snapkv"* ]] && [[ "$comp" == *"loss estimate"* ]] &&
     [[ "$comp" == *"guard ≤ 0:"*"refused"* ]]; then ok; else
    bad web_page_guard "compression line after two turns: ${comp:-none} $(grep -o 'id="status"[^<]*<' "$tmp/dom2.html" | head -1) $(tail -5 "$tmp/chrome2.log")"; fi
  if [ -s "$logdir/serve_page_guard.png" ]; then ok; echo "screenshot: $logdir/serve_page_guard.png"; else bad screenshot_guard "$(tail -3 "$tmp/chrome2.log")"; fi
else
  echo "skip: chromium not installed (scripts/install_deps.sh --test installs it)"
fi
# a second server on the port in use fails to start, with the reason (cpp-httplib's default
# SO_REUSEPORT would let it bind and split the connections between the two)
port=${url##*:}
# (it loads the model before it binds: the time limit only catches a server that starts anyway)
timeout 300 "$bin" serve -m smollm2 --port "$port" -c 512 --parallel 1 -t 1 > "$tmp/second.log" 2>&1
rc=$?
if [ $rc -ne 0 ] && grep -q "cannot bind 127.0.0.1:$port" "$tmp/second.log"; then ok; else
  bad port_in_use "rc $rc: $(tail -2 "$tmp/second.log")"; fi

# SIGINT stops the server cleanly (exit 0), although bash starts a script's background job with
# SIGINT ignored (the server installs its own handler): the first signal starts a drain (new requests
# get a 503, /health says draining) and lets a
# running stream go on, a second ends it with a 503 error event
curl -sN -m 300 -H 'Content-Type: application/json' \
  -d '{"prompt":"Once upon a time, in a land far away, there lived","max_tokens":400,"stream":true,"temperature":1}' \
  "$url/v1/completions" > "$tmp/drain.txt" 2>&1 &
cpid=$!
wait_for 300 "the stream's first event" test -s "$tmp/drain.txt"
kill -INT $pid
wait_for 300 "the server's log line after the first SIGINT" grep -q "draining: /health is 503" "$tmp/serve.log"
kill -INT $pid
stopped() { ! kill -0 $pid 2>/dev/null; }
if ! wait_for 300 "the server to exit after two SIGINTs" stopped; then
  bad sigint_stops "still running after two SIGINTs"
else
  wait $pid; rc=$?
  if [ $rc -eq 0 ] && grep -q "signal 2 (SIGINT), draining" "$tmp/serve.log" &&
     grep -q "signal 2 (SIGINT) again, ending the running requests" "$tmp/serve.log"; then ok; else
    bad sigint_stops "rc $rc: $(tail -3 "$tmp/serve.log")"; fi
fi
wait $cpid
# the stream ends well-formed: the 503 of the second signal (or its own end, had it finished first)
if tail -c 400 "$tmp/drain.txt" | grep -q 'data: \[DONE\]' &&
   { grep -q 'the server is shutting down' "$tmp/drain.txt" || grep -q '"finish_reason":"' "$tmp/drain.txt"; }; then ok; else
  bad drain_stream "$(tail -c 300 "$tmp/drain.txt")"; fi
echo "$pass passed, $failed failed"
[ "$failed" -eq 0 ]
