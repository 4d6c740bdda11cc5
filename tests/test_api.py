"""The Python API (wirelessfl/api.py, docs/api.md): the same numbers and the same error lines as
the command line, results kept in memory or written as the CLI's run folder, sweeps, tuning
studies and reproductions as tidy tables checked against their run folders read one by one."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

import wirelessfl
from tests.conftest import cli as _cli
from tests.conftest import runs_in_this_process, small_doc, write_yaml
from wirelessfl.cli import main
from wirelessfl.errors import UserError
from wirelessfl.plugins import Registry, registries
from wirelessfl.scenario.loader import load_scenario as cli_load_scenario
from wirelessfl.scenario.loader import resolved_document

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
# Manifest entries that record when a run happened, not what it computed.
WHEN = ("started_at", "finished_at")


@pytest.fixture(scope="module")
def cli_run(small_run):
    """The small scenario run by `wirelessfl run` into a folder: what the API must reproduce
    (tests/conftest.py's small_run, shared with other modules: read only)."""
    folder, path = small_run
    return path, folder


# -- the package's top level ---------------------------------------------------------------

def test_import_wirelessfl_loads_neither_torch_nor_pandas():
    code = ("import sys, wirelessfl; print(sorted(m for m in ('torch', 'pandas', "
            "'wirelessfl.api', 'wirelessfl.engine') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


def test_every_public_name_resolves_and_is_listed():
    names = wirelessfl.__all__
    assert {"load_scenario", "run", "Result", "load_run", "load_sweep", "load_tuning",
            "load_reproduction", "UserError", "Algorithm", "AlgorithmParams",
            "register_algorithm"} <= set(names)
    for name in names:
        assert getattr(wirelessfl, name) is not None
        assert name in dir(wirelessfl)
    from wirelessfl.algorithms.base import Algorithm
    from wirelessfl.errors import UserError

    assert wirelessfl.UserError is UserError and wirelessfl.Algorithm is Algorithm
    with pytest.raises(AttributeError, match="no attribute 'nosuch'"):
        wirelessfl.nosuch  # noqa: B018


def test_a_register_function_for_every_registry_kind_also_one_added_later(monkeypatch):
    from wirelessfl import plugins

    for kind, registry in registries().items():
        singular = kind.removesuffix("s")
        assert getattr(wirelessfl, f"register_{singular}") == registry.register
    monkeypatch.setattr(plugins, "_ALL", list(plugins._ALL))
    widgets = plugins.add_registry(Registry("widgets", {}))
    assert "register_widget" in wirelessfl.__all__ and "register_widget" in dir(wirelessfl)

    class Gadget:
        name = "gadget"

    wirelessfl.register_widget(Gadget)
    assert widgets.get("gadget") is Gadget


def test_a_registered_algorithm_runs_from_the_api(monkeypatch):
    """A subclass of FedAvg under a name of its own, registered from user code: accepted by a
    scenario and computing FedAvg's numbers (the built-in is the truth)."""
    from wirelessfl.algorithms.fedavg import FedAvg
    from wirelessfl.plugins import ALGORITHMS

    class MyFedAvg(FedAvg):
        name = "my-fedavg"

    monkeypatch.setattr(ALGORITHMS, "_registered", dict(ALGORITHMS._registered))
    monkeypatch.setattr(ALGORITHMS, "_loaded", dict(ALGORITHMS._loaded))
    assert wirelessfl.register_algorithm(MyFedAvg) is MyFedAvg
    entry = {"rounds": 4, "eval_every": 2, "local_steps": 3}
    mine = wirelessfl.run(small_doc(algorithms=[{"name": "my-fedavg", **entry}]))
    theirs = wirelessfl.run(small_doc(algorithms=[{"name": "fedavg", **entry}]))
    assert set(mine.rounds.algorithm) == {"my-fedavg"}
    pd.testing.assert_frame_equal(mine.rounds.drop(columns="algorithm"),
                                  theirs.rounds.drop(columns="algorithm"))


# -- loading scenarios ---------------------------------------------------------------------

def test_load_scenario_takes_names_paths_dicts_and_scenarios_with_overrides(tmp_path):
    # the truth: the CLI's loader with the same assignments as --set text
    sets = ["population.num_devices=20", "algorithms.DZOFL.rounds=100", "seed=5",
            "channel.uplink.tx_power_dbm=10"]
    expected = resolved_document(cli_load_scenario("quickstart", sets))
    file = ROOT / "scenarios" / "quickstart.yaml"
    given = [
        wirelessfl.load_scenario("quickstart", sets),
        wirelessfl.load_scenario(file, sets[:2], seed=5, channel__uplink__tx_power_dbm=10),
        wirelessfl.load_scenario(str(file), {"population.num_devices": 20,
                                             "algorithms.DZOFL.rounds": 100, "seed": 5,
                                             "channel.uplink.tx_power_dbm": 10}),
        wirelessfl.load_scenario(wirelessfl.load_scenario("quickstart"), sets),
    ]
    for scenario in given:
        assert resolved_document(scenario) == expected
    # a dict is the YAML document; relative profile names resolve as in a file
    doc = yaml.safe_load(file.read_text())
    assert resolved_document(wirelessfl.load_scenario(doc, sets)) == expected
    assert doc["population"]["num_devices"] == 50  # the caller's dict is left as it was
    del doc["name"]
    assert wirelessfl.load_scenario(doc).name == "scenario"
    # a scenario without overrides comes back as it is
    scenario = wirelessfl.load_scenario("quickstart")
    assert wirelessfl.load_scenario(scenario) is scenario


@pytest.mark.parametrize("command, source, overrides", [
    ("validate", "quickstart", ["population.num_devices=-3"]),
    ("validate", "quickstart", ["algorithms.nosuch.rounds=3"]),
    ("validate", "quickstart", ["algorithms.DZOFL.rounds=many"]),
    ("validate", "quickstart", ["population.num_devices"]),
    ("validate", "quickstart", ["channel=no-such-profile"]),
    ("validate", "no-such-scenario", []),
    ("run", "quickstart-tune", []),  # validate accepts tune and sweep files; run refuses them
    ("run", "sweep-power", []),
])
def test_errors_are_the_cli_error_lines(capsys, command, source, overrides):
    sets = [a for o in overrides for a in ("--set", o)]
    code, _out, err = _cli(capsys, command, source, *sets)
    assert code == 2 and err.startswith("error: ")
    with pytest.raises(wirelessfl.UserError) as caught:
        wirelessfl.load_scenario(source, overrides)
    assert f"error: {caught.value}\n" == err


def test_bad_sources_and_overrides_are_user_errors():
    with pytest.raises(wirelessfl.UserError, match="expected a scenario name, a path, a dict"):
        wirelessfl.load_scenario(42)
    with pytest.raises(wirelessfl.UserError, match="is not 'key.path=value' text"):
        wirelessfl.load_scenario("quickstart", [("seed", 3)])
    with pytest.raises(wirelessfl.UserError, match=r"<dict>: population.num_devices"):
        wirelessfl.load_scenario(small_doc(population={"num_devices": 0}))
    with pytest.raises(wirelessfl.UserError, match="overrides: algorithms.nosuch: no entry"):
        wirelessfl.load_scenario(small_doc(), {"algorithms.nosuch.rounds": 3})
    with pytest.raises(wirelessfl.UserError, match="threads: must be a positive number"):
        wirelessfl.run(small_doc(), threads=0)


# -- running -------------------------------------------------------------------------------

def test_in_memory_run_gives_the_cli_files_numbers_and_writes_nothing(cli_run, tmp_path,
                                                                      monkeypatch):
    path, folder = cli_run
    monkeypatch.chdir(tmp_path)
    result = wirelessfl.run(path)
    assert list(tmp_path.iterdir()) == []  # nothing written, not even runs/
    assert result.path is None and result.status == "complete" and result.seed == 3
    for name, frame in (("rounds", result.rounds), ("devices", result.devices)):
        pd.testing.assert_frame_equal(frame, pd.read_parquet(folder / f"{name}.parquet"))
    # the summary: as `wirelessfl report` computes it from the folder, and as summary.csv holds it
    cli = wirelessfl.load_run(folder)
    pd.testing.assert_frame_equal(result.summary, cli.summary)
    pd.testing.assert_frame_equal(pd.read_csv(io.StringIO(result.summary.to_csv(index=False))),
                                  pd.read_csv(folder / "summary.csv"))
    written = json.loads((folder / "manifest.json").read_text())
    assert {k: v for k, v in result.manifest.items() if k not in WHEN} == \
        {k: v for k, v in written.items() if k not in WHEN}
    assert resolved_document(result.scenario) == resolved_document(cli.scenario)
    assert list(result.summary.algorithm) == ["dzofl", "fedsgd", "fedavg"]


def test_the_run_notes_reach_the_api_and_the_report_not_only_the_terminal(cli_run, tmp_path):
    """The notes the CLI prints (pipeline/notes.py: DZOFL's 16-bit scalar takes the same slots
    at any width) are the manifest's, so a notebook user reads them as ``Result.notes`` and
    report --html shows them."""
    from wirelessfl.report.html import run_html

    path, folder = cli_run
    result = wirelessfl.run(path)
    written = json.loads((folder / "manifest.json").read_text())["notes"]
    assert result.notes == written and len(written) == 1
    assert written[0].startswith("the bit width changes nothing on air for dzofl")
    page = run_html(wirelessfl.load_run(folder), [["a"], ["b"]], [], tmp_path / "r.html")
    assert "<h2>Notes</h2>" in page.read_text() and "changes nothing on air" in page.read_text()


def test_run_into_a_folder_writes_the_cli_folder(cli_run, tmp_path):
    path, folder = cli_run
    result = wirelessfl.run(path, tmp_path / "api", figures=False)
    assert result.path == tmp_path / "api"
    assert {p.name for p in (tmp_path / "api").iterdir()} == {p.name for p in folder.iterdir()}
    for name in ("rounds.parquet", "devices.parquet"):
        pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "api" / name),
                                      pd.read_parquet(folder / name))
    assert (tmp_path / "api" / "summary.csv").read_text() == (folder / "summary.csv").read_text()
    with pytest.raises(wirelessfl.UserError, match="already holds a run"):
        wirelessfl.run(path, tmp_path / "api")


def test_overrides_and_a_scenario_object_run_the_same_numbers(cli_run):
    path, _ = cli_run
    a = wirelessfl.run(path, overrides=["seed=4", "algorithms.dzofl.rounds=10"])
    b = wirelessfl.run(wirelessfl.load_scenario(path, seed=4, algorithms__dzofl__rounds=10))
    pd.testing.assert_frame_equal(a.rounds, b.rounds)
    assert a.seed == 4 and a.rounds[a.rounds.algorithm == "dzofl"]["round"].max() == 10


def test_a_saved_result_is_a_run_folder_that_report_and_load_run_read(cli_run, tmp_path,
                                                                       capsys):
    path, folder = cli_run
    result = wirelessfl.run(path)
    saved = result.save(tmp_path / "saved", figures=False)
    loaded = wirelessfl.load_run(saved)
    assert loaded.path == saved
    for name in ("rounds", "devices", "summary"):
        pd.testing.assert_frame_equal(getattr(loaded, name), getattr(result, name))
    assert loaded.manifest == result.manifest
    assert (saved / "summary.csv").read_text() == (folder / "summary.csv").read_text()
    code, out, err = _cli(capsys, "report", saved)
    assert code == 0, err
    assert "accuracy_vs_energy.png" in out and (saved / "accuracy_vs_energy.png").is_file()
    with pytest.raises(wirelessfl.UserError, match="already holds a run"):
        result.save(saved)


def test_a_result_is_a_run_record_for_every_report_function(cli_run, tmp_path):
    from wirelessfl.report.plots import draw_report
    from wirelessfl.results.compare import compare_records
    from wirelessfl.results.records import RunRecord

    path, folder = cli_run
    result = wirelessfl.run(path)
    assert isinstance(result, RunRecord)
    assert result.target_accuracy == 0.5
    drawn = draw_report(result, tmp_path / "figures")
    assert {p.name for p in drawn} == {p.name for p in draw_report(wirelessfl.load_run(folder),
                                                                   tmp_path / "cli-figures")}
    comparison = compare_records([result])
    assert list(comparison.runs.algorithm) == ["dzofl", "fedsgd", "fedavg"]
    assert "in memory" in repr(result) and "'small'" in repr(result)


def test_figures_are_the_reports_figures_drawn_from_the_result(cli_run, tmp_path):
    from matplotlib.figure import Figure

    from wirelessfl.report.plots import FIGURES, draw_report

    path, folder = cli_run
    result = wirelessfl.run(path)
    figures = result.figures()
    # the same figures as the PNGs `wirelessfl report` writes for the CLI's folder
    written = draw_report(wirelessfl.load_run(folder), tmp_path)
    assert list(figures) == [p.stem for p in written]
    assert set(figures) <= set(FIGURES) == set(result.figure_names())
    assert all(isinstance(f, Figure) and f.axes for f in figures.values())
    # accuracy against energy: one line per algorithm through the rounds' own numbers (a log
    # axis: the round-0 point at zero joules is left out)
    lines = {line.get_label(): line for line in result.figure("accuracy_vs_energy").axes[0]
             .get_lines()}
    for algorithm, group in result.rounds.groupby("algorithm"):
        x = group.sort_values("round")
        np.testing.assert_array_equal(lines[algorithm].get_ydata(), x.test_accuracy)
        np.testing.assert_array_equal(lines[algorithm].get_xdata(),
                                      np.where(x.energy_j > 0, x.energy_j, np.nan))
    assert result.figure("optimization_progress") is None  # no f* on a classifier
    with pytest.raises(wirelessfl.UserError, match="unknown figure 'nosuch'; choose one of: "
                                                   "accuracy_vs_energy"):
        result.figure("nosuch")


# -- sweeps, tuning studies, reproductions as tidy tables ----------------------------------

TINY = small_doc(algorithms=[{"name": "dzofl", "rounds": 20, "eval_every": 10},
                             {"name": "fedsgd", "rounds": 4, "eval_every": 2, "lr": 0.5}])


@pytest.fixture(scope="module")
def tiny_sweep(tmp_path_factory):
    """2 powers x 1 learning rate x 2 seeds on one worker (its runs in this process: what is
    read back does not depend on where they ran, tests/test_sweep.py)."""
    folder = tmp_path_factory.mktemp("sweep")
    write_yaml(folder, TINY, "base.yaml")
    sweep = {"scenario": "base.yaml", "seeds": [0, 1],
             "grid": {"channel.uplink.tx_power_dbm": [0, 23],
                      "algorithms.fedsgd.lr": [0.5]}}
    path = write_yaml(folder, sweep, "study.yaml")
    with runs_in_this_process():
        assert main(["sweep", str(path), "--out", str(folder / "out"), "--workers", "1",
                     "--quiet", "--no-compare"]) == 0
    return folder / "out"


def test_a_sweep_as_one_tidy_table_equals_its_run_folders_read_one_by_one(tiny_sweep):
    tidy = wirelessfl.load_sweep(tiny_sweep)
    keys = ["channel.uplink.tx_power_dbm", "algorithms.fedsgd.lr"]
    assert list(tidy.columns[:5]) == [*keys, "seed", "run", "folder"]
    folders = sorted(p for p in (tiny_sweep / "runs").iterdir())
    assert len(folders) == 4 and tidy.folder.nunique() == 4
    total = 0
    for run_folder in folders:
        rounds = pd.read_parquet(run_folder / "rounds.parquet")
        manifest = json.loads((run_folder / "manifest.json").read_text())
        mine = tidy[tidy.folder == str(run_folder)].reset_index(drop=True)
        total += len(rounds)
        pd.testing.assert_frame_equal(mine[list(rounds.columns)], rounds)
        assert set(mine.seed) == {manifest["seed"]}
        assert set(mine[keys[0]]) == {manifest["scenario"]["channel"]["uplink"]["tx_power_dbm"]}
        fedsgd = next(a for a in manifest["scenario"]["algorithms"] if a["name"] == "fedsgd")
        assert set(mine[keys[1]]) == {fedsgd["lr"]}
        assert set(mine.run) == {run_folder.name}
    assert len(tidy) == total
    # what a reader does with it: the final accuracy per power and algorithm, over seeds
    final = tidy.sort_values("round").groupby(["folder", "algorithm"]).last()
    means = final.groupby([keys[0], "algorithm"]).test_accuracy.mean()
    assert len(means) == 4 and means.notna().all()


def test_load_sweep_refuses_what_is_not_a_sweep(tiny_sweep, tmp_path):
    with pytest.raises(wirelessfl.UserError, match="not a sweep folder"):
        wirelessfl.load_sweep(tmp_path)
    (tmp_path / "sweep.json").write_text("[1, 2")
    with pytest.raises(wirelessfl.UserError, match="cannot read the sweep manifest"):
        wirelessfl.load_sweep(tmp_path)
    for loader, what in ((wirelessfl.load_tuning, "tuning study"),
                         (wirelessfl.load_reproduction, "reproduction")):
        with pytest.raises(wirelessfl.UserError, match=f"not a {what}"):
            loader(tiny_sweep)


@pytest.fixture(scope="module")
def tiny_reproduction(tmp_path_factory):
    """A reproduction of one claim on FedSGD: two learning rates tuned on one seed, the choice
    evaluated on two (its tune folder: a tuning study of 2 + 2 runs, run in this process)."""
    from wirelessfl.tune.reproduce import load_reproduction, run_reproduction

    folder = tmp_path_factory.mktemp("reproduction")
    write_yaml(folder, small_doc(algorithms=[TINY["algorithms"][1]]), "base.yaml")
    write_yaml(folder, {"name": "tiny", "scenario": "base.yaml", "objective": "final_accuracy",
                        "tuning_seeds": [100], "evaluation_seeds": [0, 1],
                        "compare_untuned": False, "search": {"fedsgd": {"lr": [0.1, 0.5]}}},
               "tiny-tune.yaml")
    path = write_yaml(folder, {"title": "tiny", "paper": "none", "tune": "tiny-tune.yaml",
                               "claims": [{"id": "acc", "statement": "s", "metric": "final_accuracy",
                                           "algorithm": "fedsgd", "above": 0.1}]}, "tiny.yaml")
    # the library call behind `wirelessfl reproduce` (the folder it writes, without its HTML)
    with runs_in_this_process():
        run_reproduction(load_reproduction(str(path)), folder / "out", "local", 1, quiet=True)
    return folder / "out"


def test_tuning_and_reproduction_folders_as_tidy_tables(tiny_reproduction):
    tidy = wirelessfl.load_reproduction(tiny_reproduction)
    pd.testing.assert_frame_equal(tidy, wirelessfl.load_tuning(tiny_reproduction / "tune"))
    assert tidy.columns[0] == "phase"
    for phase, runs in (("tuning", 2), ("evaluation", 2)):
        mine = tidy[tidy.phase == phase]
        entries = json.loads((tiny_reproduction / "tune" / phase / "sweep.json").read_text())
        assert mine.folder.nunique() == runs == len(entries["runs"])
        for entry in entries["runs"]:
            run_folder = tiny_reproduction / "tune" / phase / entry["folder"]
            rounds = pd.read_parquet(run_folder / "rounds.parquet")
            rows = mine[mine.folder == str(run_folder)].reset_index(drop=True)
            pd.testing.assert_frame_equal(rows[list(rounds.columns)], rounds)
            assert set(rows.seed) == {entry["seed"]}
            # the swept 'algorithm' key is the run's one algorithm, the rounds' own column
            assert set(rows.algorithm) == {entry["algorithm"]}
    tuned = tidy[tidy.phase == "tuning"]
    assert set(tuned.seed) == {100} and set(tuned.lr) == {0.1, 0.5}
    assert set(tidy[tidy.phase == "evaluation"].seed) == {0, 1}


# -- the example ---------------------------------------------------------------------------

# Short settings for the example: a few rounds on 8 devices.
SHORT = ["population.num_devices=8", "algorithms.DZOFL.rounds=100",
         "algorithms.DZOFL.eval_every=50", "algorithms.FedSGD.rounds=6",
         "algorithms.FedAvg.rounds=4"]


@pytest.mark.slow
def test_the_quickstart_example_runs(tmp_path):
    """The script as a user runs it (it starts `python -m wirelessfl sweep` itself): slow."""
    png = tmp_path / "figures" / "accuracy_vs_energy.png"
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "quickstart_api.py"),
                           str(png), *SHORT], check=False, env=ENV, cwd=tmp_path,
                          capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = proc.stdout.split("wrote")[0]
    assert all(label in summary for label in ("DZOFL", "FedSGD", "FedAvg"))
    tidy = wirelessfl.load_sweep(png.parent / "quickstart-power-sweep" / "out")
    assert tidy.folder.nunique() == 4 and set(tidy.seed) == {0, 1}
    assert set(tidy["channel.uplink.tx_power_dbm"]) == {0, 23}
    # the run took the short settings; the printed table has one row per power and algorithm
    assert tidy[tidy.algorithm == "DZOFL"]["round"].max() == 100
    table = proc.stdout.split("seeds")[-1].strip().splitlines()
    assert len(table) == 1 + 2 * 3 and all(line.split()[-1] == "2" for line in table[1:])


@pytest.mark.parametrize("loader, folder", [("load_tuning", "quickstart-tune"),
                                            ("load_reproduction", "seed002-quick")])
def test_a_recorded_summary_is_refused_naming_what_it_holds(loader, folder):
    """docs/data ships studies' tables without their runs: the loaders say so (they returned
    an empty table, or blamed a missing tune/ folder's manifest) instead of guessing."""
    path = Path(__file__).resolve().parents[1] / "docs" / "data" / folder
    with pytest.raises(UserError, match=r"holds only the .*tables \(.*tuning\.csv\), not its "
                                        r"runs"):
        getattr(wirelessfl, loader)(path)


@pytest.mark.parametrize("call, where", [
    (lambda: wirelessfl.run("quickstart", out=""), "out"),
    (lambda: wirelessfl.run("quickstart", out=123), "out"),
    (lambda: wirelessfl.run("quickstart", out=b"runs/x"), "out"),
    (lambda: wirelessfl.run("quickstart", out="a\0b"), "out"),
    (lambda: wirelessfl.run("quickstart", progress="yes"), "progress"),
    (lambda: wirelessfl.run("quickstart", figures=1), "figures"),
    (lambda: wirelessfl.run("quickstart", threads=True), "threads"),
    (lambda: wirelessfl.load_run(None), "load_run"),
    (lambda: wirelessfl.load_run(""), "load_run"),
    (lambda: wirelessfl.load_sweep(1.5), "load_sweep"),
    (lambda: wirelessfl.load_tuning(None), "load_tuning"),
    (lambda: wirelessfl.load_reproduction(3), "load_reproduction"),
])
def test_a_bad_folder_or_flag_argument_is_one_user_error(call, where, tmp_path, monkeypatch):
    """pathlib's TypeError/ValueError never reaches the caller, and an empty path is not the
    current folder (run(out="") wrote a run into it): nothing is written anywhere."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match=rf"^{where}: "):
        call()
    assert list(tmp_path.iterdir()) == []
