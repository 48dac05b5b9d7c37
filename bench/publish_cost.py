"""What one publication costs a worker: one request per event, as most backends publish.

Run: .venv/bin/python -m bench.publish_cost [--seconds 8] [--connections 16]
     .venv/bin/python -m bench.publish_cost --base /tmp/base [--repeat 3]   (this tree beside another checkout)

wrk sends `POST /events` with an API key to 1,000 channels of a namespace (`rooms:r<n>`), as fast as the
server answers, on keep-alive connections; beside it, in the same run, a bare WSGI app on the same gunicorn
(this project's configuration and worker) and nginx+nchan (`POST /pub/<id>`). For each: requests per second,
latency, server CPU per request (user + system of every server process, from /proc), and how wrk's
connections were spread over the server's workers.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import requests

from bench.rooms import connections_per_worker, cpu_seconds, load, manager_key, put_namespace
from bench.run import wrk
from bench.targets import Service, process_tree, shared_redis
from tests.servers import ROOT, free_port, wait_until

ROOMS = 1000
WRK_SCRIPT = """
counter = 0
request = function()
  counter = counter + 1
  local room = counter %% %(rooms)d
  return wrk.format("POST", PATH(room), HEADERS, BODY(room))
end
"""


def wrk_post(url: str, lua: str, seconds: int, connections: int) -> dict:
    """`bench.run.wrk` with the requests of a Lua script."""
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(lua)
    try:
        return wrk(url, {}, seconds, connections, script=script.name)
    finally:
        os.unlink(script.name)


def measure(url: str, lua: str, pids: list[int], worker_pids: list[int], port: int, seconds: int, connections: int):
    spread: list[int] = []

    def sample_spread():
        time.sleep(seconds / 2)
        spread.extend(connections_per_worker(worker_pids, port))

    sampler = threading.Thread(target=sample_spread)
    before = cpu_seconds(pids)
    sampler.start()
    result = wrk_post(url, lua, seconds, connections)
    sampler.join()
    used = cpu_seconds(pids) - before
    result["server_cpu_seconds"] = round(used, 2)
    result["cpu_us_per_request"] = round(used / max(1, result["requests"]) * 1e6, 1)
    result["connections_per_worker"] = spread
    return result


def lua(path: str, headers: dict, body: str) -> str:
    """A wrk script: POST `body` to `path` (both Lua expressions of `room`, 0 to ROOMS - 1) with `headers`."""
    header_table = "{" + ", ".join(f'["{k}"] = "{v}"' for k, v in headers.items()) + "}"
    return (
        f"PATH = function(room) return {path} end\nHEADERS = {header_table}\n"
        f"BODY = function(room) return {body} end\n" + WRK_SCRIPT % {"rooms": ROOMS}
    )


def service_publishing(service: Service, seconds: int = 8, connections: int = 16) -> dict:
    key = manager_key(service.app.env)
    put_namespace(service, key, "rooms")
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    script = lua("'/events'", headers, """'{"channel":"rooms:r' .. room .. '","event":"m","data":"x"}'""")
    pids = process_tree(service.app.process.pid)
    url = f"{service.app.url}/events"
    wrk_post(url, script, 2, connections)  # warm-up: imports, pools, scripts loaded
    return measure(url, script, pids, service.app.worker_pids(), service.app.port, seconds, connections)


@contextlib.contextmanager
def bare_gunicorn(workers: int = 2, app: str = "bench.peers.bare_app:app", answers=None):
    """A bare WSGI app (by default one that answers 201 with a small JSON body) on this project's gunicorn
    worker, without the service's hooks (which expect the service's app); `answers(port)` says it is up."""
    port = free_port()
    process = subprocess.Popen(
        [str(ROOT / ".venv/bin/gunicorn"), "-c", "bench/peers/gunicorn_plain.conf.py", "--bind", f"127.0.0.1:{port}"]
        + ["--worker-class", "gevent_worker.FairGeventWorker", "--workers", str(workers)]
        + ["--worker-connections", "20000", "--log-level", "warning", app],
        cwd=ROOT,
    )
    try:
        wait_until(lambda: (answers or _publishes)(port), timeout=30)
        yield process, port
    finally:
        process.send_signal(signal.SIGQUIT)  # gunicorn's quick stop: a held stream would never end by itself
        process.wait(30)


def _publishes(port: int) -> bool:
    return requests.post(f"http://127.0.0.1:{port}/events", timeout=1).ok


def bare_publishing(seconds: int = 8, connections: int = 16) -> dict:
    with bare_gunicorn() as (process, port):
        pids = process_tree(process.pid)
        script = lua("'/events'", {"Content-Type": "application/json"}, """'{"channel":"rooms:r' .. room .. '"}'""")
        url = f"http://127.0.0.1:{port}/events"
        wrk_post(url, script, 2, connections)
        return measure(url, script, pids, pids[1:], port, seconds, connections)


def nchan_publishing(seconds: int = 8, connections: int = 16) -> dict:
    from bench.rooms import RoomsNchan

    with RoomsNchan() as nchan:
        pids = process_tree(nchan.nginx.process.pid)
        script = lua("'/pub/r' .. room", {}, "'x'")
        url = f"http://127.0.0.1:{nchan.port}/pub/r0"
        wrk_post(url, script, 2, connections)
        return measure(url, script, pids, pids[1:], nchan.port, seconds, connections)


def against_base(base: Path, repeat: int, seconds: int, connections: int) -> dict:
    """The service on this tree and on the checkout `base`, alternately, `repeat` times each (a busy machine's
    quiet and busy minutes then fall on both)."""
    from bench.rooms import _started

    runs: dict[str, list] = {"this tree": [], str(base): []}
    with shared_redis() as redis_server:
        for _ in range(repeat):
            for name, root in (("this tree", None), (str(base), base)):
                service = _started(redis_server, root)
                try:
                    runs[name].append(service_publishing(service, seconds, connections))
                finally:
                    service.__exit__(None, None, None)
                print(name, json.dumps(runs[name][-1]), flush=True)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--base", type=Path, help="instead: the service on this tree and on this checkout")
    parser.add_argument("--repeat", type=int, default=3, help="with --base: runs of each, alternately")
    args = parser.parse_args()
    if args.base is not None:
        before = load()
        runs = against_base(args.base.resolve(), args.repeat, args.seconds, args.connections)
        print(json.dumps({"load_before": before, "runs": runs, "load_after": load()}, indent=1))
        return
    results = {"load_before": load()}
    with shared_redis() as redis_server, Service(redis_server) as service:
        results["service"] = service_publishing(service, args.seconds, args.connections)
        print(json.dumps(results["service"]), flush=True)
    results["bare_wsgi"] = bare_publishing(args.seconds, args.connections)
    results["nchan"] = nchan_publishing(args.seconds, args.connections)
    results["load_after"] = load()
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
