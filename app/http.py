"""Reading JSON strictly: one place that turns bad input into a clear 4xx."""

from __future__ import annotations

import ipaddress
import json
import re
import unicodedata
from datetime import UTC, datetime
from typing import TYPE_CHECKING, TypeVar

from flask import current_app, g, request
from pydantic import ValidationError

from .errors import ApiError, bad_request, validation_failed

if TYPE_CHECKING:
    from pydantic import BaseModel
    from werkzeug.datastructures import MultiDict

    Model = TypeVar("Model", bound=BaseModel)

MAX_JSON_DEPTH = 32
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


class StrictJSONError(ValueError):
    """Text that is not plain RFC 8259 JSON: malformed, NaN/Infinity, a lone surrogate or too deep."""


def _refuse_constant(name: str):
    raise StrictJSONError(f"{name} is not JSON")


def parse_json(raw: bytes | str):
    """Plain JSON values only: no NaN or Infinity, no lone UTF-16 surrogate, at most 32 levels deep.

    The depth is checked on the text before parsing, so hostile nesting never reaches the recursive
    parser (which would raise RecursionError far below the limit we answer 400 for).
    """
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes | bytearray) else raw
    except UnicodeDecodeError:
        raise StrictJSONError("not UTF-8") from None
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH and _nesting_depth(text) > MAX_JSON_DEPTH:
        raise StrictJSONError(f"nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as error:
        raise StrictJSONError(str(error)) from None
    if _LONE_SURROGATE.search(text) is None and "\\u" not in text:
        return value  # neither a raw nor an escaped surrogate can be in it: skip the walk
    if _holds_lone_surrogate(value):
        raise StrictJSONError("a lone UTF-16 surrogate is not a character")
    return value


def _nesting_depth(text: str) -> int:
    """The deepest bracket nesting outside strings (what the parser would recurse into)."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def _holds_lone_surrogate(value) -> bool:
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            if _LONE_SURROGATE.search(item):
                return True
        elif isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return False


def has_control_characters(text: str) -> bool:
    """True for C0/C1 control characters (NUL, ESC, DEL ...): never stored or echoed."""
    return any(unicodedata.category(char) == "Cc" for char in text)


def plain_text(value: str, what: str) -> str:
    """A text the service stores or echoes: 422 when it holds control characters."""
    if has_control_characters(value):
        raise validation_failed(f"{what} must not contain control characters.")
    return value


def json_body(optional: bool = False) -> dict:
    """The request body as a JSON object; 415 if it is not JSON, 400 if it is malformed."""
    if optional and not request.content_length and not request.mimetype:
        return {}
    if request.mimetype != "application/json":
        raise ApiError(415, "unsupported_media_type", "The body must be JSON (Content-Type: application/json).")
    if "json_body" in g:  # parsed once per request (the rate limiter's key reads it too)
        return g.json_body
    raw = read_body(current_app.config["MAX_CONTENT_LENGTH"])
    if optional and not raw:
        return {}
    try:
        body = parse_json(raw)
    except StrictJSONError as error:
        raise bad_request(f"The body is not valid JSON: {error}.") from None
    if not isinstance(body, dict):
        raise bad_request("The body must be a JSON object.")
    g.json_body = body
    return body


def read_body(limit: int) -> bytes:
    """The raw body, refused with 413 above `limit` bytes, also when it arrives chunked.

    Werkzeug refuses a larger Content-Length at once but stops reading a chunked body at the limit
    without saying so; reading one byte past the limit tells "too large" from "fits".
    """
    request.max_content_length = limit + 1
    raw = request.get_data(cache=True)
    if len(raw) > limit:
        raise ApiError(413, "payload_too_large", f"The body is larger than {limit} bytes.")
    return raw


def field(body: dict, name: str, kind: type = str, required: bool = True, default=None):
    """One field of a JSON object, of the given type; 400 when missing or of another type."""
    if name not in body or body[name] is None:
        if required:
            raise bad_request(f"Field '{name}' is required.")
        return default
    value = body[name]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise bad_request(f"Field '{name}' must be of type {kind.__name__}.")
    return value


def rfc3339(epoch: float | str | None, timespec: str = "seconds") -> str | None:
    """An epoch time as an RFC 3339 UTC string (`timespec` as `datetime.isoformat` takes it)."""
    if epoch in (None, ""):
        return None
    moment = datetime.fromtimestamp(float(epoch), tz=UTC)
    return moment.isoformat(timespec=timespec).replace("+00:00", "Z")


def number_arg(name: str, default: float, minimum: float, maximum: float, kind=float):
    """A number from the query string, within bounds; 400 otherwise."""
    raw = request.args.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = kind(raw)
    except ValueError:
        raise bad_request(f"Query parameter '{name}' must be a number.") from None
    if not minimum <= value <= maximum:
        raise bad_request(f"Query parameter '{name}' must be between {minimum} and {maximum}.")
    return value


# Pydantic error types that mean "not there" or "not that JSON type": 400. Any other is a value the
# service understood and refuses: 422 (docs/api.md, Conventions).
_STRUCTURAL = {"missing", "model_type", "model_attributes_type", "dict_type", "list_type", "is_instance_of"}


def validated(model: type[Model], optional: bool = False) -> Model:
    """The JSON body checked against a request model (see app/schemas.py); 400 or 422 naming the field."""
    return _validate(model, json_body(optional=optional))


def validated_query(model: type[Model]) -> Model:
    """The query string checked against a model (text converted to numbers where a field wants one).

    A parameter given twice is refused: which of the two was meant is anyone's guess.
    """
    return validated_args(model, request.args)


def validated_args(model: type[Model], args: MultiDict) -> Model:
    """`validated_query` of parsed query arguments."""
    values = {}
    for name in model.model_fields:
        given = args.getlist(name)
        if len(given) > 1:
            raise bad_request(f"Query parameter '{name}' must be given once.")
        if given:
            values[name] = given[0]
    return _validate(model, values, where="Query parameter", strict=False)


def validated_form(model: type[Model]) -> Model:
    """An `application/x-www-form-urlencoded` body checked against a model; 415 for any other type."""
    if request.mimetype != "application/x-www-form-urlencoded":
        raise ApiError(415, "unsupported_media_type", "The body must be a form (application/x-www-form-urlencoded).")
    read_body(current_app.config["MAX_CONTENT_LENGTH"])
    values = {}
    for name in model.model_fields:  # a field given twice is refused, as a query parameter is
        given = request.form.getlist(name)
        if len(given) > 1:
            raise bad_request(f"Form field '{name}' must be given once.")
        if given:
            values[name] = given[0]
    return _validate(model, values, where="Form field")


def _validate(model: type[Model], value: dict, where: str = "Field", strict: bool = True) -> Model:
    try:
        return model.model_validate(value, strict=strict)
    except ValidationError as error:
        refusal = _refusal(error.errors(include_url=False)[0], where)
        if not strict:  # a bad query parameter is always 400
            refusal.status, refusal.code = 400, "bad_request"
        raise refusal from None


def _refusal(error: dict, where: str) -> ApiError:
    """One pydantic error as the service's own 400 or 422; never echoes the input."""
    name = ".".join(str(part) for part in error["loc"]) or "body"
    kind = error["type"]
    if kind == "missing":
        return bad_request(f"{where} '{name}' is required.")
    if kind == "literal_error" and not isinstance(error["input"], str):  # every choice is a string
        return bad_request(f"{where} '{name}' must be of type string.")
    if kind in _STRUCTURAL or kind.endswith("_type"):
        expected = kind.removesuffix("_type").replace("model", "object").replace("dict", "object")
        return bad_request(f"{where} '{name}' must be of type {expected}.")
    message = error["msg"].removeprefix("Value error, ")
    return validation_failed(f"{where} '{name}': {message[:1].lower()}{message[1:]}.")


def ip_address(text: str | None) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """A client address as the rules judge it: without an IPv6 zone (fe80::1%eth0), an IPv4-mapped IPv6
    address as the IPv4 address it maps; None when it is no address."""
    try:
        address = ipaddress.ip_address((text or "").split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address
