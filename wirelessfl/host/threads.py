"""Host threads of a run: how many, and why the numbers never depend on them.

Torch's intra-op parallelism (OpenMP, oneDNN, MKL) splits a reduction into one partial sum per
thread: a convolution's weight gradient over the batch, torch's parallel ``sum``. Its results
then change in the last bits with the thread count, and over many rounds a run's outcome changes
(seed002-digits28's FedSGD reached its target in 60 rounds with one thread, 50 with two). Its
OpenMP workers also spin-wait at barriers, so on a busy machine they burn the cores they wait
for (a run 8-20x slower than with one thread). Hence:

* every numeric kernel runs with ONE intra-op thread: ``torch.set_num_threads(1)`` in the
  calling thread and in every pool thread (OpenMP's and MKL's thread counts are per thread),
  and numpy's and scipy's BLAS limited to one thread too (threadpoolctl for the libraries
  already loaded, the environment for those loaded later): a float64 reduction in numpy's
  OpenBLAS changed seed004-quadratic's suboptimality column with OMP_NUM_THREADS;
* host parallelism comes from ``parallel_map``: a pool of ordinary threads that runs the pieces
  of a fixed partition (devices, fixed sample blocks; never derived from the thread count) and
  returns their results in order, so callers combine them in a fixed order. Torch releases the
  GIL inside kernels, and pool threads block instead of spinning, so a loaded machine costs a
  run only its fair share of the cores;
* the pool's size defaults to the CPUs available: those of this process's affinity mask minus
  the load of other processes (busy time sampled from /proc/stat), at least one. ``--threads N``
  overrides it; a sweep divides the available CPUs among its workers.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

# Read by OpenMP, MKL and OpenBLAS when they start: set before torch is imported where possible.
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
LOAD_SAMPLE_S = 0.1  # how long /proc/stat is watched to measure other processes' load


def single_intra_op() -> None:
    """One intra-op thread for torch in the calling thread and for the BLAS libraries loaded in
    this process; through the environment also for libraries loaded later and processes started
    from here. Idempotent."""
    for name in THREAD_ENV:
        os.environ[name] = "1"
    import torch
    from threadpoolctl import threadpool_limits

    if torch.get_num_threads() != 1:
        torch.set_num_threads(1)
    threadpool_limits(limits=1, user_api="blas")


def cpu_count() -> int:
    """CPUs this process may run on (its affinity mask)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _cpu_times(cpus: set[int]) -> tuple[float, float] | None:
    """(busy, total) jiffies summed over ``cpus`` from /proc/stat, or None where it is absent."""
    try:
        with open("/proc/stat") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    busy = total = 0.0
    for line in lines:
        name, *fields = line.split()
        if not (name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus):
            continue
        values = [float(v) for v in fields[:8]]  # user nice system idle iowait irq softirq steal
        total += sum(values)
        busy += sum(values) - values[3] - values[4]
    return busy, total


def busy_cpus(interval: float = LOAD_SAMPLE_S) -> float:
    """How many of this process's CPUs other processes keep busy now (this process is asleep
    while it measures): /proc/stat sampled over ``interval`` seconds, else the 1-minute load
    average."""
    count = cpu_count()
    try:
        cpus = os.sched_getaffinity(0)
    except AttributeError:
        cpus = set(range(count))
    first = _cpu_times(cpus)
    if first is not None:
        time.sleep(interval)
        second = _cpu_times(cpus)
        if second is not None and second[1] > first[1]:
            return count * (second[0] - first[0]) / (second[1] - first[1])
    try:
        return min(float(count), os.getloadavg()[0])
    except (AttributeError, OSError):
        return 0.0


@dataclass(frozen=True)
class ThreadSetting:
    """What a run records in its manifest (``threads``): the request (None: automatic), the pool
    size used, the intra-op threads (always 1) and the CPUs and load seen when it was chosen."""

    requested: int | None
    used: int
    intra_op: int
    cpus: int
    busy_cpus: float | None

    def record(self) -> dict:
        return asdict(self)


def choose(requested: int | None = None, workers: int = 1) -> ThreadSetting:
    """The pool size for one run: ``requested``, or the available CPUs (affinity mask minus the
    other load, rounded) divided among ``workers`` concurrent runs, at least 1."""
    cpus = cpu_count()
    if requested is not None:
        if requested < 1:
            raise ValueError(f"threads must be a positive number, got {requested}")
        return ThreadSetting(requested, requested, 1, cpus, None)
    busy = busy_cpus()
    available = max(1, cpus - round(busy))
    return ThreadSetting(None, max(1, available // max(1, workers)), 1, cpus, round(busy, 2))


_setting: ThreadSetting | None = None
_pool: ThreadPoolExecutor | None = None
_pool_size = 0
_lock = threading.Lock()
_local = threading.local()  # .in_pool: this thread is one of the pool's


def configure(requested: int | None = None, used: int | None = None,
              busy: float | None = None) -> ThreadSetting:
    """Set this process up for a run: one intra-op thread here, a pool of ``used`` threads
    (default: chosen from ``requested`` and the load, see ``choose``; ``busy``: the load seen
    by whoever chose ``used``). Returns the setting."""
    global _setting
    single_intra_op()
    if used is None:
        setting = choose(requested)
    else:
        setting = ThreadSetting(requested, max(1, int(used)), 1, cpu_count(), busy)
    _resize(setting.used)
    _setting = setting
    return setting


def ensure(requested: int | None = None) -> ThreadSetting:
    """The current setting when it was made for ``requested``, else a new one (``configure``);
    always leaves the calling thread with one intra-op thread."""
    if _setting is not None and _setting.requested == requested:
        single_intra_op()
        return _setting
    return configure(requested)


def pool_size() -> int:
    """Threads ``parallel_map`` runs on (1 before any ``configure``)."""
    return _setting.used if _setting is not None else 1


def _start_pool_thread() -> None:
    single_intra_op()
    _local.in_pool = True


def _resize(size: int) -> None:
    global _pool, _pool_size
    with _lock:
        if _pool is not None and _pool_size != size:
            _pool.shutdown(wait=True)
            _pool = None
        _pool_size = size
        if _pool is None and size > 1:
            _pool = ThreadPoolExecutor(max_workers=size, thread_name_prefix="wirelessfl",
                                       initializer=_start_pool_thread)


def parallel_map(fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
    """``[fn(item) for item in items]``, the items spread over the pool; results in item order.

    Each call runs single-threaded with the caller's grad mode, so a result does not depend on
    which thread computed it nor on how many there are. Runs inline with no pool, for one item,
    or when called from a pool thread (no nested waiting on a full pool)."""
    items = list(items)
    pool = _pool
    if pool is None or len(items) < 2 or getattr(_local, "in_pool", False):
        return [fn(item) for item in items]
    import torch

    grad = torch.is_grad_enabled()

    def call(item: T) -> R:
        with torch.set_grad_enabled(grad):
            return fn(item)

    return list(pool.map(call, items))
