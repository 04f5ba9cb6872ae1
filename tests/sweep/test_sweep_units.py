"""The sweep's parts on their own: metrics folded from hand-made events, the space as Optuna's own
distributions and grids, the --jobs split, sampler seeds, and where a study's storage goes."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from engine import events as ev
from engine.config import from_dict
from engine.config.vocabulary import METRICS
from engine.sweep.algorithms import sampler_seed
from engine.sweep.errors import SweepError
from engine.sweep.jobs import shares
from engine.sweep.metrics import MetricTracker
from engine.sweep.space import distribution, grid
from engine.sweep.storage import JOURNAL_FILE, SQLITE_FILE, StorageSpec, choose_storage, write_record


def step(n: int, loss: float, tokens: int = 100, seconds: float = 0.5, skipped: bool = False) -> ev.StepEnd:
    return ev.StepEnd(step=n, loss=loss, lr=1e-3, tokens=tokens, step_time_s=seconds, tokens_per_s=0.0,
                      grad_norm=1.0, skipped=skipped)


def test_every_metric_is_folded_from_the_events_as_defined():
    t = MetricTracker()
    assert all(t.value(name) is None for name in METRICS)
    t(ev.Eval(step=0, val_loss=4.0))
    for n in range(1, 13):
        t(step(n, loss=float(n)))
    t(step(12, loss=float("inf"), skipped=True))  # an fp16 overflow: no score, no throughput
    t(ev.Eval(step=6, val_loss=2.0))
    t(ev.Eval(step=12, val_loss=2.5))
    for rank, sent in ((0, [10, 30]), (1, [40, 40])):
        for n, b in enumerate(sent):
            t(ev.RankStats(step=n, rank=rank, step_time_s=0.1, comm_wait_s=0.0, bytes_sent=b))
    t(ev.MemorySnapshot(step=1, rank=0, phase="forward", current={}, peak={"parameters": 1_000_000,
                                                                          "activations": 500_000}))
    t(ev.MemorySnapshot(step=1, rank=1, phase="backward", current={}, peak={"parameters": 2_000_000}))
    expected = {"val_loss": 2.5, "best_val_loss": 2.0, "loss": sum(range(3, 13)) / 10,
                "tokens_per_s": 1200 / 6.0, "peak_memory_mb": 2.0, "bytes_per_step": 40.0}
    assert expected.keys() == METRICS.keys()
    for name, value in expected.items():
        assert math.isclose(t.value(name), value), name
    assert t.steps == 12 and t.diverged is None


def test_a_loss_that_is_not_finite_is_divergence():
    t = MetricTracker()
    t(step(1, loss=3.0))
    t(step(2, loss=float("nan")))
    assert t.diverged == "diverged: loss nan at step 2"


def space_of(**params) -> dict:
    return from_dict({"sweep": {"space": params, "sampler": "random"}}).sweep.space


def test_the_space_is_optunas_own_distributions_and_grid():
    space = space_of(**{"optim.lr": {"type": "float", "low": 1e-4, "high": 1e-2, "log": True},
                        "optim.warmup_steps": {"type": "int", "low": 0, "high": 10, "step": 5},
                        "optim.beta1": {"type": "float", "low": 0.8, "high": 0.9, "step": 0.05},
                        "precision.dtype": {"type": "categorical", "choices": ["fp32", "bf16"]}})
    assert distribution(space["optim.lr"]) == FloatDistribution(1e-4, 1e-2, log=True)
    assert distribution(space["optim.warmup_steps"]) == IntDistribution(0, 10, step=5)
    assert distribution(space["precision.dtype"]) == CategoricalDistribution(["fp32", "bf16"])
    g = grid({k: v for k, v in space.items() if k != "optim.lr"})
    assert g["optim.warmup_steps"] == [0, 5, 10] and g["precision.dtype"] == ["fp32", "bf16"]
    assert g["optim.beta1"] == pytest.approx([0.8, 0.85, 0.9])
    for key, values in g.items():  # every grid value is one Optuna's distribution accepts
        d = distribution(space[key])
        assert all(d._contains(d.to_internal_repr(v)) for v in values)


def test_jobs_share_the_remaining_trials_exactly():
    assert shares(5, 2) == [3, 2] and shares(1, 3) == [1] and shares(None, 2) == [None, None]
    assert all(sum(shares(n, j)) == n for n in range(1, 12) for j in range(1, 5))


def test_sampler_seeds_are_the_presets_for_a_fresh_sweep_and_distinct_otherwise():
    assert sampler_seed(7, 0, 0) == 7
    seeds = {sampler_seed(7, existing, job) for existing in range(4) for job in range(3)}
    assert len(seeds) == 12 and sampler_seed(7, 2, 1) == sampler_seed(7, 2, 1)


def test_storage_defaults_and_what_a_folder_keeps(tmp_path: Path):
    assert choose_storage(tmp_path, None, 1) == StorageSpec("sqlite", SQLITE_FILE)
    assert choose_storage(tmp_path, None, 3) == StorageSpec("journal", JOURNAL_FILE)
    assert choose_storage(tmp_path, "postgresql://h/db", 4) == StorageSpec("url", "postgresql://h/db")
    write_record(tmp_path, "s", StorageSpec("sqlite", SQLITE_FILE), ["val_loss"], ["minimize"])
    assert choose_storage(tmp_path, None, 1) == StorageSpec("sqlite", SQLITE_FILE)  # a rerun finds it
    with pytest.raises(SweepError, match="not safe for --jobs 2"):
        choose_storage(tmp_path, None, 2)
    with pytest.raises(SweepError, match="drop --storage"):
        choose_storage(tmp_path, "sqlite:///other.db", 1)


def test_the_headless_printer_draws_a_bar_on_a_terminal_and_plain_lines_elsewhere():
    import io

    from rich.console import Console

    from nanodist_tui.sweep_printer import SweepPrinter
    started = ev.SweepStarted(study="s", sweep_dir="runs/sweep-s", storage="x", metrics=["val_loss"],
                              directions=["minimize"], n_trials=2, timeout_s=0.0, existing=0, jobs=1)
    done = ev.TrialFinished(number=0, state="complete", metrics=["val_loss"], values=[1.5],
                            params={"optim.lr": 0.01}, duration_s=2.0, steps=12, best=[0], best_values=[1.5])
    line = "trial 0 complete: val_loss 1.5; best 1.5 (trial 0); optim.lr=0.01; 12 steps in 2.0 s"
    for terminal in (True, False):
        out = io.StringIO()
        printer = SweepPrinter(Console(file=out, force_terminal=terminal, width=200))
        for event in (started, ev.TrialStarted(number=0, params={"optim.lr": 0.01}), done,
                      ev.SweepFinished(study="s", counts={"complete": 1}, best=[0], stopped=False)):
            printer(event)
        text = out.getvalue()
        assert line in text and "sweep s finished: 1 complete" in text
        assert ("trials" in text and "\x1b[" in text) if terminal else ("\x1b[" not in text)
        if not terminal:
            assert text.splitlines()[1] == line  # one plain line per trial, nothing else between


def test_jobs_split_the_hosts_cpus_between_them():
    from engine.sweep.jobs import job_cpus
    assert job_cpus({0, 1}, 2) == [[0], [1]]
    assert job_cpus({0, 1, 2, 3, 4}, 2) == [[0, 2, 4], [1, 3]]
    assert job_cpus({3}, 1) == [[3]]
    assert job_cpus({0, 1}, 3) == [[0], [1], [0]]  # more jobs than CPUs: shared round-robin
    for cpus, jobs in (({0, 1, 2, 3}, 2), ({0, 1, 2, 3, 4, 5, 6}, 3)):
        split = job_cpus(cpus, jobs)
        assert sorted(c for part in split for c in part) == sorted(cpus)  # every CPU used, once
