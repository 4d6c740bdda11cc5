"""Per-device state of stateful methods, held only for the devices that have some.

A cross-device population registers far more devices than ever take part: SCAFFOLD's control
variates c_i, FGDRO's trackers or a method's local iterates start at a known value (zero, or
the initial model) and change only when the device works. A dense [N, d] array would cost
N d floats from round 0 (100,000 devices x a 9,000-parameter MLP = 3.6 GB); ``DeviceRows``
keeps a row for a device from its first change on, so memory follows the devices that took
part: after R rounds with participation beta, about N (1 - (1 - beta)^R) rows
(``expected_rows``, what the pre-run memory check counts).

Rows live in fixed-size blocks of ``BLOCK_ROWS`` rows (fewer for rows so large that such a block
would pass ``BLOCK_BYTES``; a list that grows), so the checkpoint walk
(pipeline/state_tree.py), which refuses an array whose shape changed, sees only new blocks
appear; ``slot`` [N] maps a device to its row (-1: none yet, the default value).
"""

from __future__ import annotations

import numpy as np
import torch

from wirelessfl.algorithms.participation import participant_count

# Rows per storage block [D]: large enough that gathers touch few blocks, small enough that the
# last, partly used block wastes little (1,024 rows of a 9,000-parameter model: 37 MB).
BLOCK_ROWS = 1024
# ... unless a block of BLOCK_ROWS rows would hold more than this many bytes [D]: then as many rows
# as fit, at least one (1,024 rows of ResNet-18's 11.2 million parameters are 46 GB, which a run
# of 10 devices asked for at its first stored row).
BLOCK_BYTES = 256 * 2**20


def block_rows(row_bytes: int) -> int:
    """Rows per storage block for rows of ``row_bytes`` bytes."""
    if BLOCK_ROWS * row_bytes <= BLOCK_BYTES:
        return BLOCK_ROWS
    return max(1, BLOCK_BYTES // max(row_bytes, 1))


def expected_rows(num_devices: int, participation: float, rounds: int) -> float:
    """Expected devices that took part at least once in ``rounds`` rounds when each round asks
    round(beta N) of N uniformly: N (1 - (1 - count/N)^rounds)."""
    count = participant_count(participation, num_devices)
    return num_devices * (1.0 - (1.0 - count / num_devices) ** rounds)


class DeviceRows:
    """Vectors [d], one per device, equal to ``default`` until first written."""

    def __init__(self, num_devices: int, default: torch.Tensor):
        self.default = default.clone()
        self.slot = np.full(num_devices, -1, dtype=np.int64)
        self.blocks: list[torch.Tensor] = []
        self.count = 0
        self.rows_per_block = block_rows(default.numel() * default.element_size())

    @property
    def held(self) -> int:
        """Devices holding a row of their own."""
        return self.count

    def get(self, devices: np.ndarray) -> torch.Tensor:
        """The rows of ``devices`` [n, d] (a copy; ``default`` for devices without a row)."""
        out = self.default.expand(len(devices), -1).clone()
        slots = self.slot[devices]
        have = np.flatnonzero(slots >= 0)
        for block, rows in self._by_block(slots[have]):
            out[torch.as_tensor(have[rows])] = self.blocks[block][
                torch.as_tensor(slots[have[rows]] % self.rows_per_block)]
        return out

    def set(self, devices: np.ndarray, values: torch.Tensor) -> None:
        """Store ``values`` [n, d] as the rows of ``devices`` (distinct indices)."""
        self._allocate(devices)
        slots = self.slot[devices]
        for block, rows in self._by_block(slots):
            self.blocks[block][torch.as_tensor(slots[rows] % self.rows_per_block)] = values[
                torch.as_tensor(rows)]

    def dense(self) -> torch.Tensor:
        """All N rows [N, d] (for tests and small populations)."""
        return self.get(np.arange(len(self.slot)))

    def _allocate(self, devices: np.ndarray) -> None:
        new = np.asarray(devices)[self.slot[devices] < 0]
        if not len(new):
            return
        self.slot[new] = self.count + np.arange(len(new))
        self.count += len(new)
        while len(self.blocks) * self.rows_per_block < self.count:
            self.blocks.append(self.default.expand(self.rows_per_block, -1).clone())

    def _by_block(self, slots: np.ndarray):
        """(block, positions in ``slots``) for each storage block the slots fall in."""
        blocks = slots // self.rows_per_block
        for block in np.unique(blocks):
            yield int(block), np.flatnonzero(blocks == block)
