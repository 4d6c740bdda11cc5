"""A run folder on disk: rounds.parquet, devices.parquet and manifest.json (schema in docs/results.md).

Files are rewritten atomically (temporary file + rename) after every algorithm finishes, so an
interrupted or failing run never loses what was already recorded.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

import numpy as np
import pandas as pd

from wirelessfl.errors import UserError
from wirelessfl.learning.partition import mean_tv_distance

ROUND_COLUMNS = [
    "algorithm", "round", "sim_time_s", "energy_j", "energy_compute_j", "energy_compute_forward_j",
    "energy_compute_backward_j", "energy_uplink_j", "energy_downlink_j", "energy_idle_j",
    "bits_up", "bits_down", "delivered_fraction", "transmissions", "late_uploads",
    "queue_wait_s", "broadcasts_missed", "alive_devices", "gradient_evaluations",
    "local_steps", "exchanges",
    "test_accuracy", "test_loss", "suboptimality", "grad_norm_sq",
    "mean_device_accuracy", "worst_device_accuracy", "worst_k_device_accuracy", "device_accuracy",
]
DEVICE_COLUMNS = [
    "algorithm", "device", "device_class", "distance_m", "mean_snr_db", "energy_j",
    "energy_compute_j", "energy_uplink_j", "energy_downlink_j", "energy_idle_j", "compute_s",
    "uplink_s", "downlink_s", "idle_s", "depleted_at_s", "bits_up", "packets_sent",
    "packets_delivered", "transmissions", "late_uploads", "queue_wait_s", "broadcasts_missed",
]
PACKAGES = ("wirelessfl", "torch", "numpy", "scipy", "simpy", "pydantic", "pandas", "pyarrow")


def _atomic_write(path: Path, write) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_json(path: Path, data: dict) -> None:
    _atomic_write(path, lambda tmp: Path(tmp).write_text(json.dumps(data, indent=2) + "\n"))


def write_csv(path: Path, frame: pd.DataFrame) -> None:
    _atomic_write(path, lambda tmp: frame.to_csv(tmp, index=False))


def write_table(path: Path, rows: list[dict], columns: list[str]) -> None:
    frame = pd.DataFrame(rows, columns=columns)
    _atomic_write(path, lambda tmp: frame.to_parquet(tmp, index=False))


def publish_folder(files: dict[str, bytes], final: Path) -> None:
    """Make ``final`` a folder holding exactly ``files`` (name -> content) in one rename: they are
    written to a hidden sibling folder first, so a reader (or a rerun after a kill) sees either
    the old folder or the whole new one, never a half-written one."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.", suffix=".partial"))
    try:
        for name, content in files.items():
            (staging / name).write_bytes(content)
        if final.exists():  # a stale or failed earlier attempt: swap it out, then delete it
            old = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.", suffix=".old"))
            os.replace(final, old / "run")
            os.replace(staging, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(staging, final)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def folder_files(folder: Path) -> dict[str, bytes]:
    """Every plain file of a run folder, by name (what a sweep worker sends back)."""
    return {p.name: p.read_bytes() for p in sorted(Path(folder).iterdir()) if p.is_file()}


def package_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def partition_manifest(scheme: str, params: dict, counts) -> dict:
    """The manifest's ``partition`` entry: the scheme, its parameters, the [N, C] label counts
    (a list per device) and their mean total-variation distance to the overall label mix."""
    counts = np.asarray(counts, dtype=np.int64)
    return {"scheme": scheme, "params": dict(params), "num_classes": int(counts.shape[1]),
            "mean_label_tv": mean_tv_distance(counts), "label_counts": counts.tolist()}


class RunWriter:
    """Keeps a run folder up to date as algorithms finish."""

    def __init__(self, out_dir: Path, scenario_doc: dict, seed: int, extra: dict | None = None,
                 partition: dict | None = None):
        self.dir = Path(out_dir)
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise UserError(f"--out {out_dir}: cannot create the results folder ({err.strerror})")
        self.round_rows: list[dict] = []
        self.device_rows: list[dict] = []
        self.manifest = {
            "status": "running",
            "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "seed": seed,
            "scenario": scenario_doc,
            "versions": package_versions(),
            "algorithms": {},
            **(extra or {}),
        }
        if partition is not None:
            self.manifest["partition"] = partition
        self.flush()

    def add(self, label: str, rounds: list[dict], devices: list[dict], info: dict) -> None:
        self.round_rows += rounds
        self.device_rows += devices
        self.manifest["algorithms"][label] = info
        self.flush()

    def finish(self, status: str = "complete") -> None:
        self.manifest["status"] = status
        self.manifest["finished_at"] = datetime.now(UTC).isoformat(timespec="seconds")
        self.flush()

    def flush(self) -> None:
        write_table(self.dir / "rounds.parquet", self.round_rows, ROUND_COLUMNS)
        write_table(self.dir / "devices.parquet", self.device_rows, DEVICE_COLUMNS)
        write_json(self.dir / "manifest.json", self.manifest)


@dataclass
class RunRecord:
    """A run folder read back: what reports and comparisons are drawn from."""

    path: Path
    rounds: pd.DataFrame
    devices: pd.DataFrame
    manifest: dict

    @property
    def target_accuracy(self) -> float | None:
        return self.manifest.get("scenario", {}).get("target_accuracy")


def read_run(path: str | Path) -> RunRecord:
    """Load a run folder, with a clean error naming what is missing."""
    folder = Path(path)
    missing = [f for f in ("rounds.parquet", "devices.parquet", "manifest.json")
               if not (folder / f).is_file()]
    if missing:
        raise UserError(f"{folder}: not a wirelessfl run folder (missing {', '.join(missing)}); "
                        "pass the folder that 'wirelessfl run' wrote (see its --out)")
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
        rounds = pd.read_parquet(folder / "rounds.parquet")
        devices = pd.read_parquet(folder / "devices.parquet")
    except (OSError, ValueError) as err:
        raise UserError(f"{folder}: cannot read the run's files ({err}); rerun the scenario")
    return RunRecord(folder, rounds, devices, manifest)
