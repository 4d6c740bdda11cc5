"""One scenario from start to its finished run folder: what `wirelessfl run` does and what every
sweep worker does, so that both write the same files with the same writer."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from wirelessfl.engine.build import World, build_world
from wirelessfl.engine.simulation import run_algorithm
from wirelessfl.results.records import RunWriter, read_run, write_csv
from wirelessfl.results.summary import summarize
from wirelessfl.scenario.loader import resolved_document
from wirelessfl.scenario.schema import Scenario


def model_facts(world: World) -> dict:
    """What the manifest records about the model and the per-pass energy it implies (for a mixed
    population, per device class: the mean over the class's devices)."""
    prof = world.model_profile
    facts = {"d": world.evaluator.d, "macs_per_sample": prof.macs_per_sample,
             "activations_per_sample": prof.activations_per_sample,
             "input_size": prof.input_size, "downlink_rate_bps": float(world.downlink().rate_bps)}
    if world.heterogeneous:
        facts["device_classes"] = {name: int((world.device_class == c).sum())
                                   for c, name in enumerate(world.class_names)}

    def value(x):
        if np.ndim(x) == 0:
            return float(x)
        return {name: float(np.mean(x[world.device_class == c]))
                for c, name in enumerate(world.class_names) if (world.device_class == c).any()}

    for p in world.scenario.algorithms:
        cm = world.compute_model(p.bits)
        facts.setdefault("per_pass", {})[p.display_name] = {
            "batch": p.batch_size, "bits": p.bits,
            "energy_forward_j": value(cm.forward_energy_j(p.batch_size)),
            "energy_backward_j": value(cm.backward_energy_j(p.batch_size)),
            "time_forward_s": value(cm.forward_time_s(p.batch_size)),
            "time_backward_s": value(cm.backward_time_s(p.batch_size))}
    return facts


def run_scenario(scenario: Scenario, out: Path, world: World | None = None,
                 on_round: Callable[[int], None] | None = None,
                 on_algorithm: Callable[[str], None] | None = None,
                 warn: Callable[[str], None] = lambda text: print(text, file=sys.stderr),
                 extra: dict | None = None) -> tuple[str, pd.DataFrame]:
    """Simulate every algorithm of ``scenario`` into the run folder ``out`` (rounds.parquet,
    devices.parquet, manifest.json, summary.csv); returns the run's status (``complete``, or
    ``partial`` when an algorithm diverged) and its summary table. An interrupt records
    ``interrupted`` and re-raises."""
    world = world or build_world(scenario)
    writer = RunWriter(out, resolved_document(scenario), scenario.seed,
                       extra={"model": model_facts(world), "problem": world.problem_record(),
                              **(extra or {})},
                       partition=world.partition_record())
    status = "complete"
    try:
        for params in scenario.algorithms:
            if on_algorithm is not None:
                on_algorithm(params.display_name)
            run = run_algorithm(world, params, on_round=on_round)
            info = {"status": run.status, "message": run.message,
                    "params": params.model_dump(mode="json"), **run.extra}
            writer.add(run.label, run.rows, run.device_rows(world), info)
            if run.status != "complete":
                status = "partial"
                warn(f"warning: {run.message}; the other algorithms continue")
    except KeyboardInterrupt:
        writer.finish("interrupted")
        raise
    writer.finish(status)
    table = summarize(read_run(out).rounds, scenario.target_accuracy, world.num_devices)
    write_csv(Path(out) / "summary.csv", table)
    return status, table
