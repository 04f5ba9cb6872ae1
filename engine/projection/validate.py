"""Validation: calibrate on this machine, predict runs the calibration never saw, run them, compare.

The calibration (calibrate.py) measures compute with ranks that never communicate and the transport with
bare collectives; every case here is a real training step (engine.trainer) on the processes backend —
N up to 4, ZeRO 0-3, fp32 and bf16, checkpointing on and off, emulated networks, two pipeline stages under
each schedule — held out from it. A pipeline case's calibration times the whole model at its micro-batch
(the stages' compute is projected from it: engine.projection.pipeline) and never runs a schedule.

Measured per case: the step period (the whole `train_step`, with the loss average after it), and the
communication the training thread waits on: the replica's waits for its communication thread plus the
collectives the training thread runs itself (timed through `_TimedComm`; a pipeline's batched messages too,
so its bubble, spent waiting for a neighbour's message, counts as waiting, as the projection counts it).
A run's figures are the lower quartiles over its steps (load from other jobs only ever slows a step).

On a shared machine the load drifts within minutes, so every case is predicted from a calibration taken
just before it runs — the compute of the case's model in its precision at its micro-batch size with 1 or
2 busy ranks (as many as it has, at most 2), and the transport — into a temporary file, leaving the
user's calibration alone. The calibration still runs none of what the case adds: no communication with
the compute, no ZeRO, no recomputation, no emulated network, never more than 2 training ranks (for a case
with more ranks than cores, 2 per core run a fixed matrix product between barriers, to time how late
time-sliced ranks meet, engine.projection.meeting_lag; and 2 ranks train the model on one core, to time
what time-slicing costs it, engine.projection.slicing_overhead). The validation goes
in `repeats` rounds over every case, forward and backward in turn (round_order); a case's figures are the
medians over rounds. Model-state memory is
compared byte for byte with the ledger, and the estimated activations with the ledger's peak on the rank the
estimate describes (with experts, the mean over that rank's expert group in each phase of each step: the
estimate assumes balanced routing; the busiest rank's peak is reported beside it).

Summary: mean absolute percentage error of the step time (a case's error: its median prediction against
its median run; and paired, the median over rounds of each round's prediction against that round's run),
its maximum, the bias (mean signed error), the
largest communication-share difference in percentage points, whether memory matched, and whether the
ranking of the cases is preserved: Kendall's tau over all pairs, and "preserved" when every pair that the
measurements tell apart is ordered the same way by the prediction. Two cases are told apart when their
measured times differ by more than NOISE and by more than their half-ranges over the rounds together
(a pair whose runs overlap is a tie: the machine could not rank it either).
"""

from __future__ import annotations

import itertools
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from engine.comm.cores import usable_cores
from engine.comm.launch import run_ranks
from engine.config import Config, from_dict, network_emulation, to_dict
from engine.config.build import vocab_size
from engine.memory.ledger import MODEL_STATES
from engine.parallel.mesh import Mesh
from engine.projection.calibrate import LEVELS, Calibration, calibrate
from engine.projection.clusters import Cluster
from engine.projection.project import predict
from engine.projection.quantile import low_quantile

CALIBRATION_STEPS = 12  # timed steps of each case's compute calibration (after its warm-up)
NOISE = 0.10  # measured step times closer than this are a tie for the ranking

# label -> overrides on the base config (gpt-mini on the processes backend, 1 MiB buckets)
CASES: tuple[tuple[str, dict], ...] = (
    ("1 rank, bf16, checkpointing", {"parallel.world_size": 1, "precision.dtype": "bf16",
                                     "memory.checkpointing": "blocks"}),
    ("2 ranks, DDP", {}),
    ("2 ranks, ZeRO-1", {"parallel.zero_stage": 1}),
    ("2 ranks, ZeRO-2, bf16", {"parallel.zero_stage": 2, "precision.dtype": "bf16"}),
    ("2 ranks, ZeRO-3", {"parallel.zero_stage": 3}),
    ("2 ranks, DDP, checkpointing", {"memory.checkpointing": "blocks"}),
    ("2 ranks, DDP, 2 ms latency", {"emulate.latency_us": 2000.0}),
    ("2 ranks, DDP, 1 Gbit/s", {"emulate.bandwidth_gbps": 1.0}),
    ("2 ranks, ZeRO-3, 500 us, 4 Gbit/s", {"parallel.zero_stage": 3, "emulate.latency_us": 500.0,
                                          "emulate.bandwidth_gbps": 4.0}),
    ("4 ranks, DDP", {"parallel.world_size": 4}),
    ("4 ranks, ZeRO-3, bf16, checkpointing", {"parallel.world_size": 4, "parallel.zero_stage": 3,
                                              "precision.dtype": "bf16", "memory.checkpointing": "blocks"}),
    ("4 ranks, ZeRO-2, 2 nodes: 1 ms, 2 Gbit/s between", {
        "parallel.world_size": 4, "parallel.zero_stage": 2, "parallel.ranks_per_node": 2,
        "emulate.inter_latency_us": 1000.0, "emulate.inter_bandwidth_gbps": 2.0}),
)
# pipeline parallelism on 2 ranks (dp 1): the simulated schedule, its messages and the per-stage reduce
PIPELINE_CASES: tuple[tuple[str, dict], ...] = tuple(
    (f"2 stages, {label}, {m} micro-batches", {"parallel.pipeline": 2, "parallel.schedule": schedule,
                                                "parallel.chunks": chunks, "train.micro_batches": m})
    for label, schedule, chunks, m in (("1F1B", "1f1b", 1, 4), ("GPipe", "gpipe", 1, 4),
                                       ("1F1B", "1f1b", 1, 8), ("interleaved v=2", "interleaved", 2, 4),
                                       ("ZB-H1", "zb-h1", 1, 4)))
# 4 stages on 4 ranks of 2 cores, in compute emulation (each F, I and W sleeps 20 ms; nothing trains): the
# schedule's shape, its messages and what surrounds it, on more stages than the machine has cores
EMULATED_CASES: tuple[tuple[str, dict], ...] = tuple(
    (f"4 stages emulated, {label}, 8 micro-batches", {
        "parallel.world_size": 4, "parallel.pipeline": 4, "parallel.schedule": schedule,
        "parallel.pipeline_emulate_ms": 20.0, "train.micro_batches": 8})
    for label, schedule in (("1F1B", "1f1b"), ("GPipe", "gpipe"), ("ZB-H1", "zb-h1")))
CASES = CASES + PIPELINE_CASES + EMULATED_CASES
QUICK = (1, 4, 6, 9)  # the cases of a quick validation
# the cases are data-parallel: a preset's tensor degree is set aside (sequence parallelism first, which
# needs it), its model kept
BASE = {"parallel.sequence_parallel": False, "parallel.tensor": 1, "parallel.backend": "processes",
        "parallel.world_size": 2, "parallel.bucket_cap_mb": 1.0}


@dataclass(frozen=True)
class Outcome:
    label: str
    predicted_s: float
    measured_s: float
    predicted_share: float
    measured_share: float
    memory_exact: bool
    runs: list

    @property
    def error(self) -> float:
        return (self.predicted_s - self.measured_s) / self.measured_s


def case_configs(base: Config, quick: bool = False, only: str = "",
                 cases: tuple | None = None) -> list[tuple[str, Config]]:
    """The held-out cases on top of `base` (ConfigError if the base cannot take one); `only`: those whose
    label contains it ("stages": the pipeline's); `cases`: other (label, overrides) than CASES."""
    out = []
    for n, (label, overrides) in enumerate(cases or CASES):
        if (quick and n not in QUICK) or only not in label:
            continue
        d = to_dict(base)  # every override at once: a pipeline case's schedule needs its chunks beside it
        for key, value in {**BASE, **overrides}.items():
            *parents, last = key.split(".")
            node = d
            for part in parents:
                node = node.setdefault(part, {})
            node[last] = value
        cfg = from_dict(d, source=f"validation case {label!r}")
        out.append((label, cfg))
    return out


def group_mean_peak(group: list[list[dict[str, int]]]) -> float:
    """The highest activations of the group's mean rank, over steps and phases (`group`: per rank, per step,
    {phase: peak bytes}). The estimate assumes balanced routing: every rank of an expert group receives the
    group's mean rows (their sum is fixed), so it describes the group's mean rank, step by step and phase by
    phase; elsewhere the group is the rank alone."""
    return max(statistics.mean(peaks[i].get(phase, 0) for peaks in group)
               for i, phases in enumerate(group[0]) for phase in phases)


def max_peak(group: list[list[dict[str, int]]]) -> int:
    """The busiest rank's highest activations, over steps and phases."""
    return max(peak for peaks in group for phases in peaks for peak in phases.values())


def validate(base: Config, cluster: Cluster, quick: bool = False, repeats: int = 2, steps: int = 10,
             warmup: int = 3, on_progress=lambda text: None, only: str = "",
             cases: tuple | None = None, calibration_steps: int = CALIBRATION_STEPS) -> dict:
    """Rounds over every case (CASES, or `cases`): calibrate for it, predict it, run it; returns the report
    (see summarize)."""
    configs = case_configs(base, quick, only, cases)
    vocab = vocab_size(configs[0][1]) if base.model.kind == "gpt" else 0
    runs: dict[str, list[dict]] = {label: [] for label, _ in configs}
    calibration = None
    for repeat, (label, cfg) in ((r, case) for r in range(repeats) for case in round_order(configs, r)):
        on_progress(f"round {repeat + 1}/{repeats}: {label}: calibrating, predicting, running")
        calibration = calibrate_for(cfg, vocab, calibration_steps)
        step, mem, _ = predict(cfg, cluster, calibration, vocab)
        run = measure_case(cfg, steps, warmup)
        mesh = Mesh.of(cfg.parallel)
        rank = mesh.rank_of(pp=mem.pipeline_rank)  # the rank the estimate describes
        activations = mem.category_peaks()["activations"]
        group = [run["activations"][r] for r in mesh.members("ep", rank)]
        measured_activations, busiest = group_mean_peak(group), max_peak(group)
        run.update(predicted_s=step.step_s, predicted_share=step.comm_share,
                   predicted_imbalance_share=step.imbalance_s / step.step_s,
                   memory_exact=all(run["states"][rank][k] == mem.states[k] for k in MODEL_STATES),
                   predicted_activations=activations, measured_activations=measured_activations,
                   busiest_activations=busiest,
                   activations_error=(measured_activations - activations) / activations)
        runs[label].append(run)

    def median(measured: list[dict], key: str) -> float:
        return statistics.median(r[key] for r in measured)
    outcomes = [Outcome(label, median(m, "predicted_s"), median(m, "step_s"), median(m, "predicted_share"),
                        median(m, "comm_share"), all(r["memory_exact"] for r in m), m)
                for label, m in runs.items()]
    return summarize(outcomes, calibration)


def round_order(cases: list, repeat: int) -> list:
    """The cases in round `repeat`'s order: forward in even rounds, backward in odd ones. The machine's
    speed drifts over the minutes a round takes; run in one order only, a case early in the round would
    always meet the round's first minutes, and a drift that lasts the round would rank it against a case
    late in the round. Alternating the order puts every pair on both sides of the drift."""
    return cases if repeat % 2 == 0 else cases[::-1]


def calibrate_for(cfg: Config, vocab: int, steps: int = CALIBRATION_STEPS) -> Calibration:
    """A fresh calibration for one case (its precision, the size of a rank's work and its busy ranks, the
    transport at its buckets), in a temporary file. One size only, so it can afford `steps` steps: the
    ranks' imbalance is a small difference of two step times, and a short calibration that a burst of load
    hits on one rank would carry that burst into the prediction."""
    with tempfile.TemporaryDirectory() as folder:
        return calibrate(cfg, vocab, [cfg.precision.dtype], path=Path(folder) / "calibration.json",
                         rows=[calibration_rows(cfg)], levels=(min(cfg.parallel.world_size, max(LEVELS)),),
                         measure_transport=True, steps=steps, meeting_lag=sliced(cfg), slicing=sliced(cfg))


def calibration_rows(cfg: Config) -> int:
    """The rows whose whole-model work is one rank's micro-batch: b rows, over the tensor and context
    ranks that split its tokens (b·s/(t·c) tokens, the size the projection times a TP or CP rank's work at:
    small products run slower per FLOP, so a curve measured at b·s would be scaled down too fast)."""
    rows = cfg.train.global_batch // (Mesh.of(cfg.parallel).degree("dpcp") * cfg.train.micro_batches)
    split = cfg.parallel.tensor * cfg.parallel.context
    return rows // split if rows % split == 0 else rows


def sliced(cfg: Config) -> bool:
    """More ranks than cores: time-slicing (how late ranks meet, what it costs, are calibrated too)."""
    return cfg.parallel.world_size > len(usable_cores())


def measure_case(cfg: Config, steps: int, warmup: int) -> dict:
    """One run of a case: {step_s, comm_share, states} (lower quartiles over steps, slowest rank; states per
    rank: a pipeline's ranks hold different stages)."""
    results = run_ranks(cfg.parallel.world_size, cfg.parallel.backend, _validation_rank,
                        (to_dict(cfg), warmup, steps), timeout_s=120.0, network=network_emulation(cfg),
                        threads_per_rank=cfg.parallel.threads_per_rank)
    return {"step_s": max(r["step_s"] for r in results),
            "comm_share": statistics.mean(r["comm_share"] for r in results),
            "states": [r["states"] for r in results], "activations": [r["activations"] for r in results]}


class _TimedComm:
    """A rank's communicator, timing the collectives the training thread runs itself (all else passes)."""

    def __init__(self, comm):
        self._comm, self._thread, self.blocking_s = comm, threading.get_ident(), 0.0

    def __getattr__(self, name):
        return getattr(self._comm, name)

    def _timed(self, fn, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            if threading.get_ident() == self._thread:
                self.blocking_s += time.perf_counter() - t0

    def send(self, *args, **kwargs):
        return self._timed(self._comm.send, *args, **kwargs)

    def recv(self, *args, **kwargs):
        return self._timed(self._comm.recv, *args, **kwargs)

    def sendrecv(self, *args, **kwargs):
        return self._timed(self._comm.sendrecv, *args, **kwargs)

    def barrier(self):
        return self._timed(self._comm.barrier)

    # what a process group (engine.comm.group: the pipeline's, a data-parallel group smaller than the world)
    # calls on its parent, and a pipeline's batched sends and receives (engine.comm.exchange)
    def _send(self, *args, **kwargs):
        return self._timed(self._comm._send, *args, **kwargs)

    def _recv(self, *args, **kwargs):
        return self._timed(self._comm._recv, *args, **kwargs)

    def _sendrecv(self, *args, **kwargs):
        return self._timed(self._comm._sendrecv, *args, **kwargs)

    def _exchange(self, *args, **kwargs):
        return self._timed(self._comm._exchange, *args, **kwargs)


def _validation_rank(comm, emit, cfg_dict: dict, warmup: int, steps: int) -> dict:
    from engine.comm.meter import TrafficMeter
    from engine.config import from_dict
    from engine.trainer import Trainer
    cfg = from_dict(cfg_dict, source="<validation>")
    comm.meter = comm.meter or TrafficMeter(comm.rank)
    timed = _TimedComm(comm)
    trainer = Trainer(cfg, timed)
    states = {k: trainer.ledger.current[k] for k in MODEL_STATES}
    step_s, waits, activations = [], [], []
    try:
        for i in range(warmup + steps):
            comm.barrier()
            before = timed.blocking_s
            t0 = time.perf_counter()
            trainer.train_step()
            seconds = time.perf_counter() - t0
            waited = trainer.replica.comm_wait_s + timed.blocking_s - before
            # the activations' peak in each of the step's phases (the ledger's, as the estimate predicts it)
            activations.append({phase: peaks.get("activations", 0)
                                for phase, peaks in trainer.ledger.maxima().items()})
            if i >= warmup:
                step_s.append(seconds)
                waits.append(waited)
    finally:
        trainer.replica.close()
    step = low_quantile(step_s)
    return {"step_s": step, "comm_share": min(1.0, low_quantile(waits) / step), "states": states,
            "activations": activations}


def kendall_tau(a: list[float], b: list[float]) -> float:
    pairs = list(itertools.combinations(range(len(a)), 2))
    if not pairs:
        return 1.0
    score = sum((a[i] - a[j]) * (b[i] - b[j]) > 0 for i, j in pairs) - \
        sum((a[i] - a[j]) * (b[i] - b[j]) < 0 for i, j in pairs)
    return score / len(pairs)


def summarize(outcomes: list[Outcome], calibration: Calibration | None = None) -> dict:
    """The validation report: per case and overall (MAPE, max, bias, comm share, memory, ranking)."""
    errors = [o.error for o in outcomes]
    # each round's prediction against the run it was calibrated for, minutes apart: under a load that
    # swings between rounds, the median of these is steadier than the medians' ratio
    paired = [statistics.median(r["predicted_s"] / r["step_s"] - 1 for r in o.runs) for o in outcomes]
    measured = [o.measured_s for o in outcomes]
    predicted = [o.predicted_s for o in outcomes]
    spread = [(max(r["step_s"] for r in o.runs) - min(r["step_s"] for r in o.runs)) / 2 for o in outcomes]
    beyond_noise = [(i, j) for i, j in itertools.combinations(range(len(outcomes)), 2)
                    if abs(measured[i] - measured[j]) > max(NOISE * min(measured[i], measured[j]),
                                                            spread[i] + spread[j])]
    discordant = [(outcomes[i].label, outcomes[j].label) for i, j in beyond_noise
                  if (measured[i] - measured[j]) * (predicted[i] - predicted[j]) <= 0]
    return {
        "cases": [{"label": o.label, "predicted_s": o.predicted_s, "measured_s": o.measured_s,
                   "error": o.error, "paired_error": e, "predicted_comm_share": o.predicted_share,
                   "measured_comm_share": o.measured_share, "memory_exact": o.memory_exact,
                   # of the predicted share, the wait for slower ranks sharing the host (calibrated)
                   "predicted_imbalance_share": statistics.median(r["predicted_imbalance_share"]
                                                                  for r in o.runs),
                   "runs_s": [r["step_s"] for r in o.runs],
                   "predicted_runs_s": [r["predicted_s"] for r in o.runs],
                   # per round too: a share that misses in one round only is noise, in every round a cause
                   "comm_shares": [r["comm_share"] for r in o.runs],
                   "predicted_comm_shares": [r["predicted_share"] for r in o.runs],
                   "predicted_activations": o.runs[0].get("predicted_activations"),
                   "measured_activations": [r.get("measured_activations") for r in o.runs],
                   "busiest_activations": [r.get("busiest_activations") for r in o.runs],
                   "activations_error": max((r.get("activations_error", 0.0) for r in o.runs), key=abs)}
                  for o, e in zip(outcomes, paired)],
        "mape": statistics.mean(abs(e) for e in errors),
        "max_error": max(abs(e) for e in errors),
        "bias": statistics.mean(errors),
        "paired_mape": statistics.mean(abs(e) for e in paired),
        "paired_max_error": max(abs(e) for e in paired),
        "comm_share_points": max(abs(o.predicted_share - o.measured_share) for o in outcomes) * 100,
        "memory_exact": all(o.memory_exact for o in outcomes),
        "activations_max_error": max(abs(r.get("activations_error", 0.0)) for o in outcomes for r in o.runs),
        "kendall_tau": kendall_tau(measured, predicted),
        "ranking_preserved": not discordant,
        "discordant": discordant,
        "pairs_told_apart": len(beyond_noise),
        "noise": NOISE,
        "calibration": {"alpha": calibration.transport["alpha"], "beta": calibration.transport["beta"],
                        "gamma": calibration.transport["gamma"], "cores": calibration.cores,
                        "peak_flops": calibration.peak_flops} if calibration else None,
    }
