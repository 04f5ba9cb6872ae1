"""Getting a training job going from the command line: the config with its overrides, the checks made
before any rank starts, and the two ways to run the job (the workbench, or headless)."""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import typer

from engine.run import stop_signals
from engine.run.printable import printable
from nanodist_tui.cli.errors import USER_ERRORS, OutDirError, fail, internal_failure, user_errors


def shortcut_overrides(sets: list[str] | None, world_size: int | None, backend: str | None,
                       log_to: str | None = None) -> list[str]:
    """The --set overrides plus the shortcut flags as overrides that remember their flag, so an error they
    cause names `--world-size 3`, not the preset's line or a --set the user never typed."""
    from engine.config.presets import Override
    extra: list[str] = list(sets or [])
    if world_size is not None:
        extra.append(Override(f"parallel.world_size={world_size}", f"--world-size {world_size}"))
    if backend is not None:
        extra.append(Override(f'parallel.backend="{backend}"', f"--backend {backend}"))
    if log_to is not None:
        names = ", ".join(f'"{n}"' for n in sink_names(log_to, "--log-to"))
        extra.append(Override(f"log.to=[{names}]", f"--log-to {log_to}"))
    return extra


def sink_names(text: str, flag: str) -> list[str]:
    """The sinks a comma-separated flag names, checked by log.to's own rule; ConfigError naming `flag`."""
    from engine.config import ConfigError
    from engine.config.rules import RULES
    names = [n.strip() for n in text.split(",") if n.strip()]
    if problem := RULES["log.to"](tuple(names)):
        raise ConfigError("", *problem, source=flag)
    return names


def load_config(preset: str, sets=None, world_size=None, backend=None, log_to=None):
    """(Config, tomlkit document, path) with overrides applied and validated."""
    from engine.config.presets import load_preset
    return load_preset(preset, shortcut_overrides(sets, world_size, backend, log_to))


def prepare_run(preset: str, sets=None, world_size=None, backend=None, log_to=None):
    """load_config, plus the checks that need more than the config: the data is readable, the
    backend can start here, the run folder can be made. Mistakes exit 2 before any rank starts."""
    with user_errors():
        cfg, doc, path = load_config(preset, sets, world_size, backend, log_to)
        check_can_run(cfg)
    return cfg, doc, path


def check_can_run(cfg) -> None:
    """What a valid config can still get wrong on this machine: unreadable data, sizes it cannot hold, a
    backend that cannot start here, a run folder that cannot be made, a sink whose library is not
    installed, an unusable tuning file for algorithm "auto". Raises one of USER_ERRORS."""
    from engine.comm.launch import check_environment
    from engine.config import ConfigError
    from engine.config.build import build_dataset, vocab_size
    from engine.memory.capacity import check_data_fits, check_fits
    from engine.parallel.data.topology import tables
    from engine.sinks import check_available
    check_data_fits(cfg)
    try:
        dataset = build_dataset(cfg)
    except MemoryError as e:
        raise ConfigError("data", f"the dataset does not fit in memory ({e})", "use less data",
                          source="this machine") from None
    check_fits(cfg, vocab_size(cfg, dataset) if cfg.model.kind == "gpt" else None)
    check_environment(cfg.parallel.backend, cfg.parallel.world_size)
    check_out_dir(cfg.run.out_dir)
    check_available(cfg.log.to)
    if cfg.parallel.algorithm == "auto":
        tables(cfg)


def check_out_dir(out_dir: str) -> None:
    """The folder that receives run folders exists (or can be made) and is writable."""
    try:
        os.makedirs(out_dir, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out_dir):
            pass
    except OSError as e:
        raise OutDirError(f"run.out_dir: cannot write run folders into {out_dir} ({e.strerror}); "
                          "choose another folder with --set run.out_dir=PATH") from None


def require_run_dir(run_dir: Path) -> None:
    if not run_dir.is_dir():
        fail(f"{run_dir}: no such run folder; `nanodist-tui runs` lists the runs")


def training_job(cfg, doc, resume_from: str | None = None):
    """The job both modes drive: train `cfg` (from the checkpoint folder `resume_from`, if given) on the
    calling thread, events to `emit`, until done or `control` (an engine.run.control.RunControl) stops it;
    returns the run summary."""
    from engine.run.job import run_training

    def job(emit, control):
        return run_training(cfg, on_event=emit, stop_event=control, preset_doc=doc, resume_from=resume_from,
                            pause_event=getattr(control, "pause", None))  # a plain stop event cannot pause
    return job


@contextmanager
def stop_on_signals(control: threading.Event) -> Iterator[list[int]]:
    """While the job runs: Ctrl-C (SIGINT), SIGTERM or SIGHUP — to this process or to its whole process group,
    as a scheduler or a closing terminal sends them — asks it to stop as the workbench's stop key does (every
    rank checkpoints at the step reached; engine.run.stop_signals); a second signal leaves at once
    (KeyboardInterrupt). Yields the signals received, in order. Outside the main thread (where Python delivers
    signals) it does nothing."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return

    def on_signal(signum: int) -> None:
        received.append(signum)
        if len(received) > 1:
            raise KeyboardInterrupt
        control.set()

    previous = stop_signals.handle(on_signal)
    try:
        yield received
    finally:
        stop_signals.restore(previous)


def workbench_config(ascii_only: bool = False):
    """The user's workbench settings (keymap, display); a mistake in that file is one line and exit 2."""
    import dataclasses

    from nanodist_tui.bindings import BINDING_IDS
    from nanodist_tui.user_config import UserConfigError, load_user_config
    try:
        config = load_user_config(BINDING_IDS)
    except UserConfigError as e:
        fail(str(e))
    return dataclasses.replace(config, ascii=config.ascii or ascii_only)


def run_in_workbench(cfg, job, ascii_only: bool = False, sweep_finish: threading.Event | None = None) -> None:
    """Open the workbench on a training job (new or resumed), or on a sweep (`sweep_finish`: the event
    that ends it after the running trial); from it the user may start other runs."""
    from engine.comm.launch import process_rank
    if process_rank(cfg.parallel.backend) not in (None, 0):
        # Under mpiexec or a tcp launch every process runs this command; only rank 0's shows the
        # workbench (it receives every rank's events), the others train headless and quietly.
        run_headless_job(job)
        return
    # Start multiprocessing's helper process now, whatever this run's backend (a run started from the app, or
    # a sweep's --jobs, may spawn processes): once Textual owns the terminal, sys.stderr has no file
    # descriptor, and spawning the tracker from inside the app fails ("bad value(s) in fds_to_keep").
    from multiprocessing import resource_tracker
    resource_tracker.ensure_running()
    from nanodist_tui.app import create_app
    user_config = workbench_config(ascii_only)
    from engine.config import to_dict
    from nanodist_tui.run_info import RunInfo
    # the run's panes from the first frame, not seconds later when its ranks have started
    shape = RunInfo.from_config(to_dict(cfg), cfg.name, sweep=sweep_finish is not None)
    run_app(create_app(cfg.name, job, make_job=training_job, check_run=check_can_run,
                       user_config=user_config, sweep_finish=sweep_finish, shape=shape))


def run_app(app) -> None:
    """Run the workbench, then print on the shell what it leaves behind: the run folder and the summary
    (or the failure, exit code 1)."""
    app.run()
    for line in app.farewell():
        print(printable(line))  # it may quote a replayed run's failure
    if app.shell_exit_code:
        raise typer.Exit(app.shell_exit_code)


def run_headless_job(job) -> None:
    """Run `job(emit, control)` (returning the run summary) with the headless printer, then print the
    summary. Ctrl-C, SIGTERM or SIGHUP stops every rank after the same step with a checkpoint kept, prints
    the summary and exits 128 + the signal's number (130, 143, 129: the shell's code for a signal, so a
    script or a scheduler sees the run did not finish); a second one leaves at once. A user mistake ends
    with its one line and code 2, a failed run with code 1 (the printer has already shown its one line: the
    rank and the cause), any other failure with code 1 and one line naming where its traceback went."""
    from engine.run.control import RunControl
    from nanodist_tui.headless import HeadlessPrinter, summary_lines
    printer, control = HeadlessPrinter(), RunControl()
    with stop_on_signals(control) as received:
        try:
            summary = job(printer, control)
        except KeyboardInterrupt:
            control.set()
            printer.close()
            fail("interrupted", code=130)
        except USER_ERRORS as e:
            printer.close()
            fail(str(e))
        except Exception as e:
            printer.close()
            if not printer.failure_shown:
                internal_failure(e)
            raise typer.Exit(1) from None
    if summary.get("lead", True):  # else another process (rank 0's, under mpiexec or tcp) reports this run
        for line in summary_lines(summary, printer.summary_lines()):
            print(printable(line))
    if received:
        raise typer.Exit(128 + received[0])


def load_source(source: Path, step: int | None):
    """The fp32 model of a run folder (its newest finished checkpoint, or the one of `step`), a checkpoint
    folder or an exported .npz, checked (checksums, names, shapes) before use; call inside user_errors()."""
    from engine.checkpoint.export import model_from_checkpoint, read_model
    from engine.checkpoint.sharded import find_checkpoint
    if source.is_file():
        return read_model(source)
    ckpt = find_checkpoint(source, step)
    ckpt.verify()
    return model_from_checkpoint(ckpt)
