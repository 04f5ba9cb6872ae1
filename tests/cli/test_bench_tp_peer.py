"""`nanodist-tui bench step` on a tensor-parallel layout, processes backend: our TP step raced against
PyTorch's tensor parallelism (engine/bench/tp_peer.py) in the same rank processes — the JSON report's
fields and ratio, the printed lines, and a layout the twin has no plan for named in one line.
(That the twin computes what one device computes: tests/parallel/test_torch_tp_twin.py.)"""

from __future__ import annotations

import json
import re

import pytest
from cli_helpers import bench_step
from extras import needs

# one block of width 32, 2 heads, context 16, vocabulary 64, batch 4, on 2 ranks of one TP group
TINY_TP = ["--preset", "gpt-mini", "--set", "data.kind=synthetic-lm", "--set", "data.max_chars=0",
           "--set", "data.n_samples=256", "--set", "model.vocab_size=64", "--set", "model.n_layer=1",
           "--set", "model.n_embd=32", "--set", "model.n_head=2", "--set", "model.block_size=16",
           "--set", "train.global_batch=4", "--set", "parallel.tensor=2", "-n", "2", "-b", "processes",
           "--steps", "1", "--warmup", "0"]


@pytest.fixture(autouse=True)
def _run_in_tmp(in_tmp):
    """Every test here runs in a fresh folder with only the shipped presets."""


@pytest.mark.slow
def test_step_with_tensor_parallelism_races_pytorch_tp_in_the_same_ranks():
    torch = needs("torch", "torch", "PyTorch's tensor parallelism is the peer")
    out = json.loads(bench_step(*TINY_TP, "--json"))
    tp = out["tp"]
    assert (tp["world_size"], tp["dp"], tp["tp"], tp["sequence_parallel"]) == (2, 1, 2, False)
    assert (tp["global_batch"], tp["tokens"], tp["torch"]) == (4, 64, torch.__version__)
    assert tp["threads_per_rank"] >= 1 and tp["ours_s"] > 0 and tp["torch_s"] > 0
    assert out["ratio"] == tp["ratio"] == pytest.approx(tp["ours_s"] / tp["torch_s"], rel=1e-12)
    assert tp["gflops"] == pytest.approx(out["flops"]["per_step"] / tp["torch_s"] / 1e9, rel=1e-12)
    assert "ddp" not in out and "torch" not in out  # neither DDP nor the one-rank eager race is run
    assert not {"overlap_on", "overlap_off"} & out.keys()  # nothing overlaps under TP: not timed


@pytest.mark.slow
def test_step_with_sequence_parallelism_prints_the_pytorch_tp_line_and_ratio():
    needs("torch", "torch", "PyTorch's tensor parallelism is the peer")
    text = bench_step(*TINY_TP, "--set", "parallel.sequence_parallel=true")
    assert re.search(r"PyTorch TP +[\d.]+ ms/step .* gloo, DeviceMesh dp 1 x tp 2 with sequence parallelism, "
                     r"2 processes x \d+ thread\(s\)\)", text), text
    assert re.search(r"ratio ours/PyTorch TP = [\d.]+  \(ours [\d.]+ ms, timed taking turns", text), text
    assert "PyTorch DDP" not in text


@pytest.mark.slow
def test_step_on_a_layout_the_twin_has_no_plan_for_says_so():
    needs("torch", "torch", "PyTorch's tensor parallelism is the peer")
    mlp = ["--preset", "mlp", "--set", "data.n_samples=1024", "--set", "model.widths=[784, 64, 10]",
           "--set", "parallel.tensor=2", "-n", "2", "-b", "processes", "--steps", "1", "--warmup", "0"]
    out = json.loads(bench_step(*mlp, "--json"))
    assert "tp" not in out and "ddp" not in out and "ratio" not in out
    assert out["tp_unraced"] == "the PyTorch TP twin has a plan for the GPT only, not an MLP model"
    assert "no PyTorch TP figure: the PyTorch TP twin has a plan for the GPT only" in bench_step(*mlp)
