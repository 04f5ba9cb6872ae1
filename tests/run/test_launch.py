"""What the launcher does once per run before any rank starts: the memory estimate (made once, carried on
RunStarted, in no memory event) and the check of the config against its data (a mistake is one line, and
no rank starts)."""

from __future__ import annotations

import json
import sys

import pytest

from engine import events as ev
from engine.config import ConfigError, check_against_data
from engine.config.build import load_dataset
from engine.data import DataError
from engine.memory.estimator import estimate
from engine.run import job
from engine.run.job import run_training
from tests.run_helpers import only_run, tiny_config

MEASURED = {"kind", "step", "rank", "phase", "current", "peak"}  # all a memory event carries


def count_calls(monkeypatch, original) -> list:
    """Every engine module's name for `original` replaced by a wrapper that counts the calls: a rank that
    made the estimate (or checked the data) again would be counted, whichever module it went through."""
    calls: list = []

    def counted(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)

    for name, module in list(sys.modules.items()):
        if name.startswith("engine") and getattr(module, original.__name__, None) is original:
            monkeypatch.setattr(module, original.__name__, counted)
    return calls


def four_ranks(out_dir):
    return tiny_config(out_dir, "parallel.world_size=4", "train.global_batch=8", "train.steps=2",
                       "checkpoint.every=0")


def test_the_memory_estimate_is_made_once_per_run_and_carried_by_run_started(tmp_path, monkeypatch):
    cfg, doc = four_ranks(tmp_path)
    calls = count_calls(monkeypatch, estimate)
    seen: list = []
    run_training(cfg, on_event=seen.append, preset_doc=doc)
    assert len(calls) == 1  # 4 ranks, one estimate
    started = next(e for e in seen if isinstance(e, ev.RunStarted))
    assert started.memory_estimate == estimate(cfg, load_dataset(cfg).vocab_size).phases()
    lines = [json.loads(line) for line in (only_run(tmp_path) / "events.jsonl").read_text().splitlines()]
    memory = [d for d in lines if d["kind"] == "memory_snapshot"]
    assert len(memory) == 4 * 2 * 3  # ranks x steps x phases, each with what was measured and nothing else
    assert all(set(d) == MEASURED for d in memory)
    (recorded,) = [d for d in lines if d["kind"] == "run_started"]
    assert recorded["memory_estimate"] == started.memory_estimate


def test_the_data_is_checked_once_at_launch_not_by_every_rank(tmp_path, monkeypatch):
    cfg, doc = four_ranks(tmp_path)
    calls = count_calls(monkeypatch, check_against_data)
    run_training(cfg, preset_doc=doc)
    assert len(calls) == 1


@pytest.mark.parametrize("sets, error", [
    (["model.vocab_size=40"], ConfigError),  # the corpus has more distinct characters
    (["data.max_chars=400", "data.val_fraction=0.02"], DataError),  # validation data shorter than a context
], ids=["vocabulary", "context"])
def test_a_data_mistake_is_one_line_before_any_rank_starts(tmp_path, monkeypatch, sets, error):
    cfg, doc = tiny_config(tmp_path / "runs", "parallel.world_size=4", "train.global_batch=8", *sets)
    started: list = []
    monkeypatch.setattr(job, "run_ranks", lambda *args, **kwargs: started.append(args))
    with pytest.raises(error) as raised:
        run_training(cfg, preset_doc=doc)
    assert started == [] and not (tmp_path / "runs").exists()  # no rank, no run folder
    with pytest.raises(error) as reference:  # the words are the data check's own
        dataset = load_dataset(cfg)
        check_against_data(cfg, len(dataset.splits["train"]), len(dataset.splits["val"]), dataset.vocab_size)
    assert str(raised.value) == str(reference.value) and "\n" not in str(raised.value)


def test_the_stages_before_the_first_step_are_announced_once_each_in_order(tmp_path):
    """A display has something to say in the seconds before the first step: each stage, as it begins, once
    (rank 0 speaks for the ranks), and all of them before the first StepEnd."""
    cfg, doc = four_ranks(tmp_path)
    seen: list = []
    run_training(cfg, on_event=seen.append, preset_doc=doc)
    phases = [e.name for e in seen if isinstance(e, ev.Phase)]
    assert phases == ["starting ranks", "building the model", "compiling kernels", "first step"]
    first_step = next(i for i, e in enumerate(seen) if isinstance(e, ev.StepEnd))
    assert max(i for i, e in enumerate(seen) if isinstance(e, ev.Phase)) < first_step


def test_the_stages_are_not_recorded_a_record_starts_with_run_started(tmp_path):
    cfg, doc = four_ranks(tmp_path)
    run_training(cfg, preset_doc=doc)
    lines = (only_run(tmp_path) / "events.jsonl").read_text().splitlines()
    kinds = [json.loads(line)["kind"] for line in lines]
    assert kinds[0] == "run_started" and "phase" not in kinds
