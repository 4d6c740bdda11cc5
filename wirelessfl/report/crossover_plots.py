"""The crossover figure: one panel per metric (time, device energy, system energy to the target)
over uplink rate x device throughput, the cells where the method beats every baseline shaded in
the method's colour, the boundary against each baseline drawn in that baseline's colour (the
colours of every other figure, report/colours.py), the scenario's point marked.

The spread over the evaluation seeds (tune/crossover.py ``time_band``, ``energy_seed_wins``) is a
hatched band in the baseline's colour: around the line of equal time, the throughputs at which
the seeds disagree about who is faster; on the energy panels, the rates at which they disagree
about who spends less. Hatched, not filled, so that the win shading stays readable under it. The
rates the MCS table carries on the uplink band end the rate axis (the default range is clipped
to them, a wider one refused); where the axis ends there, a grey bar marks it."""

from __future__ import annotations

from pathlib import Path

import matplotlib.colors
import numpy as np

from wirelessfl.report.colours import algorithm_colours
from wirelessfl.report.plots import new_figure, save_figure
from wirelessfl.tune.crossover import METRICS, Crossover


def draw_crossover(result: Crossover, path: Path) -> Path:
    """Write the three-panel figure to ``path``."""
    labels = [result.method, *result.baselines]
    colours = algorithm_colours([(label, result.names.get(label)) for label in labels])
    # white where the method loses, a light tint of its colour where it wins
    shade = matplotlib.colors.ListedColormap(
        ["white", matplotlib.colors.to_rgba(colours[result.method], 0.3)])
    fig = new_figure((5.0 * len(METRICS), 4.4), 110)
    axes = fig.subplots(1, len(METRICS), sharey=True)
    styles = ["--", ":", "-."]
    hatches = ["////", "\\\\", "xx"]
    for ax, (name, title) in zip(axes, METRICS):
        won = result.wins[name]["all"].astype(float)
        ax.pcolormesh(result.rate, result.theta, won, cmap=shade, vmin=0, vmax=1,
                      shading="nearest")
        for k, b in enumerate(result.baselines):
            style = styles[k % len(styles)]
            hatch = {"facecolor": "none", "edgecolor": colours[b], "lw": 0, "alpha": 0.6,
                     "hatch": hatches[k % len(hatches)]}
            pairs = result.pairs.get(b, 1)
            if name == "time":
                theta, _ = result.boundary[b]
                ok = np.isfinite(theta)
                if b in result.band and pairs > 1:
                    # 0 and inf (a seed faster everywhere, or never) reach the panel's edges
                    low, high = (np.clip(edge, result.theta[0], result.theta[-1])
                                 for edge in result.band[b])
                    split = ~np.isnan(low)
                    if split.any():
                        ax.fill_between(result.rate, low, high, where=split, **hatch,
                                        label=f"{b}: seeds disagree ({pairs})")
                ax.plot(result.rate[ok], theta[ok], style, color=colours[b], lw=1.6,
                        label=f"equal time with {b}")
                continue
            counts = result.seed_wins.get(name, {}).get(b)
            if counts is not None and pairs > 1:
                split = (counts > 0) & (counts < pairs)
                if split.any():
                    ax.fill_between(result.rate, result.theta[0], result.theta[-1],
                                    where=split, step="mid", **hatch,
                                    label=f"{b}: seeds disagree ({pairs})")
            if result.wins[name][b].any() and not result.wins[name][b].all():
                ax.contour(result.rate, result.theta, result.wins[name][b].astype(float),
                           levels=[0.5], colors=[colours[b]], linestyles=style, linewidths=1.6)
                ax.plot([], [], style, color=colours[b], label=f"equal energy with {b}")
        _mark_carried(ax, result)
        # black with a white edge: no algorithm's colour, seen on the shade and off it
        ax.plot(result.rate0, result.theta0, "*", color="black", markeredgecolor="white",
                ms=14, label="scenario")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(result.rate[0], result.rate[-1])
        ax.set_ylim(result.theta[0], result.theta[-1])
        ax.set_xlabel("uplink rate [bit/s]" + (
            f"; the MCS table carries {result.carried[0]:.3g} to {result.carried[1]:.3g}"
            if result.carried is not None else ""), fontsize=9)
        ax.set_title(f"{title}\nshaded: {result.method} beats {', '.join(result.baselines)}",
                     fontsize=9)
        # below the panel: inside it, a legend would hide the shading it explains
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2,
                  frameon=False)
    axes[0].set_ylabel("device compute throughput [MAC/s]")
    return save_figure(fig, path, 110)


def _mark_carried(ax, result: Crossover) -> None:
    """A grey bar on each end of the rate axis that is an end of the MCS table's rates."""
    if result.carried is None:
        return
    shown = False
    for edge, end in zip(result.carried, (result.rate[0], result.rate[-1])):
        if np.isclose(edge, end, rtol=1e-6):
            ax.axvline(end, color="0.45", lw=4,
                       label=None if shown else "end of the MCS table's rates")
            shown = True
