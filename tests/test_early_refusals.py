"""Issue 34: what would exhaust the machine or fail late is refused early, in one line. Every
refusal here is exit code 2 and exactly one ``error:`` line naming the file or flag and the fix,
no traceback, and nothing written: a sweep grid of 10^8 points (counted, never built), a tune
study whose runs ``validate`` refuses, a reproduction file given to ``validate`` (recognised,
not misread as a scenario), ``crossover``'s ranges, points and damaged manifests, ``compare
--html`` with several folders, and a ``partition.rare_classes`` (or a stratified split) that the
data set cannot hold."""

from __future__ import annotations

import pytest

from tests.conftest import cli
from wirelessfl.errors import UserError
from wirelessfl.pipeline.memory import check_memory_from_scenario
from wirelessfl.pipeline.preflight import check_runnable
from wirelessfl.scenario.loader import load_scenario


def _one_error(code: int, out: str, err: str, *fragments: str) -> None:
    assert code == 2, (code, err)
    assert out == "" and err.count("\n") == 1 and err.startswith("error: "), err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in err, err


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
