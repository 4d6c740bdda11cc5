"""The sweep folder: one run folder per point under ``runs/``, the table of runs (``runs.csv``)
and the sweep manifest (``sweep.json``). Resumable: a run whose folder holds a finished run of the
same resolved scenario is skipped; failed, missing and stale runs are (re)run."""

from __future__ import annotations

import json
import math
import shutil
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd

from wirelessfl.errors import UserError
from wirelessfl.host.progress import StudyProgress
from wirelessfl.pipeline.lockstep import lockstep_key
from wirelessfl.plugins import worker_plugins
from wirelessfl.results.compare import table_value
from wirelessfl.results.records import (
    acquire_lock,
    package_versions,
    publish_folder,
    write_csv,
    write_json,
)
from wirelessfl.sweep import heartbeat
from wirelessfl.sweep.executors import execute
from wirelessfl.sweep.spec import Sweep, SweepPoint

MANIFEST = "sweep.json"
TABLE = "runs.csv"
RUNS = "runs"
FINISHED = ("complete", "partial")  # partial: an algorithm diverged; rerunning gives the same


@dataclass
class SweepCounts:
    total: int
    skipped: int
    ran: int
    failed: int

    @property
    def finished(self) -> int:
        return self.total - self.failed


def _finished_run(folder: Path, point: SweepPoint) -> tuple[bool, str]:
    """(finished, why not): a run folder of this point's resolved scenario that ran to the end."""
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
    except (OSError, ValueError):
        return False, ""
    if manifest.get("scenario") != json.loads(json.dumps(point.scenario)):
        return False, "the scenario changed since this run was recorded; it is run again"
    return manifest.get("status") in FINISHED, ""


def _previous_entries(out: Path) -> dict[str, dict]:
    try:
        runs = json.loads((out / MANIFEST).read_text()).get("runs", [])
    except (OSError, ValueError):
        return {}
    return {r["run"]: r for r in runs if isinstance(r, dict) and "run" in r}


def _clean_leftovers(runs_dir: Path) -> None:
    """Staging folders of runs that a killed sweep never put in place."""
    if runs_dir.is_dir():
        for path in runs_dir.glob(".*.partial"):
            shutil.rmtree(path, ignore_errors=True)
        for path in runs_dir.glob(".*.old"):
            shutil.rmtree(path, ignore_errors=True)


def _named(values: dict, seed: int) -> str:
    """A run in a progress line: its swept values and its seed (``lr=0.1, seed 2``)."""
    return ", ".join([f"{k}={table_value(v)}" for k, v in values.items()] + [f"seed {seed}"])


def _write(out: Path, sweep: Sweep, entries: list[dict], executor: dict) -> None:
    manifest = {"name": sweep.name, "file": str(sweep.path), "sweep": sweep.document,
                "base_scenario": sweep.spec.scenario, "keys": sweep.keys,
                "seeds": sweep.spec.seeds, "executor": executor,
                "versions": package_versions(),
                "updated_at": datetime.now(UTC).isoformat(timespec="seconds"), "runs": entries}
    write_json(out / MANIFEST, manifest)
    table = pd.DataFrame(entries)
    for key in sweep.keys:  # lists and mappings as JSON text in the CSV
        table[key] = [table_value(v) for v in table[key]]
    write_csv(out / TABLE, table)


def _reconcile(sweep: Sweep, by_run: dict[str, dict], runs_dir: Path) -> None:
    """Entries whose run folder is in place and finished, but which a stop (Ctrl-C, SIGTERM)
    caught between the folder's publication and the entry's update, are recorded as that
    folder says: runs.csv never lists as pending a run whose folder holds its results."""
    for point in sweep.points:
        entry = by_run[point.run_id]
        if entry["status"] in FINISHED or not (runs_dir / point.run_id).is_dir():
            continue
        finished, _ = _finished_run(runs_dir / point.run_id, point)
        if finished:
            manifest = json.loads((runs_dir / point.run_id / "manifest.json").read_text())
            entry["status"] = manifest.get("status", "complete")


def lockstep_groups(tasks: list[dict], workers: int) -> list[dict]:
    """``tasks`` with those that may share a lockstep group (pipeline/lockstep.py
    ``lockstep_key``: one algorithm whose runs differ only in step sizes, the same seed and
    everything else) made one task each group (``members``), first, so the longest work starts
    first. Fewer groups than ``workers`` are split (at least two runs a part) so every worker
    has one. A run's records are the same in a group as alone."""
    by_key: dict[str, list[dict]] = {}
    alone = []
    for task in tasks:
        key = lockstep_key(task["scenario"])
        (alone if key is None else by_key.setdefault(key, [])).append(task)
    groups = [group for group in by_key.values() if len(group) > 1]
    alone += [group[0] for group in by_key.values() if len(group) == 1]
    if groups and len(groups) < workers:
        parts = []
        for group in groups:
            count = max(1, min(math.ceil(workers / len(groups)), len(group) // 2))
            parts += [group[i::count] for i in range(count)]
        groups = parts
    return [{**group[0], "members": group} for group in groups] + alone


def _member_results(outcome: dict, members: dict[str, list[dict]]):
    """The results of the runs in one task's ``outcome``: a group's members, or a group that
    failed whole (its worker died) as a failure of each member, or the one run's."""
    if "members" in outcome:
        yield from outcome["members"]
    elif outcome["run_id"] in members:
        group = members[outcome["run_id"]]
        for member in group:
            yield {**outcome, "run_id": member["run_id"],
                   "wall_s": outcome["wall_s"] / len(group), "cpu_s": outcome["cpu_s"] / len(group)}
    else:
        yield outcome


def run_sweep(sweep: Sweep, out: Path, executor: str, workers: int, address: str | None = None,
              quiet: bool = False, threads: int | None = None, lockstep: bool = True
              ) -> SweepCounts:
    """Run every unfinished point of ``sweep`` into ``out``; the table is rewritten (atomically)
    after every run, so a kill loses at most the runs in flight. A second sweep on the same
    folder while this one runs is refused (the folder's lock, results/records.py). ``threads``:
    host threads per run (default: the available CPUs divided among the workers; results do
    not depend on it; nor on ``lockstep``, which runs points that differ only in step sizes as
    one group, ``lockstep_groups``). Progress on stderr (host/progress.py ``StudyProgress``): a line as each
    run starts, its rounds now and then, the runs done and an estimate of the time left; none
    with ``quiet``."""
    runs_dir = Path(out) / RUNS
    try:
        runs_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"--out {out}: cannot create the sweep folder ({err.strerror})") from None
    with acquire_lock(Path(out)):
        return _run_unfinished(sweep, Path(out), runs_dir, executor, workers, address, quiet,
                               threads, lockstep)


def _run_unfinished(sweep: Sweep, out: Path, runs_dir: Path, executor: str, workers: int,
                    address: str | None, quiet: bool, threads: int | None,
                    lockstep: bool) -> SweepCounts:
    _clean_leftovers(runs_dir)
    previous = _previous_entries(Path(out))
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    entries, tasks, replaced = [], [], {}
    plugins = worker_plugins()  # what the workers import to resolve the same names
    progress = heartbeat.settings(workers, quiet)  # what each run reports while it runs
    for point in sweep.points:
        old = previous.get(point.run_id, {})
        folder = runs_dir / point.run_id
        done, why = _finished_run(folder, point)
        if why:  # a run of another scenario: kept beside, never overwritten
            kept = runs_dir / f"{point.run_id}.replaced-{stamp}"
            folder.rename(kept)
            why += f" (the old run folder is kept as {RUNS}/{kept.name})"
            replaced[point.run_id] = why
        entry = {"run": point.run_id, "status": "pending", "seed": point.seed, **point.values,
                 "message": why or old.get("message", ""), "wall_s": old.get("wall_s"),
                 "cpu_s": old.get("cpu_s"),
                 "host": old.get("host"), "attempts": old.get("attempts", 0),
                 "folder": f"{RUNS}/{point.run_id}"}
        if done:
            entry["status"] = json.loads((folder / "manifest.json").read_text())["status"]
        else:
            if old.get("status") == "failed":
                entry["status"] = "failed"  # until retried below
            tasks.append({"run_id": point.run_id, "scenario": point.scenario,
                          "plugins": plugins, "progress": progress,
                          "source": f"{sweep.path} [{point.run_id}]",
                          "sweep": {"name": sweep.name, "run": point.run_id,
                                    "values": point.values, "file": str(sweep.path)}})
        entries.append(entry)
    by_run = {e["run"]: e for e in entries}
    info = {"kind": executor, "workers": workers, "address": address, "threads": threads}
    _write(Path(out), sweep, entries, info)
    skipped = len(entries) - len(tasks)
    retried = sum(by_run[t["run_id"]]["status"] == "failed" for t in tasks)
    where = f"the Dask scheduler at {address}" if address else f"{executor} with {workers} workers"
    print(f"{sweep.name}: {len(entries)} runs ({len(sweep.points) // len(sweep.spec.seeds)} "
          f"points x {len(sweep.spec.seeds)} seeds); {skipped} already finished, "
          f"{len(tasks)} to run ({retried} failed before, retried) on {where} -> {out}",
          file=sys.stderr)
    failed = 0
    bar = StudyProgress({t["run_id"]: _named(t["sweep"]["values"], by_run[t["run_id"]]["seed"])
                         for t in tasks}, workers, name=sweep.name, quiet=quiet or not tasks)
    work = lockstep_groups(tasks, workers) if lockstep else tasks
    members = {task["run_id"]: task["members"] for task in work if "members" in task}
    results = execute(work, executor, workers, address, threads, bar.event)
    try:
        for result in (one for outcome in results for one in _member_results(outcome, members)):
            entry = by_run[result["run_id"]]
            if result["files"]:
                try:
                    publish_folder(result["files"], runs_dir / result["run_id"])
                except OSError as err:
                    raise UserError(f"{runs_dir / result['run_id']}: cannot write the run folder "
                                    f"({err.strerror}); the runs recorded so far are kept, run "
                                    "the same command again once there is room") from None
            notes = (result["message"], replaced.get(result["run_id"], ""))
            entry.update(status=result["status"], message="; ".join(n for n in notes if n),
                         wall_s=result["wall_s"], cpu_s=result["cpu_s"],
                         host=result.get("host"),
                         attempts=entry["attempts"] + 1)
            if result["status"] == "failed":
                failed += 1
                bar.write(f"failed: {result['run_id']}: {result['message']}")
            _write(Path(out), sweep, entries, info)
            bar.finished(result["run_id"], result["wall_s"], result["status"] == "failed")
    except BaseException:
        bar.abandon()  # the error or interruption line that follows stands alone
        raise
    finally:
        results.close()  # stops the workers now, whatever ended the loop (Ctrl-C, SIGTERM)
        bar.close()
        _reconcile(sweep, by_run, runs_dir)
        _write(Path(out), sweep, entries, info)
    return SweepCounts(len(entries), skipped, len(tasks), failed)
