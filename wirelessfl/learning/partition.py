"""Splitting the training set over devices: each scheme returns one index array per device.

Every partitioner in PARTITIONERS takes (labels [n], num_devices, rng) so that label-aware schemes
(Dirichlet, shards) plug in next to the i.i.d. split without changing the callers.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from wirelessfl.errors import UserError

Partitioner = Callable[[np.ndarray, int, np.random.Generator], list[np.ndarray]]


def partition_iid(num_samples: int, num_devices: int,
                  rng: np.random.Generator) -> list[np.ndarray]:
    """Shuffle, then cut into ``num_devices`` equal shards (sizes differ by at most 1).

    This is seed 002's "randomly and equally distributed" split (Sec. V).
    """
    if num_devices < 1:
        raise UserError(f"population.num_devices must be at least 1, got {num_devices}")
    if num_devices > num_samples:
        raise UserError(f"population.num_devices={num_devices} exceeds the {num_samples} training "
                        "samples, so some devices would get no data; use fewer devices or more "
                        "data (data.max_train_samples, a larger dataset)")
    order = rng.permutation(num_samples).astype(np.int64)
    return np.array_split(order, num_devices)


def _iid(labels: np.ndarray, num_devices: int, rng: np.random.Generator) -> list[np.ndarray]:
    return partition_iid(len(labels), num_devices, rng)


PARTITIONERS: dict[str, Partitioner] = {"iid": _iid}


def partition(scheme: str, labels: np.ndarray, num_devices: int,
              rng: np.random.Generator) -> list[np.ndarray]:
    """Indices into the training set for each device, by the named ``scheme``."""
    if scheme not in PARTITIONERS:
        raise UserError(f"partition.scheme '{scheme}' is unknown; choose one of "
                        f"{', '.join(sorted(PARTITIONERS))}")
    return PARTITIONERS[scheme](np.asarray(labels), num_devices, rng)
