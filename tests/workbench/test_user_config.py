"""The user config file: keymap and display settings, each mistake one line naming the file, the key and
the fix; through the CLI, exit code 2 before the workbench opens."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from nanodist_tui.bindings import BINDING_IDS
from nanodist_tui.cli import app as cli
from nanodist_tui.user_config import UserConfigError, config_path, load_user_config


def config_at(tmp_path, text: str) -> dict:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return {"NANODIST_CONFIG": str(path)}


def test_the_file_is_found_where_xdg_says(tmp_path):
    assert config_path({"XDG_CONFIG_HOME": str(tmp_path)}) == tmp_path / "nanodist" / "config.toml"
    assert config_path({"NANODIST_CONFIG": str(tmp_path / "x.toml")}) == tmp_path / "x.toml"


def test_no_file_is_an_empty_config_and_nanodist_ascii_turns_ascii_on(tmp_path):
    env = {"NANODIST_CONFIG": str(tmp_path / "absent.toml")}
    assert load_user_config(BINDING_IDS, env).keymap == {}
    assert not load_user_config(BINDING_IDS, env).ascii
    assert load_user_config(BINDING_IDS, env | {"NANODIST_ASCII": "1"}).ascii


def test_a_keymap_and_display_settings_are_read(tmp_path):
    env = config_at(tmp_path, '[keymap]\nstop = "x"\ntab-2 = "f2, 2"\n[display]\nascii = true\n')
    config = load_user_config(BINDING_IDS, env)
    assert config.keymap == {"stop": "x", "tab-2": "f2,2"} and config.ascii


@pytest.mark.parametrize("text, named", [
    ('[keymap]\nstopp = "x"\n', "keymap.stopp: no binding with this id; did you mean stop?"),
    ("[keymap]\nstop = 3\n", "keymap.stop: must be a key name in quotes"),
    ('[keymap]\nstop = "not a key"\n', "keymap.stop: 'not a key' is not a key name"),
    ('[display]\nascii = "yes"\n', "display.ascii: must be true or false"),
    ("[display]\ncolour = true\n", "display.colour: unknown setting"),
    ("[colours]\nx = 1\n", "colours: unknown table"),
    ("keymap = 3\n", "keymap: must be a table"),
    ("[keymap\n", "cannot read it"),
])
def test_every_mistake_is_one_line_naming_file_and_key(tmp_path, text, named):
    env = config_at(tmp_path, text)
    with pytest.raises(UserConfigError) as err:
        load_user_config(BINDING_IDS, env)
    message = str(err.value)
    assert named in message and message.startswith(env["NANODIST_CONFIG"]) and "\n" not in message


def test_a_bad_user_config_stops_the_workbench_before_it_opens(tmp_path, monkeypatch, in_tmp):
    monkeypatch.setenv("NANODIST_CONFIG", config_at(tmp_path, '[keymap]\nnope = "x"\n')["NANODIST_CONFIG"])
    result = CliRunner().invoke(cli, ["--set", "train.steps=1"])
    assert result.exit_code == 2
    (line,) = result.output.strip().splitlines()
    assert line.startswith(f"error: {tmp_path / 'config.toml'}: keymap.nope: no binding with this id")
    assert not list(in_tmp.glob("runs/*"))  # nothing started
