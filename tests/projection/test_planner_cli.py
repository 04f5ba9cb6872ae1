"""`nanodist-tui plan`: the ranking printed with its split and memory, the JSON report, and each malformed
invocation as one line with exit code 2."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from nanodist_tui.cli import app

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, ["plan", *args])


def test_the_ranking_with_its_split_memory_and_reasons():
    out = invoke("--preset", "gpt-mini", "--cluster", "h100-ndr", "--ranks", "8", "--top", "3")
    assert out.exit_code == 0, out.output
    text = out.stdout
    assert "gpt-mini on 8x H100" in text and "3 ranked" in text
    assert "step ms" in text and "bubble" in text and "MFU" in text and "peak" in text
    assert "why the rest lose" in text and "slower than the first choice" in text
    assert "--set parallel.tensor=" in text  # the first choice as overrides


def test_the_json_report_has_every_layout_and_a_reason_for_each_loser():
    out = invoke("--preset", "gpt-mini", "--cluster", "a100-hdr", "--ranks", "4", "--json")
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert len(data["ranked"]) == 5
    assert data["counts"]["layouts"] == len(data["ranked"]) + len(data["rest"])
    first = data["ranked"][0]
    assert set(first["split"]) >= {"compute", "bubble", "dp", "tp", "pp", "cp", "ep"}
    assert first["tokens_per_s"] > 0 and 0 < first["mfu"] < 1 and first["memory"]["parameters"] > 0
    assert all(c["why"] and c["verdict"] in ("slower", "does not fit", "refused", "not evaluated")
               for c in data["rest"])


def test_a_memory_per_rank_that_nothing_fits():
    out = invoke("--preset", "gpt-mini", "--cluster", "h100-ndr", "--ranks", "2", "--memory-per-rank", "1MB")
    assert out.exit_code == 0, out.output
    assert "no layout fits" in out.stdout and "does not fit" in out.stdout


@pytest.mark.parametrize("args, named", [
    (["--ranks", "0"], "--ranks"),
    (["--ranks", "many"], "--ranks"),
    (["--top", "0"], "--top"),
    (["--memory-per-rank", "lots"], "--memory-per-rank"),
    (["--memory-per-rank", "-3"], "--memory-per-rank"),
    (["--cluster", "a100-hrd"], "did you mean a100-hdr"),
    (["--preset", "no-such-preset"], "no preset"),
    (["--ranks", "100000", "--cluster", "h100-ndr"], "--ranks 100000"),
    (["--set", "train.steps=0"], "train.steps"),
])
def test_bad_flags_are_one_line_and_exit_2(args, named):
    out = invoke(*args)
    assert out.exit_code == 2, out.output
    lines = out.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and named in lines[0], out.output
