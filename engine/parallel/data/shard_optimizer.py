"""The optimizer side every replica shares: the ranges of parameters a rank owns ("pieces"), their
optimizer state, the overflow check, the gradient norm and the update.

A rank owns one or more pieces: views into its model-dtype parameter storage and into a gradient
array laid out the same way. DDP owns one piece (everything); ZeRO-1/2 own part r of every bucket;
ZeRO-3 owns part r of every layer. The optimizer state for the pieces lives in one local array per
kind (Adam m, v and, in mixed precision, the fp32 master weights), and an ordinary `optim.AdamW` runs
on each piece's slice of them: AdamW is elementwise, so the pieces together update exactly as one
unsharded optimizer would, and optim.py knows nothing of sharding.

Model states (what the memory ledger holds; with Ψ parameters, the ZeRO paper's 16Ψ for 2-byte
training): fp32/fp64 training updates the parameter pieces in place (no master copy); fp16/bf16 keeps
an fp32 master of the owned pieces. The gradient handed to AdamW in mixed precision is an fp32 copy
that exists only during the update (counted as temporaries), so persistent model states are 2Ψ params
+ 2Ψ grads + 12Ψ (sharded as the stage says). The pieces' AdamWs share one scratch array (they step one
after another), held for the whole run and counted as temporaries: two rows of min(largest piece,
optim.CHUNK) elements.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from engine.comm.collectives import all_reduce
from engine.dtypes import is_low_precision, master_dtype
from engine.fast import lowp
from engine.optim import NORM_CHUNK, AdamW, adamw_scratch
from engine.parallel.data.flat import FlatLayout
from engine.parallel.data.tensor_split import TensorSplit
from engine.parallel.tensor.whole import WholeModel

_KINDS = ("", "inf", "nan")  # codes 0 (nothing), 1, 2: MAX over ranks picks nan over inf over nothing


class Piece(NamedTuple):
    """One owned range: `param` and `grad` are views of the replica's storage; `flat` is the FlatBuffer
    laying them out (parameter names for overflow reports, the weight-decay mask) and `offset` is where
    the piece starts in it."""
    param: np.ndarray
    grad: np.ndarray
    flat: FlatLayout
    offset: int


class ShardOptimizer:
    """AdamW over this rank's pieces, with the overflow check and grad norm formed from them.

    `sharded`: the pieces differ across ranks, so the grad norm's sum of squares and the overflow flag
    are all-reduced (sum and MAX); with replicated gradients (DDP) every rank already agrees.
    `layout`: the model's tensor-parallel layout (engine.parallel.tensor.model_layout): the sums and the flag
    are then completed over the tensor-parallel group too (tensor_split.py), so every rank of the mesh agrees.
    """

    def __init__(self, cfg, pieces: list[Piece], comm, sharded: bool, param_names: list[str], ledger,
                 layout=None):
        self.pieces, self.comm, self.sharded, self.ledger = pieces, comm, sharded, ledger
        self.layout = WholeModel() if layout is None else layout
        self.split = TensorSplit(pieces, self.layout, ledger)
        self.param_names = param_names
        self._index = {name: i for i, name in enumerate(param_names)}
        self.dtype = pieces[0].param.dtype
        self.mixed = is_low_precision(self.dtype)
        bounds = np.cumsum([0] + [p.param.size for p in pieces])
        self.bounds = list(zip(bounds[:-1].tolist(), bounds[1:].tolist()))
        self.numel = int(bounds[-1])
        mdt = master_dtype(self.dtype)
        self.master = (np.concatenate([p.param for p in pieces]).astype(mdt) if self.mixed else None)
        self.m = np.zeros(self.numel, mdt)
        self.v = np.zeros(self.numel, mdt)
        self.scratch = adamw_scratch(max(p.param.size for p in pieces), mdt)
        o, masks = cfg.optim, {}
        self.parts: list[AdamW] = []
        for piece, (lo, hi) in zip(pieces, self.bounds):
            if id(piece.flat) not in masks:
                masks[id(piece.flat)] = piece.flat.decay_mask()
            params = self.master[lo:hi] if self.master is not None else piece.param
            # In mixed precision the fp32 gradient is made per update (see update()); until then the
            # optimizer points at its own params, a same-shape placeholder it never reads.
            grads = params if self.mixed else piece.grad
            opt = AdamW(params, grads, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps,
                        weight_decay=o.weight_decay,
                        decay_mask=masks[id(piece.flat)][piece.offset:piece.offset + piece.param.size],
                        scratch=self.scratch)
            opt.m, opt.v = self.m[lo:hi], self.v[lo:hi]  # state as views of one local buffer per kind
            self.parts.append(opt)
        ledger.hold("master", 0 if self.master is None else self.master.nbytes)
        ledger.hold("adam_m", self.m.nbytes)
        ledger.hold("adam_v", self.v.nbytes)
        ledger.hold("temporaries", self.scratch.nbytes)

    @property
    def step_count(self) -> int:
        return self.parts[0].t

    # ------------------------------------------------------------------ before the update

    def sum_partial_grads(self) -> None:
        """Sequence parallelism's partial gradients summed over the tensor-parallel group (none: nothing)."""
        self.split.sum_partial_grads()

    def grad_norm(self, scale: float) -> float:
        """Global unscaled gradient norm: sqrt of the (all-reduced) sum of the pieces' sums of squares,
        formed through one float64 buffer (a temporary: min(largest piece, NORM_CHUNK) elements); under
        tensor parallelism the shards' part summed over its group too, the replicated part counted once."""
        wide = np.empty(min(max(p.grad.size for p in self.pieces), NORM_CHUNK), np.float64)
        with self.ledger.transient("temporaries", wide.nbytes):
            sharded, replicated = self.split.sums_of_squares(wide)
        if self.sharded:  # a whole model sends its one sum alone, as the same collective as ever
            sums = np.array([replicated, sharded][:1 + (self.layout.degree > 1)], dtype=np.float64)
            all_reduce(self.comm, sums, op="sum")
            replicated = float(sums[0])
            sharded = float(sums[1]) if sums.size > 1 else sharded
        return math.sqrt(self.layout.combine_sum_of_squares(sharded, replicated)) / scale

    def find_overflow(self, scaler) -> tuple[str, str] | None:
        """(inf|nan, first overflowing parameter) over all ranks, or None. Each rank checks its pieces
        (`scaler.check` = amp.find_overflow); the flag and the index of the parameter nearest the loss
        (highest index: backward reaches it first) are MAX-all-reduced so every rank skips alike."""
        if not scaler.checks_overflow:
            return None
        worst = np.zeros(2, dtype=np.float64)  # [kind code, parameter index + 1]
        for p in self.pieces:
            found = scaler.check(p.grad, p.flat, p.offset)
            if found is not None:
                worst[0] = max(worst[0], _KINDS.index(found[0]))
                worst[1] = max(worst[1], self._index.get(found[1], -1) + 1)
        if self.sharded:
            all_reduce(self.comm, worst, op="max")
        self.layout.agree_max(worst)  # the other shards of a tensor-parallel model (nothing otherwise)
        if worst[0] == 0:
            return None
        index = int(worst[1]) - 1
        names = getattr(self.layout, "parameter_names", self.param_names)  # a pipeline's: the whole model's
        return _KINDS[int(worst[0])], names[index] if index >= 0 else "<padding>"

    # ------------------------------------------------------------------ the update

    def update(self, lr: float, clip: float, scale: float) -> None:
        """AdamW on every piece, its gradients read unscaled (1/scale) and clipped (in the update's own
        pass, not one pass each over the gradients); in mixed precision from an fp32 copy, and the master
        rounded back into the model-dtype parameter pieces after."""
        inv, master = 1.0 / scale, self.master
        if master is None:  # not mixed precision
            for opt in self.parts:
                opt.step(lr, inv, clip)
            return
        grad32 = np.empty(self.numel, dtype=master.dtype)
        with self.ledger.transient("temporaries", grad32.nbytes):
            for p, (lo, hi) in zip(self.pieces, self.bounds):
                lowp.copy_into(p.grad.reshape(-1), grad32[lo:hi])  # compiled, shared: NumPy's cast is slow
            for opt, (lo, hi) in zip(self.parts, self.bounds):
                opt.grads = grad32[lo:hi]
                opt.step(lr, inv, clip)
                opt.grads = opt.params
            for p, (lo, hi) in zip(self.pieces, self.bounds):
                lowp.copy_into(master[lo:hi].reshape(p.param.shape), p.param)

    # ------------------------------------------------------------------ state (checkpoints)

    def local_state(self) -> dict:
        """Copies of the owned master (the parameters themselves outside mixed precision), m and v, in
        piece order, and the step count."""
        if self.master is not None:  # mixed precision
            master = self.master.copy()
        else:
            master = np.concatenate([p.param for p in self.pieces])
        return {"master": master, "m": self.m.copy(), "v": self.v.copy(), "step": self.step_count}

    def load_local(self, master: np.ndarray, m: np.ndarray, v: np.ndarray, step: int) -> None:
        """Set the owned state from arrays in piece order; the model-dtype pieces follow the master."""
        np.copyto(self.m, m, casting="same_kind")
        np.copyto(self.v, v, casting="same_kind")
        for opt in self.parts:
            opt.t = int(step)
        if self.master is not None:  # mixed precision
            np.copyto(self.master, master, casting="same_kind")
        for p, (lo, hi) in zip(self.pieces, self.bounds):
            np.copyto(p.param, master[lo:hi], casting="unsafe")
