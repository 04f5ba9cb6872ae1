"""An MLflow run: metrics per step, the resolved config as parameters.

By default the run goes to a file store in RUN_DIR/mlruns (`mlflow ui --backend-store-uri RUN_DIR/mlruns`
browses it); `log.mlflow_uri` names any other tracking URI (a server, a sqlite database). MLflow 3 keeps
its file store in maintenance mode and refuses it unless MLFLOW_ALLOW_FILE_STORE is set: for our own
default store we set it (when the user has not), since a file store needs no database and starts in
milliseconds. The experiment is `log.project`.

The client is MlflowClient, not MLflow's fluent API: no process-global "active run", so several runs (a
sweep's trials, the tests) can log from one process.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from engine.sinks.scalars import Point

METRICS_PER_BATCH = 1000  # MLflow's limits for one log_batch call
PARAMS_PER_BATCH = 100
STATUS = {"finished": "FINISHED", "failed": "FAILED", "stopped": "KILLED"}


def _flat(d: dict, prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in d.items():
        if isinstance(value, dict):
            out |= _flat(value, f"{prefix}{key}.")
        else:
            out[prefix + key] = str(value)
    return out


class MlflowSink:
    name = "mlflow"

    def __init__(self, run_dir: Path, log_cfg) -> None:
        self.own_store = not log_cfg.mlflow_uri
        self.uri = (Path(run_dir).resolve() / "mlruns").as_uri() if self.own_store else log_cfg.mlflow_uri
        self.experiment = log_cfg.project
        self._client: Any = None
        self.run_id: str | None = None

    def open(self, started) -> None:
        if self.own_store:
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient
        client = MlflowClient(tracking_uri=self.uri)
        found = client.get_experiment_by_name(self.experiment)
        experiment_id = found.experiment_id if found else client.create_experiment(self.experiment)
        run = client.create_run(experiment_id, run_name=started.run_id,
                                tags={"nanodist.preset": started.preset, "nanodist.run_id": started.run_id})
        self._client, self.run_id = client, run.info.run_id
        params = [Param(k, v) for k, v in _flat(started.config).items()]
        for i in range(0, len(params), PARAMS_PER_BATCH):
            client.log_batch(self.run_id, params=params[i:i + PARAMS_PER_BATCH])

    def where(self) -> str:
        browse = f" (mlflow ui --backend-store-uri {self.uri})" if self.own_store else ""
        return f"run {self.run_id} of experiment {self.experiment!r} at {self.uri}{browse}"

    def write(self, points: list[Point]) -> None:
        from mlflow.entities import Metric
        assert self._client is not None and self.run_id is not None
        now_ms = int(time.time() * 1000)
        metrics = [Metric(p.tag, p.value, now_ms, p.step) for p in points]
        for i in range(0, len(metrics), METRICS_PER_BATCH):
            self._client.log_batch(self.run_id, metrics=metrics[i:i + METRICS_PER_BATCH])

    def close(self, status: str) -> None:
        if self._client is not None and self.run_id is not None:
            self._client.set_terminated(self.run_id, status=STATUS.get(status, "KILLED"))


SINK = MlflowSink
