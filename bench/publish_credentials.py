"""Publishing with an API key next to the same with an admin's access token, and through batches.

Run: .venv/bin/python -m bench.publish_credentials   (starts its own redis-server and gunicorn, 2 workers)

Several client processes post for a fixed time; each reports its count and latencies. A key check is one
Redis script, as an access-token check is, so the two rates should be alike.
"""

from __future__ import annotations

import multiprocessing
import time
import uuid

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


def measure(name: str, url: str, headers: dict, body: dict, events_per_request: int = 1) -> dict:
    """Requests and events per second, and latencies, of CLIENTS processes posting for SECONDS."""
    with multiprocessing.Pool(CLIENTS) as pool:
        results = pool.map(_post_for, [(url, headers, body, SECONDS)] * CLIENTS)
    rate = sum(count for count, _ in results) / SECONDS
    summary = summary_ms([latency for _, latencies in results for latency in latencies])
    return {
        "name": name,
        "requests_per_second": round(rate),
        "events_per_second": round(rate * events_per_request),
        **summary,
    }


def run(base_url: str, env: dict) -> list[dict]:
    """The three measurements against a running service whose environment (its Redis) is `env`."""
    email = f"bench-admin-{uuid.uuid4().hex[:8]}@example.com"
    with create_app(env).app_context():
        create_user(email, PASSWORD, role="admin")
        key, _ = create_key("bench", ["events:publish"], ["*"])
    login = {"email": email, "password": PASSWORD, "transport": "body"}
    token = requests.post(f"{base_url}/auth/login", json=login, timeout=10).json()["access_token"]
    event = {"channel": "broadcast", "event": "bench", "data": {"n": 1}}
    as_admin, as_key = {"Authorization": f"Bearer {token}"}, {"Authorization": f"Bearer {key}"}
    return [
        measure("POST /events, admin access token", f"{base_url}/events", as_admin, event),
        measure("POST /events, API key", f"{base_url}/events", as_key, event),
        measure(
            f"POST /events/batch ({BATCH}), API key",
            f"{base_url}/events/batch",
            as_key,
            {"events": [event] * BATCH},
            BATCH,
        ),
    ]


def report(rows: list[dict]) -> None:
    for row in rows:
        print(
            f"{row['name']:<34} {row['requests_per_second']:8} req/s {row['events_per_second']:9} events/s"
            f"  p50={row['p50_ms']:6.2f} ms  p99={row['p99_ms']:6.2f} ms"
        )


def main() -> None:
    print(f"{machine()}; {CLIENTS} client processes, {SECONDS:.0f} s each run")
    with service(workers=2) as (server, redis_server):
        report(run(server.url, {**server.env, "REDIS_URL": redis_server.url}))


if __name__ == "__main__":
    main()
