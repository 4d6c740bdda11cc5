"""Seed 000's Table I protocol on the data available: ZO-HFL against FedAvg, FedProx and SCAFFOLD
at the three (alpha, beta) heterogeneity settings, over several seeds, beside the paper's numbers.

Each (setting, seed) runs `scenarios/seed000-table1-digits.yaml` (or the scenario given) with
`partition.alpha` and every algorithm's `participation` set, and records per method the final
test accuracy, the energy and the simulated time. Writes a JSON file and prints a markdown table
(mean +- std over seeds) beside the paper's MNIST / Fashion-MNIST columns (zo_hfl.md 4.3).

    python benchmarks/seed000_table1.py [--scenario seed000-table1-digits] [--seeds 0 1 2]
        [--out benchmarks/seed000_table1.json]
"""

from __future__ import annotations

import argparse
import json
import statistics

from wirelessfl.pipeline.build import build_world
from wirelessfl.pipeline.simulation import run_algorithm
from wirelessfl.scenario.loader import load_scenario

SETTINGS = [(1000.0, 0.9), (1.0, 0.5), (0.1, 0.1)]  # seed 000 Sec. IV, Table I
# Table I of seed 000 (zo_hfl.md 4.3): test accuracy [%], (MNIST, Fashion-MNIST) per setting.
PAPER = {
    "FedAvg": [(87.17, 77.52), (77.33, 59.64), (39.19, 45.50)],
    "FedProx": [(86.90, 77.34), (75.61, 60.28), (45.15, 49.44)],
    "SCAFFOLD": [(91.54, 82.25), (91.25, 83.48), (87.36, 74.91)],
    "ZO-HFL": [(90.82, 78.51), (88.44, 85.51), (87.70, 76.86)],
}


def run(scenario: str, seeds: list[int]) -> list[dict]:
    rows = []
    for alpha, beta in SETTINGS:
        for seed in seeds:
            base = load_scenario(scenario, [f"seed={seed}", f"partition.alpha={alpha}"])
            overrides = [f"seed={seed}", f"partition.alpha={alpha}"] + [
                f"algorithms.{i}.participation={beta}" for i in range(len(base.algorithms))]
            sc = load_scenario(scenario, overrides)
            world = build_world(sc)
            for params in sc.algorithms:
                result = run_algorithm(world, params)
                last = result.rows[-1]
                rows.append({"alpha": alpha, "beta": beta, "seed": seed,
                             "method": params.display_name, "accuracy": last["test_accuracy"],
                             "energy_j": last["energy_j"], "sim_time_s": last["sim_time_s"]})
                print(f"alpha={alpha:g} beta={beta:g} seed={seed} {params.display_name:<20}"
                      f" acc {last['test_accuracy']:.4f}  energy {last['energy_j']:.3f} J"
                      f"  time {last['sim_time_s']:.3f} s", flush=True)
    return rows


def table(rows: list[dict]) -> str:
    methods = list(dict.fromkeys(r["method"] for r in rows))
    head = ["method"] + [f"alpha={a:g}, beta={b:.0%}: accuracy % (paper MNIST / F-MNIST); "
                         f"energy" for a, b in SETTINGS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for method in methods:
        cells = [method]
        for k, (alpha, beta) in enumerate(SETTINGS):
            sel = [r for r in rows if r["method"] == method and r["alpha"] == alpha]
            acc = [100 * r["accuracy"] for r in sel]
            energy = statistics.mean(r["energy_j"] for r in sel)
            spread = f" +- {statistics.stdev(acc):.1f}" if len(acc) > 1 else ""
            ref = (f" (paper {PAPER[method][k][0]:.1f} / {PAPER[method][k][1]:.1f})"
                   if method in PAPER else "")
            cells.append(f"{statistics.mean(acc):.1f}{spread}{ref}; {energy:.2f} J")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="seed000-table1-digits")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", default="benchmarks/seed000_table1.json")
    args = parser.parse_args()
    rows = run(args.scenario, args.seeds)
    with open(args.out, "w") as fh:
        json.dump(rows, fh, indent=2)
    print(table(rows))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
