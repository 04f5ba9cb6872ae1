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
  quartile of the waits over that of the step's compute, the lower of two such estimates seconds apart,
  averaged over the ranks). With 2 ranks, also how much a bucket's all-reduce running beside forward and
  backward slows them per CPU second it takes ("interference", κ) and how much CPU it takes there
  (engine.projection.interference). engine.projection.compute_calibration does this part. And what
  time-slicing costs the model beyond its share of a core: 2 ranks on one core against 2 on a core each
  (engine.projection.slicing_overhead).
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
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine import paths
from engine.comm.cores import usable_cores
from engine.config import Config
from engine.projection.compute_calibration import LEVELS, measure_compute
from engine.projection.flops import model_signature
from engine.projection.meeting_lag import measure_meeting_lag
from engine.projection.slicing_overhead import measure_slicing_overhead
from engine.projection.transport_calibration import default_transport_sizes, measure_ring
from engine.run.atomic_file import atomic_write_text

VERSION = 1


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
    """A calibration file's contents: {"version", "host", "cores", "peak_flops", "meeting_lag_s",
    "copy_bytes_per_s" {level: B/s}, "transport" {alpha, beta, gamma, gamma_by_dtype, sizes, gather_s,
    scatter_s, "cpu" {alpha, beta, gamma, gamma_by_dtype, gather_s, scatter_s}: the same collectives' CPU
    seconds},
    "models" {signature:
    {dtype: {level: {tokens, forward_s, backward_s, optimizer_s_per_element, other_s, imbalance,
    interference, interference_cpu_s, interference_bytes, slicing_overhead, expert_imbalance}}}}} (the
    interference figures at 2 busy ranks only; slicing_overhead where it was measured; expert_imbalance
    {EP degree: λ} for a model with experts, routing.py)."""

    data: dict

    @property
    def cores(self) -> int:
        return int(self.data["cores"])

    @property
    def peak_flops(self) -> float:
        return float(self.data["peak_flops"])

    @property
    def meeting_lag_s(self) -> float:
        """How late the last of 2 ranks per core reaches a collective (0 where it was not measured)."""
        return float(self.data.get("meeting_lag_s", 0.0))

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
            data = json.loads(paths.read_small(path).decode("utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, paths.PathError) as exc:
            raise CalibrationError(f"{path}: not a readable calibration ({exc}); delete it or run "
                                   "`nanodist-tui project --calibrate` to measure again") from None
        if not isinstance(data, dict) or data.get("version") != VERSION or "transport" not in data:
            raise CalibrationError(f"{path}: not a calibration of this nanoDist version; run "
                                   "`nanodist-tui project --calibrate` to measure again")
        return cls(data)


# ---------------------------------------------------------------------- running the measurements

def calibrate(cfg: Config, vocab: int, dtypes, path: Path | None = None, rows: list[int] | None = None,
              steps: int = 6, warmup: int = 2, transport_sizes: list[int] | None = None,
              measure_transport: bool = False, fresh: bool = False, levels=LEVELS,
              meeting_lag: bool = True, slicing: bool = True,
              context_degrees: Sequence[int] = ()) -> Calibration:
    """Measure what is missing for cfg's model in `dtypes` (and the host and transport, on a first run or
    with `measure_transport`), merge it into the calibration at `path` and save it there. `fresh`: measure
    the host, the transport and cfg's model in `dtypes` again (other models in the file are kept).
    `levels`: how many busy ranks to measure the compute with (1 and 2 unless a caller needs fewer).
    `meeting_lag`: with the host, measure how late time-sliced ranks meet (engine.projection.meeting_lag;
    a caller that never puts more ranks than cores on the host can skip it). `slicing`: with a model's
    compute, measure what time-slicing costs it beyond its share of a core
    (engine.projection.slicing_overhead; likewise skippable). `context_degrees`: ring attention's figures at
    these context-parallel degrees too, beside cfg's own (a planner's, whose base has none)."""
    path = path or default_path()
    existing = Calibration.load(path)
    data: dict = existing.data if existing else {"version": VERSION, "models": {}}
    if fresh:
        data["models"].pop(model_signature(cfg, vocab), None)
    usable = sorted(usable_cores())
    cores = len(usable)
    if measure_transport or fresh or existing is None:
        data.update(host=socket.gethostname(), cores=cores, peak_flops=peak_matmul_flops(),
                    created=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        data["transport"] = measure_ring(transport_sizes or default_transport_sizes(cfg, vocab), list(dtypes))
        if meeting_lag:
            data["meeting_lag_s"] = measure_meeting_lag(cores)
    signature = model_signature(cfg, vocab)
    todo = [d for d in dtypes if d not in data["models"].get(signature, {})]
    if todo:
        rows = rows or default_rows(cfg)
        entry, copies = measure_compute(cfg, todo, rows, cores, steps, warmup, levels, context_degrees)
        if slicing and "2" in entry[todo[0]]:
            overheads = measure_slicing_overhead(cfg, todo, rows[-1], usable, steps, warmup)
            for dtype, overhead in overheads.items():
                entry[dtype]["2"]["slicing_overhead"] = overhead
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
    """The best float32 matmul rate of this process (all the threads its BLAS may use), in FLOP/s: what 'peak'
    means on this machine (`bench step` reads its steps against it too, engine.bench.machine). One untimed
    product first lets the BLAS start its threads and touch the memory."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    out = np.empty((n, n), dtype=np.float32)
    np.matmul(a, b, out=out)
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.matmul(a, b, out=out)
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best
