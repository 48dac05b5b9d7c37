"""Start-up settings (production refuses weak secrets, development keeps generated ones) and the CLI."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from subprocess import PIPE

import pytest

from app.settings import OAUTH_PRESETS, SettingsError, load_settings
from tests.servers import ROOT, free_port, process_env
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


PRODUCTION_ADDRESSES = {"PUBLIC_BASE_URL": "https://auth.example.test", "SMTP_URL": "smtps://mail.example.test"}


def test_production_starts_with_strong_secrets(tmp_path):
    settings = load_settings(
        {"APP_ENV": "production", "SECRET_KEY": STRONG, "JWT_SECRET": "j" * 32, **PRODUCTION_ADDRESSES}
    )
    assert settings.production and str(settings.jwt_secret) == "j" * 32
    assert "j" * 32 not in repr(settings)


def test_production_refuses_the_minimal_password_hashing_cost_of_test_suites(tmp_path):
    production = {"APP_ENV": "production", "SECRET_KEY": STRONG, "JWT_SECRET": "j" * 32, **PRODUCTION_ADDRESSES}
    with pytest.raises(SettingsError, match="PASSWORD_HASH_COST=minimal"):
        load_settings({**production, "PASSWORD_HASH_COST": "minimal"})
    assert load_settings(production).password_hash_cost == "owasp"
    with pytest.raises(SettingsError, match="PASSWORD_HASH_COST"):
        load_settings({"APP_ENV": "test", "DATA_DIR": str(tmp_path), "PASSWORD_HASH_COST": "none"})


def test_development_makes_and_keeps_secrets_announcing_them_once(tmp_path, caplog):
    env = {"APP_ENV": "development", "DATA_DIR": str(tmp_path), "SECRET_KEY": "", "JWT_SECRET": ""}
    first, second = load_settings(env), load_settings(env)
    assert len(str(first.jwt_secret)) >= 32
    assert first.jwt_secret == second.jwt_secret and first.secret_key == second.secret_key
    assert caplog.text.count("development secrets") == 1  # when made, not on every start or CLI call
    assert (tmp_path / "dev-secrets.json").stat().st_mode & 0o777 == 0o600
    assert str(first.jwt_secret) not in caplog.text


def test_workers_starting_together_make_one_set_of_development_secrets(tmp_path):
    """Several processes at once on a fresh DATA_DIR: one makes the secrets, all sign with them."""
    # app/settings.py alone, as gunicorn's arbiter loads it: importing the app package too took 1.2 s of CPU each.
    code = (
        "import importlib.util, logging, sys; logging.basicConfig(stream=sys.stderr);"
        "spec = importlib.util.spec_from_file_location('settings', 'app/settings.py');"
        "settings = sys.modules['settings'] = importlib.util.module_from_spec(spec); spec.loader.exec_module(settings);"
        "print(settings.load_settings().jwt_secret)"
    )
    env = process_env(APP_ENV="development", DATA_DIR=str(tmp_path), SECRET_KEY="", JWT_SECRET="")
    processes = [
        subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, stdout=PIPE, stderr=PIPE) for _ in range(6)
    ]
    results = [process.communicate(timeout=60) for process in processes]
    assert all(process.returncode == 0 for process in processes), results
    assert len({out for out, _ in results}) == 1
    assert sum(err.count(b"development secrets made") for _, err in results) == 1


def test_long_polls_end_before_a_paas_router_cuts_them(tmp_path):
    settings = load_settings({"APP_ENV": "test", "DATA_DIR": str(tmp_path)})
    assert settings.long_poll_timeout == 25
    assert settings.long_poll_max_timeout < 30  # Heroku's router ends a response after 30 s


@pytest.mark.parametrize(
    "env, url",
    [
        ({"REDIS_URL": "rediss://h:6380/0", "REDIS_SSL_CERT_REQS": "none"}, "rediss://h:6380/0?ssl_cert_reqs=none"),
        ({"REDIS_URL": "rediss://h/0?ssl_cert_reqs=required", "REDIS_SSL_CERT_REQS": "none"}, None),
        ({"REDIS_URL": "redis://h/0", "REDIS_SSL_CERT_REQS": "none"}, None),  # TLS options only for TLS
        ({"REDIS_URL": "redis://h/0", "REDIS_TLS_URL": "rediss://t:6380"}, "rediss://t:6380"),
        ({"REDIS_URL": "redis://h/0?db=2"}, None),
    ],
)
def test_redis_url_tls_settings(tmp_path, env, url):
    settings = load_settings({"APP_ENV": "test", "DATA_DIR": str(tmp_path), **env})
    assert settings.redis_url == (url or env["REDIS_URL"])


@pytest.mark.parametrize(
    "name, value", [("ACCESS_TOKEN_TTL_SECONDS", "3600"), ("PROXY_HOPS", "many"), ("RATE_LIMITS_ENABLED", "maybe")]
)
def test_invalid_values_stop_start_up_naming_the_variable(tmp_path, name, value):
    with pytest.raises(SettingsError, match=name):
        load_settings({"APP_ENV": "test", "DATA_DIR": str(tmp_path), name: value})


#: A production environment with five things wrong: each process must name every one in its one start.
FIVE_PROBLEMS = {"APP_ENV": "production", "SECRET_KEY": "", "JWT_SECRET": "short", "WS_FRAME_RATE": "fast"}
NAMED = (
    "SECRET_KEY is missing",
    "JWT_SECRET is shorter than 32 bytes",
    "PUBLIC_BASE_URL is missing",
    "SMTP_URL is missing",
    "WS_FRAME_RATE must be a number",
)


@pytest.mark.slow
def test_the_real_processes_refuse_to_start_in_production_naming_every_problem_in_one_start(tmp_path):
    env = process_env(FIVE_PROBLEMS, DATA_DIR=str(tmp_path), PORT=str(free_port()))
    gunicorn = [str(ROOT / ".venv/bin/gunicorn"), "-c", "gunicorn.conf.py", "--workers", "2", "wsgi:app"]
    worker = [sys.executable, "worker.py"]
    for command in (
        [sys.executable, "-c", "import wsgi"],
        [sys.executable, "-m", "flask", "--app", "wsgi", "users", "list"],
        gunicorn,
        worker,
    ):
        # gunicorn stops by itself: the arbiter checks the settings before it starts any worker (workers that
        # each failed to load the app made the arbiter raise again while stopping, now and then).
        result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
        assert result.returncode == 4, (command, result.stderr)
        refusals = [line for line in result.stderr.splitlines() if "configuration error: " in line]
        assert len(refusals) == 1, (command, result.stderr)
        assert all(problem in refusals[0] for problem in NAMED), (command, result.stderr)
        lines = result.stderr.strip().splitlines()
        if command in (gunicorn, worker):  # every line JSON, as their log pipeline expects
            assert all(json.loads(line) for line in lines), result.stderr
            assert "Booting worker" not in result.stderr
        else:
            assert len(lines) == 1, result.stderr
        assert "Traceback" not in result.stderr, result.stderr
        assert not (tmp_path / "dev-secrets.json").exists()  # production makes no secrets

    # Put right, it starts: no mail wanted needs no SMTP_URL.
    right = {"SECRET_KEY": STRONG, "JWT_SECRET": "j" * 32, "WS_FRAME_RATE": "20", "MAIL_ENABLED": "false"}
    started = subprocess.run(
        [sys.executable, "-c", "import wsgi"],
        cwd=ROOT,
        env={**env, **right, "PUBLIC_BASE_URL": "https://auth.example.test"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (started.returncode, started.stderr) == (0, "")


def test_production_wants_mail_unless_mail_enabled_says_it_does_not(tmp_path):
    production = {"APP_ENV": "production", "SECRET_KEY": STRONG, "JWT_SECRET": "j" * 32}
    public = {"PUBLIC_BASE_URL": "https://auth.example.test"}
    with pytest.raises(SettingsError, match="SMTP_URL is missing.*MAIL_ENABLED=false"):
        load_settings({**production, **public})
    with pytest.raises(SettingsError, match="SMTP_URL is missing"):
        load_settings({**production, **public, "MAIL_ENABLED": "true"})
    without_mail = load_settings({**production, **public, "MAIL_ENABLED": "false"})
    assert (without_mail.mail.enabled, without_mail.mail.smtp_url) == (False, None)
    with pytest.raises(SettingsError, match="PUBLIC_BASE_URL is missing") as refusal:  # mail or none, it wants it
        load_settings({**production, "MAIL_ENABLED": "false"})
    assert "SMTP_URL" not in str(refusal.value)


@pytest.mark.parametrize(
    "public, rp_id",
    [("https://auth.example.test", "auth.example.test"), ("https://203.0.113.7", None)],  # an IP: no RP ID
)
def test_production_passkeys_never_take_their_rp_id_from_the_host_a_request_names(make_app, public, rp_id):
    """A forged Host once gave `"rpId": "evil.example"`: passkeys registered for another site."""
    forged = {"Host": "evil.example"}
    developing = make_app().test_client().post("/auth/passkeys/login/options", json={}, headers=forged)
    assert developing.get_json()["options"]["rpId"] == "evil.example"  # no PUBLIC_BASE_URL: the request's

    production = make_app(
        APP_ENV="production", PASSWORD_HASH_COST="owasp", MAIL_ENABLED="false", PUBLIC_BASE_URL=public
    )
    answer = production.test_client().post("/auth/passkeys/login/options", json={}, headers=forged)
    assert "evil.example" not in answer.get_data(as_text=True)
    if rp_id is None:  # browsers bind no passkey to an IP address, and production never takes the Host's
        assert answer.status_code == 404 and answer.get_json()["error"]["code"] == "not_found", answer.get_json()
    else:
        assert answer.get_json()["options"]["rpId"] == rp_id


#: What a real `flask` process adds is its own (settings, output, exit status), the same on either Redis; the
#: commands' Redis steps run on the cluster in process (tests/account/test_mail_addresses.py,
#: tests/events/test_publish_limits.py, tests/audit/test_types.py).
THE_PROCESS_ITSELF = pytest.mark.not_on_cluster("the real `flask` process; its commands run on the cluster in process")


def flask_cli(base_env, *args):
    env = process_env(base_env)
    return subprocess.run(
        [sys.executable, "-m", "flask", "--app", "wsgi", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@THE_PROCESS_ITSELF
def test_cli_creates_a_user_who_can_log_in(base_env, rdb, auth):
    email = random_email()
    result = flask_cli(base_env, "users", "create", "--email", email, "--password", DEFAULT_PASSWORD, "--role", "admin")
    assert result.returncode == 0, result.stderr
    assert DEFAULT_PASSWORD not in result.stdout + result.stderr
    tokens = auth.login_body(email)
    assert tokens["user"]["role"] == "admin"


@THE_PROCESS_ITSELF
def test_cli_reports_a_taken_email_clearly(base_env, rdb, auth):
    user = auth.register()
    result = flask_cli(base_env, "users", "create", "--email", user["email"], "--password", DEFAULT_PASSWORD)
    assert result.returncode != 0
    assert "already exists" in result.stderr
    assert "Traceback" not in result.stderr


@THE_PROCESS_ITSELF
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


def test_cli_says_in_one_line_which_redis_it_cannot_reach(base_env):
    port = free_port()
    dead = f"redis://:hunter2-password@127.0.0.1:{port}/0"
    for args in (["events", "publish", "--channel", "broadcast", "--event", "x"], ["users", "create"]):
        if args[0] == "users":
            args += ["--email", random_email(), "--password", DEFAULT_PASSWORD]
        result = flask_cli({**base_env, "REDIS_URL": dead}, *args)
        assert result.returncode != 0
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert f"cannot reach Redis at 127.0.0.1:{port} (REDIS_URL)" in lines[0], lines
        assert "hunter2" not in result.stderr


def test_provider_families_are_typed_settings_with_their_secrets_hidden(tmp_path):
    settings = load_settings(
        {
            "APP_ENV": "test",
            "DATA_DIR": str(tmp_path),
            "OAUTH_PROVIDERS": "github, Corp",
            "OAUTH_GITHUB_CLIENT_ID": "gh-id",
            "OAUTH_GITHUB_CLIENT_SECRET": "gh-very-secret",
            "OAUTH_CORP_CLIENT_ID": "corp-id",
            "OAUTH_CORP_CLIENT_SECRET": "corp-very-secret",
            "OAUTH_CORP_DISCOVERY_URL": "https://id.example.com/.well-known/openid-configuration",
            "WEBHOOK_PROVIDERS": "pay",
            "WEBHOOK_PAY_SCHEME": "stripe",
            "WEBHOOK_PAY_SECRET": "whsec_old, whsec_new",
        }
    )
    github, corp = settings.oauth_providers
    assert (github.name, github.token_url, github.scope) == (
        "github",
        OAUTH_PRESETS["github"]["token_url"],
        "read:user user:email",
    )
    assert (corp.name, corp.scope, corp.discovery_url) == (
        "corp",
        "openid email",
        "https://id.example.com/.well-known/openid-configuration",
    )
    (pay,) = settings.webhook_providers
    assert (pay.name, pay.scheme, pay.secrets) == ("pay", "stripe", ("whsec_old", "whsec_new"))
    shown = repr(settings)
    assert all(secret not in shown for secret in ("gh-very-secret", "corp-very-secret", "whsec_old", "whsec_new"))
    assert not any(isinstance(value, dict) for value in vars(settings).values())  # no raw environment kept


@pytest.mark.parametrize(
    "env, complaint",
    [
        ({"OAUTH_PROVIDERS": "corp", "OAUTH_CORP_CLIENT_ID": "x"}, "OAUTH_CORP_CLIENT_SECRET"),
        ({"OAUTH_PROVIDERS": "corp", "OAUTH_CORP_CLIENT_ID": "x", "OAUTH_CORP_CLIENT_SECRET": "y"}, "DISCOVERY_URL"),
        ({"OAUTH_PROVIDERS": "bad name!"}, "provider name"),
        ({"WEBHOOK_PROVIDERS": "pay", "WEBHOOK_PAY_SCHEME": "carrier-pigeon", "WEBHOOK_PAY_SECRET": "s"}, "SCHEME"),
        ({"WEBHOOK_PROVIDERS": "pay", "WEBHOOK_PAY_SCHEME": "standard", "WEBHOOK_PAY_SECRET": "whsec_!!"}, "base64"),
        ({"WEBHOOK_PROVIDERS": "pay", "WEBHOOK_PAY_SCHEME": "github"}, "WEBHOOK_PAY_SECRET"),
        ({"SMTP_URL": "http://mail.example.com"}, "SMTP_URL"),
        ({"PUBLIC_BASE_URL": "auth.example.com"}, "PUBLIC_BASE_URL"),
        ({"WEBHOOK_OUT_RETRY_SCHEDULE": "5,0"}, "WEBHOOK_OUT_RETRY_SCHEDULE"),
        ({"REDIS_MODE": "cluster", "REDIS_URL": "redis://10.0.0.1:7000/0,,redis://10.0.0.2:7000/0"}, "empty entry"),
        ({"REDIS_MODE": "cluster", "REDIS_URL": "redis://10.0.0.1:7000/0,10.0.0.2:7000"}, "not redis://host:port"),
        ({"REDIS_MODE": "cluster", "REDIS_URL": "redis://:hunter2secret@10.0.0.1/0"}, r"'redis://10\.0\.0\.1/0'"),
        ({"REDIS_MODE": "cluster", "REDIS_URL": "redis://10.0.0.1:7000/2"}, "only database 0"),
        ({"REDIS_MODE": "cluster", "REDIS_URL": "redis://a:1/0,rediss://b:2/0"}, "every seed"),
        ({"REDIS_MODE": "sharded"}, "REDIS_MODE"),
        ({"EVENT_DURABILITY": "sync"}, "EVENT_DURABILITY"),
    ],
)
def test_bad_provider_and_feature_settings_name_what_is_wrong(tmp_path, env, complaint):
    with pytest.raises(SettingsError, match=complaint):
        load_settings({"APP_ENV": "test", "DATA_DIR": str(tmp_path), **env})


def test_cluster_mode_takes_comma_separated_seed_nodes(tmp_path):
    seeds = "redis://10.0.0.1:7000/0, redis://10.0.0.2:7001/0,redis://10.0.0.3:7002"
    settings = load_settings(
        {"APP_ENV": "test", "DATA_DIR": str(tmp_path), "REDIS_MODE": "cluster", "REDIS_URL": seeds}
    )
    assert settings.redis_mode == "cluster" and settings.redis_url == seeds
    assert load_settings({"APP_ENV": "test", "DATA_DIR": str(tmp_path)}).redis_mode == "standalone"


def test_only_the_settings_module_reads_the_process_environment():
    """Every setting comes through app/settings.py, so a deployment can see and check all of them in one place."""
    readers = re.compile(r"\bos\.environ\b|\bos\.getenv\b|\bgetenv\(")
    app_dir = ROOT / "app"
    reading = [
        str(path.relative_to(ROOT))
        for path in sorted(app_dir.rglob("*.py"))
        if path != app_dir / "settings.py" and readers.search(path.read_text())
    ]
    assert reading == []


def test_the_carry_over_directory_is_a_setting(tmp_path):
    env = {"APP_ENV": "development", "DATA_DIR": str(tmp_path)}
    assert load_settings(env).carry_dir is None
    assert load_settings({**env, "AUTH_RT_CARRY_DIR": str(tmp_path)}).carry_dir == str(tmp_path)
