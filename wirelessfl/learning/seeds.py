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
    """Uniforms in [0, 1) [rows, cols] for devices ``rows`` at round ``k``.

    Devices are grouped in fixed blocks of DEVICE_BLOCK, each block drawn from its own keyed
    generator, so a device's values do not depend on which devices are computed together (chunking)
    or on the torch device, while the cost stays one generator per 64 devices.
    """
    start, stop = rows.start or 0, rows.stop
    out = []
    for block in range(start // DEVICE_BLOCK, (stop - 1) // DEVICE_BLOCK + 1):
        lo = block * DEVICE_BLOCK
        values = torch.rand((DEVICE_BLOCK, cols), generator=keyed_generator(seed, stream, k, block))
        out.append(values[max(start - lo, 0):min(stop - lo, DEVICE_BLOCK)])
    return torch.cat(out).to(device) if device is not None else torch.cat(out)
