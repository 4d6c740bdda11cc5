"""The crossover figure: one panel per metric (time, device energy, system energy to the target)
over uplink rate x device throughput, the cells where the method beats every baseline shaded,
the closed-form time boundary against each baseline drawn, the scenario's point marked."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from wirelessfl.report.plots import new_figure, save_figure
from wirelessfl.tune.crossover import METRICS, Crossover


def draw_crossover(result: Crossover, path: Path) -> Path:
    """Write the three-panel figure to ``path``."""
    fig = new_figure((5.0 * len(METRICS), 4.4), 110)
    axes = fig.subplots(1, len(METRICS), sharey=True)
    styles = ["--", ":", "-."]
    for ax, (name, title) in zip(axes, METRICS):
        won = result.wins[name]["all"].astype(float)
        ax.pcolormesh(result.rate, result.theta, won, cmap="Greens", vmin=0, vmax=1.6,
                      shading="nearest")
        for k, b in enumerate(result.baselines):
            style = styles[k % len(styles)]
            if name == "time":
                theta, _ = result.boundary[b]
                ok = np.isfinite(theta)
                ax.plot(result.rate[ok], theta[ok], style, color="k", lw=1.2,
                        label=f"equal time with {b}")
            elif result.wins[name][b].any() and not result.wins[name][b].all():
                ax.contour(result.rate, result.theta, result.wins[name][b].astype(float),
                           levels=[0.5], colors="k", linestyles=style, linewidths=1.2)
                ax.plot([], [], style, color="k", label=f"equal energy with {b}")
        ax.plot(result.rate0, result.theta0, "r*", ms=13, label="scenario")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(result.rate[0], result.rate[-1])
        ax.set_ylim(result.theta[0], result.theta[-1])
        ax.set_xlabel("uplink rate [bit/s]")
        ax.set_title(f"{title}\nshaded: {result.method} beats {', '.join(result.baselines)}",
                     fontsize=9)
        ax.legend(fontsize=7, loc="lower right")
    axes[0].set_ylabel("device compute throughput [MAC/s]")
    return save_figure(fig, path, 110)
