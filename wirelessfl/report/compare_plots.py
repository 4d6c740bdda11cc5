"""Figures of a comparison across configurations (results/compare.py), from run folders alone:
accuracy against energy and against simulated time with 95 % bands over seeds, energy to the
target against each swept parameter, and the energy/accuracy Pareto front. Each figure is a
function returning a ``matplotlib.figure.Figure`` (report/plots.py); ``draw_comparison`` writes
them."""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path

import matplotlib.ticker
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from wirelessfl.report.colours import algorithm_colours, scenario_entries
from wirelessfl.report.plots import finish, literal, log_scale, new_figure, write_png
from wirelessfl.results.compare import Comparison, mean_ci
from wirelessfl.results.records import output_folder
from wirelessfl.tune.spec import UNTUNED_SUFFIX

# A numeric swept key with at most this many values gets a tick at each of them [D].
MAX_VALUE_TICKS = 8


def _value(v) -> str:
    return f"{v:g}" if isinstance(v, int | float) and not isinstance(v, bool) else str(v)


def _short(key: str) -> str:
    return key.split(".")[-1]


def _label(row, keys: list[str]) -> str:
    return ", ".join(f"{_short(k)}={_value(row[k])}" for k in keys) or "(one configuration)"


def _algorithm_colours(comp: Comparison) -> dict[str, str]:
    """The per-run figures' colours (report/colours.py): the scenarios' entries in turn, a
    tuning study's untuned settings (labels ending in UNTUNED_SUFFIX) after the tuned ones, so
    the tuned label keeps its algorithm's colour, as in the study's tuning figures."""
    entries = [e for r in comp.records for e in scenario_entries(r.manifest)]
    entries.sort(key=lambda e: e[0].endswith(UNTUNED_SUFFIX))  # stable: the order otherwise
    return algorithm_colours(entries, comp.runs.algorithm)


def _banded_curve(comp: Comparison, algorithm: str, config: str, column: str):
    """Round-aligned mean over seeds of ``column`` (x) and of test accuracy (y), and the 95 %
    half-width of the accuracy at each evaluated round (seeds share their evaluation rounds)."""
    frames = []
    for _, run in comp.runs[(comp.runs.config == config)].iterrows():
        rec = comp.records[run.record]
        rows = rec.rounds[rec.rounds.algorithm == algorithm][["round", column, "test_accuracy"]]
        frames.append(rows)
    rows = pd.concat(frames)
    x, y, half = [], [], []
    for _, at in rows.groupby("round", sort=True):
        mean, h, _ = mean_ci(at.test_accuracy)
        x.append(at[column].mean())
        y.append(mean)
        half.append(0.0 if math.isnan(h) else h)
    return np.array(x), np.array(y), np.array(half)


def _facets(comp: Comparison, keys: list[str]):
    """Configurations of the non-algorithm keys: one panel each."""
    if not keys:
        return [((), comp.table)]
    return [(k if isinstance(k, tuple) else (k,), g)
            for k, g in comp.table.groupby(keys, sort=False)]


def accuracy_bands(comp: Comparison, column: str, xlabel: str) -> Figure:
    """Accuracy against ``column`` per configuration: mean over seeds with a 95 % band, one
    panel per value of the swept keys, one line per algorithm."""
    keys = [k for k in comp.keys if not k.startswith("algorithm.")]
    facets = _facets(comp, keys)
    cols = min(3, len(facets))
    rows = math.ceil(len(facets) / cols)
    fig = new_figure((4.6 * cols, 3.6 * rows), 110)
    axes = fig.subplots(rows, cols, squeeze=False, sharex=True, sharey=True)
    colours = _algorithm_colours(comp)
    target = comp.table.target_accuracy.dropna()
    for ax, (values, group) in zip(axes.flat, facets):
        for _, row in group.iterrows():
            config = comp.runs.config[(comp.runs.algorithm == row.algorithm)
                                      & _matches(comp.runs, comp.keys, row)].iloc[0]
            x, y, half = _banded_curve(comp, row.algorithm, config, column)
            keep = x > 0
            colour = colours[row.algorithm]
            label = row.algorithm + "".join(f", {_short(k)}={_value(row[k])}"
                                            for k in comp.keys if k.startswith("algorithm."))
            ax.plot(x[keep], y[keep], color=colour, marker=".", markersize=3,
                    label=f"{label} ({row.seeds} seeds)")
            # an accuracy lies in [0, 1]: a t interval over two seeds reaches far past both
            # ends (t = 12.7), which would stretch the axis from -0.5 to 1.6
            ax.fill_between(x[keep], np.clip(y - half, 0.0, 1.0)[keep],
                            np.clip(y + half, 0.0, 1.0)[keep], color=colour, alpha=0.2,
                            linewidth=0)
        if len(target):
            ax.axhline(target.iloc[0], color="grey", linestyle="--", linewidth=1)
        log_scale(ax, "x")
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # no crowded labels
        ax.set_xlabel(xlabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.set_title(", ".join(f"{_short(k)} = {_value(v)}" for k, v in zip(keys, values))
                     or "all runs", fontsize="medium")
    for ax in axes[:, 0]:
        ax.set_ylabel("test accuracy")
    for ax in axes.flat:  # shared x: label every visible panel's axis anyway
        ax.tick_params(labelbottom=True)
    for ax in list(axes.flat)[len(facets):]:
        ax.set_visible(False)
    # beside the panels, not in one: the curves and bands fill a panel's corners (the legend
    # of six labels covered half of one); every panel's entries, each label once
    entries = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(label, handle)
    axes[0, -1].legend(entries.values(), entries.keys(), fontsize="small", loc="upper left",
                       bbox_to_anchor=(1.02, 1.0))
    fig.suptitle("mean over seeds, band: 95 % confidence interval (t) of the accuracy, "
                 "clipped to [0, 1]"
                 + (f"; dashed: target {target.iloc[0]:g}" if len(target) else ""),
                 fontsize="medium")
    return finish(fig)


def _matches(runs: pd.DataFrame, keys: list[str], row) -> pd.Series:
    mask = pd.Series(True, index=runs.index)
    for k in keys:
        mask &= runs[k].map(lambda v: json.dumps(v, default=str)) == json.dumps(row[k],
                                                                                default=str)
    return mask


def energy_to_target(comp: Comparison) -> Figure:
    """Energy to the target against each numeric swept key (one panel per key), a line per
    algorithm and value of the other keys; 95 % error bars over the seeds that reached it,
    open markers where only some seeds did (k/n written beside). Without a numeric key, one
    point per configuration on a categorical axis whose ticks name the configurations (not
    positions 0, 0.5, 1, ...); a numeric key with few values has its ticks at those values."""
    table = comp.table
    numeric = [k for k in comp.keys if pd.api.types.is_numeric_dtype(table[k])
               and not k.startswith("algorithm.")]
    panels = numeric or [None]
    fig = new_figure((5.8 * len(panels), 5.6), 110)
    axes = fig.subplots(1, len(panels), squeeze=False)
    colours = _algorithm_colours(comp)
    styles = ["-", "--", ":", "-."]
    for ax, key in zip(axes.flat, panels):
        others = [k for k in comp.keys if k != key]
        if key is None:
            lines = [(row.algorithm, pd.DataFrame([row])) for _, row in table.iterrows()]
        else:
            lines = list(table.groupby(["algorithm", *others], sort=False)) if others else \
                list(table.groupby("algorithm", sort=False))
        variants = list(dict.fromkeys(str(n[1:]) for n, _ in lines)) \
            if others and key is not None else []
        for i, (name, group) in enumerate(lines):
            algorithm = name[0] if isinstance(name, tuple) else name
            group = group.sort_values(key) if key else group
            x = group[key].to_numpy(dtype=float) if key else np.arange(len(group)) + i
            y = group.energy_to_target_j.to_numpy(dtype=float)
            err = np.nan_to_num(group.energy_to_target_j_ci95.to_numpy(dtype=float))
            label = algorithm + ("" if not others else " (" + _label(group.iloc[0], others) + ")")
            style = styles[variants.index(str(name[1:])) % len(styles)] if variants else "-"
            ax.errorbar(x, y, yerr=err, color=colours[algorithm], linestyle=style, capsize=3,
                        label=label)
            full = (group.reached == group.seeds).to_numpy(dtype=bool)
            ax.plot(x[full], y[full], "o", color=colours[algorithm], zorder=3)
            ax.plot(x[~full], y[~full], "o", color=colours[algorithm], zorder=3,
                    markerfacecolor="white")
            for xi, yi, (_, r) in zip(x, y, group.iterrows()):
                if r.reached < r.seeds and np.isfinite(yi):
                    ax.annotate(f"{r.reached}/{r.seeds}", (xi, yi), textcoords="offset points",
                                xytext=(4, 4), fontsize="x-small")
        log_scale(ax, "y")
        ax.set_xlabel(key or "configuration")
        ax.set_ylabel("energy to target accuracy [J] (all devices)")
        ax.grid(True, which="both", alpha=0.3)
        if key is None:  # categorical: the configurations by name, in their colours
            _name_ticks(ax, [(name, _label(group.iloc[0], others) if others else name)
                             for name, group in lines], colours)
            continue
        values = np.unique(table[key].to_numpy(dtype=float))
        if len(values) <= MAX_VALUE_TICKS:  # a few swept values: ticks at them, as written
            ax.set_xticks(values, [_value(v) for v in values])
            ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.legend(fontsize="x-small", loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
    fig.suptitle("energy to target: mean ± 95 % CI over the seeds that reached it; open marker "
                 "and k/n: only k of n seeds reached it; missing: none did", fontsize="medium")
    return finish(fig)


def _name_ticks(ax, names: list[tuple[str, str]], colours: dict[str, str]) -> None:
    """Ticks 0, 1, ... of a categorical axis named (algorithm, label): the label, wrapped and
    slanted, in the algorithm's colour."""
    ax.set_xticks(range(len(names)), [textwrap.fill(literal(label), 28) for _, label in names],
                  rotation=20, ha="right", fontsize="small")
    ax.set_xlim(-0.5, len(names) - 0.5)
    for tick, (algorithm, _) in zip(ax.get_xticklabels(), names):
        tick.set_color(colours[algorithm])


def pareto_front(comp: Comparison) -> Figure:
    """Every configuration at (mean energy of the whole run, mean final accuracy) with 95 %
    error bars; the front (``pareto_indices``: no other configuration beats it by more than
    the intervals' width) numbered and listed, and joined by a step line only through the
    points the intervals tell apart from every other point of the front (``pareto_joined``):
    two configurations whose intervals overlap on both axes are not a step of the front."""
    table = comp.table
    colours = _algorithm_colours(comp)
    fig = new_figure((11.0, 5.2), 110)
    ax = fig.subplots()
    for algorithm, group in table.groupby("algorithm", sort=False):
        accuracy = group.final_accuracy.to_numpy(dtype=float)
        half = np.nan_to_num(group.final_accuracy_ci95.to_numpy(dtype=float))
        # an accuracy's interval drawn within [0, 1], as the bands of accuracy_bands
        below, above = np.clip(accuracy - half, 0, 1), np.clip(accuracy + half, 0, 1)
        ax.errorbar(group.energy_j, accuracy,
                    xerr=np.nan_to_num(group.energy_j_ci95.to_numpy(dtype=float)),
                    yerr=np.nan_to_num(np.vstack([accuracy - below, above - accuracy])),
                    fmt="o", color=colours[algorithm], capsize=2, label=algorithm, alpha=0.85)
    columns = [table[c].to_numpy(dtype=float) for c in
               ("energy_j", "final_accuracy", "energy_j_ci95", "final_accuracy_ci95")]
    front = pareto_indices(*columns)
    joined = pareto_joined(*columns)
    if joined:
        f = table.iloc[joined]
        ax.step(f.energy_j, f.final_accuracy, where="post", color="black", linewidth=1,
                label="Pareto front")
    loose = [i for i in front if i not in joined]
    if loose:
        ax.plot(table.energy_j.iloc[loose], table.final_accuracy.iloc[loose], "o", ms=11,
                markerfacecolor="none", markeredgecolor="black", linestyle="none",
                label="front, not told apart (not joined)")
    lines = []
    for i, (index, row) in enumerate(table.iloc[front].iterrows(), start=1):
        ax.annotate(str(i), (row.energy_j, row.final_accuracy), textcoords="offset points",
                    xytext=(4, 5), fontsize="small", fontweight="bold")
        apart = "" if table.index.get_loc(index) in joined else " (overlaps another)"
        lines.append(f"{i}: {row.algorithm}" + (f", {_label(row, comp.keys)}" if comp.keys else "")
                     + f"\n    {row.energy_j:.3g} J, accuracy {row.final_accuracy:.3f}{apart}")
    ax.text(1.02, 1.0, "Pareto front (no other configuration\nbeats it by more than the 95 %\n"
            "intervals; joined: told apart):\n\n" + "\n".join(lines), transform=ax.transAxes,
            va="top", fontsize="x-small", family="monospace")
    log_scale(ax, "x")
    ax.set_xlabel("energy of the whole run, mean over seeds [J] (all devices)")
    ax.set_ylabel("final test accuracy, mean over seeds")
    ax.set_title("energy / accuracy across configurations (bars: 95 % CI)", fontsize="medium")
    ax.grid(True, which="both", alpha=0.3)
    # below the axes: the points and their bars may fill any corner, the front's list holds
    # the right
    ax.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3)
    return finish(fig)


def _half(ci, n: int) -> np.ndarray:
    """Half-widths of the intervals, 0 where unknown (one seed: the mean is all there is)."""
    return np.zeros(n) if ci is None else np.nan_to_num(np.asarray(ci, dtype=float), nan=0.0)


def pareto_indices(energy: np.ndarray, accuracy: np.ndarray, energy_ci=None,
                   accuracy_ci=None) -> list[int]:
    """Indices of the points no other point dominates, ordered by energy. A point dominates
    another when its means are no worse on both axes (energy <=, accuracy >=, one strictly)
    and its interval lies wholly on the better side of the other's on at least one axis
    (energy: its upper end below the other's lower end; accuracy: its lower end above the
    other's upper end) [D]: a point beaten only within the intervals' width (the seeds cannot
    tell the two apart) stays on the front. ``energy_ci`` and ``accuracy_ci`` are the 95 %
    half-widths; None or NaN (one seed) is the plain Pareto front of the means."""
    energy, accuracy = np.asarray(energy, dtype=float), np.asarray(accuracy, dtype=float)
    de, da = _half(energy_ci, len(energy)), _half(accuracy_ci, len(energy))
    ok = np.isfinite(energy) & np.isfinite(accuracy)
    keep = []
    for i in np.flatnonzero(ok):
        better = ok & (energy <= energy[i]) & (accuracy >= accuracy[i]) & (
            (energy < energy[i]) | (accuracy > accuracy[i]))
        apart = (energy + de < energy[i] - de[i]) | (accuracy - da > accuracy[i] + da[i])
        if not (better & apart).any():
            keep.append(int(i))
    return sorted(keep, key=lambda i: (energy[i], -accuracy[i]))


def pareto_joined(energy: np.ndarray, accuracy: np.ndarray, energy_ci=None,
                  accuracy_ci=None) -> list[int]:
    """The points of ``pareto_indices``'s front that its step line joins, ordered by energy:
    those whose intervals are apart (disjoint on at least one axis) from those of every other
    point of the front [D]. Two points whose error bars overlap on both axes are not
    distinguishable: neither is a step of the front, and both are drawn unjoined."""
    energy, accuracy = np.asarray(energy, dtype=float), np.asarray(accuracy, dtype=float)
    de, da = _half(energy_ci, len(energy)), _half(accuracy_ci, len(energy))
    front = pareto_indices(energy, accuracy, energy_ci, accuracy_ci)

    def overlap(i: int, j: int) -> bool:
        return (abs(energy[i] - energy[j]) <= de[i] + de[j]
                and abs(accuracy[i] - accuracy[j]) <= da[i] + da[j])

    return [i for i in front if not any(overlap(i, j) for j in front if j != i)]


def draw_comparison(comp: Comparison, out_dir: Path) -> list[Path]:
    """The comparison figures that have something to draw into ``out_dir``; returns their
    paths. Runs without accuracy (a multi-sequence problem, the quadratic) get no accuracy
    figures, and runs that never reached a target no energy-to-target figure: empty axes say
    nothing."""
    out = output_folder(Path(out_dir))
    table = comp.table
    accuracy = bool(np.isfinite(table.final_accuracy.to_numpy(dtype=float)).any())
    reached = bool(np.isfinite(table.energy_to_target_j.to_numpy(dtype=float)).any())
    figures = []
    if accuracy:
        figures += [(lambda: accuracy_bands(comp, "energy_j", "cumulative energy, all devices [J]"),
                     "compare_accuracy_vs_energy.png"),
                    (lambda: accuracy_bands(comp, "sim_time_s", "simulated time [s]"),
                     "compare_accuracy_vs_time.png")]
    if reached:
        figures.append((lambda: energy_to_target(comp), "compare_energy_to_target.png"))
    if accuracy:
        figures.append((lambda: pareto_front(comp), "compare_pareto.png"))
    return [write_png(draw(), out / name) for draw, name in figures]
