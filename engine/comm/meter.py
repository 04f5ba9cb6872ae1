"""Per-rank traffic meter: payload bytes and seconds per (src, dst, phase), per step.

Every communicator reports each send to its meter; collectives name the phase
("reduce-scatter", "all-gather", "broadcast", "barrier"; anything else sent is "p2p").
Bandwidth helpers follow the NCCL-tests definitions (its PERFORMANCE.md): algbw = S / t and
busbw = algbw × a factor that makes the figure comparable to the link bandwidth.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

DEFAULT_PHASE = "p2p"

# busbw = algbw × factor(N); NCCL-tests PERFORMANCE.md.
_BUS_FACTORS = {
    "all-reduce": lambda n: 2 * (n - 1) / n,
    "reduce-scatter": lambda n: (n - 1) / n,
    "all-gather": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
}


class TrafficMeter:
    """Thread-safe: the communication thread records while the trainer thread snapshots."""

    def __init__(self, rank: int):
        self.rank = rank
        self.step: int | None = None
        self._lock = threading.Lock()
        self._phases = threading.local()  # the phase belongs to the thread that runs the collective
        self._step_links: dict[tuple[int, int, str], list[float]] = {}
        self._total_links: dict[tuple[int, int, str], list[float]] = {}

    def begin_step(self, step: int) -> None:
        """Start counting a new step; snapshot() reports only what is sent from here on."""
        with self._lock:
            self.step = step
            self._step_links = {}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        stack = self._stack()
        stack.append(name)
        try:
            yield
        finally:
            stack.pop()

    @property
    def current_phase(self) -> str:
        stack = self._stack()
        return stack[-1] if stack else DEFAULT_PHASE

    def record(self, phase: str, src: int, dst: int, nbytes: int, seconds: float) -> None:
        key = (src, dst, phase)
        with self._lock:
            for links in (self._step_links, self._total_links):
                entry = links.setdefault(key, [0, 0.0])
                entry[0] += nbytes
                entry[1] += seconds

    def snapshot(self) -> list[dict]:
        """This step's links: [{src, dst, phase, bytes, seconds}] (the Traffic event's ``links``)."""
        with self._lock:
            return _as_rows(self._step_links)

    def totals(self) -> list[dict]:
        """Like snapshot(), summed over the meter's whole life."""
        with self._lock:
            return _as_rows(self._total_links)

    def bytes_sent(self, phase: str | None = None) -> int:
        """Payload bytes sent this step, in one phase or all of them."""
        return sum(row["bytes"] for row in self.snapshot() if phase in (None, row["phase"]))

    def _stack(self) -> list[str]:
        if not hasattr(self._phases, "stack"):
            self._phases.stack = []
        return self._phases.stack


def metered_phase(meter: TrafficMeter | None, name: str):
    """``meter.phase(name)`` — unless there is no meter, or the caller already named the phase: a
    caller's label says more than the collective's (ZeRO-3 calls its all-gathers "param-gather")."""
    if meter is None or meter._stack():
        return contextlib.nullcontext()
    return meter.phase(name)


def algbw(size_bytes: int, seconds: float) -> float:
    """Algorithm bandwidth in bytes/s: the buffer size over the time the collective took."""
    return size_bytes / seconds if seconds > 0 else float("inf")


def busbw(collective: str, size_bytes: int, seconds: float, world_size: int) -> float:
    """Bus bandwidth in bytes/s (NCCL-tests): algbw × 2(N−1)/N for all-reduce, × (N−1)/N for
    reduce-scatter and all-gather, × 1 for broadcast."""
    if collective not in _BUS_FACTORS:
        raise ValueError(f"unknown collective {collective!r}; expected one of {sorted(_BUS_FACTORS)}")
    return algbw(size_bytes, seconds) * _BUS_FACTORS[collective](world_size)


def _as_rows(links: dict[tuple[int, int, str], list[float]]) -> list[dict]:
    return [{"src": src, "dst": dst, "phase": phase, "bytes": int(b), "seconds": s}
            for (src, dst, phase), (b, s) in sorted(links.items())]
