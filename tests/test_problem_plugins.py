"""A learning problem from outside the package (tests/plugin_problem.py) is validated, checked,
estimated and run exactly like a built-in, named by a 'module:attribute' reference or registered
in-process; its section is validated by its own Config.

Truth: on f_i(x) = s/2 ||x - b_i||^2 every client has the Hessian s I, so FedAvg's K local steps
of size lr take device i from x to b_i + (1 - lr s)^K (x - b_i) and their mean to
x* + (1 - lr s)^K (x - x*) with x* = mean_i b_i: from x_0 = 0 the gap after r rounds is exactly
f(x_r) - f* = s/2 (1 - lr s)^(2 K r) ||x*||^2 (float32 models: relative error ~1e-6 [D]).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tests.conftest import small_doc
from tests.plugin_problem import SPEC, minimisers
from wirelessfl.errors import UserError
from wirelessfl.pipeline.memory import estimate_memory
from wirelessfl.pipeline.preflight import check_runnable
from wirelessfl.pipeline.runner import run_scenario
from wirelessfl.plugins import PROBLEMS
from wirelessfl.scenario.loader import resolved_document, scenario_from_document

REFERENCE = "tests.plugin_problem:SPEC"
RELIABLE = {"profile": "seed002-pinned", "uplink": {"delivery_probability": 1.0}}
LR, STEPS, ROUNDS, SCALE = 0.1, 2, 6, 2.0


@pytest.fixture(autouse=True)
def _references_allowed(monkeypatch):
    """The problem is named by reference here, which needs the opt-in (docs/plugins.md)."""
    monkeypatch.setenv("WIRELESSFL_ALLOW_REFERENCES", "1")


def plugin_doc(problem: dict, **changes) -> dict:
    doc = small_doc(channel=RELIABLE, quantization_bits=32, problem=problem,
                    algorithms=[{"name": "fedavg", "rounds": ROUNDS, "eval_every": 1, "lr": LR,
                                 "local_steps": STEPS, "batch_size": 1}], **changes)
    for key in ("data", "model", "population", "partition"):
        if key not in changes:
            doc.pop(key, None)
    return doc


def test_a_referenced_problem_validates_checks_and_estimates_like_a_builtin():
    sc = scenario_from_document(plugin_doc({"name": REFERENCE, "dimension": 5}), "p.yaml")
    assert type(sc.problem).__name__ == "ScaledQuadraticConfig"
    assert sc.problem.clients == 3 and sc.population.num_devices == 3  # its fit rule ran
    assert resolved_document(sc)["problem"] == {"name": REFERENCE, "clients": 3, "dimension": 5,
                                                "scale": 2.0}
    again = scenario_from_document(resolved_document(sc), "manifest")  # reloads as recorded
    assert resolved_document(again) == resolved_document(sc)
    assert check_runnable(sc) == []
    assert estimate_memory(sc).d == 5


@pytest.mark.parametrize("name", [REFERENCE, "scaled-quadratic"])
def test_fedavg_on_the_plugin_problem_follows_its_closed_form(name, tmp_path):
    if name == "scaled-quadratic":
        PROBLEMS.register(SPEC)
    try:
        sc = scenario_from_document(plugin_doc({"name": name, "scale": SCALE}), "p.yaml")
        check_runnable(sc)
        status, _ = run_scenario(sc, tmp_path / "run", warn=lambda text: None)
    finally:
        PROBLEMS.unregister("scaled-quadratic")
    assert status == "complete"
    rows = pd.read_parquet(tmp_path / "run" / "rounds.parquet").sort_values("round")
    x_star = minimisers(sc.seed, 3, 4).mean(0)
    r = rows["round"].to_numpy()
    expected = SCALE / 2 * (1 - LR * SCALE) ** (2 * STEPS * r) * float(x_star @ x_star)
    np.testing.assert_allclose(rows.suboptimality, expected, rtol=1e-5)
    assert rows.suboptimality.iloc[-1] < 1e-2 * rows.suboptimality.iloc[0]


def test_its_section_is_validated_by_its_own_config():
    with pytest.raises(UserError, match=r"p\.yaml: problem\.bogus: unknown key") as err:
        scenario_from_document(plugin_doc({"name": REFERENCE, "bogus": 1}), "p.yaml")
    assert "\n" not in str(err.value)
    with pytest.raises(UserError, match=r"problem: 'dimension_x' is only read by problem "
                                        r"'bilevel-quadratic' but name is "):
        scenario_from_document(plugin_doc({"name": REFERENCE, "dimension_x": 2}), "p.yaml")
    with pytest.raises(UserError, match=r"problem\.scale: Input should be greater than 0"):
        scenario_from_document(plugin_doc({"name": REFERENCE, "scale": -1}), "p.yaml")
    with pytest.raises(UserError, match=r"model: not read by problem"):
        scenario_from_document(plugin_doc({"name": REFERENCE}, model={"name": "mlp",
                                                                      "hidden": [8]}), "p.yaml")


def test_a_reference_to_something_else_is_one_clean_line():
    for name, message in (("tests.plugin_problem:ScaledQuadraticConfig", "is not a problem"),
                          ("tests.no_such_module:SPEC", "cannot import module"),
                          ("tests.plugin_problem:NOPE", "has no attribute")):
        with pytest.raises(UserError, match=rf"p\.yaml: problem\.name: .*{message}") as err:
            scenario_from_document(plugin_doc({"name": name}), "p.yaml")
        assert "\n" not in str(err.value)
