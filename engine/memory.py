"""The memory ledger: live byte counts of the arrays a rank actually holds, by category.

Whoever allocates or drops a long-lived array tells the ledger (`add`/`sub`, or `hold` for a
fixed holding); activations are counted by the tape observer, which sees exactly the arrays each
op keeps for backward. The ledger keeps the current bytes per category and, per phase of a step
(forward, backward, optimizer), the peak of the total and the categories at that peak.

Ranks are threads in one process on the `threads` backend, so the "current" ledger is
thread-local (`current()`); communication code reports its buffers to whatever ledger is current.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

CATEGORIES = ("parameters", "gradients", "master", "adam_m", "adam_v", "activations", "comm_buffers",
              "temporaries")


class Ledger:
    """Bytes held per category now, and the peak per phase. Thread-safe (the comm thread reports too)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.current = dict.fromkeys(CATEGORIES, 0)
        self.phase = "idle"
        self.step = 0
        self.phase_peaks: dict[str, dict[str, int]] = {}
        self._saved: dict[int, tuple[int, ...]] = {}  # tape node id -> ids of arrays counted for it
        self._array_refs: dict[int, list] = {}  # array id -> [nbytes, refcount]

    # ------------------------------------------------------------------ counting

    def add(self, category: str, nbytes: int) -> None:
        with self._lock:
            self.current[category] += int(nbytes)
            self._update_peak()

    def sub(self, category: str, nbytes: int) -> None:
        with self._lock:
            self.current[category] -= int(nbytes)

    def hold(self, category: str, nbytes: int) -> None:
        """Set a category to a fixed size (model states that exist for the whole run)."""
        with self._lock:
            self.current[category] = int(nbytes)
            self._update_peak()

    def total(self) -> int:
        return sum(self.current.values())

    def _update_peak(self) -> None:
        peak = self.phase_peaks.get(self.phase)
        if peak is None or sum(self.current.values()) > sum(peak.values()):
            self.phase_peaks[self.phase] = dict(self.current)

    # ------------------------------------------------------------------ tape observer

    def on_save(self, node_id: int, arrays) -> None:
        """A node keeps these arrays for backward. An array kept by several nodes counts once."""
        added, ids = 0, []
        with self._lock:
            for a in arrays:
                if a is None or not hasattr(a, "nbytes"):
                    continue
                base = a.base if a.base is not None else a
                ref = self._array_refs.get(id(base))
                if ref is None:
                    self._array_refs[id(base)] = [base.nbytes, 1]
                    added += base.nbytes
                else:
                    ref[1] += 1
                ids.append(id(base))
            self._saved[node_id] = tuple(ids)
            self.current["activations"] += added
            self._update_peak()

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
        with self._lock:
            self.step = step
            self.phase_peaks = {}

    @contextmanager
    def in_phase(self, name: str):
        with self._lock:
            previous, self.phase = self.phase, name
            self._update_peak()
        try:
            yield
        finally:
            with self._lock:
                self.phase = previous

    def peaks(self) -> dict[str, dict[str, int]]:
        """Per phase of this step: the categories at the moment the total peaked."""
        with self._lock:
            return {phase: dict(p) for phase, p in self.phase_peaks.items()}


_local = threading.local()


def current() -> Ledger | None:
    """This thread's ledger (the rank's), or None outside a rank."""
    return getattr(_local, "ledger", None)


def set_current(ledger: Ledger | None) -> None:
    _local.ledger = ledger
