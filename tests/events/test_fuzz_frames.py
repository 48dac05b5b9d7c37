"""Fuzzing WebSocket frames against a live server: every frame gets an answer frame, never a close,
and the connection keeps delivering."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.events.clients import Api, open_ws, ws_json
from tests.fuzzing import as_json_text, bounded, deep, hostile_text, json_values

ANSWERS = {"error", "ack", "event", "pong"}
ERROR_CODES = {"bad_request", "validation_failed", "payload_too_large"}

frames = (
    st.fixed_dictionaries(
        {"type": st.sampled_from(["publish", "ping"]) | hostile_text},
        optional={"event": json_values, "data": json_values},
    ).map(as_json_text)
    | json_values.map(as_json_text)
    | st.builds(deep, st.integers(1, 3000), st.sampled_from("[{"))
    | hostile_text.map(lambda text: text.encode("utf-8", "surrogatepass").decode("utf-8", "replace"))
)


@pytest.fixture(scope="module")
def socket(server):
    user = Api(server.url)
    ws = open_ws(server.url, user.auth)
    assert ws_json(ws)["type"] == "welcome"
    yield ws
    ws.close()


@bounded
@given(frame=frames)
def test_fuzz_websocket_frames(socket, frame):
    socket.send(frame)
    socket.send(json.dumps({"type": "ping"}))  # its pong closes this frame's answers (a closed socket raises)
    while (answer := ws_json(socket))["type"] != "pong":
        assert answer["type"] in ANSWERS, answer
        if answer["type"] == "error":
            assert answer["code"] in ERROR_CODES and answer["message"], answer
