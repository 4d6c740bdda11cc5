"""Figures of a tuning study: per algorithm, the objective (mean over the tuning seeds) of every
configuration against each tuned parameter, the choice marked, configurations that missed the
target or were unhealthy drawn apart along the top edge."""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib.ticker
import numpy as np
import pandas as pd

from wirelessfl.report.colours import algorithm_colours, scenario_entries
from wirelessfl.report.plots import literal, new_figure, save_figure

# A tuned numeric parameter with at most this many values gets a tick at each of them [D]
# (an integer parameter such as local_steps would otherwise read 1.0, 1.5, 2.0, ...).
MAX_VALUE_TICKS = 8


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.+-]+", "-", text).strip("-") or "algorithm"


def _category(value):
    """A categorical axis' key of a value: null (the parameter's default rule, which a table
    holds as NaN or None) is one category, the others themselves."""
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return None
    return value


def _log_axis(info: dict) -> bool:
    """A log axis for log ranges, and for positive numeric lists spanning 20x or more."""
    values = info["values"]
    if info["kind"] == "log":
        return True
    numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
    return numeric and min(values) > 0 and max(values) / min(values) >= 20


def tuning_figure(label: str, rows: pd.DataFrame, spaces: dict[str, dict], title: str,
                  path: Path, colour: str = "#4c72b0") -> Path:
    """One panel per tuned parameter of ``label``: ``rows`` are its configurations (columns
    value_mean, healthy, reached, seeds, chosen and one per parameter), drawn in ``colour``
    (the algorithm's colour in the run and comparison figures)."""
    params = list(spaces)
    fig = new_figure((4.2 * len(params) + 0.6, 3.8), 100)
    axes = fig.subplots(1, len(params), squeeze=False)
    scored = rows[np.isfinite(rows.value_mean.to_numpy(dtype=float)) & (rows.healthy == rows.seeds)]
    missed = rows.drop(scored.index)
    finite = scored.value_mean.to_numpy(dtype=float)
    top = float(finite.max()) if len(finite) else 1.0
    bottom = float(finite.min()) if len(finite) else 0.0
    log_y = len(finite) and bottom > 0 and top / bottom > 30
    ceiling = top * (1.6 if log_y else 1.0) + (0.0 if log_y else 0.12 * (top - bottom or 1.0))
    for ax, param in zip(axes[0], params):
        info = spaces[param]
        numeric = all(isinstance(v, int | float) and not isinstance(v, bool)
                      for v in info["values"])
        order = {_category(v): i for i, v in enumerate(info["values"])}

        def xs(frame, param=param, numeric=numeric, order=order):
            return (frame[param].to_numpy(dtype=float) if numeric
                    else np.array([order[_category(v)] for v in frame[param]], dtype=float))

        ax.scatter(xs(scored), scored.value_mean, s=22, color=colour, alpha=0.8,
                   label="configurations")
        # the marks other than the algorithm's points are black and grey, never a colour: an
        # orange star or a red cross would read as FedSGD or FedProx (report/colours.py)
        if len(missed):
            ax.scatter(xs(missed), np.full(len(missed), ceiling), s=30, marker="x",
                       color="0.35", label="missed target or unhealthy")
        chosen = rows[rows.chosen]
        if len(chosen) and len(scored.index.intersection(chosen.index)):
            ax.scatter(xs(chosen), chosen.value_mean, s=180, marker="*", color=colour,
                       edgecolor="black", linewidths=0.8, zorder=3, label="chosen")
        elif len(chosen):
            ax.scatter(xs(chosen), np.full(len(chosen), ceiling), s=180, marker="*",
                       color=colour, edgecolor="black", linewidths=0.8, zorder=3,
                       label="chosen")
        if _log_axis(info):
            ax.set_xscale("log")
        if not numeric:  # categorical: the values by name at 0, 1, ...
            ax.set_xticks(range(len(info["values"])))
            ax.set_xticklabels(["default" if v is None else literal(v)
                                for v in info["values"]])
            ax.set_xlim(-0.5, len(info["values"]) - 0.5)
        elif len(info["values"]) <= MAX_VALUE_TICKS:  # the values tried, as written
            values = sorted(set(info["values"]))
            ax.set_xticks(values, [f"{v:g}" for v in values])
            ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        if log_y:
            ax.set_yscale("log")
        ax.set_xlabel(param)
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel(f"{title}\n(mean over tuning seeds)")
    axes[0][0].legend(fontsize="small", loc="best")  # where it covers the fewest points
    fig.suptitle(f"{label}: tuning", fontsize="medium")
    return save_figure(fig, path, 110)


def draw_tuning(tune, table: pd.DataFrame, out_dir: Path) -> list[Path]:
    """``tune_<label>.png`` for every tuned algorithm of ``tune`` (a wirelessfl.tune.spec.Tune)."""
    paths = []
    entries = [{"name": e} if isinstance(e, str) else e for e in tune.base.get("algorithms", [])]
    colours = algorithm_colours(scenario_entries({"scenario": {"algorithms": entries}}),
                                tune.labels, tune.spaces)
    for label, spaces in tune.spaces.items():
        rows = table[table.algorithm == label]
        if rows.empty:
            continue
        path = Path(out_dir) / f"tune_{_slug(label)}.png"
        paths.append(tuning_figure(label, rows, spaces, tune.objective.title, path,
                                   colours[label]))
    return paths
