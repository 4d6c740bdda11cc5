"""Where a sweep's runs execute: local worker processes (default) or a Dask distributed cluster
(a LocalCluster, or an existing scheduler: a workstation, several machines, dask-jobqueue on
SLURM). Both yield each run's result as it finishes; results do not depend on the executor, nor
on the threads each run gets (engine/threads.py)."""

from __future__ import annotations

import logging
import multiprocessing
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed

from wirelessfl.engine import threads as host_threads
from wirelessfl.errors import UserError
from wirelessfl.sweep.worker import run_point

EXECUTORS = ("local", "dask")


def default_workers() -> int:
    """The cores this process may use."""
    return host_threads.cpu_count()


def thread_plan(threads: int | None, workers: int, address: str | None) -> dict:
    """The threads each run gets: ``threads`` when given, else on this machine the available
    CPUs divided among the ``workers``, and on an existing scheduler's workers 1 (they are
    started one per core, docs/sweeps.md)."""
    if threads is None and address:
        return {"requested": None, "used": 1, "busy": None}
    setting = host_threads.choose(threads, workers)
    return {"requested": threads, "used": setting.used, "busy": setting.busy_cpus}


def _lost(task: dict, err: BaseException) -> dict:
    """A run whose worker died (killed, out of memory) or whose result never came back."""
    return {"run_id": task["run_id"], "status": "failed", "files": {}, "wall_s": float("nan"),
            "cpu_s": float("nan"),
            "message": f"worker lost: {type(err).__name__}: {' '.join(str(err).split())}"}


def run_local(tasks: list[dict], workers: int) -> Iterator[dict]:
    """Worker processes on this machine ('spawn': a fresh interpreter each, one torch thread)."""
    pool = ProcessPoolExecutor(max_workers=workers, initializer=host_threads.single_intra_op,
                               mp_context=multiprocessing.get_context("spawn"))
    futures = {pool.submit(run_point, task): task for task in tasks}
    try:
        for future in as_completed(futures):
            try:
                yield future.result()
            except Exception as err:  # noqa: BLE001 - e.g. BrokenProcessPool
                yield _lost(futures[future], err)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def run_dask(tasks: list[dict], workers: int, address: str | None) -> Iterator[dict]:
    """Dask distributed: an existing scheduler at ``address``, or a LocalCluster of ``workers``
    single-threaded worker processes bound to 127.0.0.1 (started and stopped here)."""
    try:
        from distributed import Client, LocalCluster
        from distributed import as_completed as dask_completed
    except ImportError:
        raise UserError("--executor dask: the 'distributed' package is not installed; "
                        "pip install 'wirelessfl[sweep]' (or dask distributed)") from None
    cluster = None
    if address:
        try:
            client = Client(address, timeout="20s")
        except (OSError, TimeoutError) as err:
            raise UserError(f"--address {address}: cannot reach a Dask scheduler there "
                            f"({' '.join(str(err).split())}); start one with "
                            "'dask scheduler' or check host and port") from None
    else:
        cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                               host="127.0.0.1", dashboard_address=None,
                               silence_logs=logging.CRITICAL)
        client = Client(cluster)
    try:
        futures = client.map(run_point, tasks, pure=False,
                             key=[f"wirelessfl-{t['run_id']}" for t in tasks])
        by_key = {f.key: t for f, t in zip(futures, tasks)}
        for future in dask_completed(futures):
            try:
                yield future.result()
            except Exception as err:  # noqa: BLE001 - KilledWorker, lost connection
                yield _lost(by_key[future.key], err)
    finally:
        client.close()  # the client first, then the cluster we started (if any)
        if cluster is not None:
            cluster.close()


def execute(tasks: list[dict], executor: str, workers: int,
            address: str | None = None, threads: int | None = None) -> Iterator[dict]:
    """Each task's result (run_point's dict), in the order they finish. ``threads``: host
    threads per run (default: chosen by ``thread_plan``)."""
    if not tasks:
        return iter(())
    plan = thread_plan(threads, workers, address)
    tasks = [{**task, "threads": plan} for task in tasks]
    if executor == "dask":
        return run_dask(tasks, workers, address)
    return run_local(tasks, workers)
