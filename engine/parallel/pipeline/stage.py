"""The stage runner: one pipeline rank's virtual stages, run one (stage, micro-batch) action at a time.

It implements engine.parallel.pipeline.interface.StageRunner. Per step the caller hands it the rank's
micro-batches and the seed of every backward (`begin_step`); then the executor calls forward and backward
in its schedule's order. What it keeps between a micro-batch's forward and its backward is the tape of
that stage's forward — the output's node, never the output array itself, which is sent on and may be
freed — and the backward frees that tape, so the memory ledger sees a schedule's real in-flight bound.

Exactness. Stage s of micro-batch j computes what one device computes for those rows: the same layers
(stage_module), the same dropout masks (the model's DropoutRNG keyed by the step and the micro-batch's
first global row, its site counter set to where one device's forward is when stage s begins), the same
seed (loss_weight: 1 / micro-batches, times the loss scale). Gradients accumulate over the micro-batches
in the order of the backwards, as one device's accumulation does in micro-batch order.

Zero bubble. backward_input computes the input's gradient and defers every weight-gradient product
(engine.backward_split); backward_weight runs them. Together they give the bits backward gives.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from engine import ops
from engine.backward_split import WeightBackward, backward_input
from engine.moe import build_gpt
from engine.nn import GPT
from engine.parallel.pipeline.moe_aux import carry_aux, stage_aux_loss
from engine.parallel.pipeline.split import PipelineSplit, model_rng
from engine.parallel.pipeline.stage_module import GPTStage, build_stages
from engine.tensor import Node, Parameter, Tensor, no_grad, run_backward


@dataclass(frozen=True)
class TiedWeight:
    """A weight held on two stages (wte.weight on the first, its copy lm_head.weight on the last): their
    gradients are summed between the two stages' ranks and the copies stay equal. A side this rank does
    not hold is None."""

    name: str
    stages: tuple[int, int]
    params: tuple[Parameter | None, Parameter | None]


class StageRunner:
    """The stages `stages` of `split`, built from `model`'s own layers. `loss_fn(logits, targets)` is the
    last stage's loss (a tensor-parallel layout's loss under TP); the default is the mean cross-entropy."""

    def __init__(self, model: GPT, split: PipelineSplit, stages: Sequence[int],
                 loss_fn: Callable[[Tensor, np.ndarray], Tensor] = ops.cross_entropy):
        self.split, self.loss_fn = split, loss_fn
        self.n_stages = len(split)
        self.stages: dict[int, GPTStage] = build_stages(model, split, stages)
        self.rng = model_rng(model)
        self.site_offsets = dropout_sites(model, split)
        self._ties = _tied_weights(model, split, self.stages)
        self.begin_step([], 1.0)

    @classmethod
    def for_rank(cls, model: GPT, split: PipelineSplit, rank: int, ranks: int, **kwargs) -> StageRunner:
        """Pipeline rank `rank` of `ranks`: stages rank, rank + ranks, ... (interleaved: more than one)."""
        return cls(model, split, range(rank, len(split), ranks), **kwargs)

    # ---- the step ---------------------------------------------------------------------------------------

    def begin_step(self, batches: Sequence[tuple[np.ndarray, np.ndarray]], loss_weight: float, step: int = 0,
                   first_rows: Sequence[int] | None = None) -> None:
        """This step's micro-batches (x, y) in order; `loss_weight` seeds each last-stage backward; dropout
        is keyed by `step` and each micro-batch's first row in the global batch (default: the micro-batches
        laid end to end from row 0, as one device sees them)."""
        self.batches, self.loss_weight, self.step = list(batches), float(loss_weight), int(step)
        if first_rows is None:
            first_rows = list(np.cumsum([0] + [len(x) for x, _ in self.batches])[:-1])
        self.first_rows = [int(r) for r in first_rows]
        self.losses: dict[int, float] = {}  # micro-batch -> its loss (last stage only)
        self._inputs: dict[tuple[int, int], Tensor] = {}
        self._roots: dict[tuple[int, int], Node | Tensor] = {}
        self._weights: dict[tuple[int, int], WeightBackward] = {}
        self._loss_dtype = np.dtype(np.float64)

    def forward(self, stage: int, micro_batch: int, inputs: np.ndarray | None) -> np.ndarray | float:
        module, key = self._stage(stage), (stage, micro_batch)
        if key in self._roots:
            raise RuntimeError(f"stage {stage}: micro-batch {micro_batch} forward again before its backward")
        x, y = self.batches[micro_batch]
        self.rng.rewind((self.step, self.first_rows[micro_batch], self.site_offsets[stage]))
        inp: Tensor | np.ndarray = x  # stage 0: the token ids
        if stage > 0:
            if inputs is None:
                raise ValueError(f"stage {stage} needs its input: stage {stage - 1}'s output of micro-batch "
                                 f"{micro_batch}")
            inp = Tensor(inputs, requires_grad=True)
            self._inputs[key] = inp
        out = module(inp)
        aux = stage_aux_loss(module)  # MoE layers' load-balancing terms, in the objective (moe_aux.py)
        if stage == self.n_stages - 1:
            loss = self.loss_fn(out, y)
            self.losses[micro_batch] = float(loss.data)
            self._loss_dtype = loss.dtype
            total = loss if aux is None else loss + aux
            self._roots[key] = total._node or total
            return self.losses[micro_batch]
        if aux is not None:
            out = carry_aux(out, aux, self.loss_weight)
        self._roots[key] = out._node or out  # the node, not the output: the output array goes with the send
        return out.data

    def backward(self, stage: int, micro_batch: int, grad_output: np.ndarray | None) -> np.ndarray | None:
        root, key = self._root(stage, micro_batch, grad_output), (stage, micro_batch)
        run_backward(root, self._seed(stage, grad_output))
        return self._input_grad(key)

    def backward_input(self, stage: int, micro_batch: int,
                       grad_output: np.ndarray | None) -> np.ndarray | None:
        root, key = self._root(stage, micro_batch, grad_output), (stage, micro_batch)
        self._weights[key] = backward_input(root, self._seed(stage, grad_output))
        return self._input_grad(key)

    def backward_weight(self, stage: int, micro_batch: int) -> None:
        weights = self._weights.pop((stage, micro_batch), None)
        if weights is None:
            raise RuntimeError(f"backward_weight of stage {stage}, micro-batch {micro_batch} before its "
                               "backward_input")
        weights.run()

    # ---- what the executor reads ------------------------------------------------------------------------

    def named_parameters(self) -> list[tuple[str, Parameter]]:
        """This rank's parameters by dense name, stage by stage (a tied copy as lm_head.weight)."""
        return [pair for i in sorted(self.stages) for pair in self.stages[i].named_parameters()]

    def parameters(self) -> list[Parameter]:
        return [p for _, p in self.named_parameters()]

    def tied_parameters(self) -> list[TiedWeight]:
        """Weights held on two stages whose gradients must be summed and values kept equal."""
        return list(self._ties)

    def in_flight(self) -> int:
        """(stage, micro-batch) tapes kept: forwards without their backward, inputs without their weights."""
        return len(self._roots) + len(self._weights)

    # ---- inside -----------------------------------------------------------------------------------------

    def _stage(self, stage: int) -> GPTStage:
        if stage not in self.stages:
            raise ValueError(f"stage {stage} is not held here (held: {sorted(self.stages)})")
        return self.stages[stage]

    def _root(self, stage: int, micro_batch: int, grad_output) -> Node | Tensor:
        root = self._roots.pop((self._stage(stage).index, micro_batch), None)
        if root is None:
            raise RuntimeError(f"backward of stage {stage}, micro-batch {micro_batch} before its forward")
        return root

    def _seed(self, stage: int, grad_output: np.ndarray | None) -> np.ndarray:
        if stage == self.n_stages - 1:
            return np.asarray(self.loss_weight, dtype=self._loss_dtype)  # as (loss * weight).backward() seeds
        if grad_output is None:
            raise ValueError(f"stage {stage} needs its output's gradient from stage {stage + 1}")
        return grad_output

    def _input_grad(self, key: tuple[int, int]) -> np.ndarray | None:
        inp = self._inputs.pop(key, None)
        return None if inp is None else inp.grad


def dropout_sites(model: GPT, split: PipelineSplit) -> list[int]:
    """The dropout site counter at each stage's start in one device's forward (zero everywhere when the model
    has no dropout). Counted by a dry forward of one token, without a tape, through a miniature GPT of the
    same structure (one head's width, a vocabulary of one): the count depends on the layers, not their
    sizes, and the model itself (tensor-parallel, perhaps, whose forward would communicate) is not run."""
    config = model.config
    if not config.get("dropout", 0.0):
        return [0] * len(split)
    moe = {"moe": config["moe"]} if config.get("moe") else {}  # MoE blocks draw as theirs do
    twin = build_gpt(vocab_size=1, block_size=1, n_layer=config["n_layer"], n_head=config["n_head"],
                     n_embd=config["n_head"], dropout=config["dropout"], tie_weights=config["tie_weights"],
                     bias=config["bias"], dtype=np.float32, **moe)
    offsets = []
    with no_grad():
        x = twin.drop(twin.wte(np.zeros((1, 1), np.int64)) + twin.wpe.weight[:1])
        for part in split.stages:
            offsets.append(model_rng(twin).site if part.index else 0)
            for b in part.blocks:
                x = twin.blocks[b](x)
    return offsets


def _tied_weights(model: GPT, split: PipelineSplit, stages: dict[int, GPTStage]) -> list[TiedWeight]:
    if not split.tied_copy:
        return []
    last = len(split) - 1
    first_p = model.wte.weight if 0 in stages else None
    last_p = stages[last].head_copy if last in stages else None
    if first_p is None and last_p is None:
        return []
    return [TiedWeight("wte.weight", (0, last), (first_p, last_p))]
