"""What a run with parallel.tensor > 1 is refused, each in one line naming its key: a context sequence
parallelism cannot split, an mlp model whose layers do not pair up or whose hidden width does not split,
and the settings that need the whole world (hybrid sharding, hierarchical and MPI-native all-reduces)."""

from __future__ import annotations

import pytest

from engine.config import ConfigError, from_dict

BASE = {"parallel": {"world_size": 4, "tensor": 2}, "train": {"global_batch": 8}}


def _with(**over) -> dict:
    d = {k: dict(v) for k, v in BASE.items()}
    for key, value in over.items():
        section, name = key.split("__")
        d.setdefault(section, {})[name] = value
    return d


MLP = {"model__kind": "mlp", "data__kind": "synthetic-classification"}


@pytest.mark.parametrize("over, key, text", [
    (dict(parallel__sequence_parallel=True, model__block_size=6, parallel__tensor=4),
     "parallel.sequence_parallel", "splits the context of model.block_size 6 tokens 4 ways, and 4 does not "
     "divide it"),
    (dict(parallel__sequence_parallel=True, **MLP), "parallel.sequence_parallel",
     "splits a sequence, and the mlp model has none"),
    (dict(model__widths=[8, 16, 4, 3], **MLP), "parallel.tensor",
     "2 splits the mlp model's layers in pairs (column-, then row-parallel), and its 3 layers do not pair "
     "up"),
    (dict(model__widths=[8, 15, 4], **MLP), "parallel.tensor", "2 does not divide the hidden width 15"),
    (dict(model__widths=[8, 16, 8, 16, 4], model__dropout=0.1, **MLP), "parallel.tensor",
     "planned for one hidden layer only"),
    (dict(parallel__zero_stage=1, parallel__hybrid=True, parallel__ranks_per_node=2), "parallel.hybrid",
     "with tensor > 1 ZeRO shards over the data-parallel group"),
    (dict(parallel__algorithm="hierarchical", parallel__ranks_per_node=2), "parallel.algorithm",
     '"hierarchical" runs over the whole world'),
])
def test_what_tensor_parallelism_cannot_split_is_one_line(over, key, text):
    with pytest.raises(ConfigError) as info:
        from_dict(_with(**over), source="test.toml")
    err = info.value
    assert "\n" not in str(err) and err.key == key and text in str(err), str(err)


def test_what_it_can_split_trains():
    cfg = from_dict(_with(parallel__sequence_parallel=True, model__block_size=8, parallel__zero_stage=3))
    assert (cfg.parallel.tensor, cfg.parallel.sequence_parallel) == (2, True)
    assert from_dict(_with(model__widths=[8, 16, 4], **MLP)).parallel.tensor == 2
    assert from_dict(_with(parallel__ranks_per_node=2)).parallel.ranks_per_node == 2  # emulated nodes: fine
