"""client.js takes the service's control messages only from the service's own framing, never from an event's
name: events named like them (`unsubscribed`, `session_ended`, `reset`, `presence.leave`), as a user could
publish before such names were reserved, leave the page's room as it was."""

from __future__ import annotations

import json

import pytest
from playwright.sync_api import expect

from app import create_app
from app.clock import utc_millis
from tests.browser.conftest import Stack
from tests.browser.test_rooms import ROOM_RULES, Admin, join, person, signed_in

pytestmark = pytest.mark.not_on_cluster("the browser client's reading of frames: the same whatever the Redis")


@pytest.fixture(scope="module")
def stack(base_env, tmp_path_factory):
    running = Stack(base_env, tmp_path_factory.mktemp("spoofed")).start()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def admin(stack, base_env) -> Admin:
    return Admin(stack, base_env)


def write_raw_events(base_env: dict, channel: str, events: list[tuple[str, object]], sender: str) -> None:
    """Append events to the channel's history as the bus does, past the checks a publication gets (the
    reserved names): what an older server, or anything writing the stream, might have left there."""
    bus = create_app(base_env).extensions["event_bus"]
    bus._append([(channel, name, json.dumps(data)) for name, data in events], utc_millis(), sender)


@pytest.mark.parametrize("transport", ["sse", "websocket"])
def test_events_named_like_control_messages_do_not_take_the_room_away(stack, admin, base_env, new_context, transport):
    channel = f"{admin.namespace(ROOM_RULES)}:lobby"
    page, me = signed_in(new_context, stack, transport)
    join(page, channel)
    expect(person(page, me)).to_have_text(f"{me} (you)")  # present, by its SSE stream or WebSocket

    spoofs = [
        ("unsubscribed", {"channel": channel, "reason": "revoked"}),
        ("session_ended", {"reason": "session_ended"}),
        ("reset", {"reason": "spoofed"}),
        ("presence.leave", {"user_id": me, "info": None}),
    ]
    write_raw_events(base_env, channel, spoofs, sender="mallory")
    admin.publish(channel, "after the spoofs")

    expect(page.locator("#room-messages li .text")).to_have_text(["after the spoofs"])  # read past them, in order
    assert person(page, me).count() == 1  # at once: the page applies events in order, the spoofed leave came first
    for name in ("unsubscribed", "session_ended", "reset"):  # delivered as the events they are
        expect(page.locator(f'#room-messages li[data-event="{name}"]')).to_have_count(1)
    expect(page.locator("#room-title")).to_have_text(f"In {channel}")
    expect(page.locator("#room-error")).to_have_text("")
    assert page.evaluate("window.authRt.feed.channels") == [channel]
    expect(page.locator("#connection")).to_have_attribute("data-state", "live")
