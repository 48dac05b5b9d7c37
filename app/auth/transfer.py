"""Users in and out as JSON lines: `flask --app wsgi users import FILE` and `users export`.

One user a line, the same in both directions:
`{"email", "password_hash", "email_verified"?, "role"?, "id"?, "created_at"?}`. `password_hash` is kept as it
came when it is one of the forms other systems export (see `passwords.imported_hash_scheme`), or null for an
account without a password; the first login with the right password stores an Argon2id hash in its place.
A line is refused as a whole, with its number and the reason in words; the other lines are imported. An
address that has an account already is reported and left unchanged, so running an import again changes
nothing. Users of trusted issuers are not exported (they log in through their issuer).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime

from ..http import rfc3339
from ..redis import Keys, get_redis
from . import emails, indexes, passwords, users

FIELDS = ("id", "email", "password_hash", "email_verified", "role", "created_at")
REQUIRED = ("email", "password_hash")
BATCH = 500
CREATED_AT_FUTURE_SECONDS = 24 * 3600  # clocks of the exporting system may run ahead


class Refused(ValueError):
    """A line that cannot be imported; the message says why, in words."""


@dataclass
class Report:
    """What an import did, line by line: the lines refused and why, the addresses already present."""

    imported: int = 0
    present: list[tuple[int, str]] = field(default_factory=list)
    refused: list[tuple[int, str]] = field(default_factory=list)
    schemes: dict[str, int] = field(default_factory=dict)

    def lines(self) -> list[str]:
        """The refused and present lines in file order, as the command prints them."""
        notes = [(number, f"refused: {reason}") for number, reason in self.refused]
        notes += [(number, f"already present, left unchanged: {email}") for number, email in self.present]
        return [f"line {number}: {note}" for number, note in sorted(notes)]

    def summary(self, dry_run: bool = False) -> str:
        """One line: how many users were imported (by kept hash scheme), found present, refused."""
        verb = "would import" if dry_run else "imported"
        kept = ", ".join(f"{count} {scheme}" for scheme, count in sorted(self.schemes.items()))
        return (
            f"{verb} {self.imported} users{f' ({kept})' if kept else ''}, "
            f"{len(self.present)} already present, {len(self.refused)} refused"
        )


def parse_line(text: str) -> tuple[dict, str]:
    """The user record a line describes (a record as `users.create_user` makes it) and the scheme of its
    password hash (`no password` for none), or Refused."""
    try:
        line = json.loads(text)
    except ValueError:
        raise Refused("not valid JSON") from None
    if not isinstance(line, dict):
        raise Refused("not a JSON object")
    unknown = sorted(set(line) - set(FIELDS))
    if unknown:
        raise Refused(f"unknown field(s) {', '.join(unknown)} (known: {', '.join(FIELDS)})")
    missing = [name for name in REQUIRED if name not in line]
    if missing:
        raise Refused(f"{' and '.join(missing)} missing")
    password_hash, scheme = _password_hash(line["password_hash"])
    record = {
        "id": _user_id(line.get("id")),
        "email": _email(line["email"]),
        "role": _role(line.get("role", "user")),
        "password_hash": password_hash,
        "token_version": "0",
        "created_at": _created_at(line.get("created_at")),
        "email_verified": "1" if _flag(line.get("email_verified", False)) else "0",
    }
    return record, scheme


def _user_id(value) -> str:
    if value is None:
        return uuid.uuid4().hex
    if not isinstance(value, str) or not users.USER_ID.fullmatch(value):
        raise Refused("id must be 32 lower-case hexadecimal digits (or left out for a new one)")
    return value


def _email(value) -> str:
    if not isinstance(value, str):
        raise Refused("email must be a string")
    try:
        return emails.plain_address(value)
    except emails.NotPlainAddress as refusal:
        raise Refused(f"bad e-mail address: {refusal}") from None


def _role(value) -> str:
    if value not in users.ROLES:
        raise Refused(f"role must be one of {', '.join(users.ROLES)}")
    return value


def _password_hash(value) -> tuple[str, str]:
    if value is None or value == "":
        return "", "no password"  # it logs in after a password reset, or through OAuth
    if not isinstance(value, str):
        raise Refused("password_hash must be a string or null")
    if len(value) > 1024:
        raise Refused("password_hash is longer than any known form")
    try:
        return value, passwords.imported_hash_scheme(value)
    except ValueError as refusal:
        raise Refused(str(refusal)) from None


def _flag(value) -> bool:
    if not isinstance(value, bool):
        raise Refused("email_verified must be true or false")
    return value


def _created_at(value) -> str:
    if value is None:
        return f"{time.time():.3f}"
    try:
        moment = datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        raise Refused("created_at must be an RFC 3339 date-time with its offset, e.g. 2024-05-01T12:00:00Z")
    # Listings and exports turn it back into a date: one outside these bounds could not be shown.
    epoch = moment.timestamp()
    if not 0 <= epoch <= time.time() + CREATED_AT_FUTURE_SECONDS:
        raise Refused("created_at must be between 1970-01-01 and now (a day ahead at most)")
    return f"{epoch:.3f}"


def import_lines(lines: Iterable[bytes], dry_run: bool = False) -> Report:
    """Import users from JSON lines (blank lines skipped), BATCH at a time; with `dry_run`, only report."""
    report = Report()
    seen_emails: dict[str, int] = {}
    seen_ids: dict[str, int] = {}
    batch: list[tuple[int, dict, str]] = []
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            record, scheme = parse_line(_text(raw, number))
            _check_unique(record, number, seen_emails, seen_ids)
        except Refused as refusal:
            report.refused.append((number, str(refusal)))
            continue
        batch.append((number, record, scheme))
        if len(batch) == BATCH:
            _store(batch, report, dry_run)
            batch = []
    if batch:
        _store(batch, report, dry_run)
    return report


def _text(raw: bytes, number: int) -> str:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise Refused("not UTF-8 text") from None
    return text.removeprefix("\ufeff") if number == 1 else text


def _check_unique(record: dict, number: int, seen_emails: dict[str, int], seen_ids: dict[str, int]) -> None:
    """Refuse a second line with an address or an id an earlier line of the file has."""
    if record["email"] in seen_emails:
        raise Refused(f"the same e-mail address as line {seen_emails[record['email']]}")
    if record["id"] in seen_ids:
        raise Refused(f"the same id as line {seen_ids[record['id']]}")
    seen_emails[record["email"]] = seen_ids[record["id"]] = number


def _store(batch: list[tuple[int, dict, str]], report: Report, dry_run: bool) -> None:
    records = [record for _, record, _ in batch]
    outcomes = _presence(records) if dry_run else users.store_imported_users(records)
    for number, record, scheme in batch:
        outcome = outcomes[record["id"]]
        if outcome == "created":
            report.imported += 1
            report.schemes[scheme] = report.schemes.get(scheme, 0) + 1
        elif outcome == "present":
            report.present.append((number, record["email"]))
        else:
            report.refused.append((number, "the id belongs to another account"))


def _presence(records: list[dict]) -> dict[str, str]:
    """What `users.store_imported_users` would answer, read only: `present`, `id_taken` or `created`."""
    client = get_redis()
    pipe = client.pipeline(transaction=False)
    for record in records:
        pipe.hget(Keys.user(record["id"]), "email")
        pipe.get(Keys.user_by_email(record["email"]))
    answers = pipe.execute()
    holders = [indexes.holder(value) for value in answers[1::2]]
    pipe = client.pipeline(transaction=False)
    for holder in holders:
        pipe.exists(Keys.user(holder or "-"))
    outcomes = {}
    for record, held, exists in zip(records, answers[::2], pipe.execute(), strict=True):
        if held is not None and held != record["email"]:
            outcomes[record["id"]] = "id_taken"
        else:
            outcomes[record["id"]] = "present" if held is not None or exists else "created"
    return outcomes


def export_lines() -> Iterator[str]:
    """Every user that logs in with an address, oldest first, as JSON lines (the import's format)."""
    client = get_redis()
    ids = client.zrange(Keys.users(), 0, -1)  # the users of this moment: later changes move no page
    for start in range(0, len(ids), BATCH):
        pipe = client.pipeline(transaction=False)
        for user_id in ids[start : start + BATCH]:
            pipe.hgetall(Keys.user(user_id))
        for record in pipe.execute():
            if record and not users.is_external(record):  # deleted meanwhile, or a trusted issuer's
                yield json.dumps(exported(record), ensure_ascii=False)


def open_private(path: str):
    """A new file only its owner may read (the export holds password hashes); FileExistsError if it exists."""
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w", encoding="utf-8")


def exported(record: dict) -> dict:
    """One user as an export line holds it."""
    return {
        "id": record["id"],
        "email": record["email"],
        "password_hash": record.get("password_hash") or None,
        "email_verified": record.get("email_verified") == "1",
        "role": record.get("role", "user"),
        "created_at": rfc3339(record.get("created_at"), timespec="milliseconds"),
    }
