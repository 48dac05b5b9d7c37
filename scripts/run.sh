#!/usr/bin/env bash
# `make run`: the whole product on this machine, for development, in the foreground until Ctrl-C. A local
# Redis (unless REDIS_URL is set), a mail catcher (unless SMTP_URL is set), gunicorn on loopback, the
# outgoing-webhook delivery process and nginx in front of it, with their files under $DATA_DIR (default var/).
#
# Settings, the first that names a variable winning: the real environment, then the developer's .env (ENV_FILE
# names another), then the development defaults this script writes to $DATA_DIR/.env. envfiles.py reads the same
# three for every process it starts, the CLI included (docs/operations.md, Running locally).
set -euo pipefail
cd "$(dirname "$0")/.."

# The developer's .env beneath the real environment, for this script and all it starts: gunicorn.conf.py,
# nginx's port and the mail catcher (every Python process also reads it itself, through envfiles.py).
exports="$(.venv/bin/python envfiles.py)"
eval "$exports"
export PORT="${PORT:-8000}"
export DATA_DIR="${DATA_DIR:-var}"
mkdir -p "$DATA_DIR"

redis_pid="" catcher_pid="" gunicorn_pid="" worker_pid="" nginx_pid=""
declare -A names=()

# Each child runs in a session of its own: the terminal's Ctrl-C reaches this script (and make) only, and
# stop_all then ends them in order. Otherwise Redis would stop at the same instant as the processes using it.
start() {
  local name=$1
  shift
  setsid "$@" &
  names[$!]=$name
}

# Whether a child is still running (one that has exited stays a zombie until `wait` reaps it).
running() {
  local stat
  { read -r stat <"/proc/$1/stat"; } 2>/dev/null || return 1
  stat="${stat##*) }"
  [ "${stat%% *}" != Z ]
}

# Stop the process whose pid the variable $1 holds: signal $2, then SIGKILL after $3 seconds.
stop() {
  local -n pid=$1
  [ -n "$pid" ] || return 0
  kill -s "$2" "$pid" 2>/dev/null || true
  local deadline=$((SECONDS + $3))
  while running "$pid" && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.05; done
  kill -s KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  pid=""
}

# Outside in: nothing new reaches gunicorn, gunicorn and the delivery process finish their work while Redis is
# still there, and Redis, last, writes its append-only file. A second Ctrl-C does not cut this short.
stop_all() {
  trap '' INT TERM HUP
  stop nginx_pid TERM 10 # a fast stop: a graceful one would wait for open event streams to end
  stop gunicorn_pid TERM 30 # graceful: streams end at once, requests get GRACEFUL_TIMEOUT
  stop worker_pid TERM 30 # attempts under way finish (WEBHOOK_OUT_TIMEOUT_SECONDS at most)
  stop catcher_pid TERM 10
  stop redis_pid TERM 30
}
trap 'echo "make run: stopping"; stop_all; echo "make run: stopped"; exit 0' INT TERM HUP
trap stop_all EXIT

# Wait until something listens on TCP port $1, unless the process $2 has exited already. Read from the kernel's
# table, not by connecting: a probe that hangs up on an SMTP server's greeting is a reset connection to it.
wait_for_port() {
  local entry
  entry=":$(printf '%04X' "$1") 00000000:0000 0A" # local port, no remote end, LISTEN
  for _ in $(seq 100); do
    grep -q "$entry" /proc/net/tcp && return 0
    running "$2" || return 1
    sleep 0.1
  done
  return 1
}

if [ -z "${REDIS_URL:-}" ]; then
  redis_port="${REDIS_PORT:-6389}"
  mkdir -p "$DATA_DIR/redis"
  redis_dir="$(cd "$DATA_DIR/redis" && pwd)"
  start redis redis-server --bind 127.0.0.1 --port "$redis_port" --dir "$redis_dir" \
    --appendonly yes --save "" --daemonize no --logfile "$redis_dir/redis.log"
  redis_pid=$!
  for _ in $(seq 50); do redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break; sleep 0.1; done
  export REDIS_URL="redis://127.0.0.1:${redis_port}/0"
  echo "redis:   $REDIS_URL (data in $DATA_DIR/redis, append-only file on)"
fi

# nginx's address: a port on loopback, or an address and port (0.0.0.0:8080, to reach it from other
# machines); the address to open here, and the one mails link to, is on loopback in either case.
nginx_listen="${NGINX_PORT:-8080}"
case "$nginx_listen" in
  *:*) ;;
  *) nginx_listen="127.0.0.1:$nginx_listen" ;;
esac
nginx_host="${nginx_listen%:*}"
case "$nginx_host" in
  0.0.0.0 | "*" | "[::]" | "") nginx_host=127.0.0.1 ;;
esac
nginx_url="http://${nginx_host}:${nginx_listen##*:}"

# Where mail goes: unless SMTP_URL is set (to anything, even nothing: mail then goes to the log), a catcher
# that keeps every mail on this machine and shows it on a page.
if [ -z "${SMTP_URL+set}" ]; then
  catcher_port="${MAILCATCHER_PORT:-1025}"
  start "mail catcher" .venv/bin/python scripts/mailcatcher.py \
    --smtp-port "$catcher_port" --web-port "${MAILCATCHER_WEB_PORT:-8025}"
  catcher_pid=$!
  if ! wait_for_port "$catcher_port" "$catcher_pid"; then
    echo "make run: the mail catcher did not start (MAILCATCHER_PORT, MAILCATCHER_WEB_PORT choose its ports)" >&2
    exit 1
  fi
fi

# Every worker's metrics, and the CLI's (it reads $DATA_DIR/.env), in one directory that /metrics sums.
export PROMETHEUS_MULTIPROC_DIR="${PROMETHEUS_MULTIPROC_DIR:-$(cd "$DATA_DIR" && pwd)/metrics}"

# A development default: written unless the environment or .env sets the variable (even to nothing).
default() {
  if [ -z "${!1+set}" ]; then echo "$1=$2"; fi
}

# make run's development settings, read beneath the environment and .env by envfiles.py in every process, the
# CLI's included. Rewritten at each start; kept after exit, so a later CLI call names this Redis when it is
# down instead of silently using another one.
umask 077
{
  echo "# Written by \`make run\` (scripts/run.sh) at each start: its development defaults."
  echo "# The environment and .env win over these; set a variable there (even to nothing) to change one."
  echo "REDIS_URL=$REDIS_URL"
  echo "PROMETHEUS_MULTIPROC_DIR=$PROMETHEUS_MULTIPROC_DIR"
  if [ -n "$catcher_pid" ]; then
    echo "SMTP_URL=smtp://127.0.0.1:$catcher_port"
    default SMTP_STARTTLS never # the catcher on loopback speaks plain SMTP
  fi
  default PUBLIC_BASE_URL "$nginx_url"
  # Passkeys: browsers bind them to a domain name, never an IP address, so the page's passkeys work at
  # http://localhost:<nginx port>/ (everything else works at 127.0.0.1 too).
  default WEBAUTHN_RP_ID localhost
  default WEBAUTHN_ORIGINS "${nginx_url/127.0.0.1/localhost}"
  # Webhook receivers on this machine (http://127.0.0.1:...), which the service refuses by default.
  default WEBHOOK_OUT_ALLOW_HTTP true
  default WEBHOOK_OUT_ALLOW_PRIVATE true
} >"$DATA_DIR/.env.tmp"
mv "$DATA_DIR/.env.tmp" "$DATA_DIR/.env"
umask 022

# Room in the kernel's listen queues for every client reconnecting at once (gunicorn's and nginx's backlogs are
# 65,535, and the kernel caps both at net.core.somaxconn): raised when this runs as root, else said once. Each is
# a setting of the whole machine, kept until the next boot: the README's first step says so, and the line below
# says how to put it back.
for setting in net.core.somaxconn net.ipv4.tcp_max_syn_backlog; do
  file="/proc/sys/${setting//.//}"
  [ -r "$file" ] && [ "$(cat "$file")" -lt "${BACKLOG:-65535}" ] || continue
  if [ -w "$file" ]; then
    was="$(cat "$file")"
    echo "${BACKLOG:-65535}" >"$file" && echo "kernel:  $setting raised from $was to ${BACKLOG:-65535} for the" \
      "whole machine until it reboots (room for reconnect storms); \`sysctl -w $setting=$was\` puts it back"
  else
    echo "kernel:  $setting is $(cat "$file"); a burst of reconnecting clients beyond it may be refused" \
      "(docs/operations.md, Reconnect storms)"
  fi
done

# The rooms of the README's first hour: a namespace `chat` whose rooms (chat:lobby, chat:<any name>) every
# logged-in user may join, talk in and see who is in, without a grant. Made when there is none, so a developer's
# own rules for it stay; with the CLI, as a developer would type it, before the service starts.
chat_rules=(--subscribe authenticated --publish subscribers --presence --join-leave)
chat_made=true
chat="$(.venv/bin/flask --app wsgi channels namespace-put chat "${chat_rules[@]}" --keep-existing 2>&1 >/dev/null)" ||
  chat_made=false
# What else the command said (the development secrets it made, an error) shows here; its audit entry is in the log.
if [[ -n $chat ]]; then grep -v -e '"logger": "audit"' -e 'kept as it is' <<<"$chat" >&2 || true; fi
if [[ $chat_made == false ]]; then
  echo "rooms:   the namespace chat could not be made (above): .venv/bin/flask --app wsgi channels" \
    "namespace-put chat ${chat_rules[*]}" >&2
elif grep -q "kept as it is" <<<"$chat"; then
  echo "rooms:   chat:<name> (namespace chat, kept as it is)"
else
  echo "rooms:   chat:<name> for every logged-in user (namespace chat made: presence, join and leave events)"
fi

# Loopback only: nginx in front is the way in (and the only place forwarded headers are trusted from).
start gunicorn .venv/bin/gunicorn -c gunicorn.conf.py --bind "127.0.0.1:${PORT}" wsgi:app
gunicorn_pid=$!

# The outgoing-webhook delivery process (the Procfile's worker: line), with the same settings.
start "the delivery process" .venv/bin/python worker.py
worker_pid=$!

# nginx in front, rendered from nginx/default.conf.template (as in production). On loopback too, as this is
# a development setup with development secrets.
.venv/bin/python scripts/nginx_config.py "$DATA_DIR/nginx" "$nginx_listen" "127.0.0.1:${PORT}" >/dev/null
start nginx nginx -c "$(cd "$DATA_DIR/nginx" && pwd)/nginx.conf"
nginx_pid=$!

env_file="${ENV_FILE-.env}"
echo "service: http://127.0.0.1:${PORT}/ (gunicorn, direct)"
echo "nginx:   ${nginx_url}/ (in front of it: open this one)"
if [ -n "$env_file" ] && [ -f "$env_file" ]; then
  echo "settings: the environment, then $env_file, then $DATA_DIR/.env (make run's development defaults)"
else
  echo "settings: the environment, then $DATA_DIR/.env (make run's development defaults); to keep your own,"
  echo "         cp .env.example .env and set them there"
fi
echo "cli:     .venv/bin/flask --app wsgi ... reads the same settings, so it uses this Redis"

# Until Ctrl-C (the trap above), or until one of them exits by itself: then the others are stopped too.
status=0
wait -n -p ended "${!names[@]}" || status=$?
echo "make run: ${names[$ended]} exited (status $status); stopping the rest" >&2
exit 1
