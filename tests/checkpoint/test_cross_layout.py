"""Checkpoints move between layouts: a checkpoint saved in one layout resumes in another across different axes
— ZeRO-2 to tensor parallelism, tensor to pipeline, pipeline x tensor to ZeRO-1, context to tensor, ZeRO-3
to context x tensor with sequence parallelism, interleaved pipeline to context under ZeRO-2, 8 ranks of data
x context x tensor to a 4-stage pipeline, pipeline x context to ZeRO-3; a mixture of experts from expert
degree 2 to 4, from EP 4 under ZeRO-1 to EP 2 under ZeRO-2 on half the ranks, from one device to EP 4, from
TP x EP to PP x EP, from PP x CP x EP to PP x TP, from TP x EP with sequence parallelism to CP x EP. For
each pair (float64, dropout on, tiny recorded runs on thread ranks): loading in the new layout and saving at
once gives back the saved master weights and AdamW moments bit for bit, and training on takes the losses,
weights and moments of a run trained in the new layout from the start, within 1e-10. `export` from every
source layout writes the parameters one device's run exports; a change no layout can make (a tensor degree
that does not divide the heads, more stages than blocks, an expert degree that does not divide the experts)
is one line and exit 2 from `nanodist-tui resume`.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.checkpoint.export import load_model
from engine.checkpoint.sharded import find_checkpoint
from engine.run.job import resume_training
from tests.cli_helpers import assert_user_error, invoke
from tests.layout_helpers import Layout
from tests.run_helpers import assert_same_state, state_at, step_losses, train

SAVED_AT, UNTIL = 4, 8
# a float64 GPT every layout below splits: 4 blocks, 4 heads, context 16, dropout, two micro-batches a step
MODEL = ["precision.dtype=fp64", "model.n_layer=4", "model.n_head=4", "model.dropout=0.1",
         "train.micro_batches=2", f"train.steps={UNTIL}", f"checkpoint.every={SAVED_AT}"]

PAIRS = [  # (saved in, resumed in)
    (Layout(4, zero=2), Layout(4, tensor=2)),                            # ZeRO-2 -> TP
    (Layout(4, tensor=2), Layout(4, pipeline=2)),                        # TP -> PP
    (Layout(4, tensor=2, pipeline=2), Layout(4, zero=1)),                # PP x TP -> ZeRO-1
    (Layout(4, context=2), Layout(4, tensor=2)),                         # CP -> TP
    (Layout(4, zero=3), Layout(4, tensor=2, context=2, sp=True)),        # ZeRO-3 -> CP x TP (SP)
    (Layout(4, pipeline=2, chunks=2, zero=1), Layout(4, context=2, zero=2)),  # interleaved PP -> CP ZeRO-2
    (Layout(8, tensor=2, context=2), Layout(4, pipeline=4)),             # 8 ranks -> 4, DP x CP x TP -> PP
    (Layout(4, expert=2, moe=True), Layout(4, expert=4, moe=True)),      # MoE: EP 2 -> EP 4
    (Layout(4, expert=4, zero=1, moe=True), Layout(2, expert=2, zero=2, moe=True)),  # EP 4 ZeRO-1 -> 2 ranks
    (Layout(1, moe=True), Layout(4, expert=4, zero=2, moe=True)),        # one device's experts -> EP 4
    (Layout(4, pipeline=2, context=2, zero=1), Layout(4, zero=3)),       # PP x CP -> ZeRO-3
    # MoE: TP x EP -> PP x EP ZeRO-1; PP x CP x EP -> PP x TP; TP (SP) x EP -> CP x EP
    (Layout(4, tensor=2, expert=2, moe=True), Layout(4, pipeline=2, expert=2, zero=1, moe=True)),
    (Layout(4, pipeline=2, context=2, expert=2, moe=True), Layout(4, tensor=2, pipeline=2, moe=True)),
    (Layout(4, tensor=2, expert=2, sp=True, moe=True), Layout(4, context=2, expert=4, moe=True)),
]
SOURCES = [saved for saved in dict.fromkeys(saved for saved, _ in PAIRS) if saved.world > 1]


class Runs:
    """Uninterrupted runs of MODEL, one per layout, trained once for the module (each in its own folder)."""

    def __init__(self, root: Path):
        self.root, self.done = root, {}

    def __call__(self, layout: Layout) -> tuple[Path, dict]:
        """(run folder, step -> loss) of the run in `layout` (checkpoints at SAVED_AT and UNTIL)."""
        if layout not in self.done:
            summary, events = train(self.root / layout.name, *MODEL, *layout.sets())
            self.done[layout] = Path(summary["run_dir"]), step_losses(events)
        return self.done[layout]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Runs:
    return Runs(tmp_path_factory.mktemp("layouts"))


def _resumed(run_dir: Path, layout: Layout, steps: int) -> tuple[Path, dict]:
    events: list = []
    summary = resume_training(run_dir, [*layout.sets(), f"train.steps={steps}"], step=SAVED_AT,
                              on_event=events.append)
    return Path(summary["run_dir"]), step_losses(events)


def _assert_close_state(got: dict, want: dict, rtol: float = 1e-10) -> None:
    assert got["step"] == want["step"]
    for key in ("master", "m", "v"):
        np.testing.assert_allclose(got[key], want[key], rtol=rtol, atol=rtol * np.abs(want[key]).max(),
                                   err_msg=key)


@pytest.mark.parametrize("saved, resumed", PAIRS, ids=[f"{a.name}-to-{b.name}" for a, b in PAIRS])
def test_a_checkpoint_resumes_in_another_layout(runs, saved, resumed):
    source, _ = runs(saved)
    target, target_losses = runs(resumed)

    # loading in the new layout and saving at once: the saved bits
    same, _ = _resumed(source, resumed, SAVED_AT)
    for run_dir, step, layout in ((source, SAVED_AT, saved), (same, None, resumed)):  # what saved each
        manifest = find_checkpoint(run_dir, step).manifest
        assert (manifest["world_size"], manifest["tensor"]) == (layout.world, layout.tensor)
        assert {k: manifest["config"]["parallel"][k] for k in layout.parallel()} == layout.parallel()
    assert_same_state(state_at(same), state_at(source, SAVED_AT))

    # training on: the run trained in the new layout from the start
    on, losses = _resumed(source, resumed, UNTIL)
    steps = list(range(SAVED_AT + 1, UNTIL + 1))
    assert sorted(losses) == steps
    np.testing.assert_allclose([losses[s] for s in steps], [target_losses[s] for s in steps], rtol=1e-10)
    _assert_close_state(state_at(on), state_at(target))


def _exported(run_dir: Path, out: Path) -> dict:
    """`nanodist-tui export RUN_DIR -o OUT`'s parameters, by name."""
    result = invoke("export", run_dir, "-o", out)
    assert result.exit_code == 0, result.output
    return dict(load_model(out).named_parameters())


@pytest.mark.parametrize("saved", SOURCES, ids=[layout.name for layout in SOURCES])
def test_export_consolidates_every_layout_to_one_devices_model(runs, saved, tmp_path):
    """`nanodist-tui export` of a run in any layout: the whole model, every parameter within float32
    rounding of the one-device run's export (their float64 masters and moments agree within 1e-10)."""
    run_dir, _ = runs(saved)
    one, _ = runs(saved.one_device())
    got, params = _exported(run_dir, tmp_path / "model.npz"), _exported(one, tmp_path / "one.npz")
    assert got.keys() == params.keys()
    for name, p in params.items():
        assert got[name].data.dtype == np.float32 and got[name].shape == p.shape, name
        ulp = 2.0 ** -22  # float32 rounding of masters within 1e-10: at most an ulp apart (the key bias,
        # which no loss moves, is float64 noise around 0: the tensor's scale bounds it)
        np.testing.assert_allclose(got[name].data, p.data, rtol=ulp, atol=ulp * np.abs(p.data).max(),
                                   err_msg=name)
    _assert_close_state(state_at(run_dir), state_at(one))


@pytest.mark.parametrize("source, change, named", [
    (Layout(4, zero=2), ["parallel.world_size=3", "parallel.tensor=3"], "parallel.tensor"),  # 4 heads
    (Layout(4, zero=2), ["parallel.world_size=8", "parallel.pipeline=8"], "parallel.pipeline"),  # 4 blocks
    (Layout(4, zero=2), ["parallel.world_size=3", "parallel.context=3"], "model.block_size"),  # 6 chunks
    (Layout(4, zero=2), ["parallel.expert=2"], "parallel.expert"),  # experts of a dense model
    (Layout(4, expert=2, moe=True), ["parallel.world_size=3", "parallel.expert=3"], "parallel.expert"),  # 8
], ids=["tensor-3", "pipeline-8", "context-3", "dense-expert-2", "expert-3"])
def test_an_impossible_layout_is_one_line(runs, source, change, named):
    run_dir, _ = runs(source)
    sets = [arg for s in change for arg in ("--set", s)]
    before = sorted(run_dir.parent.iterdir())
    assert_user_error(invoke("resume", run_dir, "--no-ui", "--step", SAVED_AT, *sets), named)
    assert sorted(run_dir.parent.iterdir()) == before  # no run started
