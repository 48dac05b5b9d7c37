"""presence_diff namespaces: a channel's joins and leaves go out together, as one `presence.diff` every
PRESENCE_DIFF_SECONDS, so that a room of thousands joining at once costs its readers one event per interval
instead of one per user (each of which every member reads). Every join and leave still reaches the channel
exactly once, in order with the channel's other events; a join and a leave of one user within one diff cancel
out. Keepers (as workers) against the session's Redis in both modes, and a live service for the transport."""

from __future__ import annotations

import json
import time

from app.redis import Keys
from tests.channels.test_presence import CHANNEL, history, pump

DIFF = 0.3
DIFF_EVENT = "presence.diff"


def diffs(rdb, channel: str = CHANNEL) -> list[tuple[list[str], list[str]]]:
    """The channel's presence events, each diff as (users joined, users left); any other presence event fails."""
    found = []
    for _, event, data, _ in history(rdb, channel):
        if event.startswith("presence."):
            assert event == DIFF_EVENT, event
            found.append(([u["user_id"] for u in data["joins"]], [u["user_id"] for u in data["leaves"]]))
    return found


def test_joins_within_one_interval_go_out_as_one_diff_after_it(keepers, rdb):
    keeper = keepers(diff_seconds=DIFF)
    rdb.hset(Keys.channel_members(CHANNEL), "bob", json.dumps({"info": {"seat": 2}, "expires_at": None}))
    started = time.monotonic()
    for user in ("carl", "ann", "bob"):
        keeper.enter(CHANNEL, user, True, diff=True)
    assert diffs(rdb) == [] and keeper.snapshot(CHANNEL)["count"] == 3  # presence itself follows at once
    pump(lambda: diffs(rdb), message="the diff")
    assert time.monotonic() - started >= DIFF - 0.05
    assert diffs(rdb) == [(["ann", "bob", "carl"], [])]  # in user id order
    (data,) = [data for _, event, data, _ in history(rdb) if event == DIFF_EVENT]
    assert data["joins"][1] == {"user_id": "bob", "info": {"seat": 2}}
    assert rdb.exists(Keys.presence_diff(CHANNEL)) == 0


def test_a_join_and_a_leave_of_one_user_within_one_diff_cancel_out_and_later_ones_go_in_the_next(keepers, rdb):
    keeper = keepers(diff_seconds=DIFF)
    ann = keeper.enter(CHANNEL, "ann", True, diff=True)
    keeper.leave(keeper.enter(CHANNEL, "bob", True, diff=True))  # in and out before the diff: neither
    pump(lambda: diffs(rdb), message="the first diff")
    keeper.leave(ann)
    pump(lambda: len(diffs(rdb)) == 2, message="the second diff")
    assert diffs(rdb) == [(["ann"], []), ([], ["ann"])]


def test_a_lingering_leave_goes_in_a_diff_and_a_user_back_within_the_linger_in_none(keepers, rdb):
    keeper, other = keepers(linger=0.5, diff_seconds=DIFF), keepers(linger=0.5, diff_seconds=DIFF)
    ann = keeper.enter(CHANNEL, "ann", True, diff=True)
    bob = keeper.enter(CHANNEL, "bob", True, diff=True)
    pump(lambda: diffs(rdb), message="the joins")
    keeper.leave(ann)
    keeper.leave(bob)
    other.enter(CHANNEL, "bob", True, diff=True)  # back at once, on another worker
    pump(lambda: len(diffs(rdb)) == 2, timeout=15, message="ann's leave")
    assert diffs(rdb) == [(["ann", "bob"], []), ([], ["ann"])]


def test_a_diff_pending_when_its_worker_dies_goes_out_from_the_reapers(keepers, rdb):
    keeper = keepers(diff_seconds=DIFF)
    keeper.enter(CHANNEL, "ann", True, diff=True)
    keeper.stop()  # its settler is gone: it never sends the diff it scheduled
    reaper = keepers(diff_seconds=DIFF)
    pump(lambda: reaper.reap() >= 0 and diffs(rdb), timeout=15, message="the reapers' diff")
    assert diffs(rdb) == [(["ann"], [])]


def test_a_channel_without_diffs_publishes_each_change_as_before(keepers, rdb):
    keeper = keepers(diff_seconds=DIFF)
    keeper.leave(keeper.enter(CHANNEL, "ann", True))
    assert [event for _, event, _, _ in history(rdb)] == ["presence.join", "presence.leave"]


def test_presence_diff_needs_join_leave_and_shows_in_n_only_where_set(client, admin_headers, namespace):
    refused = client.put(
        "/admin/namespaces/lobby",
        json={"subscribe": "authenticated", "publish": "server", "presence": True, "presence_diff": True},
        headers=admin_headers,
    )
    assert refused.status_code == 422 and "presence_diff needs join_leave" in refused.get_json()["error"]["message"]
    assert client.get("/admin/namespaces", headers=admin_headers).get_json()["namespaces"] == []
    rules = {"subscribe": "authenticated", "publish": "server", "presence": True, "join_leave": True}
    plain = client.put("/admin/namespaces/plain", json=rules, headers=admin_headers).get_json()
    assert "presence_diff" not in plain
    made = client.put("/admin/namespaces/lobby", json={**rules, "presence_diff": True}, headers=admin_headers)
    assert made.status_code == 200 and made.get_json()["presence_diff"] is True
    namespace("other", subscribe="authenticated", presence=True, join_leave=True, presence_diff=True)
    listed = {n["name"]: n for n in client.get("/admin/namespaces", headers=admin_headers).get_json()["namespaces"]}
    assert listed["lobby"]["presence_diff"] is True and listed["other"]["presence_diff"] is True
    assert "presence_diff" not in listed["plain"]
