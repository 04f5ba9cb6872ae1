"""Cluster files: the shipped ones load and cite every figure; a user folder shadows them; mistakes are one
line naming the file, the line and the key."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from engine.config import ConfigError
from engine.projection.clusters import FIELDS, cluster_dirs, find_cluster, list_clusters, load_cluster
from nanodist_tui.cli import app
from tests.projection_helpers import assert_every_figure_cites

SHIPPED = ("this-machine", "cpu-100gbe", "a100-hdr", "h100-ndr")
SOURCES = ("nominal", "reported", "measured", "assumed", "calibrat")


@pytest.fixture(autouse=True)
def _only_shipped(in_tmp, monkeypatch):
    monkeypatch.delenv("NANODIST_CLUSTERS", raising=False)


def test_the_shipped_clusters_load():
    names = [p.stem for p in list_clusters()]
    assert set(SHIPPED) <= set(names)
    for name in SHIPPED:
        cluster = load_cluster(name)
        assert cluster.name and cluster.max_ranks >= 1
    assert load_cluster("this-machine").calibrated
    h100 = load_cluster("h100-ndr")
    assert h100.peak_flops("bf16") == 989e12 and h100["intra.bandwidth_gbs"] == 370
    assert h100["intra.nominal_gbs"] == 450 and h100.max_ranks == 4096


@pytest.mark.parametrize("name", SHIPPED)
def test_every_figure_says_where_it_comes_from(name):
    """Each numeric setting carries a comment naming its kind of source: nominal (datasheet), reported
    (a published measurement), measured (by nanoDist), assumed, or calibrated here."""
    assert_every_figure_cites(name, find_cluster(name).read_text(), SOURCES)


def test_a_user_folder_shadows_the_shipped_ones(in_tmp, monkeypatch):
    mine = in_tmp / "mine"
    mine.mkdir()
    (mine / "a100-hdr.toml").write_text('name = "my A100s"\nranks_per_node = 1\n'
                                        '[compute]\npeak_tflops_bf16 = 1\n')
    monkeypatch.setenv("NANODIST_CLUSTERS", str(mine))
    assert cluster_dirs()[0] == mine
    assert load_cluster("a100-hdr").name == "my A100s"
    assert load_cluster(mine / "a100-hdr.toml").name == "my A100s"


@pytest.mark.parametrize("body, key, line, words", [
    ("nodes = 2\n[compute]\npeak_tflops_bf16 = 1\n[inter]\nbandwidth_gbs = 1\nlatency = 3\n", "inter.latency",
     6, "did you mean inter.latency_us?"),
    ("[compute]\npeak_tflops_bf16 = \"fast\"\n", "compute.peak_tflops_bf16", 2, "expected float"),
    ("[compute]\npeak_tflops_bf16 = 1\nefficiency_max = 1.5\n", "compute.efficiency_max", 3, "fraction"),
    ("[compute]\npeak_tflops_bf16 = 1\n[inter]\nnic = \"switch\"\n", "inter.nic", 4, '"rank", "node"'),
    ("ranks_per_node = 8\n", "compute", None, "no compute figures"),
    ("ranks_per_node = 8\n[compute]\npeak_tflops_fp32 = 1\n", "intra.bandwidth_gbs", None, "no bandwidth"),
    ("nodes = 4\n[compute]\npeak_tflops_fp32 = 1\n", "inter.bandwidth_gbs", None, "no link between them"),
    ("[compute]\npeak_tflops_bf16 = inf\n", "compute.peak_tflops_bf16", 2, "inf is not a finite number"),
    ("[compute]\npeak_tflops_bf16 = 1e400\n", "compute.peak_tflops_bf16", 2, "inf is not a finite number"),
    ("[compute]\npeak_tflops_bf16 = nan\n", "compute.peak_tflops_bf16", 2, "nan is not a finite number"),
    ("[compute]\npeak_tflops_bf16 = 0\n", "compute.peak_tflops_bf16", 2, "must be > 0 (leave out"),
    ("[compute]\npeak_tflops_bf16 = -5\n", "compute.peak_tflops_bf16", 2, "must be > 0"),
    ("[compute]\npeak_tflops_bf16 = 1\nmemory_gb = inf\n", "compute.memory_gb", 3, "not a finite"),
    ("[compute]\npeak_tflops_bf16 = 1\nmemory_gb = -80\n", "compute.memory_gb", 3, "must be >= 0"),
    ("nodes = 2\n[compute]\npeak_tflops_bf16 = 1\n[inter]\nbandwidth_gbs = -inf\n", "inter.bandwidth_gbs", 5,
     "-inf is not a finite number"),
    ("nodes = 2\n[compute]\npeak_tflops_bf16 = 1\n[inter]\nbandwidth_gbs = 0\n", "inter.bandwidth_gbs", None,
     "no link between them"),
    ("[compute]\npeak_tflops_bf16 = 1\n[intra]\nlatency_us = nan\n", "intra.latency_us", 4, "not a finite"),
    ("[compute]\npeak_tflops_bf16 = 1\n[intra]\nlatency_us = -1\n", "intra.latency_us", 4, "must be >= 0"),
])
def test_mistakes_are_one_line_naming_file_line_and_key(in_tmp, body, key, line, words):
    path = in_tmp / "bad.toml"
    path.write_text(body)
    with pytest.raises(ConfigError) as err:
        load_cluster(path)
    text = str(err.value)
    assert err.value.key == key and err.value.line == line and words in text
    assert text.startswith(str(path)) and "\n" not in text


@pytest.mark.parametrize("peak, words", [("inf", "inf is not a finite number"), ("nan", "nan is not a finite "
                                         "number"), ("0", "0.0 must be > 0"), ("-312", "-312.0 must be > 0")])
def test_project_refuses_a_peak_that_is_not_a_figure_in_one_line(in_tmp, peak, words):
    """The tester's file: an infinite peak predicted MFU 0.0% (a NaN or 0 one was no better)."""
    path = in_tmp / "odd.toml"
    path.write_text(f"[compute]\npeak_tflops_fp32 = {peak}\n")
    result = CliRunner().invoke(app, ["project", "--cluster", str(path)])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert lines[0].startswith(f"error: {path}:2: compute.peak_tflops_fp32: {words}")


def test_project_refuses_a_cluster_without_a_peak_for_the_runs_dtype(in_tmp):
    """Only a bf16 peak and an fp32 run: the projection had no rate (a division by zero, exit 1)."""
    path = in_tmp / "bf16.toml"
    path.write_text("[compute]\npeak_tflops_bf16 = 312\n")
    result = CliRunner().invoke(app, ["project", "--cluster", str(path), "--set", "precision.dtype=fp32"])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert lines[0] == (f"error: {path}: compute.peak_tflops_fp32: the run computes in fp32, but the cluster "
                        "gives only peak_tflops_bf16; add peak_tflops_fp32 under [compute]")


def test_unknown_names_and_bad_toml(in_tmp):
    with pytest.raises(ConfigError, match="did you mean a100-hdr"):
        load_cluster("a100-hrd")
    bad = in_tmp / "broken.toml"
    bad.write_text("nodes = [1,\n")
    with pytest.raises(ConfigError, match="TOML syntax error"):
        load_cluster(bad)


def test_every_field_has_a_doc_and_a_default_of_its_type():
    for key, (kind, default, check, doc) in FIELDS.items():
        assert doc and isinstance(default, kind), key
        # a peak's default 0 stands for "not given": a written one must be above 0
        assert check(default) is None or key.startswith(("compute.efficiency", "compute.peak_tflops")), key
