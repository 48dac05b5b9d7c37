"""The last-owner rule under concurrency: two owners demoting (or removing) each other at the same moment, in
parallel threads against the real Redis of both modes, leave exactly one owner; exactly one of them is refused
(409 for a demotion)."""

from __future__ import annotations

import json
import threading

import pytest

from app.errors import ApiError
from app.orgs import manage, store
from app.redis import Keys

ROUNDS = 8


def owners(rdb, org_id: str) -> list[str]:
    held = rdb.hgetall(Keys.org_members(org_id))
    return sorted(user_id for user_id, member in held.items() if json.loads(member)["role"] == "owner")


# Demoted, the later owner cannot demote anyone's last owner (409); removed, it is no member any more (404).
@pytest.mark.parametrize("action, refusal", [("demote", 409), ("remove", 404)])
def test_two_owners_acting_on_each_other_at_once_leave_one_owner(app, rdb, person, new_org, action, refusal):
    first, second = person(), person()
    org_id = new_org(first, (second, "owner"))

    def act(actor: dict, target: dict, start: threading.Barrier, outcomes: list) -> None:
        with app.test_request_context():
            start.wait(timeout=30)
            try:
                if action == "demote":
                    manage.change_role(org_id, actor["id"], target["id"], "member")
                else:
                    manage.remove_member(org_id, actor["id"], target["id"])
                outcomes.append("done")
            except ApiError as refused:
                outcomes.append(refused.status)

    for _ in range(ROUNDS):
        outcomes: list = []
        start = threading.Barrier(2)
        threads = [
            threading.Thread(target=act, args=(first, second, start, outcomes)),
            threading.Thread(target=act, args=(second, first, start, outcomes)),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        assert sorted(outcomes, key=str) == [refusal, "done"]
        [left] = owners(rdb, org_id)
        # Both owners again for the next round (an administrator's powers), however this one ended.
        loser = second if left == first["id"] else first
        with app.test_request_context():
            if action == "remove":
                rdb.hset(Keys.org_members(org_id), loser["id"], json.dumps({"role": "member", "joined_at": "x"}))
            assert store.set_role(org_id, store.SUPERUSER, loser["id"], "owner")[0] == "changed"
        assert owners(rdb, org_id) == sorted([first["id"], second["id"]])
