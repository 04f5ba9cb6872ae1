"""Numbers as the panes, the CLI and the README write them: one unit system (MB = 10^6 bytes, GB/s = 10^9
bytes a second, as `nanodist-tui memory` and the README print them), right-aligned in fixed widths so a
column of figures lines up and does not jitter as values change."""

from __future__ import annotations

BYTE_UNITS = (("GB", 1e9), ("MB", 1e6), ("kB", 1e3))


def format_bytes(n: float, width: int = 0) -> str:
    """`n` bytes in B, kB, MB or GB (powers of 10), one decimal; right-aligned in `width` characters."""
    for unit, size in BYTE_UNITS:
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}".rjust(width)
    return f"{n:.0f} B".rjust(width)


def format_rate(bytes_per_s: float, width: int = 0) -> str:
    """A bandwidth in GB/s (10^9 bytes per second, as NCCL-tests and `nanodist-tui bench` report it), or in
    MB/s or kB/s when it is too slow to read in GB/s."""
    if bytes_per_s == float("inf"):
        return "inf".rjust(width)  # a transfer that took no measurable time
    if bytes_per_s >= 1e9:
        return f"{bytes_per_s / 1e9:.2f} GB/s".rjust(width)
    if bytes_per_s >= 1e6:
        return f"{bytes_per_s / 1e6:.1f} MB/s".rjust(width)
    return f"{bytes_per_s / 1e3:.1f} kB/s".rjust(width)


def format_seconds(s: float, width: int = 0) -> str:
    return (f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s").rjust(width)


def short_seconds(s: float) -> str:
    """A duration in at most 6 characters, 3 significant digits and the unit (5.6ms, 696ms, 1.11s, 12.3s):
    for a table that must fit 80 columns."""
    if s < 0.01:
        return f"{s * 1e3:.1f}ms"
    if s < 1:
        return f"{s * 1e3:.0f}ms"
    return f"{s:.2f}s" if round(s, 2) < 10 else f"{s:.1f}s" if round(s, 1) < 100 else f"{s:.0f}s"


def short_bytes(n: float) -> str:
    """Bytes in at most 6 characters, 3 significant digits and the unit (331kB, 3.61MB, 12.5GB)."""
    unit, size = next(((u, z) for u, z in BYTE_UNITS if abs(n) >= z), ("B", 1.0))
    v = n / size
    if unit == "B":
        return f"{v:.0f}{unit}"
    # the decimals from the rounded value: 99.99 is "100", not "100.0"
    return f"{v:.2f}{unit}" if abs(round(v, 2)) < 10 else f"{v:.1f}{unit}" if abs(round(v, 1)) < 100 \
        else f"{v:.0f}{unit}"


def format_count(n: float, width: int = 0) -> str:
    """A large count (tokens/s) with a thousands separator."""
    return f"{n:,.0f}".rjust(width)


def format_share(part: float, whole: float, width: int = 0) -> str:
    return (f"{part / whole:.0%}" if whole > 0 else "-").rjust(width)


def format_duration(s: float) -> str:
    s = int(round(s))
    hours, rest = divmod(s, 3600)
    minutes, seconds = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"
