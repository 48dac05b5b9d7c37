"""Redis over TLS with a self-signed certificate, as managed Redis on a PaaS (Heroku) presents it: the
app's Redis client and the rate limiter's storage both connect when the certificate check is off."""

from __future__ import annotations

import subprocess

import pytest
import redis

from app import create_app
from tests.conftest import https_client
from tests.servers import free_port, make_certificate, wait_until
from tests.utils import AuthActions

pytestmark = pytest.mark.not_on_cluster("starts its own TLS redis-server (a single one)")


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory):
    """redis-server answering only TLS, with a self-signed certificate; yields its rediss:// URL."""
    directory = tmp_path_factory.mktemp("tls-redis")
    cert, key = map(str, make_certificate(directory, "redis"))
    port = free_port()
    process = subprocess.Popen(
        ["redis-server", "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1", "--save", ""]
        + ["--tls-cert-file", cert, "--tls-key-file", key, "--tls-auth-clients", "no", "--dir", str(directory)],
        stdout=subprocess.DEVNULL,
    )
    url = f"rediss://127.0.0.1:{port}/0"
    wait_until(lambda: redis.Redis.from_url(url, ssl_cert_reqs="none").ping(), message="TLS redis-server")
    yield url
    process.terminate()
    process.wait(10)


def tls_app(base_env, **env):
    # Rate limits on: a login then goes through Flask-Limiter's own Redis storage as well.
    return create_app({**base_env, "RATE_LIMITS_ENABLED": "true", "REDIS_URL": "", **env})


@pytest.mark.parametrize(
    "how",
    [
        lambda url: {"REDIS_URL": url + "?ssl_cert_reqs=none"},
        lambda url: {"REDIS_URL": url, "REDIS_SSL_CERT_REQS": "none"},
        lambda url: {"REDIS_URL": f"redis://127.0.0.1:{free_port()}/0", "REDIS_TLS_URL": url + "?ssl_cert_reqs=none"},
    ],
    ids=["in-url", "setting", "redis-tls-url"],
)
def test_a_self_signed_tls_redis_serves_logins_and_rate_limits(base_env, tls_redis, how):
    client = https_client(tls_app(base_env, **how(tls_redis)))
    assert client.get("/readyz").status_code == 200
    auth = AuthActions(client)
    user = auth.register()
    response = auth.login(user["email"])
    assert response.status_code == 200, response.get_json()
    # The limiter counted the login in this Redis, over TLS, through its own storage.
    counted = redis.Redis.from_url(tls_redis, ssl_cert_reqs="none").keys("*ratelimit*login*")
    assert counted and response.headers["X-RateLimit-Limit"]


def test_the_certificate_is_verified_unless_told_otherwise(base_env, tls_redis):
    client = https_client(tls_app(base_env, REDIS_URL=tls_redis))
    assert client.get("/readyz").status_code == 503
