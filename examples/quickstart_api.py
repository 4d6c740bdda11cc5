"""The quickstart from Python, as a script a new researcher would write (docs/api.md).

    python examples/quickstart_api.py [PNG] [key.path=value ...]

Runs the quickstart scenario (DZOFL vs FedSGD vs FedAvg over the seed-002 cell) in memory with a
few changes, prints its summary, draws accuracy against energy to PNG (default
accuracy_vs_energy.png), then runs a tiny sweep over the devices' transmit power with the
command line and reads it back as one pandas table. Further ``key.path=value`` arguments change
both the run and the sweep (the test suite passes short settings this way).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

import wirelessfl

# Our changes to the shipped quickstart: fewer devices, so that it runs in seconds.
CHANGES = {"population.num_devices": 20, "algorithms.DZOFL.rounds": 2000,
           "algorithms.FedSGD.rounds": 60, "algorithms.FedAvg.rounds": 20}


def main(argv: list[str]) -> None:
    png = Path(argv[0]) if argv else Path("accuracy_vs_energy.png")
    extra = {key: yaml.safe_load(value) for key, _, value in (a.partition("=") for a in argv[1:])}
    changes = {**CHANGES, **extra}

    # 1. one run, kept in memory: the tables are pandas DataFrames
    scenario = wirelessfl.load_scenario("quickstart", changes)
    result = wirelessfl.run(scenario)
    print(result.summary[["algorithm", "energy_to_target_j", "time_to_target_s",
                          "final_accuracy"]].to_string(index=False))
    png.parent.mkdir(parents=True, exist_ok=True)
    result.figure("accuracy_vs_energy").savefig(png, dpi=120)
    print(f"wrote {png}")

    # 2. a tiny sweep (2 powers x 2 seeds) with the command line, read back into one table
    folder = png.parent / "quickstart-power-sweep"
    folder.mkdir(exist_ok=True)
    sweep = {"scenario": "quickstart", "set": changes, "seeds": [0, 1],
             "grid": {"channel.uplink.tx_power_dbm": [0, 23]}}
    (folder / "sweep.yaml").write_text(yaml.safe_dump(sweep))
    subprocess.run([sys.executable, "-m", "wirelessfl", "sweep", str(folder / "sweep.yaml"),
                    "--out", str(folder / "out"), "--quiet", "--no-compare"], check=True)
    rounds = wirelessfl.load_sweep(folder / "out")  # one row per run per evaluated round
    last = rounds.sort_values("round").groupby(["folder", "algorithm"]).last()
    table = last.groupby(["channel.uplink.tx_power_dbm", "algorithm"]).agg(
        final_accuracy=("test_accuracy", "mean"), energy_j=("energy_j", "mean"),
        seeds=("seed", "nunique"))
    print(table.to_string())


if __name__ == "__main__":
    main(sys.argv[1:])
