"""The pipeline stage runner (engine/parallel/pipeline/stage.py) against one device, float64: a GPT cut into
S stages, run stage after stage in one process over m micro-batches, gives every micro-batch's loss and every
gradient of one device accumulating over the same m micro-batches (mean loss) within 1e-12 relative — tied or
untied embeddings, dropout, activation checkpointing, interleaved stages on one runner, stages of a
tensor-parallel model. Its tapes are freed: the output it sends is not kept, and a 1F1B order holds fewer
tapes than all-forwards-first."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

from engine.comm.launch import run_ranks
from engine.memory.ledger import Ledger
from engine.parallel.pipeline.split import split_model
from engine.parallel.pipeline.stage import StageRunner
from engine.parallel.tensor import model_layout
from engine.tensor import set_tape_observer
from tests.pp_stage_helpers import assert_matches, micro_batches, model_fn, one_device, run_step, runners
from tests.tp_helpers import tp_model


@pytest.mark.parametrize("order", ["gpipe", "1f1b"])
@pytest.mark.parametrize("m", [1, 3, 5])
@pytest.mark.parametrize("stages", [2, 3, 4])
def test_stages_equal_one_device(stages, m, order):
    build, batches = model_fn(), micro_batches(m)
    assert_matches(run_step(runners(build, stages), batches, order), one_device(build, batches))


@pytest.mark.parametrize("tie", [True, False])
def test_tied_and_untied_embeddings(tie):
    build, batches = model_fn(tie_weights=tie), micro_batches(3)
    held = runners(build, 3)
    ties = held[0].tied_parameters()
    if tie:  # the last stage's own copy, equal to wte.weight, paired with it
        (tied,) = ties
        first, last = tied.params
        assert tied.stages == (0, 2) and first is not None and last is not None and first is not last
        np.testing.assert_array_equal(first.data, last.data)
    else:
        assert ties == []
    assert_matches(run_step(held, batches, "1f1b"), one_device(build, batches))


@pytest.mark.parametrize("stages", [2, 4])
def test_dropout_draws_one_devices_masks(stages):
    build, batches = model_fn(dropout=0.2), micro_batches(3)
    assert_matches(run_step(runners(build, stages), batches, "1f1b"), one_device(build, batches))


@pytest.mark.parametrize("checkpointing", ["blocks", "every:2"])
def test_activation_checkpointing_inside_stages(checkpointing):
    build, batches = model_fn(n_layer=6, dropout=0.2, checkpointing=checkpointing), micro_batches(3)
    assert_matches(run_step(runners(build, 3), batches, "1f1b"), one_device(build, batches))


@pytest.mark.parametrize(("stages", "ranks"), [(4, 2), (6, 3), (4, 1)])
def test_interleaved_stages_on_each_runner(stages, ranks):
    build, batches = model_fn(n_layer=6, dropout=0.1), micro_batches(3)
    held = runners(build, stages, ranks)
    assert [sorted(r.stages) for r in held] == [list(range(r, stages, ranks)) for r in range(ranks)]
    assert_matches(run_step(held, batches, "1f1b"), one_device(build, batches))


def test_each_runner_holds_only_its_stages_parameters():
    held = runners(model_fn(n_layer=4), 4, ranks=2)
    first, second = ({n for n, _ in r.named_parameters()} for r in held)
    embedding, head = {"wte.weight", "wpe.weight"}, {"ln_f.weight", "ln_f.bias", "lm_head.weight"}
    assert embedding <= first and not first & head
    assert head <= second and not second & embedding
    assert {n.split(".")[1] for n in first - embedding} == {"0", "2"}  # blocks.<i>.: stages 0 and 2
    assert {n.split(".")[1] for n in second - head} == {"1", "3"}
    assert all(t.params[1] is None for t in held[0].tied_parameters())
    assert all(t.params[0] is None for t in held[1].tied_parameters())


def test_the_sent_output_is_not_kept():
    (runner,) = runners(model_fn(), 2)
    runner.begin_step(micro_batches(1), 1.0)
    out = runner.forward(0, 0, None)
    assert isinstance(out, np.ndarray)
    kept = weakref.ref(out)
    runner.forward(1, 0, out.copy())
    del out
    gc.collect()
    assert kept() is None


def _peak_activation_bytes(order: str, m: int) -> int:
    (runner,) = runners(model_fn(), 2)
    ledger = Ledger()
    set_tape_observer(ledger)
    try:
        run_step([runner], micro_batches(m), order)
    finally:
        set_tape_observer(None)
    assert ledger.total() == 0  # every saved activation freed by the end of the step
    return max(by_category["activations"] for by_category in ledger.maxima().values())


def test_backward_frees_a_micro_batchs_tape():
    gpipe3, gpipe5 = _peak_activation_bytes("gpipe", 3), _peak_activation_bytes("gpipe", 5)
    one_f_one_b3, one_f_one_b5 = _peak_activation_bytes("1f1b", 3), _peak_activation_bytes("1f1b", 5)
    assert gpipe3 < gpipe5  # all forwards first: m micro-batches held
    assert one_f_one_b3 == one_f_one_b5 < gpipe3  # one ahead: two held, whatever m


def test_misordered_calls_are_one_line():
    (runner,) = runners(model_fn(), 2)
    runner.begin_step(micro_batches(2), 0.5)
    with pytest.raises(RuntimeError, match="before its forward"):
        runner.backward(1, 0, None)
    with pytest.raises(ValueError, match="needs its input"):
        runner.forward(1, 0, None)
    with pytest.raises(RuntimeError, match="before its backward_input"):
        runner.backward_weight(0, 1)
    with pytest.raises(ValueError, match="not held here"):
        runners(model_fn(), 2, ranks=2)[0].forward(1, 0, None)


def _tensor_parallel_stages(comm, emit, build, batches, sequence_parallel: bool) -> list[float]:
    model = tp_model(comm, comm.world_size, build, sequence_parallel)
    runner = StageRunner(model, split_model(model, 2), [0, 1], loss_fn=model_layout(model).loss)
    return run_step([runner], batches, "split-1f1b")["losses"]


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_stages_of_a_tensor_parallel_model(sequence_parallel):
    """Cut after tensor parallelism (its column-parallel head copied as such), dropout drawing each rank's
    part of one device's masks: every micro-batch's loss is one device's."""
    build, batches = model_fn(n_layer=4, dropout=0.2), micro_batches(3)
    ranks = run_ranks(2, "threads", _tensor_parallel_stages, args=(build, batches, sequence_parallel))
    expected = one_device(build, batches)["losses"]
    for losses in ranks:
        np.testing.assert_allclose(losses, expected, rtol=1e-12, atol=0.0)
