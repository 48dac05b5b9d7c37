"""The package's HTTP clients: each sends its User-Agent, and all share one TLS context."""

from __future__ import annotations

import functools
import ssl
from typing import Any

import httpx

from ._version import USER_AGENT


@functools.cache
def tls_context() -> ssl.SSLContext:
    """httpx's default TLS context (certifi's CAs, or those SSL_CERT_FILE or SSL_CERT_DIR name when it is first
    built), built once a process: building one reads the whole CA bundle, tens of milliseconds of CPU."""
    return httpx.create_ssl_context()


def http_client(**options: Any) -> httpx.Client:
    """An `httpx.Client` with the package's User-Agent and the shared TLS context."""
    return httpx.Client(headers={"User-Agent": USER_AGENT}, verify=tls_context(), **options)
