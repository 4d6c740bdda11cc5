"""A run's host time on an idle machine against the same run beside other CPU-bound processes.

Each repeat times `wirelessfl run SCENARIO` (a fresh process, as a user runs it) twice,
interleaved: once with the machine as it is, once while ``--hogs`` Python busy-loop processes
(started here, always stopped here) keep cores busy. Before each run it records the CPUs of this
process's affinity mask and how many of them other processes kept busy (host/threads.py), and
after it the threads the run chose (its manifest). Target: loaded within 2x of idle (torch's
spinning OpenMP threads made a loaded run 8-20x slower before every numeric kernel ran on one
intra-op thread). Run it on an otherwise quiet machine:

    python benchmarks/load_speed.py [--repeats 3] [--hogs 2] [--out benchmarks/load_speed.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from wirelessfl.host.threads import busy_cpus, cpu_count

BUSY_LOOP = "while True:\n    pass\n"
TARGET_RATIO = 2.0


def start_hogs(count: int) -> list[subprocess.Popen]:
    """``count`` CPU-bound processes (a Python busy loop each)."""
    return [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(count)]


def stop_hogs(hogs: list[subprocess.Popen]) -> None:
    for hog in hogs:
        hog.kill()
    for hog in hogs:
        hog.wait()


def timed_run(scenario: str, sets: list[str], folder: Path) -> dict:
    """Host seconds of one `wirelessfl run`, the load seen just before it and its threads."""
    seen = busy_cpus(0.5)
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    argv = [sys.executable, "-m", "wirelessfl", "run", scenario, "--out", str(folder), "--quiet",
            "--no-report", *[arg for s in sets for arg in ("--set", s)]]
    start = time.perf_counter()
    proc = subprocess.run(argv, check=False, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode:
        raise SystemExit(f"wirelessfl run failed:\n{proc.stderr}")
    threads = json.loads((folder / "manifest.json").read_text())["threads"]
    return {"seconds": seconds, "busy_cpus_before": round(seen, 2), "threads": threads}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="quickstart")
    parser.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE",
                        help="scenario override (e.g. a shorter run to try the script)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hogs", type=int, default=2, help="CPU-bound processes when loaded")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "load_speed.json"))
    args = parser.parse_args()
    runs: dict[str, list[dict]] = {"idle": [], "loaded": []}
    with tempfile.TemporaryDirectory(prefix="load-speed-") as tmp:
        for repeat in range(args.repeats):
            for condition in ("idle", "loaded"):
                hogs = start_hogs(args.hogs) if condition == "loaded" else []
                try:
                    if hogs:
                        time.sleep(1.0)  # let the hogs get going before the load is sampled
                    result = timed_run(args.scenario, args.set,
                                       Path(tmp) / f"{condition}-{repeat}")
                finally:
                    stop_hogs(hogs)
                runs[condition].append(result)
                print(f"repeat {repeat} {condition:<6} {result['seconds']:7.2f} s  busy CPUs "
                      f"{result['busy_cpus_before']:.2f}  threads {result['threads']['used']}",
                      flush=True)
    idle = statistics.median(r["seconds"] for r in runs["idle"])
    loaded = statistics.median(r["seconds"] for r in runs["loaded"])
    ratio = loaded / idle
    summary = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "cpus": cpu_count(), "python": platform.python_version(),
                    "torch": version("torch")},
        "scenario": args.scenario, "set": args.set, "hogs": args.hogs, "repeats": args.repeats,
        "idle_s_median": idle, "loaded_s_median": loaded, "ratio_loaded_to_idle": ratio,
        "target_ratio": TARGET_RATIO, "within_target": ratio <= TARGET_RATIO, "runs": runs,
    }
    Path(args.out).write_text(json.dumps(summary, indent=2) + "\n")
    print(f"idle {idle:.2f} s, loaded ({args.hogs} busy processes) {loaded:.2f} s: "
          f"x{ratio:.2f} (target <= x{TARGET_RATIO:g}); wrote {args.out}")


if __name__ == "__main__":
    main()
