"""Bounded (x, y) histories for the plots, and the downsampling done before each redraw.

Pure data, no Textual: the plot widgets own one `History` per curve.
"""

from __future__ import annotations


class History:
    """At most `capacity` points spread evenly over the whole run.

    When full, every second point is dropped and from then on only every `stride`-th new point is
    kept, so memory stays bounded however long the run is while the curve still starts at step 0.
    The newest point is always remembered so a plot can end at the latest value.
    """

    def __init__(self, capacity: int = 4096) -> None:
        if capacity < 2:
            raise ValueError("capacity must be at least 2")
        self.capacity = capacity
        self.xs: list[float] = []
        self.ys: list[float] = []
        self.last: tuple[float, float] | None = None
        self._stride = 1
        self._seen = 0

    def __len__(self) -> int:
        return self._seen

    def append(self, x: float, y: float) -> None:
        if self._seen % self._stride == 0:
            self.xs.append(x)
            self.ys.append(y)
            if len(self.xs) >= self.capacity:
                self.xs, self.ys = self.xs[::2], self.ys[::2]
                self._stride *= 2
        self._seen += 1
        self.last = (x, y)

    def points(self, max_points: int) -> tuple[list[float], list[float]]:
        """At most ~`max_points` evenly strided points ending with the newest one."""
        xs, ys = self.xs, self.ys
        step = max(1, -(-len(xs) // max(1, max_points)))
        xs, ys = xs[::step], ys[::step]
        if self.last is not None and (not xs or xs[-1] != self.last[0]):
            xs = [*xs, self.last[0]]
            ys = [*ys, self.last[1]]
        return xs, ys
