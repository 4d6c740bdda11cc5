"""Who is asked in a round: a uniform sample of ``count`` of the N registered devices, as indices.

The devices are those of ``Algorithm.participants``'s mask (the same keyed stream (seed,
"participation", keys) and the same draw, ``Generator.choice(n, count, replace=False)``), so an
algorithm can ask its participants by index (``Network.collect(..., devices)``) in a
cross-device population without building an [N] mask. numpy's ``choice`` without replacement
runs Floyd's algorithm (Bentley and Floyd, "A sample of brilliance", CACM 30(9), 1987) with a
hash set of ~1.2 ``count`` slots when N > 10,000 and ``count`` <= N / 50: O(count) time and
memory, whatever N (a test measures the memory at N = 10^9); otherwise it shuffles the tail of
an arange(N), O(N), which at those sizes costs no more than the round's other O(N) work.
"""

from __future__ import annotations

import numpy as np

from wirelessfl.learning.seeds import keyed_rng

PARTICIPATION_STREAM = "participation"


def participant_count(participation: float, num_devices: int) -> int:
    """Devices asked a round: round(beta N), at least one (the draw below, and the memory
    check's count of a round's work)."""
    return max(1, round(participation * num_devices))


def participant_indices(seed: int, num_devices: int, count: int, *keys: int) -> np.ndarray:
    """The ``count`` devices (sorted int64 indices, distinct) of ``num_devices`` asked for
    ``keys`` (the round, and any stage keys), drawn from (seed, "participation", keys)."""
    rng = keyed_rng(seed, PARTICIPATION_STREAM, *keys)
    return np.sort(rng.choice(int(num_devices), int(count), replace=False)).astype(np.int64)
