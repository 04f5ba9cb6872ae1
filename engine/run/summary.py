"""summary.json: what a run's summary holds, field by field, and how each event folds into it.

The recorder keeps one live (engine.run.recorder), writes it atomically as the run goes, and rebuilds one
from events.jsonl for a run killed before it could (`summarize` over its events). A summary.json is a file
anyone may edit or damage, so readers check one with `summary_problem` before formatting its figures.
"""

from __future__ import annotations

import re
from typing import Any

from engine import config
from engine import events as ev_types
from engine.parallel.mesh import AXES, Mesh
from engine.run import throughput

# RunFailed messages that mean someone stopped the run rather than a fault: Ctrl-C (engine.run.job writes
# "interrupted (Ctrl-C)"; a bare KeyboardInterrupt from other callers), or a rank process ended by
# SIGINT/SIGTERM/SIGHUP. SIGKILL stays a failure: it is also the OOM killer's signal.
_INTERRUPTION = re.compile(r"^(?:interrupted|KeyboardInterrupt)\b|\bby signal SIG(?:INT|TERM|HUP)\b")

def is_interruption(message: str) -> bool:
    """Whether a RunFailed message means the run was interrupted (Ctrl-C or a stop signal), not broken."""
    return bool(_INTERRUPTION.search(message))


def new_summary(run_id: str, preset: str | None) -> dict[str, Any]:
    """summary.json before any event: status "running", no figures yet."""
    return {
        "run_id": run_id, "preset": preset, "status": "running", "started_at": None, "ended_at": None,
        "steps": 0, "total_steps": None, "n_params": None, "world_size": None, "threads_per_rank": None,
        "last_loss": None,
        "initial_val_loss": None, "final_val_loss": None, "best_val_loss": None,
        "tokens": 0,  # tokens (or samples) processed in this run: the sum over its StepEnd events
        "train_s": 0.0,  # seconds spent in those steps: the sum of their step_time_s
        "tokens_per_s": None,  # engine.run.throughput: tokens / train_s, the one definition of tokens/s
        "wall_s": None, "skipped_steps": 0, "loss_scale_changes": 0,
        "overflows": 0,  # fp16 loss-scale overflows: every LossScaleChange but growth (inf, nan, hysteresis)
        "peak_memory": {},  # rank (a string, as JSON keys are) -> its highest measured total bytes
        # rank (a string) -> {group: bytes} that rank sent in the last step it reported traffic for: the
        # process groups' names the meter books under ("world", "tp0", "dp1", ...)
        "traffic_per_step": {},
        # a resumed run (engine.run.lineage): the run folder it continues and the step it resumed from; its
        # initial_val_loss and best_val_loss are then the lineage's, from the first run's first evaluation
        "parent": None, "resumed_at": None,
        "error": None,
        "failed_rank": None, "network": None,  # network: "emulated network: ..." when it was emulated
        # the device mesh (layout_of): {"degrees": {"tp": 2, "cp": 1, "ep": 1, "dp": 2, "pp": 1},
        # "order": "tp-cp-ep-dp-pp", "sequence_parallel": false}; dp is what remains of the world
        "layout": None}


# What each summary.json field holds (null: not known yet). A summary.json is a file anyone may edit or
# damage, so `list_runs` checks one against this before any reader formats its figures.
_WHOLE, _NUMBER, _TEXT, _OBJECT = "a whole number", "a number", "text", "an object"
SUMMARY_TYPES = {
    **dict.fromkeys(("run_id", "preset", "status", "started_at", "ended_at", "parent", "error",
                     "network"), _TEXT),
    **dict.fromkeys(("steps", "total_steps", "n_params", "world_size", "threads_per_rank", "tokens",
                     "skipped_steps", "loss_scale_changes", "overflows", "resumed_at", "failed_rank"),
                    _WHOLE),
    **dict.fromkeys(("last_loss", "initial_val_loss", "final_val_loss", "best_val_loss", "train_s",
                     "tokens_per_s", "wall_s"), _NUMBER),
    "peak_memory": _OBJECT, "traffic_per_step": _OBJECT, "layout": _OBJECT}
_PYTHON_TYPES: dict[str, type | tuple[type, ...]] = {_WHOLE: int, _NUMBER: (int, float), _TEXT: str,
                                                     _OBJECT: dict}


def summary_problem(summary: Any) -> str | None:
    """What is wrong with a summary.json's content (its first wrong field), or None when it reads."""
    if not isinstance(summary, dict):
        return f"{_json_kind(summary)}, not an object"
    if summary.get("status") is None:
        return "status is missing"
    for key, kind in SUMMARY_TYPES.items():
        value = summary.get(key)
        if value is None or _holds(value, kind):
            continue
        if kind == _WHOLE and _holds(value, _NUMBER):
            return f"{key} is not a whole number"
        return f"{key} is not {'a number' if kind == _WHOLE else kind} ({_json_kind(value)})"
    return None


def _holds(value: Any, kind: str) -> bool:
    if isinstance(value, bool):  # JSON's true/false are no numbers, though Python's bool is an int
        return False
    return isinstance(value, _PYTHON_TYPES[kind])


def _json_kind(value: Any) -> str:
    kinds = ((bool, "true/false"), (str, "text"), (int, "a number"), (float, "a number"), (list, "a list"),
             (dict, "an object"))
    return next((name for t, name in kinds if isinstance(value, t)), "null")


def layout_of(run_config: dict, world_size: int) -> dict[str, Any] | None:
    """A run's device mesh as its summary keeps it, from its config (defaults where a recording from before
    the mesh has no key); None for a layout that cannot be, which only a damaged recording holds."""
    parallel = run_config.get("parallel") if isinstance(run_config, dict) else None
    parallel = parallel if isinstance(parallel, dict) else {}
    defaults = config.Config().parallel

    def setting(key: str) -> Any:
        return parallel.get(key, getattr(defaults, key))
    try:
        mesh = Mesh(world_size, int(setting("tensor")), int(setting("pipeline")), int(setting("context")),
                    int(setting("expert")), str(setting("order")))
    except (TypeError, ValueError):
        return None
    return {"degrees": {axis: mesh.degree(axis) for axis in AXES}, "order": "-".join(mesh.axes),
            "sequence_parallel": bool(setting("sequence_parallel"))}


def summarize(s: dict[str, Any], ev: Any) -> None:
    """Fold one event into a summary, in place: the recorder's live figures, and a killed run's later."""
    if isinstance(ev, ev_types.RunStarted):
        s.update(n_params=ev.n_params, world_size=ev.world_size, total_steps=ev.total_steps,
                 threads_per_rank=ev.threads_per_rank or None, network=ev.network or None,
                 layout=layout_of(ev.config or {}, ev.world_size))
        s["preset"] = s["preset"] or ev.preset
    elif isinstance(ev, ev_types.StepEnd):
        s.update(steps=ev.step, last_loss=ev.loss)
        s["tokens"] += ev.tokens  # a skipped (overflowed) step still read and processed its tokens
        s["train_s"] += ev.step_time_s
        s["tokens_per_s"] = throughput.tokens_per_s(s["tokens"], s["train_s"])
        s["skipped_steps"] += bool(ev.skipped)
    elif isinstance(ev, ev_types.History):
        s.update(parent=ev.parent, resumed_at=ev.step)
        for _, val_loss in ev.evals:
            if s["initial_val_loss"] is None:
                s["initial_val_loss"] = val_loss
            s["best_val_loss"] = val_loss if s["best_val_loss"] is None else min(s["best_val_loss"], val_loss)
    elif isinstance(ev, ev_types.Eval):
        if s["initial_val_loss"] is None:
            s["initial_val_loss"] = ev.val_loss
        s["final_val_loss"] = ev.val_loss
        best = s["best_val_loss"]
        s["best_val_loss"] = ev.val_loss if best is None else min(best, ev.val_loss)
    elif isinstance(ev, ev_types.LossScaleChange):
        s["loss_scale_changes"] += 1
        s["overflows"] += ev.reason != "growth"
    elif isinstance(ev, ev_types.MemorySnapshot):
        peaks = s["peak_memory"]
        peaks[str(ev.rank)] = max(peaks.get(str(ev.rank), 0), sum(ev.peak.values()))
    elif isinstance(ev, ev_types.Traffic):
        sent: dict[str, int] = {}
        for link in ev.links:
            group = str(link.get("group") or "world")
            sent[group] = sent.get(group, 0) + int(link.get("bytes") or 0)
        s.setdefault("traffic_per_step", {})[str(ev.rank)] = sent  # a summary from before had none
    elif isinstance(ev, ev_types.RunFinished):
        s.update(status="stopped" if ev.stopped else "finished", steps=ev.steps, wall_s=ev.wall_s)
        if s["tokens_per_s"] is None:  # no steps were recorded: the trainer's figure (the same definition)
            s["tokens_per_s"] = ev.tokens_per_s
        for key in ("initial_val_loss", "final_val_loss"):
            if key == "initial_val_loss" and s.get("parent") is not None:
                continue  # the lineage's start (History) stays, whatever this run's first evaluation was
            if getattr(ev, key) is not None:
                s[key] = getattr(ev, key)
    elif isinstance(ev, ev_types.RunFailed):
        status = "interrupted" if is_interruption(ev.message) else "failed"
        s.update(status=status, error=ev.message, failed_rank=ev.rank)
