"""The gradient side of expert parallelism: the replica interface (engine/parallel/data/__init__.py) over
two kinds of parameters that are reduced over different groups.

    replicated parameters   every data-parallel rank holds them alike: the data-parallel replica (DDP or
                            ZeRO 1-2) the trainer made, over the dp group (it leaves the split experts out:
                            engine.parallel.expert.plan.replicated_parameters)
    the split experts       this rank's E/e experts of each MoE layer: their own flat buffer and AdamW,
                            reduced over the edp group (the ranks holding the same experts)

ZeRO (parallel.zero_stage) shards each kind over its own group: the replicated parameters over dp as
without experts, the experts' state over edp (D/e ranks, their flat buffer padded to a multiple of it;
rank r of edp owns part r). Per stage, the experts:

    stage 0   whole gradient buffer; all-reduced (average) over edp; AdamW over everything
    stage 1   whole gradient buffer; reduce-scattered over edp; AdamW (and the fp32 master) over part r;
              the parameters all-gathered over edp after the update
    stage 2   as stage 1, but the whole gradient buffer lives only from zero_grad to the reduce: at rest
              a rank keeps its part r of the gradients

The experts' reduce runs once per step, after the last micro-batch's backward, on the rank's thread: the
model's all-to-alls drive the same transport inside backward, and an expert that no token reached may
finish its gradient at a different point of backward on another rank, so reducing it inside backward
could order the edp collective differently around the all-to-alls on two ranks. (ZeRO-3 would gather each
block's experts over edp inside forward and backward: refused by engine.config.rules_moe.)

Scaling. A rank's loss is the mean over its tokens, and data parallelism averages over the D = dp x cp
ranks: a replicated gradient is (1/D) sum over ranks. An expert's gradient on its rank already sums the
tokens of its EP group's e ranks (the all-to-all brought them); summed over the edp group it covers all D
ranks, so it is divided by D: an average over edp (D/e ranks) and then 1/e.

16-bit training. One loss scaler, the data-parallel replica's: both kinds carry the same scale. The
overflow flag is one over every rank: the replicated parameters' (agreed over dp by their replica) and
the experts' (MAX over edp, then over the EP group, so an overflow in any rank's experts reaches every
rank, even one that shows after the reduce), joined inside the replica's step (`overflow_beside`), which
skips on all ranks alike. The experts' fp32 master and moments cover what this rank owns (the
ShardOptimizer's own rule).

The gradient norm is one over the whole model: the replicated part once, plus every expert once, so the
experts' sum of squares is summed over edp where sharded (each part once) and over the EP group.
"""

from __future__ import annotations

import math

import numpy as np

from engine.comm.collectives import all_gather, all_reduce, broadcast, reduce_scatter
from engine.moe import moe_layers
from engine.nn import Module
from engine.optim import NORM_CHUNK
from engine.parallel.data.buckets import part
from engine.parallel.data.flat import FlatBuffer
from engine.parallel.data.shard_optimizer import _KINDS, Piece, ShardOptimizer
from engine.parallel.expert.plan import expert_parameters
from engine.parallel.expert.tensor import split_sums_of_squares, tensor_whole_ranges
from engine.parallel.tensor import model_layout

EXPERTS = ".experts.mlps."  # in every split expert's parameter name, before the expert's number


class AddingLedger:
    """The rank's memory ledger, whose hold() adds to what the data-parallel replica holds instead of
    replacing it: the experts' parameters, gradients and optimizer state live beside the others all run."""

    def __init__(self, ledger):
        self._ledger = ledger

    def hold(self, category: str, nbytes: int) -> None:
        self._ledger.add(category, nbytes)

    def __getattr__(self, name):
        return getattr(self._ledger, name)


class ExpertNames:
    """Expert parameter names as numbers every rank decodes alike: (MoE layer, expert, parameter of the
    expert), from this rank's own names (each layer's experts have the same parameters, so the prefixes
    and suffixes a rank sees are every rank's). The overflow report names one parameter on all ranks."""

    def __init__(self, names: list[str], n_experts: int):
        self.n_experts = n_experts
        self.layers: list[str] = []
        self.suffixes: list[str] = []
        for name in names:
            prefix, _, suffix = self._split(name)
            if prefix not in self.layers:
                self.layers.append(prefix)
            if suffix not in self.suffixes:
                self.suffixes.append(suffix)

    @staticmethod
    def _split(name: str) -> tuple[str, int, str]:
        prefix, rest = name.split(EXPERTS)
        expert, suffix = rest.split(".", 1)
        return prefix, int(expert), suffix

    def code(self, name: str) -> int:
        prefix, expert, suffix = self._split(name)
        return ((self.layers.index(prefix) * self.n_experts + expert) * len(self.suffixes)
                + self.suffixes.index(suffix))

    def name(self, code: int) -> str:
        rest, suffix = divmod(code, len(self.suffixes))
        layer, expert = divmod(rest, self.n_experts)
        return f"{self.layers[layer]}{EXPERTS}{expert}.{self.suffixes[suffix]}"


class ExpertReplica:
    """`dense` (the data-parallel replica of the replicated parameters) plus this rank's split experts."""

    def __init__(self, dense, cfg, model: Module, ep, edp, tensor=None, pipeline=None):
        self.dense, self.ep, self.edp = dense, ep, edp
        # the groups whose ranks hold other shards (tensor) or other stages (pipeline) of the experts: the
        # norm and the overflow flag are completed over them too
        self.tensor = tensor if tensor is not None and tensor.world_size > 1 else None
        self.stages = pipeline if pipeline is not None and pipeline.world_size > 1 else None
        self.stage = cfg.parallel.zero_stage
        if self.stage not in (0, 1, 2):
            raise ValueError(f"split experts shard under ZeRO stages 0-2, not {self.stage}")
        self.shards = edp.world_size if self.stage else 1  # the experts' state is split this many ways
        params = expert_parameters(model)
        self.experts = FlatBuffer(params, dtype=cfg.precision.dtype, pad_to=self.shards, grad=self.stage < 2)
        if edp.world_size > 1:
            broadcast(edp, self.experts.data, root=0)  # as DDP: the edp group starts from one copy
        self.ledger = AddingLedger(dense.ledger)
        lo, hi = self.part = part(0, self.experts.size, edp.rank if self.shards > 1 else 0, self.shards)
        self.ledger.hold("parameters", self.experts.data.nbytes)
        if self.stage < 2:
            grads = self.experts.grad_buffer[lo:hi]
            self.ledger.hold("gradients", self.experts.grad_buffer.nbytes)
        else:
            grads = self.grad_shard = np.zeros(hi - lo, self.experts.dtype)
            self.ledger.hold("gradients", self.grad_shard.nbytes)
        names = [str(p.name) for p in params]
        self.names = ExpertNames(names, model_experts(model))
        # what every tensor rank holds alike (the down-projections' biases): once in the norm
        specs = model_layout(model).specs if self.tensor else {}
        self.whole = tensor_whole_ranges(self.experts, lo, hi, specs) if self.tensor else []
        self.optimizer = ShardOptimizer(cfg, [Piece(self.experts.data[lo:hi], grads, self.experts, lo)], edp,
                                        sharded=self.shards > 1, param_names=names, ledger=self.ledger)
        dense.overflow_beside = self._agree_overflow

    def __getattr__(self, name):
        """What the trainer reads of a replica and the experts do not change (scaler, loss_scale, flat,
        comm_wait_s, bytes_sent, drain_events, ...): the data-parallel replica's."""
        return getattr(self.dense, name)

    def zero_grad(self) -> None:
        self.dense.zero_grad()
        if self.stage < 2:
            self.experts.mark_grads_stale()
            return
        # stage 2: the whole gradient buffer for this step's backwards, freed by the reduce
        self.experts.grad = np.zeros(self.experts.size, self.experts.dtype)
        self.ledger.add("gradients", self.experts.grad.nbytes)
        self.experts.bind()

    def begin_micro(self, sync: bool) -> None:
        self.dense.begin_micro(sync)

    def backward(self, loss, factor: float) -> None:
        self.dense.backward(loss, factor)
        if self.stage < 2:
            self.experts.zero_stale()  # an expert no token reached this micro-batch

    def finish_backward(self) -> None:
        """The replicated parameters' reduce (their replica's), then the experts': average over edp (all of
        it, or reduce-scattered to this rank's part), then 1/e."""
        self.dense.finish_backward()
        if self.stage < 2:
            self.experts.zero_stale()  # a pipeline's backwards do not pass through backward() above
        grad = self.experts.grad_buffer
        lo, hi = self.part
        if self.shards > 1:
            reduce_scatter(self.edp, grad, "avg")
        elif self.edp.world_size > 1:
            all_reduce(self.edp, grad, op="avg")
        mine = grad[lo:hi]
        np.multiply(mine, 1.0 / self.ep.world_size, out=mine)
        if self.stage == 2:  # keep the part, free the step's buffer
            self.grad_shard[...] = mine
            self.ledger.sub("gradients", grad.nbytes)
            self.experts.grad = None
            for p in self.experts.params:
                p.grad = None

    def _experts_sum_of_squares(self) -> float:
        """Every expert's gradient squared once (scaled by the loss scale still): this rank's part, summed
        over edp when the parts differ, and over the EP group."""
        grad = self.optimizer.pieces[0].grad
        wide = np.empty(min(grad.size, NORM_CHUNK), np.float64)
        with self.ledger.transient("temporaries", wide.nbytes):
            sums = split_sums_of_squares(grad, self.whole, wide)  # [tensor-split parts, the rest]
        if self.shards > 1:
            all_reduce(self.edp, sums, op="sum")
        if self.ep.world_size > 1:
            all_reduce(self.ep, sums, op="sum")
        if self.stages is not None:
            all_reduce(self.stages, sums, op="sum")
        split = sums[:1].copy()
        if self.tensor is not None:
            all_reduce(self.tensor, split, op="sum")
        return float(split[0] + sums[1])

    def grad_norm(self) -> float:
        """The whole model's gradient norm: the replicated part's, and every expert's once, unscaled."""
        scale = self.dense.scaler.scale
        return math.sqrt(self.dense.grad_norm() ** 2 + self._experts_sum_of_squares() / scale ** 2)

    def _agree_overflow(self, found: tuple[str, str] | None) -> tuple[str, str] | None:
        """The replicated parameters' overflow (agreed over dp) joined with the experts': every rank of the
        mesh ends with the same answer. The name: the experts' nearest the loss when any overflowed."""
        scaler = self.dense.scaler
        if not scaler.checks_overflow:
            return found
        mine = self.optimizer.find_overflow(scaler)  # agreed over edp when sharded
        worst = np.zeros(2, np.float64)  # [kind code, expert parameter code + 1]
        if mine is not None:
            worst[:] = _KINDS.index(mine[0]), self.names.code(mine[1]) + 1
        if self.shards == 1 and self.edp.world_size > 1:  # the reduced copies, checked by each holder alike
            all_reduce(self.edp, worst, op="max")
        if self.ep.world_size > 1:
            all_reduce(self.ep, worst, op="max")
        anywhere = worst[:1].copy()  # the kind only: another stage's parameter codes are not this rank's
        for group in (self.tensor, self.stages):
            if group is not None:
                all_reduce(group, anywhere, op="max")
        if anywhere[0] == 0:
            return found
        kind = _KINDS[max(int(anywhere[0]), _KINDS.index(found[0]) if found else 0)]
        if worst[0] == 0:
            return kind, found[1] if found else "an expert of another tensor-parallel rank or stage"
        return kind, self.names.name(int(worst[1]) - 1)

    def step(self, lr: float, clip: float, step: int) -> bool:
        """The replicated parameters' step (its overflow check joined with the experts'); when it is taken,
        the experts' update at the same loss scale, then (sharded) their parts all-gathered over edp."""
        scale = self.dense.scaler.scale  # the scale this step's gradients carry (the step may change it)
        if not self.dense.step(lr, clip, step):
            return False
        self.optimizer.update(lr, clip, scale)
        if self.shards > 1:
            all_gather(self.edp, self.experts.data)
        return True

    def optimizer_state(self) -> dict:
        """The replicated parameters' state (a checkpoint's ranges); the experts' is checkpoint_state.py's."""
        return self.dense.optimizer_state()

    def load_optimizer_state(self, full: dict) -> None:
        """The replicated parameters' state; the experts' goes through checkpoint_state.py."""
        self.dense.load_optimizer_state(full)

    def close(self) -> None:
        self.dense.overflow_beside = None
        self.dense.close()


def model_experts(model: Module) -> int:
    """E, the experts of each MoE layer (held here or not)."""
    return len(moe_layers(model)[0].experts.mlps)


def with_experts(dense, cfg, model: Module, groups):
    """The replica the trainer steps: `dense` alone for a model without split experts, else an
    ExpertReplica over the rank's EP and edp groups (engine.parallel.mesh.MeshGroups)."""
    if not expert_parameters(model):
        return dense
    return ExpertReplica(dense, cfg, model, groups.ep, groups.edp, tensor=groups.tp, pipeline=groups.pp)
