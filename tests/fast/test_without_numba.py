"""Training on a machine without numba: a subprocess in which `import numba` fails trains DDP steps
(2 thread ranks) on the NumPy paths (engine.fast.compiled.load returns None there), and its results are
held to this process's run on the compiled loops.

What the code promises decides how equal (engine/fast/kernels.py, halfconv.py, optim_jit.py, tests/fast/
test_kernels_jit.py): GELU, attention's softmax chain, AdamW's update and the 16-bit conversions are the
NumPy paths bit for bit, so an MLP (linear, GELU, cross-entropy) trains to the same bits in fp32, bf16
and fp16 (with clipping off: the gradient norm's compiled sum agrees only to float64 rounding). Layer
norm's compiled loop sums its rows in vector lanes where NumPy's chain sums through BLAS, so a GPT agrees
to float32 rounding, grown by a few steps of training."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.comm.launch import run_ranks
from engine.config import from_dict, to_dict
from engine.dtypes import resolve_dtype
from engine.fast import compiled
from engine.trainer import Trainer
from tests.parallel_helpers import tiny_gpt

ROOT = Path(__file__).resolve().parents[2]
STEPS = 3

# Run in the subprocess: numba made unimportable before the engine is imported (a None entry in
# sys.modules makes `import numba` raise ModuleNotFoundError, as where it is not installed), then this
# file's runs, saved bit for bit.
WITHOUT_NUMBA = """
import sys
sys.modules["numba"] = None
import numpy as np, runpy
from engine.fast import compiled
runs = runpy.run_path(sys.argv[1], run_name="without_numba")["all_runs"]()
assert all(compiled.load(name) is None for name in ("kernels_jit", "halfconv_jit", "optim_jit"))
np.savez(sys.argv[2], **runs)
"""


def mlp(dtype: str) -> dict:
    """A GELU MLP on synthetic classes, clipping off (see the module's docstring). Its hidden activations
    (16 rows x 256 per rank) and first weight are at least halfconv's 4096 elements: 16-bit conversions
    go through the compiled loops, not plain astype."""
    return to_dict(from_dict({
        "name": "mlp", "seed": 3, "model": {"kind": "mlp", "widths": [64, 256, 5]},
        "data": {"kind": "synthetic-classification", "n_samples": 256},
        "train": {"steps": 10, "global_batch": 32, "eval_every": 0, "eval_batches": 1},
        "optim": {"lr": 1e-2, "warmup_steps": 2, "grad_clip": 0.0}, "precision": {"dtype": dtype}}))


CONFIGS = {f"mlp-{d}": mlp(d) for d in ("fp32", "bf16", "fp16")}
CONFIGS |= {f"gpt-{d}": tiny_gpt(precision__dtype=d) for d in ("fp32", "bf16")}


def _train(comm, emit, cfg_dict):
    trainer = Trainer(from_dict(cfg_dict), comm)
    losses = [trainer.train_step()["loss"] for _ in range(STEPS)]
    trainer.replica.close()
    params = np.concatenate([p.data.reshape(-1) for p in trainer.model.parameters()])
    return np.array(losses), params.view(f"u{params.itemsize}")  # the bits (16-bit floats too)


def all_runs() -> dict[str, np.ndarray]:
    """Every config's losses and parameter bits from 2 DDP thread ranks (rank 0's; the ranks agree)."""
    runs = {}
    for name, cfg in CONFIGS.items():
        cfg = dict(cfg, parallel=dict(cfg["parallel"], world_size=2, backend="threads"))
        runs[f"{name}-losses"], runs[f"{name}-params"] = run_ranks(2, "threads", _train, args=(cfg,),
                                                                    timeout_s=60)[0]
    return runs


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    """(compiled runs in this process, NumPy runs in a subprocess without numba)."""
    if compiled.load("kernels_jit") is None:
        pytest.skip("numba is not installed here: there is no compiled path to compare with")
    out = tmp_path_factory.mktemp("without_numba") / "runs.npz"
    done = subprocess.run([sys.executable, "-c", WITHOUT_NUMBA, __file__, str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    with np.load(out) as without:
        return all_runs(), dict(without)


def test_the_subprocess_really_ran_without_numba():
    """The None entry in sys.modules is what a missing numba looks like to engine.fast.compiled."""
    probe = "import sys; sys.modules['numba'] = None\nfrom engine.fast import compiled\n" \
            "print(compiled.load('kernels_jit'), compiled.load('halfconv_jit'), compiled.load('optim_jit'))"
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.stdout.split() == ["None", "None", "None"], done.stderr[-3000:]


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
def test_an_mlp_trains_to_the_same_bits_without_numba(both, dtype):
    fast, without = both
    np.testing.assert_array_equal(without[f"mlp-{dtype}-losses"], fast[f"mlp-{dtype}-losses"])
    np.testing.assert_array_equal(without[f"mlp-{dtype}-params"], fast[f"mlp-{dtype}-params"])


@pytest.mark.parametrize("dtype, rtol", [("fp32", 1e-5), ("bf16", 1e-2)])
def test_a_gpt_trains_to_float32_rounding_without_numba(both, dtype, rtol):
    fast, without = both
    np.testing.assert_allclose(without[f"gpt-{dtype}-losses"], fast[f"gpt-{dtype}-losses"], rtol=rtol)
    fast_p, without_p = (runs[f"gpt-{dtype}-params"].view(resolve_dtype(dtype)).astype(np.float64)
                         for runs in (fast, without))
    np.testing.assert_allclose(without_p, fast_p, rtol=rtol, atol=rtol * np.abs(fast_p).max())
