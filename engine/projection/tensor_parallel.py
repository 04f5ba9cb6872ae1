"""Tensor and sequence parallelism in the step model: what a rank of a TP group sends per layer, on which
link, what it costs, and how its compute divides. Inert at t = 1: no collectives, compute unchanged.

The collectives are the plan's (engine.parallel.tensor), each of b·s·h activations in the training dtype
(b rows per micro-batch, s tokens, h the width; s/c under context parallelism, a rank's share of each row):

    per block  TP       forward 2 all-reduces (g, after attention's and the MLP's row-parallel products);
                        backward 2 all-reduces (f: the column-parallel products' input gradients)
               TP + SP  forward 2 all-gathers (before the column products) and 2 reduce-scatters (after
                        the row products); backward the mirror
    around     the vocab-parallel embedding's all-reduce (forward); the output layer's f (an all-reduce
               backward; under SP an all-gather forward and a reduce-scatter backward); under SP the
               embedding's scatter (an all-gather backward); the loss's 3 all-reduces of b·s values
               (max, target logit, sum of exp; in the compute dtype)
    per step   the gradient norm's sum of squares over the group (one fp64 value), in fp16 the overflow
               flag (two); under SP the all-reduce of the sequence region's replicated gradients
               (LayerNorms, row-parallel biases)
    recompute  a checkpointed block's forward issues its collectives again in backward

An MLP model pairs its layers (column, then row): an all-reduce of the pair's output forward, and of its
input gradient backward (none for the first pair: the data needs no gradient).

Their cost is collective_times.py's on the TP group's placement (group_comm.py): with TP innermost a group
of t ≤ ranks_per_node ranks is one node's (the intra-node link); a larger one spans nodes, and every ring
step waits for the inter-node link. On a ring, for an n-byte buffer:

    all-reduce       2(t−1)α + 2(t−1)/t·nβ + (t−1)/t·nγ
    all-gather       (t−1)α + (t−1)/t·nβ
    reduce-scatter   (t−1)α + (t−1)/t·nβ + (t−1)/t·nγ

so SP's all-gather + reduce-scatter cost what TP's all-reduce does: the same bytes, the same messages.

Exposed: all of it. The training thread runs these collectives inside forward and backward, and the next
op needs each result, so none hides behind compute (Timeline.inline); DP's buckets keep going on the
communication thread meanwhile.

Compute: the products (QKV, attention's two, the projections, the MLP, the head) split t ways. A rank's
share is the work of the whole model on b·s/t tokens, and it is timed so: T(b·s/t), the whole model's
seconds at that size (compute.py's rate by size: products t times smaller fill a machine less, and a
calibrated curve keeps its fixed costs per op). What does not split: the regions outside the products —
per block the two LayerNorms, the two residual adds and (with dropout) the two residual dropouts; outside
the blocks the embedding's sum, its dropout and the final LayerNorm — each rank does them on all b·s·h,
unless SP splits them by sequence. They are memory-bound: REPLICATED_PASSES passes over b·s·h at the
rank's copy rate (compute.copy_s), R. So a phase takes

    T(b·s/t) + (1 − 1/t)·R     (T(b·s/t) holds R/t of it)        under SP: T(b·s/t)

and at t = 1 exactly what it did before tensor parallelism.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from engine.dtypes import compute_dtype, itemsize
from engine.memory.tensor_parallel import rank_shapes, sequence_region_numel
from engine.projection.flops import BackwardEvent
from engine.projection.group_comm import GroupComm, group_members
from engine.projection.machine import Machine
from engine.projection.timeline import Timeline

# passes over b·s·h a rank makes outside the split products (forward; backward twice as many), each at the
# rank's copy rate: per block 2 LayerNorms + 2 residual adds (+ 2 dropouts), outside the embedding's sum
# and ln_f (+ the embedding's dropout)
REPLICATED_PASSES = {"block": 4, "block_dropout": 2, "outside": 2, "outside_dropout": 1}
# the once-a-step agreements over the group, each a few fp64 values (timed as the small all-reduces they
# are, GroupComm.scalars): the gradient norm's sum of squares, and in fp16 the overflow flag and where it is
SCALARS = {"tp-norm-all-reduce": 1, "tp-flag-all-reduce": 2}


@dataclass(frozen=True)
class Collective:
    kind: str  # "all-reduce" | "all-gather" | "reduce-scatter"
    nbytes: int  # the whole buffer: an all-gather's result, a reduce-scatter's input
    phase: str  # as the traffic meter books it (engine.parallel.tensor.mappings)

    def sent(self, t: int) -> float:
        """Bytes each rank sends on a ring of t ranks."""
        return (2 if self.kind == "all-reduce" else 1) * (t - 1) / t * self.nbytes


def _c(kind: str, nbytes: int, direction: str) -> Collective:
    """An activation collective, named as mappings.py books it: tp-fwd-all-reduce, sp-bwd-all-gather, ..."""
    return Collective(kind, nbytes, f"{'tp' if kind == 'all-reduce' else 'sp'}-{direction}-{kind}")


class TensorParallel:
    """The TP term of one config on one machine: its collectives by place, their seconds on the group's
    link, the compute split; `spent_s`, `count` and `sent` add up what a step's replay issued."""

    def __init__(self, cfg, vocab: int, rows: int, machine: Machine):
        p, m, dtype = cfg.parallel, cfg.model, cfg.precision.dtype
        self.gpt = m.kind == "gpt"
        self.degree, self.sp = p.tensor, bool(p.sequence_parallel and p.tensor > 1 and self.gpt)
        self.active = self.degree > 1
        self.unit_forward: dict[int, list[Collective]] = {}
        self.embedding_forward: list[Collective] = []
        self.head_forward: list[Collective] = []
        self.before: dict[tuple, list[Collective]] = {}
        self.after: dict[tuple, list[Collective]] = {}
        self.per_step: list[Collective] = []
        # a rank's tokens: the block_size / context it holds of each sequence under context parallelism
        self.tokens_per_row = m.block_size // p.context if self.gpt else 0
        self.activation = rows * self.tokens_per_row * m.n_embd * itemsize(dtype)
        self.spent_s, self.count, self.sent = 0.0, 0, 0.0
        self.issued: Counter[Collective] = Counter()  # every collective the step's replay ran, counted
        per_node = machine.topology.per_node
        self.comm = GroupComm(machine, group_members(p, "tp", per_node)) if self.active else None
        self.copy_s = machine.compute.copy_s(self.activation, machine.ranks_on_host) if self.gpt else 0.0
        self.dropout = m.dropout if self.gpt else 0.0
        self.n_layer = m.n_layer if self.gpt else 0
        self.rows = rows
        self._seconds: dict[Collective, float] = {}
        if not self.active:
            return
        if self.gpt:
            self._gpt(cfg, vocab, rows, compute_dtype(dtype).itemsize)
        else:
            self._mlp(m.widths, rows, itemsize(dtype))
        agreed = ["tp-norm-all-reduce"] + (["tp-flag-all-reduce"] if dtype == "fp16" else [])  # loss scaler
        self.per_step += [Collective("all-reduce", 8 * SCALARS[phase], phase) for phase in agreed]

    def _gpt(self, cfg, vocab: int, rows: int, loss_itemsize: int) -> None:
        n, act = cfg.model.n_layer, self.activation
        self.embedding_forward = [_c("all-reduce", act, "fwd")]
        if self.sp:
            gather, scatter = _c("all-gather", act, "fwd"), _c("reduce-scatter", act, "fwd")
            self.unit_forward = {k: [gather, scatter, gather, scatter] for k in range(n)}
            for k in range(n):
                for row, column in (("mlp.layers.1", "mlp.layers.0"), ("attn.c_proj", "attn.c_attn")):
                    self.before[(k, row)] = [_c("all-gather", act, "bwd")]
                    self.after[(k, column)] = [_c("reduce-scatter", act, "bwd")]
            self.head_forward = [gather]
            self.after[(None, "head")] = [_c("reduce-scatter", act, "bwd")]
            self.before[(None, "embeddings")] = [_c("all-gather", act, "bwd")]
            region = sequence_region_numel(cfg, rank_shapes(cfg, vocab)) * itemsize(cfg.precision.dtype)
            self.per_step.append(Collective("all-reduce", region, "sp-grad-all-reduce"))
        else:
            reduce = _c("all-reduce", act, "fwd")
            self.unit_forward = {k: [reduce, reduce] for k in range(n)}
            for k in range(n):
                for column in ("mlp.layers.0", "attn.c_attn"):
                    self.after[(k, column)] = [_c("all-reduce", act, "bwd")]
            self.after[(None, "head")] = [_c("all-reduce", act, "bwd")]
        values = rows * self.tokens_per_row * loss_itemsize
        self.head_forward = self.head_forward + [Collective("all-reduce", values, "tp-loss-all-reduce")] * 3

    def _mlp(self, widths, rows: int, size: int) -> None:
        for i in range(0, len(widths) - 1, 2):
            self.unit_forward[i + 1] = [_c("all-reduce", rows * widths[i + 2] * size, "fwd")]
            if i:  # the first pair's input is the data: no gradient, no all-reduce
                self.after[(i, f"layers.{i}")] = [_c("all-reduce", rows * widths[i] * size, "bwd")]

    # ---- cost -----------------------------------------------------------------------------------------

    def seconds(self, c: Collective) -> float:
        """One collective's seconds on the group's link."""
        if c not in self._seconds:
            assert self.comm is not None
            if c.phase in SCALARS:
                seconds = self.comm.scalars(SCALARS[c.phase])[0]
            elif c.kind == "all-reduce":
                seconds = self.comm.all_reduce(c.nbytes)[0]
            else:
                seconds = self.comm.half(c.nbytes, reduce=c.kind == "reduce-scatter")[0]
            self._seconds[c] = seconds
        return self._seconds[c]

    def issue(self, tl: Timeline, collectives: list[Collective]) -> None:
        """Run them on the training thread, one after another: all exposed."""
        for c in collectives:
            seconds = self.seconds(c)
            tl.inline(seconds)
            self.spent_s += seconds
            self.count += 1
            self.sent += c.sent(self.degree)
            self.issued[c] += 1

    def replicated_s(self, what: str) -> float:
        """Seconds of the regions TP does not split in one micro-batch's "forward" or "backward" of the
        whole model, or one "block"'s forward (a GPT's; 0 for an MLP, whose every layer is split)."""
        if not self.gpt:
            return 0.0
        drop = bool(self.dropout)
        block = REPLICATED_PASSES["block"] + drop * REPLICATED_PASSES["block_dropout"]
        if what == "block":
            return block * self.copy_s
        outside = REPLICATED_PASSES["outside"] + drop * REPLICATED_PASSES["outside_dropout"]
        passes = self.n_layer * block + outside
        return passes * self.copy_s * (2 if what == "backward" else 1)

    def tokens(self, tokens: float) -> float:
        """The tokens whose whole-model work equals a rank's share: b·s/t."""
        return tokens / self.degree

    def split(self, share_s: float, what: str) -> float:
        """A phase on one rank of the group, from `share_s`: the whole model's seconds at b·s/t tokens (its
        FLOPs are the rank's, its speed that of products t times smaller). Without SP the regions TP does
        not split run on all b·s tokens: the other (1 − 1/t) of them are added."""
        if not self.active or self.sp:
            return share_s
        r = min(self.replicated_s(what), self.degree * share_s)
        return share_s + (1 - 1 / self.degree) * r

    # ---- where they run in a step ----------------------------------------------------------------------

    def forward(self, tl: Timeline, t_fwd: float, t_units: list[float]) -> None:
        """One micro-batch's forward: the embedding, each unit then its collectives, the head and loss."""
        if not self.active:
            tl.compute(t_fwd)
            return
        self.issue(tl, self.embedding_forward)
        for k, seconds in enumerate(t_units):
            tl.compute(seconds)
            self.issue(tl, self.unit_forward.get(k, []))
        tl.compute(max(0.0, t_fwd - sum(t_units)))
        self.issue(tl, self.head_forward)

    def backward(self, tl: Timeline, event: BackwardEvent, seconds: float, recomputed: bool) -> None:
        """One piece of backward with the collectives before and after it; a checkpointed block's first
        piece runs its recomputed forward, collectives included, first."""
        if recomputed and event.block is not None:
            self.issue(tl, self.unit_forward.get(event.block, []))
        self.issue(tl, self.before.get((event.block, event.layer), []))
        tl.compute(seconds)
        self.issue(tl, self.after.get((event.block, event.layer), []))

    # ---- what the report shows --------------------------------------------------------------------------

    def layer(self) -> list[Collective]:
        """One block's collectives, forward then backward (an MLP: its second pair's, or its only one's)."""
        if not self.active:
            return []
        if self.gpt:
            back = [c for key, cs in (*self.before.items(), *self.after.items()) if key[0] == 0 for c in cs]
            return self.unit_forward[0] + back
        first = 2 if (2, "layers.2") in self.after else 0
        return self.unit_forward[first + 1] + self.after.get((first, f"layers.{first}"), [])

    def summary(self, issued: Counter[Collective] | None = None) -> dict:
        """The TP term as the report shows it (empty at t = 1): the step's figures add up `issued` (a
        rank's collectives of one step, counted), by default what this term's replay of the step issued."""
        if not self.active:
            return {}
        assert self.comm is not None
        if issued is not None:
            return {**self.summary(), **self._step_figures(issued)}
        topo = self.comm.topology
        layer = self.layer()
        return {"degree": self.degree, "sequence_parallel": self.sp, "nodes": topo.nodes, "rows": self.rows,
                "link": "intra-node" if topo.nodes == 1 else "inter-node",
                "per_layer": [{"kind": c.kind, "phase": c.phase, "bytes": c.nbytes} for c in layer],
                "layer_s": sum(self.seconds(c) for c in layer),
                "layer_sent_bytes": sum(c.sent(self.degree) for c in layer),
                "step_s": self.spent_s, "exposed_s": self.spent_s, "collectives": self.count,
                "sent_bytes": self.sent,
                "per_step": [{"kind": c.kind, "phase": c.phase, "bytes": c.nbytes, "count": n}
                             for c, n in self.issued.items()]}

    def _step_figures(self, issued: Counter[Collective]) -> dict:
        spent = sum(self.seconds(c) * n for c, n in issued.items())
        return {"step_s": spent, "exposed_s": spent, "collectives": sum(issued.values()),
                "sent_bytes": sum(c.sent(self.degree) * n for c, n in issued.items()),
                "per_step": [{"kind": c.kind, "phase": c.phase, "bytes": c.nbytes, "count": n}
                             for c, n in issued.items()]}
