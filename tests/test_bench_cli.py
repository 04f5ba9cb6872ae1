"""`nanodist-tui bench ...` through typer's test runner: allreduce, step, techniques — JSON reports with the
documented fields and formulas, and user mistakes as one line with exit code 2."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from engine.bench.techniques import TECHNIQUES
from nanodist_tui.cli import app
from tests.cli_helpers import assert_user_error

runner = CliRunner()


@pytest.fixture(autouse=True)
def _run_in_tmp(in_tmp):
    """Every test here runs in a fresh folder with only the shipped presets."""


def report(*args: str) -> dict:
    """Run a bench command with --json; the JSON object it printed on stdout."""
    result = runner.invoke(app, ["bench", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


# ----------------------------------------------------------------------------- allreduce

@pytest.mark.parametrize("world", [2, 4])
def test_allreduce_rows_follow_nccl_tests_formulas(world):
    out = report("allreduce", "--backend", "threads", "-n", str(world), "--sizes", "64KiB,1MiB",
                 "--iters", "2", "--warmup", "1")
    assert (out["backend"], out["world_size"], out["algorithm"]) == ("threads", world, "ring")
    assert out["gloo"] is None
    rows = out["ours"]
    assert [row["size"] for row in rows] == [64 * 2**10, 2**20]
    for row in rows:
        assert row["correct"] is True
        assert row["time_s"] > 0
        assert row["algbw"] == pytest.approx(row["size"] / row["time_s"], rel=1e-12)
        # busbw = algbw * 2(N-1)/N: 1 for two ranks, 1.5 for four
        assert row["busbw"] == pytest.approx(row["algbw"] * 2 * (world - 1) / world, rel=1e-12)


def test_allreduce_size_units():
    rows = report("allreduce", "--backend", "threads", "-n", "2", "--sizes", "1024, 4k,0.5MiB,2KiB",
                  "--iters", "1", "--warmup", "0")["ours"]
    assert [row["size"] for row in rows] == [1024, 4096, 2**19, 2048]
    assert all(row["correct"] for row in rows)


@pytest.mark.parametrize("sizes", [
    "12XB", "MiB", "1.2.3MiB", "64KiB,fast", "-5MiB", "0", "6",  # 6 B is not a whole number of floats
])
def test_allreduce_bad_sizes(sizes):
    result = runner.invoke(app, ["bench", "allreduce", "-b", "threads", "--sizes", sizes, "--iters", "1"])
    assert_user_error(result, "--sizes")


def test_allreduce_bad_backend():
    result = runner.invoke(app, ["bench", "allreduce", "--backend", "carrier-pigeon", "--sizes", "1KiB"])
    assert_user_error(result, "carrier-pigeon")


# ----------------------------------------------------------------------------- step

def test_step_reports_our_time_and_the_torch_ratio():
    # narrower hidden layers than the preset's 1024: the same code path in a fraction of the time
    out = report("step", "--preset", "mlp", "--set", "data.n_samples=1024",
                 "--set", "model.widths=[784, 64, 10]", "--steps", "2", "--warmup", "1")
    assert out["preset"] == "mlp" and out["world_size"] == 1
    ours = out["ours"]
    assert ours["step_s"] > 0 and ours["n_params"] > 0 and ours["tokens"] > 0
    assert ours["comm_wait_s"] == 0 and ours["comm_share"] == 0  # one rank: nothing to wait for
    try:
        import torch
    except ImportError:
        assert out["torch"] is None and "ratio" not in out
    else:  # ours timed again, taking turns with PyTorch in the same thread: the ratio is of those two
        peer = out["torch"]
        assert peer["step_s"] > 0 and peer["ours_s"] > 0 and peer["torch"] == torch.__version__
        assert out["ratio"] == pytest.approx(peer["ours_s"] / peer["step_s"], rel=1e-12)


def test_step_bad_preset_is_one_line():
    assert_user_error(runner.invoke(app, ["bench", "step", "--preset", "no-such-preset"]), "no-such-preset")


# ----------------------------------------------------------------------------- techniques

def test_techniques_one_row_per_technique():
    # nine variants, each started and timed: a one-layer model keeps the test fast
    tiny = ["model.n_layer=1", "model.n_embd=32", "model.n_head=2", "train.global_batch=8"]
    out = report("techniques", "--preset", "quickstart", "--world-size", "2", "--steps", "1", "--warmup", "0",
                 "--set", "model.block_size=16", "--set", "data.max_chars=50000",
                 *[arg for key in tiny for arg in ("--set", key)])
    assert out["preset"] == "quickstart" and out["world_size"] == 2
    rows = out["rows"]
    assert [row["technique"] for row in rows] == list(TECHNIQUES)
    assert len(rows) == len(TECHNIQUES) >= 9
    baseline = rows[0]["step_s"]
    assert rows[0]["vs_baseline"] == 1.0
    for row in rows:
        assert row["step_s"] > 0 and 0 <= row["comm_share"] <= 1, row
        assert row["vs_baseline"] == pytest.approx(row["step_s"] / baseline, rel=1e-12)
