"""Against a real gunicorn with the gevent worker: races and the hub."""

from __future__ import annotations

import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.conftest import OWASP_HASHING
from tests.servers import LiveServer
from tests.utils import DEFAULT_PASSWORD, random_email


def register_and_login(base: str, session: requests.Session | None = None) -> dict:
    http = session or requests
    email = random_email()
    assert http.post(f"{base}/auth/register", json={"email": email, "password": DEFAULT_PASSWORD}).status_code == 201
    response = http.post(f"{base}/auth/login", json={"email": email, "password": DEFAULT_PASSWORD, "transport": "body"})
    assert response.status_code == 200
    return {**response.json(), "email": email}


def test_twenty_concurrent_refreshes_of_one_token_exactly_one_succeeds(live_server):
    tokens = register_and_login(live_server.url)
    start = threading.Barrier(20)

    def refresh(_):
        with requests.Session() as http:
            start.wait()
            return http.post(f"{live_server.url}/auth/refresh", json={"refresh_token": tokens["refresh_token"]})

    with ThreadPoolExecutor(20) as pool:
        answers = list(pool.map(refresh, range(20)))
    statuses = sorted(a.status_code for a in answers)
    assert statuses == [200] + [401] * 19
    assert {a.json()["error"]["code"] for a in answers if a.status_code == 401} <= {
        "refresh_token_reused",
        "invalid_refresh_token",
    }


@pytest.fixture
def owasp_server(base_env, rdb, tmp_path):
    """A live server hashing at production's cost: tens of milliseconds a hash, as the test needs."""
    server = LiveServer({**base_env, **OWASP_HASHING}, log_path=tmp_path / "gunicorn.log")
    server.start()
    yield server
    server.stop()


def test_password_hashing_does_not_block_other_requests(owasp_server):
    """While logins hash passwords, a cheap request on the same worker still answers at once.

    If hashing ran on the gevent hub, every /healthz would wait behind whole hashes (tens of ms each).
    """
    base = owasp_server.url
    email = random_email()
    requests.post(f"{base}/auth/register", json={"email": email, "password": DEFAULT_PASSWORD})
    login_body = {"email": email, "password": DEFAULT_PASSWORD, "transport": "body"}

    with requests.Session() as http:
        started = time.perf_counter()
        http.post(f"{base}/auth/login", json=login_body)
        one_login = time.perf_counter() - started
        http.get(f"{base}/healthz")

    stop = threading.Event()

    def storm():
        with requests.Session() as http:
            while not stop.is_set():
                http.post(f"{base}/auth/login", json=login_body)

    storms = [threading.Thread(target=storm) for _ in range(6)]
    for thread in storms:
        thread.start()
    latencies = []
    try:
        with requests.Session() as http:
            time.sleep(one_login)  # let the storm fill the worker's queue of hashes
            for _ in range(30):
                started = time.perf_counter()
                assert http.get(f"{base}/healthz").status_code == 200
                latencies.append(time.perf_counter() - started)
    finally:
        stop.set()
        for thread in storms:
            thread.join()
    assert statistics.median(latencies) < one_login / 3, (one_login, latencies)
