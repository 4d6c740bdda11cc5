"""Every check a run would otherwise meet only once the world is built or an algorithm starts,
made from the scenario alone: ``wirelessfl validate`` and the start of every run
(engine/runner.py) call ``check_runnable``, so a scenario that validates does not fail hours
later, and a run that cannot work is refused before its folder exists.

The checks are cheap: no dataset is loaded (files are looked at, IDX headers read), no model
built. Where the answer needs the data (a LIBSVM file's labels and features, a label
selection's counts) the check is left to loading, which fails just as cleanly and before a
folder exists. What is checked, and where the same condition is met at run time:

* the data: folder and files exist, IDX headers sane (learning/datasets.py ``data_facts``);
  labels named by ``data.classes`` exist (``load_dataset``);
* the model fits the data's input shape (learning/models.py ``build_model``);
* the split gives every device samples (learning/partition.py);
* the problem's own constraints (logistic needs flat inputs, loss-tuning one client group per
  class, risk-averse-mco samples per client: engine/build.py, learning/*.py);
* each algorithm runs on this problem (FedMSA and FedNest need a multi-sequence problem, the
  others a single-level one), with its parameters (FGDRO-CVaR's k, FedMSA's local_clients <= N),
  with the problem constants its default rules read (``DriftCorrected.theory_needs``), with a
  loss at the base station where it needs one (ZO-HFL, ``server_data``), at a bit width its
  energy model prices (energy/compute.py);
* ``--checkpoint-every`` needs the vectorized engine (engine/simulation.py); ``device: cuda``
  needs a GPU (engine/build.py).

Warnings (returned, not raised): values whose unit makes them implausible (``bandwidth_hz: 2``),
``plausibility_warnings``.
"""

from __future__ import annotations

import math
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
from wirelessfl.learning.logistic import DENSE_HESSIAN_MAX_BYTES, DENSE_HESSIAN_MAX_D
from wirelessfl.learning.models import MODEL_NAMES
from wirelessfl.plugins import algorithm_class
from wirelessfl.scenario.schema import Scenario

# Problems of several sequences (learning/bilevel.py MSAProblem) and of two levels
# (BilevelProblem): FedMSA runs on the first, FedNest on the second, every other method on
# neither (they have no single loss f_i to take gradients of).
MSA_PROBLEMS = ("bilevel-quadratic", "loss-tuning", "risk-averse-mco")
BILEVEL_PROBLEMS = ("bilevel-quadratic", "loss-tuning")
# Problems whose training set is split over devices (engine/build.py split_data).
SPLIT_PROBLEMS = ("classification", "logistic")
# What learning/problems.py similarity_constants gives; the logistic problem has the delta keys
# only with dense Hessians (learning/logistic.py LogisticProblem.constants).
ALL_CONSTANTS = {"L", "mu", "delta_A", "delta_A_exact", "delta_B"}


def check_runnable(scenario: Scenario, checkpoint_every: int | None = None,
                   warn: Callable[[str], None] | None = None) -> list[str]:
    """Raise UserError for the first thing that would stop a run of ``scenario``; return the
    plausibility warnings (also handed to ``warn`` as ``warning: ...`` lines)."""
    warnings = plausibility_warnings(scenario)
    _check_engine(scenario, checkpoint_every)
    facts = None
    if scenario.problem.name in SPLIT_PROBLEMS or scenario.problem.name == "loss-tuning":
        facts = data_facts(scenario.data)
        _check_labels(scenario, facts)
    _check_problem(scenario, facts)
    _check_plugin_model(scenario, facts)
    for params in scenario.algorithms:
        _check_algorithm(scenario, params, facts)
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


def _classes(scenario: Scenario, facts: DataFacts | None) -> int | None:
    """Labels the learner sees after the label selection (None when only loading tells)."""
    data = scenario.data
    if data.classes is not None:
        return len(data.classes)
    if data.positive_classes is not None:
        return 2
    return facts.labels if facts is not None else None


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


def _check_problem(scenario: Scenario, facts: DataFacts | None) -> None:
    problem, n = scenario.problem, scenario.population.num_devices
    shape = facts.input_shape if facts is not None else None
    if problem.name == "classification" and shape is not None:
        _check_model(scenario.model.name, shape, scenario.data.name)
    if problem.name == "logistic" and shape is not None and len(shape) != 1:
        raise UserError(f"problem 'logistic' needs flat inputs, but dataset "
                        f"'{scenario.data.name}' has shape {shape}; use a tabular dataset "
                        "(breast_cancer, libsvm, synthetic, digits)")
    if problem.name in SPLIT_PROBLEMS and facts is not None:
        _check_partition(scenario, facts)
    if problem.name == "loss-tuning":
        classes = _classes(scenario, facts)
        if classes is not None and n % classes:
            raise UserError(f"problem 'loss-tuning': population.num_devices ({n}) must be a "
                            f"multiple of the {classes} classes (one client group per class)")
    if problem.name == "risk-averse-mco" and problem.samples % problem.clients:
        raise UserError(f"problem.samples ({problem.samples}) must be a multiple of "
                        f"problem.clients ({problem.clients}): every client holds the same "
                        "number of samples")


def _check_model(model: str, shape: tuple[int, ...], dataset: str) -> None:
    """learning/models.py ``build_model``'s conditions on the input shape."""
    if model == "seed002-cnn" and (len(shape) != 3 or min(shape[1:]) < 14):
        raise UserError(f"model 'seed002-cnn' needs image inputs (channels, height, width) of at "
                        f"least 14x14 pixels, but dataset '{dataset}' has shape {shape}; use "
                        "dataset 'digits28', 'mnist' or 'fashionmnist'")
    if model == "resnet18-cifar" and (len(shape) != 3 or min(shape[1:]) < 8):
        raise UserError(f"model 'resnet18-cifar' needs image inputs (channels, height, width) of "
                        f"at least 8x8 pixels, but dataset '{dataset}' has shape {shape}; it is "
                        "built for 3x32x32 (CIFAR-10): use an image dataset (digits28, mnist, "
                        "fashionmnist) or model mlp")


def _check_plugin_model(scenario: Scenario, facts: DataFacts | None) -> None:
    """A plugin model is built once for the data's input shape (learning/models.py
    ``build_model``), so that its own failures and a wrong return type are found by
    ``validate``; the built-ins' conditions are ``_check_model``'s, without building."""
    model = scenario.model
    shape = facts.input_shape if facts is not None else None
    if model.name in MODEL_NAMES or scenario.problem.name != "classification" or shape is None:
        return
    from wirelessfl.learning.models import build_model

    build_model(model.name, shape, _classes(scenario, facts) or 2, options=model.options)


def _check_partition(scenario: Scenario, facts: DataFacts) -> None:
    """Every device gets samples (learning/partition.py); known only without a label selection,
    which changes the count."""
    data, config, n = scenario.data, scenario.partition, scenario.population.num_devices
    classes = _classes(scenario, facts)
    if config.scheme == "label-skew" and classes is not None \
            and config.classes_per_device > classes:
        raise UserError(f"partition.classes_per_device={config.classes_per_device} exceeds the "
                        f"{classes} classes in the training set; lower it")
    if facts.train_samples is None or data.classes is not None:
        return
    samples = facts.train_samples - round(data.server_fraction * facts.train_samples)
    need, key = 1, "population.num_devices"
    if config.scheme == "shards":
        need, key = config.shards_per_device, "partition.shards_per_device"
    elif config.min_samples is not None:
        need, key = config.min_samples, "partition.min_samples"
    if n * need > samples:
        raise UserError(f"{key}: {n} devices x {need} samples each exceeds the {samples} "
                        f"training samples on devices of dataset '{data.name}', so some devices "
                        "would get too little data; use fewer devices or more data")


def _known_constants(scenario: Scenario, facts: DataFacts | None) -> set[str] | None:
    """The problem constants its ``constants`` will hold (None: only building tells)."""
    name = scenario.problem.name
    if name == "quadratic":
        return ALL_CONSTANTS
    if name == "classification":
        return set()
    if name == "logistic":
        shape = facts.input_shape if facts is not None else None
        if shape is None:
            return None
        d, n = math.prod(shape), scenario.population.num_devices
        dense = d <= DENSE_HESSIAN_MAX_D and 8 * n * d * d <= DENSE_HESSIAN_MAX_BYTES
        return ALL_CONSTANTS if dense else {"L", "mu"}
    return None


def _has_server_loss(scenario: Scenario, facts: DataFacts | None) -> bool:
    if scenario.problem.name == "quadratic":
        return bool(scenario.problem.server_loss)
    if scenario.problem.name not in SPLIT_PROBLEMS:
        return False
    fraction = scenario.data.server_fraction
    train = facts.train_samples if facts is not None else None
    return fraction > 0 and (train is None or round(fraction * train) > 0)


def _check_algorithm(scenario: Scenario, params: AlgorithmParams,
                     facts: DataFacts | None) -> None:
    cls, label = algorithm_class(params.name), params.display_name
    problem, n = scenario.problem.name, scenario.population.num_devices
    where = f"algorithms '{label}'"
    if issubclass(cls, FedNest) and problem not in BILEVEL_PROBLEMS:
        raise UserError(f"{where}: fednest needs a bilevel problem (problem.name: "
                        f"{' or '.join(BILEVEL_PROBLEMS)}); this scenario's problem is '{problem}'")
    if issubclass(cls, FedMSA) and problem not in MSA_PROBLEMS:
        raise UserError(f"{where}: fedmsa needs a multi-sequence problem (problem.name: "
                        f"{', '.join(MSA_PROBLEMS)}); this scenario's problem is single-level "
                        f"('{problem}')")
    if not issubclass(cls, FedMSA | FedNest) and problem in MSA_PROBLEMS:
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
    known = _known_constants(scenario, facts)
    if known is not None and hasattr(cls, "theory_needs"):
        check_theory(params, cls.theory_needs(params), known)
    if (cls.server_learns or getattr(params, "server_data", False)) \
            and not _has_server_loss(scenario, facts):
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
