"""gunicorn settings for the service; every value says why it is what it is.

Run: gunicorn -c gunicorn.conf.py wsgi:app   (the Procfile's web line)
"""

import json
import logging
import math
import os
import resource
import sys
import time

from gunicorn.glogging import Logger

from envfiles import EnvFileError, apply_env_files

# The settings files beneath the environment (envfiles.py), before anything here reads PORT,
# WEB_CONCURRENCY or LOG_LEVEL: a developer's .env applies to gunicorn started by hand as to `make run`.
try:
    apply_env_files()
except EnvFileError as error:
    print(f"configuration error: {error}", file=sys.stderr)
    raise SystemExit(4) from None

# PaaS platforms hand out the port in $PORT; listen on every interface so their router reaches us.
# Behind a local nginx (`make run`), `--bind 127.0.0.1:$PORT` on the command line overrides this.
bind = f"0.0.0.0:{os.environ.get('PORT', '8000')}"

# gevent: one greenlet per connection, so thousands of idle SSE streams and WebSockets cost
# memory, not threads. The worker monkey-patches the standard library before the app is imported.
# gunicorn's gevent worker plus one turn of the event loop between two requests of a keep-alive
# connection: without it one busy connection kept the worker's others waiting (gevent_worker.py).
worker_class = "gevent_worker.FairGeventWorker"


def usable_cpus(cpu_max: str = "/sys/fs/cgroup/cpu.max") -> int:
    """The CPUs this process may really use: its affinity mask, capped by a cgroup v2 CPU quota.

    os.cpu_count() is the host's count: a container limited to one CPU on a 64-core host would
    start 64 workers, each with its own Redis pool and event hub, competing for one CPU.
    """
    count = len(os.sched_getaffinity(0))
    try:
        with open(cpu_max) as file:
            quota, period = file.read().split()[:2]
    except (OSError, ValueError):
        return count  # no cgroup v2 quota file: not limited beyond the affinity mask
    if quota != "max":
        count = min(count, math.ceil(int(quota) / int(period)))
    return max(1, count)


# One worker per usable CPU: gevent serves thousands of connections per worker, so more workers
# only add parallel CPU, never capacity for idle streams. WEB_CONCURRENCY (what Heroku-style
# platforms set) overrides it: size it to the CPUs the instance really has, and lower it when
# memory is tight (each worker holds its own app, Redis pool and event hub, ~60-100 MB).
workers = int(os.environ.get("WEB_CONCURRENCY") or usable_cpus())

DESCRIPTOR_MARGIN = 100  # a worker's own descriptors besides its clients: Redis, logs, metrics files, epoll


def connections_within_descriptor_limit(cap: int = 20000) -> int:
    """Up to `cap` connections, but fewer than the file-descriptor limit allows, less a margin.

    A full worker stops accepting and leaves new connections to the others; a worker past its limit
    would fail to accept, or fail its own Redis and log writes, with the connections already open.
    """
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return cap
    return max(1, min(cap, soft - DESCRIPTOR_MARGIN))


# Open connections per worker. Streams are long-lived, so this is sized for thousands each:
# 20,000 by default, fewer when the descriptor limit (ulimit -n) would not hold them.
worker_connections = int(os.environ.get("WORKER_CONNECTIONS") or connections_within_descriptor_limit())

# Connections the kernel holds for the workers before they accept them. After a deploy or a network blip
# every client reconnects at once: 10,000 within 2 s outrun what two workers accept, and beyond gunicorn's
# default of 2,048 the queue overflowed. The kernel caps it at net.core.somaxconn, which must be as large
# as the clients that may come back at once (`make run` raises it; docs/operations.md, Reconnect storms).
backlog = int(os.environ.get("BACKLOG", "65535"))

# Seconds a worker may go without notifying the arbiter. With gevent that only happens when the
# hub is blocked (CPU work on the hub, an un-patched call): kept to catch exactly that bug.
timeout = int(os.environ.get("GUNICORN_TIMEOUT", "30"))

# On SIGTERM, open streams are ended at once (SSE) or closed with 1001 (WebSocket), and clients reconnect
# with their cursor to a live worker; idle keep-alive connections are closed. What is left are ordinary
# requests under way.
graceful_timeout = int(os.environ.get("GRACEFUL_TIMEOUT", "10"))

# On a reload, an old worker waits for the new ones to load the app, then carries its parked SSE streams
# over to them a batch at a time, serving the rest meanwhile (post_worker_init): it may take this long
# (its own graceful time-out becomes this). 20,000 streams took 11-13 s here (bench/README.md).
carry_over_seconds = int(os.environ.get("CARRY_OVER_SECONDS", "90"))

# Longer than nginx's upstream keepalive_timeout (60 s), so nginx, not gunicorn, closes idle
# upstream connections; the other way round nginx may reuse a connection just being closed.
keepalive = 75

# Trust X-Forwarded-* only from these addresses (the proxy in front). The app's ProxyFix applies
# PROXY_HOPS on top of this; both must agree with the real deployment.
forwarded_allow_ips = os.environ.get("FORWARDED_ALLOW_IPS", "127.0.0.1,::1")

# No preload: each worker builds its own app after gevent has patched the process, so the Redis
# client and the event hub are made in the process (and loop) that uses them.
preload_app = False

# No max_requests: recycling a worker would cut every open stream it holds.
max_requests = 0

# Bounded request line and headers: refuse oversized requests before the app sees them.
limit_request_line = 8190
limit_request_fields = 100
limit_request_field_size = 8190

# Logs to stdout/stderr, where a PaaS or systemd collects them. The app writes its own JSON access
# line per request, so gunicorn's access log is left off.
accesslog = None
errorlog = "-"
loglevel = os.environ.get("LOG_LEVEL", "info").lower()


class AppWritesAccessLines(Logger):
    """gunicorn's logger without its access line, which the app writes itself.

    With `logconfig_dict` set, gunicorn builds every request's access atoms and hands them to a
    logger with no handler: about 7 % of a worker's CPU per short request, for nothing.
    """

    def access(self, resp, req, environ, request_time):
        pass


logger_class = AppWritesAccessLines


class JsonFormatter(logging.Formatter):
    """One JSON object per line, like the app's request lines, so a log pipeline parses every line."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.created)),
            "level": record.levelname.lower(),
            "logger": record.name,
            "pid": record.process,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line)


# gunicorn's own logger and the root logger (every app module's) share one JSON handler on stderr.
# Set up in the master before any worker is forked, so the app's logging.basicConfig finds the root
# logger configured and adds nothing. Defined here, not in the app package: importing the app in the
# master would import prometheus_client before PROMETHEUS_MULTIPROC_DIR is chosen (on_starting).
logconfig_dict = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"json": {"()": JsonFormatter}},
    "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stderr"}},
    "root": {"level": loglevel.upper(), "handlers": ["stderr"]},
    "loggers": {
        "gunicorn.error": {"level": loglevel.upper(), "handlers": [], "propagate": True},
        "gunicorn.access": {"handlers": [], "propagate": False},
    },
}
# Python's warnings (deprecations from libraries) go through logging too, instead of raw stderr text.
logging.captureWarnings(True)

# gunicorn 24+ opens a control socket at one fixed path per user; several instances on one host (a
# scale-out test, a blue-green switch) would fight over it, and signals do everything we need.
control_socket_disable = True


def post_worker_init(worker):
    """End this worker's streams as soon as it starts a graceful shutdown (SIGTERM, HUP reload).

    gunicorn only flips `worker.alive` and then waits up to graceful_timeout for open requests; SSE
    streams and WebSockets would hold it for all of that. Ending them at once (SSE end, WebSocket
    close 1001) sends clients to a live worker, where they resume by cursor. On a reload, the parked
    SSE streams are carried over to the new workers first, and their clients stay connected.
    """
    import gc

    import gevent
    from gunicorn.workers import ggevent

    from app import mail, webhooks
    from app.events import end_live_connections
    from app.events.carry import CarryOver
    from app.events.handover import HandlerPool

    # The worker makes its handler pools after this hook: of this class, a stream finds its own and
    # keeps its place in it once it is parked without its handler (app/events/handover.py).
    ggevent.Pool = HandlerPool
    # Open streams keep hundreds of thousands of objects alive, and the cyclic collector's default thresholds
    # (700, 10, 10) had it walk them again and again while streams opened: 12 % of a worker's CPU in a
    # reconnect storm (bench/README.md). Collecting every 50,000 new objects, not every 700, keeps that small.
    gc.set_threshold(50_000, 20, 100)
    webhooks.start_background_tasks(worker.wsgi)  # retries webhook deliveries whose publishing failed
    mail.start_background_tasks(worker.wsgi)  # sends queued mail, retrying while the SMTP server is down

    # On a reload, parked SSE streams are carried over to the new workers instead (app/events/carry.py).
    carry = CarryOver.for_app(worker.wsgi)
    if carry is not None:
        carry.listen()

    def watch():
        while worker.alive:
            gevent.sleep(0.2)
        if carry is not None:
            carry.stop_adopting()
            if carry.reloading():
                # This old worker's own graceful time-out, read by its main loop as it waits for open connections.
                worker.cfg.set("graceful_timeout", carry_over_seconds)
                carry.hand_on(time.monotonic() + carry_over_seconds - 2, expected=worker.cfg.workers)
        end_live_connections(worker.wsgi)
        worker.close_idle_connections()

    gevent.spawn(watch)


def worker_int(worker):
    """SIGINT or SIGQUIT, the quick shutdown: stop now.

    gunicorn's own handler stops the worker 0.1 s after this, from a greenlet. If the worker's main loop
    had finished by then, that stop landed in the interpreter's shutdown and wrote a traceback. Raised
    here, it reaches the main loop while it still runs. A worker already finishing (after SIGTERM) is
    left to finish: this greenlet waits, and the process ends first.
    """
    import gevent

    if getattr(worker, "finishing", False):
        gevent.sleep(60)
    sys.exit(0)


def worker_exit(server, worker):
    """The worker's main loop is over: a quick shutdown arriving now must not stop it a second time."""
    worker.finishing = True


def _refuse_bad_settings(server) -> None:
    """Check every setting here, in the arbiter, before any worker starts: a bad one stops gunicorn with one
    sentence and status 4. Left to the workers, each failed alike, and when two exited at once gunicorn's
    arbiter raised its "App failed to load" a second time while stopping, with a traceback.

    app/settings.py reads the environment with the standard library only; it is loaded on its own, so the
    arbiter imports nothing of the app (prometheus_client must first see PROMETHEUS_MULTIPROC_DIR, and
    gevent patches the workers only).
    """
    import importlib.util

    name = "_auth_rt_settings_check"
    spec = importlib.util.spec_from_file_location(name, os.path.join(os.path.dirname(__file__), "app", "settings.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses looks its module up while it builds the classes
    try:
        spec.loader.exec_module(module)
        module.load_settings()
    except module.SettingsError as error:
        server.log.critical("configuration error: %s", error)
        raise SystemExit(4) from None
    finally:
        sys.modules.pop(name, None)


def on_starting(server):
    """Settings checked first; then one directory for every worker's Prometheus metrics, so /metrics adds
    up all workers.

    PROMETHEUS_MULTIPROC_DIR when given (`make run` gives $DATA_DIR/metrics and writes it to
    $DATA_DIR/.env, so the CLI counts its published events there too); otherwise a temporary one,
    removed in on_exit.
    """
    import glob
    import tempfile

    _refuse_bad_settings(server)
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    server.temporary_metrics_dir = None  # kept on the arbiter: a HUP reload re-reads this file
    if not directory:
        directory = server.temporary_metrics_dir = tempfile.mkdtemp(prefix="auth-rt-metrics-")
    os.makedirs(directory, exist_ok=True)
    for stale in glob.glob(os.path.join(directory, "*.db")):  # values of a previous run
        os.remove(stale)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory  # inherited by the workers forked after this
    # Private to this gunicorn: its workers' sockets for carrying streams over on a reload (on_reload).
    server.generation, server.carry_dir = 0, None
    try:
        server.carry_dir = tempfile.mkdtemp(prefix="auth-rt-carry-", dir=short_temp_dir())
        write_generation(server.carry_dir, 0)
    except OSError as error:  # a read-only file system: reloads end streams, and clients come back
        server.log.warning("no directory for carrying streams over on a reload (%s); reloads will end them", error)
        os.environ.pop(CARRY_DIR_ENV, None)
        return
    os.environ[CARRY_DIR_ENV] = server.carry_dir


CARRY_DIR_ENV = "AUTH_RT_CARRY_DIR"  # the workers read it through app/settings.py (carry_dir)


def short_temp_dir() -> str:
    """The temporary directory, or /tmp when its path leaves too little of a Unix socket's 107 bytes."""
    import tempfile

    directory = tempfile.gettempdir()
    return directory if len(directory) <= 60 else "/tmp"  # noqa: S108 - mkdtemp makes a private directory there


def write_generation(directory: str, generation: int) -> None:
    """Record how many reloads have begun, replacing the file at once: a stopping worker of an older
    generation then hands its open streams to the newer one's workers (app/events/carry.py)."""
    path = os.path.join(directory, "generation")
    with open(path + ".new", "w") as file:
        file.write(str(generation))
    os.replace(path + ".new", path)


def on_reload(server):
    """A reload (SIGHUP) begins: its new workers, forked after this, are the next generation."""
    server.generation += 1
    if server.carry_dir is not None:
        write_generation(server.carry_dir, server.generation)


def child_exit(server, worker):
    """Drop a dead worker's live gauges (open connections) from the sum."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)


def on_exit(server):
    """Remove the temporary metrics directory (a given one is kept: the CLI's counts may be in it) and the
    carry-over directory."""
    import shutil

    if getattr(server, "temporary_metrics_dir", None):
        shutil.rmtree(server.temporary_metrics_dir, ignore_errors=True)
    if getattr(server, "carry_dir", None):
        shutil.rmtree(server.carry_dir, ignore_errors=True)
