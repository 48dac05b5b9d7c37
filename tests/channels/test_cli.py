"""`flask --app wsgi channels ...`: namespaces, grants and members from the command line."""

from __future__ import annotations

import json

import pytest

from app.channels.namespaces import get_namespace, list_namespaces
from app.redis import Keys


@pytest.fixture
def flask(cli):
    """`flask --app wsgi channels ARGS...`, in process."""
    return lambda *args: cli("channels", *args)


def test_namespace_put_takes_the_contracts_options_and_defaults(flask, rdb):
    done = flask("namespace-put", "chat")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "name": "chat",
        "subscribe": "members",
        "publish": "server",
        "presence": False,
        "join_leave": False,
    }
    done = flask(
        "namespace-put", "game", "--subscribe", "authenticated", "--publish", "subscribers",
        "--presence", "--join-leave",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    stored = json.loads(rdb.hget(Keys.namespaces(), "game"))
    assert stored == {"name": "game", "subscribe": "authenticated", "publish": "subscribers", "presence": True,
                      "join_leave": True}  # fmt: skip
    for rule in ("org_members", "org_admins"):  # the organizations' namespaces, as the API makes them
        done = flask("namespace-put", f"team-{rule[4:]}", "--subscribe", rule, "--publish", "subscribers")
        assert done.returncode == 0, done.stderr
        assert json.loads(rdb.hget(Keys.namespaces(), f"team-{rule[4:]}"))["subscribe"] == rule


@pytest.mark.parametrize(
    "args, message",
    [
        (["namespace-put", "user"], "reserved"),
        (["namespace-put", "Bad"], "1-32"),
        (["namespace-put", "chat", "--join-leave"], "join_leave needs presence"),
        (["namespace-delete", "nothing"], "No namespace"),
        (["grant", "nothing:1", "someone@example.com"], "no user"),
    ],
)
def test_refusals_are_one_line_and_change_nothing(flask, rdb, announced, args, message):
    done = flask(*args)
    assert done.returncode != 0 and message in done.stderr, done.stderr
    assert done.stdout == "" and len(done.stderr.strip().splitlines()) <= 2  # click's "Error: ..."
    assert "Traceback" not in done.stderr
    assert not rdb.exists(Keys.namespaces()) and announced == []


def test_namespaces_are_put_replaced_listed_and_deleted_with_announcements(flask, app, announced):
    assert flask("namespace-put", "chat").returncode == 0
    replaced = flask("namespace-put", "chat", "--presence")
    assert replaced.returncode == 0, replaced.stderr
    assert announced == [("access_changed", None, "chat", None)]
    assert flask("namespace-put", "alerts").returncode == 0
    listed = flask("namespace-list")
    assert [json.loads(line)["name"] for line in listed.stdout.splitlines()] == ["alerts", "chat"]
    assert flask("namespace-delete", "chat").returncode == 0
    assert announced[-1] == ("namespace_deleted", None, "chat", None)
    with app.app_context():
        assert [n.name for n in list_namespaces(app.extensions["redis"])] == ["alerts"]
        assert get_namespace(app.extensions["redis"], "chat") is None


def test_grant_members_and_revoke(flask, new_user, namespace, announced, clock):
    namespace("chat")
    alice, bob = new_user(), new_user()
    granted = flask("grant", "chat:room", alice["email"], "--info", '{"name": "Alice"}', "--expires-in", "60")
    assert granted.returncode == 0, granted.stderr
    assert announced == [("access_changed", "chat:room", None, alice["id"])]
    assert flask("grant", "chat:room", bob["id"]).returncode == 0
    rows = {line.split("  ")[0]: line.split("  ")[1:] for line in flask("members", "chat:room").stdout.splitlines()}
    assert rows.keys() == {alice["id"], bob["id"]}
    assert rows[alice["id"]][0].endswith("Z") and rows[alice["id"]][1] == '{"name": "Alice"}'
    assert rows[bob["id"]] == ["-", "-"]

    revoked = flask("revoke", "chat:room", alice["email"])
    assert revoked.returncode == 0, revoked.stderr
    assert announced[-1] == ("revoked", "chat:room", None, alice["id"])
    assert flask("members", "chat:room").stdout.splitlines() == [f"{bob['id']}  -  -"]
    assert flask("grant", "chat:room", alice["id"], "--expires-in", "60").returncode == 0
    assert len(flask("members", "chat:room").stdout.splitlines()) == 2
    clock.ahead = 61  # Alice's grant has run out; Bob's never does
    assert flask("members", "chat:room").stdout.splitlines() == [f"{bob['id']}  -  -"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--info", "[1]"], "JSON object"),
        (["--info", "{nope"], "JSON object"),
        (["--info", json.dumps({"x": "y" * 1100})], "1024 bytes"),
        (["--expires-in", "0"], "expires-in"),
    ],
)
def test_bad_grants_are_refused_in_one_line(flask, user, namespace, rdb, args, message):
    namespace("chat")
    done = flask("grant", "chat:room", user["id"], *args)
    assert done.returncode != 0 and message in done.stderr, done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert not rdb.exists(Keys.channel_members("chat:room"))


def test_members_of_an_unknown_channel_fails(flask):
    done = flask("members", "nothing:1")
    assert done.returncode != 0 and "No channel" in done.stderr
