"""The data-only checkpoint (pipeline/checkpoint.py, pipeline/state_tree.py): a run interrupted and
resumed from checkpoints records exactly what the uninterrupted run records, for every
algorithm; the file is a zip of JSON and .npy arrays that nothing executes from; damaged,
crafted or foreign checkpoints are refused with one UserError line before anything is
allocated. The command-line cases are in test_hostile_checkpoint.py."""

from __future__ import annotations

import ast
import io
import json
import pickle
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import simpy
import torch

from tests.conftest import algorithm_scenario, small_scenario
from tests.test_radio_engine import SETTINGS
from wirelessfl.errors import UserError
from wirelessfl.pipeline import checkpoint as ck
from wirelessfl.pipeline import simulation
from wirelessfl.pipeline.build import build_world
from wirelessfl.pipeline.simulation import run_algorithm
from wirelessfl.pipeline.state_tree import StateError, capture, restore, skeleton
from wirelessfl.plugins import ALGORITHMS
from wirelessfl.results.records import ROUND_COLUMNS, write_table

REGISTRY = ALGORITHMS.load_builtins()
ROOT = Path(__file__).resolve().parents[1]


def _stop_after(rounds: int):
    """An on_round callback that interrupts the run (as Ctrl-C would) once ``rounds`` rounds
    were reported (a resumed run reports its completed rounds first)."""
    seen = [0]

    def on_round(count: int) -> None:
        seen[0] += count
        if seen[0] >= rounds:
            raise KeyboardInterrupt("test")

    return on_round


def _table(rows, folder: Path) -> bytes:
    """The rounds table as rounds.parquet holds it, and every value's repr: equal bytes mean
    identical results."""
    write_table(folder / "rounds.parquet", rows, ROUND_COLUMNS)
    return (folder / "rounds.parquet").read_bytes() + repr(rows).encode()


def _interrupted_twice(sc, path: Path):
    """The scenario's first algorithm (6 rounds, checkpoints every 2) interrupted in round 4,
    resumed from the checkpoint after round 2 (which writes one after round 4), interrupted in
    round 6, resumed from that one to the end."""
    params = sc.algorithms[0]
    first = run_algorithm(build_world(sc), params, on_round=_stop_after(4), checkpoint_every=2,
                          checkpoint_path=path)
    assert first.status == "interrupted"
    saved = ck.read_checkpoint(path)
    assert saved.completed == 2 and saved.label == params.display_name
    second = run_algorithm(build_world(sc), params, on_round=_stop_after(6), checkpoint_every=2,
                           checkpoint_path=path, resume=saved)
    assert second.status == "interrupted"
    saved = ck.read_checkpoint(path)
    assert saved.completed == 4
    return run_algorithm(build_world(sc), params, checkpoint_every=2, checkpoint_path=path,
                         resume=saved)


def _assert_same_run(full, resumed, world, tmp_path):
    assert _table(full.rows, tmp_path) == _table(resumed.rows, tmp_path)
    for name in ("energy_j", "busy_s", "bits_up", "packets_delivered", "depleted_at_s"):
        np.testing.assert_array_equal(getattr(full.ledger, name), getattr(resumed.ledger, name))
    pd.testing.assert_frame_equal(full.device_rows(world), resumed.device_rows(world))
    assert (full.status, full.message) == (resumed.status, resumed.message)


def _small(algorithm: dict):
    return algorithm_scenario({**algorithm, "rounds": 6, "eval_every": 1},
                              ["data.server_fraction=0.3"])


def _quadratic(algorithm: dict):
    """fedred.md's quadratic (the theory's default rules and the exact solver need its L)."""
    from tests.test_drift import _scenario

    return _scenario({**algorithm, "rounds": 6})


SCENARIOS = {name: (lambda name=name: _small({"name": name})) for name in sorted(REGISTRY)}
SCENARIOS.update({
    "fgdro-kl warm": lambda: _small({"name": "fgdro-kl", "start": "warm"}),
    "scaffnew sgd": lambda: _small({"name": "scaffnew", "full_batch": False}),
    "fedred exact": lambda: _quadratic({"name": "fedred", "solver": "exact", "p": 0.5}),
    "fedred theory": lambda: _quadratic({"name": "fedred"}),
    "dane-plus adaptive": lambda: _quadratic({"name": "dane-plus"}),
    "zo-hfl global loss": lambda: _small({"name": "zo-hfl", "log_objective": True}),
})


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_every_algorithm_resumed_twice_records_the_uninterrupted_run(tmp_path, name):
    """Byte-identical rounds table, ledger and device rows, for every registered algorithm
    (and variants with state of their own): the independent truth is the run never
    interrupted, without checkpoints."""
    sc = SCENARIOS[name]()
    world = build_world(sc)
    full = run_algorithm(world, sc.algorithms[0])
    assert full.status == "complete", full.message
    resumed = _interrupted_twice(sc, tmp_path / ck.CHECKPOINT_NAME)
    _assert_same_run(full, resumed, world, tmp_path)


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_radio_state_resumes_exactly(tmp_path, setting):
    """Fading processes (block, gauss-markov), the proportional-fair averages, deadlines and
    lost broadcasts (stale devices) are state the checkpoint restores."""
    sc = small_scenario(SETTINGS[setting], algorithms=[
        {"name": "fedavg", "rounds": 6, "eval_every": 1, "local_steps": 2}])
    world = build_world(sc)
    full = run_algorithm(world, sc.algorithms[0])
    _assert_same_run(full, _interrupted_twice(sc, tmp_path / ck.CHECKPOINT_NAME), world,
                     tmp_path)


def _checkpointed(tmp_path, name="fedred", rounds=5, every=3, **params):
    sc = algorithm_scenario({"name": name, "rounds": rounds, "eval_every": 1, **params})
    path = tmp_path / ck.CHECKPOINT_NAME
    run_algorithm(build_world(sc), sc.algorithms[0], checkpoint_every=every, checkpoint_path=path)
    return sc, path


def test_the_file_is_numpy_readable_without_pickle(tmp_path):
    """numpy reads every member with allow_pickle=False; the header names what it belongs to."""
    path = _checkpointed(tmp_path)[1]
    with np.load(path, allow_pickle=False) as npz:
        header = json.loads(npz["header.json"])
        arrays = [npz[name] for name in npz.files if name.startswith("arrays/")]
        json.loads(npz["state.json"])
    assert header["format"] == ck.FORMAT and header["completed"] == 3
    assert header["label"] == "fedred" and len(header["fingerprint"]) == 64
    assert arrays and all(a.dtype.kind in "biufc" for a in arrays)
    with zipfile.ZipFile(path) as zf:
        assert all(info.compress_type == zipfile.ZIP_STORED for info in zf.infolist())


def test_the_loading_code_has_no_path_to_pickle(tmp_path, monkeypatch):
    """Neither module imports pickle (or anything that loads code), and a resume with every
    unpickling entry point booby-trapped works."""
    banned_imports = {"pickle", "_pickle", "dill", "marshal", "shelve", "importlib", "cloudpickle"}
    for module in ("checkpoint.py", "state_tree.py"):
        tree = ast.parse((ROOT / "wirelessfl" / "pipeline" / module).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                assert not {a.name.split(".")[0] for a in node.names} & banned_imports
            if isinstance(node, ast.ImportFrom):
                assert (node.module or "").split(".")[0] not in banned_imports
            if isinstance(node, ast.Name):
                assert node.id not in {"eval", "exec", "__import__", "compile"}
            if isinstance(node, ast.keyword) and node.arg == "allow_pickle":
                assert isinstance(node.value, ast.Constant) and node.value.value is False
            if isinstance(node, ast.Attribute) and node.attr == "load":
                assert not (isinstance(node.value, ast.Name) and node.value.id == "torch")

    def trap(*args, **kwargs):
        raise AssertionError("something was unpickled")

    sc, path = _checkpointed(tmp_path)
    for target, name in ((pickle, "load"), (pickle, "loads"), (pickle, "Unpickler"),
                         (torch, "load"), (np, "load")):
        monkeypatch.setattr(target, name, trap)
    saved = ck.read_checkpoint(path)
    run = run_algorithm(build_world(sc), sc.algorithms[0], resume=saved)
    assert run.status == "complete" and run.rows[-1]["round"] == 5


def _rewrite(path: Path, replace: dict[str, bytes], drop=(), compress=None):
    """Copy the checkpoint zip with members replaced (or added), dropped, or compressed."""
    with zipfile.ZipFile(path) as zf:
        members = {info.filename: zf.read(info) for info in zf.infolist()}
    members = {**{k: v for k, v in members.items() if k not in drop}, **replace}
    with zipfile.ZipFile(path, "w", compression=compress or zipfile.ZIP_STORED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)


def _npy(array, allow_pickle=False) -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, array, allow_pickle=allow_pickle)
    return buffer.getvalue()


def _theta_key(path: Path) -> str:
    with zipfile.ZipFile(path) as zf:
        return json.loads(zf.read("state.json"))["attrs"]["theta"]["key"]


class _Marker:
    """Unpickling this creates a file: the sign that something executed."""

    def __init__(self, where: Path):
        self.where = where

    def __reduce__(self):
        return (Path.touch, (self.where,))


def _resume(sc, path: Path):
    saved = ck.read_checkpoint(path)
    return run_algorithm(build_world(sc), sc.algorithms[0], resume=saved)


@pytest.mark.parametrize("damage", ["object array", "truncated", "garbage", "bomb", "shape",
                                    "huge shape", "huge new array", "bad dtype", "deep", "class", "no header",
                                    "extra member", "dunder", "method", "nan token", "format",
                                    "string for number"])
def test_a_damaged_or_crafted_checkpoint_is_one_user_error(tmp_path, damage):
    """Never a traceback, never an allocation beyond the file, nothing executed."""
    sc, path = _checkpointed(tmp_path)
    marker = tmp_path / "marker"
    key = _theta_key(path)
    with zipfile.ZipFile(path) as zf:
        state = json.loads(zf.read("state.json"))
        header = json.loads(zf.read("header.json"))
    if damage == "object array":
        crafted = np.empty(1, dtype=object)
        crafted[0] = _Marker(marker)
        _rewrite(path, {f"arrays/{key}.npy": _npy(crafted, allow_pickle=True)})
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif damage == "garbage":
        path.write_bytes(b"\x00garbage" * 100)
    elif damage == "bomb":  # a member that expands far beyond the file
        _rewrite(path, {"state.json": b" " * 50_000_000 + json.dumps(state).encode()},
                 compress=zipfile.ZIP_DEFLATED)
    elif damage == "shape":
        _rewrite(path, {f"arrays/{key}.npy": _npy(np.zeros(7, np.float32))})
    elif damage == "huge shape":  # declares 2^60 floats, holds a few bytes
        head = io.BytesIO()
        np.lib.format.write_array_header_1_0(
            head, {"descr": "<f4", "fortran_order": False, "shape": (2**30, 2**30)})
        _rewrite(path, {f"arrays/{key}.npy": head.getvalue() + b"\x00" * 64})
    elif damage == "huge new array":  # no fresh array to compare with: the bytes present
        head = io.BytesIO()
        np.lib.format.write_array_header_1_0(
            head, {"descr": "<f8", "fortran_order": False, "shape": (2**40,)})
        state["attrs"]["appeared"] = {"$": "array", "key": "a999"}
        _rewrite(path, {"arrays/a999.npy": head.getvalue() + b"\x00" * 64,
                        "state.json": json.dumps(state).encode()})
    elif damage == "bad dtype":
        _rewrite(path, {f"arrays/{key}.npy": _npy(np.zeros(3, dtype="U4"))})
    elif damage == "deep":
        _rewrite(path, {"state.json": b"[" * 100_000 + b"]" * 100_000})
    elif damage == "class":  # an object the fresh run does not have
        state["attrs"]["extra"] = {"$": "object", "class": "os.system", "attrs": {}}
        _rewrite(path, {"state.json": json.dumps(state).encode()})
    elif damage == "no header":
        _rewrite(path, {}, drop=("header.json",))
    elif damage == "extra member":
        _rewrite(path, {"payload.pkl": pickle.dumps(_Marker(marker))})
    elif damage == "dunder":
        state["attrs"]["__class__"] = 1
        _rewrite(path, {"state.json": json.dumps(state).encode()})
    elif damage == "method":  # data where the class has behaviour
        state["attrs"]["round"] = 1
        _rewrite(path, {"state.json": json.dumps(state).encode()})
    elif damage == "nan token":
        _rewrite(path, {"state.json": json.dumps(state)[:-1].encode() + b',"x":NaN}'})
    elif damage == "string for number":
        state["attrs"]["ctx"]["attrs"]["eval_every"] = "1"
        _rewrite(path, {"state.json": json.dumps(state).encode()})
    elif damage == "format":
        _rewrite(path, {"header.json": json.dumps({**header, "format": 4}).encode()})
    with pytest.raises(UserError) as err:
        _resume(sc, path)
    message = str(err.value)
    assert str(path) in message and "delete it" in message and "\n" not in message
    assert not marker.exists()


def test_a_checkpoint_of_another_run_or_scenario_is_refused(tmp_path):
    """The fingerprint binds the checkpoint to its scenario, seed and algorithm parameters."""
    path = _checkpointed(tmp_path)[1]
    other = algorithm_scenario({"name": "fedred", "rounds": 5, "eval_every": 1, "eta": 11.0})
    with pytest.raises(UserError, match="does not belong to this run"):
        _resume(other, path)
    reseeded = algorithm_scenario({"name": "fedred", "rounds": 5, "eval_every": 1},
                                  ["seed=4"])
    with pytest.raises(UserError, match="does not belong to this run"):
        _resume(reseeded, path)
    relabelled = algorithm_scenario({"name": "fedred", "rounds": 5, "eval_every": 1,
                                     "label": "B"})
    with pytest.raises(UserError, match="does not belong to this run"):
        _resume(relabelled, path)


def _fresh(world, params):
    """An algorithm as a run starts it, and what the run is given (not saved)."""
    algorithm = simulation.build_algorithm(world, params, simpy.Environment(), None, None)
    return algorithm, simulation._given(world, algorithm)


def test_state_that_is_not_data_is_refused_when_saving():
    """A lambda, an object created during the run, an array that changed shape, a view of
    another tensor, an object array, another library's object: refused at save time, naming
    the attribute."""
    sc = algorithm_scenario({"name": "fedavg", "rounds": 2, "eval_every": 1})
    world = build_world(sc)
    algorithm, kept = _fresh(world, sc.algorithms[0])
    capture(algorithm, kept, skeleton(algorithm, kept))  # the graph as it starts is data
    cases = {
        "hook": lambda a: setattr(a, "hook", lambda: kept),
        "later": lambda a: setattr(a, "later", type(a.ctx.health)()),
        "bits_up": lambda a: setattr(a.ctx.ledger, "bits_up", np.zeros(3)),
        "view": lambda a: setattr(a, "view", a.theta[1:]),
        "things": lambda a: setattr(a, "things", np.array([object()])),
        "file": lambda a: setattr(a, "file", io.BytesIO()),
    }
    for name, change in cases.items():
        algorithm, kept = _fresh(world, sc.algorithms[0])
        start = skeleton(algorithm, kept)
        change(algorithm)
        with pytest.raises(StateError, match=name):
            capture(algorithm, kept, start)


def test_new_attributes_holding_data_and_aliases_round_trip():
    """A leaf that appears during a run comes back; the same object reached twice comes back
    as one object; a generator's state is restored into the fresh generator."""
    sc = algorithm_scenario({"name": "fedavg", "rounds": 2, "eval_every": 1})
    world = build_world(sc)
    source, kept = _fresh(world, sc.algorithms[0])
    source.appeared = [1.5, float("nan"), {"k": (1, None)}, np.float32(2.5)]
    source.accuracies = [float(i) for i in range(19)] + [float("nan")]  # one float64 array
    source.models = torch.arange(6.0).reshape(2, 3)
    source.same = source.models
    source.ctx.net.rng.random(5)
    tree, arrays = capture(source, kept, skeleton(source, kept))

    class Arrays(ck.ArraySource):
        def read(self, key, like):
            return arrays[key].copy()

    target, kept_target = _fresh(world, sc.algorithms[0])
    restore(target, json.loads(json.dumps(tree)), Arrays(), kept_target, torch.device("cpu"))
    assert target.appeared[0] == 1.5 and np.isnan(target.appeared[1])
    assert target.appeared[2] == {"k": (1, None)} and type(target.appeared[3]) is np.float32
    assert repr(target.accuracies) == repr(source.accuracies)
    assert target.same is target.models and torch.equal(target.models, source.models)
    assert target.ctx.net.ledger is target.ctx.ledger
    assert target.ctx.net.uplink._fading.rng is target.ctx.net.rng
    assert target.ctx.net.rng.random() == source.ctx.net.rng.random()


def test_a_save_that_is_refused_is_one_user_error(tmp_path, monkeypatch):
    """At the run's start already: an object that is not data fails the skeleton."""
    from wirelessfl.algorithms.fedavg import FedAvg

    original = FedAvg.setup

    def setup(self):
        original(self)
        self.callback = lambda: None

    monkeypatch.setattr(FedAvg, "setup", setup)
    sc = algorithm_scenario({"name": "fedavg", "rounds": 3, "eval_every": 1})
    with pytest.raises(UserError, match="callback"):
        run_algorithm(build_world(sc), sc.algorithms[0], checkpoint_every=1,
                      checkpoint_path=tmp_path / ck.CHECKPOINT_NAME)
    assert not (tmp_path / ck.CHECKPOINT_NAME).exists()
