"""Every registered algorithm, the same checks (scikit-learn's estimator-suite idea): determinism,
declared payloads equal the ledger's bits, energies add up, lost packets change nothing, clean
parameter errors. The checks live in the package (``wirelessfl.testing``), so that a plugin's
author runs the very same suite from their own tests; here they run over every built-in, one
test per (algorithm, check). A new algorithm gets these by registering."""

from __future__ import annotations

import pytest

from tests.conftest import ALGORITHM_NEEDS, COMPOSITIONAL_ALGORITHMS, MSA_ALGORITHMS
from wirelessfl import testing
from wirelessfl.plugins import ALGORITHMS
from wirelessfl.testing import algorithm_checks, default_scenario, needed_capability

REGISTRY = ALGORITHMS.load_builtins()
NAMES = sorted(REGISTRY)

# fedmsa with every client running the local steps, so that each device's traffic is the
# declared per-device payload.
EXTRA = {"fedmsa": {"local_clients": 8}}


def params(name: str) -> dict:
    """What a built-in needs on the small scenarios (conftest's ALGORITHM_NEEDS), and EXTRA."""
    return {**ALGORITHM_NEEDS.get(name, {}), **EXTRA.get(name, {})}


CASES = [pytest.param(name, check, id=f"{name}-{check.__name__}")
         for name in NAMES for check in algorithm_checks(REGISTRY[name])]


@pytest.mark.parametrize(("name", "check"), CASES)
def test_conformance(name, check):
    check(REGISTRY[name], params(name))


def test_every_check_runs_on_some_algorithm():
    """No public check of the suite is left out of ``algorithm_checks`` for every built-in."""
    public = {name for name in testing.__all__
              if name.startswith("check_") and name != "check_algorithm"}
    used = {check.__name__ for name in NAMES for check in algorithm_checks(REGISTRY[name])}
    assert used == public


def test_checks_follow_the_declarations():
    """Only an algorithm whose base station learns from its own data may move the model while
    every upload is lost (ZO-HFL), and one off the air has no uploads to lose (centralized
    SGD); every other one is held to theta_0."""
    exempt = {name for name in NAMES
              if testing.check_lost_uploads_keep_initial_model
              not in list(algorithm_checks(REGISTRY[name]))}
    off_air = {name for name in NAMES
               if testing.check_off_air in list(algorithm_checks(REGISTRY[name]))}
    assert off_air == {name for name in NAMES if REGISTRY[name].uploads_per_round == 0} == {
        "centralized-sgd", "centralized-stsa"}  # they send nothing: no uploads to lose
    assert exempt == {name for name in NAMES if REGISTRY[name].server_learns} | off_air == {
        "zo-hfl", "centralized-sgd", "centralized-stsa"}


def test_scenario_follows_the_needed_capability():
    """The suite runs the multi-sequence and bilevel methods on the small bilevel quadratic,
    centralized SGD on the small compositional problem and every other one on the digits
    classifier, as conftest's MSA_ALGORITHMS has it."""
    needing = {name for name in NAMES if needed_capability(REGISTRY[name]) is not None}
    assert needing == MSA_ALGORITHMS | COMPOSITIONAL_ALGORITHMS
    for name in NAMES:
        doc = default_scenario(REGISTRY[name])
        if name in COMPOSITIONAL_ALGORITHMS:
            assert doc["problem"]["name"] == "risk-averse-mco" and "data" not in doc
        elif name in MSA_ALGORITHMS:
            assert doc["problem"]["name"] == "bilevel-quadratic" and "data" not in doc
        else:
            assert "problem" not in doc and doc["data"]["name"] == "digits"
