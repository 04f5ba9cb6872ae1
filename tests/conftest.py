"""Fixtures shared by the test modules (test modules never import each other; shared helpers live in
comm_helpers.py, parallel_helpers.py and run_helpers.py)."""

from __future__ import annotations

import pytest


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """Run in a fresh temporary folder, seeing only the shipped presets (no ./presets, no
    NANODIST_PRESETS): what a user gets on a new machine."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("NANODIST_PRESETS", raising=False)
    return tmp_path
