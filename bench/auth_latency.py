"""One client, sequential: the time of one login (Argon2id hash) and of one authenticated GET /auth/me.

Run: .venv/bin/python -m bench.auth_latency   (starts its own redis-server and gunicorn, 1 worker)
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import requests

from app.auth.passwords import PASSWORD_CONTEXT
from tests.servers import LiveServer, RedisServer

PASSWORD = "benchmark password"


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def report(name: str, seconds: list[float]) -> None:
    ms = [s * 1000 for s in seconds]
    print(f"{name:<34} n={len(ms):<5} p50={statistics.median(ms):7.2f} ms  p99={percentile(ms, 0.99):7.2f} ms")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        redis_server = RedisServer(Path(tmp))
        redis_server.start()
        env = {
            "APP_ENV": "test",
            "DATA_DIR": tmp,
            "REDIS_URL": redis_server.url,
            "SECRET_KEY": "b" * 40,
            "JWT_SECRET": "c" * 40,
            "RATE_LIMITS_ENABLED": "false",
        }
        server = LiveServer(env, workers=1)
        server.start()
        try:
            base = server.url
            http = requests.Session()
            http.post(f"{base}/auth/register", json={"email": "bench@example.com", "password": PASSWORD})
            body = {"email": "bench@example.com", "password": PASSWORD, "transport": "body"}
            hashes, logins, mes = [], [], []
            for _ in range(50):
                started = time.perf_counter()
                PASSWORD_CONTEXT.hash(PASSWORD)
                hashes.append(time.perf_counter() - started)
            for _ in range(50):
                started = time.perf_counter()
                response = http.post(f"{base}/auth/login", json=body)
                logins.append(time.perf_counter() - started)
            headers = {"Authorization": f"Bearer {response.json()['access_token']}"}
            for _ in range(2000):
                started = time.perf_counter()
                http.get(f"{base}/auth/me", headers=headers)
                mes.append(time.perf_counter() - started)
            report("argon2id hash (in process)", hashes)
            report("POST /auth/login", logins)
            report("GET /auth/me (bearer)", mes)
        finally:
            server.stop()
            redis_server.stop()


if __name__ == "__main__":
    main()
