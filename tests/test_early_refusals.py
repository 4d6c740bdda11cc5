"""Issue 34: what would exhaust the machine or fail late is refused early, in one line. Every
refusal here is exit code 2 and exactly one ``error:`` line naming the file or flag and the fix,
no traceback, and nothing written: a sweep grid of 10^8 points (counted, never built), a tune
study whose runs ``validate`` refuses, a reproduction file given to ``validate`` (recognised,
not misread as a scenario), ``crossover``'s ranges, points and damaged manifests, ``compare
--html`` with several folders, and a ``partition.rare_classes`` (or a stratified split) that the
data set cannot hold."""

from __future__ import annotations

import pytest

from wirelessfl.errors import UserError
from wirelessfl.pipeline.memory import check_memory_from_scenario
from wirelessfl.scenario.loader import load_scenario


def _one_error(code: int, out: str, err: str, *fragments: str) -> None:
    assert code == 2, (code, err)
    assert out == "" and err.count("\n") == 1 and err.startswith("error: "), err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in err, err


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
