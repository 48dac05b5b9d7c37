"""Where the service's workers spend their CPU while they broadcast to many open streams.

Run: .venv/bin/python -m bench.profile [--streams 10000] [--transport sse|ws] [--events 20 | --rate 500]
     .venv/bin/python -m bench.profile --request /auth/me
     .venv/bin/python -m bench.profile --publish   (one POST /events per event, with an API key, from 16 connections)
     .venv/bin/python -m bench.profile --rooms [--streams 10000]   (rooms of 10 streams, one event a second each)
     .venv/bin/python -m bench.profile --opening [--streams 10000]   (opening those rooms' streams)

It starts the service (two workers) with a statistical profiler in each worker: every 4 ms of the
process's CPU time (ITIMER_PROF) it records the Python stack that was running. It opens the streams,
publishes `--events` broadcasts half a second apart (or, with `--rate`, paced events for 4 s as the
sustained benchmark does), and prints the functions that used the CPU, by
their own time and with what they called. Samples taken while the worker waits in its event loop are
not counted (the timer counts CPU time only).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path

SAMPLE_SECONDS = 0.004
OUT_VARIABLE = "BENCH_PROFILE_DIR"


class Sampler:
    """Counts the stacks that SIGPROF interrupts; writes them out as JSON every second, and forgets
    what it counted when the driver writes a new `generation` into its directory."""

    def __init__(self, directory: str):
        self.path = Path(directory) / f"worker-{os.getpid()}.json"
        self.stacks: collections.Counter = collections.Counter()
        self.written = time.monotonic()
        self.generation = ""

    def start(self) -> None:
        signal.signal(signal.SIGPROF, self.sample)
        signal.setitimer(signal.ITIMER_PROF, SAMPLE_SECONDS, SAMPLE_SECONDS)

    def sample(self, _signum, frame) -> None:
        stack = []
        while frame is not None:
            code = frame.f_code
            stack.append(f"{Path(code.co_filename).name}:{code.co_name}")
            frame = frame.f_back
        self.stacks[";".join(reversed(stack))] += 1
        if time.monotonic() - self.written > 1:
            self.written = time.monotonic()
            with contextlib.suppress(OSError):
                generation = (self.path.parent / "generation").read_text()
                if generation != self.generation:  # counted before the driver's last reset: forget it
                    self.stacks.clear()
                    self.generation = generation
                self.path.write_text(json.dumps(dict(self.stacks)))


class MemoryTracer:
    """tracemalloc in a worker: a snapshot when the driver writes `before`, the difference at `after`."""

    def __init__(self, directory: str):
        self.directory = Path(directory)
        self.before = None

    def start(self) -> None:
        import tracemalloc

        tracemalloc.start(1)
        signal.signal(signal.SIGALRM, self.check)
        signal.setitimer(signal.ITIMER_REAL, 0.5, 0.5)

    def check(self, _signum, _frame) -> None:
        import tracemalloc

        signal.setitimer(signal.ITIMER_REAL, 0)  # a snapshot takes longer than the interval: no re-entry
        with contextlib.suppress(OSError):
            stage = (self.directory / "stage").read_text()
            if stage == "before" and self.before is None:
                self.before = tracemalloc.take_snapshot()
            elif stage == "after" and self.before is not None:
                difference = tracemalloc.take_snapshot().compare_to(self.before, "lineno")
                rows = [(str(d.traceback[0]), d.size_diff, d.count_diff) for d in difference[:400]]
                total = sum(d.size_diff for d in difference)
                path = self.directory / f"memory-{os.getpid()}.json"
                path.write_text(json.dumps({"total": total, "rows": rows}))
                self.before = None
        signal.setitimer(signal.ITIMER_REAL, 0.5, 0.5)


def start_in_workers() -> None:
    """Called from the sitecustomize this module writes: profile every process forked from now on."""
    directory = os.environ.get(OUT_VARIABLE)
    if directory:
        kind = MemoryTracer if os.environ.get("BENCH_PROFILE_MEMORY") else Sampler
        os.register_at_fork(after_in_child=lambda: kind(directory).start())


def report(directory: Path, top: int = int(os.environ.get("BENCH_PROFILE_TOP", "30"))) -> str:
    """The functions by own time and with what they called; the stacks themselves, in the collapsed form
    flame graph tools read, go to the file named by BENCH_PROFILE_STACKS when it is set."""
    own, within, stacks = collections.Counter(), collections.Counter(), collections.Counter()
    total = 0
    for path in directory.glob("worker-*.json"):
        for stack, count in json.loads(path.read_text()).items():
            stacks[stack] += count
            frames = stack.split(";")
            total += count
            own[frames[-1]] += count
            for name in set(frames):
                within[name] += count
    lines = [f"{total} samples of {SAMPLE_SECONDS * 1000:.0f} ms CPU", "", "own time:"]
    lines += [f"{count / total:6.1%}  {name}" for name, count in own.most_common(top)]
    lines += ["", "with what it called:"]
    lines += [f"{count / total:6.1%}  {name}" for name, count in within.most_common(top + 20)]
    if os.environ.get("BENCH_PROFILE_STACKS"):
        Path(os.environ["BENCH_PROFILE_STACKS"]).write_text("".join(f"{s} {n}\n" for s, n in stacks.most_common()))
    return "\n".join(lines)


def memory_per_stream(service, transport: str, count: int, out: Path) -> str:
    """Open `count` streams between two tracemalloc snapshots in each worker; what they hold, per stream."""
    from bench.run import fleet_processes
    from bench.streams import StreamFleet

    (out / "stage").write_text("before")
    time.sleep(1.5)
    fleet = StreamFleet(service.target(transport), count, "memory", expected=1, processes=fleet_processes(count))
    fleet.open()
    time.sleep(1.0)
    (out / "stage").write_text("after")
    deadline = time.monotonic() + 120
    while len(list(out.glob("memory-*.json"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
    by_line, total = collections.Counter(), 0
    for path in out.glob("memory-*.json"):
        measured = json.loads(path.read_text())
        total += measured["total"]
        for line, size, _count in measured["rows"]:
            by_line[line] += size
    lines = [f"{count} {transport} streams: {total / count:,.0f} bytes per stream traced by tracemalloc", ""]
    by_file = collections.Counter()
    for line, size in by_line.items():
        by_file[line.rpartition(":")[0].rpartition("site-packages/")[2]] += size
    lines += [f"{size / count:8,.0f} B  {line}" for line, size in by_line.most_common(30)]
    lines += ["", "by file:"] + [f"{size / count:8,.0f} B  {name}" for name, size in by_file.most_common(25)]
    return "\n".join(lines)


def main() -> None:
    from bench.run import fleet_processes, sustained, wrk
    from bench.streams import StreamFleet, tag
    from bench.targets import Service, shared_redis

    parser = argparse.ArgumentParser()
    parser.add_argument("--streams", type=int, default=10000)
    parser.add_argument("--transport", choices=("sse", "ws"), default="sse")
    parser.add_argument("--events", type=int, default=20)
    parser.add_argument("--memory", action="store_true", help="what one open stream holds, by allocating line")
    parser.add_argument("--rate", type=int, help="instead of broadcasts: publish this many events/s for 4 s")
    parser.add_argument("--request", help="instead of broadcasts: wrk on this path (with a user's token) for 8 s")
    parser.add_argument("--publish", action="store_true", help="instead: POST /events to 1,000 rooms for 8 s")
    parser.add_argument("--rooms", action="store_true", help="instead: bench.rooms' rooms part (the service) for 10 s")
    parser.add_argument("--opening", action="store_true", help="instead: what opening the rooms part's streams costs")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        hook = Path(tmp) / "hook"
        hook.mkdir()
        (hook / "sitecustomize.py").write_text("import bench.profile\nbench.profile.start_in_workers()\n")
        out = Path(tmp) / "samples"
        out.mkdir()
        (out / "generation").write_text("opening")
        root = Path(__file__).resolve().parent.parent
        env = {OUT_VARIABLE: str(out), "PYTHONPATH": f"{hook}{os.pathsep}{root}"}
        if args.memory:
            env |= {"BENCH_PROFILE_MEMORY": "1", "GUNICORN_TIMEOUT": "600"}  # a snapshot takes its time
            (out / "stage").write_text("starting")
        with shared_redis() as redis_server, Service(redis_server, extra_env=env) as service:
            if args.memory:
                print(memory_per_stream(service, args.transport, args.streams, out))
                return
            if args.request:
                (out / "generation").write_text("requests")
                print(json.dumps(wrk(f"{service.app.url}{args.request}", {"Authorization": f"Bearer {service.token}"})))
                time.sleep(1.5)  # a last write of the samples
                print(report(out))
                return
            if args.rooms or args.opening:
                from bench.rooms import room_readers, rooms_run

                rooms = [n // 10 for n in range(args.streams)]
                key, targets = room_readers(service, [[f"rooms:r{room}"] for room in rooms])
                if args.opening:
                    (out / "generation").write_text("opening")  # not what making the users cost

                    def opened() -> None:
                        time.sleep(1.5)  # a last write of the samples
                        print(report(out), flush=True)

                    rooms_run("service", service, targets, rooms, service.server_pids, service.app.port, key, 1,
                              when_open=opened)  # fmt: skip
                    return

                def read() -> None:
                    time.sleep(1.5)  # a last write of the samples
                    print(report(out), flush=True)  # not what ending the streams cost

                rooms_run(
                    "service", service, targets, rooms, service.server_pids, service.app.port, key, 10,
                    when_open=lambda: (out / "generation").write_text("rooms"),  # not what opening them cost
                    when_read=read,
                )  # fmt: skip
                return
            if args.publish:
                from bench.publish_cost import service_publishing

                (out / "generation").write_text("publishing")
                print(json.dumps(service_publishing(service)))
                time.sleep(1.5)  # a last write of the samples
                print(report(out))
                return
            if args.rate:
                (out / "generation").write_text("paced")
                print(json.dumps(sustained(service, service.target(args.transport), args.streams, [args.rate], 4.0)))
                time.sleep(1.5)  # a last write of the samples
                print(report(out))
                return
            token = f"profile-{uuid.uuid4().hex}"
            fleet = StreamFleet(
                service.target(args.transport),
                args.streams,
                token,
                expected=args.events,
                processes=fleet_processes(args.streams),
                timeout=120,
            )
            fleet.open()
            (out / "generation").write_text("broadcasts")  # what opening the streams cost is not measured
            for n in range(args.events):
                service.publish(tag(token, n))
                time.sleep(0.5)
            fleet.collect()
            time.sleep(1.5)  # a last write of the samples
            missing = sum(v["missing"] for v in fleet.verdicts)
            print(f"{args.streams} {args.transport} streams, {args.events} broadcasts, {missing} deliveries missing")
            print(report(out))


if __name__ == "__main__":
    sys.exit(main())
