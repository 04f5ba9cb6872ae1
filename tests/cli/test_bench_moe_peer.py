"""`nanodist-tui bench step` on a mixture-of-experts GPT: no PyTorch twin of it is built yet, so the report
names that in one line (JSON field moe_unraced, the printed "no PyTorch peer figure" line) and times ours
alone — on one rank and under expert parallelism on processes, where the DDP race used to fail with an
internal error (its dense twin took no "moe" argument)."""

from __future__ import annotations

import json

import pytest
from cli_helpers import bench_step

# moe-4 made tiny: one block of width 32, 4 experts top-2, context 16, batch 4
TINY_MOE = ["--preset", "moe-4", "--set", "data.kind=synthetic-lm", "--set", "data.max_chars=0",
            "--set", "data.n_samples=256", "--set", "model.vocab_size=64", "--set", "model.n_layer=1",
            "--set", "model.n_embd=32", "--set", "model.n_head=2", "--set", "model.block_size=16",
            "--set", "model.n_experts=4", "--set", "train.global_batch=4", "--steps", "1", "--warmup", "0"]
WHY = ("no PyTorch twin of a mixture-of-experts GPT is built yet (model.n_experts > 0): PyTorch's twins "
       "(eager, DDP, TP, PP, CP) are dense")


@pytest.fixture(autouse=True)
def _run_in_tmp(in_tmp):
    """Every test here runs in a fresh folder with only the shipped presets."""


@pytest.mark.slow
@pytest.mark.parametrize("layout", [["-n", "1", "--set", "parallel.expert=1"],
                                    ["-n", "2", "--set", "parallel.expert=2", "-b", "processes"]],
                         ids=["one-rank", "ep2-processes"])
def test_step_on_an_moe_model_names_the_missing_twin_and_times_ours(layout):
    out = json.loads(bench_step(*TINY_MOE, *layout, "--json"))
    assert out["moe_unraced"] == WHY
    assert out["ours"]["step_s"] > 0
    assert not {"torch", "ddp", "tp", "pp", "cp", "ratio"} & out.keys()
    assert f"no PyTorch peer figure: {WHY}" in bench_step(*TINY_MOE, *layout)
