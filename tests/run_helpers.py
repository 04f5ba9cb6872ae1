"""Tiny recorded training runs for the checkpoint, resume and CLI tests, and what to read back from them."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.checkpoint.files import checkpoint_dirs
from engine.checkpoint.sharded import find_checkpoint
from engine.comm.base import RankFailure
from engine.config import presets
from engine.run.job import resume_training, run_training
from engine.trainer import Trainer

# about 16k parameters, a 20k-character corpus, one eval batch, one rank (thread ranks, when a test asks for
# more: quickstart itself trains on processes): a run takes well under a second
TINY = ["parallel.world_size=1", "parallel.backend=threads", "data.max_chars=20000", "model.n_layer=1",
        "model.n_embd=32", "model.n_head=2", "model.block_size=16", "train.global_batch=8",
        "train.eval_batches=1", "train.eval_every=0", "optim.warmup_steps=0", "train.steps=6",
        "checkpoint.every=2", "checkpoint.keep=10"]


def tiny_config(out_dir: Path, *sets: str, preset: str = "quickstart"):
    """(Config, document) of a tiny run recorded under out_dir; later sets win."""
    cfg, doc, _ = presets.load_preset(preset, [*TINY, f"run.out_dir={out_dir}", *sets])
    return cfg, doc


def train(out_dir: Path, *sets: str) -> tuple[dict, list]:
    """Run a tiny config to the end; (summary, events)."""
    cfg, doc = tiny_config(out_dir, *sets)
    events: list = []
    summary = run_training(cfg, on_event=events.append, preset_doc=doc)
    return summary, events


def crashed_run(out_dir: Path, monkeypatch: pytest.MonkeyPatch, *sets: str) -> Path:
    """A tiny run that dies of a power cut in step 3, after its step-2 checkpoint; its run folder."""
    real_step = Trainer.train_step

    def crash_in_step_3(self):
        if self.step == 2:
            raise RuntimeError("power cut")
        return real_step(self)

    cfg, doc = tiny_config(out_dir, *sets)
    with monkeypatch.context() as patch, pytest.raises(RankFailure, match="power cut"):
        patch.setattr(Trainer, "train_step", crash_in_step_3)
        run_training(cfg, preset_doc=doc)
    crashed = only_run(out_dir)
    assert [s for s, _ in checkpoint_dirs(crashed / "checkpoints")] == [2]
    return crashed


def gpt_and_mlp_runs(out_dir: Path) -> dict:
    """A finished tiny GPT run (checkpoints at steps 2, 4, 6) and a finished tiny MLP run, in out_dir."""
    gpt, _ = train(out_dir)
    cfg, doc, _ = presets.load_preset("mlp", ["train.steps=2", "data.n_samples=256", "train.global_batch=16",
                                              "model.widths=[16, 8, 4]", "train.eval_every=0",
                                              "train.eval_batches=1", "optim.warmup_steps=0",
                                              f"run.out_dir={out_dir}"])
    mlp = run_training(cfg, preset_doc=doc)
    return {"out": out_dir, "gpt": gpt["run_dir"], "mlp": mlp["run_dir"]}


def step_losses(events) -> dict[int, float]:
    return {e.step: e.loss for e in events if e.kind == "step_end"}


def only_run(out_dir: Path) -> Path:
    (run_dir,) = [p for p in Path(out_dir).iterdir() if p.is_dir()]
    return run_dir


def state_at(run_dir: Path, step: int | None = None) -> dict:
    """Consolidated fp32 master, m, v and optimizer step of a run's checkpoint (newest by default)."""
    return find_checkpoint(run_dir, step).consolidate()


def assert_same_state(a: dict, b: dict) -> None:
    assert a["step"] == b["step"]
    for key in ("master", "m", "v"):
        assert a[key].dtype == b[key].dtype and a[key].shape == b[key].shape, key
        assert a[key].tobytes() == b[key].tobytes(), f"{key} differs"


def assert_resumes_in(run_dir: Path, other: list[str], events: list, step: int = 4, until: int = 8) -> dict:
    """A run's checkpoint of `step` resumed in another layout (`other`: overrides): loading then saving at
    once gives back the saved bits, and training on to `until` takes the uninterrupted run's losses
    (`events`) within 1e-10 (a float64 run). Returns the first resume's summary."""
    same = resume_training(run_dir, [*other, f"train.steps={step}"], step=step)
    assert_same_state(state_at(same["run_dir"]), state_at(run_dir, step))
    resumed: list = []
    resume_training(run_dir, [*other, f"train.steps={until}"], step=step, on_event=resumed.append)
    expected = {s: v for s, v in step_losses(events).items() if s > step}
    got = step_losses(resumed)
    assert sorted(got) == sorted(expected)
    np.testing.assert_allclose([got[s] for s in sorted(expected)], [expected[s] for s in sorted(expected)],
                               rtol=1e-10)
    return same
