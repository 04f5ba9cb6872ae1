"""Fixtures for the projection tests: a small GPT config and a calibration file written by hand (no timing),
with figures chosen so every prediction can be worked out on paper."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

from engine.config import from_dict
from engine.projection.calibrate import VERSION, Calibration
from engine.projection.clusters import load_cluster
from engine.projection.flops import model_signature

# 2 blocks of width 64, context 32, vocabulary 65, synthetic data (nothing to load)
SMALL = {"name": "small",
         "model": {"n_layer": 2, "n_embd": 64, "n_head": 4, "block_size": 32, "vocab_size": 65},
         "data": {"kind": "synthetic-lm", "n_samples": 512}, "train": {"global_batch": 32}}
VOCAB = 65
TOKENS = [128, 256, 512, 1024]  # 4, 8, 16, 32 rows of 32 tokens

# the fixture machine: seconds per token of forward, at 1 and at 2 busy ranks (contention: 1.5x slower)
FORWARD_PER_TOKEN = {"1": 20e-6, "2": 30e-6}
OPTIMIZER_PER_ELEMENT = {"1": 4e-9, "2": 5e-9}
OTHER_S = {"1": 1e-3, "2": 1.2e-3}
IMBALANCE = {"1": 0.0, "2": 0.04}  # the faster of 2 ranks waits 4% of a step's compute for the slower
ALPHA, BETA, GAMMA = 60e-6, 1 / 4e9, 1 / 6e9
COPY = {"1": 5e9, "2": 4e9}


def small_config(**sections):
    d = json.loads(json.dumps(SMALL))
    for section, values in sections.items():
        d.setdefault(section, {}).update(values)
    return from_dict(d)


def small_preset(path: Path) -> str:
    """Write the SMALL config (name, model, data, train) as a preset TOML file at `path`; its path."""
    lines = [f'name = "{SMALL["name"]}"']
    for section in ("model", "data", "train"):
        lines.append(f"[{section}]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in SMALL[section].items()]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def level(name: str) -> dict:
    per_token = FORWARD_PER_TOKEN[name]
    return {"tokens": TOKENS, "forward_s": [per_token * t for t in TOKENS],
            "backward_s": [2 * per_token * t for t in TOKENS],
            "optimizer_s_per_element": OPTIMIZER_PER_ELEMENT[name], "other_s": OTHER_S[name],
            "imbalance": IMBALANCE[name]}


def fixture_calibration(path: Path, cfg=None, dtypes=("fp32", "bf16")) -> Calibration:
    """Write a calibration for cfg's model (SMALL by default) to `path`; returns it."""
    cfg = cfg or small_config()
    data = {"version": VERSION, "host": "fixture", "cores": 2, "peak_flops": 1.0e11,
            "copy_bytes_per_s": COPY,
            "transport": {"alpha": ALPHA, "beta": BETA, "gamma": GAMMA, "ranks": 2, "sizes": [],
                          "gather_s": [], "scatter_s": []},
            "models": {model_signature(cfg, VOCAB): {d: {"1": level("1"), "2": level("2")} for d in dtypes}}}
    path.write_text(json.dumps(data))
    return Calibration(data)


def nccl_table(alpha: float, beta: float, ranks: int, sizes) -> str:
    """An all_reduce_perf table (the current layout, with the root column) for known α and β."""
    lines = ["# nThread 1 nGpus 1 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 5 iters: 20",
             "#",
             "#" + " " * 62 + "out-of-place" + " " * 23 + "in-place",
             "#       size         count      type   redop    root     time   algbw   busbw #wrong"
             "     time   algbw   busbw #wrong",
             "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)"
             "            (us)  (GB/s)  (GB/s)"]
    for n in sizes:
        t = 2 * (ranks - 1) * alpha + 2 * (ranks - 1) / ranks * n * beta
        alg = n / t / 1e9
        bus = alg * 2 * (ranks - 1) / ranks
        us = t * 1e6
        lines.append(f"{n:>12} {n // 4:>13}     float     sum      -1 {us:8.2f} {alg:7.2f} {bus:7.2f}      0 "
                     f"{us:8.2f} {alg:7.2f} {bus:7.2f}      0")
    lines.append(f"# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 1.0\n# nranks {ranks}")
    return "\n".join(lines)


# a cluster file with nominal figures, for the terms worked out by hand (pipeline, context, expert): `peak`
# (100) TFLOP/s x 0.5 x T/(T + 1024) at T tokens; 5 us and 100 GB/s in a node, inter_us, inter_gbs between
FIXTURE_CLUSTER = """
name = "pp test"
nodes = 8
ranks_per_node = {per_node}
[compute]
peak_tflops_fp32 = {peak}
memory_bandwidth_gbs = 1000
efficiency_max = 0.5
efficiency_half_tokens = 1024
[intra]
bandwidth_gbs = 100
latency_us = 5
[inter]
bandwidth_gbs = {inter_gbs}
latency_us = {inter_us}
[collectives]
algorithm = "engine"
"""


def fixture_cluster(tmp_path, per_node: int = 4, inter_gbs: float = 10, inter_us: float = 20,
                    name: str = "c", peak: float = 100):
    path = tmp_path / f"{name}.toml"
    path.write_text(FIXTURE_CLUSTER.format(per_node=per_node, inter_gbs=inter_gbs, inter_us=inter_us,
                                           peak=peak))
    return load_cluster(path)


def assert_every_figure_cites(name: str, text: str, sources: tuple[str, ...]) -> None:
    """Each numeric setting of a cluster file carries a comment (on its line, or continued on the indented
    lines below it) naming one of `sources`; memory_gb = 0 (the host's own memory) needs none."""
    tomllib.loads(text)
    pending = None
    for line in text.splitlines() + [""]:
        match = re.match(r"^(\w+)\s*=\s*([\d.]+)\s*(#.*)?$", line)
        if pending is not None and not line.startswith(" "):  # a figure's comment may go on below it
            assert any(word in pending[1].lower() for word in sources), f"{name}: {pending[0]} cites nothing"
            pending = None
        if pending is not None:
            pending = (pending[0], pending[1] + line)
        if match and match.group(1) not in ("nodes", "ranks_per_node", "cores"):
            pending = (match.group(1), match.group(3) or "")
        if match and match.group(1) in ("memory_gb",) and float(match.group(2)) == 0:
            pending = None
