"""Generated scenario input (tests/scenario_fuzz.py) ends in a valid scenario or one clean
error naming the file, never a traceback; unsafe YAML tags are never executed. The full run of
10,000 documents is ``benchmarks/fuzz_scenarios.py``; a sample runs here."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from tests.scenario_fuzz import TEMPLATES, UNSAFE_MARKER, classify, documents, yaml_bytes
from wirelessfl.cli import main
from wirelessfl.errors import UserError
from wirelessfl.scenario.loader import MAX_DEPTH, scenario_from_document

SAMPLE = settings(max_examples=150, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))


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
