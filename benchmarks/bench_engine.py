"""Host cost of the simulation engine alone in a cross-device round, as the population grows.

FedAvg's network calls of one round (resync of stale devices, ``count`` participants drawn by
``algorithms/participation.py``, their collect, the model broadcast to every device) are run on the
engine built from a scenario (cell, device power, compute prices, ledger, network), with no
learning problem, so the time is the engine's: channel draws, airtimes, ledger charges, idle
charging. Three ways of asking (``--ask``):

* ``shared``: shared random streams and [N] masks, the engine every recorded run used;
* ``mask``: per-device streams asked with [N] masks (an algorithm that still builds them);
* ``index``: per-device streams asked by device indices, results aligned with them (the
  cross-device path: no [N] array per round).

It prints per-round milliseconds (median over rounds after a warm-up run in the same process,
first round, 90th percentile), the traced memory the engine holds after building and the peak
traced while the rounds run (tracemalloc; the process's own maxrss is printed too).

    python benchmarks/bench_engine.py --out benchmarks/bench_engine.json
    python benchmarks/bench_engine.py --devices 1000000 --counts 100 --ask index   # one case
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import time
import tracemalloc
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path

import numpy as np
import simpy

import wirelessfl as wf
from wirelessfl.algorithms.participation import participant_indices
from wirelessfl.channel import Cell, Downlink, Uplink
from wirelessfl.contract.payload import Cost, Payload
from wirelessfl.energy import ComputeModel, DevicePower
from wirelessfl.energy.profiler import ModelProfile
from wirelessfl.engine.ledger import Ledger
from wirelessfl.engine.network import VectorNetwork
from wirelessfl.learning.seeds import keyed_rng
from wirelessfl.pipeline.build import draw_population

# The logistic model of 20 features and 2 classes (d = 42): the priced passes are the engine's
# arithmetic only, any model would do.
MODEL = ModelProfile(params=42, macs_per_sample=40, activations_per_sample=2, input_size=20)
SEED = 0


def build(n: int, per_device: bool, channel: str, energy: str):
    """The engine of a scenario with ``n`` devices: (environment, network)."""
    sc = wf.load_scenario({"name": "bench-engine", "seed": SEED, "channel": channel,
                           "energy": energy, "population": {"num_devices": n},
                           "data": {"name": "synthetic"}, "model": {"name": "logistic"},
                           "algorithms": [{"name": "fedavg", "rounds": 1}]})
    cell = Cell.build(n, sc.channel, keyed_rng(SEED, "placement"))
    _, profiles, device_class, _ = draw_population(sc)
    up, down = Uplink(cell, sc.channel), Downlink(cell, sc.channel)
    power = DevicePower.from_profiles(profiles, device_class, up.tx_power_w, up.circuit_power_w)
    env = simpy.Environment()
    net = VectorNetwork(env, Ledger(n), up, down, ComputeModel(profiles[0], MODEL, 8), power,
                        keyed_rng(SEED, "fading"), keyed_rng(SEED, "downlink"),
                        per_device=per_device, seed=SEED)
    return env, net


def rounds(net, count: int, total: int, by_index: bool, stamps: list, missed: np.ndarray):
    """FedAvg's network calls for ``total`` rounds (a wall-clock stamp at each round start);
    ``missed`` [N]: the algorithm's count of downlink packets each device missed."""
    n = net.num_devices
    cost = Cost(forward_passes=5, backward_passes=5, batch_size=10)
    up, down, resync = Payload.vectors(42, 8), Payload.vectors(42, 8), Payload.vectors(42, 32)
    stale = np.zeros(0, dtype=np.int64)
    for k in range(total):
        stamps.append(time.perf_counter())
        asked = participant_indices(SEED, n, count, k)
        if by_index:
            if len(stale):
                heard = yield from net.broadcast(resync, stale)
                missed[stale[heard.received]] = 0
                stale = stale[~heard.received]
            yield from net.collect(cost, up, asked[missed[asked] == 0])
            sent = yield from net.broadcast(down)
            missed[sent.lost_devices] += 1
            stale = np.union1d(stale, sent.lost_devices)
        else:
            late = missed > 0
            if late.any():
                heard = yield from net.broadcast(resync, late)
                missed[late & heard.received] = 0
            mask = np.zeros(n, dtype=bool)
            mask[asked] = True
            yield from net.collect(cost, up, mask & (missed == 0))
            sent = yield from net.broadcast(down)
            missed += ~sent.received
    stamps.append(time.perf_counter())


def measure(n: int, count: int, total: int, ask: str, channel: str, energy: str) -> dict:
    per_device = ask != "shared"
    env, net = build(n, per_device, channel, energy)  # warm-up: imports, caches, allocator
    missed = np.zeros(n, dtype=np.int64)  # the algorithm's, not the engine's
    env.process(rounds(net, count, 3, ask == "index", [], missed))
    env.run()
    tracemalloc.start()
    env, net = build(n, per_device, channel, energy)
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    stamps: list[float] = []
    missed[:] = 0
    env.process(rounds(net, count, total, ask == "index", stamps, missed))
    env.run()
    net.settle()
    per_round = np.diff(stamps) * 1e3
    tracemalloc.start()  # peak of a second batch of rounds (tracing slows it: not timed)
    env.process(rounds(net, count, 5, ask == "index", [], missed))
    env.run()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return {"devices": n, "count": count, "ask": ask, "rounds": total,
            "median_ms": float(np.median(per_round)), "first_ms": float(per_round[0]),
            "p90_ms": float(np.percentile(per_round, 90)), "engine_mib": held / 2**20,
            "round_peak_mib": peak / 2**20,
            "maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--devices", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--counts", type=int, nargs="+", default=[100, 1_000],
                        help="participants per round")
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--ask", nargs="+", choices=["shared", "mask", "index"],
                        default=["shared", "mask", "index"])
    parser.add_argument("--channel", default="seed002-cell")
    parser.add_argument("--energy", default="seed002-accelerator")
    parser.add_argument("--out", type=Path, default=None,
                        help="write the results as JSON (benchmarks/bench_engine.json)")
    args = parser.parse_args()
    cases = []
    for count in args.counts:
        for n in args.devices:
            for ask in args.ask:
                r = measure(n, count, args.rounds, ask, args.channel, args.energy)
                cases.append(r)
                print(f"N={r['devices']:>9,} asked={r['count']} ({r['ask']}): median "
                      f"{r['median_ms']:.2f} ms/round (first {r['first_ms']:.1f}, p90 "
                      f"{r['p90_ms']:.2f}); engine holds {r['engine_mib']:.0f} MiB, a round's "
                      f"peak {r['round_peak_mib']:.2f} MiB; maxrss {r['maxrss_mib']:.0f} MiB",
                      flush=True)
    if args.out:
        result = {"date": datetime.now(UTC).isoformat(timespec="seconds"),
                  "command": "python benchmarks/bench_engine.py " + " ".join(sys.argv[1:]),
                  "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                              "load_average": list(os.getloadavg()),
                              "python": platform.python_version(),
                              "numpy": version("numpy")},
                  "channel": args.channel, "energy": args.energy, "cases": cases}
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
