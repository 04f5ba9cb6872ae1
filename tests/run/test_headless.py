"""Headless printer off a terminal: plain, unwrapped lines; periodic steps; every discrete event."""
import io
import subprocess
import sys

import pytest
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


def test_a_pipelines_bubble_is_measured_from_its_timelines_and_set_beside_the_formula():
    """4 ranks, pipeline 2 (dp 2; rank 0's pipeline is ranks 0 and 2 with pp outermost): step 1's bubble is
    the idle share of its two timelines, ranks 1 and 3 (the other pipeline) are not counted, a step is taken
    once both of rank 0's pipeline reported it, and the run's figure is the median of the steps."""
    from tests.pipeline_helpers import gpipe_step
    printer, out, _ = plain_printer()
    printer(ev.RunStarted(run_id=RUN_ID, preset="pp", config={"parallel": {"world_size": 4, "pipeline": 2}},
                          n_params=1, world_size=4, total_steps=3))
    assert printer.summary_lines() == []
    busy = gpipe_step(2, 2, step=1, rank_of=lambda r: 2 * r, comm=False)  # GPipe p 2, m 2: bubble 1/3
    for e in busy:
        printer(e)
    # step 2: both ranks compute 0-1 s and 3-4 s of a 4 s step; rank 1 (the other pipeline) a 100 s forward
    slow = [ev.PipelineTimeline(step=2, rank=r, stage_rank=r // 2, schedule="gpipe", micro_batches=2,
                                chunks=1, actions=[["F", 0, r // 2, 0.0, 1.0], ["B", 0, r // 2, 3.0, 4.0]],
                                emulated=True)
            for r in (0, 2)]
    other = ev.PipelineTimeline(step=2, rank=1, stage_rank=0, schedule="gpipe", micro_batches=2, chunks=1,
                                actions=[["F", 0, 0, 0.0, 100.0]], emulated=True)
    printer(other)
    printer(slow[0])
    assert printer.bubbles.bubbles == [pytest.approx(1 / 3)]  # step 2 waits for rank 2
    printer(slow[1])
    printer(ev.PipelineTimeline(step=3, rank=0, stage_rank=0, schedule="gpipe", micro_batches=2, chunks=1,
                                actions=[["F", 0, 0, 0.0, 1.0]], emulated=True))  # never completed
    # step 2: each rank idle 2 of 4 s: 1/2; the run's figure is the median of 1/3 and 1/2
    assert printer.bubbles.bubbles == [pytest.approx(1 / 3), pytest.approx(1 / 2)]
    assert printer.summary_lines() == [
        "pipeline       bubble 41.7% measured (median of 2 steps, compute emulated), 33.3% simulated with "
        "its action times, 33.3% by (p-1)/(m+p-1): gpipe, 2 ranks, 2 micro-batches"]
    lines = summary_lines({"initial_val_loss": 2.0, "final_val_loss": 1.0, "steps": 2, "tokens_per_s": 1.0,
                           "wall_s": 1.0, "run_dir": "runs/x"}, printer.summary_lines())
    assert lines[-2].startswith("pipeline") and lines[-1].startswith("run folder")


@pytest.mark.parametrize("schedule, chunks", [("zb-h1", 1), ("interleaved", 2), ("1f1b", 1)])
def test_the_simulated_bubble_reads_each_stages_own_action_times(schedule, chunks):
    """A step the simulator played with unequal times per op and per stage (F 1 s on stage 0 and 3 s
    elsewhere, I 2 s, W 0.5 s, B 2.5 s): read back from its timelines, the times give the same bubble, where
    the formula's (equal times) is another."""
    from engine.parallel.pipeline.schedules import build_schedule, formula_bubble
    from engine.parallel.pipeline.simulate import Durations, simulate
    from nanodist_tui.bubble_meter import simulated_bubble
    p, m = 3, 4
    stages = p * chunks
    durations = Durations(forward=[1.0] + [3.0] * (stages - 1), backward=2.5, backward_input=2.0,
                          backward_weight=0.5)
    played = simulate(build_schedule(schedule, p, m, chunks), durations)
    timelines = [ev.PipelineTimeline(step=1, rank=r, stage_rank=r, schedule=schedule, micro_batches=m,
                                     chunks=chunks, actions=[[s.action.op.value, s.action.micro_batch,
                                                              s.action.stage, s.start, s.end] for s in spans])
                 for r, spans in enumerate(played.spans)]
    assert simulated_bubble(timelines) == pytest.approx(played.bubble, rel=1e-12)
    assert abs(played.bubble - formula_bubble(schedule, p, m, chunks)[1]) > 0.01
