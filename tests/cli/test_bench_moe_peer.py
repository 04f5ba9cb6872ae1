"""`nanodist-tui bench step` on a mixture-of-experts GPT: under expert parallelism on processes our EP step
races the PyTorch expert-parallel twin (engine/bench/moe_peer.py) in the same rank processes — the JSON
report's fields and ratio, the printed lines; a layout no twin races (one rank: the eager twin is dense; EP
on part of the ranks) is named in one line. (Before: the DDP race failed with an internal error, its dense
twin taking no "moe" argument.) That the twin trains what we train: tests/parallel/test_torch_moe_twin.py."""

from __future__ import annotations

import json
import re

import pytest
from cli_helpers import bench_step
from extras import needs

# moe-4 made tiny: one block of width 32, 4 experts top-2, context 16, batch 4
TINY_MOE = ["--preset", "moe-4", "--set", "data.kind=synthetic-lm", "--set", "data.max_chars=0",
            "--set", "data.n_samples=256", "--set", "model.vocab_size=64", "--set", "model.n_layer=1",
            "--set", "model.n_embd=32", "--set", "model.n_head=2", "--set", "model.block_size=16",
            "--set", "model.n_experts=4", "--set", "train.global_batch=4", "--steps", "1", "--warmup", "0"]
EP2 = ["-n", "2", "--set", "parallel.expert=2", "-b", "processes"]


@pytest.fixture(autouse=True)
def _run_in_tmp(in_tmp):
    """Every test here runs in a fresh folder with only the shipped presets."""


@pytest.mark.slow
def test_step_with_expert_parallelism_races_the_pytorch_twin_in_the_same_ranks():
    torch = needs("torch", "torch", "the PyTorch expert-parallel twin is the peer")
    out = json.loads(bench_step(*TINY_MOE, *EP2, "--json"))
    ep = out["ep"]
    assert (ep["world_size"], ep["ep"], ep["n_experts"], ep["top_k"]) == (2, 2, 4, 2)
    assert (ep["twin"], ep["global_batch"], ep["tokens"], ep["torch"]) == (
        "torch-all-to-all-by-hand", 4, 64, torch.__version__)
    assert ep["ours_s"] > 0 and ep["torch_s"] > 0
    assert out["ratio"] == ep["ratio"] == pytest.approx(ep["ours_s"] / ep["torch_s"], rel=1e-12)
    assert not {"ddp", "torch", "moe_unraced", "ep_unraced"} & out.keys()
    text = bench_step(*TINY_MOE, *EP2)
    assert re.search(r"PyTorch EP +[\d.]+ ms/step .* gloo, torch-all-to-all-by-hand: all_to_all_single "
                     r"dispatch, 4 experts top-2, ep 2, 2 processes x \d+ thread\(s\)\)", text), text
    assert re.search(r"ratio ours/PyTorch EP = [\d.]+  \(ours [\d.]+ ms, timed taking turns", text), text


@pytest.mark.slow
@pytest.mark.parametrize(("layout", "key", "words"), [
    (["-n", "1", "--set", "parallel.expert=1"], "moe_unraced",
     "a mixture-of-experts GPT (model.n_experts > 0) is raced only under expert parallelism on processes"),
    (["-n", "2", "--set", "parallel.expert=2", "-b", "processes", "--set", "model.capacity_factor=1.0"],
     "ep_unraced", "the PyTorch expert-parallel twin races an MoE GPT with dropless routing"),
], ids=["one-rank", "ep2-with-capacity"])
def test_step_on_an_moe_layout_no_twin_races_names_why_and_times_ours(layout, key, words):
    out = json.loads(bench_step(*TINY_MOE, *layout, "--json"))
    assert out[key].startswith(words)
    assert out["ours"]["step_s"] > 0
    assert not {"torch", "ddp", "ep", "ratio"} & out.keys()
    assert f"figure: {words}" in bench_step(*TINY_MOE, *layout)
