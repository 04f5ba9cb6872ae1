"""Tests that need an optional extra skip, saying which extra and how to install it: the README's test
command runs with the `test` extra only, and CI runs the suite again with every extra."""

from __future__ import annotations

import importlib

import pytest


def needs(module: str, extra: str, why: str):
    """The module, imported; or this test (or module) skipped with one line naming the extra, reported at
    the test's own location (not this helper's)."""
    try:
        return importlib.import_module(module)
    except ImportError:
        reason = f"needs the {extra} extra (pip install -e '.[{extra}]'): {why}"
        raise pytest.skip.Exception(reason, allow_module_level=True, _use_item_location=True) from None
