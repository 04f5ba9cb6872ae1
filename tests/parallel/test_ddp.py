"""DDP equals one process on the same global batch (threads and processes, fp32 and fp64, with and without
gradient accumulation); ranks stay bitwise identical; runs are deterministic; bucket all-reduces overlap
backward; every stage starts from rank 0's parameters. (The by-hand DDP, one ring all-reduce after
backward, against this one: tests/parallel/test_by_hand.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from engine.comm.launch import run_ranks
from engine.config import from_dict
from engine.parallel.data import make_replica
from engine.parallel.data.ddp import DataParallel
from engine.trainer import Trainer
from tests.parallel_helpers import tiny_gpt


def _train(comm, emit, cfg_dict, steps):
    cfg = from_dict(cfg_dict)
    trainer = Trainer(cfg, comm)
    losses, params = [], []
    for _ in range(steps):
        losses.append(trainer.train_step()["loss"])
        params.append(trainer.replica.flat.data.copy())
    return {"losses": losses, "params": params}


def run(cfg_dict, world, backend="threads", steps=10):
    cfg_dict = dict(cfg_dict, parallel=dict(cfg_dict["parallel"], world_size=world, backend=backend))
    return run_ranks(world, backend, _train, args=(cfg_dict, steps), timeout_s=60)


def assert_replicas_identical(results):
    for step in range(len(results[0]["params"])):
        for r in results[1:]:
            np.testing.assert_array_equal(r["params"][step], results[0]["params"][step])


def assert_matches_single(multi, single, rtol):
    """Losses to `rtol` relative; final parameters to `rtol` relative plus `rtol`·max|p| absolute.

    A purely relative check is not meaningful element by element: many parameters pass through zero during
    training, and an element of size ~1e-9 holds only rounding noise relative to the rest of its tensor (the
    update that produced it subtracted numbers ~1e-2 apart in the last bits), so two summation orders may
    disagree on it by 100% while agreeing to the last few ulps of the model's scale. The absolute term is
    that scale: `rtol` of the largest parameter."""
    np.testing.assert_allclose(multi[0]["losses"], single["losses"], rtol=rtol)
    scale = np.abs(single["params"][-1]).max()
    np.testing.assert_allclose(multi[0]["params"][-1], single["params"][-1], rtol=rtol, atol=rtol * scale)


PRECISIONS = [("fp32", 1e-6), ("fp64", 1e-12)]


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("dtype, rtol", PRECISIONS)
def test_ddp_equals_single_process(world, dtype, rtol):
    cfg = tiny_gpt(precision__dtype=dtype)
    single = run(cfg, 1)[0]
    multi = run(cfg, world)
    assert_replicas_identical(multi)
    assert_matches_single(multi, single, rtol)


ACCUMULATE = dict(train__micro_batches=2, train__global_batch=16)


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("dtype, rtol", PRECISIONS)
def test_ddp_with_gradient_accumulation(world, dtype, rtol):
    cfg = tiny_gpt(precision__dtype=dtype, **ACCUMULATE)
    single = run(cfg, 1)[0]
    multi = run(cfg, world)
    assert_replicas_identical(multi)
    assert_matches_single(multi, single, rtol)


@pytest.mark.parametrize("algorithm", ["rhd", "tree", "hierarchical", "auto"])
def test_ddp_with_each_all_reduce_algorithm_equals_single_process(algorithm):
    """4 ranks as 2 nodes × 2 (the grid hierarchical and auto read); 3 ranks for the non-power-of-two
    paths."""
    cfg = tiny_gpt(precision__dtype="fp64", train__global_batch=12)
    single = run(cfg, 1)[0]
    for world, per_node in ((4, 2), (3, 3 if algorithm == "hierarchical" else 0)):
        multi = run(dict(cfg, parallel=dict(cfg["parallel"], algorithm=algorithm, ranks_per_node=per_node)),
                    world)
        assert_replicas_identical(multi)
        assert_matches_single(multi, single, 1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("dtype, rtol", PRECISIONS)
def test_ddp_on_processes_equals_single_process(world, dtype, rtol):
    cfg = tiny_gpt(precision__dtype=dtype)
    single = run(cfg, 1, steps=10)[0]
    multi = run(cfg, world, backend="processes", steps=10)
    assert_replicas_identical(multi)
    assert_matches_single(multi, single, rtol)


@pytest.mark.slow
@pytest.mark.parametrize("dtype, rtol", PRECISIONS)
def test_ddp_on_processes_with_gradient_accumulation(dtype, rtol):
    cfg = tiny_gpt(precision__dtype=dtype, **ACCUMULATE)
    single = run(cfg, 1, steps=10)[0]
    multi = run(cfg, 2, backend="processes", steps=10)
    assert_replicas_identical(multi)
    assert_matches_single(multi, single, rtol)


def test_same_seed_same_losses_bitwise():
    cfg = tiny_gpt(model__dropout=0.1)
    a, b = run(cfg, 1, steps=5)[0], run(cfg, 1, steps=5)[0]
    assert a["losses"] == b["losses"]
    np.testing.assert_array_equal(a["params"][-1], b["params"][-1])


# ---------------------------------------------------------------------------------------- overlap

def _bucket_submissions(comm, emit, cfg_dict, steps):
    """Run `steps` steps and log every bucket all-reduce the replica hands to its communication thread:
    (step, micro-batch, bucket index, gradients already final, inside backward?). The first submission
    inside a backward is also waited for right there, from a grad-ready hook, to record whether the
    communication thread ran that all-reduce to completion while backward still had gradients to make."""
    trainer = Trainer(from_dict(cfg_dict), comm)
    rep = trainer.replica
    assert isinstance(rep, DataParallel)
    n_params = len(rep.params)
    state = {"step": 0, "micro": -1, "ready": 0, "in_backward": False, "first": None}
    log, finished_early = [], []

    begin_micro, backward, submit = rep.begin_micro, rep.backward, rep._worker.submit

    def traced_begin_micro(sync):
        state["micro"] += 1
        begin_micro(sync)

    def traced_backward(loss, factor):
        state.update(ready=0, in_backward=True, first=None)
        try:
            backward(loss, factor)
        finally:
            state["in_backward"] = False

    def traced_submit(fn):
        log.append((state["step"], state["micro"], rep._next, state["ready"], state["in_backward"]))
        job = submit(fn)
        if state["in_backward"] and state["first"] is None:
            state["first"] = job  # the first bucket of this backward: on_ready waits for it once
        return job

    def on_ready(_):  # registered after the replica's hook, so it runs after any submission that hook made
        state["ready"] += 1
        job = state["first"]
        if job not in (None, "waited"):  # the comm thread runs it (with the peer's same first bucket)
            state["first"] = "waited"
            assert job.done.wait(timeout=20), "the bucket all-reduce never ran"
            finished_early.append((state["step"], n_params - state["ready"]))

    rep.begin_micro, rep.backward, rep._worker.submit = traced_begin_micro, traced_backward, traced_submit
    removers = [p.register_grad_ready_hook(on_ready) for p in rep.params]
    for step in range(steps):
        state.update(step=step, micro=-1)
        trainer.train_step()
    for remove in removers:
        remove()
    out = {"log": log, "finished_early": finished_early, "n_buckets": len(rep.buckets), "n_params": n_params}
    rep.close()
    return out


@pytest.mark.parametrize("micro_batches", [1, 2])
def test_bucket_all_reduces_overlap_backward(micro_batches):
    cfg = tiny_gpt(train__micro_batches=micro_batches, train__global_batch=8 * micro_batches)
    cfg["parallel"] = dict(cfg["parallel"], world_size=2, overlap=True)
    steps = 2
    for r in run_ranks(2, "threads", _bucket_submissions, args=(cfg, steps), timeout_s=60):
        n_buckets, log = r["n_buckets"], r["log"]
        assert n_buckets >= 4  # the tiny bucket cap really makes many buckets
        for step in range(steps):
            mine = [entry for entry in log if entry[0] == step]
            # every bucket exactly once per step, in index order, all on the last (syncing) micro-batch
            assert [b for _, _, b, _, _ in mine] == list(range(n_buckets))
            assert {micro for _, micro, _, _, _ in mine} == {micro_batches - 1}
            in_backward = [ready for _, _, _, ready, inside in mine if inside]
            # most buckets are handed over from grad-ready hooks, while gradients are still being made
            assert len(in_backward) >= n_buckets - 1, mine
            assert min(in_backward) < r["n_params"] // 2, mine
        # and the communication thread really ran one to completion before backward ended
        assert [step for step, _ in r["finished_early"]] == list(range(steps))
        assert all(left > 0 for _, left in r["finished_early"]), r["finished_early"]


def test_without_overlap_no_bucket_is_submitted_during_backward():
    cfg = tiny_gpt()
    cfg["parallel"] = dict(cfg["parallel"], world_size=2, overlap=False)
    for r in run_ranks(2, "threads", _bucket_submissions, args=(cfg, 2), timeout_s=60):
        assert not any(inside for *_, inside in r["log"]), r["log"]
        assert r["finished_early"] == []
        # all of them are issued after backward, by finish_backward, in order
        assert [b for _, _, b, _, _ in r["log"]] == list(range(r["n_buckets"])) * 2
        assert all(ready == r["n_params"] for *_, ready, _ in r["log"])


# ---------------------------------------------------------------------------------------- initial broadcast

def _start_from_different_weights(comm, emit, cfg_dict):
    """Give every rank different initial parameters (rank-dependent noise, before the replica exists), then
    read back what each rank holds once the replica is built."""
    seen = {}

    def perturbed_replica(cfg, model, comm):
        rng = np.random.default_rng(1000 + comm.rank)
        for p in model.parameters():
            p.data = p.data + rng.normal(0.0, 0.1, size=p.data.shape).astype(p.data.dtype)
        seen["before"] = np.concatenate([p.data.reshape(-1) for p in model.parameters()])
        return make_replica(cfg, model, comm)

    trainer = Trainer(from_dict(cfg_dict), comm, replica_factory=perturbed_replica)
    rep = trainer.replica
    out = {"before": seen["before"], "range": rep.owned_range(),
           "master": rep.optimizer_state()["master"], "numel": rep.flat.numel}
    if hasattr(rep.flat, "data"):  # stages 0-2: every rank holds the whole parameter buffer
        out["full"] = rep.flat.data[:rep.flat.numel].copy()
        out["views"] = np.concatenate([p.data.reshape(-1) for p in trainer.model.parameters()])
    else:  # stage 3: each unit's part; the ranks' parts together are the model
        out["parts"] = rep.param_shard.copy()
    rep.close()
    return out


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_every_stage_starts_from_rank_0_parameters(stage):
    world = 2 if stage in (0, 3) else 4
    cfg = tiny_gpt()
    cfg["parallel"] = dict(cfg["parallel"], world_size=world, zero_stage=stage)
    results = run_ranks(world, "threads", _start_from_different_weights, args=(cfg,), timeout_s=60)
    reference = results[0]["before"]
    for r in results[1:]:
        assert not np.array_equal(r["before"], reference)  # the ranks really started apart
    size = max(r["range"][1] for r in results)
    consolidated = np.zeros(size, dtype=results[0]["master"].dtype)
    for rank, r in enumerate(results):
        start, end = r["range"]
        consolidated[start:end] = r["master"]
        if "full" in r:
            np.testing.assert_array_equal(r["full"], reference, err_msg=f"rank {rank} flat buffer")
            np.testing.assert_array_equal(r["views"], reference, err_msg=f"rank {rank} model parameters")
    # the optimizer's starting point, gathered from every rank's owned range, is rank 0's model
    np.testing.assert_array_equal(consolidated[:results[0]["numel"]], reference)
