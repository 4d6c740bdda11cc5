"""From a Scenario to live parts: the cell and the learning problem (the evaluator).

The problem is a classifier (data on devices, a zoo model, ``BatchedEvaluator``), with
``problem: {name: quadratic}`` fedred.md's synthetic quadratic (``QuadraticProblem``), or with
``problem: {name: logistic}`` fedred.md's regularised logistic regression on the same data split
as a classifier's (``LogisticProblem``), with ``problem: {name: bilevel-quadratic}`` fedmsa.md's
federated bilevel quadratic (``BilevelQuadratic``). Everything
here is shared by all algorithms of a scenario (same positions, same shards, same theta_0, same
device classes and clocks), so algorithms are compared on the same world.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from wirelessfl.channel import Cell, Downlink, Uplink
from wirelessfl.energy import (
    ComputeModel,
    DevicePower,
    EnergyProfile,
    ModelProfile,
    PopulationCompute,
    draw_device_classes,
    lognormal_frequencies_hz,
    profile_model,
    uniform_frequencies_hz,
)
from wirelessfl.engine.allocator import keep_freed_memory
from wirelessfl.errors import UserError
from wirelessfl.learning.bilevel import BilevelQuadratic, bilevel_quadratic
from wirelessfl.learning.datasets import Dataset, load_dataset
from wirelessfl.learning.evaluator import BatchedEvaluator, DeviceData, FlatModel
from wirelessfl.learning.logistic import LogisticProblem
from wirelessfl.learning.loss_tuning import LossTuning
from wirelessfl.learning.mco import RiskAverseMCO, risk_averse_data
from wirelessfl.learning.models import build_model
from wirelessfl.learning.partition import label_counts, partition
from wirelessfl.learning.problems import Problem, QuadraticProblem, fedred_quadratic
from wirelessfl.learning.seeds import keyed_rng, stream_key
from wirelessfl.results.records import partition_manifest
from wirelessfl.scenario.schema import Scenario


def torch_device(requested: str) -> torch.device:
    """The torch device for ``device: cpu|cuda|auto``; a clean error when cuda is missing."""
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if requested == "cuda" and not torch.cuda.is_available():
        raise UserError("device: 'cuda' was requested but torch sees no CUDA GPU here; "
                        "set 'device: cpu' (or 'auto') or install a CUDA build of torch")
    return torch.device(requested)


@dataclass
class World:
    """The cell, the devices' hardware and the learning problem. ``evaluator`` is any
    ``Problem`` (algorithms use it as ``ctx.evaluator``); ``dataset``, ``shards`` and ``flat``
    are None for a quadratic, ``flat`` for logistic regression. Device i has the energy profile
    ``class_profiles[device_class[i]]`` and, with ``population.cpu_frequency``, the clock
    ``frequency_hz[i]``; drawn from the scenario when not given."""

    scenario: Scenario
    cell: Cell
    dataset: Dataset | None
    shards: list[np.ndarray] | None
    flat: FlatModel | None
    model_profile: ModelProfile
    evaluator: Problem
    device: torch.device
    class_names: list[str] = field(default_factory=list)
    class_profiles: list[EnergyProfile] = field(default_factory=list)
    device_class: np.ndarray | None = None  # [N] index into class_names
    frequency_hz: np.ndarray | None = None  # [N] CPU clocks [Hz]; None: each profile's own

    def __post_init__(self) -> None:
        if self.device_class is None:
            (self.class_names, self.class_profiles, self.device_class,
             self.frequency_hz) = draw_population(self.scenario)

    @property
    def num_devices(self) -> int:
        return self.scenario.population.num_devices

    @property
    def heterogeneous(self) -> bool:
        """True when devices differ in hardware (several classes or per-device clocks)."""
        return len(self.class_profiles) > 1 or self.frequency_hz is not None

    def device_class_names(self) -> list[str]:
        """[N] the class (energy profile) name of each device."""
        return [self.class_names[c] for c in self.device_class]

    def device_power(self, uplink: Uplink | None = None) -> DevicePower:
        """Each device's transmit draw (its profile's PA and circuit with the channel's RF
        output and circuit power), receive and idle power, and battery."""
        uplink = uplink or self.uplink()
        return DevicePower.from_profiles(self.class_profiles, self.device_class,
                                         uplink.tx_power_w, uplink.circuit_power_w)

    def uplink(self) -> Uplink:
        return Uplink(self.cell, self.scenario.channel)

    def downlink(self) -> Downlink:
        return Downlink(self.cell, self.scenario.channel)

    def compute_model(self, bits: int) -> ComputeModel | PopulationCompute:
        """Pass prices at M = ``bits``: floats for one kind of device, arrays [N] (a
        ``PopulationCompute``) for a mixed population or per-device clocks."""
        if not self.heterogeneous:
            return ComputeModel(self.class_profiles[0], self.model_profile, bits)
        return PopulationCompute.from_profiles(self.class_profiles, self.model_profile, bits,
                                               self.device_class, self.frequency_hz)

    def initial(self) -> torch.Tensor:
        """theta_0 [d] (float32, on the problem's device): every algorithm starts here."""
        return self.evaluator.initial()

    def label_counts(self) -> np.ndarray:
        """[N, C] training samples of each class on each device."""
        return label_counts(self.dataset.y_train, self.shards, self.dataset.num_classes)

    def partition_record(self) -> dict | None:
        """What the manifest records about the split (hand it to ``RunWriter(partition=...)``);
        None for a problem without a dataset."""
        if self.dataset is None:
            return None
        config = self.scenario.partition
        return partition_manifest(config.scheme, config.params(), self.label_counts())

    def problem_record(self) -> dict:
        """What the manifest records about the problem (constants, f* when known)."""
        return self.evaluator.describe()


def draw_population(scenario: Scenario
                    ) -> tuple[list[str], list[EnergyProfile], np.ndarray, np.ndarray | None]:
    """(class names, their profiles, device_class [N], clocks [N] or None). Classes are drawn
    with exact counts by largest remainder from the stream (seed, "device-classes"); clocks from
    (seed, "cpu-frequency")."""
    population, seed = scenario.population, scenario.seed
    n = population.num_devices
    if population.classes is None:
        names = [scenario.energy.name or "default"]
        profiles = [scenario.energy]
        device_class = np.zeros(n, dtype=np.int64)
    else:
        fractions = {name: c.fraction for name, c in population.classes.items()}
        names, device_class = draw_device_classes(fractions, n,
                                                  keyed_rng(seed, "device-classes"))
        profiles = [population.classes[name].energy for name in names]
    clocks = population.cpu_frequency
    frequency = None
    if clocks is not None:
        rng = keyed_rng(seed, "cpu-frequency")
        if clocks.distribution == "uniform":
            frequency = uniform_frequencies_hz(n, clocks.low_hz, clocks.high_hz, rng)
        else:
            frequency = lognormal_frequencies_hz(n, clocks.median_hz, clocks.sigma, rng,
                                                 clocks.low_hz, clocks.high_hz)
    return names, profiles, device_class, frequency


def build_world(scenario: Scenario) -> World:
    """Place devices, then build the problem: load and split the data and build the model and
    the evaluator (or the logistic regression on that split), or draw the quadratic."""
    keep_freed_memory()  # the round's large temporaries reuse heap memory (engine/allocator.py)
    seed, n = scenario.seed, scenario.population.num_devices
    device = torch_device(scenario.device)
    if scenario.population.distances_m is not None:
        cell = Cell.from_distances(np.asarray(scenario.population.distances_m, float),
                                   scenario.channel, keyed_rng(seed, "placement"))
    else:
        cell = Cell.build(n, scenario.channel, keyed_rng(seed, "placement"))
    if scenario.problem.name in ("quadratic", "bilevel-quadratic", "risk-averse-mco"):
        build = {"quadratic": build_quadratic, "bilevel-quadratic": build_bilevel,
                 "risk-averse-mco": build_mco}[scenario.problem.name]
        problem = build(scenario, device)
        return World(scenario, cell, None, None, None, problem.model_profile, problem, device)
    if scenario.problem.name == "loss-tuning":
        problem = build_loss_tuning(scenario, device)
        return World(scenario, cell, None, None, None, problem.model_profile, problem, device)
    split = split_data(scenario)
    if scenario.problem.name == "logistic":
        problem = build_logistic(scenario, device, split)
        return World(scenario, cell, split.dataset, split.shards, None, problem.model_profile,
                     problem, device)
    dataset, server, shards = split.dataset, split.server, split.shards
    model = build_model(scenario.model.name, dataset.input_shape, dataset.num_classes,
                        hidden=tuple(scenario.model.hidden),
                        seed=stream_key(seed, "init") % 2**31, options=scenario.model.options)
    model_profile = profile_model(model, dataset.input_shape)
    model = model.to(device)
    flat = FlatModel(model)
    data = DeviceData.from_shards(dataset.x_train, dataset.y_train, shards, dataset.x_test,
                                  dataset.y_test, device, server=server)
    evaluator = BatchedEvaluator(flat, data, model_profile.activations_per_sample,
                                 model_profile.input_size, scenario.engine.max_chunk_mb,
                                 l2=scenario.model.l2)
    # Training-set metrics cost a pass over all training data at each evaluation: on when the
    # scenario asks, and always when the optimum is known (their point is f - f* then).
    evaluator.train_metrics = bool(scenario.problem.train_metrics)
    if scenario.model.name == "logistic" and scenario.model.l2 > 0:
        evaluator.solve_optimum()  # strongly convex: f* and x* by a reference solve, once
        evaluator.train_metrics = True
    return World(scenario, cell, dataset, shards, flat, model_profile, evaluator, device)


@dataclass
class SplitData:
    """The dataset and who holds what: ``server`` the training indices the base station keeps
    (sorted), ``shards`` each device's training indices."""

    dataset: Dataset
    server: np.ndarray
    shards: list[np.ndarray]


def split_data(scenario: Scenario) -> SplitData:
    """Load ``scenario.data``, take the base station's share out (seed 000's server data, stream
    (seed, "server-data")), and partition the rest over the devices (stream (seed,
    "partition")). Classifier and logistic regression share it, so they see the same split."""
    seed, n = scenario.seed, scenario.population.num_devices
    dataset = load_dataset(scenario.data, seed)
    # The base station's own samples (seed 000) come out first; devices split the rest.
    order = keyed_rng(seed, "server-data").permutation(len(dataset.y_train))
    keep = round(scenario.data.server_fraction * len(order))
    server, on_devices = np.sort(order[:keep]), np.sort(order[keep:])
    shards = partition(scenario.partition.scheme, dataset.y_train[on_devices], n,
                       keyed_rng(seed, "partition"), **scenario.partition.params())
    return SplitData(dataset, server, [on_devices[s] for s in shards])


def build_logistic(scenario: Scenario, device: torch.device,
                   split: SplitData | None = None) -> LogisticProblem:
    """fedred.md Sec. 4.2's logistic regression on the scenario's data, split as for a
    classifier (``split_data``, loaded here when not given); the dataset must be binary."""
    split = split or split_data(scenario)
    dataset, p = split.dataset, scenario.problem
    if dataset.num_classes != 2:
        raise UserError(f"problem 'logistic' is binary but dataset '{dataset.name}' has "
                        f"{dataset.num_classes} classes; set data.positive_classes (e.g. [0]: "
                        "class 0 against the rest) or data.classes with two labels")
    if len(dataset.input_shape) != 1:
        raise UserError(f"problem 'logistic' needs flat inputs, but dataset '{dataset.name}' has "
                        f"shape {dataset.input_shape}; use a tabular dataset (breast_cancer, "
                        "libsvm, synthetic, digits)")
    return LogisticProblem(dataset.x_train, dataset.y_train, split.shards, dataset.x_test,
                           dataset.y_test, l2=p.l2, normalize_rows=p.normalize_rows,
                           device=device, max_chunk_mb=scenario.engine.max_chunk_mb,
                           server=split.server)


def build_quadratic(scenario: Scenario, device: torch.device) -> QuadraticProblem:
    """fedred.md's synthetic quadratic (Sec. 4.1 / 5.1) from the ``problem`` section."""
    p = scenario.problem
    a, c = fedred_quadratic(p.clients, p.dimension, p.L, p.mu, p.delta,
                            keyed_rng(scenario.seed, "quadratic"), p.minimizer_std)
    return QuadraticProblem(a, c, p.noise_std, device, scenario.engine.max_chunk_mb,
                            server_loss=p.server_loss)


def build_bilevel(scenario: Scenario, device: torch.device) -> BilevelQuadratic:
    """fedmsa.md Sec. 5.1's federated bilevel quadratic from the ``problem`` section, drawn from
    the stream (seed, "bilevel-quadratic")."""
    p = scenario.problem
    a, b, c = bilevel_quadratic(p.clients, p.dimension_x, p.dimension_w, p.heterogeneity,
                                keyed_rng(scenario.seed, "bilevel-quadratic"))
    return BilevelQuadratic(a, b, c, mu=p.mu, noise_std=p.noise_std, device=device)


def build_mco(scenario: Scenario, device: torch.device) -> RiskAverseMCO:
    """fedmsa.md Sec. 4.1's risk-averse composition from the ``problem`` section, data drawn from
    the stream (seed, "risk-averse-mco")."""
    p = scenario.problem
    a, b, x_true = risk_averse_data(p.samples, p.dimension, p.label_noise_std,
                                    keyed_rng(scenario.seed, "risk-averse-mco"))
    return RiskAverseMCO(a, b, x_true, p.clients, p.risk_weight, p.risk_delta, p.initial_value,
                         p.sample_batch, device)


def build_loss_tuning(scenario: Scenario, device: torch.device) -> LossTuning:
    """fedmsa.md Sec. 4.2 / 5.2's loss-function tuning on ``scenario.data``: long tail,
    q-partition and train/validation split drawn from the stream (seed, "loss-tuning")."""
    p = scenario.problem
    data = load_dataset(scenario.data, scenario.seed)
    return LossTuning(data.x_train, data.y_train, data.x_test, data.y_test, data.num_classes,
                      scenario.population.num_devices, keyed_rng(scenario.seed, "loss-tuning"),
                      p.imbalance_ratio, p.heterogeneity_q, p.validation_fraction,
                      p.weight_decay, device)
