"""Channel patterns: the channels an API key may publish to and those a webhook endpoint follows, by one rule.

A pattern is a channel name (what `POST /events` accepts), `<namespace>:*` for every channel of a
namespace (`user:*`: every user's channel) or `*` for every channel.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field

from ..events.bus import CHANNEL_PATTERN
from .namespaces import NAMESPACE_PATTERN

PATTERN = rf"^(\*|{NAMESPACE_PATTERN}:\*|{CHANNEL_PATTERN.pattern.strip('^$')})$"
PATTERN_LIMIT = 128
RULE = (
    "a channel name (1-128 of letters, digits and _ . : = @ -), '<namespace>:*' for every channel of a namespace "
    "(the namespace: 1-32 of a-z, 0-9, _ and -; 'user:*': every user's channel) or '*' for every channel"
)
_MATCHES = re.compile(PATTERN)
_SHOWN_LIMIT = 64  # a refused pattern is quoted back only when short and printable


def is_channel_pattern(text: str) -> bool:
    """Whether `text` is a channel name, `<namespace>:*` or `*`."""
    return isinstance(text, str) and _MATCHES.fullmatch(text) is not None


def covers(pattern: str, channel: str) -> bool:
    """Whether a channel pattern includes `channel`."""
    return pattern in ("*", channel) or (pattern.endswith(":*") and channel.startswith(pattern[:-1]))


def refusal(patterns: list[str]) -> str | None:
    """Why a list of patterns is refused, naming the first bad one by its place (1-based) and, when it is
    short and printable, by its value; None when every one is a pattern."""
    for place, text in enumerate(patterns, start=1):
        if not is_channel_pattern(text):
            shown = f" ({text!r})" if text.isascii() and text.isprintable() and len(text) <= _SHOWN_LIMIT else ""
            return f"channel {place}{shown} is not a channel pattern: give {RULE}"
    return None


def _checked(patterns: list[str]) -> list[str]:
    reason = refusal(patterns)
    if reason is not None:
        raise ValueError(reason)
    return patterns


# One item: checked with the whole list (so a refusal names it 1-based, in words); the document shows the rule.
ChannelPatternItem = Annotated[
    str, Field(json_schema_extra={"pattern": PATTERN, "maxLength": PATTERN_LIMIT, "minLength": 1})
]
# A list of channel patterns, as API keys and webhook endpoints take them.
ChannelPatterns = Annotated[list[ChannelPatternItem], AfterValidator(_checked)]
