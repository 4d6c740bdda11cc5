"""Speed-up of `wirelessfl sweep` with the local executor: the example study
(scenarios/sweep-power.yaml, 30 runs) on 1 worker process against 2 (or --workers ...).

Each setting runs the whole sweep from scratch as a user would (`python -m wirelessfl sweep`, a
fresh process, worker start-up included) into its own temporary folder, the settings interleaved
(1, 2, 1, 2, ...) --repeats times; the speed-up is the ratio of the best wall-clock times (other
processes on a shared machine only ever slow a repeat down), the median ratio is reported too.
The script checks that every run's rounds.parquet is the same whatever the number of workers, and
writes wall-clock and CPU times and the machine's load to a JSON file.

    python benchmarks/sweep_speedup.py [--sweep sweep-power] [--workers 1 2] [--repeats 2]
        [--out benchmarks/sweep_speedup.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]


def _machine_busy_s() -> float:
    """CPU seconds all processes on the machine have used since boot (/proc/stat; Linux)."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return float("nan")
    user, nice, system, _idle, _iowait, irq, softirq = map(int, fields[:7])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


PROBE = """
import time
t0, c0 = time.perf_counter(), time.process_time()
while time.perf_counter() - t0 < 3:
    pass
print((time.process_time() - c0) / (time.perf_counter() - t0))
"""


def cpus_available(processes: int = 2) -> float:
    """CPUs this session gets right now: ``processes`` busy loops run side by side for 3 s; the
    sum of their CPU/wall ratios. About 2 on an idle 2-core machine; less when other users'
    sessions are busy (Linux autogroup shares the CPUs between sessions, not processes)."""
    procs = [subprocess.Popen([sys.executable, "-c", PROBE], stdout=subprocess.PIPE, text=True)
             for _ in range(processes)]
    return round(sum(float(p.communicate()[0]) for p in procs), 2)


def run(sweep: str, workers: int, out: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    load = os.getloadavg()[0]
    available = cpus_available()
    busy = _machine_busy_s()
    start, cpu = time.perf_counter(), os.times()
    subprocess.run([sys.executable, "-m", "wirelessfl", "sweep", sweep, "--out", str(out),
                    "--workers", str(workers), "--quiet", "--no-compare"], check=True, env=env,
                   cwd=ROOT)
    wall = time.perf_counter() - start
    after = os.times()  # the sweep process and its workers (reaped children), start-up included
    cpu_total = (after.children_user + after.children_system
                 - cpu.children_user - cpu.children_system)
    others = _machine_busy_s() - busy - cpu_total  # CPU seconds of every other process
    table = pd.read_csv(out / "runs.csv")
    return {"workers": workers, "wall_s": round(wall, 2), "runs": len(table),
            "failed": int((table.status == "failed").sum()),
            "host_s_per_run_median": round(float(table.wall_s.median()), 3),
            "host_s_all_runs": round(float(table.wall_s.sum()), 2),
            "cpu_s_all_runs": round(float(table.cpu_s.sum()), 2),
            "cpu_s_total": round(cpu_total, 2),
            # runs in flight on average: the executor's concurrency, whatever the CPU share
            "runs_in_flight_mean": round(float(table.wall_s.sum()) / wall, 2),
            "cpus_available_before": available,
            # mean number of CPUs that other users' processes kept busy during this sweep
            "other_processes_cpus": round(others / wall, 2),
            "load_average_1min_before": round(load, 2),
            "load_average_1min_after": round(os.getloadavg()[0], 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", default="sweep-power")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "sweep_speedup.json"))
    args = parser.parse_args()
    results, frames = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for workers in args.workers:
                out = Path(tmp) / f"w{workers}-r{repeat}"
                results.append({"repeat": repeat, **run(args.sweep, workers, out)})
                print(json.dumps(results[-1]), flush=True)
                frames[(workers, repeat)] = {p.name: pd.read_parquet(p / "rounds.parquet")
                                             for p in sorted((out / "runs").iterdir())}
                shutil.rmtree(out)
        first = next(iter(frames.values()))
        for key, runs in frames.items():  # same numbers whatever the number of workers
            assert list(runs) == list(first), key
            for name, frame in runs.items():
                pd.testing.assert_frame_equal(frame, first[name])
    walls = {w: [r["wall_s"] for r in results if r["workers"] == w] for w in args.workers}
    base = args.workers[0]
    report = {
        "sweep": args.sweep, "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cores": len(os.sched_getaffinity(0)), "python": sys.version.split()[0],
        "repeats": args.repeats, "results": results,
        "best_wall_s": {str(w): min(v) for w, v in walls.items()},
        "speedup_best": {str(w): round(min(walls[base]) / min(v), 3) for w, v in walls.items()},
        "speedup_median": {str(w): round(statistics.median(walls[base]) / statistics.median(v),
                                         3) for w, v in walls.items()},
        "identical_rounds_parquet": True,
    }
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({"speedup_best": report["speedup_best"],
                      "speedup_median": report["speedup_median"]}))


if __name__ == "__main__":
    main()
