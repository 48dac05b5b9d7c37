"""A worker renews its connection leases in slices, with other greenlets' turns in between (app/events/leases.py):
in one pipeline, a worker's 5,000 leases held its loop for tens of milliseconds, and every stream waited."""

from __future__ import annotations

import time

import gevent

from app.events.leases import LEASE_SECONDS, RENEW_CHUNK, ConnectionLeases
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
