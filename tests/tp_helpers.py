"""Tiny float64 models, batches and rank functions shared by the tensor-parallel tests
(tests/parallel/test_tp_*.py): one device's step and training, and the same on t ranks of a TP group.

Shapes: vocabulary 11 (a prime: no t in 2-4 divides it, so the vocabulary is padded), width 24 and 12 heads
(2, 3 and 4 divide both), context 12 (sequence parallelism splits it 2, 3 or 4 ways).
"""

from __future__ import annotations

import threading

import numpy as np

from engine import ops
from engine.comm.group import Group
from engine.comm.meter import TrafficMeter
from engine.nn import GPT, Module
from engine.optim import AdamW, global_norm_clip_scale, sum_of_squares
from engine.parallel.tensor import layout, mappings, parallelize
from engine.recompute import apply_checkpointing

VOCAB, BLOCK, WIDTH, HEADS = 11, 12, 24, 12
ADAMW = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
MAX_NORM = 0.05  # below the tiny model's gradient norm: clipping acts in every step


def tiny_gpt(vocab: int = VOCAB, n_layer: int = 2, dropout: float = 0.0, tie_weights: bool = True,
             dtype=np.float64) -> GPT:
    return GPT(vocab, BLOCK, n_layer=n_layer, n_head=HEADS, n_embd=WIDTH, dropout=dropout,
               tie_weights=tie_weights, bias=True, dtype=dtype)


def random_batches(steps: int, rows: int = 2, vocab: int = VOCAB, seed: int = 0):
    tokens = np.random.default_rng(seed).integers(0, vocab, (steps, rows, BLOCK + 1))
    return [(t[:, :-1], t[:, 1:]) for t in tokens]


def tp_group(comm, t: int) -> Group:
    """This rank's TP group: t consecutive ranks of the world (TP innermost), named as the mesh names it."""
    first = comm.rank // t * t
    return Group(comm, list(range(first, first + t)), f"tp{comm.rank // t}")


def count_collectives(monkeypatch) -> list[tuple[int, str, str, int]]:
    """Patch the tensor-parallel package (mappings and layout) to log every collective it runs, as
    (global rank, kind, phase, elements), into the list returned; monkeypatch undoes it."""
    log: list[tuple[int, str, str, int]] = []
    lock = threading.Lock()

    def counting(original):
        def collective(group, kind, buf, phase, op="sum"):
            with lock:
                log.append((group.global_rank(group.rank), kind, phase, buf.size))
            original(group, kind, buf, phase, op)
        return collective
    monkeypatch.setattr(mappings, "collective", counting(mappings.collective))
    monkeypatch.setattr(layout, "collective", counting(layout.collective))
    return log


def assert_close(actual, expected, rtol: float) -> None:
    """Relative to the array's scale: an element near zero keeps the rounding of the O(1) terms it came
    from (tests/parallel/test_ddp.py's assert_matches_single says why)."""
    expected = np.asarray(expected)
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=rtol * max(np.abs(expected).max(), 1e-300))


# ---- one device --------------------------------------------------------------------------------------

def dense_step(model: Module, x, y, step: int = 0) -> dict:
    """Logits, loss and every parameter's gradient (by name) of one forward and backward."""
    model.rng.begin(step, 0)
    logits = model(x)
    loss = ops.cross_entropy(logits, y)
    loss.backward()
    return {"logits": logits.data, "loss": float(loss.data),
            "grads": {n: p.grad for n, p in model.named_parameters()}}


def flat_adamw(model: Module) -> AdamW:
    """AdamW over the model's (this rank's) parameters moved into one flat array; decay on matrices only."""
    params = model.parameters()
    flat = np.concatenate([p.data.reshape(-1) for p in params])
    start = 0
    for p in params:
        p.data = flat[start:start + p.data.size].reshape(p.shape)
        start += p.data.size
    mask = np.concatenate([np.full(p.data.size, p.data.ndim >= 2) for p in params])
    return AdamW(flat, np.zeros_like(flat), decay_mask=mask, **ADAMW)


def apply_step(model: Module, opt: AdamW, clip: float) -> None:
    opt.grads[:] = np.concatenate([p.grad.reshape(-1) for p in model.parameters()]) * clip
    opt.step()
    for p in model.parameters():
        p.grad = None


def train_dense(model_fn, batches) -> dict[str, np.ndarray]:
    model = model_fn()
    opt = flat_adamw(model)
    for step, (x, y) in enumerate(batches):
        dense_step(model, x, y, step)
        sumsq = sum(sum_of_squares(p.grad) for p in model.parameters())
        apply_step(model, opt, global_norm_clip_scale(sumsq, MAX_NORM))
    return {n: p.data.copy() for n, p in model.named_parameters()}


# ---- t ranks -----------------------------------------------------------------------------------------

def tp_model(comm, t: int, model_fn, sequence_parallel: bool, meter: bool = False):
    if meter:
        comm.meter = TrafficMeter(comm.rank)
    return parallelize(model_fn(), tp_group(comm, t), sequence_parallel)


def tp_step_rank(comm, emit, t: int, model_fn, x, y, sequence_parallel: bool,
                 checkpointing: str = "none") -> dict:
    """A rank's step: logits and gradients made dense again, and the loss."""
    model = tp_model(comm, t, model_fn, sequence_parallel)
    apply_checkpointing(model, checkpointing)
    tp = model.tensor_parallel
    model.rng.begin(0, 0)
    logits = model(x)
    loss = tp.loss(logits, y)
    loss.backward()
    tp.reduce_sequence_parallel_grads()
    return {"logits": tp.whole_logits(logits.data), "loss": float(loss.data), "grads": tp.dense("grad"),
            "grad_norm": tp.grad_norm(), "local_logits_shape": logits.shape}


def tp_train_rank(comm, emit, t: int, model_fn, batches, sequence_parallel: bool) -> dict:
    """A rank's training: the dense parameters at the end, and its own replicated parameters."""
    model = tp_model(comm, t, model_fn, sequence_parallel)
    tp = model.tensor_parallel
    opt = flat_adamw(model)
    for step, (x, y) in enumerate(batches):
        model.rng.begin(step, 0)
        tp.loss(model(x), y).backward()
        tp.reduce_sequence_parallel_grads()
        apply_step(model, opt, global_norm_clip_scale(tp.grad_sum_of_squares(), MAX_NORM))
    replicated = {n: p.data.copy() for n, p in model.named_parameters() if not tp.is_sharded(n)}
    return {"params": tp.dense("data"), "replicated": replicated}
