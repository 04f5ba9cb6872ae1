"""A training job: launch the ranks, relay their events to subscribers, record the run.

This is what the headless runner and the workbench both call (on whatever thread they like).
What is the run's rather than a rank's is done here, once, before any rank starts: the config is checked
against its data, and the memory estimate is made (it reaches the readers on RunStarted).
The ranks send events as JSON dicts; here they become typed events again and go to every
subscriber of the job's bus: the run recorder, the progress printer, the TUI bridge.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from engine import events as ev
from engine.checkpoint.resume import prepare_resume
from engine.checkpoint.sharded import CHECKPOINTS
from engine.comm.base import RankFailure
from engine.comm.launch import process_rank, run_ranks
from engine.config import Config, network_emulation, to_dict
from engine.config.build import build_dataset, vocab_size
from engine.data import DATA_KINDS
from engine.memory.estimator import estimate
from engine.memory.pipeline import estimate_ranks
from engine.parallel.mesh import Mesh
from engine.run import error_log, lineage
from engine.run.recorder import RecordingError, RunRecorder
from engine.run.summary import new_summary, summarize
from engine.sinks.runner import SinkSet
from engine.trainer import train_rank


def run_training(cfg: Config, on_event=None, stop_event: threading.Event | None = None,
                 record: bool = True, preset_doc=None, resume_from: str | Path | None = None,
                 pause_event: threading.Event | None = None) -> dict:
    """Train `cfg` on its backend and world size; returns the run summary. Raises on failure
    (after emitting RunFailed), so callers can map the error to an exit code or a message.
    A recorded run checkpoints into its folder, also when it is stopped (at the step reached);
    `resume_from` (a checkpoint folder) starts from one. While `pause_event` is set the ranks hold
    after their step (engine.run.control.RunControl carries both events). A config its data cannot
    train is a ConfigError or DataError (one line) before any rank starts or any run folder is made."""
    bus = ev.EventBus()
    recorder = None
    stop_event = stop_event or threading.Event()
    # With tcp/mpi each process runs one rank; only rank 0's process records the run.
    lead = process_rank(cfg.parallel.backend) in (None, 0)
    memory_estimate, per_rank = _before_ranks(cfg, lead)
    if record and lead:
        resolved = preset_doc if preset_doc is not None else to_dict(cfg)
        # a folder that stops taking writes stops the run (checkpointing if the disk still allows)
        recorder = RunRecorder(cfg.run.out_dir, cfg.name, resolved, on_failure=lambda _: stop_event.set())
        bus.subscribe(recorder)
    if on_event is not None:
        bus.subscribe(on_event)
    # the figures the ranks' results do not hold (peak memory per rank, overflows), folded as the recorder
    # folds them, so the summary every caller prints has them, recorded or not
    figures = new_summary("", cfg.name)
    bus.subscribe(lambda event: summarize(figures, event))
    # Telemetry sinks (TensorBoard, W&B, MLflow) write beside the run folder, so only a recorded run has them.
    sinks = SinkSet(cfg.log.to, recorder.run_dir, cfg.log, bus.emit) if recorder and cfg.log.to else None
    if sinks:
        bus.subscribe(sinks)
    run_id = recorder.run_id if recorder else uuid.uuid4().hex[:8]
    checkpoint_dir = str(recorder.run_dir / CHECKPOINTS) if recorder else ""
    t0 = time.perf_counter()
    bus.emit(ev.Phase("starting ranks"))
    try:
        results = run_ranks(cfg.parallel.world_size, cfg.parallel.backend, train_rank,
                            args=(to_dict(cfg), run_id, checkpoint_dir, str(resume_from or "")),
                            on_event=_relay(bus, memory_estimate, lineage.parent_of(resume_from)
                                            if resume_from else None, per_rank),
                            timeout_s=cfg.parallel.timeout_s, stop_event=stop_event,
                            pause_event=pause_event, network=network_emulation(cfg),
                            threads_per_rank=cfg.parallel.threads_per_rank)
    except BaseException as e:
        message = _failure_message(e, recorder)
        cause_first = recorder is not None and recorder.failure is not None  # the folder, not a rank
        bus.emit(ev.RunFailed(message=message, rank=None if cause_first else getattr(e, "rank", None)))
        if sinks:
            sinks.close()
        if recorder:
            recorder.close()
        if recorder and recorder.failure:
            raise RecordingError(message) from e
        raise
    if recorder and recorder.check_folder():  # also a folder removed after the last event
        message = _recording_stopped(recorder)
        bus.emit(ev.RunFailed(message=message))
        if sinks:
            sinks.close()
        recorder.close()
        raise RecordingError(message)
    mine = [r for r in results if r is not None]  # tcp/mpi: only this process's rank (or all, on rank 0)
    if not mine:
        message = "every rank stopped before finishing its first evaluation"
        bus.emit(ev.RunFailed(message=message))
        if sinks:
            sinks.close()
        if recorder:
            recorder.close()  # the run folder is closed and recorded as failed, like any failed run
        raise RuntimeError(message)
    summary = dict(mine[0])
    summary["wall_s"] = time.perf_counter() - t0
    summary["stopped"] = summary["steps"] < cfg.train.steps
    summary["total_steps"] = cfg.train.steps
    summary["lead"] = lead
    summary.update({key: figures[key] for key in ("peak_memory", "overflows", "skipped_steps",
                                                  "loss_scale_changes", "parent", "resumed_at", "layout")})
    if figures["parent"] is not None:  # a resumed run's improvement is the lineage's, from its first eval
        summary["initial_val_loss"] = figures["initial_val_loss"]
    finished = ev.RunFinished(steps=summary["steps"], initial_val_loss=summary["initial_val_loss"],
                              final_val_loss=summary["final_val_loss"],
                              tokens_per_s=summary["tokens_per_s"], wall_s=summary["wall_s"],
                              run_dir=str(recorder.run_dir) if recorder else "", stopped=summary["stopped"])
    bus.emit(finished)
    if sinks:
        sinks.close()  # before the recorder: a sink's last failure still reaches the run's log
    if recorder:
        recorder.close()
        summary["run_dir"] = str(recorder.run_dir)
    return summary


def _before_ranks(cfg: Config, lead: bool) -> tuple[dict | None, list | None]:
    """What is done once per run before any rank starts: check the config against its data (build_dataset:
    ConfigError or DataError, one line) and, in the process that reports the run, make the memory estimate
    (phase -> category -> bytes per rank) that its RunStarted carries; under pipeline parallelism also each
    rank's own (its stages', per global rank), else None. Every process of a tcp or mpi launch checks, as
    each builds its own rank's data; only rank 0's reports, so only it estimates."""
    # Only token streams are checked against the config (the context, the vocabulary); a classifier's
    # samples are not built here, where nothing would read them. Dropped on return: the ranks build their
    # own (the corpora and synthetic streams are cached per process, so thread ranks reuse this one).
    dataset = build_dataset(cfg) if DATA_KINDS.get(cfg.data.kind) == "lm" else None
    if not lead:
        return None, None
    vocab = vocab_size(cfg, dataset) if cfg.model.kind == "gpt" else None
    if cfg.parallel.pipeline == 1:
        return estimate(cfg, vocab).phases(), None
    per_stage, mesh = estimate_ranks(cfg, vocab), Mesh.of(cfg.parallel)
    heaviest = max(per_stage, key=lambda e: sum(e.peak()[1].values()))  # what estimate(cfg) gives
    return heaviest.phases(), [per_stage[mesh.coords(r).pp].phases() for r in range(cfg.parallel.world_size)]


def _relay(bus: ev.EventBus, memory_estimate: dict | None, parent: Path | None = None,
           per_rank: list | None = None) -> Callable[[dict], None]:
    """The ranks' events (JSON dicts) onto the bus as typed events. Rank 0's RunStarted gains the run's
    memory estimate (and under pipeline parallelism each rank's), so every reader (recorder, workbench,
    sinks) gets it once, not in each memory event; a run resumed from `parent` (a run folder) is followed
    by its History (engine.run.lineage)."""
    def relay(d: dict) -> None:
        event = ev.from_json(d)
        if isinstance(event, ev.RunStarted) and memory_estimate is not None:
            event = dataclasses.replace(event, memory_estimate=memory_estimate,
                                        memory_estimate_per_rank=per_rank)
        bus.emit(event)
        if isinstance(event, ev.RunStarted) and parent is not None:
            bus.emit(lineage.history(parent, event.first_step))
    return relay


def resume_training(run_dir: str | Path, overrides=(), step: int | None = None, on_event=None,
                    stop_event: threading.Event | None = None) -> dict:
    """Continue a recorded run from its newest finished checkpoint (or the one of `step`) in a new run
    folder beside it; `overrides` ("a.b=v") may change e.g. the world size or ZeRO stage. The checkpoint
    is verified (checksums, model layout) before any rank starts."""
    cfg, doc, ckpt = prepare_resume(run_dir, overrides, step)
    return run_training(cfg, on_event=on_event, stop_event=stop_event, preset_doc=doc, resume_from=ckpt.path)


def _failure_message(e: BaseException, recorder: RunRecorder | None) -> str:
    """The one line a failed run ends with: what failed, where its traceback is, and — when the run folder
    stopped taking writes first — that, which is the cause."""
    message = one_line(e)
    if recorder is None:
        return message
    if recorder.failure:
        return f"{_recording_stopped(recorder)}; then stopping failed too: {message}"
    log = recorder.run_dir / error_log.ERROR_LOG
    if not isinstance(e, RankFailure) and not isinstance(e, KeyboardInterrupt):
        log = error_log.write(recorder.run_dir, "the launcher failed", e) or log
    return f"{message} (traceback in {log})" if log.exists() else message


def _recording_stopped(recorder: RunRecorder) -> str:
    saved = recorder.last_checkpoint
    kept = (f"checkpoint of step {saved} saved; `nanodist-tui resume {recorder.run_dir}` continues it"
            if saved is not None else "no checkpoint saved")
    if recorder.vanished:  # its checkpoints went with it, and none can be saved where there is no folder
        kept = "no checkpoint is left to resume from; run it again"
    return (f"recording stopped at step {recorder.summary['steps']}: {recorder.failure}, so the run was "
            f"stopped; {kept}")


def one_line(e: BaseException) -> str:
    """An error as the one line a RunFailed event (and a failed trial) carries."""
    if isinstance(e, RankFailure):  # the event names the rank; the message says what happened to it
        return e.cause
    if isinstance(e, KeyboardInterrupt):
        return "interrupted (Ctrl-C)"
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[-1] if text else ''}".rstrip(": ")
