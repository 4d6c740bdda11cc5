"""Fuzz every input a user hands wirelessfl: scenario, sweep and tune files, --set values, and
damaged run folders (issues 11 and 20).

Kinds of input (generators in ``tests/scenario_fuzz.py``):

* ``documents``: mutated scenario documents fed to the loader;
* ``yaml_files``: raw scenario files (corrupted bytes, anchors, aliases, tags, unsafe Python
  tags, non-UTF-8) through ``wirelessfl validate``;
* ``sweep_files``: mutated sweep files (small ones, ``scenarios/sweep-power.yaml`` and
  docs/sweeps.md's ``points`` form) and templates, including nested-alias bombs, through
  ``wirelessfl validate``;
* ``tune_files``: mutated tune files and templates through ``wirelessfl validate``;
* ``set_values``: 1-3 ``--set`` assignments (unknown and malformed key paths, wrong types, huge
  and non-finite numbers, NUL bytes, YAML syntax errors, aliases, nests 5,000 deep) on
  ``wirelessfl validate``;
* ``run_folders``: a real tiny run folder (finished, or SIGKILLed after a checkpoint; made once
  per session) damaged (files truncated, garbled, emptied, deleted, replaced by folders or
  symlinks; manifest JSON invalid or mutated; table columns NaN, inf, strings, dropped), then
  ``wirelessfl report`` (with or without ``--html``), ``compare`` or ``run --resume``.

Each ends in: valid (exit 0), rejected (exit 2, exactly one ``error:`` line, no traceback;
a file's rejection names the file), hang (past the time limit) or crashed (anything else: a
traceback, another exit code, an unsafe tag executed, a file outside the run folder written).
Commands run in this process (``cli.main``) for speed, under an address-space limit so a memory
bomb ends in MemoryError instead of the machine's OOM killer.

    python benchmarks/fuzz_scenarios.py [--examples 10000] [--kinds sweep_files,set_values]
        [--seed 0] [--out benchmarks/fuzz_scenarios.json]

``--examples`` is the total, shared among the chosen kinds in proportion to ``SHARES``. The
same seed and code give the same inputs; the JSON keeps the first crashing inputs of each kind.
To use two cores, run disjoint ``--kinds`` with ``--examples`` in the same proportion (e.g.
``--kinds run_folders --examples 500`` beside the other kinds with ``--examples 9500``), each
with its own ``--out``, then sum them: ``--combine A.json B.json --out ...``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import shutil
import sys
import tempfile
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import tests.scenario_fuzz as fz

# [D] shares of the total: the run folders (about 1 s each: a report draws seven figures) get
# few, so that 10,000 inputs take about 20-30 minutes on one core.
SHARES = {"documents": 25, "yaml_files": 20, "sweep_files": 20, "tune_files": 6,
          "set_values": 24, "run_folders": 5}
MEMORY_LIMIT_BYTES = 8 << 30  # [D] address space: a bomb fails with MemoryError, not the machine
CRASHES_KEPT = 10  # distinct crashes kept per kind
VALIDATE_TIMEOUT_S = 30.0  # [D] a validate past this is a hang


def _where(exc: BaseException) -> str:
    """The innermost frame of the traceback inside wirelessfl (module:line function)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/wirelessfl/" in f.filename]
    if not frames:
        return "outside wirelessfl"
    f = frames[-1]
    return f"{f.filename.split('wirelessfl/', 1)[-1]}:{f.lineno} {f.name}"


def combine(parts: list[Path], out: Path) -> None:
    """One record from runs of disjoint kinds (run side by side, one per core)."""
    reports = [json.loads(p.read_text()) for p in parts]
    kinds = [k for r in reports for k in r["kinds"]]
    if len(set(kinds)) != len(kinds) or len({r["seed"] for r in reports}) != 1:
        sys.exit("--combine: the parts must cover disjoint kinds with the same seed")
    outcomes = ("valid", "rejected", "crashed", "hang")
    merged = {"date": max(r["date"] for r in reports),
              "examples": sum(r["examples"] for r in reports), "kinds": kinds,
              "tried": sum(r["tried"] for r in reports),
              **{o: sum(r[o] for r in reports) for o in outcomes},
              "unsafe_tags_executed": sum(r["unsafe_tags_executed"] for r in reports),
              "seed": reports[0]["seed"],
              "killed_base": any(r.get("killed_base") for r in reports),
              "by_family": {k: v for r in reports for k, v in r["by_family"].items()},
              "seconds_by_family": {k: v for r in reports for k, v in r["seconds_by_family"].items()},
              "crash_samples": {k: v for r in reports for k, v in r["crash_samples"].items()},
              "seconds": max(r["seconds"] for r in reports),
              "parts": [{"kinds": r["kinds"], "examples": r["examples"], "seconds": r["seconds"]}
                        for r in reports]}
    out.write_text(json.dumps(merged, indent=1) + "\n")
    print(f"combined {len(parts)} parts: tried {merged['tried']:,}, crashed {merged['crashed']}, "
          f"hangs {merged['hang']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--examples", type=int, default=10_000, help="total over the kinds")
    parser.add_argument("--kinds", default=",".join(SHARES),
                        help=f"comma-separated, from {', '.join(SHARES)}")
    parser.add_argument("--seed", type=int, default=0, help="hypothesis seed")
    parser.add_argument("--out", default="benchmarks/fuzz_scenarios.json")
    parser.add_argument("--combine", nargs="+", metavar="PART",
                        help="sum recorded runs of disjoint kinds into --out (nothing is run)")
    args = parser.parse_args()
    if args.combine:
        combine([Path(p) for p in args.combine], Path(args.out))
        return
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    unknown = sorted(set(kinds) - set(SHARES))
    if unknown or not kinds:
        parser.error(f"--kinds: unknown {unknown}; choose from {', '.join(SHARES)}")
    weight = sum(SHARES[k] for k in kinds)
    planned = {k: max(1, round(args.examples * SHARES[k] / weight)) for k in kinds}
    _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = MEMORY_LIMIT_BYTES if hard == resource.RLIM_INFINITY else min(hard, MEMORY_LIMIT_BYTES)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))

    out = Path(args.out).resolve()  # before the chdir below
    root = Path(tempfile.mkdtemp(prefix="wirelessfl-fuzz-"))
    files, session, inputs = root / "files", root / "session", root / "inputs"
    files.mkdir()
    inputs.mkdir()
    fz.write_scenario_beside(files)
    os.chdir(root)  # an unsafe tag that ran would leave its marker here
    counts = {k: collections.Counter() for k in kinds}
    crashes: dict[str, list[dict]] = {k: [] for k in kinds}
    seen: set[tuple] = set()
    seconds: dict[str, float] = {}

    def record(kind: str, shown, run) -> None:
        try:
            counts[kind][run()] += 1
        except fz.Hang:
            counts[kind]["hang"] += 1
        except Exception as exc:  # noqa: BLE001 - a crash is what we are counting
            counts[kind]["crashed"] += 1
            last = traceback.format_exception_only(exc)[-1].strip()[:300]
            key = (kind, type(exc).__name__, _where(exc), last[:80])
            if key not in seen and len(crashes[kind]) < CRASHES_KEPT:
                seen.add(key)
                crashes[kind].append({"input": repr(shown())[:600], "error": last,
                                      "where": _where(exc), "example": sum(counts[kind].values())})

    def validate(data: bytes, name: str, extra=()) -> str:
        path = files / name
        path.write_bytes(data)
        return fz.cli_outcome(["validate", str(path), *extra], VALIDATE_TIMEOUT_S, names=str(path))

    def fuzz(kind: str, strategy, run) -> None:
        config = settings(max_examples=planned[kind], database=None, deadline=None,
                          phases=[Phase.generate], suppress_health_check=list(HealthCheck))

        @seed(args.seed)
        @config
        @given(strategy)
        def body(item):
            record(kind, lambda: item, lambda: run(item))

        start = time.perf_counter()
        body()
        seconds[kind] = round(time.perf_counter() - start, 1)

    def run_folder(data) -> None:
        work = Path(tempfile.mkdtemp(dir=inputs))
        log: list[str] = []
        try:
            record("run_folders", lambda: log,
                   lambda: fz.damaged_run_outcome(data, bases, work, session, log))
        finally:
            shutil.rmtree(work, ignore_errors=True)

    runners = {
        "documents": (fz.documents(), lambda doc: fz.classify(doc)[0]),
        "yaml_files": (fz.yaml_bytes(), lambda data: validate(data, "fuzz.yaml")),
        "sweep_files": (fz.sweep_bytes(bombs=True), lambda data: validate(data, "sweep.yaml")),
        "tune_files": (fz.tune_bytes(), lambda data: validate(data, "tune.yaml")),
        "set_values": (fz.set_assignments(),
                       lambda sets: fz.cli_outcome(["validate", str(files / "small.yaml"),
                                                 *(f"--set={s}" for s in sets)],
                                                VALIDATE_TIMEOUT_S)),
    }
    bases = fz.make_run_folders(session) if "run_folders" in kinds else {}
    started = time.perf_counter()
    for kind in kinds:
        if kind == "run_folders":
            start = time.perf_counter()
            config = settings(max_examples=planned[kind], database=None, deadline=None,
                              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
            seed(args.seed)(config(given(st.data())(run_folder)))()
            seconds[kind] = round(time.perf_counter() - start, 1)
        else:
            fuzz(kind, *runners[kind])
    unsafe = [str(p) for p in (root / fz.UNSAFE_MARKER, files / fz.UNSAFE_MARKER) if p.exists()]
    outcomes = ("valid", "rejected", "crashed", "hang")
    total = {o: sum(c[o] for c in counts.values()) for o in outcomes}
    report = {"date": datetime.now(UTC).isoformat(timespec="seconds"),
              "examples": args.examples, "kinds": kinds,
              "tried": sum(total.values()), **total, "unsafe_tags_executed": len(unsafe),
              "seed": args.seed, "killed_base": "killed" in bases,
              "by_family": {k: {o: c[o] for o in outcomes} for k, c in counts.items()},
              "seconds_by_family": seconds,
              "crash_samples": {k: v for k, v in crashes.items() if v},
              "seconds": round(time.perf_counter() - started, 1)}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"tried {report['tried']:,}: valid {total['valid']:,}, rejected cleanly "
          f"{total['rejected']:,}, crashed {total['crashed']:,}, hangs {total['hang']:,}, "
          f"unsafe tags executed {len(unsafe)} ({report['seconds']} s)")
    for kind, c in counts.items():
        print(f"  {kind}: {dict(c)} ({seconds.get(kind)} s)")
    for kind, samples in crashes.items():
        for sample in samples:
            print(f"CRASH {kind} #{sample['example']}: {sample['error']} [{sample['where']}]\n"
                  f"      input {sample['input'][:300]}")
    shutil.rmtree(root, ignore_errors=True)
    sys.exit(1 if total["crashed"] or total["hang"] or unsafe else 0)


if __name__ == "__main__":
    main()
