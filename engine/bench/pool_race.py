"""Our training step with the rank's workers polling between shares (engine.fast.spin_pool) and sleeping
between them (the ThreadPoolExecutor's, products on MKL's own threads), and PyTorch's two twins, taking
turns in blocks of steps in one process: the pool's effect on a step as ratios taken under the same load.

    python -m engine.bench.pool_race [preset] [steps] [threads] [--set key=value ...]

Wall seconds per step. Prints each contestant's median step and ours / PyTorch for each pool.
"""

from __future__ import annotations

import contextlib
import functools
import sys

import engine.bench.torch_first  # noqa: F401 - torch before our first product (engine/bench/torch_first.py)
from engine.bench.turns import TWINS, print_race, race_arguments, race_in_turns
from engine.config import Config
from engine.fast import blas, thread_pool

POLLING, SLEEPING = "ours polling", "ours sleeping"
POOLS = {POLLING: True, SLEEPING: False}  # thread_pool.SPIN of each of our contestants


@contextlib.contextmanager
def _workers(name: str):
    """The rank's pool rebuilt as contestant `name` has it (POOLS) inside the block."""
    n, before = thread_pool.threads(), thread_pool.SPIN
    thread_pool.set_threads(1)
    thread_pool.SPIN = POOLS[name]
    thread_pool.set_threads(n)
    try:
        yield
    finally:
        thread_pool.set_threads(1)
        thread_pool.SPIN = before
        thread_pool.set_threads(n)


def race(cfg: Config, steps: int = 15, warmup: int = 2, threads: int = 2) -> dict:
    """Median wall seconds per step of each contestant."""
    ours = {name: functools.partial(_workers, name) for name in POOLS}
    med = race_in_turns(cfg, ours, steps, warmup, threads)
    return {"median_s": {k: med[k] for k in (*POOLS, *TWINS)}, "backend": blas.backend(), "threads": threads,
            "steps": med["steps"], "ratios": {f"{o} / {p}": med[o] / med[p] for o in POOLS for p in TWINS},
            f"{POLLING} / {SLEEPING}": med[POLLING] / med[SLEEPING]}


def main(argv: list[str]) -> None:
    preset, cfg, steps, threads = race_arguments(argv, "gpt-mini")
    r = race(cfg, steps, threads=threads)
    print(f"{preset}: {r['steps']} timed steps each, {threads} thread(s), wall s, products on {r['backend']}")
    print_race(r)
    print(f"  {POLLING} / {SLEEPING}   {r[f'{POLLING} / {SLEEPING}']:.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
