"""Reading back what the sinks wrote, with each library's own reader.

TensorBoard: its event accumulator. MLflow: its tracking client. W&B: since wandb 0.2x the Python package
no longer ships a reader of the `.wandb` run files (its Go core reads them), so the records are taken
apart here: the file is a LevelDB-style log (a 7-byte ":W&B" header, then 32 KiB blocks of chunks with a
7-byte header: crc32c, length, type) whose records are W&B's own protocol buffers (wandb_internal_pb2).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

BLOCK = 32 * 1024
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def tensorboard_scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value)] from every event file in logdir, by TensorBoard's EventAccumulator."""
    from tensorboard.backend.event_processing import event_accumulator as ea
    acc = ea.EventAccumulator(str(logdir), size_guidance={ea.SCALARS: 0})  # 0: keep every point
    acc.Reload()
    return {tag: [(s.step, s.value) for s in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def wandb_records(path: Path) -> list:
    """Every record of a .wandb file, parsed with W&B's Record message."""
    from wandb.proto import wandb_internal_pb2
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path}: not a W&B run file"
    pos, pending, records = 7, b"", []
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:  # a block's tail too short for a chunk header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and length == 0:  # zero fill up to the end of the block
            pos += left
            continue
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def wandb_offline_run(run_dir: Path) -> dict:
    """The offline W&B run under run_dir/wandb: its name, project, config, history rows and exit code."""
    (folder,) = sorted((run_dir / "wandb").glob("offline-run-*"))
    (path,) = folder.glob("run-*.wandb")
    out: dict = {"history": [], "config": {}, "exit_code": None}
    for record in wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            out["name"], out["project"] = record.run.display_name, record.run.project
            out["config"] |= {i.key: json.loads(i.value_json) for i in record.run.config.update}
        elif kind == "history":
            out["history"].append({"/".join(i.nested_key) or i.key: json.loads(i.value_json)
                                   for i in record.history.item})
        elif kind == "exit":
            out["exit_code"] = record.exit.exit_code
    return out


def mlflow_run(tracking_uri: str, experiment: str):
    """(client, the one run of `experiment`) at tracking_uri, by MLflow's own client."""
    from mlflow.tracking import MlflowClient
    client = MlflowClient(tracking_uri=tracking_uri)
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no MLflow experiment {experiment!r} at {tracking_uri}"
    (run,) = client.search_runs([found.experiment_id])
    return client, run
