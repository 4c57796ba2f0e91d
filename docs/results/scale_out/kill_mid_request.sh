#!/usr/bin/env bash
# What a request that is mid-answer gets when its replica is killed (SIGKILL), two replicas
# behind nginx. 1. A non-streaming request: SIGKILL to the replica once it is generating (its
# /health says a slot is processing); nginx resends it to the other replica, the client gets a 200.
# 2. A stream: SIGKILL to its replica once the first tokens arrived; prints the stream's last
# lines and curl's exit status, then the same conversation's next turn (answered by the other
# replica, its history prefilled again). Output: kill_mid_request.txt.
set -uo pipefail
cd "$(dirname "$0")/../../.."
dir=$(mktemp -d)
trap 'deploy/nginx/run_local.sh stop -d "$dir" 2>/dev/null; rm -rf "$dir"' EXIT
deploy/nginx/run_local.sh start -n 2 -d "$dir" -- -m smollm2 -t 1 --parallel 2 -c 2048 > /dev/null
source "$dir/env"
read -r -a pids <<< "$REPLICA_PIDS"
read -r -a urls <<< "$REPLICA_URLS"

# 1. non-streaming: which replica a key goes to is asked of nginx with a short request first
key=kill-plain-1
curl -s -o /dev/null -D "$dir/h0" -H "X-Conversation-Id: $key" -H 'Content-Type: application/json' \
  -d '{"messages":[{"role":"user","content":"hi"}],"max_tokens":1}' "$LB_URL/v1/chat/completions"
r=$(grep -i '^X-Kvtrim-Replica:' "$dir/h0" | cut -d' ' -f2 | tr -d '\r')
curl -s -D "$dir/h1" -o "$dir/b1" -w '%{http_code}' -H "X-Conversation-Id: $key" -H 'Content-Type: application/json' \
  -d '{"messages":[{"role":"user","content":"Tell me a long story about a lighthouse keeper."}],"max_tokens":200}' \
  "$LB_URL/v1/chat/completions" > "$dir/s1" &
plain_pid=$!
busy() { curl -s "${urls[${r#r}]}/health" | grep -q '"slots_processing":[1-9]'; }
until busy; do sleep 0.1; done
kill -KILL "${pids[${r#r}]}"
wait "$plain_pid"
echo "non-streaming request on $r, SIGKILL while it generated: status $(cat "$dir/s1"), answered by" \
  "$(grep -i '^X-Kvtrim-Replica:' "$dir/h1" | cut -d' ' -f2 | tr -d '\r') (nginx tried" \
  "$(grep -i '^X-Kvtrim-Upstream:' "$dir/h1" | cut -d' ' -f2- | tr -d '\r')), $(grep -o '"completion_tokens":[0-9]*' "$dir/b1")"
deploy/nginx/run_local.sh stop -d "$dir"
for p in $REPLICA_PIDS $NGINX_PID; do while kill -0 "$p" 2>/dev/null; do sleep 0.2; done; done

# 2. a stream
deploy/nginx/run_local.sh start -n 2 -d "$dir" -- -m smollm2 -t 1 --parallel 2 -c 2048 > /dev/null
source "$dir/env"
read -r -a pids <<< "$REPLICA_PIDS"
body='{"messages":[{"role":"user","content":"Tell me a long story about a lighthouse keeper."}],"max_tokens":300,"stream":true}'
curl -sN -D "$dir/h" -H 'X-Conversation-Id: stream-kill-1' -H 'Content-Type: application/json' -d "$body" \
  "$LB_URL/v1/chat/completions" > "$dir/stream" &
curl_pid=$!
events() { local n; n=$(grep -c "^data: " "$dir/stream" 2>/dev/null); [ "${n:-0}" -ge 5 ]; }
until events; do sleep 0.1; done
r=$(grep -i '^X-Kvtrim-Replica:' "$dir/h" | cut -d' ' -f2 | tr -d '\r')
kill -KILL "${pids[${r#r}]}"
wait "$curl_pid"; rc=$?
echo "stream served by $r, SIGKILL after $(grep -c '^data: ' "$dir/stream") events; curl exit status $rc"
echo "last event: $(grep '^data: ' "$dir/stream" | tail -1 | head -c 200)"
echo "[DONE] received: $(grep -c '^data: \[DONE\]' "$dir/stream")"
curl -s -D "$dir/h2" -o "$dir/b2" -H 'X-Conversation-Id: stream-kill-1' -H 'Content-Type: application/json' \
  -d '{"messages":[{"role":"user","content":"Tell me a long story about a lighthouse keeper."},{"role":"assistant","content":"Once upon a time"},{"role":"user","content":"Go on."}],"max_tokens":8}' \
  "$LB_URL/v1/chat/completions"
echo "next turn: replica $(grep -i '^X-Kvtrim-Replica:' "$dir/h2" | cut -d' ' -f2 | tr -d '\r'), $(grep -o '"usage":{[^}]*}[^}]*}' "$dir/b2")"
