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
import matplotlib.patches
import matplotlib.text
import matplotlib.ticker
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from wirelessfl.report.colours import run_colours
from wirelessfl.results.records import output_folder, write_file
from wirelessfl.results.summary import describe_target, reached_mask

# Never LaTeX, whatever a user's matplotlibrc says: a label would be handed to TeX as markup.
matplotlib.rcParams["text.usetex"] = False

BREAKDOWN = [("energy_compute_forward_j", "compute (forward)"),
             ("energy_compute_backward_j", "compute (backward)"),
             ("energy_uplink_j", "uplink"), ("energy_downlink_j", "downlink"),
             ("energy_idle_j", "idle")]
# One colour per kind of energy, the same in the breakdown, the per-round figure and the
# device figure's time split [D]: pastel tints, none of them an algorithm's colour
# (report/colours.py FIXED: tab10 and darker saturated colours). A kind is an area, which reads
# in a pastel; an algorithm is a line or a point, which needs a saturated colour; so a pastel
# bar never reads as an algorithm, and an algorithm's coloured tick label or hatch never reads
# as a kind (tab10's first five, which the kinds took before, were the first five algorithms'
# colours: "uplink" was FedAvg's green). Each is at least 18 CIEDE2000 units from every
# algorithm colour and 15 from the other kinds (tests/test_report_view.py). Compute: cool
# tints (forward blue, backward lavender); radio: uplink peach, downlink mint; idle: rose. The
# base station's transmit energy is grey and hatched.
KIND_COLOURS = {"energy_compute_forward_j": "#a2bffe", "energy_compute_backward_j": "#dfc5fe",
                "energy_compute_j": "#a2bffe", "energy_uplink_j": "#fdcdac",
                "energy_downlink_j": "#90e4c1", "energy_idle_j": "#fdc1c5"}
# Bars of stacked pastel kinds are drawn with thin edges of this grey, so two tints that meet
# stay apart [D].
KIND_EDGE = "0.45"
STATION = ("energy_bs_j", "base station (transmit)")
STATION_STYLE = {"color": "0.75", "hatch": "//", "edgecolor": "0.35"}
# Devices up to which the label histogram draws one bar per device and class (gaps between
# devices); beyond it one filled step outline per class [D].
BAR_DEVICES = 100
# Steps at most in the label histogram's outline: about the figure's pixel columns (16 inches
# at 120 dpi) [D]; more devices are drawn as means over consecutive devices.
MAX_COLUMNS = 2000
# Points per algorithm at most in the per-device accuracy figure: more devices (a large
# population) draw a random sample of them as points, smaller and fainter, the box still over
# all (more points hide the box) [D].
POINT_DEVICES = 2_000
TIME_SPLIT = [("compute_s", "compute"), ("uplink_s", "uplink"), ("downlink_s", "downlink"),
              ("idle_s", "idle")]
# The time split's colours: those of the matching kinds of energy.
TIME_COLOURS = {"compute_s": KIND_COLOURS["energy_compute_j"],
                "uplink_s": KIND_COLOURS["energy_uplink_j"],
                "downlink_s": KIND_COLOURS["energy_downlink_j"],
                "idle_s": KIND_COLOURS["energy_idle_j"]}
# Where a figure tells algorithms apart by more than colour (the device figure's points and
# bars), the a-th algorithm of the run takes the a-th marker and hatch, cycling [D]: a reader
# who cannot tell two colours apart, or a grey print, still can.
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "<", ">", "h"]
HATCHES = ["", "//", "..", "xx", "\\\\", "++", "oo", "--", "||", "**"]


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
    formatters write in mathtext (``\\mathdefault``), and with titles too wide for their
    place wrapped (``fit_titles``; the layout runs again around the taller titles); returns
    ``fig``."""
    for text in fig.findobj(matplotlib.text.Text):
        shown = text.get_text()
        if "$" in shown and r"\mathdefault" not in shown:
            text.set_text(literal(shown))
    fig.tight_layout(rect=rect)
    for _ in range(3):  # a wrapped title changes the layout, which changes the room for titles
        if not fit_titles(fig):
            break
        fig.tight_layout(rect=rect)
    return fig


def whole_numbers() -> matplotlib.ticker.Locator:
    """Ticks at whole numbers only, for an axis of counts (rounds, device ids): a device 0.5 or
    a round 2.5 does not exist."""
    return matplotlib.ticker.MaxNLocator(nbins="auto", integer=True)


def log_scale(axes, which: str) -> None:
    """A log scale on the ``which`` ("x" or "y") axis of ``axes`` (one or a row sharing it) when
    a point drawn there in data coordinates (lines, scatter points) has finite coordinates and
    a positive value on that axis; else the axis stays linear: matplotlib's log locator raises
    on an axis with no positive data (a damaged run folder's NaN column, a run that spent no
    energy). Lines in axes coordinates (a target's axhline) do not count."""
    axes = axes if isinstance(axes, (list, tuple, np.ndarray)) else [axes]
    k = 0 if which == "x" else 1

    def points(ax):
        for line in ax.get_lines():
            if line.get_transform() is ax.transData:
                yield np.column_stack([np.asarray(v, dtype=float) for v in line.get_data()])
        for coll in ax.collections:
            if coll.get_offset_transform() is ax.transData:
                yield np.asarray(coll.get_offsets(), dtype=float).reshape(-1, 2)

    for ax in axes:
        for xy in points(ax):
            if (np.isfinite(xy).all(axis=1) & (xy[:, k] > 0)).any():
                for each in axes:
                    (each.set_xscale if k == 0 else each.set_yscale)("log")
                return


def _titles(fig: Figure):
    """(title, the width in pixels it may take) of ``fig``: the figure's title the figure's
    width, an axes title its axes' width (wider, it would run into its neighbour's)."""
    if fig._suptitle is not None and fig._suptitle.get_text():
        yield fig._suptitle, fig.bbox.width
    for ax in fig.axes:
        if ax.get_visible():
            for title in (ax.title, ax._left_title, ax._right_title):
                if title.get_text():
                    yield title, ax.bbox.width


def fit_titles(fig: Figure) -> bool:
    """Wrap every title of ``fig`` wider than its place (``_titles``) at the widest number of
    characters that fits (the lines it already has kept as they are broken), a word longer
    than the line broken too; True when some title changed. A scenario's name or a list of
    algorithm labels is text of any length: a title cut off at the figure's edge hides it."""
    renderer = fig.canvas.get_renderer()
    changed = False
    for title, room in _titles(fig):
        text = title.get_text()
        lines = text.split("\n")
        chars = max(len(line) for line in lines)
        width = title.get_window_extent(renderer).width
        while width > room and chars > 1:
            chars = max(1, min(chars - 1, int(chars * room / width)))
            title.set_text("\n".join(textwrap.fill(line, chars) if line else line
                                     for line in lines))
            width = title.get_window_extent(renderer).width
        changed |= title.get_text() != text
    return changed


def write_png(fig: Figure, path: Path) -> Path:
    """Render ``fig`` as PNG in memory at its own dpi, close it, and write it to ``path``
    atomically (a temporary file renamed into place, records.write_file): a link planted at
    ``path`` is replaced, never written through, and a failed write leaves the previous
    figure."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=fig.dpi)
    return write_file(path, buffer.getvalue())


def save_figure(fig, path: Path, dpi: int, rect=(0, 0, 1, 1)) -> Path:
    """``finish`` ``fig`` (a figure of the tuning and crossover reports) and ``write_png`` it
    at ``dpi``."""
    fig.set_dpi(dpi)
    finish(fig, rect)
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
    colours = run_colours(record)
    for algorithm, group in record.rounds.groupby("algorithm", sort=False):
        group = group.sort_values("round")
        x = group[column].where(group[column] > 0)
        ax.plot(x, group.test_accuracy, marker=".", markersize=3, label=algorithm,
                color=colours[algorithm])
    target = _target(record, "target_accuracy")
    if target is not None:
        ax.axhline(target, color="grey", linestyle="--", linewidth=1, label=f"target {target:g}")
    log_scale(ax, "x")
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


def _recorded(rounds: pd.DataFrame, column: str) -> bool:
    return column in rounds and bool(np.isfinite(rounds[column].to_numpy(dtype=float)).any())


def optimization_progress(record) -> Figure | None:
    """f - f* and ||grad f||^2 of the global model (where recorded), and the methods' own
    objective (``objective``: ZO-HFL's global loss, seed 000 Fig. 2) against rounds, gradient
    evaluations, simulated seconds and joules; None when no run records any of them.
    ||grad f||^2 alone, f* unknown, is drawn where it is the measure (quadratic instance:
    non-convex, fedred.md A14) or a run set target_grad_norm_sq; a classifier that records it
    without f* (problem.train_metrics) keeps its accuracy figures only, as before."""
    rounds = record.rounds
    rows = []
    gradients = _recorded(rounds, "grad_norm_sq")
    if _recorded(rounds, "suboptimality"):
        rows.append(("suboptimality", "f(x) - f*"))
        if gradients:
            rows.append(("grad_norm_sq", "||grad f(x)||^2"))
    elif gradients and (_target(record, "target_grad_norm_sq") is not None
                        or not _recorded(rounds, "test_accuracy")):
        rows.append(("grad_norm_sq", "||grad f(x)||^2"))
    if _recorded(rounds, "objective"):
        rows.append(("objective", "objective f(x)"))
    if not rows:
        return None
    axes_cols = [a for a in PROGRESS_AXES if a[0] in rounds]
    fig = new_figure((3.6 * len(axes_cols), 3.0 * len(rows)), 110)
    axes = fig.subplots(len(rows), len(axes_cols), squeeze=False, sharey="row")
    colours = run_colours(record)
    for algorithm, group in rounds.groupby("algorithm", sort=False):
        group = group.sort_values("round")
        for i, (metric, _) in enumerate(rows):
            y = group[metric].where(group[metric] > 0)
            for j, (column, _) in enumerate(axes_cols):
                axes[i, j].plot(group[column], y, linewidth=1.2, color=colours[algorithm],
                                label=algorithm if (i, j) == (0, 0) else None)
    for i, (_, ylabel) in enumerate(rows):
        axes[i, 0].set_ylabel(ylabel)
        log_scale(list(axes[i]), "y")  # the row shares its y axis
        for j, (_, xlabel) in enumerate(axes_cols):
            axes[i, j].grid(True, which="both", alpha=0.3)
            axes[-1, j].set_xlabel(xlabel)
    for i, (metric, _) in enumerate(rows):
        target = _target(record, f"target_{metric}") if metric in (
            "suboptimality", "grad_norm_sq") else None
        if target is not None:
            for ax in axes[i]:
                ax.axhline(target, color="grey", linestyle="--", linewidth=1)
    fig.suptitle(_title(record), fontsize=10)
    # beside the panels (an axes legend, which the layout makes room for, however long the
    # labels), not above them where a wrapped title would run into it
    axes[0, -1].legend(*axes[0, 0].get_legend_handles_labels(), fontsize="small",
                       loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)
    return finish(fig)


def energy_breakdown(record) -> Figure | None:
    """Stacked bars of each algorithm's energy by kind, in the scenario's order of algorithms:
    the devices' kinds, then the base station's transmit energy (hatched, its share of the
    system's energy written above the bar) where the run recorded it.

    Two budgets compare differently [D]: the algorithms of a run stop after their own numbers
    of rounds, so their totals are not a comparison of the methods. Where some algorithm
    reached the run's target, the left panel is the energy to the target (at the first
    evaluated round that met it; "not reached" where one did not), the right the whole run,
    titled with each algorithm's rounds when they differ; else the whole run alone, so
    titled. A kind that is zero in every bar (no idle power, no backward pass) is left out of
    the bars and the legend. The bars' labels are wrapped to the bar's width and written in
    the algorithm's colour; the legend stands beside the axes, never over a bar."""
    if record.rounds.empty:  # a run with no row yet has nothing to compare
        return None
    colours = run_colours(record)
    rounds = record.rounds.sort_values("round", kind="stable")
    order = [a for a in colours if a in set(rounds.algorithm)]
    last = rounds.groupby("algorithm", sort=False).tail(1).set_index("algorithm").loc[order]
    accuracy, gap = _target(record, "target_accuracy"), _target(record, "target_suboptimality")
    gradient = _target(record, "target_grad_norm_sq")
    worst = _target(record, "target_worst_device_accuracy")
    at_target = rounds[reached_mask(rounds, accuracy, gap, None, gradient, worst)].groupby(
        "algorithm", sort=False).head(1).set_index("algorithm")
    at_target = at_target.reindex([a for a in order if a in at_target.index])
    budgets = last["round"].astype(int)
    differ = budgets.nunique() > 1
    whole = ("over the whole run: budgets differ, rounds " + ", ".join(
        f"{a} {n:,}" for a, n in budgets.items()) if differ
        else f"over the whole run ({budgets.iloc[0]:,} rounds each)")
    panels = [(last, whole, "energy over the whole run [J]")]
    if len(at_target):
        goal = describe_target(accuracy, gap, None, gradient, worst)
        panels.insert(0, (at_target, f"to {goal} (first evaluated round that met it)",
                          "energy to the target [J]"))
    kinds = [k for k in energy_kinds(last, record.manifest)
             if any((p[k[0]].fillna(0.0) > 0).any() for p, _, _ in panels)]
    width = max(6.4, 2.4 + 1.1 * len(order)) if len(panels) == 1 else \
        max(11.0, 3.6 + 2.0 * len(order))
    fig = new_figure((width, 4.4), 120)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (rows, title, ylabel) in zip(axes, panels):
        _stacked_kinds(ax, rows, order, kinds, colours, fig.get_figwidth() / len(panels))
        who = "devices + base station" if STATION in kinds else "all devices"
        ax.set_ylabel(f"{ylabel}\n({who})")
        ax.set_title(title, fontsize="medium")
    axes[-1].legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.suptitle("energy by kind", fontsize="medium")
    return finish(fig)


def _stacked_kinds(ax, rows: pd.DataFrame, order: list[str], kinds: list[tuple[str, str]],
                   colours: dict[str, str], inches: float) -> None:
    """One stacked bar per algorithm of ``order`` (``rows`` indexed by algorithm, the ones it
    lacks marked "not reached"): the ``kinds``, the base station's last and hatched."""
    x = np.arange(len(order))
    present = np.array([a in rows.index for a in order])
    rows = rows.reindex(order)
    bottom = np.zeros(len(order))
    for column, label in kinds:
        values = rows[column].fillna(0.0).to_numpy(dtype=float)
        style = STATION_STYLE if column == STATION[0] else \
            {"color": KIND_COLOURS[column], "edgecolor": KIND_EDGE, "linewidth": 0.4}
        ax.bar(x, values, bottom=bottom, label=label, **style)
        if column == STATION[0]:
            for at, devices, bs in zip(x, bottom, values):
                total = devices + bs
                ax.annotate(f"BS {100 * bs / total:.1f}%" if total else "", (at, total),
                            ha="center", va="bottom", fontsize="x-small")
        bottom = bottom + values
    for at in x[~present]:
        ax.annotate("not\nreached", (at, 0), xytext=(0, 4), textcoords="offset points",
                    ha="center", va="bottom", fontsize="x-small", color="0.3")
    # about the characters of a small font that fit in one bar's share of the width [D]
    chars = max(6, int(inches * 72 * 0.7 / max(len(order), 1) / 6))
    ax.set_xticks(x, [textwrap.fill(literal(name), chars) for name in order],
                  fontsize="small")
    for tick, name in zip(ax.get_xticklabels(), order):
        tick.set_color(colours[name])
    drawn = bottom[present]
    ax.set_yscale("log" if len(drawn) and drawn.min() > 0 and drawn.max() / drawn.min() > 100
                  else "linear")


def energy_kinds(rounds, manifest: dict | None = None) -> list[tuple[str, str]]:
    """(column, label) of the kinds of energy ``rounds`` recorded, devices' first: compute split
    into forward and backward where recorded (else one compute column), uplink, downlink, idle,
    then the base station's energy where the run recorded it: its transmit energy, or with the
    EARTH model (the manifest's ``base_station``) its draw on air and asleep."""
    kinds = [(c, label) for c, label in BREAKDOWN if c in rounds]
    if "energy_compute_forward_j" not in rounds and "energy_compute_j" in rounds:
        kinds.insert(0, ("energy_compute_j", "compute"))
    if STATION[0] in rounds and rounds[STATION[0]].notna().any():
        model = ((manifest or {}).get("base_station") or {}).get("power_model")
        kinds.append((STATION[0], "base station (EARTH: on air and asleep)") if model == "earth"
                     else STATION)
    return kinds


def energy_per_round(record) -> Figure | None:
    """One panel per algorithm: the energy spent in each round by kind, stacked. rounds.parquet
    holds cumulative totals at the evaluated rounds, so a round's energy is the difference of
    consecutive rows divided by the rounds between them (the mean per round when eval_every >
    1). None when no algorithm has two recorded rounds."""
    rounds = record.rounds
    # a kind the run never spent (no idle power, no backward pass) is no band and no legend entry
    kinds = [k for k in energy_kinds(rounds, record.manifest)
             if (rounds[k[0]].fillna(0.0) != 0).any()]
    groups = []
    for algorithm, group in rounds.groupby("algorithm", sort=False):
        group = group.sort_values("round", kind="stable").drop_duplicates("round", keep="last")
        if len(group) >= 2:
            groups.append((algorithm, group))
    if not groups or not kinds:
        return None
    cols = min(3, len(groups))
    rows = -(-len(groups) // cols)
    fig = new_figure((4.4 * cols + 1.6, 3.2 * rows + 0.5), 110)
    axes = fig.subplots(rows, cols, squeeze=False)
    colours = run_colours(record)
    spread = False
    for ax, (algorithm, group) in zip(axes.flat, groups):
        edges = group["round"].to_numpy(dtype=float)
        gaps = np.diff(edges)
        spread |= bool((gaps > 1).any())
        bottom = np.zeros(len(gaps))
        for column, label in kinds:
            per_round = np.diff(group[column].fillna(0.0).to_numpy(dtype=float)) / gaps
            style = STATION_STYLE if column == STATION[0] else {"color": KIND_COLOURS[column]}
            ax.stairs(bottom + per_round, edges, baseline=bottom, fill=True, label=label,
                      **style)
            bottom = bottom + per_round
        ax.set_title(algorithm, color=colours[algorithm], fontsize="medium")
        ax.set_xlabel("round")
        ax.xaxis.set_major_locator(whole_numbers())
        ax.set_xlim(edges[0], edges[-1])
        ax.grid(True, axis="y", alpha=0.3)
    for ax in axes[:, 0]:
        ax.set_ylabel("energy per round [J]")
    for ax in list(axes.flat)[len(groups):]:
        ax.set_visible(False)
    axes.flat[cols - 1].legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.suptitle("energy spent in each round, by kind"
                 + (" (mean per round between evaluated rounds)" if spread else ""),
                 fontsize="medium")
    return finish(fig)


def label_histogram(record) -> Figure | None:
    """Stacked bars of each device's training samples by class, from the manifest's partition
    entry; None (nothing drawn) for a run recorded before label counts were kept.

    Up to ``BAR_DEVICES`` devices: one bar per device and class. More: one filled step outline
    per class (C artists whatever N; N x C bar patches took 9.5 minutes and 10.5 GB at 100,000
    devices), and beyond ``MAX_COLUMNS`` devices each step is the mean over k consecutive
    devices (k in the axis label), about one step per pixel column of the figure. A large
    population's manifest keeps the counts of a random sample of devices
    (``label_counts_sample``, results/records.py): those are drawn, one step each, and the
    axis says so (means over consecutive devices would hide the skew a sample shows)."""
    part = record.manifest.get("partition") or {}
    sample = part.get("label_counts_sample") or {}
    counts = np.asarray(sample.get("counts") or part.get("label_counts") or [], dtype=float)
    if counts.ndim != 2 or counts.size == 0:
        return None
    num_devices, num_classes = counts.shape
    colours = matplotlib.colormaps.get_cmap("tab10" if num_classes <= 10 else "tab20" if num_classes <= 20
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
    ax.set_xlabel(f"device: a random sample of {num_devices:,} of the "
                  f"{part.get('num_devices', num_devices):,} devices, in id order"
                  if sample else "device")
    ax.set_ylabel("training samples" if per_step == 1 else
                  f"training samples (mean of {per_step} consecutive devices)")
    ax.set_xlim(-0.6, num_devices - 0.4)
    ax.xaxis.set_major_locator(whole_numbers())
    if num_classes <= 20:
        ax.legend(title="class", fontsize="small", ncol=1 if num_classes <= 10 else 2,
                  loc="upper left", bbox_to_anchor=(1.0, 1.0))
    params = ", ".join(f"{k}={v:g}" if isinstance(v, int | float) else f"{k}={v}"
                       for k, v in (part.get("params") or {}).items())
    tv = part.get("mean_label_tv")
    drawn = (", drawn with replacement" if part.get("with_replacement") else "") \
        + (f", {num_devices:,} sampled devices" if sample else "")
    ax.set_title(textwrap.fill(f"labels per device: {part.get('scheme', '?')}"
                               + (f" ({params})" if params else "") + drawn, 90)
                 + (f"\nmean total-variation distance to the overall mix {tv:.3f}"
                    + (" (over all devices)" if sample else "") if tv is not None else ""),
                 fontsize="medium")
    return finish(fig)


def has_batteries(manifest: dict) -> bool:
    """True when the run's scenario gives some device a battery: a ``battery_j`` set in its
    energy profile or in one of its population's classes (the manifest's resolved scenario)."""
    scenario = manifest.get("scenario") or {}
    stack = [scenario.get("energy"), scenario.get("population")]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            value = node.get("battery_j")
            if isinstance(value, int | float) and not isinstance(value, bool) \
                    and np.isfinite(value) and value > 0:
                return True
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return False


def network_lifetime(record) -> Figure | None:
    """Devices with energy left (dashed, right axis) and test accuracy (solid) against simulated
    time and against cumulative energy. Only for a run in which some device has a battery
    (``has_batteries``, or a battery that ran out in the tables): without one every device
    lives to the end, a flat line at N, and the accuracy is accuracy_vs_time's [D]. A run
    without accuracy (a quadratic) draws the devices alone, on the left axis, and only when
    some device's battery ran out. None for a run recorded before ``alive_devices``."""
    rounds = record.rounds
    if "alive_devices" not in rounds:
        return None
    rounds = rounds.sort_values("round", kind="stable")
    depleted = {a: int(g.alive_devices.iloc[0] - g.alive_devices.min())
                for a, g in rounds.groupby("algorithm", sort=False)}
    if not has_batteries(record.manifest) and not any(depleted.values()):
        return None
    accuracy = np.isfinite(rounds.test_accuracy.to_numpy(dtype=float)).any()
    if not accuracy and not any(depleted.values()):
        return None
    n = record.manifest.get("scenario", {}).get("population", {}).get("num_devices")
    colours = run_colours(record)
    fig = new_figure((11.0, 4.2), 120)
    axes = fig.subplots(1, 2)
    for ax, column, xlabel in ((axes[0], "sim_time_s", "simulated time [s]"),
                               (axes[1], "energy_j", "cumulative energy, all devices [J]")):
        alive_ax = ax.twinx() if accuracy else ax
        for algorithm, group in rounds.groupby("algorithm", sort=False):
            colour = colours[algorithm]
            if accuracy:
                ax.plot(group[column], group.test_accuracy, color=colour, marker=".",
                        markersize=3, label=algorithm)
            alive_ax.step(group[column], group.alive_devices, where="post", color=colour,
                          linestyle="--", linewidth=1.2, label=None if accuracy else algorithm)
        ax.set_xlabel(xlabel)
        if accuracy:
            ax.set_ylabel("test accuracy (solid)")
        alive_ax.set_ylabel("devices with energy left (dashed)")
        alive_ax.set_ylim(0, (n or rounds.alive_devices.max()) * 1.05)
        ax.grid(True, alpha=0.3)
    # beside the panels: inside, a legend would cover the curves of one of two y axes (its
    # 'best' place sees only its own axes' lines)
    handles, labels = axes[0].get_legend_handles_labels()
    axes[1].legend(handles, labels, fontsize="small", loc="upper left",
                   bbox_to_anchor=(1.16 if accuracy else 1.02, 1.0))
    fig.suptitle("network lifetime: devices whose battery ran out, by algorithm: "
                 + ", ".join(f"{a} {k}" for a, k in depleted.items()), fontsize="medium")
    return finish(fig)


def device_energy(record) -> Figure | None:
    """Left: each device's energy over the run by device class and algorithm (box plus one
    point per device). Right: where each class's time went (compute, uplink, downlink, idle),
    as a share of the time its devices were alive. Algorithms differ in colour and in more
    (``MARKERS``, ``HATCHES``): each has its own point marker, and its time bars their own
    hatch, drawn in its colour (an edge colour alone did not tell them apart). None for a run
    recorded before the per-device class and time columns existed."""
    devices = record.devices
    needed = {"device_class", "energy_j", "depleted_at_s", *(c for c, _ in TIME_SPLIT)}
    if devices.empty or not needed <= set(devices.columns):
        return None
    classes = list(dict.fromkeys(devices.device_class))
    algorithms = list(dict.fromkeys(devices.algorithm))
    # a large population's rows are the devices that took part (records.device_records); its
    # manifest entry ("devices") has the class counts and sums over every device
    summaries = {a: (record.manifest.get("algorithms", {}).get(a) or {}).get("devices")
                 for a in algorithms}
    for summary in summaries.values():
        for name in (summary or {}).get("classes", {}):
            if name not in classes:
                classes.append(name)
    width = 0.8 / len(algorithms)
    fig = new_figure((12.0, 4.6), 120)
    ax, time_ax = fig.subplots(1, 2)
    rng = np.random.default_rng(0)  # jitter of the points only
    colours = run_colours(record)
    keys = []  # the time split's legend entries of the algorithms
    spent = dict.fromkeys(TIME_COLOURS, False)  # states some class spent time in
    for a, algorithm in enumerate(algorithms):
        colour = colours[algorithm]
        marker, hatch = MARKERS[a % len(MARKERS)], HATCHES[a % len(HATCHES)]
        rows = devices[devices.algorithm == algorithm]
        positions = np.arange(len(classes)) + (a - (len(algorithms) - 1) / 2) * width
        data = [rows.energy_j[rows.device_class == c].to_numpy() for c in classes]
        box = ax.boxplot(data, positions=positions, widths=width * 0.8, showfliers=False,
                         patch_artist=True, medianprops={"color": colour})
        for patch in box["boxes"]:
            patch.set(facecolor=colour, alpha=0.25, edgecolor=colour)
        for x, c in zip(positions, classes):
            of_class = rows[rows.device_class == c]
            jitter = x + rng.uniform(-0.3, 0.3, len(of_class)) * width
            out = of_class.depleted_at_s.notna().to_numpy()
            ax.scatter(jitter[~out], of_class.energy_j[~out], s=16, color=colour, alpha=0.8,
                       marker=marker, linewidths=0,
                       label=algorithm if x == positions[0] else None)
            ax.scatter(jitter[out], of_class.energy_j[out], s=28, color="black", marker="x",
                       linewidths=0.8,
                       label=f"{algorithm}: battery ran out" if out.any() else None)
        # time split per class (stacked shares of alive time), hatched by algorithm in its
        # colour
        times = _class_times(rows, summaries[algorithm], classes)
        alive_s = np.maximum(times.sum(axis=1).to_numpy(), 1e-300)
        bottom = np.zeros(len(classes))
        for column, label in TIME_SPLIT:
            share = times[column].to_numpy() / alive_s
            time_ax.bar(positions, share, bottom=bottom, width=width * 0.9,
                        color=TIME_COLOURS[column], edgecolor=colour, linewidth=1.2,
                        hatch=hatch)
            bottom += share
            spent[column] |= bool((share > 0).any())
        keys.append(matplotlib.patches.Patch(facecolor="white", edgecolor=colour, hatch=hatch,
                                             linewidth=1.2,
                                             label=textwrap.fill(f"bars: {algorithm}", 28)))
    energies = devices.energy_j[devices.energy_j > 0]
    if len(energies) and energies.max() / energies.min() > 100:
        ax.set_yscale("log")
    summary = next((v for v in summaries.values() if v), None)
    if summary is None:
        per_class = [(devices.device_class == c).sum() // len(algorithms) for c in classes]
    else:
        per_class = [summary["classes"].get(c, {}).get("devices", 0) for c in classes]
    for axis in (ax, time_ax):
        axis.set_xticks(np.arange(len(classes)))
        axis.set_xticklabels([f"{literal(c)}\n({count if summary is None else f'{count:,}'}"
                              " devices)" for c, count in zip(classes, per_class)])
    ax.set_ylabel("energy per device over the run [J]")
    ax.set_title("per-device energy by class" + ("" if summary is None else
                 f"\n(points: {_rows_rule(summaries)}; boxes of those)"), fontsize="medium")
    ax.legend(fontsize="small")
    ax.grid(True, axis="y", which="both", alpha=0.3)
    time_ax.set_ylabel("share of the time alive")
    time_ax.set_ylim(0, 1.0)
    time_ax.set_title("where each class's time went (bars: " + ", ".join(algorithms) + ")"
                      + ("" if summary is None else "\n(summed over every device)"),
                      fontsize="medium")
    states = [matplotlib.patches.Patch(facecolor=TIME_COLOURS[column], edgecolor=KIND_EDGE,
                                       linewidth=0.4, label=label)
              for column, label in TIME_SPLIT if spent[column]]  # none of zero height
    time_ax.legend(handles=states + keys, fontsize="small", loc="upper left",
                   bbox_to_anchor=(1.0, 1.0))
    return finish(fig)


def _class_times(rows, summary: dict | None, classes: list[str]):
    """Seconds in each state (TIME_SPLIT) per device class: summed over ``rows``, or, for a
    large population, over every device (the manifest's summary)."""
    columns = [c for c, _ in TIME_SPLIT]
    if summary is None:
        return rows.groupby("device_class")[columns].sum().reindex(classes)
    sums = summary.get("classes", {})
    return pd.DataFrame([[sums.get(c, {}).get(k) or 0.0 for k in columns] for c in classes],
                        index=classes, columns=columns)


def _rows_rule(summaries: dict) -> str:
    """What the rows of a large population's devices.parquet are, per algorithm (its manifest
    summaries), in a few words."""
    said = []
    for algorithm, s in summaries.items():
        if s:
            sample = "" if s["rows_written"] == s["took_part"] else \
                f", a random {s['rows_written']:,}"
            said.append(f"{algorithm} {s['took_part']:,} of {s['num_devices']:,} took part"
                        + sample)
    return "; ".join(said)


def device_accuracy(record) -> Figure | None:
    """Left: each algorithm's accuracy on every device's own test distribution at its last
    evaluation (box plus one point per device). Right: the worst device's accuracy and the mean
    of the worst k against cumulative energy, the scenario's target_worst_device_accuracy drawn
    across it where set. None for runs without per-device accuracy (a quadratic, or recorded
    before the column existed)."""
    rounds = record.rounds
    if "device_accuracy" not in rounds or rounds.device_accuracy.isna().all():
        return None
    fig = new_figure((12.0, 4.6), 120)
    ax, energy_ax = fig.subplots(1, 2)
    rng = np.random.default_rng(0)  # jitter of the points only
    names = []
    colours = run_colours(record)
    sampled = 0  # devices of the largest population whose points are a sample
    infos = record.manifest.get("algorithms", {})
    listed = {name: len(info["device_accuracy_devices"]) for name, info in infos.items()
              if "device_accuracy_devices" in info}  # rows list a sample (records.py)
    for a, (algorithm, group) in enumerate(rounds.groupby("algorithm", sort=False)):
        colour = colours[algorithm]
        group = group[group.device_accuracy.notna()].sort_values("round")
        if group.empty:
            continue
        names.append(algorithm)
        values = np.asarray(group.device_accuracy.iloc[-1], dtype=float)
        box = ax.boxplot([values[np.isfinite(values)]], positions=[a], widths=0.6,
                         showfliers=False, patch_artist=True, medianprops={"color": colour})
        for patch in box["boxes"]:
            patch.set(facecolor=colour, alpha=0.25, edgecolor=colour)
        size, alpha = 12, 0.8
        if len(values) > POINT_DEVICES:  # a large population: points of a random sample
            sampled = max(sampled, len(values))
            values = values[np.sort(rng.choice(len(values), POINT_DEVICES, replace=False))]
            size, alpha = 4, 0.4
        ax.scatter(a + rng.uniform(-0.2, 0.2, len(values)), values, s=size, color=colour,
                   alpha=alpha)
        x = group.energy_j.where(group.energy_j > 0)
        energy_ax.plot(x, group.worst_device_accuracy, color=colour, marker=".",
                       label=f"{algorithm}: worst device")
        energy_ax.plot(x, group.worst_k_device_accuracy, color=colour, linestyle="--",
                       label=f"{algorithm}: worst k")
    worst = _target(record, "target_worst_device_accuracy")
    if worst is not None:
        energy_ax.axhline(worst, color="grey", linestyle="--", linewidth=1,
                          label=f"target {worst:g}")
    fraction = record.manifest.get("scenario", {}).get("worst_fraction", 0.1)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels([literal(name) for name in names], rotation=20, ha="right")
    ax.set_ylabel("accuracy on the device's own label mix")
    population = record.manifest.get("scenario", {}).get("population", {}).get("num_devices")
    if listed:  # the rounds rows hold a sample's accuracies
        note = (f"\n(boxes and points: a random {max(listed.values()):,} of the "
                f"{population:,} devices)")
    elif sampled:
        note = f"\n(boxes: all {sampled:,} devices; points: a random {POINT_DEVICES:,})"
    else:
        note = ""
    ax.set_title("per-device accuracy at the last evaluation" + note, fontsize="medium")
    ax.grid(True, axis="y", alpha=0.3)
    log_scale(energy_ax, "x")
    energy_ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # no crowded labels
    energy_ax.set_xlabel("cumulative energy, all devices [J]")
    energy_ax.set_ylabel("accuracy")
    energy_ax.set_title(f"worst device, and mean of the worst k = ceil({fraction:g} N)"
                        + ("\n(over all devices)" if listed else ""), fontsize="medium")
    energy_ax.grid(True, which="both", alpha=0.3)
    energy_ax.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return finish(fig)


# Every per-run figure, in the order the report shows them; the key is the PNG's stem.
FIGURES: dict[str, Callable[..., Figure | None]] = {
    "accuracy_vs_energy": accuracy_vs_energy,
    "accuracy_vs_time": accuracy_vs_time,
    "energy_breakdown": energy_breakdown,
    "energy_per_round": energy_per_round,
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
