"""The memory ledger: live byte counts of the arrays a rank actually holds, by category.

Whoever allocates or drops a long-lived array tells the ledger (`add`/`sub`, or `hold` for a
fixed holding); activations are counted by the tape observer, which sees exactly the arrays each
op keeps for backward (an array kept by several nodes, or through several views, counts once, at
the size of the memory block it lives in). The ledger keeps the current bytes per category and,
per phase of a step (forward, backward, optimizer): the categories at the moment the total
peaked, each category's own maximum, and the categories when the phase last ended.

Ranks are threads in one process on the `threads` backend, so the "current" ledger is
thread-local (`current()`); code running on a helper thread (a rank's communication thread)
should capture `current()` while it is set up on the rank's thread and report to that ledger.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

import numpy as np

from engine.events import MemorySnapshot

CATEGORIES = ("parameters", "gradients", "master", "adam_m", "adam_v", "activations", "comm_buffers",
              "temporaries")
MODEL_STATES = ("parameters", "gradients", "master", "adam_m", "adam_v")
PHASES = ("forward", "backward", "optimizer")


def peak_phase(by_phase: dict[str, dict[str, int]]) -> str | None:
    """The phase a step's highest total belongs to: of the phases with the highest total, the last in step
    order (PHASES). The one definition the estimator, `memory --measure` and the workbench's memory pane use.

    A tie is the usual case, not a corner: a phase starts holding everything the previous one ended with
    (backward starts with every activation forward kept and the loss's logits), so forward's top total is
    also backward's first, in both the ledger and the estimator. What the ops hold then is more than that:
    backward's first op already allocates its gradients (dlogits, the size of the logits), which neither
    the categories nor the estimate count (tracemalloc puts backward 5-25% above the ledger, docs/memory.md).
    So the top is really reached in the later phase. Taking a tie by dict order (the estimator: forward) or
    by sorted key (the pane: backward) had the two name different phases for the same moment."""
    phases = [p for p in PHASES if p in by_phase] + sorted(p for p in by_phase if p not in PHASES)
    if not phases:
        return None
    top = max(sum(by_phase[p].values()) for p in phases)
    return [p for p in phases if sum(by_phase[p].values()) == top][-1]


class Ledger:
    """Bytes held per category now, and peaks per phase. Thread-safe (the comm thread reports too).

    `on_phase(old, new)`, if set, is called on every phase change (tests use it to take a
    tracemalloc reading at the same boundaries).
    """

    def __init__(self):
        self._lock = threading.Lock()
        self.current = dict.fromkeys(CATEGORIES, 0)
        self.phase = "idle"
        self.step = 0
        self.on_phase = None
        self.phase_peaks: dict[str, dict[str, int]] = {}  # phase -> categories when the total peaked
        self.phase_max: dict[str, dict[str, int]] = {}  # phase -> each category's own maximum
        self.phase_end: dict[str, dict[str, int]] = {}  # phase -> categories when it last ended
        self._saved: dict[int, tuple[int, ...]] = {}  # tape node id -> ids of memory blocks counted for it
        self._array_refs: dict[int, list] = {}  # memory block id -> [nbytes, number of nodes keeping it]

    # ------------------------------------------------------------------ counting

    def add(self, category: str, nbytes: int) -> None:
        with self._lock:
            self.current[category] += int(nbytes)
            self._update_peak(category)

    def sub(self, category: str, nbytes: int) -> None:
        with self._lock:
            self.current[category] -= int(nbytes)

    def hold(self, category: str, nbytes: int) -> None:
        """Set a category to a fixed size (model states that exist for the whole run)."""
        with self._lock:
            self.current[category] = int(nbytes)
            self._update_peak(category)

    @contextmanager
    def transient(self, category: str, nbytes: int):
        """Count nbytes in a category for the duration of a block (an array that lives only that long)."""
        self.add(category, nbytes)
        try:
            yield
        finally:
            self.sub(category, nbytes)

    def total(self) -> int:
        return sum(self.current.values())

    def _update_peak(self, category: str | None = None) -> None:
        """Called with the lock held after anything grew (category None: all may have)."""
        peak = self.phase_peaks.get(self.phase)
        if peak is None or sum(self.current.values()) > sum(peak.values()):
            self.phase_peaks[self.phase] = dict(self.current)
        top = self.phase_max.setdefault(self.phase, dict(self.current))
        for c in CATEGORIES if category is None else (category,):
            if self.current[c] > top[c]:
                top[c] = self.current[c]

    # ------------------------------------------------------------------ tape observer

    def on_save(self, node_id: int, arrays) -> None:
        """A node keeps these arrays for backward. Each counts at the size of the memory block it is a
        view of (that whole block stays alive), once however many nodes or views keep it."""
        added, ids = 0, []
        with self._lock:
            for a in arrays:
                if not isinstance(a, np.ndarray):
                    continue
                block = memory_block(a)
                ref = self._array_refs.get(id(block))
                if ref is None:
                    self._array_refs[id(block)] = [block.nbytes, 1]
                    added += block.nbytes
                else:
                    ref[1] += 1
                ids.append(id(block))
            self._saved[node_id] = tuple(ids)
            self.current["activations"] += added
            self._update_peak("activations")

    def on_free(self, node_id: int) -> None:
        freed = 0
        with self._lock:
            for key in self._saved.pop(node_id, ()):
                ref = self._array_refs[key]
                ref[1] -= 1
                if ref[1] == 0:
                    freed += ref[0]
                    del self._array_refs[key]
            self.current["activations"] -= freed

    # ------------------------------------------------------------------ phases

    def begin_step(self, step: int) -> None:
        """Forget the previous step's phase figures."""
        with self._lock:
            self.step = step
            self.phase_peaks, self.phase_max, self.phase_end = {}, {}, {}

    @contextmanager
    def in_phase(self, name: str):
        """Attribute what happens inside to phase `name`; phases may repeat (one per micro-batch)."""
        previous = self._switch(name)
        try:
            yield
        finally:
            with self._lock:
                self.phase_end[name] = dict(self.current)
            self._switch(previous)

    def _switch(self, name: str) -> str:
        with self._lock:
            old, self.phase = self.phase, name
            self._update_peak()
        if self.on_phase is not None:
            self.on_phase(old, name)
        return old

    def peaks(self) -> dict[str, dict[str, int]]:
        """Per phase of this step: the categories at the moment the total peaked."""
        with self._lock:
            return {phase: dict(p) for phase, p in self.phase_peaks.items()}

    def maxima(self) -> dict[str, dict[str, int]]:
        """Per phase of this step: each category's own maximum."""
        with self._lock:
            return {phase: dict(p) for phase, p in self.phase_max.items()}

    def snapshots(self, step: int, rank: int) -> list:
        """One MemorySnapshot event per phase seen this step: what was measured only (the estimate they are
        held against is the run's, made once by the launcher: RunStarted.memory_estimate)."""
        with self._lock:
            return [MemorySnapshot(step=step, rank=rank, phase=phase,
                                   current=dict(self.phase_end.get(phase, {})),
                                   peak=dict(self.phase_peaks[phase]))
                    for phase in PHASES if phase in self.phase_peaks]


def memory_block(a: np.ndarray) -> np.ndarray:
    """The array owning the memory `a` is a view of (or `a` itself)."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


_local = threading.local()


def current() -> Ledger | None:
    """This thread's ledger (the rank's), or None outside a rank."""
    return getattr(_local, "ledger", None)


def set_current(ledger: Ledger | None) -> None:
    _local.ledger = ledger


def rank_ledger() -> Ledger | NullLedger:
    """The calling thread's ledger, or one that ignores everything. Replicas capture it at
    construction, because their communication thread reports to it too."""
    return current() or NullLedger()


class NullLedger:
    """A ledger that counts nothing (code run outside a rank: tests, tools)."""

    def add(self, category: str, nbytes: int) -> None:
        pass

    sub = hold = add

    @contextmanager
    def transient(self, category: str, nbytes: int):
        yield

    @contextmanager
    def in_phase(self, name: str):
        yield
