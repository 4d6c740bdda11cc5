"""target_grad_norm_sq: "converged" as ||grad f(theta)||^2 at or below a bound, read from the rounds
column grad_norm_sq, for problems without a known optimum (fedred.md A14: the non-convex quadratic
instance, whose f* is unknown, compares GD, DANE+ and FedRed by rounds to ||grad f||^2 <= eps).

Every number "to target" is checked against the rounds table read back here: the summary's
rounds, time, energy and gradient evaluations to target, stop_at_target, a tuning study's
rounds_to_target, a reproduction claim read at a gradient-norm target, the report's figures; the
key's refusals are one clear line each."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pandas as pd
import pytest
import yaml

import wirelessfl
from tests.conftest import small_doc
from wirelessfl.cli import main
from wirelessfl.errors import UserError
from wirelessfl.results.records import read_run
from wirelessfl.results.summary import SUMMARY_COLUMNS, describe_target, format_summary
from wirelessfl.scenario.loader import resolved_document, scenario_from_document

RELIABLE = {"profile": "seed002-pinned", "uplink": {"delivery_probability": 1.0}}
NON_CONVEX = {"name": "quadratic", "instance": "non-convex", "dimension": 20, "clients": 5}
LR = 1e-3  # below 1/L: L = max ||A_i|| + 2 beta = 100 + 800 at the defaults (checked below)
BOUND = 1e-4  # reached part-way through 40 rounds at LR (checked below)


def non_convex_doc(algorithms: list[dict] | None = None, **changes) -> dict:
    """The non-convex quadratic (d = 20, 5 clients) on a lossless 32-bit uplink, GD at LR for 40
    rounds evaluated every round; no accuracy target (there is no accuracy)."""
    algorithms = algorithms or [{"name": "gd", "label": "GD", "lr": LR, "rounds": 40,
                                 "eval_every": 1}]
    doc = small_doc(channel=RELIABLE, quantization_bits=32, problem=dict(NON_CONVEX),
                    algorithms=algorithms, **changes)
    for key in ("data", "model", "population", "target_accuracy"):
        doc.pop(key, None)
    if "target_accuracy" in changes:
        doc["target_accuracy"] = changes["target_accuracy"]
    return doc


def first_at(rounds: pd.DataFrame, bound: float) -> pd.Series:
    """The first evaluated row (grad_norm_sq recorded) whose grad_norm_sq is at or below
    ``bound``, found here from the rounds table alone."""
    evaluated = rounds[rounds.grad_norm_sq.notna()].sort_values("round")
    hit = evaluated[evaluated.grad_norm_sq.to_numpy() <= bound]
    assert len(hit), "the bound is never reached"
    return hit.iloc[0]


@pytest.fixture(scope="module")
def free_run(tmp_path_factory):
    """The run without stop_at_target, written to a folder (summary.csv, rounds.parquet)."""
    out = tmp_path_factory.mktemp("free") / "run"
    wirelessfl.run(non_convex_doc(target_grad_norm_sq=BOUND), out, figures=False)
    return out


# ---- the summary ------------------------------------------------------------------------------
def test_the_summary_counts_to_the_first_evaluated_round_at_the_gradient_norm_target(free_run):
    record = read_run(free_run)
    constants = record.manifest["problem"]
    assert constants["optimum_value"] is None and LR < 1 / constants["L"]
    rounds = record.rounds
    assert rounds.suboptimality.isna().all()  # f* unknown: the gap target could not serve
    at = first_at(rounds, BOUND)
    evaluated = rounds[rounds["round"] > 0].sort_values("round")
    assert 1 < int(at["round"]) < int(evaluated["round"].max())  # reached part-way
    assert evaluated.grad_norm_sq.iloc[0] > BOUND
    summary = pd.read_csv(free_run / "summary.csv")
    assert list(summary.columns) == SUMMARY_COLUMNS  # no new column: grad_norm_sq is read
    row = summary.iloc[0]
    assert int(row.rounds_to_target) == int(at["round"])
    assert row.time_to_target_s == pytest.approx(at.sim_time_s, rel=1e-12)
    assert row.energy_to_target_j == pytest.approx(at.energy_j, rel=1e-12)
    assert row.gradient_evaluations_to_target == pytest.approx(at.gradient_evaluations,
                                                               rel=1e-12)
    # the API's summary of the folder (computed from its tables, as `wirelessfl report` does)
    assert int(wirelessfl.load_run(free_run).summary.iloc[0].rounds_to_target) == int(at["round"])


def test_the_title_line_names_the_gradient_norm_target(free_run):
    assert describe_target(None, None, None, 1e-4) == "target ||grad f||^2 <= 0.0001"
    assert describe_target(0.9, None, None, 1e-4) == \
        "target accuracy 0.900 and target ||grad f||^2 <= 0.0001"
    table = pd.read_csv(free_run / "summary.csv")
    text = format_summary(table, None, None, target_grad_norm_sq=BOUND)
    assert "to target ||grad f||^2 <= 0.0001 ('-': not reached)" in text
    assert "gradients" in text  # gradients to target: the measure's cost, f* unknown or not
    assert "no target set" in format_summary(table, None)


def test_the_cli_prints_the_target_and_the_rounds_to_it(tmp_path, capsys):
    path = tmp_path / "nc.yaml"
    path.write_text(yaml.safe_dump(non_convex_doc(target_grad_norm_sq=BOUND)))
    assert main(["run", str(path), "--out", str(tmp_path / "run"), "--quiet",
                 "--no-report"]) == 0
    out = capsys.readouterr().out
    assert "to target ||grad f||^2 <= 0.0001" in out
    at = first_at(read_run(tmp_path / "run").rounds, BOUND)
    assert main(["report", str(tmp_path / "run")]) == 0
    report = capsys.readouterr().out
    assert "to target ||grad f||^2 <= 0.0001" in report
    line = next(x for x in report.splitlines() if x.startswith("GD"))
    assert line.split()[1] == str(int(at["round"]))


def test_all_given_targets_must_hold(free_run):
    """With an accuracy target beside it (the quadratic has no accuracy: NaN) nothing is
    reached: every given target must hold at one row, as for the other targets."""
    from wirelessfl.engine.recorder import target_reached
    from wirelessfl.results.summary import reached_mask

    rounds = read_run(free_run).rounds
    at = first_at(rounds, BOUND)
    assert target_reached(at.to_dict(), None, None, None, BOUND)
    assert not target_reached(at.to_dict(), 0.5, None, None, BOUND)
    assert not reached_mask(rounds, 0.5, None, None, BOUND).any()
    assert not reached_mask(rounds, None, None, float(rounds.test_loss.min()) - 1, BOUND).any()
    mask = reached_mask(rounds, None, None, None, BOUND)
    assert rounds[mask].iloc[0]["round"] == at["round"]


# ---- stop_at_target ---------------------------------------------------------------------------
def test_stop_at_target_ends_the_run_at_the_first_round_at_the_gradient_norm_target(
        free_run, tmp_path):
    full = read_run(free_run).rounds
    at = first_at(full, BOUND)
    stopped = wirelessfl.run(non_convex_doc(target_grad_norm_sq=BOUND, stop_at_target=True),
                             tmp_path / "stopped", figures=False)
    assert int(stopped.rounds["round"].max()) == int(at["round"])
    pd.testing.assert_frame_equal(stopped.rounds.reset_index(drop=True),
                                  full[full["round"] <= at["round"]].reset_index(drop=True))
    assert int(stopped.summary.iloc[0].rounds_to_target) == int(at["round"])
    # a gradient-norm target alone is a target stop_at_target accepts
    assert scenario_from_document(non_convex_doc(target_grad_norm_sq=BOUND, stop_at_target=True),
                                  "nc.yaml").stop_at_target


# ---- validation -------------------------------------------------------------------------------
def test_the_key_is_dumped_only_when_set():
    """Scenarios written before the key keep their resolved document (and fingerprint)."""
    assert "target_grad_norm_sq" not in resolved_document(
        scenario_from_document(non_convex_doc(), "nc.yaml"))
    assert resolved_document(scenario_from_document(
        non_convex_doc(target_grad_norm_sq=BOUND), "nc.yaml"))["target_grad_norm_sq"] == BOUND


@pytest.mark.parametrize("value, why", [(-1.0, "greater than 0"), (0.0, "greater than 0"),
                                        (math.inf, "finite number"), (math.nan, "finite number")])
def test_a_bound_that_is_not_positive_and_finite_is_refused(value, why):
    with pytest.raises(UserError) as err:
        scenario_from_document(non_convex_doc(target_grad_norm_sq=value), "nc.yaml")
    message = str(err.value)
    assert "\n" not in message and "target_grad_norm_sq" in message and why in message


def test_the_cli_refuses_with_one_error_line(tmp_path, capsys):
    path = tmp_path / "nc.yaml"
    path.write_text(yaml.safe_dump(non_convex_doc(target_grad_norm_sq=-1.0)))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "target_grad_norm_sq" in err[0]
    # a classifier records grad_norm_sq only with problem.train_metrics: the fix is named
    assert main(["validate", "quickstart", "--set", "target_grad_norm_sq=0.01"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:")
    assert "target_grad_norm_sq" in err[0] and "problem.train_metrics: true" in err[0]


def test_problems_that_record_no_gradient_norm_are_refused():
    """grad_norm_sq is NaN for a classifier without problem.train_metrics (unless f* is known:
    logistic with l2 > 0) and always for loss-tuning; there the target could never be met."""
    from tests.conftest import SMALL_BILEVEL, SMALL_COMPOSITIONAL

    with pytest.raises(UserError, match="target_grad_norm_sq needs the grad_norm_sq column.*"
                                        "problem.train_metrics: true"):
        scenario_from_document(small_doc(target_grad_norm_sq=0.1), "small.yaml")
    for changes in ({"problem": {"name": "classification", "train_metrics": True}},
                    {"model": {"name": "logistic", "l2": 0.01}}):
        assert scenario_from_document(small_doc(target_grad_norm_sq=0.1, **changes),
                                      "small.yaml").target_grad_norm_sq == 0.1
    loss_tuning = small_doc(target_grad_norm_sq=0.1, problem={"name": "loss-tuning"},
                            algorithms=[{"name": "fedmsa", "local_steps": 3}])
    with pytest.raises(UserError, match="'loss-tuning' does not record"):
        scenario_from_document(loss_tuning, "small.yaml")
    # problems that record it: the quadratic (every instance), the bilevel quadratic, MCO
    for problem, algorithm in ((SMALL_BILEVEL, "fedmsa"), (SMALL_COMPOSITIONAL, "fedmsa")):
        doc = small_doc(target_grad_norm_sq=0.1, problem=problem,
                        algorithms=[{"name": algorithm, "local_steps": 3}])
        for key in ("data", "model", "population"):
            doc.pop(key)
        assert scenario_from_document(doc, "s.yaml").target_grad_norm_sq == 0.1


def test_a_damaged_manifest_value_is_refused_on_reading(free_run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(free_run, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["scenario"]["target_grad_norm_sq"] = "small"
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(UserError, match="scenario.target_grad_norm_sq"):
        read_run(copy)


# ---- tuning -----------------------------------------------------------------------------------
def _tune_file(folder, **changes):
    """Rounds to ||grad f||^2 <= BOUND for GD over three step sizes below 1/L (seeds whose
    instances GD takes there within 100 rounds at each; from seed 0's theta_0 = 0 it passes a
    saddle first, ||grad f||^2 ~ 5 for hundreds of rounds)."""
    base = non_convex_doc([{"name": "gd", "label": "GD", "lr": 3e-4, "rounds": 100,
                            "eval_every": 1}])
    (folder / "base.yaml").write_text(yaml.safe_dump(base))
    path = folder / "nc-tune.yaml"
    path.write_text(yaml.safe_dump({"name": "nc", "scenario": "base.yaml",
                                    "objective": "rounds_to_target", "tuning_seeds": [100],
                                    "evaluation_seeds": [1, 3],
                                    "set": {"target_grad_norm_sq": BOUND},
                                    "search": {"GD": {"lr": [3e-4, 6e-4, 1e-3]}}, **changes},
                                   sort_keys=False))
    return path


def test_a_tune_file_needs_a_target_and_takes_a_gradient_norm_target(tmp_path):
    from wirelessfl.tune.spec import load_tune

    tune = load_tune(str(_tune_file(tmp_path)))
    assert tune.objective.name == "rounds_to_target"
    with pytest.raises(UserError, match="target_grad_norm_sq"):
        load_tune(str(_tune_file(tmp_path, set={})))


def test_tuning_picks_the_step_size_with_the_fewest_rounds_to_the_target(
        tmp_path, capsys, in_process_runs):
    out = tmp_path / "out"
    assert main(["tune", str(_tune_file(tmp_path)), "--out", str(out), "--quiet"]) == 0, \
        capsys.readouterr().err
    tuning = pd.read_csv(out / "tuning.csv")
    runs = sorted((out / "tuning" / "runs").iterdir())
    assert len(runs) == 3
    by_hand = {}
    for run in runs:
        record = read_run(run)
        lr = record.manifest["scenario"]["algorithms"][0]["lr"]
        by_hand[lr] = int(first_at(record.rounds, BOUND)["round"])
        # stop_at_target (on by default for a to-target objective) ended it there
        assert int(record.rounds["round"].max()) == by_hand[lr]
    assert len(set(by_hand.values())) == 3  # the step sizes differ in rounds to the target
    assert (tuning.reached == 1).all()
    for row in tuning.itertuples():  # the study's scores are the rounds found by hand
        assert row.value_mean == next(v for lr, v in by_hand.items() if math.isclose(lr, row.lr))
    best = min(by_hand, key=by_hand.get)
    chosen = tuning[tuning.chosen].iloc[0]
    assert chosen.lr == pytest.approx(best)
    assert json.loads((out / "tune.json").read_text())["choices"]["GD"]["lr"] == \
        pytest.approx(best)


def test_closeness_orders_runs_that_missed_a_gradient_norm_target():
    from wirelessfl.tune.objectives import OBJECTIVES, score

    rounds = pd.DataFrame({"round": [0, 5, 10], "test_accuracy": np.nan,
                           "suboptimality": np.nan, "grad_norm_sq": [10.0, 1e-2, 1e-3]})
    got = score(OBJECTIVES["rounds_to_target"], rounds, None, None, None, 1e-2)
    assert got == {"value": 5.0, "reached": True, "closeness": pytest.approx(3.0),
                   "first": True}
    missed = score(OBJECTIVES["rounds_to_target"], rounds, None, None, None, 1e-6)
    assert math.isnan(missed["value"]) and not missed["reached"]
    assert missed["closeness"] == pytest.approx(3.0)  # -log10 of the smallest ||grad f||^2


# ---- claims -----------------------------------------------------------------------------------
def test_a_claim_can_be_read_at_a_gradient_norm_target(tmp_path, free_run):
    from wirelessfl.tune.claims import Claim
    from wirelessfl.tune.reproduce import _metric, load_reproduction

    _tune_file(tmp_path)
    claim = {"id": "rounds-eps", "statement": "GD gets ||grad f||^2 below 1e-6",
             "metric": "rounds_to_target", "algorithm": "GD", "below": 100,
             "target": {"grad_norm_sq": 1e-6}}
    path = tmp_path / "nc-repro.yaml"
    path.write_text(yaml.safe_dump({"title": "t", "paper": "p", "tune": "nc-tune.yaml",
                                    "claims": [claim]}))
    repro = load_reproduction(str(path))
    parsed = repro.spec.claims[0]
    assert parsed.target.grad_norm_sq == 1e-6 and parsed.target.describe() == \
        "grad_norm_sq 1e-06"
    rounds = read_run(free_run).rounds
    value, _ = _metric(parsed, {"rounds": rounds, "targets": (None, None, None, BOUND)})
    assert value == first_at(rounds, 1e-6)["round"]
    for bad in ({"grad_norm_sq": -1.0}, {"grad_norm_sq": math.inf}, {}):
        with pytest.raises(ValueError):
            Claim.model_validate({**claim, "target": bad})


# ---- the report ---------------------------------------------------------------------------------
def test_the_report_draws_the_gradient_norm_of_a_run_without_f_star(free_run, tmp_path):
    from wirelessfl.report import plots

    record = read_run(free_run)
    written = plots.draw_report(record, tmp_path / "figures")
    assert "optimization_progress" in {p.stem for p in written}
    for path in written:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    fig = plots.optimization_progress(record)
    assert fig.axes[0].get_ylabel() == "||grad f(x)||^2"
    line = fig.axes[0].lines[0]
    np.testing.assert_allclose(line.get_ydata(), record.rounds.sort_values("round").grad_norm_sq)
    # the target is drawn across the row
    assert any(np.allclose(ln.get_ydata(), BOUND) for ln in fig.axes[0].lines[1:])
    # without the target the figure is still drawn: the problem has no accuracy to show
    untargeted = type(record)(record.path, record.rounds, record.devices,
                              {**record.manifest, "scenario": {
                                  k: v for k, v in record.manifest["scenario"].items()
                                  if k != "target_grad_norm_sq"}})
    assert plots.optimization_progress(untargeted) is not None
