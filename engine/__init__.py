"""nanoDist engine: a from-scratch NumPy training engine for data-parallel training.

The engine never imports textual, typer or rich; the workbench in `nanodist_tui` drives it.
"""
