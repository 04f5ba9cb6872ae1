"""Published large-scale runs, projected: each run's model shape (presets/published/), its system (a cluster
file in presets/clusters/), its layout and its reported throughput, and the projection of that layout against
it. docs/planner.md gives the table and the sources; tests/projection/test_planner_published.py holds the
errors to what the docs state.

A paper's "TFLOP/s per GPU" is its own count of the work per token: Megatron-LM's (and BLOOM's, whose
Megatron-DeepSpeed counts the same way) includes the recomputed forward of activation checkpointing
(96·B·s·l·h²(1 + s/6h + V/16lh) FLOPs a step: 4 passes, not 3); Llama 3's MFU counts the model's FLOPs
only. The projection's figure is counted the same way: its tokens/s times the FLOPs per token of
engine.projection.flops (6·Ψ + attention, PaLM's count, which is the same formula term by term) plus, where
the paper counts it, the recomputed forward.

What a paper does not give is assumed and said so in `assumed` (micro-batch size, schedule, chunks), and
the model is nanoDist's GPT at the run's shape (Llama 3's SwiGLU MLP and grouped-query attention are not
modelled: a GPT of its width and depth has 410B parameters against its 405B).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from engine.config import Config
from engine.config.build import vocab_size
from engine.config.presets import load_preset
from engine.projection.clusters import Cluster, load_cluster
from engine.projection.flops import FlopsOf
from engine.projection.planner_space import Layout, apply
from engine.projection.project import predict, rank_memory
from engine.recompute import checkpointed_blocks

PRESETS = Path(__file__).resolve().parents[2] / "presets" / "published"


@dataclass(frozen=True)
class PublishedRun:
    name: str
    preset: str  # presets/published/<preset>.toml
    cluster: str
    ranks: int
    layout: Layout
    reported_tflops: float  # per GPU, as the paper counts
    counts_recompute: bool  # the paper's count includes the recomputed forward
    source: str
    assumed: str  # what the layout takes that the source does not give
    fitted: bool = False  # the cluster's efficiency was fitted to this run
    sequence_parallel: bool = False


def _layout(d: int, t: int, p: int, m: int, schedule: str = "1f1b", chunks: int = 1, zero: int = 0,
            ckpt: str = "blocks") -> Layout:
    return Layout(d, t, p, 1, 1, "tp-cp-ep-dp-pp", zero, m, schedule, chunks, ckpt, 25.0)


MEGATRON = ("Narayanan et al., \"Efficient Large-Scale Language Model Training on GPU Clusters Using "
            "Megatron-LM\", SC'21, Table 1")
MEGATRON_ASSUMED = "one sequence per micro-batch, 1F1B (Table 1 gives t, p, GPUs and batch only)"
BLOOM = ("BigScience, \"BLOOM: A 176B-Parameter Open-Access Multilingual Language Model\", 2022, section 3.4 "
         "(TP 4, PP 12, DP 8, ZeRO-1, micro-batch 2, batch 2048, 156 TFLOP/s)")
LLAMA = "Llama Team, AI @ Meta, \"The Llama 3 Herd of Models\", 2024, Table 4"
LLAMA_ASSUMED = ("one sequence per micro-batch, interleaved with 2 chunks, ZeRO-1, no recomputation, "
                 "sequence parallelism")


def _megatron(name: str, preset: str, gpus: int, layout: Layout, tflops: float, fitted: bool = False
              ) -> PublishedRun:
    return PublishedRun(f"Megatron-LM {name}, {gpus} A100", preset, "selene-a100", gpus, layout, tflops, True,
                        MEGATRON, MEGATRON_ASSUMED, fitted)


def _llama(gpus: int, dp: int, rows: int, tflops: float, mfu: str) -> PublishedRun:
    return PublishedRun(f"Llama 3 405B, {gpus} H100", "llama3-405b", "meta-h100-roce", gpus,
                        _layout(dp, 8, 16, rows, "interleaved", 2, zero=1, ckpt="none"), tflops, False,
                        f"{LLAMA} (TP 8, CP 1, PP 16, DP {dp}, sequence 8192, {rows} sequences a DP rank, "
                        f"{tflops:g} TFLOP/s, {mfu} BF16 MFU)", LLAMA_ASSUMED, sequence_parallel=True)


RUNS: tuple[PublishedRun, ...] = (
    _megatron("1.7B", "megatron-1.7b", 32, _layout(32, 1, 1, 16), 137),
    _megatron("18.4B", "megatron-18b", 256, _layout(32, 8, 1, 32), 135),
    _megatron("39.1B", "megatron-39b", 512, _layout(32, 8, 2, 48), 138),
    _megatron("145.6B", "megatron-146b", 1536, _layout(24, 8, 8, 96), 148, fitted=True),
    _megatron("310.1B", "megatron-310b", 1920, _layout(15, 8, 16, 144), 155),
    _megatron("1T", "megatron-1t", 3072, _layout(6, 8, 64, 512), 163),
    PublishedRun("BLOOM-176B, 384 A100", "bloom-176b", "jean-zay-a100", 384, _layout(8, 4, 12, 128, zero=1),
                 156, True, BLOOM, "1F1B (the paper names Megatron-DeepSpeed's pipeline, not the schedule)"),
    _llama(8192, 64, 32, 430, "43%"),
    _llama(16384, 128, 16, 400, "41%"),
)


def run_config(run: PublishedRun) -> Config:
    """The run's preset laid out as the run was (built without the launch limits, as the projection does)."""
    cfg = load_preset(str(PRESETS / f"{run.preset}.toml"))[0]
    cluster = load_cluster(run.cluster)
    laid = apply(cfg, run.layout, run.ranks, cluster["ranks_per_node"])
    return dataclasses.replace(laid, parallel=dataclasses.replace(laid.parallel,
                                                                  sequence_parallel=run.sequence_parallel))


def project_run(run: PublishedRun, efficiency: float | None = None) -> dict:
    """The projection of one run against its reported figure: TFLOP/s per GPU counted as the paper counts,
    the error, the step's split and the memory per rank. `efficiency`: the cluster's efficiency_max
    replaced (fitting it)."""
    cfg = run_config(run)
    cluster = load_cluster(run.cluster)
    if efficiency is not None:
        cluster = Cluster(cluster.path, {**cluster.values, "compute.efficiency_max": efficiency})
    vocab = vocab_size(cfg)
    flops_of = FlopsOf(cfg, vocab)
    step, mem, machine = predict(cfg, cluster, None, vocab, flops_of)
    tokens = cfg.train.global_batch * flops_of.tokens_per_row
    model = flops_of(tokens)
    work = model.training
    if run.counts_recompute:
        work += len(checkpointed_blocks(cfg.memory.checkpointing, cfg.model.n_layer)) * model.block_forward
    tflops = work / step.step_s / run.ranks / 1e12
    peak = machine.compute.peak(cfg.precision.dtype)
    _, at_peak = mem.peak()
    return {"name": run.name, "cluster": run.cluster, "ranks": run.ranks, "layout": run.layout.label(),
            "reported_tflops": run.reported_tflops, "predicted_tflops": tflops,
            "error": tflops / run.reported_tflops - 1, "step_s": step.step_s,
            "tokens_per_s": tokens / step.step_s, "mfu": model.training / step.step_s / run.ranks / peak,
            "bubble_s": step.bubble_s, "compute_s": step.compute_s, "tp_s": step.tp_s, "p2p_s": step.p2p_s,
            "peak_gb": sum(at_peak.values()) / 1e9, "memory_gb": rank_memory(cluster, 8) / 1e9,
            "fitted": run.fitted, "source": run.source, "assumed": run.assumed,
            "counts_recompute": run.counts_recompute}


def fit_efficiency(run: PublishedRun, start: float = 0.5, rounds: int = 4) -> float:
    """The efficiency_max at which the projection of `run` gives its reported TFLOP/s (the compute share of
    the step scales with 1/efficiency; a few rounds settle what the communication does not)."""
    efficiency = start
    for _ in range(rounds):
        r = project_run(run, efficiency)
        efficiency = min(1.0, efficiency * run.reported_tflops / r["predicted_tflops"])
    return efficiency
