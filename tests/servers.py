"""Real servers for tests: redis-server and gunicorn (gevent worker), on loopback ports picked here."""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis
import requests
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

ROOT = Path(__file__).resolve().parent.parent
OIDC_DIR = ROOT / "tests" / "oidc"
CLIENT_ID, CLIENT_SECRET = "auth-rt-test", "test-client-secret-0123456789"
VENV_BIN = Path(sys.executable).parent


# What a child process needs from ours; nothing else of a developer's shell (OAUTH_PROVIDERS,
# JWT_ALGORITHM, REDIS_URL ...) may change what the tests test.
INHERITED = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "TERM")


def process_env(*environments: dict, **variables: str) -> dict[str, str]:
    """A clean environment for a child process: the few inherited variables, then the given ones."""
    env = {name: os.environ[name] for name in INHERITED if name in os.environ}
    env["ENV_FILE"] = ""  # a developer's .env must not change what the tests test
    for environment in environments:
        env.update(environment)
    env.update(variables)
    return env


def free_port() -> int:
    """A port free on every local address: gunicorn binds 0.0.0.0, which a connection from another
    loopback address (the load generator's 127.0.1.x) using the port as its source would block."""
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        return sock.getsockname()[1]


def _ephemeral_ports() -> range:
    """The ports the kernel hands out as outgoing connections' source ports."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return range(low, high + 1)


def free_cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is free too, both outside the ephemeral range.

    A bus port among the ephemeral ports could be taken by any outgoing connection of the suite
    between this check and the node's start, and the node would exit at once."""
    ephemeral = _ephemeral_ports()
    while True:
        port = random.randint(10000, 30000)
        if port in ephemeral or port + 10000 in ephemeral:
            continue
        with socket.socket() as data, socket.socket() as bus:
            try:
                data.bind(("127.0.0.1", port))
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
            return port


class ProcessExited(RuntimeError):
    """The process waited for has exited: waiting longer cannot help."""


def wait_until(predicate, timeout: float = 10.0, interval: float = 0.02, message: str = "condition"):
    """Poll `predicate` until it returns a truthy value; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last_error = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except ProcessExited:
            raise
        except Exception as error:  # noqa: BLE001 - the server may not be up yet
            last_error = error
        time.sleep(interval)
    raise TimeoutError(f"timed out waiting for {message}: {last_error!r}")


class RedisServer:
    """A redis-server process that can be stopped and started again on the same port."""

    def __init__(self, directory: Path, persistent: bool = False):
        self.port = free_port()
        self.directory = directory
        self.persistent = persistent  # an append-only file, so a restart keeps users and streams
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, decode_responses=True)

    def start(self) -> None:
        self.process = subprocess.Popen(
            ["redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--save", ""]
            + ["--appendonly", "yes" if self.persistent else "no", "--appendfsync", "always"]
            + ["--dir", str(self.directory)],
            stdout=subprocess.DEVNULL,
        )
        wait_until(lambda: self.client().ping(), message="redis-server")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)


class RedisClusterServer:
    """A local Redis Cluster: 3 primaries and 3 replicas on loopback ports, each node a redis-server.

    Nodes time out after `node_timeout` ms, so a killed primary's replica takes over within seconds.
    `url` names every node (the app's `REDIS_URL` in cluster mode takes comma-separated seeds).
    """

    def __init__(self, directory: Path, primaries: int = 3, replicas_each: int = 1, node_timeout: int = 1000):
        self.directory = directory
        self.count = primaries * (1 + replicas_each)
        self.replicas_each = replicas_each
        self.node_timeout = node_timeout
        self.ports = [free_cluster_port() for _ in range(self.count)]
        self.processes: dict[int, subprocess.Popen] = {}

    @property
    def url(self) -> str:
        return ",".join(f"redis://127.0.0.1:{port}/0" for port in self.ports)

    def client(self) -> redis.RedisCluster:
        nodes = [redis.cluster.ClusterNode("127.0.0.1", port) for port in self.ports if port in self.processes]
        return redis.RedisCluster(startup_nodes=nodes, decode_responses=True)

    def start(self) -> None:
        for index, port in enumerate(self.ports):
            self.ports[index] = self._start_new_node(port)
        addresses = [f"127.0.0.1:{port}" for port in self.ports]
        subprocess.run(
            ["redis-cli", "--cluster", "create", *addresses, "--cluster-replicas", str(self.replicas_each)]
            + ["--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=60,
        )
        wait_until(self.whole, timeout=30, message="redis cluster with its replicas")

    def start_node(self, port: int) -> None:
        """Start (or restart, keeping its nodes.conf) the node on this port."""
        node_dir = self.directory / str(port)
        node_dir.mkdir(parents=True, exist_ok=True)
        self.processes[port] = subprocess.Popen(
            ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", ""]
            + ["--appendonly", "no", "--dir", str(node_dir), "--cluster-enabled", "yes"]
            + ["--cluster-config-file", "nodes.conf", "--cluster-node-timeout", str(self.node_timeout)]
            + ["--cluster-replica-validity-factor", "0"]
            + ["--repl-diskless-sync-delay", "0"],  # a node back after a kill syncs at once, not after 5 s
            stdout=subprocess.DEVNULL,
        )
        wait_until(lambda: self._answers(port), message=f"redis node {port}")

    def _start_new_node(self, port: int, attempts: int = 5) -> int:
        """Start a node that has never run, on another free port if another process took this one."""
        for _ in range(attempts - 1):
            try:
                self.start_node(port)
                return port
            except ProcessExited:
                port = free_cluster_port()
        self.start_node(port)
        return port

    def _answers(self, port: int) -> bool:
        if self.processes[port].poll() is not None:
            raise ProcessExited(f"redis node {port} exited with status {self.processes.pop(port).returncode}")
        return redis.Redis("127.0.0.1", port).ping()

    def kill_node(self, port: int) -> None:
        """SIGKILL one node (a crash: no goodbye to the cluster)."""
        process = self.processes.pop(port)
        process.kill()
        process.wait(10)

    def wait_for_failover(self, dead_port: int, timeout: float = 30) -> None:
        """Wait until a replica serves the dead primary's slots and the cluster is whole again."""
        wait_until(lambda: dead_port not in self.primaries() and self.ready(), timeout=timeout, message="failover")

    def replicas_in_sync(self) -> bool:
        """Every replica connected to its primary (until then it cannot take over)."""
        for port in self.processes:
            info = redis.Redis("127.0.0.1", port, decode_responses=True).info("replication")
            if info["role"] == "slave" and info.get("master_link_status") != "up":
                return False
        return True

    def whole(self) -> bool:
        """Ready, and every primary serving slots has all its replicas online and in sync.

        A restarted primary reports itself as a primary until it learns of its failover, and a node that was
        slow to answer may have been failed over: `replicas_in_sync` alone does not see either."""
        if not self.ready() or not self.replicas_in_sync():
            return False
        for port in self.primaries():
            info = redis.Redis("127.0.0.1", port, decode_responses=True).info("replication")
            online = [info.get(f"slave{n}", {}) for n in range(int(info["connected_slaves"]))]
            if len([r for r in online if r.get("state") == "online"]) < self.replicas_each:
                return False
        return True

    def replica_of(self, primary: int) -> int:
        """The port of a replica of the primary on `primary` (wait for `whole` first)."""
        return int(redis.Redis("127.0.0.1", primary, decode_responses=True).info("replication")["slave0"]["port"])

    def ready(self) -> bool:
        """Every slot served and every node agreeing that the cluster is ok."""
        for port in self.processes:
            info = redis.Redis("127.0.0.1", port, decode_responses=True).cluster("info")
            if info.get("cluster_state") != "ok" or int(info.get("cluster_slots_ok", 0)) != 16384:
                return False
        return True

    def primaries(self) -> list[int]:
        """Ports of the nodes serving slots now."""
        any_port = next(iter(self.processes))
        slots = redis.Redis("127.0.0.1", any_port, decode_responses=True).execute_command("CLUSTER", "SLOTS")
        return sorted({int(entry[2][1]) for entry in slots})

    def primary_of(self, key: str) -> int:
        """The port of the primary that serves `key`'s hash slot."""
        return self.client().get_node_from_key(key).port

    def flushall(self) -> None:
        for port in self.primaries():
            redis.Redis("127.0.0.1", port).flushall()

    def stop(self) -> None:
        for port in list(self.processes):
            process = self.processes.pop(port)
            process.terminate()
            process.wait(10)


def flush_redis(redis_server) -> None:
    """Empty the suite's Redis (every primary on a cluster): for a module-scoped server that must not start on
    what an earlier module left (a signing key sealed under another SECRET_KEY, say)."""
    if redis_server.mode == "cluster":
        redis_server.flushall()
    else:
        redis_server.client().flushall()


class LiveServer:
    """gunicorn with the gevent worker, configured by gunicorn.conf.py and environment variables."""

    #: Every server's log, so the suite can check at its end that no request raised (see conftest).
    logs: list[Path] = []

    def __init__(self, env: dict, workers: int = 1, log_path: Path | None = None, root: Path = ROOT):
        """`root` is the checkout to serve (another revision's, for a benchmark's comparison)."""
        self.root = root
        self.port = free_port()
        self.env = process_env(env, PORT=str(self.port), WEB_CONCURRENCY=str(workers))
        self.env["PATH"] = f"{VENV_BIN}:{self.env.get('PATH', '')}"
        if log_path is None:
            descriptor, name = tempfile.mkstemp(prefix="gunicorn-", suffix=".log")
            os.close(descriptor)
            log_path = Path(name)
        self.log_path = log_path
        LiveServer.logs.append(log_path)
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start gunicorn and wait until it answers. free_port() only probes a port: if another process
        takes it before gunicorn binds, gunicorn gives up, and this starts once more on a fresh port."""
        for attempt in range(2):
            log = open(self.log_path, "ab")  # noqa: SIM115 - the child keeps its own copy of the descriptor
            self.process = subprocess.Popen(
                [str(VENV_BIN / "gunicorn"), "-c", "gunicorn.conf.py", "wsgi:app"],
                cwd=self.root,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            log.close()
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and self.process.poll() is None:
                with contextlib.suppress(requests.RequestException):
                    if requests.get(self.url + "/healthz", timeout=1).ok:
                        return
                time.sleep(0.02)
            taken = "Address already in use" in self.log_path.read_text(errors="replace")
            self.stop()
            if attempt or not taken:
                raise TimeoutError(f"gunicorn did not start on port {self.port}; see {self.log_path}")
            self.port = free_port()
            self.env["PORT"] = str(self.port)

    def signal(self, sig: int) -> None:
        self.process.send_signal(sig)

    def worker_pids(self) -> list[int]:
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children").read_text().split()
        return [int(pid) for pid in children]

    def stop(self) -> None:
        """The arbiter's quick shutdown (SIGQUIT), with its workers SIGKILLed meanwhile: a test server's end.

        A worker's own quick exit is a quarter of a second of CPU (its interpreter's shutdown) and up to three
        quarters on a busy machine, for every worker of every server the suite stops; a worker still booting
        ignored the quit, and held the stop for the whole graceful time-out. The arbiter handles the SIGQUIT
        before the SIGCHLDs that follow it (it takes signals in the order they came, and Python runs pending
        handlers in signal order: 3 before 17), so it starts no worker in their place, reaps them, and still
        runs its exit hooks (the temporary directories removed). What a worker does on SIGQUIT is
        test_gunicorn's to test; tests of graceful shutdown send their own signals."""
        if not self.process or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGQUIT)
        deadline = time.monotonic() + 15
        while self.process.poll() is None and time.monotonic() < deadline:
            for pid in self._children():  # again and again: one forked meanwhile is killed too
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(0.05)
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def _children(self) -> list[int]:
        """The arbiter's child processes now (none once it has exited)."""
        try:
            return self.worker_pids()
        except (FileNotFoundError, ProcessLookupError):
            return []


class NginxServer:
    """Debian's nginx with the project's template rendered in front of the given upstreams."""

    def __init__(self, directory: Path, upstreams: list[str], site: str | None = None):
        """`site` is a variant of the template (placeholders still in it); the template by default."""
        from scripts.nginx_config import render_site, write_config

        self.port = free_port()
        self.directory = directory
        self.config = write_config(directory, self.port, upstreams, site=render_site(self.port, upstreams, site))
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def check(self) -> subprocess.CompletedProcess:
        return subprocess.run(["nginx", "-t", "-c", str(self.config)], capture_output=True, text=True, timeout=30)

    def start(self) -> None:
        self.process = subprocess.Popen(["nginx", "-c", str(self.config)], stderr=subprocess.DEVNULL)

        def accepting():
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True

        wait_until(accepting, message="nginx")

    def stop(self) -> None:
        """nginx's fast shutdown (SIGTERM): its graceful one (SIGQUIT) waited for every open stream through it,
        a page's or a client's still reading, for as long as it stayed open (10 s here, then a kill)."""
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class OpenIdProvider:
    def __init__(self, log_path: Path):
        self.port = free_port()
        self.log_path = log_path
        self.process = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, redirect_uri: str, spa: tuple[str, str] | None = None) -> None:
        """Start it with the service's client redirecting to `redirect_uri`, and with `spa` = (client id,
        redirect URI) also a public client for a product's single-page app."""
        node = shutil.which("node")
        assert node, "Node.js is required for the OpenID provider (make test installs it)"
        if not (OIDC_DIR / "node_modules" / "oidc-provider").exists():
            subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=OIDC_DIR, check=True, capture_output=True)
        env = process_env(PORT=str(self.port), CLIENT_ID=CLIENT_ID, CLIENT_SECRET=CLIENT_SECRET)
        env["REDIRECT_URI"] = redirect_uri
        if spa:
            env["SPA_CLIENT_ID"], env["SPA_REDIRECT_URI"] = spa
        with open(self.log_path, "wb") as log:  # the child keeps its own copy of the descriptor
            self.process = subprocess.Popen(
                [node, "provider.mjs"], cwd=OIDC_DIR, env=env, stdout=log, stderr=subprocess.STDOUT
            )
        wait_until(lambda: requests.get(f"{self.url}/.well-known/openid-configuration", timeout=1).ok, timeout=20)

    def token_requests(self) -> int:
        return requests.get(f"{self.url}/__counts").json()["token"]

    def stop(self) -> None:
        if self.process:
            self.process.terminate()
            self.process.wait(10)


def make_certificate(directory: Path, stem: str = "tls") -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and localhost (it is its own CA): (cert, key) files."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "auth-rt test")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / f"{stem}-cert.pem", directory / f"{stem}-key.pem"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path
