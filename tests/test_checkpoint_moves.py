"""A run interrupted before issue 33's moves resumes after them and records what an
uninterrupted run records.

``tests/data/checkpoints-before-issue-33/<label>/`` are run folders written by the code at
282c5be (before the layers moved classes: the run context's health counter now lives in
engine/recorder.py), each interrupted after round 4 of 8 with a checkpoint (every 2 rounds):
the small scenario (tests/conftest.py) with FedAvg, DZOFL, FGDRO-KL and, on the bilevel
quadratic, FedMSA. Written on an AVX-512 host: a resumed run's floats are compared with a fresh
run's within a stated tolerance (the last rounds' reductions may differ in the last digits on
another CPU), everything else exactly.
"""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from wirelessfl import cli
from wirelessfl.pipeline import state_tree
from wirelessfl.pipeline.runner import run_scenario
from wirelessfl.scenario.loader import scenario_from_document

FIXTURES = Path(__file__).resolve().parent / "data" / "checkpoints-before-issue-33"
LABELS = sorted(p.name for p in FIXTURES.iterdir())
# Relative and absolute tolerance of float columns between the resumed and the fresh run
# [D]: identical on the recording host (measured: 0 difference); on another CPU, four rounds
# after a state whose reductions may differ in the last digits.
RTOL, ATOL = 1e-6, 1e-9


def _classes(folder: Path) -> set[str]:
    with zipfile.ZipFile(folder / "checkpoint.npz") as zf:
        tree = json.loads(zf.read("state.json"))
    found = set()

    def walk(node):
        if isinstance(node, dict):
            if node.get("$") == "object":
                found.add(node["class"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(tree)
    return found


def test_the_fixtures_name_a_moved_class_by_its_old_name():
    """What makes the resume below a test of the rename table: the checkpoints hold the health
    counter under its module before the move, which no longer exists there."""
    for label in LABELS:
        assert "wirelessfl.engine.context.HealthCounter" in _classes(FIXTURES / label), label
    assert state_tree.RENAMED["wirelessfl.engine.context.HealthCounter"] \
        == "wirelessfl.engine.recorder.HealthCounter"
    from wirelessfl.engine import context, recorder

    assert recorder.HealthCounter.__module__ == "wirelessfl.engine.recorder"
    assert "HealthCounter" not in vars(context) or context.HealthCounter is recorder.HealthCounter


# Rounds columns added after the fixtures were written: the rows the checkpoint carries (those
# before the interruption) hold NaN there; the rows after it are compared as every other column.
NEWER_COLUMNS = ("worst_class_accuracy",)


def _compare(resumed: pd.DataFrame, fresh: pd.DataFrame) -> None:
    assert list(resumed.columns) == list(fresh.columns)
    assert len(resumed) == len(fresh)
    for column in fresh.columns:
        a, b = resumed[column], fresh[column]
        if column in NEWER_COLUMNS and a.isna().any() and not b.isna().all():
            before = a.isna().to_numpy()
            assert before[:before.sum()].all() and 0 < before.sum() < len(a), column
            a, b = a[~before], b[~before]
        if pd.api.types.is_float_dtype(b):
            np.testing.assert_allclose(a.to_numpy(), b.to_numpy(), rtol=RTOL, atol=ATOL,
                                       equal_nan=True, err_msg=column)
        elif b.dtype == object:
            for x, y in zip(a, b, strict=True):
                if isinstance(y, (list, np.ndarray)):
                    np.testing.assert_allclose(np.asarray(x, float), np.asarray(y, float),
                                               rtol=RTOL, atol=ATOL, err_msg=column)
                else:
                    assert x == y or (x is None and y is None), column
        else:
            assert a.tolist() == b.tolist(), column


@pytest.mark.parametrize("label", LABELS)
def test_a_checkpoint_written_before_the_moves_resumes(label, tmp_path, capsys):
    folder = tmp_path / "interrupted"
    shutil.copytree(FIXTURES / label, folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["status"] == "interrupted"
    assert cli.main(["run", "--resume", str(folder), "--quiet", "--no-report"]) == 0
    assert "continuing from the checkpoint after round 4" in capsys.readouterr().err
    assert json.loads((folder / "manifest.json").read_text())["status"] == "complete"
    scenario = scenario_from_document(manifest["scenario"], "manifest.json")
    run_scenario(scenario, tmp_path / "fresh", warn=lambda text: None)
    for table in ("rounds", "devices"):
        _compare(pd.read_parquet(folder / f"{table}.parquet"),
                 pd.read_parquet(tmp_path / "fresh" / f"{table}.parquet"))


def test_without_the_rename_the_old_checkpoint_is_refused(tmp_path, monkeypatch, capsys):
    """The table is what lets it resume: emptied, the same folder is one clear error."""
    folder = tmp_path / "interrupted"
    shutil.copytree(FIXTURES / LABELS[0], folder)
    monkeypatch.setattr(state_tree, "RENAMED", {})
    assert cli.main(["run", "--resume", str(folder), "--quiet", "--no-report"]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "wirelessfl.engine.context.HealthCounter" in err
