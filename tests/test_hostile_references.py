"""A data file must not choose code to run (issue 34): a name written as ``module:attribute`` (a
reference) in a scenario, a sweep, tune or reproduction file or a run folder's manifest is
refused unless references were allowed (``--allow-references``, WIRELESSFL_ALLOW_REFERENCES=1,
``wirelessfl.allow_references()``), before anything is imported.

Every hostile case names a module the test writes beside the files, which on import writes a
marker file and prints a line; each must exit with code 2 and one ``error:`` line, with no
marker, no line printed, the module not in ``sys.modules`` (in-process cases) and nothing
written under the test's folder (no output folder either). The opt-in paths then import it:
the flag, the variable, the Python function (also as a context manager), and a sweep worker
that follows its task rather than its own environment. Registered parts and entry points need
no opt-in."""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from tests.hostile import RUNNERS, assert_refused, assert_untouched, run_cli, runner_cases, snapshot
from wirelessfl.errors import UserError
from wirelessfl.plugins import ALLOW_REFERENCES_ENV, MODELS, references_allowed

MODULE = "markermod"
REFERENCE = f"{MODULE}:model"
MARKER = "IMPORTED"
PRINTED = "MARKER MODULE RAN"
# Imported, it leaves a file beside itself and prints; its ``model`` is a valid model plugin,
# so that where references are allowed the scenario is valid.
MARKER_SOURCE = f'''
import pathlib

pathlib.Path(__file__).with_name("{MARKER}").write_text("imported")
print("{PRINTED}")


def model(input_shape, num_classes):
    import math

    from torch import nn

    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), num_classes))
'''
REFUSED = "is a module:attribute reference, which would import and run that module's code"
# The opt-in off, whatever the environment of the test run says.
REFUSING = {ALLOW_REFERENCES_ENV: "0"}

BASE = {"channel": "seed002-cell", "energy": "seed002-accelerator",
        "population": {"num_devices": 5}, "data": {"name": "digits", "max_train_samples": 200},
        "model": {"name": "mlp", "hidden": [8]},
        "algorithms": [{"name": "fedavg", "rounds": 1, "eval_every": 1}]}

# case -> (the scenario's changed keys, the key path the error names)
SCENARIOS = {
    "model": ({"model": {"name": REFERENCE}}, "model.name"),
    "algorithm": ({"algorithms": [{"name": REFERENCE, "rounds": 1}]}, "algorithms[0].name"),
    "problem": ({"problem": {"name": REFERENCE}}, "problem.name"),
    "fading": ({"channel": {"profile": "seed002-cell", "fading": {"model": REFERENCE}}},
               "channel.fading.model"),
    "compute": ({"energy": {"model": REFERENCE}}, "energy.model"),
    "dataset": ({"data": {"name": REFERENCE}}, "data.name"),
    "device-class": ({"population": {"num_devices": 5, "classes": {"slow": {
        "fraction": 1.0, "profile": "seed002-accelerator", "model": REFERENCE}}}},
        "population.classes.slow.energy.model"),
}


def write(folder: Path, name: str, doc: dict) -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.fixture
def folder(tmp_path) -> Path:
    """The test's folder, holding the marker module (the current folder of every command, which
    is where a reference would be imported from)."""
    (tmp_path / f"{MODULE}.py").write_text(MARKER_SOURCE)
    return tmp_path


# Each refusal runs through cli.main in this process (the module must then be absent from
# sys.modules); a few also in a fresh interpreter, as a user runs them (slow).
BOTH = [pytest.param("in-process"), pytest.param("subprocess", marks=pytest.mark.slow)]


def assert_not_imported(folder: Path, *procs) -> None:
    assert MODULE not in sys.modules
    assert not (folder / MARKER).exists(), "the referenced module was imported"
    assert not (folder / "__pycache__").exists()
    for proc in procs:
        assert PRINTED not in proc.stdout + proc.stderr


@pytest.mark.parametrize("case, runner", runner_cases(list(SCENARIOS), ("model", "algorithm")))
def test_a_reference_in_a_scenario_is_refused_by_validate_and_run(folder, case, runner):
    changes, key = SCENARIOS[case]
    path = write(folder, f"{case}.yaml", {**BASE, **changes})
    out = folder / "out"
    before = snapshot(folder)
    procs = [RUNNERS[runner]("validate", path, cwd=folder, env=REFUSING),
             RUNNERS[runner]("run", path, "--out", out, "--quiet", cwd=folder, env=REFUSING)]
    for proc in procs:
        line = assert_refused(proc, f"{path.name}: {key}: '{REFERENCE}' {REFUSED}",
                              "--allow-references", ALLOW_REFERENCES_ENV, "docs/plugins.md")
        assert line.count(REFERENCE) == 1  # said once: no "(got ...)" repeating it
    assert_not_imported(folder, *procs)
    assert_untouched(folder, before)
    assert not out.exists()


def _validate_and_run_refused(folder: Path, path: Path, command: str, runner, *fragments):
    """``validate`` and ``command`` (sweep, tune) on the study file ``path`` are each refused
    with ``fragments``; nothing imported, nothing written, no output folder."""
    out = folder / "out"
    before = snapshot(folder)
    procs = [runner("validate", path, cwd=folder, env=REFUSING),
             runner(command, path, "--out", out, "--quiet", "--workers", "1", cwd=folder,
                    env=REFUSING)]
    for proc in procs:
        assert_refused(proc, *fragments)
    assert_not_imported(folder, *procs)
    assert_untouched(folder, before)
    assert not out.exists()


@pytest.mark.parametrize("runner", BOTH)
def test_a_reference_in_a_sweep_file_is_refused(folder, runner):
    write(folder, "base.yaml", BASE)
    path = write(folder, "sweep.yaml", {"scenario": "base.yaml", "seeds": [0],
                                        "grid": {"model.name": ["mlp", REFERENCE]}})
    _validate_and_run_refused(folder, path, "sweep", RUNNERS[runner],
                              "sweep.yaml: grid.model.name", f"model.name: '{REFERENCE}' {REFUSED}")


def _tune_file(folder: Path) -> Path:
    write(folder, "base.yaml", {**BASE, "target_accuracy": 0.5})
    return write(folder, "tune.yaml", {
        "scenario": "base.yaml", "set": {"model.name": REFERENCE}, "objective": "final_accuracy",
        "tuning_seeds": [0], "evaluation_seeds": [1, 2],
        "search": {"fedavg": {"lr": [0.1, 0.2]}}})


def test_a_reference_in_a_tune_file_is_refused(folder):
    path = _tune_file(folder)
    _validate_and_run_refused(folder, path, "tune", RUNNERS["in-process"], "tune.yaml: set",
                              f"model.name: '{REFERENCE}' {REFUSED}")


def test_a_reference_in_a_reproduction_is_refused(folder):
    _tune_file(folder)
    path = write(folder, "repro.yaml", {
        "title": "t", "paper": "p", "tune": "tune.yaml",
        "claims": [{"id": "c", "statement": "s", "metric": "final_accuracy",
                    "algorithm": "fedavg", "above": 0.1}]})
    out = folder / "out"
    before = snapshot(folder)
    proc = RUNNERS["in-process"]("reproduce", path, "--out", out, "--quiet", "--workers", "1",
                                 cwd=folder, env=REFUSING)
    assert_refused(proc, f"model.name: '{REFERENCE}' {REFUSED}")
    assert_not_imported(folder, proc)
    assert_untouched(folder, before)
    assert not out.exists()


@pytest.fixture
def run_folder(folder) -> Path:
    """A finished run of the base scenario (built-in parts only), to resume."""
    import wirelessfl

    out = folder / "run"
    wirelessfl.run(BASE, out, figures=False)
    return out


def _edit_manifest(folder: Path, fingerprint: str) -> None:
    """The manifest's model named by reference; its fingerprint kept (``kept``), dropped, or
    recomputed for the edited scenario (``forged``: anyone can; it is not a signature)."""
    from wirelessfl.pipeline.fingerprint import MANIFEST_KEY, canonical_sha256

    path = folder / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["scenario"]["model"] = {"name": REFERENCE}
    if fingerprint == "dropped":
        del manifest[MANIFEST_KEY]
    elif fingerprint == "forged":
        manifest[MANIFEST_KEY] = canonical_sha256({"scenario": manifest["scenario"],
                                                   "seed": manifest["scenario"]["seed"]})
    path.write_text(json.dumps(manifest, indent=2))


@pytest.mark.parametrize("runner", BOTH)
def test_a_reference_edited_into_a_manifest_is_refused_by_its_fingerprint_first(
        folder, run_folder, runner):
    """Checked before any name is resolved: refused even with references allowed."""
    _edit_manifest(run_folder, "kept")
    before = snapshot(folder)
    proc = RUNNERS[runner]("run", "--resume", run_folder, "--quiet", "--allow-references",
                           cwd=folder)
    assert_refused(proc, "manifest.json: its scenario no longer matches the fingerprint")
    assert_not_imported(folder, proc)
    assert_untouched(folder, before)


@pytest.mark.parametrize("fingerprint", ["dropped", "forged"])
def test_a_reference_in_a_manifest_without_a_true_fingerprint_is_refused(folder, run_folder,
                                                                         fingerprint):
    _edit_manifest(run_folder, fingerprint)
    before = snapshot(folder)
    proc = RUNNERS["in-process"]("run", "--resume", run_folder, "--quiet", cwd=folder,
                                 env=REFUSING)
    assert_refused(proc, f"manifest.json: model.name: '{REFERENCE}' {REFUSED}")
    assert_not_imported(folder, proc)
    assert_untouched(folder, before)


# ---- the opt-in ---------------------------------------------------------------------------------
@pytest.mark.slow  # imports the module: in a fresh interpreter
@pytest.mark.parametrize("how", ["flag", "variable"])
def test_the_flag_or_the_variable_allows_references(folder, how):
    path = write(folder, "s.yaml", {**BASE, "model": {"name": REFERENCE}})
    if how == "flag":
        proc = run_cli("validate", path, "--allow-references", cwd=folder, env=REFUSING)
    else:
        proc = run_cli("validate", path, cwd=folder, env={ALLOW_REFERENCES_ENV: "1"})
    assert proc.returncode == 0 and "s.yaml: valid" in proc.stdout, proc.stderr
    assert (folder / MARKER).exists() and PRINTED in proc.stdout


def test_a_variable_that_says_neither_yes_nor_no_is_one_error_line(folder):
    path = write(folder, "s.yaml", {**BASE, "model": {"name": REFERENCE}})
    proc = RUNNERS["in-process"]("validate", path, cwd=folder,
                                 env={ALLOW_REFERENCES_ENV: "maybe"})
    assert_refused(proc, f"{ALLOW_REFERENCES_ENV}='maybe': expected 1")
    assert_not_imported(folder, proc)


@pytest.mark.slow  # worker processes
def test_a_sweep_worker_follows_the_command_not_its_environment(folder):
    """--allow-references in the sweep command, 0 in the environment every worker inherits: the
    workers resolve the reference (the task carries the opt-in)."""
    write(folder, "base.yaml", {**BASE, "model": {"name": REFERENCE}})
    path = write(folder, "sweep.yaml", {"scenario": "base.yaml", "seeds": [0],
                                        "grid": {"quantization_bits": [16]}})
    proc = run_cli("sweep", path, "--out", folder / "out", "--quiet", "--workers", "1",
                   "--no-compare", "--allow-references", cwd=folder, env=REFUSING)
    assert proc.returncode == 0, proc.stderr
    runs = json.loads((folder / "out" / "sweep.json").read_text())["runs"]
    assert [r["status"] for r in runs] == ["complete"], runs


@pytest.fixture
def module_name(tmp_path, monkeypatch):
    """A marker module under a name of its own (this process's sys.modules is shared), in the
    current folder; forgotten afterwards."""
    name = f"markermod_{uuid.uuid4().hex[:12]}"
    (tmp_path / f"{name}.py").write_text(MARKER_SOURCE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(ALLOW_REFERENCES_ENV, "0")
    yield name
    sys.modules.pop(name, None)
    MODELS._loaded.pop(f"{name}:model", None)
    if str(tmp_path) in sys.path:
        sys.path.remove(str(tmp_path))


def test_the_python_api_refuses_then_allows_by_function(module_name, tmp_path):
    import wirelessfl

    doc = {**BASE, "model": {"name": f"{module_name}:model"}}
    with pytest.raises(UserError, match=rf"<dict>: model\.name: '{module_name}:model' {REFUSED}"):
        wirelessfl.load_scenario(doc)
    assert module_name not in sys.modules and not (tmp_path / MARKER).exists()
    with wirelessfl.allow_references():
        assert references_allowed()
        assert wirelessfl.load_scenario(doc).model.name == f"{module_name}:model"
    assert module_name in sys.modules and (tmp_path / MARKER).exists()
    # back to the environment's word: refused again, though resolved (and cached) before
    assert not references_allowed()
    with pytest.raises(UserError, match=REFUSED):
        wirelessfl.load_scenario(doc)
    setting = wirelessfl.allow_references()  # a plain call: from now on, in this process
    try:
        assert wirelessfl.load_scenario(doc).model.name == f"{module_name}:model"
    finally:
        setting.__exit__(None, None, None)
    assert not references_allowed()


def test_a_worker_refuses_what_its_task_does_not_allow_whatever_its_environment(module_name,
                                                                                monkeypatch,
                                                                                tmp_path):
    from wirelessfl.sweep.worker import run_point

    monkeypatch.setenv(ALLOW_REFERENCES_ENV, "1")
    result = run_point({"run_id": "r", "scenario": {**BASE, "model": {
        "name": f"{module_name}:model"}}, "source": "sweep.yaml [r]", "sweep": {},
        "plugins": {"modules": [], "path": [], "references": False}})
    assert result["status"] == "failed" and REFUSED in result["message"], result
    assert module_name not in sys.modules and not (tmp_path / MARKER).exists()
    assert references_allowed()  # the task's word held for the task only


def test_registered_parts_and_entry_points_need_no_opt_in(tmp_path, monkeypatch):
    """The user chose that code by registering or installing it, not a file."""
    import wirelessfl
    from wirelessfl.plugins import registries

    monkeypatch.setenv(ALLOW_REFERENCES_ENV, "0")
    site = tmp_path / "site"
    (site / "eppkg").mkdir(parents=True)
    (site / "eppkg" / "__init__.py").write_text(MARKER_SOURCE)
    info = site / "eppkg-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: eppkg\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[wirelessfl.models]\nep-linear = eppkg:model\n")
    monkeypatch.syspath_prepend(str(site))
    for registry in registries().values():
        registry.rescan()
    try:
        assert wirelessfl.load_scenario({**BASE, "model": {"name": "ep-linear"}})
        assert (site / "eppkg" / MARKER).exists()
        wirelessfl.register_model(sys.modules["eppkg"].model, "registered-linear")
        assert wirelessfl.load_scenario({**BASE, "model": {"name": "registered-linear"}})
    finally:
        MODELS.unregister("registered-linear")
        sys.modules.pop("eppkg", None)
        sys.path.remove(str(site))
        for registry in registries().values():
            registry.rescan()
