"""Checkpoints of one algorithm's run at a round boundary, in a format that holds data only.

Why not pickle: a run folder is what researchers send each other, and unpickling a file runs
whatever code it names (a crafted ``checkpoint.pkl`` could even wrap a genuine checkpoint, so
the resumed results looked right). Nothing in this format can choose code or build objects:

* The file (``checkpoint.npz``) is an uncompressed zip that ``numpy.load(path,
  allow_pickle=False)`` reads: ``header.json`` (format, algorithm label, rounds completed,
  simulated time, the fingerprint of what it belongs to), ``state.json`` (the state tree of
  pipeline/state_tree.py) and ``arrays/aN.npy`` (numeric arrays in .npy format, little-endian).
  It is read with ``zipfile``, ``json`` and the .npy header parser only; no pickle, no
  ``torch.load``.
* A resumed run builds its objects fresh from the scenario exactly as a run starts (the
  network with its random generators and fading processes, the ledger, the run context, the
  algorithm after ``setup``), in a new SimPy environment at the saved time; the checkpoint's
  state (theta, the algorithm's own state, rows recorded so far, counters, ledger, generator
  states, fading and scheduler state) is then put into those objects by attribute path. What is
  not saved comes from the rebuild: the SimPy environment (the base-station process restarts at
  the next round, which is exact because between rounds no other event is pending in the
  vectorized engine), the learning problem, the callbacks, and what the World shares between
  algorithms (the cell, the model and energy profiles) and the configuration.
* What cannot be represented as data, or an object that appeared during the run (restoring it
  would mean building it from the file), is refused when the checkpoint is *written*, with the
  attribute's path: a checkpoint that could not be restored is never written.
* On reading, every member must be stored uncompressed (so no member can expand beyond the
  file's size: no zip bomb), every array's declared dtype and shape is checked against the
  freshly built object at its path (when there is one) and against the bytes actually present
  before anything is allocated, and object dtypes are refused. Any damage (truncated, garbage,
  wrong members, a tree that does not fit the fresh run) is one ``UserError`` line naming the
  file and the fix: delete it to rerun that algorithm from its start.
* The header's fingerprint (pipeline/fingerprint.py: scenario, seed, the algorithm's parameters)
  must match the run being resumed, so a checkpoint copied from another run or written before
  the manifest was edited is refused.
* A ``checkpoint.pkl`` left by an older wirelessfl is never opened: ``--resume`` refuses the
  folder until it is deleted. Refusing (rather than ignoring it and rerunning the algorithm from
  its start) keeps the user in charge: the file may be a genuine checkpoint of hours of work,
  which a silent restart would throw away, or a planted one, which should not stay unnoticed.

Files are written atomically (results/records.atomic_write), so a run killed while writing keeps
the previous checkpoint.
"""

from __future__ import annotations

import json
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from wirelessfl.errors import UserError
from wirelessfl.pipeline.state_tree import ArraySource, StateError, capture, restore
from wirelessfl.results.records import atomic_write

CHECKPOINT_NAME = "checkpoint.npz"
LEGACY_NAME = "checkpoint.pkl"  # FORMAT <= 4: Python pickle, never read
FORMAT = 6  # 2: the run context holds the health counters; 3: the ledger the base station's;
# 4: algorithms' resolved parameters, ZO-HFL/FGDRO/FedNest state, stop_when_unhealthy;
# 5: data only (zip of JSON + .npy), fingerprinted; 6: per-device streams' state (keyed fading,
# lazily charged ledger entries, the network's per-device scheduler averages)
KIND = "wirelessfl-checkpoint"
HEADER, STATE = "header.json", "state.json"
_ARRAY_MEMBER = re.compile(r"arrays/(a[0-9]{1,9})\.npy")
_FINGERPRINT = re.compile(r"[0-9a-f]{64}")
MAX_HEADER_BYTES = 65_536  # header.json: a few hundred bytes
# Largest .npy header accepted (numpy's own default limit).
MAX_NPY_HEADER = 10_000
_FIX = "delete it to rerun {what} from its start"
# What reading a damaged zip, its JSON or an .npy header can raise (RuntimeError: an encrypted
# member; NotImplementedError: an unknown zip feature).
_READ_ERRORS = (OSError, ValueError, KeyError, EOFError, RecursionError, RuntimeError,
                NotImplementedError, zipfile.BadZipFile, zipfile.LargeZipFile)


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint's header (its state is read by ``restore_state``)."""

    path: Path
    label: str
    completed: int
    now_s: float
    fingerprint: str


def save_checkpoint(path: Path, algorithm, completed: int, kept: set[int],
                    start: dict, fingerprint: str) -> None:
    """Write ``algorithm``'s run after ``completed`` rounds to ``path`` (atomically).
    ``kept``: the objects the run is given (state_tree.kept_ids); ``start``: the skeleton of the
    graph when the run started. Something that is not data is a UserError here, when writing."""
    ctx = algorithm.ctx
    try:
        tree, arrays = capture(algorithm, kept, start)
    except StateError as err:
        raise UserError(f"{path}: cannot checkpoint {ctx.algorithm}: {err}; run it without "
                        "--checkpoint-every") from None
    header = {"kind": KIND, "format": FORMAT, "label": ctx.algorithm, "completed": int(completed),
              "now_s": float(ctx.env.now), "fingerprint": fingerprint}

    def write(tmp):
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
            zf.writestr(HEADER, json.dumps(header, allow_nan=False))
            zf.writestr(STATE, json.dumps(tree, allow_nan=False, separators=(",", ":")))
            for key, array in arrays.items():
                array = np.ascontiguousarray(array)
                if array.dtype.byteorder == ">":
                    array = array.astype(array.dtype.newbyteorder("<"))
                with zf.open(f"arrays/{key}.npy", "w", force_zip64=True) as member:
                    np.lib.format.write_array(member, array, allow_pickle=False)

    atomic_write(Path(path), write)


class _Malformed(ValueError):
    """A checkpoint zip whose members are not what this format writes."""


def _damaged(path: Path, err, what: str = "the interrupted algorithm") -> UserError:
    """The one line for a file that cannot be read: our own finding, or the error's type (a
    library's message could quote the file's bytes)."""
    why = str(err) if isinstance(err, (_Malformed, str)) else type(err).__name__
    return UserError(f"{path}: unreadable checkpoint ({why}); {_FIX.format(what=what)}")


def _no_constants(name: str):
    raise ValueError(f"{name} is not JSON")


def _json(zf: zipfile.ZipFile, name: str):
    return json.loads(zf.read(name), parse_constant=_no_constants)


def _open(path: Path) -> zipfile.ZipFile:
    """The checkpoint's zip, its members checked: the expected names only, all stored."""
    zf = zipfile.ZipFile(path)
    names = [info.filename for info in zf.infolist()]
    if HEADER not in names or STATE not in names or len(set(names)) != len(names):
        zf.close()
        raise _Malformed("members missing or repeated")
    for info in zf.infolist():
        if info.compress_type != zipfile.ZIP_STORED:
            zf.close()
            raise _Malformed(f"member {info.filename!r} is compressed")
        if info.filename not in (HEADER, STATE) and not _ARRAY_MEMBER.fullmatch(info.filename):
            zf.close()
            raise _Malformed(f"unexpected member {info.filename!r}")
    return zf


def legacy_checkpoint(folder: Path) -> Path | None:
    """A pickle checkpoint left by an older wirelessfl in ``folder`` (never opened), or None."""
    path = Path(folder) / LEGACY_NAME
    return path if path.exists() or path.is_symlink() else None


def refuse_legacy(folder: Path) -> None:
    """``--resume`` on a folder holding a pickle checkpoint: one error line (it is not read)."""
    path = legacy_checkpoint(folder)
    if path is not None:
        raise UserError(f"{path}: a checkpoint in the old pickle format, which can run code "
                        "when read, so it is not read; delete it to rerun the interrupted "
                        "algorithm from its start (the finished algorithms are kept)")


def read_checkpoint(path: Path) -> Checkpoint | None:
    """The checkpoint's header (validated), or None when there is none."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        return None
    if path.is_symlink() or not path.is_file():
        raise _damaged(path, "not a regular file")
    try:
        with _open(path) as zf:
            if zf.getinfo(HEADER).file_size > MAX_HEADER_BYTES:
                raise _Malformed("an oversized header")
            header = _json(zf, HEADER)
    except _READ_ERRORS as err:
        raise _damaged(path, err) from None
    if type(header) is not dict or header.get("kind") != KIND:
        raise _damaged(path, "not a wirelessfl checkpoint")
    if header.get("format") != FORMAT:
        raise UserError(f"{path}: checkpoint format {header.get('format')!r} is not {FORMAT} "
                        f"(written by another version); {_FIX.format(what='the algorithm')}")
    label, completed, now_s = header.get("label"), header.get("completed"), header.get("now_s")
    fingerprint = header.get("fingerprint")
    if (type(label) is not str or type(completed) is not int or completed < 1
            or type(now_s) not in (int, float) or not 0 <= now_s < float("inf")
            or type(fingerprint) is not str or not _FINGERPRINT.fullmatch(fingerprint)):
        raise _damaged(path, "a malformed header")
    return Checkpoint(path, label, completed, float(now_s), fingerprint)


def check_belongs(saved: Checkpoint, label: str, fingerprint: str, rounds: int) -> None:
    """Refuse a checkpoint written for another algorithm, another scenario (the manifest was
    edited after it was written) or another run (copied from another folder)."""
    if saved.label != label or saved.fingerprint != fingerprint:
        what = "its scenario or parameters differ" if saved.label == label else \
            f"it is {saved.label!r}'s, the run continues with {label!r}"
        raise UserError(f"{saved.path}: this checkpoint does not belong to this run ({what}: "
                        "copied from another run, or the manifest was edited after it was "
                        f"written); {_FIX.format(what=label)}")
    if saved.completed >= rounds:
        raise _damaged(saved.path, f"{saved.completed} rounds completed of {rounds}", label)


class _ZipArrays(ArraySource):
    """The checkpoint's arrays, each checked before it is read: a numeric dtype, the dtype and
    shape of the fresh object at its path, exactly as many bytes as the member holds."""

    def __init__(self, zf: zipfile.ZipFile):
        self.zf = zf
        self.used: set[str] = set()

    def read(self, key, like):
        name = f"arrays/{key}.npy"
        if type(key) is not str or not _ARRAY_MEMBER.fullmatch(name) or key in self.used:
            raise StateError(f"array {key!r} is missing or used twice")
        self.used.add(key)
        info = self.zf.getinfo(name)
        with self.zf.open(info) as member:
            version = np.lib.format.read_magic(member)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(
                    member, max_header_size=MAX_NPY_HEADER)
            elif version in ((2, 0), (3, 0)):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(
                    member, max_header_size=MAX_NPY_HEADER)
            else:
                raise StateError(f"{name}: .npy version {version}")
            if dtype.hasobject or dtype.kind not in "biufc" or dtype.fields is not None:
                raise StateError(f"{name}: dtype {dtype} is not numeric data")
            native = dtype.newbyteorder("=")
            if like is not None and (str(native), tuple(shape)) != (like[0], tuple(like[1])):
                raise StateError(f"{name}: {native} {tuple(shape)} where the run holds "
                                 f"{like[0]} {tuple(like[1])}")
            count = 1
            for n in shape:
                count *= n
            nbytes = count * dtype.itemsize
            if nbytes != info.file_size - member.tell():
                raise StateError(f"{name}: declares {nbytes} bytes, holds "
                                 f"{info.file_size - member.tell()}")
            buffer = bytearray(nbytes)
            if member.readinto(memoryview(buffer)) != nbytes:
                raise StateError(f"{name}: truncated")
        array = np.frombuffer(buffer, dtype=dtype).reshape(shape, order="F" if fortran else "C")
        return array.astype(native, copy=False) if native != dtype else array


def restore_state(saved: Checkpoint, algorithm, kept: set[int]) -> None:
    """Put the checkpoint's state into ``algorithm``, freshly built (and set up) for the same
    scenario in an environment at ``saved.now_s``. UserError when the file is damaged or does
    not fit the run."""
    what = saved.label
    try:
        with _open(saved.path) as zf:
            tree = _json(zf, STATE)
            arrays = _ZipArrays(zf)
            restore(algorithm, tree, arrays, kept, algorithm.theta.device)
            unused = {m.filename for m in zf.infolist() if _ARRAY_MEMBER.fullmatch(m.filename)}
            if len(unused) != len(arrays.used):
                raise StateError("arrays the state does not use")
    except StateError as err:
        raise UserError(f"{saved.path}: the checkpoint does not fit this run ({err}); "
                        f"{_FIX.format(what=what)}") from None
    except (*_READ_ERRORS, TypeError, OverflowError, MemoryError) as err:
        raise _damaged(saved.path, err, what) from None
    if not isinstance(algorithm.theta, torch.Tensor):
        raise _damaged(saved.path, "theta is not a tensor", what)
