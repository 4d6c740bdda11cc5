"""A run folder on disk: rounds.parquet, devices.parquet and manifest.json (schema in docs/results.md).

Files are rewritten atomically (temporary file + rename) after every algorithm finishes, so an
interrupted or failing run never loses what was already recorded. An ``flock`` on ``.lock`` (the
file holds the writer's process id) refuses a second run writing to the same folder; the kernel
releases it when the writer's process ends, however it ends.
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import shutil
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Self

import numpy as np
import pandas as pd

from wirelessfl.errors import UserError
from wirelessfl.learning.partition import mean_tv_distance

ROUND_COLUMNS = [
    "algorithm", "round", "sim_time_s", "energy_j", "energy_compute_j", "energy_compute_forward_j",
    "energy_compute_backward_j", "energy_uplink_j", "energy_downlink_j", "energy_idle_j",
    "energy_bs_j", "energy_system_j", "bs_airtime_s", "bits_up", "bits_down",
    "delivered_fraction", "transmissions", "late_uploads", "queue_wait_s", "broadcasts_missed",
    "alive_devices", "gradient_evaluations", "hessian_vector_products", "local_steps", "exchanges",
    "test_accuracy", "test_loss", "suboptimality", "grad_norm_sq",
    "mean_device_accuracy", "worst_device_accuracy", "worst_k_device_accuracy", "device_accuracy",
    "param_norm", "quantized_up", "clipped_up", "quantized_down", "clipped_down", "empty_rounds",
    "nonfinite_uploads",
]
DEVICE_COLUMNS = [
    "algorithm", "device", "device_class", "distance_m", "mean_snr_db", "energy_j",
    "energy_compute_j", "energy_uplink_j", "energy_downlink_j", "energy_idle_j", "compute_s",
    "uplink_s", "downlink_s", "idle_s", "depleted_at_s", "bits_up", "packets_sent",
    "packets_delivered", "transmissions", "late_uploads", "queue_wait_s", "broadcasts_missed",
]
PACKAGES = ("wirelessfl", "torch", "numpy", "scipy", "simpy", "pydantic", "pandas", "pyarrow")


def atomic_write(path: Path, write) -> None:
    """Call ``write(tmp)`` on a temporary file beside ``path``, then rename it into place."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_json(path: Path, data: dict) -> None:
    atomic_write(path, lambda tmp: Path(tmp).write_text(json.dumps(data, indent=2) + "\n"))


def write_csv(path: Path, frame: pd.DataFrame) -> None:
    atomic_write(path, lambda tmp: frame.to_csv(tmp, index=False))


def write_table(path: Path, rows: list[dict], columns: list[str]) -> None:
    frame = pd.DataFrame(rows, columns=columns)
    atomic_write(path, lambda tmp: frame.to_parquet(tmp, index=False))


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


LOCK_NAME = ".lock"
# Statuses of an algorithm's entry in the manifest that a resumed run keeps (the others rerun).
FINISHED = ("complete", "diverged")


class FolderLock:
    """An exclusive ``flock`` on ``folder/.lock``, held while the writer lives. The kernel drops
    it when the process ends, however it ends (SIGKILL, out of memory), so a lock can never be
    stale and nothing has to be taken over; two writers can never both hold it (the check and
    the taking are one system call). The file holds the holder's process id, for the message.

    A released lock's file is removed; a writer that opened the file just before and locks it
    just after would hold a lock on a file no longer at that path, so acquiring checks that the
    locked file is still the one at the path, and tries again otherwise."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        self._file = None

    def acquire(self) -> FolderLock:
        for _ in range(100):
            try:  # never through a symbolic link: the file is truncated and written below
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
            except OSError as err:
                raise UserError(f"{self.folder}: cannot open the folder's lock file {self.path} "
                                f"({err.strerror}); check the folder's permissions, or remove "
                                "the file if it is a symbolic link") from None
            handle = os.fdopen(fd, "r+", encoding="utf-8", errors="replace")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.seek(0)
                holder = handle.read().strip()
                handle.close()
                who = f" (process {holder})" if holder.isdigit() else ""
                raise UserError(f"{self.folder}: another run{who} is writing to this folder; "
                                "wait for it or choose another --out") from None
            except OSError as err:
                handle.close()
                raise UserError(f"{self.folder}: cannot lock the folder ({err.strerror}: its "
                                "filesystem does not support file locks); write to a local "
                                "folder") from None
            try:
                ours, there = os.fstat(handle.fileno()), os.stat(self.path)
                same = (ours.st_dev, ours.st_ino) == (there.st_dev, there.st_ino)
            except FileNotFoundError:
                same = False
            if not same:  # released and removed meanwhile: lock the file now at the path
                handle.close()
                continue
            handle.seek(0)
            handle.truncate()
            handle.write(str(os.getpid()))
            handle.flush()
            self._file = handle
            return self
        raise UserError(f"{self.folder}: cannot take the folder's lock {self.path}; another "
                        "process keeps replacing it")

    def release(self) -> None:
        """Remove the file, then drop the lock (in this order: see the class docstring)."""
        if self._file is None:
            return
        self.path.unlink(missing_ok=True)
        self._file.close()
        self._file = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def acquire_lock(folder: Path) -> FolderLock:
    """Lock ``folder`` for this process (FolderLock), or a UserError naming the process that
    holds it. Use as ``with acquire_lock(folder):`` or call ``.release()``."""
    return FolderLock(folder).acquire()


class RunWriter:
    """Keeps a run folder up to date as algorithms finish."""

    def __init__(self, out_dir: Path, scenario_doc: dict, seed: int, extra: dict | None = None,
                 partition: dict | None = None):
        self.dir = Path(out_dir)
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise UserError(f"--out {out_dir}: cannot create the results folder ({err.strerror})")
        if (self.dir / "manifest.json").exists():
            acquire_lock(self.dir).release()  # a live writer there is refused first
            raise UserError(f"--out {out_dir}: already holds a run; choose another folder, or "
                            f"finish it with 'wirelessfl run --resume {out_dir}'")
        self.lock = acquire_lock(self.dir)
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

    @classmethod
    def reopen(cls, out_dir: Path) -> RunWriter:
        """A writer on an existing run folder (``--resume``): keeps the rows of the algorithms
        that finished (complete or diverged) and drops those of an interrupted one."""
        record = read_run(out_dir)
        writer = cls.__new__(cls)
        writer.dir = Path(out_dir)
        writer.lock = acquire_lock(writer.dir)
        writer.manifest = record.manifest
        done = {k: v for k, v in record.manifest.get("algorithms", {}).items()
                if v.get("status") in FINISHED}
        writer.manifest["algorithms"] = done
        writer.manifest["status"] = "running"
        writer.manifest.setdefault("resumed_at", []).append(
            datetime.now(UTC).isoformat(timespec="seconds"))
        keep = lambda frame: frame[frame.algorithm.isin(list(done))]
        writer.round_rows = keep(record.rounds).to_dict("records")
        writer.device_rows = keep(record.devices).to_dict("records")
        writer.flush()
        return writer

    def finish(self, status: str = "complete") -> None:
        self.manifest["status"] = status
        self.manifest["finished_at"] = datetime.now(UTC).isoformat(timespec="seconds")
        self.flush()
        self.lock.release()

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

    @property
    def target_suboptimality(self) -> float | None:
        return self.manifest.get("scenario", {}).get("target_suboptimality")


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
