"""`nanodist-tui sweep --preset P`: an Optuna sweep over the preset's [sweep] space, in the workbench or
headless (--no-ui), resumable by running it again; `sweep show NAME|DIR` prints a sweep's trials and its
best trial (or Pareto front); `sweep export-best NAME|DIR -o NEW.toml` writes the best configuration as a
preset. The work is engine.sweep's; this module parses, calls and prints."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Annotated

import typer

from engine.run.printable import printable
from nanodist_tui.cli.errors import USER_ERRORS, fail, internal_failure, user_errors
from nanodist_tui.cli.options import BackendOpt, LogToOpt, PresetOpt, SetOpt, WorldOpt
from nanodist_tui.cli.running import prepare_run, run_in_workbench, shortcut_overrides, stop_on_signals

app = typer.Typer(help="Optuna sweeps over a preset's [sweep] space: run or resume, show, export the best.")

SweepArg = Annotated[str, typer.Argument(help="a study name (runs/sweep-NAME) or a sweep folder",
                                         show_default=False)]
OutDirOpt = Annotated[Path, typer.Option("--out-dir", help="the folder holding sweep-NAME folders "
                                                          "(run.out_dir)")]


@app.callback(invoke_without_command=True)
def sweep(
    ctx: typer.Context,
    preset: PresetOpt = "sweep-lr",
    sets: SetOpt = None,
    world_size: WorldOpt = None,
    backend: BackendOpt = None,
    log_to: LogToOpt = None,
    no_ui: Annotated[bool, typer.Option("--no-ui", help="headless: one line per trial, then the results")]
    = False,
    trials: Annotated[int | None, typer.Option("--trials", min=1, help="trials the study holds at the end "
                                               "(sweep.n_trials)")] = None,
    timeout: Annotated[float | None, typer.Option("--timeout", min=0.0, help="seconds after which no new "
                                                  "trial starts (sweep.timeout_s)")] = None,
    jobs: Annotated[int, typer.Option("--jobs", "-j", min=1, help="trials at once, in separate processes "
                                      "sharing the study")] = 1,
    storage: Annotated[str | None, typer.Option("--storage", help="an Optuna storage URL (e.g. "
                                                "postgresql://...) or a journal file; default: "
                                                "study.db (journal.log with --jobs) in the sweep folder")]
    = None,
    study: Annotated[str | None, typer.Option("--study", help="study name (sweep.study); names the "
                                              "folder runs/sweep-NAME")] = None,
) -> None:
    """Run (or resume) a sweep: each trial is a real training run, recorded in runs/sweep-NAME/."""
    if ctx.invoked_subcommand is not None:
        return
    from engine.sweep.study import prepare_sweep
    extra = shortcut_overrides(sets, world_size, backend, log_to)  # --log-to: every trial logs there
    extra += [f"sweep.n_trials={trials}"] if trials is not None else []
    extra += [f"sweep.timeout_s={timeout}"] if timeout is not None else []
    extra += [f'sweep.study="{study}"'] if study is not None else []
    cfg, doc, _ = prepare_run(preset, extra)
    with user_errors():
        swept = prepare_sweep(cfg, doc, storage, jobs)
    finish = threading.Event()

    def job(emit, stop_event):
        from engine.sweep.runner import run_sweep
        return run_sweep(swept, emit, stop_event, finish, jobs)

    if no_ui:
        _run_headless(swept, job)
    else:
        run_in_workbench(cfg, job, sweep_finish=finish)
    _print_results(swept)


def _run_headless(swept, job) -> None:
    """Ctrl-C, SIGTERM or SIGHUP (to this process or its whole group, as a scheduler sends them) stops the
    running trials as the workbench's stop does, then exits 128 + the signal with every finished trial kept;
    a second one leaves at once (130); a user mistake: one line, 2; anything else: 1."""
    from nanodist_tui.sweep_printer import SweepPrinter
    printer, stop = SweepPrinter(), threading.Event()
    kept = (f"every finished trial is kept in {swept.storage.describe(swept.sweep_dir)}: run the same "
            "command again to resume")
    with stop_on_signals(stop) as received:
        try:
            job(printer, stop)
        except KeyboardInterrupt:
            printer.close()
            fail(f"interrupted; {kept}", code=130)
        except USER_ERRORS as e:
            printer.close()
            fail(str(e))
        except Exception as e:  # noqa: BLE001 - an internal failure: one line, exit 1, the traceback in a file
            printer.close()
            raise typer.Exit(internal_failure(e)) from None
    if received:  # the trials ran to a stop: what the sweep found so far, then the signal's exit code
        printer.close()
        _print_results(swept)
        fail(f"stopped by {signal.Signals(received[0]).name}; {kept}", code=128 + received[0])


def _print_results(swept) -> None:
    from nanodist_tui.sweep_printer import sweep_results
    with user_errors():
        lines = sweep_results(swept)
    for line in lines:
        print(printable(line))  # a sweep folder's study (names, reasons, parameters) is recorded text


@app.command("show")
def show(name: SweepArg, out_dir: OutDirOpt = Path("runs")) -> None:
    """Print a sweep's trials, its best trial (or Pareto front), trials.csv and the dashboard command."""
    from engine.sweep.study import find_sweep_dir, load_sweep
    with user_errors():
        swept = load_sweep(find_sweep_dir(name, out_dir))
    _print_results(swept)


@app.command("export-best")
def export_best(
    name: SweepArg,
    output: Annotated[Path, typer.Option("--output", "-o", help="the new preset file (NEW.toml)")],
    trial: Annotated[int | None, typer.Option("--trial", min=0, help="export this trial instead of the "
                                              "best (e.g. one of a Pareto front)")] = None,
    force: Annotated[bool, typer.Option("--force", help="overwrite the output file")] = False,
    out_dir: OutDirOpt = Path("runs"),
) -> None:
    """Write the best trial's configuration as a new preset, keeping the swept preset's comments."""
    from engine.sweep import results
    from engine.sweep.study import find_sweep_dir, load_study, load_sweep
    if output.suffix != ".toml":
        fail(f"--output {output}: a preset is a .toml file; write e.g. -o best.toml")
    if output.exists() and not force:
        fail(f"{output} exists; choose another name or pass --force to overwrite it")
    with user_errors():
        swept = load_sweep(find_sweep_dir(name, out_dir))
        chosen = results.export_best(swept, load_study(swept), output, trial)
    from nanodist_tui.describe import params_text, scores_text
    scores = scores_text(swept.metrics, chosen.values)
    print(printable(f"wrote {output}: trial {chosen.number} of sweep {swept.study_name} "
                    f"({scores}; {params_text(chosen.params)}), comments kept"))
