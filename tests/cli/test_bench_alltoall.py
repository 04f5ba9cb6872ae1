"""`nanodist-tui bench alltoall` through typer's test runner: JSON rows with NCCL-tests' all-to-all formulas
(busbw = algbw·(N−1)/N), every schedule correct on 2 and 4 ranks, the send buffers and expected receives
agreeing element by element, gloo racing in the same process ranks, and user mistakes as one line, exit 2."""

from __future__ import annotations

import json

import numpy as np
import pytest
from extras import needs
from typer.testing import CliRunner

from engine.bench.alltoall import blocks
from nanodist_tui.cli import app
from tests.cli_helpers import assert_user_error

runner = CliRunner()


@pytest.fixture(autouse=True)
def _run_in_tmp(in_tmp):
    """Every test here runs in a fresh folder with only the shipped presets."""


def report(*args: str) -> dict:
    result = runner.invoke(app, ["bench", "alltoall", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.parametrize("world", [2, 4])
def test_rows_follow_nccl_tests_formulas(world):
    out = report("--backend", "threads", "-n", str(world), "--sizes", "64KiB,1MiB", "--iters", "2",
                 "--warmup", "1", "--algorithm", "all", "--uneven")
    assert (out["backend"], out["world_size"]) == ("threads", world)
    contestants = ["pairwise", "all-at-once", "pairwise uneven", "all-at-once uneven"]
    assert [(row["size"], row["contestant"]) for row in out["rows"]] == \
        [(size, c) for size in (64 * 2**10, 2**20) for c in contestants]
    for row in out["rows"]:
        assert row["correct"] is True and row["time_s"] > 0
        assert row["algbw"] == pytest.approx(row["size"] / row["time_s"], rel=1e-12)
        # busbw = algbw * (N-1)/N: a half for two ranks, three quarters for four
        assert row["busbw"] == pytest.approx(row["algbw"] * (world - 1) / world, rel=1e-12)


@pytest.mark.parametrize("world", [1, 3])
def test_what_each_rank_sends_is_what_its_peer_expects(world):
    """The bench's closed form: block dst of src's buffer is, element for element, block src of what dst
    expects, and every (src, dst) block differs from every other."""
    sent = [blocks(48 * world, r, world)[0].reshape(world, -1) for r in range(world)]
    expected = [blocks(48 * world, r, world)[1].reshape(world, -1) for r in range(world)]
    for src in range(world):
        for dst in range(world):
            assert np.array_equal(sent[src][dst], expected[dst][src])
    assert len({block.tobytes() for buf in sent for block in buf}) == world * world


@pytest.mark.slow
def test_gloo_races_in_the_same_process_ranks():
    needs("torch", "torch", "gloo is torch.distributed's")
    result = runner.invoke(app, ["bench", "alltoall", "-n", "2", "--sizes", "64KiB", "--iters", "2",
                                 "--warmup", "0", "--vs-gloo"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("all-to-all, processes backend, 2 ranks")
    assert [line.split()[2] for line in lines[2:]] == ["pairwise", "gloo"]
    assert all(" yes " in line for line in lines[2:]) and lines[-1].endswith("1.00x")


@pytest.mark.parametrize("args, named", [
    (["-n", "3", "--sizes", "1KiB"], "do not cut into 3 equal blocks"),  # 1024 B is not 3 x 4-byte floats
    (["--algorithm", "butterfly"], "butterfly"),
    (["--algorithm", "mpi-native"], "--backend mpi"),
    (["-b", "threads", "--vs-gloo"], "--vs-gloo"),
    (["-b", "carrier-pigeon"], "carrier-pigeon"),
    (["--sizes", "big"], "--sizes"),
])
def test_mistakes_are_one_line(args, named):
    assert_user_error(runner.invoke(app, ["bench", "alltoall", *args, "--iters", "1"]), named)
