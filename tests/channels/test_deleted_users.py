"""A deleted user's grants go with the account, through the API and the command line."""

from __future__ import annotations

from app.channels import grants
from app.redis import Keys


def grant_two(client, admin, user_id: str) -> None:
    for channel in ("chat:1", "chat:2"):
        answer = client.put(f"/channels/{channel}/members/{user_id}", json={"info": {"a": 1}}, headers=admin["headers"])
        assert answer.status_code == 204


def test_deleting_a_user_through_the_api_purges_their_grants(client, admin, new_user, namespace, rdb):
    namespace("chat")
    gone, kept = new_user(), new_user()
    grant_two(client, admin, gone["id"])
    grant_two(client, admin, kept["id"])
    assert rdb.hexists(Keys.channel_members("chat:1"), gone["id"]) and rdb.exists(Keys.user_grants(gone["id"]))
    assert client.delete(f"/admin/users/{gone['id']}", headers=admin["headers"]).status_code == 204
    for channel in ("chat:1", "chat:2"):
        assert rdb.hkeys(Keys.channel_members(channel)) == [kept["id"]]
    assert not rdb.exists(Keys.user_grants(gone["id"]))
    assert sorted(rdb.hkeys(Keys.user_grants(kept["id"]))) == ["chat:1", "chat:2"]


def test_deleting_a_user_on_the_command_line_purges_their_grants(cli, client, admin, new_user, namespace, rdb):
    namespace("chat")
    gone = new_user()
    grant_two(client, admin, gone["id"])
    done = cli("users", "delete", gone["email"], "--yes")
    assert done.returncode == 0, done.stderr
    assert not rdb.exists(Keys.channel_members("chat:1")) and not rdb.exists(Keys.channel_members("chat:2"))
    assert not rdb.exists(Keys.user_grants(gone["id"]))


def test_a_grant_that_reaches_a_deleted_account_keeps_nothing(app, client, admin, new_user, namespace, rdb):
    """A grant checked its user before the deletion, and writes after it (and after the purge)."""
    namespace("chat")
    gone = new_user()
    assert client.delete(f"/admin/users/{gone['id']}", headers=admin["headers"]).status_code == 204
    assert grants.grant(app.extensions["redis"], "chat:1", gone["id"], None, None) is False
    assert not rdb.exists(Keys.channel_members("chat:1")) and not rdb.exists(Keys.user_grants(gone["id"]))
