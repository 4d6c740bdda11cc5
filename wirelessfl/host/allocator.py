"""Keep freed tensor memory in the process heap instead of handing it back to the OS each time.

glibc serves every allocation above M_MMAP_THRESHOLD (128 KiB at start) with fresh mmap pages and
unmaps them on free, so a round that creates and frees megabyte-sized tensors (quantising 50
model deltas, stacked per-device models) page-faults on every one of them. Raising the threshold
and the trim threshold lets the heap reuse that memory: the M-bit quantiser on 50 x 2,410 values
went from 4.7 ms to 0.9 ms on our 2-core machine (benchmarks/README.md). Peak memory is unchanged;
memory freed after the peak stays with the process until it exits.
"""

from __future__ import annotations

import ctypes
import sys

M_TRIM_THRESHOLD = -1  # glibc malloc.h
M_MMAP_THRESHOLD = -3  # glibc malloc.h
MMAP_THRESHOLD_BYTES = 32 * 2**20  # glibc's largest allowed value on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX)
TRIM_THRESHOLD_BYTES = 2**30

_applied: bool | None = None


def keep_freed_memory() -> bool:
    """Apply the glibc settings once per process; False where there is no glibc (macOS, musl)."""
    global _applied
    if _applied is None:
        _applied = False
        if sys.platform.startswith("linux"):
            try:
                mallopt = ctypes.CDLL("libc.so.6").mallopt
            except (OSError, AttributeError):
                return False
            mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
            _applied = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
                            and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
    return _applied
