"""Argon2id password hashing, run in gevent's thread pool so a login never freezes the worker's hub.

The cost is OWASP's unless PASSWORD_HASH_COST=minimal, which test suites set so that thousands of accounts
do not cost 40 ms of CPU each; settings refuse it in production.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading

import gevent
import gevent.threadpool
from flask import Flask, current_app, has_app_context
from passlib.context import CryptContext

# OWASP's minimum for argon2id is m=19 MiB, t=2, p=1. Changing these makes every login after the
# change rehash its stored hash (verify_and_update), so parameters can be raised without a migration.
PASSWORD_CONTEXT = CryptContext(
    schemes=["argon2"],
    argon2__type="ID",
    argon2__memory_cost=19 * 1024,
    argon2__time_cost=2,
    argon2__parallelism=1,
)
# The same scheme at the lowest cost Argon2 allows (8 KiB, one pass): about 0.1 ms a hash.
MINIMAL_CONTEXT = CryptContext(
    schemes=["argon2"],
    argon2__type="ID",
    argon2__memory_cost=8,
    argon2__time_cost=1,
    argon2__parallelism=1,
)
CONTEXTS = {"owasp": PASSWORD_CONTEXT, "minimal": MINIMAL_CONTEXT}


def init_app(app: Flask) -> None:
    """Bind the hashing cost the settings chose."""
    app.extensions["password_context"] = CONTEXTS[app.config["SETTINGS"].password_hash_cost]


def _context() -> CryptContext:
    """The app's hashing cost; OWASP's outside an app (a script hashing for an import)."""
    return current_app.extensions["password_context"] if has_app_context() else PASSWORD_CONTEXT


# Hashing threads per process. Off the hub is not enough: with gevent's default pool (10 threads)
# a login storm puts ten hashing threads per worker against the hub thread on a 2-core machine, and
# the hub starves (event p99 rose from 22 ms to 625 ms in bench/run.py). One thread per worker, at a
# lower CPU priority, keeps the hub responsive; logins queue instead, bounded by the cores anyway.
HASH_THREADS = 1
HASH_THREAD_NICENESS = 10
_pool: gevent.threadpool.ThreadPool | None = None
_pool_pid: int | None = None


def _hash_pool() -> gevent.threadpool.ThreadPool:
    global _pool, _pool_pid
    if _pool is None or _pool_pid != os.getpid():  # a pool is not inherited across fork
        _pool, _pool_pid = gevent.threadpool.ThreadPool(HASH_THREADS), os.getpid()
    return _pool


def _at_low_priority(fn, args):
    if not getattr(_thread_state, "niced", False):
        with contextlib.suppress(OSError):  # Linux: a thread's niceness is its own
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), HASH_THREAD_NICENESS)
        _thread_state.niced = True
    return fn(*args)


_thread_state = threading.local()


def _off_hub(fn, *args):
    """Run CPU-heavy work in the hashing thread; argon2 releases the GIL, so greenlets keep running."""
    return _hash_pool().apply(_at_low_priority, (fn, args))


def hash_password(password: str) -> str:
    """An Argon2id hash of the password, computed off the hub."""
    return _off_hub(_context().hash, password)


def verify_password(password: str, stored_hash: str) -> tuple[bool, str | None]:
    """Whether the password matches, and a new hash when the stored one uses old parameters."""
    return _off_hub(_context().verify_and_update, password, stored_hash)


@functools.cache
def _dummy_hash(context: CryptContext) -> str:
    return context.hash("not-a-real-password-only-spends-time")


def spend_verification_time(password: str) -> None:
    """Verify against a dummy hash, so an unknown e-mail costs as much time as a wrong password."""
    context = _context()
    _off_hub(context.verify, password, _dummy_hash(context))
