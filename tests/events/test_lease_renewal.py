"""A worker renews its connection leases a slice of its users at a time, each slice in pipelines with other
greenlets' turns in between (app/events/leases.py): all at once, in one pipeline, a worker's 5,000 leases held its
loop for tens of milliseconds every 20 s, and a busy worker's streams waited behind them."""

from __future__ import annotations

import time

import gevent

from app.events.leases import LEASE_SECONDS, RENEW_CHUNK, RENEW_SLICES, ConnectionLeases
from app.redis import Keys


def test_every_lease_is_renewed_slice_by_slice_with_the_loop_turning_in_between(rdb):
    users = RENEW_CHUNK * 2 + 7  # three slices
    leases = ConnectionLeases(rdb, limit=5)
    for n in range(users):
        asked = leases.ask(f"u{n}")
        script, keys, args = asked.call
        leases.granted(asked, script(keys=keys, args=args, client=rdb))
    leases._renewer.kill()  # renewed by hand here
    stale = time.time() + 5  # every lease set to lapse soon
    for lease_id, user_id in leases.held.items():
        rdb.zadd(Keys.connection_leases(user_id), {lease_id: stale})
    gone_id, gone_user = next(iter(leases.held.items()))
    leases.release(gone_id)  # given back: not taken again by the renewal

    turns = []

    def tick():
        while True:
            turns.append(1)
            gevent.sleep(0)

    ticker = gevent.spawn(tick)
    pipelines = []
    real_pipeline = rdb.pipeline

    def counted_pipeline(**options):
        pipelines.append(len(turns))
        return real_pipeline(**options)

    leases.client = type("Counted", (), {"pipeline": staticmethod(counted_pipeline)})()
    try:
        before = time.time()
        leases.renew()
    finally:
        ticker.kill()
    assert len(pipelines) == 3  # a slice of RENEW_CHUNK users each
    assert pipelines[0] < pipelines[1] < pipelines[2]  # other greenlets ran between the slices
    for lease_id, user_id in leases.held.items():
        assert rdb.zscore(Keys.connection_leases(user_id), lease_id) >= before + LEASE_SECONDS - 1
    assert rdb.zscore(Keys.connection_leases(gone_user), gone_id) is None


def test_the_slices_renew_each_users_leases_once_and_together_all_of_them(rdb):
    leases = ConnectionLeases(rdb, limit=5)
    for n in range(60):
        for _ in range(2):  # two streams of one user: renewed in the same slice
            asked = leases.ask(f"u{n}")
            script, keys, args = asked.call
            leases.granted(asked, script(keys=keys, args=args, client=rdb))
    leases._renewer.kill()
    stale = time.time() + 5
    for lease_id, user_id in leases.held.items():
        rdb.zadd(Keys.connection_leases(user_id), {lease_id: stale})

    def renewed() -> set[str]:
        return {
            lease_id
            for lease_id, user_id in leases.held.items()
            if rdb.zscore(Keys.connection_leases(user_id), lease_id) > stale + 1
        }

    seen: set[str] = set()
    for part in range(RENEW_SLICES):
        leases.renew(part)
        now = renewed()
        slice_ = now - seen
        assert len({leases.held[lease_id] for lease_id in slice_}) * 2 == len(slice_)  # a user's leases together
        seen = now
    assert seen == set(leases.held) and len(seen) == 120  # every lease, by one slice or another
