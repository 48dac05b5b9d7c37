"""Liveness, readiness and metrics for load balancers, orchestrators and Prometheus."""

from __future__ import annotations

import logging

import redis
from flask import Blueprint, Response, current_app, jsonify, request

from .errors import error_response, not_found
from .metrics import render as render_metrics
from .metrics import scrape_allowed
from .openapi import operation
from .redis import Outage, get_redis
from .schemas import Answer

bp = Blueprint("ops", __name__)
log = logging.getLogger(__name__)


class Status(Answer):
    """How the process is."""

    status: str


@bp.get("/healthz")
@operation("Liveness: 200 while the process runs", tags=["operations"], responses={200: Status})
def healthz():
    """200 while the process runs."""
    return jsonify({"status": "ok"})


@bp.get("/metrics")
@operation(
    "Prometheus metrics of every worker (to METRICS_ALLOW_IPS, or with the METRICS_TOKEN bearer)",
    tags=["operations"],
    responses={200: ("text/plain", "Metrics")},
    errors=(404,),
)
def metrics():
    """Prometheus metrics, summed over every worker; 404 to anyone the access rule does not name."""
    if not scrape_allowed(request.remote_addr, request.headers.get("Authorization")):
        raise not_found()
    body, content_type = render_metrics(current_app.config["SETTINGS"].prometheus_multiproc_dir)
    return Response(body, content_type=content_type)


@bp.get("/readyz")
@operation("Readiness: 200 when Redis answers", tags=["operations"], responses={200: Status})
def readyz():
    """200 when Redis answers, else 503 (and the log says where it was looked for, once an outage)."""
    outage = _readiness_outage()
    try:
        get_redis().ping()
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as error:
        outage.failed(error)
        return error_response(503, "unavailable", "Redis is not reachable.", {"Retry-After": "1"})
    outage.succeeded()
    return jsonify({"status": "ready"})


def _readiness_outage() -> Outage:
    """This app's record of Redis failing its readiness checks (a probe every few seconds tells it once)."""
    extensions = current_app.extensions
    if "readiness_outage" not in extensions:
        extensions["readiness_outage"] = Outage(log, "readyz", current_app.config["SETTINGS"].redis_url)
    return extensions["readiness_outage"]
