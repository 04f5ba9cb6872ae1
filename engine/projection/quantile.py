"""The one statistic every timed figure of the projection takes: the lower quartile of its repetitions.

Other jobs on a shared machine only ever slow a repetition down, so the low quantile estimates the
machine's own speed better than the median (calibrate.py, transport_calibration.py, validate.py).
"""

from __future__ import annotations

LOW_QUANTILE = 0.25


def low_quantile(values) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(LOW_QUANTILE * len(values)))]
