"""client.js's event feed, run by node on the module the page and products load (app/static/client.js): it hands
presence changes to `onJoin` and `onLeave` (one per `presence.join` and `presence.leave`, and one per entry of a
presence_diff namespace's `presence.diff`, its leaves then its joins), and resumes from where each connection or
subscription started: a WebSocket welcome's `start`, a `subscribed` answer's cursor, an SSE opening's `start`."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from tests.servers import ROOT

pytestmark = pytest.mark.not_on_cluster("client.js alone: no Redis")

FAKE_WEBSOCKET = """
globalThis.addEventListener = () => {};
const sockets = [];
globalThis.WebSocket = class { constructor(url) { this.url = String(url); sockets.push(this); } send() {} close() {} };
"""


def run_with_client_js(tmp_path, script: str, *values):
    """What node prints (JSON) running `script` with client.js's module URI and `values` put in its `%s`s."""
    node = shutil.which("node")
    assert node, "node is installed with the test packages (make test)"
    module = tmp_path / "client.mjs"  # node reads an ES module by its extension
    module.write_text((ROOT / "app/static/client.js").read_text())
    path = tmp_path / "run.mjs"
    path.write_text(script % (module.as_uri(), *values))
    done = subprocess.run([node, str(path)], capture_output=True, text=True, timeout=60, check=True)
    return json.loads(done.stdout)


SCRIPT = """
globalThis.addEventListener = () => {};  // what a page has and node lacks (client.js listens for pagehide)
const { EventFeed } = await import("%s");
const seen = [];
const feed = new EventFeed({}, {
  onEvent: (event) => seen.push(["event", event.event]),
  onJoin: (channel, member) => seen.push(["join", channel, member.user_id, member.info]),
  onLeave: (channel, member) => seen.push(["leave", channel, member.user_id]),
});
const events = %s;
for (const event of events) feed.deliver(event, event.id + "-cursor");
console.log(JSON.stringify({ seen, cursor: feed.cursor }));
process.exit(0);  // client.js's BroadcastChannel would keep node running
"""


def test_each_join_and_leave_reaches_on_join_and_on_leave_also_inside_a_diff(tmp_path):
    events = [
        {"id": "1", "channel": "lobby:a", "event": "presence.join", "data": {"user_id": "u1", "info": None}},
        {
            "id": "2",
            "channel": "lobby:a",
            "event": "presence.diff",
            "data": {
                "joins": [{"user_id": "u2", "info": {"name": "Bo"}}, {"user_id": "u3", "info": None}],
                "leaves": [{"user_id": "u1", "info": None}],
            },
        },
        {"id": "3", "channel": "lobby:a", "event": "presence.diff", "from": "u9", "data": {"joins": [], "leaves": []}},
        {"id": "4", "channel": "lobby:a", "event": "message", "data": "hi"},
    ]
    result = run_with_client_js(tmp_path, SCRIPT, json.dumps(events))
    assert result["seen"] == [
        ["event", "presence.join"],
        ["join", "lobby:a", "u1", None],
        ["event", "presence.diff"],
        ["leave", "lobby:a", "u1"],
        ["join", "lobby:a", "u2", {"name": "Bo"}],
        ["join", "lobby:a", "u3", None],
        ["event", "presence.diff"],  # published by a user (a history from before the name was reserved): not presence
        ["event", "message"],
    ]
    assert result["cursor"] == "4-cursor"


WELCOME_SCRIPT = (
    FAKE_WEBSOCKET
    + """
const { EventFeed } = await import("%s");
const client = { url: (path) => new URL(path, "http://service.test") };
const cursors = [];
for (const [held, welcome] of %s) {
  const feed = new EventFeed(client, { onEvent: () => {}, cursor: held });
  feed.openWebSocket(feed.generation);
  sockets.at(-1).onmessage({ data: JSON.stringify({ type: "welcome", user: {}, ...welcome }) });
  cursors.push(feed.cursor);
}
console.log(JSON.stringify(cursors));
process.exit(0);
"""
)


def test_a_websocket_feed_resumes_from_the_welcomes_start(tmp_path):
    """The welcome's `start` (where the connection began reading, before its history) replaces the cursor the
    feed held: it also covers a named channel that cursor did not name. Without one, the held cursor stays."""
    cases = [
        ["held", {"cursor": "after-history", "start": "start"}],
        ["held", {"cursor": "after-history"}],  # a server before `start`
        [None, {"cursor": "after-history"}],
    ]
    assert run_with_client_js(tmp_path, WELCOME_SCRIPT, json.dumps(cases)) == ["start", "held", "after-history"]


SUBSCRIBED_SCRIPT = (
    FAKE_WEBSOCKET
    + """
const { EventFeed } = await import("%s");
const client = { url: (path) => new URL(path, "http://service.test") };
const feed = new EventFeed(client, { onEvent: () => {}, cursor: "held" });
feed.openWebSocket(feed.generation);
const socket = sockets.at(-1);
const frame = (data) => socket.onmessage({ data: JSON.stringify(data) });
frame({ type: "welcome", user: {}, cursor: "held", start: "held" });
const cursors = [];
const joined = feed.subscribe("lobby:a");
frame({ type: "subscribed", channel: "lobby:a", cursor: "held+lobby:a" });
await joined;
cursors.push(feed.cursor);
frame({ type: "event", id: "1", channel: "lobby:a", event: "m", data: 1, ts: 1, cursor: "after-1" });
cursors.push(feed.cursor);
const refused = feed.subscribe("lobby:b").catch(() => "refused");
frame({ type: "error", code: "forbidden", message: "no", channel: "lobby:b" });
cursors.push(await refused, feed.cursor);
console.log(JSON.stringify(cursors));
process.exit(0);
"""
)


def test_a_websocket_feed_keeps_the_cursor_of_its_subscribed_answer(tmp_path):
    """A `subscribed` answer's cursor (what was sent before it, and the new channel from its start) replaces the
    cursor held, so a reconnect before the channel's first event resumes it there; an error frame changes none."""
    assert run_with_client_js(tmp_path, SUBSCRIBED_SCRIPT) == ["held+lobby:a", "after-1", "refused", "after-1"]


SSE_START_SCRIPT = """
globalThis.addEventListener = () => {};
const { EventFeed } = await import("%s");
const asked = [];
const streams = %s;
const client = {
  url: (path) => new URL(path, "http://service.test"),
  request: async (path) => {
    asked.push(path);
    const text = streams.shift();
    if (text === undefined) return new Promise(() => {});  // no third connection answers
    const body = new ReadableStream({ start: (c) => { c.enqueue(new TextEncoder().encode(text)); c.close(); } });
    return new Response(body, { status: 200, headers: { "Content-Type": "text/event-stream" } });
  },
};
const feed = new EventFeed(client, { onEvent: () => {}, cursor: "held", channels: ["lobby:a"] });
feed.start("sse");
while (asked.length < 3) await new Promise((resolve) => setTimeout(resolve, 10));
console.log(JSON.stringify(asked.map((path) => new URL(path, "http://x").searchParams.get("cursor"))));
process.exit(0);
"""


def test_an_sse_feed_resumes_from_the_streams_opening_start(tmp_path):
    """The opening's `start <cursor>` (where the stream began reading, before its history) replaces the cursor
    the feed held, until an event's `id:` moves it on; a stream without one leaves the held cursor."""
    streams = [
        "retry: 1\n: stream open, start from-start\n\n",  # ends at once: the feed reconnects
        "retry: 1\n: stream open, start second\n\nid: after-1\nevent: m\ndata: {}\n\n",
    ]
    assert run_with_client_js(tmp_path, SSE_START_SCRIPT, json.dumps(streams)) == ["held", "from-start", "after-1"]
