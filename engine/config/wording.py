"""How the config's messages spell what they name: a value as TOML writes it, a close key for a misspelt one,
a field's allowed values. Shared by the rules (engine.config.rules and the per-axis rule modules) and the
parser, so each has one wording.
"""
from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

Problem = tuple[str, str]  # (problem, fix): a rule's verdict on one setting's value
KeyedProblem = tuple[str, str, str]  # (key, problem, fix): a problem across settings


def toml_repr(value: Any) -> str:
    """How a value is spelled in TOML, for messages."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_repr(v) for v in value) + "]"
    return repr(value)


def did_you_mean(key: str, candidates: list[str]) -> str:
    """Fix for an unknown dotted key: a close name in its section, the same name elsewhere, or a list."""
    section, _, last = key.rpartition(".")
    same = [c for c in candidates if c.rpartition(".")[0] == section]
    close = (difflib.get_close_matches(key, same, n=1, cutoff=0.75)
             or [c for c in candidates if c.rpartition(".")[2] == last]
             or difflib.get_close_matches(key, candidates, n=1, cutoff=0.6))
    if close:
        return f"did you mean {close[0]}?"
    return "valid keys here: " + ", ".join(c.rpartition(".")[2] for c in same) if same else "remove it"


def choices_doc(choices: Iterable[str]) -> str:
    """How a field's doc lists its allowed values: "a" | "b" | "c"."""
    return " | ".join(f'"{c}"' for c in choices)

