"""The user's own workbench settings: $NANODIST_CONFIG, else $XDG_CONFIG_HOME/nanodist/config.toml
(default ~/.config/nanodist/config.toml). Optional; every mistake in it is one line naming the file, the key
and the fix.

    [keymap]          # binding id = key(s); the help screen (?) lists every id and its key
    stop = "x"
    pane-2 = "f2,2"   # several keys, comma-separated

    [display]
    ascii = true      # ASCII instead of braille and block characters (also: --ascii, NANODIST_ASCII=1)
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from engine import paths
from engine.config.wording import did_you_mean

# A Textual key name: a printable character, or names such as "f2", "ctrl+x", "question_mark", "shift+tab".
_KEY = re.compile(r"^(?:(?:ctrl|shift|alt|meta|super|hyper)\+)*(?:[a-z0-9_]+|[!-~])$")
DISPLAY_KEYS = {"ascii": bool}


class UserConfigError(ValueError):
    """A mistake in the user config file; str() is one line: file: key: problem; fix."""


@dataclass(frozen=True)
class UserConfig:
    keymap: dict[str, str] = field(default_factory=dict)
    ascii: bool = False
    path: Path | None = None


def config_path(environ=os.environ) -> Path:
    if environ.get("NANODIST_CONFIG"):
        return Path(environ["NANODIST_CONFIG"]).expanduser()
    base = environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base).expanduser() / "nanodist" / "config.toml"


def load_user_config(binding_ids: Iterable[str], environ=os.environ) -> UserConfig:
    """Read and check the user config (an absent file is an empty one); UserConfigError on any mistake."""
    path = config_path(environ)
    ascii_env = environ.get("NANODIST_ASCII", "") not in ("", "0")
    try:
        if not paths.check_name(path).exists():
            return UserConfig(ascii=ascii_env)
        data = tomllib.loads(paths.read_small(path).decode("utf-8"))
    except paths.PathError as exc:
        raise UserConfigError(str(exc)) from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UserConfigError(f"{path}: cannot read it ({' '.join(str(exc).split())}); fix the TOML or "
                              "remove the file") from None
    unknown = sorted(set(data) - {"keymap", "display"})
    if unknown:
        raise UserConfigError(f"{path}: {unknown[0]}: unknown table; "
                              f"{did_you_mean(unknown[0], ['keymap', 'display'])}")
    ids = list(binding_ids)
    keymap = _table(data, "keymap", 'id = "key" lines', path)
    for binding, keys in keymap.items():
        if binding not in ids:
            raise UserConfigError(f"{path}: keymap.{binding}: no binding with this id; "
                                  f"{did_you_mean(binding, ids)}")
        if not isinstance(keys, str) or not keys.strip():
            raise UserConfigError(f"{path}: keymap.{binding}: must be a key name in quotes, e.g. \"x\" or "
                                  "\"ctrl+x\" (several: \"x,f2\")")
        for key in keys.split(","):
            if not _KEY.match(key.strip()):
                raise UserConfigError(f"{path}: keymap.{binding}: {key.strip()!r} is not a key name; write "
                                      "e.g. \"x\", \"f2\", \"ctrl+x\" or \"question_mark\"")
    display = _table(data, "display", "ascii = true", path)
    for key, value in display.items():
        if key not in DISPLAY_KEYS:
            raise UserConfigError(f"{path}: display.{key}: unknown setting; "
                                  f"{did_you_mean(key, list(DISPLAY_KEYS))}")
        if not isinstance(value, DISPLAY_KEYS[key]):
            raise UserConfigError(f"{path}: display.{key}: must be true or false")
    return UserConfig(keymap={k: v.replace(" ", "") for k, v in keymap.items()},
                      ascii=bool(display.get("ascii", False)) or ascii_env, path=path)


def _table(data: dict, name: str, example: str, path: Path) -> dict:
    table = data.get(name, {})
    if not isinstance(table, dict):
        raise UserConfigError(f"{path}: {name}: must be a table; write [{name}] then {example}")
    return table
