"""From a Scenario to live parts: the cell, the devices' hardware and the learning problem.

The problem is whatever ``problem.name`` names in the ``PROBLEMS`` registry (wirelessfl/plugins.py):
its ``ProblemSpec.build`` (problems/) draws or loads it; this module names no problem. Everything
here is shared by all algorithms of a scenario (same positions, same shards, same theta_0, same
device classes and clocks), so algorithms are compared on the same world.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cached_property

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
    uniform_frequencies_hz,
)
from wirelessfl.errors import UserError
from wirelessfl.host.allocator import keep_freed_memory
from wirelessfl.learning.datasets import Dataset
from wirelessfl.learning.flat_model import FlatModel
from wirelessfl.learning.partition import DeviceSamples, label_counts
from wirelessfl.learning.seeds import keyed_rng
from wirelessfl.plugins import problem_spec
from wirelessfl.problems.base import Problem
from wirelessfl.results.records import accuracy_sample, partition_manifest
from wirelessfl.scenario.schema import Scenario


def torch_device(requested: str) -> torch.device:
    """The torch device for ``device: cpu|cuda|auto``; a clean error when cuda is missing. A GPU
    run computes with torch's deterministic kernels (``deterministic_gpu``)."""
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise UserError("device: 'cuda' was requested but torch sees no CUDA GPU here; "
                        "set 'device: cpu' (or 'auto') or install a CUDA build of torch")
    if requested == "cuda":
        deterministic_gpu()
    return torch.device(requested)


def deterministic_gpu() -> None:
    """Same scenario and seed, same numbers on a GPU too: cuBLAS with a fixed workspace (its
    split-K reductions otherwise depend on the stream's workspace, NVIDIA's cuBLAS guide,
    "Results reproducibility"), cuDNN's deterministic convolution algorithms and no autotuning,
    and torch's deterministic kernels for scatter-adds and index-adds
    (``torch.use_deterministic_algorithms``) [D]; and float32 computed as float32: no TF32 in
    matrix products or convolutions (torch turns it on for cuDNN's convolutions by default), so
    a GPU run follows the CPU's numbers to float32 roundings (tests/test_cuda.py) [D]. For the
    whole process: a program that runs a GPU scenario has asked for reproducible GPU numbers.
    ``warn_only``: an operation torch has no deterministic kernel for warns instead of failing
    the run (benchmarks/cuda_check.py records that no shipped scenario reaches one)."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.use_deterministic_algorithms(True, warn_only=True)


@dataclass
class World:
    """The cell, the devices' hardware and the learning problem. ``evaluator`` is any
    ``Problem`` (algorithms use it as ``ctx.evaluator``); ``dataset``, ``shards`` and ``flat``
    are what the problem's builder gives (None for a problem without data; ``flat`` only for a
    zoo model; ``shards`` every device's training indices as index sets, ``DeviceSamples``).
    Device i has the energy profile
    ``class_profiles[device_class[i]]`` and, with ``population.cpu_frequency``, the clock
    ``frequency_hz[i]``; drawn from the scenario when not given."""

    scenario: Scenario
    cell: Cell
    dataset: Dataset | None
    shards: DeviceSamples | None
    flat: FlatModel | None
    model_profile: ModelProfile
    evaluator: Problem
    device: torch.device
    class_names: list[str] = field(default_factory=list)
    class_profiles: list[EnergyProfile] = field(default_factory=list)
    device_class: np.ndarray | None = None  # [N] index into class_names
    frequency_hz: np.ndarray | None = None  # [N] CPU clocks [Hz]; None: each profile's own

    def __post_init__(self) -> None:
        if self.shards is not None:  # a plugin problem's list of index arrays, say
            self.shards = DeviceSamples.coerce(self.shards)
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
        return self.device_class_array().tolist()

    def device_class_array(self) -> np.ndarray:
        """[N] object array of each device's class name (one str object per class, shared)."""
        return np.asarray(self.class_names, dtype=object)[self.device_class]

    @cached_property
    def device_ranks(self) -> np.ndarray:
        """[N] a random permutation of the devices (stream (seed, "device-sample")): which
        devices the per-device outputs of a large population sample (results/records.py
        ``sample_by_rank``), the same for every algorithm of the run."""
        return keyed_rng(self.scenario.seed, "device-sample").permutation(self.num_devices)

    @cached_property
    def accuracy_devices(self) -> np.ndarray | None:
        """Devices whose accuracies the rounds rows list (results/records.py
        ``accuracy_sample``: a sample above FULL_OUTPUT_DEVICES, None for every device), the
        same for every algorithm of the run and for the manifest that names them."""
        return accuracy_sample(self.device_ranks)

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
        drawn = None
        if self.shards.with_replacement:  # the population outgrew the data (or m was given)
            train = len(self.dataset.y_train)
            drawn = {"with_replacement": True, "samples_drawn": len(self.shards.order),
                     "training_samples_on_devices":
                         train - round(self.scenario.data.server_fraction * train)}
        return partition_manifest(config.scheme, config.params(), self.label_counts(),
                                  self.device_ranks, drawn)

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
    """Place devices (stream (seed, "placement")), then build the registered problem."""
    keep_freed_memory()  # the round's large temporaries reuse heap memory (host/allocator.py)
    seed, n = scenario.seed, scenario.population.num_devices
    device = torch_device(scenario.device)
    if scenario.population.distances_m is not None:
        cell = Cell.from_distances(np.asarray(scenario.population.distances_m, float),
                                   scenario.channel, keyed_rng(seed, "placement"))
    else:
        cell = Cell.build(n, scenario.channel, keyed_rng(seed, "placement"))
    built = problem_spec(scenario.problem.name).build(scenario, device)
    return World(scenario, cell, built.dataset, built.shards, built.flat, built.model_profile,
                 built.problem, device)
