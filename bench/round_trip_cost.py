"""The worker's CPU for one Redis round trip, by the way it is made: redis-py's own call, and the round trips
that concurrent requests share (`app/redis.py`), here with one caller at a time, their costliest case.

Run: .venv/bin/python -m bench.round_trip_cost [--root /tmp/base] [--calls 5000]

It starts a redis-server of its own on a free loopback port, and reports this process's CPU time (user and
system, which includes the kernel's side of the loopback sends) per call, best of three runs. `--root` imports
`app` from another checkout, so two trees can be compared on the same machine minutes apart.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path


def per_call(call, calls: int) -> float:
    """The least CPU time per call, in microseconds, of three runs of `calls` calls."""
    for _ in range(200):
        call()
    best = float("inf")
    for _ in range(3):
        started = time.process_time()
        for _ in range(calls):
            call()
        best = min(best, (time.process_time() - started) / calls * 1e6)
    return round(best, 1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", type=Path, help="import app from this checkout")
    parser.add_argument("--calls", type=int, default=5000)
    args = parser.parse_args()
    from gevent import monkey

    monkey.patch_all()
    from tests.servers import RedisServer

    if args.root is not None:
        sys.path.insert(0, str(args.root.resolve()))
        for name in [name for name in sys.modules if name == "app" or name.startswith("app.")]:
            del sys.modules[name]
    from app.redis import SharedPipelines, SharedRoundTrips, connect

    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp))
        server.start()
        try:
            client = connect(server.url, 64)
            script = client.register_script("return redis.call('GET', KEYS[1])")
            client.set("k", "v")
            shared_script, shared_reads = SharedRoundTrips(client, script), SharedPipelines(client)
            result = {
                "root": str(args.root or "this tree"),
                "redis-py call (HMGET)": per_call(lambda: client.hmget("h", ["a", "b"]), args.calls),
                "redis-py script call": per_call(lambda: script(keys=["k"]), args.calls),
                "shared reads (HMGET), one caller": per_call(
                    lambda: shared_reads([("hmget", ("h", ["a", "b"]), {})]), args.calls
                ),
                "shared script, one caller": per_call(lambda: shared_script(["k"], []), args.calls),
                "the shared script's round trip alone": per_call(
                    lambda: shared_script._round_trip([(["k"], [], ())]), args.calls
                ),
            }
        finally:
            server.stop()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
