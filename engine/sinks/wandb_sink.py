"""A Weights & Biases run: online when this machine has a W&B API key, offline files otherwise.

Offline runs land in RUN_DIR/wandb/offline-run-*/ (`wandb sync RUN_DIR/wandb/offline-run-*` uploads one
later). Nothing here waits on a network it does not have: without a key the run is offline from the
start, and an online start gives up after INIT_TIMEOUT_S (the sink then reports once and stops). W&B's
console capture is off (the workbench owns the terminal) and so are its own messages. W&B's service
process and threads stay for the life of the process (W&B ends them at exit), so that a process running
several runs (a sweep) starts them once.

Steps go in as a `step` value beside each row, the x-axis of every chart (`define_metric`), because the
engine's events do not arrive in strict step order (a rank's memory figures follow its next step).
"""

from __future__ import annotations

import netrc
import os
from itertools import groupby
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from engine.sinks.scalars import Point

INIT_TIMEOUT_S = 20.0
STEP_KEY = "step"


def wandb_mode() -> str:
    """WANDB_MODE when set; else "online" with an API key (WANDB_API_KEY, or `wandb login`'s ~/.netrc
    entry for the W&B host), "offline" without one."""
    if mode := os.environ.get("WANDB_MODE"):
        return mode
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"
    try:
        return "online" if netrc.netrc().authenticators(host) else "offline"
    except (OSError, netrc.NetrcParseError):  # no ~/.netrc, or one we cannot read
        return "offline"


class WandbSink:
    name = "wandb"

    def __init__(self, run_dir: Path, log_cfg) -> None:
        self.run_dir = Path(run_dir)
        self.project = log_cfg.project
        self._run: Any = None

    def open(self, started) -> None:
        import wandb
        settings = wandb.Settings(mode=wandb_mode(), silent=True, console="off", init_timeout=INIT_TIMEOUT_S)
        # The process-wide settings too: W&B's own usage telemetry reads those, and offline means nothing
        # is sent anywhere.
        wandb.setup(settings=settings)
        self._run = wandb.init(project=self.project, name=started.run_id, dir=str(self.run_dir),
                               config=started.config, settings=settings, reinit="create_new")
        self._run.define_metric(STEP_KEY)
        self._run.define_metric("*", step_metric=STEP_KEY)

    def where(self) -> str:
        assert self._run is not None
        if self._run.settings.mode == "offline":
            folder = Path(self._run.dir).parent  # files/ sits inside the offline run's folder
            return f"offline run in {folder} (upload it with: wandb sync {folder})"
        return f"run {self._run.url or self._run.id}"

    def write(self, points: list[Point]) -> None:
        assert self._run is not None
        for step, group in groupby(points, key=lambda p: p.step):
            self._run.log({STEP_KEY: step} | {p.tag: p.value for p in group})

    def close(self, status: str) -> None:
        if self._run is not None:
            self._run.finish(exit_code=0 if status == "finished" else 1)


SINK = WandbSink
