"""One scenario from start to its finished run folder: the one pipeline that `wirelessfl run`,
the Python API (``wirelessfl.run``) and every sweep worker call, so that all of them check,
build and record a run the same way and write the same files with the same writer (or, for an
in-memory run, the same rows and manifest).

The order is the pipeline's: host threads; preflight (pipeline/preflight.py) and the memory
check (pipeline/memory.py) before anything is loaded or written; the world (pipeline/build.py);
then every algorithm in its own simulated world (pipeline/simulation.py) into the run record.
Callers add only what they show: a progress bar (``on_round``, ``on_algorithm``), warnings
(``warn``) and what they print once the world is built (``on_world``)."""

from __future__ import annotations

import contextlib
import json
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from wirelessfl.errors import UserError
from wirelessfl.host.threads import ensure as ensure_threads
from wirelessfl.pipeline.build import World, build_world
from wirelessfl.pipeline.checkpoint import CHECKPOINT_NAME, read_checkpoint, refuse_legacy
from wirelessfl.pipeline.fingerprint import MANIFEST_KEY, check_resumable, scenario_fingerprint
from wirelessfl.pipeline.lockstep import lane_world, lanes_per_group, run_lockstep
from wirelessfl.pipeline.memory import check_memory_from_scenario
from wirelessfl.pipeline.notes import (
    same_slots_note,
    silent_analog_warning,
    small_share_warning,
)
from wirelessfl.pipeline.preflight import check_runnable
from wirelessfl.pipeline.simulation import AlgorithmRun, run_algorithm
from wirelessfl.results.health import manifest_entry
from wirelessfl.results.records import MemoryWriter, RunRecord, RunWriter, device_records
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


@contextlib.contextmanager
def sigterm_as_interrupt():
    """SIGTERM (a scheduler, `kill`) stops a run like Ctrl-C: at a clean point, results kept.
    Outside the main thread (a Dask worker) signals are left alone."""
    def stop(signum, frame):
        raise KeyboardInterrupt("SIGTERM")

    try:
        previous = signal.signal(signal.SIGTERM, stop)
    except ValueError:
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_scenario(scenario: Scenario, out: Path | None, **options) -> tuple[str, pd.DataFrame]:
    """Simulate every algorithm of ``scenario`` into the run folder ``out`` (nothing written when
    None); returns the run's status and its summary table (``run_to_record`` says the rest)."""
    status, table, _ = run_to_record(scenario, out, **options)
    return status, table


@sigterm_as_interrupt()
def run_to_record(scenario: Scenario, out: Path | None, *,
                  on_world: Callable[[World], None] | None = None,
                  on_round: Callable[[int], None] | None = None,
                  on_algorithm: Callable[[str], None] | None = None,
                  warn: Callable[[str], None] = lambda text: print(text, file=sys.stderr),
                  extra: dict | None = None, resume: bool = False,
                  checkpoint_every: int | None = None, threads: int | None = None,
                  world: World | None = None, runs: dict[str, AlgorithmRun] | None = None
                  ) -> tuple[str, pd.DataFrame, RunRecord]:
    """Simulate every algorithm of ``scenario`` into the run folder ``out`` (rounds.parquet,
    devices.parquet, manifest.json, summary.csv), or with ``out`` None into memory only (the
    Python API: the same rows and manifest, results/records.MemoryWriter); returns the run's
    status (``complete``, or ``partial`` when an algorithm diverged or failed: an exception in
    one algorithm is recorded as its failure and the others run on), its summary table and the
    run as its folder's reader sees it. A MemoryError is recorded as the algorithm's failure,
    marks the run ``failed`` and is re-raised (``--resume`` reruns it).

    ``resume``: ``out`` holds an earlier run of this scenario; the algorithms it finished are
    kept, the one that was running continues from its checkpoint (or its start), the rest run.
    ``checkpoint_every``: save the running algorithm's state every that many rounds. The
    preflight and the memory check run first; ``on_world`` is called with the built world
    before any algorithm runs (the CLI prints its facts). Ctrl-C / SIGTERM (a handler for the
    whole call: SIGTERM's default action would end the process silently, mid-write) record the
    running algorithm's rounds as ``interrupted``, mark the run ``interrupted`` and re-raise
    KeyboardInterrupt; once the folder has been written, wherever it comes (between
    algorithms, in a write), so the folder always holds a manifest that says so. ``threads``:
    host threads (host/threads.py; default: the CPUs available), recorded in the manifest; the
    results do not depend on it. ``world`` and ``runs``: the scenario's world already built and
    its algorithms' runs already simulated, by label (a lockstep group, ``run_in_lockstep``);
    they are recorded as their own runs would be."""
    if out is None and (resume or checkpoint_every):
        raise UserError("resuming and checkpoints need a run folder: give out=FOLDER")
    setting = ensure_threads(threads)  # before any numerics, building the world's included
    check_runnable(scenario, checkpoint_every, warn)  # before anything is built or written
    check_memory_from_scenario(scenario)  # before anything large is loaded or built
    world = build_world(scenario) if world is None else world
    for line in (small_share_warning(world),  # known once the data is split
                 silent_analog_warning(world)):  # and once the devices are placed
        if line is not None:
            warn(f"warning: {line}")
    if on_world is not None:
        on_world(world)
    writer = None
    try:
        if resume:
            check_folder(out, scenario, warn)
            writer = RunWriter.reopen(out)
            every = checkpoint_every or writer.manifest.get("checkpoint_every") or 0
        else:
            # what the world tells about the run beside its numbers (pipeline/notes.py): kept
            # in the manifest, so the API, report --html and the CLI show the same notes
            notes = [n for n in (same_slots_note(world),) if n is not None]
            facts = (resolved_document(scenario), scenario.seed,
                     {"model": model_facts(world), "problem": world.problem_record(),
                      "base_station": world.downlink().power_record(),
                      **({"notes": notes} if notes else {}),
                      "checkpoint_every": checkpoint_every, "threads": setting.record(),
                      MANIFEST_KEY: scenario_fingerprint(scenario), **(extra or {})},
                     world.partition_record())
            writer = MemoryWriter(*facts) if out is None else RunWriter(out, *facts)
            every = checkpoint_every or 0
        status = _run_algorithms(world, scenario, writer, out, resume, every, on_round,
                                 on_algorithm, warn, runs or {})
        writer.finish(status)
    except KeyboardInterrupt:
        if writer is not None:  # None: nothing written (RunWriter finishes its own first write)
            writer.finish("interrupted")
        raise
    record = writer.record()
    table = summarize(record.rounds, scenario.target_accuracy, world.num_devices,
                      scenario.target_suboptimality, manifest=record.manifest)
    writer.save_summary(table)
    return status, table, record


def run_in_lockstep(scenarios: list[Scenario], outs: list[Path | None], *,
                    warns: list[Callable[[str], None]], extras: list[dict | None],
                    on_round: Callable[[int], None] | None = None, threads: int | None = None
                    ) -> list[tuple[str, pd.DataFrame, RunRecord] | UserError]:
    """Scenarios whose runs may share a lockstep group (pipeline/lockstep.py ``lockstep_key``
    equal, one algorithm each) into their run folders ``outs``, each as ``run_to_record`` writes
    it alone (``warns``, ``extras``: each one's): one world is built and the lanes are
    simulated together, in groups of at most ``lanes_per_group``; a lane the group hands back
    runs alone. Each result is ``run_to_record``'s, or the UserError that refused the
    scenario (its preflight, its memory check)."""
    setting = ensure_threads(threads)
    results: list = [None] * len(scenarios)
    able = []
    for i, scenario in enumerate(scenarios):  # a refused scenario says why, alone
        try:
            check_runnable(scenario, None, lambda _text: None)
            check_memory_from_scenario(scenario)
        except UserError as err:
            results[i] = err
        else:
            able.append(i)
    runs: dict[int, AlgorithmRun | None] = {}
    worlds = {}
    if able:
        world = build_world(scenarios[able[0]])
        worlds = {i: lane_world(world, scenarios[i]) for i in able}
        size = lanes_per_group(world.evaluator.d)
        for start in range(0, len(able), size):
            part = able[start:start + size]
            runs.update(zip(part, run_lockstep([worlds[i] for i in part], on_round),
                            strict=True))
    for i in able:
        run = runs[i]
        try:
            results[i] = run_to_record(
                scenarios[i], outs[i], warn=warns[i], extra=extras[i], threads=setting.requested,
                on_round=None if run is not None else on_round,
                **({"world": worlds[i], "runs": {run.label: run}} if run is not None else {}))
        except UserError as err:
            results[i] = err
    return results


def _run_algorithms(world: World, scenario: Scenario, writer: MemoryWriter, out: Path | None,
                    resume: bool, every: int, on_round, on_algorithm, warn,
                    runs: dict[str, AlgorithmRun]) -> str:
    """Every algorithm the writer has not recorded as finished, each into ``writer`` as it
    ends; returns the run's status. An interrupted algorithm's rounds are recorded, then its
    KeyboardInterrupt raised (``run_to_record`` marks the run); a MemoryError marks the run
    ``failed`` and is raised."""
    checkpoint_path = Path(out) / CHECKPOINT_NAME if out is not None else None
    finished = writer.manifest["algorithms"]
    status = "complete" if all(v.get("status") == "complete" for v in finished.values()) \
        else "partial"
    for params in scenario.algorithms:
        if params.display_name in finished:
            continue
        if on_algorithm is not None:
            on_algorithm(params.display_name)
        saved = read_checkpoint(checkpoint_path) if resume else None
        if saved is not None and saved.label in finished:
            saved = None  # from an algorithm that has since finished
        if saved is not None:  # run_algorithm refuses one of another run or scenario
            warn(f"{params.display_name}: continuing from the checkpoint after round "
                 f"{saved.completed}")
        run = runs.get(params.display_name) or run_algorithm(
            world, params, on_round=on_round, checkpoint_every=every,
            checkpoint_path=checkpoint_path, resume=saved)
        info = {"status": run.status, "message": run.message,
                "params": params.model_dump(mode="json"), **run.extra,
                "health": manifest_entry(run.rows, run.status, scenario.health,
                                         type(params).model_fields)}
        devices, summary = device_records(run.label, run.device_columns(world),
                                          world.device_ranks)
        if summary is not None:  # a large population: rows of a sample (records.py)
            info["devices"] = summary
        listed = world.accuracy_devices
        if listed is not None:  # whose accuracies the rounds rows' lists hold
            info["device_accuracy_devices"] = listed.tolist()
        writer.add(run.label, run.rows, devices, info)
        if run.status == "interrupted":
            raise KeyboardInterrupt(run.message)
        if isinstance(run.error, MemoryError):  # the next algorithm would run out too
            writer.finish("failed")
            raise run.error
        if checkpoint_path is not None:
            checkpoint_path.unlink(missing_ok=True)
        if run.status != "complete":
            status = "partial"
            where = " (its traceback is in manifest.json)" if run.status == "failed" else ""
            warn(f"warning: {run.message}{where}; the other algorithms continue")
    return status


def check_folder(out: Path, scenario: Scenario, warn: Callable[[str], None]) -> None:
    """Before a run folder is resumed: its manifest's scenario must be the one it started with
    (pipeline/fingerprint.py), and a checkpoint in the old pickle format is refused unread
    (pipeline/checkpoint.py); both before the folder is reopened (nothing in it changes)."""
    try:
        manifest = json.loads((Path(out) / "manifest.json").read_text())
    except (OSError, ValueError, RecursionError):
        return  # RunWriter.reopen says what is wrong with the folder
    if not isinstance(manifest, dict):
        return
    note = check_resumable(out, manifest, scenario)
    if note:
        warn(note)
    refuse_legacy(out)
