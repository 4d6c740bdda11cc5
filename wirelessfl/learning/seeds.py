"""Counter-based random streams: every stream is a pure function of (seed, stream name, keys).

Deriving each stream from a key, not from a shared global generator, makes results independent of
batching, chunking, the executor and the order in which algorithms run (same seed, same numbers).
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch


def stream_key(seed: int, stream: str, *keys: int) -> int:
    """A 63-bit integer key for (seed, stream, keys), stable across runs and platforms."""
    text = f"{int(seed)}/{stream}/" + "/".join(str(int(k)) for k in keys)
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1


def keyed_generator(seed: int, stream: str, *keys: int) -> torch.Generator:
    """A CPU torch generator for (seed, stream, keys)."""
    return torch.Generator().manual_seed(stream_key(seed, stream, *keys))


def keyed_rng(seed: int, stream: str, *keys: int) -> np.random.Generator:
    """A numpy generator for (seed, stream, keys)."""
    return np.random.default_rng(stream_key(seed, stream, *keys))



DEVICE_BLOCK = 64


def device_uniform(seed: int, stream: str, k: int, rows: slice, cols: int,
                   device=None) -> torch.Tensor:
    """Float32 uniforms in [0, 1) [rows, cols] for devices ``rows`` at round ``k``.

    Devices are grouped in fixed blocks of DEVICE_BLOCK, each block a keyed PCG64 stream filled
    row by row, so a device's values do not depend on which devices are computed together
    (chunking) or on the torch device. Only the rows up to the last one asked for are drawn (a
    prefix of the block's stream), so one row costs one row, not a block.
    """
    start, stop = rows.start or 0, rows.stop
    out = []
    for block in range(start // DEVICE_BLOCK, (stop - 1) // DEVICE_BLOCK + 1):
        lo = block * DEVICE_BLOCK
        needed = min(stop - lo, DEVICE_BLOCK)
        values = keyed_rng(seed, stream, k, block).random((needed, cols), dtype=np.float32)
        out.append(values[max(start - lo, 0):])
    noise = torch.from_numpy(out[0] if len(out) == 1 else np.concatenate(out))
    return noise.to(device) if device is not None else noise
