"""`nanodist-tui bench profile` on a layout that needs several ranks (context, expert parallelism): it
trains on the fewest ranks the layout needs, as threads, and profiles rank 0 alone — its op calls per step
are one rank's (the same as the one-rank profile of the same model: the other ranks' calls are not booked),
and the header says which rank of how many."""

from __future__ import annotations

import json

import pytest
from cli_helpers import invoke

TINY = ["--set", "data.kind=synthetic-lm", "--set", "data.max_chars=0", "--set", "data.n_samples=256",
        "--set", "model.vocab_size=64", "--set", "model.n_layer=1", "--set", "model.n_embd=32",
        "--set", "model.n_head=2", "--set", "model.block_size=32", "--set", "train.global_batch=4",
        "--steps", "2", "--warmup", "1"]


def profile(*args: str) -> dict:
    result = invoke("bench", "profile", *args, *TINY, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def calls(report: dict) -> dict[str, int]:
    return {row["op"]: row["calls"] for row in report["ops"]}


@pytest.fixture(autouse=True)
def _run_in_tmp(in_tmp):
    """Every test here runs in a fresh folder with only the shipped presets."""


@pytest.mark.slow
@pytest.mark.parametrize(("sets", "ranks"), [
    (["--preset", "cp-2-long"], 2),
    (["--preset", "moe-4", "--set", "model.n_experts=4", "--set", "parallel.expert=2"], 2),
], ids=["cp2", "ep2"])
def test_profile_of_a_multi_rank_layout_books_rank_0_alone(sets, ranks):
    report = profile(*sets)
    one = profile(*sets, "--set", "parallel.context=1", "--set", "parallel.expert=1")
    assert (report["ranks"], one["ranks"]) == (ranks, 1)
    # one rank's layers, not two ranks' (the experts' linears differ: rank 0 holds half of them)
    assert calls(report)["layer_norm"] == calls(one)["layer_norm"] > 0
    assert calls(report)["cross_entropy"] == calls(one)["cross_entropy"] > 0
    assert report["phases"]["step"] > 0
