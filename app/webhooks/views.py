"""`POST /webhooks/<provider>` (docs/api.md, Webhooks received) and the admins' list of recent deliveries."""

from __future__ import annotations

import hashlib

from flask import Blueprint, current_app, jsonify, request

from ..auth.guards import csrf_exempt, current_caller, login_required
from ..errors import bad_request, forbidden, not_found, unauthorized, validation_failed
from ..http import StrictJSONError, parse_json, plain_text, read_body, rfc3339, validated_query
from ..openapi import operation
from ..settings import WebhookProvider
from .schemas import Deliveries, Received, Recent, WebhookProviderPath
from .schemes import VERIFIERS, SignatureRejected
from .store import DeliveryStore, user_at_path

bp = Blueprint("webhooks", __name__, url_prefix="/webhooks")

BODY_LIMIT = 1024 * 1024
ID_LIMIT = 200


def _provider(name: str) -> WebhookProvider:
    provider = current_app.extensions["webhook_providers"].get(name)
    if provider is None:
        raise not_found("No such webhook provider.")
    return provider


def _store() -> DeliveryStore:
    return current_app.extensions["webhook_store"]


@bp.post("/<name>")
@operation(
    "Receive a signed webhook from a configured provider (the body as the provider signed it)",
    tags=["webhooks received"],
    path=WebhookProviderPath,
    responses={202: Received, 200: Received},
    errors=(400, 401, 404, 413, 422),
)
@csrf_exempt
def receive(name: str):
    """Verify, de-duplicate and record a delivery; answer at once and publish after."""
    provider = _provider(name)
    body = read_body(BODY_LIMIT)  # enforced while reading, chunked bodies included
    try:
        signed_id = VERIFIERS[provider.scheme](body, request.headers, provider.secrets)
    except SignatureRejected as refusal:
        raise unauthorized(f"Webhook signature rejected: {refusal}.") from None
    try:
        payload = parse_json(body)
    except StrictJSONError as error:
        raise bad_request(f"The verified body is not plain JSON: {error}.") from None
    delivery_id, kind = _identify(provider, signed_id, payload)
    store = _store()
    user_id = user_at_path(payload, provider.user_path)
    # GitHub signs the body alone: a captured body under a fresh X-GitHub-Delivery is the same delivery.
    also_known_as = ("body:" + hashlib.sha256(body).hexdigest(),) if provider.scheme == "github" else ()
    if not store.record(provider.name, delivery_id, kind, payload, user_id, also_known_as):
        return jsonify({"id": delivery_id, "duplicate": True}), 200
    store.publish_soon(provider.name, delivery_id)
    return jsonify({"id": delivery_id, "status": "accepted"}), 202


def _identify(provider: WebhookProvider, signed_id: str | None, payload) -> tuple[str, str]:
    """The delivery id (for de-duplication) and the event type, per scheme."""
    if provider.scheme == "github":
        delivery_id, kind = signed_id, request.headers["X-GitHub-Event"]
    else:
        if not isinstance(payload, dict) or not isinstance(payload.get("type"), str):
            raise bad_request("The payload has no 'type'.")
        kind = payload["type"]
        delivery_id = signed_id if provider.scheme == "standard" else payload.get("id")
        if not isinstance(delivery_id, str) or not delivery_id:
            raise bad_request("The payload has no event 'id'.")
    if len(delivery_id) > ID_LIMIT or len(kind) > ID_LIMIT:
        raise validation_failed("The delivery id or type is too long.")
    return plain_text(delivery_id, "The delivery id"), plain_text(kind, "The event type")


@bp.get("/<name>/deliveries")
@operation(
    "A provider's recent deliveries (admins)",
    tags=["webhooks received"],
    path=WebhookProviderPath,
    query=Recent,
    responses={200: Deliveries},
    auth=("bearer", "cookie"),
)
@login_required
def deliveries(name: str):
    """Admins: a provider's recent deliveries."""
    provider = _provider(name)
    if not current_caller().is_admin:
        raise forbidden("Only administrators may list webhook deliveries.")
    rows = _store().recent(provider.name, validated_query(Recent).limit)
    for row in rows:
        row["received_at"] = rfc3339(row["received_at"])
    return jsonify({"deliveries": rows})
