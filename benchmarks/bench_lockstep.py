"""Tuning studies with and without runs in lockstep (docs/sweeps.md, "Runs in lockstep"): the
wall time of ``wirelessfl tune quickstart-tune`` and ``wirelessfl reproduce seed002-quick`` as a
user runs them (``--workers 2``, the CLI, reports included), each once with ``--no-lockstep``
(every point alone, as before lockstep existed) and once by default, alternated ``--repeats``
times in one sitting (the best of each side compared); and whether every table the study writes
is the same file every time: every ``*.csv`` but the ``runs.csv`` files (the sweeps' hold host
times, the reproduction's names each run's folder; tests/test_lockstep.py compares the run
folders themselves). Also the time of one lane's cross-entropy with this host's torch kernels
and with the AVX2 ones (what bounds a lane's cost, benchmarks/README.md).

    PYTHONPATH=. python benchmarks/bench_lockstep.py [--out benchmarks/lockstep.json] [--repeats 2]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
STUDIES = [("tune", "quickstart-tune"), ("reproduce", "seed002-quick")]
WORKERS = 2  # [D] the machine's two cores, as the docs' recorded studies ran


def _machine_facts(load: tuple[float, ...]) -> dict:
    spec = importlib.util.spec_from_file_location("bench_model_size",
                                                  BENCH_DIR / "bench_model_size.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.machine_facts(load)


def run_study(command: str, name: str, out: Path, lockstep: bool) -> float:
    """Wall seconds of the study's command line, run to its end in ``out``."""
    args = [sys.executable, "-m", "wirelessfl", command, name, "--out", str(out),
            "--workers", str(WORKERS), "--quiet"] + ([] if lockstep else ["--no-lockstep"])
    start = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} exited {done.returncode}:\n{done.stderr[-2000:]}")
    return seconds


# [D] one lane's loss pass of the quickstart: 50 devices x 10 samples, 10 classes
CROSS_ENTROPY = """
import time, torch, torch.nn.functional as F
torch.set_num_threads(1)
logits, labels = torch.randn(500, 10), torch.randint(0, 10, (500,))
for _ in range(100):
    F.cross_entropy(logits, labels, reduction="none")
start = time.perf_counter()
for _ in range(2000):
    F.cross_entropy(logits, labels, reduction="none")
print((time.perf_counter() - start) / 2000 * 1e6)
"""


def cross_entropy_us(**env: str) -> float:
    """Microseconds of one cross-entropy of a lane's 500 logits of 10 classes, with torch's
    kernels as this host picks them or as ``env`` sets them (ATEN_CPU_CAPABILITY=avx2)."""
    done = subprocess.run([sys.executable, "-c", CROSS_ENTROPY], capture_output=True, text=True,
                          check=True, env={**os.environ, "OMP_NUM_THREADS": "1", **env})
    return float(done.stdout)


def tables(out: Path) -> dict[str, bytes]:
    """Every table the study wrote (relative path -> bytes), the runs' host times left out."""
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*.csv"))
            if p.name != "runs.csv" and "runs" not in p.relative_to(out).parts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/lockstep.json")
    parser.add_argument("--repeats", type=int, default=2,
                        help="runs of each side, alternated; the best of each is compared")
    args = parser.parse_args()
    load = os.getloadavg()
    cases = []
    with tempfile.TemporaryDirectory(prefix="bench-lockstep-") as tmp:
        for command, name in STUDIES:
            seconds: dict[bool, list[float]] = {False: [], True: []}
            written: dict[tuple[bool, int], dict[str, bytes]] = {}
            for repeat in range(args.repeats):
                for lockstep in (False, True):
                    out = Path(tmp) / f"{name}-{'lockstep' if lockstep else 'alone'}-{repeat}"
                    seconds[lockstep].append(run_study(command, name, out, lockstep))
                    written[lockstep, repeat] = tables(out)
                    shutil.rmtree(out)
                    print(f"{command} {name} {'lockstep' if lockstep else 'alone'}: "
                          f"{seconds[lockstep][-1]:.1f} s", flush=True)
            reference = written[False, 0]
            differing = sorted({k for got in written.values()
                                for k in reference.keys() | got.keys()
                                if reference.get(k) != got.get(k)})
            best = {side: min(times) for side, times in seconds.items()}
            cases.append({"command": f"wirelessfl {command} {name} --workers {WORKERS}",
                          "alone_s": best[False], "lockstep_s": best[True],
                          "alone_samples_s": seconds[False], "lockstep_samples_s": seconds[True],
                          "speedup": best[False] / best[True],
                          "tables": sorted(reference), "differing_tables": differing})
            print(f"  {best[False] / best[True]:.2f}x faster (best of {args.repeats}); tables "
                  f"{'identical' if not differing else 'DIFFER: ' + ', '.join(differing)}",
                  flush=True)
    kernels = {"default": cross_entropy_us(), "avx2": cross_entropy_us(ATEN_CPU_CAPABILITY="avx2")}
    record = {"date": datetime.now(UTC).isoformat(timespec="seconds"),
              "command": "PYTHONPATH=. python benchmarks/bench_lockstep.py",
              "machine": _machine_facts(load), "workers": WORKERS, "cases": cases,
              "cross_entropy_us": kernels}
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
