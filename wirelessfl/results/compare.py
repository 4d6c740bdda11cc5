"""Comparison across runs: group run folders into configurations (same resolved scenario and
algorithm, any seed) and give, per configuration, the mean and the t-based 95 % confidence
interval over seeds of the energy and simulated time to the target accuracy and of the final
accuracy. Seeds that never reached the target are counted, not averaged in."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from wirelessfl.errors import UserError
from wirelessfl.results.records import RunRecord, read_run
from wirelessfl.results.summary import summarize, text_table

CONFIDENCE = 0.95
SWEEP_MANIFEST = "sweep.json"
FINISHED = ("complete", "partial")
# Keys that differ between runs of one configuration, or that do not change the simulation
# (the health limits only judge it).
IGNORED_KEYS = ("name", "description", "seed", "health")


def mean_ci(values, confidence: float = CONFIDENCE) -> tuple[float, float, int]:
    """(mean, half-width of the two-sided t interval, n) of the finite values: half-width =
    t_{(1+c)/2, n-1} s / sqrt(n) with s the sample standard deviation; NaN half-width for n < 2."""
    x = np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=float)
    n = len(x)
    if n == 0:
        return math.nan, math.nan, 0
    if n == 1:
        return float(x[0]), math.nan, 1
    if np.ptp(x) == 0:  # identical values: no spread (np.std would give rounding noise)
        return float(x[0]), 0.0, n
    half = stats.t.ppf(0.5 + confidence / 2, n - 1) * x.std(ddof=1) / math.sqrt(n)
    return float(x.mean()), float(half), n


def flatten(doc, prefix: str = "") -> dict:
    """Nested scenario data as {dotted.key: value}; lists of named entries by their label/name,
    other lists as JSON text (hashable, comparable)."""
    out = {}
    if isinstance(doc, dict):
        for key, value in doc.items():
            out.update(flatten(value, f"{prefix}{key}."))
    elif isinstance(doc, list) and doc and all(isinstance(d, dict) for d in doc):
        for i, entry in enumerate(doc):
            out.update(flatten(entry, f"{prefix}{entry.get('label') or entry.get('name') or i}."))
    else:
        out[prefix.rstrip(".")] = json.dumps(doc) if isinstance(doc, list) else doc
    return out


def table_value(value):
    """A swept value as a table cell: numbers, text and booleans as they are, lists and mappings
    as JSON text (hashable, so a table can be grouped by it; runs.csv writes the same)."""
    return value if isinstance(value, int | float | str | bool) else json.dumps(value)


def finished_sweep_runs(folder: Path) -> tuple[dict, list[dict]]:
    """A sweep folder's sweep.json and the entries of its finished runs (each names its run
    folder, relative to the sweep folder, under 'folder'); a damaged manifest (not JSON, not a
    mapping, a finished entry without a folder) is one UserError."""
    where = Path(folder) / SWEEP_MANIFEST
    try:
        manifest = json.loads(where.read_text())
        runs = [r for r in manifest["runs"] if r.get("status") in FINISHED]
        for r in runs:
            Path(folder) / r["folder"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError,
            RecursionError) as err:  # unreadable, not JSON, or not a sweep manifest
        raise UserError(f"{where}: cannot read the sweep manifest ({type(err).__name__}: "
                        f"{err}); re-run the sweep to rewrite it") from None
    return manifest, runs


def run_folders(dirs: list[str | Path]) -> list[Path]:
    """The finished run folders of each DIR: a sweep folder's runs (from its sweep.json), or the
    DIR itself when it is a run folder."""
    folders, given = [], {}
    for d in map(Path, dirs):
        if (d / SWEEP_MANIFEST).is_file():
            found = [d / r["folder"] for r in finished_sweep_runs(d)[1]]
        elif (d / "manifest.json").is_file():
            found = [d]
        else:
            raise UserError(f"{d}: neither a sweep folder (sweep.json) nor a run folder "
                            "(manifest.json); pass what 'wirelessfl sweep' or 'wirelessfl run' "
                            "wrote")
        for folder in found:  # one run counted twice would be two "seeds" that always agree
            first = given.setdefault(folder.resolve(), d)
            if first is not d:
                how = ("given twice" if first.resolve() == d.resolve()
                       else f"in the comparison twice (through {first} and {d})")
                raise UserError(f"{folder}: this run folder is {how}; give each folder once")
        folders += found
    if not folders:
        raise UserError(f"{', '.join(map(str, dirs))}: no finished runs to compare yet")
    return folders


@dataclass
class Comparison:
    """Per-run, per-algorithm outcomes (``runs``), the configuration table (``table``), the
    keys that differ between configurations (``keys``), the records themselves, and what was
    left out (``warnings``: repeated runs of one configuration and seed)."""

    runs: pd.DataFrame
    table: pd.DataFrame
    keys: list[str]
    records: list[RunRecord]
    warnings: list[str] = field(default_factory=list)


def _config_keys(flat: list[dict]) -> list[str]:
    """Keys whose value differs between runs of the same algorithm (the swept keys)."""
    keys: dict[str, None] = {}
    by_algorithm: dict[str, list[dict]] = {}
    for f in flat:
        by_algorithm.setdefault(f["__algorithm"], []).append(f)
    for group in by_algorithm.values():
        names = dict.fromkeys(k for f in group for k in f if not k.startswith("__"))
        for k in names:
            if len({json.dumps(f.get(k), sort_keys=True, default=str) for f in group}) > 1:
                keys[k] = None
    return list(keys)


def compare_records(records: list[RunRecord]) -> Comparison:
    """Group runs into configurations and summarise each over its seeds."""
    rows, flat = [], []
    for index, rec in enumerate(records):
        scenario = rec.manifest.get("scenario", {})
        base = flatten({k: v for k, v in scenario.items()
                        if k not in (*IGNORED_KEYS, "algorithms")})
        n = scenario.get("population", {}).get("num_devices", 1)
        summary = summarize(rec.rounds, rec.target_accuracy, n,
                            manifest=rec.manifest).set_index("algorithm")
        params = {(p.get("label") or p.get("name")): p for p in scenario.get("algorithms", [])}
        for label, s in summary.iterrows():
            f = {**base, **flatten(params.get(label, {}), "algorithm."), "__algorithm": label}
            flat.append(f)
            rows.append({"algorithm": label, "seed": rec.manifest.get("seed"),
                         "target_accuracy": rec.target_accuracy, "run": str(rec.path),
                         "record": index,
                         "reached": not math.isnan(s.energy_to_target_j),
                         "energy_to_target_j": s.energy_to_target_j,
                         "time_to_target_s": s.time_to_target_s,
                         "final_accuracy": s.final_accuracy, "energy_j": s.energy_j,
                         "sim_time_s": s.sim_time_s, "healthy": bool(s.healthy),
                         "health": s.health})
    if not rows:
        raise UserError(f"{', '.join(str(r.path) for r in records)}: no algorithm has recorded a "
                        "round yet; compare the runs once they have (or finish them with "
                        "'wirelessfl run --resume RUN_DIR')")
    keys = _config_keys(flat)
    runs = pd.DataFrame(rows)
    for k in keys:
        runs[k] = [f.get(k) for f in flat]
    config = ["algorithm", *keys]
    runs["config"] = [json.dumps([r[c] for c in config], default=str) for _, r in runs.iterrows()]
    runs, warnings = _one_per_seed(runs)
    out = []
    for _, group in runs.groupby("config", sort=False):
        first = group.iloc[0]
        row = {c: first[c] for c in config}
        row.update(seeds=len(group), reached=int(group.reached.sum()),
                   unhealthy=int((~group.healthy).sum()), target_accuracy=first.target_accuracy)
        for column in ("energy_to_target_j", "time_to_target_s", "final_accuracy", "energy_j"):
            mean, half, _ = mean_ci(group[column])
            row[column], row[f"{column}_ci95"] = mean, half
        out.append(row)
    table = pd.DataFrame(out)
    if keys:
        table = table.sort_values(keys + ["algorithm"], kind="stable", ignore_index=True)
    return Comparison(runs, table, keys, records, warnings)


def _one_per_seed(runs: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """Keep the first run of each configuration and seed. Two runs of the same scenario (apart
    from its name and description) and seed compute the same numbers (docs/reliability.md,
    "Determinism"): counted as two seeds they would narrow the interval with no new information
    (two identical runs give a zero-width one). A warning names each run left out."""
    repeated = runs.duplicated(["config", "seed"], keep="first")
    warnings = []
    for _, row in runs[repeated].iterrows():
        first = runs[(runs.config == row.config) & (runs.seed == row.seed)].iloc[0]
        warnings.append(f"{row.run}: {row.algorithm} with seed {row.seed} repeats {first.run} "
                        "(the same scenario and seed); counted once")
    return runs[~repeated].reset_index(drop=True), warnings


def compare_dirs(dirs: list[str | Path]) -> Comparison:
    return compare_records([read_run(f) for f in run_folders(dirs)])


def _pm(mean: float, half: float, digits: str = ".4g") -> str:
    if math.isnan(mean):
        return "-"
    return f"{mean:{digits}}" + ("" if math.isnan(half) else f" ± {half:{digits}}")


def comparison_cells(comp: Comparison) -> list[list[str]]:
    """The table as text cells, header first (terminal and HTML share it)."""
    head = ["algorithm", *(k.split(".")[-1] for k in comp.keys), "seeds", "reached target",
            "unhealthy",
            "energy to target [J]", "time to target [s]", "final accuracy",
            "energy, whole run [J]"]
    cells = [head]
    for _, r in comp.table.iterrows():
        cells.append([str(r.algorithm), *(f"{r[k]:g}" if isinstance(r[k], int | float)
                                          and not isinstance(r[k], bool) else str(r[k])
                                          for k in comp.keys),
                      str(r.seeds), f"{r.reached}/{r.seeds}", f"{r.unhealthy}/{r.seeds}",
                      _pm(r.energy_to_target_j, r.energy_to_target_j_ci95),
                      _pm(r.time_to_target_s, r.time_to_target_s_ci95),
                      _pm(r.final_accuracy, r.final_accuracy_ci95, ".4f"),
                      _pm(r.energy_j, r.energy_j_ci95)])
    return cells


def format_comparison(comp: Comparison) -> str:
    """A plain-text table: mean ± 95 % CI half-width over seeds."""
    targets = sorted({t for t in comp.table.target_accuracy
                      if t is not None and not math.isnan(t)})
    return (f"mean ± 95 % confidence interval (t, over seeds); to-target columns over the seeds "
            f"that reached the target ({', '.join(f'{t:g}' for t in targets) or 'none set'})\n"
            + text_table(comparison_cells(comp)))
