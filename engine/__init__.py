"""nanoDist engine: a from-scratch NumPy training engine for data-parallel training.

The engine never imports textual, typer or rich; the workbench in `nanodist_tui` drives it.
"""

from engine.fast.blas_idle import sleep_when_idle

sleep_when_idle()  # before any engine module imports NumPy (engine/fast/blas_idle.py says why)
