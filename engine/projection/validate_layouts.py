"""Context and expert parallelism held to runs measured here: validate.py's rounds (calibrate for the case,
predict it, run it, compare) over cases of their own, on the same base (gpt-mini on the processes backend,
2 ranks, 1 MiB buckets):

    CP 2, zigzag and contiguous   a 256-token context (8 rows): ring attention's hops and the busiest rank's
                                  attention blocks (contiguous: the last rank computes twice the first's)
    MoE, EP 2 and EP 1            4 experts, top-2, every block: the all-to-alls and the experts' reduce,
                                  against the same model with every expert local (DP 2)

Each case is calibrated on its own model and rows (calibrate_for): the calibration never runs ring
attention or an all-to-all, so those are predicted, not measured. Run:

    just projection-validate-layouts
"""

from __future__ import annotations

from engine.config import Config
from engine.projection.clusters import Cluster
from engine.projection.validate import validate

LONG = {"model.block_size": 256, "train.global_batch": 8}
MOE = {"model.n_experts": 4, "model.top_k": 2}
LAYOUT_CASES: tuple[tuple[str, dict], ...] = (
    ("CP 2, zigzag, 256 tokens", {**LONG, "parallel.context": 2, "parallel.context_layout": "zigzag"}),
    ("CP 2, contiguous, 256 tokens", {**LONG, "parallel.context": 2,
                                      "parallel.context_layout": "contiguous"}),
    ("MoE 4 experts top-2, EP 2", {**MOE, "parallel.expert": 2}),
    ("MoE 4 experts top-2, EP 1 (DP 2)", MOE),
)


def validate_layouts(base: Config, cluster: Cluster, repeats: int = 2) -> dict:
    """validate.py's report over LAYOUT_CASES."""
    return validate(base, cluster, repeats=repeats, cases=LAYOUT_CASES)
