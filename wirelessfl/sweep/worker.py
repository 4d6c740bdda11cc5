"""What runs in a sweep worker (a local process or a Dask worker): one point, start to finish.

The worker writes the run folder with the same code as `wirelessfl run` (engine/runner.py) into a
private temporary folder and sends the files back; the sweep process puts them in place with one
rename. So a Dask worker on another machine needs no shared filesystem.
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
from pathlib import Path

from wirelessfl.engine import threads


def run_point(task: dict) -> dict:
    """Run one sweep point; never raises: a failure comes back as ``status: failed`` with its
    message, so the sweep records it and carries on.

    ``task["threads"]``: {"requested": N or None, "used": the pool size, "busy": the load seen}
    (sweep/executors.py's ``thread_plan``; without it, chosen here). One intra-op thread either way
    (engine/threads.py), so the results do not depend on it."""
    wanted = task.get("threads") or {}
    setting = threads.configure(wanted.get("requested"), wanted.get("used"), wanted.get("busy"))
    import wirelessfl
    from wirelessfl.engine.runner import run_scenario
    from wirelessfl.errors import UserError
    from wirelessfl.results.records import folder_files
    from wirelessfl.scenario.loader import scenario_from_document

    start, start_cpu = time.perf_counter(), time.process_time()
    result = {"run_id": task["run_id"], "host": socket.gethostname(), "pid": os.getpid(),
              "module": wirelessfl.__file__, "files": {}}
    warnings: list[str] = []
    try:
        scenario = scenario_from_document(task["scenario"], task["source"])
        with tempfile.TemporaryDirectory(prefix="wirelessfl-sweep-") as tmp:
            out = Path(tmp) / "run"
            status, _ = run_scenario(scenario, out, warn=warnings.append,
                                     extra={"sweep": task["sweep"]},
                                     threads=setting.requested)
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
