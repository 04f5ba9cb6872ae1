"""A recorded run is anyone's text: `replay --no-ui`, `runs`, `presets show`, the sweep printer and the error
lines write its control characters as visible escapes, never as bytes a terminal would obey."""

from __future__ import annotations

import io
import json

from rich.console import Console

from engine.events import SweepStarted, TrialFinished
from nanodist_tui.sweep_printer import SweepPrinter
from tests.cli_helpers import invoke
from tests.hostile_run import FOLDER_SHOWN, PAYLOAD, SHOWN, hostile_run_folder, unsafe


def shown(data: bytes) -> str:
    """What a command wrote, checked to be inert: UTF-8 with no control byte but the newline."""
    text = data.decode("utf-8")
    assert unsafe(text) == [], unsafe(text)
    return text


def test_replay_no_ui_shows_a_recorded_runs_text_escaped(tmp_path):
    run = hostile_run_folder(tmp_path)
    result = invoke("replay", run, "--no-ui")
    out, err = shown(result.stdout_bytes), shown(result.stderr_bytes)
    assert f"run {SHOWN} started: preset {SHOWN}," in out  # the run id and the preset
    assert f"; {SHOWN}\n" in out  # the network
    assert f"warning: {SHOWN}\n" in out  # a log message
    assert f"run failed: rank 1: {SHOWN}\n" in err  # the failure
    assert out.rstrip().splitlines()[-1].endswith(f"events from {tmp_path}/runs/{FOLDER_SHOWN}")


def test_runs_lists_a_recorded_runs_text_escaped(tmp_path):
    hostile_run_folder(tmp_path)
    result = invoke("runs", "--out-dir", tmp_path / "runs")
    assert result.exit_code == 0, result.output
    out = shown(result.stdout_bytes)
    row = out.splitlines()[1]
    assert row.startswith(f"{FOLDER_SHOWN}  {SHOWN}  ")  # the folder's name, then its summary's status
    assert r"  link]\r\nz @ step 7  " in row  # the parent folder's name (PAYLOAD's last part) and step


def test_an_error_line_quoting_a_recorded_value_is_escaped(tmp_path):
    run = hostile_run_folder(tmp_path)
    (run / "events.jsonl").write_text(json.dumps({"kind": PAYLOAD}) + "\n" + json.dumps({"kind": "x"}) + "\n")
    result = invoke("replay", run, "--no-ui")
    assert result.exit_code == 2
    err = shown(result.stderr_bytes)
    assert err.count("\n") == 1 and err.startswith("error: ") and SHOWN in err


def test_presets_show_keeps_a_files_lines_and_escapes_the_rest(tmp_path):
    preset = tmp_path / "handed.toml"
    # TOML refuses C0 controls and DEL even in a comment; a C1 CSI, bidi controls and a tab it admits
    preset.write_text('# \x9b2J\u202eevil\u2066\tx\nname = "handed"\n')
    result = invoke("presets", "show", preset)
    assert result.exit_code == 0, result.output
    assert shown(result.stdout_bytes) == '# \\x9b2J\\u202eevil\\u2066\\tx\nname = "handed"\n'


def test_the_sweep_printer_escapes_parameter_names_and_reasons():
    out = io.StringIO()
    printer = SweepPrinter(Console(file=out), live=False)
    printer(SweepStarted(study=PAYLOAD, sweep_dir="runs/sweep-x", storage="sqlite:///x.db",
                         metrics=["val_loss"], directions=["minimize"], n_trials=1, timeout_s=0.0, existing=0,
                         jobs=1))
    printer(TrialFinished(number=0, state="failed", metrics=["val_loss"], values=None, params={PAYLOAD: 0.5},
                          duration_s=1.0, steps=2, best=[], reason=PAYLOAD))
    text = shown(out.getvalue().encode())
    assert f"sweep {SHOWN} started" in text
    assert f"trial 0 failed: {SHOWN}; no trial complete yet; {SHOWN}=0.5; 2 steps" in text
