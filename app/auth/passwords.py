"""Argon2id password hashing, run in gevent's thread pool so a login never freezes the worker's hub.

The cost is OWASP's unless PASSWORD_HASH_COST=minimal, which test suites set so that thousands of accounts
do not cost 40 ms of CPU each; settings refuse it in production.

Hashes imported from other systems (`users import`) are kept as they came: bcrypt (`$2a$`, `$2b$`, `$2y$`,
as Auth0 and Supabase export it), Django's `pbkdf2_sha256$...` and argon2 PHC strings. They verify at
login, and a match stores an Argon2id hash in their place (their schemes are deprecated in the context).
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import threading
import warnings

import gevent
import gevent.threadpool
from flask import Flask, current_app, has_app_context
from passlib.context import CryptContext
from passlib.exc import PasslibHashWarning

# Schemes an import keeps; deprecated, so that verify_and_update rehashes a match with Argon2id.
IMPORTED_SCHEMES = ["bcrypt", "django_pbkdf2_sha256"]
# OWASP's minimum for argon2id is m=19 MiB, t=2, p=1. Changing these makes every login after the
# change rehash its stored hash (verify_and_update), so parameters can be raised without a migration.
PASSWORD_CONTEXT = CryptContext(
    schemes=["argon2", *IMPORTED_SCHEMES],
    deprecated=IMPORTED_SCHEMES,
    default="argon2",
    argon2__type="ID",
    argon2__memory_cost=19 * 1024,
    argon2__time_cost=2,
    argon2__parallelism=1,
)
# The same scheme at the lowest cost Argon2 allows (8 KiB, one pass): about 0.1 ms a hash.
MINIMAL_CONTEXT = CryptContext(
    schemes=["argon2", *IMPORTED_SCHEMES],
    deprecated=IMPORTED_SCHEMES,
    default="argon2",
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
    """Whether the password matches, and a new hash when the stored one uses old parameters or scheme."""
    return _off_hub(_verify_and_update, _context(), password, stored_hash)


def _verify_and_update(context: CryptContext, password: str, stored_hash: str) -> tuple[bool, str | None]:
    try:
        if BCRYPT.fullmatch(stored_hash):
            # bcrypt reads 72 bytes at most: the systems that made these hashes dropped the rest of a longer
            # password (the bcrypt package refuses it instead). The new hash is of the whole password.
            matches = context.verify(password.encode()[:BCRYPT_MAX_BYTES], stored_hash)
            return matches, context.hash(password) if matches else None
        return context.verify_and_update(password, stored_hash)
    except UNVERIFIABLE:
        # A password the scheme refuses (bcrypt and a NUL byte) matches nothing. It answers like a wrong one, in
        # about the same time, so that no answer tells an imported account from an unknown address.
        context.verify(password, _dummy_hash(context))
        return False, None


# What a scheme raises for input it cannot verify (a malformed hash, a password it refuses): never a match.
UNVERIFIABLE = (ValueError, TypeError, NotImplementedError)
BCRYPT = re.compile(r"\$2[aby]\$\d\d\$[./A-Za-z0-9]{53}")
BCRYPT_MAX_BYTES = 72
# How an import tells the schemes apart, by the start of the hash; the handler then parses the rest.
IMPORTED_FORMS = (
    (("$2a$", "$2b$", "$2y$"), "bcrypt", "bcrypt"),
    (("pbkdf2_sha256$",), "pbkdf2_sha256", "django_pbkdf2_sha256"),
    (("$argon2id$", "$argon2i$", "$argon2d$"), "argon2", "argon2"),
)
FORMS = "bcrypt ($2a$, $2b$, $2y$), Django's pbkdf2_sha256$, or an argon2 PHC string ($argon2id$)"
# The most an imported hash may cost at a login: one wrong guess holds a worker's only hashing thread for
# that long (bcrypt 12 is about 0.3 s here, pbkdf2 1,000,000 about 0.5 s, argon2 64 MiB x 4 passes about 0.2 s).
MAX_BCRYPT_COST = 12
MAX_PBKDF2_ITERATIONS = 1_000_000
MAX_ARGON2_MEMORY_KIB, MAX_ARGON2_TIME, MAX_ARGON2_LANES = 64 * 1024, 4, 4
ARGON2_MIN_CHECKSUM_BYTES = 4


def imported_hash_scheme(password_hash: str) -> str:
    """The scheme of a hash another system exported (bcrypt, pbkdf2_sha256, argon2); ValueError saying why
    it cannot be kept: an unknown or malformed form, a cost beyond what a login may spend, or a hash that a
    login could not verify."""
    found = [(scheme, name) for starts, scheme, name in IMPORTED_FORMS if password_hash.startswith(starts)]
    if not found:
        raise ValueError(f"unknown password hash format: expected {FORMS}")
    scheme, name = found[0]
    try:
        if scheme == "bcrypt" and not BCRYPT.fullmatch(password_hash):
            raise ValueError
        with warnings.catch_warnings():  # a salt whose unused bits are set: libpass repairs it, and verifies
            warnings.simplefilter("ignore", PasslibHashWarning)
            parsed = PASSWORD_CONTEXT.handler(name).from_string(password_hash)
    except UNVERIFIABLE:
        raise ValueError(f"malformed {scheme} hash") from None
    if scheme == "bcrypt" and parsed.rounds > MAX_BCRYPT_COST:
        raise ValueError(f"bcrypt cost {parsed.rounds} is above {MAX_BCRYPT_COST}")
    if scheme == "pbkdf2_sha256" and parsed.rounds > MAX_PBKDF2_ITERATIONS:
        raise ValueError(f"pbkdf2_sha256 iterations {parsed.rounds} are above {MAX_PBKDF2_ITERATIONS:,}")
    if scheme == "argon2":
        _check_argon2(parsed)
    return scheme


def _check_argon2(parsed) -> None:
    """ValueError unless a login can verify this argon2 hash within the cost limits.

    Parsing accepts what the verifier then refuses, so the hash is also verified once, at the lowest cost
    its lanes allow (the cost does not change what is checked): whatever that raises refuses it here.
    """
    if (
        parsed.memory_cost > MAX_ARGON2_MEMORY_KIB
        or parsed.rounds > MAX_ARGON2_TIME
        or parsed.parallelism > MAX_ARGON2_LANES
    ):
        raise ValueError(f"argon2 costs above m={MAX_ARGON2_MEMORY_KIB},t={MAX_ARGON2_TIME},p={MAX_ARGON2_LANES}")
    if parsed.data:
        raise ValueError("argon2 hash with a data= parameter (associated data), which logins cannot verify")
    if parsed.memory_cost < 8 * parsed.parallelism:
        raise ValueError(f"argon2 memory cost {parsed.memory_cost} is below 8 per lane ({parsed.parallelism} lanes)")
    if len(parsed.checksum or b"") < ARGON2_MIN_CHECKSUM_BYTES:
        raise ValueError("malformed argon2 hash: its checksum is shorter than 4 bytes")
    parsed.memory_cost, parsed.rounds = 8 * parsed.parallelism, 1  # parsed here for this check alone
    trial = parsed.to_string()
    try:
        PASSWORD_CONTEXT.handler("argon2").verify("trial", trial)
    except UNVERIFIABLE:
        raise ValueError("malformed argon2 hash: it cannot be verified") from None


@functools.cache
def _dummy_hash(context: CryptContext) -> str:
    return context.hash("not-a-real-password-only-spends-time")


def spend_verification_time(password: str) -> None:
    """Verify against a dummy hash, so an unknown e-mail costs as much time as a wrong password."""
    context = _context()
    _off_hub(context.verify, password, _dummy_hash(context))
