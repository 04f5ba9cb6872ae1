"""`nanodist-tui bench step` on a context-parallel layout, processes backend: our CP step raced against the
PyTorch ring-attention twin (engine/bench/cp_peer.py, "torch-ring-by-hand": PyTorch's own context_parallel
has no CPU attention kernel) in the same rank processes — the JSON report's fields and ratio, the printed
lines, and a layout the twin cannot race named in one line. (That the twin computes what one device
computes: tests/parallel/test_torch_cp_twin.py.)"""

from __future__ import annotations

import json
import re

import pytest
from cli_helpers import bench_step
from extras import needs

# one block of width 32, 2 heads, context 32, vocabulary 64, batch 2, on 2 ranks of one CP group (zigzag)
TINY_CP = ["--preset", "cp-2-long", "--set", "data.kind=synthetic-lm", "--set", "data.max_chars=0",
           "--set", "data.n_samples=256", "--set", "model.vocab_size=64", "--set", "model.n_layer=1",
           "--set", "model.n_embd=32", "--set", "model.n_head=2", "--set", "model.block_size=32",
           "--set", "train.global_batch=2", "-b", "processes", "--steps", "1", "--warmup", "0"]


@pytest.fixture(autouse=True)
def _run_in_tmp(in_tmp):
    """Every test here runs in a fresh folder with only the shipped presets."""


@pytest.mark.slow
def test_step_with_context_parallelism_races_the_pytorch_ring_twin_in_the_same_ranks():
    torch = needs("torch", "torch", "the PyTorch ring-attention twin is the peer")
    out = json.loads(bench_step(*TINY_CP, "--json"))
    cp = out["cp"]
    assert (cp["world_size"], cp["dp"], cp["cp"], cp["layout"]) == (2, 1, 2, "zigzag")
    assert (cp["twin"], cp["global_batch"], cp["tokens"], cp["torch"]) == (
        "torch-ring-by-hand", 2, 64, torch.__version__)
    assert cp["ours_s"] > 0 and cp["torch_s"] > 0
    assert out["ratio"] == cp["ratio"] == pytest.approx(cp["ours_s"] / cp["torch_s"], rel=1e-12)
    assert cp["gflops"] == pytest.approx(out["flops"]["per_step"] / cp["torch_s"] / 1e9, rel=1e-12)
    assert "ddp" not in out and "tp" not in out  # the DDP race no longer stands in for CP's


@pytest.mark.slow
def test_step_with_context_parallelism_prints_the_pytorch_cp_line_and_ratio():
    needs("torch", "torch", "the PyTorch ring-attention twin is the peer")
    text = bench_step(*TINY_CP)
    assert re.search(r"PyTorch CP +[\d.]+ ms/step .* gloo, torch-ring-by-hand: ring attention written in "
                     r"torch, zigzag dp 1 x cp 2, 2 processes x \d+ thread\(s\)\)", text), text
    assert re.search(r"ratio ours/PyTorch CP = [\d.]+  \(ours [\d.]+ ms, timed taking turns", text), text


@pytest.mark.slow
def test_step_on_a_context_layout_the_twin_cannot_race_says_so():
    needs("torch", "torch", "the PyTorch ring-attention twin is the peer")
    args = [*TINY_CP, "-n", "4", "--set", "parallel.tensor=2"]
    out = json.loads(bench_step(*args, "--json"))
    assert "cp" not in out and "ddp" not in out and "ratio" not in out
    assert out["cp_unraced"].startswith("the PyTorch ring-attention twin races a dense GPT on data x context")
    assert "no PyTorch CP figure: the PyTorch ring-attention twin races" in bench_step(*args)
