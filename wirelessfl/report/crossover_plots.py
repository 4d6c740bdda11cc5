"""The crossover figure: one panel per metric (time, device energy, system energy to the target)
over uplink rate x device throughput, the cells where the method beats every baseline shaded in
the method's colour, the boundary against each baseline drawn in that baseline's colour (the
colours of every other figure, report/colours.py), the scenario's point marked."""

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
    for ax, (name, title) in zip(axes, METRICS):
        won = result.wins[name]["all"].astype(float)
        ax.pcolormesh(result.rate, result.theta, won, cmap=shade, vmin=0, vmax=1,
                      shading="nearest")
        for k, b in enumerate(result.baselines):
            style = styles[k % len(styles)]
            if name == "time":
                theta, _ = result.boundary[b]
                ok = np.isfinite(theta)
                ax.plot(result.rate[ok], theta[ok], style, color=colours[b], lw=1.6,
                        label=f"equal time with {b}")
            elif result.wins[name][b].any() and not result.wins[name][b].all():
                ax.contour(result.rate, result.theta, result.wins[name][b].astype(float),
                           levels=[0.5], colors=[colours[b]], linestyles=style, linewidths=1.6)
                ax.plot([], [], style, color=colours[b], label=f"equal energy with {b}")
        # black with a white edge: no algorithm's colour, seen on the shade and off it
        ax.plot(result.rate0, result.theta0, "*", color="black", markeredgecolor="white",
                ms=14, label="scenario")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(result.rate[0], result.rate[-1])
        ax.set_ylim(result.theta[0], result.theta[-1])
        ax.set_xlabel("uplink rate [bit/s]")
        ax.set_title(f"{title}\nshaded: {result.method} beats {', '.join(result.baselines)}",
                     fontsize=9)
        # below the panel: inside it, a legend would hide the shading it explains
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2,
                  frameon=False)
    axes[0].set_ylabel("device compute throughput [MAC/s]")
    return save_figure(fig, path, 110)
