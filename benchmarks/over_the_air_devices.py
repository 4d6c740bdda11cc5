"""How each method's upload time per round grows with the number of devices on one shared band
(scenarios/over-the-air-devices.yaml): digital packets queue for ten 2 MHz sub-bands of a 20 MHz
pool, analog phases superpose on the whole pool, so the first grow with N and the second do not.

For each N the scenario runs once (N devices, N quadratic clients, the same seed) and the script
records per algorithm: the simulated time per round, the base station's airtime per round (its
broadcasts) and their difference, the upload time per round (the devices compute at 1e15 MAC/s,
so nothing else takes time), the uplink energy per device per round, and the share of uploads
in the sum or delivered. Simulated seconds, not host time: the numbers do not depend on the
machine.

    python benchmarks/over_the_air_devices.py [--devices 10 30 100 300 1000]
        [--out benchmarks/over_the_air_devices.json] [--figure docs/img/over_the_air_devices.png]
"""

from __future__ import annotations

import argparse
import itertools
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from wirelessfl.pipeline.build import build_world
from wirelessfl.pipeline.simulation import run_algorithm
from wirelessfl.report.colours import algorithm_colours
from wirelessfl.scenario.loader import load_scenario

SCENARIO = "over-the-air-devices"


def sweep(devices: list[int]) -> list[dict]:
    rows = []
    for n in devices:
        scenario = load_scenario(SCENARIO, [f"population.num_devices={n}",
                                            f"problem.clients={n}"])
        world = build_world(scenario)
        for params in scenario.algorithms:
            run = run_algorithm(world, params)
            last, led = run.rows[-1], run.ledger
            rounds = int(last["round"])
            upload = (last["sim_time_s"] - last["bs_airtime_s"]) / rounds
            rows.append({
                "devices": n, "algorithm": run.label, "rounds": rounds,
                "time_per_round_s": last["sim_time_s"] / rounds,
                "broadcast_per_round_s": last["bs_airtime_s"] / rounds,
                "upload_per_round_s": upload,
                "uplink_energy_per_device_round_j": last["energy_uplink_j"] / (n * rounds),
                "delivered_fraction": float(led.packets_delivered.sum()
                                            / led.packets_sent.sum()),
            })
            print(f"N = {n:5d}  {run.label:<15} upload {upload * 1e3:10.4f} ms a round  "
                  f"delivered {rows[-1]['delivered_fraction']:.3f}", flush=True)
    return rows


def plot(rows: list[dict], path: str) -> None:
    """Upload time per round against N, log-log, each algorithm in its colour of every other
    figure (report/colours.py)."""
    frame = pd.DataFrame(rows)
    entries = [(p.display_name, p.name) for p in load_scenario(SCENARIO).algorithms]
    colour = algorithm_colours(entries, frame.algorithm)
    fig, ax = plt.subplots(figsize=(6, 4))
    # the analog methods' lines coincide: distinct markers and widths keep both visible
    styles = [("o", 4.0, "-"), ("s", 3.0, "--"), ("^", 2.0, "-"), ("x", 1.2, ":")]
    for (label, group), (marker, width, line) in zip(frame.groupby("algorithm", sort=False),
                                                     itertools.cycle(styles)):
        ax.plot(group.devices, group.upload_per_round_s * 1e3, marker=marker, linestyle=line,
                linewidth=width, markersize=4 + 2 * width, label=label, color=colour[label],
                markerfacecolor="none")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("devices N")
    ax.set_ylabel("upload time per round [ms] (simulated)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    ax.set_title("one shared band: digital packets queue, analog phases superpose", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, nargs="+", default=[10, 30, 100, 300, 1000])
    parser.add_argument("--out", default="benchmarks/over_the_air_devices.json")
    parser.add_argument("--figure", default="docs/img/over_the_air_devices.png")
    args = parser.parse_args()
    rows = sweep(args.devices)
    plot(rows, args.figure)
    with open(args.out, "w") as handle:
        json.dump({"scenario": SCENARIO, "rows": rows}, handle, indent=2)
        handle.write("\n")
    print(f"wrote {args.out} and {args.figure}")


if __name__ == "__main__":
    main()
