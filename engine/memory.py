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

CATEGORIES = ("parameters", "gradients", "master", "adam_m", "adam_v", "activations", "comm_buffers",
              "temporaries")
MODEL_STATES = ("parameters", "gradients", "master", "adam_m", "adam_v")
PHASES = ("forward", "backward", "optimizer")


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

    def snapshots(self, step: int, rank: int, estimate: dict | None = None) -> list:
        """One MemorySnapshot event per phase seen this step (estimate: phase -> categories)."""
        from engine.events import MemorySnapshot
        with self._lock:
            return [MemorySnapshot(step=step, rank=rank, phase=phase,
                                   current=dict(self.phase_end.get(phase, {})),
                                   peak=dict(self.phase_peaks[phase]),
                                   estimate=None if estimate is None else dict(estimate[phase]))
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


# ---------------------------------------------------------------------- measuring a run

EXTRA_ATTEMPTS = 40  # skipped steps a measurement tolerates (fp16 overflows while the loss scale settles)


def measure_rank(comm, emit, cfg_dict: dict, steps: int, trace: bool = False) -> dict:
    """Rank function (any backend): train until `steps` steps have updated the parameters and report
    what this rank's ledger saw. A step skipped on fp16 overflow never runs the update (nor holds its
    temporaries), so it does not count; after `steps` + EXTRA_ATTEMPTS attempts the measurement stops
    with whatever updated (`steps` in the result: the steps that updated, `skipped`: those that did not).

    Returns the categories at rest (after set-up), and per phase the categories when the total
    peaked in any step (`peaks`) and each category's own maximum (`maxima`). With `trace` (one rank
    per process: tracemalloc is process-wide) tracemalloc runs from before the model is built and
    `traced` gives its peak per phase minus `baseline`, what it sees at rest beyond the ledger (the
    data set, Python objects): the cross-check of the ledger on a real process.
    """
    import tracemalloc

    from engine.config import from_dict
    from engine.trainer import Trainer

    cfg = from_dict(cfg_dict, source="<memory measure>")
    if trace:
        tracemalloc.start()
    trainer = Trainer(cfg, comm)
    ledger = trainer.ledger
    at_rest = dict(ledger.current)
    traced: dict[str, int] = {}
    baseline = 0
    if trace:
        baseline = tracemalloc.get_traced_memory()[0] - sum(at_rest.values())

        def on_phase(old: str, new: str) -> None:
            if old in PHASES:
                traced[old] = max(traced.get(old, 0), tracemalloc.get_traced_memory()[1] - baseline)
            tracemalloc.reset_peak()
        ledger.on_phase = on_phase
        tracemalloc.reset_peak()
    peaks: dict[str, dict[str, int]] = {}
    maxima: dict[str, dict[str, int]] = {}
    updated = skipped = 0
    try:
        while updated < steps and updated + skipped < steps + EXTRA_ATTEMPTS:
            if trainer.train_step()["skipped"]:
                skipped += 1
            else:
                updated += 1
            for phase, p in ledger.peaks().items():
                if phase in PHASES and sum(p.values()) > sum(peaks.get(phase, {}).values()):
                    peaks[phase] = p
            for phase, m in ledger.maxima().items():
                if phase in PHASES:
                    old = maxima.setdefault(phase, dict(m))
                    for c in CATEGORIES:
                        old[c] = max(old[c], m[c])
    finally:
        ledger.on_phase = None
        if trace:
            tracemalloc.stop()
        trainer.replica.close()
    return {"rank": comm.rank, "steps": updated, "skipped": skipped, "at_rest": at_rest, "peaks": peaks,
            "maxima": maxima, "traced": traced or None, "baseline": baseline if trace else None}


def measure(cfg, steps: int = 2, backend: str = "threads") -> dict:
    """Train `cfg` on every rank until `steps` steps have updated (measure_rank) and summarise what the
    ledgers saw, per rank taking the largest: `at_rest` (model states after set-up), `category_peaks`
    (each category's own maximum over the step), `peak_total` and `peak_phase` (the highest
    simultaneous total); `steps` and `skipped` count the steps that updated and that overflowed (every
    rank skips the same steps)."""
    from engine.comm.launch import run_ranks
    from engine.config import replace, to_dict
    cfg = replace(cfg, "parallel.backend", backend)
    results = run_ranks(cfg.parallel.world_size, backend, measure_rank, args=(to_dict(cfg), steps),
                        timeout_s=cfg.parallel.timeout_s)
    at_rest = {c: max(r["at_rest"][c] for r in results) for c in CATEGORIES}
    peaks = {c: max(m[c] for r in results for m in r["maxima"].values()) for c in CATEGORIES}
    phase, total = max(((p, sum(cats.values())) for r in results for p, cats in r["peaks"].items()),
                       key=lambda item: item[1])
    return {"at_rest": at_rest, "category_peaks": peaks, "peak_total": total, "peak_phase": phase,
            "steps": results[0]["steps"], "skipped": results[0]["skipped"], "ranks": results}
