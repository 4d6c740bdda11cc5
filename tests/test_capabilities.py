"""Algorithms state what they need (issue 33): the problem capability, their own scenario
constraints, the problem constants, a server loss and their round's memory are hooks of each
algorithm's class, and nothing above the algorithms branches on which built-in it is. Each hook
is checked here against the rule it replaced, written out as the independent reference."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import small_scenario
from wirelessfl.algorithms.drift import Dane
from wirelessfl.algorithms.fedavg import FedAvg
from wirelessfl.contract.facts import (
    BILEVEL,
    MULTI_SEQUENCE,
    READS_DATA,
    SINGLE_LEVEL,
    ScenarioFacts,
    problem_capabilities,
)
from wirelessfl.contract.memory import RoundShape
from wirelessfl.errors import UserError
from wirelessfl.layers import violations
from wirelessfl.pipeline import preflight
from wirelessfl.plugins import ALGORITHMS, COMPUTE, PROBLEMS, problems_with

BUILTINS = ALGORITHMS.load_builtins()
PACKAGE = Path(__file__).resolve().parents[1] / "wirelessfl"


# ---- the round's memory: the rule pipeline/memory.py applied by module name before -------------
MIB = 2**20


def old_round_compute(module: str, batch: int, d: int, size: int, input_size: int,
                      activations: int, n: int, chunk: int, bits: int,
                      name: str = "") -> tuple[int, bool]:
    """pipeline/memory.py's round_compute as it was (commit 77d5785), by the class's module,
    with its constants written out: 48 B a quantised value, heap factor 104/64 below 32 MiB,
    3 row copies, 11 for FGDRO, 3 autograd copies of each activation, 4 B a float."""
    def on_heap(nbytes, block):
        return int(nbytes if block >= 32 * MIB else nbytes * 104 / 64)

    all_rows = module in ("wirelessfl.algorithms.drift", "wirelessfl.algorithms.fedmsa",
                          "wirelessfl.algorithms.fednest")
    samples = 4 * batch * (input_size + 3 * activations)
    if module == "wirelessfl.algorithms.over_the_air":
        # newer than the old rule, held to their own: AirComp is its digital parent (the
        # default) plus every asked device's vector at once, 1P-ZOFL DZOFL's forward pass
        if name.startswith("aircomp"):
            default = old_round_compute("wirelessfl.algorithms.fedavg", batch, d, size,
                                        input_size, activations, n, chunk, bits)
            return default[0] + n * d * size, True
        module = "wirelessfl.algorithms.dzofl"
    if module == "wirelessfl.algorithms.dzofl":
        return chunk * 4 * batch * (input_size + activations), True
    if module == "wirelessfl.algorithms.fgdro":
        return chunk * samples + on_heap(11 * chunk * d * size, chunk * d * size), True
    rows = n if all_rows else chunk
    per_value = 2 * size
    if bits < 32:
        per_value = on_heap(48, rows * d * 8)
    if all_rows:
        return rows * d * per_value, False
    return chunk * (samples + 3 * d * size) + rows * d * per_value, True


# (d, itemsize, input size, activations a sample, n, chunk, bits): a classifier on digits, a
# problem without data in float64, a large model whose blocks are mmapped, full precision.
SHAPES = [(650, 4, 64, 74, 8, 8, 16), (650, 4, 64, 74, 400, 37, 16), (11, 8, 0, 0, 50, 50, 16),
          (1_000_000, 4, 784, 2000, 1000, 3, 8), (1_000_000, 4, 784, 2000, 1000, 5, 32),
          (20_000, 8, 0, 0, 300, 300, 1), (650, 4, 64, 74, 8, 1, 32)]


@pytest.mark.parametrize("name", list(BUILTINS))
@pytest.mark.parametrize("shape", SHAPES)
def test_each_algorithm_states_the_memory_the_old_rule_gave(name, shape):
    cls = BUILTINS[name]
    d, size, input_size, activations, n, chunk, bits = shape
    for batch in (1, 10, 32):
        params = cls.Params(name=name, batch_size=batch)
        stated = cls.round_memory(params, RoundShape(
            d=d, itemsize=size, batch=batch, input_size=input_size,
            activations_per_sample=activations, devices=n, chunk=chunk, bits=bits))
        assert stated == old_round_compute(cls.__module__, batch, d, size, input_size,
                                           activations, n, chunk, bits, name)
        assert type(stated[0]) is int


def test_a_subclass_inherits_its_parents_memory_rule():
    """Where the module-name rule sized a plugin subclass of a drift method by the default, the
    hook sizes it as its parent: all N rows quantised at once, not chunked."""
    class MyDane(Dane):
        name = "my-dane"

    class MyFedAvg(FedAvg):
        name = "my-fedavg"

    shape = RoundShape(d=650, itemsize=4, batch=10, input_size=64, activations_per_sample=74,
                       devices=400, chunk=37, bits=16)
    assert MyDane.round_memory(MyDane.Params(name="my-dane"), shape) \
        == Dane.round_memory(Dane.Params(name="dane"), shape)
    assert MyDane.round_memory(MyDane.Params(name="my-dane"), shape)[1] is False
    assert MyFedAvg.round_memory(MyFedAvg.Params(name="my-fedavg"), shape) \
        == FedAvg.round_memory(FedAvg.Params(name="fedavg"), shape)


# ---- the problem an algorithm runs on: the rule preflight applied by class before -------------
def old_refusal(name: str, spec, where: str) -> str | None:
    """pipeline/preflight.py's capability rule as it was: FedNest needs a bilevel problem,
    FedMSA a multi-sequence one, every other algorithm a single-level one; the same texts."""
    problem = spec.name
    if name in ("centralized-sgd", "centralized-stsa"):  # added with the capability: the
        return None if spec.compositional else (                # generic refusal
            f"{where}: {name} needs a problem with capability 'compositional' "
            f"(problem.name: {', '.join(problems_with('compositional'))}); this scenario's "
            f"problem is '{problem}'")
    if name == "fednest" and not spec.bilevel:
        return (f"{where}: fednest needs a bilevel problem (problem.name: "
                f"{' or '.join(problems_with('bilevel'))}); this scenario's problem is "
                f"'{problem}'")
    if name == "fedmsa" and not spec.multi_sequence:
        return (f"{where}: fedmsa needs a multi-sequence problem (problem.name: "
                f"{', '.join(problems_with('multi_sequence'))}); this scenario's problem "
                f"is single-level ('{problem}')")
    if name not in ("fedmsa", "fednest", "centralized-sgd", "centralized-stsa") \
            and spec.multi_sequence:
        return (f"{where}: problem '{problem}' is a multi-sequence (bilevel) problem: "
                "it has no single loss f_i to take gradients of; run it with algorithm "
                "'fedmsa' (or 'fednest'), or use a single-level problem (classification, "
                "quadratic, logistic)")
    return None


@pytest.mark.parametrize("name", list(BUILTINS))
def test_each_algorithm_needs_the_problem_it_needed(name):
    cls, where = BUILTINS[name], f"algorithms '{name}'"
    for problem, spec in PROBLEMS.load_builtins().items():
        capabilities = problem_capabilities({"multi_sequence": spec.multi_sequence,
                                             "bilevel": spec.bilevel,
                                             "reads_data": spec.reads_data,
                                             "compositional": spec.compositional})
        refused = None
        if cls.problem_needs not in capabilities:
            refused = preflight._missing_capability(cls.name, cls.problem_needs, where, problem)
        assert refused == old_refusal(name, spec, where), (name, problem)


def test_problem_capabilities():
    assert problem_capabilities({}) == {SINGLE_LEVEL}
    assert problem_capabilities({"reads_data": True}) == {SINGLE_LEVEL, READS_DATA}
    assert problem_capabilities({"multi_sequence": True}) == {MULTI_SEQUENCE}
    assert problem_capabilities({"multi_sequence": True, "bilevel": True}) \
        == {MULTI_SEQUENCE, BILEVEL}


def test_a_capability_no_builtin_algorithm_needs_is_refused_by_name():
    """A plugin that needs a capability gets the same kind of message, listing the problems
    that have it."""
    text = preflight._missing_capability("my-algo", READS_DATA, "algorithms 'x'", "quadratic")
    assert text == (f"algorithms 'x': my-algo needs a problem with capability 'reads_data' "
                    f"(problem.name: {', '.join(problems_with('reads_data'))}); this "
                    "scenario's problem is 'quadratic'")


def facts(n: int, constants=None, server_loss=False) -> ScenarioFacts:
    return ScenarioFacts(num_devices=n, problem="quadratic", capabilities=frozenset(
        {SINGLE_LEVEL}), constants=constants, server_loss=server_loss)


def test_scenario_constraints_are_the_algorithms_own():
    fedmsa, cvar = BUILTINS["fedmsa"], BUILTINS["fgdro-cvar"]
    assert fedmsa.check_scenario(fedmsa.Params(name="fedmsa", local_clients=6), facts(5)) == (
        "algorithms 'fedmsa': local_clients (6) exceeds the 5 clients; set local_clients <= 5")
    assert fedmsa.check_scenario(fedmsa.Params(name="fedmsa", local_clients=5), facts(5)) is None
    assert cvar.check_scenario(cvar.Params(name="fgdro-cvar", label="CVaR", k=9), facts(8)) == (
        "CVaR: k = 9 exceeds the 8 devices (population.num_devices); choose k between 1 and 8")
    assert cvar.check_scenario(cvar.Params(name="fgdro-cvar", k=8), facts(8)) is None
    assert cvar.check_scenario(cvar.Params(name="fgdro-cvar"), facts(1)) is None  # default K
    for name, cls in BUILTINS.items():
        if name not in ("fedmsa", "fgdro-cvar"):
            assert cls.check_scenario(cls.Params(name=name), facts(1)) is None, name


def test_constants_and_server_loss_are_hooks():
    gd, fedavg, zo = BUILTINS["gd"], BUILTINS["fedavg"], BUILTINS["zo-hfl"]
    with pytest.raises(UserError, match="lr defaults to 1/L, but this problem does not know L"):
        gd.check_constants(gd.Params(name="gd"), frozenset({"mu"}))
    gd.check_constants(gd.Params(name="gd"), frozenset({"L"}))
    gd.check_constants(gd.Params(name="gd", lr=0.1), frozenset())
    fedavg.check_constants(fedavg.Params(name="fedavg"), frozenset())  # reads no constant
    assert zo.needs_server_loss(zo.Params(name="zo-hfl"))
    assert fedavg.needs_server_loss(fedavg.Params(name="fedavg", server_data=True))
    assert not fedavg.needs_server_loss(fedavg.Params(name="fedavg"))
    for name, cls in BUILTINS.items():  # the old rule: server_learns or a server_data set true
        params = cls.Params(name=name)
        assert cls.needs_server_loss(params) == bool(
            cls.server_learns or getattr(params, "server_data", False)), name


# ---- the registry's kind checks, and no upward import ------------------------------------------
def test_every_builtin_passes_its_kinds_check():
    """One check for every part: the built-ins pass it, as plugins must."""
    for registry in (ALGORITHMS, COMPUTE, PROBLEMS):
        for name, obj in registry.load_builtins().items():
            assert registry._check(obj) is None, (registry.kind, name)
    assert "is not a compute model" in COMPUTE._check(int)


def test_a_compute_model_is_a_profile_energy_compute_can_price():
    """Priced by its own pass_costs, or by energy/compute.py's table for a tag its ``model``
    field alone admits; a profile whose tag can be anything and has no pass_costs is refused
    (its passes would have no price)."""
    from typing import Literal

    from wirelessfl.energy.profile import CmosProfile, EnergyProfile

    class NoPrice(EnergyProfile):
        pass

    class Priced(EnergyProfile):
        def pass_costs(self, model, batch, bits):
            return 0.0, 0.0, 0.0, 0.0

    class FixedCmos(CmosProfile):
        model: Literal["cmos"] = "cmos"

    assert "is not a compute model" in COMPUTE._check(NoPrice)
    assert "is not a compute model" in COMPUTE._check(EnergyProfile)
    assert COMPUTE._check(Priced) is None
    assert COMPUTE._check(FixedCmos) is None
    assert "is not an algorithm" in ALGORITHMS._check(int)
    assert "is not a problem" in PROBLEMS._check(int)


def test_the_registry_imports_nothing_of_the_package_but_its_errors():
    tree = ast.parse((PACKAGE / "plugins.py").read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    imported |= {a.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                 for a in node.names}
    assert {m for m in imported if m and m.startswith("wirelessfl")} == {"wirelessfl.errors"}


def test_no_layer_violation_in_the_checks_that_were_special_cases():
    found = [line for line in violations(PACKAGE)
             if line.startswith(("wirelessfl/plugins.py", "wirelessfl/pipeline/preflight.py",
                                 "wirelessfl/pipeline/memory.py", "wirelessfl/contract/"))]
    assert found == []


class _Superposing(FedAvg):
    """FedAvg's round, declared as an over-the-air method: preflight must refuse it before
    anything runs on a network that cannot superpose."""

    name = "fedavg-air"
    air = "superposition"


def test_an_algorithm_that_needs_superposition_is_refused_where_the_network_cannot(monkeypatch):
    ALGORITHMS.register(_Superposing)
    try:
        sc = small_scenario(algorithms=[{"name": "fedavg-air", "rounds": 1}])
        assert preflight.check_runnable(sc) == []  # both engines implement superpose

        class PacketsOnly:  # a network of the first way only (contract/port.py)
            def collect(self, cost, payload, active=None):
                yield from ()

        monkeypatch.setitem(preflight.ENGINES, "vectorized", PacketsOnly)
        with pytest.raises(UserError, match="sends its uploads by superposition .* engine.mode "
                                            "'vectorized' does not simulate"):
            preflight.check_runnable(sc)
        monkeypatch.setattr(_Superposing, "air", "smoke-signals")
        with pytest.raises(UserError, match="declares air = 'smoke-signals'"):
            preflight.check_runnable(sc)
    finally:
        ALGORITHMS.unregister("fedavg-air")
    assert FedAvg.air == "packets"
