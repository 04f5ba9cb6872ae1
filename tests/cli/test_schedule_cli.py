"""`nanodist-tui schedule`: the drawing fits the width asked for (80 columns included), its figures are the
published ones (p = 4, m = 8: bubble 27.3% for 1F1B, in flight 4 3 2 1), --json parses, the docs page shows
what the command prints, and every bad input is one line with exit code 2, never a traceback."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.cli_helpers import assert_user_error, invoke

DOC = Path(__file__).resolve().parents[2] / "docs" / "pipeline-parallel.md"
SHAPES = [("gpipe", 4, 8), ("1f1b", 4, 8), ("interleaved", 4, 8), ("zb-h1", 4, 8), ("1f1b", 8, 32),
          ("zb-h1", 3, 1), ("interleaved", 8, 32), ("interleaved", 4, 7), ("interleaved", 4, 1),
          ("gpipe", 1, 5)]


@pytest.mark.parametrize("name,p,m", SHAPES)
@pytest.mark.parametrize("width", [80, 100])
def test_every_line_fits_the_width(name, p, m, width):
    result = invoke("schedule", "--pp", p, "--micro-batches", m, "--schedule", name, "--width", width)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert sum(line.startswith("rank ") for line in lines) == p
    assert max(len(line) for line in lines) <= width


def test_1f1b_at_p4_m8_prints_the_published_figures():
    result = invoke("schedule", "--pp", 4, "--micro-batches", 8, "--schedule", "1f1b", "--width", 80)
    assert result.exit_code == 0, result.output
    assert "bubble 27.3% simulated" in result.output  # (p - 1)/(m + p - 1) = 3/11
    assert "bubble 27.3% by the formula (p-1)/(m+p-1)" in result.output
    assert "r0 4   r1 3   r2 2   r3 1" in result.output  # min(p - r, m)
    assert "messages: 24 activations forward, 24 gradients backward" in result.output  # m (p - 1)


def test_json_parses_with_the_published_figures():
    result = invoke("schedule", "--pp", 4, "--micro-batches", 8, "--schedule", "interleaved", "--chunks", 2,
                    "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    shape = (report["schedule"], report["pp"], report["micro_batches"], report["chunks"])
    assert shape == ("interleaved", 4, 8, 2)
    assert report["bubble"] == pytest.approx(3 / 19, rel=1e-12)  # (p - 1)/(v m + p - 1)
    assert report["formula"]["text"] == "(p-1)/(v*m+p-1)"
    assert report["peak_in_flight"] == [2 * (4 - r - 1) + 4 + 1 for r in range(4)]  # Megatron's warm-up + 1
    assert report["messages"] == {"activation": 8 * 7, "gradient": 8 * 7}  # m (p v - 1)
    assert len(report["actions"]) == 4 and {"action", "start", "end"} <= set(report["actions"][0][0])


def test_the_docs_page_shows_what_the_command_prints():
    text = DOC.read_text(encoding="utf-8")
    blocks = re.findall(r"```\n\$ nanodist-tui (schedule [^\n]*)\n(.*?)```", text, re.S)
    assert len(blocks) >= 5
    for command, printed in blocks:
        result = invoke(*command.split())
        assert result.output == printed, command


@pytest.mark.parametrize("args,named", [
    (["--pp", 4, "--micro-batches", 8, "--schedule", "pipedream"], "--schedule pipedream"),
    (["--pp", 0, "--micro-batches", 8], "--pp 0"),
    (["--pp", 4, "--micro-batches", 0], "--micro-batches 0"),
    (["--pp", 4, "--micro-batches", 8, "--schedule", "1f1b", "--chunks", 2], "--chunks 2"),
    (["--pp", 4, "--micro-batches", 8, "--schedule", "interleaved", "--chunks", 1], "--chunks 1"),
    (["--pp", 4, "--micro-batches", 8, "--width", 10], "--width 10"),
    (["--pp", 1000, "--micro-batches", 1000], "--pp 1000"),
    (["--pp", "four", "--micro-batches", 8], "--pp"),
    (["--micro-batches", 8], "--pp"),
])
def test_bad_input_is_one_line_and_exit_code_2(args, named):
    assert_user_error(invoke("schedule", *args), named)


def test_the_drawing_of_gpipe_on_two_ranks_worked_out_by_hand():
    from engine.parallel.pipeline.schedules import build_schedule
    from engine.parallel.pipeline.simulate import Durations, simulate
    from engine.parallel.pipeline.timeline_text import render
    # F = 1, B = 2: rank 0 runs F0 F1 at 0..2, waits, B0 B1 at 5..9; rank 1 F0 F1 at 1..3, B0 B1 at 3..7.
    # 30 columns leave 21 cells for 9 time units: 2 cells each.
    lines = render(simulate(build_schedule("gpipe", 2, 2), Durations(forward=1.0, backward=2.0)), width=30)
    assert lines[:3] == ["rank 0 |0>1>......0<<<1<<<|",
                         "rank 1 |..0>1>0<<<1<<<....|",
                         "        0                9"]
    assert max(len(line) for line in lines) <= 30
    text = " ".join(line.strip() for line in lines[3:])
    assert "bubble 33.3% simulated (idle compute / ranks x step)" in text  # 6 idle of 2 x 9
    assert "bubble 33.3% by the formula (p-1)/(m+p-1), p=2 m=2 v=1" in text
