"""One client, sequential: the time of one login (Argon2id hash) and of one authenticated GET /auth/me.

Run: .venv/bin/python -m bench.auth_latency   (starts its own redis-server and gunicorn, 1 worker)
"""

from __future__ import annotations

import time

import requests

from app.auth.passwords import PASSWORD_CONTEXT
from bench.common import PASSWORD, service, summary_ms


def report(name: str, seconds: list[float]) -> None:
    summary = summary_ms(seconds)
    print(f"{name:<34} n={summary['n']:<5} p50={summary['p50_ms']:7.2f} ms  p99={summary['p99_ms']:7.2f} ms")


def main() -> None:
    with service(workers=1) as (server, _):
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


if __name__ == "__main__":
    main()
