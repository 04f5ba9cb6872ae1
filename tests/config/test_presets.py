"""Presets: lookup, every shipped file validates, malformed files and overrides, byte-exact round trips."""
import os
import sys
from pathlib import Path

import pytest
import tomlkit

from engine import config
from engine.config import ConfigError, presets

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted((REPO / "presets").glob("*.toml"))
BAD = sorted((Path(__file__).parents[1] / "bad_presets").glob("*.toml"))
REQUIRED = {"quickstart", "gpt-mini", "gpt-baby", "mlp", "ddp-2", "ddp-4", "zero1-4", "zero2-2", "zero2-4",
            "zero3-2", "zero3-4", "processes-2", "fp16-dynamic", "bf16", "checkpointing", "seed-table",
            "sweep-lr", "sweep-zero"}


def test_all_required_presets_are_shipped():
    assert REQUIRED - {p.stem for p in SHIPPED} == set()


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_shipped_preset_validates_and_names_itself(path):
    cfg, doc, found = presets.load_preset(path)
    assert cfg.name == path.stem and cfg.description and found == path
    assert config.from_dict(doc.unwrap()) == cfg


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_every_key_in_a_shipped_preset_is_commented_with_its_default(path):
    for line in path.read_text().splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            assert " # " in line, line
            comment = line.split(" # ", 1)[1]
            assert "; default " in comment or "required" in comment, line


def test_zero_examples_at_two_world_sizes():
    shipped = {p.stem: presets.load_preset(p)[0] for p in SHIPPED}
    for stage in (2, 3):
        small, large = shipped[f"zero{stage}-2"], shipped[f"zero{stage}-4"]
        assert (small.parallel.zero_stage, small.parallel.world_size) == (stage, 2)
        assert (large.parallel.zero_stage, large.parallel.world_size) == (stage, 4)
        assert small.model == large.model and small.train == large.train  # only the world size differs


def test_sweep_presets_search_float_int_and_categorical():
    lr, zero = presets.load_preset("sweep-lr")[0].sweep, presets.load_preset("sweep-zero")[0].sweep
    assert {p.type for p in [*lr.space.values(), *zero.space.values()]} == {"float", "int", "categorical"}
    assert zero.metric == "val_loss" and zero.space["optim.lr"].log
    assert zero.space["parallel.bucket_cap_mb"].choices == (0.0625, 0.25, 25.0)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_load_then_save_is_byte_identical(path, tmp_path):
    _, doc, _ = presets.load_preset(path)
    presets.save_preset(doc, tmp_path / path.name)
    assert (tmp_path / path.name).read_bytes() == path.read_bytes()


def test_seed_table_has_8_4_million_parameters():
    m = presets.load_preset("seed-table")[0].model
    d, V, T, L = m.n_embd, m.vocab_size, m.block_size, m.n_layer
    assert m.tie_weights and V * d + T * d + L * (12 * d * d + 13 * d) + 2 * d == 8_400_000


def test_gpt_baby_is_nanogpts_baby_shape():
    """nanoGPT's config/train_shakespeare_char.py: 6 layers, 6 heads, width 384, context 256, dropout 0.2,
    no biases; beta2 0.99, 100 warmup steps, min_lr a tenth of lr; on the shipped corpus, batch 8."""
    cfg = presets.load_preset("gpt-baby")[0]
    m = cfg.model
    assert (m.kind, m.n_layer, m.n_head, m.n_embd, m.block_size) == ("gpt", 6, 6, 384, 256)
    assert (m.dropout, m.bias, m.tie_weights) == (0.2, False, True)
    assert (cfg.data.kind, cfg.train.global_batch, cfg.parallel.world_size) == ("stdlib", 8, 1)
    o = cfg.optim
    assert (o.beta2, o.warmup_steps, o.schedule) == (0.99, 100, "cosine")
    assert o.min_lr == pytest.approx(o.lr / 10)


def test_quickstart_lists_every_setting():
    doc = presets.read_document(REPO / "presets" / "quickstart.toml")
    written = set(presets._flat(doc.unwrap()))
    expected = {k for k in config.setting_keys() if not k.startswith("sweep.")}
    assert expected - written == set()
    defaults = presets._flat(config.to_dict(config.Config()))
    for key in ("model.widths", "data.path", "data.n_samples"):  # read only by other model/data kinds
        assert presets._flat(doc.unwrap())[key] == defaults[key]


@pytest.mark.parametrize("path", BAD, ids=lambda p: p.stem)
def test_malformed_preset_gives_one_line_naming_file_and_key(path):
    expected = path.read_text().splitlines()[0].removeprefix("# expect: ")
    with pytest.raises(ConfigError) as info:
        presets.load_preset(path)
    message = str(info.value)
    assert "\n" not in message and str(path) in message and expected in message, message
    line = presets.locate_key(path.read_text(), info.value.key) if info.value.key else None
    if line:
        assert message.startswith(f"{path}:{line}: ")


def test_enough_malformed_presets():
    assert len(BAD) >= 20


def test_syntax_errors_carry_the_line(tmp_path):
    for name in ("syntax_unclosed_string", "syntax_duplicate_key", "syntax_bad_header"):
        path = Path(__file__).parents[1] / "bad_presets" / f"{name}.toml"
        with pytest.raises(ConfigError, match=rf"^{path}:\d+: TOML syntax error"):
            presets.load_preset(path)


@pytest.mark.parametrize("override, expected", [
    ("optim.lr", "--set: \"optim.lr\" is not of the form key=value"),
    ("=3", "not of the form key=value"),
    ("optim.lr=", "not of the form key=value"),
    ("optim.lrr=1e-3", "--set optim.lrr=1e-3: optim.lrr: unknown key; did you mean optim.lr?"),
    ("optimizer.lr=1e-3", "optimizer.lr: unknown key"),
    ("model.n_layer=two", "--set model.n_layer=two: model.n_layer: expected a whole number"),
    ("train.steps=true", "--set train.steps=true: train.steps: expected a whole number"),
    ("optim.lr=-1", "--set optim.lr=-1: optim.lr: -1.0 is out of range"),
    ("parallel.backend=nccl", "--set parallel.backend=nccl: parallel.backend: \"nccl\" is not allowed"),
    ("precision.loss_scale=512", "--set precision.loss_scale=512: precision.loss_scale: a static loss scale"),
    ("model.n_head=5", "--set model.n_head=5: model.n_head: 5 heads do not divide n_embd 64"),
    ("sweep.space.optim.lr.low=1", "--set sweep.space.optim.lr.low=1: sweep.space.optim.lr.high: float"),
])
def test_bad_overrides(override, expected):
    with pytest.raises(ConfigError) as info:
        presets.load_preset("quickstart", [override])
    assert expected in str(info.value) and "\n" not in str(info.value), str(info.value)


@pytest.mark.parametrize("override, key", [
    ("sweep.space.optim.lr.high=1e-5", "sweep.space.optim.lr.low"),  # high made the file's low invalid
    ("sweep.space.optim.lr.low=0.5", "sweep.space.optim.lr.low"),
    ("sweep.space.optim.lr.type=int", "sweep.space.optim.lr.type"),
    ("sweep.space.optim.lrr.low=1", "sweep.space.optim.lrr"),
])
def test_sweep_space_override_errors_name_the_set_flag(override, key):
    with pytest.raises(ConfigError) as info:
        presets.load_preset("sweep-lr", [override])
    assert str(info.value).startswith(f"--set {override}: {key}: "), str(info.value)


def test_error_caused_by_an_override_elsewhere_names_the_override():
    # global_batch 32 splits over the file's world size; the override makes it unsplittable, so the override
    # is the mistake (issue 27: `--world-size 3` blamed quickstart.toml:34)
    with pytest.raises(ConfigError) as info:
        presets.load_preset("quickstart", ["parallel.world_size=3"])
    assert str(info.value).startswith("--set parallel.world_size=3: train.global_batch:")
    with pytest.raises(ConfigError) as info:
        presets.load_preset("quickstart", [presets.Override("parallel.world_size=3", "--world-size 3")])
    assert str(info.value).startswith("--world-size 3: train.global_batch:")


def test_error_the_file_has_without_overrides_points_at_the_file_line(tmp_path):
    path = tmp_path / "odd.toml"
    path.write_text('name = "odd"\n[train]\nglobal_batch = 3\n[parallel]\nworld_size = 2\n')
    with pytest.raises(ConfigError) as info:  # an unrelated override does not take the blame
        presets.load_preset(str(path), ["optim.lr=1e-3"])
    assert str(info.value).startswith(f"{path}:3: train.global_batch:")


def test_overrides_parse_toml_literals_and_keep_spelling():
    cfg, doc, _ = presets.load_preset("quickstart", [
        "optim.lr=1e-3", "parallel.backend=processes", 'name="my run"', "model.tie_weights=false",
        "run.out_dir=2024", "precision.dtype=fp16", "precision.loss_scale=dynamic",
        "memory.checkpointing=blocks"])
    assert (cfg.optim.lr, cfg.parallel.backend, cfg.name) == (1e-3, "processes", "my run")
    assert (cfg.model.tie_weights, cfg.run.out_dir, cfg.precision.dtype) == (False, "2024", "fp16")
    assert "lr = 1e-3 " in doc.as_string()


def test_overrides_on_a_plain_dict():
    d = {"optim": {"lr": 0.1}}
    cfg = presets.apply_overrides(d, ["optim.lr=2e-3", "sweep.space.optim.lr.type=float",
                                      "sweep.space.optim.lr.low=1e-4", "sweep.space.optim.lr.high=1e-2"])
    assert cfg.optim.lr == 2e-3 and d["optim"]["lr"] == 2e-3
    assert cfg.sweep.space["optim.lr"].high == 1e-2


def changed_lines(before: str, after: str) -> list[tuple[str, str]]:
    a, b = before.splitlines(), after.splitlines()
    assert len(a) == len(b)
    return [(x, y) for x, y in zip(a, b, strict=True) if x != y]


def test_set_value_changes_exactly_one_line_and_keeps_its_comment():
    doc = presets.read_document(REPO / "presets" / "quickstart.toml")
    before = doc.as_string()
    presets.set_value(doc, "optim.lr", 1e-3)
    [(old, new)] = changed_lines(before, doc.as_string())
    assert old.startswith("lr = 3e-3") and new.startswith("lr = 1e-3")
    assert old.split("#", 1)[1] == new.split("#", 1)[1]
    edits = [("train.steps", 500, "steps = 500"), ("parallel.backend", "tcp", 'backend = "tcp"'),
             ("model.bias", False, "bias = false"), ("optim.beta2", 0.98, "beta2 = 0.98")]
    for key, value, text in edits:
        before = doc.as_string()
        presets.set_value(doc, key, value)
        [(old, new)] = changed_lines(before, doc.as_string())
        assert new.startswith(text) and "#" in new, new
    assert config.from_dict(doc.unwrap()).train.steps == 500


def test_set_value_of_an_equal_value_changes_nothing():
    doc = presets.read_document(REPO / "presets" / "quickstart.toml")
    before = doc.as_string()
    presets.set_value(doc, "optim.lr", float(doc["optim"]["lr"]))  # 3e-3 written as 0.003: same value
    presets.set_value(doc, "train.steps", int(doc["train"]["steps"]))
    assert doc.as_string() == before


def test_set_value_adds_missing_keys_and_tables():
    doc = presets.read_document(REPO / "presets" / "sweep-lr.toml")
    before = doc.as_string()
    presets.set_value(doc, "memory.checkpointing", "blocks")
    presets.set_value(doc, "sweep.space.optim.lr.high", 0.05)
    presets.set_value(doc, "sweep.space.train.micro_batches.type", "categorical")
    presets.set_value(doc, "sweep.space.train.micro_batches.choices", [1, 2])
    cfg = config.from_dict(tomlkit.parse(doc.as_string()).unwrap())
    assert cfg.memory.checkpointing == "blocks" and cfg.sweep.space["optim.lr"].high == 0.05
    assert cfg.sweep.space["train.micro_batches"].choices == (1, 2)
    kept = [line for line in before.splitlines() if "#" in line and "high = 1e-2" not in line]
    assert all(line in doc.as_string() for line in kept)


def test_added_keys_and_tables_get_their_doc_as_comment():
    doc = presets.read_document(REPO / "presets" / "sweep-lr.toml")
    presets.apply_overrides(doc, ["precision.dtype=fp16", "optim.lr=1e-3",
                                  "sweep.space.train.micro_batches.type=categorical",
                                  "sweep.space.train.micro_batches.choices=[1, 2]"])
    text = doc.as_string()
    assert "\n[precision]  # number formats and loss scaling\n" in text
    assert ('dtype = "fp16"  # "fp32" | "fp16" | "bf16" | "fp64" for parameters and activations; '
            'default "fp32"\n') in text
    assert "lr = 1e-3            # peak learning rate (AdamW); default 3e-4\n" in text  # its own comment
    assert ("[sweep.space.train.micro_batches]  # search over train.micro_batches: gradient-accumulation "
            "micro-batches per step on each rank\n") in text
    assert 'type = "categorical"  # "float" | "int" | "categorical"; default "float"\n' in text
    assert "choices = [1, 2]  # values to pick from (categorical)\n" in text
    for line in text.splitlines():
        if "=" in line and not line.startswith("#"):
            assert " # " in line, line
    assert config.from_dict(tomlkit.parse(text).unwrap()).precision.dtype == "fp16"


def test_save_is_atomic_and_keeps_permissions(tmp_path):
    target = tmp_path / "p.toml"
    target.write_text("a = 1\n")
    os.chmod(target, 0o640)
    presets.save_preset(tomlkit.parse("a = 2\n"), target)
    assert target.read_text() == "a = 2\n" and (target.stat().st_mode & 0o777) == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["p.toml"]  # no temporary file left behind


def test_missing_file_and_unknown_name():
    with pytest.raises(ConfigError, match=r"^nope/missing\.toml: file not found; "):
        presets.load_preset("nope/missing.toml")
    with pytest.raises(ConfigError, match=r"^quickstrat: no preset with this name; did you mean quickstart"):
        presets.load_preset("quickstrat")


def test_lookup_order_user_then_cwd_then_repo(tmp_path, monkeypatch):
    user, cwd = tmp_path / "user", tmp_path / "work"
    (cwd / "presets").mkdir(parents=True)
    user.mkdir()
    (user / "quickstart.toml").write_text('name = "quickstart"\ndescription = "user copy"\n')
    (cwd / "presets" / "quickstart.toml").write_text('name = "quickstart"\ndescription = "cwd copy"\n')
    (cwd / "presets" / "mine.toml").write_text('name = "mine"\ndescription = "only here"\n')
    (cwd / "presets" / "broken.toml").write_text("name = \n")
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("NANODIST_PRESETS", str(user))
    found = {p.name: p for p in presets.list_presets()}
    assert found["quickstart"].description == "user copy" and found["quickstart"].origin == "user"
    assert found["mine"].origin == "cwd" and found["gpt-mini"].origin == "repo"
    assert found["broken"].error
    assert presets.load_preset("mine")[0].description == "only here"
    monkeypatch.delenv("NANODIST_PRESETS")
    assert presets.load_preset("quickstart")[0].description == "cwd copy"


def test_installed_package_folder_is_searched_last(tmp_path, monkeypatch):
    package = tmp_path / "site" / "nanodist_tui"
    (package / "presets").mkdir(parents=True)
    (package / "__init__.py").write_text("raise RuntimeError('must not be imported')\n")
    (package / "presets" / "packaged-only.toml").write_text('name = "packaged-only"\ndescription = "x"\n')
    monkeypatch.delitem(sys.modules, "nanodist_tui", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert presets.search_dirs()[-1] == ("package", package / "presets")
    assert presets.find_preset("packaged-only") == package / "presets" / "packaged-only.toml"


def test_diff_presets():
    diff = dict((k, (a, b)) for k, a, b in presets.diff_presets("quickstart", "zero2-4"))
    assert diff["parallel.zero_stage"] == (0, 2) and "parallel.world_size" not in diff  # both on 4 ranks
    assert ("parallel.world_size", 4, 2) in presets.diff_presets("quickstart", "ddp-2")
    assert "optim.beta1" not in diff
    assert presets.diff_presets("quickstart", presets.load_preset("quickstart")[0]) == []
    assert ("sweep.n_trials", None, 20) in presets.diff_presets("quickstart", "sweep-lr")


def test_resolved_document_fills_defaults_and_keeps_comments():
    cfg, doc, path = presets.load_preset("mlp")
    resolved = presets.resolved_document(doc)
    assert config.from_dict(resolved.unwrap()) == cfg
    lines = iter(resolved.as_string().splitlines())
    assert all(original in lines for original in path.read_text().splitlines())  # every line kept, in order
    assert 'checkpointing = "none"  # default' in resolved.as_string()


def test_locate_key():
    text = ('a = 1\n[model]\nn_layer = 2  # x\n[sweep.space."optim.lr"]\nlow = 1\n'
            '[sweep.space.optim.wd]\nlow = 2\n')
    assert presets.locate_key(text, "a") == 1
    assert presets.locate_key(text, "model.n_layer") == 3
    assert presets.locate_key(text, "[model]") == 2
    assert presets.locate_key(text, "sweep.space.optim.lr.low") == 5
    assert presets.locate_key(text, "sweep.space.optim.wd.low") == 7
    assert presets.locate_key(text, "model.n_head") is None
