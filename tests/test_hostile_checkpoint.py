"""Hostile run folders on `wirelessfl run --resume` (issue 20): a crafted checkpoint (an old
pickle, or an object array smuggled into the data-only format) is refused without executing
anything, a checkpoint copied from another run or a manifest edited after the run started is
refused; each with exit code 2, one `error:` line, no traceback, nothing outside the folder
touched and the results recorded before intact. The resumes run in process (tests/hostile.py's
``run_in_process``); the old pickle's also in a fresh interpreter (slow)."""

from __future__ import annotations

import io
import json
import pickle
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.conftest import small_doc
from tests.hostile import RUNNERS, assert_refused, assert_untouched, snapshot
from wirelessfl.cli import main
from wirelessfl.pipeline.checkpoint import CHECKPOINT_NAME, LEGACY_NAME
from wirelessfl.pipeline.fingerprint import MANIFEST_KEY
from wirelessfl.pipeline.runner import run_scenario
from wirelessfl.results.records import read_run
from wirelessfl.scenario.loader import scenario_from_document

ALGORITHMS = [{"name": "fedavg", "rounds": 4, "eval_every": 2, "local_steps": 2, "label": "A"},
              {"name": "dzofl", "rounds": 30, "eval_every": 5, "label": "B"}]


class _Marker:
    """Unpickling this creates a file: the sign that something executed."""

    def __init__(self, where: Path):
        self.where = where

    def __reduce__(self):
        return (Path.touch, (self.where,))


def _interrupted(out: Path, seed: int = 3) -> None:
    """A run folder as Ctrl-C leaves it: A recorded, B interrupted in round 13 with a
    checkpoint after round 10."""
    sc = scenario_from_document(small_doc(algorithms=ALGORITHMS, seed=seed), "small.yaml")
    seen = [0]

    def on_round(count):
        seen[0] += count
        if seen[0] >= 4 + 13:
            raise KeyboardInterrupt("test")

    with pytest.raises(KeyboardInterrupt):
        run_scenario(sc, out, on_round=on_round, checkpoint_every=5, warn=lambda text: None)
    assert (out / CHECKPOINT_NAME).exists()


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    base = tmp_path_factory.mktemp("interrupted")
    _interrupted(base / "run")
    return base / "run"


@pytest.fixture
def run_dir(tmp_path, folder):
    out = tmp_path / "run"
    shutil.copytree(folder, out)
    return out


def _recorded_a(out: Path):
    record = read_run(out)
    return record.rounds[record.rounds.algorithm == "A"], record.manifest["algorithms"]["A"]


def _refused(tmp_path, out, *fragments, changes_folder=False, runner="in-process"):
    """Resume ``out`` (in process, or in a subprocess): refused (exit 2, one error line naming
    ``fragments``), nothing outside ``out`` touched (nothing at all unless ``changes_folder``),
    A intact."""
    marker = tmp_path / "marker"
    before = snapshot(tmp_path)
    rows, entry = _recorded_a(out)
    proc = RUNNERS[runner]("run", "--resume", str(out), "--quiet", "--no-report", cwd=tmp_path)
    assert_refused(proc, *fragments)
    assert not marker.exists(), "the crafted file executed"
    assert_untouched(tmp_path, before, allowed=[out] if changes_folder else [])
    rows_after, entry_after = _recorded_a(out)
    pd.testing.assert_frame_equal(rows, rows_after)
    assert entry == entry_after


def test_the_genuine_folder_resumes_from_its_checkpoint(run_dir, capsys):
    """The folder the hostile cases start from is resumable (so their refusals are the files')."""
    assert main(["run", "--resume", str(run_dir), "--quiet", "--no-report"]) == 0
    assert "B: continuing from the checkpoint after round 10" in capsys.readouterr().err
    assert not (run_dir / CHECKPOINT_NAME).exists()
    assert read_run(run_dir).manifest["status"] == "complete"


@pytest.mark.parametrize("runner", ["in-process",
                                    pytest.param("subprocess", marks=pytest.mark.slow)])
def test_an_old_pickle_checkpoint_is_never_unpickled(tmp_path, run_dir, runner):
    (run_dir / CHECKPOINT_NAME).unlink()
    (run_dir / LEGACY_NAME).write_bytes(pickle.dumps({"blob": _Marker(tmp_path / "marker")}))
    _refused(tmp_path, run_dir, LEGACY_NAME, "pickle", "delete it", runner=runner)


def test_an_object_array_smuggled_into_the_checkpoint_is_never_loaded(tmp_path, run_dir):
    path = run_dir / CHECKPOINT_NAME
    with zipfile.ZipFile(path) as zf:
        members = {info.filename: zf.read(info) for info in zf.infolist()}
        theta = json.loads(members["state.json"])["attrs"]["theta"]["key"]
    crafted = np.empty(1, dtype=object)
    crafted[0] = _Marker(tmp_path / "marker")
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, crafted, allow_pickle=True)
    members[f"arrays/{theta}.npy"] = buffer.getvalue()
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    _refused(tmp_path, run_dir, CHECKPOINT_NAME, "delete it", changes_folder=True)


def test_garbage_in_place_of_the_checkpoint_is_one_error_line(tmp_path, run_dir):
    (run_dir / CHECKPOINT_NAME).write_bytes(b"PK\x03\x04" + b"\xff" * 300)
    _refused(tmp_path, run_dir, CHECKPOINT_NAME, "unreadable", changes_folder=True)


def test_a_checkpoint_copied_from_another_run_is_refused(tmp_path, run_dir):
    other = tmp_path / "other"
    _interrupted(other, seed=5)
    shutil.copy(other / CHECKPOINT_NAME, run_dir / CHECKPOINT_NAME)
    _refused(tmp_path, run_dir, CHECKPOINT_NAME, "does not belong", changes_folder=True)


def test_a_manifest_edited_after_the_run_started_is_refused(tmp_path, run_dir):
    """Changing B's step size in the manifest would resume B with the checkpoint's (or A's
    recorded) results of the old one: refused before the folder is opened."""
    manifest = json.loads((run_dir / "manifest.json").read_text())
    manifest["scenario"]["algorithms"][1]["alpha0"] = 0.5
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    _refused(tmp_path, run_dir, "manifest.json", MANIFEST_KEY)
    (run_dir / CHECKPOINT_NAME).unlink()  # without a checkpoint: the same refusal
    _refused(tmp_path, run_dir, "manifest.json", MANIFEST_KEY)


def test_a_folder_from_before_the_fingerprint_resumes_with_a_warning(run_dir, capsys):
    manifest = json.loads((run_dir / "manifest.json").read_text())
    del manifest[MANIFEST_KEY]
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    (run_dir / CHECKPOINT_NAME).unlink()
    assert main(["run", "--resume", str(run_dir), "--quiet", "--no-report"]) == 0
    assert "records no scenario fingerprint" in capsys.readouterr().err
