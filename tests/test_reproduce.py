"""wirelessfl reproduce: claim verdicts against intervals worked by hand, bad reproduction files
as one error line, and a small reproduction end to end (verdicts recomputed from its runs): a
tiny one with its runs in this process, and (slow) a small one in worker processes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import yaml
from scipy import stats

from tests.conftest import cli as _cli
from tests.conftest import small_doc
from wirelessfl.errors import UserError
from wirelessfl.tune.claims import (
    FAILS,
    HOLDS,
    INCONCLUSIVE,
    NOT_REPRODUCED,
    PER_ROUND_COST,
    Claim,
    judge,
    judge_across,
)


def _runs(values, healthy=True, first=False):
    return [{"value": v, "reached": math.isfinite(v), "healthy": healthy, "seed": i,
             "first": first} for i, v in enumerate(values)]


PAIR = Claim(id="e", statement="A uses less energy than B", metric="energy_to_target",
             winner="A", loser="B")
T975_2 = 4.302652729911275  # Student t, 0.975 quantile, 2 degrees of freedom (tables)


def _hand_interval(values):
    """Mean and 95 % t half-width of three values, written out."""
    mean = sum(values) / 3
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / 2)
    return mean, T975_2 * sd / math.sqrt(3)


def test_pair_claims_follow_the_paired_ratio_worked_by_hand():
    # per seed B / A = 9, 5, 11/3: the mean log ratio and its t interval, back to ratios
    logs = [math.log(9), math.log(5), math.log(11 / 3)]
    mean, half = _hand_interval(logs)
    v = judge(PAIR, {"A": _runs([1, 2, 3]), "B": _runs([9, 10, 11])})
    assert v["verdict"] == HOLDS and v["ratio"] == pytest.approx(5.0)
    assert v["paired"]["estimate"] == pytest.approx(math.exp(mean))
    assert v["paired"]["low"] == pytest.approx(math.exp(mean - half))
    assert v["paired"]["high"] == pytest.approx(math.exp(mean + half))
    assert v["paired"]["seeds_past"] == 3 and "3 of 3 seeds" in v["reason"]
    assert v["measured"]["A"]["ci95"] == pytest.approx(T975_2 / math.sqrt(3))
    # the unpaired intervals of A (1, 2, 3) and B (5, 6, 7) overlap, but every seed's ratio is
    # above 1: paired, the claim holds
    assert judge(PAIR, {"A": _runs([1, 2, 3]), "B": _runs([5, 6, 7])})["verdict"] == HOLDS
    assert judge(PAIR, {"A": _runs([9, 10, 11]), "B": _runs([1, 2, 3])})["verdict"] == FAILS
    higher = PAIR.model_copy(update={"better": "higher"})
    assert judge(higher, {"A": _runs([9, 10, 11]), "B": _runs([1, 2, 3])})["verdict"] == HOLDS
    # seeds are matched by seed, not by position
    shuffled = _runs([9, 10, 11])[::-1]
    assert judge(PAIR, {"A": _runs([1, 2, 3]), "B": shuffled})["paired"]["estimate"] == \
        pytest.approx(math.exp(mean))


def test_at_least_k_times_and_not_reproduced():
    """'A uses at least k times less': the paired ratio's interval against k. Ratios 9, 5, 11/3
    (geometric mean 5.48, interval 1.77 to 17.0): above 1.5, containing 4 with the estimate
    above it, containing 6 with the estimate below it (not reproduced), below 20."""
    runs = {"A": _runs([1, 2, 3]), "B": _runs([9, 10, 11])}
    logs = [math.log(9), math.log(5), math.log(11 / 3)]
    mean, half = _hand_interval(logs)
    assert math.exp(mean - half) > 1.5 and math.exp(mean + half) < 20
    assert math.exp(mean) > 4 and math.exp(mean) < 6
    verdict = {k: judge(PAIR.model_copy(update={"times": k}), runs) for k in (1.5, 4, 6, 20)}
    assert verdict[1.5]["verdict"] == HOLDS
    assert verdict[4]["verdict"] == INCONCLUSIVE and "2 of 3 seeds past 4" in verdict[4]["reason"]
    assert verdict[6]["verdict"] == NOT_REPRODUCED
    assert "goes against the paper" in verdict[6]["reason"]
    assert verdict[20]["verdict"] == FAILS
    # overlapping intervals whose paired estimate favours the loser: not reproduced
    mixed = judge(PAIR, {"A": _runs([4, 2, 3.2]), "B": _runs([3, 2.6, 2.4])})
    assert mixed["verdict"] == NOT_REPRODUCED and "1 of 3 seeds past 1" in mixed["reason"]


def test_within_claims_follow_the_paired_difference_worked_by_hand():
    """'A is not worse than B by more than t': per-seed A - B (higher is better) = -0.01,
    -0.005, -0.005: mean -0.00667, half-width 4.3027 x 0.002887 / sqrt(3) = 0.00717."""
    claim = Claim(id="w", statement="A is competitive with B", metric="final_accuracy",
                  winner="A", loser="B", within=0.02)
    runs = {"A": _runs([0.90, 0.91, 0.92]), "B": _runs([0.91, 0.915, 0.925])}
    mean, half = _hand_interval([-0.01, -0.005, -0.005])
    v = judge(claim, runs)
    assert v["verdict"] == HOLDS
    assert v["paired"]["estimate"] == pytest.approx(mean)
    assert v["paired"]["low"] == pytest.approx(mean - half)
    assert mean - half > -0.02
    tight = judge(claim.model_copy(update={"within": 0.005}), runs)
    assert mean - half < -0.005 < mean + half and mean < -0.005
    assert tight["verdict"] == NOT_REPRODUCED
    worse = {"A": _runs([0.80, 0.81, 0.82]), "B": runs["B"]}
    assert judge(claim, worse)["verdict"] == FAILS


def test_across_claims_compare_the_per_seed_losses_worked_by_hand():
    """'A loses less accuracy than B from setting X to Y': per seed, each method's X - Y
    (higher is better), then B's loss minus A's, its mean and t interval. A: 0.90 -> 0.88,
    0.91 -> 0.90, 0.92 -> 0.89 (losses 0.02, 0.01, 0.03); B: 0.95 -> 0.80, 0.94 -> 0.85,
    0.96 -> 0.82 (0.15, 0.09, 0.14); differences 0.13, 0.08, 0.11."""
    claim = Claim(id="r", statement="A is more robust than B", metric="final_accuracy",
                  winner="A", loser="B", across=["X", "Y"])
    before = {"A": _runs([0.90, 0.91, 0.92]), "B": _runs([0.95, 0.94, 0.96])}
    after = {"A": _runs([0.88, 0.90, 0.89]), "B": _runs([0.80, 0.85, 0.82])}
    mean, half = _hand_interval([0.13, 0.08, 0.11])
    v = judge_across(claim, before, after)
    assert v["verdict"] == HOLDS and v["against"] == "X"
    assert v["paired"]["estimate"] == pytest.approx(mean)
    assert v["paired"]["low"] == pytest.approx(mean - half)
    assert v["measured"]["A"]["mean"] == pytest.approx(0.02)
    assert v["measured"]["B"]["mean"] == pytest.approx(0.38 / 3)
    assert "from X to Y" in v["metric"]
    # the other way round: B is the more robust
    swapped = claim.model_copy(update={"winner": "B", "loser": "A"})
    assert judge_across(swapped, before, after)["verdict"] == FAILS
    # a lower-is-better metric worsens by growing: Y - X
    loss = Claim(id="l", statement="A's loss grows less", metric="final_loss", winner="A",
                 loser="B", across=["X", "Y"])
    grown = judge_across(loss, {"A": _runs([1, 1, 1]), "B": _runs([1, 1, 1])},
                         {"A": _runs([1.1, 1.2, 1.1]), "B": _runs([2, 2.5, 2.2])})
    assert grown["verdict"] == HOLDS
    assert grown["measured"]["B"]["mean"] == pytest.approx(1.2333333)
    # an unhealthy run in either setting makes the seed's loss unhealthy
    sick = judge_across(claim, before, {**after, "B": _runs([0.80, 0.85, 0.82], healthy=False)})
    assert sick["verdict"] == INCONCLUSIVE


@pytest.mark.parametrize("bad, message", [
    ({"across": ["X", "X"]}, "two different regimes"),
    ({"across": ["X", "Y"], "times": 2}, "no 'times'"),
    ({"across": ["X", "Y"], "regimes": ["X"]}, "replaces 'regimes'"),
])
def test_across_claims_are_validated(bad, message):
    with pytest.raises(ValueError, match=message):
        Claim(id="r", statement="s", metric="final_accuracy", winner="A", loser="B", **bad)


def test_the_regime_check_fires_on_a_loser_that_reaches_the_target_in_its_first_round():
    one_round = judge(PAIR, {"A": _runs([1, 2, 3]), "B": _runs([9, 10, 11], first=True)})
    assert one_round["verdict"] == HOLDS and PER_ROUND_COST in one_round["note"]
    later = judge(PAIR, {"A": _runs([1, 2, 3]), "B": _runs([9, 10, 11], first=False)})
    assert "note" not in later
    mixed = _runs([9, 10, 11], first=True)
    mixed[1]["first"] = False
    assert "note" not in judge(PAIR, {"A": _runs([1, 2, 3]), "B": mixed})
    # not on a metric read at the end of the run
    final = Claim(id="f", statement="s", metric="final_accuracy", winner="A", loser="B")
    assert "note" not in judge(final, {"A": _runs([0.9, 0.91, 0.92]),
                                       "B": _runs([0.5, 0.6, 0.55], first=True)})


def test_the_first_evaluation_is_read_from_the_rounds():
    """score's 'first': the target held at the first evaluation after round 0 (round 0 is the
    untrained model)."""
    from wirelessfl.tune.objectives import OBJECTIVES, score

    rounds = pd.DataFrame({"round": [0, 1, 2, 3, 4], "test_accuracy": [0.5, None, 0.96, 0.9, 0.97],
                           "test_loss": [0.7, None, 0.2, 0.3, 0.05],
                           "energy_system_j": [0.0, 1.0, 2.0, 3.0, 4.0]})
    objective = OBJECTIVES["system_energy_to_target"]
    assert score(objective, rounds, 0.95, None) == {
        "value": 2.0, "reached": True, "closeness": 0.97, "first": True}
    assert score(objective, rounds, 0.95, None, 0.1)["value"] == 4.0
    assert score(objective, rounds, 0.95, None, 0.1)["first"] is False
    assert score(objective, rounds, None, None, 0.01)["reached"] is False
    assert score(objective, rounds, None, None, 0.01)["closeness"] == -0.05


def test_to_target_claims_with_missed_targets_and_unhealthy_runs():
    nan = math.nan
    holds = judge(PAIR, {"A": _runs([1, 2]), "B": _runs([nan, nan])})
    assert holds["verdict"] == HOLDS and "B never reached" in holds["reason"]
    assert judge(PAIR, {"A": _runs([nan, nan]), "B": _runs([1, 2])})["verdict"] == FAILS
    assert judge(PAIR, {"A": _runs([1, nan]), "B": _runs([5, 6])})["verdict"] == INCONCLUSIVE
    sick = judge(PAIR, {"A": _runs([1, 2, 3], healthy=False), "B": _runs([9, 10, 11])})
    assert sick["verdict"] == INCONCLUSIVE and "unhealthy runs of A" in sick["reason"]


def test_an_unhealthy_run_leaves_the_claim_inconclusive_and_says_what_the_healthy_seeds_say():
    """A diverged run (seed 3 of A) makes the claim inconclusive, naming the method and the
    seed; the paired estimate of the seeds on which every compared run was healthy is given
    beside it (ratios 9, 5, 11/3 and 8/2 = 4 on seeds 0, 1, 2, 4), worked by hand."""
    nan = math.nan
    runs_a = _runs([1, 2, 3, nan, 2])
    runs_a[3]["healthy"] = False
    v = judge(PAIR, {"A": runs_a, "B": _runs([9, 10, 11, 12, 8])})
    assert v["verdict"] == INCONCLUSIVE
    assert v["reason"].startswith("unhealthy runs of A (seed 3); on the 4 seeds where every "
                                  "compared run was healthy: holds")
    logs = [math.log(9), math.log(5), math.log(11 / 3), math.log(4)]
    mean = sum(logs) / 4
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / 3)
    half = stats.t.ppf(0.975, 3) * sd / 2
    assert v["paired"]["estimate"] == pytest.approx(math.exp(mean))
    assert v["paired"]["low"] == pytest.approx(math.exp(mean - half))
    assert v["paired"]["seeds"] == 4 and v["paired"]["seeds_past"] == 4
    # a loser that reached the target at its first evaluation is still marked
    first = judge(PAIR, {"A": runs_a, "B": _runs([9, 10, 11, 12, 8], first=True)})
    assert first["verdict"] == INCONCLUSIVE and PER_ROUND_COST in first["note"]


def test_claims_against_a_constant():
    claim = Claim(id="c", statement="mostly compute", metric="compute_share", algorithm="A",
                  above=0.5)
    assert judge(claim, {"A": _runs([0.9, 0.91, 0.92])})["verdict"] == HOLDS
    assert judge(claim, {"A": _runs([0.1, 0.11, 0.12])})["verdict"] == FAILS
    assert judge(claim, {"A": _runs([0.3, 0.9, 0.6])})["verdict"] == INCONCLUSIVE
    below = claim.model_copy(update={"above": None, "below": 0.5})
    assert judge(below, {"A": _runs([0.1, 0.11, 0.12])})["verdict"] == HOLDS


def test_a_failed_evaluation_run_scores_nan_for_every_claim():
    """A run that failed has no rounds (tune/study._outcome): every metric of it is NaN, so
    the claim sees a missed run instead of the command ending in a KeyError."""
    from wirelessfl.tune.reproduce import _metric

    failed = {"value": math.nan, "reached": False, "closeness": math.nan, "healthy": False,
              "health": "run failed: worker killed", "rounds": None}
    for metric in ("energy_to_target", "compute_share"):
        claim = Claim(id="f", statement="s", metric=metric, algorithm="A", above=0.5)
        assert math.isnan(_metric(claim, failed)[0])


def _tune_file(tmp_path):
    # DZOFL is neither tuned nor claimed about, but its runs are part of each evaluation run:
    # 250 of its rounds instead of the quickstart's 10,000
    doc = {"name": "small", "scenario": "quickstart", "objective": "energy_to_target",
           "set": {"target_accuracy": 0.6, "population.num_devices": 10,
                   "algorithms.DZOFL.rounds": 250, "algorithms.FedSGD.rounds": 30,
                   "algorithms.FedAvg.rounds": 8},
           "tuning_seeds": [100], "evaluation_seeds": [0, 1, 2], "compare_untuned": False,
           "search": {"FedSGD": {"lr": [0.5, 1.0]}, "FedAvg": {"lr": [0.2, 0.4]}}}
    (tmp_path / "small-tune.yaml").write_text(yaml.safe_dump(doc))


CLAIMS = [{"id": "energy", "statement": "FedAvg needs less energy than FedSGD",
           "where": "test", "metric": "energy_to_target", "winner": "FedAvg", "loser": "FedSGD"},
          {"id": "radio", "statement": "FedSGD's energy is mostly radio",
           "metric": "radio_share", "algorithm": "FedSGD", "above": 0.5}]


@pytest.mark.parametrize("change, expected", [
    ({"claims": []}, "claims"),
    ({"claims": [{**CLAIMS[0], "winner": "DZOFL"}]}, "'DZOFL' is not tuned by small-tune.yaml"),
    ({"claims": [{**CLAIMS[0], "metric": "joules"}]}, "unknown metric 'joules'"),
    ({"claims": [{**CLAIMS[1], "above": None}]}, "give either 'winner' and 'loser'"),
    ({"claims": [CLAIMS[0], CLAIMS[0]]}, "two claims share an id"),
    ({"tune": "nowhere.yaml"}, "file 'nowhere.yaml' not found"),
])
def test_bad_reproduction_files_are_one_error_line(tmp_path, capsys, change, expected):
    _tune_file(tmp_path)
    doc = {"title": "t", "paper": "p", "tune": "small-tune.yaml", "claims": CLAIMS, **change}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc))
    code, out, err = _cli(capsys, "reproduce", path, "--out", tmp_path / "out")
    assert code == 2 and out == "" and err.count("\n") == 1 and expected in err, err
    assert not (tmp_path / "out").exists()


def _check_the_verdicts(out: Path, claims_made: list[dict], methods: set[str],
                        evaluation_seeds: int) -> pd.DataFrame:
    """claims.csv holds the verdicts recomputed from runs.csv with the same rules; the reports
    are written. Returns claims.csv."""
    claims = pd.read_csv(out / "claims.csv")
    runs = pd.read_csv(out / "runs.csv")
    assert set(runs.method) == methods and len(runs) == len(methods) * evaluation_seeds
    for claim in (Claim(**c) for c in claims_made):
        by = {m: [{"value": v, "reached": math.isfinite(v), "healthy": bool(h), "seed": s,
                   "first": bool(f)}
                  for v, h, s, f in zip(g[claim.column], g.healthy, g.seed,
                                        g[f"{claim.column} first"])]
              for m, g in runs.groupby("method")}
        assert claims[claims.claim == claim.id].verdict.iloc[0] == judge(claim, by)["verdict"]
    assert (out / "report.html").is_file() and (out / "tune" / "report.html").is_file()
    return claims


@pytest.mark.slow
def test_a_small_reproduction_end_to_end(tmp_path, capsys):
    """On worker processes; the tiny one in process: the next test."""
    _tune_file(tmp_path)
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump({"title": "small", "paper": "none", "tune":
                                    "small-tune.yaml", "claims": CLAIMS}))
    out = tmp_path / "out"
    code, stdout, err = _cli(capsys, "reproduce", path, "--out", out, "--workers", "2",
                             "--quiet")
    assert code == 0, err
    claims = _check_the_verdicts(out, CLAIMS, {"FedSGD", "FedAvg"}, evaluation_seeds=3)
    assert "radio" in stdout and claims[claims.claim == "radio"].verdict.iloc[0] == HOLDS


def test_a_tiny_reproduction_end_to_end_in_process(tmp_path, capsys, in_process_runs):
    """`wirelessfl reproduce` with its runs in this process (tests/conftest.py's
    runs_in_this_process), of one claim on the small scenario's FedSGD at 6 rounds: two step
    sizes tuned on one seed, the choice evaluated on three. The verdict is the one recomputed
    from its runs."""
    fedsgd = {"name": "fedsgd", "label": "FedSGD", "rounds": 6, "eval_every": 2, "lr": 0.5}
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(small_doc(algorithms=[fedsgd])))
    (tmp_path / "tiny-tune.yaml").write_text(yaml.safe_dump(
        {"name": "tiny", "scenario": "base.yaml", "objective": "energy_to_target",
         "tuning_seeds": [100], "evaluation_seeds": [0, 1, 2], "compare_untuned": False,
         "search": {"FedSGD": {"lr": [0.5, 1.0]}}}))
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump({"title": "tiny", "paper": "none", "tune": "tiny-tune.yaml",
                                    "claims": [CLAIMS[1]]}))
    code, stdout, err = _cli(capsys, "reproduce", path, "--out", tmp_path / "out", "--quiet")
    assert code == 0, err
    claims = _check_the_verdicts(tmp_path / "out", [CLAIMS[1]], {"FedSGD"}, evaluation_seeds=3)
    for row in claims.itertuples():
        assert row.claim in stdout and row.verdict in stdout


def test_regimes_judge_every_claim_in_each(tmp_path, capsys, in_process_runs):
    """A reproduction with two regimes (each its own tune file): every claim is judged in each,
    from that regime's runs; the studies are tune-<regime>/, each with its report; claims.csv
    and runs.csv name the regime; a claim with its own target reads it from the same runs."""
    fedsgd = {"name": "fedsgd", "label": "FedSGD", "rounds": 6, "eval_every": 2, "lr": 0.5}
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(small_doc(algorithms=[fedsgd])))
    for name, lrs in (("easy", [0.5, 1.0]), ("slow", [0.05, 0.1])):
        (tmp_path / f"{name}-tune.yaml").write_text(yaml.safe_dump(
            {"name": name, "scenario": "base.yaml", "objective": "energy_to_target",
             "tuning_seeds": [100], "evaluation_seeds": [0, 1], "compare_untuned": False,
             "search": {"FedSGD": {"lr": lrs}}}))
    low = {"id": "low-bar", "statement": "FedSGD gets there", "metric": "rounds_to_target",
           "algorithm": "FedSGD", "below": 100, "target": {"accuracy": 0.2}}
    claims_made = [CLAIMS[1], low]
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump({
        "title": "two", "paper": "none", "claims": claims_made,
        "regimes": [{"name": "easy", "title": "large steps", "tune": "easy-tune.yaml"},
                    {"name": "slow", "title": "small steps", "tune": "slow-tune.yaml"}]}))
    out = tmp_path / "out"
    code, stdout, err = _cli(capsys, "reproduce", path, "--out", out, "--quiet")
    assert code == 0, err
    claims = pd.read_csv(out / "claims.csv")
    runs = pd.read_csv(out / "runs.csv")
    assert sorted(set(zip(claims.regime, claims.claim))) == [
        ("easy", "low-bar"), ("easy", "radio"), ("slow", "low-bar"), ("slow", "radio")]
    assert set(runs.regime) == {"easy", "slow"} and len(runs) == 4
    assert "rounds_to_target@accuracy 0.2" in runs.columns
    for regime in ("easy", "slow"):
        assert (out / f"tune-{regime}" / "report.html").is_file()
        assert f"regime {regime}:" in stdout
        mine = runs[runs.regime == regime]
        for claim in (Claim(**c) for c in claims_made):
            by = {"FedSGD": [{"value": v, "reached": math.isfinite(v), "healthy": bool(h),
                              "seed": s} for v, h, s in zip(mine[claim.column], mine.healthy,
                                                            mine.seed)]}
            got = claims[(claims.regime == regime) & (claims.claim == claim.id)]
            assert got.verdict.iloc[0] == judge(claim, by)["verdict"]
    page = (out / "report.html").read_text()
    assert "large steps" in page and "small steps" in page
    bad = yaml.safe_load(path.read_text())
    bad["tune"] = "easy-tune.yaml"
    path.write_text(yaml.safe_dump(bad))
    code, _, err = _cli(capsys, "reproduce", path, "--out", tmp_path / "o2")
    assert code == 2 and "give either 'tune' (one study) or 'regimes'" in err


def test_reproduce_list_names_what_ships(capsys):
    code, out, _ = _cli(capsys, "reproduce", "--list")
    assert code == 0 and "seed002" in out and "seed002-quick" in out


def test_reproduce_list_shows_the_others_when_one_file_cannot_be_read(capsys, tmp_path,
                                                                      monkeypatch):
    from wirelessfl.scenario import catalog

    bad, good = tmp_path / "bad.yaml", tmp_path / "good.yaml"
    bad.write_text("title: a: b\n")
    good.write_text("title: fine\n")
    monkeypatch.setattr(catalog, "entries", lambda kind: {"bad": bad, "good": good})
    code, out, _ = _cli(capsys, "reproduce", "--list")
    lines = out.splitlines()
    assert code == 0 and lines[0].startswith("bad") and "cannot be read" in lines[0]
    assert lines[1].split() == ["good", "fine"]


def test_the_recorded_seed002_fashionmnist_reproduction_matches_its_files():
    """docs/data/seed002-fashionmnist (benchmarks/record_scenarios.py --study): the claims
    table is the verdicts of reproduce.json in each regime; every verdict is recomputed from
    runs.csv with the same rules (so the docs' table follows from the recorded runs); every
    claim that involves an unhealthy run is inconclusive and names it; each regime's tuned
    choices are those of its tune.json; every device held at least a batch (10 samples)."""
    root = Path(__file__).resolve().parents[1] / "docs" / "data" / "seed002-fashionmnist"
    repro = json.loads((root / "reproduce.json").read_text())
    claims = pd.read_csv(root / "claims.csv", keep_default_na=False, na_values=[""])
    runs = pd.read_csv(root / "runs.csv")
    facts = json.loads((root / "facts.json").read_text())
    regimes = [r["name"] for r in repro["reproduction"]["regimes"]]
    assert set(runs.regime) == set(regimes) == set(facts["samples_per_device"])
    assert all(held["fewest"] >= 10 for held in facts["samples_per_device"].values())
    for verdict in repro["verdicts"]:
        rows = claims[(claims.regime == verdict["regime"]) & (claims.claim == verdict["claim"])]
        assert set(rows.verdict) == {verdict["verdict"]}
        claim = Claim(**next(c for c in repro["reproduction"]["claims"]
                             if c["id"] == verdict["claim"]))
        mine = runs[runs.regime == verdict["regime"]]
        by = {m: [{"value": v, "reached": math.isfinite(v), "healthy": bool(h), "seed": s,
                   "first": bool(f)}
                  for v, h, s, f in zip(g[claim.column], g.healthy, g.seed,
                                        g[f"{claim.column} first"])]
              for m, g in mine.groupby("method")}
        assert judge(claim, by)["verdict"] == verdict["verdict"]
        sick = mine[mine.method.isin(claim.methods) & ~mine.healthy.astype(bool)]
        if len(sick):
            assert verdict["verdict"] == INCONCLUSIVE and "unhealthy runs of" in verdict["reason"]
        choices = json.loads((root / verdict["regime"] / "tune.json").read_text())["choices"]
        assert repro["choices"][verdict["regime"]] == choices


def test_the_recorded_seed002_reproduction_is_healthy_and_matches_its_files():
    """docs/data/seed002-quick (benchmarks/record_scenarios.py): every evaluation run of
    every method healthy and at the target, the claims table the verdicts of reproduce.json,
    the tuned choices those of tune.json (the docs quote these files), and the whole study
    under 10 minutes of 2 cores."""
    root = Path(__file__).resolve().parents[1] / "docs" / "data" / "seed002-quick"
    runs = pd.read_csv(root / "runs.csv")
    assert set(runs.method) == {"DZOFL", "FedSGD", "FedAvg"}
    assert runs.healthy.astype(bool).all(), runs[~runs.healthy.astype(bool)].health.tolist()
    repro = json.loads((root / "reproduce.json").read_text())
    claims = pd.read_csv(root / "claims.csv")
    for verdict in repro["verdicts"]:
        rows = claims[claims.claim == verdict["claim"]]
        assert set(rows.verdict) == {verdict["verdict"]}
        assert set(rows.method) == set(verdict["measured"])
    assert repro["choices"] == json.loads((root / "tune.json").read_text())["choices"]
    assert not json.loads((root / "facts.json").read_text())["host_s"] > 10 * 60


def test_a_claim_needs_its_methods_tuned_only_where_it_is_judged(tmp_path):
    """Regimes that tune different methods (seed001: the quadratic's FedMSA variants, the
    compositional problem's centralized SGD): a claim scoped to one regime names methods of
    that regime's tune file only; one scoped to a regime that does not tune its method is
    refused, naming that regime's tune file."""
    from wirelessfl.tune.reproduce import load_reproduction

    fedsgd = {"name": "fedsgd", "label": "FedSGD", "rounds": 6, "eval_every": 2, "lr": 0.5}
    fedavg = {"name": "fedavg", "label": "FedAvg", "rounds": 4, "eval_every": 2}
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(small_doc(algorithms=[fedsgd, fedavg])))
    for name, method in (("one", "FedSGD"), ("two", "FedAvg")):
        (tmp_path / f"{name}-tune.yaml").write_text(yaml.safe_dump(
            {"name": name, "scenario": "base.yaml", "objective": "final_accuracy",
             "tuning_seeds": [100], "evaluation_seeds": [0, 1], "compare_untuned": False,
             "search": {method: {"lr": [0.1, 0.2]}}}))
    claims = [{"id": f"{m}-high", "statement": "s", "metric": "final_accuracy",
               "algorithm": m, "above": 0.1, "regimes": [regime]}
              for m, regime in (("FedSGD", "one"), ("FedAvg", "two"))]
    doc = {"title": "t", "paper": "p", "claims": claims,
           "regimes": [{"name": "one", "title": "1", "tune": "one-tune.yaml"},
                       {"name": "two", "title": "2", "tune": "two-tune.yaml"}]}
    path = tmp_path / "scoped.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert set(load_reproduction(str(path)).tunes) == {"one", "two"}
    claims[1]["regimes"] = ["one", "two"]  # FedAvg is not tuned in regime one
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(UserError, match="'FedAvg' is not tuned by one-tune.yaml"):
        load_reproduction(str(path))
