"""The context-parallel rules (engine.config.rules_context): each layout it cannot train is one line naming
the key, what is wrong and the fix; what it can train passes."""

from __future__ import annotations

import pytest

from engine.config import ConfigError, from_dict


def cfg(parallel: dict, **model) -> dict:
    return {"model": {"kind": "gpt", "n_head": 4, "n_embd": 16, "block_size": 16, "dropout": 0.0, **model},
            "parallel": {"world_size": 2, "context": 2, **parallel}}


@pytest.mark.parametrize("d, key, text", [
    (cfg({}, block_size=10), "model.block_size", '10 tokens do not cut into the 4 equal chunks the "zigzag" '
     "layout over 2 ranks needs; use a multiple of 4, e.g. 8"),
    (cfg({"context_layout": "contiguous"}, block_size=9), "model.block_size", "use a multiple of 2, e.g. 8"),
    (cfg({"context_layout": "zig"}), "parallel.context_layout", "'zig' is not a context layout"),
    (cfg({"world_size": 4, "tensor": 4, "sequence_parallel": True, "context": 1}, block_size=12), None, None),
    (cfg({"world_size": 8, "tensor": 4, "sequence_parallel": True}, block_size=20),
     "parallel.sequence_parallel", "splits each rank's 10 tokens (block_size 20 / context 2) 4 ways"),
    ({"model": {"kind": "mlp"}, "data": {"kind": "synthetic-classification"},
      "parallel": {"world_size": 2, "context": 2}}, "parallel.context", "the mlp model has none"),
])
def test_a_layout_context_parallelism_cannot_train_is_one_line(d, key, text):
    if key is None:  # the rule stays silent at context 1
        from_dict(d)
        return
    with pytest.raises(ConfigError) as info:
        from_dict(d, source="test.toml")
    assert info.value.key == key and text in str(info.value) and "\n" not in str(info.value), str(info.value)


def test_what_it_trains_passes():
    for layout in ("zigzag", "contiguous"):
        c = from_dict(cfg({"world_size": 8, "tensor": 2, "context_layout": layout, "zero_stage": 3}))
        assert (c.parallel.context, c.parallel.context_layout) == (2, layout)
    assert from_dict(cfg({}, dropout=0.1)).model.dropout == 0.1  # each rank draws its part of the masks
    c = from_dict(cfg({"world_size": 8, "pipeline": 2, "tensor": 2}, n_layer=4))  # stages run the ring
    assert (c.parallel.pipeline, c.parallel.context, c.parallel.tensor) == (2, 2, 2)
