"""The pre-run memory estimate (pipeline/memory.py) against the measured peak of whole runs.

For each algorithm family at two population sizes, a scenario runs as a user runs it
(``wirelessfl run SCENARIO --out DIR --quiet``, report figures included) in a fresh process; its
peak resident set (``ru_maxrss`` of that child, from ``os.wait4``) minus a baseline is compared
with ``estimate_memory(scenario)``. The baseline is what the estimate leaves out: a fresh
interpreter that imports every module the measured run had loaded when it ended (its
``sys.modules``, written by the wrapper below) and does nothing else. Target: every
estimate / measured ratio within 0.75-1.25. It also times the refusal of ``num_devices:
1000000000`` by ``validate`` and ``run`` (the check itself in this process, and each command's
wall time, which is mostly the interpreter starting and importing torch).

    python benchmarks/memory_estimate.py [--sizes 2000 20000] [--cross-device ...]
                                         [--out benchmarks/memory_estimate.json]

Cross-device cases (``--cross-device``): SCAFFOLD and FGDRO-KL at N = 100,000 registered with
1 % asked a round (issue 22's acceptance: the estimate within 25 % of the measured peak).

One run at a time; RSS is per process, so other work on the machine slows the benchmark but
does not change what it measures. About 15 minutes on 2 shared cores, under 3 GB.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from wirelessfl.errors import UserError
from wirelessfl.pipeline.memory import check_memory_from_scenario, estimate_memory
from wirelessfl.scenario.loader import scenario_from_document

LOW, HIGH = 0.75, 1.25
CELL = {"seed": 1, "channel": "seed002-cell", "energy": "seed002-accelerator",
        "quantization_bits": 16, "target_accuracy": 0.9}
COMMON = {"rounds": 2, "eval_every": 1, "batch_size": 10}
# One scenario per algorithm family; the classifier families on a synthetic set of 10 samples
# per device (20 features, 10 classes) with an MLP 20-32-10 (d = 1,002), the bilevel methods on
# fedmsa.md's quadratic (one client per device).
FAMILIES = {
    "dzofl": [{"name": "dzofl"}],
    "fedsgd-fedavg-fedprox": [{"name": "fedsgd", "lr": 0.5},
                              {"name": "fedavg", "lr": 0.2, "local_steps": 2},
                              {"name": "fedprox", "lr": 0.2, "local_steps": 2}],
    "drift-corrected": [{"name": "scaffold-cv", "lr": 0.1},
                        {"name": "fedred", "p": 0.5, "eta": 10.0}],
    "fgdro": [{"name": "fgdro-cvar", "local_steps": 2, "k": 3}],
    "zo-hfl": [{"name": "zo-hfl", "tau": 2.0}],
    "bilevel": [{"name": "fedmsa", "local_steps": 2}, {"name": "fednest"}],
}
# Cross-device cases (issue 22's acceptance): N = 100,000 registered, 1 % asked a round, an MLP
# 64-64-10 (d = 8,970) on a synthetic set of 2 samples a device (64 features): per-device
# state held for the devices that have it, a round's work sized by the participants.
CROSS_DEVICE = {
    "scaffold-1pct": [{"name": "scaffold", "local_steps": 5, "lr": 0.1, "participation": 0.01}],
    "fgdro-kl-1pct": [{"name": "fgdro-kl", "local_steps": 5, "lr": 0.1, "participation": 0.01}],
}
CROSS_DEVICE_N = 100_000
# Runs the CLI, then writes the names of the modules it loaded to the file named in argv[1].
WRAPPER = """
import sys
out = sys.argv.pop(1)
from wirelessfl.cli import main
try:
    code = main(sys.argv[1:])
finally:
    open(out, "w").write("\\n".join(sorted(m for m in list(sys.modules) if "." not in m)))
sys.exit(code)
"""
BASELINE = """
import importlib, sys
import matplotlib
matplotlib.use("Agg")
for name in open(sys.argv[1]).read().split():
    try:
        importlib.import_module(name)
    except Exception:
        pass
import wirelessfl.cli, wirelessfl.pipeline.runner, wirelessfl.report.plots
"""


def scenario_doc(family: str, n: int) -> dict:
    doc = {"name": f"mem-{family}-{n}", **copy.deepcopy(CELL), "population": {"num_devices": n},
           "algorithms": [{**COMMON, **a} for a in {**FAMILIES, **CROSS_DEVICE}[family]]}
    if family in CROSS_DEVICE:
        doc["data"] = {"name": "synthetic", "synthetic": {"num_samples": 2 * n,
                                                          "num_features": 64, "num_classes": 10,
                                                          "informative": 16}}
        doc["model"] = {"name": "mlp", "hidden": [64, 64]}
    elif family == "bilevel":
        doc["problem"] = {"name": "bilevel-quadratic", "dimension_x": 10, "dimension_w": 20}
    else:
        doc["data"] = {"name": "synthetic", "synthetic": {"num_samples": 10 * n,
                                                          "num_features": 20, "num_classes": 10,
                                                          "informative": 5}}
        doc["model"] = {"name": "mlp", "hidden": [32]}
        if family == "zo-hfl":
            doc["data"]["server_fraction"] = 0.3
    return doc


def env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def peak_rss(argv: list[str]) -> tuple[int, float, int, str]:
    """(peak RSS [B], wall seconds, exit code, stderr tail) of one child process."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = proc.stderr.read().decode(errors="replace")
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_maxrss * 1024, time.perf_counter() - start, proc.returncode, err[-2000:]


def measure(family: str, n: int, work: Path) -> dict:
    doc = scenario_doc(family, n)
    path = work / f"{family}-{n}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    scenario = scenario_from_document(doc, str(path), [])
    est = estimate_memory(scenario)
    modules = work / f"{family}-{n}.modules"
    run_rss, seconds, code, err = peak_rss([sys.executable, "-c", WRAPPER, str(modules), "run",
                                            str(path), "--out", str(work / f"{family}-{n}"),
                                            "--quiet"])
    if code:
        raise SystemExit(f"{family} at N = {n} failed ({code}):\n{err}")
    base_rss, _, code, err = peak_rss([sys.executable, "-c", BASELINE, str(modules)])
    if code:
        raise SystemExit(f"baseline of {family} failed ({code}):\n{err}")
    measured = run_rss - base_rss
    figures = sorted(p.name for p in (work / f"{family}-{n}").glob("*.png"))
    row = {"family": family, "num_devices": n, "d": est.d,
           "algorithms": [a["name"] for a in doc["algorithms"]], "run_seconds": round(seconds, 1),
           "peak_rss_mb": round(run_rss / 2**20, 1), "baseline_mb": round(base_rss / 2**20, 1),
           "measured_mb": round(measured / 2**20, 1), "estimate_mb": round(est.total / 2**20, 1),
           "ratio": round(est.total / measured, 3), "worst_algorithm": est.worst,
           "estimate_parts_mb": {k: round(v / 2**20, 1) for k, v in est.parts.items()},
           "figures": figures}
    print(f"{family:<22} N={n:>6,}  measured {row['measured_mb']:>7.1f} MB  estimate "
          f"{row['estimate_mb']:>7.1f} MB  ratio {row['ratio']:.3f}  ({seconds:.0f} s)",
          flush=True)
    return row


def refusal(work: Path) -> dict:
    """``num_devices: 1000000000`` (on the bilevel problem, which has no data split for the
    other checks to refuse first): the check's own time here, and the commands' wall time and
    error line."""
    doc = scenario_doc("bilevel", 1_000_000_000)  # no data split to refuse it first
    path = work / "billion.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    start = time.perf_counter()
    scenario = scenario_from_document(doc, str(path), [])
    try:
        check_memory_from_scenario(scenario)
        raise SystemExit("num_devices: 1000000000 was not refused")
    except UserError as err:
        message = str(err)
    check_s = time.perf_counter() - start
    out = {"check_seconds": round(check_s, 4), "message": message}
    for command in ("validate", "run"):
        argv = [sys.executable, "-m", "wirelessfl", command, str(path)]
        if command == "run":
            argv += ["--out", str(work / "billion")]
        _, seconds, code, err = peak_rss(argv)
        lines = [line for line in err.splitlines() if line.startswith("error:")]
        out[command] = {"exit_code": code, "wall_seconds": round(seconds, 2),
                        "error_lines": len(lines), "memory_refusal": any(
                            "needs about" in line for line in lines),
                        "run_folder_created": (work / "billion").exists()}
    _, seconds, _, _ = peak_rss([sys.executable, "-c", "import wirelessfl.cli, torch"])
    out["import_wall_seconds"] = round(seconds, 2)
    print(f"num_devices 1e9: check {check_s * 1000:.0f} ms; validate {out['validate']}, "
          f"run {out['run']} (interpreter + imports alone {seconds:.2f} s)", flush=True)
    return out


def meminfo_total() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs=2, default=[2000, 20000])
    parser.add_argument("--families", nargs="*", default=list(FAMILIES))
    parser.add_argument("--cross-device", nargs="*", default=list(CROSS_DEVICE),
                        help=f"cases at N = {CROSS_DEVICE_N:,}, 1 %% asked a round")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "memory_estimate.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        refused = refusal(work)
        cases = [measure(f, n, work) for n in args.sizes for f in args.families]
        cases += [measure(f, CROSS_DEVICE_N, work) for f in args.cross_device]
    ratios = [c["ratio"] for c in cases]
    result = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": "python benchmarks/memory_estimate.py " + " ".join(sys.argv[1:]),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                    "memory_total_gb": round((meminfo_total() or 0) / 2**30, 1),
                    "python": platform.python_version(), "torch": version("torch"),
                    "numpy": version("numpy")},
        "definition": "measured = peak RSS (ru_maxrss) of `wirelessfl run SCENARIO --out DIR "
                      "--quiet` (report figures included) minus the peak RSS of a fresh "
                      "interpreter importing every top-level module that run had loaded; "
                      "estimate = wirelessfl.pipeline.memory.estimate_memory(scenario), made "
                      "from the scenario alone; ratio = estimate / measured",
        "target": [LOW, HIGH],
        "min_ratio": min(ratios), "max_ratio": max(ratios),
        "all_within": all(LOW <= r <= HIGH for r in ratios),
        "refusal": refused,
        "cases": cases,
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"ratios {min(ratios):.3f}-{max(ratios):.3f}: "
          f"{'all within' if result['all_within'] else 'NOT all within'} {LOW}-{HIGH}; "
          f"wrote {args.out}")


if __name__ == "__main__":
    main()
