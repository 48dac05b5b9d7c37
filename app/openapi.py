"""The OpenAPI 3.1 document, built from the routes and the models the views validate with.

Each view declares its operation with `@operation(...)`: the models of its body, query and path, what
it answers and who may call it. The document is assembled from those declarations and Flask's URL map,
so a route, a field or a constraint cannot change without the document changing with it; a test fails
for any route that declares nothing.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus

from flask import Flask
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from .schemas import ErrorAnswer

VERSION = "1.0.0"
REF_TEMPLATE = "#/components/schemas/{model}"

# Who may call: the names views use, and the security schemes they stand for.
SECURITY_SCHEMES = {
    "bearer": (
        "accessToken",
        {"type": "http", "scheme": "bearer", "bearerFormat": "JWT", "description": "An access token."},
    ),
    "cookie": (
        "accessCookie",
        {"type": "apiKey", "in": "cookie", "name": "__Host-access", "description": "The browser's access cookie."},
    ),
    "api_key": (
        "apiKey",
        {"type": "http", "scheme": "bearer", "bearerFormat": "ak_...", "description": "An API key for backends."},
    ),
}

# A response that is not JSON: its media type and what it is.
Media = tuple[str, str]
Response = type[BaseModel] | Media | None


@dataclass(frozen=True)
class Operation:
    """What one view declares about itself."""

    summary: str
    tags: tuple[str, ...]
    responses: Mapping[int, Response]
    body: type[BaseModel] | None = None
    body_required: bool = True
    form: type[BaseModel] | None = None
    query: type[BaseModel] | None = None
    path: type[BaseModel] | None = None
    errors: tuple[int, ...] = ()
    auth: tuple[str, ...] = ()
    headers: Mapping[int, Mapping[str, str]] = field(default_factory=dict)
    error_answer: type[BaseModel] | None = None


def operation(
    summary: str,
    *,
    tags: Iterable[str],
    responses: Mapping[int, Response],
    body: type[BaseModel] | None = None,
    body_required: bool = True,
    form: type[BaseModel] | None = None,
    query: type[BaseModel] | None = None,
    path: type[BaseModel] | None = None,
    errors: Iterable[int] = (),
    auth: Iterable[str] = (),
    headers: Mapping[int, Mapping[str, str]] | None = None,
    error_answer: type[BaseModel] | None = None,
) -> Callable:
    """Declare a view's operation for /openapi.json (see app/schemas.py for the models).

    `error_answer`: the shape of its errors when it is not ErrorAnswer's (the OAuth token endpoint answers
    RFC 6749's); its error statuses are then exactly `errors` (and 503).
    """
    declared = Operation(
        summary, tuple(tags), dict(responses), body, body_required, form, query, path,
        tuple(errors), tuple(auth), headers or {}, error_answer,
    )  # fmt: skip
    unknown = set(declared.auth) - set(SECURITY_SCHEMES)
    if unknown:
        raise ValueError(f"unknown auth names {sorted(unknown)}")

    def declare(view: Callable) -> Callable:
        view.openapi_operation = declared
        return view

    return declare


def undocumented(view: Callable) -> Callable:
    """Mark a route that is deliberately not in the document (e.g. the WebSocket upgrade)."""
    view.openapi_operation = None
    return view


def declared_operation(view: Callable) -> Operation | None | bool:
    """The view's declaration, None if it is deliberately undocumented, False if it declares nothing."""
    while view is not None:
        if hasattr(view, "openapi_operation"):
            return view.openapi_operation
        view = getattr(view, "__wrapped__", None)
    return False


def undeclared_routes(app: Flask) -> list[str]:
    """Routes whose views declare nothing: each is a gap in the document."""
    return sorted(
        f"{sorted(rule.methods - {'HEAD', 'OPTIONS'})} {rule.rule}"
        for rule in app.url_map.iter_rules()
        if rule.endpoint != "static" and declared_operation(app.view_functions[rule.endpoint]) is False
    )


def build_document(app: Flask) -> dict:
    """The whole OpenAPI 3.1 document for this app."""
    operations = []
    for rule in sorted(app.url_map.iter_rules(), key=lambda rule: rule.rule):
        declared = declared_operation(app.view_functions[rule.endpoint]) if rule.endpoint != "static" else None
        if declared:
            for method in sorted(rule.methods - {"HEAD", "OPTIONS"}):
                operations.append((rule, method.lower(), declared))

    models = _models(declared for *_, declared in operations)
    refs, definitions = models_json_schema(models, ref_template=REF_TEMPLATE)
    operation_ids = _operation_ids([(rule, method) for rule, method, _ in operations])
    paths: dict[str, dict] = {}
    for (rule, method, declared), operation_id in zip(operations, operation_ids, strict=True):
        described = {"operationId": operation_id, **_operation(declared, method, rule, refs)}
        paths.setdefault(_openapi_path(rule.rule), {})[method] = described

    used_schemes = {name for *_, declared in operations for name in declared.auth}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "auth-rt",
            "version": VERSION,
            "description": "Token authentication and real-time delivery. Errors share one shape: ErrorAnswer.",
        },
        "paths": paths,
        "components": {
            "schemas": definitions.get("$defs", {}),
            "securitySchemes": dict(SECURITY_SCHEMES[name] for name in sorted(used_schemes)),
        },
    }


def _openapi_path(rule: str) -> str:
    """`/auth/sessions/<session_id>` as `/auth/sessions/{session_id}`."""
    return re.sub(r"<(?:[^:<>]+:)?([^<>]+)>", r"{\1}", rule)


def _operation_ids(operations: list[tuple]) -> list[str]:
    """Each operation's id: its view's endpoint, with the method and path added when the view has several.

    A view may answer at several paths (the page) or methods, and an operationId must be unique in the
    whole document, so the endpoint alone names only a view with one operation.
    """
    per_endpoint = Counter(rule.endpoint for rule, _ in operations)
    ids = [
        rule.endpoint if per_endpoint[rule.endpoint] == 1 else _qualified_id(rule, method)
        for rule, method in operations
    ]
    repeated = sorted(name for name, count in Counter(ids).items() if count > 1)
    if repeated:
        raise ValueError(f"operationIds used more than once: {repeated}")
    return ids


def _qualified_id(rule, method: str) -> str:
    """`page.index.get_verify_email` for `GET /verify-email` of the view `page.index`."""
    return "_".join([f"{rule.endpoint}.{method}", *re.findall(r"[A-Za-z0-9]+", _openapi_path(rule.rule))])


def _models(declarations: Iterable[Operation]) -> list[tuple[type[BaseModel], str]]:
    wanted = {(ErrorAnswer, "serialization")}
    for declared in declarations:
        for model in (declared.body, declared.form):  # parameters are inlined, not components
            if model is not None:
                wanted.add((model, "validation"))
        for answer in (*declared.responses.values(), declared.error_answer):
            if isinstance(answer, type):
                wanted.add((answer, "serialization"))
    return sorted(wanted, key=lambda pair: (pair[0].__module__, pair[0].__qualname__, pair[1]))


def _operation(declared: Operation, method: str, rule, refs: Mapping) -> dict:
    path_parameters = _parameters(declared.path, "path", refs) or [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}} for name in sorted(rule.arguments)
    ]
    answer: dict = {
        "summary": declared.summary,
        "tags": list(declared.tags),
        "parameters": [*path_parameters, *_parameters(declared.query, "query", refs)],
        "responses": {},
    }
    if declared.body is not None:
        schema = refs[(declared.body, "validation")]
        content = {"application/json": {"schema": schema}}
        answer["requestBody"] = {"required": declared.body_required, "content": content}
    if declared.form is not None:
        schema = refs[(declared.form, "validation")]
        form = {"application/x-www-form-urlencoded": {"schema": schema}}
        answer["requestBody"] = {"required": True, "content": form}
    if declared.auth:
        answer["security"] = [{SECURITY_SCHEMES[name][0]: []} for name in declared.auth]
    for status, response in declared.responses.items():
        answer["responses"][str(status)] = _success(status, response, declared.headers.get(status, {}), refs)
    for status in sorted(_error_statuses(declared, method, rule)):
        shape = declared.error_answer or ErrorAnswer
        answer["responses"][str(status)] = _error(status, declared.headers.get(status, {}), refs, shape)
    if not answer["parameters"]:
        del answer["parameters"]
    return answer


def _parameters(model: type[BaseModel] | None, where: str, refs: Mapping) -> list[dict]:
    if model is None:
        return []
    schema = model.model_json_schema(ref_template=REF_TEMPLATE)
    required = set(schema.get("required", ()))
    return [
        {
            "name": name,
            "in": where,
            "required": where == "path" or name in required,
            "schema": {key: value for key, value in prop.items() if key not in ("title", "description")},
            **({"description": prop["description"]} if "description" in prop else {}),
        }
        for name, prop in schema.get("properties", {}).items()
    ]


def _error_statuses(declared: Operation, method: str, rule) -> set[int]:
    """Errors any such operation can answer, beside the ones the view names."""
    statuses = set(declared.errors) | {503}  # Redis unreachable
    if declared.error_answer is not None:
        return statuses
    if declared.body is not None or declared.form is not None:
        statuses |= {400, 413, 415, 422}
    if declared.query is not None:
        statuses |= {400, 414}
    if declared.path is not None or "<" in rule.rule:
        statuses.add(404)
    if declared.auth:
        statuses |= {401, 403}  # a key without the scope or on a user's endpoint; a cross-site request
    return statuses


def _success(status: int, response: Response, headers: Mapping[str, str], refs: Mapping) -> dict:
    described = {"description": HTTPStatus(status).phrase}
    if isinstance(response, tuple):
        media, what = response
        described = {"description": what, "content": {media: {"schema": {"type": "string"}}}}
    elif response is not None:
        described["content"] = {"application/json": {"schema": refs[(response, "serialization")]}}
    if headers:
        described["headers"] = _headers(headers)
    return described


# Refused by gunicorn before the service sees the request: a request line over 8190 bytes.
URI_TOO_LONG = {
    "description": "URI Too Long: gunicorn refuses a request line over 8190 bytes, with a page of its own",
    "content": {"text/html": {"schema": {"type": "string"}}},
}


def _error(status: int, headers: Mapping[str, str], refs: Mapping, shape: type[BaseModel] = ErrorAnswer) -> dict:
    if status == 414:
        return URI_TOO_LONG
    headers = {"Retry-After": "Seconds to wait before trying again."} if status == 429 else headers
    described = {
        "description": HTTPStatus(status).phrase,
        "content": {"application/json": {"schema": refs[(shape, "serialization")]}},
    }
    if headers:
        described["headers"] = _headers(headers)
    return described


def _headers(headers: Mapping[str, str]) -> dict:
    return {name: {"description": what, "schema": {"type": "string"}} for name, what in headers.items()}
