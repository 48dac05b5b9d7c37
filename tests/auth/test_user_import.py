"""`users import` and `users export`: other systems' password hashes kept and verified at login (then rehashed
with Argon2id), a report per refused line, a re-run that changes nothing, and a round trip through export."""

from __future__ import annotations

import json
import stat
import uuid

import argon2
import pytest
import requests
from passlib.hash import bcrypt, django_pbkdf2_sha256

from app.audit.store import read as read_audit
from app.auth import indexes, users
from app.auth.emails import RULE
from app.redis import Keys
from tests.utils import DEFAULT_PASSWORD, redis_snapshot

BCRYPT_4 = bcrypt.using(rounds=4, ident="2b")
PBKDF2 = django_pbkdf2_sha256.using(rounds=1000)
FOREIGN_ARGON2 = argon2.PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1)


def password_of(email: str) -> str:
    return f"pw of {email}"


def bcrypt_as(ident: str, password: str) -> str:
    """A bcrypt hash with the identifier another system writes ($2a$ Supabase's Go, $2y$ PHP's): one algorithm."""
    return f"${ident}$" + BCRYPT_4.hash(password)[4:]


@pytest.fixture(scope="module")
def export_of_300() -> list[dict]:
    """300 users as other systems export them: bcrypt of three identifiers, Django's pbkdf2, argon2."""
    lines = []
    for n in range(300):
        email = f"import-{n:03d}@example.com"
        kind = ("2b", "2a", "2y", "pbkdf2", "argon2")[n % 5] if n < 50 else "2b"
        if kind == "pbkdf2":
            hashed = PBKDF2.hash(password_of(email))
        elif kind == "argon2":
            hashed = FOREIGN_ARGON2.hash(password_of(email))
        else:
            hashed = bcrypt_as(kind, password_of(email))
        lines.append({"email": email, "password_hash": hashed, "email_verified": n % 2 == 0})
    return lines


def write_lines(path, lines: list) -> str:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return str(path)


def test_imported_users_log_in_over_http_with_each_kind_of_hash_which_becomes_argon2id(
    live_server, cli, rdb, tmp_path, export_of_300
):
    done = cli("users", "import", write_lines(tmp_path / "users.jsonl", export_of_300))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == [
        "imported 300 users (10 argon2, 280 bcrypt, 10 pbkdf2_sha256), 0 already present, 0 refused"
    ]
    assert rdb.zcard(Keys.users()) == 300 and rdb.zcard(indexes.EMAIL_ORDER) == 300
    for n in (0, 1, 2, 3, 4):  # bcrypt $2b$, $2a$, $2y$, Django's pbkdf2_sha256, argon2id
        email = f"import-{n:03d}@example.com"
        user_id = rdb.get(Keys.user_by_email(email))
        kept = rdb.hget(Keys.user(user_id), "password_hash")
        assert kept == export_of_300[n]["password_hash"]
        wrong = requests.post(f"{live_server.url}/auth/login", json={"email": email, "password": "not it"}, timeout=30)
        assert wrong.status_code == 401 and rdb.hget(Keys.user(user_id), "password_hash") == kept
        right = {"email": email, "password": password_of(email), "transport": "body"}
        answer = requests.post(f"{live_server.url}/auth/login", json=right, timeout=30)
        assert answer.status_code == 200, answer.text
        assert answer.json()["user"] == {
            "id": user_id,
            "email": email,
            "role": "user",
            "email_verified": n % 2 == 0,
            "mfa_enabled": False,
        }
        rehashed = rdb.hget(Keys.user(user_id), "password_hash")
        assert rehashed.startswith("$argon2id$") and rehashed != kept
        again = requests.post(f"{live_server.url}/auth/login", json=right, timeout=30)
        assert again.status_code == 200 and rdb.hget(Keys.user(user_id), "password_hash") == rehashed


def test_each_refused_line_is_reported_with_its_number_and_reason_and_the_others_are_imported(app, cli, rdb, tmp_path):
    with app.app_context():
        existing = users.create_user("existing@example.com", DEFAULT_PASSWORD)
    good = {"email": "Good@Example.com", "password_hash": BCRYPT_4.hash("x"), "role": "admin", "email_verified": True}
    lines = [
        good,
        "{not json",
        "",  # blank lines are skipped, and still counted
        ["a", "list"],
        {"email": "no-at-sign", "password_hash": None},
        {"email": "md5@example.com", "password_hash": "5f4dcc3b5aa765d61d8327deb882cf99"},
        {"email": "short@example.com", "password_hash": "$2b$10$tooshort"},
        {"email": "costly@example.com", "password_hash": "$2b$31$" + BCRYPT_4.hash("x")[7:]},
        {"email": "role@example.com", "password_hash": None, "role": "root"},
        {"email": "good@example.com", "password_hash": None},
        {"email": "typo@example.com", "passwordHash": "$2b$"},
        {"email": "verified@example.com", "password_hash": None, "email_verified": "yes"},
        {"email": "id@example.com", "password_hash": None, "id": "auth0|5dea9f9c82dd7c0e76e4ec93"},
        {"email": "when@example.com", "password_hash": None, "created_at": "yesterday"},
        {"email": "nopassword@example.com", "password_hash": None, "created_at": "2020-01-02T03:04:05Z"},
        {"email": "other@example.com", "password_hash": None, "id": existing["id"]},
    ]
    path = tmp_path / "users.jsonl"
    write_lines(path, lines)
    with path.open("ab") as file:
        file.write(b'{"email": "\xff@example.com", "password_hash": null}\n')
    done = cli("users", "import", str(path))
    assert done.returncode == 1
    assert done.stdout.splitlines() == [
        "line 2: refused: not valid JSON",
        "line 4: refused: not a JSON object",
        f"line 5: refused: bad e-mail address: {RULE}",
        "line 6: refused: unknown password hash format: expected bcrypt ($2a$, $2b$, $2y$), Django's pbkdf2_sha256$, "
        "or an argon2 PHC string ($argon2id$)",
        "line 7: refused: malformed bcrypt hash",
        "line 8: refused: bcrypt cost 31 is above 12",
        "line 9: refused: role must be one of user, admin",
        "line 10: refused: the same e-mail address as line 1",
        "line 11: refused: unknown field(s) passwordHash (known: id, email, password_hash, email_verified, role, "
        "created_at)",
        "line 12: refused: email_verified must be true or false",
        "line 13: refused: id must be 32 lower-case hexadecimal digits (or left out for a new one)",
        "line 14: refused: created_at must be an RFC 3339 date-time with its offset, e.g. 2024-05-01T12:00:00Z",
        "line 16: refused: the id belongs to another account",
        "line 17: refused: not UTF-8 text",
        "imported 2 users (1 bcrypt, 1 no password), 0 already present, 14 refused",
    ]
    stored = {record["email"]: record for record in _records(rdb)}
    assert sorted(stored) == ["existing@example.com", "good@example.com", "nopassword@example.com"]
    assert stored["good@example.com"]["role"] == "admin" and stored["good@example.com"]["email_verified"] == "1"
    without = stored["nopassword@example.com"]
    assert without["password_hash"] == "" and without["created_at"] == "1577934245.000"


def _records(rdb) -> list[dict]:
    return [rdb.hgetall(Keys.user(user_id)) for user_id in rdb.zrange(Keys.users(), 0, -1)]


def test_a_second_run_changes_nothing_and_each_user_has_one_registration_entry(app, cli, rdb, tmp_path):
    with app.app_context():
        existing = users.create_user("already@example.com", DEFAULT_PASSWORD)
    lines = [
        {"email": "already@example.com", "password_hash": BCRYPT_4.hash("other")},
        {"email": "new-1@example.com", "password_hash": BCRYPT_4.hash("one")},
        {"email": "new-2@example.com", "password_hash": PBKDF2.hash("two"), "id": uuid.uuid4().hex},
    ]
    path = write_lines(tmp_path / "users.jsonl", lines)
    first = cli("users", "import", path)
    assert first.returncode == 0
    assert first.stdout.splitlines() == [
        "line 1: already present, left unchanged: already@example.com",
        "imported 2 users (1 bcrypt, 1 pbkdf2_sha256), 1 already present, 0 refused",
    ]
    assert rdb.hget(Keys.user(existing["id"]), "password_hash") == existing["password_hash"]
    registered = rdb.zrange(Keys.audit_type("user.registered"), 0, -1)
    assert len(registered) == 3  # the existing user's own, and one per imported user
    imported = [rdb.get(Keys.user_by_email(line["email"])) for line in lines[1:]]
    assert imported[1] == lines[2]["id"]
    for user_id in imported:
        (entry,) = [json.loads(m.partition(" ")[2]) for m in rdb.zrange(Keys.audit_subject(user_id), 0, -1)]
        assert entry["type"] == "user.registered" and entry["details"] == {"method": "import", "role": "user"}
        assert entry["actor"] == {"kind": "cli", "id": None}
    assert "$2b$" not in "".join(rdb.zrange(Keys.audit_log(), 0, -1))  # no hash in the audit log
    before = redis_snapshot(rdb)
    second = cli("users", "import", path)
    assert second.returncode == 0
    assert second.stdout.splitlines()[-1] == "imported 0 users, 3 already present, 0 refused"
    assert redis_snapshot(rdb) == before


def test_a_dry_run_reports_and_changes_nothing(app, cli, rdb, tmp_path):
    with app.app_context():
        users.create_user("already@example.com", DEFAULT_PASSWORD)
    lines = [
        {"email": "already@example.com", "password_hash": None},
        {"email": "new@example.com", "password_hash": None},
    ]
    before = redis_snapshot(rdb)
    done = cli("users", "import", "--dry-run", write_lines(tmp_path / "users.jsonl", lines))
    assert done.returncode == 0
    assert done.stdout.splitlines() == [
        "line 1: already present, left unchanged: already@example.com",
        "would import 1 users (1 no password), 1 already present, 0 refused",
    ]
    assert redis_snapshot(rdb) == before


def test_an_import_that_died_midway_is_finished_by_the_next_run(app, cli, rdb, tmp_path):
    """Claims left pending: one whose record was written (its account exists: present, and committed), one
    whose record was not (free: the next run takes it over and creates the user)."""
    written_id, unwritten_id = uuid.uuid4().hex, uuid.uuid4().hex
    rdb.set(Keys.user_by_email("written@example.com"), indexes.PENDING + written_id)
    rdb.hset(Keys.user(written_id), mapping={"id": written_id, "email": "written@example.com", "role": "user"})
    rdb.set(Keys.user_by_email("unwritten@example.com"), indexes.PENDING + unwritten_id)
    lines = [
        {"email": "written@example.com", "password_hash": None},
        {"email": "unwritten@example.com", "password_hash": None},
    ]
    done = cli("users", "import", write_lines(tmp_path / "users.jsonl", lines))
    assert done.stdout.splitlines()[-1] == "imported 1 users (1 no password), 1 already present, 0 refused"
    assert rdb.get(Keys.user_by_email("written@example.com")) == written_id
    created = rdb.get(Keys.user_by_email("unwritten@example.com"))
    assert created not in (unwritten_id, indexes.PENDING + unwritten_id)
    assert rdb.hget(Keys.user(created), "email") == "unwritten@example.com"


def test_export_then_import_elsewhere_keeps_every_user_as_it_was(app, cli, rdb, redis_server, tmp_path):
    with app.app_context():
        made = users.create_user("made-here@example.com", DEFAULT_PASSWORD, role="admin", email_verified=True)
        users.find_or_create_external_user("corp", "subject-1", "external@example.com")
    source = [{"email": "from-auth0@example.com", "password_hash": BCRYPT_4.hash("a"), "email_verified": True}]
    assert cli("users", "import", write_lines(tmp_path / "in.jsonl", source)).returncode == 0
    before = {record["email"]: record for record in _records(rdb) if not users.is_external(record)}
    assert made["password_hash"].startswith("$argon2id$")

    target = tmp_path / "out.jsonl"
    done = cli("users", "export", "--output", str(target))
    assert done.returncode == 0 and "exported 2 users" in done.stderr
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    exported = [json.loads(line) for line in target.read_text().splitlines()]
    assert [line["email"] for line in exported] == ["made-here@example.com", "from-auth0@example.com"]
    assert set(exported[0]) == {"id", "email", "password_hash", "email_verified", "role", "created_at"}
    assert cli("users", "export").stdout == target.read_text()  # standard output: the same lines
    refused = cli("users", "export", "--output", str(target))
    assert refused.returncode == 1 and "exists: export to a new file" in refused.stderr
    with app.app_context():  # every export is an audit entry, naming how many and where (never the file's name)
        exports = read_audit(entry_type="users.exported")[0]
    assert [(entry["actor"]["kind"], entry["details"]) for entry in exports] == [
        ("cli", {"users": 2, "to": "stdout"}),
        ("cli", {"users": 2, "to": "file"}),
    ]

    redis_server.flushall() if redis_server.mode == "cluster" else rdb.flushall()  # another service's database
    assert cli("users", "import", str(target)).returncode == 0
    after = {record["email"]: record for record in _records(rdb)}
    assert after == before
    assert cli("users", "export").stdout == target.read_text()


def test_a_bcrypt_password_longer_than_72_bytes_logs_in_as_the_system_that_truncated_it_and_is_rehashed_whole(
    cli, rdb, auth, tmp_path
):
    """bcrypt reads 72 bytes; Node's bcrypt (Auth0) and Go's older one dropped the rest, the bcrypt package refuses
    it: compared on the first 72 bytes, then kept as an Argon2id hash of the whole password."""
    password = "long passphrase " * 6  # 96 bytes
    line = {"email": "long@example.com", "password_hash": BCRYPT_4.hash(password.encode()[:72])}
    assert cli("users", "import", write_lines(tmp_path / "users.jsonl", [line])).returncode == 0
    assert auth.login("long@example.com", password).status_code == 200
    assert auth.login("long@example.com", password[:72] + "not the rest").status_code == 401  # now all of it counts
    assert auth.login("long@example.com", password).status_code == 200
    assert rdb.hget(Keys.user(rdb.get(Keys.user_by_email("long@example.com"))), "password_hash").startswith(
        "$argon2id$"
    )
