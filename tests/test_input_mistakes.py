"""Input mistakes (issue 34): each ends in one ``error:`` line naming the place (the file and the
key path, or the ``--set``) and the fix, or in a ``warning:`` where the value is legal but
probably meant in another unit; never a traceback. The CLI runs in this process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import cli, small_doc, small_scenario, write_yaml
from wirelessfl.errors import UserError
from wirelessfl.pipeline.preflight import check_runnable
from wirelessfl.pipeline.runner import run_scenario
from wirelessfl.scenario.loader import scenario_from_document


def _one_error(code: int, err: str) -> str:
    """The single ``error:`` line of a refused command (exit 2, no traceback), without the
    prefix."""
    assert code == 2 and "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0].removeprefix("error: ")


# ---- 1. a misspelt key names the key it was meant to be -------------------------------------

@pytest.mark.parametrize(("override", "meant"), [
    ("quantisation_bits=8", "quantization_bits"),  # British spelling (difflib)
    ("population.num_device=3", "num_devices"),  # a letter short (difflib)
    ("algorithms.FedSGD.learning_rate=0.1", "lr"),  # another tool's name (the synonyms)
    ("channel.uplink.tx_power=10", "tx_power_dbm"),  # the unit left off
    ("energy.throughput_mac_per_s=1e9", "throughput_macs_per_s"),  # a resolved profile's key
])
def test_a_misspelt_key_says_did_you_mean(capsys, override, meant):
    message = _one_error(*cli(capsys, "validate", "quickstart", "--set", override)[::2])
    key = override.partition("=")[0].replace("algorithms.FedSGD", "algorithms[1]")
    assert message == f"--set {override}: {key}: unknown key; did you mean '{meant}'?"


@pytest.mark.parametrize("spelling", ["algorithms[0].rounds", "algorithms[FedSGD].rounds",
                                      "algorithms.0.rounds"])
def test_a_list_entry_in_brackets_is_the_dotted_entry(spelling):
    """The bracket spelling other tools use for a list entry (algorithms[0].rounds) sets the
    same key as the dotted one, by position or by label (it was 'unknown key' before)."""
    fedsgd = {"name": "fedsgd", "label": "FedSGD", "rounds": 6, "lr": 0.5}
    scenario = small_scenario([f"{spelling}=17"], algorithms=[fedsgd])
    assert scenario.algorithms[0].rounds == 17


def test_a_misspelt_key_in_the_file_names_the_file_and_the_key(capsys, tmp_path):
    doc = small_doc(quantisation_bits=8)
    del doc["quantization_bits"]
    doc["algorithms"][1]["learning_rate"] = doc["algorithms"][1].pop("lr")
    path = write_yaml(tmp_path, doc)
    message = _one_error(*cli(capsys, "validate", path)[::2])
    # the algorithms are validated first, each against its own parameters
    assert message == f"{path}: algorithms[1].learning_rate: unknown key; did you mean 'lr'?"
    doc["algorithms"][1]["lr"] = doc["algorithms"][1].pop("learning_rate")
    path = write_yaml(tmp_path, doc)
    message = _one_error(*cli(capsys, "validate", path)[::2])
    assert message == f"{path}: quantisation_bits: unknown key; did you mean 'quantization_bits'?"


def test_a_key_of_a_problem_section_is_suggested_from_that_problem():
    """The problem section validates as the named problem's own Config: its keys are offered."""
    doc = small_doc(problem={"name": "quadratic", "dimensoin": 5})
    for key in ("data", "model"):
        doc.pop(key)
    with pytest.raises(UserError) as err:
        scenario_from_document(doc, "small.yaml")
    assert "small.yaml: problem.dimensoin: unknown key; did you mean 'dimension'?" \
        in str(err.value)


def test_a_key_with_nothing_close_keeps_the_plain_message(capsys):
    message = _one_error(*cli(capsys, "validate", "quickstart", "--set", "colour=blue")[::2])
    assert message == "--set colour=blue: colour: unknown key; remove it or check its spelling"


# ---- 2. a bad --set is the --set's mistake -------------------------------------------------

def test_a_bad_set_value_is_blamed_on_the_set_not_the_file(capsys):
    message = _one_error(*cli(capsys, "validate", "quickstart", "--set",
                              "population.num_devices=-3")[::2])
    assert message == ("--set population.num_devices=-3: population.num_devices: Input should be "
                       "greater than 0 (got -3)")
    # a list entry named by its label; a section's own check names the section after the --set
    message = _one_error(*cli(capsys, "validate", "quickstart", "--set",
                              "algorithms.FedSGD.rounds=0")[::2])
    assert message.startswith("--set algorithms.FedSGD.rounds=0: algorithms[1].rounds: Input "
                              "should be greater than 0")
    message = _one_error(*cli(capsys, "validate", "quickstart", "--set",
                              "population.distances_m=[100, 200]")[::2])
    assert message.startswith("--set population.distances_m=[100, 200]: population: "
                              "distances_m has 2 entries but num_devices is 50")
    message = _one_error(*cli(capsys, "validate", "quickstart", "--set",
                              "population.num_devices=true")[::2])
    assert message.startswith("--set population.num_devices=true: population.num_devices: "
                              "expects a number")


def test_a_check_of_the_whole_scenario_names_the_file_with_the_sets(capsys):
    """What validate checks beyond the keys (preflight) cannot tell which input is wrong: it
    names the file and the --set values it was given with."""
    code, _, err = cli(capsys, "validate", "quickstart", "--set", "data.classes=[1, 42]")
    assert _one_error(code, err).endswith(
        "quickstart.yaml with --set data.classes=[1, 42]: data.classes lists label(s) [42] that "
        "dataset 'digits' does not have; its labels are [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]")


@pytest.mark.parametrize("command", ["run", "validate"])
def test_a_schema_check_of_the_whole_scenario_names_the_sets_too(capsys, command):
    """A check across keys (stop_at_target without a target) cannot blame one key: run and
    validate name the file and every --set it was given with."""
    code, _, err = cli(capsys, command, "quickstart", "--set", "stop_at_target=true",
                       "--set", "target_accuracy=null")
    message = _one_error(code, err)
    assert "quickstart.yaml with --set stop_at_target=true, --set target_accuracy=null: " \
           "(top level): stop_at_target needs" in message, message


def test_a_mistake_in_the_file_is_still_the_file_s_with_a_set_given(capsys, tmp_path):
    path = write_yaml(tmp_path, small_doc(population={"num_devices": -3}))
    message = _one_error(*cli(capsys, "validate", path, "--set", "seed=4")[::2])
    assert message == f"{path}: population.num_devices: Input should be greater than 0 (got -3)"


@pytest.mark.parametrize(("words", "given"), [
    (["--set", "population.num_devices", "3"], "population.num_devices 3"),
    (["--set", "population.num_devices", "=", "3"], "population.num_devices = 3"),
    (["--set", "population.num_devices=", "3"], "population.num_devices= 3"),
    (["--set=population.num_devices", "3"], "population.num_devices 3"),
])
def test_a_set_in_two_words_says_to_write_one(capsys, words, given):
    message = _one_error(*cli(capsys, "validate", "quickstart", *words)[::2])
    assert message == (f"--set {given}: a --set is one word, KEY.PATH=VALUE with no spaces "
                       "around '='; write --set population.num_devices=3 (quote it if the "
                       "value holds spaces)")


# ---- 3. a value probably written in another unit warns, and validate counts the warnings -----

UNIT_WARNINGS = [
    ("channel.uplink.deadline_s=20",
     ("channel.uplink.deadline_s = 20 s is outside the plausible 1e-05 to 10 s: deadline_s is in "
      "seconds (for 20 ms write 0.02), e.g. 0.1 for 100 ms")),
    ("energy.battery_j=4000",
     ("energy.battery_j = 4000 J looks like a battery capacity in mAh: battery_j is in joules, "
      "and C mAh at V volts is C x 3.6 x V J (4000 mAh at 3.7 V is 53,280 J); keep 4000 if "
      "joules were meant")),
]


@pytest.mark.parametrize(("override", "expected"), UNIT_WARNINGS)
def test_a_value_in_the_wrong_unit_warns_and_validate_says_with_warnings(capsys, override,
                                                                         expected):
    assert check_runnable(small_scenario([override])) == [expected]
    code, out, err = cli(capsys, "validate", "quickstart", "--set", override)
    assert code == 0 and err == f"warning: {expected}\n"
    assert out.startswith("quickstart: valid, with 1 warning (50 devices")


@pytest.mark.parametrize("override", ["channel.uplink.deadline_s=0.02", "energy.battery_j=2430",
                                      "energy.battery_j=0.12", "energy.battery_j=55440"])
def test_plausible_deadlines_and_budgets_do_not_warn(capsys, override):
    assert check_runnable(small_scenario([override])) == []
    code, out, err = cli(capsys, "validate", "quickstart", "--set", override)
    assert code == 0 and err == "" and out.startswith("quickstart: valid (50 devices")


# ---- 4. an interrupted run: report says so, and --resume renews report.html -----------------

def _interrupted_run(out: Path) -> None:
    """A run of two algorithms stopped (as by Ctrl-C) in the second one, after its 7th round."""
    scenario = small_scenario(algorithms=[
        {"name": "fedavg", "rounds": 4, "eval_every": 2, "local_steps": 2, "label": "A"},
        {"name": "fedsgd", "rounds": 20, "eval_every": 5, "lr": 0.5, "label": "B"}])
    running, rounds = [], []

    def on_round(n: int) -> None:
        rounds.append(n)
        if running[-1] == "B" and len(rounds) == 4 + 7:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_scenario(scenario, out, on_round=on_round, on_algorithm=running.append,
                     warn=lambda line: None)
    assert json.loads((out / "manifest.json").read_text())["status"] == "interrupted"


def test_report_on_an_interrupted_run_says_where_and_how_to_finish(capsys, tmp_path):
    out = tmp_path / "run"
    _interrupted_run(out)
    code, _, err = cli(capsys, "report", out, "--out", tmp_path / "figures")
    assert code == 0
    assert err.splitlines() == [(
        f"warning: {out}: the run was interrupted after round 5 of B (of 20; the summary and "
        f"figures show the rounds recorded so far); finish it with: wirelessfl run --resume "
        f"{out}")]


@pytest.mark.parametrize("no_report", [False, True])
def test_resume_renews_a_report_html_of_the_interrupted_run(capsys, tmp_path, no_report):
    out = tmp_path / "run"
    _interrupted_run(out)
    assert cli(capsys, "report", out, "--html")[0] == 0
    page = out / "report.html"
    assert "status interrupted" in page.read_text()
    code, _, err = cli(capsys, "run", "--resume", out, "--quiet",
                       *(["--no-report"] if no_report else []))
    assert code == 0, err
    if no_report:  # no figures drawn: the stale page is removed, and the way to write it said
        assert not page.exists()
        assert f"write it again with: wirelessfl report {out} --html" in err
    else:
        assert "status complete" in page.read_text() and f"wrote {page}" in err
    code, _, err = cli(capsys, "report", out)
    assert code == 0 and "warning" not in err


# ---- 5. link: a distance outside the cell warns; --set overrides the profile -----------------

def _link(capsys, *argv) -> tuple[int, dict, str]:
    code, out, err = cli(capsys, "link", "seed002-cell", "--bits", 1000, "--json", *argv)
    return code, json.loads(out) if code == 0 else {}, err


@pytest.mark.parametrize(("distance", "fix"), [(800, "cell_radius_m=800"),
                                               (5, "min_distance_m=5")])
def test_link_warns_of_a_distance_outside_the_cell(capsys, distance, fix):
    code, _, err = _link(capsys, "--distance", distance)
    assert code == 0 and err == (
        f"warning: --distance {distance} m is outside the cell of channel profile "
        f"'seed002-cell' (devices are placed from min_distance_m 10 m to cell_radius_m 500 m), "
        f"so no device of a scenario on it is there; to include it, --set {fix}\n")
    code, _, err = _link(capsys, "--distance", distance, "--set", fix)
    assert code == 0 and err == ""


def test_link_takes_set_like_run_and_validate(capsys):
    code, plain, err = _link(capsys, "--distance", 300)
    assert code == 0 and err == ""
    for key in ("uplink.tx_power_dbm=10", "channel.uplink.tx_power_dbm=10"):
        code, weaker, err = _link(capsys, "--distance", 300, "--set", key)
        assert code == 0 and err == ""
        assert weaker["mean_snr_db"] == pytest.approx(plain["mean_snr_db"] - 13)
    message = _one_error(*_link(capsys, "--distance", 300, "--set", "uplink.tx_power=10")[::2])
    assert message == ("--set uplink.tx_power=10: uplink.tx_power: unknown key; did you mean "
                       "'tx_power_dbm'?")
    message = _one_error(*_link(capsys, "--distance", 300, "--set", "cell_radius_m=-1")[::2])
    assert message == ("--set cell_radius_m=-1: cell_radius_m: Input should be greater than 0 "
                       "(got -1)")


def test_a_profile_path_to_another_file_never_quotes_its_lines(tmp_path, capsys):
    """``--set energy=/etc/shadow``: YAML reads each line of such a file as a key, which the
    error named verbatim; a key that is not a field name is now described, not shown."""
    from wirelessfl import cli

    secret = "root:$6$saltsalt$hashhashhash:19000:0:99999:7:::"
    other = tmp_path / "shadow"
    other.write_text(secret + "\n")
    assert cli.main(["validate", "quickstart", "--set", f"energy={other}"]) == 2
    err = capsys.readouterr().err
    assert "a key that is not a field name" in err and str(other) in err
    assert "hashhash" not in err and "saltsalt" not in err and "root:" not in err


# ---- the study files' own keys ---------------------------------------------------------------

@pytest.mark.parametrize(("doc", "expected"), [
    ({"name": "t", "scenario": "quickstart", "objective": "energy_to_target",
      "tuning_seed": [1], "evaluation_seeds": [0], "search": {"FedSGD": {"lr": [0.1]}}},
     "tuning_seed: unknown key; did you mean 'tuning_seeds'?"),
    ({"name": "s", "scenario": "quickstart", "grid": {"population.num_devices": [3]},
      "seed": [0]}, "seed: unknown key; did you mean 'seeds'?"),
    ({"name": "s", "scenario": "quickstart", "grids": {"population.num_devices": [3]}},
     ("but has neither a sweep's 'grid' or 'points' nor a tune file's 'search'; 'grids' (did "
      "you mean 'grid'?)")),
])
def test_a_misspelt_key_of_a_sweep_or_tune_file_says_did_you_mean(capsys, tmp_path, doc,
                                                                   expected):
    """validate names the key meant; so do the commands that read the file (tune, sweep, and
    run for a file that is neither)."""
    path = write_yaml(tmp_path, doc, "study.yaml")
    own = "tune" if "objective" in doc else "sweep" if "grid" in doc else "run"
    for command in ("validate", own):
        code, _, err = cli(capsys, command, path)
        assert expected in _one_error(code, err), err
