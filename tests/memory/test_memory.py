"""The memory ledger: counting, phases and peaks, the tape observer, the trainer's MemorySnapshot events held
against the run's estimate, and the cross-check against tracemalloc on real processes."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from engine import events as ev
from engine import nn, ops
from engine.bench.memory import measure_rank
from engine.comm.launch import run_ranks
from engine.config import from_dict, to_dict
from engine.memory.ledger import CATEGORIES, PHASES, Ledger, memory_block
from engine.tensor import Tensor, set_tape_observer


def test_counting_phases_and_peaks():
    ledger = Ledger()
    ledger.hold("parameters", 100)
    ledger.begin_step(0)
    with ledger.in_phase("forward"):
        ledger.add("activations", 50)
        ledger.add("activations", 30)
    with ledger.in_phase("backward"):
        ledger.sub("activations", 80)
        with ledger.transient("comm_buffers", 20):
            assert ledger.current["comm_buffers"] == 20
        ledger.add("gradients", 10)
    assert ledger.phase == "idle" and ledger.current["comm_buffers"] == 0
    peaks, maxima = ledger.peaks(), ledger.maxima()
    assert peaks["forward"]["activations"] == 80 and sum(peaks["forward"].values()) == 180
    # backward: 180 at entry (activations still held), the transient comm buffer came after they were freed
    assert sum(peaks["backward"].values()) == 180 and maxima["backward"]["comm_buffers"] == 20
    snaps = ledger.snapshots(step=1, rank=3)
    assert [s.phase for s in snaps] == ["forward", "backward"]
    assert snaps[1].current == {**dict.fromkeys(CATEGORIES, 0), "parameters": 100, "gradients": 10}
    assert ev.from_json(ev.to_json(snaps[0])) == snaps[0]
    ledger.begin_step(1)
    assert ledger.peaks() == {}


def test_phases_nest_and_restore():
    ledger, seen = Ledger(), []
    ledger.on_phase = lambda old, new: seen.append((old, new))
    with ledger.in_phase("backward"):
        with ledger.in_phase("optimizer"):
            assert ledger.phase == "optimizer"
        assert ledger.phase == "backward"
    assert seen == [("idle", "backward"), ("backward", "optimizer"), ("optimizer", "backward"),
                    ("backward", "idle")]


def test_observer_counts_memory_blocks_once_and_frees_them():
    ledger = Ledger()
    set_tape_observer(ledger)
    try:
        x = Tensor(np.ones((4, 6), np.float32), requires_grad=True)
        qkv = x * 2.0  # one new [4, 6] array; its three column views are kept by one node
        q, k, v = ops.split(qkv, 3, axis=-1)
        prod = q * k  # keeps q and k: views of one block, counted once at the block's size
        assert ledger.current["activations"] == qkv.data.nbytes
        out = (prod * v).sum()  # keeps prod and v: v's block is counted already
        assert ledger.current["activations"] == qkv.data.nbytes + prod.data.nbytes
        assert memory_block(q.data) is qkv.data
        out.backward()
        assert ledger.current["activations"] == 0
        y = (x * x).sum()  # a graph dropped without backward frees its saves too
        assert ledger.current["activations"] == x.data.nbytes
        del y
        gc.collect()
        assert ledger.current["activations"] == 0
    finally:
        set_tape_observer(None)


def test_gpt_forward_and_backward_return_to_zero():
    ledger = Ledger()
    model = nn.GPT(vocab_size=17, block_size=8, n_layer=2, n_head=2, n_embd=8)
    set_tape_observer(ledger)
    try:
        rng = np.random.default_rng(0)
        loss = ops.cross_entropy(model(rng.integers(0, 17, (2, 8))), rng.integers(0, 17, (2, 8)))
        assert ledger.current["activations"] > 0
        loss.backward()
        assert ledger.current["activations"] == 0
    finally:
        set_tape_observer(None)


def tiny(**over) -> dict:
    d = {"name": "mem", "seed": 2,
         "model": {"kind": "gpt", "n_layer": 2, "n_head": 2, "n_embd": 16, "block_size": 8, "vocab_size": 19},
         "data": {"kind": "synthetic-lm", "n_samples": 128},
         "train": {"steps": 2, "global_batch": 4, "eval_every": 0, "eval_batches": 1, "log_every": 1},
         "parallel": {"world_size": 2}}
    for key, value in over.items():
        section, name = key.split("__")
        d.setdefault(section, {})[name] = value
    return to_dict(from_dict(d))


def test_trainer_emits_a_snapshot_per_phase_rank_and_step():
    from engine.run.job import run_training
    seen: list = []
    run_training(from_dict(tiny()), on_event=seen.append, record=False)
    snaps = [e for e in seen if isinstance(e, ev.MemorySnapshot)]
    assert len(snaps) == 2 * 2 * len(PHASES)  # steps x ranks x phases
    expected = {(step, rank, phase) for step in (1, 2) for rank in (0, 1) for phase in PHASES}
    assert {(s.step, s.rank, s.phase) for s in snaps} == expected
    # the estimate is the run's (the launcher's, on RunStarted), held against every rank's every snapshot
    estimate = next(e for e in seen if isinstance(e, ev.RunStarted)).memory_estimate
    assert set(estimate) == set(PHASES)
    for s in snaps:
        assert set(s.peak) == set(CATEGORIES) and set(estimate[s.phase]) == set(CATEGORIES)
        assert sum(s.peak.values()) >= sum(s.current.values())
        assert s.peak["parameters"] == estimate[s.phase]["parameters"] > 0
    forward = next(s for s in snaps if s.phase == "forward")
    assert forward.peak["activations"] == estimate["forward"]["activations"] > 0
    optimizer = next(s for s in snaps if s.phase == "optimizer")
    assert optimizer.peak["temporaries"] == estimate["optimizer"]["temporaries"] > 0
    assert optimizer.current["activations"] == 0


@pytest.mark.slow
def test_ledger_peak_agrees_with_tracemalloc_on_processes():
    """Each rank process runs tracemalloc from before its model is built. The model is wide and the batch
    small, so model states and the optimizer's temporaries (AdamW's scratch, the gradient norm's float64
    buffer) dominate the interpreter's own allocations and the backward pass's transient gradient arrays
    (which the ledger does not count). The baseline subtracted from the traced figures is what
    tracemalloc sees at rest beyond the ledger (the data set, Python objects, AdamW's 1-byte-per-parameter
    weight-decay mask); it must itself be small."""
    cfg = tiny(model__n_layer=2, model__n_embd=384, model__n_head=6, model__block_size=16,
               model__vocab_size=64, train__global_batch=4, parallel__backend="processes")
    results = run_ranks(2, "processes", measure_rank, args=(cfg, 2, True), timeout_s=120)
    for r in results:
        at_rest = sum(r["at_rest"].values())
        assert 0 <= r["baseline"] < 0.1 * at_rest
        ledger_peak = max(sum(p.values()) for p in r["peaks"].values())
        traced_peak = max(r["traced"].values())
        assert traced_peak == pytest.approx(ledger_peak, rel=0.10)
        for phase in ("forward", "optimizer"):
            assert r["traced"][phase] == pytest.approx(sum(r["peaks"][phase].values()), rel=0.10), phase
