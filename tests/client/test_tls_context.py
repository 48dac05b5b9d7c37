"""The client's HTTP clients share one TLS context: building one reads the whole CA bundle (tens of milliseconds
of CPU), which every `Client` paid twice and every `EventReader` once."""

from __future__ import annotations

import ssl

import httpx
from auth_rt_client import Client, EventReader

SERVICE = "https://127.0.0.1:1"  # nothing is sent: the clients are only made


def test_clients_and_readers_read_the_certificates_once_a_process(monkeypatch):
    Client(SERVICE).close()  # the first one of the process builds the context, if nothing has yet
    loaded, load = [], ssl.SSLContext.load_verify_locations
    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations", lambda *a, **kw: loaded.append(1) or load(*a, **kw))
    httpx.Client().close()  # what each of them did before
    assert loaded
    loaded.clear()
    for _ in range(3):
        Client(SERVICE, "ak_not_a_key").close()
        EventReader(SERVICE, "not a token").close()
    assert loaded == []
