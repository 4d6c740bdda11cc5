"""target_worst_device_accuracy: "converged" as the worst device's accuracy (the rounds column
worst_device_accuracy) at or above a bound: seed 003 (fgdro.md Sec. 5) compares methods by the
rounds, joules and seconds they need to reach a worst-client accuracy target.

Every number "to target" is checked against the rounds table read back here: the summary's
rounds, time and energy to target, stop_at_target, a tuning study's energy_to_target and its
ranking, a reproduction claim read at a worst-device target, the figures; the key's refusals
are one clear line each."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pandas as pd
import pytest
import yaml

import wirelessfl
from tests.conftest import SMALL_BILEVEL, SMALL_COMPOSITIONAL, small_doc, small_quadratic
from wirelessfl.cli import main
from wirelessfl.errors import UserError
from wirelessfl.results.records import read_run
from wirelessfl.results.summary import SUMMARY_COLUMNS, describe_target, format_summary
from wirelessfl.scenario.loader import resolved_document, scenario_from_document

# a label skew strong enough that the worst device lags the others by rounds (checked below)
DIRICHLET = {"scheme": "dirichlet", "alpha": 0.3}
BOUND = 0.25  # reached part-way through 12 rounds, after the test accuracy passes 0.5
FEDAVG = {"name": "fedavg", "label": "FedAvg", "rounds": 12, "eval_every": 1, "local_steps": 3}


def classifier_doc(algorithms: list[dict] | None = None, **changes) -> dict:
    """tests/conftest.py's small classifier (digits, logistic model, 8 devices) split by a
    Dirichlet label skew, FedAvg for 12 rounds evaluated every round; no target unless given."""
    doc = small_doc(partition=dict(DIRICHLET), algorithms=algorithms or [dict(FEDAVG)])
    doc.pop("target_accuracy")
    doc.update(changes)
    return doc


def first_at(rounds: pd.DataFrame, bound: float, accuracy: float | None = None) -> pd.Series:
    """The first evaluated row whose worst_device_accuracy is at least ``bound`` (and whose
    test accuracy is at least ``accuracy``, when given), found here from the rounds table
    alone."""
    evaluated = rounds[rounds.worst_device_accuracy.notna()].sort_values("round")
    ok = evaluated.worst_device_accuracy.to_numpy() >= bound
    if accuracy is not None:
        ok &= evaluated.test_accuracy.to_numpy() >= accuracy
    hit = evaluated[ok]
    assert len(hit), "the bound is never reached"
    return hit.iloc[0]


@pytest.fixture(scope="module")
def free_run(tmp_path_factory):
    """The run without stop_at_target, written to a folder (summary.csv, rounds.parquet)."""
    out = tmp_path_factory.mktemp("free") / "run"
    wirelessfl.run(classifier_doc(target_worst_device_accuracy=BOUND), out, figures=False)
    return out


# ---- the summary ------------------------------------------------------------------------------
def test_the_summary_counts_to_the_first_evaluated_round_at_the_worst_device_target(free_run):
    rounds = read_run(free_run).rounds.sort_values("round")
    at = first_at(rounds, BOUND)
    evaluated = rounds[rounds["round"] > 0]
    assert 1 < int(at["round"]) < int(evaluated["round"].max())  # reached part-way
    # the devices differ: the worst lags the mean, and the test accuracy passed the same bound
    # rounds earlier (an accuracy target would have stopped sooner)
    assert (rounds.worst_device_accuracy < rounds.mean_device_accuracy - 0.05).all()
    assert int(rounds[rounds.test_accuracy >= BOUND]["round"].iloc[0]) < int(at["round"])
    # not monotone: a later row falls below the bound again, the first one counts
    later = rounds[rounds["round"] > at["round"]]
    assert (later.worst_device_accuracy < later.worst_device_accuracy.cummax()).any()
    summary = pd.read_csv(free_run / "summary.csv")
    assert list(summary.columns) == SUMMARY_COLUMNS  # no new column: worst_device is read
    row = summary.iloc[0]
    assert int(row.rounds_to_target) == int(at["round"])
    assert row.time_to_target_s == pytest.approx(at.sim_time_s, rel=1e-12)
    assert row.energy_to_target_j == pytest.approx(at.energy_j, rel=1e-12)
    assert row.system_energy_to_target_j == pytest.approx(at.energy_system_j, rel=1e-12)
    # the API: the target and the summary of the folder (computed from its tables)
    loaded = wirelessfl.load_run(free_run)
    assert loaded.target_worst_device_accuracy == BOUND
    assert int(loaded.summary.iloc[0].rounds_to_target) == int(at["round"])


def test_the_title_line_names_the_worst_device_target(free_run):
    assert describe_target(None, None, None, None, 0.25) == \
        "target worst-device accuracy 0.250"
    assert describe_target(0.9, None, None, None, 0.25) == \
        "target accuracy 0.900 and target worst-device accuracy 0.250"
    table = pd.read_csv(free_run / "summary.csv")
    text = format_summary(table, None, None, target_worst_device_accuracy=BOUND)
    assert "to target worst-device accuracy 0.250 ('-': not reached)" in text
    assert "no target set" in format_summary(table, None)


def test_the_cli_prints_the_target_and_the_rounds_to_it(tmp_path, capsys):
    path = tmp_path / "worst.yaml"
    path.write_text(yaml.safe_dump(classifier_doc(target_worst_device_accuracy=BOUND)))
    assert main(["run", str(path), "--out", str(tmp_path / "run"), "--quiet",
                 "--no-report"]) == 0
    assert "to target worst-device accuracy 0.250" in capsys.readouterr().out
    at = first_at(read_run(tmp_path / "run").rounds, BOUND)
    assert main(["report", str(tmp_path / "run")]) == 0
    report = capsys.readouterr().out
    assert "to target worst-device accuracy 0.250" in report
    line = next(x for x in report.splitlines() if x.startswith("FedAvg"))
    assert line.split()[1] == str(int(at["round"]))


def test_all_given_targets_must_hold(free_run):
    """With an accuracy target beside it, the first row where both hold."""
    from wirelessfl.engine.recorder import target_reached
    from wirelessfl.results.summary import reached_mask

    rounds = read_run(free_run).rounds.sort_values("round")
    at = first_at(rounds, BOUND)
    assert target_reached(at.to_dict(), None, None, None, None, BOUND)
    before = rounds[rounds["round"] == at["round"] - 1].iloc[0]
    assert not target_reached(before.to_dict(), None, None, None, None, BOUND)
    both = first_at(rounds, BOUND, accuracy=0.7)
    assert int(both["round"]) > int(at["round"])  # the accuracy bound holds later here
    mask = reached_mask(rounds, 0.7, None, None, None, BOUND)
    assert rounds[mask].iloc[0]["round"] == both["round"]
    assert not reached_mask(rounds, None, None, None, None, 0.99).any()
    assert not reached_mask(rounds, None, None, float(rounds.test_loss.min()) / 2, None,
                            BOUND).any()


# ---- stop_at_target ---------------------------------------------------------------------------
def test_stop_at_target_ends_the_run_at_the_first_round_at_the_worst_device_target(
        free_run, tmp_path):
    full = read_run(free_run).rounds
    at = first_at(full, BOUND)
    stopped = wirelessfl.run(classifier_doc(target_worst_device_accuracy=BOUND,
                                            stop_at_target=True),
                             tmp_path / "stopped", figures=False)
    assert int(stopped.rounds["round"].max()) == int(at["round"])
    pd.testing.assert_frame_equal(stopped.rounds.reset_index(drop=True),
                                  full[full["round"] <= at["round"]].reset_index(drop=True))
    assert int(stopped.summary.iloc[0].rounds_to_target) == int(at["round"])


# ---- validation -------------------------------------------------------------------------------
def test_the_key_is_dumped_only_when_set():
    """Scenarios written before the key keep their resolved document (and fingerprint)."""
    assert "target_worst_device_accuracy" not in resolved_document(
        scenario_from_document(classifier_doc(), "w.yaml"))
    assert resolved_document(scenario_from_document(
        classifier_doc(target_worst_device_accuracy=BOUND), "w.yaml"))[
            "target_worst_device_accuracy"] == BOUND
    # alone, a target stop_at_target accepts
    assert scenario_from_document(classifier_doc(target_worst_device_accuracy=BOUND,
                                                 stop_at_target=True), "w.yaml").stop_at_target


@pytest.mark.parametrize("value, why", [(0.0, "greater than 0"), (-0.5, "greater than 0"),
                                        (1.5, "less than or equal to 1"),
                                        (math.nan, "finite number")])
def test_a_bound_outside_0_1_is_refused(value, why):
    with pytest.raises(UserError) as err:
        scenario_from_document(classifier_doc(target_worst_device_accuracy=value), "w.yaml")
    message = str(err.value)
    assert "\n" not in message and "target_worst_device_accuracy" in message and why in message


def _quadratic_doc(**changes) -> dict:
    doc = small_doc(problem={"name": "quadratic", "clients": 5, "dimension": 4},
                    algorithms=[{"name": "gd", "lr": 0.1, "rounds": 2}], **changes)
    for key in ("data", "model", "population", "target_accuracy"):
        doc.pop(key)
    return doc


def test_problems_without_per_device_accuracy_record_nan_and_are_refused():
    """The quadratic (as the bilevel quadratic, MCO and loss-tuning, whose evaluate_devices is
    the contract's default) records NaN worst_device_accuracy: there a target could never be
    met, so the key is refused, naming the targets that serve instead."""
    rounds = wirelessfl.run(small_quadratic({"name": "gd", "lr": 0.1, "rounds": 2,
                                             "eval_every": 1}), None, figures=False).rounds
    assert rounds.worst_device_accuracy.isna().all()
    with pytest.raises(UserError, match="target_worst_device_accuracy needs the "
                                        "worst_device_accuracy column.*'quadratic'.*"
                                        "target_grad_norm_sq instead"):
        scenario_from_document(_quadratic_doc(target_worst_device_accuracy=0.5), "q.yaml")
    for problem, fix in ((SMALL_BILEVEL, "target_suboptimality"),
                         (SMALL_COMPOSITIONAL, "target_loss")):
        doc = small_doc(target_worst_device_accuracy=0.5, problem=problem,
                        algorithms=[{"name": "fedmsa", "local_steps": 3}])
        for key in ("data", "model", "population"):
            doc.pop(key)
        with pytest.raises(UserError, match=f"'{problem['name']}' does not record.*{fix}"):
            scenario_from_document(doc, "s.yaml")
    loss_tuning = small_doc(target_worst_device_accuracy=0.5, problem={"name": "loss-tuning"},
                            algorithms=[{"name": "fedmsa", "local_steps": 3}])
    with pytest.raises(UserError, match="'loss-tuning' does not record.*target_accuracy"):
        scenario_from_document(loss_tuning, "s.yaml")
    # the classifier records it (the free run's rows above); the logistic problem too
    doc = small_doc(data={"name": "breast_cancer"}, problem={"name": "logistic"},
                    population={"num_devices": 5}, target_worst_device_accuracy=0.5,
                    algorithms=[{"name": "fedsgd", "rounds": 2, "eval_every": 1}])
    doc.pop("model")
    logistic = wirelessfl.run(doc, None, figures=False).rounds
    assert np.isfinite(logistic.worst_device_accuracy).all()


def test_the_cli_refuses_with_one_error_line(tmp_path, capsys):
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(classifier_doc(target_worst_device_accuracy=1.5)))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:")
    assert "target_worst_device_accuracy" in err[0]
    path = tmp_path / "q.yaml"
    path.write_text(yaml.safe_dump(_quadratic_doc(target_worst_device_accuracy=0.5)))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:")
    assert "target_worst_device_accuracy needs the worst_device_accuracy column" in err[0]
    assert "'quadratic'" in err[0] and "instead" in err[0]
    assert main(["validate", "quickstart", "--set", "target_worst_device_accuracy=0.5"]) == 0


def test_a_damaged_manifest_value_is_refused_on_reading(free_run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(free_run, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["scenario"]["target_worst_device_accuracy"] = "half"
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(UserError, match="scenario.target_worst_device_accuracy"):
        read_run(copy)


# ---- tuning -----------------------------------------------------------------------------------
LRS = [0.03, 0.1, 0.3]
TUNE_BOUND = 0.4  # on tuning seed 100: 0.03 misses it in 12 rounds, 0.1 and 0.3 reach it


def _tune_file(folder, **changes):
    """Energy to the worst device's accuracy TUNE_BOUND for FedAvg over three step sizes, the
    only target the scenario sets."""
    (folder / "base.yaml").write_text(yaml.safe_dump(classifier_doc()))
    path = folder / "worst-tune.yaml"
    path.write_text(yaml.safe_dump({"name": "worst", "scenario": "base.yaml",
                                    "objective": "energy_to_target", "tuning_seeds": [100],
                                    "evaluation_seeds": [1, 2], "compare_untuned": False,
                                    "set": {"target_worst_device_accuracy": TUNE_BOUND},
                                    "search": {"FedAvg": {"lr": LRS}}, **changes},
                                   sort_keys=False))
    return path


def test_a_tune_file_takes_the_worst_device_target_alone(tmp_path):
    from wirelessfl.tune.spec import load_tune

    tune = load_tune(str(_tune_file(tmp_path)))
    assert tune.objective.name == "energy_to_target"
    with pytest.raises(UserError, match="target_worst_device_accuracy") as err:
        load_tune(str(_tune_file(tmp_path, set={})))
    assert "\n" not in str(err.value)


def test_tuning_ranks_by_the_energy_to_the_worst_device_target(tmp_path, capsys,
                                                                in_process_runs):
    out = tmp_path / "out"
    assert main(["tune", str(_tune_file(tmp_path)), "--out", str(out), "--quiet"]) == 0, \
        capsys.readouterr().err
    tuning = pd.read_csv(out / "tuning.csv")
    runs = sorted((out / "tuning" / "runs").iterdir())
    assert len(runs) == 3
    energy, near = {}, {}
    for run in runs:
        record = read_run(run)
        lr = record.manifest["scenario"]["algorithms"][0]["lr"]
        rounds = record.rounds.sort_values("round")
        hit = rounds[rounds.worst_device_accuracy >= TUNE_BOUND]
        if len(hit):
            energy[lr] = float(hit.iloc[0].energy_j)
            # stop_at_target (on by default for a to-target objective) ended it there
            assert int(rounds["round"].max()) == int(hit.iloc[0]["round"])
        else:  # missed: ranked by its best worst-device accuracy
            near[lr] = float(rounds.worst_device_accuracy.max())
            assert int(rounds["round"].max()) == FEDAVG["rounds"]
    assert len(energy) == 2 and len(near) == 1  # one step size misses (see TUNE_BOUND)
    for row in tuning.itertuples():
        lr = next(v for v in LRS if math.isclose(v, row.lr))
        if lr in energy:
            assert row.reached == 1 and row.value_mean == pytest.approx(energy[lr], rel=1e-12)
        else:
            assert row.reached == 0 and math.isnan(row.value_mean)
            assert row.closeness_mean == pytest.approx(near[lr], rel=1e-12)
    best = min(energy, key=energy.get)
    assert tuning[tuning.chosen].iloc[0].lr == pytest.approx(best)
    assert json.loads((out / "tune.json").read_text())["choices"]["FedAvg"]["lr"] == \
        pytest.approx(best)


def test_closeness_of_a_run_that_missed_is_its_best_worst_device_accuracy():
    from wirelessfl.tune.objectives import OBJECTIVES, closeness, score

    rounds = pd.DataFrame({"round": [0, 5, 10], "energy_j": [0.0, 1.0, 2.0],
                           "test_accuracy": [0.1, 0.8, 0.9],
                           "worst_device_accuracy": [0.0, 0.4, 0.3]})
    got = score(OBJECTIVES["energy_to_target"], rounds, None, None, None, None, 0.35)
    assert got == {"value": 1.0, "reached": True, "closeness": pytest.approx(0.4),
                   "first": True}
    missed = score(OBJECTIVES["energy_to_target"], rounds, None, None, None, None, 0.5)
    assert math.isnan(missed["value"]) and not missed["reached"]
    assert missed["closeness"] == pytest.approx(0.4)
    # beside an accuracy target the worst device's (the stricter) orders the misses
    assert closeness(rounds, 0.95, None, None, None, 0.5) == pytest.approx(0.4)
    both = score(OBJECTIVES["rounds_to_target"], rounds, 0.85, None, None, None, 0.3)
    assert both["value"] == 10.0 and not both["first"]


def test_bits_and_gradients_to_target_read_the_first_row_at_target():
    """The communication and computation a method spends to reach the worst-device target
    (seed 003's comparison against DRFA and DR-DSGD): the cumulative uplink bits and gradient
    evaluations of the first evaluated row where every target holds."""
    from wirelessfl.tune.objectives import OBJECTIVES, score

    rounds = pd.DataFrame({"round": [0, 5, 10, 15], "bits_up": [0.0, 3e4, 6e4, 9e4],
                           "gradient_evaluations": [0.0, 50.0, 100.0, 150.0],
                           "test_accuracy": [0.1, 0.6, 0.8, 0.9],
                           "worst_device_accuracy": [0.0, 0.2, 0.45, 0.5]})
    bits = score(OBJECTIVES["bits_to_target"], rounds, None, None, None, None, 0.4)
    assert bits["value"] == 6e4 and bits["reached"]
    grads = score(OBJECTIVES["gradients_to_target"], rounds, None, None, None, None, 0.4)
    assert grads["value"] == 100.0
    assert math.isnan(score(OBJECTIVES["bits_to_target"], rounds, None, None, None, None,
                            0.6)["value"])


# ---- claims -----------------------------------------------------------------------------------
CLAIM = {"id": "energy-worst", "statement": "FedAvg gets its worst device to 0.5 on little energy",
         "metric": "energy_to_target", "algorithm": "FedAvg", "below": 1.0,
         "target": {"worst_device_accuracy": 0.5}}


def _reproduction(folder, claims=(CLAIM,)):
    path = folder / "worst-repro.yaml"
    path.write_text(yaml.safe_dump({"title": "t", "paper": "p", "tune": "worst-tune.yaml",
                                    "claims": list(claims)}))
    return path


def test_a_claim_is_read_at_a_worst_device_target(tmp_path, free_run):
    from wirelessfl.tune.claims import Claim
    from wirelessfl.tune.reproduce import _metric, load_reproduction

    _tune_file(tmp_path)
    parsed = load_reproduction(str(_reproduction(tmp_path))).spec.claims[0]
    assert parsed.target.worst_device_accuracy == 0.5
    assert parsed.target.describe() == "worst-device accuracy 0.5"
    assert parsed.column == "energy_to_target@worst-device accuracy 0.5"
    rounds = read_run(free_run).rounds
    value, first = _metric(parsed, {"rounds": rounds, "targets": (None, None, None, None,
                                                                   BOUND)})
    assert value == first_at(rounds, 0.5).energy_j and not first
    # the study's own target when the claim names none
    own = Claim.model_validate({**CLAIM, "target": None})
    value, _ = _metric(own, {"rounds": rounds, "targets": (None, None, None, None, BOUND)})
    assert value == first_at(rounds, BOUND).energy_j
    system = Claim.model_validate({**CLAIM, "metric": "system_energy_to_target"})
    assert _metric(system, {"rounds": rounds})[0] == first_at(rounds, 0.5).energy_system_j
    for bad in ({"worst_device_accuracy": 0.0}, {"worst_device_accuracy": 1.5},
                {"worst_device_accuracy": math.inf}, {}):
        with pytest.raises(ValueError):
            Claim.model_validate({**CLAIM, "target": bad})


def test_a_to_target_claim_with_its_own_target_needs_no_to_target_tuning(tmp_path):
    """A study tuned for a final value (seed 003: the final worst-device accuracy) runs every
    evaluation to its end, so a to-target claim can be read at the claim's own target; without
    one it is refused in one line naming the fix."""
    from wirelessfl.tune.reproduce import load_reproduction

    _tune_file(tmp_path, objective="final_worst_device_accuracy", set={})
    claim = {**CLAIM, "metric": "bits_to_target"}
    parsed = load_reproduction(str(_reproduction(tmp_path, [claim]))).spec.claims[0]
    assert parsed.target.worst_device_accuracy == 0.5
    with pytest.raises(UserError, match="give the claim one") as err:
        load_reproduction(str(_reproduction(tmp_path, [{**claim, "target": None}])))
    assert "\n" not in str(err.value)


def test_a_claim_at_a_worst_device_target_on_a_problem_without_one_is_one_line(
        tmp_path, capsys):
    """A quadratic study (its own target a gap) cannot answer a worst-device claim."""
    base = _quadratic_doc()
    base["algorithms"][0]["label"] = "GD"
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(base))
    (tmp_path / "worst-tune.yaml").write_text(yaml.safe_dump(
        {"name": "q", "scenario": "base.yaml", "objective": "rounds_to_target",
         "tuning_seeds": [100], "evaluation_seeds": [1, 2],
         "set": {"target_suboptimality": 1e-3}, "search": {"GD": {"lr": [0.1, 0.2]}}}))
    path = _reproduction(tmp_path, [{**CLAIM, "algorithm": "GD"}])
    assert main(["reproduce", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:")
    assert "target worst_device_accuracy needs the worst_device_accuracy column" in err[0]
    assert "'quadratic'" in err[0]


def test_a_tiny_reproduction_scores_the_claim_at_its_worst_device_target(
        tmp_path, capsys, in_process_runs):
    """`wirelessfl reproduce` in this process: the study tuned at TUNE_BOUND, the claim read at
    0.5 from the same evaluation runs (which go on to their last round): each run's value is
    the energy at its first row with the worst device at 0.5, found here from its rounds."""
    _tune_file(tmp_path)
    out = tmp_path / "out"
    assert main(["reproduce", str(_reproduction(tmp_path)), "--out", str(out),
                 "--quiet"]) == 0, capsys.readouterr().err
    runs = pd.read_csv(out / "runs.csv")
    column = "energy_to_target@worst-device accuracy 0.5"
    assert len(runs) == 2 and (runs.method == "FedAvg").all()
    evaluation = sorted((out / "tune" / "evaluation" / "runs").iterdir())
    by_seed = {}
    for run in evaluation:
        record = read_run(run)
        by_seed[record.manifest["seed"]] = float(first_at(record.rounds, 0.5).energy_j)
    assert sorted(runs.seed) == sorted(by_seed) == [1, 2]
    for seed, value in zip(runs.seed, runs[column]):
        assert value == pytest.approx(by_seed[seed], rel=1e-12)
    claims = pd.read_csv(out / "claims.csv")
    assert claims.iloc[0].claim == "energy-worst" and "worst-device accuracy 0.5" in \
        str(claims.iloc[0].target)


# ---- the figures --------------------------------------------------------------------------------
def test_the_figures_draw_the_worst_device_target(free_run):
    from wirelessfl.report import plots

    record = read_run(free_run)
    fig = plots.device_accuracy(record)
    right = fig.axes[1]
    assert any(np.allclose(ln.get_ydata(), BOUND) for ln in right.lines)
    breakdown = plots.energy_breakdown(record)
    titles = [ax.get_title() for ax in breakdown.axes]
    assert any("to target worst-device accuracy 0.250" in t for t in titles), titles


# ---- the crossover ------------------------------------------------------------------------------
def test_the_crossover_costs_the_run_to_the_worst_device_target(free_run):
    from wirelessfl.tune.crossover import run_costs

    rounds = read_run(free_run).rounds
    cost = run_costs(free_run)["FedAvg"]
    assert cost.rounds == first_at(rounds, BOUND)["round"]
    assert run_costs(free_run, (None, None, None, None, 0.99))["FedAvg"] is None


def _problem_doc(problem: dict | None, algorithm: str, **changes) -> dict:
    """The small scenario on ``problem`` (None: the classifier) with ``algorithm`` for 2 rounds,
    evaluated every round."""
    doc = small_doc(algorithms=[{"name": algorithm, "rounds": 2, "eval_every": 1}], **changes)
    if problem is not None:
        doc["problem"] = problem
        unread = (("model", "partition") if problem["name"] == "loss-tuning"
                  else ("data", "model", "population"))
        for key in unread:
            doc.pop(key, None)
    doc.pop("target_accuracy", None)
    return doc


@pytest.mark.parametrize("doc", [
    _problem_doc(None, "fedavg"),
    _problem_doc({"name": "classification", "train_metrics": True}, "fedavg"),
    _problem_doc(None, "fedavg", model={"name": "logistic", "l2": 0.01}),
    _problem_doc({"name": "quadratic", "clients": 5, "dimension": 4}, "gd"),
    _problem_doc(SMALL_BILEVEL, "fedmsa"),
    _problem_doc(SMALL_COMPOSITIONAL, "fedmsa"),
    _problem_doc({"name": "loss-tuning"}, "fedmsa", population={"num_devices": 10}),
], ids=["classifier", "classifier-train-metrics", "classifier-logistic-l2", "quadratic",
        "bilevel-quadratic", "risk-averse-mco", "loss-tuning"])
def test_each_problem_names_exactly_the_target_columns_its_runs_leave_nan(doc):
    """The invariant the scenario's target refusals rest on: a column a problem's
    ``unrecorded`` hook names is NaN in every evaluated row of a run, and one it does not name
    is recorded (finite) there, so a target on it can be met and one on the other is refused."""
    from wirelessfl.plugins import PROBLEMS
    from wirelessfl.scenario.schema import TARGET_COLUMNS

    scenario = scenario_from_document(doc, "s.yaml")
    unrecorded = PROBLEMS.get(scenario.problem.name, "problem.name").unrecorded(scenario)
    rounds = wirelessfl.run(doc, None, figures=False).rounds
    evaluated = rounds[rounds.test_loss.notna() | rounds.objective.notna()]
    assert len(evaluated) >= 2
    for key, (column, _) in TARGET_COLUMNS.items():
        values = evaluated[column].to_numpy(float)
        if column in unrecorded:
            assert np.isnan(values).all(), column
            with pytest.raises(UserError, match=f"{key} needs the {column} column"):
                scenario_from_document({**doc, key: 0.5}, "s.yaml")
        else:
            assert np.isfinite(values).all(), column
            assert getattr(scenario_from_document({**doc, key: 0.5}, "s.yaml"), key) == 0.5
