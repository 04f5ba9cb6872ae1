"""How fast a rank computes: FLOP/s as a function of the work's size, per phase and precision.

Two sources, one interface (`rate`, `optimizer_s`, `copy_s`, `other_s`, `peak`, `imbalance_s`,
`meeting_lag_s`, `slicing`, and `interference`: compute lost per CPU second of communication overlapping
it):

* `NominalCompute` — a cluster file's figures: peak FLOP/s × an efficiency curve that saturates with the
  micro-batch, eff(x) = eff_max · x / (x + x½) for x tokens per micro-batch (the shape of every achieved-
  FLOPs-versus-batch plot: small products cannot fill the machine). The optimizer and the copies ZeRO makes
  are memory-bound: bytes moved / memory bandwidth.
* `CalibratedCompute` — measured on this machine (engine.projection.calibrate): forward and backward
  seconds of the model at several micro-batch sizes, with 1 and with 2 ranks computing at once on the host;
  efficiency is interpolated linearly in log(size) between them. Ranks sharing the host's cores and memory
  bandwidth are part of the curve: the 2-rank curve is measured with both ranks busy. Beyond what was
  calibrated, more ranks than cores time-slice: time × (ranks × threads) / (calibrated ranks × threads),
  threads per rank as the run resolves them (parallel.threads_per_rank; auto: engine.comm.cores.share),
  × the overhead of time-slicing where it was measured (engine.projection.slicing_overhead).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from engine.comm.cores import resolve, share
from engine.dtypes import is_low_precision
from engine.projection.collective_times import Link, ring_all_reduce
from engine.projection.ring_calibration import degree_key

PHASES = ("forward", "backward")
# AdamW per element: fp32 reads parameter, gradient, m, v and writes parameter, m, v (7 × 4 bytes); mixed
# precision also reads the 16-bit gradient, writes and reads its fp32 copy, and writes the 16-bit parameter
OPTIMIZER_BYTES = {False: 28, True: 40}


def expected_max_normal(n: int, points: int = 4001) -> float:
    """E[max of n independent standard normals] (0 for n = 1; 1/sqrt(pi) for 2), by quadrature."""
    if n < 2:
        return 0.0
    total, width = 0.0, 16.0 / (points - 1)
    for i in range(points):
        x = -8.0 + i * width
        pdf = math.exp(-x * x / 2) / math.sqrt(2 * math.pi)
        cdf = 0.5 * (1 + math.erf(x / math.sqrt(2)))
        total += x * n * pdf * cdf ** (n - 1) * width
    return total


def demand(ranks_on_host: int, cores: int, threads_per_rank: int, level: int) -> float:
    """How much more CPU time the ranks ask for than the calibrated `level` had (1 = no more): ranks x
    their threads over level x the auto share it was measured with; more than the cores is time-slicing."""
    if not cores:
        return 1.0
    asked = ranks_on_host * resolve(threads_per_rank, cores, ranks_on_host)
    return max(1.0, asked / (level * share(cores, level)))


class NominalCompute:
    """Peak × efficiency(x) from a cluster file; memory-bound work at its memory bandwidth."""

    def __init__(self, cluster):
        self.cluster = cluster

    def peak(self, dtype: str) -> float:
        return self.cluster.peak_flops(dtype) or self.cluster.peak_flops("fp32")

    def efficiency(self, tokens: float) -> float:
        c = self.cluster
        return c["compute.efficiency_max"] * tokens / (tokens + c["compute.efficiency_half_tokens"])

    def rate(self, phase: str, dtype: str, tokens: float, ranks_on_host: int) -> float:
        return self.peak(dtype) * self.efficiency(tokens)

    def _bandwidth(self) -> float:
        return self.cluster["compute.memory_bandwidth_gbs"] * 1e9

    def optimizer_s(self, elements: int, dtype: str, ranks_on_host: int) -> float:
        bandwidth = self._bandwidth()
        return elements * OPTIMIZER_BYTES[is_low_precision(dtype)] / bandwidth if bandwidth else 0.0

    def copy_s(self, nbytes: float, ranks_on_host: int) -> float:
        bandwidth = self._bandwidth()
        return 2 * nbytes / bandwidth if bandwidth else 0.0  # read and write

    def other_s(self, dtype: str, ranks_on_host: int) -> float:
        return 0.0

    def imbalance_s(self, compute_s: float, dtype: str, ranks_on_host: int) -> float:
        return 0.0

    def interference(self, dtype: str, ranks_on_host: int) -> float:
        return 1.0  # a CPU second of communication takes a CPU second from compute

    def meeting_lag_s(self, dtype: str, ranks_on_host: int) -> float:
        return 0.0  # a cluster file's ranks each have their own cores

    def slicing(self, dtype: str, ranks_on_host: int) -> float:
        return 1.0

    def ring_blocks(self, dtype: str, ranks_on_host: int, tokens: float, degree: int) -> dict | None:
        return None  # a cluster file's accelerators run ring attention's blocks at their FLOP rate

    def expert_imbalance(self, degree: int, dtype: str, ranks_on_host: int) -> float | None:
        return None  # a cluster file says nothing of a model's routing


@dataclass(frozen=True)
class Curve:
    """Measured seconds at increasing sizes; log-log interpolation, extrapolated along the end segments."""

    sizes: tuple[float, ...]
    seconds: tuple[float, ...]

    def __call__(self, x: float) -> float:
        xs, ys = self.sizes, self.seconds
        if len(xs) == 1:
            return ys[0] * x / xs[0]
        i = min(max(bisect.bisect_left(xs, x), 1), len(xs) - 1)
        lx0, lx1, ly0, ly1 = (math.log(v) for v in (xs[i - 1], xs[i], ys[i - 1], ys[i]))
        slope = max((ly1 - ly0) / (lx1 - lx0), 0.0)  # time never falls as the work grows
        if x < xs[0]:
            slope = min(slope, 1.0)  # below the smallest size measured, time falls at most linearly
        return math.exp(ly0 + slope * (math.log(x) - lx0))


class CalibratedCompute:
    """This machine's measured curves for one model (`entry` of a calibration, see calibrate.py)."""

    def __init__(self, calibration, entry: dict, flops_of, threads_per_rank: int = 0):
        self.calibration, self.entry, self.flops_of = calibration, entry, flops_of
        self.cores, self.threads_per_rank = calibration.cores, threads_per_rank

    def _by_level(self, dtype: str) -> dict:
        """{level: measured figures} in this precision (the first one measured where it was not)."""
        return self.entry.get(dtype) or self.entry[next(iter(self.entry))]

    def _measured(self, dtype: str, ranks_on_host: int) -> tuple[dict, float]:
        """The measured level for this many busy ranks, and the demand factor beyond it."""
        by_dtype = self._by_level(dtype)
        levels = sorted(int(k) for k in by_dtype)
        level = max([k for k in levels if k <= ranks_on_host] or levels[:1])
        return by_dtype[str(level)], demand(ranks_on_host, self.cores, self.threads_per_rank, level)

    def _level(self, dtype: str, ranks_on_host: int) -> tuple[dict, float]:
        """The measured level, and how much longer its work takes here: the demand factor, and where that
        is time-slicing, its overhead (slicing_overhead: measured at 2 ranks per core, reached in
        proportion as the demand goes from 1 to 2 ranks per core's worth)."""
        level, factor = self._measured(dtype, ranks_on_host)
        overhead = self._by_level(dtype).get("2", {}).get("slicing_overhead", 1.0)
        return level, factor * (1.0 + (overhead - 1.0) * min(1.0, factor - 1.0))

    def peak(self, dtype: str) -> float:
        return self.calibration.peak_flops

    def seconds(self, phase: str, dtype: str, tokens: float, ranks_on_host: int) -> float:
        level, factor = self._level(dtype, ranks_on_host)
        return Curve(tuple(level["tokens"]), tuple(level[phase + "_s"]))(tokens) * factor

    def ring_blocks(self, dtype: str, ranks_on_host: int, tokens: float, degree: int) -> dict | None:
        """Ring attention's figures as calibrated for context-parallel `degree` (ring_calibration.py,
        ring_pass_calibration.py) for a rank whose whole-model work is `tokens` tokens: {key: seconds}, from
        the calibrated size nearest it, scaled by the ratio (the kernels are a loop over rows and heads) and
        by the time-slicing factor; None where the calibration did not time them at that degree."""
        level, factor = self._level(dtype, ranks_on_host)
        prefix = degree_key(degree, "")
        keys = [k for k in level if k.startswith(prefix)]
        if not keys:
            return None
        sizes = level["tokens"]
        i = min(range(len(sizes)), key=lambda j: abs(math.log(sizes[j] / tokens)))
        return {k[len(prefix):]: level[k][i] * tokens / sizes[i] * factor for k in keys}

    def expert_imbalance(self, degree: int, dtype: str, ranks_on_host: int) -> float | None:
        """λ of an EP group of `degree` ranks as the calibrated model routed (compute_calibration.py);
        None where it has no experts or the calibration predates the figure."""
        level, _ = self._measured(dtype, ranks_on_host)
        return level.get("expert_imbalance", {}).get(str(degree))

    def rate(self, phase: str, dtype: str, tokens: float, ranks_on_host: int) -> float:
        flops = self.flops_of(tokens)
        work = flops.forward if phase == "forward" else flops.backward
        return work / self.seconds(phase, dtype, tokens, ranks_on_host)

    def optimizer_s(self, elements: int, dtype: str, ranks_on_host: int) -> float:
        level, factor = self._level(dtype, ranks_on_host)
        return elements * level["optimizer_s_per_element"] * factor

    def copy_s(self, nbytes: float, ranks_on_host: int) -> float:
        level, factor = self._level(next(iter(self.entry)), ranks_on_host)
        return nbytes / self.calibration.copy_bytes_per_s(min(ranks_on_host, self.cores or 1)) * factor

    def other_s(self, dtype: str, ranks_on_host: int) -> float:
        level, factor = self._level(dtype, ranks_on_host)
        return level["other_s"] * factor

    def imbalance_s(self, compute_s: float, dtype: str, ranks_on_host: int) -> float:
        """How long the step waits for the slowest of the ranks sharing the host: the calibrated share
        of compute at 2 ranks (E[max − mean] of 2) scaled to n ranks as normal order statistics are,
        E[max of n] / E[max of 2]."""
        if ranks_on_host < 2:
            return 0.0
        share = self._by_level(dtype).get("2", {}).get("imbalance", 0.0)
        return share * compute_s * expected_max_normal(ranks_on_host) / expected_max_normal(2)

    def meeting_lag_s(self, dtype: str, ranks_on_host: int) -> float:
        """How late the last rank reaches each collective where the ranks outnumber the cores: the lag
        measured with 2 ranks per core (engine.projection.meeting_lag), scaled by the ranks per core beyond
        one (the time-slicing factor less one: 0 with cores to spare)."""
        return self.calibration.meeting_lag_s * max(0.0, self.slicing(dtype, ranks_on_host) - 1.0)

    def slicing(self, dtype: str, ranks_on_host: int) -> float:
        """The ranks' CPU demand over what the calibrated level had: > 1 where they time-slice."""
        return self._measured(dtype, ranks_on_host)[1]

    def interference(self, dtype: str, ranks_on_host: int) -> float:
        """Seconds of compute lost per second of the transport's fitted CPU time (calibrate.py) of the
        communication running beside it, as measured with 2 busy ranks (engine.projection.interference):
        κ × the CPU one all-reduce took there over the fitted CPU time of that all-reduce. 1 where it was
        not measured."""
        level = self._by_level(dtype).get("2", {})
        if "interference" not in level:
            return 1.0
        alpha, beta, gamma = self.calibration.cpu(dtype)
        ranks = self.calibration.transport.get("ranks", 2)
        fitted = ring_all_reduce(ranks, level["interference_bytes"], Link(alpha, beta), gamma)
        return float(level["interference"]) * (level["interference_cpu_s"] / fitted if fitted > 0 else 1.0)
