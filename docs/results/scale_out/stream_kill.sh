#!/usr/bin/env bash
# What a streaming request that is mid-answer gets when its replica is killed (SIGKILL): two
# replicas behind nginx, one long stream through nginx, SIGKILL to the replica serving it once
# the first tokens arrived; prints the stream's last lines and curl's exit status, then the same
# conversation's next turn (answered by the other replica, its history prefilled again).
set -uo pipefail
cd "$(dirname "$0")/../../.."
dir=$(mktemp -d)
trap 'deploy/nginx/run_local.sh stop -d "$dir" 2>/dev/null; rm -rf "$dir"' EXIT
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
