"""Liveness, readiness and metrics for load balancers, orchestrators and Prometheus."""

from __future__ import annotations

import redis
from flask import Blueprint, Response, current_app, jsonify, request

from .errors import error_response, not_found
from .metrics import render as render_metrics
from .metrics import scrape_allowed
from .openapi import operation
from .redis import get_redis
from .schemas import Answer

bp = Blueprint("ops", __name__)


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
    """200 when Redis answers, else 503."""
    try:
        get_redis().ping()
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
        return error_response(503, "unavailable", "Redis is not reachable.", {"Retry-After": "1"})
    return jsonify({"status": "ready"})
