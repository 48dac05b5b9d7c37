"""The base models for what requests carry and answers hold, and the field types features share.

A view validates its body with a `Body` model (app/http.py, `validated`), and /openapi.json is built
from the same models (app/openapi.py), so the document and the checks cannot drift apart. Rules that
depend on settings stay in the service layer; static ones (types, lengths, patterns) live here.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic_core import PydanticCustomError

from .http import has_control_characters

# No C0 or C1 control character (what has_control_characters refuses), in a form every JSON Schema
# regex engine reads the same way.
PLAIN_TEXT_PATTERN = r"^[^\u0000-\u001f\u007f-\u009f]*$"


# Models are built on first use (defer_build), not when imported: a process validates the few bodies its
# requests carry, and only /openapi.json needs every model; building all of them cost each process ~100 ms.


class Body(BaseModel):
    """A request body or query: strict JSON types (no "1" for 1), unknown fields ignored."""

    model_config = ConfigDict(strict=True, extra="ignore", hide_input_in_errors=True, frozen=True, defer_build=True)


class Answer(BaseModel):
    """What a view answers: documented in /openapi.json (views build the JSON themselves)."""

    model_config = ConfigDict(extra="allow", defer_build=True)


def _plain(value: str) -> str:
    if has_control_characters(value):
        raise PydanticCustomError("control_characters", "must not contain control characters")
    return value


# Text the service stores or echoes: control characters are refused with 422.
PlainText = Annotated[str, AfterValidator(_plain), Field(json_schema_extra={"pattern": PLAIN_TEXT_PATTERN})]

# A provider's name, as the settings accept it (another shape is 404).
ProviderName = Annotated[str, Field(pattern=r"^[a-z0-9_-]{1,40}$")]


# Any JSON value (event data): the strict parser has already refused NaN, Infinity and lone surrogates.
JsonValue = Annotated[Any, Field(description="Any JSON value.")]


class ErrorDetail(Answer):
    """What went wrong: a stable code for programs and a message for people."""

    code: str = Field(pattern=r"^[a-z][a-z0-9_]*$", examples=["bad_request"])
    message: str


class ErrorAnswer(Answer):
    """Every error the service answers has this shape."""

    error: ErrorDetail
