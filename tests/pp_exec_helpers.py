"""A stand-in stage runner whose exact gradients are known, and rank functions that run the pipeline executor
with it (tests/parallel/test_pp_executor.py); JSON arguments and results, so the processes backend runs
them too.

The chain: stage s multiplies by its own matrix W_s (h × h, float64), tanh between stages; the last stage's
loss of micro-batch j is 0.5·Σ y² · weight. Its one-device reference (`chain_reference`) is written out
here with plain NumPy, independently of the executor: the loss of every micro-batch and every W's gradient
summed over the micro-batches.
"""

from __future__ import annotations

import numpy as np

from engine.comm import TrafficMeter
from engine.parallel.pipeline.executor import Emulation, Executor, uniform_io
from engine.parallel.pipeline.schedules import build_schedule

ROWS, WIDTH = 3, 5


def weights(stages: int) -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    return [rng.standard_normal((WIDTH, WIDTH)) / np.sqrt(WIDTH) for _ in range(stages)]


def inputs(micro_batches: int) -> list[np.ndarray]:
    rng = np.random.default_rng(11)
    return [rng.standard_normal((ROWS, WIDTH)) for _ in range(micro_batches)]


class ChainRunner:
    """The stages `held` of the chain, as the StageRunner protocol asks; arrays only, no autograd."""

    def __init__(self, stages: int, held: list[int], micro_batches: int, weight: float):
        self.n, self.w, self.x0, self.weight = stages, weights(stages), inputs(micro_batches), weight
        self.held = held
        self.grads = {s: np.zeros((WIDTH, WIDTH)) for s in held}
        self.saved: dict[tuple[int, int], np.ndarray] = {}  # the stage's input, until its backward
        self.pending: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}  # (input, grad) until W
        self.in_flight_peak = 0

    def forward(self, stage, micro_batch, inp):
        assert stage in self.held and (inp is None) == (stage == 0)
        x = self.x0[micro_batch] if stage == 0 else np.tanh(inp)
        self.saved[(stage, micro_batch)] = x
        self.in_flight_peak = max(self.in_flight_peak, len(self.saved))
        y = x @ self.w[stage]
        return 0.5 * float(np.sum(y * y)) * self.weight if stage == self.n - 1 else y

    def backward_input(self, stage, micro_batch, grad_output):
        x = self.saved.pop((stage, micro_batch))
        g = x @ self.w[stage] * self.weight if stage == self.n - 1 else grad_output
        self.pending[(stage, micro_batch)] = (x, g)
        if stage == 0:
            return None
        return (g @ self.w[stage].T) * (1 - x * x)  # through the tanh at the stage's entry

    def backward_weight(self, stage, micro_batch):
        x, g = self.pending.pop((stage, micro_batch))
        self.grads[stage] += x.T @ g

    def backward(self, stage, micro_batch, grad_output):
        out = self.backward_input(stage, micro_batch, grad_output)
        self.backward_weight(stage, micro_batch)
        return out


def chain_reference(stages: int, micro_batches: int, weight: float) -> tuple[list[float], list[np.ndarray]]:
    """One device: each micro-batch through every stage, then back; gradients summed."""
    w, losses, grads = weights(stages), [], [np.zeros((WIDTH, WIDTH)) for _ in range(stages)]
    for x0 in inputs(micro_batches):
        xs, y = [], None
        for s in range(stages):
            x = x0 if s == 0 else np.tanh(y)
            xs.append(x)
            y = x @ w[s]
        losses.append(0.5 * float(np.sum(y * y)) * weight)
        g = y * weight
        for s in reversed(range(stages)):
            grads[s] += xs[s].T @ g
            if s:
                g = (g @ w[s].T) * (1 - xs[s] ** 2)
    return losses, grads


def make_schedule(name: str, p: int, m: int, chunks: int = 1):
    return build_schedule(name, p, m, chunks)


def run_chain(comm, emit, name: str, m: int, chunks: int, weight: float) -> dict:
    """Rank function: this rank's actions of the schedule with a ChainRunner; losses, gradients, timeline."""
    schedule = make_schedule(name, comm.world_size, m, chunks)
    comm.meter = TrafficMeter(comm.rank)
    runner = ChainRunner(schedule.stages, schedule.stages_of(comm.rank), schedule.micro_batches, weight)
    result = Executor(schedule, comm.rank, comm, uniform_io((ROWS, WIDTH), np.float64), runner).run()
    return {"losses": {str(k): v for k, v in result.losses.items()},
            "grads": {str(s): g.tolist() for s, g in runner.grads.items()},
            "timeline": result.timeline, "peak_held": result.peak_held,
            "in_flight_peak": runner.in_flight_peak,
            "sent": {row["phase"]: row["bytes"] for row in comm.meter.snapshot()}}


def run_emulated(comm, emit, name: str, m: int, chunks: int, unit_s: float) -> dict:
    """Rank function: the schedule with every compute action a sleep (F = I = W = unit, B = 2 units)."""
    schedule = make_schedule(name, comm.world_size, m, chunks)
    executor = Executor(schedule, comm.rank, comm, uniform_io((2, 4), np.float32),
                        emulation=Emulation(unit_s, unit_s, unit_s))
    comm.barrier()  # the ranks start the step together, as the trainer's steps do
    return {"timeline": executor.run().timeline}


def run_broken(comm, emit) -> None:
    """Rank function: a 2-rank list whose rank 0 sends micro-batch 0's activation before computing it."""
    from engine.parallel.pipeline.ir import Action, Op, Schedule
    rank0 = (Action(Op.SEND_ACT, 0, 0, 1), Action(Op.FORWARD, 0, 0), Action(Op.BACKWARD, 0, 0))
    rank1 = (Action(Op.RECV_ACT, 0, 1, 0), Action(Op.FORWARD, 0, 1), Action(Op.BACKWARD, 0, 1))
    schedule = Schedule("broken", 2, 1, 1, (rank0, rank1))
    runner = ChainRunner(2, [comm.rank], 1, 1.0)
    Executor(schedule, comm.rank, comm, uniform_io((ROWS, WIDTH), np.float64), runner).run()
