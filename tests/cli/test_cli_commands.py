"""Every subcommand through typer's test runner: presets, runs, replay, resume, export, sample — the main
path and the user mistakes (exit code 2, one line, no traceback)."""
from __future__ import annotations

import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

from engine import nn
from engine.checkpoint.export import load_model, params_from_checkpoint
from engine.checkpoint.sharded import find_checkpoint
from engine.config import presets
from engine.events import StepEnd
from engine.trainer import Trainer
from nanodist_tui.replay import replay_events
from tests.cli_helpers import assert_user_error, invoke
from tests.run_helpers import gpt_and_mlp_runs, train


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A finished tiny GPT run (checkpoints at steps 2, 4, 6) and a finished tiny MLP run, in one folder."""
    return gpt_and_mlp_runs(tmp_path_factory.mktemp("runs"))


@pytest.fixture(autouse=True)
def _run_in_tmp(in_tmp):
    """Every test here runs in a fresh folder with only the shipped presets."""


@pytest.fixture
def gpt_copy(runs, tmp_path):
    """A copy of the GPT run, so a resume's new run folder lands beside it in tmp_path."""
    return shutil.copytree(runs["gpt"], tmp_path / "runs" / "copy")


COMMANDS = [[], ["run"], ["memory"], ["presets"], ["presets", "list"], ["presets", "show"],
            ["presets", "new"], ["presets", "diff"], ["runs"], ["replay"], ["compare"], ["screenshot"],
            ["resume"], ["export"], ["sample"],
            ["bench"], ["bench", "step"], ["bench", "allreduce"], ["bench", "alltoall"],
            ["bench", "techniques"], ["sweep"], ["sweep", "show"], ["sweep", "export-best"]]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "main")
def test_every_command_has_help(command):
    result = invoke(*command, "--help")
    assert result.exit_code == 0, result.output
    assert "Usage" in result.output


BAD_PRESETS = sorted((Path(__file__).parents[1] / "bad_presets").glob("*.toml"))


@pytest.mark.parametrize("path", BAD_PRESETS, ids=lambda p: p.stem)
def test_every_bad_preset_is_one_line_and_exit_code_2(path):
    """Through the real command line: result.output mixes stderr into stdout (Click >= 8.2), so the one
    line is everything the user sees."""
    expected = path.read_text().splitlines()[0].removeprefix("# expect: ")
    result = invoke("--no-ui", "--preset", path)
    assert_user_error(result, expected)
    assert str(path) in result.output


def test_there_are_bad_presets_to_run():
    assert len(BAD_PRESETS) >= 20


# ----------------------------------------------------------------------------- presets

def test_presets_list_and_show():
    listed = invoke("presets", "list")
    assert listed.exit_code == 0
    assert any(line.startswith("quickstart ") and "repo" in line for line in listed.output.splitlines())
    shown = invoke("presets", "show", "quickstart")
    assert shown.exit_code == 0
    assert shown.output == presets.find_preset("quickstart").read_text(encoding="utf-8")


def test_presets_show_resolved_fills_in_defaults(in_tmp):
    (in_tmp / "tiny.toml").write_text('name = "tiny"  # mine\n[train]\nsteps = 5\n')
    shown = invoke("presets", "show", "tiny.toml", "--resolved")
    assert shown.exit_code == 0, shown.output
    assert 'name = "tiny"  # mine' in shown.output and "steps = 5" in shown.output
    assert "# default" in shown.output and "[optim]" in shown.output


def test_presets_new_keeps_every_comment_and_changes_two_lines(in_tmp):
    made = invoke("presets", "new", "mine", "--from", "quickstart", "--set", "optim.lr=1e-3")
    assert made.exit_code == 0, made.output
    new = (in_tmp / "presets" / "mine.toml").read_text().splitlines()
    old = presets.find_preset("quickstart").read_text().splitlines()
    changed = [(a, b) for a, b in zip(old, new) if a != b]
    assert len(new) == len(old) and len(changed) == 2
    name_comment = changed[0][0].split("#", 1)[1]
    assert changed[0][1].startswith('name = "mine"') and changed[0][1].endswith(name_comment)
    assert changed[1][1].startswith("lr = 1e-3 ") and "# peak learning rate" in changed[1][1]
    listed = invoke("presets", "list").output.splitlines()
    assert any(line.startswith("mine ") and " cwd " in line for line in listed)
    assert_user_error(invoke("presets", "new", "mine", "--from", "quickstart"), "exists")
    again = invoke("presets", "new", "mine", "--from", "mine", "--force", "--set", "train.steps=7")
    assert again.exit_code == 0, again.output
    assert "steps = 7 " in (in_tmp / "presets" / "mine.toml").read_text()


def test_presets_diff():
    result = invoke("presets", "diff", "quickstart", "gpt-mini")
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if line.startswith("model.n_layer "))
    assert row.split() == ["model.n_layer", "2", "4"]
    assert "same settings" in invoke("presets", "diff", "quickstart", "quickstart").output


@pytest.mark.parametrize("args, named", [
    (["presets", "show", "quickstrat"], "did you mean quickstart"),
    (["presets", "show", "missing/file.toml"], "missing/file.toml"),
    (["presets", "new", "bad name!", "--from", "quickstart"], "bad name!"),
    (["presets", "new", "x", "--from", "nope"], "nope"),
    (["presets", "new", "x", "--from", "quickstart", "--set", "optim.lrr=1"], "optim.lrr"),
    (["presets", "new", "x", "--from", "quickstart", "--set", "train.steps=many"], "train.steps"),
    (["presets", "diff", "quickstart", "nope"], "nope"),
])
def test_presets_user_errors(args, named):
    assert_user_error(invoke(*args), named)


# ----------------------------------------------------------------------------- runs and replay

def test_runs_lists_runs_with_key_figures(runs):
    result = invoke("runs", "--out-dir", runs["out"])
    assert result.exit_code == 0, result.output
    header, *rows = result.output.splitlines()
    assert header.split()[:3] == ["RUN", "STATUS", "STEPS"]
    gpt = next(r for r in rows if r.startswith(runs["gpt"].rsplit("/", 1)[1]))
    assert "finished" in gpt and "6/6" in gpt and gpt.endswith("step 6")
    assert len(rows) == 2


def test_runs_errors(in_tmp):
    assert_user_error(invoke("runs"), "runs")
    (in_tmp / "runs").mkdir()
    assert "no runs" in invoke("runs").output


def test_replay_headless_prints_the_recorded_run(runs):
    result = invoke("replay", runs["gpt"], "--no-ui")
    assert result.exit_code == 0, result.output
    assert "step 6: val loss " in result.output and "step 6: checkpoint saved to " in result.output
    assert result.output.rstrip().splitlines()[-1].startswith("replayed ")


def test_replay_opens_the_recorded_run_in_the_workbench(runs, workbench):
    result = invoke("replay", runs["gpt"], "--speed", "0")
    assert result.exit_code == 0, result.output
    assert workbench["replay"] and workbench["state"] == "finished"
    assert "6/6" in workbench["header"]


def test_replay_errors(runs, tmp_path):
    assert_user_error(invoke("replay", tmp_path / "nowhere", "--no-ui"), "nowhere")
    broken = shutil.copytree(runs["gpt"], tmp_path / "broken")
    lines = (broken / "events.jsonl").read_text().splitlines()
    (broken / "events.jsonl").write_text("\n".join([lines[0], '{"kind": "bogus"}', *lines[1:]]) + "\n")
    assert_user_error(invoke("replay", broken, "--no-ui"), "bogus")


def test_replay_paces_steps_and_stops_when_asked():
    steps = [StepEnd(step=i, loss=1.0, lr=0.1, tokens=8, step_time_s=0.05, tokens_per_s=1.0, grad_norm=1.0)
             for i in range(1, 5)]
    got, stop = [], threading.Event()
    replay_events(steps, got.append, stop, speed=0)
    assert got == steps
    got.clear()

    def emit(event):
        got.append(event)
        stop.set()
    replay_events(steps, emit, stop, speed=1.0)
    assert got == steps[:1]


# ----------------------------------------------------------------------------- resume

def test_resume_headless_continues_in_a_new_run_folder(gpt_copy):
    result = invoke("resume", gpt_copy, "--no-ui", "--set", "train.steps=8", "--step", "4")
    assert result.exit_code == 0, result.output
    assert "resuming from" in result.output and "step-000004" in result.output
    new = [p for p in gpt_copy.parent.iterdir() if p != gpt_copy]
    assert len(new) == 1 and find_checkpoint(new[0]).step == 8
    assert "resumed at step 4" in (new[0] / "events.jsonl").read_text()


def test_resume_in_the_workbench(gpt_copy, workbench):
    result = invoke("resume", gpt_copy, "--set", "train.steps=8")
    assert result.exit_code == 0, result.output
    assert not workbench["replay"] and workbench["state"] == "finished"
    assert "8/8" in workbench["header"]
    # Once the workbench closes, the shell shows the run folder and the summary.
    new = next(p for p in gpt_copy.parent.iterdir() if p != gpt_copy)
    assert f"run folder     {new}" in result.output and "steps          8 of 8" in result.output


@pytest.mark.parametrize("extra, named", [
    (["--set", "model.n_embd=48"], "different model"),
    (["--set", "optim.lrr=1"], "optim.lrr"),
    (["--world-size", "3"], "world_size"),
    (["--step", "5"], "no finished checkpoint for step 5"),
    (["--set", "train.steps=3"], "train.steps=6"),
])
def test_resume_user_errors(gpt_copy, extra, named):
    assert_user_error(invoke("resume", gpt_copy, "--no-ui", *extra), named)


def test_resume_refuses_missing_runs_and_runs_without_checkpoints(gpt_copy, tmp_path):
    assert_user_error(invoke("resume", tmp_path / "nowhere", "--no-ui"), "no such run folder")
    shutil.rmtree(gpt_copy / "checkpoints")
    assert_user_error(invoke("resume", gpt_copy, "--no-ui"), "no finished checkpoint")


def test_resume_refuses_a_corrupted_checkpoint(gpt_copy):
    shard = gpt_copy / "checkpoints" / "step-000006" / "rank-00000.npz"
    data = bytearray(shard.read_bytes())
    data[-200] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert_user_error(invoke("resume", gpt_copy, "--no-ui"), "corrupted")


# ----------------------------------------------------------------------------- export and sample

def test_export_writes_a_model_the_engine_loads(runs, in_tmp):
    result = invoke("export", runs["gpt"], "-o", "model.npz")
    assert result.exit_code == 0, result.output
    model = load_model(in_tmp / "model.npz")
    assert isinstance(model, nn.GPT) and not model.training
    expected = params_from_checkpoint(find_checkpoint(runs["gpt"]))
    for name, p in model.named_parameters():
        assert p.data.dtype == np.float32 and np.array_equal(p.data, expected[name]), name
    with np.load(in_tmp / "model.npz", allow_pickle=False) as npz:  # no pickle needed to read it
        assert "__meta__" in npz.files


@pytest.mark.parametrize("world, stage", [(1, 0), (2, 1), (2, 2)])
def test_export_holds_the_parameters_training_ended_with(in_tmp, monkeypatch, world, stage):
    """The exported file against the trainer's LIVE parameters at the end of training (every rank's model),
    not against the export module's own consolidation: a checkpoint that saved stale or misplaced shards,
    or an export that consolidates them wrongly, cannot agree with what the ranks really trained."""
    live: dict[int, dict[str, np.ndarray]] = {}
    fit = Trainer.fit

    def fit_and_keep(self, *args, **kwargs):
        out = fit(self, *args, **kwargs)
        live[self.rank] = {name: p.data.copy() for name, p in self.model.named_parameters()}
        return out
    monkeypatch.setattr(Trainer, "fit", fit_and_keep)
    summary, _ = train(in_tmp / "runs", f"parallel.world_size={world}", f"parallel.zero_stage={stage}",
                       "train.steps=5", "checkpoint.every=2")  # the last checkpoint is the one at_end writes
    assert sorted(live) == list(range(world)) and summary["steps"] == 5
    result = invoke("export", summary["run_dir"], "-o", "model.npz")
    assert result.exit_code == 0, result.output
    with np.load(in_tmp / "model.npz", allow_pickle=False) as npz:
        exported = {k: npz[k] for k in npz.files if k != "__meta__"}
    assert set(exported) == set(live[0])
    for rank in range(world):
        for name, value in live[rank].items():
            assert value.dtype == np.float32 and exported[name].dtype == np.float32
            np.testing.assert_array_equal(exported[name], value, err_msg=f"rank {rank} {name}")
    for name, p in load_model(in_tmp / "model.npz").named_parameters():
        np.testing.assert_array_equal(p.data, live[0][name], err_msg=name)


def test_export_errors(runs, tmp_path):
    assert_user_error(invoke("export", tmp_path / "nowhere"), "nowhere")
    assert_user_error(invoke("export", runs["gpt"], "--step", "3"), "step 3")


def test_sample_continues_the_prompt_deterministically(runs, in_tmp):
    first = invoke("sample", runs["gpt"], "--prompt", "def ", "--tokens", "30", "--seed", "3")
    assert first.exit_code == 0, first.output
    text = first.output.rstrip("\n")
    assert text.startswith("def ") and len(text) == 34
    same_seed = invoke("sample", runs["gpt"], "--prompt", "def ", "--tokens", "30", "--seed", "3")
    assert same_seed.output == first.output
    invoke("export", runs["gpt"], "-o", "model.npz")
    from_file = invoke("sample", "model.npz", "--prompt", "def ", "--tokens", "30", "--seed", "3")
    assert from_file.output == first.output
    greedy = invoke("sample", runs["gpt"], "--prompt", "import", "--tokens", "10", "--temperature", "0")
    assert greedy.exit_code == 0 and greedy.output.startswith("import")


def test_sample_errors(runs, in_tmp):
    assert_user_error(invoke("sample", runs["gpt"], "--prompt", "caf\u00e9 \u20ac"), "never saw")
    assert_user_error(invoke("sample", runs["mlp"], "--prompt", "x"), "MLP")
    assert_user_error(invoke("sample", in_tmp / "nowhere", "--prompt", "x"), "nowhere")
    (in_tmp / "junk.npz").write_bytes(b"not a zip file")
    assert_user_error(invoke("sample", "junk.npz", "--prompt", "x"), "junk.npz")
