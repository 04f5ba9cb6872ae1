"""The estimator against the model it describes, the ZeRO paper's model-state formulas and the measuring
ledger; and the `nanodist-tui memory` command."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from engine.bench.memory import measure_rank
from engine.comm.launch import run_ranks
from engine.config import DataConfig, PrecisionConfig, from_dict, to_dict
from engine.config.build import build_model, count_params, param_shapes
from engine.config.presets import load_preset
from engine.memory.estimator import estimate
from engine.memory.ledger import MODEL_STATES
from nanodist_tui.cli import app

STATES = MODEL_STATES


def tiny(**over):
    d = {"name": "est", "seed": 1,
         "model": {"kind": "gpt", "n_layer": 3, "n_head": 2, "n_embd": 16, "block_size": 8, "vocab_size": 23},
         "data": {"kind": "synthetic-lm", "n_samples": 128},
         "train": {"steps": 2, "global_batch": 6, "micro_batches": 1, "eval_every": 0, "eval_batches": 1},
         "parallel": {"world_size": 3, "bucket_cap_mb": 0.004},
         "precision": {"init_scale": 256.0}}  # fp16: no overflowing first steps
    for key, value in over.items():
        section, name = key.split("__")
        d.setdefault(section, {})[name] = value
    return from_dict(d)


def mlp(**over):
    d = {"name": "est", "seed": 1, "model": {"kind": "mlp", "widths": [12, 20, 7]},
         "data": {"kind": "synthetic-classification", "n_samples": 128},
         "train": {"steps": 2, "global_batch": 6, "micro_batches": 1, "eval_every": 0, "eval_batches": 1},
         "parallel": {"world_size": 3, "bucket_cap_mb": 0.004}}
    for key, value in over.items():
        section, name = key.split("__")
        d.setdefault(section, {})[name] = value
    return from_dict(d)


@pytest.mark.parametrize("cfg", [tiny(), tiny(model__bias=False, model__tie_weights=False), mlp()],
                         ids=["gpt", "gpt-untied-nobias", "mlp"])
def test_parameter_layout_is_the_models(cfg):
    model = build_model(cfg, vocab=23)
    shapes = param_shapes(cfg, 23)
    assert [(n, tuple(p.shape)) for n, p in model.named_parameters()] == [(n, s) for n, s, _ in shapes]
    assert count_params(shapes) == count_params(model) == sum(p.data.size for p in model.parameters())


def test_seed_table_is_the_original_nanodist_model():
    cfg, _, _ = load_preset("seed-table")
    e = estimate(cfg)
    assert e.n_params == 8_400_000
    assert e.states["parameters"] == 33_600_000  # fp32 parameters: 33.6 MB


@pytest.mark.parametrize("world", [1, 3, 4])
def test_model_states_follow_reference_formulas(world):
    """The ZeRO paper's table for 2-byte training: 16Ψ, 4Ψ + 12Ψ/N, 2Ψ + 14Ψ/N, 16Ψ/N, up to padding."""
    for dtype in ("fp16", "bf16"):
        per_stage = [estimate(tiny(parallel__world_size=world, parallel__zero_stage=s, train__global_batch=12,
                                   precision__dtype=dtype)) for s in range(4)]
        psi = per_stage[0].n_params
        pad = math.ceil(psi / world) * world
        assert sum(per_stage[0].states.values()) == 16 * psi
        assert sum(per_stage[1].states.values()) == 4 * pad + 12 * pad // world
        assert sum(per_stage[2].states.values()) == 2 * pad + 14 * pad // world
        units = 5  # the outer unit (embeddings, ln_f) and three blocks, each padded to a multiple of N
        assert 16 * psi / world <= sum(per_stage[3].states.values()) <= 16 * (psi / world + units)
    fp32 = estimate(tiny(parallel__world_size=world, train__global_batch=12))
    assert fp32.states["master"] == 0 and sum(fp32.states.values()) == 16 * fp32.n_params


def measured(cfg, steps=2):
    world = cfg.parallel.world_size
    return run_ranks(world, "threads", measure_rank, args=(to_dict(cfg), steps), timeout_s=60)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16", "fp64"])
def test_estimate_equals_measurement(stage, dtype):
    """Model states exactly on every rank (N = 3: padding); activations within 10%; the optimizer's
    scratch exactly."""
    cfg = tiny(parallel__zero_stage=stage, precision__dtype=dtype, model__dropout=0.1)
    e = estimate(cfg)
    for r in measured(cfg):
        assert {k: r["at_rest"][k] for k in STATES} == e.states
        for phase in ("forward", "backward"):
            predicted = e.maxima[phase]["activations"]
            assert r["maxima"][phase]["activations"] == pytest.approx(predicted, rel=0.10)
        assert r["maxima"]["optimizer"]["temporaries"] == e.maxima["optimizer"]["temporaries"]
        assert r["maxima"]["forward"]["parameters"] == e.maxima["forward"]["parameters"]


CAPS = (2e-5, 0.004, 25.0)  # 21 bytes: buckets smaller than one parameter; a few buckets; one bucket
GRID = [(stage, world, cap, ("fp32", "fp16", "bf16")[(stage + world + c) % 3], (stage + world + c) % 2 == 1)
        for stage in range(4) for world in range(1, 5) for c, cap in enumerate(CAPS)]


@pytest.mark.parametrize("stage, world, cap, dtype, checkpointing", GRID)
def test_estimate_equals_the_ledger_to_the_byte(stage, world, cap, dtype, checkpointing):
    """Every stage and world size (3 and 4 leave uneven shards), bucket caps from below one parameter to
    above the model, each dtype, with and without checkpointing and overlap: model states at rest, and
    every model-state category, the gradients and the communication buffers at their peak, to the byte."""
    cfg = tiny(parallel__zero_stage=stage, parallel__world_size=world, parallel__bucket_cap_mb=cap,
               parallel__overlap=cap != CAPS[1], precision__dtype=dtype, train__global_batch=12,
               train__micro_batches=1 + (world == 1),
               memory__checkpointing="blocks" if checkpointing else "none")
    e = estimate(cfg)
    predicted = e.category_peaks()
    for r in measured(cfg):
        assert {k: r["at_rest"][k] for k in STATES} == e.states
        peaks = {c: max(m[c] for m in r["maxima"].values()) for c in (*STATES, "comm_buffers")}
        assert peaks == {c: predicted[c] for c in peaks}, f"rank {r['rank']}"


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_hybrid_estimate_equals_measurement(stage):
    """Hybrid sharding (4 ranks as 2 nodes × 2): model states exactly, sharded over the node; the
    optimizer's temporaries and stage 3's gathered parameters exactly; activations (of the micro-batch the
    whole world splits) within 10%, as for flat ZeRO."""
    cfg = tiny(parallel__zero_stage=stage, precision__dtype="bf16", parallel__world_size=4,
               parallel__ranks_per_node=2, parallel__hybrid=True, train__global_batch=8)
    e = estimate(cfg)
    flat = estimate(tiny(parallel__zero_stage=stage, precision__dtype="bf16", parallel__world_size=4,
                         train__global_batch=8))
    assert sum(e.states.values()) > sum(flat.states.values())  # G-way, not N-way, sharding
    assert e.micro_batch == flat.micro_batch == 2
    for r in measured(cfg):
        assert {k: r["at_rest"][k] for k in STATES} == e.states
        assert r["maxima"]["optimizer"]["temporaries"] == e.maxima["optimizer"]["temporaries"]
        assert r["maxima"]["forward"]["parameters"] == e.maxima["forward"]["parameters"]
        assert r["maxima"]["forward"]["activations"] == pytest.approx(e.maxima["forward"]["activations"],
                                                                      rel=0.10)


def test_fp16_at_the_default_scale_is_measured_over_steps_that_update():
    """At the default initial loss scale (2^16) the first fp16 steps overflow and skip the update, which
    would leave its fp32 gradient copy (here the largest temporary: small buckets keep AdamW's pieces
    small) unmeasured. The measurement goes on until `steps` steps have updated, and says how many
    it skipped."""
    cfg = tiny(parallel__zero_stage=2, precision__dtype="fp16", data__kind="stdlib", model__vocab_size=0,
               data__n_samples=DataConfig.n_samples,  # the corpus is read whole: no synthetic size
               precision__init_scale=PrecisionConfig.init_scale)  # the corpus: its first steps overflow
    e = estimate(cfg)
    scratch, grad32 = e.maxima["backward"]["temporaries"], e.states["adam_m"]  # AdamW's; fp32, as adam_m
    assert e.maxima["optimizer"]["temporaries"] == scratch + grad32
    for r in measured(cfg, steps=1):
        assert r["steps"] == 1 and r["skipped"] >= 1
        assert r["maxima"]["optimizer"]["temporaries"] == e.maxima["optimizer"]["temporaries"]


def test_mlp_activations_match():
    cfg = mlp(parallel__world_size=2, model__dropout=0.2, train__global_batch=8)
    e = estimate(cfg)
    for r in measured(cfg):
        predicted = e.maxima["forward"]["activations"]
        assert r["maxima"]["forward"]["activations"] == pytest.approx(predicted, rel=0.10)


@pytest.mark.parametrize("spec", ["blocks", "every:2"])
def test_checkpointing_lowers_the_measured_peak_to_the_estimate(spec):
    plain_cfg = tiny(model__n_layer=4, model__dropout=0.1, precision__dtype="fp16")
    cfg = tiny(model__n_layer=4, model__dropout=0.1, precision__dtype="fp16", memory__checkpointing=spec)
    plain = max(m["activations"] for m in measured(plain_cfg)[0]["maxima"].values())
    ckpt = max(m["activations"] for m in measured(cfg)[0]["maxima"].values())
    predicted = estimate(cfg).category_peaks()["activations"]
    assert ckpt < plain
    assert ckpt == pytest.approx(predicted, rel=0.10)
    assert estimate(plain_cfg).category_peaks()["activations"] == pytest.approx(plain, rel=0.10)


# ---------------------------------------------------------------------- the command

runner = CliRunner()
SMALL = ["--set", "model.n_layer=2", "--set", "model.n_embd=32", "--set", "model.n_head=2",
         "--set", "model.block_size=16", "--set", "model.vocab_size=50", "--set", "data.n_samples=256"]


def test_memory_command_prints_the_breakdown():
    result = runner.invoke(app, ["memory", "--preset", "seed-table"])
    assert result.exit_code == 0, result.output
    assert "8,400,000 parameters" in result.output and "33.6" in result.output
    assert "peak total" in result.output


def test_memory_command_measures_beside_the_estimate():
    result = runner.invoke(app, ["memory", "--preset", "seed-table", *SMALL, "--world-size", "2",
                                 "--zero", "1", "--precision", "bf16", "--measure", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert (report["zero_stage"], report["dtype"], report["world_size"]) == (1, "bf16", 2)
    assert report["measured"]["states"] == report["estimate"]["states"]
    for key in ("activations", "temporaries"):
        assert report["measured"]["category_peaks"][key] == pytest.approx(
            report["estimate"]["category_peaks"][key], rel=0.10)


def test_memory_command_says_how_many_steps_it_measured():
    """zero2-4's model in fp16 at the default loss scale: its first two steps overflow."""
    args = ["memory", "--preset", "zero2-4", "--set", "model.n_layer=1", "--set", "train.global_batch=8",
            "--precision", "fp16", "--measure"]
    report = json.loads(runner.invoke(app, [*args, "--json"]).output)["measured"]
    assert report["steps"] == 2 and report["skipped_steps"] == 2
    assert "measured over 2 updating step(s); 2 skipped on fp16 overflow" in runner.invoke(app, args).output


def test_memory_compare_tables():
    result = runner.invoke(app, ["memory", "--preset", "seed-table", "--compare"])
    assert result.exit_code == 0, result.output
    for text in ("ZeRO-0", "ZeRO-3", "fp16", "bf16", "component", "reduction", "optimizer (master+m+v)"):
        assert text in result.output
    as_json = runner.invoke(app, ["memory", "--preset", "seed-table", "--compare", "--json"])
    report = json.loads(as_json.output)
    assert len(report["grid"]) == 12
    base, opt = report["baseline"], report["optimized"]
    assert (base["dtype"], base["zero_stage"], base["checkpointing"]) == ("fp32", 0, "none")
    assert (opt["dtype"], opt["zero_stage"], opt["checkpointing"]) == ("fp16", 2, "blocks")
    assert opt["estimate"]["peak_total"] < base["estimate"]["peak_total"]


@pytest.mark.parametrize("args", [["--zero", "5"], ["--precision", "fp8"], ["--preset", "no-such-preset"],
                                  ["--set", "memory.checkpointing=sometimes"]])
def test_memory_command_bad_input_is_one_line(args):
    result = runner.invoke(app, ["memory", *args])
    assert result.exit_code == 2
    assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output


def test_the_bucket_size_picked_for_memory_lowers_the_measured_peak():
    """ZeRO-2 fp16 on a model whose gradients fit one default bucket: the cap picked for the lowest peak
    is smaller, and the ledger's peak with it is lower than with the default (and equals the estimate's
    model states and gradients)."""
    from engine.config import replace
    from engine.memory.estimator import BUCKET_CAPS_MB, bucket_cap_for_memory
    cfg = tiny(parallel__zero_stage=2, precision__dtype="fp16", model__n_embd=64, model__n_head=4)
    cap = bucket_cap_for_memory(cfg)
    assert cap in BUCKET_CAPS_MB and cap < 25.0
    small, default = (replace(cfg, "parallel.bucket_cap_mb", c) for c in (cap, 25.0))
    peak = {name: max(sum(p.values()) for r in measured(c) for p in r["peaks"].values())
            for name, c in (("small", small), ("default", default))}
    assert peak["small"] < peak["default"]


@pytest.mark.parametrize("stage", [0, 3])
def test_estimator_ledger_and_memory_pane_name_the_same_peak_phase(stage):
    """Issue 27: the estimator said forward, the workbench's memory pane backward. The ops hold the same
    arrays at forward's end and backward's start (every activation and the loss's logits), so the ledger's
    forward and backward peaks tie, as the estimator's do; backward then allocates gradients on top, which
    neither counts, so the peak is backward's (peak_phase: the later phase of a tie), for all three. (A batch
    of 12: with fewer rows this small model's activations stay under the optimizer step's own peak.)"""
    from engine.events import MemorySnapshot
    from engine.memory.ledger import peak_phase
    from nanodist_tui.widgets.memory_pane import MemoryPane
    cfg = tiny(parallel__zero_stage=stage, parallel__world_size=2, train__global_batch=12)
    e = estimate(cfg)
    estimated = {p: sum(c.values()) for p, c in e.phases().items()}
    for r in measured(cfg):
        totals = {p: sum(c.values()) for p, c in r["peaks"].items()}
        assert totals["backward"] >= totals["forward"] and estimated["backward"] >= estimated["forward"]
        assert peak_phase(r["peaks"]) == e.peak()[0] == "backward"
        pane = MemoryPane.__new__(MemoryPane)  # its choice alone, no app
        pane.snapshots = {(r["rank"], p): MemorySnapshot(step=1, rank=r["rank"], phase=p, current={}, peak=c)
                          for p, c in r["peaks"].items()}
        assert pane.peaks()[r["rank"]].phase == e.peak()[0]


def test_peak_phase_is_the_last_in_step_order_to_hold_the_top():
    from engine.memory.ledger import peak_phase
    tie = {"optimizer": {"a": 1}, "backward": {"a": 5}, "forward": {"a": 5}}
    assert peak_phase(tie) == "backward"  # step order, not dict order
    assert peak_phase({"backward": {"a": 5}, "optimizer": {"a": 5}}) == "optimizer"  # not alphabetical
    assert peak_phase({"forward": {"a": 6}, "backward": {"a": 5}}) == "forward"
    assert peak_phase({}) is None
