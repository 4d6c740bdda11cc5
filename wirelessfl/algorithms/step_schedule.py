"""ZO-HFL's growing local-steps schedule (seed 000; zo_hfl.md 2.2 and A10), shared by ZO-HFL and
by the baselines that match its total local steps (``local_steps_schedule: zo-hfl`` of FedAvg,
FedProx and SCAFFOLD, zo_hfl.md 4.3 and A12): one home, so that both count the same steps and
neither algorithm module imports the other."""

from __future__ import annotations

import math

import numpy as np

# ZO-HFL's defaults, which the baselines' schedule takes when it is not given its own.
DEFAULT_TAU = 20.0  # seed 000 Table I
DEFAULT_MAX_LOCAL_STEPS = 1000  # the cap on H_r [D]


def zo_hfl_steps(tau: float | np.ndarray, r: int, cap: int) -> int | np.ndarray:
    """H_r = min(cap, ceil(tau sqrt(r + 1))): the local steps of one proximal solve of round r
    (zo_hfl.md 2.2, rounded up per A10 [D]); ZO-HFL runs two solves a round. ``tau`` may be one
    value (an int back) or one per device (tau_per_device: int64 [N] back)."""
    if np.ndim(tau):
        return np.minimum(cap, np.ceil(np.asarray(tau) * math.sqrt(r + 1))).astype(np.int64)
    return min(cap, math.ceil(tau * math.sqrt(r + 1)))
