"""Seed 001's Fed-BLO experiment (fedmsa.md Sec. 4.2 / 5.2) on long-tailed digits: rounds,
exchanges, simulated seconds and joules to the paper's 90 % balanced-accuracy mark (Sec. 4.4) and
to 85 %, for FedMSA (K = 1, 5, 10) and FedNest, beside the paper's "about 10x fewer rounds than
FedNest" (Fig. 1a; FedNest > 2,000 rounds to 90 % where FedMSA needs about 250, Fig. 4).

Every entry of `scenarios/seed001-loss-tuning-digits.yaml` runs on the same world per seed. A
FedMSA round is 2 exchanges, a FedNest round 2T + N + 3 = 16; the paper's "rounds" count
exchanges ("communication rounds"), so the ratio is reported for both.

    PYTHONPATH=. python benchmarks/seed001_loss_tuning.py [--seeds 0 1 2]
        [--out benchmarks/seed001_loss_tuning.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import pandas as pd

from wirelessfl.pipeline.build import build_world
from wirelessfl.pipeline.simulation import run_algorithm
from wirelessfl.scenario.loader import load_scenario

SCENARIO = "seed001-loss-tuning-digits"
TARGETS = (0.9, 0.85)  # fedmsa.md Sec. 4.4: the 90 % mark; 85 % as a second mark [D]
PAPER_ROUND_RATIO = 10  # fedmsa.md Sec. 4.4: "10x" fewer communication rounds than FedNest


def to_target(rows: pd.DataFrame, target: float) -> dict:
    hit = np.flatnonzero(rows.test_accuracy.to_numpy() >= target)
    if not len(hit):
        return {"rounds": None, "exchanges": None, "sim_time_s": None, "energy_j": None}
    row = rows.iloc[hit[0]]
    return {"rounds": int(row["round"]), "exchanges": int(row.exchanges),
            "sim_time_s": float(row.sim_time_s), "energy_j": float(row.energy_j)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", default="benchmarks/seed001_loss_tuning.json")
    args = parser.parse_args()
    records = []
    for seed in args.seeds:
        scenario = load_scenario(SCENARIO, [f"seed={seed}"])
        world = build_world(scenario)
        for params in scenario.algorithms:
            start = time.perf_counter()
            rows = pd.DataFrame(run_algorithm(world, params).rows)
            rec = {"seed": seed, "label": params.display_name, "algorithm": params.name,
                   "final_balanced_accuracy": float(rows.test_accuracy.iloc[-1]),
                   "best_balanced_accuracy": float(rows.test_accuracy.max()),
                   "rounds": int(rows["round"].iloc[-1]),
                   "exchanges": int(rows.exchanges.iloc[-1]),
                   "energy_j": float(rows.energy_j.iloc[-1]),
                   "host_s": time.perf_counter() - start}
            for target in TARGETS:
                rec[f"to_{target:g}"] = to_target(rows, target)
            records.append(rec)
            print(f"seed {seed} {params.display_name}: best {rec['best_balanced_accuracy']:.3f}, "
                  f"to 0.9 {rec['to_0.9']['rounds']}, to 0.85 {rec['to_0.85']['rounds']} "
                  f"({rec['host_s']:.0f} s)", flush=True)
    with open(args.out, "w") as f:
        json.dump({"scenario": SCENARIO, "targets": TARGETS, "paper_round_ratio":
                   PAPER_ROUND_RATIO, "records": records}, f, indent=2)
        f.write("\n")
    frame = pd.DataFrame(records)
    print(f"\nmedian over seeds {args.seeds} (n = runs that reached the mark)\n")
    print("| method | best bal. acc. | final | mark | rounds | exchanges | simulated s | J | n |")
    print("|---|---|---|---|---|---|---|---|---|")
    for label, g in frame.groupby("label", sort=False):
        for target in TARGETS:
            got = [r for r in g[f"to_{target:g}"] if r["rounds"] is not None]

            def med(key, got=got):
                return f"{statistics.median(r[key] for r in got):.4g}" if got else "never"
            print(f"| {label} | {statistics.median(g.best_balanced_accuracy):.3f} | "
                  f"{statistics.median(g.final_balanced_accuracy):.3f} | {target:g} | "
                  f"{med('rounds')} | {med('exchanges')} | {med('sim_time_s')} | "
                  f"{med('energy_j')} | {len(got)}/{len(g)} |")


if __name__ == "__main__":
    main()
