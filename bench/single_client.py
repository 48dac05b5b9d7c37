"""One client: publish-to-receive latency per transport (SSE, WebSocket, long polling) over N events.

Each event is published only after the previous one arrived, so the numbers are latency, not queueing.
Run: .venv/bin/python -m bench.single_client [--events 1000] [--base URL --api-key KEY]   (starts its own
service unless --base is given, e.g. to measure through nginx; then KEY publishes to user:*).
Events are published as a backend publishes them: with an API key.
"""

from __future__ import annotations

import argparse
import json
import threading
import time

import requests

from bench.common import machine, publisher_key, service, summary_ms
from tests.events.clients import SSE, Api, open_ws, ws_json


def measure_sse(base: str, user: Api, publisher: requests.Session, count: int) -> list[float]:
    stream = SSE(base, user.auth)
    stream.next(skip_comments=False)
    latencies = []
    for n in range(count):
        started = time.perf_counter()
        publisher.post(f"{base}/events", json={"channel": user.channel, "event": "b", "data": n})
        stream.next_event()
        latencies.append(time.perf_counter() - started)
    stream.close()
    return latencies


def measure_ws(base: str, user: Api, publisher: requests.Session, count: int) -> list[float]:
    ws = open_ws(base, user.auth)
    ws_json(ws)
    latencies = []
    for n in range(count):
        started = time.perf_counter()
        publisher.post(f"{base}/events", json={"channel": user.channel, "event": "b", "data": n})
        while ws_json(ws)["type"] != "event":
            pass
        latencies.append(time.perf_counter() - started)
    ws.close()
    return latencies


def measure_long_poll(base: str, user: Api, publisher: requests.Session, count: int) -> list[float]:
    cursor = user.current_cursor()
    latencies = []
    for n in range(count):
        arrived = {}

        def wait(cursor=cursor, arrived=arrived):
            arrived["response"] = user.wait(cursor, timeout=10)
            arrived["at"] = time.perf_counter()

        waiter = threading.Thread(target=wait)
        waiter.start()
        time.sleep(0.002)  # let the poll reach the server and be held
        started = time.perf_counter()
        publisher.post(f"{base}/events", json={"channel": user.channel, "event": "b", "data": n})
        waiter.join()
        cursor = arrived["response"].json()["cursor"]
        latencies.append(arrived["at"] - started)
    return latencies


def run(base: str, count: int, api_key: str) -> dict:
    user = Api(base)
    publisher = requests.Session()
    publisher.headers["Authorization"] = f"Bearer {api_key}"
    return {
        "sse": summary_ms(measure_sse(base, user, publisher, count)),
        "websocket": summary_ms(measure_ws(base, user, publisher, count)),
        "long_poll": summary_ms(measure_long_poll(base, user, publisher, count)),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=1000)
    parser.add_argument("--base", help="measure an already running service (e.g. through nginx)")
    parser.add_argument("--api-key", help="with --base: a key with events:publish to user:*")
    args = parser.parse_args()
    if args.base:
        if not args.api_key:
            parser.error("--base needs --api-key (flask --app wsgi api-keys create ...)")
        results = run(args.base, args.events, args.api_key)
    else:
        with service(workers=2) as (server, _):
            results = run(server.url, args.events, publisher_key(server.env, ("user:*",)))
    print(json.dumps({"machine": machine(), "events": args.events, "publish_to_receive": results}, indent=2))


if __name__ == "__main__":
    main()
