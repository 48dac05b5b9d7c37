"""Every setting of the service, read from environment variables once, validated at start-up."""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

log = logging.getLogger(__name__)

MIN_SECRET_BYTES = 32
ASYMMETRIC_ALGORITHMS = {"EdDSA", "RS256", "ES256"}
DEV_SECRETS_FILE = "dev-secrets.json"


class SettingsError(RuntimeError):
    """Configuration that the service refuses to start with."""


class Secret(str):
    """A string that keeps itself out of reprs and logs."""

    def __repr__(self) -> str:
        return "Secret('**********')"


@dataclass(frozen=True)
class Settings:
    app_env: str
    data_dir: Path
    redis_url: str
    redis_max_connections: int
    secret_key: Secret
    jwt_secret: Secret
    jwt_algorithm: str
    jwt_private_key: Secret | None
    jwt_issuer: str
    jwt_audience: str
    access_token_ttl: int
    refresh_token_ttl: int
    refresh_reuse_grace: int
    allowed_origins: tuple[str, ...]
    proxy_hops: int
    forwarded_allow_ips: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]
    rate_limits_enabled: bool
    rate_limit_login: str
    rate_limit_register: str
    rate_limit_refresh: str
    rate_limit_password: str
    max_connections_per_user: int
    sse_heartbeat_seconds: float
    long_poll_timeout: float
    long_poll_max_timeout: float
    event_history_maxlen: int
    ws_send_queue: int
    ws_send_timeout: float
    # The raw environment, for feature modules (OAuth, webhooks) that parse their own provider lists.
    # Kept out of the repr: it holds secrets.
    environ: dict = field(default_factory=dict, repr=False)

    @property
    def production(self) -> bool:
        return self.app_env == "production"

    @property
    def asymmetric_jwt(self) -> bool:
        return self.jwt_algorithm in ASYMMETRIC_ALGORITHMS


def load_settings(overrides: dict | None = None) -> Settings:
    """Parse the environment (plus test overrides) into Settings, or raise SettingsError."""
    env = {**os.environ, **(overrides or {})}
    reader = _Reader(env)
    app_env = reader.choice("APP_ENV", "development", {"development", "production", "test"})
    data_dir = Path(reader.text("DATA_DIR", "var"))
    algorithm = reader.choice("JWT_ALGORITHM", "HS256", {"HS256", *ASYMMETRIC_ALGORITHMS})
    private_key = env.get("JWT_PRIVATE_KEY", "").replace("\\n", "\n").strip()
    if algorithm in ASYMMETRIC_ALGORITHMS and not private_key:
        raise SettingsError(f"JWT_PRIVATE_KEY is required with JWT_ALGORITHM={algorithm}")
    if private_key and algorithm not in ASYMMETRIC_ALGORITHMS:
        raise SettingsError("JWT_PRIVATE_KEY is set but JWT_ALGORITHM is not EdDSA, RS256 or ES256")

    secret_names = ["SECRET_KEY"] + ([] if private_key else ["JWT_SECRET"])
    found = _secrets(env, secret_names, app_env == "production", data_dir)

    settings = Settings(
        app_env=app_env,
        data_dir=data_dir,
        redis_url=_redis_url(reader),
        redis_max_connections=reader.integer("REDIS_MAX_CONNECTIONS", 64, minimum=4),
        secret_key=found["SECRET_KEY"],
        jwt_secret=found.get("JWT_SECRET", Secret("")),
        jwt_algorithm=algorithm,
        jwt_private_key=Secret(private_key) if private_key else None,
        jwt_issuer=reader.text("JWT_ISSUER", "auth-rt"),
        jwt_audience=reader.text("JWT_AUDIENCE", "auth-rt"),
        # Access tokens live 15 minutes; shorter is allowed so tests can watch expiry.
        access_token_ttl=reader.integer("ACCESS_TOKEN_TTL_SECONDS", 900, minimum=1, maximum=900),
        refresh_token_ttl=reader.integer("REFRESH_TOKEN_TTL_SECONDS", 30 * 24 * 3600, minimum=60),
        refresh_reuse_grace=reader.integer("REFRESH_REUSE_GRACE_SECONDS", 0, minimum=0, maximum=60),
        allowed_origins=tuple(
            o.strip().rstrip("/") for o in reader.text("ALLOWED_ORIGINS", "").split(",") if o.strip()
        ),
        proxy_hops=reader.integer("PROXY_HOPS", 1, minimum=0, maximum=10),
        forwarded_allow_ips=reader.networks("FORWARDED_ALLOW_IPS", "127.0.0.1,::1"),
        rate_limits_enabled=reader.boolean("RATE_LIMITS_ENABLED", True),
        rate_limit_login=reader.text("RATE_LIMIT_LOGIN", "10/minute"),
        rate_limit_register=reader.text("RATE_LIMIT_REGISTER", "5/minute"),
        rate_limit_refresh=reader.text("RATE_LIMIT_REFRESH", "30/minute"),
        rate_limit_password=reader.text("RATE_LIMIT_PASSWORD", "10/minute"),
        max_connections_per_user=reader.integer("MAX_CONNECTIONS_PER_USER", 50, minimum=1),
        sse_heartbeat_seconds=reader.number("SSE_HEARTBEAT_SECONDS", 15, minimum=0.05),
        long_poll_timeout=reader.number("LONG_POLL_TIMEOUT_SECONDS", 25, minimum=0.05),
        # Below the 30 s a PaaS router (Heroku's) allows a response to take before it cuts it off.
        long_poll_max_timeout=reader.number("LONG_POLL_MAX_TIMEOUT_SECONDS", 28, minimum=0.05),
        event_history_maxlen=reader.integer("EVENT_HISTORY_MAXLEN", 1000, minimum=1),
        ws_send_queue=reader.integer("WS_SEND_QUEUE", 1000, minimum=1),
        ws_send_timeout=reader.number("WS_SEND_TIMEOUT_SECONDS", 10, minimum=0.05),
        environ=env,
    )
    if settings.long_poll_timeout > settings.long_poll_max_timeout:
        raise SettingsError("LONG_POLL_TIMEOUT_SECONDS must not exceed LONG_POLL_MAX_TIMEOUT_SECONDS")
    return settings


def _redis_url(reader: _Reader) -> str:
    """REDIS_TLS_URL over REDIS_URL; REDIS_SSL_CERT_REQS added to a rediss:// URL that does not say it.

    Managed Redis on a PaaS (Heroku) presents a self-signed certificate under a URL the platform owns,
    so the verification mode cannot always be written into the URL itself.
    """
    url = reader.text("REDIS_TLS_URL", "") or reader.text("REDIS_URL", "redis://127.0.0.1:6379/0")
    cert_reqs = reader.choice("REDIS_SSL_CERT_REQS", "default", {"default", "none", "optional", "required"})
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    if parts.scheme == "rediss" and cert_reqs != "default" and "ssl_cert_reqs" not in query:
        url = urlunsplit(parts._replace(query=urlencode({**query, "ssl_cert_reqs": cert_reqs})))
    return url


def _secrets(env: dict, names: list[str], production: bool, data_dir: Path) -> dict[str, Secret]:
    """Take each secret from the environment; in development, make and keep missing ones."""
    found: dict[str, Secret] = {}
    for name in names:
        value = env.get(name, "")
        if value and len(value.encode()) >= MIN_SECRET_BYTES:
            found[name] = Secret(value)
        elif production:
            problem = "is missing" if not value else f"is shorter than {MIN_SECRET_BYTES} bytes"
            raise SettingsError(f"{name} {problem}; set it to a random value of at least {MIN_SECRET_BYTES} bytes")
    missing = [n for n in names if n not in found]
    if missing:
        kept = _development_secrets(data_dir, missing)
        found.update({name: Secret(kept[name]) for name in missing})
    return found


def _development_secrets(data_dir: Path, names: list[str]) -> dict[str, str]:
    """The kept development secrets; made (and announced, once) by whichever process first needs them."""
    path = data_dir / DEV_SECRETS_FILE
    for _ in range(3):
        kept = _read_json(path)
        if all(name in kept for name in names):
            return kept
        made = {**kept, **{name: secrets.token_urlsafe(48) for name in names if name not in kept}}
        data_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{DEV_SECRETS_FILE}.{os.getpid()}.tmp")
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as file:
            file.write(json.dumps(made))  # readable by no one else from the first byte
        try:
            if kept:
                tmp.replace(path)  # adding a name the file lacks (a secret no longer set): keeps the others
            else:
                # Several workers start at once: only one may create the file, or they would sign
                # with different keys. The others read what it wrote.
                os.link(tmp, path)
        except FileExistsError:
            continue
        finally:
            tmp.unlink(missing_ok=True)
        log.warning("development secrets made for %s (kept in %s); set them in production", ", ".join(names), path)
        return made
    raise SettingsError(f"{path} is not readable JSON; delete it to make new development secrets")


def _read_json(path: Path) -> dict:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


class _Reader:
    def __init__(self, env: dict):
        self.env = env

    def text(self, name: str, default: str) -> str:
        value = self.env.get(name)
        return default if value is None or value.strip() == "" else value.strip()

    def choice(self, name: str, default: str, allowed: set[str]) -> str:
        value = self.text(name, default)
        if value not in allowed:
            raise SettingsError(f"{name} must be one of {', '.join(sorted(allowed))}, not {value!r}")
        return value

    def number(self, name: str, default: float, minimum: float | None = None, maximum: float | None = None) -> float:
        raw = self.text(name, str(default))
        try:
            value = float(raw)
        except ValueError:
            raise SettingsError(f"{name} must be a number, not {raw!r}") from None
        if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
            raise SettingsError(f"{name} must be between {minimum} and {maximum}, not {raw}")
        return value

    def integer(self, name: str, default: int, minimum: int | None = None, maximum: int | None = None) -> int:
        value = self.number(name, default, minimum, maximum)
        if value != int(value):
            raise SettingsError(f"{name} must be a whole number")
        return int(value)

    def networks(self, name: str, default: str) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
        """Comma-separated addresses and CIDR ranges; `*` is every address (as gunicorn spells it)."""
        found = []
        for item in (part.strip() for part in self.text(name, default).split(",")):
            if item == "*":
                found += [ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0")]
            elif item:
                try:
                    found.append(ipaddress.ip_network(item, strict=False))
                except ValueError:
                    raise SettingsError(f"{name}: {item!r} is not an address or CIDR range") from None
        return tuple(found)

    def boolean(self, name: str, default: bool) -> bool:
        raw = self.text(name, "true" if default else "false").lower()
        if raw in {"1", "true", "yes", "on"}:
            return True
        if raw in {"0", "false", "no", "off"}:
            return False
        raise SettingsError(f"{name} must be true or false, not {raw!r}")
