"""Host cost of building a world and writing its per-device outputs, for large populations.

For each population size N, in a fresh process (so its peak RSS is its own), it loads a scenario
(``wirelessfl.load_scenario``) with an MLP 64-64-10 on synthetic data, then times, one after
another: the pre-run memory estimate, ``pipeline.build.build_world`` (placement, path loss, the
data split, the problem), the manifest's partition entry, a Ledger, the per-device outputs of
one algorithm (devices.parquet and manifest.json written by the run writer, from a ledger in
which 100 devices took part in each of 50 rounds) and the two figures with per-device axes
(``label_histogram``, ``device_energy``). The learning rounds are not run.

    python benchmarks/bench_population.py [--sizes 10000 100000 1000000] [--samples 60000]
                                          [--samples-per-device M] [--out FILE.json]

Timings on a shared machine are noisy (other jobs, CPU steal); peak RSS is per process and
does not depend on the load.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import resource
import tempfile
import time
from pathlib import Path

# Rounds x participants of the ledger the outputs are written from [D]: a cross-device run's
# shape (pfl-research's benchmarks sample 100 devices per round).
ROUNDS, PARTICIPANTS = 50, 100


def scenario_document(n: int, samples: int, per_device: int | None = None) -> dict:
    return {
        "name": f"population-{n}", "seed": 1, "channel": "seed002-cell",
        "energy": "seed002-accelerator", "population": {"num_devices": n},
        "data": {"name": "synthetic", "synthetic": {"num_samples": samples, "num_features": 64,
                                                    "num_classes": 10, "informative": 16}},
        "model": {"name": "mlp", "hidden": [64]}, "quantization_bits": 32,
        **({"partition": {"samples_per_device": per_device}} if per_device else {}),
        "target_accuracy": 0.9,
        "algorithms": [{"name": "fedavg", "label": "FedAvg", "rounds": ROUNDS, "eval_every": 10,
                        "batch_size": 10, "local_steps": 5, "lr": 0.1}],
    }


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def fill_ledger(ledger, n: int) -> None:
    """ROUNDS rounds of PARTICIPANTS devices each: compute, upload, download; idle for all."""
    from wirelessfl.engine.ledger import KIND_INDEX

    rng = __import__("numpy").random.default_rng(0)
    for _ in range(ROUNDS):
        asked = rng.choice(n, size=min(PARTICIPANTS, n), replace=False)
        ledger.charge("compute_forward", 1e-3, 1e-2, asked)
        ledger.charge("compute_backward", 2e-3, 2e-2, asked)
        ledger.charge("uplink", 5e-3, 1e-2, asked)
        ledger.charge("downlink", 1e-3, 1e-3, asked)
        ledger.bits_up[asked] += 32 * 4000
        ledger.packets_sent[asked] += 1
        ledger.packets_delivered[asked] += 1
        ledger.transmissions[asked] += 1
    ledger.charge("idle", 1e-4, 1.0)
    assert KIND_INDEX["idle"] == 4


def write_outputs(world, ledger, folder: Path) -> tuple[object, dict]:
    """The run writer's path for one algorithm (as pipeline/runner.py takes it), either version."""
    from wirelessfl.pipeline import simulation
    from wirelessfl.results import records

    params = world.scenario.algorithms[0]
    run = simulation.AlgorithmRun(params.display_name, params, [], ledger)
    writer = records.RunWriter(folder, {"name": world.scenario.name,
                                        "population": {"num_devices": world.num_devices}},
                               world.scenario.seed, partition=world.partition_record())
    timings = {}
    start = time.perf_counter()
    info = {"status": "complete", "message": "", "params": {}}
    if hasattr(records, "device_records"):  # since issue 22: only what is kept at large N
        devices, entry = records.device_records(run.label, run.device_columns(world),
                                                world.device_ranks)
        if entry is not None:
            info["devices"] = entry
    else:
        devices = run.device_rows(world)
    timings["device_rows_s"] = time.perf_counter() - start
    start = time.perf_counter()
    writer.add(run.label, [], devices, info)
    writer.finish()
    timings["write_s"] = time.perf_counter() - start
    return writer.record(), timings


def measure(n: int, samples: int, per_device: int | None, queue) -> None:
    result = {"n": n, "samples": samples, "samples_per_device": per_device}
    try:
        start = time.perf_counter()
        import wirelessfl
        from wirelessfl.engine.ledger import Ledger
        from wirelessfl.pipeline.build import build_world
        from wirelessfl.pipeline.memory import estimate_memory
        from wirelessfl.report.plots import device_energy, label_histogram

        result["import_s"] = time.perf_counter() - start
        result["base_rss_mb"] = peak_mb()
        start = time.perf_counter()
        scenario = wirelessfl.load_scenario(scenario_document(n, samples, per_device))
        result["load_scenario_s"] = time.perf_counter() - start
        start = time.perf_counter()
        result["estimate_mb"] = estimate_memory(scenario).total / 2**20
        result["estimate_s"] = time.perf_counter() - start
        start = time.perf_counter()
        world = build_world(scenario)
        result["build_world_s"] = time.perf_counter() - start
        result["build_rss_mb"] = peak_mb()
        start = time.perf_counter()
        record = world.partition_record()
        result["partition_record_s"] = time.perf_counter() - start
        result["partition_json_mb"] = len(json.dumps(record)) / 2**20
        start = time.perf_counter()
        ledger = Ledger(n)
        result["ledger_s"] = time.perf_counter() - start
        fill_ledger(ledger, n)
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp) / "run"
            run_record, timings = write_outputs(world, ledger, folder)
            result.update(timings)
            result["devices_parquet_mb"] = (folder / "devices.parquet").stat().st_size / 2**20
            result["manifest_mb"] = (folder / "manifest.json").stat().st_size / 2**20
            result["device_rows"] = len(run_record.devices)
            for name, figure in (("label_histogram", label_histogram),
                                 ("device_energy", device_energy)):
                start = time.perf_counter()
                fig = figure(run_record)
                if fig is not None:
                    fig.savefig(Path(tmp) / f"{name}.png")
                result[f"{name}_s"] = time.perf_counter() - start
        result["peak_rss_mb"] = peak_mb()
    except Exception as err:  # noqa: BLE001 - recorded (the old code refuses large N)
        result["error"] = f"{type(err).__name__}: {err}"[:300]
        result["peak_rss_mb"] = peak_mb()
    queue.put(result)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--samples", type=int, default=60_000,
                        help="synthetic samples before the train/test split")
    parser.add_argument("--samples-per-device", type=int,
                        help="partition.samples_per_device (since issue 22; default: the split, "
                             "or one sample a device where the population outgrows the data)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    results = []
    for n in args.sizes:
        queue = ctx.Queue()
        child = ctx.Process(target=measure, args=(n, args.samples, args.samples_per_device,
                                                  queue))
        child.start()
        result = queue.get()
        child.join()
        results.append(result)
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v
                          for k, v in result.items()}), flush=True)
    if args.out:
        args.out.write_text(json.dumps({"machine": platform.platform(), "cpus": os.cpu_count(),
                                        "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
