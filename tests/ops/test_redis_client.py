"""The Redis client under gevent: checking a pooled connection before a command does not wait for the loop."""

from __future__ import annotations

import json
import subprocess

from tests.servers import ROOT, VENV_BIN, process_env

PROBE = """
import json, socket
from gevent import monkey
monkey.patch_all()
import gevent
import redis._parsers.hiredis as hiredis_parser
gevents_check = hiredis_parser._socket_can_read
import app.redis  # noqa: F401  (replaces the check)

idle, peer = socket.socketpair()

def ran_during(can_read, timeout):
    other_ran = []
    gevent.spawn(other_ran.append, True)
    readable = can_read(idle, timeout)
    return {"readable": readable, "yielded": bool(other_ran)}

answers = {
    "gevent, idle": ran_during(gevents_check, 0),
    "ours, idle": ran_during(hiredis_parser._socket_can_read, 0),
    "ours, a wait": ran_during(hiredis_parser._socket_can_read, 0.05),
}
peer.send(b"+stray\\r\\n")
answers["ours, stray bytes"] = ran_during(hiredis_parser._socket_can_read, 0)
print(json.dumps(answers))
"""


def test_the_check_for_stray_bytes_answers_without_yielding_and_a_wait_still_yields():
    result = subprocess.run(
        [str(VENV_BIN / "python"), "-c", PROBE],
        cwd=ROOT,
        env=process_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    answers = json.loads(result.stdout)
    assert answers["gevent, idle"] == {"readable": False, "yielded": True}  # what the test can tell apart
    assert answers["ours, idle"] == {"readable": False, "yielded": False}
    assert answers["ours, stray bytes"] == {"readable": True, "yielded": False}
    assert answers["ours, a wait"] == {"readable": False, "yielded": True}
