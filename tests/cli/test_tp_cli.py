"""The tensor-parallel presets from the command line: `run --preset tp-sp-4` trains (shrunk, thread
ranks) and its summary says the layout; `memory --preset tp-2` predicts one rank's shard (half the model
states of gpt-mini, the vocab-parallel logits) and measures the same bytes; a layout tensor parallelism
cannot split is one line, exit 2."""

from __future__ import annotations

import json

from tests.cli_helpers import assert_user_error, invoke

SMALL = ["model.n_layer=1", "model.n_embd=32", "model.block_size=16", "data.max_chars=20000", "train.steps=2",
         "train.global_batch=8", "train.eval_every=0", "train.eval_batches=1", "optim.warmup_steps=0",
         "parallel.backend=threads"]


def _sets(*extra: str) -> list[str]:
    return [a for s in (*SMALL, *extra) for a in ("--set", s)]


def test_run_tp_sp_4_headless(in_tmp):
    result = invoke("run", "--preset", "tp-sp-4", *_sets())
    assert result.exit_code == 0, result.output
    assert "steps          2" in result.output and "tp 2" in result.output


def test_memory_of_tp_2_halves_the_model_states_and_measures_them(in_tmp):
    def report(preset: str, *args) -> dict:
        result = invoke("memory", "--preset", preset, "--json", *args, *_sets("parallel.world_size=2"))
        assert result.exit_code == 0, result.output
        return json.loads(result.output)
    tp = report("tp-2", "--measure")
    dp = report("tp-2", *_sets("parallel.tensor=1"))
    assert tp["measured"]["states"] == tp["estimate"]["states"]
    assert sum(tp["estimate"]["states"].values()) < 0.6 * sum(dp["estimate"]["states"].values())


def test_a_context_sequence_parallelism_cannot_split_is_one_line(in_tmp):
    assert_user_error(invoke("run", "--preset", "tp-sp-4", *_sets("model.block_size=15")),
                      "parallel.sequence_parallel")
