"""User records: creation, look-up, the public view (`U` in docs/api.md) and password changes."""

from __future__ import annotations

import re
import time
import uuid

from ..errors import ApiError, validation_failed
from ..http import has_control_characters
from ..redis import Keys, get_redis, get_scripts
from . import passwords

EMAIL_PATTERN = re.compile(r"^[^@\s]{1,64}@[^@\s]+\.[^@\s]+$")
PASSWORD_MIN, PASSWORD_MAX = 8, 1024
ROLES = ("user", "admin")


def normalise_email(email: str) -> str:
    """The form e-mail addresses are compared and stored in."""
    return email.strip().lower()


def validate_email(email: str) -> str:
    """The normalised address, or 422 when it is not one (or holds control characters)."""
    email = normalise_email(email)
    if len(email) > 254 or not EMAIL_PATTERN.fullmatch(email) or has_control_characters(email):
        raise validation_failed("The e-mail address is not valid.")
    return email


def validate_password(password: str) -> str:
    """The password, or 422 when its length is outside what accounts accept."""
    if not PASSWORD_MIN <= len(password) <= PASSWORD_MAX:
        raise validation_failed(f"The password must have {PASSWORD_MIN} to {PASSWORD_MAX} characters.")
    return password


def create_user(email: str, password: str | None, role: str = "user", identities: tuple[str, ...] = ()) -> dict:
    """Create a user (password hashed off the hub); 409 if the e-mail or an identity is taken."""
    email = validate_email(email)
    if role not in ROLES:
        raise validation_failed(f"The role must be one of {', '.join(ROLES)}.")
    # No password: an account that only logs in through an OAuth provider (password login always fails).
    password_hash = passwords.hash_password(validate_password(password)) if password is not None else ""
    user = {
        "id": uuid.uuid4().hex,
        "email": email,
        "role": role,
        "password_hash": password_hash,
        "token_version": "0",
        "created_at": f"{time.time():.3f}",
    }
    keys = [Keys.user_by_email(email), *identities, Keys.user(user["id"])]
    pairs = [item for pair in user.items() for item in pair]
    taken = get_scripts().create_user(keys=keys, args=[user["id"], *pairs])
    if taken:
        raise ApiError(409, "conflict", "An account with this e-mail address already exists.")
    return user


def find_user_id_by_email(email: str) -> str | None:
    """The id of the account with this e-mail, if any."""
    return get_redis().get(Keys.user_by_email(normalise_email(email)))


def get_user(user_id: str) -> dict | None:
    """The stored user record, or None."""
    record = get_redis().hgetall(Keys.user(user_id))
    return record or None


def public_user(user: dict) -> dict:
    """U: the fields of a user that answers may show."""
    return {"id": user["id"], "email": user["email"], "role": user["role"]}


def store_password_hash(user_id: str, password_hash: str) -> None:
    """Replace the user's stored password hash."""
    get_redis().hset(Keys.user(user_id), "password_hash", password_hash)


def password_matches(user: dict | None, password: str) -> bool:
    """Whether `password` is the user's; costs one hash verification whether or not the user exists.

    No stored password is longer than PASSWORD_MAX, so a longer one is refused without hashing (the
    hasher refuses such input itself). A match on outdated hash parameters stores a fresh hash.
    """
    if len(password) > PASSWORD_MAX:
        return False
    if not user or not user.get("password_hash"):
        passwords.spend_verification_time(password)
        return False
    ok, new_hash = passwords.verify_password(password, user["password_hash"])
    if ok and new_hash:
        store_password_hash(user["id"], new_hash)
    return ok
