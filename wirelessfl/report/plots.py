"""Figures drawn from a saved run alone (never re-simulating): accuracy vs energy and vs simulated
time, where the energy went, and which labels each device holds."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from wirelessfl.results.records import RunRecord

BREAKDOWN = [("energy_compute_forward_j", "compute (forward)"),
             ("energy_compute_backward_j", "compute (backward)"),
             ("energy_uplink_j", "uplink"), ("energy_downlink_j", "downlink")]


def _accuracy_against(record: RunRecord, column: str, xlabel: str, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for algorithm, group in record.rounds.groupby("algorithm", sort=False):
        group = group.sort_values("round")
        x = group[column].where(group[column] > 0)
        ax.plot(x, group.test_accuracy, marker=".", markersize=3, label=algorithm)
    if record.target_accuracy is not None:
        ax.axhline(record.target_accuracy, color="grey", linestyle="--", linewidth=1,
                   label=f"target {record.target_accuracy:g}")
    ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("test accuracy")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    ax.set_title(record.manifest.get("scenario", {}).get("name", ""))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def energy_breakdown(record: RunRecord, path: Path) -> Path:
    """Stacked bars of each algorithm's total energy by kind, at its last round."""
    last = record.rounds.sort_values("round").groupby("algorithm", sort=False).tail(1)
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    bottom = [0.0] * len(last)
    names = list(last.algorithm)
    for column, label in BREAKDOWN:
        values = list(last[column])
        ax.bar(names, values, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_ylabel("energy over the whole run [J] (all devices)")
    ax.set_yscale("log" if max(bottom, default=0) / max(min(bottom, default=1), 1e-30) > 100
                  else "linear")
    ax.legend()
    ax.set_title("energy by kind")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def label_histogram(record: RunRecord, path: Path) -> Path | None:
    """Stacked bars of each device's training samples by class, from the manifest's partition
    entry; None (nothing drawn) for a run recorded before label counts were kept."""
    part = record.manifest.get("partition") or {}
    counts = np.asarray(part.get("label_counts") or [], dtype=float)
    if counts.ndim != 2 or counts.size == 0:
        return None
    num_devices, num_classes = counts.shape
    colours = plt.get_cmap("tab10" if num_classes <= 10 else "tab20" if num_classes <= 20
                           else "viridis")
    fig, ax = plt.subplots(figsize=(min(16.0, max(6.4, 0.12 * num_devices)), 4.2))
    x, bottom = np.arange(num_devices), np.zeros(num_devices)
    for c in range(num_classes):
        colour = colours(c if num_classes <= 20 else c / max(num_classes - 1, 1))
        ax.bar(x, counts[:, c], bottom=bottom, width=0.9 if num_devices <= 100 else 1.0,
               color=colour, label=str(c), linewidth=0)
        bottom += counts[:, c]
    ax.set_xlabel("device")
    ax.set_ylabel("training samples")
    ax.set_xlim(-0.6, num_devices - 0.4)
    if num_classes <= 20:
        ax.legend(title="class", fontsize="small", ncol=1 if num_classes <= 10 else 2,
                  loc="upper left", bbox_to_anchor=(1.0, 1.0))
    params = ", ".join(f"{k}={v:g}" for k, v in (part.get("params") or {}).items())
    tv = part.get("mean_label_tv")
    ax.set_title(f"labels per device: {part.get('scheme', '?')}" + (f" ({params})" if params else "")
                 + (f"\nmean total-variation distance to the overall mix {tv:.3f}"
                    if tv is not None else ""), fontsize="medium")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def draw_report(record: RunRecord, out_dir: Path | None = None) -> list[Path]:
    """Write the run's PNG figures next to its results; returns their paths (the label histogram
    only when the manifest has label counts)."""
    out = Path(out_dir or record.path)
    paths = [
        _accuracy_against(record, "energy_j", "cumulative energy, all devices [J]",
                          out / "accuracy_vs_energy.png"),
        _accuracy_against(record, "sim_time_s", "simulated time [s]", out / "accuracy_vs_time.png"),
        energy_breakdown(record, out / "energy_breakdown.png"),
    ]
    histogram = label_histogram(record, out / "label_histogram.png")
    return paths + ([histogram] if histogram is not None else [])
