"""The command line through typer's test runner: the headless run, and user mistakes."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from nanodist_tui.cli import app

runner = CliRunner()
FAST = ["--set", "train.steps=12", "--set", "optim.warmup_steps=2", "--set", "train.eval_every=6",
        "--set", "data.max_chars=60000"]


@pytest.fixture(autouse=True)
def _run_in_tmp(in_tmp):
    """Every test here runs in a fresh folder with only the shipped presets."""


def test_headless_run_writes_the_run_folder_and_learns(in_tmp):
    result = runner.invoke(app, ["--no-ui", "--preset", "quickstart", *FAST])
    assert result.exit_code == 0, result.output
    assert "val loss" in result.output
    (run_dir,) = (in_tmp / "runs").iterdir()
    for name in ("config.toml", "events.jsonl", "summary.json", "metrics.csv"):
        assert (run_dir / name).is_file(), name
    kinds = [json.loads(line)["kind"] for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert kinds[0] == "run_started" and kinds[-1] == "run_finished"
    assert kinds.count("step_end") == 12
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["final_val_loss"] < summary["initial_val_loss"]


def test_run_subcommand_is_the_headless_run(in_tmp):
    result = runner.invoke(app, ["run", "--preset", "mlp", "--set", "train.steps=3",
                                 "--set", "optim.warmup_steps=0", "--set", "data.n_samples=1024",
                                 "--set", "train.eval_every=0"])
    assert result.exit_code == 0, result.output
    assert "steps          3" in result.output


BAD_INPUT = [
    (["--preset", "no-such-preset"], "no-such-preset"),
    (["--preset", "missing/file.toml"], "missing/file.toml"),
    (["--set", "optim.lrr=1e-3"], "optim.lrr"),
    (["--set", "optim.lr=fast"], "optim.lr"),
    (["--set", "train.steps=1.5"], "train.steps"),
    (["--set", "nonsense"], "nonsense"),
    (["--set", 'data.kind="text"', "--set", 'data.path="nowhere.txt"'], "nowhere.txt"),
    (["--set", "model.vocab_size=50"], "model.vocab_size"),  # the corpus has more characters
]


@pytest.mark.parametrize("args, named", BAD_INPUT)
def test_bad_input_is_one_line_and_exit_code_2(args, named):
    result = runner.invoke(app, ["--no-ui", *args])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert named in lines[0]
    assert "Traceback" not in result.output


def test_malformed_preset_file(in_tmp):
    bad = in_tmp / "bad.toml"
    bad.write_text("[model\nn_layer = 2\n")
    result = runner.invoke(app, ["--no-ui", "--preset", str(bad)])
    assert result.exit_code == 2
    assert "bad.toml" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("args, named", [
    (["--backend", "tcp", "--world-size", "2"], "RANK"),
    (["--backend", "mpi", "--world-size", "2"], "mpiexec"),
])
def test_a_backend_that_cannot_start_here_is_a_user_error(args, named, monkeypatch, in_tmp):
    for name in ("RANK", "WORLD_SIZE", "MASTER_PORT", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"):
        monkeypatch.delenv(name, raising=False)
    result = runner.invoke(app, ["--no-ui", *args])
    assert result.exit_code == 2 and named in result.output
    assert not (in_tmp / "runs").exists() or not any((in_tmp / "runs").iterdir())


def test_an_unwritable_out_dir_is_a_user_error(in_tmp):
    (in_tmp / "afile").write_text("")
    result = runner.invoke(app, ["--no-ui", "--set", 'run.out_dir="afile/runs"'])
    assert result.exit_code == 2 and "run.out_dir" in result.output
