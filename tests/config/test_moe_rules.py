"""What a mixture-of-experts run is refused, each in one line naming its key: settings out of range, expert
settings on a dense model, top_k above the experts, the parallelisms not built beside experts, and what
expert parallelism cannot fold (experts that do not split evenly) or run beside."""

from __future__ import annotations

import pytest

from engine.config import ConfigError, from_dict

MOE = {"model": {"n_experts": 4, "top_k": 2}, "parallel": {"world_size": 4}, "train": {"global_batch": 8}}


def _with(**over) -> dict:
    d = {k: dict(v) for k, v in MOE.items()}
    for key, value in over.items():
        section, name = key.split("__")
        d.setdefault(section, {})[name] = value
    return d


@pytest.mark.parametrize("over, key, text", [
    (dict(model__n_experts=-1), "model.n_experts", "out of range"),
    (dict(model__top_k=0), "model.top_k", "out of range"),
    (dict(model__capacity_factor=-0.5), "model.capacity_factor", "out of range"),
    (dict(model__top_k=5), "model.top_k", "5 experts per token, of model.n_experts 4"),
    (dict(model__n_experts=0, model__capacity_factor=1.25), "model.capacity_factor",
     "shapes the experts, and model.n_experts = 0"),
    (dict(model__n_experts=0, parallel__expert=2), "parallel.expert",
     "splits the experts, and model.n_experts"),
    (dict(model__n_experts=6, parallel__expert=4), "parallel.expert", "cannot share model.n_experts 6"),
    (dict(parallel__expert=3), "parallel.expert", "3 does not divide the 4 data x context ranks"),
    (dict(parallel__expert=2, parallel__zero_stage=3), "parallel.zero_stage", "ZeRO-3 gathers a block's"),
    (dict(model__kind="mlp", data__kind="synthetic-classification"), "model.n_experts",
     'model.kind = "mlp" does not read it'),
])
def test_what_experts_cannot_do_is_one_line(over, key, text):
    with pytest.raises(ConfigError) as info:
        from_dict(_with(**over), source="test.toml")
    err = info.value
    assert "\n" not in str(err) and err.key == key and text in str(err), str(err)


@pytest.mark.parametrize("stage, dtype", [(1, "fp32"), (2, "bf16"), (0, "fp16")])
def test_expert_parallelism_beside_zero_1_2_and_16_bit_is_valid(stage, dtype):
    cfg = from_dict(_with(parallel__expert=2, parallel__zero_stage=stage, precision__dtype=dtype))
    assert cfg.parallel.zero_stage == stage and cfg.precision.dtype == dtype


def test_an_moe_model_on_data_parallelism_is_valid():
    cfg = from_dict(_with(model__moe_every=2, model__capacity_factor=1.25))
    assert cfg.model.n_experts == 4 and cfg.model.moe_every == 2


@pytest.mark.parametrize("expert", [1, 2])
def test_experts_inside_pipeline_stages_and_beside_tensor_and_context_parallelism_are_valid(expert):
    cfg = from_dict(_with(parallel__pipeline=2, parallel__expert=expert))
    assert cfg.parallel.pipeline == 2 and cfg.parallel.expert == expert
    cfg = from_dict(_with(parallel__tensor=2, parallel__expert=expert, parallel__sequence_parallel=True))
    assert cfg.parallel.tensor == 2 and cfg.parallel.expert == expert
    cfg = from_dict(_with(parallel__context=2, parallel__expert=expert, model__capacity_factor=1.0))
    assert cfg.parallel.context == 2 and cfg.parallel.expert == expert
