"""The access line written straight to the access log's stream (app/logs.py): the same line a log record gives,
and records again as soon as any other handler listens."""

from __future__ import annotations

import io
import json
import logging
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app import logs


@pytest.fixture
def own_handler(monkeypatch):
    """The access log with only its own handler, writing to a buffer."""
    handler = logs.AccessLineHandler()
    handler.setStream(io.StringIO())
    monkeypatch.setattr(logs.access_log, "handlers", [handler])
    level = logs.access_log.level
    logs.access_log.setLevel(logging.INFO)
    yield handler
    logs.access_log.setLevel(level)


def write_line(status: int = 201) -> None:
    logs.write_access_line(
        "POST", "/events", "events.publish", status, time.perf_counter(), "r1", None, "127.0.0.1", "http", "h:1"
    )


def test_the_line_written_directly_is_the_one_a_record_gives(own_handler, monkeypatch):
    write_line()
    direct = own_handler.stream.getvalue()
    records = []
    monkeypatch.setattr(
        logs.access_log, "handlers", [own_handler, type("Kept", (logging.Handler,), {"emit": records.append})()]
    )
    write_line()
    both = own_handler.stream.getvalue()[len(direct) :]
    assert len(records) == 1 and both == records[0].getMessage() + "\n"  # through a record now
    first, second = json.loads(direct), json.loads(both)
    assert direct.count("\n") == 1 and direct.endswith("\n")
    assert {k: v for k, v in first.items() if k not in ("ts", "duration_ms")} == {
        k: v for k, v in second.items() if k not in ("ts", "duration_ms")
    }
    assert first["logger"] == "access" and first["status"] == 201 and first["ts"].endswith("Z")


def test_nothing_is_written_while_the_access_log_is_turned_down(own_handler):
    write_line()
    assert own_handler.stream.getvalue()  # written at INFO
    logs.access_log.setLevel(logging.WARNING)
    own_handler.setStream(io.StringIO())
    write_line()
    assert own_handler.stream.getvalue() == ""


texts = st.one_of(st.none(), st.text(max_size=40))


@settings(max_examples=300, deadline=None)
@given(
    method=st.text(max_size=10), path=st.text(max_size=60), status=st.integers(100, 599),
    duration=st.floats(0, 1e7, allow_nan=False), request_id=texts, user_id=texts, remote_addr=texts,
    scheme=st.sampled_from(["http", "https"]), host=texts,
)  # fmt: skip
def test_the_line_is_what_json_dumps_writes(
    method, path, status, duration, request_id, user_id, remote_addr, scheme, host
):
    # Paths and hosts come from clients: quotes, control characters and any Unicode must be escaped as json.dumps does.
    duration_ms = round(duration, 2)
    fields = (method, path, status, duration_ms, request_id, user_id, remote_addr, scheme, host)
    expected = json.dumps(
        {"ts": "2026-11-29T19:06:23Z", "level": "info", "logger": "access", "msg": "request", "method": method,
         "path": path, "status": status, "duration_ms": duration_ms, "request_id": request_id, "user_id": user_id,
         "remote_addr": remote_addr, "scheme": scheme, "host": host}
    )  # fmt: skip
    assert logs.access_line("2026-11-29T19:06:23Z", *fields) == expected
