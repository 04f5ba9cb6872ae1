"""Per-rank traffic meter: payload bytes and seconds per link, per step.

A link is (src, dst, phase, group, algorithm), with global ranks:
  phase      what the bytes were for: the collective's own step ("reduce-scatter", "all-gather",
             "all-reduce", "reduce", "broadcast", "barrier") or a caller's label ("param-gather");
             anything sent outside a labelled block is "p2p"
  group      the communicator that sent them: "world", or a process group's name ("node0", "cross1",
             engine.comm.group)
  algorithm  the collective algorithm that ran ("ring", "rhd", "tree", "hierarchical", "chain" for
             the pipelined broadcast, "dissemination" for the barrier; "p2p" outside any collective)

Labels nest: the outermost one wins (a caller's label says more than the collective's: ZeRO-3 calls its
all-gathers "param-gather"; a hierarchical all-reduce books its ring steps inside the node as
"hierarchical").
Bandwidth helpers follow the NCCL-tests definitions (its PERFORMANCE.md): algbw = S / t and
busbw = algbw × a factor that makes the figure comparable to the link bandwidth.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

DEFAULT_PHASE = "p2p"
DEFAULT_ALGORITHM = "p2p"
WORLD = "world"

# busbw = algbw × factor(N); NCCL-tests PERFORMANCE.md.
_BUS_FACTORS = {
    "all-reduce": lambda n: 2 * (n - 1) / n,
    "reduce-scatter": lambda n: (n - 1) / n,
    "all-gather": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "all-to-all": lambda n: (n - 1) / n,
}

LinkKey = tuple[int, int, str, str, str]  # (src, dst, phase, group, algorithm)


class TrafficMeter:
    """Thread-safe: the communication thread records while the trainer thread snapshots."""

    def __init__(self, rank: int):
        self.rank = rank
        self.step: int | None = None
        self._lock = threading.Lock()
        self._labels = threading.local()  # labels belong to the thread that runs the collective
        self._step_links: dict[LinkKey, list[float]] = {}
        self._total_links: dict[LinkKey, list[float]] = {}

    def begin_step(self, step: int) -> None:
        """Start counting a new step; snapshot() reports only what is sent from here on."""
        with self._lock:
            self.step = step
            self._step_links = {}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        with self._label("phase", name):
            yield

    @contextlib.contextmanager
    def algorithm(self, name: str) -> Iterator[None]:
        with self._label("algorithm", name):
            yield

    @property
    def current_phase(self) -> str:
        stack = self._stack("phase")
        return stack[0] if stack else DEFAULT_PHASE

    @property
    def current_algorithm(self) -> str:
        stack = self._stack("algorithm")
        return stack[0] if stack else DEFAULT_ALGORITHM

    def record(self, phase: str, src: int, dst: int, nbytes: int, seconds: float, group: str = WORLD,
               algorithm: str | None = None) -> None:
        key = (src, dst, phase, group, self.current_algorithm if algorithm is None else algorithm)
        with self._lock:
            for links in (self._step_links, self._total_links):
                entry = links.setdefault(key, [0, 0.0])
                entry[0] += nbytes
                entry[1] += seconds

    def snapshot(self) -> list[dict]:
        """This step's links: [{src, dst, phase, group, algorithm, bytes, seconds}] (the Traffic event's
        ``links``)."""
        with self._lock:
            return _as_rows(self._step_links)

    def totals(self) -> list[dict]:
        """Like snapshot(), summed over the meter's whole life."""
        with self._lock:
            return _as_rows(self._total_links)

    def bytes_sent(self, phase: str | None = None, group: str | None = None) -> int:
        """Payload bytes sent this step, in one phase (one group) or all of them."""
        return sum(row["bytes"] for row in self.snapshot()
                   if phase in (None, row["phase"]) and group in (None, row["group"]))

    @contextlib.contextmanager
    def _label(self, kind: str, name: str) -> Iterator[None]:
        stack = self._stack(kind)
        stack.append(name)
        try:
            yield
        finally:
            stack.pop()

    def _stack(self, kind: str) -> list[str]:
        if not hasattr(self._labels, kind):
            setattr(self._labels, kind, [])
        return getattr(self._labels, kind)


def metered_phase(meter: TrafficMeter | None, name: str):
    """``meter.phase(name)``, or nothing without a meter. Labels nest and the outermost wins, so a
    caller's label ("param-gather") covers the collective's own ("all-gather")."""
    return contextlib.nullcontext() if meter is None else meter.phase(name)


@contextlib.contextmanager
def metered(meter: TrafficMeter | None, phase: str, algorithm: str) -> Iterator[None]:
    """Label what is sent inside with a phase and an algorithm (outer labels win)."""
    if meter is None:
        yield
        return
    with meter.phase(phase), meter.algorithm(algorithm):
        yield


def algbw(size_bytes: int, seconds: float) -> float:
    """Algorithm bandwidth in bytes/s: the buffer size over the time the collective took."""
    return size_bytes / seconds if seconds > 0 else float("inf")


def busbw(collective: str, size_bytes: int, seconds: float, world_size: int) -> float:
    """Bus bandwidth in bytes/s (NCCL-tests): algbw × 2(N−1)/N for all-reduce, × (N−1)/N for
    reduce-scatter, all-gather and all-to-all, × 1 for broadcast."""
    if collective not in _BUS_FACTORS:
        raise ValueError(f"unknown collective {collective!r}; expected one of {sorted(_BUS_FACTORS)}")
    return algbw(size_bytes, seconds) * _BUS_FACTORS[collective](world_size)


def _as_rows(links: dict[LinkKey, list[float]]) -> list[dict]:
    return [{"src": src, "dst": dst, "phase": phase, "group": group, "algorithm": algorithm,
             "bytes": int(b), "seconds": s}
            for (src, dst, phase, group, algorithm), (b, s) in sorted(links.items())]
