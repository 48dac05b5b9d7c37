"""Liveness and readiness for load balancers and orchestrators."""

from __future__ import annotations

import redis
from flask import Blueprint, jsonify

from .errors import error_response
from .redis import get_redis

bp = Blueprint("ops", __name__)


@bp.get("/healthz")
def healthz():
    return jsonify({"status": "ok"})


@bp.get("/readyz")
def readyz():
    try:
        get_redis().ping()
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
        return error_response(503, "unavailable", "Redis is not reachable.", {"Retry-After": "1"})
    return jsonify({"status": "ready"})
