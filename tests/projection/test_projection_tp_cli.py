"""`nanodist-tui project` with a tensor-parallel degree, through typer's runner: `--set parallel.tensor=...`
(and sequence_parallel) reaches the step model; the JSON rows carry the TP term, the table its column and
its lines; world sizes that are not multiples of t are left out with why; layouts the projection has no
term for, or that cannot be, are one line with exit code 2."""

from __future__ import annotations

import json

import pytest
from projection_helpers import small_preset
from typer.testing import CliRunner

from nanodist_tui.cli import app

runner = CliRunner()


@pytest.fixture
def preset(in_tmp, monkeypatch):
    """The SMALL config (4 heads) as a preset file; nothing else on the cluster search path."""
    monkeypatch.delenv("NANODIST_CLUSTERS", raising=False)
    return small_preset(in_tmp / "small.toml")


def invoke(preset: str, *args):
    return runner.invoke(app, ["project", "--preset", preset, "--cluster", "h100-ndr", "-n", "8", *args])


def test_the_json_rows_carry_the_tensor_parallel_term(preset):
    out = invoke(preset, "--set", "parallel.tensor=2", "--set", "parallel.sequence_parallel=true",
                 "--world-sizes", "6,8,16", "--scaling", "strong", "--json")
    assert out.exit_code == 0, out.output
    report = json.loads(out.stdout)
    assert [r["world_size"] for r in report["rows"]] == [8, 16]
    assert report["skipped"] == [{"world_size": 6, "why": "global batch 32 does not split over 3 "
                                                          "data-parallel ranks"}]
    for r in report["rows"]:
        tp = r["tp"]
        assert tp["degree"] == 2 and tp["sequence_parallel"] and tp["link"] == "intra-node"
        assert r["tp_s"] == tp["step_s"] > 0 and r["exposed_s"] >= r["tp_s"]
        assert r["step_s"] == pytest.approx(r["compute_s"] + r["exposed_s"] + r["interference_s"])
        assert len(tp["per_layer"]) == 8  # 2 all-gathers + 2 reduce-scatters forward, the mirror backward


def test_the_table_shows_the_term_and_its_lines(preset, in_tmp):
    out = invoke(preset, "--set", "parallel.tensor=4", "--world-sizes", "8,16", "--out",
                 str(in_tmp / "p.json"))
    assert out.exit_code == 0, out.output
    lines = out.stdout.splitlines()
    assert "tensor 4" in lines[0] and "of it tp" in lines[1]
    assert any(line.startswith("tensor parallel 4 at 8 ranks (dp 2, 16 row(s) per micro-batch): each group "
                               "inside a node, on the intra-node link") for line in lines)
    assert any("per layer 2 all-reduces forward + 2 all-reduces backward" in line for line in lines)
    assert any("all exposed" in line for line in lines)


def test_without_tensor_parallelism_the_table_is_as_before(preset, in_tmp):
    out = invoke(preset, "--world-sizes", "8", "--out", str(in_tmp / "p.json"))
    assert out.exit_code == 0, out.output
    assert "of it tp" not in out.stdout and "tensor parallel" not in out.stdout


@pytest.mark.parametrize("sets, named", [
    (["parallel.tensor=8"], "parallel.tensor"),  # 8 does not divide the 4 heads
    (["parallel.tensor=16"], "parallel.world_size"),  # 8 ranks are not a multiple of 16
])
def test_layouts_it_cannot_project_are_one_line(preset, sets, named):
    out = invoke(preset, *[a for s in sets for a in ("--set", s)])
    assert out.exit_code == 2, out.output
    lines = [line for line in out.output.splitlines() if line.strip()]
    assert len(lines) == 1 and named in lines[0] and "Traceback" not in out.output, out.output


def test_memory_takes_the_tensor_degree_and_the_projection_shows_the_same_bytes(preset, in_tmp):
    sets = ("--set", "parallel.tensor=2", "--set", "parallel.sequence_parallel=true")
    out = runner.invoke(app, ["memory", "--preset", preset, "-n", "4", *sets, "--json"])
    assert out.exit_code == 0, out.output
    memory = json.loads(out.stdout)
    assert (memory["tensor"], memory["sequence_parallel"], memory["micro_batch_rows"]) == (2, True, 16)
    # a rank's shard: 54,656 of the 106,304 parameters (the vocabulary's 65 rows padded to 66), in fp32
    assert memory["estimate"]["n_params"] == 106304
    assert memory["estimate"]["states"]["parameters"] == 54656 * 4
    text = runner.invoke(app, ["memory", "--preset", preset, "-n", "4", *sets])
    assert "4 rank(s) = dp 2 x tp 2 with sequence parallelism" in text.stdout.splitlines()[0]
    projected = runner.invoke(app, ["project", "--preset", preset, "--cluster", "h100-ndr", "-n", "4", *sets,
                                    "--world-sizes", "4", "--json"])
    assert projected.exit_code == 0, projected.output
    row = json.loads(projected.stdout)["rows"][0]
    assert row["memory"] == memory["estimate"]["category_peaks"]
    assert row["peak_bytes"] == memory["estimate"]["peak_total"]
