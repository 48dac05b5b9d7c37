"""`/admin/webhook-endpoints`: endpoints, their secrets and messages (docs/api.md, Webhooks sent)."""

from __future__ import annotations

from datetime import datetime

import gevent
from flask import Blueprint, current_app, jsonify, render_template

from .. import audit
from ..auth.guards import current_api_key, current_caller, login_required, user_or_api_key
from ..errors import ApiError, bad_request, forbidden, not_found, validation_failed
from ..events.cursor import decode_positions
from ..http import validated, validated_query
from ..openapi import operation
from .replay import replay_events
from .schemas import (
    Accepted,
    CreatedEndpoint,
    CreateEndpoint,
    Endpoint,
    EndpointPath,
    Endpoints,
    MessagePath,
    Messages,
    MessagesQuery,
    NewSecret,
    Replay,
    UpdateEndpoint,
)
from .ssrf import TargetRefused, check_url
from .store import OutgoingStore, public_endpoint

bp = Blueprint("outgoing", __name__, url_prefix="/admin/webhook-endpoints")
page_bp = Blueprint("outgoing_page", __name__)

SCOPE = "webhooks:manage"
MANAGERS = ("bearer", "cookie", "api_key")
RESOLVE_TIMEOUT = 5.0
PAGE_MESSAGES = 10


def _store() -> OutgoingStore:
    return current_app.extensions["outgoing_store"]


@bp.before_request
@user_or_api_key(SCOPE)
def managers_only():
    """Administrators, and API keys with scope webhooks:manage."""
    if current_api_key() is None and not current_caller().is_admin:
        raise forbidden("Only administrators (or API keys with scope webhooks:manage) may manage webhook endpoints.")


def _checked_url(url: str) -> str:
    """422 unless the URL is one outgoing webhooks may be sent to (checked on what its host resolves to now)."""
    settings = current_app.config["SETTINGS"].outgoing_webhooks
    try:
        with gevent.Timeout(RESOLVE_TIMEOUT, TargetRefused("The URL's host could not be resolved in time.")):
            check_url(url, settings.allow_http, settings.allow_private)
    except TargetRefused as refusal:
        raise validation_failed(str(refusal)) from None
    return url


def _endpoint(endpoint_id: str) -> dict:
    record = _store().endpoint_record(endpoint_id)
    if record is None:
        raise not_found("No such webhook endpoint.")
    return record


@bp.post("")
@operation(
    "Create a webhook endpoint (its secret shown this once)",
    tags=["webhooks sent"],
    body=CreateEndpoint,
    responses={201: CreatedEndpoint},
    auth=MANAGERS,
)
def create():
    """A new endpoint; every matching event published from now on is sent to it."""
    asked = validated(CreateEndpoint)
    url = _checked_url(asked.url)
    endpoint, secret = _store().create_endpoint(
        url, sorted(set(asked.channels)), _patterns(asked.events), asked.description
    )
    _record("webhook_endpoint.created", endpoint["id"], channels=endpoint["channels"], events=endpoint["events"])
    return jsonify({**endpoint, "secret": secret}), 201


def _record(entry_type: str, endpoint_id: str, **details) -> None:
    """An endpoint change's audit entry: never its URL (which may carry a credential) nor a secret."""
    audit.record(entry_type, details={"endpoint_id": endpoint_id, **details})


@bp.get("")
@operation("Every webhook endpoint", tags=["webhooks sent"], responses={200: Endpoints}, auth=MANAGERS)
def list_endpoints():
    """Every endpoint, oldest first."""
    return jsonify({"endpoints": [public_endpoint(record) for record in _store().list_endpoints()]})


@bp.get("/<id>")
@operation("One webhook endpoint", tags=["webhooks sent"], path=EndpointPath, responses={200: Endpoint}, auth=MANAGERS)
def show(id: str):
    """One endpoint."""
    return jsonify(public_endpoint(_endpoint(id)))


@bp.patch("/<id>")
@operation(
    "Change a webhook endpoint (applies at once, to queued retries too)",
    tags=["webhooks sent"],
    path=EndpointPath,
    body=UpdateEndpoint,
    responses={200: Endpoint},
    auth=MANAGERS,
)
def update(id: str):
    """Change any of url, channels, events, description, disabled."""
    _endpoint(id)
    asked = validated(UpdateEndpoint)
    changes = {}
    for name in asked.model_fields_set:
        value = getattr(asked, name)
        if value is None and name in ("url", "channels", "disabled"):
            raise bad_request(f"Field '{name}' must not be null.")
        changes[name] = value
    if "url" in changes:
        _checked_url(changes["url"])
    if "channels" in changes:
        changes["channels"] = sorted(set(changes["channels"]))
    if "events" in changes:
        changes["events"] = _patterns(changes["events"])
    record = _store().update_endpoint(id, changes)
    if record is None:
        raise not_found("No such webhook endpoint.")
    if changes:
        _record("webhook_endpoint.updated", id, changed=sorted(changes))
    return jsonify(public_endpoint(record))


@bp.delete("/<id>")
@operation(
    "Delete a webhook endpoint: nothing more is sent to it",
    tags=["webhooks sent"],
    path=EndpointPath,
    responses={204: None},
    auth=MANAGERS,
)
def delete(id: str):
    """Delete an endpoint, its queue and its scheduled retries."""
    if _store().endpoint_record(id) is None or not _store().delete_endpoint(id):
        raise not_found("No such webhook endpoint.")
    _record("webhook_endpoint.deleted", id)
    return "", 204


@bp.post("/<id>/rotate-secret")
@operation(
    "Give a webhook endpoint a new secret (the old one also signs during the overlap)",
    tags=["webhooks sent"],
    path=EndpointPath,
    responses={200: NewSecret},
    auth=MANAGERS,
)
def rotate_secret(id: str):
    """A new secret; messages carry both signatures until the old one's overlap ends."""
    _endpoint(id)
    secret = _store().rotate_secret(id)
    if secret is None:
        raise not_found("No such webhook endpoint.")
    _record("webhook_endpoint.updated", id, changed=["secret"])
    return jsonify({"secret": secret})


@bp.get("/<id>/messages")
@operation(
    "A webhook endpoint's messages and their attempts",
    tags=["webhooks sent"],
    path=EndpointPath,
    query=MessagesQuery,
    responses={200: Messages},
    auth=MANAGERS,
)
def messages(id: str):
    """Recent messages, newest first; `status=pending` lists the backlog, oldest first."""
    _endpoint(id)
    asked = validated_query(MessagesQuery)
    return jsonify({"messages": _store().messages(id, asked.status, asked.limit)})


@bp.post("/<id>/messages/<msg_id>/retry")
@operation(
    "Send one message again now (same webhook-id, fresh retry schedule)",
    tags=["webhooks sent"],
    path=MessagePath,
    responses={202: Accepted},
    errors=(409,),
    auth=MANAGERS,
)
def retry(id: str, msg_id: str):
    """Queue the message at once; its attempts follow the retry schedule again if it fails."""
    endpoint = _endpoint(id)
    record = _store().message_record(id, msg_id)
    if record is None:
        raise not_found("No such message.")
    _refuse_disabled(endpoint)
    return jsonify({"status": "accepted", "messages": _store().retry_message(id, record)}), 202


@bp.post("/<id>/replay")
@operation(
    "Send every matching event since a cursor or a time again",
    tags=["webhooks sent"],
    path=EndpointPath,
    body=Replay,
    responses={202: Accepted},
    errors=(409,),
    auth=MANAGERS,
)
def replay(id: str):
    """Every event of the kept history after the cursor (or at or after the time) that the endpoint's
    filters match: messages it already had are sent again, the others are made."""
    endpoint = _endpoint(id)
    asked = validated(Replay)
    if (asked.cursor is None) == (asked.since is None):
        raise bad_request("Give exactly one of 'cursor' and 'since'.")
    positions = decode_positions(asked.cursor) if asked.cursor is not None else None
    since_ms = _milliseconds(asked.since) if asked.since is not None else None
    _refuse_disabled(endpoint)
    queued = replay_events(_store(), current_app.extensions["redis"], endpoint, positions, since_ms)
    return jsonify({"status": "accepted", "messages": queued}), 202


def _refuse_disabled(endpoint: dict) -> None:
    if endpoint.get("disabled") == "1":
        raise ApiError(409, "conflict", "The endpoint is disabled; enable it (PATCH disabled=false) first.")


def _patterns(events: list[str] | None) -> list[str] | None:
    return sorted(set(events)) if events is not None else None


def _milliseconds(since: str) -> int:
    """An RFC 3339 time as milliseconds since the epoch; 422 when it is not one (a zone is required)."""
    try:
        moment = datetime.fromisoformat(since.replace("z", "Z"))
    except ValueError:
        raise validation_failed("Field 'since' must be an RFC 3339 time, e.g. 2026-01-01T00:00:00Z.") from None
    if moment.tzinfo is None:
        raise validation_failed("Field 'since' must name its time zone (e.g. Z for UTC).")
    return max(0, int(moment.timestamp() * 1000))


@page_bp.get("/admin/webhooks")
@operation(
    "Administrators' page: webhook endpoints and their recent messages",
    tags=["pages"],
    responses={200: ("text/html", "The page")},
    auth=("bearer", "cookie"),
)
@login_required
def admin_page():
    """A plain page (no script) listing every endpoint and its latest messages."""
    if not current_caller().is_admin:
        raise forbidden("Only administrators may see this page.")
    store = _store()
    endpoints = [
        {**public_endpoint(record), "messages": store.messages(record["id"], None, PAGE_MESSAGES)}
        for record in store.list_endpoints()
    ]
    return render_template("outgoing.html", endpoints=endpoints), 200, {"Cache-Control": "no-store"}
