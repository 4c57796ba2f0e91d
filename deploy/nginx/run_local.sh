#!/usr/bin/env bash
# Starts N kvtrim serve replicas and nginx (deploy/nginx/kvtrim.conf) on loopback, as the current
# user (nginx with a prefix, pid, logs and temp files under DIR; no root needed), waits until
# every replica answers /health and nginx answers, writes DIR/env and returns (they keep running).
#
#   deploy/nginx/run_local.sh start [-n N] [-d DIR] [-p LB_PORT] [--round-robin] [-- SERVE_ARGS...]
#   deploy/nginx/run_local.sh stop [-d DIR]      # SIGTERM to every replica (a drain) and nginx
#
# SERVE_ARGS go to every `kvtrim serve` (default: -m smollm2 -t 1 --parallel 2 -c 2048).
# --round-robin drops the hash line (the comparison in docs/results/scale_out/). DIR/env holds
# LB_URL, REPLICA_URLS, REPLICA_PIDS, NGINX_PID (shell syntax: `source DIR/env`); replica i logs
# to DIR/replica_i.log as replica id "r<i>". KVTRIM_BIN picks the binary (default build/ci/kvtrim),
# NGINX the nginx binary (default: nginx on PATH, else /usr/sbin/nginx).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cmd="${1:-}"; shift || true
n=3; dir="${TMPDIR:-/tmp}/kvtrim_scale_out"; lb_port=0; rr=0
while [ $# -gt 0 ]; do
  case "$1" in
    -n) n="$2"; shift 2 ;;
    -d) dir="$2"; shift 2 ;;
    -p) lb_port="$2"; shift 2 ;;
    --round-robin) rr=1; shift ;;
    --) shift; break ;;
    *) echo "run_local.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
serve_args=("$@")
[ ${#serve_args[@]} -gt 0 ] || serve_args=(-m smollm2 -t 1 --parallel 2 -c 2048)
bin="${KVTRIM_BIN:-$repo/build/ci/kvtrim}"

if [ "$cmd" = stop ]; then
  [ -f "$dir/env" ] || { echo "run_local.sh: no $dir/env" >&2; exit 1; }
  source "$dir/env"
  for p in $REPLICA_PIDS $NGINX_PID; do kill "$p" 2>/dev/null || true; done
  exit 0
fi
[ "$cmd" = start ] || { sed -n '2,15p' "$0" >&2; exit 2; }
nginx_bin="${NGINX:-$(command -v nginx || echo /usr/sbin/nginx)}"
[ -x "$nginx_bin" ] || { echo "run_local.sh: nginx is not installed (apt-get install nginx)" >&2; exit 3; }
[ -x "$bin" ] || { echo "run_local.sh: no kvtrim binary at $bin (build it, or set KVTRIM_BIN)" >&2; exit 1; }

mkdir -p "$dir/tmp"
pids=(); urls=()
for i in $(seq 0 $((n - 1))); do
  "$bin" serve "${serve_args[@]}" --port 0 --replica-id "r$i" > "$dir/replica_$i.log" 2>&1 &
  pids+=($!)
done
# a replica is up once it printed its address and answers /health (or it exited: an error)
replica_url() { grep -o 'http://127.0.0.1:[0-9]*' "$dir/replica_$1.log" | head -1; }
for i in $(seq 0 $((n - 1))); do
  until u=$(replica_url "$i") && [ -n "$u" ] && curl -sf "$u/health" > /dev/null; do
    if ! kill -0 "${pids[$i]}" 2>/dev/null; then
      cat "$dir/replica_$i.log" >&2; echo "run_local.sh: replica $i exited" >&2
      kill "${pids[@]}" 2>/dev/null || true; exit 1
    fi
    sleep 0.2
  done
  urls+=("$u")
done

: > "$dir/kvtrim_upstreams.conf"
for u in "${urls[@]}"; do echo "server ${u#http://} max_fails=2 fail_timeout=10s;" >> "$dir/kvtrim_upstreams.conf"; done
if [ "$lb_port" = 0 ]; then
  lb_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
fi
echo "listen 127.0.0.1:$lb_port;" > "$dir/kvtrim_listen.conf"
if [ "$rr" = 1 ]; then
  grep -v '^ *hash ' "$here/kvtrim.conf" > "$dir/kvtrim.conf"
else
  cp "$here/kvtrim.conf" "$dir/kvtrim.conf"
fi
user_line=""
[ "$(id -u)" -eq 0 ] && user_line="user root;"  # else nginx runs as the caller (the directive is ignored)
cat > "$dir/nginx.conf" <<CONF
$user_line
worker_processes 1;
pid $dir/nginx.pid;
error_log $dir/nginx_error.log warn;
events { worker_connections 1024; }
http {
  access_log $dir/nginx_access.log;
  client_body_temp_path $dir/tmp/body;
  proxy_temp_path $dir/tmp/proxy;
  fastcgi_temp_path $dir/tmp/fastcgi;
  uwsgi_temp_path $dir/tmp/uwsgi;
  scgi_temp_path $dir/tmp/scgi;
  include $dir/kvtrim.conf;
}
CONF
"$nginx_bin" -p "$dir" -c "$dir/nginx.conf" -e "$dir/nginx_error.log" -g 'daemon off;' > "$dir/nginx.log" 2>&1 &
nginx_pid=$!
until curl -sf "http://127.0.0.1:$lb_port/nginx-health" > /dev/null; do
  if ! kill -0 "$nginx_pid" 2>/dev/null; then
    cat "$dir/nginx.log" "$dir/nginx_error.log" >&2 2>/dev/null; echo "run_local.sh: nginx exited" >&2
    kill "${pids[@]}" 2>/dev/null || true; exit 1
  fi
  sleep 0.1
done
cat > "$dir/env" <<ENV
LB_URL=http://127.0.0.1:$lb_port
REPLICA_URLS="${urls[*]}"
REPLICA_PIDS="${pids[*]}"
NGINX_PID=$nginx_pid
ENV
echo "kvtrim behind nginx: http://127.0.0.1:$lb_port  (replicas: ${urls[*]}; pids ${pids[*]}; nginx $nginx_pid; state in $dir)"
