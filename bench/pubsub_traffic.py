"""Redis's outgoing bytes per published event as instances are added, with one reader on one of them.

1, 4 and 8 gunicorn instances (1 worker each) on one Redis. Each instance but the first has a reader of
some other user's channel, so every hub is live, as on a real deployment; the measured user's one
reader is on the first instance. Publish N events to that user's channel (with an API key) and read
`total_net_output_bytes` from `INFO stats` before and after (less what the INFO calls themselves
cost): Redis's outgoing bytes per event. With per-channel subscriptions only the reader's worker is
sent the wake-up, so the figure must not grow with the instance count; with the former pattern
subscription (`wake:*` in every worker) each instance adds one copy of every event.

Run: .venv/bin/python -m bench.pubsub_traffic [--events 500] [--old-ref 48bdc23]
(--old-ref measures the same on that revision, extracted with `git archive`; `--old-ref ''` skips it.)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import tarfile
import tempfile
from concurrent.futures import ThreadPoolExecutor
from io import BytesIO
from pathlib import Path

import requests

from bench.common import publisher_key, service_env
from tests.events.clients import SSE, Api
from tests.servers import ROOT, LiveServer, RedisServer

INSTANCE_COUNTS = (1, 4, 8)
# The last revision whose hub pattern-subscribed to wake:* in every worker.
OLD_DESIGN_REF = "48bdc23"


def output_bytes(client) -> int:
    return int(client.info("stats")["total_net_output_bytes"])


def measure(instances: int, events: int, root: Path = ROOT) -> dict:
    """Outgoing bytes per event with `instances` instances of the checkout at `root`."""
    with tempfile.TemporaryDirectory() as tmp:
        redis_server = RedisServer(Path(tmp))
        redis_server.start()
        env = service_env(redis_server, tmp)
        servers = [LiveServer(env, workers=1, root=root) for _ in range(instances)]
        streams: list[SSE] = []
        try:
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(LiveServer.start, servers))
            for server in servers[1:]:  # a reader of another channel: every instance's hub is live
                other = Api(server.url)
                streams.append(SSE(server.url, other.auth))
            reader = Api(servers[0].url)
            stream = SSE(servers[0].url, reader.auth)
            streams.append(stream)
            for each in streams:
                each.next(skip_comments=False)  # open: subscribed
            publisher = requests.Session()
            publisher.headers["Authorization"] = f"Bearer {publisher_key(env, (reader.channel,))}"
            client = redis_server.client()
            info_cost = -output_bytes(client)
            info_cost += output_bytes(client)  # one INFO reply, counted in the next reading
            before = output_bytes(client)
            for n in range(events):
                body = {"channel": reader.channel, "event": "measure", "data": {"n": n, "text": "x" * 100}}
                assert publisher.post(f"{servers[-1].url}/events", json=body, timeout=10).status_code == 201
            received = stream.events(events, timeout=60)
            after = output_bytes(client)
            assert [f["data"]["data"]["n"] for f in received] == list(range(events))
            per_event = (after - before - info_cost) / events
            pubsub = {
                c["name"] or c["addr"]: {"sub": int(c["sub"]), "psub": int(c["psub"])}
                for c in client.client_list()
                if "P" in c["flags"]
            }
            return {
                "instances": instances,
                "events": events,
                "bytes_per_event": round(per_event, 1),
                "pubsub_connections": len(pubsub),
                "pattern_subscriptions": sum(c["psub"] for c in pubsub.values()),
            }
        finally:
            for each in streams:
                each.close()
            for server in servers:
                server.stop()
            redis_server.stop()


@contextlib.contextmanager
def checkout(ref: str):
    """The tree of `ref` from this repository, in a temporary directory (None if git cannot give it)."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], capture_output=True, check=False)
    if archive.returncode != 0:
        yield None
        return
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
            tar.extractall(tmp, filter="data")
        yield Path(tmp)


def run(events: int = 500, old_ref: str | None = OLD_DESIGN_REF) -> dict:
    """Per-channel (this checkout) and, if `old_ref` is given and available, the pattern design."""
    results = {"events": events, "per_channel": [], "pattern": [], "pattern_ref": old_ref or None}
    for instances in INSTANCE_COUNTS:
        results["per_channel"].append(measure(instances, events))
        print(json.dumps({"design": "per-channel", **results["per_channel"][-1]}), flush=True)
    if old_ref:
        with checkout(old_ref) as old_root:
            if old_root is None:
                results["pattern_ref"] = None
            else:
                for instances in INSTANCE_COUNTS:
                    results["pattern"].append(measure(instances, events, old_root))
                    print(json.dumps({"design": f"pattern ({old_ref})", **results["pattern"][-1]}), flush=True)
    return results


def table(results: dict) -> str:
    """Markdown rows: bytes per event by instance count, for each design measured."""
    lines = [
        "| design | instances | Redis output bytes per event | pub/sub connections | pattern subscriptions |",
        "|---|---|---|---|---|",
    ]
    designs = (("per-channel", results["per_channel"]), (f"pattern ({results['pattern_ref']})", results["pattern"]))
    for design, rows in designs:
        for row in rows:
            lines.append(
                f"| {design} | {row['instances']} | {row['bytes_per_event']:,.0f} | {row['pubsub_connections']} "
                f"| {row['pattern_subscriptions']} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=500)
    parser.add_argument("--old-ref", default=OLD_DESIGN_REF, help="revision of the pattern design ('' to skip)")
    args = parser.parse_args()
    results = run(args.events, args.old_ref)
    print(table(results))


if __name__ == "__main__":
    main()
