"""`nanodist-tui sweep` through the real command line: headless lines, results, show, export-best, bad
spaces and storages as one line with exit code 2, --jobs sharing one study, and a sweep SIGKILLed mid-trial
then run again (a real subprocess): no completed trial lost, the numbering goes on."""
from __future__ import annotations

import csv
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from extras import needs
from optuna.trial import TrialState

from engine.config import presets
from engine.sweep.study import load_study, load_sweep
from tests.cli_helpers import assert_user_error, invoke
from tests.sweep_helpers import SPACE, write_preset

REPO = Path(__file__).resolve().parents[2]
BAD_SWEEPS = sorted((Path(__file__).parents[1] / "bad_presets").glob("sweep_*.toml"))
TRIAL_LINE = re.compile(r"^trial (\d+) (complete|pruned|failed|rejected): (.+); "
                        r"(best [^;]+|no trial complete yet); (optim\.lr=\S+ optim\.warmup_steps=\d+); "
                        r"(\d+) steps in ([\d.]+) s$")


@pytest.fixture(autouse=True)
def _run_in_tmp(in_tmp):
    """Every test here runs in a fresh folder with only the shipped presets."""


def sweep_written(name: str) -> bool:
    """The launcher has written the sweep's record and its preset copy (it makes the folder first)."""
    folder = Path("runs") / f"sweep-{name}"
    return (folder / "sweep.json").is_file() and (folder / "preset.toml").is_file()


def trials(name: str = "cli"):
    sweep = load_sweep(Path("runs") / f"sweep-{name}")
    return sweep, load_study(sweep).get_trials(deepcopy=False)


def test_headless_prints_one_line_per_trial_then_the_results(in_tmp):
    result = invoke("sweep", "--no-ui", "--preset", write_preset(in_tmp, SPACE))
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("sweep cli started: minimize val_loss; 3 trials; 1 job(s); study in sqlite:///")
    found = [m for line in lines if (m := TRIAL_LINE.match(line))]
    assert [int(m.group(1)) for m in found] == [0, 1, 2] and {m.group(2) for m in found} == {"complete"}
    sweep, stored = trials()
    best = min(stored, key=lambda t: t.values[0])
    for m, t in zip(found, stored):  # each line's value, parameters and steps are the study's own
        assert m.group(3) == f"val_loss {t.values[0]:.4g}" and m.group(6) == "12"
        lr, warmup = t.params["optim.lr"], t.params["optim.warmup_steps"]
        assert m.group(5) == f"optim.lr={lr:.4g} optim.warmup_steps={warmup}"
    assert found[-1].group(4) == f"best {best.values[0]:.4g} (trial {best.number})"
    assert f"best trial {best.number} (minimize val_loss): val_loss {best.values[0]:.4g}" in result.output
    assert "dashboard      optuna-dashboard sqlite:///" in result.output and "study.db" in result.output
    assert "[I " not in result.output and "Trial 0 finished" not in result.output  # no Optuna log lines
    shown = invoke("sweep", "show", "cli")
    assert shown.exit_code == 0 and shown.output == "\n".join(lines[-len(shown.output.splitlines()):]) + "\n"
    assert invoke("sweep", "show", "runs/sweep-cli").output == shown.output


def test_trials_and_study_flags_override_the_preset(in_tmp):
    path = write_preset(in_tmp, SPACE)
    result = invoke("sweep", "--no-ui", "--preset", path, "--trials", "1", "--study", "other")
    assert result.exit_code == 0, result.output
    _, stored = trials("other")
    assert len(stored) == 1
    assert presets.load_preset("runs/sweep-other/preset.toml")[0].sweep.n_trials == 1


def test_export_best_writes_a_preset_that_trains(in_tmp):
    assert invoke("sweep", "--no-ui", "--preset", write_preset(in_tmp, SPACE), "--trials", "2").exit_code == 0
    made = invoke("sweep", "export-best", "cli", "-o", "best.toml")
    assert made.exit_code == 0, made.output
    _, stored = trials()
    best = min(stored, key=lambda t: t.values[0])
    cfg = presets.load_preset("best.toml")[0]
    assert cfg.optim.lr == best.params["optim.lr"]
    assert cfg.optim.warmup_steps == best.params["optim.warmup_steps"]
    assert "warmup_steps = " in Path("best.toml").read_text() and "# none" in Path("best.toml").read_text()
    trained = invoke("run", "--preset", "best.toml", "--set", "train.steps=2")
    assert trained.exit_code == 0, trained.output
    assert_user_error(invoke("sweep", "export-best", "cli", "-o", "best.toml"), "best.toml exists")
    assert_user_error(invoke("sweep", "export-best", "cli", "-o", "x.toml", "--trial", "7"),
                      "trial 7 does not exist")


@pytest.mark.parametrize("path", BAD_SWEEPS, ids=lambda p: p.stem)
def test_bad_sweep_sections_are_one_line_and_exit_code_2(path):
    expected = path.read_text().splitlines()[0].removeprefix("# expect: ")
    result = invoke("sweep", "--no-ui", "--preset", path)
    assert_user_error(result, expected)
    assert str(path) in result.output
    assert not Path("runs").exists()  # nothing started


def test_the_four_bad_spaces_of_the_issue_are_covered():
    stems = {p.stem for p in BAD_SWEEPS}
    assert {"sweep_low_above_high", "sweep_unknown_space_key", "sweep_empty_choices",
            "sweep_log_with_zero_low"} <= stems


def test_sweep_mistakes_beyond_the_preset_are_one_line(in_tmp):
    assert_user_error(invoke("sweep", "--no-ui", "--preset", "quickstart"), "has no [sweep] section")
    path = write_preset(in_tmp, SPACE)
    assert invoke("sweep", "--no-ui", "--preset", path, "--trials", "1").exit_code == 0
    assert_user_error(invoke("sweep", "--no-ui", "--preset", path, "--jobs", "2"), "not safe for --jobs 2")
    assert_user_error(invoke("sweep", "--no-ui", "--preset", path, "--storage", "elsewhere.log"),
                      "drop --storage to resume it")
    assert_user_error(invoke("sweep", "--no-ui", "--preset", path, "--set", 'sweep.metric="tokens_per_s"'),
                      "give this sweep another name")
    assert_user_error(invoke("sweep", "show", "nosuch"), "nosuch: no sweep folder or study of this name")
    swept_backend = SPACE + (
        '[sweep.space.parallel.backend]\ntype = "categorical"\nchoices = ["tcp", "threads"]')
    assert_user_error(invoke("sweep", "--no-ui", "--preset", write_preset(in_tmp, swept_backend, "b.toml")),
                      "the tcp backend leaves to you")


@pytest.mark.slow
def test_parallel_jobs_share_one_study(in_tmp):
    path = write_preset(in_tmp, SPACE.replace("n_trials = 3", "n_trials = 4"))
    result = invoke("sweep", "--no-ui", "--preset", path, "--jobs", "2")
    assert result.exit_code == 0, result.output
    sweep, stored = trials()
    assert sweep.storage.kind == "journal" and (sweep.sweep_dir / "journal.log").is_file()
    assert [t.number for t in stored] == [0, 1, 2, 3] and all(t.state == TrialState.COMPLETE for t in stored)
    assert {t.user_attrs["job"] for t in stored} == {0, 1}
    pids = {t.user_attrs["pid"] for t in stored}
    assert len(pids) == 2 and os.getpid() not in pids
    assert len({t.params["optim.lr"] for t in stored}) == 4  # the two jobs sample apart
    assert sum(1 for line in result.output.splitlines() if TRIAL_LINE.match(line)) == 4


def completed_rows(csv_path: Path) -> list[dict]:
    if not csv_path.is_file():
        return []
    with open(csv_path, newline="") as f:
        return [row for row in csv.DictReader(f) if row["state"] == "complete"]


@pytest.mark.slow
def test_a_sigkilled_sweep_loses_no_completed_trial_and_resumes(in_tmp):
    path = write_preset(in_tmp, SPACE.replace("n_trials = 3", "n_trials = 4"))
    presets.apply_overrides(doc := presets.read_document(path), ["train.steps=120"])
    presets.save_preset(doc, path)  # longer trials: the kill lands inside one
    command = [sys.executable, "-m", "nanodist_tui.cli", "sweep", "--no-ui", "--preset", str(path)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    csv_path = Path("runs/sweep-cli/trials.csv")
    deadline = time.monotonic() + 120
    while len(completed_rows(csv_path)) < 2 and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)

    def running() -> bool:  # a trial the study records as started, not finished: the kill lands inside it
        return any(t.state == TrialState.RUNNING for t in trials()[1])
    while not running() and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(child.pid, signal.SIGKILL)
    assert child.wait(timeout=30) == -signal.SIGKILL
    _, before = trials()
    done = {t.number: (t.params, t.values) for t in before if t.state == TrialState.COMPLETE}
    assert len(done) >= 2 and any(t.state == TrialState.RUNNING for t in before)  # killed mid-trial
    rerun = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    _, after = trials()
    assert [t.number for t in after] == list(range(4))  # every number once, going on from the last
    assert {t.number: (t.params, t.values) for t in after if t.number in done} == done
    killed = [t for t in after if t.number not in done and t.number < len(before)]
    assert killed and all(t.state == TrialState.FAIL and t.user_attrs["reason"].startswith("interrupted")
                          for t in killed)
    assert all(t.state == TrialState.COMPLETE for t in after if t.number >= len(before))
    assert f"resuming with {len(before)} already" in rerun.stdout


def test_log_to_makes_every_trial_log_there_with_its_own_losses(in_tmp):
    needs("tensorboard", "tensorboard", "the sweep logs to TensorBoard")
    import json

    from tests.sink_readers import tensorboard_scalars
    result = invoke("sweep", "--no-ui", "--preset", write_preset(in_tmp, SPACE), "--trials", "2",
                    "--log-to", "tensorboard")
    assert result.exit_code == 0, result.output
    _, stored = trials()
    assert len(stored) == 2
    for t in stored:  # each trial's TensorBoard losses are that trial's own recorded losses
        run_dir = in_tmp / t.user_attrs["run_dir"]
        lines = (run_dir / "events.jsonl").read_text().splitlines()
        losses = {e["step"]: e["loss"] for e in map(json.loads, lines) if e["kind"] == "step_end"}
        got = dict(tensorboard_scalars(run_dir / "tensorboard")["train/loss"])
        assert got and got == pytest.approx({s: losses[s] for s in got}, rel=1e-6)


@pytest.mark.slow
def test_a_signal_to_a_sweeps_process_group_stops_its_jobs_cleanly(in_tmp):
    """SIGTERM to the whole group (a scheduler's scancel), the launcher and both --jobs processes at once: the
    running trials stop as the launcher's own stop would stop them, no job process dies by the signal, and
    the sweep exits 128 + the signal with its completed trials kept."""
    path = write_preset(in_tmp, SPACE.replace("n_trials = 3", "n_trials = 6"))
    presets.apply_overrides(doc := presets.read_document(path), ["train.steps=200"])
    presets.save_preset(doc, path)  # long trials: the signal lands inside them
    command = [sys.executable, "-m", "nanodist_tui.cli", "sweep", "--no-ui", "--preset", str(path),
               "--jobs", "2"]
    child = subprocess.Popen(command, env={**os.environ, "PYTHONPATH": str(REPO)}, start_new_session=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    try:
        while child.poll() is None and time.monotonic() < deadline and not (
                sweep_written("cli") and any(t.state == TrialState.RUNNING for t in trials()[1])):
            time.sleep(0.1)
        time.sleep(1.0)  # inside the trials' training
        os.killpg(child.pid, signal.SIGTERM)
        out, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
    assert child.returncode == 128 + signal.SIGTERM, (out, err)
    assert "killed by signal" not in out + err and "Traceback" not in out + err
    _, stored = trials()
    assert stored and all(t.state != TrialState.RUNNING for t in stored)
