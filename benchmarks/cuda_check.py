"""Every shipped scenario on a GPU: the short version of each (shipped_identity.py's, the same
overrides and generated data) run with ``device: cuda`` twice and with ``device: cpu`` once, on
the machine that has the GPU.

Recorded per scenario: whether each run completed (the error's last line when not), the GPU's
warnings (an operation without a deterministic kernel warns, pipeline/build.py
``deterministic_gpu``), whether the two GPU runs gave the same tables (canonical digests), and the
CPU run against the GPU run column by column: equal, or the largest absolute and relative
difference. The simulated world (times, energies, bits, counts) must be equal, the learning
columns (results/records.py ``LEARNING_COLUMNS``) follow another device's float32 kernels.
tests/test_cuda.py asserts the same per algorithm; this is the record for the shipped
scenarios, made where a GPU was lent (there is none in CI).

    python benchmarks/cuda_check.py [--out benchmarks/cuda_check.json] [--only NAME ...]
        [--workers 12]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import os
import platform
import sys
import tempfile
import time
import traceback
import warnings
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime
from functools import cache
from multiprocessing import get_context
from pathlib import Path

import torch

from wirelessfl.results.records import LEARNING_COLUMNS

BENCH_DIR = Path(__file__).resolve().parent


@cache
def _identity():
    spec = importlib.util.spec_from_file_location("shipped_identity",
                                                  BENCH_DIR / "shipped_identity.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_once(name: str, device: str, work: str) -> dict:
    """Scenario ``name``'s short version on ``device`` into a fresh folder under ``work`` (which
    holds the generated data): {"status", "seconds", "warnings", "error", "folder"}."""
    ident = _identity()
    path = ident.scenario_files()[name]
    overrides = ident.short_overrides(name, path, Path(work) / "data") + [f"device={device}"]
    out = Path(tempfile.mkdtemp(prefix=f"{name}-{device}-", dir=work))
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            ident.run_in_process(path, overrides, out, threads=1)
            error = None
        except BaseException as err:  # noqa: BLE001 - recorded, the next scenario runs
            error = f"{type(err).__name__}: {err}"[-2000:] + "\n" + traceback.format_exc()[-3000:]
    seen = sorted({f"{w.category.__name__}: {w.message}"[:300] for w in caught})
    return {"status": "failed" if error else "ran", "seconds": round(time.perf_counter() - start, 2),
            "warnings": seen, "error": error, "folder": str(out)}


def compare(ident, cpu_folder: str, gpu_folder: str) -> dict:
    """Column by column, the CPU run's tables against the GPU run's."""
    cpu, _ = ident.read_run(Path(cpu_folder))
    gpu, _ = ident.read_run(Path(gpu_folder))
    out = {}
    for table in ident.TABLES:
        a, b = cpu[table], gpu[table]
        if list(a.columns) != list(b.columns) or len(a) != len(b):
            out[table] = {"problem": f"{a.shape} {list(a.columns)} vs {b.shape} {list(b.columns)}"}
            continue
        equal, differ = [], {}
        for column in a.columns:
            result = ident.compare_column(a[column], b[column])
            if result["equal"]:
                equal.append(str(column))
            else:
                differ[str(column)] = {"max_abs": result["max_abs"],
                                       "max_rel": result["max_rel"],
                                       "learning": column in LEARNING_COLUMNS,
                                       "note": result["note"]}
        out[table] = {"equal": len(equal), "differ": differ}
    return out


def world_equal(comparison: dict) -> bool:
    """Every column outside the learning ones equal between the CPU and the GPU run."""
    return all("problem" not in t and not any(not c["learning"] for c in t["differ"].values())
               for t in comparison.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/cuda_check.json")
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--workers", type=int, default=12, help="worker processes")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("error: no CUDA GPU here: run this where one is")
    ident = _identity()
    names = args.only or list(ident.scenario_files())
    results = {}
    with tempfile.TemporaryDirectory(prefix="cuda-check-") as work:
        ident.write_data(Path(work) / "data")
        os.environ["OMP_NUM_THREADS"] = "1"  # the worker processes' (spawned after this)
        with ProcessPoolExecutor(args.workers, mp_context=get_context("spawn")) as pool:
            # every run in its own worker process (the GPU runs side by side too: each process
            # has its own CUDA context, and deterministic kernels do not depend on the load)
            runs = {n: [pool.submit(run_once, n, device, work) for device in ("cpu", "cuda",
                                                                               "cuda")]
                    for n in names}
            for name in names:
                cpu, *gpu = (future.result() for future in runs[name])
                entry = {"cpu": {k: cpu[k] for k in ("status", "seconds", "error")},
                         "gpu": [{k: g[k] for k in ("status", "seconds", "warnings", "error")}
                                 for g in gpu]}
                if all(g["status"] == "ran" for g in gpu):
                    entry["gpu_repeatable"] = (ident.digest_run(Path(gpu[0]["folder"]))
                                               == ident.digest_run(Path(gpu[1]["folder"])))
                if cpu["status"] == "ran" and gpu[0]["status"] == "ran":
                    with contextlib.redirect_stderr(io.StringIO()):
                        entry["cpu_vs_gpu"] = compare(ident, cpu["folder"], gpu[0]["folder"])
                    entry["world_equal"] = world_equal(entry["cpu_vs_gpu"])
                results[name] = entry
                print(f"{name}: cpu {cpu['status']} {cpu['seconds']} s, gpu "
                      f"{[g['status'] for g in gpu]} {[g['seconds'] for g in gpu]} s, repeatable "
                      f"{entry.get('gpu_repeatable')}, world equal {entry.get('world_equal')}",
                      flush=True)
                for g in gpu[:1]:
                    if g["error"]:
                        print(g["error"], flush=True)
    out = {"date": datetime.now(UTC).isoformat(timespec="seconds"),
           "command": "benchmarks/cuda_check.py " + " ".join(sys.argv[1:]),
           "machine": {"platform": platform.platform(), "torch": torch.__version__,
                       "cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name(),
                       "cpu_capability": torch.backends.cpu.get_cpu_capability()},
           "scenarios": results}
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
