"""The app's routes build the URLs werkzeug's own rules build, though their builders are compiled on first use."""

from __future__ import annotations

from werkzeug.routing import Map, Rule

from app.routing import Route

SAMPLES = {"IntegerConverter": 7, "PathConverter": "a b/c%d"}  # any other converter takes a string


def sample_values(rule: Rule) -> dict:
    """A value for each of the rule's variable parts, of the type its converter takes."""
    return {name: SAMPLES.get(type(rule._converters[name]).__name__, "x y/%z") for name in rule.arguments}


def werkzeug_map(routes: Map) -> Map:
    """The same rules as plain werkzeug rules, whose builders are compiled when they are added."""
    return Map(
        [
            Rule(rule.rule, endpoint=rule.endpoint, defaults=rule.defaults, websocket=rule.websocket)
            for rule in routes.iter_rules()
        ]
    )


def test_every_route_builds_the_url_werkzeug_builds(app):
    routes = app.url_map.bind("localhost")
    expected = werkzeug_map(app.url_map).bind("localhost")
    rules = list(app.url_map.iter_rules())
    assert len(rules) > 100 and all(isinstance(rule, Route) for rule in rules if rule.endpoint != "static")
    for rule in rules:
        values = sample_values(rule)
        for _ in range(2):  # the first call compiles the builder, the second uses it
            for extra in ({}, {"unknown": "1 2"}):  # an unknown value goes to the query, or nowhere
                for append_unknown in (True, False):
                    arguments = {"values": {**values, **extra}, "append_unknown": append_unknown}
                    built = routes.build(rule.endpoint, **arguments, force_external=True)
                    assert built == expected.build(rule.endpoint, **arguments, force_external=True), rule.rule
