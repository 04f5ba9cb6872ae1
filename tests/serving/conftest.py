"""The model the serving tests serve: the exported GPT of a tiny trained run, made once per session."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from nanodist_tui.cli import app
from tests.run_helpers import train


@pytest.fixture(scope="session")
def model_file(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("serve")
    summary, _ = train(out / "runs")
    path = out / "model.npz"
    result = CliRunner().invoke(app, ["export", summary["run_dir"], "-o", str(path)])
    assert result.exit_code == 0, result.output
    return path
