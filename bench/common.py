"""Shared pieces of the benchmarks: a Redis plus gunicorn set-up, users, percentiles, machine facts."""

from __future__ import annotations

import contextlib
import os
import platform
import statistics
import tempfile
from pathlib import Path

from tests.servers import LiveServer, RedisClusterServer, RedisServer

PASSWORD = "benchmark password"


def publisher_key(env: dict, channels: tuple[str, ...] = ("*",)) -> str:
    """A new API key that may publish to `channels`, made in the Redis of a service run with `env`.

    Every benchmark publishes as a backend does: with an API key, which never expires mid-run.
    """
    from app import create_app
    from app.apikeys.store import create_key

    with create_app(env).app_context():
        key, _ = create_key("bench publisher", ["events:publish"], list(channels))
    return key


def service_env(redis_server: RedisServer, data_dir: str) -> dict:
    """The settings every benchmarked instance runs with: test mode, fixed secrets, no rate limits (the
    WebSocket frame limit included: a load generator subscribes by frames back to back)."""
    return {
        "APP_ENV": "test",
        "DATA_DIR": data_dir,
        "REDIS_URL": redis_server.url,
        "SECRET_KEY": "b" * 40,
        "JWT_SECRET": "c" * 40,
        "RATE_LIMITS_ENABLED": "false",
        "WS_FRAME_RATE": "1000000",
        "LOG_LEVEL": "warning",
    }


@contextlib.contextmanager
def service(workers: int = 2, cluster: bool = False, **env):
    """A redis-server (or, `cluster`, a local Redis Cluster) and the service under gunicorn (gevent worker),
    on loopback ports."""
    with tempfile.TemporaryDirectory() as tmp:
        redis_server = RedisClusterServer(Path(tmp)) if cluster else RedisServer(Path(tmp))
        redis_server.start()
        # Load generators open thousands of streams as a handful of users.
        settings = {**service_env(redis_server, tmp), "MAX_CONNECTIONS_PER_USER": "1000000", **env}
        if cluster:
            settings["REDIS_MODE"] = "cluster"
        server = LiveServer(settings, workers=workers)
        server.start()
        try:
            yield server, redis_server
        finally:
            server.stop()
            redis_server.stop()


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def summary_ms(seconds: list[float]) -> dict:
    ms = [s * 1000 for s in seconds]
    return {
        "n": len(ms),
        "p50_ms": round(statistics.median(ms), 3),
        "p99_ms": round(percentile(ms, 0.99), 3),
        "max_ms": round(max(ms), 3),
    }


def machine() -> str:
    cpu = "unknown cpu"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return (
        f"{os.cpu_count()} cores, {cpu}, Python {platform.python_version()}, {platform.system()} {platform.release()}"
    )
