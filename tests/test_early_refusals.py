"""Issue 34: what would exhaust the machine or fail late is refused early, in one line. Every
refusal here is exit code 2 and exactly one ``error:`` line naming the file or flag and the fix,
no traceback, and nothing written: a sweep grid of 10^8 points (counted, never built), a tune
study whose runs ``validate`` refuses, a reproduction file given to ``validate`` (recognised,
not misread as a scenario), ``crossover``'s ranges, points and damaged manifests, ``compare
--html`` with several folders, and a ``partition.rare_classes`` (or a stratified split) that the
data set cannot hold."""

from __future__ import annotations

import importlib
import json
import shutil
import time
import tracemalloc

import pytest
import yaml

from tests.conftest import cli
from tests.test_crossover import _run
from wirelessfl.errors import UserError
from wirelessfl.pipeline.memory import check_memory_from_scenario
from wirelessfl.pipeline.preflight import check_runnable
from wirelessfl.scenario.loader import load_scenario
from wirelessfl.sweep.spec import MAX_RUNS
from wirelessfl.tune.crossover import MAX_POINTS, _setting

# eight swept keys of the quickstart scenario, ten values each: 10^8 points
HUGE_KEYS = ["channel.uplink.tx_power_dbm", "population.num_devices", "quantization_bits",
             "target_accuracy", "channel.uplink.bandwidth_hz", "energy.throughput_macs_per_s",
             "algorithms.FedSGD.lr", "algorithms.FedAvg.lr"]


def _one_error(code: int, out: str, err: str, *fragments: str) -> None:
    assert code == 2, (code, err)
    assert out == "" and err.count("\n") == 1 and err.startswith("error: "), err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in err, err


def _write(tmp_path, name: str, doc: dict):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


# ---- 1. a sweep grid's size is counted before any point is built -------------------------------
@pytest.mark.parametrize("command", ["validate", "sweep"])
def test_a_grid_of_a_hundred_million_points_is_refused_at_once_in_little_memory(
        tmp_path, capsys, command):
    """Before: `validate` on such a file (98 KB) grew to 22.5 GB and was killed. Now the product
    of the lists' lengths is refused before the base scenario is even read."""
    grid = {key: [v + 1 for v in range(10)] for key in HUGE_KEYS}
    path = _write(tmp_path, "huge.yaml", {"scenario": "quickstart", "grid": grid,
                                          "seeds": [0, 1, 2]})
    out = tmp_path / "out"
    extra = ["--out", out, "--quiet"] if command == "sweep" else []
    for module in ("wirelessfl.pipeline.preflight", "wirelessfl.sweep.study"):
        importlib.import_module(module)  # what the commands import first: not counted below
    tracemalloc.start()
    start = time.perf_counter()
    try:
        code, stdout, err = cli(capsys, command, path, *extra)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    elapsed = time.perf_counter() - start
    _one_error(code, stdout, err, f"{path}: grid: 10 x 10 x 10 x 10 x 10 x 10 x 10 x 10 values",
               "100,000,000 points x 3 seeds = 300,000,000 runs",
               f"more than the {MAX_RUNS:,} a study file may hold", "use fewer values per key")
    assert peak < 20 * 2**20, f"{peak / 2**20:.1f} MiB"  # measured: about 1 MiB
    assert elapsed < 10, elapsed  # measured: well under a second
    assert not out.exists()


def test_listed_points_times_seeds_are_capped_too(tmp_path, capsys):
    points = [{"channel.uplink.tx_power_dbm": float(i)} for i in range(101)]
    path = _write(tmp_path, "many.yaml", {"scenario": "quickstart", "points": points,
                                          "seeds": list(range(200))})
    _one_error(*cli(capsys, "validate", path), "points: 101 points x 200 seeds = 20,200 runs",
               "list fewer points or seeds")


def test_a_tune_grid_is_counted_before_it_is_built(tmp_path, capsys):
    """Five ranges of 1,000 values each are 10^15 configurations: the count is refused without
    building them (before, the list of configurations was built first, then counted)."""
    search = {"FedSGD": {p: {"log": [0.01, 1.0], "num": 1000}
                         for p in ("lr", "batch_size", "rounds", "eval_every", "bits")}}
    path = _write(tmp_path, "huge-tune.yaml", {
        "scenario": "quickstart", "objective": "energy_to_target", "tuning_seeds": [1],
        "evaluation_seeds": [2, 3], "search": search})
    start = time.perf_counter()
    _one_error(*cli(capsys, "tune", path, "--out", tmp_path / "out"),
               f"{path}: search.FedSGD: 898 x 898 x 898 x 898 x 898 values",
               f"more than the {MAX_RUNS:,}", "use fewer values (num) per parameter")
    assert time.perf_counter() - start < 10
    assert not (tmp_path / "out").exists()


# ---- 2. tune and reproduce check every run before the first starts ----------------------------
BASE = {"name": "msa-on-digits", "seed": 0, "channel": "seed002-cell",
        "energy": "seed002-accelerator", "population": {"num_devices": 4},
        "data": {"name": "digits"}, "model": {"name": "logistic"}, "quantization_bits": 16,
        "target_accuracy": 0.5,
        "algorithms": [{"name": "fedsgd", "label": "FedSGD", "rounds": 2, "eval_every": 1,
                        "lr": 0.5},
                       {"name": "fedmsa", "label": "FedMSA", "rounds": 2, "eval_every": 1,
                        "local_steps": 2}]}
TUNE = {"scenario": "base.yaml", "objective": "final_accuracy", "tuning_seeds": [1],
        "evaluation_seeds": [2, 3], "search": {"FedSGD": {"lr": [0.1, 0.5]}}}


@pytest.mark.parametrize("command", ["validate", "tune"])
def test_a_study_with_a_refused_run_is_refused_before_any_run(tmp_path, capsys, command):
    """FedMSA on a classifier: before, `tune` ran the whole study (every FedMSA run failed and
    was ranked unhealthy), then exit 1; `validate` refused it. Now both refuse it, the same
    line, before anything is written."""
    _write(tmp_path, "base.yaml", BASE)
    path = _write(tmp_path, "tune.yaml", TUNE)
    out = tmp_path / "out"
    extra = ["--out", out, "--workers", "1", "--quiet"] if command == "tune" else []
    _one_error(*cli(capsys, command, path, *extra),
               f"{path}: evaluation of FedMSA (untuned): ", "fedmsa needs a multi-sequence "
               "problem")
    assert not out.exists()


def test_a_study_whose_runs_do_not_fit_is_refused_before_any_run(tmp_path, capsys):
    """The memory estimate of every distinct scenario, as `run` makes it, before the first run:
    the configuration that would not fit is named, and so is its cause (the rounds)."""
    _write(tmp_path, "base.yaml", {**BASE, "algorithms": BASE["algorithms"][:1]})
    path = _write(tmp_path, "tune.yaml", {
        **TUNE, "search": {"FedSGD": {"rounds": [2, 1_000_000_000_000]}}})
    out = tmp_path / "out"
    _one_error(*cli(capsys, "tune", path, "--out", out, "--workers", "1", "--quiet"),
               f"{path}: search {{'algorithm': 'FedSGD', 'rounds': 1000000000000}}: "
               "msa-on-digits: this run needs about", "use fewer rounds or a larger eval_every "
               "for 'FedSGD'")
    assert not out.exists()


# ---- 3. validate recognises every study file by its shape ---------------------------------------
def _reproduction(tmp_path, tune: dict) -> object:
    _write(tmp_path, "base.yaml", {**BASE, "algorithms": BASE["algorithms"][:1]})
    _write(tmp_path, "tune.yaml", tune)
    return _write(tmp_path, "repro.yaml", {
        "title": "t", "paper": "p", "tune": "tune.yaml",
        "claims": [{"id": "c", "statement": "s", "where": "w", "metric": "final_accuracy",
                    "algorithm": "FedSGD", "above": 0.1}]})


def test_validate_checks_a_reproduction_file_as_one(tmp_path, capsys):
    """Before: 'channel: required key is missing' (read as a scenario)."""
    path = _reproduction(tmp_path, TUNE)
    code, out, err = cli(capsys, "validate", path)
    assert code == 0, err
    assert out.startswith(f"{path}: valid reproduction (1 claims) with tune file tune.yaml over "
                          "'base.yaml' (objective final_accuracy; 2 tuning runs"), out


def test_validate_runs_a_reproductions_pre_run_checks(tmp_path, capsys):
    path = _reproduction(tmp_path, {**TUNE, "set": {"data.classes": [0, 12]}})
    _one_error(*cli(capsys, "validate", path), "tune.yaml: search {'algorithm': 'FedSGD', 'lr': "
               "0.1}: data.classes lists label(s) [12] that dataset 'digits' does not have")


def test_a_shipped_reproduction_validates_by_name(capsys):
    code, out, err = cli(capsys, "validate", "seed002-quick")
    assert code == 0, err
    assert out.startswith("seed002-quick: valid reproduction (8 claims) with tune file "
                          "seed002-tune.yaml over 'seed002-digits28'"), out


def test_the_fashionmnist_reproduction_without_its_data_names_the_package(capsys, monkeypatch):
    """seed002 reads FashionMNIST where Debian's package puts it; on a machine without it,
    validate (and reproduce) refuse in one line naming the package and data.root."""
    from wirelessfl.learning import datasets

    monkeypatch.setitem(datasets.DISTRIBUTION_ROOTS, "fashionmnist",
                        ("/nonexistent/fashion-mnist", "dataset-fashion-mnist"))
    code, _, err = cli(capsys, "validate", "seed002")
    assert code == 2 and err.count("\n") == 1, err
    assert "apt-get install dataset-fashion-mnist" in err and "data.root" in err


@pytest.mark.parametrize("command, given, kind, reader", [
    ("run", "reproductions/seed002.yaml", "a reproduction file", "reproduce"),
    ("tune", "reproductions/seed002.yaml", "a reproduction file", "reproduce"),
    ("sweep", "quickstart-tune", "a tune file", "tune"),
    ("reproduce", "scenarios/sweep-power.yaml", "a sweep file", "sweep"),
    ("sweep", "quickstart", "a scenario", "run"),
    ("tune", "quickstart", "a scenario", "run"),
])
def test_a_file_given_to_the_wrong_command_names_the_right_one(capsys, tmp_path, command, given,
                                                                kind, reader):
    _one_error(*cli(capsys, command, given, "--out", tmp_path / "out"), f"this is {kind}",
               f"run it with 'wirelessfl {reader} {given}'")
    assert not (tmp_path / "out").exists()


def test_set_on_a_reproduction_file_says_where_overrides_go(capsys):
    _one_error(*cli(capsys, "validate", "seed002", "--set", "seed=1"),
               "--set: seed002 is a reproduction file; put overrides in its tune file's 'set'")


# ---- 4. crossover: ranges, points and manifests checked before anything is written ------------
@pytest.mark.parametrize("args, fragment", [
    (["--throughput", "1e-300", "1e300"], ("--throughput 1e-300 1e+300 spans 600 decades, "
                                           "more than the 16")),
    (["--rate", "1", "1e30"], "--rate 1 1e+30 spans 30 decades"),
    (["--throughput", "nan", "1"], "--throughput needs 0 < LO < HI, both finite"),
    (["--rate", "5", "inf"], "--rate needs 0 < LO < HI, both finite"),
    (["--rate", "-1", "5"], "--rate needs 0 < LO < HI"),
    (["--points", "3000"], (f"--points 3,000: at most {MAX_POINTS} per axis (3,000 x 3,000 = "
                            "9,000,000 cells would take about 2.7 GiB")),
    (["--points", "1"], "--points must be at least 2"),
])
def test_crossover_arguments_are_checked_before_the_study_is_read(capsys, tmp_path, args,
                                                                  fragment):
    """Before: an OverflowError traceback from matplotlib's log ticker after the CSVs were
    written (1e-300 to 1e300), and 165 s and 2.9 GB for 3,000 points. The folder does not even
    exist: the arguments are refused first."""
    _one_error(*cli(capsys, "crossover", tmp_path / "no-study", "--out", tmp_path / "o", *args),
               fragment)
    assert not (tmp_path / "o").exists()


def _manifest() -> dict:
    return {"scenario": {
        "energy": {"model": "seed002-accelerator", "throughput_macs_per_s": 4e9,
                   "pa_efficiency": 1.0},
        "channel": {"slot_s": 1e-3, "uplink": {"mode": "fixed", "rate_bps": 4e6,
                                               "tx_power_dbm": 23, "header_bits": 0}}}}


@pytest.mark.parametrize("edit, fragment", [
    (("energy", "throughput_macs_per_s", "abc"),
     "scenario.energy.throughput_macs_per_s is \"abc\", not a positive number"),
    (("uplink", "rate_bps", -4.0), "scenario.channel.uplink.rate_bps is -4.0, not a positive"),
    (("uplink", "tx_power_dbm", [1, "a"]), "scenario.channel.uplink.tx_power_dbm is [1, \"a\"]"),
    (("channel", "slot_s", None), "scenario.channel.slot_s is null"),
    (("energy", "pa_efficiency", True), "scenario.energy.pa_efficiency is true"),
    (("uplink", "arq", 5), "scenario.channel.uplink.arq is not an object"),
])
def test_a_manifest_value_that_is_not_a_number_is_one_error(tmp_path, edit, fragment):
    manifest = _manifest()
    section, key, value = edit
    where = {"energy": manifest["scenario"]["energy"],
             "channel": manifest["scenario"]["channel"],
             "uplink": manifest["scenario"]["channel"]["uplink"]}[section]
    where[key] = value
    with pytest.raises(UserError) as err:
        _setting(manifest, tmp_path)
    text = str(err.value)
    assert text.startswith(f"{tmp_path / 'manifest.json'}: ") and fragment in text, text
    assert "the run folder is damaged" in text and "\n" not in text
    assert _setting(_manifest(), tmp_path)["theta0"] == 4e9  # the undamaged one passes


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """A small quickstart run as the one evaluation run of a study (tests/test_crossover.py's),
    every method reaching its target."""
    base = tmp_path_factory.mktemp("early-crossover") / "study"
    _run(base / "evaluation" / "runs" / "s0")
    return base


def test_a_damaged_manifest_is_one_error_line_and_nothing_written(study, capsys, tmp_path):
    copy = tmp_path / "study"
    shutil.copytree(study, copy)
    path = copy / "evaluation" / "runs" / "s0" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["model"]["per_pass"]["DZOFL"]["energy_forward_j"] = "x"
    path.write_text(json.dumps(manifest))
    _one_error(*cli(capsys, "crossover", copy, "--out", tmp_path / "o"),
               "model.per_pass.DZOFL.energy_forward_j is \"x\", not a positive number")
    assert not (tmp_path / "o").exists()


def test_a_range_where_the_costs_overflow_is_refused(study, capsys, tmp_path):
    """Within the span allowed, a throughput near 0 makes compute time overflow to inf."""
    _one_error(*cli(capsys, "crossover", study, "--out", tmp_path / "o", "--throughput",
                    "1e-320", "1e-310"), "time or energy to the target overflows at",
               "give a range nearer the scenario's (4e+09 MAC/s, 4e+06 bit/s)")
    assert not (tmp_path / "o").exists()
    code, _, err = cli(capsys, "crossover", study, "--out", tmp_path / "o", "--points", "5",
                       "--throughput", "1e8", "1e10")
    assert code == 0 and "Traceback" not in err, err


# ---- 5. compare --html is checked before anything is written ----------------------------------
def test_compare_html_with_two_folders_writes_nothing(study, capsys, tmp_path):
    """Before: comparison.csv and the figures were written, then --html refused."""
    out = tmp_path / "cmp"
    run = study / "evaluation" / "runs" / "s0"
    _one_error(*cli(capsys, "compare", run, run, "--html", "--out", out),
               "--html: give one sweep folder")
    assert not out.exists()


# ---- 6. what the data set cannot hold is refused by validate, not by the run --------------------
def test_rare_classes_beyond_the_labels_are_refused_by_validate_and_before_the_run(capsys,
                                                                                   tmp_path):
    """seed003-toy marks classes 5-9 rare; with two classes they do not exist. Before:
    `validate` said valid and `run` refused it after loading the data."""
    fragment = ("partition.rare_classes lists [5, 6, 7, 8, 9], which the training set does not "
                "hold; its labels are [0, 1]")
    over = ["--set", "data.synthetic.num_classes=2"]
    _one_error(*cli(capsys, "validate", "seed003-toy", *over), fragment)
    out = tmp_path / "run"
    _one_error(*cli(capsys, "run", "seed003-toy", *over, "--out", out, "--quiet"), fragment)
    assert not out.exists()


@pytest.mark.parametrize("overrides, fragment", [
    (["data.synthetic.num_classes=3", "partition.rare_classes=[-1, 2]"],
     "lists [-1], which the training set does not hold; its labels are [0, 1, 2]"),
    (["data.synthetic.num_samples=30"],
     ("data.test_fraction=0.25 cannot split 30 samples with stratification: it leaves 22 "
      "training and 8 test samples, and each side needs one sample of each of the 10 labels; "
      "set data.test_fraction between 0.301 and 0.666")),
    (["data.synthetic.num_samples=15"], "use at least 20 samples"),
])
def test_what_loading_would_refuse_is_refused_from_the_scenario(overrides, fragment):
    with pytest.raises(UserError) as err:
        check_runnable(load_scenario("seed003-toy", overrides))
    assert fragment in str(err.value), err.value


def test_the_split_rule_matches_the_loaders_on_both_sides_of_the_bound():
    """The bounds the refusal quotes are the loader's: 0.301 and 0.666 of 30 samples split (each
    side keeps 10 labels), 0.3 and 0.667 do not."""
    from wirelessfl.pipeline.build import build_world

    for fraction, ok in ((0.301, True), (0.666, True), (0.3, False), (0.667, False)):
        scenario = load_scenario("seed003-toy", ["data.synthetic.num_samples=30",
                                                 f"data.test_fraction={fraction}",
                                                 "population.num_devices=3",
                                                 "partition.min_samples=1"])
        for check in (check_runnable, build_world):
            if ok:
                check(scenario)
            else:
                with pytest.raises(UserError, match="cannot split 30 samples"):
                    check(scenario)


# ---- low: the memory refusal names the part that is largest ----------------------------------
def test_a_huge_round_count_is_blamed_on_the_rounds_not_the_devices():
    scenario = load_scenario("quickstart", ["algorithms.0.rounds=1000000000000"])
    with pytest.raises(UserError) as err:
        check_memory_from_scenario(scenario)
    text = str(err.value)
    assert "use fewer rounds or a larger eval_every for 'DZOFL' (algorithms.0: rounds " \
           "1,000,000,000,000, eval_every 250, 4,000,000,001 evaluations recorded" in text, text
    assert "fewer devices" not in text
    scenario = load_scenario("quickstart", ["population.num_devices=100000000"])
    with pytest.raises(UserError, match=r"use fewer devices \(population.num_devices\)"):
        check_memory_from_scenario(scenario)
