"""Hypothesis strategies for hostile input, and the bounded settings the suite runs them with.

Deterministic (derandomized) and without an example database, so a CI run is repeatable and writes
nothing; HYPOTHESIS_EXAMPLES raises the example count for a longer local run.
"""

from __future__ import annotations

import json
import os

from hypothesis import HealthCheck, settings
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
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | hostile_text
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(hostile_text, inner, max_size=4),
    max_leaves=12,
)


def as_json_text(value) -> str:
    """JSON text as a careless client writes it: NaN and Infinity as bare words, surrogates escaped."""
    return json.dumps(value, allow_nan=True)


def deep(depth: int, opening: str = "[") -> str:
    closing = {"[": "]", "{": "}"}[opening]
    if opening == "{":
        return '{"a":' * depth + "1" + closing * depth
    return opening * depth + closing * depth


def bodies(fields: list[str]):
    """Request bodies: objects with the endpoint's own fields holding anything, any JSON, deep
    nesting, and bytes that are not JSON at all."""
    objects = st.fixed_dictionaries({}, optional={name: json_values for name in fields}).map(as_json_text)
    nested = st.builds(deep, st.integers(1, 3000), st.sampled_from("[{"))
    return objects | json_values.map(as_json_text) | nested | st.binary(max_size=200)
