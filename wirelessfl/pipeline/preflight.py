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
* each algorithm runs on this problem (FedMSA needs a multi-sequence problem, FedNest a bilevel
  one, the others a single-level one: the spec's capabilities, never its name), with its
  parameters (FGDRO-CVaR's k, FedMSA's local_clients <= N),
  with the problem constants its default rules read (``DriftCorrected.theory_needs``), with a
  loss at the base station where it needs one (ZO-HFL, ``server_data``), at a bit width its
  energy model prices (energy/compute.py);
* ``--checkpoint-every`` needs the vectorized engine (pipeline/simulation.py); ``device: cuda``
  needs a GPU (pipeline/build.py).

Warnings (returned, not raised): values whose unit makes them implausible (``bandwidth_hz: 2``),
``plausibility_warnings``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from pydantic import BaseModel

from wirelessfl.algorithms.base import AlgorithmParams
from wirelessfl.algorithms.drift import check_theory
from wirelessfl.algorithms.fedmsa import FedMSA
from wirelessfl.algorithms.fednest import FedNest
from wirelessfl.algorithms.fgdro import FGDROCVaR
from wirelessfl.energy.compute import check_bits
from wirelessfl.errors import UserError
from wirelessfl.learning.datasets import DataFacts, data_facts
from wirelessfl.plugins import algorithm_class, problem_spec, problems_with
from wirelessfl.problems.base import ProblemSpec
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
    for params in scenario.algorithms:
        _check_algorithm(scenario, spec, params, facts)
    if warn is not None:
        for text in warnings:
            warn(f"warning: {text}")
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


def _check_algorithm(scenario: Scenario, spec: ProblemSpec, params: AlgorithmParams,
                     facts: DataFacts | None) -> None:
    cls, label = algorithm_class(params.name), params.display_name
    problem, n = scenario.problem.name, scenario.population.num_devices
    where = f"algorithms '{label}'"
    if issubclass(cls, FedNest) and not spec.bilevel:
        raise UserError(f"{where}: fednest needs a bilevel problem (problem.name: "
                        f"{' or '.join(problems_with('bilevel'))}); this scenario's problem is "
                        f"'{problem}'")
    if issubclass(cls, FedMSA) and not spec.multi_sequence:
        raise UserError(f"{where}: fedmsa needs a multi-sequence problem (problem.name: "
                        f"{', '.join(problems_with('multi_sequence'))}); this scenario's problem "
                        f"is single-level ('{problem}')")
    if not issubclass(cls, FedMSA | FedNest) and spec.multi_sequence:
        raise UserError(f"{where}: problem '{problem}' is a multi-sequence (bilevel) problem: "
                        f"it has no single loss f_i to take gradients of; run it with algorithm "
                        "'fedmsa' (or 'fednest'), or use a single-level problem (classification, "
                        "quadratic, logistic)")
    if issubclass(cls, FedMSA) and params.local_clients > n:
        raise UserError(f"{where}: local_clients ({params.local_clients}) exceeds the {n} "
                        f"clients; set local_clients <= {n}")
    if issubclass(cls, FGDROCVaR) and params.k is not None and params.k > n:
        raise UserError(f"{label}: k = {params.k} exceeds the {n} devices "
                        f"(population.num_devices); choose k between 1 and {n}")
    known = spec.constants(scenario, facts)
    if known is not None and hasattr(cls, "theory_needs"):
        check_theory(params, cls.theory_needs(params), known)
    if (cls.server_learns or getattr(params, "server_data", False)) \
            and not spec.server_loss(scenario, facts):
        raise UserError(f"{where}: needs a loss held by the base station, which this scenario "
                        "does not give; set data.server_fraction (e.g. 0.3, seed 000 Sec. IV), "
                        "or problem.server_loss: true for the quadratic")
    for profile in scenario.population.profiles(scenario.energy):
        try:
            check_bits(profile, params.bits)
        except UserError as err:
            raise UserError(f"{where}: bits = {params.bits}: {err}") from None


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
    ("deadline_s", "s", 1e-5, 1e5, "0.1 for 100 ms"),
    ("coherence_time_s", "s", 1e-5, 1e4, "0.01 for 10 ms"),
    ("throughput_macs_per_s", "MAC/s", 1e3, 1e17, "1e12 for 1 TMAC/s"),
]


def plausibility_warnings(scenario: Scenario) -> list[str]:
    """One line per value with a unit outside its plausible range, naming the field, the unit
    and an example: 'channel.uplink.bandwidth_hz = 2 Hz: bandwidths are in Hz, e.g. 1e6 for
    1 MHz'. Each field is named once (the first offending value of a list)."""
    out, seen = [], set()
    for path, value in _numbers(scenario, ()):
        field = next((str(p) for p in reversed(path) if isinstance(p, str)), "")
        if field in seen:
            continue
        for suffix, unit, low, high, example in PLAUSIBLE:
            if field.endswith(suffix) and not low <= value <= high:
                seen.add(field)
                shown = ".".join(str(p) for p in path)
                out.append(f"{shown} = {value:g} {unit} is outside the plausible {low:g} to "
                           f"{high:g} {unit}: {field} is in {unit}, e.g. {example}")
                break
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
