"""What the wheel holds and what its extras are called, read from pyproject.toml: every package of the source
tree ships, and every extra a one-line error tells users to install exists. (.ci/wheel-smoke builds and
installs the real wheel and runs every command from outside the checkout.)"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from engine.sinks import SINKS, install_hint
from nanodist_tui.serve import INSTALL_HINT

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_every_package_of_the_source_tree_ships_in_the_wheel():
    listed = set(PROJECT["tool"]["setuptools"]["packages"])
    found = {".".join(init.parent.relative_to(ROOT).parts)
             for top in ("engine", "nanodist_tui") for init in (ROOT / top).rglob("__init__.py")}
    assert found - listed == set()
    assert PROJECT["tool"]["setuptools"]["package-dir"]["nanodist_tui.presets"] == "presets"


def test_extras_are_named_for_what_they_bring():
    extras = PROJECT["project"]["optional-dependencies"]
    assert {"mpi", "tensorboard", "wandb", "mlflow", "serve", "torch", "test"} <= set(extras)
    hinted = [install_hint(name) for name in SINKS] + [INSTALL_HINT]
    for hint in hinted:  # the extra a missing-library message names is one pip knows
        (extra,) = re.findall(r"nanodist\[(\w+)\]", hint)
        assert extra in extras, hint


def test_the_quick_start_names_the_python_it_needs():
    needs = PROJECT["project"]["requires-python"]
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    quick = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert f"Python {needs.removeprefix('>=')}" in quick
