"""Figures drawn from a saved run alone (never re-simulating): accuracy vs energy and vs simulated
time, where the energy went, which labels each device holds, how many devices still have energy,
how energy and time split per device and device class, how accuracy spreads over devices, and, for
problems with a known optimum, f - f* and ||grad f||^2 against rounds, gradients, seconds, joules.

Every per-run figure is a public function ``name(record) -> Figure | None`` listed in ``FIGURES``
(name = the PNG's stem): ``record`` is anything with ``.rounds``, ``.devices`` and ``.manifest``
(a results.records.RunRecord, or the Python API's result), and None means the run has nothing
for that figure to draw. The figures are ``matplotlib.figure.Figure`` objects made without
pyplot, so a notebook shows the returned one once and nothing accumulates in pyplot's list of
open figures; ``draw_report`` writes them as PNG files."""

from __future__ import annotations

import io
import textwrap
from collections.abc import Callable
from pathlib import Path

import matplotlib
import matplotlib.text
import matplotlib.ticker
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from wirelessfl.results.records import output_folder, write_file

# Never LaTeX, whatever a user's matplotlibrc says: a label would be handed to TeX as markup.
matplotlib.rcParams["text.usetex"] = False

BREAKDOWN = [("energy_compute_forward_j", "compute (forward)"),
             ("energy_compute_backward_j", "compute (backward)"),
             ("energy_uplink_j", "uplink"), ("energy_downlink_j", "downlink"),
             ("energy_idle_j", "idle")]
# Devices up to which the label histogram draws one bar per device and class (gaps between
# devices); beyond it one filled step outline per class [D].
BAR_DEVICES = 100
# Steps at most in the label histogram's outline: about the figure's pixel columns (16 inches
# at 120 dpi) [D]; more devices are drawn as means over consecutive devices.
MAX_COLUMNS = 2000
TIME_SPLIT = [("compute_s", "compute"), ("uplink_s", "uplink"), ("downlink_s", "downlink"),
              ("idle_s", "idle")]


def literal(text) -> str:
    """``text`` as matplotlib draws it literally: a pair of '$' would be read as mathtext (an
    algorithm labelled ``a$x$`` drawn as an italic x, ``$\\foo$`` a crash); an escaped '\\$' is
    drawn as '$'. For tick labels, which are re-made at every draw (finish escapes the
    other texts)."""
    return str(text).replace("$", r"\$")


def new_figure(figsize: tuple[float, float], dpi: int) -> Figure:
    """An empty figure outside pyplot's registry (nothing to close, nothing shown twice in a
    notebook), with an Agg canvas so it can be laid out, measured and saved; ``dpi`` is the
    resolution its PNG is written at."""
    fig = Figure(figsize=figsize, dpi=dpi)
    FigureCanvasAgg(fig)
    return fig


def finish(fig: Figure, rect=(0, 0, 1, 1)) -> Figure:
    """Lay ``fig`` out (tight, within ``rect``) with every text drawn as written (``literal``;
    before the layout, which measures the texts), except the tick labels matplotlib's log
    formatters write in mathtext (``\\mathdefault``); returns ``fig``."""
    for text in fig.findobj(matplotlib.text.Text):
        shown = text.get_text()
        if "$" in shown and r"\mathdefault" not in shown:
            text.set_text(literal(shown))
    fig.tight_layout(rect=rect)
    return fig


def write_png(fig: Figure, path: Path) -> Path:
    """Render ``fig`` as PNG in memory at its own dpi, close it, and write it to ``path``
    atomically (a temporary file renamed into place, records.write_file): a link planted at
    ``path`` is replaced, never written through, and a failed write leaves the previous
    figure."""
    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, format="png", dpi=fig.dpi)
    finally:
        plt.close(fig)
    return write_file(path, buffer.getvalue())


def save_figure(fig, path: Path, dpi: int, rect=(0, 0, 1, 1)) -> Path:
    """``finish`` ``fig`` (a pyplot figure of the comparison, tuning and crossover reports) and
    ``write_png`` it at ``dpi``; the figure is closed whatever happens."""
    try:
        fig.set_dpi(dpi)
        finish(fig, rect)
    except BaseException:
        plt.close(fig)
        raise
    return write_png(fig, path)


def _title(record) -> str:
    return record.manifest.get("scenario", {}).get("name", "")


def _target(record, key: str) -> float | None:
    return record.manifest.get("scenario", {}).get(key)


def _accuracy_against(record, column: str, xlabel: str) -> Figure | None:
    """Test accuracy against ``column``; None for a run that recorded no accuracy (a problem
    without one, the bilevel quadratic say: optimization_progress shows its f - f*)."""
    if not np.isfinite(record.rounds.test_accuracy.to_numpy(dtype=float)).any():
        return None
    fig = new_figure((6.4, 4.2), 120)
    ax = fig.subplots()
    for algorithm, group in record.rounds.groupby("algorithm", sort=False):
        group = group.sort_values("round")
        x = group[column].where(group[column] > 0)
        ax.plot(x, group.test_accuracy, marker=".", markersize=3, label=algorithm)
    target = _target(record, "target_accuracy")
    if target is not None:
        ax.axhline(target, color="grey", linestyle="--", linewidth=1, label=f"target {target:g}")
    ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("test accuracy")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    ax.set_title(_title(record))
    return finish(fig)


def accuracy_vs_energy(record) -> Figure | None:
    """Test accuracy against the cumulative energy of all devices (log axis)."""
    return _accuracy_against(record, "energy_j", "cumulative energy, all devices [J]")


def accuracy_vs_time(record) -> Figure | None:
    """Test accuracy against simulated time (log axis)."""
    return _accuracy_against(record, "sim_time_s", "simulated time [s]")


# x-axes of the optimisation-progress figure (fedred.md A14 / Sec. 5.1 metrics (a)-(c)).
PROGRESS_AXES = [("round", "rounds (model averages)"),
                 ("gradient_evaluations", "gradient evaluations per device"),
                 ("sim_time_s", "simulated time [s]"), ("energy_j", "energy, all devices [J]")]


def optimization_progress(record) -> Figure | None:
    """f - f* (top) and ||grad f||^2 (bottom, where recorded) of the global model against rounds,
    gradient evaluations, simulated seconds and joules; None when no run knows f*."""
    rounds = record.rounds
    if "suboptimality" not in rounds or not np.isfinite(rounds.suboptimality).any():
        return None
    rows = [("suboptimality", "f(x) - f*")]
    if "grad_norm_sq" in rounds and np.isfinite(rounds.grad_norm_sq).any():
        rows.append(("grad_norm_sq", "||grad f(x)||^2"))
    axes_cols = [a for a in PROGRESS_AXES if a[0] in rounds]
    fig = new_figure((3.6 * len(axes_cols), 3.0 * len(rows)), 110)
    axes = fig.subplots(len(rows), len(axes_cols), squeeze=False, sharey="row")
    for algorithm, group in rounds.groupby("algorithm", sort=False):
        group = group.sort_values("round")
        for i, (metric, _) in enumerate(rows):
            y = group[metric].where(group[metric] > 0)
            for j, (column, _) in enumerate(axes_cols):
                axes[i, j].plot(group[column], y, linewidth=1.2,
                                label=algorithm if (i, j) == (0, 0) else None)
    for i, (_, ylabel) in enumerate(rows):
        axes[i, 0].set_ylabel(ylabel)
        for j, (_, xlabel) in enumerate(axes_cols):
            axes[i, j].set_yscale("log")
            axes[i, j].grid(True, which="both", alpha=0.3)
            axes[-1, j].set_xlabel(xlabel)
    target = _target(record, "target_suboptimality")
    if target is not None:
        for ax in axes[0]:
            ax.axhline(target, color="grey", linestyle="--", linewidth=1)
    fig.suptitle(_title(record), y=0.99, fontsize=10)
    fig.legend(loc="upper center", bbox_to_anchor=(0.5, 0.955),
               ncol=min(6, rounds.algorithm.nunique()), frameon=False)
    return finish(fig, rect=(0, 0, 1, 0.88))


def energy_breakdown(record) -> Figure | None:
    """Stacked bars of each algorithm's total energy by kind, at its last round: the devices'
    kinds, then the base station's transmit energy (hatched, its share of the system's energy
    written above the bar) where the run recorded it."""
    last = record.rounds.sort_values("round").groupby("algorithm", sort=False).tail(1)
    fig = new_figure((6.4, 4.2), 120)
    ax = fig.subplots()
    bottom = [0.0] * len(last)
    names = [literal(name) for name in last.algorithm]  # the x axis's categories: tick labels
    for column, label in BREAKDOWN:
        if column not in last:  # runs recorded before idle energy existed
            continue
        values = list(last[column])
        ax.bar(names, values, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, values)]
    who = "all devices"
    if "energy_bs_j" in last and last.energy_bs_j.notna().any():
        station = list(last.energy_bs_j.fillna(0.0))
        ax.bar(names, station, bottom=bottom, label="base station (transmit)", color="0.75",
               hatch="//", edgecolor="0.35")
        for name, devices, bs in zip(names, bottom, station):
            total = devices + bs
            ax.annotate(f"BS {100 * bs / total:.1f}%" if total else "", (name, total),
                        ha="center", va="bottom", fontsize="x-small")
        bottom = [b + v for b, v in zip(bottom, station)]
        who = "devices + base station"
    ax.set_ylabel(f"energy over the whole run [J] ({who})")
    ax.set_yscale("log" if max(bottom, default=0) / max(min(bottom, default=1), 1e-30) > 100
                  else "linear")
    ax.legend()
    ax.set_title("energy by kind")
    return finish(fig)


def label_histogram(record) -> Figure | None:
    """Stacked bars of each device's training samples by class, from the manifest's partition
    entry; None (nothing drawn) for a run recorded before label counts were kept.

    Up to ``BAR_DEVICES`` devices: one bar per device and class. More: one filled step outline
    per class (C artists whatever N; N x C bar patches took 9.5 minutes and 10.5 GB at 100,000
    devices), and beyond ``MAX_COLUMNS`` devices each step is the mean over k consecutive
    devices (k in the axis label), about one step per pixel column of the figure."""
    part = record.manifest.get("partition") or {}
    counts = np.asarray(part.get("label_counts") or [], dtype=float)
    if counts.ndim != 2 or counts.size == 0:
        return None
    num_devices, num_classes = counts.shape
    colours = plt.get_cmap("tab10" if num_classes <= 10 else "tab20" if num_classes <= 20
                           else "viridis")
    fig = new_figure((min(16.0, max(6.4, 0.12 * num_devices)), 4.2), 120)
    ax = fig.subplots()
    per_step = -(-num_devices // MAX_COLUMNS)  # k devices per step (ceil)
    starts = np.arange(0, num_devices, per_step)
    heights = np.add.reduceat(counts, starts, axis=0) / np.diff(np.append(starts, num_devices))[:, None]
    xs = np.repeat(np.append(starts, num_devices) - 0.5, 2)[1:-1]  # step outline: 2 per step
    bottom = np.zeros(len(starts))
    for c in range(num_classes):
        colour = colours(c if num_classes <= 20 else c / max(num_classes - 1, 1))
        top = bottom + heights[:, c]
        if num_devices <= BAR_DEVICES:
            ax.bar(starts, heights[:, c], bottom=bottom, width=0.9, color=colour, label=str(c),
                   linewidth=0)
        else:
            ax.fill_between(xs, np.repeat(bottom, 2), np.repeat(top, 2), color=colour,
                            label=str(c), linewidth=0)
        bottom = top
    ax.set_xlabel("device")
    ax.set_ylabel("training samples" if per_step == 1 else
                  f"training samples (mean of {per_step} consecutive devices)")
    ax.set_xlim(-0.6, num_devices - 0.4)
    if num_classes <= 20:
        ax.legend(title="class", fontsize="small", ncol=1 if num_classes <= 10 else 2,
                  loc="upper left", bbox_to_anchor=(1.0, 1.0))
    params = ", ".join(f"{k}={v:g}" if isinstance(v, int | float) else f"{k}={v}"
                       for k, v in (part.get("params") or {}).items())
    tv = part.get("mean_label_tv")
    ax.set_title(textwrap.fill(f"labels per device: {part.get('scheme', '?')}"
                               + (f" ({params})" if params else ""), 90)
                 + (f"\nmean total-variation distance to the overall mix {tv:.3f}"
                    if tv is not None else ""), fontsize="medium")
    return finish(fig)


def network_lifetime(record) -> Figure | None:
    """Devices with energy left (dashed, right axis) and test accuracy (solid) against simulated
    time and against cumulative energy; None for a run recorded before ``alive_devices``."""
    rounds = record.rounds
    if "alive_devices" not in rounds:
        return None
    n = record.manifest.get("scenario", {}).get("population", {}).get("num_devices")
    fig = new_figure((11.0, 4.2), 120)
    axes = fig.subplots(1, 2)
    for ax, column, xlabel in ((axes[0], "sim_time_s", "simulated time [s]"),
                               (axes[1], "energy_j", "cumulative energy, all devices [J]")):
        alive_ax = ax.twinx()
        for colour, (algorithm, group) in zip(_colours(), rounds.groupby("algorithm", sort=False)):
            group = group.sort_values("round")
            ax.plot(group[column], group.test_accuracy, color=colour, marker=".", markersize=3,
                    label=algorithm)
            alive_ax.step(group[column], group.alive_devices, where="post", color=colour,
                          linestyle="--", linewidth=1.2)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("test accuracy (solid)")
        alive_ax.set_ylabel("devices with energy left (dashed)")
        alive_ax.set_ylim(0, (n or rounds.alive_devices.max()) * 1.05)
        ax.grid(True, alpha=0.3)
    axes[0].legend(loc="lower right", fontsize="small")
    depleted = {a: int(g.alive_devices.iloc[0] - g.alive_devices.min())
                for a, g in rounds.sort_values("round").groupby("algorithm", sort=False)}
    fig.suptitle("network lifetime: devices whose battery ran out, by algorithm: "
                 + ", ".join(f"{a} {k}" for a, k in depleted.items()), fontsize="medium")
    return finish(fig)


def _colours():
    return plt.rcParams["axes.prop_cycle"].by_key()["color"] * 10


def device_energy(record) -> Figure | None:
    """Left: each device's energy over the run by device class and algorithm (box plus one
    point per device). Right: where each class's time went (compute, uplink, downlink, idle),
    as a share of the time its devices were alive. None for a run recorded before the
    per-device class and time columns existed."""
    devices = record.devices
    needed = {"device_class", "energy_j", "depleted_at_s", *(c for c, _ in TIME_SPLIT)}
    if devices.empty or not needed <= set(devices.columns):
        return None
    classes = list(dict.fromkeys(devices.device_class))
    algorithms = list(dict.fromkeys(devices.algorithm))
    width = 0.8 / len(algorithms)
    fig = new_figure((12.0, 4.6), 120)
    ax, time_ax = fig.subplots(1, 2)
    rng = np.random.default_rng(0)  # jitter of the points only
    for a, (algorithm, colour) in enumerate(zip(algorithms, _colours())):
        rows = devices[devices.algorithm == algorithm]
        positions = np.arange(len(classes)) + (a - (len(algorithms) - 1) / 2) * width
        data = [rows.energy_j[rows.device_class == c].to_numpy() for c in classes]
        box = ax.boxplot(data, positions=positions, widths=width * 0.8, showfliers=False,
                         patch_artist=True)
        for patch in box["boxes"]:
            patch.set(facecolor=colour, alpha=0.25, edgecolor=colour)
        for x, c in zip(positions, classes):
            of_class = rows[rows.device_class == c]
            jitter = x + rng.uniform(-0.3, 0.3, len(of_class)) * width
            out = of_class.depleted_at_s.notna().to_numpy()
            ax.scatter(jitter[~out], of_class.energy_j[~out], s=9, color=colour, alpha=0.8,
                       label=algorithm if x == positions[0] else None)
            ax.scatter(jitter[out], of_class.energy_j[out], s=28, color="black", marker="x",
                       linewidths=0.8,
                       label=f"{algorithm}: battery ran out" if out.any() else None)
        # time split per class (stacked shares of alive time), hatched by algorithm
        times = rows.groupby("device_class")[[c for c, _ in TIME_SPLIT]].sum().reindex(classes)
        alive_s = np.maximum(times.sum(axis=1).to_numpy(), 1e-300)
        bottom = np.zeros(len(classes))
        for (column, label), shade in zip(TIME_SPLIT, ("#4c72b0", "#dd8452", "#55a868", "#c7c7c7")):
            share = times[column].to_numpy() / alive_s
            time_ax.bar(positions, share, bottom=bottom, width=width * 0.9, color=shade,
                        edgecolor=colour, linewidth=1.2, label=label if a == 0 else None)
            bottom += share
    energies = devices.energy_j[devices.energy_j > 0]
    if len(energies) and energies.max() / energies.min() > 100:
        ax.set_yscale("log")
    for axis in (ax, time_ax):
        axis.set_xticks(np.arange(len(classes)))
        per_class = [(devices.device_class == c).sum() // len(algorithms) for c in classes]
        axis.set_xticklabels([f"{literal(c)}\n({count} devices)"
                              for c, count in zip(classes, per_class)])
    ax.set_ylabel("energy per device over the run [J]")
    ax.set_title("per-device energy by class", fontsize="medium")
    ax.legend(fontsize="small")
    ax.grid(True, axis="y", which="both", alpha=0.3)
    time_ax.set_ylabel("share of the time alive")
    time_ax.set_ylim(0, 1.0)
    time_ax.set_title("where each class's time went (bars: " + ", ".join(algorithms) + ")",
                      fontsize="medium")
    time_ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return finish(fig)


def device_accuracy(record) -> Figure | None:
    """Left: each algorithm's accuracy on every device's own test distribution at its last
    evaluation (box plus one point per device). Right: the worst device's accuracy and the mean
    of the worst k against cumulative energy. None for runs without per-device accuracy (a
    quadratic, or recorded before the column existed)."""
    rounds = record.rounds
    if "device_accuracy" not in rounds or rounds.device_accuracy.isna().all():
        return None
    fig = new_figure((12.0, 4.6), 120)
    ax, energy_ax = fig.subplots(1, 2)
    rng = np.random.default_rng(0)  # jitter of the points only
    names = []
    for a, ((algorithm, group), colour) in enumerate(zip(rounds.groupby("algorithm", sort=False),
                                                         _colours())):
        group = group[group.device_accuracy.notna()].sort_values("round")
        if group.empty:
            continue
        names.append(algorithm)
        values = np.asarray(group.device_accuracy.iloc[-1], dtype=float)
        box = ax.boxplot([values[np.isfinite(values)]], positions=[a], widths=0.6,
                         showfliers=False, patch_artist=True)
        for patch in box["boxes"]:
            patch.set(facecolor=colour, alpha=0.25, edgecolor=colour)
        ax.scatter(a + rng.uniform(-0.2, 0.2, len(values)), values, s=12, color=colour,
                   alpha=0.8)
        x = group.energy_j.where(group.energy_j > 0)
        energy_ax.plot(x, group.worst_device_accuracy, color=colour, marker=".",
                       label=f"{algorithm}: worst device")
        energy_ax.plot(x, group.worst_k_device_accuracy, color=colour, linestyle="--",
                       label=f"{algorithm}: worst k")
    fraction = record.manifest.get("scenario", {}).get("worst_fraction", 0.1)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels([literal(name) for name in names], rotation=20, ha="right")
    ax.set_ylabel("accuracy on the device's own label mix")
    ax.set_title("per-device accuracy at the last evaluation", fontsize="medium")
    ax.grid(True, axis="y", alpha=0.3)
    energy_ax.set_xscale("log")
    energy_ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # no crowded labels
    energy_ax.set_xlabel("cumulative energy, all devices [J]")
    energy_ax.set_ylabel("accuracy")
    energy_ax.set_title(f"worst device, and mean of the worst k = ceil({fraction:g} N)",
                        fontsize="medium")
    energy_ax.grid(True, which="both", alpha=0.3)
    energy_ax.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return finish(fig)


# Every per-run figure, in the order the report shows them; the key is the PNG's stem.
FIGURES: dict[str, Callable[..., Figure | None]] = {
    "accuracy_vs_energy": accuracy_vs_energy,
    "accuracy_vs_time": accuracy_vs_time,
    "energy_breakdown": energy_breakdown,
    "label_histogram": label_histogram,
    "network_lifetime": network_lifetime,
    "device_energy": device_energy,
    "device_accuracy": device_accuracy,
    "optimization_progress": optimization_progress,
}


def draw_report(record, out_dir: Path | None = None) -> list[Path]:
    """Write the run's PNG figures (``FIGURES``, each as ``<name>.png``) next to its results, or
    into ``out_dir``; returns their paths. A figure with nothing to draw for this run (None:
    no accuracy on a quadratic, no label counts in an old manifest, ...) writes no file."""
    out = output_folder(Path(out_dir or record.path))
    paths = []
    for name, figure in FIGURES.items():
        fig = figure(record)
        if fig is not None:
            paths.append(write_png(fig, out / f"{name}.png"))
    return paths
