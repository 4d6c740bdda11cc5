"""Generated input (tests/scenario_fuzz.py) ends in success or one clean error, never a
traceback, a hang or a write outside the output: scenario documents and files, sweep and tune
files, --set values, damaged run folders under report, compare and run --resume; unsafe YAML tags
are never executed. The full run of 10,000 inputs is ``benchmarks/fuzz_scenarios.py``; a sample
of 340 runs here."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.scenario_fuzz import (
    TEMPLATES,
    UNSAFE_MARKER,
    classify,
    cli_outcome,
    damaged_run_outcome,
    documents,
    make_run_folders,
    set_assignments,
    sweep_bytes,
    tune_bytes,
    write_scenario_beside,
    yaml_bytes,
)
from wirelessfl.cli import main
from wirelessfl.errors import UserError
from wirelessfl.scenario.loader import MAX_DEPTH, scenario_from_document


def _sample(n: int):
    """``n`` generated examples, not shrunk (a failure prints the example as drawn)."""
    return settings(max_examples=n, deadline=None, database=None, phases=[Phase.generate],
                    suppress_health_check=list(HealthCheck))


SAMPLE = _sample(100)


@SAMPLE
@given(documents())
def test_mutated_documents_are_valid_or_rejected_cleanly(doc):
    assert classify(doc)[0] in ("valid", "rejected")


@SAMPLE
@given(yaml_bytes())
def test_raw_files_are_valid_or_rejected_cleanly(tmp_path_factory, data):
    assert classify(data, tmp_path_factory.mktemp("fuzz"))[0] in ("valid", "rejected")


@pytest.mark.parametrize("template", [t for t in TEMPLATES if "python/" in t])
def test_unsafe_python_tags_are_refused_and_never_run(tmp_path, monkeypatch, capsys, template):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "evil.yaml"
    path.write_text(template)
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}") and "invalid YAML" in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / UNSAFE_MARKER).exists()


def test_deep_nesting_and_self_referencing_aliases_name_the_problem(tmp_path):
    deep: object = 1
    for _ in range(MAX_DEPTH + 5):
        deep = {"k": deep}
    with pytest.raises(UserError, match=r"x\.yaml: model\.k\.k\.k\.\.\.: nested more than 32"):
        scenario_from_document({"model": deep}, "x.yaml")
    path = tmp_path / "loop.yaml"
    path.write_text("name: a\nalgorithms: &a [*a]\n")
    assert main(["validate", str(path)]) == 2


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A folder holding the base scenario that generated sweep and tune files name."""
    folder = tmp_path_factory.mktemp("fuzz-files")
    write_scenario_beside(folder)
    return folder


def _validate(folder: Path, data: bytes, name: str) -> str:
    path = folder / name
    path.write_bytes(data)
    return cli_outcome(["validate", str(path)], timeout_s=60, names=str(path))


@_sample(50)
@given(sweep_bytes())
def test_sweep_files_are_valid_or_rejected_cleanly(files, data):
    assert _validate(files, data, "sweep.yaml") in ("valid", "rejected")
    assert not (files / UNSAFE_MARKER).exists() and not Path(UNSAFE_MARKER).exists()


@_sample(20)
@given(tune_bytes())
def test_tune_files_are_valid_or_rejected_cleanly(files, data):
    assert _validate(files, data, "tune.yaml") in ("valid", "rejected")


@_sample(60)
@given(set_assignments())
def test_set_values_are_valid_or_rejected_cleanly(files, sets):
    argv = ["validate", str(files / "small.yaml"), *(f"--set={s}" for s in sets)]
    assert cli_outcome(argv, timeout_s=60) in ("valid", "rejected")
    assert not Path(UNSAFE_MARKER).exists()


@pytest.fixture(scope="module")
def run_bases(tmp_path_factory):
    """Real tiny run folders (finished; SIGKILLed after a checkpoint) and the victim file."""
    session = tmp_path_factory.mktemp("fuzz-session")
    return session, make_run_folders(session)


@pytest.mark.slow  # its base folders come from runs in fresh interpreters, one SIGKILLed
@_sample(10)
@given(st.data())
def test_damaged_run_folders_are_reported_or_refused_cleanly(run_bases, tmp_path_factory, data):
    session, bases = run_bases
    assert "killed" in bases  # the interrupted base exists, so resume-from-checkpoint is tried
    work, log = tmp_path_factory.mktemp("damaged"), []
    try:
        outcome = damaged_run_outcome(data, bases, work, session, log)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    assert outcome in ("valid", "rejected"), log
