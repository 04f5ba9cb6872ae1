"""`nanodist-tui project` with a pipeline: the table says the schedule simulated, its bubble beside the
formula's, the messages and their link, in words under the table."""

from __future__ import annotations

import re

import pytest
from projection_helpers import small_preset
from typer.testing import CliRunner

from nanodist_tui.cli import app

runner = CliRunner()


@pytest.fixture
def preset(in_tmp, monkeypatch):
    """The SMALL config as a preset file; nothing else on the cluster search path."""
    monkeypatch.delenv("NANODIST_CLUSTERS", raising=False)
    return small_preset(in_tmp / "small.toml")


def test_the_table_says_the_pipeline_term_in_words(preset):
    out = runner.invoke(app, ["project", "--preset", preset, "--cluster", "h100-ndr", "-n", "8",
                              "--set", "parallel.pipeline=2", "--set", "train.micro_batches=4",
                              "--set", 'parallel.schedule="gpipe"', "--world-sizes", "2,4"])
    assert out.exit_code == 0, out.output
    assert re.search(r"^pipeline 2 at 2 ranks: gpipe, 4 micro-batches, blocks per stage \[\d+, \d+\]$",
                     out.stdout, re.M), out.stdout
    # the formula's figure: (p-1)/(m+p-1) = 1/5
    assert re.search(r"^  bubble [\d.]+% of the schedule simulated \([\d.]+ ms\), 20\.0% by "
                     r"\(p-1\)/\(m\+p-1\) with equal stages$", out.stdout, re.M), out.stdout
    # each rank, at its one boundary, moves one activation and one gradient per micro-batch: 2m messages
    assert re.search(r"^  8 messages per rank of [\d.]+ MB on the \S+ link", out.stdout, re.M), out.stdout
