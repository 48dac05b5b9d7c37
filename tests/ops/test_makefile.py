"""`make run` installs what serving needs; the test, lint and benchmark targets add the dev tools."""

from __future__ import annotations

import subprocess

import pytest

from tests.servers import ROOT


def planned(target: str, venv) -> str:
    """What `make` would run for `target` on a fresh virtualenv (a dry run: nothing is installed)."""
    result = subprocess.run(
        ["make", "-n", target, f"VENV={venv}"], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
    )
    return result.stdout


def test_make_run_installs_only_the_runtime_requirements(tmp_path):
    plan = planned("run", tmp_path / "venv")
    assert "pip install -q -r requirements.txt" in plan
    assert "requirements-dev.txt" not in plan and "requirements-bench.txt" not in plan


@pytest.mark.parametrize("target", ["test", "lint", "bench"])
def test_tool_targets_install_the_dev_requirements(tmp_path, target):
    plan = planned(target, tmp_path / "venv")
    assert "pip install -q -r requirements-dev.txt" in plan
