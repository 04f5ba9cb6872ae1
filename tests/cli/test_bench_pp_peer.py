"""`nanodist-tui bench step` on a pipeline layout, processes backend: our pipeline step raced against
PyTorch's pipelining (engine/bench/pp_peer.py) in the same rank processes — the JSON report's fields and
ratio, the printed lines, and a layout the twin does not race named in one line.
(That the twin computes what one device computes: tests/parallel/test_torch_pp_twin.py.)"""

from __future__ import annotations

import json
import re

import pytest
from cli_helpers import bench_step
from extras import needs

# two blocks of width 32, 2 heads, context 16, vocabulary 64, batch 4 in 2 micro-batches, 2 stages
TINY_PP = ["--preset", "pp-2", "--set", "data.kind=synthetic-lm", "--set", "data.max_chars=0",
           "--set", "data.n_samples=256", "--set", "model.vocab_size=64", "--set", "model.n_layer=2",
           "--set", "model.n_embd=32", "--set", "model.n_head=2", "--set", "model.block_size=16",
           "--set", "train.global_batch=4", "--set", "train.micro_batches=2", "--steps", "1", "--warmup", "0"]


@pytest.fixture(autouse=True)
def _run_in_tmp(in_tmp):
    """Every test here runs in a fresh folder with only the shipped presets."""


@pytest.mark.slow
def test_step_with_a_pipeline_races_pytorch_pipelining_in_the_same_ranks():
    torch = needs("torch", "torch", "PyTorch's pipelining is the peer")
    out = json.loads(bench_step(*TINY_PP, "--json"))
    pp = out["pp"]
    assert (pp["world_size"], pp["pp"], pp["schedule"], pp["micro_batches"]) == (2, 2, "1f1b", 2)
    assert (pp["global_batch"], pp["tokens"], pp["torch"]) == (4, 64, torch.__version__)
    assert pp["ours_s"] > 0 and pp["torch_s"] > 0
    assert out["ratio"] == pp["ratio"] == pytest.approx(pp["ours_s"] / pp["torch_s"], rel=1e-12)
    assert not {"ddp", "tp", "torch", "overlap_on", "overlap_off"} & out.keys()


@pytest.mark.slow
def test_step_with_a_pipeline_prints_the_pytorch_pp_line_and_ratio():
    needs("torch", "torch", "PyTorch's pipelining is the peer")
    text = bench_step(*TINY_PP, "--set", 'parallel.schedule="gpipe"')
    assert re.search(r"PyTorch PP +[\d.]+ ms/step .* gloo, torch.distributed.pipelining gpipe, pp 2, "
                     r"2 micro-batches, 2 processes x \d+ thread\(s\)\)", text), text
    assert re.search(r"ratio ours/PyTorch PP = [\d.]+  \(ours [\d.]+ ms, timed taking turns", text), text


def test_an_emulated_pipeline_is_not_raced_and_says_why():
    text = bench_step(*TINY_PP, "--set", "parallel.pipeline_emulate_ms=1")
    assert "no PyTorch pipeline figure: an emulated pipeline (parallel.pipeline_emulate_ms > 0) computes " \
           "nothing to race" in text
    assert "ratio" not in text
