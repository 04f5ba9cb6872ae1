"""The busiest expert-parallel rank's rows over the mean (the projection's λ, expert.py), from routing as a
model really routes: the tokens each expert of each MoE layer took, forward by forward.

With e ranks in an EP group, rank j holds the E/e consecutive experts engine.parallel.expert.layer gives it
(owned_experts), so its rows in one layer are the sum of their counts. A layer's all-to-alls and its experts'
compute wait for that layer's busiest rank; a step passes every MoE layer in turn, so a forward's λ is the
mean over its layers of (busiest rank's rows) / (the rank mean), and the figure kept is the median over
forwards (one that a burst of tokens to one expert made unusual does not set it).

The calibration (compute_calibration.py) counts the routing of the rows it trains on one rank: one rank's
share of a group's tokens routes like the group's, but a sample of fewer tokens spreads more, so λ from it is,
if anything, a little high.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import numpy as np

from engine.parallel.expert.layer import owned_experts


def routing_imbalance(counts: Sequence[Sequence[np.ndarray]], ranks: int) -> float:
    """λ for an EP group of `ranks` ranks: `counts[layer][forward]` the tokens each expert took."""
    forwards = min(len(layer) for layer in counts)
    per_forward = []
    for f in range(forwards):
        ratios = []
        for layer in counts:
            taken = np.asarray(layer[f], dtype=np.float64)
            rows = [taken[owned_experts(len(taken), ranks, j)].sum() for j in range(ranks)]
            if sum(rows) > 0:
                ratios.append(max(rows) / (sum(rows) / ranks))
        if ratios:
            per_forward.append(statistics.mean(ratios))
    return float(statistics.median(per_forward)) if per_forward else 1.0


def imbalance_by_degree(counts: Sequence[Sequence[np.ndarray]], n_experts: int) -> dict[str, float]:
    """{str(e): λ} for every EP degree e > 1 that divides the experts (the keys a calibration stores)."""
    return {str(e): routing_imbalance(counts, e) for e in range(2, n_experts + 1) if n_experts % e == 0}
