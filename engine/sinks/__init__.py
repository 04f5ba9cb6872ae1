"""Telemetry sinks: the run's event stream written where people already look (TensorBoard, W&B, MLflow).

A sink is an event-bus subscriber beside the run recorder. Each one uses the real library, which comes
with an optional extra of the same name (`pip install 'nanodist[tensorboard]'`); the library is imported
inside the sink, when it opens, so a missing extra costs nothing until that sink is asked for.

    file                what
    scalars.py          events -> named scalars (one set of names for every sink)
    runner.py           SinkSet: the bus subscriber; each sink on its own thread, a failure reported once
    tensorboard_sink.py TensorBoard event files in RUN_DIR/tensorboard
    wandb_sink.py       a W&B run: online when an API key is set, offline files in RUN_DIR/wandb otherwise
    mlflow_sink.py      an MLflow run: a file store in RUN_DIR/mlruns unless log.mlflow_uri names another

The sink interface (what SinkSet calls, all on the sink's own thread, never concurrently):

    name                       its name in `log.to` / `--log-to`
    open(started: RunStarted)  start the backend's run (its name, the resolved config)
    where() -> str             after open: where the run went and how to look at it, for the run's log
    write(points)              a batch of scalars.Point (tag, value, step), in arrival order
    close(status)              "finished" | "failed" | "stopped": end the backend's run, flush, let go
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

from engine.config.vocabulary import SINKS

# sink name -> (the module that must be importable, the extra that brings it, the sink's module here):
# each sink's library and its extra carry the sink's own name.
_SINKS: dict[str, tuple[str, str, str]] = {name: (name, name, f"engine.sinks.{name}_sink") for name in SINKS}


class SinkUnavailable(ValueError):
    """A sink was asked for but its library is not installed. str() is one line naming the extra."""


def install_hint(name: str) -> str:
    return f"pip install 'nanodist[{_SINKS[name][1]}]'"


def missing_library(name: str) -> str | None:
    """The one line saying which extra to install when sink `name`'s library is absent, else None."""
    module = _SINKS[name][0]
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken install, or a module set to None in sys.modules
        found = False
    if found:
        return None
    return (f'log.to: the "{name}" sink needs the {module} package, which is not installed; '
            f"{install_hint(name)}, or leave {name} out of log.to / --log-to")


def check_available(names) -> None:
    """Raise SinkUnavailable (one line naming the extra) for the first sink whose library is missing."""
    for name in names:
        if problem := missing_library(name):
            raise SinkUnavailable(problem)


def make_sink(name: str, run_dir: Path, log_cfg):
    """A new, unopened sink writing for the run in `run_dir`; SinkUnavailable if its library is missing."""
    check_available([name])
    module = importlib.import_module(_SINKS[name][2])
    return module.SINK(run_dir, log_cfg)
