"""Argon2id password hashing, run in gevent's thread pool so a login never freezes the worker's hub."""

from __future__ import annotations

import functools

import gevent
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


def _off_hub(fn, *args):
    """Run CPU-heavy work in gevent's thread pool; argon2 releases the GIL, so greenlets keep running."""
    return gevent.get_hub().threadpool.apply(fn, args)


def hash_password(password: str) -> str:
    return _off_hub(PASSWORD_CONTEXT.hash, password)


def verify_password(password: str, stored_hash: str) -> tuple[bool, str | None]:
    """Whether the password matches, and a new hash when the stored one uses old parameters."""
    return _off_hub(PASSWORD_CONTEXT.verify_and_update, password, stored_hash)


@functools.cache
def _dummy_hash() -> str:
    return PASSWORD_CONTEXT.hash("not-a-real-password-only-spends-time")


def spend_verification_time(password: str) -> None:
    """Verify against a dummy hash, so an unknown e-mail costs as much time as a wrong password."""
    _off_hub(PASSWORD_CONTEXT.verify, password, _dummy_hash())
