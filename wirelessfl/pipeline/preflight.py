"""Every check a run would otherwise meet only once the world is built or an algorithm starts,
made from the scenario alone: ``wirelessfl validate`` and the start of every run
(pipeline/runner.py) call ``check_runnable``, so a scenario that validates does not fail hours
later, and a run that cannot work is refused before its folder exists.

The checks are cheap: no dataset is loaded (files are looked at, IDX headers read), no model
built. Where the answer needs the data (a LIBSVM file's labels and features, a label
selection's counts) the check is left to loading, which fails just as cleanly and before a
folder exists. What is checked, and where the same condition is met at run time:

* the data: folder and files exist, IDX headers sane (learning/datasets.py ``data_facts``);
  labels named by ``data.classes`` exist (``load_dataset``);
* the split gives every device samples (problems/data.py ``check_partition``);
* the problem's own constraints, its ``ProblemSpec.check`` (problems/: a classifier's model fits
  the data, logistic needs flat inputs, loss-tuning one client group per class, ...);
* each algorithm runs on this problem and scenario, as the algorithm itself declares
  (algorithms/base.py, from the scenario's ``ScenarioFacts``, contract/facts.py): the problem
  capability it needs (``problem_needs``: FedMSA a multi-sequence problem, FedNest a bilevel
  one, the others a single-level one: the spec's capabilities, never its name), its parameters
  (``check_scenario``: FGDRO-CVaR's k, FedMSA's local_clients <= N), the problem constants its
  default rules read (``check_constants``: the drift family's ``theory_needs``), a loss at the
  base station where it needs one (``needs_server_loss``: ZO-HFL, ``server_data``); and a bit
  width its energy model prices (energy/compute.py);
* ``--checkpoint-every`` needs the vectorized engine (pipeline/simulation.py); ``device: cuda``
  needs a GPU (pipeline/build.py).

Warnings (returned, not raised): values whose unit makes them implausible (``bandwidth_hz: 2``),
``plausibility_warnings``.

``check_runs`` makes the same checks, and the memory estimate, on every run of a study file:
``wirelessfl validate`` on sweep, tune and reproduction files, and ``tune`` / ``reproduce``
before their first run (a refused configuration would otherwise be ranked as an unhealthy one).
A sweep's points are independent: a point refused when it starts is recorded as failed and
retried by the next sweep, the other points' results kept.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator

from pydantic import BaseModel

from wirelessfl.algorithms.base import AlgorithmParams
from wirelessfl.contract.facts import (
    BILEVEL,
    MULTI_SEQUENCE,
    PROBLEM_FLAGS,
    SINGLE_LEVEL,
    ScenarioFacts,
    problem_capabilities,
)
from wirelessfl.contract.port import AIR_WAYS
from wirelessfl.energy.compute import check_bits
from wirelessfl.engine.network import ENGINES
from wirelessfl.errors import UserError
from wirelessfl.learning.datasets import DataFacts, data_facts
from wirelessfl.pipeline.memory import check_memory_from_scenario
from wirelessfl.plugins import algorithm_class, problem_spec, problems_with
from wirelessfl.problems.base import ProblemSpec
from wirelessfl.scenario.loader import scenario_from_document
from wirelessfl.scenario.schema import Scenario


def check_runnable(scenario: Scenario, checkpoint_every: int | None = None,
                   warn: Callable[[str], None] | None = None) -> list[str]:
    """Raise UserError for the first thing that would stop a run of ``scenario``; return the
    plausibility warnings (also handed to ``warn`` as ``warning: ...`` lines)."""
    warnings = plausibility_warnings(scenario)
    _check_engine(scenario, checkpoint_every)
    spec = problem_spec(scenario.problem.name)
    facts = None
    if spec.reads_data:
        facts = data_facts(scenario.data)
        _check_labels(scenario, facts)
    spec.check(scenario, facts)
    if scenario.algorithms:
        scene = scenario_facts(scenario, spec, facts)
        for params in scenario.algorithms:
            _check_algorithm(scenario, params, scene)
    if warn is not None:
        for text in warnings:
            warn(f"warning: {text}")
    return warnings


def check_runs(runs: Iterable[tuple[str, dict]], source: str) -> list[str]:
    """What every run of a study meets first, ``check_runnable`` and the memory estimate
    (pipeline/memory.py), on each run's resolved scenario document before any run starts: once
    per distinct scenario, the seed aside (no check reads it). ``runs``: (where, document)
    pairs; the first refusal is one UserError naming the file and the run (``source: where:
    ...``). Returns the plausibility warnings, each once. The checks are this machine's (its
    data folders, its memory): a study sent to a remote Dask scheduler leaves them to each run."""
    seen: set[str] = set()
    warnings: list[str] = []
    for where, document in runs:
        key = json.dumps({k: v for k, v in document.items() if k != "seed"}, sort_keys=True,
                         default=str)
        if key in seen:
            continue
        seen.add(key)
        try:
            scenario = scenario_from_document(document, str(source))
            lines = check_runnable(scenario)
            check_memory_from_scenario(scenario)
        except UserError as err:
            raise UserError(f"{source}: {where}: {err}") from None
        warnings += [line for line in lines if line not in warnings]
    return warnings


def _check_engine(scenario: Scenario, checkpoint_every: int | None) -> None:
    if checkpoint_every and scenario.engine.mode != "vectorized":
        raise UserError("checkpoints need engine.mode: vectorized (the processes engine keeps "
                        "per-device SimPy processes, which cannot be saved); drop "
                        "--checkpoint-every or set --set engine.mode=vectorized")
    if scenario.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise UserError("device: 'cuda' was requested but torch sees no CUDA GPU here; "
                            "set 'device: cpu' (or 'auto') or install a CUDA build of torch")


def _check_labels(scenario: Scenario, facts: DataFacts) -> None:
    """Labels named in ``data`` exist in the dataset (``load_dataset``'s _check_present)."""
    data = scenario.data
    if facts.labels is None:
        return
    for key in ("classes", "positive_classes"):
        labels = getattr(data, key)
        missing = [c for c in labels or () if c >= facts.labels]
        if missing:
            raise UserError(f"data.{key} lists label(s) {missing} that dataset '{data.name}' "
                            f"does not have; its labels are {list(range(facts.labels))}")
    if data.positive_classes is not None and len(data.positive_classes) >= facts.labels:
        raise UserError(f"data.positive_classes={data.positive_classes} covers every label of "
                        f"'{data.name}', leaving no negative class; list fewer labels")


def scenario_facts(scenario: Scenario, spec: ProblemSpec, facts: DataFacts | None
                   ) -> ScenarioFacts:
    """What the algorithms' own checks read of ``scenario`` (contract/facts.py): N, the
    problem's capabilities (its spec's flags), the constants it will know, whether the base
    station holds a loss; ``facts``: the data's cheap facts (None unless the problem reads
    data)."""
    constants = spec.constants(scenario, facts)
    return ScenarioFacts(
        num_devices=scenario.population.num_devices, problem=scenario.problem.name,
        capabilities=problem_capabilities({f: getattr(spec, f) for f in PROBLEM_FLAGS}),
        constants=None if constants is None else frozenset(constants),
        server_loss=bool(spec.server_loss(scenario, facts)))


def _missing_capability(name: str, need: str, where: str, problem: str) -> str:
    """The refusal of algorithm ``name``, which needs a problem with capability ``need``, on
    ``problem``, which lacks it; the alternatives are the built-in problems that have it."""
    if need == BILEVEL:
        return (f"{where}: {name} needs a bilevel problem (problem.name: "
                f"{' or '.join(problems_with(BILEVEL))}); this scenario's problem is "
                f"'{problem}'")
    if need == MULTI_SEQUENCE:
        return (f"{where}: {name} needs a multi-sequence problem (problem.name: "
                f"{', '.join(problems_with(MULTI_SEQUENCE))}); this scenario's problem "
                f"is single-level ('{problem}')")
    if need == SINGLE_LEVEL:
        return (f"{where}: problem '{problem}' is a multi-sequence (bilevel) problem: "
                f"it has no single loss f_i to take gradients of; run it with algorithm "
                "'fedmsa' (or 'fednest'), or use a single-level problem (classification, "
                "quadratic, logistic)")
    offered = ", ".join(problems_with(need)) if need in PROBLEM_FLAGS else "none built in"
    return (f"{where}: {name} needs a problem with capability '{need}' (problem.name: "
            f"{offered}); this scenario's problem is '{problem}'")


def _check_algorithm(scenario: Scenario, params: AlgorithmParams, facts: ScenarioFacts) -> None:
    """What the algorithm declares it needs of the scenario (algorithms/base.py), in order:
    the problem's capability, its own constraints, the problem's constants, a server loss,
    and the bit width's price."""
    cls = algorithm_class(params.name)
    where = f"algorithms '{params.display_name}'"
    if cls.problem_needs not in facts.capabilities:
        raise UserError(_missing_capability(cls.name, cls.problem_needs, where, facts.problem))
    _check_air(cls, scenario, where)
    refusal = cls.check_scenario(params, facts)
    if refusal:
        raise UserError(refusal)
    if facts.constants is not None:
        cls.check_constants(params, facts.constants)
    if cls.needs_server_loss(params) and not facts.server_loss:
        raise UserError(f"{where}: needs a loss held by the base station, which this scenario "
                        "does not give; set data.server_fraction (e.g. 0.3, seed 000 Sec. IV), "
                        "or problem.server_loss: true for the quadratic")
    for profile in scenario.population.profiles(scenario.energy):
        try:
            check_bits(profile, params.bits)
        except UserError as err:
            raise UserError(f"{where}: bits = {params.bits}: {err}") from None


def _check_air(cls, scenario: Scenario, where: str) -> None:
    """The way the algorithm's uploads cross the air (``Algorithm.air``) is one the scenario's
    network simulates: packets everywhere, superposition only where the network implements
    ``superpose`` (contract/port.py ``SuperposingAir``)."""
    if cls.air not in AIR_WAYS:
        raise UserError(f"{where}: declares air = {cls.air!r}; an algorithm's uploads cross the "
                        f"air as one of {', '.join(map(repr, AIR_WAYS))}")
    network = ENGINES[scenario.engine.mode]
    if cls.air == "superposition" and not callable(getattr(network, "superpose", None)):
        raise UserError(f"{where}: sends its uploads by superposition (devices transmitting at "
                        f"once, the base station receiving their channel-weighted sum), which "
                        f"engine.mode '{scenario.engine.mode}' does not simulate; run it with a "
                        "network that implements superpose (contract/port.py SuperposingAir)")


# ---- plausibility of values with units ---------------------------------------------------------
# (field name, unit, plausible low, plausible high, an example) [D]: the ranges cover every
# shipped profile and the hardware the specs cite with margin; outside them the value was most
# likely written in another unit (MHz for Hz, mW for W, km for m). Warnings only: an exotic
# setup is legal.
PLAUSIBLE = [
    ("bandwidth_hz", "Hz", 1e3, 1e10, "1e6 for 1 MHz"),
    ("carrier_frequency_hz", "Hz", 1e6, 3e11, "3.5e9 for 3.5 GHz"),
    ("cpu_frequency_hz", "Hz", 1e6, 1e11, "2e9 for 2 GHz"),
    ("low_hz", "Hz", 1e6, 1e11, "1e9 for 1 GHz"),
    ("high_hz", "Hz", 1e6, 1e11, "2e9 for 2 GHz"),
    ("median_hz", "Hz", 1e6, 1e11, "1.5e9 for 1.5 GHz"),
    ("doppler_hz", "Hz", 0, 1e5, "10 for a pedestrian at 3.5 GHz"),
    ("rate_bps", "bit/s", 1e2, 1e12, "1e6 for 1 Mbit/s"),
    ("_power_w", "W", 0, 1e3, "0.1 for 100 mW"),
    ("_dbm", "dBm", -60, 70, "23 for a phone"),
    ("cell_radius_m", "m", 1, 1e5, "500 for a 500 m cell"),
    ("distances_m", "m", 0.1, 1e5, "100 for 100 m"),
    ("min_distance_m", "m", 0, 1e4, "10 for 10 m"),
    ("_height_m", "m", 0.5, 1e3, "25 for a macro base station"),
    ("battery_j", "J", 1e-3, 1e8, "4e4 for a 3 Ah, 3.7 V phone battery"),
    ("access_energy_j", "J", 1e-16, 1e-6, "1e-12 for 1 pJ"),
    ("mac_energy_j", "J", 1e-16, 1e-6, "1e-12 for 1 pJ"),
    ("slot_s", "s", 1e-6, 1, "1e-3 for 1 ms"),
    # [D] 10 s: an upload phase (the base station's wait for one round's uploads) of more than
    # 10 s is far beyond every shipped profile's (20 ms) and the slots and frames the specs
    # cite; deadline_s: 20 was 20 ms written in seconds.
    ("deadline_s", "s", 1e-5, 10, "0.1 for 100 ms"),
    ("coherence_time_s", "s", 1e-5, 1e4, "0.01 for 10 ms"),
    ("throughput_macs_per_s", "MAC/s", 1e3, 1e17, "1e12 for 1 TMAC/s"),
]


# Unit names spelt out in the warnings (a bare "s" is easily read past).
UNIT_NAMES = {"s": "seconds", "m": "metres", "J": "joules", "W": "watts", "Hz": "Hz"}
# A time in seconds above its plausible range was most often written in milliseconds [D].
SMALLER_UNIT = {"s": ("ms", 1e-3)}
# Battery capacities as sold, in mAh [D]: a phone's is 3,000-5,000, a tablet's up to 10,000,
# and they are quoted in round hundreds. A battery_j that is a multiple of 500 in this range
# (battery_j: 4000) was most likely such a capacity: 4000 mAh at 3.7 V is 53,280 J. Budgets in
# joules converted from a capacity (C x 3.6 x V: 2,430 J for a 225 mAh coin cell) are rarely
# so round. A warning only: a budget of exactly 4 kJ stays legal.
MAH_LIKE = (500, 10_000, 500)
TYPICAL_VOLTS = 3.7  # a lithium-ion cell's nominal voltage, for the conversion shown


def plausibility_warnings(scenario: Scenario) -> list[str]:
    """One line per value with a unit outside its plausible range, naming the field, the unit
    and an example: 'channel.uplink.bandwidth_hz = 2 Hz: bandwidths are in Hz, e.g. 1e6 for
    1 MHz'; and a ``battery_j`` that looks like a capacity in mAh (``MAH_LIKE``). Each field is
    named once (the first offending value of a list)."""
    out, seen = [], set()
    for path, value in _numbers(scenario, ()):
        field = next((str(p) for p in reversed(path) if isinstance(p, str)), "")
        if field in seen:
            continue
        shown = ".".join(str(p) for p in path)
        for suffix, unit, low, high, example in PLAUSIBLE:
            if field.endswith(suffix) and not low <= value <= high:
                seen.add(field)
                meant = ""
                if value > high and unit in SMALLER_UNIT:
                    smaller, factor = SMALLER_UNIT[unit]
                    meant = f" (for {value:g} {smaller} write {value * factor:g})"
                out.append(f"{shown} = {value:g} {unit} is outside the plausible {low:g} to "
                           f"{high:g} {unit}: {field} is in {UNIT_NAMES.get(unit, unit)}"
                           f"{meant}, e.g. {example}")
                break
        else:
            low, high, step = MAH_LIKE
            if field == "battery_j" and low <= value <= high and value % step == 0:
                seen.add(field)
                joules = value * 3.6 * TYPICAL_VOLTS
                out.append(f"{shown} = {value:g} J looks like a battery capacity in mAh: "
                           f"battery_j is in joules, and C mAh at V volts is C x 3.6 x V J "
                           f"({value:g} mAh at {TYPICAL_VOLTS:g} V is {joules:,.0f} J); keep "
                           f"{value:g} if joules were meant")
    return out


def _numbers(node: object, path: tuple) -> Iterator[tuple[tuple, float]]:
    """(key path, value) of every number in a model tree (bools left out)."""
    stack = [(node, path)]
    while stack:
        node, path = stack.pop()
        if isinstance(node, BaseModel):
            stack.extend((getattr(node, k), path + (k,)) for k in reversed(type(node).model_fields))
        elif isinstance(node, dict):
            stack.extend((v, path + (str(k),)) for k, v in reversed(node.items()))
        elif isinstance(node, list | tuple):
            stack.extend((v, path + (i,)) for i, v in reversed(list(enumerate(node))))
        elif isinstance(node, int | float) and not isinstance(node, bool):
            yield path, float(node)
