"""Headless printer off a terminal: plain, unwrapped lines; periodic steps; every discrete event."""
import io
import subprocess
import sys

from rich.console import Console

from engine import events as ev
from nanodist_tui.headless import HeadlessPrinter, summary_lines

RUN_ID = "20260101-120000-a-preset-name-long-enough-to-pass-eighty-columns"


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def step(n):
    return ev.StepEnd(step=n, loss=2.0, lr=1e-3, tokens=32, step_time_s=1.0, tokens_per_s=1234.0,
                      grad_norm=0.5)


def plain_printer(interval_s=5.0):
    out, clock = io.StringIO(), FakeClock()
    printer = HeadlessPrinter(Console(file=out, width=80), interval_s=interval_s, live=False, clock=clock)
    return printer, out, clock


def started(total_steps=10):
    return ev.RunStarted(run_id=RUN_ID, preset="quickstart", config={}, n_params=123456, world_size=2,
                         total_steps=total_steps)


def test_plain_mode_prints_steps_every_interval_and_the_last_step():
    printer, out, clock = plain_printer(interval_s=5.0)
    printer(started())
    for n in range(1, 11):
        clock.now = float(n)  # one step a second
        printer(step(n))
    lines = out.getvalue().splitlines()
    assert lines[0] == f"run {RUN_ID} started: preset quickstart, 123,456 parameters, 2 rank(s), 10 steps"
    assert [line.split()[1] for line in lines[1:]] == ["1/10", "6/10", "10/10"]
    assert lines[1] == "step 1/10  loss 2.0000  1,234 tok/s  lr 1.00e-03"


def test_plain_lines_are_never_wrapped():
    printer, out, _ = plain_printer()
    printer(started())
    printer(ev.Log(level="info", message="x" * 120))
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and lines[0].startswith(f"run {RUN_ID} started: ") and len(lines[0]) > 80
    assert lines[0].endswith(", 10 steps")
    assert lines[1] == "info: " + "x" * 120


def test_default_console_off_a_terminal_prints_plain_unwrapped_lines(capsys):
    printer = HeadlessPrinter()  # stdout is captured: not a terminal
    assert not printer.live
    printer(started())
    assert capsys.readouterr().out.splitlines() == [
        f"run {RUN_ID} started: preset quickstart, 123,456 parameters, 2 rank(s), 10 steps"]


def test_interval_zero_prints_every_step():
    printer, out, _ = plain_printer(interval_s=0)
    printer(started(total_steps=3))
    for n in (1, 2, 3):
        printer(step(n))
    assert len(out.getvalue().splitlines()) == 4


def test_discrete_events_are_printed_as_they_happen_and_verbatim(capsys):
    printer, out, clock = plain_printer(interval_s=1e9)
    printer(started())
    printer(step(1))
    printer(step(2))  # inside the interval: no line
    printer(ev.Eval(step=2, val_loss=1.5))
    printer(ev.LossScaleChange(step=2, reason="inf", old_scale=1024.0, new_scale=512.0, first_param="w"))
    printer(ev.CheckpointSaved(step=2, path="runs/x/checkpoints/step-2"))
    printer(ev.Log(level="warning", message="[bold]not markup[/bold] :smile:"))
    printer(step(3))
    assert out.getvalue().splitlines()[1:] == [
        "step 1/10  loss 2.0000  1,234 tok/s  lr 1.00e-03",
        "step 2: val loss 1.5000",
        "step 2: inf overflow, scale 1024 -> 512 (first: w)",
        "step 2: checkpoint saved to runs/x/checkpoints/step-2",
        "warning: [bold]not markup[/bold] :smile:",
    ]
    printer(ev.RunFailed(message="ValueError: loss is NaN", rank=1))
    printer(ev.RunFailed(message="interrupted (Ctrl-C)"))
    assert capsys.readouterr().err.splitlines() == ["run failed: rank 1: ValueError: loss is NaN",
                                                    "run stopped: interrupted (Ctrl-C)"]


def test_val_loss_joins_the_step_line_after_an_eval():
    printer, out, _ = plain_printer(interval_s=0)
    printer(started())
    printer(ev.Eval(step=0, val_loss=4.25))
    printer(step(1))
    assert out.getvalue().splitlines()[-1] == "step 1/10  loss 2.0000  1,234 tok/s  val 4.2500  lr 1.00e-03"


def test_summary_lines():
    lines = summary_lines({"steps": 10, "initial_val_loss": 4.0, "final_val_loss": 2.0, "tokens_per_s": 1e4,
                           "wall_s": 3.25, "stopped": True, "run_dir": "runs/x", "total_steps": 40})
    assert lines == ["steps          10 of 40  (stopped early, checkpoint kept)",
                     "val loss       4.0000 -> 2.0000  (50.0% lower)",
                     "throughput     10,000 tokens/s", "wall time      3.2 s", "run folder     runs/x",
                     "continue with  nanodist-tui resume runs/x"]
    finished = summary_lines({"steps": 40, "initial_val_loss": 4.0, "final_val_loss": 2.0,
                              "tokens_per_s": 1e4, "wall_s": 3.25, "stopped": False, "run_dir": "runs/x",
                              "total_steps": 40})
    assert finished[0] == "steps          40 of 40" and finished[-1] == "run folder     runs/x"


def test_the_printer_and_the_event_wording_need_no_textual():
    code = "import sys, nanodist_tui.headless, nanodist_tui.describe; print('textual' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_the_threads_each_rank_got_are_named_where_the_run_is_described():
    from nanodist_tui.describe import describe
    from nanodist_tui.messages import Tick
    from nanodist_tui.widgets.run_header import RunHeader
    event = ev.RunStarted(run_id=RUN_ID, preset="quickstart", config={}, n_params=10, world_size=2,
                          total_steps=5, threads_per_rank=3)
    assert "2 rank(s) × 3 thread(s)," in describe(event).text
    header = RunHeader("quickstart")
    header.ingest(Tick(0, (), 0, {}, {}, {}, (event,)))
    assert "3 thread(s)/rank" in header.summary().plain
    summary = {"steps": 5, "initial_val_loss": 2.0, "final_val_loss": 1.0, "tokens_per_s": 10.0,
               "wall_s": 1.0, "threads_per_rank": 3}
    assert "threads/rank   3" in summary_lines(summary)


def test_the_summary_has_each_ranks_peak_memory_and_the_overflows(tmp_path):
    # fp16 with a first scale of 2^24 overflows at once: the summary counts it, and each rank's peak is the
    # highest total its MemorySnapshot events measured (issue 27: --no-ui left both out)
    from tests.run_helpers import train
    summary, events = train(tmp_path, "parallel.world_size=2", "precision.dtype=fp16",
                            "precision.loss_scale=dynamic", "precision.init_scale=16777216")
    measured: dict[str, int] = {}
    for e in events:
        if e.kind == "memory_snapshot":
            measured[str(e.rank)] = max(measured.get(str(e.rank), 0), sum(e.peak.values()))
    overflows = [e for e in events if e.kind == "loss_scale_change" and e.reason != "growth"]
    assert set(measured) == {"0", "1"} and summary["peak_memory"] == measured
    assert overflows and summary["overflows"] == len(overflows)
    lines = summary_lines(summary)
    peak = next(line for line in lines if line.startswith("peak memory"))
    def decimal(n: int) -> str:  # the memory pane's and the header's units: powers of 10
        return f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.1f} kB"
    assert peak == "peak memory    " + "  ".join(f"r{r} {decimal(measured[r])}" for r in ("0", "1"))
    skipped = sum(e.skipped for e in events if e.kind == "step_end")
    assert (f"overflows      {len(overflows)} (loss-scale overflows; {skipped} step"
            f"{'' if skipped == 1 else 's'} skipped)") in lines
