"""Checkpoints of expert-parallel runs: each rank writes its experts' parameters and AdamW moments and its
part of the replicated parameters' as runs of the whole model's flat state, the manifest naming the global
experts each holds. A crash and resume continues bitwise (EP 2 over DP 4, top-2 under a capacity, dropout);
the checkpoint consolidates to the dense model's arrays whatever expert degree saved it, so a run resumes at
EP 1, 2 or 4, at another data-parallel degree, under ZeRO, and beside tensor and pipeline parallelism
(loading then saving gives back the saved bits; training on matches the uninterrupted run within 1e-10 in
float64 on threads); `export` writes the one-device model; damaged expert fields are one line each."""
from __future__ import annotations

import json

import numpy as np
import pytest

from engine.checkpoint.experts import expert_of, gather, offsets, runs
from engine.checkpoint.export import export_model, load_model
from engine.checkpoint.files import MANIFEST, CheckpointError, read_manifest, read_shard
from engine.checkpoint.sharded import find_checkpoint
from engine.run.job import resume_training
from tests.run_helpers import (
    assert_resumes_in,
    assert_same_state,
    crashed_run,
    only_run,
    state_at,
    step_losses,
    train,
)

MOE = ["model.n_layer=2", "model.n_experts=4", "model.top_k=2", "model.moe_every=1",
       "model.aux_loss_coef=0.01"]
EP2 = [*MOE, "parallel.world_size=4", "parallel.expert=2", "model.dropout=0.1", "model.capacity_factor=1.0"]
FP64 = [*MOE, "precision.dtype=fp64"]


def _layout(world: int, expert: int, *more: str) -> list[str]:
    return [f"parallel.world_size={world}", f"parallel.expert={expert}", *more]


def test_resume_after_a_crash_continues_bitwise_identically(tmp_path, monkeypatch):
    _, full = train(tmp_path / "a", *EP2)
    crashed = crashed_run(tmp_path / "b", monkeypatch, *EP2)
    ckpt = find_checkpoint(crashed)
    manifest = ckpt.manifest
    assert manifest["expert"] == 2
    # ranks 0 and 1 are EP group 0 (experts 0-1 and 2-3); ranks 2 and 3 hold the same state again
    assert [e["experts"] for e in manifest["shards"]] == [[0, 2], [2, 4], [0, 2], [2, 4]]
    assert [bool(e["ranges"]) for e in manifest["shards"]] == [True, True, False, False]
    where = offsets("gpt", manifest["layout"], 1)
    owner: dict = {}  # each parameter in one shard's runs: rank 0's (replicated, experts 0-1), rank 1's
    for entry in manifest["shards"]:
        for name, (start, size) in where.items():
            if any(a <= start and start + size <= b for a, b in entry["ranges"]):
                owner.setdefault(name, []).append(entry["rank"])
    assert all(owner[n] == [1 if (expert_of(n) or 0) >= 2 else 0] for n in where), owner
    arrays, meta = read_shard(ckpt.path / "rank-00001.npz")
    assert meta["experts"] == [2, 4] and sorted(arrays) == ["m", "master", "v"]
    assert arrays["m"].size == sum(b - a for a, b in meta["ranges"]) > 0

    resumed: list = []
    summary = resume_training(crashed, on_event=resumed.append)
    assert step_losses(resumed) == {s: v for s, v in step_losses(full).items() if s > 2}  # bitwise
    assert_same_state(state_at(summary["run_dir"]), state_at(only_run(tmp_path / "a")))


# The load-balancing loss and a capacity are taken over a rank's own tokens, so a run of another data-parallel
# degree trains another model; without them (dropless, coefficient 0) every layout trains the same one.
NO_AUX = "model.aux_loss_coef=0.0"


@pytest.mark.parametrize("saved, other", [
    (_layout(4, 2), _layout(4, 1)),                                       # EP 2 -> EP 1, the same ranks
    (_layout(4, 1), _layout(4, 4)),                                       # EP 1 -> EP 4
    (_layout(4, 4), _layout(4, 2)),                                       # EP 4 -> EP 2
    (_layout(4, 2, NO_AUX), _layout(1, 1)),                               # EP 2 -> one device
    (_layout(4, 2, NO_AUX), _layout(2, 2)),                               # the same EP, DP 4 -> DP 2
    (_layout(2, 2, NO_AUX), _layout(4, 1, "parallel.zero_stage=1")),      # EP 2 over DP 2 -> DP 4 ZeRO-1
    (_layout(4, 2, "parallel.zero_stage=1"), _layout(4, 1, "parallel.zero_stage=2")),  # saved by edp parts
    (_layout(4, 4, "parallel.zero_stage=1"), _layout(4, 2, "parallel.zero_stage=2")),  # loaded into them
    (_layout(4, 2, NO_AUX, "parallel.tensor=2"), _layout(1, 1, "parallel.tensor=1")),  # EP 2 x TP 2 -> one
    (_layout(4, 4, NO_AUX), _layout(4, 2, "parallel.tensor=2")),                  # EP 4 -> EP 2 x TP 2
    (_layout(4, 2, NO_AUX, "parallel.pipeline=2", "train.micro_batches=2"),       # EP 2 x PP 2 -> EP 4
     _layout(4, 4, "parallel.pipeline=1")),
    (_layout(4, 4, NO_AUX), _layout(4, 2, "parallel.pipeline=2", "train.micro_batches=2")),  # EP 4 -> x PP 2
    (_layout(4, 2, NO_AUX, "parallel.context=2"), _layout(1, 1, "parallel.context=1")),  # EP 2 x CP 2 -> one
    (_layout(4, 2, NO_AUX, "parallel.pipeline=2", "train.micro_batches=2", "parallel.chunks=2",  # interleaved
             'parallel.schedule="interleaved"', "model.n_layer=4"),
     _layout(4, 1, "parallel.pipeline=1", "parallel.chunks=1", 'parallel.schedule="1f1b"')),
], ids=["ep2-ep1", "ep1-ep4", "ep4-ep2", "ep2-one", "ep2-dp2", "dp2ep2-dp4zero1", "ep2zero1-ep1zero2",
        "ep4zero1-ep2zero2", "ep2tp2-one", "ep4-ep2tp2", "ep2pp2-ep4", "ep4-ep2pp2", "ep2cp2-one",
        "ep2pp2interleaved-ep1"])
def test_resume_at_another_expert_degree(tmp_path, saved, other):
    original, events = train(tmp_path / "a", *FP64, *saved, "train.steps=8", "checkpoint.every=4")
    same = assert_resumes_in(original["run_dir"], other, events)
    assert find_checkpoint(same["run_dir"]).manifest["expert"] == int(other[1].split("=")[1])


def test_a_ranks_parameters_are_runs_of_the_flat_state():
    """The runs a rank's flat buffer covers (a part of it too, as ZeRO owns) and gathering it back: the
    replicated parameters around an MoE layer's experts are two runs, experts 2-3 of two layers two more."""
    expert = "blocks.{}.mlp.experts.mlps.{}.layers.0.{}"
    layout = [{"name": "wte.weight", "shape": [3, 2]},
              *[{"name": expert.format(0, e, "weight"), "shape": [2, 2]} for e in range(4)],
              {"name": "blocks.1.ln_1.weight", "shape": [2]},
              *[{"name": expert.format(1, e, "bias"), "shape": [1]} for e in range(4)]]
    where = offsets("gpt", layout, 1)
    assert where["blocks.1.ln_1.weight"] == (22, 2) and where[expert.format(1, 3, "bias")] == (27, 1)
    flat = np.arange(28, dtype=np.float64)
    replicated = [("wte.weight", 6), ("blocks.1.ln_1.weight", 2)]
    held = [(expert.format(0, 2, "weight"), 4), (expert.format(0, 3, "weight"), 4),
            (expert.format(1, 2, "bias"), 1), (expert.format(1, 3, "bias"), 1)]
    assert runs(replicated, where, 0, 8) == [[0, 6], [22, 24]]
    assert runs(replicated, where, 5, 7) == [[5, 6], [22, 23]]  # a ZeRO part across the two
    assert runs(held, where, 0, 10) == [[14, 22], [26, 28]]
    assert gather(flat, held, where).tolist() == [*range(14, 22), 26, 27]
    assert gather(flat, replicated, where).tolist() == [0, 1, 2, 3, 4, 5, 22, 23]


def test_export_consolidates_to_the_one_device_model(tmp_path):
    """An EP 2 run's export holds every expert: the parameters an EP 1 run of the same config exports
    (float64 training, exported as float32), and it runs as one device's MoE GPT."""
    runs = [train(tmp_path / str(e), *FP64, *_layout(4, e), "train.steps=3")[0] for e in (2, 1)]
    models = [load_model(export_model(find_checkpoint(r["run_dir"]), tmp_path / f"{i}.npz"))
              for i, r in enumerate(runs)]
    names = [n for n, _ in models[0].named_parameters()]
    assert names == [n for n, _ in models[1].named_parameters()]
    assert sum(".experts.mlps." in n for n in names) == 2 * 4 * 4  # 2 layers x 4 experts x 4 arrays
    for (name, a), (_, b) in zip(models[0].named_parameters(), models[1].named_parameters()):
        np.testing.assert_allclose(a.data, b.data, rtol=1e-6, atol=1e-7, err_msg=name)
    idx = np.arange(8).reshape(1, 8) % models[0].vocab_size
    np.testing.assert_allclose(models[0](idx).data, models[1](idx).data, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("edit, text", [
    (lambda m: m.update(expert=3), "expert: 3 does not divide world_size 4"),
    (lambda m: m["shards"][1].update(experts=[1, 3]), "shards[1].experts: [1, 3] is not one expert-parallel"),
    (lambda m: m["shards"][2].update(ranges=m["shards"][1]["ranges"]), "(gap or overlap)"),
    (lambda m: m["shards"][1].update(ranges=[]), "(gap or overlap)"),
    (lambda m: m["shards"][0].update(range=[0, 5]), "shards[0].range: expected null"),
    (lambda m: m["shards"][0]["ranges"].append([9, 3]), "got list [9, 3]"),
])
def test_a_damaged_expert_field_is_one_line(tmp_path, edit, text):
    original, _ = train(tmp_path, *MOE, *_layout(4, 2), "train.steps=2", "checkpoint.every=0")
    folder = find_checkpoint(original["run_dir"]).path
    manifest = json.loads((folder / MANIFEST).read_text())
    edit(manifest)
    (folder / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError) as info:
        read_manifest(folder)
    assert text in str(info.value) and "\n" not in str(info.value), str(info.value)


def test_a_shard_whose_runs_are_not_its_entrys_is_one_line(tmp_path):
    """Two shards' entries swapped in the manifest (the runs still tile): each file's runs and experts are
    not what its entry says."""
    original, _ = train(tmp_path, *MOE, *_layout(4, 2), "train.steps=2", "checkpoint.every=0")
    ckpt = find_checkpoint(original["run_dir"])
    manifest = json.loads((ckpt.path / MANIFEST).read_text())
    first, second = manifest["shards"][0], manifest["shards"][1]
    for key in ("ranges", "experts"):
        first[key], second[key] = second[key], first[key]
    (ckpt.path / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError) as info:
        find_checkpoint(ckpt.path).verify()
    assert "meta.ranges:" in str(info.value) and "but the manifest says" in str(info.value), str(info.value)
