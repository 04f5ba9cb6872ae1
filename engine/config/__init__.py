"""Configuration: what a run is, checked before anything starts.

    file            what
    schema.py       every section and setting as frozen dataclasses, each with its default and doc
    rules.py        what a valid value is, the rules across settings, the wording of the messages
    vocabulary.py   the allowed values config owns: sweep metrics, samplers, pruners; telemetry sinks
    parse.py        a plain dict (a preset plus --set overrides) -> a validated Config, and back
    presets.py      finding, loading, editing and saving TOML presets without losing their comments
    build.py        a Config -> the dataset and the model a rank trains

The package re-exports parse.py's names, so `from engine.config import Config, from_dict` reads as
one module.
"""

from engine.config import parse
from engine.config.parse import *  # noqa: F403 - the names parse.__all__ lists, written once there

__all__ = parse.__all__
