"""From the tuning runs' scores to one chosen configuration per algorithm.

Each configuration is summarised over its tuning seeds and ranked (docs/tuning.md):

1. configurations healthy on every seed before any that was unhealthy, diverged or failed on one;
   with the tune file's ``stability_margin``, then those whose grid neighbours (one step along
   one numeric parameter: ``grid_neighbours``) were healthy on every seed too, so the choice
   is never a setting one grid step from divergence [D];
2. for a to-target objective, those that reached the target on more seeds first;
3. then by the objective's mean over the seeds (when it reached the target on all of them);
4. then by how close they came to the target (mean best accuracy, or -log10 of the best f - f*);
5. ties keep grid order.

The best-ranked configuration is the choice. A choice at the smallest or largest value tried of a
numeric parameter is warned about: the best may lie beyond the grid.
"""

from __future__ import annotations

import math

import pandas as pd

from wirelessfl.results.compare import mean_ci
from wirelessfl.tune.objectives import Objective
from wirelessfl.tune.spec import axis_value, tied


def grid_neighbours(grid: list[dict], spaces: dict[str, dict]) -> dict[int, list[int]]:
    """For each configuration of one algorithm's grid (its value of each search key, in grid
    order: a configuration's ``axes``), the indices of those one step away: the same values but
    one numeric key's, which is the next smaller or larger value tried (a tied key is one
    axis). Non-numeric keys make no neighbours."""
    steps = {}
    for param, info in spaces.items():
        values = info["values"]
        if all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
            ordered = sorted(values)
            steps[param] = {v: {ordered[i - 1] if i else None,
                                ordered[i + 1] if i + 1 < len(ordered) else None} - {None}
                            for i, v in enumerate(ordered)}
    where = {tuple(sorted(values.items())): index for index, values in enumerate(grid)}
    out = {}
    for index, values in enumerate(grid):
        near = []
        for param, adjacent in steps.items():
            for other in sorted(adjacent[values[param]]):
                key = tuple(sorted({**values, param: other}.items()))
                if key in where:
                    near.append(where[key])
        out[index] = sorted(near)
    return out


def summarize_configurations(outcomes: pd.DataFrame, objective: Objective,
                             neighbours: dict[str, dict[int, list[int]]] | None = None
                             ) -> pd.DataFrame:
    """One row per (algorithm, configuration) of ``outcomes`` (one row per tuning run with
    columns algorithm, config, seed, value, reached, closeness, healthy, health), with
    ``seeds``, ``reached``, ``healthy``, ``value_mean``, ``value_ci95``, ``closeness_mean``,
    ``rank`` (1 = best within its algorithm) and ``chosen``. With ``neighbours`` (algorithm ->
    ``grid_neighbours``: the stability margin), also ``margin``: the configuration and every
    grid neighbour were healthy on every seed, which ranks right after its own health."""
    rows = []
    for (algorithm, config), group in outcomes.groupby(["algorithm", "config"], sort=False):
        n = len(group)
        reached = int(group.reached.sum())
        healthy = int(group.healthy.sum())
        values = group.value[group.reached]
        mean, half, _ = mean_ci(values)
        if objective.to_target and reached < n:
            mean, half = math.nan, math.nan  # a mean over the lucky seeds would flatter it
        near = [c for c in group.closeness if isinstance(c, int | float) and math.isfinite(c)]
        problems = sorted({h for h, ok in zip(group.health, group.healthy) if not ok and h})
        rows.append({"algorithm": algorithm, "config": config, "seeds": n, "reached": reached,
                     "healthy": healthy, "value_mean": mean, "value_ci95": half,
                     "closeness_mean": sum(near) / len(near) if near else math.nan,
                     "health": "; ".join(problems) if problems else "ok"})
    table = pd.DataFrame(rows)
    if table.empty:
        return table.assign(rank=[], chosen=[])
    if neighbours is not None:
        sound = {(a, c) for a, c, h, n in zip(table.algorithm, table.config, table.healthy,
                                              table.seeds) if h == n}
        table["margin"] = [(a, c) in sound and all((a, other) in sound
                                                   for other in neighbours.get(a, {}).get(c, []))
                           for a, c in zip(table.algorithm, table.config)]
    table["sort_key"] = [rank_key(r, objective) for r in table.itertuples()]
    ranked = []
    for _, group in table.groupby("algorithm", sort=False):
        group = group.sort_values("sort_key", kind="stable")
        group["rank"] = range(1, len(group) + 1)
        ranked.append(group)
    table = pd.concat(ranked).sort_values(["algorithm", "config"], kind="stable")
    table["chosen"] = table["rank"] == 1
    return table.drop(columns="sort_key").reset_index(drop=True)


def rank_key(row, objective: Objective) -> tuple:
    """The sorting key of one configuration's summary row (smaller ranks first)."""
    unhealthy = 0 if row.healthy == row.seeds else 1
    no_margin = 0 if getattr(row, "margin", True) else 1
    reached_share = row.reached / row.seeds if objective.to_target else 0.0
    value = objective.sign * row.value_mean if math.isfinite(row.value_mean) else math.inf
    near = row.closeness_mean if math.isfinite(row.closeness_mean) else -math.inf
    return (unhealthy, no_margin, -reached_share, value, -near, row.config)


def edge_warnings(label: str, chosen: dict, spaces: dict[str, dict]) -> list[str]:
    """One warning per numeric search key whose chosen value is the smallest or largest tried;
    ``chosen`` holds the value of each key (or of each parameter, tied keys expanded). A tied
    key names all its parameters: 'beta1 = beta2 = 0.5 is the largest value tried'."""
    out = []
    for param, info in spaces.items():
        values = info["values"]
        numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
        if not numeric or len(values) < 2:
            continue
        value, lo, hi = axis_value(chosen, param, info), min(values), max(values)
        if value in (lo, hi):
            end = "smallest" if value == lo else "largest"
            names = " = ".join(tied(param, info))
            out.append(f"{label}: {names} = {value:g} is the {end} value tried ({lo:g} to "
                       f"{hi:g}); the best may lie beyond it: widen the grid")
    return out


def choice_warnings(label: str, row, objective: Objective) -> list[str]:
    """Warnings about the chosen configuration itself: unhealthy, or short of the target."""
    out = []
    if row.healthy < row.seeds:
        out.append(f"{label}: every configuration was unhealthy on some tuning seed ({row.health});"
                   " the choice is the least bad: change the grid")
    if row.healthy == row.seeds and not getattr(row, "margin", True):
        out.append(f"{label}: every configuration healthy on the tuning seeds had a grid "
                   "neighbour that was not (stability_margin); the choice may sit one step from "
                   "divergence: add smaller values")
    if objective.to_target and row.reached < row.seeds:
        out.append(f"{label}: no configuration reached the target on every tuning seed "
                   f"(the choice reached it on {row.reached} of {row.seeds}); give it more "
                   "rounds or widen the grid")
    return out
