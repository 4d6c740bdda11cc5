"""Render the measured numbers of docs/results.md and benchmarks/README.md from recorded files.

    python benchmarks/render_docs.py           # rewrite every generated block in place
    python benchmarks/render_docs.py --check   # list the blocks whose text differs; exit 1 if any

A generated block is the text between

    <!-- generated: NAME (from FILE, ...) -->
    ...
    <!-- end generated -->

and is produced by the function registered below under NAME, from the files it names (the
benchmark scripts' JSON files in benchmarks/, and the runs ``benchmarks/record_scenarios.py``
keeps in docs/data/). Everything between the markers is overwritten; edit the renderer, not the
text. ``tests/test_results_doc.py`` fails when a block differs from its files.
"""

from __future__ import annotations

import argparse
import csv
import functools
import itertools
import json
import math
import re
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
DATA = ROOT / "docs" / "data"
DOCS = (ROOT / "docs" / "results.md", BENCH / "README.md", ROOT / "docs" / "reliability.md")

START = re.compile(r"^<!-- generated: (?P<name>[\w.-]+) \(from [^\n]*\) -->$", re.MULTILINE)
END = "<!-- end generated -->"
UNTUNED = ("Untuned: each method runs at one hand-picked setting (the scenario's or the "
           "script's), so no method is shown to be better than another at its own best setting.")

BLOCKS: dict[str, tuple[tuple[str, ...], Callable[[], str]]] = {}


def block(name: str, *sources: str):
    """Register the renderer of block NAME, built from SOURCES (paths from the repository root)."""
    def register(fn: Callable[[], str]) -> Callable[[], str]:
        BLOCKS[name] = (sources, fn)
        return fn
    return register


# ---------------------------------------------------------------- readers and formats


@functools.cache
def _json(path: str):
    return json.loads((ROOT / path).read_text())


def facts(key: str) -> dict:
    return _json(f"docs/data/{key}/facts.json")


@functools.cache
def summary(key: str) -> list[dict]:
    with open(DATA / key / "summary.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def _num(value) -> float | None:
    if value is None or value == "":
        return None
    value = float(value)
    return None if math.isnan(value) else value


def g3(value) -> str:
    """Three significant figures, thousands separated; '-' for a missing value."""
    value = _num(value)
    if value is None:
        return "-"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def i0(value) -> str:
    value = _num(value)
    return "-" if value is None else f"{value:,.0f}"


def pct(value, digits: int = 1) -> str:
    value = _num(value)
    return "-" if value is None else f"{100 * value:.{digits}f} %"


def sci(value) -> str:
    value = _num(value)
    return "-" if value is None else f"{value:.2g}"


def ratio(a, b, digits: int = 1) -> str:
    return f"{_num(a) / _num(b):.{digits}f}x"


def factor(base, value, fewer: str = "fewer", more: str = "more", same: str = "as many",
           digits: int | None = None) -> str:
    """VALUE against BASE as a factor with its direction, both read from the data: 'N.Nx fewer'
    when VALUE is below BASE, 'N.Nx more' when above, SAME when the factor rounds to 1 (DIGITS
    decimals; by default 1 below a factor of 10 and 0 above)."""
    base, value = _num(base), _num(value)
    low, high = sorted((base, value))
    if digits is None:
        digits = 0 if low > 0 and high / low >= 10 else 1
    text = f"{high / low:.{digits}f}" if low > 0 else "inf"
    if text == "inf" and high == low:
        return same
    if text != "inf" and float(text) == 1.0:
        return same
    return f"{text}x {fewer if value < base else more}"


def than(base, value, noun: str, other: str, fewer: str = "fewer", more: str = "more",
         same: str = "as many") -> str:
    """'N.Nx fewer NOUN than OTHER', '... more ...', or 'as many NOUN as OTHER' (``factor``)."""
    text = factor(base, value, fewer, more, same)
    return f"{same} {noun} as {other}" if text == same else f"{text} {noun} than {other}"


def side(value, other, fmt: str = "{:.3f}", above: str = "above", below: str = "below",
         same: str = "level with") -> str:
    """Where VALUE lies against OTHER, compared as they are printed (FMT): ABOVE, BELOW or SAME."""
    a, b = fmt.format(_num(value)), fmt.format(_num(other))
    if a == b:
        return same
    return above if _num(value) > _num(other) else below


def listing(items: list[str]) -> str:
    """'a', 'a and b', 'a, b and c'."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def mean_std(values: list[float], fmt: str = "{:.3f}") -> str:
    text = fmt.format(statistics.mean(values))
    return text + (" +- " + fmt.format(statistics.stdev(values)) if len(values) > 1 else "")


def span(values: list[float], fmt: str = "{:.3g}") -> str:
    low, high = fmt.format(min(values)), fmt.format(max(values))
    sep = " to " if "e" in low + high or low.startswith("-") else "-"
    return low if low == high else f"{low}{sep}{high}"


def _bench_module(name: str):
    """A benchmark script as a module (its table functions and the spec's constants)."""
    import importlib

    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    return importlib.import_module(name)


# Columns of summary.csv as table columns: (header, column, format).
RUN_COLUMNS = {
    "rounds_to_target": ("rounds to target", i0),
    "time_to_target_s": ("time to target [s]", g3),
    "energy_to_target_j": ("energy to target [J]", g3),
    "gradient_evaluations_to_target": ("grads / device to target", i0),
    "compute_share": ("compute", pct),
    "radio_share": ("radio", pct),
    "idle_share": ("idle", pct),
    "final_accuracy": ("final acc.", lambda v: f"{float(v):.4f}"),
    "final_worst_device_accuracy": ("worst device", lambda v: f"{float(v):.4f}"),
    "final_suboptimality": ("final f - f*", sci),
    "rounds": ("rounds", i0),
    "sim_time_s": ("sim time [s]", g3),
    "energy_j": ("energy [J]", g3),
    "uplink_bits_per_device_round": ("uplink bits/dev/round", i0),
    "in_time_fraction": ("delivered", pct),
}


def run_table(key: str, columns: list[str], headers: dict[str, str] | None = None) -> str:
    """summary.csv of a recorded run as a table; an empty 'to target' cell reads 'not reached'."""
    headers = headers or {}
    head = ["algorithm"] + [headers.get(c, RUN_COLUMNS[c][0]) for c in columns]
    rows = []
    for row in summary(key):
        cells = [row["algorithm"]]
        for c in columns:
            value = row[c]
            missing = value == "" and (c.endswith("_to_target") or "to_target_" in c)
            cells.append("not reached" if missing else RUN_COLUMNS[c][1](value))
        rows.append(cells)
    return table(head, rows)


def by_label(key: str) -> dict[str, dict]:
    return {row["algorithm"]: row for row in summary(key)}


def recorded_line(key: str) -> str:
    f = facts(key)
    return (f"`{f['command']}`, seed {f['seed']}, recorded {f['recorded']} by "
            f"`benchmarks/record_scenarios.py` ({f['host_s']:.0f} s of host time, one thread, "
            f"{f['cpus']}-core machine; `docs/data/{key}/`).")


# ---------------------------------------------------------------- docs/results.md: overview


def _recorded_keys() -> list[str]:
    record = _bench_module("record_scenarios")
    return [k for k in record.RUNS if (DATA / k / "facts.json").exists()]


@block("recorded-runs", "docs/data/*/facts.json")
def recorded_runs() -> str:
    rows = []
    for key in _recorded_keys():
        f = facts(key)
        rows.append([f"`{key}`", f"`{f['command']}`", f["recorded"], f"{f['host_s']:.0f}",
                     f["status"]])
    return table(["folder (docs/data/)", "command", "recorded", "host time [s]", "status"], rows)


# ---------------------------------------------------------------- quickstart


@block("quickstart-table", "docs/data/quickstart/summary.csv")
def quickstart_table() -> str:
    f = facts("quickstart")
    return (f"Target accuracy {f['target_accuracy']:g}. " + recorded_line("quickstart") + "\n\n"
            + run_table("quickstart", [
                "rounds_to_target", "time_to_target_s", "energy_to_target_j", "compute_share",
                "radio_share", "final_accuracy", "rounds", "sim_time_s", "energy_j",
                "uplink_bits_per_device_round", "in_time_fraction"]))


@block("quickstart-reading", "docs/data/quickstart/summary.csv")
def quickstart_reading() -> str:
    rows = by_label("quickstart")
    dz, sgd, avg = rows["DZOFL"], rows["FedSGD"], rows["FedAvg"]
    rounds, energy = "rounds_to_target", "energy_to_target_j"
    return (f"At these untuned settings DZOFL needs {ratio(dz[rounds], sgd[rounds], 0)} "
            f"FedSGD's rounds to the target ({i0(dz[rounds])} against {i0(sgd[rounds])}), and "
            f"{ratio(dz[energy], sgd[energy])} its energy to target "
            f"({ratio(dz[energy], avg[energy])} FedAvg's); its energy is "
            f"{pct(dz['radio_share'], 0)} radio.")


QUICKSTART_TUNE = "docs/data/quickstart-tune"


@block("quickstart-tuned", f"{QUICKSTART_TUNE}/tune.json", f"{QUICKSTART_TUNE}/tuning.csv",
       f"{QUICKSTART_TUNE}/evaluation.csv", f"{QUICKSTART_TUNE}/facts.json")
def quickstart_tuned() -> str:
    """The tuned comparison: choices on the tuning seeds, the evaluation with 95 % CIs, the
    verdict and the warnings, as `wirelessfl tune quickstart-tune` printed them."""


    study = _json(f"{QUICKSTART_TUNE}/tune.json")
    f = _json(f"{QUICKSTART_TUNE}/facts.json")
    warnings = "".join(f"\n* {w}" for w in study["warnings"]) or "\n* none"
    return (_study_tables(QUICKSTART_TUNE, study, f)
            + f"\n\nVerdict: {study['verdict']}.\n\nWarnings:{warnings}")


def _study_tables(folder: str, study: dict, f: dict) -> str:
    """A recorded tuning study's command line, its choices on the tuning seeds and its
    evaluation, as `wirelessfl tune` printed them (tune.json, tuning.csv, evaluation.csv)."""
    import pandas as pd

    from wirelessfl.tune.objectives import OBJECTIVES
    from wirelessfl.tune.tables import choice_cells, evaluation_cells

    title = OBJECTIVES[study["objective"]].title
    tuning = pd.read_csv(ROOT / folder / "tuning.csv")
    evaluation = pd.read_csv(ROOT / folder / "evaluation.csv")
    chosen = choice_cells(tuning, study["choices"], title)
    evaluated = evaluation_cells(evaluation, title)
    return (f"`{f['command']}` (recorded {f['recorded']}, {g3(f['host_s'])} s of host time on "
            f"{f['cpus']} cores): objective `{study['objective']}`, tuning seeds "
            f"{study['tuning_seeds']}, evaluation seeds {study['evaluation_seeds']}.\n\n"
            "Chosen on the tuning seeds:\n\n" + table(chosen[0], chosen[1:])
            + "\n\nOn the evaluation seeds (mean ± 95 % CI half-width; to-target columns over "
              "the seeds that reached the target):\n\n" + table(evaluated[0], evaluated[1:]))


# ---------------------------------------------------------------- seed002-digits28


SEED002 = "docs/data/seed002-quick"
SEED002_FASHION = "docs/data/seed002-fashionmnist"


def _reproduction(folder: str, regime: str = "") -> str:
    """A recorded reproduction's study of ``regime`` ("" for a single-regime one) as
    `wirelessfl reproduce` printed it: what each method was tuned to, the evaluation, every
    claim's verdict, what the claims measured of the paper's quantities (T/T', the energy
    shares) and the health of every run."""
    import pandas as pd

    from wirelessfl.tune.reproduce import verdict_cells

    study_folder = f"{folder}/{regime}" if regime else folder
    repro = _json(f"{folder}/reproduce.json")
    study = _json(f"{study_folder}/tune.json")
    f = _json(f"{folder}/facts.json")
    runs = pd.read_csv(ROOT / folder / "runs.csv")
    if "regime" in runs:  # a single-regime reproduction's regime is "" (read back as NaN)
        runs = runs[runs.regime.astype(object).where(runs.regime.notna(), "") == regime]
    mine = [v for v in repro["verdicts"] if v.get("regime", "") == regime]
    verdicts = verdict_cells(mine)
    health = []
    for method, group in runs.groupby("method", sort=False):
        sick = group[~group.healthy.astype(bool)]
        why = "; ".join(f"seed {r.seed}: {r.health}" for r in sick.itertuples()) or "-"
        health.append([method, f"{int(group.healthy.sum())}/{len(group)}", why])
    warnings = "".join(f"\n* {w}" for w in study["warnings"]) or "\n* none"
    held = f.get("samples_per_device", {}).get(regime)
    samples = ""
    if held:
        count = (f"{held['fewest']:,}" if held["fewest"] == held["most"]
                 else f"{held['fewest']:,} to {held['most']:,}")
        samples = f"\n\nIn every evaluation run each device held {count} training samples."
    return (_study_tables(study_folder, study, f) + samples
            + "\n\nThe paper's claims, judged on the evaluation runs of the tuned settings, "
              "paired by seed (docs/tuning.md, \"Reproductions\"):\n\n"
            + table(verdicts[0], verdicts[1:]) + _measured_quantities(mine)
            + "\n\nHealth of the evaluation runs:\n\n"
            + table(["method", "healthy runs", "unhealthy: why"], health)
            + f"\n\nWarnings:{warnings}" + _regime_note(repro, regime))


def _regime_note(repro: dict, regime: str) -> str:
    """The reproduction file's note on ``regime`` (what its choices and warnings mean), as
    recorded in reproduce.json; "" when it has none."""
    for r in repro["reproduction"].get("regimes") or []:
        if r["name"] == regime and r.get("note"):
            return f"\n\nWhat the choices and warnings mean: {r['note']}"
    return ""


def _measured_quantities(verdicts: list[dict]) -> str:
    """The paper's quantities as the claims measured them: T/T' (the paired ratio of DZOFL's
    iterations to FedSGD's rounds) and the radio and compute shares of the energy."""
    by_id = {v["claim"]: v for v in verdicts}
    parts = []
    paired = by_id.get("iterations", {}).get("paired")
    if paired:
        interval = (f" (95 % CI {g3(paired['low'])} to {g3(paired['high'])})"
                    if math.isfinite(paired["low"]) else "")
        parts.append(f"T/T' (DZOFL's iterations over FedSGD's rounds to the target, paired by "
                     f"seed) = {g3(paired['estimate'])}{interval}")
    for claim, method, what in (("fl-radio", "FedSGD", "radio"),
                                ("dzofl-compute", "DZOFL", "compute")):
        m = by_id.get(claim, {}).get("measured", {}).get(method)
        if m and m["scored"]:
            parts.append(f"{method}'s {what} share of the devices' energy to the target "
                         f"{pct(m['mean'], 1)}")
    return ("\n\nMeasured: " + "; ".join(parts) + ".") if parts else ""


@block("seed002-reproduction", f"{SEED002}/reproduce.json", f"{SEED002}/tune.json",
       f"{SEED002}/tuning.csv", f"{SEED002}/evaluation.csv", f"{SEED002}/runs.csv",
       f"{SEED002}/facts.json")
def seed002_reproduction() -> str:
    """The quick seed-002 reproduction (`wirelessfl reproduce seed002-quick`)."""
    return _noted_reproduction(SEED002)


def _noted_reproduction(folder: str) -> str:
    """A single-study reproduction's note (what it can and cannot show), then the study."""
    note = _json(f"{folder}/reproduce.json")["reproduction"].get("note", "")
    return (f"{note}\n\n" if note else "") + _reproduction(folder)


def _regime_block(name: str, folder: str, regime: str):
    """The block ``name`` (``_reproduction``) of one regime of the reproduction in ``folder``."""
    files = [f"{folder}/{file}" for file in ("reproduce.json", "runs.csv", "facts.json")]
    files += [f"{folder}/{regime}/{file}" for file in ("tune.json", "tuning.csv",
                                                        "evaluation.csv")]

    @block(name, *files)
    def render() -> str:
        return _reproduction(folder, regime)
    return render


def _verdicts_block(name: str, folder: str):
    """The block ``name``: every claim's verdict in each regime of ``folder``'s reproduction."""

    @block(name, f"{folder}/reproduce.json", f"{folder}/facts.json")
    def render() -> str:
        return _regime_verdicts(folder)
    return render


SEED000 = "docs/data/seed000"
SEED001 = "docs/data/seed001"
SEED000_FIG2 = "docs/data/seed000-fig2"
SEED000_FMNIST = "docs/data/seed000-fmnist"
SEED000_FIG2_FMNIST = "docs/data/seed000-fig2-fmnist"
SEED003 = "docs/data/seed003"
SEED003_DIGITS = "docs/data/seed003-digits"
SEED003_FMNIST = "docs/data/seed003-fmnist"
SEED004 = "docs/data/seed004"


for _regime in ("shirt-sneaker", "ten-class"):
    _regime_block(f"seed002-fashionmnist-{_regime}", SEED002_FASHION, _regime)
for _regime in ("homogeneous", "moderate", "extreme"):
    _regime_block(f"seed000-{_regime}", SEED000, _regime)
for _regime in ("homogeneous", "moderate", "extreme", "remedy"):
    _regime_block(f"seed000-fig2-{_regime}", SEED000_FIG2, _regime)
_verdicts_block("seed000-fig2-verdicts", SEED000_FIG2)
for _regime in ("homogeneous", "moderate", "extreme", "remedy"):
    _regime_block(f"seed000-fig2-fmnist-{_regime}", SEED000_FIG2_FMNIST, _regime)
_verdicts_block("seed000-fig2-fmnist-verdicts", SEED000_FIG2_FMNIST)
for _regime in ("quadratic", "mco", "loss-k4", "loss-k8", "loss-k12", "loss-k4-q01", "loss-k8-q01",
                "loss-k12-q01", "loss-k4-q03", "loss-k8-q03", "loss-k12-q03", "loss-mlp"):
    _regime_block(f"seed001-study-{_regime}", SEED001, _regime)
_verdicts_block("seed001-verdicts", SEED001)
_verdicts_block("seed002-fashionmnist-verdicts", SEED002_FASHION)
_verdicts_block("seed000-verdicts", SEED000)
for _regime in ("homogeneous", "moderate", "extreme"):
    _regime_block(f"seed000-fmnist-{_regime}", SEED000_FMNIST, _regime)
_verdicts_block("seed000-fmnist-verdicts", SEED000_FMNIST)
_regime_block("seed003-toy-study", SEED003, "toy")
_regime_block("seed003-large-i-study", SEED003, "large-i")
_regime_block("seed003-digits-label-shift-study", SEED003_DIGITS, "label-shift")
_verdicts_block("seed003-digits-verdicts", SEED003_DIGITS)
_verdicts_block("seed003-verdicts", SEED003)
_regime_block("seed003-fmnist-dir03", SEED003_FMNIST, "dir03")
_verdicts_block("seed003-fmnist-verdicts", SEED003_FMNIST)
for _regime in ("strongly-convex", "strongly-convex-d1000", "general-convex",
                "general-convex-d1000", "non-convex", "non-convex-d1000", "logistic"):
    _regime_block(f"seed004-{_regime}", SEED004, _regime)
_verdicts_block("seed004-verdicts", SEED004)


def _regime_verdicts(folder: str) -> str:
    """Every claim's verdict in each regime side by side (seed002: where DZOFL's advantage
    holds and where it ends)."""
    from wirelessfl.tune.claims import (
        PER_ROUND_COST,
        UNHEALTHY,
        decided_by_round_cost,
        healthy_seeds_verdict,
        unhealthy_part,
    )

    repro = _json(f"{folder}/reproduce.json")
    f = _json(f"{folder}/facts.json")
    regimes = [r["name"] for r in repro["reproduction"]["regimes"]]
    verdict = {(v["regime"], v["claim"]): v for v in repro["verdicts"]}
    rows = []
    for claim in repro["reproduction"]["claims"]:
        cells = []
        for regime in regimes:
            v = verdict.get((regime, claim["id"]))
            if v is None:
                cells.append("(not judged here)")
                continue
            text = v["verdict"]
            sick = unhealthy_part(v)
            if sick is not None:  # what the healthy seeds say beside it
                healthy = healthy_seeds_verdict(v)
                text += (f" ({UNHEALTHY} {sick}"
                         + (f"; the others: {healthy}" if healthy else "") + ")")
            if decided_by_round_cost(v):
                text += f" ({PER_ROUND_COST})"
            paired = v.get("paired")
            if paired:
                text += (f"; paired {g3(paired['estimate'])}, {paired['seeds_past']} of "
                         f"{paired['seeds']} seeds")
            cells.append(text)
        rows.append([claim["id"], *cells])
    return (f"`{f['command']}` (recorded {f['recorded']}, {g3(f['host_s'])} s of host time on "
            f"{f['cpus']} cores), every claim in each regime (the paired estimate, per seed and "
            "in the paper's favour: the loser's value over the winner's, or for a `within` or "
            "`across` claim their difference):\n\n"
            + table(["claim", *regimes], rows) + "\n\n"
            + "\n".join(_regime_reading(regime, [v for v in repro["verdicts"]
                                                  if v["regime"] == regime])
                        for regime in regimes))


def _regime_reading(regime: str, verdicts: list[dict]) -> str:
    """One line per regime: which claims hold, which do not (the other way, or short of a
    claimed factor), which are open, read from the verdicts (for an unhealthy run, what the
    healthy seeds give)."""
    from wirelessfl.tune.claims import healthy_seeds_verdict, unhealthy_part

    groups: dict[str, list[str]] = {}
    sick = sorted({part for v in verdicts if (part := unhealthy_part(v)) is not None})
    for v in verdicts:
        verdict = v["verdict"]
        if unhealthy_part(v) is not None:
            verdict = healthy_seeds_verdict(v) or "inconclusive"
        key = {"holds": "hold", "does not hold": "do not hold",
               "not reproduced (inconclusive)": "are not reproduced (inconclusive)"}.get(
            verdict, "stay inconclusive")
        groups.setdefault(key, []).append(v["claim"])
    parts = [f"{what}: {', '.join(ids)}" for what, ids in groups.items()]
    where = (f" on the seeds where every compared run was healthy (unhealthy: "
             f"{'; '.join(sick)})" if sick else "")
    return f"* {regime}{where}: claims " + "; ".join(parts) + "."


def _nearest_rows(rows: list[dict], column: str, targets: list[float]) -> list[dict]:
    """Of ``rows``, those whose ``column`` is nearest (in log) to each of ``targets``, each
    value once (targets beyond a bounded axis share its end)."""
    picked, seen = [], set()
    for target in targets:
        best = min({float(r[column]) for r in rows}, key=lambda v: abs(math.log(v / target)))
        if best not in seen:
            seen.add(best)
            picked += [r for r in rows if float(r[column]) == best]
    return picked


def _crossover(folder: str) -> str:
    """Where DZOFL wins: the tuned methods' costs at the scenario's point and the throughput
    above which DZOFL is faster than each baseline, at uplink rates a decade apart, with the
    evaluation seeds' spread. A crossover recorded before the spread and the MCS bound on the
    rate axis (issue 35) has no band columns: its table says so instead of showing them."""
    c = _json(f"{folder}/crossover.json")
    with (ROOT / folder / "crossover_boundary.csv").open() as fh:
        boundary = list(csv.DictReader(fh))
    method, theta0, rate0 = c["method"], c["throughput0_macs_per_s"], c["uplink_rate0_bps"]
    seeds = ", ".join(f"{k} {v} seeds" for k, v in c["seeds"].items())
    lines = [(f"At the scenario's point ({theta0:.3g} MAC/s, uplink {rate0:.3g} bit/s), the means "
              f"of the tuned evaluation runs ({seeds}; the claims above carry the confidence "
              "intervals):"), ""]
    for metric in c["at_scenario"].values():
        values = "; ".join(f"{k} {g3(v)}" for k, v in metric["values"].items())
        wins = [k for k, w in metric["wins"].items() if w]
        loses = [k for k, w in metric["wins"].items() if not w]
        verdict = (f"{method} lower than {', '.join(wins) or 'none'}"
                   + (f", not than {', '.join(loses)}" if loses else ""))
        if metric["values"].get(method) is None:  # a seed missed the target: no mean
            verdict = (f"{method} missed the target on an evaluation seed, so it has no mean "
                       "and counts as losing here; the seed counts below compare the seeds")
        lines.append(f"* {metric['title']}: {values} ({verdict})")
    rows = _nearest_rows(boundary, "uplink_rate_bps", [rate0 * 10.0**k for k in (-2, -1, 0, 1, 2)])
    banded = bool(boundary) and "time_boundary_low_macs_per_s" in boundary[0]
    cells = []
    for r in rows:
        edge = float(r["time_boundary_macs_per_s"]) if r["time_boundary_macs_per_s"] else math.nan
        side = r["time"]
        faster = (f"{side} {edge:.3g} MAC/s" if math.isfinite(edge) else side)
        energy = ["yes" if r[key] == "True" else "no"
                  for key in ("energy_wins", "system_energy_wins")]
        if banded:
            low, high = (r[f"time_boundary_{end}_macs_per_s"] for end in ("low", "high"))
            faster += f" (seeds: {float(low):.3g} to {float(high):.3g})" if low else ""
            energy = [f"{answer} ({r[key]}/{r['seed_pairs']} seeds)" for answer, key in
                      zip(energy, ("energy_wins_seeds", "system_energy_wins_seeds"))]
        cells.append([f"{float(r['uplink_rate_bps']):.3g}", r["baseline"], faster, *energy])
    spread = ("; in brackets the throughputs over which the evaluation seeds disagree, and on "
              "how many seeds it spends less" if banded else
              "; recorded before the crossover gave the evaluation seeds' spread and bounded "
              "the rate axis by what the MCS table carries, which the next recording adds")
    return ("\n".join(lines) + f"\n\nAcross the map ({method} against each tuned baseline; the "
            "throughput at which the times to target are equal, and whether "
            f"{method} spends less energy at that rate{spread}):\n\n"
            + table(["uplink rate [bit/s]", "against", f"{method} faster",
                     "less device energy", "less system energy"], cells))


@block("seed002-crossover", f"{SEED002}/crossover.json", f"{SEED002}/crossover_boundary.csv")
def seed002_crossover() -> str:
    return _crossover(SEED002)


def _fashion_crossover(regime: str):
    @block(f"seed002-fashionmnist-{regime}-crossover",
           f"{SEED002_FASHION}/{regime}/crossover.json",
           f"{SEED002_FASHION}/{regime}/crossover_boundary.csv")
    def render() -> str:
        return _crossover(f"{SEED002_FASHION}/{regime}")
    return render


for _regime in ("shirt-sneaker", "ten-class"):
    _fashion_crossover(_regime)


@block("seed002-profile", "docs/data/profile-seed002-cnn/profile.json")
def seed002_profile() -> str:
    p = _json("docs/data/profile-seed002-cnn/profile.json")
    return (f"Computed by `{p['command']}` (from the model and the energy profile, not measured): "
            f"d = {p['d']:,}; on a batch of 10 a forward pass is {p['macs']:,} MACs and "
            f"costs {1e3 * p['energy_forward_j']:.3g} mJ and {1e3 * p['time_forward_s']:.3g} ms, "
            f"a backward pass {1e3 * p['energy_backward_j']:.3g} mJ and "
            f"{1e3 * p['time_backward_s']:.3g} ms. A DZOFL iteration is two forward passes per "
            f"device and a 16-bit upload; a FedSGD round uploads d x 16 + 32 = "
            f"{p['d'] * 16 + 32:,} bits per device.")


# ---------------------------------------------------------------- radio-power-sweep


def _sweep_rows() -> dict[str, list[dict]]:
    """Per algorithm, the sweep's points; a target not reached (NaN in the file) is None."""
    out: dict[str, list[dict]] = {}
    for r in _json("benchmarks/radio_power_sweep.json"):
        out.setdefault(r["algorithm"], []).append({k: _num(v) if k.endswith(("_target", "_s",
                                                                              "_j")) else v
                                                   for k, v in r.items()})
    return out


@block("radio-power-sweep-table", "benchmarks/radio_power_sweep.json")
def radio_power_sweep_table() -> str:
    rows = _sweep_rows()
    nr = "not reached"

    def cell(r, key, fmt):
        return nr if r[key] is None else fmt(r[key])

    out = []
    for dz, avg in zip(rows["DZOFL"], rows["FedAvg"], strict=True):
        out.append([f"{dz['tx_power_dbm']:g}", cell(dz, "time_to_target_s", g3),
                    cell(dz, "energy_to_target_j", g3), pct(dz["delivered_fraction"]),
                    cell(avg, "rounds_to_target", i0), cell(avg, "time_to_target_s", g3),
                    cell(avg, "energy_to_target_j", g3), pct(avg["delivered_fraction"])])
    return table(["tx power [dBm]", "DZOFL time [s]", "DZOFL energy [J]", "DZOFL in time",
                  "FedAvg rounds", "FedAvg time [s]", "FedAvg energy [J]", "FedAvg in time"],
                 out)


@block("radio-power-sweep-reading", "benchmarks/radio_power_sweep.json")
def radio_power_sweep_reading() -> str:
    rows = _sweep_rows()
    dz, avg = rows["DZOFL"], rows["FedAvg"]
    reached = [r for r in avg if r["rounds_to_target"] is not None]
    missed = [r for r in avg if r["rounds_to_target"] is None]
    hi, lo = reached[0], reached[-1]
    cheapest = min(reached, key=lambda r: r["energy_to_target_j"])
    dz_reached = [r for r in dz if r["rounds_to_target"] is not None]
    both = [(d, a) for d, a in zip(dz, avg, strict=True) if a["rounds_to_target"] is not None
            and d["rounds_to_target"] is not None]
    cheaper = [a["tx_power_dbm"] for d, a in both
               if a["energy_to_target_j"] < d["energy_to_target_j"]
               and a["time_to_target_s"] < d["time_to_target_s"]]
    lines = [
        (f"* FedAvg: as power drops from {hi['tx_power_dbm']:g} to {lo['tx_power_dbm']:g} dBm "
        f"the share of its uploads that arrive in time goes from {pct(hi['delivered_fraction'])} "
        f"to {pct(lo['delivered_fraction'])}; its rounds to target go from "
        f"{i0(hi['rounds_to_target'])} to {i0(lo['rounds_to_target'])}; at "
        f"{lo['tx_power_dbm']:g} dBm its time to target is "
        f"{ratio(lo['time_to_target_s'], hi['time_to_target_s'], 0)} that at "
        f"{hi['tx_power_dbm']:g} dBm and its energy to target "
        f"{ratio(lo['energy_to_target_j'], cheapest['energy_to_target_j'], 0)} that at its "
        f"cheapest point ({cheapest['tx_power_dbm']:g} dBm).")]
    if missed:
        lines.append(
            "* Below that FedAvg no longer reaches the target: final accuracy "
            + ", ".join(f"{r['final_accuracy']:.2f} at {r['tx_power_dbm']:g} dBm" for r in missed)
            + ".")
    low = dz_reached[-1]
    lines.append(
        f"* DZOFL reaches the target at {len(dz_reached)} of {len(dz)} powers, down to "
        f"{low['tx_power_dbm']:g} dBm with {pct(low['delivered_fraction'], 0)} "
        f"of its uploads in time; its rounds to target range over "
        f"{span([r['rounds_to_target'] for r in dz_reached], '{:,.0f}')}.")
    times = [d["rounds_to_target"] / a["rounds_to_target"] for d, a in both]
    lines.append(
        f"* Where both reach the target, FedAvg is cheaper in joules and in seconds at "
        f"{len(cheaper)} of {len(both)} powers, at these untuned settings (DZOFL's rounds to "
        f"target are {span(times, '{:.0f}')} times FedAvg's).")
    return "\n".join(lines)


# ---------------------------------------------------------------- over the air


OVER_THE_AIR = "docs/data/over-the-air"


_verdicts_block("over-the-air-verdicts", OVER_THE_AIR)
for _regime in ("transmit-only", "earth"):
    _regime_block(f"over-the-air-{_regime}", OVER_THE_AIR, _regime)


def _devices_rows() -> dict[str, list[dict]]:
    """Per algorithm, the device-count sweep's points in increasing N."""
    out: dict[str, list[dict]] = {}
    for r in _json("benchmarks/over_the_air_devices.json")["rows"]:
        out.setdefault(r["algorithm"], []).append(r)
    return out


@block("over-the-air-devices-table", "benchmarks/over_the_air_devices.json")
def over_the_air_devices_table() -> str:
    rows = _devices_rows()
    labels = list(rows)
    counts = [r["devices"] for r in rows[labels[0]]]
    body = [[f"{n:,}"] + [g3(rows[label][i]["upload_per_round_s"] * 1e3) for label in labels]
            for i, n in enumerate(counts)]
    return table(["devices N"] + [f"{label} upload [ms/round]" for label in labels], body)


@block("over-the-air-devices-reading", "benchmarks/over_the_air_devices.json")
def over_the_air_devices_reading() -> str:
    rows = _devices_rows()
    lines = []
    for label, points in rows.items():
        first, last = points[0], points[-1]
        growth = last["upload_per_round_s"] / first["upload_per_round_s"]
        what = ("the same at every N" if growth == 1 else
                f"{g3(growth)} times longer at N = {last['devices']:,} than at "
                f"N = {first['devices']:,} ({g3(last['devices'] / first['devices'])} times as "
                "many devices)")
        lines.append(f"* {label}: {g3(first['upload_per_round_s'] * 1e3)} ms of upload a round "
                     f"at N = {first['devices']:,}, {what}; "
                     f"{pct(min(p['delivered_fraction'] for p in points))} to "
                     f"{pct(max(p['delivered_fraction'] for p in points))} of the uploads in "
                     "the sum or delivered.")
    return "\n".join(lines)


# ---------------------------------------------------------------- seed000


# zo_hfl.md 5.3, the spec's prototype at setting (1, 0.5): mean +- std over 3 seeds with
# renormalised client weights, and (its note under the table) the ZO-HFL rows with a_i = w_i,
# the weights these runs use (no spread given).
ZO_HFL_PROTOTYPE = {
    "ZO-HFL": "0.872 (renormalised: 0.823 +- 0.017)",
    "ZO-HFL (CRN)": "0.881 (renormalised: 0.885 +- 0.015)",
    "server only": "0.866 +- 0.036", "FedAvg": "0.955 +- 0.005", "FedProx": "0.953 +- 0.007"}
FEDAVG_PROTOTYPE_LOW = "92.9 +- 1.4 %"  # zo_hfl.md 5.3: the spec's prototype at (0.1, 10 %)
ZO_HFL_PROTOTYPE_LOW = "87.9 % (independent solves) and 88.8 % (CRN)"  # zo_hfl.md 5.3, a_i = w_i
BASELINES = ("FedAvg", "FedProx", "SCAFFOLD")


@block("seed000-table1-digits-table", "docs/data/seed000-table1-digits/summary.csv")
def seed000_digits_table() -> str:
    rows = []
    for row in summary("seed000-table1-digits"):
        label = row["algorithm"]
        rows.append([label, f"{float(row['final_accuracy']):.3f}",
                     ZO_HFL_PROTOTYPE.get(label, "-"), g3(row["energy_j"]),
                     i0(row["uplink_bits_per_device_round"])])
    return (recorded_line("seed000-table1-digits") + "\n\n"
            + table(["method", "final accuracy (seed 0)", "spec prototype (zo_hfl.md 5.3)",
                     "energy [J]", "uplink bits/dev/round"], rows))


@block("seed000-table1-digits-reading", "docs/data/seed000-table1-digits/summary.csv")
def seed000_digits_reading() -> str:
    rows = by_label("seed000-table1-digits")
    paper, crn = rows["ZO-HFL"], rows["ZO-HFL (CRN)"]
    seed, server = rows["ZO-HFL (seed mode)"], rows["server only"]
    acc = "final_accuracy"
    best = max((b for b in BASELINES if b in rows), key=lambda b: float(rows[b][acc]))
    bits = "uplink_bits_per_device_round"
    return "\n".join([
        (f"* ZO-HFL ends at {float(paper[acc]):.3f}, {side(paper[acc], server[acc])} its "
         f"server-only control ({float(server[acc]):.3f}); with common batches (CRN) at "
         f"{float(crn[acc]):.3f}, {side(crn[acc], paper[acc])} the independent solves. The best "
         f"baseline here, {best}, ends at {float(rows[best][acc]):.3f}: ZO-HFL is "
         f"{side(paper[acc], rows[best][acc])} it."),
        (f"* The seed mode's final accuracy is {float(seed[acc]):.3f} against the paper mode's "
         f"{float(paper[acc]):.3f}, for 1/{float(paper[bits]) / float(seed[bits]):,.0f} of the "
         f"uplink bits and {pct(float(seed['energy_j']) / float(paper['energy_j']), 0)} of the "
         f"energy; the radio (uplink and downlink) is {pct(paper['radio_share'], 0)} of the paper "
         f"mode's energy and {pct(seed['radio_share'], 0)} of the seed mode's.")])


def _table1_rows() -> list[dict]:
    return _json("benchmarks/seed000_table1.json")


@block("seed000-table1-table", "benchmarks/seed000_table1.json")
def seed000_table1_table() -> str:
    return _bench_module("seed000_table1").table(_table1_rows())


def _setting(alpha: float, beta: float) -> str:
    return f"({alpha:g}, {100 * beta:.0f} %)"


def _relation(values: list[float], others: list[float], settings: list[tuple]) -> str:
    """Where VALUES lie against OTHERS setting by setting: 'above at (..) and (..), below at
    (..)', or 'below at every setting' (compared as printed, one decimal)."""
    groups: dict[str, list[str]] = {}
    for v, o, (a, b) in zip(values, others, settings, strict=True):
        groups.setdefault(side(v, o, "{:.1f}", same="level"), []).append(_setting(a, b))
    if len(groups) == 1:
        return f"{next(iter(groups))} at every setting"
    return ", ".join(f"{where} at {listing(names)}" for where, names in groups.items())


@block("seed000-table1-reading", "benchmarks/seed000_table1.json")
def seed000_table1_reading() -> str:
    rows = _table1_rows()
    bench = _bench_module("seed000_table1")
    settings = bench.SETTINGS

    def acc(method, alpha):
        return statistics.mean(100 * r["accuracy"] for r in rows
                               if r["method"] == method and r["alpha"] == alpha)

    def energy(method, alpha):
        return statistics.mean(r["energy_j"] for r in rows
                               if r["method"] == method and r["alpha"] == alpha)

    methods = {r["method"] for r in rows}
    base = [m for m in BASELINES if m in methods]
    (a0, b0), (a2, b2) = settings[0], settings[-1]
    paper = [acc("ZO-HFL", a) for a, _ in settings]
    crn = [acc("ZO-HFL (CRN)", a) for a, _ in settings]
    server = [acc("server only", a) for a, _ in settings]
    seed = [acc("ZO-HFL (seed mode)", a) for a, _ in settings]
    share = [energy("ZO-HFL (seed mode)", a) / energy("ZO-HFL", a) for a, _ in settings]
    low = {m: acc(m, a2) for m in base}
    behind = [m for m in base if side(paper[-1], low[m], "{:.1f}") == "below"]
    published = " -> ".join(f"{bench.PAPER['ZO-HFL'][k][0]:.1f}" for k in range(len(settings)))
    return "\n".join([
        (f"* Means over seeds {listing([str(s) for s in sorted({r['seed'] for r in rows})])}. "
         f"From {_setting(a0, b0)} to {_setting(a2, b2)} (heterogeneity growing): "
         + ", ".join(f"{m} {acc(m, a0):.1f} -> {acc(m, a2):.1f} %" for m in base)
         + f" (the spec's own prototype measured FedAvg at {FEDAVG_PROTOTYPE_LOW} at "
         f"{_setting(a2, b2)}); the paper's MNIST column has "
         + ", ".join(f"{m} {bench.PAPER[m][0][0]:.1f} -> {bench.PAPER[m][-1][0]:.1f} %"
                     for m in base if m in bench.PAPER) + "."),
        (f"* ZO-HFL in the paper's mode (independent inner solves, a_i = w_i): "
         f"{' -> '.join(f'{v:.1f}' for v in paper)} % over the three settings (paper, MNIST: "
         f"{published} %; the spec's prototype with a_i = w_i at {_setting(a2, b2)}: "
         f"{ZO_HFL_PROTOTYPE_LOW}); against its server-only control "
         f"({' / '.join(f'{v:.1f}' for v in server)} %) it is "
         f"{_relation(paper, server, settings)}. With common batches (CRN): "
         f"{' / '.join(f'{v:.1f}' for v in crn)} %; against the independent solves, "
         f"{_relation(crn, paper, settings)}."),
        (f"* The paper's ordering at {_setting(a2, b2)} (zo_hfl.md 5.2: ZO-HFL at or above "
         f"SCAFFOLD, far above FedAvg and FedProx) "
         + ("holds here" if not behind else "does not hold here")
         + f": ZO-HFL {paper[-1]:.1f} % against "
         + ", ".join(f"{m} {low[m]:.1f} %" for m in base)
         + (f" (below {listing(behind)})." if behind else ".")),
        (f"* The seed payload mode spends {span([100 * s for s in share], '{:.0f}')} % of the "
         "paper mode's energy (one scalar up instead of two d-vectors, a 32-bit seed down instead "
         "of a direction) and ends within "
         f"{max(abs(s - p) for s, p in zip(seed, paper, strict=True)):.1f} points of its "
         "accuracy in every setting."),
        "* " + UNTUNED])


# ---------------------------------------------------------------- heterogeneous-devices


@block("heterogeneous-devices-table", "docs/data/heterogeneous-devices/summary.csv")
def heterogeneous_table() -> str:
    return (recorded_line("heterogeneous-devices") + "\n\n" + run_table(
        "heterogeneous-devices", [
            "rounds_to_target", "time_to_target_s", "energy_to_target_j", "compute_share",
            "radio_share", "idle_share", "final_accuracy", "rounds", "sim_time_s", "energy_j",
            "uplink_bits_per_device_round", "in_time_fraction"]))


def _classes() -> dict:
    return facts("heterogeneous-devices")["classes"]


@block("heterogeneous-devices-classes", "docs/data/heterogeneous-devices/facts.json")
def heterogeneous_classes() -> str:
    per = _classes()["per_algorithm"]
    head, cols = [""], []
    for label in ("FedAvg", "DZOFL"):
        for cls, c in per[label]["classes"].items():
            head.append(f"{label}, {cls}")
            cols.append(c)
    rows = [
        ["devices"] + [str(c["devices"]) for c in cols],
        ["total [J]"] + [f"{g3(c['mean_energy_j'])} ({g3(c['min_energy_j'])} to "
                         f"{g3(c['max_energy_j'])})" for c in cols],
        ["idle [J]"] + [g3(c["mean_energy_idle_j"]) for c in cols],
        ["uplink [J]"] + [g3(c["mean_energy_uplink_j"]) for c in cols],
        ["downlink [J]"] + [g3(c["mean_energy_downlink_j"]) for c in cols],
        ["compute [J]"] + [g3(c["mean_energy_compute_j"]) for c in cols],
        ["compute time [s]"] + [g3(c["mean_compute_s"]) for c in cols],
        ["idle time [s] / time alive [s]"] + [f"{g3(c['mean_idle_s'])} / "
                                              f"{g3(c['mean_time_alive_s'])}" for c in cols],
        ["ran out of budget"] + [str(c["depleted"]) for c in cols],
    ]
    return "Per device, mean over the class (min to max for the total):\n\n" + table(head, rows)


@block("heterogeneous-devices-reading", "docs/data/heterogeneous-devices/summary.csv",
       "docs/data/heterogeneous-devices/facts.json")
def heterogeneous_reading() -> str:
    rows = by_label("heterogeneous-devices")
    cls = _classes()
    per = cls["per_algorithm"]
    lines = []
    for label in ("DZOFL", "FedAvg"):
        phone = per[label]["classes"]["smartphone-soc"]
        lines.append(
            f"* {label}: a phone waits {pct(phone['mean_idle_s'] / phone['mean_time_alive_s'], 0)} "
            f"of its time alive; idle is {pct(rows[label]['idle_share'], 0)} of the energy to "
            f"target; {per[label]['transmissions_per_packet']:.2f} transmissions per packet "
            f"(ARQ); {per[label]['alive_at_end']} devices alive at the end.")
    iot = per["DZOFL"]["classes"]["mcu-iot"]
    if iot["depleted"]:
        lines.append(
            f"* Batteries, DZOFL: {iot['depleted']} of the {iot['devices']} IoT nodes spend their "
            f"budget, between {g3(iot['depleted_first_s'])} s and {g3(iot['depleted_last_s'])} s "
            f"(target reached at {g3(rows['DZOFL']['time_to_target_s'])} s); mean distance "
            f"{iot['depleted_mean_distance_m']:.0f} m against {iot['kept_mean_distance_m']:.0f} m "
            f"for those that last; final accuracy {float(rows['DZOFL']['final_accuracy']):.3f}.")
    fa, dz = rows["FedAvg"], rows["DZOFL"]
    reached = [label for label in ("FedAvg", "DZOFL")
               if _num(rows[label]["rounds_to_target"]) is not None]
    if len(reached) == 2:
        much = {"fewer": "less", "more": "more", "same": "as much"}
        lines.append(
            "* At these untuned settings DZOFL reaches the target with "
            + than(fa["energy_to_target_j"], dz["energy_to_target_j"], "energy", "FedAvg",
                   **much) + ", "
            + than(fa["time_to_target_s"], dz["time_to_target_s"], "time", "FedAvg", **much)
            + " and " + than(fa["rounds_to_target"], dz["rounds_to_target"], "rounds", "FedAvg")
            + ".")
    else:
        lines.append(f"* Reached the target: {listing(reached) if reached else 'neither'}.")
    return "\n".join(lines)


# ---------------------------------------------------------------- seed003


def _toy() -> list[dict]:
    return _json("benchmarks/seed003_toy.json")


@block("seed003-toy-table", "benchmarks/seed003_toy.json")
def seed003_toy_table() -> str:
    return _bench_module("seed003_toy").table(_toy(), "R=100")


@block("seed003-toy-long", "benchmarks/seed003_toy.json")
def seed003_toy_long() -> str:
    return _bench_module("seed003_toy").table(_toy(), "R=300")


@block("seed003-toy-ablation", "benchmarks/seed003_toy.json")
def seed003_toy_ablation() -> str:
    return _bench_module("seed003_toy").ablation_table(_toy())


def _toy_mean(protocol: str, method: str, key: str) -> float:
    return statistics.mean(r[key] for r in _toy() if r["protocol"] == protocol
                           and r["method"] == method)


@block("seed003-toy-reading", "benchmarks/seed003_toy.json")
def seed003_toy_reading() -> str:
    def gap(protocol, method):
        d = (_toy_mean(protocol, method, "worst_device_accuracy")
             - _toy_mean(protocol, "FedAvg", "worst_device_accuracy"))
        return f"{d:+.3f}"

    def vs_fedavg(method, key, digits=1):
        return ratio(_toy_mean("R=100", method, key), _toy_mean("R=100", "FedAvg", key), digits)

    def worst(method):
        return f"{_toy_mean('R=100', method, 'worst_device_accuracy'):.3f}"

    methods = ("FGDRO-CVaR", "FGDRO-KL", "FGDRO-KL-Adam")
    kl, adam, bits = "FGDRO-KL", "FGDRO-KL-Adam", "uplink_bits_per_device_round"
    cvar, paid = "FGDRO-CVaR", "FGDRO-CVaR (every backward paid)"
    radio = [r["energy_uplink_j"] / r["energy_j"] for r in _toy() if r["protocol"] == "R=100"]
    compute = [r["energy_compute_j"] / r["energy_j"] for r in _toy() if r["protocol"] == "R=100"]
    lines = [
        "* Worst-device accuracy minus FedAvg's (mean over seeds): "
        + "; ".join(f"{m} {gap('R=100', m)} at R = 100, {gap('R=300', m)} at R = 300, "
                    f"{gap('I=8', m) if m != 'FGDRO-KL' else 'not run'} at I = 8"
                    for m in methods) + ".",
        (f"* The lam = 1e6 controls (no re-weighting): KL {worst(kl + ', lam=1e6 (momentum SGD)')}"
        f" against {worst(kl)} with re-weighting; KL-Adam "
        f"{worst(adam + ', lam=1e6 (LocalAdam)')} against {worst(adam)}; FedAvg "
        f"{worst('FedAvg')}."),
        (f"* Per round KL uploads {vs_fedavg(kl, bits)} and KL-Adam {vs_fedavg(adam, bits)} "
        f"FedAvg's bits; their energy is {vs_fedavg(kl, 'energy_j', 2)} and "
        f"{vs_fedavg(adam, 'energy_j', 2)} FedAvg's, their simulated time "
        f"{vs_fedavg(kl, 'sim_time_s', 2)} and {vs_fedavg(adam, 'sim_time_s', 2)} (the uplink is "
        f"{span([100 * v for v in radio], '{:.1f}')} % of every run's energy)."),
        (f"* CVaR's lazy backward: backward / forward passes "
        f"{_toy_mean('R=100', cvar, 'backward_per_forward'):.2f}; its compute energy is "
        f"{vs_fedavg(cvar, 'energy_compute_j', 3)} FedAvg's (compute is "
        f"{span([100 * v for v in compute], '{:.1f}')} % of the energy), and its simulated time "
        f"{g3(_toy_mean('R=100', cvar, 'sim_time_s'))} s against "
        f"{g3(_toy_mean('R=100', paid, 'sim_time_s'))} s for the control that pays every "
        "backward pass."),
        "* " + UNTUNED]
    return "\n".join(lines)


@block("seed003-toy-run", "docs/data/seed003-toy/summary.csv")
def seed003_toy_run() -> str:
    return (recorded_line("seed003-toy") + "\n\n" + run_table("seed003-toy", [
        "final_accuracy", "final_worst_device_accuracy", "rounds", "sim_time_s", "energy_j",
        "uplink_bits_per_device_round", "in_time_fraction"]))


SHIFT = [f"seed003-digits-label-shift-seed{s}" for s in (0, 1, 2)]


def _shift_last(key: str, label: str) -> dict:
    return facts(key)["algorithms"][label]["last"]


@block("seed003-label-shift-table", "docs/data/seed003-digits-label-shift-seed*/facts.json")
def seed003_label_shift_table() -> str:
    labels = list(facts(SHIFT[0])["algorithms"])
    rows = []
    for suffix, note in (("", ""), ("-lam1e6", ", lam = 1e6")):
        for label in labels:
            if suffix and label in ("FedAvg", "FGDRO-CVaR"):
                continue
            last = [_shift_last(k + suffix, label) for k in SHIFT]
            rows.append([label + note] + [
                mean_std([r[c] for r in last]) for c in (
                    "worst_device_accuracy", "worst_k_device_accuracy",
                    "mean_device_accuracy", "test_accuracy")] + [
                g3(statistics.mean(r["energy_j"] for r in last)),
                g3(statistics.mean(r["sim_time_s"] for r in last))])
    keys = ", ".join(f"`{k}`, `{k}-lam1e6`" for k in SHIFT)
    return (f"Last round, mean +- std over seeds 0, 1, 2 (docs/data/: {keys}; "
            f"{statistics.mean(facts(k)['host_s'] for k in SHIFT):.0f} s of host time a run):"
            "\n\n" + table(["method", "worst device", "worst 2", "mean over devices",
                            "global test acc.", "energy [J]", "sim. time [s]"], rows))


@block("seed003-label-shift-reading", "docs/data/seed003-digits-label-shift-seed*/facts.json")
def seed003_label_shift_reading() -> str:
    def worst(suffix, label):
        return statistics.mean(_shift_last(k + suffix, label)["worst_device_accuracy"]
                               for k in SHIFT)

    fedavg = worst("", "FedAvg")
    gains = [f"{label} {worst('', label) - fedavg:+.3f} ({worst('-lam1e6', label) - fedavg:+.3f}"
             " with lam = 1e6)" for label in ("FGDRO-KL", "FGDRO-KL-Adam")]

    def at_budget(key, label, budget):
        rows = [r for r in facts(key)["trace"][label] if r["energy_j"] <= budget * 1.02]
        return rows[-1]

    equal = []
    for label in ("FedAvg", "FGDRO-KL", "FGDRO-KL-Adam"):
        got = [at_budget(k, label, _shift_last(k, "FedAvg")["energy_j"]) for k in SHIFT]
        equal.append(f"{label} " + ", ".join(f"{r['worst_device_accuracy']:.3f}" for r in got)
                     + f" (round {', '.join(str(r['round']) for r in got)})")
    return (f"Worst-device accuracy minus FedAvg's: {'; '.join(gains)}; FGDRO-CVaR "
            f"{worst('', 'FGDRO-CVaR') - fedavg:+.3f}. At FedAvg's final energy (the last "
            f"evaluated round within it), seeds 0, 1, 2: {'; '.join(equal)}. " + UNTUNED)


# ---------------------------------------------------------------- seed004


def _quad() -> dict:
    return _json("benchmarks/seed004_quadratic.json")


@block("seed004-quadratic-constants", "benchmarks/seed004_quadratic.json")
def seed004_constants() -> str:
    c = _quad()["constants"]
    return (f"d = {_quad()['dimension']}, L = {c['L']:.4g}, mu = {c['mu']:.4g}, delta_A = "
            f"{c['delta_A']:.4g} by the paper's formula (L / delta_A = "
            f"{c['L'] / c['delta_A']:.3g}), exact AHD constant {c['delta_A_exact']:.3g}, "
            f"delta_B {c['delta_B']:.3g}.")


@block("seed004-quadratic-table", "benchmarks/seed004_quadratic.json")
def seed004_quadratic_table() -> str:
    return _bench_module("seed004_quadratic").table(_quad()["records"])


@block("seed004-quadratic-reading", "benchmarks/seed004_quadratic.json")
def seed004_quadratic_reading() -> str:
    recs = _quad()["records"]
    seeds = len({r["seed"] for r in recs})

    def got(method, key):
        return [r[key] for r in recs if r["method"] == method and _num(r[key]) is not None]

    def mean(method, key):
        values = got(method, key)
        return statistics.mean(values) if values else None

    def rounds(method, key="rounds_to_1e-06"):
        """'N.N' (mean over the seeds that reached 1e-6) and how many did not."""
        values = got(method, key)
        if not values:
            return "never"
        missed = seeds - len(values)
        return f"{statistics.mean(values):.1f}" + (f" ({missed} of {seeds} seeds never)"
                                                    if missed else "")

    def vs_gd(method, key="rounds_to_1e-06"):
        value, gd = mean(method, key), mean("GD", key)
        return "-" if value is None or gd is None else factor(gd, value)

    def exchanges(method):
        value, gd = mean(method, "exchanges_to_1e-06"), mean("GD", "exchanges_to_1e-06")
        if value is None or gd is None:
            return f"{method.split()[0]} -"
        return f"{method.split()[0]} {than(gd, value, 'exchanges', 'GD')}"

    gd_g = mean("GD", "grads_to_1e-06")
    dane = "DANE+-GD lam=2delta_A"  # Cor. 5's lambda, DANE+'s default
    half = "DANE+-GD lam=delta_A"
    fr = "FedRed-GD p=0.05"
    k50 = got("Scaffold K=50", "rounds_to_1e-06")
    stall = [r["final_suboptimality"] for r in recs if r["method"] in ("FedAvg K=5",
                                                                        "FedProx K=5")]
    lines = [
        (f"* Rounds to 1e-6 (mean over seeds): GD {rounds('GD')}, DANE+-GD at Cor. 5's lambda = "
         f"2 delta_A {rounds(dane)} ({vs_gd(dane)}; at lambda = delta_A, below what Cor. 5 "
         f"covers, {rounds(half)}, {vs_gd(half)}), FedRed-GD at p = 0.05 {rounds(fr)} "
         f"({vs_gd(fr)}). In exchanges (two per round for DANE+ and FedRed, one for GD): "
         f"{exchanges(dane)}, {exchanges(fr)}; the paper counts model rounds.")]
    if gd_g is not None and mean(fr, "grads_to_1e-06") is not None:
        fr_g, dane_g = mean(fr, "grads_to_1e-06"), mean(dane, "grads_to_1e-06")
        lines.append(
            f"* Gradients to 1e-6: FedRed-GD {fr_g:.0f}, {fr_g / gd_g:.1f}x GD's ({gd_g:.0f})"
            + (f" and {fr_g / dane_g:.2f}x DANE+-GD's at lambda = 2 delta_A ({dane_g:.0f})."
               if dane_g is not None else "."))
    if k50 and gd_g is not None:
        lines.append(
            f"* Scaffold with the exact control variate at K = 50: {span(k50, '{:.0f}')} rounds "
            f"to 1e-6 at {mean('Scaffold K=50', 'grads_to_1e-06') / gd_g:.2f}x GD's gradients.")
    lines += [
        (f"* FedAvg / FedProx with K = 5 local steps end at f - f* = {span(stall, '{:.2g}')}: "
         "they have no drift correction."),
        "* " + UNTUNED]
    return "\n".join(lines)


@block("seed004-quadratic-run", "docs/data/seed004-quadratic/summary.csv")
def seed004_quadratic_run() -> str:
    return (recorded_line("seed004-quadratic") + "\n\n" + run_table("seed004-quadratic", [
        "rounds_to_target", "gradient_evaluations_to_target", "time_to_target_s",
        "energy_to_target_j", "final_suboptimality", "rounds", "in_time_fraction"]))


PAPER_L_OVER_DELTA = 20  # seed 004, Fig. 1: "L / delta_A ~ L / delta_B >~ 20" on its quadratic


@block("seed004-logistic-constants", "docs/data/seed004-logistic/facts.json")
def seed004_logistic_constants() -> str:
    p = facts("seed004-logistic")["problem"]
    return (f"l2 = 1/M = {p['l2']:.3g} (M = {p['M']}), rows of mean norm 1; L = {p['L']:.3g}, "
            f"mu = {p['mu']:.2g}, delta_A = {p['delta_A']:.3g} estimated at 0 (exact "
            f"{p['delta_A_exact']:.3g}), so L / delta_A is {p['L'] / p['delta_A']:.2g}, "
            f"{side(p['L'] / p['delta_A'], PAPER_L_OVER_DELTA, '{:.2g}', 'above', 'below', 'at')}"
            f" the paper's {PAPER_L_OVER_DELTA} on its quadratic (Fig. 1; the spec's Sec. 5.2 "
            "notes that unbalanced Dirichlet clients inflate delta).")


@block("seed004-logistic-table", "docs/data/seed004-logistic/summary.csv")
def seed004_logistic_table() -> str:
    f = facts("seed004-logistic")
    return (f"Target f - f* <= {f['target_suboptimality']:g}. " + recorded_line("seed004-logistic")
            + "\n\n" + run_table("seed004-logistic", [
                "rounds_to_target", "gradient_evaluations_to_target", "time_to_target_s",
                "energy_to_target_j", "final_suboptimality", "rounds"]))


@block("seed004-logistic-reading", "docs/data/seed004-logistic/summary.csv",
       "docs/data/seed004-logistic/facts.json")
def seed004_logistic_reading() -> str:
    rows = by_label("seed004-logistic")
    p = facts("seed004-logistic")["problem"]
    gd = rows["GD"]
    rounds, grads = "rounds_to_target", "gradient_evaluations_to_target"
    parts = []
    thm9 = "Thm 9: lambda = delta_A, p = (lambda + mu/2) / (L - mu/2)"
    for label, theory in (("FedRed-GD", thm9), ("DANE+-GD", "Cor. 5: lambda = 2 delta_A")):
        row = rows.get(label)
        if row is None:
            continue
        if _num(row[rounds]) is None:
            parts.append(f"{label} ({theory}) does not reach the target")
        elif _num(gd[rounds]) is None:
            parts.append(f"{label} ({theory}) reaches the target in {i0(row[rounds])} rounds")
        else:
            parts.append(f"{label} ({theory}) reaches the target in "
                         f"{than(gd[rounds], row[rounds], 'rounds', 'GD')} at "
                         f"{ratio(row[grads], gd[grads])} GD's gradients")
    return (f"At the theory's parameters (untuned; delta_A = {p['delta_A_exact']:.3g}, the exact "
            "constant the defaults read, from the run's manifest): "
            + "; ".join(parts)
            + (". GD does not reach the target." if _num(gd[rounds]) is None else ".")
            + f" Their round bounds scale with delta_A / mu ({p['delta_A_exact'] / p['mu']:,.0f} "
            f"here), GD's with L / mu ({p['L'] / p['mu']:,.0f}).")


# ---------------------------------------------------------------- seed001


def _bilevel() -> dict:
    return _json("benchmarks/seed001_quadratic.json")


def _median_never(values: list) -> str:
    """Median of the runs that reached the mark, and how many never did."""
    known = [v for v in values if _num(v) is not None]
    if not known:
        return "never"
    text = g3(statistics.median(known))
    return text if len(known) == len(values) else f"{text} ({len(values) - len(known)} never)"


@block("seed001-quadratic-table", "benchmarks/seed001_quadratic.json")
def seed001_quadratic_table() -> str:
    data = _bilevel()
    groups: dict[tuple, list[dict]] = {}
    for r in data["records"]:
        groups.setdefault((r["label"], r["local_clients"], r["local_steps"]), []).append(r)
    rows = []
    for (label, clients, k), g in groups.items():
        fedmsa = label.startswith("FedMSA")
        proto = data["prototype_rounds"].get(str(k)) if fedmsa and clients == 1 else None
        rows.append([label, str(clients), str(k)] + [_median_never([r[c] for r in g]) for c in (
            "rounds_to_1pct", "rounds_staying_below_1pct", "exchanges_to_1pct",
            "sim_time_to_1pct_s", "energy_to_1pct_j", "hvp_per_device_to_1pct")]
            + [f"{statistics.median(r['final_relative_error'] for r in g):.1e}",
               str(proto) if proto else ("never" if fedmsa and clients == 1 else "-")])
    seeds = sorted({r["seed"] for r in data["records"]})
    return (f"Medians over seeds {', '.join(map(str, seeds))} (\"(n never)\": n seeds did not "
            "reach 1e-2 in the run; the median is of the others):\n\n" + table(
                ["method", "S", "K", "rounds to 1 % (first)", "staying below 1 %",
                 "exchanges to 1 %", "simulated s", "J", "HVPs/device", "final error",
                 "spec prototype (rounds)"], rows))


def _trend(values: list[float]) -> str:
    """'falling', 'rising' or 'not monotone' for a sequence (ties break monotony)."""
    pairs = list(itertools.pairwise(values))
    if all(b < a for a, b in pairs):
        return "falling"
    if all(b > a for a, b in pairs):
        return "rising"
    return "not monotone"


@block("seed001-quadratic-reading", "benchmarks/seed001_quadratic.json")
def seed001_quadratic_reading() -> str:
    recs = _bilevel()["records"]
    fedmsa = [r for r in recs if r["label"].startswith("FedMSA")]
    n_seeds = len({r["seed"] for r in recs})

    def runs(clients, k):
        return [r for r in fedmsa if r["local_clients"] == clients and r["local_steps"] == k]

    def med(clients, k, key):
        got = [r[key] for r in runs(clients, k) if r[key] is not None]
        return statistics.median(got) if got else None

    ks = sorted({r["local_steps"] for r in fedmsa if r["local_clients"] == 1})
    reached = ", ".join(f"K = {k}: {sum(r['rounds_to_1pct'] is not None for r in runs(1, k))}"
                        f"/{len(runs(1, k))}" for k in ks)
    final = ", ".join(f"{med(1, k, 'final_relative_error'):.1e}" for k in ks)
    conv = [k for k in ks if med(1, k, "rounds_staying_below_1pct") is not None]
    stay = [med(1, k, "rounds_staying_below_1pct") for k in conv]
    first = [med(1, k, "rounds_to_1pct") for k in conv]
    ks_text = ", ".join(map(str, conv))
    lines = [
        (f"* One client doing the local steps (S = 1), {n_seeds} seeds: seeds that reach 1e-2, "
         f"{reached}; median final error {final} for K = {', '.join(map(str, ks))}.")]
    if len(conv) > 1:
        lines.append(
            f"* Median round from which the error stays below 1e-2: "
            f"{', '.join(f'{v:g}' for v in stay)} for K = {ks_text} ({_trend(stay)} as K grows); "
            f"first crossing: {', '.join(f'{v:g}' for v in first)} ({_trend(first)}).")
    both = [k for k in conv if med(10, k, "rounds_staying_below_1pct") is not None]
    if both:
        stay1 = [med(1, k, "rounds_staying_below_1pct") for k in both]
        stay10 = [med(10, k, "rounds_staying_below_1pct") for k in both]
        hvp = [med(10, k, "hvp_per_device_to_1pct") / med(1, k, "hvp_per_device_to_1pct")
               for k in both]
        lines.append(
            "* S = 10 against S = 1 (medians over the seeds that reach 1e-2), until the error "
            "stays below 1e-2: "
            + ", ".join(f"{factor(a, b)} rounds at K = {k}"
                        for a, b, k in zip(stay1, stay10, both, strict=True))
            + "; HVPs per device to 1e-2: " + ", ".join(f"{v:.1f}x" for v in hvp)
            + f" S = 1's at K = {', '.join(map(str, both))}.")
    nest = [r["final_relative_error"] for r in recs if r["label"].startswith("FedNest")]
    if nest:
        error = statistics.median(nest)
        lines.append(
            f"* FedNest with 3 Neumann terms ends at a median relative error of {error:.1e}, "
            f"{side(error, 1e-2, '{:.1e}')} the 1e-2 mark.")
    lines.append("* " + UNTUNED)
    return "\n".join(lines)


@block("seed001-quadratic-run", "docs/data/seed001-quadratic/summary.csv")
def seed001_quadratic_run() -> str:
    return (recorded_line("seed001-quadratic") + " The CLI's `final f - f*` column is the "
            "relative error \\|x - x*\\| / \\|x*\\| for this problem.\n\n"
            + run_table("seed001-quadratic", ["final_suboptimality", "rounds", "sim_time_s",
                                              "energy_j", "uplink_bits_per_device_round"],
                        {"final_suboptimality": "final relative error"}))


@block("seed001-mco", "docs/data/seed001-mco/facts.json",
       "docs/data/seed001-mco-centralized/facts.json")
def seed001_mco() -> str:
    """FedMSA (R = 200, K = 5) against the one-device run (1,000 plain steps): the relative
    errors at the recorded rounds and iterations (facts' "mco": round/iteration -> values, read
    at exactly those keys), and where FedMSA lies at equal updates and at equal rounds."""
    fed, cen = facts("seed001-mco"), facts("seed001-mco-centralized")
    labels = list(fed["mco"])
    p = fed["problem"]
    rows, lines = [], []
    per_update, per_round = [], []
    for label in labels:
        m, c = fed["mco"][label], cen["mco"][label]

        def err(run, key):
            return run[key]["relative_error"]

        rows.append([label, f"{err(m, '0'):.3f}", f"{err(m, '40'):.3f}",
                     f"{err(m, '200'):.3f}", f"{m['200']['objective']:.3g}",
                     f"{err(c, '40'):.3f}", f"{err(c, '200'):.3f}", f"{err(c, '1000'):.3f}"])
        short, long_ = side(err(m, "40"), err(c, "200")), side(err(m, "200"), err(c, "1000"))
        rounds = side(err(m, "40"), err(c, "40"))
        per_update.append((label, short == "below" and long_ == "below"))
        per_round.append((label, rounds == "below"))
        lines.append(f"* {label}: at equal updates FedMSA's error is {short} the centralized "
                     f"run's at about 200 and {long_} it at about 1,000; at equal rounds (40) it "
                     f"is {rounds} it.")

    def verdict(results):
        held = [label for label, ok in results if ok]
        if len(held) == len(results):
            return "holds at both step settings"
        return f"holds at {listing(held)} only" if held else "does not hold at either setting"

    last = fed["algorithms"][labels[0]]["last"]
    return (recorded_line("seed001-mco") + " Centralized: " + recorded_line(
        "seed001-mco-centralized") + "\n\n" + table(
        ["steps", "FedMSA, round 0", "FedMSA, round 40 (about 200 updates)", "FedMSA, round 200",
         "FedMSA objective, round 200", "centralized, iteration 40",
         "centralized, iteration 200", "centralized, iteration 1,000"], rows)
        + "\n\nRelative errors \\|x - x*\\| / \\|x*\\| (up to sign; the CLI's `final f - f*` "
        "column shows this relative error for this problem). The objective's floor is about "
        f"lambda sqrt(delta) = {p['risk_weight'] * p['risk_delta'] ** 0.5:.3f}. FedMSA's "
        f"200 rounds cost {g3(last['sim_time_s'])} simulated seconds and "
        f"{g3(last['energy_j'])} J.\n\n" + "\n".join(lines)
        + f"\n* The paper's finding of fewer updates to converge (fedmsa.md Sec. 4.1), read as "
        f"a lower error at equal updates, {verdict(per_update)}; the spec's per-round "
        f"prediction (Sec. 5.3) {verdict(per_round)}.")


def _tuning() -> dict:
    return _json("benchmarks/seed001_loss_tuning.json")


@block("seed001-loss-tuning-table", "benchmarks/seed001_loss_tuning.json")
def seed001_loss_tuning_table() -> str:
    data = _tuning()
    groups: dict[str, list[dict]] = {}
    for r in data["records"]:
        groups.setdefault(r["label"], []).append(r)
    rows = []
    for target in data["targets"]:
        for label, g in groups.items():
            got = [r[f"to_{target:g}"] for r in g if r[f"to_{target:g}"]["rounds"] is not None]

            def med(key, got=got):
                return f"{statistics.median(r[key] for r in got):.3g}" if got else "never"

            first = target == data["targets"][0]
            rows.append([label,
                         f"{statistics.median(r['best_balanced_accuracy'] for r in g):.3f}"
                         if first else "",
                         f"{statistics.median(r['final_balanced_accuracy'] for r in g):.3f}"
                         if first else "", f"{target:g}", med("rounds"), med("exchanges"),
                         med("sim_time_s"), med("energy_j"), f"{len(got)}/{len(g)}"])
    return table(["method", "best bal. acc.", "final", "mark", "rounds", "exchanges",
                  "simulated s", "J", "n"], rows)


@block("seed001-loss-tuning-reading", "benchmarks/seed001_loss_tuning.json")
def seed001_loss_tuning_reading() -> str:
    data = _tuning()
    recs = data["records"]
    best = [r["best_balanced_accuracy"] for r in recs]
    nest = next(r["label"] for r in recs if r["algorithm"] == "fednest")
    ks = sorted({int(re.search(r"K=(\d+)", r["label"]).group(1)): r["label"]
                 for r in recs if r["algorithm"] == "fedmsa"}.items())

    def reached(target):
        return [r for r in recs if r[f"to_{target:g}"]["rounds"] is not None]

    def med(label, target, key):
        got = [r[f"to_{target:g}"][key] for r in reached(target) if r["label"] == label]
        return statistics.median(got) if got else None

    counts = "; ".join(f"the {tg:g} mark is reached by {len(reached(tg))} of {len(recs)} runs"
                       for tg in data["targets"])
    everyone = [tg for tg in data["targets"] if len(reached(tg)) == len(recs)]
    mark = max(everyone) if everyone else max(data["targets"], key=lambda tg: len(reached(tg)))
    lines = [f"* Best balanced accuracies range over {span(best, '{:.3f}')} by method and seed; "
             f"{counts}" + ("" if mark in everyone else
                            " (medians are over the runs that reach a mark)") + "."]
    fedmsa = [(k, label) for k, label in ks if med(label, mark, "exchanges") is not None]
    if fedmsa and med(nest, mark, "exchanges") is not None:
        n_ex, n_r = med(nest, mark, "exchanges"), med(nest, mark, "rounds")
        k_top, top = fedmsa[-1]
        k_best, fewest = min(fedmsa, key=lambda kl: med(kl[1], mark, "exchanges"))
        others = [f"K = {k}: {factor(n_ex, med(label, mark, 'exchanges'))}"
                  for k, label in fedmsa[:-1]]
        lines.append(
            f"* At the {mark:g} mark, FedMSA with K = {k_top} needs "
            f"{med(top, mark, 'exchanges'):g} exchanges against FedNest's {n_ex:g} "
            f"({factor(n_ex, med(top, mark, 'exchanges'))}), "
            f"{med(top, mark, 'sim_time_s'):.2f} s against {med(nest, mark, 'sim_time_s'):.2f} s "
            f"of simulated time and {med(top, mark, 'energy_j'):.2f} J against "
            f"{med(nest, mark, 'energy_j'):.2f} J"
            + (f"; {', '.join(others)} exchanges than FedNest" if others else "")
            + f". In rounds (FedNest's outer iterations, 16 exchanges each, against FedMSA's, 2 "
            f"each): FedNest {n_r:g}, FedMSA "
            + ", ".join(f"{med(label, mark, 'rounds'):g}" for _, label in fedmsa)
            + f" for K = {', '.join(str(k) for k, _ in fedmsa)}.")
        ratio_ex = n_ex / med(fewest, mark, "exchanges")
        paper = data["paper_round_ratio"]
        lines.append(
            f"* Against the paper's {paper}x fewer communication rounds than FedNest (fedmsa.md "
            f"Sec. 4.4; its rounds are exchanges): at the {mark:g} mark FedNest needs "
            f"{ratio_ex:.1f}x the exchanges of FedMSA's best K here (K = {k_best}), "
            + ("at or above" if ratio_ex >= paper else "below")
            + f" the paper's factor; counted in rounds, FedMSA with K = {k_best} needs "
            f"{than(n_r, med(fewest, mark, 'rounds'), 'rounds', 'FedNest')}.")
    if len(fedmsa) > 1:
        (k_low, low), (k_high, high) = fedmsa[0], fedmsa[-1]
        lines.append(f"* FedMSA from K = {k_low} to K = {k_high}: "
                     f"{factor(med(low, mark, 'rounds'), med(high, mark, 'rounds'))} rounds "
                     f"to {mark:g}.")
    lines.append("* " + UNTUNED)
    return "\n".join(lines)


# ---------------------------------------------------------------- benchmarks/README.md


CASE_LABELS = {
    "mlp_fedavg": "FedAvg, digits MLP 64-64-10, E = 5, b = 10",
    "cnn_fedavg": "FedAvg, seed-002 CNN, E = 5, b = 10",
    "cnn_dzofl": "DZOFL, seed-002 CNN, b = 10",
    "mlp_dzofl_n10": "DZOFL, MLP 64-64-10 (synthetic)",
    "mlp_dzofl_n100": "DZOFL, MLP",
    "mlp_dzofl_n1000": "DZOFL, MLP",
    "mlp_dzofl_n10000": "DZOFL, MLP",
    "mlp_dzofl_n1000_shared": "DZOFL, MLP, shared pool (100 sub-bands, round-robin)",
}
TARGETS = {"speedup": 8, "peak": 0.45, "overhead": 0.05}  # the vectorized-compute issue's


def _bench() -> dict:
    return _json("benchmarks/results.json")


def _cases() -> dict[str, dict]:
    return {c["case"]: c for c in _bench()["cases"]}


@block("bench-rounds-machine", "benchmarks/results.json")
def bench_rounds_machine() -> str:
    b = _bench()
    m = b["machine"]
    low = min(c["matmul_peak_gflops"] for c in b["cases"])
    return (f"Machine: `{m['platform']}`, torch {m['torch']}, {m['threads']} threads. The matmul "
            "peak is re-measured between repeats in each case's process and each fraction is "
            f"taken against the best rate that process saw ({b['matmul_peak_gflops']:.1f} GFLOP/s "
            f"best overall, {low:.1f} the lowest of the cases).")


@block("bench-rounds-cases", "benchmarks/results.json")
def bench_rounds_cases() -> str:
    rows = []
    for c in _bench()["cases"]:
        speed = c["speedup_vs_loop"]
        rows.append([CASE_LABELS.get(c["case"], c["case"]), f"{c['devices']:,}",
                     f"{1e3 * c['loop_s_per_round']:,.1f}",
                     f"{1e3 * c['wirelessfl_s_per_round']:.3g}",
                     f"{speed:.2g}x" if speed >= 10 else f"{speed:.3g}x",
                     f"{c['achieved_gflops']:.1f}", pct(c["peak_fraction"]),
                     pct(c["engine_overhead_fraction"]), f"{c['peak_rss_mb']:.0f} MB"])
    return table(["case", "N", "loop ms/round", "wirelessfl ms/round", "speed-up", "GFLOP/s",
                  "% of peak", "overhead", "peak RSS"], rows)


@block("bench-rounds-strategies", "benchmarks/results.json")
def bench_rounds_strategies() -> str:
    rows = []
    strategies = _bench()["per_device_model_strategies"]
    for model in dict.fromkeys(s["model"] for s in strategies):
        chosen = next(s for s in strategies if s["model"] == model and s["chosen"])
        vmap = next(s for s in strategies if s["model"] == model and s["strategy"] == "vmap")
        rows.append([model, str(chosen["devices"]), chosen["strategy"],
                     f"{chosen['ms_per_step']:.3g}", pct(chosen["peak_fraction"]),
                     f"{vmap['ms_per_step']:.3g}", pct(vmap["peak_fraction"])])
    return table(["model", "devices", "chosen strategy", "ms/step", "% of peak", "vmap ms/step",
                  "vmap % of peak"], rows)


@block("bench-rounds-targets", "benchmarks/results.json")
def bench_rounds_targets() -> str:
    b, c = _bench(), _cases()
    worst = max(b["cases"], key=lambda x: x["engine_overhead_fraction"])
    n10, n10k = c["mlp_dzofl_n10"], c["mlp_dzofl_n10000"]
    extra = 1e3 * (c["mlp_dzofl_n1000_shared"]["wirelessfl_s_per_round"]
                   - c["mlp_dzofl_n1000"]["wirelessfl_s_per_round"])
    return "\n".join([
        (f"* FedAvg with the digits MLP: {b['mlp_fedavg_speedup_vs_loop']:.1f}x faster than the "
        f"plain per-device loop (target {TARGETS['speedup']}x)."),
        (f"* Seed-002 CNN: FedAvg {pct(b['cnn_fedavg_peak_fraction'])} and DZOFL "
        f"{pct(b['cnn_dzofl_peak_fraction'])} of the matmul peak (target "
        f"{pct(TARGETS['peak'], 0)}), engine overhead "
        f"{pct(c['cnn_fedavg']['engine_overhead_fraction'])} and "
        f"{pct(c['cnn_dzofl']['engine_overhead_fraction'])} (target "
        f"{pct(TARGETS['overhead'], 0)})."),
        (f"* The bound FedAvg's convolution kernels set on the seed-002 CNN (the round's "
        f"convolution calls alone, on the devices' own activations, same pool): they reach "
        f"{pct(c['cnn_fedavg']['kernel_bound_fraction'])} of the peak and its round "
        f"{pct(c['cnn_fedavg']['share_of_kernel_bound'])} of that."),
        (f"* DZOFL with the MLP from {n10['devices']:,} to {n10k['devices']:,} devices: "
        f"{1e3 * n10['wirelessfl_s_per_round']:.3g} -> {1e3 * n10k['wirelessfl_s_per_round']:.3g}"
        f" ms per round, {n10k['peak_rss_mb']:.0f} MB peak RSS at {n10k['devices']:,} devices "
        "with the default chunk bound."),
        (f"* `engine_overhead_fraction` (largest over the cases, "
        f"{pct(b['engine_overhead_fraction'], 0)}) comes from the {worst['devices']}-device "
        f"`{worst['case']}` round ({1e3 * worst['wirelessfl_s_per_round']:.2g} ms of host time); "
        f"it is {pct(n10k['engine_overhead_fraction'])} at {n10k['devices']:,} devices."),
        (f"* The shared uplink pool adds {extra:.1f} ms per round at 1,000 devices (the list "
        "scheduler's heap).")])


def _speedup_block(path: str) -> str:
    d = _json(path)
    rows = [[str(r["workers"]), str(r["repeat"]), f"{r['wall_s']:.1f}",
             f"{r['runs_in_flight_mean']:.2f}", f"{r['cpu_s_all_runs']:.1f}",
             f"{r['cpus_available_before']:.2f}", f"{r['other_processes_cpus']:.2f}"]
            for r in d["results"]]
    return (f"Recorded {d['date']} (`{path}`), {d['cores']} cores.\n\n"
            + table(["workers", "repeat", "wall [s]", "runs in flight", "CPU of the runs [s]",
                     "CPUs available to this session", "CPUs used by others"], rows)
            + f"\n\n**Speed-up 2 workers vs 1: {d['speedup_best']['2']:.2f}x (best of "
            f"{d['repeats']} each), {d['speedup_median']['2']:.2f}x (median).** "
            + ("All runs identical between the sweeps." if d["identical_rounds_parquet"]
               else "Runs differ between the sweeps."))


@block("sweep-speedup-quiet", "benchmarks/sweep_speedup.json")
def sweep_speedup_quiet() -> str:
    return _speedup_block("benchmarks/sweep_speedup.json")


@block("load-speed", "benchmarks/load_speed.json")
def load_speed() -> str:
    d = _json("benchmarks/load_speed.json")
    runs = d["runs"]
    idle = ", ".join(f"{r['seconds']:.1f}" for r in runs["idle"])
    loaded = ", ".join(f"{r['seconds']:.1f}" for r in runs["loaded"])
    used = sorted({r["threads"]["used"] for r in runs["loaded"]})
    return (f"`wirelessfl run {d['scenario']}` on {d['machine']['cpus']} CPUs "
            f"({d['date'][:10]}, torch {d['machine']['torch']}), {d['repeats']} interleaved "
            f"repeats: idle {idle} s; beside {d['hogs']} busy-loop processes {loaded} s "
            f"(the loaded runs chose {', '.join(map(str, used))} thread(s)). **Median loaded / "
            f"idle: {d['ratio_loaded_to_idle']:.2f}x** (target at most "
            f"{d['target_ratio']:g}x).")


FUZZ_OUTCOMES = (("valid", "valid"), ("rejected", "rejected cleanly"), ("crashed", "crashed"),
                 ("hang", "hangs"))


@block("fuzz-scenarios", "benchmarks/fuzz_scenarios.json")
def fuzz_scenarios() -> str:
    """docs/reliability.md: the recorded fuzz run, one row per kind of input and the total."""
    d = _json("benchmarks/fuzz_scenarios.json")
    rows = [[f"`{kind}`", i0(sum(c.values())), *(i0(c.get(key, 0)) for key, _ in FUZZ_OUTCOMES)]
            for kind, c in d["by_family"].items()]
    rows.append(["all", i0(d["tried"]), *(i0(d.get(key, 0)) for key, _ in FUZZ_OUTCOMES)])
    when = f"{d['date'][:10]}, " if "date" in d else ""
    examples = f"`--examples {d['examples']}`, " if "examples" in d else ""
    seed = f"seed {d['seed']}, " if "seed" in d else ""
    if "parts" in d:  # disjoint kinds run side by side, one per core, then --combine
        took = "; ".join(f"{', '.join(p['kinds'])}: {p['seconds']:.0f} s" for p in d["parts"])
        took = f"{len(d['parts'])} processes side by side, one core each ({took})"
    else:
        took = f"{d['seconds']:.0f} s on one core"
    return (f"Recorded run ({when}{examples}{seed}`benchmarks/fuzz_scenarios.json`; "
            f"{took}; unsafe tags executed: "
            f"{d['unsafe_tags_executed']}):\n\n"
            + table(["input kind", "tried", *(name for _, name in FUZZ_OUTCOMES)], rows))


@block("sweep-speedup-contended", "benchmarks/sweep_speedup_contended.json")
def sweep_speedup_contended() -> str:
    path = "benchmarks/sweep_speedup_contended.json"
    d = _json(path)
    res = d["results"]
    others = [r["other_processes_cpus"] for r in res]
    avail = [r["cpus_available_before"] for r in res]
    inflight = [r["runs_in_flight_mean"] for r in res if r["workers"] == 2]
    cpu = {(r["workers"], r["repeat"]): r["cpu_s_all_runs"] for r in res}
    extra = [100 * (cpu[(2, k)] / cpu[(1, k)] - 1) for k in range(d["repeats"])]
    return (_speedup_block(path) + "\n\n"
            f"Other sessions kept {span(others, '{:.2f}')} CPUs busy throughout, and this session "
            f"could get {span(avail, '{:.2f}')} CPU whether it ran one process or two. With 2 "
            f"workers the executor kept {span(inflight, '{:.2f}')} runs in flight; the runs took "
            f"{span(extra, '{:.0f}')} % more CPU seconds with two workers time-sharing that CPU "
            "than with one.")


ASK_LABELS = {"shared": "shared streams, [N] masks (every recorded run)",
              "mask": "per-device streams, [N] masks", "index": "per-device streams, by index"}


@block("bench-engine", "benchmarks/bench_engine.json")
def bench_engine() -> str:
    """The engine's ms per cross-device round by population, participants and way of asking
    (benchmarks/README.md)."""
    b = _json("benchmarks/bench_engine.json")
    asks = list(dict.fromkeys(c["ask"] for c in b["cases"]))
    keys = list(dict.fromkeys((c["count"], c["devices"]) for c in b["cases"]))
    by = {(c["count"], c["devices"], c["ask"]): c for c in b["cases"]}
    rows = [[i0(count), i0(n)] + [f"{by[(count, n, a)]['median_ms']:.3g}"
                                  if (count, n, a) in by else "-" for a in asks]
            for count, n in keys]
    big = max(c["devices"] for c in b["cases"])
    held = max(c["engine_mib"] for c in b["cases"] if c["devices"] == big)
    peaks = {a: max(c["round_peak_mib"] for c in b["cases"] if c["devices"] == big
                    and c["ask"] == a) for a in asks}
    m = b["machine"]
    return (table(["asked a round", "N"] + [f"{ASK_LABELS[a]} [ms]" for a in asks], rows)
            + f"\n\nMedian host ms per round over {b['cases'][0]['rounds']} rounds after a "
            f"warm-up. At N = {big:,} the engine holds {held:.0f} MiB (tracemalloc) and a round's "
            "peak allocation is " + ", ".join(f"{peaks[a]:.2f} MiB ({a})" for a in asks)
            + f". Recorded {b['date'][:10]} on `{m['platform']}` ({m['cpus']} CPUs, load "
            f"average {m['load_average'][0]:.1f} at the end), `{b['command'].strip()}`.")


def _ms(side: dict) -> str:
    """A simulator's ms per round, or why there is none (not run, failed, timed out)."""
    value = _num(side["ms_per_round"])
    if value is None:
        return "not run" if str(side.get("error", "")).startswith("not run") else "failed"
    return f"{value:,.3g}" if value < 100 else f"{value:,.0f}"


PEERS, PEERS_BEST = "benchmarks/bench_peers.json", "benchmarks/bench_peers_best.json"


def _best_side(name: str, case: str, runs: list[dict]) -> tuple[float | None, int | None]:
    """(the smallest median ms per round of simulator NAME on CASE over the recorded thread
    settings, its thread count)."""
    best = (None, None)
    for b in runs:
        row = next((c for c in b["cases"] if c["case"] == case), None)
        ms = None if row is None else _num(row[name]["ms_per_round"])
        if ms is not None and (best[0] is None or ms < best[0]):
            best = (ms, b["machine"]["threads"][name])
    return best


def _peer_runs() -> list[dict]:
    """The recorded bench_peers runs: one thread each, then each simulator's best setting."""
    return [_json(PEERS)] + ([_json(PEERS_BEST)] if (ROOT / PEERS_BEST).exists() else [])


@block("bench-peers", PEERS, PEERS_BEST)
def bench_peers() -> str:
    """FedAvg rounds of wirelessfl and pfl-research on the same cases (benchmarks/README.md):
    one thread each, and each side at its best thread setting."""
    runs = _peer_runs()
    b = runs[0]
    head = ["case", "d", "wirelessfl ms/round", "pfl ms/round", "pfl / wirelessfl"]
    if len(runs) > 1:
        head += ["best: wirelessfl ms (threads)", "best: pfl ms (threads)", "best: pfl / wirelessfl"]
    head += ["wirelessfl peak RSS [MB]", "pfl peak RSS [MB]", "RSS ratio"]
    rows = []
    for c in b["cases"]:
        w, p = c["wirelessfl"], c["pfl"]
        speed = c["pfl_over_wirelessfl"]
        row = [c["title"], i0((c.get("facts") or {}).get("d")), _ms(w), _ms(p),
               "-" if speed is None else f"{speed:.3g}x"]
        if len(runs) > 1:
            (wm, wt), (pm, pt) = (_best_side(n, c["case"], runs) for n in ("wirelessfl", "pfl"))
            row += ["-" if wm is None else f"{wm:,.3g} ({wt})",
                    "-" if pm is None else f"{pm:,.3g} ({pt})",
                    "-" if not (wm and pm) else f"{pm / wm:.3g}x"]
        rss_w, rss_p = _num(w["peak_rss_mb"]), _num(p["peak_rss_mb"])
        row += [i0(rss_w), i0(rss_p), "-" if not (rss_w and rss_p) else f"{rss_w / rss_p:.2f}"]
        rows.append(row)
    cases = {c["case"]: c for c in b["cases"]}
    lines = [table(head, rows), ""]
    small = cases.get("mlp_synthetic_n100_k100")
    for big in ("mlp_synthetic_n1000000_k100", "mlp_synthetic_n1000000_k1000"):
        if small and big in cases and cases[big]["wirelessfl"]["ms_per_round"]:
            ratio_ = cases[big]["wirelessfl"]["ms_per_round"] / small["wirelessfl"]["ms_per_round"]
            lines.append(f"* {cases[big]['title']}: {ratio_:.2f}x the host time of a round of "
                         f"100 registered devices all taking part, "
                         f"{cases[big]['wirelessfl']['peak_rss_mb']:,.0f} MB peak RSS.")
    speeds = [c["pfl_over_wirelessfl"] for c in b["cases"] if c["pfl_over_wirelessfl"]]
    if speeds:
        lines.append(f"* wirelessfl / pfl speed, one thread each: {min(speeds):.3g}x to "
                     f"{max(speeds):.3g}x over the {len(speeds)} cases both ran.")
    for run, setting in zip(runs, ("one thread each", "both on every core")):
        rss = [c["wirelessfl"]["peak_rss_mb"] / c["pfl"]["peak_rss_mb"] for c in run["cases"]
               if c["wirelessfl"]["peak_rss_mb"] and c["pfl"]["peak_rss_mb"]]
        if rss:
            worst = max((c for c in run["cases"] if c["wirelessfl"]["peak_rss_mb"]
                         and c["pfl"]["peak_rss_mb"]),
                        key=lambda c: c["wirelessfl"]["peak_rss_mb"] / c["pfl"]["peak_rss_mb"])
            lines.append(f"* Peak RSS, wirelessfl over pfl, {setting}: {min(rss):.2f} to "
                         f"{max(rss):.2f}, the largest on {worst['title']} (target: at most 2; "
                         f"{'met' if max(rss) <= 2 else 'NOT met'}).")
    lines += _size_axis_lines(b, cases)
    for key in ("cnn_digits28_n10",):
        if key in cases and cases[key]["peak_fraction"]["wirelessfl"] is not None:
            f = cases[key]["peak_fraction"]
            lines.append(f"* {cases[key]['title']}: wirelessfl at {pct(f['wirelessfl'])} of the "
                         f"rate a large float32 matmul reached in the same process "
                         f"({b['matmul_peak_gflops']:.0f} GFLOP/s; oneDNN's convolutions can "
                         "beat it), pfl at " + ("-" if f["pfl"] is None else pct(f["pfl"])) + ".")
    for run in runs:
        m, st = run["machine"], run["settings"]
        load = m.get("load_average")
        lines.append(f"\nRecorded {run['date'][:10]} on `{m['platform']}` ({m['cpu_count']} "
                     f"CPUs), pfl {m['pfl']}, torch {m['torch']}; {st['repeats']} interleaved "
                     f"repeats a case (medians), threads: wirelessfl {m['threads']['wirelessfl']}"
                     f", pfl {m['threads']['pfl']}"
                     + (f"; load average {load[0]:.2f} before, {load[1]:.2f} after"
                        if load else "") + f"; `{run['command'].strip()}`.")
    return "\n".join(lines)


def _size_axis_lines(b: dict, cases: dict) -> list[str]:
    """The model-size axis against issue 36's targets (one thread each)."""
    sized = sorted((c for c in b["cases"] if (c.get("facts") or {}).get("d")
                    and c["case"].startswith(("mlp_size_", "mlp_synthetic_n100_k100"))),
                   key=lambda c: c["facts"]["d"])
    both = [c for c in sized if c["pfl_over_wirelessfl"]]
    if not both:
        return []
    small = [c for c in both if c["facts"]["d"] <= 100_000]
    large = [c for c in both if c["facts"]["d"] > 100_000]
    out = []
    if small:
        low = min(c["pfl_over_wirelessfl"] for c in small)
        out.append(f"* MLP with 100 clients, d up to 10^5: at least {low:.3g}x faster than pfl "
                   f"(target 3x: {'met' if low >= 3 else 'NOT met'}).")
    if large:
        low = min(c["pfl_over_wirelessfl"] for c in large)
        out.append(f"* MLP with 100 clients above d = 10^5: at least {low:.3g}x pfl's speed "
                   f"(target 1x: {'met' if low >= 1 else 'NOT met'}).")
    big = cases.get("mlp_size_d1126410")
    if big and big["peak_fraction"]["wirelessfl"] is not None:
        f = big["peak_fraction"]
        out.append(f"* {big['title']}: wirelessfl at {pct(f['wirelessfl'])} of the one-thread "
                   f"float32 matmul peak ({b['matmul_peak_gflops']:.0f} GFLOP/s), pfl at "
                   + ("-" if f["pfl"] is None else pct(f["pfl"])) + " (target 25 %: "
                   + ("met" if f["wirelessfl"] >= 0.25 else "NOT met") + ").")
    return out


@block("model-size", "benchmarks/model_size.json")
def model_size() -> str:
    """Devices' local SGD by strategy against d (benchmarks/bench_model_size.py)."""
    b = _json("benchmarks/model_size.json")
    names = ["stacked", "per-device", "plain loop"]
    rows = []
    for c in sorted(b["cases"], key=lambda c: c["d"]):
        row = [i0(c["d"]), "-".join(str(w) for w in [64, *c["hidden"], 10])]
        for name in names:
            side = c["ms"].get(name)
            best = None if side is None else side["best"]
            row.append("not run" if side is None else
                       (f"{best:.3g}" if best < 100 else f"{best:,.0f}")
                       + f" ({pct(side['peak_fraction'])})")
        row += [c["chosen"], "yes" if c["agree"] else "NO"]
        rows.append(row)
    chosen = [c["ms"]["stacked" if c["chosen"] == "stacked" else "per-device"]["best"]
              / c["ms"]["plain loop"]["best"] for c in b["cases"]]
    st = b["settings"]
    return (table(["d", "MLP", "stacked ms (% of peak)", "per-device ms (% of peak)",
                   "plain loop ms (% of peak)", "chosen", "agree"], rows)
            + f"\n\nThe chosen strategy took {min(chosen):.2f} to {max(chosen):.2f} times the "
            "plain loop's time (target: at most 1, "
            + ("met" if max(chosen) <= 1 else "NOT met") + "). "
            f"{st['devices']} devices, {st['local_steps']} steps of {st['batch_size']} samples, "
            f"best of {st['repeats']} interleaved repeats on one thread; percentages of the "
            f"one-thread float32 matmul peak ({b['matmul_peak_gflops_one_thread']:.0f} GFLOP/s, "
            f"same process). Threshold `PER_DEVICE_MIN_PARAMETERS` = "
            f"{b['per_device_min_parameters']:,}. " + _recorded_on(b))


def _recorded_on(b: dict) -> str:
    """When, where and how a benchmark record (bench_model_size's ``machine`` facts) was made."""
    m = b["machine"]
    return (f"Recorded {b['date'][:10]} on `{m['platform']}` ({m['cpu_capability']}), load "
            f"average {m['load_average_start']:.2f} at the start, {m['load_average_end']:.2f} "
            f"at the end; `{b['command'].strip()}`.")


@block("resnet", "benchmarks/resnet.json")
def resnet() -> str:
    """ResNet-18's local SGD in wirelessfl against a plain torch loop (bench_resnet.py)."""
    b = _json("benchmarks/resnet.json")
    names = [n for n in b["cases"][0]["ms"] if n != "plain loop"]
    rows = []
    for c in b["cases"]:
        plain = c["ms"]["plain loop"]
        rows.append([str(c["threads"])]
                    + [f"{c['ms'][n]['best']:,.0f} ({c['ms'][n]['best'] / plain['best']:.2f}x; "
                       f"{c['chunk_devices'][n]} a chunk)" for n in names]
                    + [f"{plain['best']:,.0f}", "yes" if c["agree"] else "NO"])
    st = b["settings"]
    return (table(["threads", *(f"{n} ms (of plain; devices)" for n in names),
                   "plain loop ms", "agree"], rows)
            + f"\n\n{st['devices']} devices, ResNet-18 (d = {st['d']:,}), "
            f"{st['local_steps']} steps of {st['batch_size']} samples each, best of "
            f"{st['repeats']} interleaved repeats. " + _recorded_on(b))


@block("gpu", "benchmarks/cuda_check.json", "benchmarks/model_size_cuda.json",
       "benchmarks/resnet_cuda.json")
def gpu() -> str:
    """The ``device: cuda`` path on a GPU: the shipped scenarios (cuda_check.py), the MLP sizes
    (bench_model_size.py --device cuda) and ResNet-18 (bench_resnet.py --device cuda)."""
    check = _json("benchmarks/cuda_check.json")
    runs = check["scenarios"]
    m = check["machine"]
    ran = [n for n, e in runs.items() if all(g["status"] == "ran" for g in e["gpu"])]
    repeatable = [n for n, e in runs.items() if e.get("gpu_repeatable")]
    world = [n for n, e in runs.items() if e.get("world_equal")]
    warned = sorted({w for e in runs.values() for g in e["gpu"] for w in g["warnings"]})
    learning = [(v["max_rel"], column, name) for name, e in runs.items()
                for t in e.get("cpu_vs_gpu", {}).values()
                for column, v in t.get("differ", {}).items() if v["learning"]]
    worst = max(learning, default=None)
    lines = [f"Shipped scenarios' short versions on `{m['gpu']}` (torch {m['torch']}, CUDA "
             f"{m['cuda']}), recorded {check['date'][:10]}: {len(ran)} of {len(runs)} ran; the "
             f"two GPU runs of {len(repeatable)} of {len(runs)} gave identical tables; the "
             f"simulated world (every column but the learning ones) equal to the CPU run's in "
             f"{len(world)} of {len(runs)}"
             + (f"; the learning columns within {worst[0]:.2g} relative of the CPU run's (the "
                f"largest: `{worst[1]}` in `{worst[2]}`)" if worst else "")
             + "; torch warnings: " + ("none" if not warned else "; ".join(warned)) + "."]
    size = _json("benchmarks/model_size_cuda.json")
    rows = []
    for c in sorted(size["cases"], key=lambda c: c["d"]):
        rows.append([i0(c["d"]), "-".join(str(w) for w in [64, *c["hidden"], 10])]
                    + [f"{c['ms'][n]['best']:,.3g}" if c["ms"][n]["best"] < 100
                       else f"{c['ms'][n]['best']:,.0f}"
                       for n in ("stacked", "per-device", "plain loop")]
                    + [c["chosen"], "yes" if c["agree"] else "NO"])
    chosen = [c["ms"]["stacked" if c["chosen"] == "stacked" else "per-device"]["best"]
              / c["ms"]["plain loop"]["best"] for c in size["cases"]]
    st = size["settings"]
    res = _json("benchmarks/resnet_cuda.json")
    rc = res["cases"][0]
    plain = rc["ms"]["plain loop"]["best"]
    ours = {n: rc["ms"][n]["best"] for n in rc["ms"] if n != "plain loop"}
    return ("\n".join(lines) + "\n\n"
            + table(["d", "MLP", "stacked ms", "per-device ms", "plain loop ms", "chosen",
                     "agree"], rows)
            + f"\n\nMLP sizes on the GPU ({st['devices']} devices, {st['local_steps']} steps of "
            f"{st['batch_size']} samples, best of {st['repeats']} interleaved repeats): the "
            f"chosen strategy took {min(chosen):.3f} to {max(chosen):.3f} times the plain loop's "
            f"time. ResNet-18 (d = {res['settings']['d']:,}, {res['settings']['devices']} "
            f"devices, {res['settings']['local_steps']} steps of {res['settings']['batch_size']}"
            f" samples): " + ", ".join(f"{n} {v:,.0f} ms ({plain / v:.2f}x the plain loop's "
                                       f"speed)" for n, v in ours.items())
            + f", plain loop {plain:,.0f} ms, agree: {'yes' if rc['agree'] else 'NO'}. "
            f"Recorded {size['date'][:10]} and {res['date'][:10]}; `{size['command'].strip()}`,"
            f" `{res['command'].strip()}`, `{check['command'].strip()}`.")


@block("lockstep", "benchmarks/lockstep.json")
def lockstep() -> str:
    """Tuning studies before issue 36's last change, alone and in lockstep (bench_lockstep.py)."""
    b = _json("benchmarks/lockstep.json")
    def samples(times: list[float]) -> str:
        return " / ".join(f"{t:,.0f}" for t in times)

    rows = [[f"`{c['command']}`", samples(c["before_samples_s"]), samples(c["alone_samples_s"]),
             samples(c["lockstep_samples_s"]), f"{c['speedup_over_before']:.2f}x",
             f"{c['speedup']:.2f}x",
             "identical" if not c["differing_tables"] else
             "DIFFER: " + ", ".join(c["differing_tables"])]
            for c in b["cases"]]
    tables = sum(len(c["tables"]) for c in b["cases"])
    ce = b["cross_entropy_us"]
    return (table(["study", f"before ({b['before']['revision']}), every point alone s",
                   "now, every point alone (`--no-lockstep`) s", "now, in lockstep s",
                   "lockstep faster than before", "lockstep faster than alone", "tables"], rows)
            + f"\n\nWall seconds of each command, reports included, on {b['workers']} worker "
            "processes, the three sides run in turn (before, alone, lockstep, before, ...); "
            "faster: best against best; "
            f"the {tables} tables the studies write compared byte for byte across every run of "
            f"all three sides. One lane's cross-entropy (500 logits of 10 classes): "
            f"{ce['default']:.0f} us with this host's torch kernel, {ce['avx2']:.0f} us with "
            f"the AVX2 ones, {ce['sample_cross_entropy']:.0f} us through "
            "`sample_cross_entropy` (this host's bits). " + _recorded_on(b))


@block("memory-estimate", "benchmarks/memory_estimate.json")
def memory_estimate() -> str:
    """The pre-run memory estimate against each family's measured peak (docs/reliability.md)."""
    m = _json("benchmarks/memory_estimate.json")
    rows = [[c["family"] + " (" + ", ".join(c["algorithms"]) + ")", i0(c["num_devices"]),
             i0(c["d"]), f"{c['baseline_mb']:,.0f}", f"{c['peak_rss_mb']:,.0f}",
             f"{c['measured_mb']:,.0f}", f"{c['estimate_mb']:,.0f}", f"{c['ratio']:.2f}"]
            for c in m["cases"]]
    low, high = m["target"]
    ref = m["refusal"]
    return (table(["family (algorithms)", "N", "d", "baseline [MB]", "peak RSS [MB]",
                   "measured [MB]", "estimate [MB]", "estimate / measured"], rows)
            + f"\n\nEvery ratio is between {m['min_ratio']:.2f} and {m['max_ratio']:.2f} "
            f"(target {low}-{high}: {'met' if m['all_within'] else 'NOT met'}). Recorded "
            f"{m['date'][:10]} on `{m['machine']['platform']}` ({m['machine']['cpus']} CPUs, "
            f"{m['machine']['memory_total_gb']:g} GB), `{m['command'].strip()}`. "
            f"`num_devices: 1000000000` is refused by the check in "
            f"{ref['check_seconds'] * 1000:.0f} ms; `validate` and `run` exit with code "
            f"{ref['validate']['exit_code']} and {ref['run']['exit_code']}, one `error:` line "
            f"each, no run folder, in {ref['validate']['wall_seconds']:.1f} and "
            f"{ref['run']['wall_seconds']:.1f} s of wall time; that is the interpreter starting "
            f"and importing torch (a bare `import wirelessfl.cli, torch` took "
            f"{ref['import_wall_seconds']:.1f} s in the same minutes on this shared machine), "
            "not the check.")


# ---------------------------------------------------------------- rendering


def render(text: str) -> tuple[str, list[str]]:
    """TEXT with every generated block re-rendered, and the names of the blocks found."""
    out, names, pos = [], [], 0
    for match in START.finditer(text):
        if match.start() < pos:
            continue
        name = match["name"]
        if name not in BLOCKS:
            raise KeyError(f"unknown generated block {name!r}")
        end = text.find("\n" + END, match.end())
        if end < 0:
            raise ValueError(f"block {name!r} has no '{END}'")
        sources, fn = BLOCKS[name]
        out.append(text[pos:match.start()])
        out.append(f"<!-- generated: {name} (from {', '.join(sources)}) -->\n{fn().rstrip()}\n")
        names.append(name)
        pos = end + 1
    out.append(text[pos:])
    return "".join(out), names


def blocks(text: str) -> dict[str, str]:
    """name -> the text of each generated block of TEXT (markers included)."""
    found = {}
    for match in START.finditer(text):
        end = text.find("\n" + END, match.end())
        found[match["name"]] = text[match.start():end + 1 + len(END)]
    return found


def check(texts: dict[Path, str] | None = None) -> list[str]:
    """'doc: block' for every block whose text differs from its files (TEXTS: a doc's text to
    check instead of the file's); every registered block must appear in exactly one doc."""
    problems, seen = [], []
    for doc in DOCS:
        text = (texts or {}).get(doc) or doc.read_text()
        new, names = render(text)
        seen += names
        old_blocks, new_blocks = blocks(text), blocks(new)
        problems += [f"{doc.relative_to(ROOT)}: {name}" for name in names
                     if old_blocks.get(name) != new_blocks.get(name)]
    problems += [f"block {name} appears {seen.count(name)} times" for name in BLOCKS
                 if seen.count(name) != 1]
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="report the blocks that differ from their files; change nothing")
    args = parser.parse_args(argv)
    if args.check:
        problems = check()
        for line in problems:
            print("differs:", line)
        return 1 if problems else 0
    for doc in DOCS:
        text = doc.read_text()
        new, names = render(text)
        if new != text:
            doc.write_text(new)
        print(f"{doc.relative_to(ROOT)}: {len(names)} blocks")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
