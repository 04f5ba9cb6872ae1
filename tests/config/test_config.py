"""Config tree: defaults, types, ranges, combinations, sweep space, replace, data checks."""
import dataclasses
import pickle

import pytest

from engine import config
from engine.config import Config, ConfigError, from_dict, replace, to_dict


def error_of(d: dict) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        from_dict(d, source="test.toml")
    message = str(info.value)
    assert "\n" not in message and message.startswith("test.toml: ")
    return info.value


def test_empty_dict_gives_the_defaults():
    assert from_dict({}) == Config()


def test_every_setting_has_a_default_and_a_doc():
    cfg = Config()
    for key in config.setting_keys():
        assert config.describe(key).strip(), key
        section, _, name = key.rpartition(".")
        if section != "sweep":
            assert hasattr(getattr(cfg, section) if section else cfg, name), key


def test_to_dict_round_trips():
    cfg = replace(Config(), "optim.lr", 1e-3)
    assert from_dict(to_dict(cfg)) == cfg
    assert "sweep" not in to_dict(cfg)


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        Config().model.n_layer = 3


def test_ints_are_accepted_for_floats():
    cfg = from_dict({"optim": {"lr": 1, "grad_clip": 0}})
    assert cfg.optim.lr == 1.0 and type(cfg.optim.lr) is float
    assert type(cfg.optim.grad_clip) is float


@pytest.mark.parametrize("section, key, value", [
    ("train", "steps", True), ("model", "n_head", 4.0), ("model", "tie_weights", 1), ("optim", "lr", "3e-4"),
    ("model", "widths", [784, True, 10]), ("parallel", "backend", 3),
])
def test_wrong_types_are_rejected(section, key, value):
    err = error_of({section: {key: value}})
    assert err.key == f"{section}.{key}" and "expected" in err.problem


def test_unknown_keys_suggest_the_right_one():
    assert "did you mean model.n_layer?" in str(error_of({"model": {"n_layers": 2}}))
    assert "did you mean optim.lr?" in str(error_of({"train": {"lr": 0.1}}))
    assert "did you mean model.n_layer?" in str(error_of({"n_layer": 2}))
    assert "did you mean [optim]?" in str(error_of({"optimizer": {"lr": 0.1}}))


@pytest.mark.parametrize("d, key", [
    ({"optim": {"lr": 0}}, "optim.lr"), ({"optim": {"lr": float("nan")}}, "optim.lr"),
    ({"model": {"dropout": 1.0}}, "model.dropout"), ({"parallel": {"zero_stage": -1}}, "parallel.zero_stage"),
    ({"data": {"val_fraction": 0}}, "data.val_fraction"), ({"precision": {"backoff_factor": 1}},
                                                            "precision.backoff_factor"),
    ({"precision": {"loss_scale": -2}}, "precision.loss_scale"), ({"run": {"out_dir": " "}}, "run.out_dir"),
    ({"model": {"kind": "mlp", "widths": [784]}, "data": {"kind": "synthetic-classification"}},
     "model.widths"),
    ({"precision": {"dtype": "float16"}}, "precision.dtype"),
    ({"memory": {"checkpointing": "every:x"}}, "memory.checkpointing"),
])
def test_out_of_range_and_bad_enums(d, key):
    assert error_of(d).key == key


def test_enum_errors_suggest_the_close_value():
    assert 'did you mean "fp16"?' in str(error_of({"precision": {"dtype": "float16"}}))


def test_batch_must_split_over_ranks_and_micro_batches():
    err = error_of({"train": {"global_batch": 30, "micro_batches": 2}, "parallel": {"world_size": 4}})
    assert err.key == "train.global_batch" and "multiple of 8" in err.fix
    from_dict({"train": {"global_batch": 32, "micro_batches": 2}, "parallel": {"world_size": 4}})


def test_heads_must_divide_width():
    err = error_of({"model": {"n_embd": 64, "n_head": 6}})
    assert err.key == "model.n_head" and "[4, 8]" in err.fix


def test_loss_scale_decision():
    # "dynamic" is inert outside fp16; a static number only makes sense for fp16
    for dtype in ("fp32", "bf16", "fp64"):
        assert from_dict({"precision": {"dtype": dtype}}).precision.loss_scale == "dynamic"
        assert error_of({"precision": {"dtype": dtype, "loss_scale": 1024}}).key == "precision.loss_scale"
    assert from_dict({"precision": {"dtype": "fp16", "loss_scale": 1024}}).precision.loss_scale == 1024.0


@pytest.mark.parametrize("section, kinds, key, value", [
    ("model", {"model": {"kind": "mlp"}, "data": {"kind": "synthetic-classification"}}, "n_layer", 4),
    ("model", {"model": {"kind": "mlp"}, "data": {"kind": "synthetic-classification"}}, "block_size", 64),
    ("model", {"model": {"kind": "gpt"}}, "widths", [4, 2]),
    ("data", {"data": {"kind": "stdlib"}}, "path", "corpus.txt"),
    ("data", {"data": {"kind": "stdlib"}}, "n_samples", 128),
    ("data", {"data": {"kind": "synthetic-lm"}}, "max_chars", 1000),
])
def test_a_setting_the_chosen_kind_does_not_read_is_an_error(section, kinds, key, value):
    d = {k: dict(v) for k, v in kinds.items()}
    d.setdefault(section, {})[key] = value
    err = error_of(d)
    kind = d[section].get("kind", "gpt" if section == "model" else "stdlib")
    assert err.key == f"{section}.{key}"
    assert f'{section}.kind = "{kind}" does not read it' in err.problem
    assert f"set {section}.kind =" in err.fix
    default = {f.name: f.default for f in dataclasses.fields(getattr(from_dict(kinds), section))}[key]
    d[section][key] = list(default) if isinstance(default, tuple) else default
    from_dict(d)  # left at its default, it is harmless


def test_model_and_data_must_match():
    assert error_of({"model": {"kind": "mlp"}}).key == "data.kind"
    assert error_of({"data": {"kind": "synthetic-classification"}}).key == "data.kind"
    mlp = {"model": {"kind": "mlp"}, "data": {"kind": "synthetic-classification"}}
    assert from_dict(mlp).model.widths == (784, 1024, 1024, 10)
    assert error_of(mlp | {"memory": {"checkpointing": "blocks"}}).key == "memory.checkpointing"


def test_allowed_combinations():
    from_dict({"train": {"steps": 5}, "optim": {"warmup_steps": 50}})  # a shortened run never reaches peak lr
    from_dict({"parallel": {"zero_stage": 3, "world_size": 1}})
    from_dict({"memory": {"checkpointing": "every:2"}, "model": {"n_layer": 4}})
    from_dict({"parallel": {"backend": "mpi", "algorithm": "mpi-native"}})
    from_dict({"data": {"kind": "synthetic-lm"}})


@pytest.mark.parametrize("d, key", [
    ({"optim": {"lr": 1e-3, "min_lr": 1e-2}}, "optim.min_lr"),
    ({"data": {"kind": "text"}}, "data.path"),
    ({"parallel": {"algorithm": "mpi-native"}}, "parallel.algorithm"),
    ({"precision": {"min_scale": 1e6}}, "precision.min_scale"),
    ({"model": "gpt"}, "model"),
])
def test_impossible_combinations(d, key):
    assert error_of(d).key == key


def lr_space(**extra):
    return {"type": "float", "low": 1e-4, "high": 1e-2, "log": True} | extra


def test_sweep_space_nested_and_quoted_forms_agree():
    nested = from_dict({"sweep": {"space": {"optim": {"lr": lr_space()}}}})
    quoted = from_dict({"sweep": {"space": {"optim.lr": lr_space()}}})
    assert nested == quoted
    param = nested.sweep.space["optim.lr"]
    assert (param.type, param.low, param.high, param.log) == ("float", 1e-4, 1e-2, True)
    assert from_dict(to_dict(nested)) == nested


@pytest.mark.parametrize("space, key", [
    ({"optim.lrr": lr_space()}, "sweep.space.optim.lrr"),
    ({"optim.lr": lr_space(low=0.0)}, "sweep.space.optim.lr.low"),
    ({"optim.lr": lr_space(low=1.0, high=0.1)}, "sweep.space.optim.lr.low"),
    ({"optim.lr": lr_space(lo=1.0)}, "sweep.space.optim.lr.lo"),
    ({"optim.lr": lr_space(type="int")}, "sweep.space.optim.lr.type"),
    ({"train.steps": {"type": "float", "low": 1, "high": 5}}, "sweep.space.train.steps.type"),
    ({"parallel.world_size": {"type": "int", "low": 1, "high": 3}}, "sweep.space.parallel.world_size.high"),
    ({"optim.schedule": {"type": "categorical", "choices": []}}, "sweep.space.optim.schedule.choices"),
    ({"optim.schedule": {"type": "categorical", "choices": ["cosine", "step"]}},
     "sweep.space.optim.schedule.choices"),
    ({}, "sweep.space"),
])
def test_bad_sweep_spaces(space, key):
    assert error_of({"sweep": {"space": space}}).key == key


def test_categorical_sweep():
    space = {"parallel.zero_stage": {"type": "categorical", "choices": [0, 1, 2]}}
    cfg = from_dict({"sweep": {"space": space, "n_trials": 3}, "parallel": {"world_size": 2}})
    assert cfg.sweep.space["parallel.zero_stage"].choices == (0, 1, 2)


def test_replace_validates_and_copies():
    cfg = Config()
    assert replace(cfg, "parallel.world_size", 4).parallel.world_size == 4
    assert cfg.parallel.world_size == 1
    with pytest.raises(ConfigError, match="replace parallel.world_size: train.global_batch"):
        replace(cfg, "parallel.world_size", 3)
    swept = from_dict({"sweep": {"space": {"optim.lr": lr_space()}}})
    assert replace(swept, "sweep.space.optim.lr.high", 0.1).sweep.space["optim.lr"].high == 0.1


def test_split_key():
    assert config.split_key("optim.lr") == ("optim", "lr")
    assert config.split_key("sweep.space.optim.lr.low") == ("sweep", "space", "optim.lr", "low")
    assert config.split_key("sweep.space.optim.lr") == ("sweep", "space", "optim.lr")


def test_context_longer_than_data():
    cfg = Config()  # block_size 32
    config.check_against_data(cfg, n_train_tokens=33, n_val_tokens=33)
    with pytest.raises(ConfigError, match="model.block_size: context of 32 tokens is longer than the train"):
        config.check_against_data(cfg, n_train_tokens=20)
    with pytest.raises(ConfigError, match="validation data"):
        config.check_against_data(cfg, n_train_tokens=1000, n_val_tokens=10)
    with pytest.raises(ConfigError, match="model.vocab_size"):
        config.check_against_data(replace(cfg, "model.vocab_size", 50), 1000, data_vocab=90)


def test_error_is_one_line_and_picklable():
    err = ConfigError("a.b", "bad\nvalue", "fix\nit", source="f.toml", line=3)
    assert str(err) == "f.toml:3: a.b: bad value; fix it"
    assert str(pickle.loads(pickle.dumps(err))) == str(err)


def test_ranks_per_node_must_divide_the_world():
    assert from_dict({"parallel": {"world_size": 4, "ranks_per_node": 2}}).parallel.ranks_per_node == 2
    assert from_dict({"parallel": {"world_size": 4}}).parallel.ranks_per_node == 0  # one node
    err = error_of({"parallel": {"world_size": 4, "ranks_per_node": 3}})
    assert err.key == "parallel.ranks_per_node" and "does not divide world_size 4" in err.problem
    assert error_of({"parallel": {"ranks_per_node": -1}}).key == "parallel.ranks_per_node"


def test_algorithms_and_hybrid_sharding_against_the_grid_and_stage():
    grid = {"world_size": 4, "ranks_per_node": 2}
    hybrid = {**grid, "zero_stage": 2, "hybrid": True, "algorithm": "auto"}
    assert from_dict({"parallel": {**grid, "algorithm": "hierarchical"}}).parallel.algorithm == "hierarchical"
    assert from_dict({"parallel": hybrid}).parallel.hybrid
    for algorithm in ("rhd", "tree", "auto"):
        assert from_dict({"parallel": {"world_size": 4, "algorithm": algorithm}}).parallel.algorithm \
            == algorithm
    cases = [  # (parallel settings, key named, words in the problem, words in the fix)
        ({"world_size": 4, "algorithm": "hierarchical"}, "parallel.algorithm", "needs a node grid",
         "ranks_per_node"),
        ({**grid, "hybrid": True}, "parallel.hybrid", "zero_stage 0 shards nothing",
         "zero_stage to 1, 2 or 3"),
        ({"world_size": 4, "zero_stage": 1, "hybrid": True}, "parallel.hybrid", "needs a node grid",
         "ranks_per_node"),
        ({**grid, "zero_stage": 3, "hybrid": True, "algorithm": "hierarchical"}, "parallel.algorithm",
         "inter-node step", '"rhd"'),
        ({"world_size": 4, "zero_stage": 2, "algorithm": "rhd"}, "parallel.algorithm",
         "no all-reduce reads it", "parallel.hybrid = true"),
        ({"world_size": 4, "algorithm": "halving"}, "parallel.algorithm", "not allowed", '"rhd"'),
    ]
    for settings, key, problem, fix in cases:
        err = error_of({"parallel": settings})
        assert (err.key, problem in err.problem, fix in err.fix) == (key, True, True), (settings, str(err))
    # the allowed values in the field doc and the message come from the one tuple
    from engine.comm.collectives import ALGORITHMS
    assert all(f'"{a}"' in config.describe("parallel.algorithm") for a in ALGORITHMS)
