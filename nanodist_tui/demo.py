"""The demo recording: a short 4-rank fp16 run kept in the package (demo/events.jsonl), so the workbench can
be shown — by `nanodist-tui screenshot`, the README's picture, the tests' snapshots — without training first.

`python -m nanodist_tui.demo` (or `just demo-recording`) trains it again on the threads backend and keeps
every step, evaluation and discrete event, and the per-rank figures (stats, memory, traffic) of every 5th
step.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

DEMO_DIR = Path(__file__).parent / "demo"
DEMO_PRESET = "quickstart"
# 4 ranks, ZeRO-2, fp16 with a high first scale (a few overflows early), small buckets (several per step)
DEMO_SETTINGS = ["parallel.world_size=4", "parallel.zero_stage=2", "precision.dtype=fp16",
                 "precision.init_scale=16777216.0", "parallel.bucket_cap_mb=0.1", "train.steps=60",
                 "train.eval_every=20", "optim.warmup_steps=5", "checkpoint.every=0"]
KEEP_EVERY = 5
CONTINUOUS = ("rank_stats", "memory_snapshot", "traffic")


def thin(events: list[dict], total_steps: int) -> list[dict]:
    """Every event, except the per-rank figures of steps not a multiple of KEEP_EVERY (nor the last)."""
    return [e for e in events
            if e["kind"] not in CONTINUOUS or e["step"] % KEEP_EVERY == 0 or e["step"] == total_steps]


def record_demo(folder: Path = DEMO_DIR) -> Path:
    from engine.config.presets import load_preset
    from engine.run.atomic_file import atomic_write_text
    from engine.run.job import run_training
    with tempfile.TemporaryDirectory() as tmp:
        cfg, doc, _ = load_preset(DEMO_PRESET, [*DEMO_SETTINGS, f"run.out_dir={tmp}"])
        summary = run_training(cfg, preset_doc=doc)
        lines = Path(summary["run_dir"], "events.jsonl").read_text(encoding="utf-8").splitlines()
    events = [json.loads(line) for line in lines if line.strip()]
    for e in events:  # where the recording was made is of no use to anyone
        if e["kind"] in ("run_started", "run_finished"):
            e["run_dir"] = ""
        if e["kind"] == "checkpoint_saved":
            e["path"] = "checkpoints/" + Path(e["path"]).name
    kept = thin(events, cfg.train.steps)
    target = folder / "events.jsonl"
    atomic_write_text(target, "".join(json.dumps(e) + "\n" for e in kept))
    return target


if __name__ == "__main__":
    print(f"wrote {record_demo()}")
