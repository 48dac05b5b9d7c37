"""The one JSON error shape (docs/api.md, Errors), and the handlers that make every failure use it."""

from __future__ import annotations

import logging

import redis
from flask import Flask, current_app, g, jsonify
from werkzeug.exceptions import HTTPException

from .redis import Failures

log = logging.getLogger(__name__)

# Redis (or part of a Redis Cluster) cannot serve the request now: 503, retry shortly. On a cluster a
# failover answers CLUSTERDOWN / TRYAGAIN for a moment, and a slot may be uncovered until it ends.
REDIS_UNAVAILABLE = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.ClusterError,  # CLUSTERDOWN, MASTERDOWN, too many redirections
    redis.exceptions.TryAgainError,
    redis.exceptions.ReadOnlyError,  # a primary just turned replica (failover): its slots are served elsewhere
    redis.exceptions.AskError,  # MOVED or ASK still after redis-py's own retries
    redis.exceptions.RedisClusterException,  # no node reachable, slot not covered
)

# Werkzeug's own exceptions (routing, size limits) mapped to our error codes.
_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    415: "unsupported_media_type",
    429: "rate_limited",
}


class ApiError(Exception):
    """An error answered to the client as `{"error": {"code", "message"}}`."""

    def __init__(self, status: int, code: str, message: str, headers: dict | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or {}


def bad_request(message: str) -> ApiError:
    """400: input the service cannot parse."""
    return ApiError(400, "bad_request", message)


def validation_failed(message: str) -> ApiError:
    """422: well-formed input whose value is not acceptable."""
    return ApiError(422, "validation_failed", message)


def unauthorized(message: str = "Authentication required.", code: str = "unauthorized") -> ApiError:
    """401: no, or no longer valid, credentials."""
    return ApiError(401, code, message)


def forbidden(message: str = "Not allowed.", code: str = "forbidden") -> ApiError:
    """403: authenticated but not allowed, or refused as cross-site."""
    return ApiError(403, code, message)


def not_found(message: str = "Not found.") -> ApiError:
    """404: no such resource (or not the caller's)."""
    return ApiError(404, "not_found", message)


def error_response(status: int, code: str, message: str, headers: dict | None = None):
    """A JSON error answer in the one error shape."""
    response = jsonify({"error": {"code": code, "message": message}})
    response.status_code = status
    response.headers.update(headers or {})
    if status == 401:
        response.headers.setdefault("WWW-Authenticate", 'Bearer realm="api"')
    return response


def init_app(app: Flask) -> None:
    """Answer every failure, expected or not, in the error shape (503 while Redis is away)."""

    @app.errorhandler(ApiError)
    def handle_api_error(error: ApiError):
        g.answered_retry_after = (error.headers or {}).get("Retry-After")  # kept as given (app/limits.py)
        return error_response(error.status, error.code, error.message, error.headers)

    @app.errorhandler(HTTPException)
    def handle_http_exception(error: HTTPException):
        status = error.code or 500
        code = _HTTP_CODES.get(status, "error")
        headers = {}
        if status == 429:
            retry_after = getattr(getattr(error, "limit", None), "limit", None)
            seconds = int(retry_after.get_expiry()) if retry_after is not None else 60
            headers["Retry-After"] = str(seconds)
            message = "Too many requests; retry later."
        elif status == 405:
            message = "Method not allowed."
            headers["Allow"] = ", ".join(getattr(error, "valid_methods", None) or [])  # which ones are
        elif status == 413:
            message = "Request body is too large."
        else:
            message = error.description or error.name
        return error_response(status, code, message, headers)

    @app.errorhandler(redis.exceptions.ConnectionError)
    @app.errorhandler(redis.exceptions.TimeoutError)
    @app.errorhandler(redis.exceptions.ClusterError)
    @app.errorhandler(redis.exceptions.TryAgainError)
    @app.errorhandler(redis.exceptions.ReadOnlyError)
    @app.errorhandler(redis.exceptions.AskError)
    @app.errorhandler(redis.exceptions.RedisClusterException)
    def handle_redis_down(error: Exception):
        _failed_requests().failed("request answered 503", error)
        return error_response(503, "unavailable", "A dependency is unavailable; retry shortly.", {"Retry-After": "1"})

    @app.errorhandler(Exception)
    def handle_unexpected(error: Exception):
        log.exception("unhandled error")
        return error_response(500, "internal_error", "Internal server error.")


def _failed_requests() -> Failures:
    """This app's (this worker's) record of requests Redis failed: one line a minute however many there are."""
    extensions = current_app.extensions
    if "failed_requests" not in extensions:
        extensions["failed_requests"] = Failures(log, current_app.config["SETTINGS"].redis_url)
    return extensions["failed_requests"]
