"""Will a run fit in memory? An estimate made before anything runs, and a clear refusal.

The data set, the model and the problem are already loaded when the check runs (after
``build_world``), so what is estimated is what a run adds on top: the [N, d] arrays an algorithm
holds at its peak (``Algorithm.peak_device_arrays``, in the problem's compute precision: control
variates, local models, local solves) plus one chunk of the batched learning compute, which
``engine.max_chunk_mb`` bounds. It is compared with the memory the machine has
available now (``/proc/meminfo``'s MemAvailable) or with ``engine.memory_limit_mb``.
"""

from __future__ import annotations

import os

import torch

from wirelessfl.algorithms.base import algorithm_class
from wirelessfl.errors import UserError

MIB = 2**20
# Share of the available memory a run may plan to use: the rest is the allocator's slack,
# evaluation buffers and the interpreter.
HEADROOM = 0.8


def available_bytes() -> int | None:
    """Memory available to a new allocation now [B], or None where the system does not say."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def run_bytes(num_devices: int, d: int, peak_device_arrays: int, itemsize: int,
              max_chunk_mb: float) -> int:
    """Estimated memory a run adds [B]: peak_device_arrays x N x d x itemsize + one chunk."""
    return int(peak_device_arrays * num_devices * d * itemsize + max_chunk_mb * MIB)


def check_memory(world, algorithms=None) -> None:
    """Refuse (UserError) a scenario whose largest algorithm will not fit, with the numbers and
    what to change."""
    sc = world.scenario
    n, d = world.num_devices, world.evaluator.d
    itemsize = torch.empty((), dtype=getattr(world.evaluator, "compute_dtype",
                                             torch.float32)).element_size()
    worst = max(algorithms or sc.algorithms,
                key=lambda p: algorithm_class(p.name).peak_device_arrays)
    copies = algorithm_class(worst.name).peak_device_arrays
    need = run_bytes(n, d, copies, itemsize, sc.engine.max_chunk_mb)
    limit = (sc.engine.memory_limit_mb * MIB if sc.engine.memory_limit_mb is not None
             else available_bytes())
    if limit is None:
        return
    budget = limit if sc.engine.memory_limit_mb is not None else HEADROOM * limit
    if need <= budget:
        return
    state = copies * n * d * itemsize
    hint = (f"fewer devices (population.num_devices), a smaller model, or run "
            f"'{worst.display_name}' on a larger machine" if state > budget / 2 else
            f"a smaller chunk (--set engine.max_chunk_mb={max(16, int(budget / MIB / 4))})")
    raise UserError(
        f"{sc.name}: this run needs about {need / 2**30:.2f} GiB ({worst.display_name}: {copies} "
        f"per-device vectors x {n:,} devices x {d:,} parameters x {itemsize} B = "
        f"{state / 2**30:.2f} GiB, plus one compute chunk of engine.max_chunk_mb = "
        f"{sc.engine.max_chunk_mb:g} MiB), but {budget / 2**30:.2f} GiB "
        f"{'is the engine.memory_limit_mb' if sc.engine.memory_limit_mb is not None else 'is available'}"
        f"; use {hint}")
