"""The app's URL rules: werkzeug's, with each URL builder compiled by the first `url_for` that needs it."""

from __future__ import annotations

from werkzeug.routing import Rule


class Route(Rule):
    """A werkzeug rule that compiles its URL builders on first use instead of when it is added.

    werkzeug generates and compiles two builder functions per rule at startup (tens of milliseconds for
    this app's routes, in every process), and most processes build few URLs or none.
    """

    def _compile_builder(self, append_unknown: bool = True):
        def build_on_first_use(rule: Rule, /, **values):
            compiled = Rule._compile_builder(rule, append_unknown).__get__(rule, None)
            setattr(rule, "_build_unknown" if append_unknown else "_build", compiled)  # later calls go straight there
            return compiled(**values)

        return build_on_first_use
