"""Sweeps on tiny models (threads backend): counts and states, pruning, resume, the Pareto front, the memory
budget, failures that leave the sweep going, export-best. The references: Optuna's own storage read back,
the run folders' own records, Python's csv reader, the estimator, a brute-force dominance check."""
from __future__ import annotations

import csv
import json
import math
import subprocess
import sys

import optuna
import pytest
import tomlkit
from optuna.trial import TrialState

from engine.config import presets
from engine.memory.estimator import estimate
from engine.sweep import results
from engine.sweep.storage import fail_orphans
from engine.sweep.study import load_study
from tests.sweep_helpers import of_kind, run, sweep_of, trials_of, write_preset

LR_SPACE = """\
[sweep]  # the search
n_trials = 4         # trials
sampler = "random"   # reproducible
pruner = "none"      # train everything
seed = 3             # sampler seed

[sweep.space.optim.lr]  # search over optim.lr
type = "float"
low = 1e-3
high = 3e-2
log = true
"""


def rows_of_csv(sweep) -> list[dict]:
    with open(sweep.sweep_dir / results.TRIALS_CSV, newline="") as f:
        return list(csv.DictReader(f))


def steps_in_run(run_dir: str) -> int:
    """The optimizer steps a run trained, from its own metrics.csv (one row per step)."""
    with open(f"{run_dir}/metrics.csv", newline="") as f:
        return max(int(row["step"]) for row in csv.DictReader(f) if row["loss"])


def test_every_trial_is_a_recorded_run_and_the_counts_match_the_storage(in_tmp):
    result, events, sweep = run(write_preset(in_tmp, LR_SPACE))
    trials = trials_of(sweep)
    assert [t.number for t in trials] == [0, 1, 2, 3]
    assert all(t.state == TrialState.COMPLETE for t in trials)
    assert result["counts"]["complete"] == 4 and sum(result["counts"].values()) == 4
    finished = of_kind(events, "trial_finished")
    assert [e.number for e in finished] == [0, 1, 2, 3] and {e.state for e in finished} == {"complete"}
    for t in trials:  # each trial's value is what its own run folder recorded as the final val loss
        summary = json.loads((in_tmp / t.user_attrs["run_dir"] / "summary.json").read_text())
        assert summary["status"] == "finished" and summary["steps"] == 12
        assert t.values == [summary["final_val_loss"]]
        assert 1e-3 <= t.params["optim.lr"] <= 3e-2
    best = min(trials, key=lambda t: t.values[0])
    assert result["best"] == [best.number] and finished[-1].best == [best.number]
    rows = rows_of_csv(sweep)
    assert [int(r["number"]) for r in rows] == [0, 1, 2, 3]
    assert [float(r["val_loss"]) for r in rows] == [t.values[0] for t in trials]
    assert {r["state"] for r in rows} == {"complete"}


def test_a_pruned_trial_trains_fewer_steps_and_stops_right_after_its_evaluation(in_tmp):
    space = LR_SPACE.replace('pruner = "none"', 'pruner = "median"').replace("n_trials = 4", "n_trials = 6")
    space = space.replace('type = "float"\nlow = 1e-3\nhigh = 3e-2\nlog = true',
                          'type = "categorical"\nchoices = [3e-2, 1e-5]')
    # seed 4 samples 3e-2 four times, then 1e-5: a learning rate that barely learns, after good ones
    result, events, sweep = run(write_preset(in_tmp, space), "sweep.prune_startup_trials=1", "sweep.seed=4")
    trials = trials_of(sweep)
    pruned = [t for t in trials if t.state == TrialState.PRUNED]
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert pruned and complete and result["counts"]["pruned"] == len(pruned)
    for t in complete:
        assert steps_in_run(t.user_attrs["run_dir"]) == 12
    for t in pruned:
        reported = max(t.intermediate_values)  # the step Optuna last heard about
        assert steps_in_run(t.user_attrs["run_dir"]) == reported + 1 < 12
        assert t.user_attrs["steps"] == reported + 1
        assert t.user_attrs["reason"].startswith(f"pruned at step {reported}")
        assert t.params["optim.lr"] == 1e-5  # the pruner stops the learning rate that barely learns
    reports = of_kind(events, "trial_report")
    reported = {(t.number, step) for t in trials for step in t.intermediate_values}
    assert {(e.number, e.step) for e in reports} == reported


def test_resume_keeps_every_trial_and_numbers_on(in_tmp):
    path = write_preset(in_tmp, LR_SPACE.replace("n_trials = 4", "n_trials = 5"))
    first, _, sweep = run(path, finish_after=2)  # stopped after its second trial, as by the `x` key
    assert first["stopped"]
    before = {t.number: (t.params, t.values) for t in trials_of(sweep)}
    assert sorted(before) == [0, 1]
    second, events, _ = run(path)
    trials = trials_of(sweep)
    assert [t.number for t in trials] == [0, 1, 2, 3, 4] and not second["stopped"]
    assert {t.number: (t.params, t.values) for t in trials if t.number < 2} == before
    started = of_kind(events, "sweep_started")[0]
    assert started.existing == 2
    assert [e.number for e in of_kind(events, "trial_finished") if e.resumed] == [0, 1]
    assert [e.number for e in of_kind(events, "trial_started")] == [2, 3, 4]
    # a fresh sampler is seeded anew for what the study holds: it does not replay the first run's picks
    assert {t.params["optim.lr"] for t in trials[2:]}.isdisjoint({p["optim.lr"] for p, _ in before.values()})


def test_an_orphaned_running_trial_is_failed_on_the_next_run(in_tmp):
    sweep = sweep_of(write_preset(in_tmp, LR_SPACE))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    study = load_study(sweep)
    orphan = study.ask()  # what a SIGKILLed sweep leaves: a RUNNING trial of a process that is gone
    import socket
    orphan.set_user_attr("host", socket.gethostname())
    orphan.set_user_attr("pid", int(dead.stdout))
    assert fail_orphans(study) == [0]
    (t,) = load_study(sweep).get_trials(deepcopy=False)
    assert t.state == TrialState.FAIL and t.user_attrs["reason"].startswith("interrupted")
    assert results.outcome(t) == "failed"


def dominated(a: list[float], b: list[float]) -> bool:
    """a is dominated by b (both minimized)."""
    return all(y <= x for x, y in zip(a, b)) and any(y < x for x, y in zip(a, b))


def test_a_multi_objective_study_returns_its_pareto_front(in_tmp):
    space = """\
[sweep]
metric = ["val_loss", "peak_memory_mb"]
n_trials = 6
sampler = "nsga2"
seed = 1

[sweep.space.model.n_embd]
type = "categorical"
choices = [8, 16, 32, 48]

[sweep.space.optim.lr]
type = "float"
low = 1e-3
high = 3e-2
log = true
"""
    result, events, sweep = run(write_preset(in_tmp, space))
    assert sweep.directions == ["minimize", "minimize"]
    trials = [t for t in trials_of(sweep) if t.state == TrialState.COMPLETE]
    front = {t.number for t in trials if not any(dominated(t.values, o.values) for o in trials)}
    assert set(result["best"]) == front and front
    last = of_kind(events, "trial_finished")[-1]
    assert set(last.best) == front and last.best_values is None
    for t in trials:  # the second value is the ledger's peak, as each run's own events recorded it
        lines = (in_tmp / t.user_attrs["run_dir"] / "events.jsonl").read_text().splitlines()
        peaks = [sum(e["peak"].values()) for e in map(json.loads, lines) if e["kind"] == "memory_snapshot"]
        assert t.values[1] == pytest.approx(max(peaks) / 1e6)


def test_the_memory_budget_rejects_what_the_estimator_says_will_not_fit(in_tmp):
    path = write_preset(in_tmp, """\
[sweep]
n_trials = 2
sampler = "grid"

[sweep.space.model.n_embd]
type = "categorical"
choices = [16, 64]
""")
    peaks = {}
    for width in (16, 64):
        cfg, _, _ = presets.load_preset(path, [f"model.n_embd={width}"])
        peaks[width] = sum(estimate(cfg).peak()[1].values()) / 1e6
    budget = (peaks[16] + peaks[64]) / 2
    result, events, sweep = run(path, f"sweep.memory_budget_mb={budget}")
    by_width = {t.params["model.n_embd"]: t for t in trials_of(sweep)}
    big, small = by_width[64], by_width[16]
    assert big.state == TrialState.FAIL and results.outcome(big) == "rejected"
    assert big.user_attrs["estimated_peak_mb"] == pytest.approx(peaks[64], abs=1e-3)
    assert "above the budget" in big.user_attrs["reason"] and "run_dir" not in big.user_attrs  # never trained
    assert small.state == TrialState.COMPLETE
    assert small.user_attrs["metric.peak_memory_mb"] <= budget
    assert result["counts"]["rejected"] == 1 and result["counts"]["complete"] == 1


def test_a_measured_peak_above_the_budget_fails_the_trial(in_tmp, monkeypatch):
    import engine.sweep.objective as objective
    real = objective.estimate

    class Optimist:  # an estimate that fits, so the trial trains and meets its real peak
        def __init__(self, cfg, vocab=None):
            self.real = real(cfg, vocab)

        def peak(self):
            phase, cats = self.real.peak()
            return phase, {k: v // 100 for k, v in cats.items()}
    monkeypatch.setattr(objective, "estimate", Optimist)
    cfg, _, _ = presets.load_preset(write_preset(in_tmp, LR_SPACE))
    budget = sum(real(cfg).peak()[1].values()) / 1e6 / 2
    result, _, sweep = run(in_tmp / "tiny.toml", "sweep.n_trials=1", f"sweep.memory_budget_mb={budget}")
    (t,) = trials_of(sweep)
    assert t.state == TrialState.FAIL and results.outcome(t) == "failed"
    assert t.user_attrs["reason"].startswith("measured peak") and t.user_attrs["steps"] < 12


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the diverging run overflows, as it should
def test_impossible_combinations_divergence_and_failed_ranks_fail_the_trial_and_the_sweep_goes_on(
        in_tmp, monkeypatch):
    path = write_preset(in_tmp, """\
[sweep]
n_trials = 6
sampler = "grid"

[sweep.space.parallel.world_size]
type = "categorical"
choices = [1, 2]

[sweep.space.train.global_batch]
type = "categorical"
choices = [8, 9]

[sweep.space.optim.lr]
type = "categorical"
choices = [3e-3, 1e30]
""")
    import engine.trainer as trainer
    real_step = trainer.Trainer.train_step

    def flaky(self):  # rank 1 of a 2-rank run with batch 8 fails on its third step
        if self.rank == 1 and self.step == 2 and self.cfg.train.global_batch == 8 and self.cfg.optim.lr < 1:
            raise RuntimeError("injected fault")
        return real_step(self)
    monkeypatch.setattr(trainer.Trainer, "train_step", flaky)
    result, _, sweep = run(path, "sweep.n_trials=8")
    trials = trials_of(sweep)
    assert len(trials) == 8  # every combination was tried: no failure ended the sweep
    reasons = {(t.params["parallel.world_size"], t.params["train.global_batch"], t.params["optim.lr"]):
               (results.outcome(t), t.user_attrs.get("reason", "")) for t in trials}
    for lr in (3e-3, 1e30):
        state, reason = reasons[(2, 9, lr)]
        assert state == "failed" and reason.startswith("impossible combination")
        assert "train.global_batch" in reason
    assert reasons[(1, 8, 1e30)][0] == "failed" and reasons[(1, 8, 1e30)][1].startswith("diverged: loss nan")
    assert reasons[(2, 8, 3e-3)] == ("failed", "rank 1 failed: RuntimeError: injected fault")
    assert reasons[(1, 8, 3e-3)][0] == reasons[(1, 9, 3e-3)][0] == "complete"
    assert result["counts"]["complete"] == 2 and result["counts"]["failed"] == 6


def test_export_best_writes_a_preset_that_loads_and_keeps_the_comments(in_tmp):
    path = write_preset(in_tmp, LR_SPACE)
    result, _, sweep = run(path)
    out = in_tmp / "best.toml"
    best = results.export_best(sweep, load_study(sweep), out)
    assert [best.number] == result["best"]
    cfg, doc, _ = presets.load_preset(out)
    assert cfg.optim.lr == best.params["optim.lr"] and cfg.sweep is None and cfg.name == "best"
    assert cfg.run.out_dir == "runs"  # the preset's own, not the sweep's folder
    written = out.read_text()
    for line in path.read_text().split("[sweep]")[0].splitlines():  # all but the swept line and the name
        if "#" in line and not line.startswith(("lr =", "name =", "description =")):
            assert line in written, line
    assert "lr = " in written and "# kept unless swept" in written  # the swept value, with its comment
    assert "[sweep" not in written
    with pytest.raises(presets.ConfigError, match="trial 99 does not exist"):
        results.export_best(sweep, load_study(sweep), out, number=99)


def test_a_stored_study_of_other_metrics_is_refused(in_tmp):
    from engine.sweep.errors import SweepError
    path = write_preset(in_tmp, LR_SPACE)
    sweep_of(path)
    with pytest.raises(SweepError, match="another name"):
        sweep_of(path, 'sweep.metric="tokens_per_s"')
    assert load_study(sweep_of(path)).directions == [optuna.study.StudyDirection.MINIMIZE]


def test_trials_csv_is_read_back_by_the_csv_module_with_every_measured_metric(in_tmp):
    _, _, sweep = run(write_preset(in_tmp, LR_SPACE), "sweep.n_trials=1")
    (row,) = rows_of_csv(sweep)
    (t,) = trials_of(sweep)
    for name in ("val_loss", "best_val_loss", "loss", "tokens_per_s", "peak_memory_mb", "bytes_per_step"):
        assert math.isclose(float(row[f"metric.{name}"]), t.user_attrs[f"metric.{name}"])
    assert float(row["metric.bytes_per_step"]) == 0.0  # one rank sends nothing
    assert tomlkit.parse((sweep.sweep_dir / "preset.toml").read_text())["sweep"]["n_trials"] == 1
