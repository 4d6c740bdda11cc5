"""Where a sweep's runs execute: local worker processes (default) or a Dask distributed cluster
(a LocalCluster, or an existing scheduler: a workstation, several machines, dask-jobqueue on
SLURM). Both yield each run's result as it finishes and hand each run's progress events
(sweep/heartbeat.py) to ``on_event`` as they arrive; results do not depend on the executor, nor
on the threads each run gets (host/threads.py), nor on whether progress is reported."""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import queue
import signal
import time
import uuid
from collections import deque
from collections.abc import Generator
from concurrent.futures import CancelledError
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait

from wirelessfl.errors import UserError
from wirelessfl.host import threads as host_threads
from wirelessfl.sweep.heartbeat import Report
from wirelessfl.sweep.worker import STOPPED, run_on_dask, serve

EXECUTORS = ("local", "dask")
# Seconds between two looks at a Dask study's finished runs and progress events when neither
# came (the client's own thread receives both; this loop hands them on). [D]
DASK_POLL_S = 0.2


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


def _receive(w: _Worker, on_event: Report) -> dict | None:
    """What the worker ``w`` has sent since the last look: its run's progress events go to
    ``on_event``; its result, once there, is returned (None: not yet, or it died before or
    while sending: its death is seen next)."""
    try:
        while w.conn.poll():
            message = w.conn.recv()
            if "event" not in message:
                return message
            on_event(message)
    except (EOFError, OSError):
        pass
    return None


def _ignore(event: dict) -> None:
    """An ``on_event`` for callers that show no progress."""


def run_local(tasks: list[dict], workers: int,
              on_event: Report = _ignore) -> Generator[dict, None, None]:
    """Worker processes on this machine ('spawn': a fresh interpreter each, one torch thread),
    supervised here, one task at a time each; what each run reports while it runs goes to
    ``on_event``, here, between the results. A worker that dies (the OOM killer's SIGKILL, a
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
                result = _receive(w, on_event) if w.task is not None else None
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


def _worker_threads(client) -> int:
    """The task slots of a scheduler's workers now (a cluster that scales, dask-jobqueue's,
    has more or fewer as its jobs come and go)."""
    try:
        return sum(client.nthreads().values())
    except Exception:  # noqa: BLE001 - a lost scheduler: the result loop says so
        return 0


@contextlib.contextmanager
def _quiet_distributed() -> Generator[None, None, None]:
    """distributed's loggers silenced while a study runs on Dask, and restored after. dask's
    logging configuration gives them a stderr handler of their own, so a lost scheduler added
    distributed's lines and tracebacks ("Failed to reconnect to scheduler") to the one
    ``error:`` line the command says it with (``_scheduler_lost``); a worker's lost run is
    reported by the study as well. A logger created later inherits the raised level from
    ``distributed``, its ancestor; its children with a level of their own are raised here too."""
    names = ["distributed"] + [name for name in logging.Logger.manager.loggerDict
                               if name.startswith("distributed.")]
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def _scheduler_lost(client, err: Exception) -> bool:
    """A run's future came back cancelled (nothing here cancels one) or the client is no longer
    connected: the scheduler is gone, and with it every run it held (not one worker, whose run
    alone fails: KilledWorker)."""
    return isinstance(err, CancelledError) or client.status != "running"


def _lost_scheduler_error(address: str | None, err: Exception) -> UserError:
    """The one line a lost scheduler ends the study with: where, why (distributed's reason),
    and that the same command finishes the runs that did not (the finished ones are kept)."""
    reason = getattr(err, "reason", None)  # a cancelled future's ("unknown": none given)
    if not isinstance(err, CancelledError):
        reason = f"{type(err).__name__}: {' '.join(str(err).split())}"
    why = f" ({reason})" if reason and reason != "unknown" else ""
    if address:
        return UserError(f"the Dask scheduler at {address} was lost while runs were in flight"
                         f"{why}; the runs that finished are kept: start the scheduler again "
                         "(or give another with --address) and run the same command again to "
                         "finish the rest")
    return UserError(f"the Dask LocalCluster this command started was lost while runs were in "
                     f"flight{why}; the runs that finished are kept: run the same command again "
                     "to finish the rest")


def run_dask(tasks: list[dict], workers: int, address: str | None,
             on_event: Report = _ignore) -> Generator[dict, None, None]:
    """Dask distributed: an existing scheduler at ``address`` (its security is its operator's:
    docs/sweeps.md), or a private LocalCluster of ``workers`` processes (started and stopped
    here). The runs' progress events come as worker events on a topic of this sweep's own
    (sweep/worker.py ``run_on_dask``); on an existing scheduler, ``on_event`` also gets a
    ``workers`` event with its task slots before every result (the study's estimate of the
    time left divides by them, not by ``workers``). A lost scheduler ends it with one UserError
    (the study keeps the runs that finished), distributed's own log lines silenced meanwhile."""
    try:
        import distributed  # noqa: F401 - only whether it is there
    except ImportError:
        raise UserError("--executor dask: the 'distributed' package is not installed; "
                        "pip install 'wirelessfl[sweep]' (or dask distributed)") from None
    with _quiet_distributed():
        yield from _on_dask(tasks, workers, address, on_event)


def _on_dask(tasks: list[dict], workers: int, address: str | None,
             on_event: Report) -> Generator[dict, None, None]:
    """``run_dask``'s work, once distributed is known to be there and quiet."""
    from distributed import Client
    from distributed import as_completed as dask_completed

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
    events: queue.SimpleQueue = queue.SimpleQueue()
    topic = f"wirelessfl-progress-{uuid.uuid4().hex}"
    try:
        if tasks[0].get("progress") is not None:
            client.subscribe_topic(topic, lambda event: events.put(event[1]))
            tasks = [{**t, "progress": {**t["progress"], "topic": topic}} for t in tasks]
        futures = client.map(run_on_dask, tasks, pure=False,
                             key=[f"wirelessfl-{t['run_id']}" for t in tasks])
        by_key = {f.key: t for f, t in zip(futures, tasks)}
        finished = dask_completed(futures)
        while not finished.is_empty():
            while not events.empty():
                on_event(events.get())
            ready = finished.next_batch(block=False)
            if not ready:
                time.sleep(DASK_POLL_S)
            for future in ready:
                try:
                    result = future.result()
                except Exception as err:  # noqa: BLE001 - KilledWorker, lost connection
                    if _scheduler_lost(client, err):
                        raise _lost_scheduler_error(address, err) from None
                    result = _lost(by_key[future.key], err)
                if address:
                    on_event({"event": "workers", "count": _worker_threads(client)})
                yield result
    finally:
        client.close()  # the client first, then the cluster we started (if any)
        if cluster is not None:
            cluster.close()


def _nothing() -> Generator[dict, None, None]:
    yield from ()


def execute(tasks: list[dict], executor: str, workers: int,
            address: str | None = None, threads: int | None = None,
            on_event: Report = _ignore) -> Generator[dict, None, None]:
    """Each task's result (run_point's dict), in the order they finish; the runs' progress
    events (sweep/heartbeat.py) go to ``on_event`` as they come, in this thread. ``threads``:
    host threads per run (default: chosen by ``thread_plan``). Close the generator when done
    with it (also on an exception): that stops the workers."""
    if not tasks:
        return _nothing()
    plan = thread_plan(threads, workers, address)
    tasks = [{**task, "threads": plan} for task in tasks]
    if executor == "dask":
        return run_dask(tasks, workers, address, on_event)
    return run_local(tasks, workers, on_event)
