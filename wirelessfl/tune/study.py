"""A tuning study from start to its folder: every configuration on the tuning seeds (a sweep), the
choice per algorithm, then the chosen and the untuned settings on fresh evaluation seeds (a second
sweep) and their comparison with 95 % confidence intervals.

Both phases are sweep folders (``tuning/`` and ``evaluation/``) run by the sweep machinery, so a
study runs on the local or the Dask executor with the same numbers and resumes like a sweep: the
same command again skips finished runs.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd

from wirelessfl.pipeline.preflight import check_runs
from wirelessfl.results.compare import mean_ci
from wirelessfl.results.records import package_versions, read_run, write_csv, write_json
from wirelessfl.results.summary import summarize
from wirelessfl.sweep.spec import Sweep, SweepFile, SweepPoint, run_id
from wirelessfl.sweep.study import RUNS, SweepCounts, run_sweep
from wirelessfl.tune.objectives import score
from wirelessfl.tune.select import (
    choice_warnings,
    edge_warnings,
    grid_neighbours,
    summarize_configurations,
)
from wirelessfl.tune.spec import UNTUNED_SUFFIX, Tune, tied

MANIFEST = "tune.json"
TUNING, EVALUATION = "tuning", "evaluation"
# Columns of the evaluation table that every objective reports beside its own.
STANDARD = (("energy_to_target_j", "energy to target [J]"),
            ("system_energy_to_target_j", "system energy to target [J]"),
            ("time_to_target_s", "time to target [s]"),
            ("final_accuracy", "final accuracy"), ("energy_j", "energy, whole run [J]"))


@dataclass
class TuneResult:
    """What a finished study holds (also written to its folder). Data only: the figures and the
    HTML page are report/'s, drawn by the caller from this (report/tune_plots.py, tune_html.py)."""

    out: Path
    tuning: pd.DataFrame  # one row per configuration, ranked per algorithm
    choices: dict[str, dict]  # label -> chosen parameter values
    evaluation: pd.DataFrame  # one row per evaluated setting (tuned and untuned)
    verdict: str
    warnings: list[str] = field(default_factory=list)
    counts: dict[str, SweepCounts] = field(default_factory=dict)
    # (setting, seed, outcome) of every evaluation run: what claims are judged from
    evaluated: list[tuple[dict, int, dict]] = field(default_factory=list)


def _phase_sweep(tune: Tune, phase: str, plan: list[tuple[dict, dict, int]]) -> Sweep:
    """A sweep of ``plan`` = [(values shown in the run table, scenario, seed)]."""
    keys = list(dict.fromkeys(k for values, _, _ in plan for k in values))
    points = [SweepPoint(run_id(values, seed, {k: k for k in values}), seed, values, scenario)
              for values, scenario, seed in plan]
    seeds = tune.spec.tuning_seeds if phase == TUNING else tune.spec.evaluation_seeds
    spec = SweepFile.model_construct(name=f"{tune.name}-{phase}", scenario=str(tune.base_path),
                                     set=tune.spec.set, grid=None,
                                     points=[v for v, _, _ in plan], seeds=seeds)
    return Sweep(tune.path, f"{tune.name}: {phase}", spec, keys, points,
                 {"tune": tune.document, "phase": phase})


def tuning_plan(tune: Tune) -> list[tuple[dict, dict, int, object]]:
    """Every (values, scenario, seed, configuration) of the tuning phase, scenarios validated."""
    plan = []
    for label in tune.labels:
        for config in tune.grids.get(label, []):
            for seed in tune.spec.tuning_seeds:
                where = f"search.{label} (configuration {config.axes})"
                scenario = tune.scenario(label, config.values, seed, where=where,
                                         stop_at_target=tune.stop_tuning_at_target,
                                         stop_when_unhealthy=tune.spec.stop_when_unhealthy)
                plan.append(({"algorithm": label, **config.values}, scenario, seed, config))
    return plan


def evaluation_plan(tune: Tune, choices: dict[str, dict]) -> list[tuple[dict, dict, int, dict]]:
    """Every (values, scenario, seed, setting) of the evaluation phase: each tuned algorithm at
    its choice and, with ``compare_untuned`` (or when it was not tuned), at the scenario's own
    setting labelled '<label> (untuned)'."""
    settings = []
    for label in tune.labels:
        if label in choices:
            settings.append((label, label, choices[label], True))
        if label not in choices or tune.spec.compare_untuned:
            settings.append((label, label + UNTUNED_SUFFIX, {}, False))
    plan = []
    for label, shown, values, tuned in settings:
        for seed in tune.spec.evaluation_seeds:
            scenario = tune.scenario(label, values, seed, shown,
                                     where=f"evaluation of {shown}")
            setting = {"algorithm": shown, "base": label, "tuned": tuned, "values": values}
            plan.append(({"algorithm": shown}, scenario, seed, setting))
    return plan


def check_study(tune: Tune, plan: list | None = None) -> tuple[list[str], int, int]:
    """The pre-run checks (pipeline/preflight.py ``check_runs``: ``check_runnable`` and the
    memory estimate) of every distinct scenario the study will run: each tuning configuration
    (``plan``, default ``tuning_plan``) and the evaluation's settings (a tuned one is one of the
    configurations; the untuned ones where they are evaluated). ``run_tune`` calls it before
    the first run, so a study whose runs would be refused (FedMSA on a classifier, a run that
    does not fit) is refused whole, in one line, instead of ranking refused runs as unhealthy;
    ``wirelessfl validate`` calls it on a tune file. Returns (warnings, tuning runs, evaluation
    runs)."""
    plan = tuning_plan(tune) if plan is None else plan
    any_choice = {label: grid[0].values for label, grid in tune.grids.items()}
    evaluations = evaluation_plan(tune, any_choice)
    warnings = check_runs([(f"search {values}", scenario) for values, scenario, *_ in plan]
                          + [(f"evaluation of {setting['algorithm']}", scenario)
                             for _, scenario, _, setting in evaluations],
                          str(tune.path))
    return warnings, len(plan), len(evaluations)


def _outcome(folder: Path, entry: dict, label: str, tune: Tune) -> dict:
    """The score and health of one finished (or failed) run of the algorithm ``label``."""
    if entry.get("status") not in ("complete", "partial"):
        why = entry.get("message") or entry.get("status")
        return {"value": math.nan, "reached": False, "closeness": math.nan, "healthy": False,
                "health": f"run failed: {why}", "rounds": None}
    record = read_run(folder)
    rounds = record.rounds[record.rounds.algorithm == label]
    scenario = record.manifest.get("scenario", {})
    targets = (record.target_accuracy, record.target_suboptimality, record.target_loss,
               record.target_grad_norm_sq, record.target_worst_device_accuracy)
    n = scenario.get("population", {}).get("num_devices", 1)
    row = (summarize(rounds, targets[0], n, targets[1], manifest=record.manifest).iloc[0]
           if len(rounds) else None)
    info = record.manifest.get("algorithms", {}).get(label, {})
    healthy = bool(row.get("healthy", True)) if row is not None else False
    health = str(row.get("health", "ok")) if row is not None else "no evaluated rounds"
    if info.get("status") == "diverged":
        healthy, health = False, f"diverged: {info.get('message', '')}".strip()
    result = score(tune.objective, rounds, *targets)
    result.update(healthy=healthy, health=health, rounds=rounds, summary=row, targets=targets,
                  run=str(folder))
    return result


def _entries(out: Path) -> dict[str, dict]:
    runs = json.loads((out / "sweep.json").read_text()).get("runs", [])
    return {r["run"]: r for r in runs}


def run_tune(tune: Tune, out: Path, executor: str, workers: int, address: str | None = None,
             quiet: bool = False, **sweep_options) -> TuneResult:
    """Run (or finish) the study ``tune`` into ``out``; ``sweep_options`` go to each phase's
    ``run_sweep`` (e.g. threads)."""
    out = Path(out)
    objective = tune.objective
    plan = tuning_plan(tune)  # every configuration's scenario is validated
    if address is None:  # runs on this machine: both phases' pre-run checks before the first run
        check_study(tune, plan)
    counts = {TUNING: run_sweep(_phase_sweep(tune, TUNING, [p[:3] for p in plan]),
                                out / TUNING, executor, workers, address, quiet,
                                **sweep_options)}
    entries = _entries(out / TUNING)
    rows = []
    for values, _, seed, config in plan:
        rid = run_id(values, seed, {k: k for k in values})
        got = _outcome(out / TUNING / RUNS / rid, entries.get(rid, {}), config.algorithm, tune)
        rows.append({"algorithm": config.algorithm, "config": config.index, "seed": seed,
                     "run": rid, **{k: got[k] for k in ("value", "reached", "closeness",
                                                        "healthy", "health")}})
    outcomes = pd.DataFrame(rows)
    neighbours = None
    if tune.spec.stability_margin:  # along the search keys: a tied key is one axis
        neighbours = {label: grid_neighbours([c.axes for c in grid], tune.spaces[label])
                      for label, grid in tune.grids.items()}
    table = summarize_configurations(outcomes, objective, neighbours)
    configs = {c.key: c for grid in tune.grids.values() for c in grid}
    # one column per search key (a tied key once, named 'beta1=beta2'), as the figures and the
    # tables of every configuration show them
    names = list(dict.fromkeys(p for grid in tune.spaces.values() for p in grid))
    for name in names:
        table[name] = [configs[f"{a}#{c}"].axes.get(name)
                       for a, c in zip(table.algorithm, table.config)]
    choices, warnings = {}, []
    for label in tune.labels:
        mine = table[(table.algorithm == label) & table.chosen]
        if mine.empty:
            continue
        best = mine.iloc[0]
        chosen = configs[f"{label}#{best.config}"]
        choices[label] = chosen.values  # every parameter a run sets, a tied key's on each
        warnings += choice_warnings(label, best, objective)
        warnings += edge_warnings(label, chosen.axes, tune.spaces[label])

    eval_plan = evaluation_plan(tune, choices)
    counts[EVALUATION] = run_sweep(_phase_sweep(tune, EVALUATION, [p[:3] for p in eval_plan]),
                                   out / EVALUATION, executor, workers, address, quiet,
                                   **sweep_options)
    entries = _entries(out / EVALUATION)
    scored = []
    for values, _, seed, setting in eval_plan:
        rid = run_id(values, seed, {k: k for k in values})
        got = _outcome(out / EVALUATION / RUNS / rid, entries.get(rid, {}),
                       setting["algorithm"], tune)
        scored.append((setting, seed, got))
    evaluation = evaluation_table(tune, scored)
    verdict = decide(evaluation, objective)
    result = TuneResult(out, table, choices, evaluation, verdict, warnings, counts,
                        evaluated=scored)
    write_outputs(tune, result, outcomes)
    return result


def evaluation_table(tune: Tune, scored: list[tuple[dict, int, dict]]) -> pd.DataFrame:
    """One row per evaluated setting: mean and 95 % CI half-width over the evaluation seeds of
    the objective (over the seeds that reached the target, for a to-target objective) and of
    the standard columns, with the counts of seeds that reached the target and stayed healthy."""
    groups: dict[str, list] = {}
    for setting, seed, got in scored:
        groups.setdefault(setting["algorithm"], []).append((setting, seed, got))
    rows = []
    for shown, items in groups.items():
        setting = items[0][0]
        entry = tune.entry(setting["base"])
        used = {k: setting["values"].get(k, entry.get(k))
                for axis, info in tune.spaces.get(setting["base"], {}).items()
                for k in tied(axis, info)}
        got = [g for _, _, g in items]
        values = [g["value"] for g in got if g["reached"]]
        mean, half, _ = mean_ci(values)
        row = {"algorithm": shown, "base": setting["base"], "tuned": setting["tuned"],
               "parameters": json.dumps(used, sort_keys=False), "seeds": len(got),
               "reached": sum(g["reached"] for g in got),
               "healthy": sum(g["healthy"] for g in got),
               "objective_mean": mean, "objective_ci95": half,
               "health": "; ".join(sorted({g["health"] for g in got if not g["healthy"]}))
               or "ok"}
        for column, _ in STANDARD:
            series = [float(g["summary"][column]) if g.get("summary") is not None else math.nan
                      for g in got]
            row[column], row[f"{column}_ci95"], _ = mean_ci(series)
        rows.append(row)
    return pd.DataFrame(rows)


def decide(evaluation: pd.DataFrame, objective) -> str:
    """One sentence: which tuned setting scored best on the evaluation seeds, and whether its
    95 % interval clears the runner-up's (else: inconclusive)."""
    eligible = evaluation[evaluation.tuned & (evaluation.healthy == evaluation.seeds)]
    if objective.to_target:
        eligible = eligible[eligible.reached == eligible.seeds]
    eligible = eligible[[math.isfinite(v) for v in eligible.objective_mean]]
    if eligible.empty:
        return (f"no verdict: no tuned setting was healthy and scored on every evaluation seed "
                f"({objective.title})")
    order = eligible.assign(k=objective.sign * eligible.objective_mean).sort_values("k")
    best = order.iloc[0]
    untuned = sorted(set(evaluation.base) - set(evaluation.base[evaluation.tuned]))
    note = (f"; not tuned, so not in the verdict: {', '.join(untuned)}" if untuned else "")
    text = f"{objective.title}: {best.algorithm} {_pm(best.objective_mean, best.objective_ci95)}"
    if len(order) == 1:
        return f"{text}: the only tuned setting that qualified{note}"
    second = order.iloc[1]
    half_a = best.objective_ci95 if math.isfinite(best.objective_ci95) else 0.0
    half_b = second.objective_ci95 if math.isfinite(second.objective_ci95) else 0.0
    separated = objective.sign * (second.objective_mean - best.objective_mean) > half_a + half_b
    runner = f"{second.algorithm} {_pm(second.objective_mean, second.objective_ci95)}"
    if separated:
        return f"winner on {text}; runner-up {runner}; the 95 % intervals do not overlap{note}"
    return f"inconclusive on {text} against {runner}: the 95 % intervals overlap{note}"


def _pm(mean: float, half: float) -> str:
    if not math.isfinite(mean):
        return "-"
    return f"{mean:.4g}" + (f" ± {half:.3g}" if math.isfinite(half) else "")


def write_outputs(tune: Tune, result: TuneResult, outcomes: pd.DataFrame) -> None:
    """tune.json, tuning.csv, tuning_runs.csv and evaluation.csv (the figures beside them are
    report/tune_plots.py's ``draw_tuning``, called on the result)."""
    out = result.out
    write_csv(out / "tuning.csv", result.tuning)
    write_csv(out / "tuning_runs.csv", outcomes)
    write_csv(out / "evaluation.csv", result.evaluation)
    write_json(out / MANIFEST, {
        "name": tune.name, "file": str(tune.path), "tune": tune.document,
        "objective": tune.spec.objective, "tuning_seeds": tune.spec.tuning_seeds,
        "evaluation_seeds": tune.spec.evaluation_seeds,
        "search": {label: {p: info["values"] for p, info in spaces.items()}
                   for label, spaces in tune.spaces.items()},
        "choices": result.choices, "warnings": result.warnings, "verdict": result.verdict,
        "runs": {phase: {"total": c.total, "failed": c.failed} for phase, c in
                 result.counts.items()},
        "versions": package_versions(),
        "updated_at": datetime.now(UTC).isoformat(timespec="seconds")})
