"""Tuning studies with and without runs in lockstep (docs/sweeps.md, "Runs in lockstep"): the
wall time of ``wirelessfl tune quickstart-tune`` and ``wirelessfl reproduce seed002-quick`` as a
user runs them (``--workers 2``, the CLI, reports included), each with every point alone
(``--no-lockstep``) at ``--before`` (the code before issue 36's last change, from a git worktree:
what "before" means in its acceptance), alone with this code, and by default with this code,
alternated ``--repeats`` times in one sitting (the best of each side compared); and whether every
table the study writes is the same file every time: every ``*.csv`` but the ``runs.csv`` files
(the sweeps' hold host times, the reproduction's names each run's folder; tests/test_lockstep.py
compares the run folders themselves). Also the time of one lane's cross-entropy with this host's
torch kernel, with the AVX2 ones and through ``sample_cross_entropy`` (what bounded a lane's
cost, benchmarks/README.md).

    PYTHONPATH=. python benchmarks/bench_lockstep.py [--out benchmarks/lockstep.json] [--repeats 2]
        [--before 140eb16]
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


# [D] the last commit before sample_cross_entropy: the code issue 36's "before" is measured at
BEFORE = "140eb16"
SIDES = ("before", "alone", "lockstep")


def run_study(command: str, name: str, out: Path, lockstep: bool, code: Path | None = None
              ) -> float:
    """Wall seconds of the study's command line, run to its end in ``out`` (``code``: a
    checkout whose package is imported instead of this one)."""
    args = [sys.executable, "-m", "wirelessfl", command, name, "--out", str(out),
            "--workers", str(WORKERS), "--quiet"] + ([] if lockstep else ["--no-lockstep"])
    env = {**os.environ, **({"PYTHONPATH": str(code)} if code else {})}
    start = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True, check=False, env=env,
                          cwd=code or Path.cwd())
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} exited {done.returncode}:\n{done.stderr[-2000:]}")
    return seconds


# [D] one lane's loss pass of the quickstart: 50 devices x 10 samples, 10 classes
CROSS_ENTROPY = """
import time, torch, torch.nn.functional as F
from wirelessfl.learning.minibatch import sample_cross_entropy
torch.set_num_threads(1)
logits, labels = torch.randn(500, 10), torch.randint(0, 10, (500,))
for _ in range(100):
    {loss}
start = time.perf_counter()
for _ in range(2000):
    {loss}
print((time.perf_counter() - start) / 2000 * 1e6)
"""
TORCH_LOSS = 'F.cross_entropy(logits, labels, reduction="none")'
OUR_LOSS = "sample_cross_entropy(logits, labels)"


def cross_entropy_us(loss: str = TORCH_LOSS, **env: str) -> float:
    """Microseconds of one cross-entropy of a lane's 500 logits of 10 classes by ``loss``
    (torch's kernel or ``sample_cross_entropy``), with torch's kernels as this host picks them
    or as ``env`` sets them (ATEN_CPU_CAPABILITY=avx2)."""
    done = subprocess.run([sys.executable, "-c", CROSS_ENTROPY.format(loss=loss)],
                          capture_output=True, text=True, check=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **env})
    return float(done.stdout)


def worktree(rev: str, where: Path) -> Path:
    """A detached checkout of ``rev`` at ``where`` (git worktree), for the "before" side."""
    subprocess.run(["git", "worktree", "add", "--detach", "-f", str(where), rev], check=True,
                   capture_output=True)
    return where


def tables(out: Path) -> dict[str, bytes]:
    """Every table the study wrote (relative path -> bytes), the runs' host times left out."""
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*.csv"))
            if p.name != "runs.csv" and "runs" not in p.relative_to(out).parts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/lockstep.json")
    parser.add_argument("--repeats", type=int, default=2,
                        help="runs of each side, alternated; the best of each is compared")
    parser.add_argument("--before", default=BEFORE,
                        help="git revision whose code the 'before' side runs (alone)")
    args = parser.parse_args()
    load = os.getloadavg()
    before_commit = subprocess.run(["git", "rev-parse", args.before], capture_output=True,
                                   text=True, check=True).stdout.strip()
    cases = []
    with tempfile.TemporaryDirectory(prefix="bench-lockstep-") as tmp:
        code = worktree(before_commit, Path(tmp) / "before")
        try:
            for command, name in STUDIES:
                seconds: dict[str, list[float]] = {side: [] for side in SIDES}
                written: dict[tuple[str, int], dict[str, bytes]] = {}
                for repeat in range(args.repeats):
                    for side in SIDES:
                        out = Path(tmp) / f"{name}-{side}-{repeat}"
                        seconds[side].append(run_study(command, name, out, side == "lockstep",
                                                       code if side == "before" else None))
                        written[side, repeat] = tables(out)
                        shutil.rmtree(out)
                        print(f"{command} {name} {side}: {seconds[side][-1]:.1f} s", flush=True)
                reference = written["before", 0]
                differing = sorted({k for got in written.values()
                                    for k in reference.keys() | got.keys()
                                    if reference.get(k) != got.get(k)})
                best = {side: min(times) for side, times in seconds.items()}
                cases.append({"command": f"wirelessfl {command} {name} --workers {WORKERS}",
                              **{f"{side}_s": best[side] for side in SIDES},
                              **{f"{side}_samples_s": seconds[side] for side in SIDES},
                              "speedup": best["alone"] / best["lockstep"],
                              "speedup_over_before": best["before"] / best["lockstep"],
                              "tables": sorted(reference), "differing_tables": differing})
                print(f"  {best['before'] / best['lockstep']:.2f}x faster than before, "
                      f"{best['alone'] / best['lockstep']:.2f}x than alone (best of "
                      f"{args.repeats}); tables "
                      f"{'identical' if not differing else 'DIFFER: ' + ', '.join(differing)}",
                      flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(code)], check=False,
                           capture_output=True)
    kernels = {"default": cross_entropy_us(), "avx2": cross_entropy_us(ATEN_CPU_CAPABILITY="avx2"),
               "sample_cross_entropy": cross_entropy_us(OUR_LOSS)}
    record = {"date": datetime.now(UTC).isoformat(timespec="seconds"),
              "command": "PYTHONPATH=. python benchmarks/bench_lockstep.py",
              "before": {"revision": args.before, "commit": before_commit},
              "machine": _machine_facts(load), "workers": WORKERS, "cases": cases,
              "cross_entropy_us": kernels}
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
