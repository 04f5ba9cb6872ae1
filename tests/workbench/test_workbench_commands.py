"""The workbench's own commands: `screenshot` draws the same SVG from the same recording (the README's
picture is that drawing, kept current), `bench ui-events` reports a 1 kHz stream handled as the workbench
promises, and `bench ui` compares tokens/s with the workbench open against --no-ui and says whether it
meets the goal."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.cli_helpers import assert_user_error, invoke

README_SHOT = Path(__file__).resolve().parents[2] / "docs" / "workbench.svg"


def test_screenshot_is_deterministic_and_the_readme_picture_is_current(tmp_path):
    first, second = tmp_path / "a.svg", tmp_path / "b.svg"
    for out in (first, second):
        result = invoke("screenshot", "-o", str(out), "--size", "160x50")
        assert result.exit_code == 0, result.output
    svg = first.read_text()
    assert svg.startswith("<svg") and "nanoDist" in svg
    assert first.read_bytes() == second.read_bytes()
    # the README shows docs/workbench.svg; `just screenshot` redraws it after a change of the picture
    assert README_SHOT.read_bytes() == first.read_bytes(), "docs/workbench.svg is stale: `just screenshot`"


@pytest.mark.parametrize("size", ["160", "10x5"])
def test_screenshot_bad_size_is_one_line(tmp_path, size):
    assert_user_error(invoke("screenshot", "-o", str(tmp_path / "x.svg"), "--size", size), "--size")


@pytest.mark.slow
def test_bench_ui_events_reports_the_stream_and_its_checks():
    result = invoke("bench", "ui-events", "--rate", "1000", "--seconds", "1")
    assert result.exit_code == 0, result.output
    assert "1000 steps at 1000/s (9,000 events/s)" in result.output
    assert "last step shown     1000 of 1000" in result.output
    assert "discrete events     20 of 20 in the log" in result.output
    assert result.output.count("ok    ") == 3 and "FAILED" not in result.output


@pytest.mark.slow
def test_bench_ui_compares_the_workbench_with_no_ui(in_tmp):
    result = invoke("bench", "ui", "--preset", "quickstart", "--world-size", "2", "--steps", "4",
                    "--repeats", "1", "--set", "model.n_layer=1", "--set", "model.n_embd=32",
                    "--set", "model.block_size=16", "--set", "data.max_chars=20000",
                    "--set", "train.eval_batches=1", "--set", "train.eval_every=0")
    assert result.exit_code == 0, result.output
    rates = {kind: float(value.replace(",", "")) for kind, value in
             re.findall(r"(no-ui|workbench)\s+median\s+([\d,]+) tokens/s", result.output)}
    assert set(rates) == {"no-ui", "workbench"} and all(r > 0 for r in rates.values())
    ratio = float(re.search(r"workbench / no-ui = ([\d.]+)", result.output).group(1))
    assert ratio == pytest.approx(rates["workbench"] / rates["no-ui"], rel=0.01)
    assert ("meets the goal" in result.output) == (ratio >= 0.95)
