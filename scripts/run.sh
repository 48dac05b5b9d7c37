#!/usr/bin/env bash
# `make run`: a local Redis (unless REDIS_URL is set) with its data under var/, gunicorn, and nginx in front.
set -euo pipefail
cd "$(dirname "$0")/.."
export PORT="${PORT:-8000}"
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; }
trap cleanup EXIT INT TERM

if [ -z "${REDIS_URL:-}" ]; then
  redis_port="${REDIS_PORT:-6389}"
  mkdir -p var/redis
  redis-server --bind 127.0.0.1 --port "$redis_port" --dir "$PWD/var/redis" \
    --appendonly yes --save "" --daemonize no --logfile "$PWD/var/redis/redis.log" &
  pids+=($!)
  for _ in $(seq 50); do redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break; sleep 0.1; done
  export REDIS_URL="redis://127.0.0.1:${redis_port}/0"
  echo "redis:   $REDIS_URL (data in var/redis, append-only file on)"
fi

.venv/bin/gunicorn -c gunicorn.conf.py wsgi:app &
pids+=($!)
gunicorn_pid=$!

# nginx in front, rendered from nginx/default.conf.template (as in production).
nginx_port="${NGINX_PORT:-8080}"
.venv/bin/python scripts/nginx_config.py var/nginx "$nginx_port" "127.0.0.1:${PORT}" >/dev/null
nginx -c "$PWD/var/nginx/nginx.conf" &
pids+=($!)

echo "service: http://127.0.0.1:${PORT}/ (gunicorn, direct)"
echo "nginx:   http://127.0.0.1:${nginx_port}/ (in front of it)"
wait "$gunicorn_pid"
