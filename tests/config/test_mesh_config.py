"""The mesh keys of [parallel]: their defaults, the rules that refuse impossible layouts, the batch split over
the data-parallel degree (what remains of the world), and the one place that says which degrees a run may
train (engine.config.vocabulary.IMPLEMENTED_AXES), lifted only while a layout is described."""

from __future__ import annotations

import pytest

from engine.config import Config, ConfigError, from_dict
from engine.config import rules_layout as config_rules
from engine.config.rules_layout import describing_layout


def error_of(d: dict) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        from_dict(d, source="test.toml")
    assert "\n" not in str(info.value)
    return info.value


def described(d: dict) -> Config:
    with describing_layout():
        return from_dict(d, source="test.toml")


def test_the_defaults_are_one_rank_of_pure_data_parallelism():
    p = Config().parallel
    assert (p.tensor, p.pipeline, p.context, p.expert) == (1, 1, 1, 1)
    assert p.order == "tp-cp-ep-dp-pp" and p.sequence_parallel is False


@pytest.fixture
def cp_and_ep_not_built(monkeypatch):
    """A release without context and expert parallelism: what the refusal of an axis not built looks like."""
    monkeypatch.setattr(config_rules, "IMPLEMENTED_AXES", frozenset({"dp", "tp", "pp"}))


@pytest.mark.parametrize("key", ["context", "expert"])
def test_a_degree_not_built_yet_is_refused_in_a_run(key, cp_and_ep_not_built):
    err = error_of({"parallel": {"world_size": 4, key: 2}})
    assert str(err) == (f"test.toml: parallel.{key}: {key} parallelism ({key} = 2) is not implemented yet "
                        f"in this release; set parallel.{key} = 1 (`nanodist-tui mesh` shows the layout it "
                        "would make)")
    assert getattr(described({"parallel": {"world_size": 4, key: 2}}).parallel, key) == 2


def test_describing_ends_with_its_block(cp_and_ep_not_built):
    described({"parallel": {"world_size": 4, "context": 2}})
    assert error_of({"parallel": {"world_size": 4, "context": 2}}).key == "parallel.context"


def test_one_set_says_which_degrees_a_run_may_train(monkeypatch):
    """The rule reads IMPLEMENTED_AXES alone: naming an axis there lets runs use it (tensor and pipeline
    parallelism train; taken out of the set, they are refused again)."""
    assert from_dict({"parallel": {"world_size": 4, "tensor": 2}}).parallel.tensor == 2
    assert from_dict({"parallel": {"world_size": 4, "pipeline": 2}}).parallel.pipeline == 2
    monkeypatch.setattr(config_rules, "IMPLEMENTED_AXES", frozenset({"dp"}))
    assert error_of({"parallel": {"world_size": 4, "tensor": 2}}).key == "parallel.tensor"
    assert error_of({"parallel": {"world_size": 4, "pipeline": 2}}).key == "parallel.pipeline"


@pytest.mark.parametrize("parallel, model, key, text", [
    ({"world_size": 6, "tensor": 4}, {}, "parallel.world_size",
     "6 is not a multiple of tensor 4 x pipeline 1 x context 1 = 4; use a world_size that is a multiple of 4 "
     "(e.g. 4 or 8), or degrees whose product divides it"),
    ({"world_size": 10, "pipeline": 2, "context": 3}, {}, "parallel.world_size",
     "10 is not a multiple of tensor 1 x pipeline 2 x context 3 = 6; use a world_size that is a multiple "
     "of 6 (e.g. 6 or 12)"),
    ({"world_size": 8, "tensor": 8}, {"n_head": 4, "n_embd": 64}, "parallel.tensor",
     "8 does not divide model.n_head 4: each tensor-parallel rank holds whole attention heads; use a divisor "
     "of 4: 1, 2, 4"),
    ({"world_size": 4, "pipeline": 4}, {"n_layer": 2}, "parallel.pipeline",
     "4 stages for 2 layers: every stage needs at least one; use at most 2"),
    ({"world_size": 12, "tensor": 2, "expert": 4}, {}, "parallel.expert",
     "4 does not divide the 6 data x context ranks experts are spread over (world_size 12 / (tensor 2 x "
     "pipeline 1)); use a divisor of 6: 1, 2, 3, 6"),
    ({"world_size": 2, "sequence_parallel": True}, {}, "parallel.sequence_parallel",
     "splits the sequence over the tensor-parallel ranks, but parallel.tensor = 1; set parallel.tensor > 1, "
     "or sequence_parallel = false"),
    ({"order": "tp-cp-ep-dp"}, {}, "parallel.order",
     '"tp-cp-ep-dp" is not an axis order: it leaves out pp; name tp, cp, ep, dp, pp once each, innermost '
     'first, e.g. "tp-cp-ep-dp-pp"'),
    ({"order": "tp-tp-ep-dp-pp"}, {}, "parallel.order", '"tp-tp-ep-dp-pp" is not an axis order: it names tp '
     "twice"),
    ({"expert": 0}, {}, "parallel.expert", "0 is out of range; use a value >= 1 and <= 1024"),
])
def test_an_impossible_layout_is_one_line_naming_its_key(parallel, model, key, text):
    d = {"parallel": parallel, "model": model, "train": {"global_batch": 48}}
    with describing_layout():  # the layout rules hold whether or not the degrees are trained yet
        err = error_of(d)
    assert err.key == key and str(err).startswith(f"test.toml: {key}: {text}"), str(err)


def test_the_batch_splits_over_the_data_parallel_degree():
    """world 8 = dp 2 x tp 2 x pp 2: 2 data-parallel ranks share the batch, not 8."""
    cfg = described({"parallel": {"world_size": 8, "tensor": 2, "pipeline": 2}, "train": {"global_batch": 6}})
    assert cfg.train.global_batch == 6
    with describing_layout():
        err = error_of({"parallel": {"world_size": 8, "tensor": 2}, "train": {"global_batch": 6}})
    assert str(err) == ("test.toml: train.global_batch: 6 cannot be split evenly over the data-parallel "
                        "degree 4 x micro_batches 1 = 4; use a multiple of 4, e.g. 4")
    # pure data parallelism keeps its words
    assert "over world_size 3 x micro_batches 1" in str(error_of({"parallel": {"world_size": 3}}))


def test_a_sweep_cannot_reach_a_degree_not_built_yet(cp_and_ep_not_built):
    err = error_of({"parallel": {"world_size": 2}, "sweep": {"space": {"parallel.context": {
        "type": "categorical", "choices": [1, 2]}}}})
    assert err.key == "sweep.space.parallel.context.choices" and "not implemented yet" in err.problem
