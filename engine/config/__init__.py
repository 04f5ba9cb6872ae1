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

from engine.config.parse import (
    CheckpointConfig,
    Config,
    ConfigError,
    DataConfig,
    EmulateConfig,
    LogConfig,
    MemoryConfig,
    ModelConfig,
    OptimConfig,
    ParallelConfig,
    PrecisionConfig,
    RunConfig,
    SearchParam,
    SweepConfig,
    TrainConfig,
    check_against_data,
    describe,
    field_type,
    from_dict,
    network_emulation,
    replace,
    setting_keys,
    split_key,
    to_dict,
    toml_repr,
)

__all__ = [
    "CheckpointConfig",
    "Config",
    "ConfigError",
    "DataConfig",
    "EmulateConfig",
    "LogConfig",
    "MemoryConfig",
    "ModelConfig",
    "OptimConfig",
    "ParallelConfig",
    "PrecisionConfig",
    "RunConfig",
    "SearchParam",
    "SweepConfig",
    "TrainConfig",
    "check_against_data",
    "describe",
    "field_type",
    "from_dict",
    "network_emulation",
    "replace",
    "setting_keys",
    "split_key",
    "to_dict",
    "toml_repr",
]
