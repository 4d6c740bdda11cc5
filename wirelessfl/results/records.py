"""A run folder on disk: rounds.parquet, devices.parquet and manifest.json (schema in docs/results.md).

Files are rewritten atomically (temporary file + rename) after every algorithm finishes, so an
interrupted or failing run never loses what was already recorded. An ``flock`` on ``.lock`` (the
file holds the writer's process id) refuses a second run writing to the same folder; the kernel
releases it when the writer's process ends, however it ends.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import math
import os
import platform
import re
import secrets
import shutil
import socket
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Self

import numpy as np
import pandas as pd

from wirelessfl.errors import UserError, os_error_message
from wirelessfl.learning.partition import mean_tv_distance
from wirelessfl.results.health import HealthConfig

ROUND_COLUMNS = [
    "algorithm", "round", "sim_time_s", "energy_j", "energy_compute_j", "energy_compute_forward_j",
    "energy_compute_backward_j", "energy_uplink_j", "energy_downlink_j", "energy_idle_j",
    "energy_bs_j", "energy_system_j", "bs_airtime_s", "bits_up", "bits_down",
    "delivered_fraction", "transmissions", "late_uploads", "queue_wait_s", "broadcasts_missed",
    "alive_devices", "gradient_evaluations", "hessian_vector_products", "local_steps", "exchanges",
    "test_accuracy", "test_loss", "suboptimality", "grad_norm_sq", "objective",
    "mean_device_accuracy", "worst_device_accuracy", "worst_k_device_accuracy", "device_accuracy",
    "worst_class_accuracy", "param_norm", "quantized_up", "clipped_up", "quantized_down",
    "clipped_down", "empty_rounds", "nonfinite_uploads",
]
# The rounds columns that follow the model's numbers (its evaluation and its norm); every other
# column is the simulated world (times, energies, bits, counts), which no learning number feeds:
# equal on any device (tests/test_cuda.py, benchmarks/cuda_check.py).
LEARNING_COLUMNS = ("test_accuracy", "test_loss", "suboptimality", "grad_norm_sq", "objective",
                    "mean_device_accuracy", "worst_device_accuracy", "worst_k_device_accuracy",
                    "device_accuracy", "worst_class_accuracy", "param_norm")
DEVICE_COLUMNS = [
    "algorithm", "device", "device_class", "distance_m", "mean_snr_db", "energy_j",
    "energy_compute_j", "energy_uplink_j", "energy_downlink_j", "energy_idle_j", "compute_s",
    "uplink_s", "downlink_s", "idle_s", "depleted_at_s", "bits_up", "packets_sent",
    "packets_delivered", "transmissions", "late_uploads", "queue_wait_s", "broadcasts_missed",
]
PACKAGES = ("wirelessfl", "torch", "numpy", "scipy", "simpy", "pydantic", "pandas", "pyarrow")


# Temporary files and folders of an unfinished write: ".NAME.tmp-PID-HOST-RANDOM" beside NAME.
# The writer's process id and host tell a stale one (its writer is gone) from one being written.
TEMP_MARK = ".tmp-"
_TEMP = re.compile(r"^\.(?P<name>.+)\.tmp-(?P<pid>\d+)-(?P<host>[A-Za-z0-9_.-]*)-[0-9a-f]{8}$")


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname())[:64]


def _temp_path(path: Path) -> Path:
    return path.parent / f".{path.name}{TEMP_MARK}{os.getpid()}-{_host()}-{secrets.token_hex(4)}"


def _writer_alive(pid: int, host: str) -> bool:
    """Whether the process that named a temporary file may still be writing it (a process on
    another host sharing the folder is assumed alive)."""
    if host != _host():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def remove_stale_temps(folder: Path, name: str | None = None) -> None:
    """Delete the temporary files and folders that interrupted writes (a kill, a full disk) left
    in ``folder`` (only those of ``name`` when given), never one whose writer still runs."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for entry in entries:
        found = _TEMP.match(entry.name)
        if not found or (name is not None and found["name"] != name) \
                or _writer_alive(int(found["pid"]), found["host"]):
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(entry.path)


def _new_temp(path: Path) -> Path:
    """Create an empty temporary file for ``path`` (O_EXCL: never an existing file or link)."""
    while True:
        tmp = _temp_path(path)
        try:
            os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o666))
        except FileExistsError:  # a 32-bit random name taken: draw another
            continue
        return tmp


def sync(path: Path, folder: bool = False) -> None:
    """Flush ``path`` (a file, or with ``folder`` a folder's entries) to the disk: a crash or a
    power cut after an atomic rename then finds the new file whole, which the resume promise
    rests on (docs/reliability.md). A folder that cannot be opened for it (a platform without
    directory sync) is left to the system."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        if folder:
            return
        raise
    try:
        os.fsync(fd)
    except OSError:
        if not folder:
            raise
    finally:
        os.close(fd)


def atomic_write(path: Path, write) -> None:
    """Call ``write(tmp)`` on a new temporary file beside ``path``, then rename it onto ``path``.

    The rename replaces whatever ``path`` is, a symbolic link included, and never writes through
    it; a reader sees the old file or the whole new one; a failed write (a full disk) leaves the
    old file as it was and no temporary file behind. The file gets the permissions of any file
    this process creates (0666 less the umask), so the group reads tables as it reads figures.
    An OSError becomes a UserError naming ``path`` and the fix."""
    path = Path(path)
    remove_stale_temps(path.parent, path.name)
    tmp = None
    try:
        tmp = _new_temp(path)
        write(str(tmp))
        sync(tmp)  # the bytes on disk before the name points at them
        os.replace(tmp, path)
        sync(path.parent, folder=True)  # the rename itself, before anyone is told it is done
    except OSError as err:
        raise UserError(f"cannot write {os_error_message(err, path)}; the file as it was before "
                        "is kept") from err
    finally:
        if tmp is not None and os.path.lexists(tmp):
            os.unlink(tmp)


def write_file(path: Path, content: bytes | str) -> Path:
    """Write ``content`` (text as UTF-8) to ``path`` atomically (atomic_write); returns ``path``."""
    data = content.encode("utf-8") if isinstance(content, str) else content

    def write(tmp: str) -> None:
        fd = os.open(tmp, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)

    atomic_write(path, write)
    return Path(path)


def write_json(path: Path, data: dict) -> None:
    write_file(path, json.dumps(data, indent=2) + "\n")


def write_csv(path: Path, frame: pd.DataFrame) -> None:
    atomic_write(path, lambda tmp: frame.to_csv(tmp, index=False))


def write_table(path: Path, rows: list[dict] | pd.DataFrame, columns: list[str]) -> None:
    frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(rows, columns=columns)
    atomic_write(path, lambda tmp: frame.to_parquet(tmp, index=False))


def output_folder(folder: Path, flag: str = "--out") -> Path:
    """Create ``folder`` (and its parents) for outputs and clear the temporary files interrupted
    writes left there; an OSError becomes a UserError naming ``flag``. A folder the user names
    that is a symbolic link is followed (a scratch disk linked into place is common); inside it,
    files are replaced by rename (atomic_write), never written through a link planted there."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"{flag} {folder}: cannot create the folder: "
                        f"{os_error_message(err, None)}") from None
    remove_stale_temps(folder)
    return folder


def publish_folder(files: dict[str, bytes], final: Path) -> None:
    """Make ``final`` a folder holding exactly ``files`` (name -> content) in one rename: they are
    written to a hidden sibling folder first (``.NAME.XXXXXXXX.partial``, which a sweep's next
    start removes if a kill left it), so a reader (or a rerun after a kill) sees either the old
    folder or the whole new one, never a half-written one. The folder gets 0777 less the umask,
    its files 0666 less the umask, like every output."""
    final = Path(final)
    output_folder(final.parent)
    for name in files:
        if name in ("", ".", "..") or os.sep in name or (os.altsep and os.altsep in name):
            raise UserError(f"{final}: refusing the file name {name!r} (not a plain file name)")
    sibling = lambda suffix: final.parent / f".{final.name}.{secrets.token_hex(4)}{suffix}"
    staging = None
    try:
        while staging is None:
            staging = sibling(".partial")
            try:
                os.mkdir(staging, 0o777)
            except FileExistsError:  # a 32-bit random name taken: draw another
                staging = None
        for name, content in files.items():
            write_file(staging / name, content)
        if os.path.lexists(final):  # a stale or failed earlier attempt: swap it out, delete it
            old = sibling(".old")
            os.replace(final, old)
            os.replace(staging, final)
            if old.is_dir() and not old.is_symlink():
                shutil.rmtree(old, ignore_errors=True)
            else:
                old.unlink()
        else:
            os.replace(staging, final)
        sync(final.parent, folder=True)
    except OSError as err:
        raise UserError(f"cannot write {os_error_message(err, final)}; the folder as it was "
                        "before is kept") from err
    finally:
        if staging is not None and os.path.lexists(staging):
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


# ---- per-device outputs of large populations [D] -------------------------------------------------
# Up to this many devices every per-device output is complete: one devices.parquet row per device
# and algorithm, the manifest's label counts of every device (a few MB of JSON and Parquet at
# most). Above it (cross-device populations: a million devices would give about 20 MB of
# Parquet per algorithm, 120 MB of JSON label counts and minutes of writing), they hold a sample
# and the manifest holds quantiles and totals over every device.
FULL_OUTPUT_DEVICES = 10_000
# Above FULL_OUTPUT_DEVICES: devices whose label counts the manifest keeps (a random sample,
# about one per pixel column of the label histogram) ...
LABEL_SAMPLE_DEVICES = 2_000
# ... and devices.parquet rows per algorithm: every device that took part (computed or sent in
# some round), or a random sample of them when more did.
DEVICE_ROWS_MAX = 10_000
# Devices whose accuracies a rounds row's ``device_accuracy`` list holds: the label-count sample's
# devices (each accuracy beside its device's label mix); the row's mean, worst and worst-k stay
# over every device. A million floats per evaluation would be 8 MB of Parquet and 40 MB of
# Python floats.
ACCURACY_SAMPLE_DEVICES = LABEL_SAMPLE_DEVICES
# Quantiles of every per-device column over all devices, in the manifest above the limit.
DEVICE_QUANTILES = (0.0, 0.05, 0.25, 0.5, 0.75, 0.95, 1.0)
# Columns summed per device class in that summary (where energy and time went, by class).
CLASS_SUMS = ("energy_j", "energy_compute_j", "energy_uplink_j", "energy_downlink_j",
              "energy_idle_j", "compute_s", "uplink_s", "downlink_s", "idle_s")


def sample_by_rank(ranks: np.ndarray, count: int, among: np.ndarray | None = None
                   ) -> np.ndarray:
    """Sorted ids of the ``count`` devices of lowest ``ranks`` (a random permutation of the
    devices, drawn once per run), among the mask ``among`` [N] when given: a uniform sample
    without replacement, the same devices whatever is asked of it (a device in the sample of
    one algorithm's participants is in that of every other's that it took part in)."""
    ids = np.arange(len(ranks)) if among is None else np.flatnonzero(among)
    if len(ids) > count:
        ids = np.sort(ids[np.argpartition(ranks[ids], count - 1)[:count]])
    return ids


def accuracy_sample(ranks: np.ndarray) -> np.ndarray | None:
    """Sorted ids of the devices whose accuracies the rounds rows list above
    FULL_OUTPUT_DEVICES devices (those of lowest ``ranks``, the label-count sample's); None (every
    device) up to it."""
    if len(ranks) <= FULL_OUTPUT_DEVICES:
        return None
    return sample_by_rank(ranks, ACCURACY_SAMPLE_DEVICES)


def partition_manifest(scheme: str, params: dict, counts, ranks: np.ndarray | None = None,
                       drawn: dict | None = None) -> dict:
    """The manifest's ``partition`` entry: the scheme, its parameters, the [N, C] label counts
    (a list per device) and their mean total-variation distance to the overall label mix.

    Above FULL_OUTPUT_DEVICES devices the label counts are those of the LABEL_SAMPLE_DEVICES
    devices of lowest ``ranks`` (``label_counts_sample``: their ids and counts), with the
    population's size and samples per class; the distance is over every device. ``drawn``:
    what a split drawn with replacement (learning/partition.py) records: ``with_replacement``
    and the samples drawn, against the training samples on devices."""
    counts = np.asarray(counts, dtype=np.int64)
    entry = {"scheme": scheme, "params": dict(params), "num_classes": int(counts.shape[1]),
             "mean_label_tv": mean_tv_distance(counts)}
    if len(counts) <= FULL_OUTPUT_DEVICES or ranks is None:
        entry["label_counts"] = counts.tolist()
    else:
        chosen = sample_by_rank(ranks, LABEL_SAMPLE_DEVICES)
        entry.update(num_devices=len(counts), class_totals=counts.sum(axis=0).tolist(),
                     label_counts_sample={"devices": chosen.tolist(),
                                          "counts": counts[chosen].tolist()})
    if drawn:
        entry.update(drawn)
    return entry


def device_frame(label: str, columns: dict[str, np.ndarray], rows=slice(None)) -> pd.DataFrame:
    """devices.parquet rows of one algorithm: ``columns`` (every DEVICE_COLUMNS entry but
    ``algorithm``, one value per device) at ``rows``, in DEVICE_COLUMNS order."""
    data = {name: columns[name][rows] for name in DEVICE_COLUMNS[1:]}
    return pd.DataFrame({"algorithm": np.full(len(data["device"]), label, dtype=object),
                         **data})


def _number(value) -> float | None:
    """A JSON number, None for NaN (the manifest is strict JSON)."""
    value = float(value)
    return value if math.isfinite(value) else None


def device_summary(columns: dict[str, np.ndarray], took_part: np.ndarray, rows: int) -> dict:
    """The manifest entry (``algorithms.<label>.devices``) of a run whose devices.parquet holds
    ``rows`` of its N devices: the rule, and per column the sum, mean and DEVICE_QUANTILES over
    every device (NaN entries, ``depleted_at_s`` of devices whose battery lasted, left out and
    counted); per device class the devices, those that took part and the CLASS_SUMS."""
    n, part = len(took_part), int(took_part.sum())
    rule = ("every device that took part (computed or sent in some round)" if rows == part else
            f"a random sample of {rows:,} of the {part:,} devices that took part (computed or "
            "sent in some round)")
    stats = {}
    for name in DEVICE_COLUMNS[3:]:
        values = np.asarray(columns[name], dtype=float)
        known = values[~np.isnan(values)]
        stats[name] = {"count": len(known), "sum": _number(known.sum()),
                       "mean": _number(known.mean()) if len(known) else None,
                       "quantiles": [_number(q) for q in np.quantile(known, DEVICE_QUANTILES)]
                       if len(known) else None}
    codes, names = pd.factorize(columns["device_class"])
    classes = {}
    for c, name in enumerate(names):
        mask = codes == c
        classes[str(name)] = {"devices": int(mask.sum()), "took_part": int(took_part[mask].sum()),
                              **{k: _number(np.asarray(columns[k])[mask].sum())
                                 for k in CLASS_SUMS}}
    return {"rows": rule, "num_devices": n, "took_part": part, "rows_written": rows,
            "quantiles": list(DEVICE_QUANTILES), "columns": stats, "classes": classes}


def device_records(label: str, columns: dict[str, np.ndarray], ranks: np.ndarray | None = None
                   ) -> tuple[pd.DataFrame, dict | None]:
    """(devices.parquet rows, manifest summary or None) of one algorithm from its per-device
    ``columns`` [N] each: every device's row up to FULL_OUTPUT_DEVICES devices (no summary);
    above, the rows of the devices that took part, at most DEVICE_ROWS_MAX of them (those of
    lowest ``ranks``), and ``device_summary`` over all devices."""
    n = len(columns["device"])
    if n <= FULL_OUTPUT_DEVICES or ranks is None:
        return device_frame(label, columns), None
    took_part = (np.asarray(columns["compute_s"]) > 0) | (np.asarray(columns["transmissions"]) > 0)
    rows = sample_by_rank(ranks, DEVICE_ROWS_MAX, took_part)
    return device_frame(label, columns, rows), device_summary(columns, took_part, len(rows))


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


def claim_run_folder(out_dir: Path) -> tuple[Path, FolderLock]:
    """``out_dir`` (created if needed) locked for a new run: a folder that already holds a run
    is refused, naming the process that writes it if one does, else the way to finish it."""
    folder = output_folder(Path(out_dir))
    if (folder / "manifest.json").exists():
        acquire_lock(folder).release()  # a live writer there is refused first
        raise UserError(f"--out {out_dir}: already holds a run; choose another folder, or "
                        f"finish it with 'wirelessfl run --resume {out_dir}'")
    return folder, acquire_lock(folder)


class MemoryWriter:
    """A run's rows and manifest as algorithms finish, kept in memory: what the Python API's
    ``run(out=None)`` records. ``RunWriter`` is this plus the folder, so the rows and the
    manifest of an in-memory run are built by the same code as a run folder's."""

    def __init__(self, scenario_doc: dict, seed: int, extra: dict | None = None,
                 partition: dict | None = None):
        self.round_rows: list[dict] = []
        self.device_frames: list[pd.DataFrame] = []  # one per algorithm (device_records)
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

    def add(self, label: str, rounds: list[dict], devices: pd.DataFrame | list[dict],
            info: dict) -> None:
        """Record one finished algorithm: its rounds rows, its devices.parquet rows (a frame
        from ``device_records``, or dicts) and its manifest entry."""
        self.round_rows += rounds
        self.device_frames.append(devices if isinstance(devices, pd.DataFrame)
                                  else pd.DataFrame(devices, columns=DEVICE_COLUMNS))
        self.manifest["algorithms"][label] = info
        self.flush()

    def devices(self) -> pd.DataFrame:
        """Every algorithm's devices.parquet rows so far, as one table."""
        frames = [f for f in self.device_frames if len(f)]
        if not frames:
            return pd.DataFrame([], columns=DEVICE_COLUMNS)
        return frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)

    def finish(self, status: str = "complete") -> None:
        self.manifest["status"] = status
        self.manifest["finished_at"] = datetime.now(UTC).isoformat(timespec="seconds")
        self.flush()

    def flush(self) -> None:
        """Nothing to write in memory (RunWriter writes its folder here)."""

    def save_summary(self, table: pd.DataFrame) -> None:
        """Nothing to write in memory (RunWriter writes summary.csv here)."""

    def record(self) -> RunRecord:
        """The run as a reader of its folder would see it (path None): the tables pass through
        Parquet and the manifest through JSON in memory, so their types are those of the files
        (an integer column with a missing value read back as floats, tuples as lists)."""
        return RunRecord(None, _stored(self.round_rows, ROUND_COLUMNS),
                         _stored(self.devices(), DEVICE_COLUMNS),
                         json.loads(json.dumps(self.manifest)))


def _stored(rows: list[dict] | pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """``rows`` as write_table stores them and read_run reads them back."""
    buffer = io.BytesIO()
    frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(rows, columns=columns)
    frame.to_parquet(buffer, index=False)
    buffer.seek(0)
    return pd.read_parquet(buffer)


class RunWriter(MemoryWriter):
    """Keeps a run folder up to date as algorithms finish."""

    def __init__(self, out_dir: Path, scenario_doc: dict, seed: int, extra: dict | None = None,
                 partition: dict | None = None):
        super().__init__(scenario_doc, seed, extra, partition)
        self.dir, self.lock = claim_run_folder(out_dir)
        self._first_flush()

    @classmethod
    def reopen(cls, out_dir: Path) -> RunWriter:
        """A writer on an existing run folder (``--resume``): keeps the rows of the algorithms
        that finished (complete or diverged) and drops those of an interrupted one."""
        record = read_run(out_dir)
        writer = cls.__new__(cls)
        writer.dir = Path(out_dir)
        writer.lock = acquire_lock(writer.dir)
        remove_stale_temps(writer.dir)
        writer.manifest = record.manifest
        done = {k: v for k, v in record.manifest.get("algorithms", {}).items()
                if v.get("status") in FINISHED}
        writer.manifest["algorithms"] = done
        writer.manifest["status"] = "running"
        writer.manifest.setdefault("resumed_at", []).append(
            datetime.now(UTC).isoformat(timespec="seconds"))
        keep = lambda frame: frame[frame.algorithm.isin(list(done))]
        writer.round_rows = keep(record.rounds).to_dict("records")
        writer.device_frames = [keep(record.devices).reset_index(drop=True)]
        writer._first_flush()
        return writer

    def _first_flush(self) -> None:
        """The folder's first write (a new run's, or a resumed one's). Ctrl-C or SIGTERM part
        way through it would leave tables that no manifest describes (a new folder without one,
        which neither --resume nor report can read), so the write is finished with the
        manifest saying 'interrupted' before the interruption goes on (here: the caller has no
        writer to finish yet)."""
        try:
            self.flush()
        except KeyboardInterrupt:
            self.finish("interrupted")
            raise

    def finish(self, status: str = "complete") -> None:
        super().finish(status)
        self.lock.release()

    def save_summary(self, table: pd.DataFrame) -> None:
        write_csv(self.dir / "summary.csv", table)

    def record(self) -> RunRecord:
        return read_run(self.dir)

    def flush(self) -> None:
        write_table(self.dir / "rounds.parquet", self.round_rows, ROUND_COLUMNS)
        write_table(self.dir / "devices.parquet", self.devices(), DEVICE_COLUMNS)
        write_json(self.dir / "manifest.json", self.manifest)


@dataclass
class RunRecord:
    """A run folder read back: what reports and comparisons are drawn from."""

    path: Path | None  # None: a run kept in memory (the Python API's run(out=None))
    rounds: pd.DataFrame
    devices: pd.DataFrame
    manifest: dict

    @property
    def target_accuracy(self) -> float | None:
        return self.manifest.get("scenario", {}).get("target_accuracy")

    @property
    def target_suboptimality(self) -> float | None:
        return self.manifest.get("scenario", {}).get("target_suboptimality")

    @property
    def target_loss(self) -> float | None:
        return self.manifest.get("scenario", {}).get("target_loss")

    @property
    def target_grad_norm_sq(self) -> float | None:
        return self.manifest.get("scenario", {}).get("target_grad_norm_sq")

    @property
    def target_worst_device_accuracy(self) -> float | None:
        return self.manifest.get("scenario", {}).get("target_worst_device_accuracy")


# What the readers of a run folder (report, compare, --resume) rely on without a check for runs
# recorded by older versions: these columns, numeric, and an ``algorithm`` column of labels.
REQUIRED_ROUNDS = ("algorithm", "round", "sim_time_s", "energy_j", "energy_compute_j",
                   "energy_uplink_j", "energy_downlink_j", "bits_up", "delivered_fraction",
                   "test_accuracy")
REQUIRED_DEVICES = ("algorithm", "device")
TEXT_COLUMNS = ("algorithm", "device_class", "device_accuracy")  # the rest are numbers
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _damaged(where: Path, what: str) -> UserError:
    return UserError(f"{where}: {what}; the run folder is damaged: restore it from a copy, or "
                     "run the scenario again into a new folder")


def _is_number(value, optional: bool = False) -> bool:
    if value is None:
        return optional
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _check_table(frame: pd.DataFrame, where: Path, required: tuple[str, ...]) -> None:
    missing = [c for c in required if c not in frame.columns]
    if missing:
        raise _damaged(where, f"columns {', '.join(missing)} are missing")
    for column in frame.columns:
        values = frame[column]
        if column in TEXT_COLUMNS or values.isna().all():
            continue
        if not (pd.api.types.is_numeric_dtype(values) or pd.api.types.is_bool_dtype(values)):
            raise _damaged(where, f"column {column!r} holds {values.dtype} values, not numbers")
    labels = frame["algorithm"]
    if labels.isna().any() or not all(isinstance(v, str) and not _CONTROL.search(v)
                                      for v in labels.unique()):
        raise _damaged(where, "the 'algorithm' column holds values that are not printable labels")


def _check_manifest(manifest, where: Path) -> None:
    """The manifest keys and types the readers use (docs/results.md, "manifest.json")."""
    from pydantic import ValidationError


    if not isinstance(manifest, dict):
        raise _damaged(where, f"holds a JSON {type(manifest).__name__}, not an object")
    for key, kind, what in (("status", str, "a text"), ("scenario", dict, "an object"),
                            ("algorithms", dict, "an object")):
        if not isinstance(manifest.get(key), kind):
            raise _damaged(where, f"'{key}' is missing or not {what}")
    seed = manifest.get("seed")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise _damaged(where, "'seed' is missing or not an integer")
    for label, entry in manifest["algorithms"].items():
        if not isinstance(entry, dict) or not isinstance(entry.get("status", ""), str) \
                or not isinstance(entry.get("params", {}), dict):
            raise _damaged(where, f"'algorithms.{label}' is not an algorithm's entry")
    scenario = manifest["scenario"]
    population = scenario.get("population", {})
    checks = [
        ("scenario.name", isinstance(scenario.get("name", ""), str)),
        ("scenario.population.num_devices", isinstance(population, dict) and isinstance(
            population.get("num_devices", 1), int) and population.get("num_devices", 1) > 0),
        ("scenario.target_accuracy", _is_number(scenario.get("target_accuracy"), True)),
        ("scenario.target_suboptimality", _is_number(scenario.get("target_suboptimality"), True)),
        ("scenario.target_grad_norm_sq", _is_number(scenario.get("target_grad_norm_sq"), True)),
        ("scenario.target_worst_device_accuracy",
         _is_number(scenario.get("target_worst_device_accuracy"), True)),
        ("scenario.worst_fraction", _is_number(scenario.get("worst_fraction", 0.1))),
        ("scenario.algorithms", isinstance(scenario.get("algorithms", []), list) and all(
            isinstance(a, dict) for a in scenario.get("algorithms", []))),
    ]
    for key, ok in checks:
        if not ok:
            raise _damaged(where, f"'{key}' has a value of the wrong kind")
    try:
        HealthConfig.model_validate(scenario.get("health") or {})
    except ValidationError:
        raise _damaged(where, "'scenario.health' is not a valid health section") from None
    partition = manifest.get("partition")
    if partition is not None:
        try:
            counts = np.asarray(partition.get("label_counts") or [], dtype=float)
            ok = counts.ndim in (1, 2) and isinstance(partition.get("params") or {}, dict) \
                and _is_number(partition.get("mean_label_tv"), True)
        except (AttributeError, TypeError, ValueError):
            ok = False
        if not ok:
            raise _damaged(where, "'partition' is not a partition entry")


def read_run(path: str | Path) -> RunRecord:
    """Load a run folder, checked for what its readers rely on: a missing file, a file that is not
    what it should be (truncated, not JSON, not Parquet), a missing key or column or a value of the
    wrong kind ends in a UserError naming the file and the fix, never in a traceback further on."""
    import pyarrow

    folder = Path(path)
    missing = [f for f in ("rounds.parquet", "devices.parquet", "manifest.json")
               if not (folder / f).is_file()]
    if missing:
        raise UserError(f"{folder}: not a wirelessfl run folder (missing {', '.join(missing)}); "
                        "pass the folder that 'wirelessfl run' wrote (see its --out)")
    where = folder / "manifest.json"
    try:
        manifest = json.loads(where.read_text(encoding="utf-8"))
    except OSError as err:
        raise UserError(f"cannot read {os_error_message(err, where)}") from None
    except (ValueError, RecursionError) as err:  # not UTF-8, not JSON, nested too deep
        raise _damaged(where, f"not a JSON document ({type(err).__name__})") from None
    _check_manifest(manifest, where)
    tables = {}
    for name, required in (("rounds.parquet", REQUIRED_ROUNDS),
                           ("devices.parquet", REQUIRED_DEVICES)):
        where = folder / name
        try:
            tables[name] = pd.read_parquet(where)
        except OSError as err:
            if err.errno is None:  # pyarrow's error for bytes that are not a Parquet file
                raise _damaged(where, f"not a readable Parquet file ({err})") from None
            raise UserError(f"cannot read {os_error_message(err, where)}") from None
        except (ValueError, TypeError, KeyError, pyarrow.ArrowException) as err:
            raise _damaged(where, f"not a readable Parquet file ({type(err).__name__}: "
                                  f"{str(err)[:200]})") from None
        _check_table(tables[name], where, required)
    return RunRecord(folder, tables["rounds.parquet"], tables["devices.parquet"], manifest)
