"""Fuzzing WebSocket frames against a live server: every frame gets an answer frame, never a close,
and the connection keeps delivering."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.events.clients import Api, open_ws, ws_json
from tests.events.conftest import FAST
from tests.fuzzing import (
    HOSTILE_FRAGMENTS,
    bounded,
    hostile_objects,
    hostile_text,
    objects_with,
    value_texts,
    with_examples,
)
from tests.servers import LiveServer

ANSWERS = {"error", "ack", "event", "pong"}
ERROR_CODES = {"bad_request", "validation_failed", "payload_too_large"}

frames = (
    objects_with(["type", "event", "data"])
    | st.sampled_from(['{"type": "publish", "event": "e", "data": %s}', '{"type": "ping", "x": %s}']).flatmap(
        lambda shape: value_texts.map(lambda value: shape % value)
    )
    | value_texts
    | hostile_text.map(lambda text: text.encode("utf-8", "surrogatepass").decode("utf-8", "replace"))
)


@pytest.fixture(scope="module")
def server(base_env, tmp_path_factory):
    """The usual server, with room for the fuzzer's frames: WS_FRAME_RATE has tests of its own."""
    env = {**base_env, **FAST, "WS_FRAME_RATE": "100000"}
    live = LiveServer(env, log_path=tmp_path_factory.mktemp("logs") / "gunicorn.log")
    live.start()
    yield live
    live.stop()


@pytest.fixture(scope="module")
def socket(server):
    user = Api(server.url)
    ws = open_ws(server.url, user.auth)
    assert ws_json(ws)["type"] == "welcome"
    yield ws
    ws.close()


def test_fuzz_websocket_frames(socket):
    @bounded
    @given(frame=frames)
    def check(frame):
        socket.send(frame)
        socket.send(json.dumps({"type": "ping"}))  # its pong closes this frame's answers (a closed socket raises)
        while (answer := ws_json(socket))["type"] != "pong":
            assert answer["type"] in ANSWERS, answer
            if answer["type"] == "error":
                assert answer["code"] in ERROR_CODES and answer["message"], answer

    template = {"type": "publish", "event": "fuzz", "data": 1}
    with_examples(check, "frame", hostile_objects(list(template), template) + HOSTILE_FRAGMENTS)()
