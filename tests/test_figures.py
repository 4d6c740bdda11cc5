"""The per-run figures as functions (report/plots.py FIGURES): one colour per algorithm label in
every figure of a run and of a comparison, read back from the Figure objects; no figure without
data (a short quadratic run); titles inside the figure for long names; the per-round energy by
kind against numpy differences of the cumulative columns; the Pareto front's rule on a
hand-built example."""

from __future__ import annotations

import itertools
from pathlib import Path

import matplotlib.colors
import matplotlib.container
import numpy as np
import pandas as pd
import pytest

from wirelessfl.cli import main
from wirelessfl.report import plots
from wirelessfl.report.colours import FIXED, PALETTE
from wirelessfl.report.compare_plots import (
    accuracy_bands,
    energy_to_target,
    pareto_front,
    pareto_indices,
    pareto_joined,
)
from wirelessfl.results.compare import compare_records
from wirelessfl.results.records import RunRecord, read_run

KINDS = ["energy_compute_forward_j", "energy_compute_backward_j", "energy_uplink_j",
         "energy_downlink_j", "energy_idle_j", "energy_bs_j"]


def _record(labels=("A", "B", "C"), rounds_order=(2, 0, 1), devices_order=(1, 2, 0),
            name="toy", seed=0, eval_every=1, path=Path("/runs/toy")) -> RunRecord:
    """A hand-made run of the ``labels`` (the scenario's order) whose rounds and devices tables
    list them in other orders: every figure has data (accuracy, f - f*, batteries running out,
    per-device accuracy, label counts)."""
    rng = np.random.default_rng(seed)
    frames, device_frames = [], []
    n = 4
    for a in rounds_order:
        r = np.arange(0, 7 * eval_every, eval_every)
        spent = {k: np.concatenate([[0.0], np.cumsum(rng.uniform(0.1, 1.0, len(r) - 1))])
                 for k in KINDS}
        devices_energy = sum(spent[k] for k in KINDS[:5])
        accuracy = np.linspace(0.1, 0.6 + 0.1 * a, len(r))
        frames.append(pd.DataFrame({
            "algorithm": labels[a], "round": r, "sim_time_s": r * 0.5, **spent,
            "energy_compute_j": spent[KINDS[0]] + spent[KINDS[1]], "energy_j": devices_energy,
            "energy_system_j": devices_energy + spent["energy_bs_j"],
            "bits_up": r * 100.0, "delivered_fraction": 1.0, "test_accuracy": accuracy,
            "alive_devices": np.maximum(n - r // (3 * eval_every), 1),
            "suboptimality": 10.0 ** -r, "grad_norm_sq": 10.0 ** -(2 * r),
            "gradient_evaluations": r * 2.0,
            "device_accuracy": [list(accuracy[i] + 0.05 * np.arange(n)) for i in range(len(r))],
            "worst_device_accuracy": accuracy, "worst_k_device_accuracy": accuracy + 0.02}))
    for a in devices_order:
        device_frames.append(pd.DataFrame({
            "algorithm": labels[a], "device": range(n), "device_class": ["phone", "phone",
                                                                          "sensor", "sensor"],
            "energy_j": rng.uniform(1, 2, n), "depleted_at_s": [np.nan, 2.0, np.nan, np.nan],
            "compute_s": 1.0, "uplink_s": 2.0, "downlink_s": 0.5, "idle_s": 0.5}))
    counts = rng.integers(0, 9, (n, 3)).tolist()
    scenario = {"name": name, "seed": seed, "target_accuracy": 0.5,
                "population": {"num_devices": n},
                "algorithms": [{"name": "fedavg", "label": label, "lr": 0.1} for label in labels]}
    manifest = {"seed": seed, "scenario": scenario, "status": "complete",
                "partition": {"scheme": "iid", "params": {}, "label_counts": counts}}
    return RunRecord(path, pd.concat(frames, ignore_index=True),
                     pd.concat(device_frames, ignore_index=True), manifest)


def _hex(colour) -> str:
    return matplotlib.colors.to_hex(colour)


def _label_colours(fig) -> dict[str, set[str]]:
    """label -> the colours of every line, point set and error-bar set drawn under it in
    ``fig`` (an algorithm's entries read 'A', 'A: worst device', 'A (2 seeds)'), and of the
    per-round figure's panel titles."""
    seen: dict[str, set[str]] = {}

    def add(label: str, colour) -> None:
        label = label.split(":")[0].split(" (")[0]
        if not label.startswith("_"):
            seen.setdefault(label, set()).add(_hex(colour))

    for ax in fig.axes:
        for line in ax.get_lines():
            add(line.get_label(), line.get_color())
        for points in ax.collections:
            if "battery ran out" in points.get_label():  # black crosses, whatever the algorithm
                continue
            if len(points.get_facecolors()):
                add(points.get_label(), points.get_facecolors()[0])
        for container in ax.containers:
            if isinstance(container, matplotlib.container.ErrorbarContainer):
                add(container.get_label(), container.lines[0].get_color())
        if ax.title.get_text() in ("A", "B", "C"):  # the per-round figure's panels
            add(ax.title.get_text(), ax.title.get_color())
    return seen


def test_an_algorithm_has_one_colour_in_every_figure_of_a_run_and_of_a_comparison():
    """Rounds list C, A, B and devices B, C, A; the scenario lists A, B, C, three labels of
    FedAvg: A has FedAvg's colour, B and C the palette's first two colours no label holds
    (report/colours.py), in every figure that draws algorithms (each figure used to take its
    own table's order, so the same label changed colour between figures)."""
    record = _record()
    want = {"A": FIXED["fedavg"], "B": PALETTE[0], "C": PALETTE[1]}
    drawn = 0
    for name, figure in plots.FIGURES.items():
        fig = figure(record)
        colours = {k: v for k, v in _label_colours(fig).items() if k in want}
        if name not in ("energy_breakdown", "label_histogram"):  # kinds and classes, not algorithms
            assert colours == {k: {c} for k, c in want.items()}, name
            drawn += 1
    assert drawn == 7
    comp = compare_records([_record(seed=s, path=Path(f"/runs/{s}")) for s in range(2)])
    for fig in (accuracy_bands(comp, "energy_j", "energy"), energy_to_target(comp),
                pareto_front(comp)):
        colours = {k: v for k, v in _label_colours(fig).items() if k in want}
        assert colours == {k: {c} for k, c in want.items()}


def test_per_round_energy_is_the_difference_of_the_cumulative_columns():
    """Rows every 3 rounds (eval_every = 3): each stacked step is (cumulative[k] - cumulative[k-1])
    / 3 per kind, and the stack's top times the 3 rounds is the difference of the devices' plus
    the base station's cumulative energy (numpy on the table)."""
    record = _record(eval_every=3)
    fig = plots.energy_per_round(record)
    panels = {ax.get_title(): ax for ax in fig.axes if ax.get_visible()}
    assert set(panels) == {"A", "B", "C"}
    for label, ax in panels.items():
        rows = record.rounds[record.rounds.algorithm == label].sort_values("round")
        stairs = [p for p in ax.patches if isinstance(p, matplotlib.patches.StepPatch)]
        assert [p.get_label() for p in stairs] == ["compute (forward)", "compute (backward)",
                                                   "uplink", "downlink", "idle",
                                                   "base station (transmit)"]
        top = np.zeros(len(rows) - 1)
        for patch, column in zip(stairs, KINDS):
            values, edges, baseline = patch.get_data()
            np.testing.assert_array_equal(edges, rows["round"].to_numpy(dtype=float))
            np.testing.assert_allclose(values - baseline, np.diff(rows[column]) / 3, rtol=1e-12)
            top = values
        total = np.diff(rows.energy_j.to_numpy() + rows.energy_bs_j.to_numpy())
        np.testing.assert_allclose(top * 3, total, rtol=1e-12)
        np.testing.assert_allclose(top * 3, np.diff(rows.energy_system_j), rtol=1e-12)
    assert "mean per round" in fig.get_suptitle()


def test_titles_stay_inside_the_figure_for_long_names():
    """A 200-character scenario name and 60-character labels: after drawing, every figure's
    title and every axes title lies inside the figure, and no axes title is wider than its
    axes (long titles used to run off both edges)."""
    labels = tuple(f"{c} a long algorithm label with several settings, K=10, lr=0.01"
                   for c in "ABC")
    name = "a-scenario-name-" + "-".join(["very-long"] * 20)
    record = _record(labels=labels, name=name)
    for key, figure in plots.FIGURES.items():
        fig = figure(record)
        fig.canvas.draw()
        box = fig.bbox
        renderer = fig.canvas.get_renderer()
        titles = [(fig._suptitle, box.width)] if fig._suptitle is not None else []
        titles += [(ax.title, ax.bbox.width) for ax in fig.axes if ax.get_visible()]
        for title, room in titles:
            if not title.get_text():
                continue
            extent = title.get_window_extent(renderer)
            assert extent.x0 >= box.x0 - 0.5 and extent.x1 <= box.x1 + 0.5, (key, title)
            assert extent.y0 >= box.y0 - 0.5 and extent.y1 <= box.y1 + 0.5, (key, title)
            assert extent.width <= room + 0.5, (key, title.get_text())
        if key == "energy_breakdown":  # the algorithms' names under the bars: side by side
            ticks = [t.get_window_extent(renderer) for t in fig.axes[0].get_xticklabels()]
            assert all(left.x1 <= right.x0 for left, right in itertools.pairwise(ticks))
            assert ticks[0].x0 >= box.x0 and ticks[-1].x1 <= box.x1


def test_a_title_that_fits_is_left_as_written():
    fig = plots.accuracy_vs_energy(_record())
    assert fig.axes[0].get_title() == "toy"


def test_a_short_quadratic_run_writes_no_empty_figure(tmp_path, capsys):
    """seed004-quadratic (no accuracy, no batteries) at 3 rounds per algorithm: the accuracy and
    network-lifetime figures have nothing to draw and are not written; every written figure
    has, in every axes that holds lines or bars, one with finite data (the lifetime figure used
    to draw an accuracy axis of all-NaN lines beside a flat line of 5 devices)."""
    out = tmp_path / "run"
    sets = [f"algorithms.{i}.rounds=3" for i in range(6)]
    assert main(["run", "seed004-quadratic", "--out", str(out), "--quiet", "--no-report",
                 *(a for s in sets for a in ("--set", s))]) == 0
    record = read_run(out)
    written = plots.draw_report(record)
    assert {p.stem for p in written} == {"energy_breakdown", "energy_per_round", "device_energy",
                                         "optimization_progress"}
    for path in written:
        fig = plots.FIGURES[path.stem](record)
        assert _has_data(fig), path.stem
        for ax in fig.axes:
            if ax.get_lines() and ax.get_visible():
                assert any(_finite(line.get_xydata()) for line in ax.get_lines()), path.stem


def _finite(xy) -> bool:
    xy = np.asarray(xy, dtype=float)
    return bool(len(xy)) and bool(np.isfinite(xy).all(axis=1).any())


def _has_data(fig) -> bool:
    for ax in fig.axes:
        if any(_finite(line.get_xydata()) for line in ax.get_lines()):
            return True
        if any(p.get_height() > 0 for p in ax.patches if hasattr(p, "get_height")):
            return True
        if any(isinstance(p, matplotlib.patches.StepPatch) and np.any(p.get_data()[0] > 0)
               for p in ax.patches):
            return True
        if any(len(c.get_offsets()) for c in ax.collections):
            return True
    return False


def test_a_run_without_accuracy_and_without_depletion_has_no_lifetime_figure():
    record = _record()
    record.rounds = record.rounds.assign(test_accuracy=np.nan, alive_devices=4)
    assert plots.network_lifetime(record) is None
    assert plots.accuracy_vs_energy(record) is None and plots.accuracy_vs_time(record) is None
    ran_out = _record()
    ran_out.rounds = ran_out.rounds.assign(test_accuracy=np.nan)
    fig = plots.network_lifetime(ran_out)  # batteries ran out: the devices alone, one axis each
    assert len(fig.axes) == 2 and all(_finite(ax.get_lines()[0].get_xydata()) for ax in fig.axes)


# ---- the Pareto front with confidence intervals --------------------------------------------
#   point  energy  ± ci    accuracy  ± ci
#     0     1.0    0.1      0.50     0.01   cheapest
#     1     1.05   0.1      0.52     0.05   overlaps 0 on both axes: indistinguishable from 0
#     2     3.0    0.1      0.80     0.01   a clear step up from 0 and 1
#     3     3.1    0.1      0.70     0.01   beaten by 2 (more energy, accuracy interval below)
#     4     3.05   0.2      0.79     0.02   beaten by 2 in the means only, intervals overlap
#     5     5.0    0.1      0.95     0.01   the top step
#     6     6.0    0.1      0.90     0.01   beaten by 5 on both axes
ENERGY = np.array([1.0, 1.05, 3.0, 3.1, 3.05, 5.0, 6.0])
ENERGY_CI = np.array([0.1, 0.1, 0.1, 0.1, 0.2, 0.1, 0.1])
ACCURACY = np.array([0.50, 0.52, 0.80, 0.70, 0.79, 0.95, 0.90])
ACCURACY_CI = np.array([0.01, 0.05, 0.01, 0.01, 0.02, 0.01, 0.01])


def test_pareto_front_keeps_points_beaten_only_within_their_intervals():
    assert pareto_indices(ENERGY, ACCURACY, ENERGY_CI, ACCURACY_CI) == [0, 1, 2, 4, 5]
    # without intervals, the plain front of the means: 4 is beaten by 2 there
    assert pareto_indices(ENERGY, ACCURACY) == [0, 1, 2, 5]
    assert pareto_indices(ENERGY, ACCURACY, np.full(7, np.nan), np.full(7, np.nan)) == [0, 1, 2, 5]


def test_pareto_front_joins_only_points_told_apart_from_the_rest_of_the_front():
    # 0 and 1 overlap on both axes, 2 and 4 too: only 5 is apart from every other front point
    assert pareto_joined(ENERGY, ACCURACY, ENERGY_CI, ACCURACY_CI) == [5]
    apart = ACCURACY_CI.copy()
    apart[1] = 0.005  # 1 now differs from 0 in accuracy (0.02 > 0.015): both are steps
    assert pareto_joined(ENERGY, ACCURACY, ENERGY_CI, apart) == [0, 1, 5]


@pytest.mark.parametrize("ci", [None, np.zeros(7)])
def test_pareto_joined_without_intervals_is_the_plain_front(ci):
    assert pareto_joined(ENERGY, ACCURACY, ci, ci) == pareto_indices(ENERGY, ACCURACY)


def test_log_axes_without_positive_data_stay_linear_instead_of_raising():
    """A damaged run folder (the fuzz suite found one: rounds.parquet's energy_j all NaN, and
    f - f* at 0) gives figures with linear axes where nothing positive was drawn, instead of
    matplotlib's "Data cannot be log-scaled" traceback; with data the axes are logarithmic."""
    class Record:
        def __init__(self, rounds):
            self.rounds, self.devices = rounds, pd.DataFrame()
            self.manifest = {"scenario": {"target_accuracy": 0.5}}

    rounds = pd.DataFrame({
        "algorithm": ["A"] * 3, "round": [0, 1, 2], "test_accuracy": [0.1, 0.4, 0.6],
        "energy_j": [np.nan] * 3, "sim_time_s": [0.0, 1.0, 2.0],
        "gradient_evaluations": [0, 10, 20], "suboptimality": [0.0, 0.0, 0.0],
        "device_accuracy": [[0.1, 0.2]] * 3, "worst_device_accuracy": [0.1] * 3,
        "worst_k_device_accuracy": [0.1] * 3})
    fig = plots.accuracy_vs_energy(Record(rounds))
    assert fig.axes[0].get_xscale() == "linear"
    assert plots.device_accuracy(Record(rounds)).axes[1].get_xscale() == "linear"
    assert all(ax.get_yscale() == "linear"
               for ax in plots.optimization_progress(Record(rounds)).axes)
    rounds["energy_j"] = [0.0, 2.0, 5.0]
    rounds["suboptimality"] = [1.0, 0.5, 0.0]
    assert plots.accuracy_vs_energy(Record(rounds)).axes[0].get_xscale() == "log"
    assert plots.device_accuracy(Record(rounds)).axes[1].get_xscale() == "log"
    assert all(ax.get_yscale() == "log" for ax in plots.optimization_progress(Record(rounds)).axes)
