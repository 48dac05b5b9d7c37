"""Start-up settings (production refuses weak secrets, development keeps generated ones) and the CLI."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from app.settings import SettingsError, load_settings
from tests.servers import ROOT
from tests.utils import DEFAULT_PASSWORD, random_email

STRONG = "s" * 32


@pytest.mark.parametrize(
    "env, named",
    [
        ({"SECRET_KEY": STRONG}, "JWT_SECRET"),
        ({"JWT_SECRET": STRONG}, "SECRET_KEY"),
        ({"SECRET_KEY": STRONG, "JWT_SECRET": "short"}, "JWT_SECRET"),
        ({"SECRET_KEY": "s" * 31, "JWT_SECRET": STRONG}, "SECRET_KEY"),
    ],
)
def test_production_refuses_missing_or_short_secrets_naming_them(tmp_path, env, named):
    base = {"APP_ENV": "production", "DATA_DIR": str(tmp_path), "SECRET_KEY": "", "JWT_SECRET": ""}
    with pytest.raises(SettingsError, match=named):
        load_settings({**base, **env})
    assert not (tmp_path / "dev-secrets.json").exists()


def test_production_starts_with_strong_secrets(tmp_path):
    settings = load_settings({"APP_ENV": "production", "SECRET_KEY": STRONG, "JWT_SECRET": "j" * 32})
    assert settings.production and str(settings.jwt_secret) == "j" * 32
    assert "j" * 32 not in repr(settings)


def test_development_makes_and_keeps_secrets_with_a_warning(tmp_path, caplog):
    env = {"APP_ENV": "development", "DATA_DIR": str(tmp_path), "SECRET_KEY": "", "JWT_SECRET": ""}
    first, second = load_settings(env), load_settings(env)
    assert len(str(first.jwt_secret)) >= 32
    assert first.jwt_secret == second.jwt_secret and first.secret_key == second.secret_key
    assert "development secrets" in caplog.text
    assert str(first.jwt_secret) not in caplog.text


@pytest.mark.parametrize(
    "name, value", [("ACCESS_TOKEN_TTL_SECONDS", "3600"), ("PROXY_HOPS", "many"), ("RATE_LIMITS_ENABLED", "maybe")]
)
def test_invalid_values_stop_start_up_naming_the_variable(tmp_path, name, value):
    with pytest.raises(SettingsError, match=name):
        load_settings({"APP_ENV": "test", "DATA_DIR": str(tmp_path), name: value})


def test_the_real_process_refuses_to_start_in_production_without_secrets(tmp_path):
    env = {**os.environ, "APP_ENV": "production", "SECRET_KEY": "", "JWT_SECRET": "", "DATA_DIR": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-c", "import wsgi"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0
    assert "JWT_SECRET" in result.stderr or "SECRET_KEY" in result.stderr


def flask_cli(base_env, *args):
    env = {**os.environ, **base_env}
    return subprocess.run(
        [sys.executable, "-m", "flask", "--app", "wsgi", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_creates_a_user_who_can_log_in(base_env, rdb, auth):
    email = random_email()
    result = flask_cli(base_env, "users", "create", "--email", email, "--password", DEFAULT_PASSWORD, "--role", "admin")
    assert result.returncode == 0, result.stderr
    assert DEFAULT_PASSWORD not in result.stdout + result.stderr
    tokens = auth.login_body(email)
    assert tokens["user"]["role"] == "admin"


def test_cli_reports_a_taken_email_clearly(base_env, rdb, auth):
    user = auth.register()
    result = flask_cli(base_env, "users", "create", "--email", user["email"], "--password", DEFAULT_PASSWORD)
    assert result.returncode != 0
    assert "already exists" in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_publishes_an_event_readers_receive(base_env, rdb, client, auth):
    tokens = auth.new_user_tokens()
    headers = {"Authorization": f"Bearer {tokens['access_token']}"}
    cursor = client.get("/events", headers=headers).headers["Event-Cursor"]
    channel = f"user:{tokens['user']['id']}"
    result = flask_cli(
        base_env, "events", "publish", "--channel", channel, "--event", "ops.notice", "--data", '{"a": 1}'
    )
    assert result.returncode == 0, result.stderr
    events = client.get("/events", query_string={"cursor": cursor}, headers=headers).get_json()["events"]
    assert [(e["event"], e["data"]) for e in events] == [("ops.notice", {"a": 1})]
    bad = flask_cli(base_env, "events", "publish", "--channel", channel, "--event", "x", "--data", "{nope")
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
