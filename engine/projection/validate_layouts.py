"""Every parallel layout the engine trains, held to runs measured here: validate.py's rounds (calibrate for
the case, predict it, run it, compare) over LAYOUT_CASES, on the same base (the preset's model on the
processes backend, 2 ranks, 1 MiB buckets):

    DP, ZeRO         DDP, ZeRO-1, ZeRO-3 over 2 ranks
    TP, SP           tensor 2, with and without sequence parallelism; DP 2 x TP 2 on 4 ranks
    PP               2 stages, 1F1B and ZB-H1 (4 micro-batches); DP 2 x PP 2, 1F1B, on 4 ranks (the DP
                     reduce overlapped with the schedule)
    CP               context 2, zigzag and contiguous, a 256-token context (8 rows)
    EP               4 experts top-2 in every block: EP 2, and EP 1 (the same model, DP 2)

The 4-rank cases time-slice 2 ranks a core on a 2-core host. Each case is calibrated just before it runs,
on its own model, precision and rows per rank (calibrate_for): the calibration times the whole model on one
or two ranks that never communicate, the transport, and ring attention's blocks, a rank's pass with its hops
delivered locally and one hop beside one block; it never runs a tensor-parallel collective, a pipeline
schedule, a ring of ranks or an all-to-all, so those are predicted, not measured. Run:

    nanodist-tui project --validate --layouts [--repeats 2]     (just projection-validate-layouts)

and the report gives per case the step time predicted and measured, the error, model-state memory against
the ledger byte for byte, activations against the ledger's peak, and over all cases the mean and maximum
error and Kendall's tau of the ranking.
"""

from __future__ import annotations

from engine.config import Config
from engine.projection.clusters import Cluster
from engine.projection.validate import validate

LONG = {"model.block_size": 256, "train.global_batch": 8}
MOE = {"model.n_experts": 4, "model.top_k": 2}
PIPE = {"parallel.pipeline": 2, "train.micro_batches": 4}
LAYOUT_CASES: tuple[tuple[str, dict], ...] = (
    ("DP 2", {}),
    ("DP 2, ZeRO-1", {"parallel.zero_stage": 1}),
    ("DP 2, ZeRO-3", {"parallel.zero_stage": 3}),
    ("TP 2", {"parallel.tensor": 2}),
    ("TP 2, SP", {"parallel.tensor": 2, "parallel.sequence_parallel": True}),
    ("DP 2 x TP 2", {"parallel.world_size": 4, "parallel.tensor": 2}),
    ("PP 2, 1F1B, 4 micro-batches", {**PIPE, "parallel.schedule": "1f1b"}),
    ("PP 2, ZB-H1, 4 micro-batches", {**PIPE, "parallel.schedule": "zb-h1"}),
    ("DP 2 x PP 2, 1F1B, 4 micro-batches", {**PIPE, "parallel.world_size": 4, "parallel.schedule": "1f1b"}),
    ("CP 2, zigzag, 256 tokens", {**LONG, "parallel.context": 2, "parallel.context_layout": "zigzag"}),
    ("CP 2, contiguous, 256 tokens", {**LONG, "parallel.context": 2,
                                      "parallel.context_layout": "contiguous"}),
    ("MoE 4 experts top-2, EP 2", {**MOE, "parallel.expert": 2}),
    ("MoE 4 experts top-2, EP 1 (DP 2)", MOE),
)
# the layouts of a quick check: one of each dimension, on 2 ranks
QUICK_LAYOUTS = ("DP 2, ZeRO-1", "TP 2, SP", "PP 2, 1F1B, 4 micro-batches", "CP 2, zigzag, 256 tokens",
                 "MoE 4 experts top-2, EP 2")


def layout_cases(quick: bool = False) -> tuple[tuple[str, dict], ...]:
    return tuple(case for case in LAYOUT_CASES if not quick or case[0] in QUICK_LAYOUTS)


def validate_layouts(base: Config, cluster: Cluster, repeats: int = 2, quick: bool = False,
                     **options) -> dict:
    """validate.py's report over LAYOUT_CASES (`quick`: QUICK_LAYOUTS); `options` go to validate (steps,
    warmup, on_progress, calibration_steps)."""
    return validate(base, cluster, repeats=repeats, cases=layout_cases(quick), **options)
