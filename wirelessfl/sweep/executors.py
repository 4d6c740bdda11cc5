"""Where a sweep's runs execute: local worker processes (default) or a Dask distributed cluster
(a LocalCluster, or an existing scheduler: a workstation, several machines, dask-jobqueue on
SLURM). Both yield each run's result as it finishes; results do not depend on the executor, nor
on the threads each run gets (host/threads.py)."""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import signal
import time
from collections import deque
from collections.abc import Generator
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait

from wirelessfl.errors import UserError
from wirelessfl.host import threads as host_threads
from wirelessfl.sweep.worker import STOPPED, run_point, serve

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
    """A Dask run whose worker died (killed, out of memory) or whose result never came back."""
    return _failed(task, f"worker lost: {type(err).__name__}: {' '.join(str(err).split())}")


def _failed(task: dict, message: str) -> dict:
    return {"run_id": task["run_id"], "status": "failed", "files": {}, "wall_s": float("nan"),
            "cpu_s": float("nan"), "message": message}


def death_reason(exitcode: int | None) -> str:
    """Why a local worker process ended without sending its run's result, from its exit code
    (negative: the signal that killed it)."""
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = "unknown signal"
        hint = ", e.g. out of memory" if -exitcode == signal.SIGKILL else ""
        return f"worker process killed by signal {-exitcode} ({name}){hint}"
    if exitcode == STOPPED:
        return "worker process stopped by SIGTERM (sent to it, not to the sweep: e.g. scancel)"
    return f"worker process exited with code {exitcode} before returning its result"


@dataclass
class _Worker:
    """One local worker process, the parent's end of its pipe, and the task it runs (None:
    idle)."""

    process: multiprocessing.process.BaseProcess
    conn: Connection
    task: dict | None = None


def _start_worker(ctx) -> _Worker:
    """A 'spawn' process running worker.serve. SIGINT is blocked while it starts, and a blocked
    signal stays blocked across exec: Ctrl-C reaches the whole process group, and only the sweep
    process acts on it (it then stops its workers with SIGTERM)."""
    ours, theirs = ctx.Pipe(duplex=True)
    process = ctx.Process(target=serve, args=(theirs,), name="wirelessfl-sweep-worker",
                          daemon=True)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        process.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        theirs.close()  # the child holds it now: its death reads as EOF here
    return _Worker(process, ours)


def _stop_workers(live: list[_Worker], grace_s: float = 10.0) -> None:
    """Idle workers end at the pipe's EOF; busy ones get SIGTERM (their run stops at a clean
    point, runner.py's sigterm_as_interrupt); any still alive after ``grace_s`` gets SIGKILL.
    Every one is reaped: no worker outlives the sweep."""
    for w in live:
        w.conn.close()
        if w.task is not None and w.process.is_alive():
            w.process.terminate()
    deadline = time.monotonic() + grace_s
    for w in live:
        w.process.join(max(0.0, deadline - time.monotonic()))
        if w.process.is_alive():
            w.process.kill()
            w.process.join()


def run_local(tasks: list[dict], workers: int) -> Generator[dict, None, None]:
    """Worker processes on this machine ('spawn': a fresh interpreter each, one torch thread),
    supervised here, one task at a time each. A worker that dies (the OOM killer's SIGKILL, a
    crash) fails only the run it held, with the reason; a new worker takes its place and the
    other runs go on. Closing the generator (the sweep finished, Ctrl-C, SIGTERM) stops every
    worker. Every worker started takes a task at once, and one that dies holding a task fails
    it, so each death costs a run and this always ends (a worker that cannot even start fails
    the runs one by one, each with the reason)."""
    ctx = multiprocessing.get_context("spawn")
    pending = deque(tasks)
    live: list[_Worker] = []
    try:
        while pending or any(w.task is not None for w in live):
            while pending and len(live) < workers:
                try:
                    live.append(_start_worker(ctx))
                except OSError as err:  # no process to be had (EAGAIN, ENOMEM)
                    if not live:
                        raise UserError(f"cannot start a worker process ({err.strerror}); "
                                        "the runs recorded so far are kept: free memory or "
                                        "processes, or give fewer --workers, and run the same "
                                        "command again") from None
                    break  # go on with fewer
            for w in live:
                if w.task is None and pending:
                    w.task = pending.popleft()
                    with contextlib.suppress(OSError):  # dead already: its task fails below
                        w.conn.send(w.task)
                elif w.task is None:
                    w.conn.close()  # nothing left for it: it exits at EOF
            wait([w.conn for w in live if not w.conn.closed] + [w.process.sentinel for w in live])
            for w in list(live):
                result = None
                if w.task is not None and w.conn.poll():
                    try:
                        result = w.conn.recv()
                    except (EOFError, OSError):  # it died before or while sending
                        result = None
                if result is not None:
                    w.task = None
                    yield result
                if w.process.is_alive():
                    continue
                live.remove(w)
                w.conn.close()
                w.process.join()
                if w.task is not None:  # its run is not retried here: it could kill again
                    yield _failed(w.task, death_reason(w.process.exitcode))
    finally:
        _stop_workers(live)


# The LocalCluster the command starts answers no HTTP: dask starts an HTTP server on the scheduler
# and on every worker even with dashboard_address=None; with these routes empty it serves
# nothing, and it is stopped once up (_stop_http). [D]
NO_HTTP_ROUTES = {"distributed.scheduler.http.routes": [], "distributed.worker.http.routes": []}


def _stop_http(dask_scheduler=None, dask_worker=None) -> None:
    """Stop the HTTP server of the scheduler or worker this runs on (in its event loop)."""
    server = dask_scheduler or dask_worker
    if getattr(server, "http_server", None) is not None:
        server.http_server.stop()


def _no_http_plugin():
    """A worker plugin (applied to every worker, also one the nanny restarts) that stops the
    worker's HTTP server."""
    from distributed.diagnostics.plugin import WorkerPlugin

    class NoHTTP(WorkerPlugin):
        name = "wirelessfl-no-http"

        def setup(self, worker):
            _stop_http(dask_worker=worker)

    return NoHTTP()


def _private_cluster(workers: int):
    """(cluster, client): a LocalCluster of ``workers`` single-threaded worker processes that
    only this process can use. A plain LocalCluster accepts tasks (code) from any process of any
    user on this machine that connects to its port. Here the scheduler and the workers speak TLS
    on 127.0.0.1 and accept only peers holding a certificate of a throwaway certificate
    authority (``Security.temporary``: made in memory for this cluster, given to its workers and
    to our client, never written to disk), and nothing answers HTTP (NO_HTTP_ROUTES)."""
    import dask
    from distributed import Client, LocalCluster

    try:
        from distributed.security import Security

        security = Security.temporary()
    except ImportError:
        raise UserError("--executor dask: the LocalCluster needs the 'cryptography' package for "
                        "its TLS certificates; pip install cryptography") from None
    with dask.config.set(NO_HTTP_ROUTES):
        cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                               host="127.0.0.1", protocol="tls://", security=security,
                               dashboard_address=None, worker_dashboard_address=None,
                               silence_logs=logging.CRITICAL)
        try:
            client = Client(cluster, security=security)
            client.run_on_scheduler(_stop_http)
            client.register_plugin(_no_http_plugin())
        except BaseException:
            cluster.close()
            raise
    return cluster, client


def run_dask(tasks: list[dict], workers: int, address: str | None) -> Generator[dict, None, None]:
    """Dask distributed: an existing scheduler at ``address`` (its security is its operator's:
    docs/sweeps.md), or a private LocalCluster of ``workers`` processes (started and stopped
    here)."""
    try:
        from distributed import Client
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
        cluster, client = _private_cluster(workers)
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


def _nothing() -> Generator[dict, None, None]:
    yield from ()


def execute(tasks: list[dict], executor: str, workers: int,
            address: str | None = None, threads: int | None = None) -> Generator[dict, None, None]:
    """Each task's result (run_point's dict), in the order they finish. ``threads``: host
    threads per run (default: chosen by ``thread_plan``). Close the generator when done with it
    (also on an exception): that stops the workers."""
    if not tasks:
        return _nothing()
    plan = thread_plan(threads, workers, address)
    tasks = [{**task, "threads": plan} for task in tasks]
    if executor == "dask":
        return run_dask(tasks, workers, address)
    return run_local(tasks, workers)
