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


def device_uniform(seed: int, stream: str, k: int, rows: slice | np.ndarray, cols: int,
                   device=None) -> torch.Tensor:
    """Float32 uniforms in [0, 1) [rows, cols] for devices ``rows`` (a slice, or an increasing
    array of device indices) at round ``k``.

    Devices are grouped in fixed blocks of DEVICE_BLOCK, each block a keyed PCG64 stream filled
    row by row, so a device's values do not depend on which devices are computed together
    (chunking, participants) or on the torch device. A consecutive run of devices draws the
    block's prefix up to the last one asked for; a device far into a block skips to its row with
    PCG64's jump-ahead (``advance``), so a few devices scattered over a large population cost
    their own rows, not their blocks.
    """
    if isinstance(rows, slice):
        devices = np.arange(rows.start or 0, rows.stop)
    else:
        devices = np.asarray(rows, dtype=np.int64)
    out = np.empty((len(devices), cols), dtype=np.float32)
    blocks = devices // DEVICE_BLOCK
    cuts = np.flatnonzero(np.diff(blocks)) + 1
    for group in np.split(np.arange(len(devices)), cuts):
        if not len(group):
            continue
        block = int(blocks[group[0]])
        local = devices[group] - block * DEVICE_BLOCK
        rng = keyed_rng(seed, stream, k, block)
        if local[-1] + 1 <= 2 * len(group):  # dense enough: draw the prefix, keep the rows asked
            out[group] = rng.random((int(local[-1]) + 1, cols), dtype=np.float32)[local]
            continue
        position = 0  # float32 values consumed: two per PCG64 step, low half first
        for slot, row in zip(group, local):
            target = int(row) * cols
            if target > position:  # jump (advance drops a buffered high half, skipped anyway)
                rng.bit_generator.advance(target // 2 - (position + 1) // 2)
                if target % 2:
                    rng.random(1, dtype=np.float32)
            out[slot] = rng.random(cols, dtype=np.float32)
            position = (int(row) + 1) * cols
    noise = torch.from_numpy(out)
    return noise.to(device) if device is not None else noise


# SplitMix64's increment and finaliser constants (Steele, Lea and Flood, "Fast splittable
# pseudorandom number generators", OOPSLA 2014; the finaliser is Stafford's variant 13).
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def _mix64(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser, elementwise on uint64 (wrapping arithmetic)."""
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


def counter_uniform(seed: int, stream: str, keys: tuple[int, ...], devices: np.ndarray,
                    count: int) -> np.ndarray:
    """Float64 uniforms in [0, 1) [n, count]: row r holds values 0..count-1 of device
    ``devices[r]``'s stream for (seed, stream, keys).

    A counter-based generator (SplitMix64 over the counter (device, position) under a key
    hashed from (seed, stream, keys)): a device's values are a pure function of its index, so
    any subset of devices, in any order or grouping, gets exactly the values the whole
    population would (what per-device random streams of cross-device populations need, where
    a round draws only for the devices asked). Vectorised: no per-device Python work.
    """
    base = np.uint64(stream_key(seed, stream, *keys))
    with np.errstate(over="ignore"):
        device_key = _mix64(np.asarray(devices, dtype=np.uint64) * _GOLDEN + base)
        counters = np.arange(1, count + 1, dtype=np.uint64) * _GOLDEN
        bits = _mix64(device_key[:, None] ^ counters[None, :])
    return (bits >> np.uint64(11)).astype(np.float64) * 2.0**-53


def keyed_normals(keys: np.ndarray, count: int) -> np.ndarray:
    """Standard normals [len(keys), count], float64: row r is a pure function of keys[r].

    Row r reads the SplitMix64 stream seeded by mix(keys[r]) (``_mix64``); two uniforms per
    value go through Box-Muller. Vectorised over rows and columns, so which rows are drawn together (chunking)
    never changes a row.
    """
    state = _mix64(np.asarray(keys, dtype=np.uint64).reshape(-1))[:, None]
    counters = np.arange(1, 2 * count + 1, dtype=np.uint64) * _GOLDEN
    bits = _mix64(state + counters[None, :])
    u = ((bits >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53  # in (0, 1)
    return np.sqrt(-2.0 * np.log(u[:, 0::2])) * np.cos(2.0 * np.pi * u[:, 1::2])
