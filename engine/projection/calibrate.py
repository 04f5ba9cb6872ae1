"""Calibration from a short live run on this machine: how fast a model computes at each micro-batch size
with 1 and 2 ranks busy at once, how fast memory copies, and α, β, γ of nanoDist's own transport at the
sizes a run sends. Saved as JSON (atomically) and reused; a model or precision not in the file yet is
measured when a projection first needs it.

What is measured, all on the processes backend (real processes, as training runs them):

* compute: `level` ranks (1 or 2) each train the model alone (a one-rank communicator of its own, so
  nothing is sent) with their auto share of the cores (engine.comm.cores), in step with each other (a barrier
  between steps), timing forward, backward, the optimizer step and the bookkeeping around them (drawing
  the batch, clearing gradients); for every precision and several micro-batch sizes. With 2 ranks the
  host's cores and memory bandwidth are shared: that contention is in the curve, not mistaken later for
  communication. So is their imbalance: ranks sharing cores do not finish together, and the time the
  faster one waits at the barrier, as a share of the step's compute, is kept ("imbalance": the lower
  quartile of the waits over that of the step's compute, averaged over the ranks). With 2 ranks, also
  how much a bucket's all-reduce running beside forward and backward slows them per CPU second it takes
  ("interference", κ) and how much CPU it takes there (engine.projection.interference).
* copies: bytes per second of a large numpy copy, with the same ranks busy (ZeRO packs and unpacks).
* transport: α, β, γ of our ring at the sizes a run sends, in wall-clock and in CPU time
  (engine.projection.transport_calibration).

A timed figure is the lower quartile of its repetitions: other jobs on a shared machine only ever slow a
repetition down, so the low quantile estimates the machine's own speed better than the median.
"""

from __future__ import annotations

import json
import math
import os
import socket
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.atomic_file import atomic_write_text
from engine.comm.cores import usable_cores
from engine.comm.launch import run_ranks
from engine.config import Config, to_dict
from engine.dtypes import itemsize
from engine.projection.flops import model_signature
from engine.projection.interference import measure_interference
from engine.projection.quantile import low_quantile
from engine.projection.transport_calibration import default_transport_sizes, measure_ring

VERSION = 1
LEVELS = (1, 2)  # ranks computing at once on the host


class CalibrationError(ValueError):
    """An unusable calibration file: one line naming it and what to do."""


def default_path() -> Path:
    """$NANODIST_CALIBRATION, else $XDG_CACHE_HOME (or ~/.cache)/nanodist/calibration.json."""
    if os.environ.get("NANODIST_CALIBRATION"):
        return Path(os.environ["NANODIST_CALIBRATION"]).expanduser()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "nanodist" / "calibration.json"


@dataclass
class Calibration:
    """A calibration file's contents: {"version", "host", "cores", "peak_flops", "copy_bytes_per_s"
    {level: B/s}, "transport" {alpha, beta, gamma, gamma_by_dtype, sizes, gather_s, scatter_s,
    "cpu" {alpha, beta, gamma, gamma_by_dtype, gather_s, scatter_s}: the same collectives' CPU seconds},
    "models" {signature:
    {dtype: {level: {tokens, forward_s, backward_s, optimizer_s_per_element, other_s, imbalance,
    interference, interference_cpu_s, interference_bytes}}}}} (the last three at 2 busy ranks only)."""

    data: dict

    @property
    def cores(self) -> int:
        return int(self.data["cores"])

    @property
    def peak_flops(self) -> float:
        return float(self.data["peak_flops"])

    def copy_bytes_per_s(self, level: int) -> float:
        table = self.data["copy_bytes_per_s"]
        return float(table.get(str(level)) or table[max(table, key=int)])

    @property
    def transport(self) -> dict:
        return self.data["transport"]

    def gamma(self, dtype: str) -> float:
        """Seconds per byte our reduction takes in this precision (fp32's when it was not measured)."""
        return float(self.transport.get("gamma_by_dtype", {}).get(dtype, self.transport["gamma"]))

    def cpu(self, dtype: str) -> tuple[float, float, float]:
        """(α, β, γ) of our collectives' CPU time in this precision: seconds per message, per byte sent,
        per byte reduced. A file without them (measured before they were) gives the copying alone: 0, β
        and γ of the wall-clock fit."""
        cpu = self.transport.get("cpu")
        if cpu is None:
            return 0.0, float(self.transport["beta"]), self.gamma(dtype)
        return (float(cpu["alpha"]), float(cpu["beta"]),
                float(cpu.get("gamma_by_dtype", {}).get(dtype, cpu["gamma"])))

    def model(self, signature: str) -> dict | None:
        return self.data.get("models", {}).get(signature)

    def missing(self, signature: str, dtypes) -> list[str]:
        have = self.model(signature) or {}
        return [d for d in dtypes if d not in have]

    def save(self, path: Path) -> None:
        atomic_write_text(path, json.dumps(self.data, indent=1, sort_keys=True) + "\n")

    @classmethod
    def load(cls, path: Path) -> Calibration | None:
        """The file's calibration; None when there is none yet; CalibrationError when it is unusable."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CalibrationError(f"{path}: not a readable calibration ({exc}); delete it or run "
                                   "`nanodist-tui project --calibrate` to measure again") from None
        if not isinstance(data, dict) or data.get("version") != VERSION or "transport" not in data:
            raise CalibrationError(f"{path}: not a calibration of this nanoDist version; run "
                                   "`nanodist-tui project --calibrate` to measure again")
        return cls(data)


# ---------------------------------------------------------------------- running the measurements

def calibrate(cfg: Config, vocab: int, dtypes, path: Path | None = None, rows: list[int] | None = None,
              steps: int = 6, warmup: int = 2, transport_sizes: list[int] | None = None,
              measure_transport: bool = False, fresh: bool = False, levels=LEVELS) -> Calibration:
    """Measure what is missing for cfg's model in `dtypes` (and the host and transport, on a first run or
    with `measure_transport`), merge it into the calibration at `path` and save it there. `fresh`: measure
    the host, the transport and cfg's model in `dtypes` again (other models in the file are kept).
    `levels`: how many busy ranks to measure the compute with (1 and 2 unless a caller needs fewer)."""
    path = path or default_path()
    existing = Calibration.load(path)
    data: dict = existing.data if existing else {"version": VERSION, "models": {}}
    if fresh:
        data["models"].pop(model_signature(cfg, vocab), None)
    cores = len(usable_cores())
    if measure_transport or fresh or existing is None:
        data.update(host=socket.gethostname(), cores=cores, peak_flops=peak_matmul_flops(),
                    created=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        data["transport"] = measure_ring(transport_sizes or default_transport_sizes(cfg, vocab), list(dtypes))
    signature = model_signature(cfg, vocab)
    todo = [d for d in dtypes if d not in data["models"].get(signature, {})]
    if todo:
        rows = rows or default_rows(cfg)
        entry, copies = measure_compute(cfg, todo, rows, cores, steps, warmup, levels)
        data["models"].setdefault(signature, {}).update(entry)
        data["copy_bytes_per_s"] = {**data.get("copy_bytes_per_s", {}), **copies}
    calibration = Calibration(data)
    calibration.save(path)
    return calibration


def default_rows(cfg: Config) -> list[int]:
    """Micro-batch sizes to measure: powers of two from an eighth of the global batch up to all of it."""
    top = cfg.train.global_batch
    return sorted({max(1, top >> k) for k in range(4)})


def peak_matmul_flops(n: int = 1024, repeats: int = 5) -> float:
    """The best float32 matmul rate of this process (all cores): what 'peak' means on this machine."""
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ a
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def measure_compute(cfg: Config, dtypes, rows: list[int], cores: int, steps: int, warmup: int,
                    levels=LEVELS) -> tuple[dict, dict]:
    """{dtype: {level: curve}} for cfg's model, and copy bandwidth per level."""
    entry: dict = {d: {} for d in dtypes}
    copies: dict = {}
    for level in levels:
        if level > max(1, cores):
            continue  # more busy ranks than cores is time-slicing, which the model scales
        args = (to_dict(cfg), list(dtypes), rows, steps, warmup)
        results = run_ranks(level, "processes", _compute_rank, args, timeout_s=300.0)  # auto threads per rank
        for dtype in dtypes:
            per_rank = [r["curves"][dtype] for r in results]
            entry[dtype][str(level)] = {key: _mean_over_ranks(per_rank, key) for key in per_rank[0]}
        copies[str(level)] = statistics.mean(r["copy_bytes_per_s"] for r in results)
    return entry, copies


def _mean_over_ranks(per_rank: list[dict], key: str):
    values = [r[key] for r in per_rank]
    if isinstance(values[0], list):
        return [statistics.mean(column) for column in zip(*values)]
    return statistics.mean(values)


def _compute_rank(comm, emit, cfg_dict: dict, dtypes: list[str], rows: list[int], steps: int, warmup: int
                  ) -> dict:
    """One busy rank: its model alone at every size and precision, in step with the other ranks."""
    from engine.config import from_dict
    curves = {}
    per_row = cfg_dict["model"].get("block_size", 1) if cfg_dict["model"]["kind"] == "gpt" else 1
    for dtype in dtypes:
        per_size = [_time_phases(comm, from_dict(_single(cfg_dict, dtype, r), source="<calibration>"), steps,
                                 warmup, interference=r == rows[-1]) for r in rows]
        curves[dtype] = {"tokens": [r * per_row for r in rows], "forward_s": [p["forward"] for p in per_size],
                         "backward_s": [p["backward"] for p in per_size],
                         "optimizer_s_per_element": statistics.mean(p["optimizer"] / p["n_params"]
                                                                    for p in per_size),
                         "other_s": statistics.mean(p["other"] for p in per_size),
                         "imbalance": statistics.mean(p["imbalance"] for p in per_size),
                         **{k: v for k, v in per_size[-1].items() if k.startswith("interference")}}
    return {"curves": curves, "copy_bytes_per_s": _copy_rate(comm)}


def _single(cfg_dict: dict, dtype: str, rows: int) -> dict:
    """cfg as one rank training `rows` rows per step in `dtype`: no accumulation, no checkpointing."""
    d = json.loads(json.dumps(cfg_dict))
    d["parallel"].update(world_size=1, backend="threads", zero_stage=0, ranks_per_node=0)
    d.pop("emulate", None)
    d["train"].update(global_batch=rows, micro_batches=1)
    d["precision"]["dtype"] = dtype
    d["memory"]["checkpointing"] = "none"
    return d


def _time_phases(comm, cfg: Config, steps: int, warmup: int, interference: bool = False) -> dict:
    """Low-quantile seconds of a step's phases for a one-rank trainer, ranks stepping together; with
    `interference` and other busy ranks, also κ of a bucket's all-reduce beside its forward and backward
    (engine.projection.interference; 1 with one rank, whose collectives never overlap anything)."""
    from engine.comm.base import Signals
    from engine.comm.threads import ThreadGroup
    from engine.data import rank_slice
    from engine.trainer import Trainer
    trainer = Trainer(cfg, ThreadGroup(1, cfg.parallel.timeout_s, Signals()).communicator(0))
    replica = trainer.replica
    phases: dict[str, list[float]] = {"forward": [], "backward": [], "optimizer": [], "other": []}
    waits, computes = [], []
    try:
        for i in range(warmup + steps):
            before = time.perf_counter()
            comm.barrier()  # waits for the slowest rank's previous step
            t0 = time.perf_counter()
            x, y = rank_slice(trainer.dataset.global_batch(i, "train"), 0, 1, 0, 1)
            replica.zero_grad()
            replica.begin_micro(sync=True)
            t1 = time.perf_counter()
            loss = trainer._loss(x, y)
            float(loss.data)
            t2 = time.perf_counter()
            replica.backward(loss, 1.0)
            replica.finish_backward()
            t3 = time.perf_counter()
            replica.step(1e-4, min(1.0, 1.0 / max(replica.grad_norm(), 1e-12)), i)
            t4 = time.perf_counter()
            if i >= warmup:
                for key, seconds in zip(phases, (t2 - t1, t3 - t2, t4 - t3, t1 - t0)):
                    phases[key].append(seconds)
                computes.append(t4 - t0)
                if i > warmup:  # the first barrier waits for the warm-up, not for a step
                    waits.append(t0 - before)
        beside: dict = {}
        if interference and comm.world_size > 1:
            def forward_backward() -> None:
                replica.zero_grad()
                replica.begin_micro(sync=True)
                replica.backward(trainer._loss(x, y), 1.0)
                replica.finish_backward()
            bucket = min(int(cfg.parallel.bucket_cap_mb * 2**20),
                         trainer.n_params * itemsize(cfg.precision.dtype))
            beside = measure_interference(comm, forward_backward, bucket)
    finally:
        replica.close()
    # the lower quartiles, as for every timed figure: a step another job slowed on one rank is load, not
    # the ranks' own imbalance (and a run's measured waits are taken the same way, validate.py)
    imbalance = low_quantile(waits) / low_quantile(computes) if waits else 0.0
    return {**{k: low_quantile(v) for k, v in phases.items()}, "n_params": trainer.n_params,
            "imbalance": imbalance, **beside}


def _copy_rate(comm, nbytes: int = 32 << 20, repeats: int = 7) -> float:
    """Bytes per second of one large numpy copy, the other ranks copying at the same time."""
    src, dst = np.ones(nbytes, np.uint8), np.empty(nbytes, np.uint8)
    times = []
    for _ in range(repeats):
        comm.barrier()
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    return nbytes / low_quantile(times)
