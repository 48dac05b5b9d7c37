"""Keys fetched from an issuer's JWKS URL, counted at the test's JWKS server: kept while fresh, fetched again
at once for a rotated-in key, at most once a minute for unknown kids, again once the kept set is stale,
never from an address the rules refuse, and a failed fetch refuses the token."""

from __future__ import annotations

import time
import uuid

import pytest

from app.issuers import store
from tests.conftest import https_client
from tests.issuers.issuer import AUDIENCE, Signer, claims, exchange_form

pytestmark = pytest.mark.not_on_cluster("fetching keys over HTTP: the same code whatever the Redis")


def exchange(client, signer: Signer, iss: str, kid=True):
    return client.post("/oauth/token", data=exchange_form(signer.sign(claims(iss), kid=kid)))


def ok(answer) -> None:
    assert answer.status_code == 200, answer.get_json()


def refused(answer, said: str) -> None:
    assert answer.status_code == 400 and answer.get_json()["error"] == "invalid_grant", answer.get_json()
    assert said in answer.get_json()["error_description"], answer.get_json()


@pytest.fixture
def url_issuer(define, key_server):
    """An issuer whose keys are at a fresh path of the JWKS server: (its iss, the path, the first signer)."""

    def make(*signers: Signer) -> tuple[str, str]:
        path = f"/{uuid.uuid4().hex[:8]}/jwks.json"
        url = key_server.publish(path, *signers)
        name = define(algorithms=["RS256", "ES256", "EdDSA"], jwks_url=url)
        return f"https://{name}.example", path

    return make


def test_a_rotated_in_key_is_fetched_at_once_and_unknown_kids_at_most_once_a_minute(
    app, client, key_server, url_issuer
):
    first, second, third = Signer.rsa(), Signer.ec(), Signer.ed25519()
    iss, path = url_issuer(first)
    assert key_server.fetches(path) == 0  # saving the issuer fetches nothing
    ok(exchange(client, first, iss))
    assert key_server.fetches(path) == 1
    ok(exchange(client, first, iss))
    assert key_server.fetches(path) == 1  # kept

    key_server.publish(path, first, second)  # the issuer rotates a key in
    ok(exchange(client, second, iss))  # its kid is unknown here: fetched again at once
    assert key_server.fetches(path) == 2

    key_server.publish(path, first, second, third)  # and another one, within the minute
    refused(exchange(client, third, iss), "kid")  # unknown, and the minute is not over: not fetched
    refused(exchange(client, first, iss, kid="made-up"), "kid")
    assert key_server.fetches(path) == 2
    ok(exchange(client, second, iss))  # the kept keys still serve
    assert key_server.fetches(path) == 2

    app.extensions["issuer_keys"].unknown_kid_interval = 0.5  # the minute, shortened: then an unknown kid fetches
    time.sleep(0.6)
    ok(exchange(client, third, iss))
    assert key_server.fetches(path) == 3


def test_each_issuer_has_its_own_minute(client, key_server, url_issuer):
    alpha, beta = Signer.rsa(), Signer.rsa()
    iss_a, path_a = url_issuer(alpha)
    iss_b, path_b = url_issuer(beta)
    ok(exchange(client, alpha, iss_a))
    refused(exchange(client, alpha, iss_a, kid="unknown-1"), "kid")  # the one fetch of the minute for alpha
    ok(exchange(client, beta, iss_b))
    refused(exchange(client, beta, iss_b, kid="unknown-2"), "kid")
    assert (key_server.fetches(path_a), key_server.fetches(path_b)) == (2, 2)
    refused(exchange(client, alpha, iss_a, kid="unknown-3"), "kid")
    assert key_server.fetches(path_a) == 2


def test_a_stale_key_set_is_fetched_again_and_a_withdrawn_key_then_refused(app, client, key_server, url_issuer):
    old, new = Signer.rsa(), Signer.ec()
    iss, path = url_issuer(old)
    app.extensions["issuer_keys"].lifespan = 1.0  # kept keys go stale after a second (JWKS_LIFESPAN_SECONDS)
    ok(exchange(client, old, iss))
    ok(exchange(client, old, iss))
    assert key_server.fetches(path) == 1
    key_server.publish(path, new)  # the issuer withdraws the old key
    ok(exchange(client, old, iss))  # the kept set is still fresh: its key still verifies
    time.sleep(1.1)
    refused(exchange(client, old, iss), "kid")  # stale: fetched again, and the old key is gone
    assert key_server.fetches(path) == 2
    ok(exchange(client, new, iss))
    assert key_server.fetches(path) == 2


def test_replacing_an_issuer_forgets_its_kept_keys(client, define, key_server):
    old, new = Signer.rsa(), Signer.rsa()
    first = key_server.publish("/replaced-1.json", old)
    name = define(algorithms=["RS256"], jwks_url=first)
    iss = f"https://{name}.example"
    ok(exchange(client, old, iss))
    second = key_server.publish("/replaced-2.json", new)
    define(name, algorithms=["RS256"], jwks_url=second)
    ok(exchange(client, new, iss))
    refused(exchange(client, old, iss), "kid")
    assert (key_server.fetches("/replaced-1.json"), key_server.fetches("/replaced-2.json")) == (1, 2)


@pytest.mark.parametrize(
    "answer, said",
    [
        (None, "could not be fetched"),  # 404
        ({"keys": []}, "could not be fetched"),
        ({"keys": [{"kty": "RSA"}]}, "could not be fetched"),
        ({"no": "keys"}, "could not be fetched"),
    ],
)
def test_a_jwks_url_that_answers_no_usable_keys_refuses_the_token(client, define, key_server, answer, said):
    signer = Signer.rsa()
    path = f"/broken-{uuid.uuid4().hex[:6]}.json"
    if answer is not None:
        key_server.sets[path] = answer
    name = define(algorithms=["RS256"], jwks_url=key_server.url(path))
    iss = f"https://{name}.example"
    refused(exchange(client, signer, iss), said)
    assert key_server.fetches(path) == 1
    key_server.publish(path, signer)  # once it answers keys, they are fetched (a failure is not kept)
    ok(exchange(client, signer, iss))


def test_a_jwks_url_on_a_refused_address_is_never_fetched(make_app, rdb, key_server):
    """Checked at every connection too: a record saved where loopback was allowed fetches nothing where it is not."""
    strict = https_client(make_app())
    signer = Signer.rsa()
    url = key_server.publish("/strict-fetch.json", signer)
    store.put_issuer(rdb, store.Issuer("strict", "https://strict.example", AUDIENCE, ("RS256",), jwks_url=url))
    refused(exchange(strict, signer, "https://strict.example"), "could not be fetched")
    assert key_server.fetches("/strict-fetch.json") == 0
