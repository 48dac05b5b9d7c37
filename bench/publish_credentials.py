"""Publishing with an API key next to the same with an admin's access token, and through batches.

Run: .venv/bin/python -m bench.publish_credentials   (starts its own redis-server and gunicorn, 2 workers)

Several client processes post for a fixed time; each reports its count and latencies. A key check is one
Redis script, as an access-token check is, so the two rates should be alike.
"""

from __future__ import annotations

import multiprocessing
import time

import requests

from app import create_app
from app.apikeys.store import create_key
from app.auth.users import create_user
from bench.common import PASSWORD, machine, service, summary_ms

CLIENTS, SECONDS, BATCH = 8, 5.0, 100


def _post_for(args) -> tuple[int, list[float]]:
    url, headers, body, seconds = args
    http, latencies = requests.Session(), []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        started = time.perf_counter()
        response = http.post(url, json=body, headers=headers, timeout=10)
        latencies.append(time.perf_counter() - started)
        assert response.status_code == 201, response.text
    return len(latencies), latencies


def measure(name: str, url: str, headers: dict, body: dict, events_per_request: int = 1) -> None:
    with multiprocessing.Pool(CLIENTS) as pool:
        results = pool.map(_post_for, [(url, headers, body, SECONDS)] * CLIENTS)
    requests_done = sum(count for count, _ in results)
    summary = summary_ms([latency for _, latencies in results for latency in latencies])
    rate = requests_done / SECONDS
    print(
        f"{name:<34} {rate:8.0f} req/s {rate * events_per_request:9.0f} events/s"
        f"  p50={summary['p50_ms']:6.2f} ms  p99={summary['p99_ms']:6.2f} ms"
    )


def main() -> None:
    print(f"{machine()}; {CLIENTS} client processes, {SECONDS:.0f} s each run")
    with service(workers=2) as (server, redis_server):
        app = create_app({**server.env, "REDIS_URL": redis_server.url})
        with app.app_context():
            create_user("bench-admin@example.com", PASSWORD, role="admin")
            key, _ = create_key("bench", ["events:publish"], ["*"])
        login = {"email": "bench-admin@example.com", "password": PASSWORD, "transport": "body"}
        token = requests.post(f"{server.url}/auth/login", json=login, timeout=10).json()["access_token"]
        event = {"channel": "broadcast", "event": "bench", "data": {"n": 1}}
        batch = {"events": [event] * BATCH}
        measure("POST /events, admin access token", f"{server.url}/events", {"Authorization": f"Bearer {token}"}, event)
        measure("POST /events, API key", f"{server.url}/events", {"Authorization": f"Bearer {key}"}, event)
        measure(
            f"POST /events/batch ({BATCH}), API key",
            f"{server.url}/events/batch",
            {"Authorization": f"Bearer {key}"},
            batch,
            BATCH,
        )


if __name__ == "__main__":
    main()
