"""What runs in a sweep worker (a local process or a Dask worker): one point, start to finish.

The worker writes the run folder with the same code as `wirelessfl run` (pipeline/runner.py) into a
private temporary folder and sends the files back; the sweep process puts them in place with one
rename. So a Dask worker on another machine needs no shared filesystem.

A local worker process (sweep/executors.py) runs ``serve``: one task at a time from its pipe, the
result back on it, preceded by the run's progress events (sweep/heartbeat.py); a Dask worker runs
``run_on_dask``, whose events travel as the worker's events on the task's topic. A local worker
never outlives the sweep process: when that one is gone (even killed with SIGKILL, which no
handler sees) the worker stops its run like SIGTERM would and exits.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import sys
import tempfile
import threading
import time
from multiprocessing.connection import wait
from pathlib import Path

from wirelessfl.host import threads
from wirelessfl.sweep.heartbeat import Heartbeat, Report

# The package's __init__.py this worker imported (what ``wirelessfl.__file__`` is: submodules are
# found in the package's folder), named from here: the top package is above the sweep layer.
PACKAGE_FILE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "__init__.py")


def run_point(task: dict, report: Report | None = None) -> dict:
    """Run one sweep point; never raises: a failure comes back as ``status: failed`` with its
    message, so the sweep records it and carries on. ``report``: where its progress events go
    (sweep/heartbeat.py; ``task["progress"]`` None: none are sent).

    ``task["threads"]``: {"requested": N or None, "used": the pool size, "busy": the load seen}
    (sweep/executors.py's ``thread_plan``; without it, chosen here). One intra-op thread either way
    (host/threads.py), so the results do not depend on it."""
    wanted = task.get("threads") or {}
    setting = threads.configure(wanted.get("requested"), wanted.get("used"), wanted.get("busy"))
    from wirelessfl.errors import UserError
    from wirelessfl.pipeline.runner import run_scenario
    from wirelessfl.plugins import allow_references, import_worker_modules
    from wirelessfl.results.records import folder_files
    from wirelessfl.scenario.loader import scenario_from_document

    start, start_cpu = time.perf_counter(), time.process_time()
    heartbeat = Heartbeat(task, report)
    heartbeat.started()
    result = {"run_id": task["run_id"], "host": socket.gethostname(), "pid": os.getpid(),
              "module": PACKAGE_FILE, "files": {}}
    warnings: list[str] = []
    plugins = task.get("plugins") or {}
    # References are allowed exactly when the command that sent the task allowed them: this
    # worker's own environment (a Dask worker's, on another machine) says nothing of that.
    allowed = plugins.get("references") is True
    try:
        with allow_references(allowed):
            import_worker_modules(plugins.get("modules", []), plugins.get("path", []))
            scenario = scenario_from_document(task["scenario"], task["source"])
            with tempfile.TemporaryDirectory(prefix="wirelessfl-sweep-") as tmp:
                out = Path(tmp) / "run"
                status, _ = run_scenario(scenario, out, warn=warnings.append,
                                         extra={"sweep": task["sweep"]},
                                         threads=setting.requested,
                                         **heartbeat.callbacks(
                                             [(p.display_name, p.rounds)
                                              for p in scenario.algorithms]))
                result["files"] = folder_files(out)
        result.update(status=status, message="; ".join(warnings))
    except UserError as err:
        result.update(status="failed", message=" ".join(str(err).split()))
    except Exception as err:  # noqa: BLE001 - any crash of one run is recorded, not raised
        result.update(status="failed", message=f"{type(err).__name__}: "
                                               + " ".join(str(err).split()))
    result["wall_s"] = time.perf_counter() - start
    result["cpu_s"] = time.process_time() - start_cpu
    return result


def run_group(task: dict, report: Report | None = None) -> dict:
    """The points ``task["members"]`` of one lockstep group (pipeline/lockstep.py: runs that
    differ only in step sizes, simulated together and recorded each as its run alone) in this
    worker; never raises. The result holds each point's result as ``run_point`` gives it, in
    ``members``, with the group's wall and CPU time shared equally among them (a study's host
    time, the sum, stays the time spent). Progress events are the group's, under the first
    point's run id."""
    wanted = task.get("threads") or {}
    setting = threads.configure(wanted.get("requested"), wanted.get("used"), wanted.get("busy"))
    from wirelessfl.errors import UserError
    from wirelessfl.pipeline.runner import run_in_lockstep
    from wirelessfl.plugins import allow_references, import_worker_modules
    from wirelessfl.results.records import folder_files
    from wirelessfl.scenario.loader import scenario_from_document

    start, start_cpu = time.perf_counter(), time.process_time()
    heartbeat = Heartbeat(task, report)
    heartbeat.started()
    members = task["members"]
    results = [{"run_id": m["run_id"], "host": socket.gethostname(), "pid": os.getpid(),
                "module": PACKAGE_FILE, "files": {}} for m in members]
    plugins = task.get("plugins") or {}
    try:
        with allow_references(plugins.get("references") is True):
            import_worker_modules(plugins.get("modules", []), plugins.get("path", []))
            scenarios, places = [], []
            for i, member in enumerate(members):
                try:
                    scenarios.append(scenario_from_document(member["scenario"],
                                                            member["source"]))
                    places.append(i)
                except UserError as err:
                    results[i].update(status="failed", message=" ".join(str(err).split()))
            warnings: list[list[str]] = [[] for _ in places]
            callbacks = heartbeat.callbacks([(scenarios[0].algorithms[0].display_name,
                                              scenarios[0].algorithms[0].rounds)]
                                            if scenarios else [])
            with tempfile.TemporaryDirectory(prefix="wirelessfl-sweep-") as tmp:
                outs = [Path(tmp) / f"run-{i}" for i in places]
                if callbacks:
                    callbacks["on_algorithm"](scenarios[0].algorithms[0].display_name)
                done = run_in_lockstep(scenarios, outs, warns=[w.append for w in warnings],
                                       extras=[{"sweep": members[i]["sweep"]} for i in places],
                                       on_round=callbacks.get("on_round"),
                                       threads=setting.requested) if scenarios else []
                for i, out, said, outcome in zip(places, outs, warnings, done, strict=True):
                    if isinstance(outcome, UserError):
                        results[i].update(status="failed",
                                          message=" ".join(str(outcome).split()))
                    else:
                        results[i].update(status=outcome[0], message="; ".join(said),
                                          files=folder_files(out))
    except Exception as err:  # noqa: BLE001 - any crash of the group is each run's, recorded
        for result in results:
            if "status" not in result:
                result.update(status="failed", files={},
                              message=f"{type(err).__name__}: " + " ".join(str(err).split()))
    wall_s = time.perf_counter() - start
    cpu_s = time.process_time() - start_cpu
    for result in results:
        result.update(wall_s=wall_s / len(results), cpu_s=cpu_s / len(results))
    return {"run_id": task["run_id"], "members": results}


def run_task(task: dict, report: Report | None = None) -> dict:
    """A sweep task: one point (``run_point``) or a lockstep group of points (``run_group``)."""
    return run_group(task, report) if task.get("members") else run_point(task, report)


def run_on_dask(task: dict) -> dict:
    """``run_point`` on a Dask worker: its progress events are logged as the worker's events
    on ``task["progress"]["topic"]``, which the sweep's client subscribes to
    (sweep/executors.py ``run_dask``); the scheduler forwards them, so they need no channel of
    their own between the machines."""
    from distributed import get_worker

    topic = (task.get("progress") or {}).get("topic")
    worker = get_worker()
    return run_task(task, (lambda event: worker.log_event(topic, event)) if topic else None)


# Exit code of a worker whose run SIGTERM stopped (128 + the signal, as a shell reports it).
STOPPED = 128 + signal.SIGTERM
# Seconds a worker whose sweep process is gone waits for its run to stop at a clean point (its
# temporary folder removed) before it exits regardless. [D]
ORPHAN_GRACE_S = 10.0


def _exit_with_parent() -> None:
    """Stop this process when the process that started it is gone. ``parent_process().sentinel``
    is a pipe the parent holds open until it exits, however it exits, so it reads as closed
    exactly then (a poll of ``getppid`` would lag and misses a parent whose pid was reused)."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch():
        wait([parent.sentinel])
        os.kill(os.getpid(), signal.SIGTERM)  # a run in progress stops like `kill` (runner.py)
        time.sleep(ORPHAN_GRACE_S)
        os._exit(1)

    threading.Thread(target=watch, name="wirelessfl-parent-watch", daemon=True).start()


def serve(conn) -> None:
    """The loop of a local worker process: receive a task, send back ``run_point``'s progress
    events and then its result, until the sweep closes the pipe. Ctrl-C is left to the sweep
    process (it reaches the whole process group; the sweep stops its workers with SIGTERM): a
    worker that also stopped on it could lose a result it was sending. One torch/BLAS thread, as ``threads.single_intra_op``
    sets for every run."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threads.single_intra_op()
    _exit_with_parent()
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return  # the sweep is done with this worker, or gone
        try:
            result = run_task(task, conn.send)
        except KeyboardInterrupt:  # SIGTERM stopped the run: nothing to send
            sys.exit(STOPPED)
        conn.send(result)
