"""Deleting an account that belongs to organizations: refused (409, nothing changed) for the last owner of an
organization with other members, through the admin API and the CLI alike; otherwise an organization it alone
belongs to goes with it and its other memberships end, each announced."""

from __future__ import annotations

from app.redis import Keys
from tests.utils import redis_snapshot


def test_the_last_owner_of_an_organization_with_members_is_not_deleted(client, rdb, cli, person, new_org):
    owner, member, root = person(), person(), person("admin")
    org = new_org(owner, (member, "member"))
    before = redis_snapshot(rdb)
    refused = client.delete(f"/admin/users/{owner['id']}", headers=root["headers"])
    assert refused.status_code == 409 and refused.get_json()["error"]["code"] == "conflict"
    assert "last owner" in refused.get_json()["error"]["message"]
    done = cli("users", "delete", owner["id"], "--yes")
    assert done.returncode != 0 and "last owner" in done.stderr
    assert redis_snapshot(rdb) == before
    assert client.get(f"/orgs/{org}", headers=owner["headers"]).status_code == 200  # still signed in, still owner


def test_a_deleted_users_organizations_and_memberships(client, rdb, cli, person, new_org, announced):
    owner, other, root = person(), person(), person("admin")
    alone = new_org(owner, name="Alone")
    shared = new_org(other, (owner, "owner"), name="Shared")  # another owner remains
    joined = new_org(other, (owner, "member"), name="Joined")
    announced.clear()
    assert client.delete(f"/admin/users/{owner['id']}", headers=root["headers"]).status_code == 204
    assert sorted(announced) == sorted([(alone, None), (shared, owner["id"]), (joined, owner["id"])])
    assert not rdb.exists(Keys.org(alone), Keys.org_members(alone), Keys.user_orgs(owner["id"]))
    assert rdb.zscore(Keys.orgs(), alone) is None
    for org in (shared, joined):
        members = client.get(f"/orgs/{org}/members", headers=other["headers"]).get_json()["members"]
        assert [m["user_id"] for m in members] == [other["id"]]
    audit = client.get(f"/admin/audit?subject={owner['id']}", headers=root["headers"]).get_json()["entries"]
    removed = {e["details"]["org_id"] for e in audit if e["type"] == "org.member_removed"}
    assert removed == {shared, joined}
    [deleted] = client.get("/admin/audit?type=org.deleted", headers=root["headers"]).get_json()["entries"]
    assert deleted["subject"] == root["id"] and deleted["details"] == {"org_id": alone, "with_account": True}

    # The CLI deletes the same way once nothing stands in its way.
    assert cli("users", "delete", other["id"], "--yes").returncode == 0
    assert not rdb.exists(Keys.org(shared), Keys.org(joined))
