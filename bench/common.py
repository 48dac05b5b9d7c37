"""Shared pieces of the benchmarks: a Redis plus gunicorn set-up, users, percentiles, machine facts."""

from __future__ import annotations

import contextlib
import os
import platform
import statistics
import tempfile
from pathlib import Path

from tests.servers import LiveServer, RedisServer

PASSWORD = "benchmark password"


@contextlib.contextmanager
def service(workers: int = 2, **env):
    """A redis-server and the service under gunicorn (gevent worker), on loopback ports."""
    with tempfile.TemporaryDirectory() as tmp:
        redis_server = RedisServer(Path(tmp))
        redis_server.start()
        settings = {
            "APP_ENV": "test",
            "DATA_DIR": tmp,
            "REDIS_URL": redis_server.url,
            "SECRET_KEY": "b" * 40,
            "JWT_SECRET": "c" * 40,
            "RATE_LIMITS_ENABLED": "false",
            "LOG_LEVEL": "warning",
            # Load generators open thousands of streams as a handful of users.
            "MAX_CONNECTIONS_PER_USER": "1000000",
            **env,
        }
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
