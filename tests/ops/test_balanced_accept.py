"""The workers share out the connections they serve (gevent_worker.py, BalancedAccept): a backend's keep-alive
connections do not all sit on one worker while the other idles."""

from __future__ import annotations

import mmap
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from gevent_worker import SLOT, SLOTS, BalancedAccept
from tests.servers import LiveServer, wait_until

pytestmark = pytest.mark.not_on_cluster("tests gunicorn's worker, which serves the same with any Redis")

CONNECTIONS = 16


def sibling(memory, age: int, pid: int, count: int) -> None:
    SLOT.pack_into(memory, (age % SLOTS) * SLOT.size, pid, count)


def gone_pid() -> int:
    """The pid of a process that has ended."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(done.stdout)


def test_a_worker_ahead_of_its_siblings_leaves_the_next_connection_to_them_for_a_bounded_time():
    memory = mmap.mmap(-1, SLOT.size * SLOTS)
    balance = BalancedAccept(age=1, memory=memory)
    balance.join()
    assert not balance.ahead()  # alone
    sibling(memory, 2, os.getppid(), 0)  # a live process
    balance.opened()
    assert not balance.ahead()  # one ahead: within the margin
    balance.opened()
    waits = BalancedAccept.MAX_DEFERRALS
    assert [balance.ahead() for _ in range(waits + 1)] == [True] * waits + [False]  # the sibling took none
    assert not balance.ahead()  # not waited for again for a while
    balance.waiting_again_at = 0
    assert balance.ahead()
    sibling(memory, 2, os.getppid(), 1)
    assert not balance.ahead()  # the sibling took one
    sibling(memory, 2, gone_pid(), 0)
    assert not balance.ahead()  # a sibling that ended is not waited for
    balance.closed()
    balance.leave()
    assert SLOT.unpack_from(memory, 1 * SLOT.size) == (0, 0)


def connections_per_worker(worker_pids: list[int], port: int) -> list[int]:
    """The established connections to `port` that each worker holds (from /proc: sockets by inode)."""
    inodes = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].split(":")[1], 16) == port and fields[3] == "01":  # local port, ESTABLISHED
            inodes.add(fields[9])
    counts = []
    for pid in worker_pids:
        held = 0
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                found = re.fullmatch(r"socket:\[(\d+)\]", os.readlink(fd))
            except OSError:
                continue
            held += bool(found and found[1] in inodes)
        counts.append(held)
    return counts


@pytest.fixture
def two_workers(base_env, tmp_path):
    server = LiveServer(base_env, workers=2, log_path=tmp_path / "gunicorn.log")
    server.start()
    yield server
    server.stop()


def test_keep_alive_connections_opened_one_after_another_are_shared_by_the_workers(two_workers):
    """Each connection is opened once the one before it was answered: whichever worker woke first took it, and
    one worker could hold nearly all of them; now the two hold 8 each, give or take one."""
    wait_until(lambda: len(two_workers.worker_pids()) == 2, timeout=30)
    pids, port = two_workers.worker_pids(), two_workers.port
    held: list[socket.socket] = []

    def one_more() -> None:
        sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        held.append(sock)
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")

    try:
        # Until both workers serve (the second may still be loading the app): each holds a connection.
        wait_until(lambda: one_more() or min(connections_per_worker(pids, port)) > 0, timeout=30)
        for sock in held:
            sock.close()
        held.clear()
        wait_until(lambda: connections_per_worker(pids, port) == [0, 0], timeout=30)
        for _ in range(CONNECTIONS):
            one_more()
        wait_until(lambda: sum(connections_per_worker(pids, port)) == CONNECTIONS, timeout=30)
        counts = connections_per_worker(pids, port)
        assert max(counts) - min(counts) <= 2, counts
    finally:
        for sock in held:
            sock.close()
