"""DZOFL against FedAvg as the devices' transmit power drops (scenarios/radio-power-sweep.yaml).

For each power the scenario runs once (same seed, so the same placement, data and fading streams)
and the script records, per algorithm: time and energy to the target accuracy, the final
accuracy, the share of uploads that arrived in time and the uploads cut off by the deadline.
It writes a JSON table and a two-panel figure (time and energy to target against power).

    python benchmarks/radio_power_sweep.py [--powers 23 10 0 -10 -20 -30 -35 -40]
        [--out benchmarks/radio_power_sweep.json] [--figure docs/img/radio_power_sweep.png]
"""

from __future__ import annotations

import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from wirelessfl.pipeline.build import build_world
from wirelessfl.pipeline.simulation import run_algorithm
from wirelessfl.report.colours import algorithm_colours
from wirelessfl.results.summary import summarize
from wirelessfl.scenario.loader import load_scenario


def sweep(powers: list[float]) -> list[dict]:
    rows = []
    for power in powers:
        scenario = load_scenario("radio-power-sweep", [f"channel.uplink.tx_power_dbm={power}"])
        world = build_world(scenario)
        runs = [run_algorithm(world, params) for params in scenario.algorithms]
        table = summarize(pd.DataFrame([r for run in runs for r in run.rows]),
                          scenario.target_accuracy, world.num_devices)
        for run, (_, summary) in zip(runs, table.iterrows()):
            led = run.ledger
            rows.append({
                "tx_power_dbm": power, "algorithm": run.label,
                "rounds_to_target": summary.rounds_to_target,
                "time_to_target_s": summary.time_to_target_s,
                "energy_to_target_j": summary.energy_to_target_j,
                "final_accuracy": summary.final_accuracy,
                "delivered_fraction": float(led.packets_delivered.sum() / led.packets_sent.sum()),
                "late_uploads": int(led.late_uploads.sum()),
                "uploads": int(led.packets_sent.sum()),
            })
            print(f"{power:6.1f} dBm  {run.label:<7} rounds to target {summary.rounds_to_target}"
                  f"  time {summary.time_to_target_s:8.3f} s  energy "
                  f"{summary.energy_to_target_j:9.4f} J  final acc {summary.final_accuracy:.3f}"
                  f"  in time {rows[-1]['delivered_fraction']:.3f}", flush=True)
    return rows


def plot(rows: list[dict], path: str) -> None:
    """The two panels, each algorithm in its colour of every other figure (report/colours.py:
    the scenario's entries name the algorithms)."""
    frame = pd.DataFrame(rows)
    entries = [(p.display_name, p.name) for p in load_scenario("radio-power-sweep").algorithms]
    colour = algorithm_colours(entries, frame.algorithm)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for label, group in frame.groupby("algorithm", sort=False):
        group = group.sort_values("tx_power_dbm")
        for ax, column in zip(axes, ("time_to_target_s", "energy_to_target_j")):
            ax.plot(group.tx_power_dbm, group[column], "o-", label=label, color=colour[label])
    for ax, name in zip(axes, ("simulated time to target [s]", "energy to target [J]")):
        ax.set_xlabel("device transmit power [dBm]")
        ax.set_ylabel(name)
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle("radio-power-sweep: 50 devices, adaptive rate, 20 ms upload deadline "
                 "(missing points: target not reached)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--powers", type=float, nargs="+", default=[23, 10, 0, -10, -20, -30, -35, -40])
    parser.add_argument("--out", default="benchmarks/radio_power_sweep.json")
    parser.add_argument("--figure", default="docs/img/radio_power_sweep.png")
    parser.add_argument("--plot-only", action="store_true",
                        help="draw the figure from the recorded --out file, running nothing")
    args = parser.parse_args()
    if args.plot_only:
        with open(args.out) as fh:
            rows = json.load(fh)
    else:
        rows = sweep(args.powers)
        with open(args.out, "w") as fh:
            json.dump(rows, fh, indent=2, default=float)
    plot(rows, args.figure)
    print(f"wrote {args.out} and {args.figure}")


if __name__ == "__main__":
    main()
