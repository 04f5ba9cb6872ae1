"""`nanodist-tui memory` under pipeline parallelism: the heaviest pipeline rank's figures on top and a table
of every pipeline rank's (its stages, each category's peak, the peak total) in bytes, estimated and
measured equal; --json carries the same rows. Without a pipeline there is no such table."""

from __future__ import annotations

import json

from tests.cli_helpers import invoke

SMALL = ["model.n_layer=3", "model.n_embd=32", "model.block_size=16", "data.max_chars=20000",
         "train.global_batch=8", "train.micro_batches=4", "parallel.backend=threads", "parallel.world_size=2",
         "parallel.pipeline=2"]


def _memory(*args: str, sets=SMALL) -> str:
    result = invoke("memory", "--preset", "gpt-mini", *args, *[a for s in sets for a in ("--set", s)])
    assert result.exit_code == 0, result.output
    return result.output


def test_each_pipeline_rank_estimated_and_measured_to_the_byte(in_tmp):
    report = json.loads(_memory("--measure", "--json"))
    rows = report["pipeline_ranks"]
    assert [(r["pipeline_rank"], r["stages"]) for r in rows] == [(0, [0]), (1, [1])]
    for r in rows:
        assert r["measured"]["category_peaks"] == r["estimate"]["category_peaks"]
        assert r["measured"]["peak_total"] == r["estimate"]["peak_total"]
    assert report["estimate"]["peak_total"] == max(r["estimate"]["peak_total"] for r in rows)
    # on top, each figure the largest of any pipeline rank's, estimated as measured
    assert report["estimate"]["category_peaks"] == report["measured"]["category_peaks"]
    assert report["estimate"]["states"] == report["measured"]["states"]
    text = _memory("--measure")
    assert "= dp 1 x pp 2" in text and "per pipeline rank, bytes" in text
    lines = text.splitlines()
    est = next(line for line in lines if line.strip().startswith("activations") and "est" in line)
    meas = lines[lines.index(est) + 1]
    assert meas.split()[0] == "meas" and est.split()[2:] == meas.split()[1:]
    assert est.split()[2:] == [f"{r['estimate']['category_peaks']['activations']:,}" for r in rows]


def test_no_pipeline_no_table(in_tmp):
    sets = [s for s in SMALL if not s.startswith("parallel.pipeline")]
    assert json.loads(_memory("--json", sets=sets))["pipeline_ranks"] is None
    assert "per pipeline rank" not in _memory(sets=sets)
