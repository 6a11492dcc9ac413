"""``merge_below``'s switch: a paper worker's rollouts run across short episodes.

A K = 1 worker's rollout ends with its episode, as in the A3C paper.  On a
task whose episodes are much shorter than ``t_max`` that makes many tiny
updates, so a :class:`MergeSwitch` watches the lengths of the worker's last
``merge_window`` episodes: while they average fewer than ``merge_below``
steps the worker's rollouts run on into the next episode (``merging``), and
once they average more than ``t_max`` they end with their episode again;
in between the switch stays where it is.  The lengths are summed as
integers, so the mean is exact.
"""
from __future__ import annotations

import numpy as np

__all__ = ["MergeSwitch"]


class MergeSwitch:
    """The mean length of a worker's last ``window`` episodes and the switch
    it drives (see the module docstring)."""

    def __init__(self, merge_below, t_max, window):
        self.merge_below = merge_below
        self.t_max = t_max
        self.lengths = np.zeros(max(int(window), 1), np.int64)
        self.n = 0
        self.total = 0

    def update(self, length, merging) -> bool:
        """One more episode of ``length`` steps; returns the switch's new
        position (``merging``: its position so far, kept until the window
        is full)."""
        buf = self.lengths
        i = self.n % len(buf)
        self.total += int(length) - int(buf[i])
        buf[i] = length
        self.n += 1
        if self.n < len(buf):
            return merging
        mean = self.total / len(buf)
        if mean < self.merge_below:
            return True
        if mean > self.t_max:
            return False
        return merging

    def mean(self):
        """The mean length of the episodes in the window (None before one ended)."""
        k = min(self.n, len(self.lengths))
        return self.total / k if k else None
