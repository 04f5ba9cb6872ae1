"""`bench profile`: where each millisecond of a training step goes, per op and per phase.

One rank trains `warmup` untimed steps and then `steps` profiled ones. A layout that needs several ranks
(tensor, pipeline, context or expert parallelism) trains on the fewest ranks it needs, as threads of this
process, and rank 0 is the one profiled (the clock books only its thread's calls). While it runs, every op of
engine.ops is timed: its forward (the call) and its backward (the closure it hands the tape), each
exclusive of the ops it calls itself, so nested ops are not counted twice; the tape's own gradient
additions (engine.tensor._accumulate, _write_leaf_grad) and the optimizer's parts (gradient norm,
overflow check, AdamW) are timed the same way. The phases come from the memory ledger's phase
switches (forward, backward, optimizer), and what a phase spent outside any timed op is the Python
of the tape, the model and the replica (`other`). Communication: the time the rank waited on it.

The timing wraps module functions for the duration of the run (and restores them): a measurement
for one process, like cProfile, but cheap enough (two clock reads per op call) to leave the step's
proportions as they are.
"""

from __future__ import annotations

import functools
import inspect
import math
import threading
import time
from collections import defaultdict

from engine import ops, tensor
from engine.config import Config, replace
from engine.parallel.data import shard_optimizer

ARRAY_HELPERS = ("matmul_kernel", "unbroadcast")  # public functions of engine.ops that are not ops
OPS = tuple(name for name, fn in vars(ops).items() if inspect.isfunction(fn) and fn.__module__ == ops.__name__
            and not name.startswith("_") and name not in ARRAY_HELPERS)
TAPE = {"_accumulate": "tape: gradient sum", "_write_leaf_grad": "tape: parameter gradient"}
PHASE_COLUMNS = ("forward_ms", "backward_ms", "optimizer_ms")
OPTIMIZER = {"grad_norm": "optimizer: gradient norm", "find_overflow": "optimizer: overflow check",
             "update": "optimizer: AdamW update"}


class _Clock:
    """Exclusive seconds per (label, phase): a timed call's time minus the timed calls inside it, booked
    to the phase the ledger was in (a block recomputed by checkpointing runs its forward in backward)."""

    def __init__(self, phase):
        self.phase = phase
        self.seconds: dict[tuple[str, str], float] = defaultdict(float)
        self.calls: dict[tuple[str, str], int] = defaultdict(int)
        self._inner = threading.local()
        self.thread: threading.Thread | None = None  # the profiled rank's; no other thread's calls are booked

    def timed(self, fn, label: str):
        @functools.wraps(fn)
        def run(*args, **kwargs):
            if threading.current_thread() is not self.thread:
                return fn(*args, **kwargs)
            stack = self._inner.__dict__.setdefault("stack", [0.0])
            stack.append(0.0)
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent = time.perf_counter() - t0
                inner = stack.pop()
                stack[-1] += spent
                key = (label, self.phase())
                self.seconds[key] += spent - inner
                self.calls[key] += 1
        return run


class _Patched:
    """engine.ops functions, the tape's gradient sums and the optimizer's parts, timed while inside."""

    def __init__(self, clock: _Clock):
        self.clock = clock
        self._undo: list[tuple[object, str, object]] = []

    def __enter__(self):
        clock = self.clock
        make = ops.make
        local = threading.local()  # per rank thread: the op whose forward is running owns make()'s closure

        def timed_make(data, inputs, backward, saved=(), fresh=False):
            current = local.__dict__.setdefault("current", [])
            return make(data, inputs, clock.timed(backward, current[-1] if current else "?"), saved, fresh)

        def op(name, fn):
            timed = clock.timed(fn, name)

            def run(*args, **kwargs):
                current = local.__dict__.setdefault("current", [])
                current.append(name)
                try:
                    return timed(*args, **kwargs)
                finally:
                    current.pop()
            return functools.wraps(fn)(run)

        self._set(ops, "make", timed_make)
        for name in OPS:  # an alias (permute = transpose) is timed under the function's own name
            fn = getattr(ops, name)
            self._set(ops, name, op(fn.__name__, fn))
        for name, label in TAPE.items():
            self._set(tensor, name, clock.timed(getattr(tensor, name), label))
        for name, label in OPTIMIZER.items():
            cls = shard_optimizer.ShardOptimizer
            self._set(cls, name, clock.timed(getattr(cls, name), label))
        ops._install_operators()  # Tensor's operators pick up the timed functions
        return self

    def _set(self, owner, name, value) -> None:
        self._undo.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    def __exit__(self, *exc):
        for owner, name, value in reversed(self._undo):
            setattr(owner, name, value)
        ops._install_operators()


def fewest_ranks(cfg: Config) -> int:
    """The fewest ranks cfg's layout runs on: tensor x pipeline x context, times what expert parallelism
    adds (it is carved out of the data x context ranks)."""
    p = cfg.parallel
    return p.tensor * p.pipeline * p.context * p.expert // math.gcd(p.context, p.expert)


def profile_step(cfg: Config, warmup: int = 3, steps: int = 10) -> dict:
    """Per-step milliseconds of rank 0 training `cfg` on the fewest ranks its layout needs (one for a
    data-parallel layout): `phases` (forward, backward, optimizer, comm wait, step), `ops` rows {op,
    forward_ms, backward_ms, calls} sorted by total, and `other` per phase (time in the phase outside
    timed ops)."""
    from engine.comm.cores import limited, resolve, usable_cores
    from engine.comm.launch import run_ranks
    world = fewest_ranks(cfg)
    cfg = replace(replace(replace(cfg, "train.steps", warmup + steps + 1), "train.eval_every", 0),
                  "parallel.world_size", world)
    threads = resolve(cfg.parallel.threads_per_rank, len(usable_cores()), world)
    clock = _Clock(lambda: "idle")
    phase_s: dict[str, float] = defaultdict(float)
    with limited(threads), _Patched(clock):
        step_s, wait_s = run_ranks(world, "threads", _train_rank, args=(cfg, warmup, steps, clock, phase_s),
                                   timeout_s=max(cfg.parallel.timeout_s, 120.0))[0]
    rows: dict[str, dict] = defaultdict(lambda: {**dict.fromkeys(PHASE_COLUMNS, 0.0), "calls": 0})
    in_phase: dict[str, float] = defaultdict(float)
    for (label, phase), seconds in clock.seconds.items():
        if phase + "_ms" not in PHASE_COLUMNS:
            raise AssertionError(f"{label} ran outside the step's phases ({phase})")
        rows[label][phase + "_ms"] += 1e3 * seconds / steps
        rows[label]["calls"] += clock.calls[label, phase] // steps
        in_phase[phase] += seconds
    table = sorted(({"op": label, **row} for label, row in rows.items()),
                   key=lambda r: -sum(r[c] for c in PHASE_COLUMNS))
    phases = {name: 1e3 * phase_s[name] / steps for name in ("forward", "backward", "optimizer")}
    phases["comm_wait"] = 1e3 * wait_s / steps
    phases["step"] = 1e3 * step_s / steps
    names = ("forward", "backward", "optimizer")
    other = {name: phases[name] - 1e3 * in_phase[name] / steps for name in names}
    other["outside phases"] = phases["step"] - sum(phases[n] for n in names)
    return {"preset": cfg.name, "steps": steps, "threads": threads, "phases": phases, "ops": table,
            "other": other, "ranks": world}


def _train_rank(comm, emit, cfg: Config, warmup: int, steps: int, clock: _Clock, phase_s: dict):
    """Every rank trains warmup + steps steps; rank 0 times its last `steps` on `clock` and `phase_s`.
    Returns (step seconds, comm-wait seconds) summed over those steps (rank 0's; None elsewhere)."""
    from engine.trainer import Trainer
    trainer = Trainer(cfg, comm)
    try:
        for _ in range(warmup):
            trainer.train_step()
        if comm.rank:
            for _ in range(steps):
                trainer.train_step()
            return None
        clock.phase = lambda: trainer.ledger.phase
        switched = [time.perf_counter()]

        def on_phase(old: str, new: str) -> None:
            now = time.perf_counter()
            phase_s[old] += now - switched[0]
            switched[0] = now
        trainer.ledger.on_phase = on_phase
        clock.thread = threading.current_thread()
        step_s = wait_s = 0.0
        for _ in range(steps):
            step_s += trainer.train_step()["step_time_s"]
            wait_s += trainer.replica.comm_wait_s
        clock.thread = None
        return step_s, wait_s
    finally:
        trainer.ledger.on_phase = None
        trainer.replica.close()
