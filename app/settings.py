"""Every setting of the service, read from environment variables once, validated at start-up."""

from __future__ import annotations

import base64
import binascii
import email.utils
import ipaddress
import json
import logging
import os
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

log = logging.getLogger(__name__)

MIN_SECRET_BYTES = 32
ASYMMETRIC_ALGORITHMS = {"EdDSA", "RS256", "ES256"}
DEV_SECRETS_FILE = "dev-secrets.json"
MINIMAL_HASH_COST = "minimal"  # PASSWORD_HASH_COST for test suites only
PROVIDER_NAME = re.compile(r"[a-z0-9_-]{1,40}")
RATE_LIMIT = re.compile(
    r"\s*[0-9]+\s*(?:/|per)\s*(?:[0-9]+\s*)?(?:second|minute|hour|day|month|year)s?\s*", re.IGNORECASE
)
WEBHOOK_SCHEMES = ("standard", "stripe", "github")
# A host name or address as an RP ID: labels of letters, digits and hyphens (IDNs in their A-label form).
RP_ID = re.compile(r"(?=.{1,253}$)[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)*")


def is_rp_id(host: str) -> bool:
    """Whether a host can be a WebAuthn RP ID: a domain name (browsers refuse an IP address, 127.0.0.1 too)."""
    if not RP_ID.fullmatch(host):
        return False
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return True
    return False


OAUTH_PRESETS = {
    "google": {
        "discovery_url": "https://accounts.google.com/.well-known/openid-configuration",
        "scope": "openid email profile",
    },
    "github": {
        "authorize_url": "https://github.com/login/oauth/authorize",
        "token_url": "https://github.com/login/oauth/access_token",
        "userinfo_url": "https://api.github.com/user",
        "api_base_url": "https://api.github.com/",
        "scope": "read:user user:email",
    },
}


class SettingsError(RuntimeError):
    """Configuration that the service refuses to start with: every problem found, each naming its setting."""

    def __init__(self, *problems: str):
        super().__init__("; ".join(problems))
        self.problems = problems


class Secret(str):
    """A string that keeps itself out of reprs and logs."""

    def __repr__(self) -> str:
        return "Secret('**********')"


@dataclass(frozen=True)
class OAuthProvider:
    """One OAuth login provider (OAUTH_<NAME>_*), presets filled in."""

    name: str
    client_id: str
    client_secret: Secret
    scope: str
    discovery_url: str | None = None
    authorize_url: str | None = None
    token_url: str | None = None
    userinfo_url: str | None = None
    api_base_url: str | None = None


@dataclass(frozen=True)
class WebhookProvider:
    """One webhook sender (WEBHOOK_<NAME>_*): its signature scheme, its secrets (several while rotating)
    and where its payload names one of our users."""

    name: str
    scheme: str
    secrets: tuple[Secret, ...]
    user_path: str | None


@dataclass(frozen=True)
class OutgoingWebhooks:
    """Webhooks sent to other systems (WEBHOOK_OUT_*)."""

    timeout_seconds: float  # the whole attempt: connecting, sending, the answer's status and first KiB
    connect_timeout_seconds: float
    retry_schedule: tuple[int, ...]
    disable_after_seconds: int
    allow_private: bool
    allow_http: bool
    endpoint_concurrency: int  # attempts in flight to one endpoint, per delivery process
    secret_overlap_seconds: int  # how long a rotated-out secret still signs
    retention_seconds: int  # how long a message and its attempts are kept


@dataclass(frozen=True)
class Mail:
    """Outgoing mail: SMTP when SMTP_URL is set, else (in development) the log."""

    enabled: bool  # MAIL_ENABLED=false: no mail is wanted (production then needs no SMTP_URL)
    smtp_url: Secret | None
    mail_from: str
    public_base_url: str | None  # required with smtp_url, and in production
    starttls: str  # smtp:// only: always (no plain-text fallback) | never (loopback relay, mail catcher)
    retry_schedule: tuple[int, ...]
    timeout_seconds: float


@dataclass(frozen=True)
class WebAuthn:
    """Passkeys (WEBAUTHN_*): what a credential is bound to. Empty values mean "from the request"."""

    rp_id: str | None  # None: the request's host (PUBLIC_BASE_URL's host is filled in when that is set)
    origins: tuple[str, ...]  # empty: the request's own origin (PUBLIC_BASE_URL's is filled in when set)
    rp_name: str


@dataclass(frozen=True)
class Settings:
    """Every setting of the service, parsed and checked; secrets are `Secret`s."""

    app_env: str
    data_dir: Path
    redis_url: str
    redis_url_setting: str  # the one redis_url was read from (REDIS_TLS_URL or REDIS_URL), for log lines
    redis_max_connections: int
    secret_key: Secret
    jwt_secret: Secret
    jwt_algorithm: str
    jwt_private_key: Secret | None
    jwt_issuer: str
    jwt_audience: str
    password_hash_cost: str  # "owasp", or "minimal" for test suites (refused in production)
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
    rate_limit_mail: str
    rate_limit_passkey_options: str
    rate_limit_publish: str
    require_verified_email: bool
    org_creation: str  # who may create organizations: everyone (with a verified address) | admins
    mfa_max_failures: int
    max_connections_per_user: int
    sse_heartbeat_seconds: float
    long_poll_timeout: float
    long_poll_max_timeout: float
    event_history_maxlen: int
    event_history_ttl: int
    audit_retention_days: float
    ws_send_queue: int
    ws_send_timeout: float
    max_channels_per_connection: int
    ws_frame_rate: int
    presence_timeout: float
    presence_linger: float
    presence_diff_seconds: float
    subscribe_proxy_timeout: float
    subscribe_proxy_grant_seconds: int
    oidc_issuer: str | None  # the OpenID provider's issuer: OIDC_ISSUER, else PUBLIC_BASE_URL
    oidc_id_token_alg: str
    prometheus_multiproc_dir: str | None
    carry_dir: str | None  # gunicorn's private directory for carrying streams over on a reload
    metrics_allow_ips: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]
    metrics_token: Secret | None
    worker_metrics_port: int | None
    redis_mode: str
    event_durability: str
    oauth_providers: tuple[OAuthProvider, ...]
    webhook_providers: tuple[WebhookProvider, ...]
    outgoing_webhooks: OutgoingWebhooks
    mail: Mail
    webauthn: WebAuthn

    @property
    def production(self) -> bool:
        """Whether the service runs in production (secrets must be given, never made)."""
        return self.app_env == "production"

    @property
    def asymmetric_jwt(self) -> bool:
        """Whether tokens are signed with a private key (and a JWKS is published)."""
        return self.jwt_algorithm in ASYMMETRIC_ALGORITHMS


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """Parse an environment (the process's own when None) into Settings, or raise SettingsError naming every
    setting that is missing or wrong, all at once: an operator fixes them in one go, not one per restart.

    Tests pass a complete environment, so nothing in a developer's shell changes what they test.
    """
    env = dict(os.environ if environ is None else environ)
    reader = _Reader(env)
    app_env = reader.choice("APP_ENV", "development", {"development", "production", "test"})
    production = app_env == "production"
    data_dir = Path(reader.text("DATA_DIR", "var"))
    algorithm = reader.choice("JWT_ALGORITHM", "HS256", {"HS256", *ASYMMETRIC_ALGORITHMS})
    private_key = env.get("JWT_PRIVATE_KEY", "").replace("\\n", "\n").strip()
    if algorithm in ASYMMETRIC_ALGORITHMS and not private_key:
        reader.refuse(f"JWT_PRIVATE_KEY is required with JWT_ALGORITHM={algorithm}")
    if private_key and algorithm not in ASYMMETRIC_ALGORITHMS:
        reader.refuse("JWT_PRIVATE_KEY is set but JWT_ALGORITHM is not EdDSA, RS256 or ES256")

    secret_names = ["SECRET_KEY"] + ([] if private_key else ["JWT_SECRET"])
    found = reader.checked(_secrets, env, secret_names, production, data_dir, fallback={})

    settings = Settings(
        app_env=app_env,
        data_dir=data_dir,
        redis_url=_redis_url(reader),
        redis_url_setting=_redis_url_setting(reader),
        redis_max_connections=reader.integer("REDIS_MAX_CONNECTIONS", 64, minimum=4),
        secret_key=found.get("SECRET_KEY", Secret("")),
        jwt_secret=found.get("JWT_SECRET", Secret("")),
        jwt_algorithm=algorithm,
        jwt_private_key=Secret(private_key) if private_key else None,
        jwt_issuer=reader.text("JWT_ISSUER", "auth-rt"),
        jwt_audience=reader.text("JWT_AUDIENCE", "auth-rt"),
        password_hash_cost=reader.choice("PASSWORD_HASH_COST", "owasp", {"owasp", MINIMAL_HASH_COST}),
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
        rate_limit_login=reader.rate_limit("RATE_LIMIT_LOGIN", "10/minute"),
        rate_limit_register=reader.rate_limit("RATE_LIMIT_REGISTER", "5/minute"),
        rate_limit_refresh=reader.rate_limit("RATE_LIMIT_REFRESH", "30/minute"),
        rate_limit_password=reader.rate_limit("RATE_LIMIT_PASSWORD", "10/minute"),
        rate_limit_mail=reader.rate_limit("RATE_LIMIT_MAIL", "5/hour"),
        # Asked by the page at every logged-out view (passkey autofill): more than logins, still bounded.
        rate_limit_passkey_options=reader.rate_limit("RATE_LIMIT_PASSKEY_OPTIONS", "60/minute"),
        # Events a user (not an admin, not an API key) may publish, in a rolling window.
        rate_limit_publish=reader.rate_limit("RATE_LIMIT_PUBLISH", "50/second"),
        require_verified_email=reader.boolean("REQUIRE_VERIFIED_EMAIL", False),
        org_creation=reader.choice("ORG_CREATION", "everyone", {"everyone", "admins"}),
        # Wrong second-factor codes in a row before an account's MFA login is locked until a password reset.
        mfa_max_failures=reader.integer("MFA_MAX_FAILURES", 100, minimum=1),
        max_connections_per_user=reader.integer("MAX_CONNECTIONS_PER_USER", 50, minimum=1),
        sse_heartbeat_seconds=reader.number("SSE_HEARTBEAT_SECONDS", 15, minimum=0.05),
        long_poll_timeout=reader.number("LONG_POLL_TIMEOUT_SECONDS", 25, minimum=0.05),
        # Below the 30 s a PaaS router (Heroku's) allows a response to take before it cuts it off.
        long_poll_max_timeout=reader.number("LONG_POLL_MAX_TIMEOUT_SECONDS", 28, minimum=0.05),
        event_history_maxlen=reader.integer("EVENT_HISTORY_MAXLEN", 1000, minimum=1),
        # A channel's history is deleted this long after its last publication: names nobody uses again
        # (a user may make up channel names in an `authenticated` namespace) do not stay in Redis for good.
        event_history_ttl=reader.integer("EVENT_HISTORY_TTL_SECONDS", 7 * 24 * 3600, minimum=1),
        # How long audit entries are kept: fractions of a day allowed (tests keep them under a second).
        audit_retention_days=reader.number("AUDIT_RETENTION_DAYS", 90, minimum=0.00001, maximum=3660),
        ws_send_queue=reader.integer("WS_SEND_QUEUE", 1000, minimum=1),
        ws_send_timeout=reader.number("WS_SEND_TIMEOUT_SECONDS", 10, minimum=0.05),
        max_channels_per_connection=reader.integer("MAX_CHANNELS_PER_CONNECTION", 100, minimum=1),
        # Frames a WebSocket may send a second, of every type; the rest are answered `rate_limited`.
        ws_frame_rate=reader.integer("WS_FRAME_RATE", 20, minimum=1),
        # A dead worker's connections stop counting as present within this time (their lease runs out).
        presence_timeout=reader.number("PRESENCE_TIMEOUT_SECONDS", 60, minimum=0.5),
        # A user absent for less than this causes neither a leave nor a join (0: every change is published).
        presence_linger=reader.number("PRESENCE_LINGER_SECONDS", 2, minimum=0, maximum=3600),
        # presence_diff namespaces: how often a channel's joins and leaves go out together, as one presence.diff.
        presence_diff_seconds=reader.number("PRESENCE_DIFF_SECONDS", 0.5, minimum=0.05, maximum=60),
        # A namespace's subscribe proxy: how long the product's backend may take to answer, and how long the
        # grant of an `allow` without `expires_in` lasts.
        subscribe_proxy_timeout=reader.number("SUBSCRIBE_PROXY_TIMEOUT_SECONDS", 3, minimum=0.1, maximum=60),
        subscribe_proxy_grant_seconds=reader.integer(
            "SUBSCRIBE_PROXY_GRANT_SECONDS", 3600, minimum=1, maximum=10 * 366 * 24 * 3600
        ),
        # The OpenID provider: its issuer identifier (never a request's Host), and how its ID tokens are signed.
        oidc_issuer=reader.checked(_oidc_issuer, reader),
        oidc_id_token_alg=reader.choice("OIDC_ID_TOKEN_ALG", "RS256", {"RS256", "ES256", "EdDSA"}),
        # Set by gunicorn.conf.py for its workers (and by `make run`'s var/.env for the CLI).
        prometheus_multiproc_dir=reader.text("PROMETHEUS_MULTIPROC_DIR", "") or None,
        # Set by gunicorn.conf.py for its workers: where they hand open streams to the next generation on a reload.
        carry_dir=reader.text("AUTH_RT_CARRY_DIR", "") or None,
        # Who may read /metrics: these client addresses, or whoever sends the token as a bearer.
        metrics_allow_ips=reader.networks("METRICS_ALLOW_IPS", "127.0.0.1,::1"),
        metrics_token=Secret(reader.text("METRICS_TOKEN", "")) or None,
        # The delivery process (worker.py) serves its own /metrics on this port when set.
        worker_metrics_port=reader.integer("WORKER_METRICS_PORT", 0, minimum=0, maximum=65535) or None,
        redis_mode=reader.choice("REDIS_MODE", "standalone", {"standalone", "cluster"}),
        event_durability=reader.choice("EVENT_DURABILITY", "async", {"async", "replicated"}),
        oauth_providers=reader.provided(_oauth_provider, "OAUTH_PROVIDERS"),
        webhook_providers=reader.provided(_webhook_provider, "WEBHOOK_PROVIDERS"),
        outgoing_webhooks=OutgoingWebhooks(
            timeout_seconds=reader.number("WEBHOOK_OUT_TIMEOUT_SECONDS", 15, minimum=0.1, maximum=300),
            connect_timeout_seconds=reader.number("WEBHOOK_OUT_CONNECT_TIMEOUT_SECONDS", 5, minimum=0.1, maximum=300),
            retry_schedule=reader.seconds_list("WEBHOOK_OUT_RETRY_SCHEDULE", "5,300,1800,7200,18000,36000,36000"),
            disable_after_seconds=reader.integer("WEBHOOK_OUT_DISABLE_AFTER_SECONDS", 5 * 24 * 3600, minimum=1),
            allow_private=reader.boolean("WEBHOOK_OUT_ALLOW_PRIVATE", False),
            allow_http=reader.boolean("WEBHOOK_OUT_ALLOW_HTTP", False),
            endpoint_concurrency=reader.integer("WEBHOOK_OUT_ENDPOINT_CONCURRENCY", 8, minimum=1, maximum=1000),
            secret_overlap_seconds=reader.integer(
                "WEBHOOK_OUT_SECRET_OVERLAP_SECONDS", 24 * 3600, minimum=1, maximum=7 * 24 * 3600
            ),
            retention_seconds=reader.integer(
                "WEBHOOK_OUT_RETENTION_SECONDS", 14 * 24 * 3600, minimum=3600, maximum=90 * 24 * 3600
            ),
        ),
        mail=Mail(
            enabled=reader.boolean("MAIL_ENABLED", True),
            smtp_url=reader.checked(_smtp_url, reader),
            mail_from=reader.checked(_mail_from, reader, fallback=""),
            public_base_url=reader.checked(_public_base_url, reader),
            starttls=reader.choice("SMTP_STARTTLS", "always", {"always", "never"}),
            retry_schedule=reader.seconds_list("MAIL_RETRY_SCHEDULE", "5,30,120,300,600"),
            timeout_seconds=reader.number("SMTP_TIMEOUT_SECONDS", 20, minimum=1, maximum=120),
        ),
        webauthn=reader.checked(_webauthn, reader, fallback=WebAuthn(None, (), "auth-rt")),
    )
    mail = settings.mail
    if production and not mail.public_base_url:
        reader.refuse(
            "PUBLIC_BASE_URL is missing; production needs it (https://auth.example.com): mail links, passkeys' "
            "RP ID and origin and the OpenID issuer come from it, never from the Host header a request names"
        )
    elif mail.smtp_url and not mail.public_base_url:
        # In every environment: links in mails are never built from a request's Host header, which a
        # client chooses (a forged Host would send a victim's reset link to another site).
        reader.refuse(
            "PUBLIC_BASE_URL is required when SMTP_URL is set: links in mails point there, never at the "
            "Host header a request names"
        )
    if production and mail.enabled and not mail.smtp_url:
        reader.refuse(
            "SMTP_URL is missing; production sends its mail (verification, reset, MFA notices) over it, or set "
            "MAIL_ENABLED=false to say that no mail is wanted"
        )
    if settings.require_verified_email and not mail.enabled:
        reader.refuse(
            "REQUIRE_VERIFIED_EMAIL=true needs mail: with MAIL_ENABLED=false no account could verify its address"
        )
    if production and settings.password_hash_cost == MINIMAL_HASH_COST:
        reader.refuse("PASSWORD_HASH_COST=minimal is for test suites: APP_ENV=production hashes at OWASP's cost")
    reader.checked(_check_redis_url, settings.redis_url, settings.redis_mode, settings.redis_url_setting)
    if settings.long_poll_timeout > settings.long_poll_max_timeout:
        reader.refuse("LONG_POLL_TIMEOUT_SECONDS must not exceed LONG_POLL_MAX_TIMEOUT_SECONDS")
    outgoing = settings.outgoing_webhooks
    if outgoing.retention_seconds <= sum(outgoing.retry_schedule):
        reader.refuse("WEBHOOK_OUT_RETENTION_SECONDS must be longer than WEBHOOK_OUT_RETRY_SCHEDULE's total")
    if reader.problems:
        raise SettingsError(*reader.problems)
    return settings


def _oauth_provider(reader: _Reader, name: str) -> OAuthProvider:
    prefix = f"OAUTH_{name.upper()}_"
    preset = OAUTH_PRESETS.get(name, {})
    client_id, client_secret = reader.text(prefix + "CLIENT_ID", ""), reader.text(prefix + "CLIENT_SECRET", "")
    if not client_id or not client_secret:
        raise SettingsError(f"{prefix}CLIENT_ID and {prefix}CLIENT_SECRET are required for OAuth provider {name!r}")
    provider = OAuthProvider(
        name=name,
        client_id=client_id,
        client_secret=Secret(client_secret),
        scope=reader.text(prefix + "SCOPE", preset.get("scope", "openid email")),
        discovery_url=reader.text(prefix + "DISCOVERY_URL", preset.get("discovery_url", "")) or None,
        authorize_url=reader.text(prefix + "AUTHORIZE_URL", preset.get("authorize_url", "")) or None,
        token_url=reader.text(prefix + "TOKEN_URL", preset.get("token_url", "")) or None,
        userinfo_url=reader.text(prefix + "USERINFO_URL", preset.get("userinfo_url", "")) or None,
        api_base_url=preset.get("api_base_url"),
    )
    if not provider.discovery_url and not (provider.authorize_url and provider.token_url):
        raise SettingsError(f"{prefix}DISCOVERY_URL, or {prefix}AUTHORIZE_URL and {prefix}TOKEN_URL, must be set")
    return provider


def _webhook_provider(reader: _Reader, name: str) -> WebhookProvider:
    prefix = f"WEBHOOK_{name.upper()}_"
    scheme = reader.choice(prefix + "SCHEME", "", set(WEBHOOK_SCHEMES))
    # Several secrets, separated by spaces or commas, are all accepted (rotation).
    secrets_ = tuple(Secret(s) for s in reader.text(prefix + "SECRET", "").replace(",", " ").split())
    if not secrets_:
        raise SettingsError(f"{prefix}SECRET is required")
    if scheme == "standard":
        for secret in secrets_:
            try:
                base64.b64decode(secret.removeprefix("whsec_"), validate=True)
            except binascii.Error:
                raise SettingsError(f"{prefix}SECRET: a Standard Webhooks secret is 'whsec_' + base64") from None
    return WebhookProvider(name, scheme, secrets_, reader.text(prefix + "USER_PATH", "") or None)


def _smtp_url(reader: _Reader) -> Secret | None:
    url = reader.text("SMTP_URL", "")
    if url and urlsplit(url).scheme not in {"smtp", "smtps"}:
        raise SettingsError("SMTP_URL must start with smtp:// (STARTTLS) or smtps://")
    return Secret(url) if url else None


def _mail_from(reader: _Reader) -> str:
    value = reader.text("MAIL_FROM", "auth-rt <no-reply@localhost>")
    address = email.utils.parseaddr(value)[1]
    if "@" not in address or any(c in value for c in "\r\n"):
        raise SettingsError("MAIL_FROM must be an address, e.g. 'auth-rt <no-reply@example.com>'")
    return value


def _public_base_url(reader: _Reader) -> str | None:
    url = reader.text("PUBLIC_BASE_URL", "").rstrip("/")
    if url and (urlsplit(url).scheme not in {"http", "https"} or not urlsplit(url).netloc):
        raise SettingsError("PUBLIC_BASE_URL must be an http(s) URL such as https://auth.example.com")
    return url or None


def _oidc_issuer(reader: _Reader) -> str | None:
    """OIDC_ISSUER, else PUBLIC_BASE_URL: an http(s) URL with no query or fragment (https in production, as
    PUBLIC_BASE_URL is behind TLS there)."""
    issuer = reader.text("OIDC_ISSUER", "").rstrip("/")
    if not issuer:
        return _public_base_url(reader)
    parts = urlsplit(issuer)
    if parts.scheme not in {"http", "https"} or not parts.hostname or parts.query or parts.fragment:
        raise SettingsError(
            "OIDC_ISSUER must be an http(s) URL without a query or fragment, such as https://auth.example.com"
        )
    return issuer


def _origin(value: str) -> str | None:
    """`scheme://host[:port]` (http or https, nothing more), lower-cased; None when `value` is not one."""
    parts = urlsplit(value.strip())
    try:
        port = parts.port
    except ValueError:  # not a number, or out of range
        return None
    if parts.scheme not in {"http", "https"} or not parts.hostname or parts.username or parts.password:
        return None
    if parts.path not in {"", "/"} or parts.query or parts.fragment or value.strip().endswith(("?", "#")):
        return None
    host = parts.netloc.rsplit(":", 1)[0] if port is not None else parts.netloc
    # As a browser serialises an origin: no default port.
    shown_port = "" if port in (None, {"http": 80, "https": 443}[parts.scheme]) else f":{port}"
    return f"{parts.scheme}://{host}{shown_port}".lower()


def _webauthn(reader: _Reader) -> WebAuthn:
    """WEBAUTHN_RP_ID and WEBAUTHN_ORIGINS, defaulting to PUBLIC_BASE_URL's host and origin (else the request's).

    A passkey is bound to its RP ID for good: changing it later makes every registered passkey unusable.
    """
    public = _public_base_url(reader)
    rp_id = reader.text("WEBAUTHN_RP_ID", "").lower() or None
    if rp_id is not None and not is_rp_id(rp_id):
        raise SettingsError(f"WEBAUTHN_RP_ID must be a domain name such as auth.example.com (not an IP), not {rp_id!r}")
    if rp_id is None and public and is_rp_id(urlsplit(public).hostname or ""):
        rp_id = urlsplit(public).hostname
    origins = []
    for item in reader.text("WEBAUTHN_ORIGINS", "").split(","):
        if not item.strip():
            continue
        origin = _origin(item)
        if origin is None:
            raise SettingsError(f"WEBAUTHN_ORIGINS: {item.strip()!r} is not an origin (scheme://host[:port])")
        origins.append(origin)
    if not origins and public:
        origins.append(_origin(f"{urlsplit(public).scheme}://{urlsplit(public).netloc}"))
    for origin in origins:
        host = urlsplit(origin).hostname or ""
        if rp_id is not None and host != rp_id and not host.endswith("." + rp_id):
            # Browsers refuse such a pair: an origin may use its own host or a parent domain as RP ID.
            raise SettingsError(
                f"WEBAUTHN_ORIGINS (by default PUBLIC_BASE_URL's origin): {origin} is not on WEBAUTHN_RP_ID "
                f"{rp_id} or a subdomain of it"
            )
    rp_name = reader.text("WEBAUTHN_RP_NAME", "") or reader.text("JWT_ISSUER", "auth-rt")
    return WebAuthn(rp_id, tuple(origins), rp_name)


def _redis_url_setting(reader: _Reader) -> str:
    """The setting the Redis URL is read from: REDIS_TLS_URL when it is set (it wins over REDIS_URL)."""
    return "REDIS_TLS_URL" if reader.text("REDIS_TLS_URL", "") else "REDIS_URL"


def _redis_url(reader: _Reader) -> str:
    """REDIS_TLS_URL over REDIS_URL; REDIS_SSL_CERT_REQS added to a rediss:// URL that does not say it.

    Managed Redis on a PaaS (Heroku) presents a self-signed certificate under a URL the platform owns,
    so the verification mode cannot always be written into the URL itself.
    """
    url = reader.text(_redis_url_setting(reader), "redis://127.0.0.1:6379/0")
    cert_reqs = reader.choice("REDIS_SSL_CERT_REQS", "default", {"default", "none", "optional", "required"})
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    if parts.scheme == "rediss" and cert_reqs != "default" and "ssl_cert_reqs" not in query:
        url = urlunsplit(parts._replace(query=urlencode({**query, "ssl_cert_reqs": cert_reqs})))
    return url


def _check_redis_url(url: str, mode: str, setting: str = "REDIS_URL") -> None:
    """One redis:// or rediss:// URL; with REDIS_MODE=cluster, one or more (comma-separated) seed nodes."""
    if mode != "cluster":
        return
    seeds = [seed.strip() for seed in url.split(",")]
    example = "redis://10.0.0.1:6379/0,redis://10.0.0.2:6379/0"
    if not all(seeds):
        raise SettingsError(f"{setting} (cluster seeds) has an empty entry; write them like {example}")
    for seed in seeds:
        parts = urlsplit(seed)
        try:
            port = parts.port
        except ValueError:
            port = None
        if parts.scheme not in {"redis", "rediss"} or not parts.hostname or port is None:
            raise SettingsError(
                f"{setting} (cluster seeds): {_without_credentials(seed)!r} is not redis://host:port; "
                f"write the seeds like {example}"
            )
        if parts.path not in {"", "/", "/0"}:
            raise SettingsError(f"{setting} (cluster seeds): a Redis Cluster has only database 0")
    if len({urlsplit(seed).scheme for seed in seeds}) > 1:
        raise SettingsError(f"{setting} (cluster seeds): use redis:// for every seed or rediss:// for every seed")


def _without_credentials(url: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def _secrets(env: dict, names: list[str], production: bool, data_dir: Path) -> dict[str, Secret]:
    """Take each secret from the environment; in development, make and keep missing ones."""
    found: dict[str, Secret] = {}
    problems = []
    for name in names:
        value = env.get(name, "")
        if value and len(value.encode()) >= MIN_SECRET_BYTES:
            found[name] = Secret(value)
        elif production:
            problem = "is missing" if not value else f"is shorter than {MIN_SECRET_BYTES} bytes"
            problems.append(f"{name} {problem}; set it to a random value of at least {MIN_SECRET_BYTES} bytes")
    if problems:
        raise SettingsError(*problems)
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
    """Reads settings, noting each problem (and going on with the default) so that all are told at once."""

    def __init__(self, env: dict):
        self.env = env
        self.problems: list[str] = []

    def refuse(self, problem: str) -> None:
        """Note a problem of the configuration (once, however many readings meet it)."""
        if problem not in self.problems:
            self.problems.append(problem)

    def checked(self, build, *args, fallback=None):
        """`build(*args)`, or `fallback` with its SettingsError's problems noted."""
        try:
            return build(*args)
        except SettingsError as error:
            for problem in error.problems:
                self.refuse(problem)
            return fallback

    def provided(self, build, name: str) -> tuple:
        """One `build(reader, name)` per provider that the list `name` names, leaving out those with problems."""
        built = (self.checked(build, self, item) for item in self.names(name))
        return tuple(item for item in built if item is not None)

    def text(self, name: str, default: str) -> str:
        value = self.env.get(name)
        return default if value is None or value.strip() == "" else value.strip()

    def rate_limit(self, name: str, default: str) -> str:
        """A rate limit in the `limits` notation (`10/minute`, `50 per second`, several split by `;`)."""
        value = self.text(name, default)
        if not all(RATE_LIMIT.fullmatch(part) for part in re.split(r"[,;|]", value)):
            self.refuse(f"{name} must be a rate such as 10/minute or 50/second, not {value!r}")
            return default
        return value

    def choice(self, name: str, default: str, allowed: set[str]) -> str:
        value = self.text(name, default)
        if value not in allowed:
            self.refuse(f"{name} must be one of {', '.join(sorted(allowed))}, not {value!r}")
            return default
        return value

    def number(self, name: str, default: float, minimum: float | None = None, maximum: float | None = None) -> float:
        raw = self.text(name, str(default))
        try:
            value = float(raw)
        except ValueError:
            self.refuse(f"{name} must be a number, not {raw!r}")
            return default
        if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
            self.refuse(f"{name} must be between {minimum} and {maximum}, not {raw}")
            return default
        return value

    def integer(self, name: str, default: int, minimum: int | None = None, maximum: int | None = None) -> int:
        value = self.number(name, default, minimum, maximum)
        if value != int(value):
            self.refuse(f"{name} must be a whole number")
            return default
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
                    self.refuse(f"{name}: {item!r} is not an address or CIDR range")
        return tuple(found)

    def names(self, name: str) -> list[str]:
        """A comma-separated list of provider names (lower-case letters, digits, `_` and `-`)."""
        found = [item.strip().lower() for item in self.text(name, "").split(",") if item.strip()]
        for item in found:
            if not PROVIDER_NAME.fullmatch(item):
                self.refuse(f"{name}: {item!r} is not a provider name (letters, digits, _ and -)")
        return [item for item in found if PROVIDER_NAME.fullmatch(item)]

    def seconds_list(self, name: str, default: str) -> tuple[int, ...]:
        """Comma-separated whole seconds, each at least 1."""
        raw = self.text(name, default)
        try:
            values = tuple(int(item) for item in raw.split(","))
        except ValueError:
            self.refuse(f"{name} must be whole seconds separated by commas, not {raw!r}")
            return tuple(int(item) for item in default.split(","))
        if not values or min(values) < 1:
            self.refuse(f"{name}: every delay must be at least 1 second")
            return tuple(int(item) for item in default.split(","))
        return values

    def boolean(self, name: str, default: bool) -> bool:
        raw = self.text(name, "true" if default else "false").lower()
        if raw in {"1", "true", "yes", "on"}:
            return True
        if raw in {"0", "false", "no", "off"}:
            return False
        self.refuse(f"{name} must be true or false, not {raw!r}")
        return default
