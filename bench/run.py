"""`make bench`: run every benchmark in turn and write bench/results/latest.json.

Each benchmark is also runnable alone (see bench/README.md). They start their own redis-server and
gunicorn on loopback ports and stop them after.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from bench.common import machine

HERE = Path(__file__).resolve().parent
STEPS = [
    ["bench.auth_latency"],
    ["bench.single_client", "--events", "1000"],
    ["bench.capacity", "--streams", "1000"],
    ["bench.capacity", "--streams", "5000"],
    ["bench.capacity", "--streams", "1000", "--transport", "ws"],
]


def main() -> None:
    results = {"machine": machine(), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "runs": []}
    for step in STEPS:
        command = [sys.executable, "-m", *step]
        print("$", " ".join(["python", "-m", *step]), flush=True)
        done = subprocess.run(command, cwd=HERE.parent, capture_output=True, text=True, timeout=1800)
        print(done.stdout, flush=True)
        if done.returncode != 0:
            print(done.stderr, file=sys.stderr)
        results["runs"].append({"command": " ".join(step), "output": done.stdout, "exit": done.returncode})
    out = HERE / "results" / "latest.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"written to {out.relative_to(HERE.parent)}")


if __name__ == "__main__":
    main()
