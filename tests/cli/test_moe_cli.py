"""The moe-4 preset from the command line: `run --preset moe-4` trains (shrunk) and its summary says the
layout, it checkpoints its split experts, and its recording holds every rank's ExpertLoad of every step;
`memory --preset moe-4 --measure` measures the model states it predicts (the experts 1/4 per rank); a fold
expert parallelism cannot make is one line, exit 2."""

from __future__ import annotations

import json

from engine.checkpoint.sharded import find_checkpoint
from engine.events import ExpertLoad
from engine.run.recorder import read_events
from tests.cli_helpers import assert_user_error, invoke

SMALL = ["model.n_embd=32", "model.block_size=16", "data.max_chars=20000", "train.steps=2",
         "train.global_batch=8", "train.eval_every=0", "train.eval_batches=1", "optim.warmup_steps=0"]


def _sets(*extra: str) -> list[str]:
    return [a for s in (*SMALL, *extra) for a in ("--set", s)]


def test_run_moe_4_headless(in_tmp):
    result = invoke("run", "--preset", "moe-4", *_sets())
    assert result.exit_code == 0, result.output
    assert "steps          2" in result.output and "dp 4, ep 4" in result.output
    [folder] = (in_tmp / "runs").iterdir()  # the recording a replay reads: every rank's routing, each step
    assert (folder / "checkpoints" / "step-000002" / "manifest.json").is_file()
    loads = [e for e in read_events(folder) if isinstance(e, ExpertLoad)]
    assert sorted((e.step, e.rank) for e in loads) == [(s, r) for s in (1, 2) for r in range(4)]
    assert all(len(e.tokens_per_expert) == 2 and len(e.tokens_per_expert[0]) == 8 for e in loads)


def test_memory_of_moe_4_measures_what_it_predicts(in_tmp):
    def report(*args) -> dict:
        result = invoke("memory", "--preset", "moe-4", "--json", *args, *_sets())
        assert result.exit_code == 0, result.output
        return json.loads(result.output)
    split = report("--measure")
    whole = report(*_sets("parallel.expert=1"))
    assert split["measured"]["states"] == split["estimate"]["states"]
    assert sum(split["estimate"]["states"].values()) < 0.5 * sum(whole["estimate"]["states"].values())


def test_a_run_with_every_expert_local_checkpoints_resumes_and_exports(in_tmp):
    """An MoE model's spec (its "moe" settings) in the manifest: the layout checks, a resume continues, the
    export rebuilds the experts; it resumes into split experts too (EP 4), whose checkpoint exports."""
    first = invoke("run", "--preset", "moe-4", *_sets("parallel.expert=1"))
    assert first.exit_code == 0, first.output
    [folder] = (in_tmp / "runs").iterdir()
    resumed = invoke("resume", str(folder), "--no-ui", *_sets("parallel.expert=1", "train.steps=4"))
    assert resumed.exit_code == 0 and "resumed from" in resumed.output, resumed.output
    exported = invoke("export", str(folder), "-o", "moe.npz")
    assert exported.exit_code == 0, exported.output
    split = invoke("resume", str(folder), "--no-ui", *_sets("parallel.expert=4", "train.steps=6"))
    assert split.exit_code == 0 and "resumed from" in split.output, split.output
    newest = max((in_tmp / "runs").iterdir(), key=lambda p: p.stat().st_mtime)
    assert find_checkpoint(newest).manifest["expert"] == 4
    exported = invoke("export", str(newest), "-o", "moe-ep4.npz")
    assert exported.exit_code == 0, exported.output


def test_experts_that_do_not_split_evenly_are_one_line(in_tmp):
    assert_user_error(invoke("run", "--preset", "moe-4", *_sets("model.n_experts=6")), "parallel.expert")
