"""A plugin algorithm written against the contract only passes the package's conformance suite
(``wirelessfl.testing.check_algorithm``), as its author would check it in their own tests; and
the suite can fail: broken variants of the same plugin fail it, naming the check."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
import yaml

from tests import plugin_algorithm
from tests.plugin_algorithm import MomentumSGD
from wirelessfl.contract.payload import Payload
from wirelessfl.plugins import ALGORITHMS
from wirelessfl.scenario.loader import scenario_from_document
from wirelessfl.testing import (
    check_algorithm,
    check_declared_payloads,
    check_lost_uploads_keep_initial_model,
    default_scenario,
)

# What the plugin may import of the package: the algorithm base and the contract.
ALLOWED = ("wirelessfl.algorithms.base", "wirelessfl.contract")
FORBIDDEN = ("wirelessfl.engine", "wirelessfl.pipeline", "wirelessfl.scenario")
THIRD_PARTY = {"numpy", "torch", "pydantic"}


def imported_modules(path: Path) -> list[str]:
    """Every module an import statement of ``path`` names, wherever it is written."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"relative import at line {node.lineno}"
            found.append(node.module)
    return found


def within(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def test_plugin_imports_only_the_contract():
    modules = imported_modules(Path(plugin_algorithm.__file__))
    ours = [m for m in modules if within(m, ("wirelessfl",))]
    assert ours and not [m for m in ours if within(m, FORBIDDEN)]
    assert all(within(m, ALLOWED) for m in ours), ours
    others = {m.split(".")[0] for m in modules if m not in ours}
    assert others - sys.stdlib_module_names - {"__future__"} == THIRD_PARTY


def test_plugin_passes_the_suite():
    """Unregistered, by its class alone; registered for the checks only."""
    check_algorithm(MomentumSGD)
    assert MomentumSGD.name not in ALGORITHMS.names()


def test_plugin_passes_with_parameters_of_its_own():
    check_algorithm(MomentumSGD, params={"lr": 0.2, "momentum": 0.9, "batch_size": 5})


def test_the_author_may_choose_the_scenario(tmp_path):
    """``scenario=``: the default document changed (four devices), as a dict, a YAML file and a
    ``Scenario``; the checks replace its algorithms by the one under check."""
    doc = default_scenario(MomentumSGD)
    doc["population"]["num_devices"] = 4
    path = tmp_path / "four.yaml"
    path.write_text(yaml.safe_dump(doc))
    built = scenario_from_document({**doc, "algorithms": [{"name": "fedsgd"}]}, "four.yaml")
    for scenario in (doc, path, str(path), built):
        check_declared_payloads(MomentumSGD, scenario=scenario)


def test_the_tutorial_algorithm_passes_as_the_docs_show(monkeypatch):
    """docs/plugins.md, "Test your algorithm": the tutorial's FedAvgM (examples/), as written."""
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "examples"))
    from my_algorithm import FedAvgM

    check_algorithm(FedAvgM)
    check_algorithm(FedAvgM, params={"momentum": 0.5, "lr": 0.02})


class ForgetsScaleHeader(MomentumSGD):
    """Declares d values of M bits each way, forgetting the 32-bit scale its packets carry."""

    name = "plugin-forgets-header"

    @classmethod
    def declared_payloads(cls, d: int, bits: int, participants: int = 1
                          ) -> tuple[Payload, Payload]:
        return Payload(d, bits), Payload(d, bits)


class AveragesLostUploads(MomentumSGD):
    """Averages every device that took part, whether its upload arrived or not."""

    name = "plugin-averages-lost"

    def heard(self, result):
        return result.device_indices(result.active)


@pytest.mark.parametrize(("cls", "check"), [
    (ForgetsScaleHeader, "check_declared_payloads"),
    (AveragesLostUploads, "check_lost_uploads_never_reach_the_model"),
])
def test_a_broken_plugin_fails_naming_the_check(cls, check):
    with pytest.raises(AssertionError, match=rf"^{check} failed for algorithm '{cls.name}' "):
        check_algorithm(cls)
    assert cls.name not in ALGORITHMS.names()


def test_each_check_fails_alone():
    """The checks are public functions: each reports its own failure."""
    with pytest.raises(AssertionError, match=r"check_declared_payloads failed .*uplink bits per "
                                             r"device 41728 on every device, declared 10400 x 4 "
                                             r"rounds \+ 0 = 41600 each"):
        check_declared_payloads(ForgetsScaleHeader)
    with pytest.raises(AssertionError, match=r"check_lost_uploads_keep_initial_model failed .*"
                                             r"the model moved without a delivered upload"):
        check_lost_uploads_keep_initial_model(AveragesLostUploads)


def test_not_an_algorithm_fails_the_declarations():
    class Stranger:
        name = "stranger"

    with pytest.raises(AssertionError, match=r"check_declarations failed for algorithm "
                                             r"'stranger' .*not a subclass of"):
        check_algorithm(Stranger)
