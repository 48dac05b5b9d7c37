"""Hypothesis strategies for hostile input, and the bounded settings the suite runs them with.

Bodies are built as JSON *text*, so that what a careless or hostile client can send (NaN, Infinity,
numbers Python cannot hold, lone surrogates, control characters, nesting thousands deep) can stand
at any place a value can. Deterministic (derandomized) and without an example database, so a CI run is
repeatable and writes nothing; HYPOTHESIS_EXAMPLES raises the example count for a longer local run.
"""

from __future__ import annotations

import json
import os

from hypothesis import HealthCheck, example, settings
from hypothesis import strategies as st

EXAMPLES = int(os.environ.get("HYPOTHESIS_EXAMPLES", "60"))

bounded = settings(
    max_examples=EXAMPLES,
    deadline=None,  # password hashing makes some examples take tens of milliseconds
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# Any character at all, lone surrogates and control characters included.
hostile_text = st.text(st.characters(codec=None, exclude_categories=()), max_size=40)


def deep(depth: int, opening: str = "[") -> str:
    if opening == "{":
        return '{"a":' * depth + "1" + "}" * depth
    return "[" * depth + "]" * depth


HOSTILE_FRAGMENTS = [
    "NaN",
    "Infinity",
    "-Infinity",
    "1e400",  # overflows to infinity when parsed
    "1" * 5000,  # past Python's digit limit for int()
    '"\\ud800"',
    '"x\\udfff"',
    '"\\u0000"',
    '"\\u001b[31m"',
    '"a\\nb"',
    '"' + "x" * 5000 + '"',
    "18446744073709551616",
    deep(33),
    deep(5000),
    deep(5000, "{"),
]
depths = st.sampled_from([32, 33, 100, 1000, 5000]) | st.integers(1, 64)
hostile_fragments = st.sampled_from(HOSTILE_FRAGMENTS) | st.builds(deep, depths, st.sampled_from("[{"))


def _text_of(value) -> str:
    return json.dumps(value, allow_nan=True)  # lone surrogates come out escaped, as a client sends them


scalar_texts = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True) | hostile_text
).map(_text_of)


def _object_text(members: list[tuple[str, str]]) -> str:
    return "{" + ",".join(f"{_text_of(key)}:{value}" for key, value in members) + "}"


value_texts = st.recursive(
    scalar_texts | hostile_fragments,
    lambda inner: (
        st.lists(inner, max_size=4).map(lambda items: "[" + ",".join(items) + "]")
        | st.lists(st.tuples(hostile_text, inner), max_size=4).map(_object_text)
    ),
    max_leaves=10,
)


def objects_with(fields: list[str]):
    """JSON object text whose members are (some of) `fields`, each holding any value text."""
    members = st.lists(st.tuples(st.sampled_from(fields), value_texts), min_size=1, max_size=len(fields) + 1)
    return members.map(_object_text)


def hostile_objects(fields: list[str], template: dict | None = None) -> list[str]:
    """One object per field and hostile fragment (the rest of `template` kept): cases every run covers."""
    template = template or {}
    return [
        _object_text(
            [
                (name, fragment if name == field else _text_of(value))
                for name, value in {**template, field: None}.items()
            ]
        )
        for field in fields
        for fragment in HOSTILE_FRAGMENTS
    ]


def with_examples(check, name: str, values: list, **fixed):
    """`check` with an explicit Hypothesis example for each value of its argument `name`."""
    for value in values:
        check = example(**{name: value}, **fixed)(check)
    return check


def bodies(fields: list[str]):
    """Request bodies: objects with the endpoint's own fields holding anything, any JSON value text,
    and bytes that are not JSON at all."""
    return objects_with(fields) | value_texts | st.binary(max_size=200)
