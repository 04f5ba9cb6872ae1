"""`nanodist-tui bench ...` through typer's test runner: allreduce, step, techniques — JSON reports with the
documented fields and formulas, and user mistakes as one line with exit code 2."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
from extras import needs
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


TINY_MLP = ["--preset", "mlp", "--set", "data.n_samples=1024", "--set", "model.widths=[784, 64, 10]"]

# one block of width 32, 2 heads, context 16, vocabulary 64, batch 4: 64 tokens a step
TINY_GPT = ["--preset", "gpt-mini", "--set", "data.kind=synthetic-lm", "--set", "data.max_chars=0",
            "--set", "data.n_samples=256", "--set", "model.vocab_size=64", "--set", "model.n_layer=1",
            "--set", "model.n_embd=32", "--set", "model.n_head=2", "--set", "model.block_size=16",
            "--set", "train.global_batch=4"]
# Training FLOPs of TINY_GPT's step, by hand: 3 x forward over 4 x 16 = 64 tokens, where forward is
#   the block's weights, 2 per weight per token: 12·C² + 13·C = 12·1024 + 416 = 12,704 -> 2 · 12,704 · 64
#   attention's QKᵀ and PV: 4·T·C per token = 4 · 16 · 32 · 64
#   the (tied) head: 2·V·C per token = 2 · 64 · 32 · 64
TINY_GPT_FLOPS = 3 * (2 * 12_704 * 64 + 4 * 16 * 32 * 64 + 2 * 64 * 32 * 64)
assert TINY_GPT_FLOPS == 6_057_984


def test_step_counts_flops_and_rates_them_against_the_measured_peak():
    torch = needs("torch", "torch", "PyTorch eager is the peer")
    out = report("step", *TINY_GPT, "--steps", "2", "--warmup", "1")
    host = out["machine"]
    blas = host["blas"][0]  # NumPy always loads one
    assert host["cpu"] and blas["internal_api"] and blas["version"] and blas["num_threads"] >= 1
    peak = host["peak"]
    assert (peak["n"], peak["repeats"]) == (2048, 5)
    assert peak["gflops"] == pytest.approx(2 * 2048**3 / peak["best_s"] / 1e9, rel=1e-12)
    assert out["flops"]["per_step"] == TINY_GPT_FLOPS and out["ours"]["tokens"] == 64
    ours, manual = out["ours"], out["torch"]
    sdpa = manual["sdpa"]
    assert manual["torch"] == torch.__version__
    for row in (ours, manual, sdpa):
        assert row["gflops"] == pytest.approx(TINY_GPT_FLOPS / row["step_s"] / 1e9, rel=1e-12)
        assert row["of_peak"] == pytest.approx(row["gflops"] / peak["gflops"], rel=1e-12)
    # both PyTorch peers took turns with the same timing of ours
    assert out["ratio"] == pytest.approx(manual["ours_s"] / manual["step_s"], rel=1e-12)
    assert sdpa["ratio"] == pytest.approx(manual["ours_s"] / sdpa["step_s"], rel=1e-12)


def test_step_prints_the_machine_and_the_fraction_of_it_each_step_uses():
    needs("torch", "torch", "PyTorch eager is the peer")
    result = runner.invoke(app, ["bench", "step", *TINY_GPT, "--steps", "2", "--warmup", "1"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()

    def line(prefix: str) -> list[str]:
        found = [x for x in lines if x.strip().startswith(prefix)]
        assert found, (prefix, result.stdout)
        return found
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():  # the model name as the kernel states it
        model = next(x for x in cpuinfo.read_text().splitlines() if x.startswith("model name"))
        assert model.split(":", 1)[1].strip() in line("CPU")[0]
    assert " thread(s)" in line("BLAS")[0] and "kernel " in line("BLAS")[0]
    peak = float(re.findall(r"peak\s+([\d.]+) GFLOP/s", line("peak")[0])[0])
    flops = int(re.findall(r"FLOPs\s+([\d,]+) per step", line("FLOPs")[0])[0].replace(",", ""))
    assert flops == TINY_GPT_FLOPS
    rows = line("nanoDist") + line("PyTorch")
    assert len(rows) == 3
    assert "hand-written attention" in rows[1] and "scaled_dot_product_attention" in rows[2]
    for row in rows:
        found = re.search(r"([\d.]+) ms/step\s+([\d.]+) GFLOP/s =\s+([\d.]+)% of peak", row)
        assert found, row
        ms, gflops, share = found.groups()
        # the printed time is rounded to 0.1 ms, the rate to 0.01 GFLOP/s, the share to 0.1%
        slow = flops / ((float(ms) + 0.05) * 1e-3) / 1e9
        fast = flops / (max(float(ms) - 0.05, 1e-3) * 1e-3) / 1e9
        assert slow - 0.005 <= float(gflops) <= fast + 0.005, row
        assert float(share) / 100 == pytest.approx(float(gflops) / peak, abs=0.0005 + 0.005 / peak), row
    assert re.search(r"ratio ours/PyTorch = [\d.]+", result.stdout)
    assert re.search(r"ratio ours/PyTorch SDPA = [\d.]+", result.stdout)


@pytest.mark.slow
def test_step_on_process_ranks_races_pytorch_ddp_in_the_same_ranks():
    torch = needs("torch", "torch", "PyTorch DDP is the peer")
    out = report("step", *TINY_MLP, "-n", "2", "-b", "processes", "--steps", "1", "--warmup", "0")
    ddp = out["ddp"]
    assert (ddp["world_size"], ddp["global_batch"], ddp["torch"]) == (2, 256, torch.__version__)
    assert ddp["threads_per_rank"] >= 1 and ddp["ours_s"] > 0 and ddp["torch_s"] > 0
    assert out["ratio"] == ddp["ratio"] == pytest.approx(ddp["ours_s"] / ddp["torch_s"], rel=1e-12)
    assert 0 <= ddp["comm_share"] <= 1 and "torch" not in out  # the single-rank eager race is not run


@pytest.mark.slow
def test_scaling_rows_follow_the_efficiency_formulas():
    out = report("scaling", *TINY_MLP, "--worlds", "1,2", "--steps", "1", "--warmup", "0")
    rows = {(r["mode"], r["world_size"]): r for r in out["rows"]}
    assert list(rows) == [("strong", 1), ("strong", 2), ("weak", 1), ("weak", 2)]
    assert [r["global_batch"] for r in rows.values()] == [256, 256, 256, 512]
    assert rows["strong", 1]["ours_s"] == rows["weak", 1]["ours_s"]  # one measurement serves both
    peers = ("ours", "torch") if rows["strong", 1]["torch_s"] is not None else ("ours",)
    for who in peers:
        t1 = rows["strong", 1][who + "_s"]
        strong = rows["strong", 2]
        assert strong[who + "_efficiency"] == pytest.approx(t1 / (2 * strong[who + "_s"]))
        assert rows["weak", 2][who + "_efficiency"] == pytest.approx(t1 / rows["weak", 2][who + "_s"])
        for r in rows.values():
            tokens = r["global_batch"]  # one "token" per MLP sample
            assert r[who + "_tokens_per_s"] == pytest.approx(tokens / r[who + "_s"])


@pytest.mark.parametrize("worlds", ["1,two", "0,2", ","])
def test_scaling_bad_worlds_is_one_line(worlds):
    assert_user_error(runner.invoke(app, ["bench", "scaling", "--worlds", worlds]), "--worlds")


def test_scaling_world_size_that_breaks_the_batch_is_one_line():
    result = runner.invoke(app, ["bench", "scaling", *TINY_MLP, "--worlds", "1,3"])
    assert_user_error(result, "train.global_batch")


def test_profile_splits_the_step_into_ops_and_phases():
    out = report("profile", *TINY_MLP, "--steps", "2", "--warmup", "1")
    phases, ops = out["phases"], {row["op"]: row for row in out["ops"]}
    assert phases["step"] > 0 and phases["comm_wait"] == 0
    assert {"linear", "gelu", "cross_entropy", "optimizer: AdamW update"} <= set(ops)
    assert ops["linear"]["calls"] == 2 * 2  # two layers, forward and backward
    assert ops["linear"]["forward_ms"] > 0 and ops["linear"]["backward_ms"] > 0
    timed = sum(r["forward_ms"] + r["backward_ms"] + r["optimizer_ms"] for r in out["ops"])
    other = out["other"]
    assert timed + sum(other.values()) == pytest.approx(phases["step"], rel=1e-6)
    assert min(other.values()) >= 0  # exclusive times never exceed their phase


@pytest.mark.slow  # times real steps for several seconds
def test_step_compares_precisions_taking_turns():
    tiny = ["model.n_layer=1", "model.n_embd=32", "model.n_head=2", "train.global_batch=8",
            "model.block_size=16", "data.max_chars=50000", "precision.init_scale=256"]
    out = report("step", "--preset", "quickstart", "--compare-precision", "--steps", "4", "--warmup", "1",
                 *[arg for key in tiny for arg in ("--set", key)])
    p = out["precision"]
    assert p["fp32"]["vs_fp32"] == 1.0 and p["threads"] >= 1
    for dtype in ("fp16", "bf16"):
        assert p[dtype]["step_s"] > 0 and p[dtype]["skipped"] >= 0
        assert p[dtype]["vs_fp32"] == pytest.approx(p[dtype]["step_s"] / p["fp32"]["step_s"], rel=1e-12)
    if importlib.util.find_spec("torch") is None:  # PyTorch is a test extra: without it, no peer figures
        assert p["torch"] is None
    else:
        t = p["torch"]
        assert t["fp32"]["vs_fp32"] == 1.0 and t["bf16"]["step_s"] > 0
        assert t["bf16"]["vs_fp32"] == pytest.approx(t["bf16"]["step_s"] / t["fp32"]["step_s"], rel=1e-12)


@pytest.mark.slow  # times real steps for several seconds
def test_step_cpu_time_of_one_thread_taking_turns():
    tiny = ["model.n_layer=1", "model.n_embd=32", "model.n_head=2", "train.global_batch=8",
            "model.block_size=16", "data.max_chars=50000", "precision.init_scale=256"]
    out = report("step", "--preset", "quickstart", "--cpu-time", "--steps", "4", "--warmup", "1",
                 *[arg for key in tiny for arg in ("--set", key)])
    c = out["cpu_time"]
    assert c["fp32"]["vs_fp32"] == 1.0
    for dtype in ("fp16", "bf16"):
        assert c[dtype]["cpu_s"] > 0
        assert c[dtype]["vs_fp32"] == pytest.approx(c[dtype]["cpu_s"] / c["fp32"]["cpu_s"], rel=1e-12)
    if c["torch"] is None:  # PyTorch is a test extra: without it there is no peer figure, and no ratio
        assert c["ratio"] is None
    else:
        assert c["ratio"] == pytest.approx(c["fp32"]["cpu_s"] / c["torch"]["cpu_s"], rel=1e-12)


def test_step_bad_preset_is_one_line():
    assert_user_error(runner.invoke(app, ["bench", "step", "--preset", "no-such-preset"]), "no-such-preset")


# ----------------------------------------------------------------------------- techniques

@pytest.mark.slow  # times real steps for several seconds
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


# ----------------------------------------------------------------------------- traffic

def test_traffic_counts_what_crosses_the_nodes():
    """Hybrid ZeRO-2 on 2 nodes × 2 against flat ZeRO-2 on the same grid: hybrid keeps the parameter
    gathers in the node and sends only the node shard of each bucket across, so every rank's bytes across
    nodes are its cross-node group's (plus, on the ranks whose ring neighbour is on the next node, the
    trainer's scalars); flat, the two ranks whose ring neighbour is on the next node send everything
    across, the others nothing."""
    small = ["--set", "model.n_layer=1", "--set", "model.n_embd=32", "--set", "data.max_chars=20000"]
    hybrid = report("traffic", "--preset", "hybrid-4", *small)
    flat = report("traffic", "--preset", "zero2-4", "--set", "parallel.ranks_per_node=2", *small)
    assert (hybrid["hybrid"], flat["hybrid"], hybrid["ranks_per_node"], hybrid["step"]) == (True, False, 2, 2)
    for r in hybrid["ranks"]:
        assert set(r["by_group"]) == {"world", "node", "cross"}
        assert r["across_nodes"] == r["by_group"]["cross"] + (r["by_group"]["world"] if r["rank"] % 2 else 0)
    crossing = [r["across_nodes"] for r in flat["ranks"]]
    assert crossing[0] == crossing[2] == 0
    assert [crossing[r] for r in (1, 3)] == [flat["ranks"][r]["total"] for r in (1, 3)]
    assert sum(r["across_nodes"] for r in hybrid["ranks"]) < sum(crossing)
