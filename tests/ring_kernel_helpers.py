"""The fixture calibration with ring attention's kernels timed (figures chosen to be worked out by hand), for
the context-parallel projection's tests."""

from __future__ import annotations

from projection_helpers import SMALL, fixture_calibration

from engine.config import from_dict
from engine.projection.calibrate import Calibration
from engine.projection.flops import model_signature
from engine.projection.ring_calibration import degree_key, key

VOCAB = 65
MS = 1e-3
# kernel seconds at the calibrated sizes [128, 256, 512, 1024] tokens: only the first two are used
KERNELS = {("one_device", "forward", None): 1.0, ("one_device", "backward", None): 2.0,
           ("diagonal", "forward", 8): 0.1, ("diagonal", "backward", 8): 0.2,
           ("whole", "forward", 8): 0.3, ("whole", "backward", 8): 0.5,
           ("diagonal", "forward", 16): 0.25, ("diagonal", "backward", 16): 0.4,
           ("whole", "forward", 16): 0.7, ("whole", "backward", 16): 1.1}


def config(layout: str, rows: int = 8):
    return from_dict({**SMALL, "train": {"global_batch": rows},
                      "parallel": {"world_size": 2, "context": 2, "context_layout": layout}})


def calibrated(tmp_path, cfg) -> Calibration:
    """The fixture calibration with the kernels above at 128 tokens, and twice them at 256 (per 2 busy
    ranks, fp32)."""
    cal = fixture_calibration(tmp_path / "calibration.json", cfg)
    level = cal.data["models"][model_signature(cfg, VOCAB)]["fp32"]["2"]
    for (kind, phase, chunk), ms in KERNELS.items():
        level[degree_key(2, key(kind, phase, chunk))] = [ms * MS, 2 * ms * MS, 4 * ms * MS, 8 * ms * MS]
    return Calibration(cal.data)
