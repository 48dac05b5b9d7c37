"""The pinned requirements are closed: `make run` installs everything the app imports, nothing floats."""

from __future__ import annotations

import ast
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]


def pins(name: str) -> dict[str, str]:
    """`name==version` lines of a requirements file and the files it includes (-r), by canonical name."""
    found = {}
    for line in (ROOT / name).read_text().splitlines():
        line = line.split("#")[0].strip()
        if line.startswith("-r "):
            found.update(pins(line[3:].strip()))
        elif line and not line.startswith("-"):
            package, _, version = line.partition("==")
            assert version, f"{name}: {line} is not pinned with =="
            found[canonicalize_name(package)] = version
    return found


def unpinned_dependencies(pinned: dict[str, str]) -> list[str]:
    missing = []
    for package in pinned:
        for requirement in metadata.requires(package) or []:
            needed = Requirement(requirement)
            if needed.marker is not None and not needed.marker.evaluate({"extra": ""}):
                continue
            if canonicalize_name(needed.name) not in pinned:
                missing.append(f"{package} needs {needed.name}")
    return sorted(missing)


def test_runtime_pins_include_everything_they_need():
    assert unpinned_dependencies(pins("requirements.txt")) == []


def test_test_pins_include_everything_they_need():
    pinned = pins("requirements-dev.txt")
    pinned[canonicalize_name("auth-rt-client")] = "local"  # installed from ./clients/python
    assert unpinned_dependencies(pinned) == []


def test_the_installed_versions_are_the_pinned_ones():
    pinned = pins("requirements-dev.txt")
    wrong = {name: (version, metadata.version(name)) for name, version in pinned.items()}
    assert {name: pair for name, pair in wrong.items() if pair[0] != pair[1]} == {}


def test_everything_the_app_imports_is_a_runtime_pin():
    runtime = pins("requirements.txt")
    owners = metadata.packages_distributions()
    imported = set()
    for path in (ROOT / "app").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
    own = {"app"} | {path.stem for path in ROOT.glob("*.py")}  # the package and the modules beside it
    third_party = {name for name in imported if name not in sys.stdlib_module_names and name not in own}
    assert third_party, "the walk found no imports"
    unpinned = {
        name: owners.get(name)
        for name in third_party
        if not any(canonicalize_name(owner) in runtime for owner in owners.get(name, []))
    }
    assert unpinned == {}
