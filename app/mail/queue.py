"""The mail queue: every mail is a job kept in Redis until a sender has handed it to the server.

A request only records a job (what to send, to whom) and returns; a sender greenlet in each worker
claims due jobs, builds each message (the token it carries is made at that moment, so no token ever
sits in the queue) and sends it. Claiming is one Lua step that pushes the job's due time past a
lease, so exactly one sender anywhere holds a job; a sender that dies leaves its job to be claimed
again when the lease ends. A transient failure puts the job back for later (MAIL_RETRY_SCHEDULE), so
an SMTP server that is down for a while delays mail but loses none, and a job is deleted only once the
server has taken its message, so none is sent twice (short of a crash between the server's "250" and
the delete; the message's Message-ID is the job's, so such a copy is recognisable).
"""

from __future__ import annotations

import logging
import time
import uuid

import gevent
import gevent.event
import gevent.pool
import redis
from flask import Flask

from ..redis import Keys, Outage, redis_error
from . import messages
from .backends import PermanentMailError, TransientMailError

log = logging.getLogger(__name__)

SWEEP_INTERVAL = 1.0  # how often an idle sender looks for jobs that became due (retries, other workers')
REDIS_RETRY_CAP = 10.0  # seconds between tries, at most, while Redis cannot be reached (from SWEEP_INTERVAL, doubling)
CONCURRENT_SENDS = 4  # per worker
RETENTION_MARGIN = 3600  # a job's record outlives its give-up time by this much, then expires by itself

# KEYS[1] the queue. ARGV: now, lease end. The id of one due job, now leased to the caller, or nil.
CLAIM_LUA = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, 1)
if #due == 0 then return false end
redis.call('ZADD', KEYS[1], ARGV[2], due[1])
return due[1]
"""


# KEYS[1] the job, KEYS[2] the queue. ARGV: job id, attempts, last error, when it is next due. Puts the job
# back for a later attempt, unless its record is gone meanwhile (deleted or expired while it was being
# sent): writing to it then would make a record of attempts alone, with nothing to send.
RETRY_LUA = """
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('ZREM', KEYS[2], ARGV[1])
  return 0
end
redis.call('HSET', KEYS[1], 'attempts', ARGV[2], 'last_error', ARGV[3])
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[1])
return 1
"""


class MailQueue:
    """Jobs in Redis, and this worker's sender that works through them."""

    def __init__(self, app: Flask, client: redis.Redis, backend):
        self.app = app
        self.client = client
        self.backend = backend
        settings = app.config["SETTINGS"].mail
        self.retry_schedule = settings.retry_schedule
        # A send may take every SMTP step's time-out; the lease must outlast it so nobody else claims
        # a job that is still being sent.
        self.send_deadline = settings.timeout_seconds * 3
        self.lease_seconds = self.send_deadline * 2 + 10
        self._claim = client.register_script(CLAIM_LUA)
        self._retry = client.register_script(RETRY_LUA)
        self._wake = gevent.event.Event()
        self._sender: gevent.Greenlet | None = None
        self._outage = Outage(log, "mail sender", app.config["SETTINGS"].redis_url)

    def enqueue(self, kind: str, give_up_after: int, **fields: str) -> str:
        """Record a job (due now) and wake this worker's sender; returns the job id."""
        job_id = uuid.uuid4().hex
        now = time.time()
        record = {"id": job_id, "kind": kind, "created_at": f"{now:.3f}", "give_up_at": f"{now + give_up_after:.3f}"}
        record.update({name: value for name, value in fields.items() if value is not None})
        pipe = self.client.pipeline(transaction=True)
        pipe.hset(Keys.mail_job(job_id), mapping={**record, "attempts": 0})
        pipe.expire(Keys.mail_job(job_id), give_up_after + RETENTION_MARGIN)
        pipe.zadd(Keys.mail_queue(), {job_id: now})
        pipe.execute()
        self._wake.set()
        return job_id

    def start(self) -> None:
        """Start this worker's sender (gunicorn workers; a process that never starts one only enqueues)."""
        if self._sender is None or self._sender.dead:
            log.info("mail sender started; mail goes to %s", self.backend.describe())
            self._sender = gevent.spawn(self._run)

    def stop(self) -> None:
        """Stop the sender (jobs being sent are left to their lease and claimed again)."""
        if self._sender is not None:
            self._sender.kill(block=False)

    def _run(self) -> None:
        pool = gevent.pool.Pool(CONCURRENT_SENDS)
        retry = SWEEP_INTERVAL
        while True:
            self._wake.clear()  # before claiming: a job queued meanwhile sets it again
            try:
                pool.wait_available()
                job_id = self.claim_next()
            except redis.exceptions.RedisError as error:
                self._outage.failed(error)
                self._wake.wait(retry)  # a job queued meanwhile (Redis is back) ends the wait
                retry = min(retry * 2, REDIS_RETRY_CAP)
                continue
            self._outage.succeeded()
            retry = SWEEP_INTERVAL
            if job_id:
                pool.spawn(self.process, job_id)
                continue
            self._wake.wait(SWEEP_INTERVAL)

    def claim_next(self) -> str | None:
        """The id of one due job, now leased to the caller for `lease_seconds`; None when none is due."""
        return self._claim(keys=[Keys.mail_queue()], args=[time.time(), time.time() + self.lease_seconds]) or None

    def process(self, job_id: str) -> None:
        """Build and send one job claimed by `claim_next`; delete it when sent, put it back after a transient
        failure."""
        try:
            with self.app.app_context():
                self._process(job_id)
        except redis.exceptions.RedisError as error:
            # The job keeps its lease and is claimed again when it ends.
            log.warning(
                "mail job %s: redis at %s failed (%s); it will be retried",
                job_id,
                self._outage.where,
                redis_error(error),
            )
        except Exception:
            log.exception("mail job %s: unexpected failure; it will be retried after its lease", job_id)

    def _process(self, job_id: str) -> None:
        job = self.client.hgetall(Keys.mail_job(job_id))
        if "kind" not in job:  # expired, or (before RETRY_LUA) a record of attempts alone
            self._delete(job_id)
            return
        attempts = int(job.get("attempts") or 0) + 1
        try:
            with gevent.Timeout(self.send_deadline, TransientMailError(f"no answer in {self.send_deadline:g} s")):
                message = messages.build(job)
                if message is not None:
                    self.backend.send(message)
        except TransientMailError as error:
            self._retry_later(job, attempts, str(error))
            return
        except PermanentMailError as error:
            log.error("mail job %s (%s) refused for good after %d attempt(s): %s", job_id, job["kind"], attempts, error)
        else:
            if message is None:
                log.info("mail job %s (%s): nothing to send", job_id, job["kind"])
            else:
                log.info("mail job %s (%s) sent after %d attempt(s)", job_id, job["kind"], attempts)
        self._delete(job_id)

    def _retry_later(self, job: dict, attempts: int, reason: str) -> None:
        delay = self.retry_schedule[min(attempts, len(self.retry_schedule)) - 1]
        due = time.time() + delay
        if due > float(job["give_up_at"]):
            log.error("mail job %s (%s) abandoned after %d attempt(s): %s", job["id"], job["kind"], attempts, reason)
            self._delete(job["id"])
            return
        log.warning(
            "mail job %s (%s) attempt %d failed (%s); next in %d s", job["id"], job["kind"], attempts, reason, delay
        )
        self._retry(keys=[Keys.mail_job(job["id"]), Keys.mail_queue()], args=[job["id"], attempts, reason[:200], due])

    def _delete(self, job_id: str) -> None:
        pipe = self.client.pipeline(transaction=True)
        pipe.zrem(Keys.mail_queue(), job_id)
        pipe.delete(Keys.mail_job(job_id))
        pipe.execute()
