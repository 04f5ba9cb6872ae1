"""The planner: which layout of N ranks trains a model fastest on a cluster, and why the others lose.

Every layout of the search space (planner_space.py) is either refused by the config rules, or judged:
its memory per rank by the estimator (engine.memory.estimator, the prediction the ledger tests hold to
the byte) against what a rank has, then its step by the projection (engine.projection.step: compute,
communication per group, the pipeline's bubble), as `nanodist-tui project` predicts it. The best `top`
that fit are ranked by predicted step time (the global batch is the same for all: tokens/s is the same
order); every other layout gets one reason:

    refused        a config rule's one line (what a run would refuse)
    does not fit   the category that holds the most at the peak, and the peak against the rank's memory
    slower         the term of its step that exceeds the first choice's the most (compute, the bubble,
                   one group's exposed communication), or, if it was never projected, the bound that
                   shows it cannot win
    not evaluated  the search's time budget ran out before it (its bound is given)

The search stays within seconds by bounding before projecting (branch and bound). A layout's compute and
bubble alone are cheap (its FLOPs at the rate of its micro-batch's size, and the schedule's published
bubble), and no layout's step is shorter (only an approximate bound under context parallelism: half the
attention is taken off it, the most a layout can save there); layouts are taken in the order of that
bound, and once `top` layouts fit, one whose bound exceeds the `top`-th step cannot enter. A layout that
differs from a projected one only in the axis order, the ZeRO stage or the bucket size has the same compute
and bubble; what it can change is the data-parallel reduce and the optimizer, so the projected one's step
less those is its bound. Memory is bounded too: Ψ/(t·p) parameters at least, with what ZeRO shards
divided by the data x context degree, and the activations of the rank's blocks for the micro-batches a
pipeline's first stage holds (all of GPipe's, min(p, m) of the others'; one without a pipeline); the
states are the average stage's, so with a pipeline the larger of the two bounds the heaviest rank; a
layout whose bound exceeds the rank's memory is not estimated further.
"""

from __future__ import annotations

import bisect
import math
import time
from dataclasses import dataclass, field

from engine.config import Config
from engine.config.build import param_shapes, vocab_size
from engine.dtypes import itemsize, master_dtype
from engine.memory.estimator import estimate
from engine.memory.expert import EXPERTS
from engine.parallel.mesh import Mesh
from engine.parallel.pipeline.schedules import formula_bubble
from engine.projection.calibrate import Calibration
from engine.projection.clusters import Cluster
from engine.projection.flops import FlopsOf
from engine.projection.machine import make_machine
from engine.projection.planner_space import Layout, apply, layouts, problem
from engine.projection.project import rank_memory
from engine.projection.step import predict_step
from engine.projection.step_parts import StepBreakdown
from engine.recompute import checkpointed_blocks

GB = 1e9
TIE = 1e-4  # steps this close (relative) are the same prediction: the preferred variant is ranked
DEFAULT_BUDGET_S = 30.0
TERMS = ("compute", "bubble", "dp", "tp", "pp", "cp", "ep")  # a step's split, as the report names it


@dataclass
class Candidate:
    """A layout and what the search found of it."""

    layout: Layout
    bound_s: float = 0.0
    verdict: str = ""  # "ranked" | "refused" | "does not fit" | "slower" | "not evaluated"
    why: str = ""
    step: StepBreakdown | None = None
    tokens_per_s: float = 0.0
    mfu: float = 0.0
    memory: dict = field(default_factory=dict)  # category -> bytes at its own peak
    at_peak: dict = field(default_factory=dict)  # category -> bytes at the peak phase
    peak_bytes: int = 0

    def split(self) -> dict[str, float]:
        """The step's parts: compute, the bubble, each group's exposed communication (seconds)."""
        s = self.step
        if s is None:
            return {}
        groups = {"tp": s.tp_s, "pp": s.p2p_s, "cp": s.cp_s, "ep": s.ep_s, "bubble": s.bubble_s}
        dp = max(0.0, s.step_s - s.compute_s - sum(groups.values()))  # the rest: the gradient reduce, ZeRO
        return {"compute": s.compute_s, **groups, "dp": dp}

    def as_dict(self) -> dict:
        out = {"layout": self.layout.as_dict(), "label": self.layout.label(), "verdict": self.verdict,
               "why": self.why, "bound_s": self.bound_s}
        if self.step is not None:
            out.update(step_s=self.step.step_s, tokens_per_s=self.tokens_per_s, mfu=self.mfu,
                       split=self.split(), breakdown=self.step.as_dict())
        if self.memory:
            out.update(memory=self.memory, at_peak=self.at_peak, peak_bytes=self.peak_bytes)
        return out


class _Judge:
    """The model, the cluster and the figures every candidate shares; each candidate's bound, memory and
    step."""

    def __init__(self, cfg: Config, cluster: Cluster, ranks: int, capacity: float,
                 calibration: Calibration | None):
        self.cfg, self.cluster, self.ranks, self.capacity = cfg, cluster, ranks, capacity
        self.calibration = calibration
        self.vocab = vocab_size(cfg) if cfg.model.kind == "gpt" else 0
        self.flops_of = FlopsOf(cfg, self.vocab)
        self.per_node = cluster["ranks_per_node"] if ranks > cluster["ranks_per_node"] else 0
        shapes = param_shapes(cfg, self.vocab)
        self.params = sum(math.prod(s) for _, s, _ in shapes)
        self.expert_params = sum(math.prod(s) for name, s, _ in shapes if EXPERTS in name)
        self._bounds: dict = {}
        self._flops: dict = {}
        self._problems: dict = {}
        self._memory: dict = {}

    def laid(self, layout: Layout) -> Config:
        return apply(self.cfg, layout, self.ranks, self.per_node)

    def machine(self, cfg: Config):
        return make_machine(self.cluster, cfg, self.ranks, self.calibration, self.flops_of)

    # ---- bounds ---------------------------------------------------------------------------------------

    def bound(self, layout: Layout) -> float:
        """Seconds of compute and bubble: no step of this layout is shorter (see the module docstring)."""
        if layout.shape not in self._bounds:
            self._bounds[layout.shape] = self._bound(layout)
        return self._bounds[layout.shape]

    def _bound(self, layout: Layout) -> float:
        cfg = self.laid(layout)
        m = layout.micro_batches
        rows = cfg.train.global_batch // (Mesh.of(cfg.parallel).dp * m)
        tokens = rows * self.flops_of.tokens_per_row / (layout.tensor * layout.context)
        if tokens not in self._flops:
            self._flops[tokens] = self.flops_of(tokens)
        flops = self._flops[tokens]
        compute, dtype = self.machine(cfg).compute, cfg.precision.dtype
        k = min(self.ranks, self.cluster["ranks_per_node"])
        forward = compute.rate("forward", dtype, tokens, k)
        backward = compute.rate("backward", dtype, tokens, k)
        attention = 0.0
        if layout.context > 1:  # the busiest rank computes at least half the full square (zigzag)
            mm = cfg.model
            attention = 0.5 * 4.0 * mm.block_size * mm.n_embd * flops.tokens * mm.n_layer
        experts = 1.0
        recomputed = len(checkpointed_blocks(layout.checkpointing, cfg.model.n_layer)) \
            if cfg.model.kind == "gpt" else 0
        per_micro = ((flops.forward - attention) / forward + (flops.backward - 2 * attention) / backward
                     + recomputed * flops.block_forward / forward) * experts
        per_rank = m * per_micro / layout.pipeline
        if layout.pipeline == 1:
            return per_rank
        _, bubble = formula_bubble(layout.schedule, layout.pipeline, m, layout.chunks)
        return per_rank / (1.0 - bubble)

    def memory_bound(self, layout: Layout) -> tuple[float, float]:
        """(model states, activations): bytes a rank holds at least (see the module docstring)."""
        dtype = self.cfg.precision.dtype
        s, f = itemsize(dtype), master_dtype(dtype).itemsize
        master = f if s != f else 0
        shared = (self.params - self.expert_params + self.expert_params / layout.expert)
        psi = shared / (layout.tensor * layout.pipeline)
        n = layout.data * layout.context
        params, grads, optimizer = float(s), float(s), float(2 * f + master)
        if layout.zero >= 1:
            optimizer /= n
        if layout.zero >= 2:
            grads /= n
        if layout.zero >= 3:
            params /= n
        m = self.cfg.model
        if m.kind != "gpt":
            return psi * (params + grads + optimizer), 0.0
        # one micro-batch of the rank's blocks: each keeps its input (checkpointed), else 4 + 12/t arrays
        # of b·(s/c)·h (the LayerNorms', QKV, attention and MLP inputs; TP splits all but the 4 replicated)
        rows = self.cfg.train.global_batch // (layout.data * layout.micro_batches)
        arrays = 1.0 if layout.checkpointing != "none" else 4 + 12 / layout.tensor
        blocks = m.n_layer // layout.pipeline
        # a pipeline's first stage holds the micro-batches in flight: all of GPipe's, min(p, m) of 1F1B's
        m_ = layout.micro_batches
        flight = m_ if layout.schedule == "gpipe" else min(layout.pipeline, m_)
        activations = flight * blocks * arrays * rows * (m.block_size // layout.context) * m.n_embd * s
        return psi * (params + grads + optimizer), activations

    # ---- the estimator and the projection ---------------------------------------------------------------

    def memory(self, layout: Layout, cfg: Config):
        """The estimate, shared by the layouts it cannot tell apart (order; buckets below ZeRO-2)."""
        key = (layout.shape, layout.zero, layout.bucket_mb if layout.zero >= 2 else None)
        if key not in self._memory:
            self._memory[key] = estimate(cfg, self.vocab)
        return self._memory[key]

    def judge(self, cand: Candidate) -> None:
        """Memory, then (if it fits) the step: sets the candidate's verdict unless it is ranked."""
        layout = cand.layout
        cfg = self.laid(layout)
        states, activations = self.memory_bound(layout)
        # one rank holds both without a pipeline; with one, the average stage's states and the first stage's
        # activations may be two ranks' (the heaviest holds at least either)
        least = states + activations if layout.pipeline == 1 else max(states, activations)
        if self.capacity and least > self.capacity:
            cand.verdict = "does not fit"
            what = "model states" if states >= activations else "activations"
            cand.why = (f"at least {least / GB:.1f} GB (model states {states / GB:.1f}, "
                        f"activations {activations / GB:.1f}) over the {self.capacity / GB:.1f} GB a rank "
                        f"has; {what} hold the most")
            return
        key = (layout.shape, layout.zero)  # what the rules read of a layout (its buckets and order: nothing)
        if key not in self._problems:
            self._problems[key] = problem(cfg)
        if self._problems[key] is not None:
            cand.verdict, cand.why = "refused", self._problems[key]
            return
        mem = self.memory(layout, cfg)
        phase, at_peak = mem.peak()
        cand.memory, cand.at_peak = mem.category_peaks(), dict(at_peak)
        cand.peak_bytes = sum(at_peak.values())
        if self.capacity and cand.peak_bytes > self.capacity:
            largest = max(at_peak, key=at_peak.__getitem__)
            cand.verdict = "does not fit"
            cand.why = (f"{cand.peak_bytes / GB:.1f} GB at its peak ({phase}) over the "
                        f"{self.capacity / GB:.1f} GB a rank has; {largest} hold the most, "
                        f"{at_peak[largest] / GB:.1f} GB")
            return
        owned = mem.states["adam_m"] // master_dtype(cfg.precision.dtype).itemsize
        machine = self.machine(cfg)
        try:
            cand.step = predict_step(cfg, machine, self.flops_of, owned)
        except (ZeroDivisionError, ValueError) as e:  # a layout the projection cannot take yet: said so
            cand.verdict = "not evaluated"
            cand.why = f"the projection cannot take this layout yet ({type(e).__name__}: {e})"
            return
        tokens = cfg.train.global_batch * self.flops_of.tokens_per_row
        cand.tokens_per_s = tokens / cand.step.step_s
        per_token = self.flops_of(tokens).training / tokens
        peak = machine.compute.peak(cfg.precision.dtype)
        cand.mfu = cand.tokens_per_s * per_token / (self.ranks * peak) if peak else 0.0


def plan(cfg: Config, cluster: Cluster, ranks: int, memory_per_rank: float | None = None, top: int = 5,
         calibration: Calibration | None = None, budget_s: float = DEFAULT_BUDGET_S) -> dict:
    """The search (module docstring). `memory_per_rank`: bytes (default: the cluster's per rank, 0 for
    unknown: every layout fits). Returns {"ranked": [Candidate], "rest": [Candidate], "counts", ...}."""
    started = time.perf_counter()
    capacity = memory_per_rank if memory_per_rank is not None else rank_memory(
        cluster, min(ranks, cluster["ranks_per_node"]))
    judge = _Judge(cfg, cluster, ranks, capacity, calibration)
    replica = judge.params * itemsize(cfg.precision.dtype)
    cands = [Candidate(layout) for layout in layouts(cfg, ranks, replica)]
    for cand in cands:
        cand.bound_s = judge.bound(cand.layout)
    order = sorted(range(len(cands)), key=lambda i: (cands[i].bound_s, i))  # ties: the preferred variant
    steps: list[float] = []  # the fitting layouts' steps, ascending
    projected: dict[tuple, Candidate] = {}  # shape -> its first projected variant
    for i in order:
        cand = cands[i]
        kth = steps[top - 1] if len(steps) >= top else math.inf
        sibling = projected.get(cand.layout.shape)
        bound = cand.bound_s
        if sibling is not None and sibling.step is not None:
            s = sibling.step
            bound = max(bound, s.step_s - sibling.split()["dp"] - s.optimizer_s)
        if bound >= kth:
            cand.verdict = "slower"
            cand.why = _bound_reason(cand, bound, kth, sibling)
            continue
        if time.perf_counter() - started > budget_s:
            cand.verdict, cand.why = "not evaluated", f"the search's {budget_s:g} s ran out (its bound " \
                                                      f"{bound * 1e3:.4g} ms)"
            continue
        judge.judge(cand)
        if cand.step is not None:
            projected.setdefault(cand.layout.shape, cand)
            bisect.insort(steps, cand.step.step_s)
    fitting = sorted((c.step.step_s, i, c) for i, c in enumerate(cands) if c.step is not None)
    ranked: list[Candidate] = []
    kept: list[float] = []  # the ranked ones' steps
    for step_s, _, c in fitting:
        same = next((r for r, k in zip(ranked, kept) if r.layout.shape == c.layout.shape
                     and abs(k - step_s) <= TIE * k), None)
        if same is not None:
            c.verdict = "slower"
            c.why = f"predicts the step of #{ranked.index(same) + 1} ({same.layout.label()}): no faster"
        elif len(ranked) < top:
            c.verdict = "ranked"
            ranked.append(c)
            kept.append(step_s)
        else:
            c.verdict, c.why = "slower", _slower_reason(c, ranked[0])
    rest = sorted((c for c in cands if c.verdict != "ranked"), key=_rest_order)
    counts: dict[str, int] = {}
    for c in rest:
        counts[c.verdict] = counts.get(c.verdict, 0) + 1
    return {"preset": cfg.name, "cluster": cluster.name, "ranks": ranks, "capacity_bytes": capacity,
            "global_batch": cfg.train.global_batch, "ranked": ranked, "rest": rest,
            "counts": {"layouts": len(cands), "ranked": len(ranked), **counts},
            "projected": sum(c.step is not None for c in cands), "search_s": time.perf_counter() - started}


def _rest_order(c: Candidate) -> tuple:
    """The projected losers first (their reasons name a term of the step), then the bounded ones."""
    rank = {"slower": 0, "does not fit": 1, "not evaluated": 2, "refused": 3}.get(c.verdict, 4)
    tie = c.why.startswith("predicts the step of")  # a variant that changes nothing: last of the projected
    return (rank, c.step is None, tie, c.step.step_s if c.step is not None else c.bound_s)


def _slower_reason(c: Candidate, best: Candidate) -> str:
    """The term of c's step that exceeds the first choice's the most."""
    mine, theirs = c.split(), best.split()
    term = max(mine, key=lambda k: mine[k] - theirs.get(k, 0.0))
    assert c.step is not None and best.step is not None
    extra = (c.step.step_s / best.step.step_s - 1) * 100
    what = _term_name(term)
    return (f"{extra:.1f}% slower than the first choice: {what} {mine[term] * 1e3:.4g} ms against "
            f"{theirs.get(term, 0.0) * 1e3:.4g} ms")


def _bound_reason(c: Candidate, bound: float, kth: float, sibling: Candidate | None) -> str:
    if sibling is not None and bound > c.bound_s:
        return (f"differs from {sibling.layout.label()} only in order, ZeRO or buckets: at least "
                f"{bound * 1e3:.4g} ms, not under the {kth * 1e3:.4g} ms of the last ranked")
    what = "compute and bubble" if c.layout.pipeline > 1 else "compute"
    return f"its {what} alone take {bound * 1e3:.4g} ms, not under the {kth * 1e3:.4g} ms of the last ranked"


def _term_name(term: str) -> str:
    return {"compute": "compute", "bubble": "the bubble", "dp": "exposed data-parallel communication",
            "tp": "exposed tensor-parallel communication", "pp": "pipeline messages",
            "cp": "exposed context-parallel communication",
            "ep": "exposed expert-parallel communication"}[term]
