"""`serve` and `--log-to` mistakes a user can make: each is one line on stderr and exit code 2, before any
server starts or any rank trains."""

from __future__ import annotations

import socket
import sys

import pytest
from typer.testing import CliRunner

from nanodist_tui.cli import app
from tests.run_helpers import gpt_and_mlp_runs

runner = CliRunner()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return gpt_and_mlp_runs(tmp_path_factory.mktemp("runs"))


def assert_one_line(args, named: str) -> None:
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and named in lines[0], result.output
    assert "Traceback" not in result.output


def test_serve_refuses_what_is_not_a_gpt_model(runs, in_tmp):
    pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install 'nanodist[serve]')")
    pytest.importorskip("uvicorn", reason="the serve extra is not installed (pip install 'nanodist[serve]')")
    (in_tmp / "junk.npz").write_bytes(b"not a zip file")
    assert_one_line(["serve", in_tmp / "junk.npz"], "junk.npz: not a nanoDist model file")
    assert_one_line(["serve", in_tmp / "nowhere"], "no such run folder")
    assert_one_line(["serve", runs["mlp"]], "serve needs a GPT run")
    assert_one_line(["serve", runs["gpt"], "--step", "3"], "step 3")


def test_serve_on_a_port_in_use_is_one_line(runs):
    pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install 'nanodist[serve]')")
    pytest.importorskip("uvicorn", reason="the serve extra is not installed (pip install 'nanodist[serve]')")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert_one_line(["serve", runs["gpt"], "--port", port], f"--port {port}: cannot listen there")


@pytest.mark.parametrize("args, named", [
    (["--port", "70000"], "--port"), (["--port", "-1"], "--port"), (["--max-tokens", "0"], "--max-tokens"),
    (["--max-prompt", "0"], "--max-prompt"), (["--max-generations", "0"], "--max-generations")])
def test_serve_options_out_of_range(runs, args, named):
    result = runner.invoke(app, ["serve", str(runs["gpt"]), *args])
    assert result.exit_code == 2 and named in result.output and "Traceback" not in result.output


def test_serve_without_its_extra_names_the_extra(runs, monkeypatch):
    monkeypatch.setitem(sys.modules, "fastapi", None)
    monkeypatch.setitem(sys.modules, "uvicorn", None)
    assert_one_line(["serve", runs["gpt"]], "serve needs fastapi and uvicorn, which are not installed; pip "
                                            "install 'nanodist[serve]'")


@pytest.mark.parametrize("args, named", [
    (["--seed", "-1"], "--seed"), (["--top-k", "-2"], "--top-k")])
def test_sample_options_out_of_range(runs, args, named):
    result = runner.invoke(app, ["sample", str(runs["gpt"]), *args])
    assert result.exit_code == 2 and named in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("command", [["run"], ["--no-ui"]])
@pytest.mark.parametrize("log_to, named", [
    ("tensorbord", '"tensorbord" is not allowed'), ("wandb,wandb", '"wandb" is named twice'),
    ("tensorboard,,x", '"x" is not allowed')])
def test_log_to_mistakes(command, log_to, named, in_tmp):
    assert_one_line([*command, "--log-to", log_to], f"--log-to: {named}")
    assert not (in_tmp / "runs").exists()


def test_a_preset_log_table_mistake_names_the_file_and_key(in_tmp):
    bad = in_tmp / "bad.toml"
    bad.write_text('name = "bad"\n[log]\nto = ["tensorboard", "neptune"]\n')
    assert_one_line(["run", "--preset", bad], f'{bad}:3: log.to: "neptune" is not allowed')


def test_replay_to_an_unknown_sink(runs):
    assert_one_line(["replay", runs["gpt"], "--to", "csv", "--no-ui"], '--to: "csv" is not allowed')
