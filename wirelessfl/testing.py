"""The algorithm conformance suite: one set of checks that every algorithm must pass, built-in or
plugin (scikit-learn's ``check_estimator`` is the model: one shared suite, the checks chosen by
what the algorithm declares).

``check_algorithm(MyAlgorithm)`` runs them all on a small scenario that suits the algorithm and
raises ``AssertionError`` on the first failure, naming the check and the algorithm; the checks
are also public functions of their own (``check_declared_payloads(MyAlgorithm)``, ...) and
``algorithm_checks(cls)`` lists those that apply, so that a test suite can parametrize over
(algorithm, check) and report each alone. ``tests/test_conformance.py`` runs them over every
built-in; a plugin author calls them from their own tests (docs/plugins.md, "Test your
algorithm").

What is checked, and why (each check's docstring says more):

* ``check_declarations``: the class is an algorithm the registry takes (a subclass of
  ``Algorithm`` with a ``name``, a ``Params`` model and its own ``round`` and
  ``declared_payloads``);
* ``check_clean_parameter_errors``: bad parameters are one clean ``UserError`` naming the key;
* ``check_deterministic``: the same scenario and seed give the same rows;
* ``check_declared_payloads``: the bits and packets the engine's ledger counts equal what the
  algorithm declares (``declared_payloads``, ``initial_payloads``, ``uploads_per_round``), at a
  wide and a narrow quantisation (an algorithm that draws its own devices, ``samples_devices``:
  each device's traffic in whole packets of its ``declared_phases``);
* ``check_energy_accounting``: energies are non-negative and add up (compute forward +
  backward, uplink, downlink; devices + base station, whose draw is its transmit power);
* ``check_lost_uploads_never_reach_the_model``: with every upload lost, uplink energy is still
  spent, nothing is delivered and the trajectory does not depend on the devices' data;
* ``check_lost_uploads_keep_initial_model`` (not for an algorithm whose base station learns from
  data of its own, ``server_learns``): with every upload lost the model stays theta_0.

The scenario: ``default_scenario(cls)``, eight devices of the seed-002 cell for a few rounds, on
the problem the algorithm runs on (``needed_capability``): the digits classifier (logistic
regression) for single-level methods, the small bilevel quadratic for methods that need a
multi-sequence or bilevel problem. ``params`` (the algorithm's keys, as a scenario entry holds
them) and ``scenario`` (a document, a file or a ``Scenario`` of your own) change either; each
check then sets only what it is about (the channel, the loss probability, the bits).
"""

from __future__ import annotations

import copy
import itertools
import os
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from wirelessfl.algorithms.base import Algorithm, AlgorithmParams
from wirelessfl.channel.analog import analog_airtime_s
from wirelessfl.contract.facts import SINGLE_LEVEL
from wirelessfl.engine.ledger import KIND_INDEX
from wirelessfl.errors import UserError
from wirelessfl.pipeline.build import World, build_world
from wirelessfl.pipeline.simulation import AlgorithmRun, run_algorithm
from wirelessfl.plugins import ALGORITHMS, problem_spec
from wirelessfl.scenario.loader import (
    read_scenario_document,
    resolved_document,
    scenario_from_document,
)
from wirelessfl.scenario.schema import Scenario

__all__ = [
    "PAYLOAD_BITS",
    "ROUNDS",
    "Check",
    "ScenarioSource",
    "algorithm_checks",
    "check_algorithm",
    "check_clean_parameter_errors",
    "check_declarations",
    "check_declared_payloads",
    "check_deterministic",
    "check_energy_accounting",
    "check_lost_uploads_keep_initial_model",
    "check_lost_uploads_never_reach_the_model",
    "check_off_air",
    "default_scenario",
    "needed_capability",
]

# Rounds each check runs (every one evaluated): enough for per-round sums to be tested, few
# enough that an algorithm's whole suite takes well under a second or two of CPU.
ROUNDS = 4
# Bits per value of the payload check: the default width and a narrow one, where per-vector
# scale headers and scalar formats differ from full precision.
PAYLOAD_BITS = (16, 4)
# The source named in messages about the default scenario.
SOURCE = "conformance.yaml"

# Eight devices of the seed-002 cell and accelerator (tests/conftest.py's small scenario).
_BASE: dict[str, Any] = {
    "name": "conformance",
    "seed": 3,
    "channel": "seed002-cell",
    "energy": "seed002-accelerator",
    "population": {"num_devices": 8},
    "quantization_bits": 16,
    "target_accuracy": 0.5,
}
# Single-level methods: logistic regression on digits, the base station keeping 30 % of the
# samples so that a method that also learns from its own (``server_learns``, ``server_data``)
# has some.
_CLASSIFIER: dict[str, Any] = {"data": {"name": "digits", "server_fraction": 0.3},
                               "model": {"name": "logistic"}}
# Problems without data for methods that need a capability, in the order they are tried:
# fedmsa.md Sec. 5.1's quadratic, small (one client per device).
_SMALL_PROBLEMS: tuple[dict[str, Any], ...] = (
    {"name": "bilevel-quadratic", "dimension_x": 3, "dimension_w": 4},
    {"name": "risk-averse-mco", "dimension": 3, "samples": 40, "sample_batch": 10},
)

Check = Callable[..., None]
# What ``scenario=`` takes: a scenario document (dict), a YAML file or catalog name, a Scenario.
ScenarioSource = Mapping[str, Any] | str | os.PathLike | Scenario


# ---- which scenario ----------------------------------------------------------------------------
def needed_capability(cls: type) -> str | None:
    """The problem capability ``cls`` needs (``"multi_sequence"``, ``"bilevel"``; None: any
    single-level problem, e.g. a classifier), as the algorithm declares it
    (``Algorithm.problem_needs``, the declaration the pre-run checks read too)."""
    needs = getattr(cls, "problem_needs", SINGLE_LEVEL)
    return None if needs == SINGLE_LEVEL else needs


def default_scenario(cls: type) -> dict[str, Any]:
    """The small scenario document (without ``algorithms``) the checks run ``cls`` on: the digits
    classifier for a single-level method, else the first small problem whose registered
    ``ProblemSpec`` has the capability ``cls`` needs. A copy: change it and pass it back as
    ``scenario=``."""
    doc = copy.deepcopy(_BASE)
    capability = needed_capability(cls)
    if capability is None:
        return doc | copy.deepcopy(_CLASSIFIER)
    for problem in _SMALL_PROBLEMS:
        if getattr(problem_spec(problem["name"]), capability, False):
            return doc | {"problem": copy.deepcopy(problem)}
    raise ValueError(f"no small problem with the capability {capability!r} that "
                     f"{cls.__name__} needs; pass scenario= with a problem that has it")


def _document(cls: type, scenario: ScenarioSource | None
              ) -> tuple[dict[str, Any], str, Path | None]:
    """(document, source named in messages, folder its relative paths start from)."""
    if scenario is None:
        return default_scenario(cls), SOURCE, None
    if isinstance(scenario, Scenario):
        return resolved_document(scenario), f"scenario '{scenario.name}'", None
    if isinstance(scenario, Mapping):
        return copy.deepcopy(dict(scenario)), "<dict>", None
    path, doc = read_scenario_document(os.fspath(scenario))
    if not isinstance(doc, dict):
        raise UserError(f"{path}: a scenario must be a mapping of keys")
    return doc, str(path), path.parent


@contextmanager
def _registered(cls: type) -> Iterator[str]:
    """The name scenarios call ``cls`` by while the block runs: its own ``name`` when the
    registry already resolves that to ``cls`` (a built-in, an entry point, a registered class);
    else ``cls`` is registered for the block, under its ``name`` when that is free, otherwise
    under ``<name>-under-check``, and forgotten afterwards."""
    name = cls.name
    try:
        found = ALGORITHMS.get(name)
    except UserError:
        found = None
    if found is cls:
        yield name
        return
    if found is not None:
        name = f"{name}-under-check"
    ALGORITHMS.register(cls, name)
    try:
        yield name
    finally:
        ALGORITHMS.unregister(name)


class _Subject:
    """One algorithm under check: its class, parameters and scenario document; builds the
    scenario a check asks for (the document, the algorithm's entry, ``overrides``) and runs it."""

    def __init__(self, cls: type, name: str, params: Mapping[str, Any],
                 scenario: ScenarioSource | None):
        self.cls, self.name, self.params = cls, name, dict(params)
        self.doc, self.source, self.base_dir = _document(cls, scenario)

    def entry(self, **changes: Any) -> dict[str, Any]:
        """The scenario's algorithm entry: ROUNDS rounds, each evaluated, then the author's
        ``params``, then ``changes`` (what a check is about)."""
        return {"rounds": ROUNDS, "eval_every": 1, **self.params, **changes, "name": self.name}

    def scenario(self, *overrides: str, **changes: Any) -> Scenario:
        doc = {**self.doc, "algorithms": [self.entry(**changes)]}
        return scenario_from_document(doc, self.source, list(overrides), self.base_dir)

    def run(self, *overrides: str, **changes: Any) -> tuple[Scenario, World, AlgorithmRun]:
        """Build and run the scenario; a run that does not complete fails the check."""
        sc = self.scenario(*overrides, **changes)
        world = build_world(sc)
        run = run_algorithm(world, sc.algorithms[0])
        if run.status != "complete":
            raise AssertionError(f"the run ended {run.status}: {run.message}") from run.error
        return sc, world, run


def _check(function: Callable[[_Subject], None]) -> Check:
    """A public check ``(cls, params=None, scenario=None) -> None`` from ``function(subject)``:
    any failure (an assertion, or an exception from the algorithm or its scenario) becomes one
    ``AssertionError`` naming the check and the algorithm, the cause chained."""
    def check(cls: type, params: Mapping[str, Any] | None = None,
              scenario: ScenarioSource | None = None) -> None:
        what = f"{function.__name__} failed for algorithm {_describe(cls)}"
        try:
            with _registered(cls) as name:
                function(_Subject(cls, name, params or {}, scenario))
        except Exception as err:  # every failure is reported as the check's
            detail = str(err) if isinstance(err, AssertionError) else \
                f"{type(err).__name__}: {err}"
            raise AssertionError(f"{what}: {detail}") from err

    # the check's own name and docstring, with the public signature (not ``subject``'s)
    for attribute in ("__name__", "__qualname__", "__doc__", "__module__"):
        setattr(check, attribute, getattr(function, attribute))
    return check


def _describe(cls: Any) -> str:
    name = getattr(cls, "name", None)
    where = f"{getattr(cls, '__module__', '?')}.{getattr(cls, '__qualname__', repr(cls))}"
    return f"{name!r} ({where})" if isinstance(name, str) else where


def _require(condition: bool, message: str) -> None:
    """``assert`` that survives ``python -O``."""
    if not condition:
        raise AssertionError(message)


# ---- the checks --------------------------------------------------------------------------------
def check_declarations(cls: type, params: Mapping[str, Any] | None = None,
                       scenario: ScenarioSource | None = None) -> None:
    """The class is an algorithm the registry takes and the other checks can read: a subclass of
    ``wirelessfl.algorithms.base.Algorithm`` with a ``name`` (a string), a ``Params`` that is
    an ``AlgorithmParams`` model, and its own ``round`` and ``declared_payloads``."""
    what = f"check_declarations failed for algorithm {_describe(cls)}"
    problems = []
    if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
        problems.append("it is not a subclass of wirelessfl.algorithms.base.Algorithm")
    else:
        if not (isinstance(getattr(cls, "name", None), str) and cls.name):
            problems.append("it has no 'name' (a class attribute: the name scenarios use)")
        if not (isinstance(cls.Params, type) and issubclass(cls.Params, AlgorithmParams)):
            problems.append("its Params is not a subclass of AlgorithmParams")
        if cls.round is Algorithm.round:
            problems.append("it does not define round(k)")
        declared = getattr(cls.declared_payloads, "__func__", cls.declared_payloads)
        if declared is Algorithm.declared_payloads.__func__:
            problems.append("it does not define declared_payloads (what crosses the air)")
    if problems:
        raise AssertionError(f"{what}: {'; '.join(problems)}")


# A bad value and an unknown key, and what the message of each must say.
_BAD_PARAMETERS = (
    ({"rounds": 0}, r"algorithms\[0\]\.rounds: Input should be greater than 0"),
    ({"no_such_parameter": 1}, r"algorithms\[0\]\.no_such_parameter: unknown key"),
)


@_check
def check_clean_parameter_errors(subject: _Subject) -> None:
    """A bad parameter value (``rounds: 0``) and an unknown key are each one ``UserError``
    naming the key (as ``wirelessfl validate`` prints it), not a traceback: the algorithm's
    ``Params`` keeps the base's rules and rejects keys it does not know."""
    for changes, pattern in _BAD_PARAMETERS:
        try:
            subject.scenario(**changes)
        except UserError as err:
            _require(re.search(pattern, str(err)) is not None,
                     f"{changes} gave the error {str(err)!r}, not one matching {pattern!r}")
        else:
            raise AssertionError(f"{changes} was accepted; expected a UserError matching "
                                 f"{pattern!r}")


@_check
def check_deterministic(subject: _Subject) -> None:
    """The same scenario run twice gives the same rows, bit for bit: every random draw comes from
    streams keyed by the scenario's seed (``keyed_generator``, ``device_uniform``, the
    algorithm's helpers), never from global state."""
    first = pd.DataFrame(subject.run()[2].rows)
    second = pd.DataFrame(subject.run()[2].rows)
    pd.testing.assert_frame_equal(first, second)


def _counts(values: np.ndarray) -> str:
    """Per-device counts for a message: the one value all devices share, or the list."""
    found = np.unique(values)
    if len(found) == 1:
        return f"{found[0]:g} on every device"
    return str([float(v) for v in values])


@_check
def check_declared_payloads(subject: _Subject) -> None:
    """On a lossless link with every device taking part (participation 1), the engine's ledger
    counts exactly what the algorithm declares: per device, ``declared_payloads``'s uplink and
    downlink bits each round plus ``initial_payloads``'s once, ``uploads_per_round`` delivered
    packets each round plus one for the initial exchange; at each of PAYLOAD_BITS.

    The declaration is the spec's statement of what crosses the air: a payload built in
    ``round`` that differs from it (a forgotten scale header, a second vector) fails here.

    An algorithm that draws its own devices each round (``samples_devices``: DRFA samples its
    clients from its mixture weights, with replacement) does not ask every device every round
    even at participation 1; it declares each upload phase (``declared_phases``) and is held to
    ``_check_sampled_payloads`` instead."""
    cls = subject.cls
    for bits in PAYLOAD_BITS:
        sc, world, run = subject.run("channel=seed002-pinned",
                                     "channel.uplink.delivery_probability=1.0",
                                     _ANALOG_ALL_SEND, f"quantization_bits={bits}",
                                     participation=1.0)
        params, n, led = sc.algorithms[0], world.num_devices, run.ledger
        rounds, m = params.rounds, int(params.bits)
        d = world.evaluator.d
        keywords = cls.declaration_keywords(params, world.evaluator)
        up, down = cls.declared_payloads(d, m, participants=n, **keywords)
        first = cls.initial_payloads(d, m)
        up0, down0, packets0 = (first[0].bits, first[1].bits, 1) if first else (0, 0, 0)
        at = f"at {m} bits"
        if getattr(cls, "samples_devices", False):
            phases = cls.declared_phases(d, m, participants=n, **keywords)
            _check_sampled_payloads(cls, led, rounds, (up, down), phases,
                                    (up0, down0, packets0), at)
            continue
        _require(led.bits_up.tolist() == [up.bits * rounds + up0] * n,
                 f"{at}: uplink bits per device {_counts(led.bits_up)}, declared "
                 f"{up.bits} x {rounds} rounds + {up0} = {up.bits * rounds + up0} each")
        _require(led.bits_down.tolist() == [down.bits * rounds + down0] * n,
                 f"{at}: downlink bits per device {_counts(led.bits_down)}, declared "
                 f"{down.bits} x {rounds} rounds + {down0} = {down.bits * rounds + down0} each")
        packets = cls.uploads_per_round * rounds + packets0
        _require(led.packets_delivered.tolist() == [packets] * n,
                 f"{at}: delivered packets per device {_counts(led.packets_delivered)}, "
                 f"declared uploads_per_round {cls.uploads_per_round} x {rounds} rounds + "
                 f"{packets0} = {packets} each")
        _require(led.exchanges == packets,
                 f"{at}: {led.exchanges} upload exchanges, declared {packets}")
        if getattr(cls, "air", "packets") == "superposition":  # channel uses, not bits
            on_air = run.ledger.busy_s[:, KIND_INDEX["uplink"]]
            phase = analog_airtime_s(up.values, sc.channel.uplink.bandwidth_hz,
                                     sc.channel.slot_s)
            _require(bool(np.all(on_air == phase * packets)),
                     f"{at}: analog uplink airtime per device {_counts(on_air)} s, declared "
                     f"{up.values} values a phase = {phase:g} s x {packets} phases")


def _check_sampled_payloads(cls: type, led, rounds: int, declared: tuple, phases: tuple,
                            initial: tuple[int, int, int], at: str) -> None:
    """``check_declared_payloads`` for an algorithm that draws its own devices
    (``samples_devices``), whose ``declared_phases(d, bits, participants)`` gives (the broadcast
    every device gets each round, ((uplink, downlink sent to each device asked before it, or
    None) of each of the ``uploads_per_round`` upload phases)). On the lossless link every
    device's ledger must be whole declared packets: counts n_j in 0..rounds of the phases it
    took part in with sum_j n_j its delivered packets, sum_j n_j up_j its uplink bits and
    rounds x broadcast + sum_j n_j down_j its downlink bits (plus ``initial_payloads``'s once);
    ``declared_payloads`` is what a device asked in every phase sends and receives; every phase
    of every round reached some device; ``uploads_per_round`` exchanges a round."""
    (up, down), (broadcast, steps), (up0, down0, packets0) = declared, phases, initial
    count = cls.uploads_per_round
    _require(len(steps) == count,
             f"{at}: declared_phases lists {len(steps)} upload phases, uploads_per_round "
             f"{count}")
    ups = [phase_up.bits for phase_up, _ in steps]
    downs = [phase_down.bits if phase_down is not None else 0 for _, phase_down in steps]
    _require(up.bits == sum(ups) and down.bits == broadcast.bits + sum(downs),
             f"{at}: declared_payloads ({up.bits} up, {down.bits} down) is not the sum of "
             f"declared_phases ({sum(ups)} up, {broadcast.bits} + {sum(downs)} down)")
    for i in range(led.num_devices):
        packets = int(led.packets_delivered[i]) - packets0
        bits_up, bits_down = led.bits_up[i] - up0, led.bits_down[i] - down0 - \
            broadcast.bits * rounds
        whole = [n for n in itertools.product(range(rounds + 1), repeat=count)
                 if sum(n) == packets and np.dot(n, ups) == bits_up
                 and np.dot(n, downs) == bits_down]
        _require(bool(whole),
                 f"{at}: device {i}'s ledger ({led.bits_up[i]:g} bits up, "
                 f"{led.bits_down[i]:g} down, {led.packets_delivered[i]} packets) is no whole "
                 f"number of the declared phases' packets (up {ups}, down {downs}, broadcast "
                 f"{broadcast.bits} x {rounds} rounds)")
    sent = int(led.packets_delivered.sum()) - packets0 * led.num_devices
    _require(sent >= count * rounds,
             f"{at}: {sent} packets delivered, fewer than one per phase of each round")
    _require(led.exchanges == count * rounds + packets0,
             f"{at}: {led.exchanges} upload exchanges, declared {count * rounds + packets0}")


@_check
def check_off_air(subject: _Subject) -> None:
    """A method that declares no uploads (``uploads_per_round`` 0: a centralized reference)
    uses neither the air nor the devices: no bits, no device or base-station energy, no
    simulated time, while its rounds still count its updates."""
    _, _, run = subject.run()
    rows = pd.DataFrame(run.rows)
    for column in ("energy_j", "energy_bs_j", "bits_up", "bits_down", "sim_time_s"):
        _require(bool((rows[column] == 0).all()), f"{column} is not 0 for a method off the air")
    _require(bool((np.diff(rows.local_steps) > 0).all()),
             "local_steps (its updates) does not rise every evaluated round")


@_check
def check_energy_accounting(subject: _Subject) -> None:
    """Energies are non-negative and add up: each device's, compute (forward + backward) +
    uplink + downlink per row, rising every round with the simulated time, the last row the
    ledger's total; the base station's, its draw (transmit power + circuit power) times its
    airtime (with ``channel.downlink.bs_power_model: earth``, EARTH's on-air draw times its
    airtime + its sleep draw times the rest of the simulated time), rising every round, and
    system = devices + base station."""
    sc, _, run = subject.run()
    rows = pd.DataFrame(run.rows)
    _require(bool((run.ledger.energy_j >= 0).all()), "a device's ledger energy is negative")
    np.testing.assert_allclose(rows.energy_j, rows.energy_compute_j + rows.energy_uplink_j
                               + rows.energy_downlink_j, rtol=1e-12,
                               err_msg="energy_j != compute + uplink + downlink")
    np.testing.assert_allclose(rows.energy_compute_j, rows.energy_compute_forward_j
                               + rows.energy_compute_backward_j, rtol=1e-12,
                               err_msg="energy_compute_j != forward + backward")
    _require(bool((np.diff(rows.energy_j) > 0).all() and (np.diff(rows.sim_time_s) > 0).all()),
             "energy_j or sim_time_s does not rise every evaluated round")
    np.testing.assert_allclose(rows.energy_j.iloc[-1], run.ledger.energy_j.sum(), rtol=1e-12,
                               err_msg="the last row's energy_j != the ledger's total")
    # the base station is on air every round (its transmit power x its airtime), kept beside
    # the devices' energy: system = devices + base station
    np.testing.assert_allclose(rows.energy_system_j, rows.energy_j + rows.energy_bs_j,
                               rtol=1e-15, err_msg="energy_system_j != devices + base station")
    _require(bool((np.diff(rows.energy_bs_j) > 0).all()
                  and (np.diff(rows.bs_airtime_s) > 0).all()),
             "the base station's energy or airtime does not rise every evaluated round")
    downlink = sc.channel.downlink
    if downlink.bs_power_model == "earth":  # EARTH: N_TRX (P_0 + Delta_p P_out) on air,
        e = downlink.earth                  # N_TRX P_sleep the rest of the simulated time
        p_out = 10 ** ((downlink.tx_power_dbm - 30) / 10)
        np.testing.assert_allclose(
            rows.energy_bs_j, e.n_trx * (e.p0_w + e.delta_p * p_out) * rows.bs_airtime_s
            + e.n_trx * e.p_sleep_w * (rows.sim_time_s - rows.bs_airtime_s), rtol=1e-12,
            err_msg="energy_bs_j != EARTH's on-air draw x airtime + sleep draw x the rest")
        return
    draw_w = 10 ** ((downlink.tx_power_dbm - 30) / 10) + downlink.circuit_power_w
    np.testing.assert_allclose(rows.energy_bs_j, draw_w * rows.bs_airtime_s, rtol=1e-12,
                               err_msg="energy_bs_j != (transmit + circuit power) x airtime")


# Every upload lost: the pinned channel (no fading) with a delivery probability of almost 0;
# on the analog uplink, a scheduling radius inside the cell's nearest device: nobody transmits.
_ALL_LOST = ("channel=seed002-pinned", "channel.uplink.delivery_probability=1e-12",
             "channel.uplink.analog={interior_radius_m: 1}")
# Every analog upload in the sum: a truncation threshold no Rayleigh gain falls below in any
# test's lifetime (-300 dB: P(silent) = 1e-30 per device and phase).
_ANALOG_ALL_SEND = "channel.uplink.analog={threshold_db: -300}"
# The other split of the devices' data the trajectory must not depend on.
_OTHER_SPLIT = "partition={scheme: dirichlet, alpha: 0.1}"


@_check
def check_lost_uploads_never_reach_the_model(subject: _Subject) -> None:
    """With every upload lost, nothing is delivered but uplink energy is still spent (devices
    transmit what is lost; on the analog uplink, where nobody is scheduled, none is: a silent
    device draws nothing), and nothing the devices hold reaches the global model: on a problem
    with data, the test loss does not change when the devices' data is split otherwise (a
    Dirichlet split), so only the base station's own data (``server_learns``) can move it."""
    sc, _, run = subject.run(*_ALL_LOST)
    rows = pd.DataFrame(run.rows)
    delivered = int(run.ledger.packets_delivered.sum())
    _require(delivered == 0, f"{delivered} packets delivered at delivery probability 1e-12")
    if getattr(subject.cls, "air", "packets") == "superposition":
        _require(bool(rows.energy_uplink_j.iloc[-1] == 0),
                 "uplink energy spent by analog devices that were all silent")
    else:
        _require(bool(rows.energy_uplink_j.iloc[-1] > 0),
                 "no uplink energy spent on the lost uploads")
    if problem_spec(sc.problem.name).reads_data:
        other = pd.DataFrame(subject.run(*_ALL_LOST, _OTHER_SPLIT)[2].rows)
        pd.testing.assert_series_equal(rows.test_loss, other.test_loss,
                                       obj="test_loss under another split of the data")


@_check
def check_lost_uploads_keep_initial_model(subject: _Subject) -> None:
    """With every upload lost, the global model stays theta_0: the test loss and accuracy never
    change (for an algorithm whose base station learns only from what devices deliver; one
    with ``server_learns`` is exempt)."""
    rows = pd.DataFrame(subject.run(*_ALL_LOST)[2].rows)
    _require(rows.test_loss.nunique() == 1 and rows.test_accuracy.nunique(dropna=False) == 1,
             f"the model moved without a delivered upload: test_loss "
             f"{rows.test_loss.tolist()}, test_accuracy {rows.test_accuracy.tolist()}")


# ---- the suite ---------------------------------------------------------------------------------
def algorithm_checks(cls: type) -> Iterator[Check]:
    """The checks that apply to ``cls``, in the order ``check_algorithm`` runs them (cheapest
    first); each is called as ``check(cls, params=None, scenario=None)``. Chosen by what
    ``cls`` declares: ``check_lost_uploads_keep_initial_model`` only without
    ``server_learns``; for a method of no uploads (``uploads_per_round`` 0) ``check_off_air``
    instead of the energy and lost-upload checks."""
    yield check_declarations
    yield check_clean_parameter_errors
    yield check_deterministic
    yield check_declared_payloads
    if getattr(cls, "uploads_per_round", 1) == 0:  # off the air: nothing to spend or lose
        yield check_off_air
        return
    yield check_energy_accounting
    yield check_lost_uploads_never_reach_the_model
    if not getattr(cls, "server_learns", False):
        yield check_lost_uploads_keep_initial_model


def check_algorithm(cls: type, params: Mapping[str, Any] | None = None,
                    scenario: ScenarioSource | None = None) -> None:
    """Run every check of ``algorithm_checks(cls)`` on ``cls``; the first failure raises
    ``AssertionError`` naming the check and the algorithm.

    ``params``: the algorithm's keys as its scenario entry would hold them (``{"lr": 0.1}``;
    ``rounds`` and ``eval_every`` default to ROUNDS and 1). ``scenario``: the scenario to run on
    instead of ``default_scenario(cls)`` (a document, a YAML file or catalog name, or a
    ``Scenario``; its ``algorithms`` are replaced by ``cls``). ``cls`` need not be registered:
    it is registered for the duration of each check."""
    for check in algorithm_checks(cls):
        check(cls, params, scenario)
