"""Every shipped scenario's short version gives the same tables before and after a change.

Issue 21 moves code (problems into plugins, the learning package split, the registry) and promises
to keep behaviour: "results are identical before and after (compare rounds.parquet of every
shipped scenario's short version)". This script runs, for every scenario in ``scenarios/`` (not
the sweep and tune files, which name a base ``scenario:``), a SHORT version of it, defined here as
``--set`` overrides applied by the loader's own override machinery: a few evaluated rounds per
algorithm, the training and test sets capped, and, for the scenarios that read a user's data
folder (MNIST, FashionMNIST IDX files), small IDX files generated here with ``data.root`` pointed
at them. Each run writes its results folder into a temporary folder; what is kept is a canonical
digest of ``rounds.parquet`` and ``devices.parquet`` (column names, dtypes and values, per column,
independent of the Parquet writer's metadata) and a few readable values (the last evaluated
test_accuracy or suboptimality per algorithm).

    # record with the code before the change (a worktree of that commit on PYTHONPATH)
    PYTHONPATH=/path/to/old OMP_NUM_THREADS=1 python benchmarks/shipped_identity.py --record
    # compare the current code against the record: a table, exit status 1 on any difference
    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/shipped_identity.py --check

The code measured is whichever ``wirelessfl`` Python imports (PYTHONPATH first), so the scenario
files are always this checkout's. Only entry points that exist since before issue 21 are used:
``scenario.loader.load_scenario`` and ``engine.runner.run_scenario`` in process (default), or the
command line, ``python -m wirelessfl run FILE --set ... --out DIR --quiet --no-report --threads
N`` in a subprocess (``--via cli``). Every run uses one host thread unless ``--threads`` says
otherwise: the project promises results independent of it (docs/reliability.md), which
tests/test_shipped_identity.py checks with 1 and 2. About 1-2 minutes on one core.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "scenarios"
RECORD = ROOT / "benchmarks" / "shipped_identity.json"
TABLES = ("rounds", "devices")

# The short version of every algorithm: (rounds, eval_every). [D] Two evaluated rounds after the
# start for the methods with costly rounds; the zeroth-order methods, whose rounds are cheap and
# move the model little, run 40 rounds evaluated every 20.
SHORT_ROUNDS = (2, 1)
CHEAP_ROUNDS = {"dzofl": (40, 20)}
# [D] Data capped for every scenario that reads a dataset: a few dozen samples per device.
MAX_TRAIN, MAX_TEST = 600, 200
# Scenario-specific overrides on top of the generic ones (keys of the scenario file's stem).
EXTRA: dict[str, list[str]] = {
    # 100 long-tailed clients need more samples than the cap leaves; 10 clients keep its shape
    # (one client per class) at 1/10 of the work.
    "seed001-loss-tuning-mnist": ["population.num_devices=10"],
    # 20 devices of at least 40 samples (partition.min_samples), hence all 1,000 generated
    # samples, and FGDRO-CVaR's k at its default 0.2 N (fgdro.md 2.5)
    "seed003-fashionmnist": ["population.num_devices=20", "data.max_train_samples=1000",
                             "algorithms.1.k=4"],
    # the seed-002 CNN's DZOFL rounds are not cheap: 4 rounds evaluated every 2
    "seed002-digits28": ["algorithms.0.rounds=4", "algorithms.0.eval_every=2"],
    "seed002-fashionmnist": ["algorithms.0.rounds=4", "algorithms.0.eval_every=2"],
    # 1,000 samples of 10 features: the problem's own size is the run's cost
    "seed001-mco": ["problem.samples=200"],
}
# The datasets read from a user's folder of IDX files; generated here, 28 x 28 like the real ones.
IDX_DATASETS = ("mnist", "fashionmnist")
IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
             "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
IDX_TRAIN, IDX_TEST, IDX_SIDE = 1000, 200, 28


# --- which files, and their short versions --------------------------------------------------

def scenario_files(folder: Path = SCENARIOS) -> dict[str, Path]:
    """Stem -> file of every scenario in ``folder``. Sweep and tune files name the base scenario
    they vary (a string ``scenario:`` key, scenario/loader.py ``is_sweep_document`` and
    ``is_tune_document``); a scenario never does."""
    found = {}
    for path in sorted(folder.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        if isinstance(doc, dict) and not isinstance(doc.get("scenario"), str):
            found[path.stem] = path
    return found


def short_overrides(name: str, path: Path, data_root: Path) -> list[str]:
    """The ``--set`` strings that make scenario ``name`` short (see the module docstring)."""
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    sets = []
    for i, algorithm in enumerate(doc.get("algorithms") or []):
        rounds, every = CHEAP_ROUNDS.get(algorithm.get("name"), SHORT_ROUNDS)
        sets += [f"algorithms.{i}.rounds={rounds}", f"algorithms.{i}.eval_every={every}"]
    data = doc.get("data")
    if isinstance(data, dict):
        sets += [f"data.max_train_samples={MAX_TRAIN}", f"data.max_test_samples={MAX_TEST}"]
        if data.get("name") in IDX_DATASETS:
            sets.append(f"data.root={data_root / data['name']}")
    return sets + EXTRA.get(name, [])


def write_idx_folder(folder: Path, seed: int) -> Path:
    """Four gzipped IDX files (the MNIST format: magic 2051 images / 2049 labels, big-endian
    dimensions, uint8 data) of a learnable 10-class task: each class a fixed random template,
    each image its template plus noise. The same ``seed`` writes the same bytes."""
    rng = np.random.default_rng(seed)
    templates = rng.integers(0, 64, size=(10, IDX_SIDE, IDX_SIDE))
    folder.mkdir(parents=True, exist_ok=True)
    arrays = []
    for n in (IDX_TRAIN, IDX_TEST):
        labels = np.arange(n) % 10
        rng.shuffle(labels)
        images = templates[labels] + rng.integers(0, 192, size=(n, IDX_SIDE, IDX_SIDE))
        arrays += [images, labels]
    for name, array in zip(IDX_FILES, arrays):
        magic = 2051 if array.ndim == 3 else 2049
        header = np.array([magic, *array.shape], dtype=">i4").tobytes()
        (folder / f"{name}.gz").write_bytes(gzip.compress(header + array.astype(np.uint8).tobytes(),
                                                         mtime=0))
    return folder


def write_data(root: Path) -> Path:
    """Every generated data folder under ``root`` (one per IDX dataset, distinct contents)."""
    for seed, name in enumerate(IDX_DATASETS):
        write_idx_folder(root / name, seed)
    return root


# --- canonical digests ----------------------------------------------------------------------

def _element_bytes(value) -> bytes:
    """One cell of an object column (text, a per-device array, a number, a missing value) as
    bytes that name its kind, so that 1, 1.0, '1' and [1] differ."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return b"N"
    if isinstance(value, str):
        raw = value.encode("utf-8")
        return b"S" + len(raw).to_bytes(8, "little") + raw
    if isinstance(value, (list, tuple, np.ndarray)):
        array = np.asarray(value)
        if array.dtype == object:
            return b"L" + len(array).to_bytes(8, "little") + b"".join(map(_element_bytes, array))
        return b"A" + str(array.dtype).encode() + str(array.shape).encode() + _array_bytes(array)
    if isinstance(value, (bool, np.bool_)):
        return b"B" + bytes([bool(value)])
    if isinstance(value, (int, np.integer)):
        return b"I" + int(value).to_bytes(16, "little", signed=True)
    if isinstance(value, (float, np.floating)):
        return b"F" + np.float64(value).tobytes()
    raise TypeError(f"no canonical bytes for a {type(value).__name__} cell")


def _array_bytes(array: np.ndarray) -> bytes:
    """A numeric array's bytes, every NaN written as the one canonical NaN (a NaN's payload
    bits are no result)."""
    array = np.ascontiguousarray(array)
    if array.dtype.kind == "f":
        array = np.where(np.isnan(array), np.nan, array).astype(array.dtype)
    return array.tobytes()


def column_digest(series: pd.Series) -> str:
    """sha256 of a column's name, dtype, length and values (see ``_element_bytes``)."""
    h = hashlib.sha256()
    h.update(f"{series.name}\0{series.dtype}\0{len(series)}\0".encode())
    if series.dtype.kind in "fiub":
        h.update(_array_bytes(series.to_numpy()))
    else:
        for value in series.astype(object).to_numpy():
            h.update(_element_bytes(value))
    return h.hexdigest()


def table_digest(frame: pd.DataFrame) -> dict:
    """The digest of a table (its columns' digests in order), the per-column digests (to say
    which column differs) and its shape. The index is not part of it: the writers keep a
    RangeIndex, and a Parquet file's pandas metadata is the writer's, not a result."""
    columns = {str(c): column_digest(frame[c]) for c in frame.columns}
    whole = hashlib.sha256("\n".join(f"{c}:{d}" for c, d in columns.items()).encode())
    return {"digest": whole.hexdigest(), "rows": len(frame), "columns": columns}


def final_values(rounds: pd.DataFrame) -> dict:
    """Per algorithm, its last round and the last evaluated test_accuracy and suboptimality
    (those it has; readable, 6 significant digits)."""
    out = {}
    for label, rows in rounds.groupby("algorithm", sort=False):
        values = {"round": int(rows["round"].iloc[-1])}
        for column in ("test_accuracy", "suboptimality"):
            known = rows[column].dropna() if column in rows else ()
            if len(known):
                values[column] = float(f"{known.iloc[-1]:.6g}")
        out[str(label)] = values
    return out


def digest_run(folder: Path) -> dict:
    """Digests of a results folder's two tables, the run's status (``complete``, or
    ``partial`` when an algorithm failed or diverged) and the readable final values."""
    frames = {t: pd.read_parquet(folder / f"{t}.parquet") for t in TABLES}
    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    return {**{t: table_digest(frames[t]) for t in TABLES}, "status": manifest.get("status"),
            "final": final_values(frames["rounds"])}


# --- running --------------------------------------------------------------------------------

def run_in_process(path: Path, overrides: list[str], out: Path, threads: int) -> None:
    """``load_scenario`` + ``run_scenario`` (both exist since before issue 21)."""
    from wirelessfl.pipeline.runner import run_scenario
    from wirelessfl.scenario.loader import load_scenario

    run_scenario(load_scenario(str(path), list(overrides)), out, threads=threads,
                 warn=lambda text: None)


def run_cli(path: Path, overrides: list[str], out: Path, threads: int) -> None:
    """``python -m wirelessfl run`` in a subprocess, with this process's environment
    (PYTHONPATH included), so the same code runs."""
    command = [sys.executable, "-m", "wirelessfl", "run", str(path), "--out", str(out),
               "--quiet", "--no-report", "--threads", str(threads)]
    for assignment in overrides:
        command += ["--set", assignment]
    done = subprocess.run(command, check=False, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode}: "
                           f"{done.stderr.strip()[-2000:]}")


RUNNERS: dict[str, Callable[[Path, list[str], Path, int], None]] = {
    "api": run_in_process, "cli": run_cli}


def run_short(name: str, path: Path, work: Path, via: str = "api", threads: int = 1) -> dict:
    """Run scenario ``name``'s short version into a fresh folder under ``work`` (which holds the
    generated data, ``write_data``) and return its record entry."""
    overrides = short_overrides(name, path, work / "data")
    out = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=work))
    start = time.perf_counter()
    RUNNERS[via](path, overrides, out, threads)
    # the record names the generated data folder $DATA: the temporary path is no result
    portable = [o.replace(str(work / "data"), "$DATA") for o in overrides]
    return {"file_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
            "overrides": portable, **digest_run(out),
            "seconds": round(time.perf_counter() - start, 2)}


def code_facts() -> dict:
    """Which code ran: the imported package's folder, its git commit and whether its tree had
    uncommitted changes, and the numeric libraries' versions."""
    import wirelessfl

    folder = Path(wirelessfl.__file__).resolve().parents[1]

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(folder), *args], check=False,
                              capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    return {"code_path": str(folder), "commit": git("rev-parse", "HEAD") or None,
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no", "wirelessfl")),
            "versions": {"python": platform.python_version(),
                         **{p: version(p) for p in ("torch", "numpy", "pandas", "pyarrow")}}}


def run_all(names: list[str] | None = None, via: str = "api", threads: int = 1,
            log: Callable[[str], None] = lambda text: None) -> dict[str, dict]:
    """Record entries of the named scenarios (default: every shipped one), run one at a time."""
    files = scenario_files()
    chosen = names if names is not None else list(files)
    unknown = sorted(set(chosen) - set(files))
    if unknown:
        raise SystemExit(f"not a shipped scenario: {', '.join(unknown)} (known: "
                         f"{', '.join(files)})")
    with tempfile.TemporaryDirectory(prefix="shipped-identity-") as tmp:
        work = Path(tmp)
        write_data(work / "data")
        entries = {}
        for name in chosen:
            entries[name] = run_short(name, files[name], work, via, threads)
            log(f"{name}: {entries[name]['seconds']:.1f} s")
    return entries


# --- comparing ------------------------------------------------------------------------------

def compare_table(old: dict | None, new: dict | None) -> tuple[bool, str]:
    """(equal?, why not): a table's digests, with the columns that differ, appeared or went."""
    if old is None or new is None:
        return False, "missing"
    if old["digest"] == new["digest"]:
        return True, ""
    notes = []
    if old["rows"] != new["rows"]:
        notes.append(f"{old['rows']} -> {new['rows']} rows")
    gone = [c for c in old["columns"] if c not in new["columns"]]
    added = [c for c in new["columns"] if c not in old["columns"]]
    changed = [c for c in old["columns"]
               if c in new["columns"] and old["columns"][c] != new["columns"][c]]
    for what, cols in (("changed", changed), ("gone", gone), ("new", added)):
        if cols:
            notes.append(f"{what}: {', '.join(cols[:6])}{' ...' if len(cols) > 6 else ''}")
    if not notes:
        notes.append("column order")
    return False, "; ".join(notes)


def compare(recorded: dict[str, dict], current: dict[str, dict]) -> list[dict]:
    """One row per scenario of either side: both tables equal?, and notes (a changed scenario
    file or short version is named, since then a difference need not be the code's)."""
    rows = []
    for name in sorted(set(recorded) | set(current)):
        old, new = recorded.get(name), current.get(name)
        if new is None:
            rows.append({"scenario": name, "rounds": False, "devices": False,
                         "note": "recorded but not run (gone from scenarios/?)"})
            continue
        if old is None:
            rows.append({"scenario": name, "rounds": None, "devices": None,
                         "note": "new: not in the record (record it with the old code)"})
            continue
        row = {"scenario": name}
        notes = []
        for table in TABLES:
            row[table], why = compare_table(old.get(table), new.get(table))
            if why:
                notes.append(f"{table}: {why}")
        if old.get("file_sha256") != new.get("file_sha256"):
            notes.append("scenario file changed since recorded")
        if old.get("overrides") != new.get("overrides"):
            notes.append("short version changed since recorded")
        row["note"] = "; ".join(notes)
        rows.append(row)
    return rows


def failed(rows: list[dict]) -> bool:
    """A difference in a recorded scenario's table (a new, unrecorded scenario is no failure)."""
    return any(row[t] is False for row in rows for t in TABLES)


def format_rows(rows: list[dict]) -> str:
    mark = {True: "equal", False: "DIFFERS", None: "-"}
    width = max([len("scenario")] + [len(r["scenario"]) for r in rows])
    lines = [f"{'scenario':<{width}}  {'rounds':<8} {'devices':<8} note"]
    for r in rows:
        lines.append(f"{r['scenario']:<{width}}  {mark[r['rounds']]:<8} "
                     f"{mark[r['devices']]:<8} {r['note']}".rstrip())
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--record", action="store_true", help=f"write {RECORD.name}")
    action.add_argument("--check", action="store_true",
                        help="compare the current code with the record; exit 1 on a difference")
    parser.add_argument("--file", type=Path, default=RECORD, help="the record (default: %(default)s)")
    parser.add_argument("--only", nargs="+", metavar="SCENARIO", help="these scenarios only")
    parser.add_argument("--via", choices=sorted(RUNNERS), default="api",
                        help="in process (api, default) or 'python -m wirelessfl run' (cli)")
    parser.add_argument("--threads", type=int, default=1, help="host threads per run (default 1)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    facts = code_facts()
    print(f"code: {facts['code_path']} at {facts['commit']}"
          f"{' (uncommitted changes)' if facts['dirty'] else ''}", file=sys.stderr)
    entries = run_all(args.only, args.via, args.threads,
                      log=lambda text: print(text, file=sys.stderr))
    elapsed = time.perf_counter() - start
    if args.record:
        if args.only and args.file.is_file():  # a partial record updates the scenarios it ran
            kept = json.loads(args.file.read_text(encoding="utf-8"))["scenarios"]
            entries = {**kept, **entries}
        record = {"what": "digests of rounds.parquet and devices.parquet of every shipped "
                          "scenario's short version (benchmarks/shipped_identity.py)",
                  "recorded": datetime.now(UTC).isoformat(timespec="seconds"),
                  **facts, "via": args.via, "threads": args.threads,
                  "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
                  "seconds": round(elapsed, 1), "scenarios": entries}
        args.file.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {args.file} ({len(entries)} scenarios, {elapsed:.0f} s)")
        return 0
    record = json.loads(args.file.read_text(encoding="utf-8"))
    recorded = record["scenarios"]
    if args.only:
        recorded = {k: v for k, v in recorded.items() if k in args.only}
    rows = compare(recorded, entries)
    print(f"record: {args.file.name}, code at {record.get('commit')}; now: {facts['commit']}"
          f"{' (uncommitted changes)' if facts['dirty'] else ''}; {elapsed:.0f} s")
    print(format_rows(rows))
    bad = failed(rows)
    print("DIFFERENT: see the notes" if bad else "identical: every recorded scenario")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
