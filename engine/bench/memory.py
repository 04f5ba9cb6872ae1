"""Measuring a run's memory: train a few real steps on every rank and report what the ledgers saw
(`nanodist-tui memory --measure`, and the tests that hold the estimator to the ledger)."""

from __future__ import annotations

import dataclasses
import tracemalloc

from engine import optim
from engine.comm.launch import EMULATING_BACKENDS, run_ranks
from engine.config import EmulateConfig, from_dict, replace, to_dict
from engine.fast import flash, kernels
from engine.memory.ledger import CATEGORIES, PHASES, peak_phase
from engine.trainer import Trainer

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
    data set, Python objects): the cross-check of the ledger on a real process. The compiled loops are
    loaded before tracing starts, as modules are imported before it.
    """
    cfg = from_dict(cfg_dict, source="<memory measure>")
    if trace:
        kernels.warm_up()  # numba's code and its caches are the interpreter's, not the run's memory
        flash.warm_up()
        optim.warm_up()
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
    if backend not in EMULATING_BACKENDS:  # memory does not depend on the network, emulated or not
        cfg = dataclasses.replace(cfg, emulate=EmulateConfig())
    cfg = replace(cfg, "parallel.backend", backend)
    results = run_ranks(cfg.parallel.world_size, backend, measure_rank, args=(to_dict(cfg), steps),
                        timeout_s=cfg.parallel.timeout_s, threads_per_rank=cfg.parallel.threads_per_rank)
    at_rest = {c: max(r["at_rest"][c] for r in results) for c in CATEGORIES}
    peaks = {c: max(m[c] for r in results for m in r["maxima"].values()) for c in CATEGORIES}
    # the highest total of any rank, and the phase it was first reached in (ledger.peak_phase)
    by_phase: dict[str, dict[str, int]] = {}
    for r in results:
        for p, cats in r["peaks"].items():
            if p not in by_phase or sum(cats.values()) > sum(by_phase[p].values()):
                by_phase[p] = cats
    phase = peak_phase(by_phase)
    total = sum(by_phase[phase].values()) if phase is not None else 0
    return {"at_rest": at_rest, "category_peaks": peaks, "peak_total": total, "peak_phase": phase,
            "steps": results[0]["steps"], "skipped": results[0]["skipped"], "ranks": results}
