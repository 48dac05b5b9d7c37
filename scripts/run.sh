#!/usr/bin/env bash
# `make run`: a local Redis (unless REDIS_URL is set) with its data under $DATA_DIR (default var/),
# gunicorn on loopback, the outgoing-webhook delivery process, and nginx in front of it.
set -euo pipefail
cd "$(dirname "$0")/.."
export PORT="${PORT:-8000}"
export DATA_DIR="${DATA_DIR:-var}"
pids=()
# Stop everything started here and wait for it, so nothing outlives `make run`.
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT INT TERM
mkdir -p "$DATA_DIR"

if [ -z "${REDIS_URL:-}" ]; then
  redis_port="${REDIS_PORT:-6389}"
  mkdir -p "$DATA_DIR/redis"
  redis_dir="$(cd "$DATA_DIR/redis" && pwd)"
  redis-server --bind 127.0.0.1 --port "$redis_port" --dir "$redis_dir" \
    --appendonly yes --save "" --daemonize no --logfile "$redis_dir/redis.log" &
  pids+=($!)
  for _ in $(seq 50); do redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break; sleep 0.1; done
  export REDIS_URL="redis://127.0.0.1:${redis_port}/0"
  echo "redis:   $REDIS_URL (data in $DATA_DIR/redis, append-only file on)"
fi

# Every worker's metrics, and the CLI's (it reads $DATA_DIR/.env), in one directory that /metrics sums.
export PROMETHEUS_MULTIPROC_DIR="${PROMETHEUS_MULTIPROC_DIR:-$(cd "$DATA_DIR" && pwd)/metrics}"

# What `flask --app wsgi ...` needs to reach this service's Redis and count into its metrics: read
# beneath the environment by wsgi.py. Kept after exit, so a later CLI call names this Redis when it
# is down instead of silently using another one.
umask 077
cat > "$DATA_DIR/.env.tmp" <<ENV
# Written by \`make run\` (scripts/run.sh); the real environment wins over these.
REDIS_URL=$REDIS_URL
PROMETHEUS_MULTIPROC_DIR=$PROMETHEUS_MULTIPROC_DIR
ENV
mv "$DATA_DIR/.env.tmp" "$DATA_DIR/.env"
umask 022

# Loopback only: nginx in front is the way in (and the only place forwarded headers are trusted from).
.venv/bin/gunicorn -c gunicorn.conf.py --bind "127.0.0.1:${PORT}" wsgi:app &
pids+=($!)
gunicorn_pid=$!

# The outgoing-webhook delivery process (the Procfile's worker: line), with the same environment.
.venv/bin/python worker.py &
pids+=($!)

# nginx in front, rendered from nginx/default.conf.template (as in production). On loopback too, as
# this is a development setup with development secrets; NGINX_PORT may name the address as well
# (0.0.0.0:8080) to reach it from other machines.
nginx_port="${NGINX_PORT:-8080}"
case "$nginx_port" in
  *:*) ;;
  *) nginx_port="127.0.0.1:$nginx_port" ;;
esac
.venv/bin/python scripts/nginx_config.py "$DATA_DIR/nginx" "$nginx_port" "127.0.0.1:${PORT}" >/dev/null
nginx -c "$(cd "$DATA_DIR/nginx" && pwd)/nginx.conf" &
pids+=($!)

echo "service: http://127.0.0.1:${PORT}/ (gunicorn, direct)"
echo "nginx:   http://${nginx_port}/ (in front of it)"
echo "cli:     .venv/bin/flask --app wsgi ... uses this Redis (from $DATA_DIR/.env)"
wait "$gunicorn_pid"
