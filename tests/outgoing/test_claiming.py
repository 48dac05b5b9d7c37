"""The delivery process's claim loop against queues that change under it (real Redis, in-process worker)."""

from __future__ import annotations

from app.outgoing.delivery import DeliveryWorker
from app.outgoing.store import DELIVER_GROUP
from app.redis import Keys


def test_a_queue_gone_between_its_listing_and_its_claim_is_passed_over(app, rdb):
    # An endpoint deleted (or a database flushed) after the claim loop listed its queue: taking its stale
    # entries meets no group. That once ended the loop's step with an error and a traceback in the log.
    worker = DeliveryWorker(app)
    gone = Keys.outgoing_queue("ep_gone")
    assert not rdb.exists(gone)
    worker._take_stale(gone, DELIVER_GROUP, "ep_gone")  # passes over it, raising nothing
    rdb.xgroup_create(gone, DELIVER_GROUP, id="0", mkstream=True)
    rdb.xadd(gone, {"message": "m"})
    rdb.xreadgroup(DELIVER_GROUP, "a-dead-consumer", {gone: ">"})
    worker.stale_ms = 0  # every pending entry is stale: the same call takes it now
    started = []
    worker._start_attempt = lambda endpoint_id, entry_id, fields: started.append((endpoint_id, entry_id))
    worker._take_stale(gone, DELIVER_GROUP, "ep_gone")
    assert [endpoint for endpoint, _ in started] == ["ep_gone"]
