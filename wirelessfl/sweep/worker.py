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

# Oversubscription: several torch processes each using every core made tiny ops ~1000x slower on
# a 2-core machine (team measurement); one thread per worker process, set before torch starts.
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def limit_threads() -> None:
    """One compute thread in this process (idempotent; local pool initializer and Dask task)."""
    for name in THREAD_ENV:
        os.environ[name] = "1"
    import torch

    if torch.get_num_threads() != 1:
        torch.set_num_threads(1)


def run_point(task: dict) -> dict:
    """Run one sweep point; never raises: a failure comes back as ``status: failed`` with its
    message, so the sweep records it and carries on."""
    limit_threads()
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
                                     extra={"sweep": task["sweep"]})
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
