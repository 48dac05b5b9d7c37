"""`flask --app wsgi users import`: 10,000 users with bcrypt hashes, timed, and every one of them logging in.

Run: .venv/bin/python -m bench.import_users [--users N] [--clients C] [--cluster]
(starts its own redis-server, or with --cluster a local Redis Cluster of 3 primaries and 3 replicas, and
gunicorn with 2 workers; about two minutes on 2 cores)

1. Cost 10, as Auth0 and Supabase export them: N users whose hashes are 16 distinct cost-10 hashes reused
   (an import does not hash, so its time does not depend on how many distinct hashes there are, and making
   N of them would take N x 70 ms), imported with the real command in its own process: the time an operator
   waits. A sample of them logs in over HTTP (each a cost-10 verification, then an Argon2id rehash).
2. Every user logs in: N other users, each with its own password and a distinct cost-4 hash (so that making
   them takes seconds), imported the same way; then each one logs in over HTTP, C clients at a time, and
   each stored hash must be Argon2id afterwards.
3. The first file again: nothing changes, every line is reported present.

The service runs with PASSWORD_HASH_COST=minimal so that the 10,000 rehashes at login cost the logins little
(the figure of interest is that each verifies); the import itself never hashes.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import tempfile
import time
from pathlib import Path

import bcrypt
import requests

from app.redis import Keys
from bench.common import machine, service, summary_ms

ROOT = Path(__file__).resolve().parents[1]
FLASK = ROOT / ".venv" / "bin" / "flask"
DISTINCT_COST_10 = 16
SAMPLE_LOGINS = 64


def password_of(prefix: str, n: int, distinct: int | None = None) -> str:
    return f"{prefix} password {n % distinct if distinct else n}"


def _bcrypt(args: tuple[str, int]) -> str:
    password, cost = args
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(cost)).decode()


def hashes(passwords: list[str], cost: int) -> list[str]:
    """bcrypt hashes of the passwords, made on every core."""
    with multiprocessing.Pool() as pool:
        return pool.map(_bcrypt, [(password, cost) for password in passwords], chunksize=64)


def write_export(path: Path, prefix: str, hashed: list[str], users: int) -> None:
    with path.open("w") as file:
        for n in range(users):
            line = {"email": f"{prefix}-{n:05d}@example.com", "password_hash": hashed[n % len(hashed)]}
            file.write(json.dumps({**line, "email_verified": True}) + "\n")


def run_import(env: dict, path: Path) -> tuple[float, str]:
    """`flask --app wsgi users import PATH` in its own process: seconds, and its summary line."""
    started = time.perf_counter()
    done = subprocess.run(
        [str(FLASK), "--app", "wsgi", "users", "import", str(path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    elapsed = time.perf_counter() - started
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return elapsed, done.stdout.strip().splitlines()[-1]


def _log_in(args: tuple[str, list[tuple[str, str]]]) -> list[tuple[int, float]]:
    url, accounts = args
    http, results = requests.Session(), []
    for email, password in accounts:
        started = time.perf_counter()
        answer = http.post(f"{url}/auth/login", json={"email": email, "password": password, "transport": "body"})
        results.append((answer.status_code, time.perf_counter() - started))
    return results


def log_in_all(url: str, accounts: list[tuple[str, str]], clients: int) -> tuple[float, list[tuple[int, float]]]:
    """Each account logs in once over HTTP, `clients` at a time: seconds, and (status, latency) per login."""
    shares = [(url, accounts[i::clients]) for i in range(clients)]
    started = time.perf_counter()
    with multiprocessing.Pool(clients) as pool:
        results = [result for share in pool.map(_log_in, shares) for result in share]
    return time.perf_counter() - started, results


def stored_hash_kinds(redis_server) -> dict[str, int]:
    """How many user records hold which kind of hash (by its first characters)."""
    client = redis_server.client()
    kinds: dict[str, int] = {}
    ids = client.zrange(Keys.users(), 0, -1)
    pipe = client.pipeline(transaction=False)
    for user_id in ids:
        pipe.hget(Keys.user(user_id), "password_hash")
    for value in pipe.execute():
        kind = value.split("$")[1] if value else "none"
        kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=10_000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--cluster", action="store_true", help="on a local Redis Cluster")
    options = parser.parse_args()
    users = options.users
    where = "a Redis Cluster (3 primaries, 3 replicas)" if options.cluster else "one redis-server"
    print(f"{machine()}; {users:,} users a file, {options.clients} login clients, {where}")
    with (
        tempfile.TemporaryDirectory() as tmp,
        service(workers=2, cluster=options.cluster, PASSWORD_HASH_COST="minimal") as (server, rdb),
    ):
        env = {key: value for key, value in server.env.items() if key not in ("PORT", "WEB_CONCURRENCY")}

        started = time.perf_counter()
        cost_10 = hashes([password_of("auth0", n) for n in range(DISTINCT_COST_10)], 10)
        auth0_file = Path(tmp) / "auth0.jsonl"
        write_export(auth0_file, "auth0", cost_10, users)
        print(f"made {DISTINCT_COST_10} cost-10 hashes and the file in {time.perf_counter() - started:.1f} s")
        seconds, summary = run_import(env, auth0_file)
        print(f"import, cost-10 bcrypt: {seconds:.2f} s ({users / seconds:,.0f} users/s): {summary}")
        sample = [
            (f"auth0-{n:05d}@example.com", password_of("auth0", n, DISTINCT_COST_10))
            for n in range(0, users, max(1, users // SAMPLE_LOGINS))
        ]
        _, results = log_in_all(server.url, sample, 2)
        assert [status for status, _ in results] == [200] * len(sample), results
        latencies = summary_ms([latency for _, latency in results])
        print(f"  {len(sample)} of them logged in (cost-10 verification, then rehash): {latencies}")

        started = time.perf_counter()
        own = [password_of("own", n) for n in range(users)]
        cost_4 = hashes(own, 4)
        own_file = Path(tmp) / "own.jsonl"
        write_export(own_file, "own", cost_4, users)
        print(f"made {users:,} cost-4 hashes and the file in {time.perf_counter() - started:.1f} s")
        seconds, summary = run_import(env, own_file)
        print(
            f"import, cost-4 bcrypt, each its own password: {seconds:.2f} s ({users / seconds:,.0f} users/s): {summary}"
        )
        accounts = [(f"own-{n:05d}@example.com", own[n]) for n in range(users)]
        elapsed, results = log_in_all(server.url, accounts, options.clients)
        statuses: dict[int, int] = {}
        for status, _ in results:
            statuses[status] = statuses.get(status, 0) + 1
        print(
            f"  every one logged in: {statuses} in {elapsed:.1f} s ({len(results) / elapsed:,.0f} logins/s), "
            f"{summary_ms([s for _, s in results])}"
        )
        assert statuses == {200: users}, statuses
        kinds = stored_hash_kinds(rdb)
        print(f"  stored hashes now: {kinds}")
        assert kinds.get("argon2id", 0) >= users + len(sample), kinds

        seconds, summary = run_import(env, auth0_file)
        print(f"the cost-10 file again: {seconds:.2f} s: {summary}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    main()
