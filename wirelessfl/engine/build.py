"""From a Scenario to live parts: the cell, the data on devices, the model, the evaluator.

Everything here is shared by all algorithms of a scenario (same positions, same shards, same
theta_0), so algorithms are compared on the same world.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from wirelessfl.channel import Cell, Downlink, Uplink
from wirelessfl.energy import ComputeModel, ModelProfile, profile_model
from wirelessfl.engine.allocator import keep_freed_memory
from wirelessfl.errors import UserError
from wirelessfl.learning.datasets import Dataset, load_dataset
from wirelessfl.learning.evaluator import BatchedEvaluator, DeviceData, FlatModel
from wirelessfl.learning.models import build_model
from wirelessfl.learning.partition import label_counts, partition
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
    scenario: Scenario
    cell: Cell
    dataset: Dataset
    shards: list[np.ndarray]
    flat: FlatModel
    model_profile: ModelProfile
    evaluator: BatchedEvaluator
    device: torch.device

    @property
    def num_devices(self) -> int:
        return self.scenario.population.num_devices

    def uplink(self) -> Uplink:
        return Uplink(self.cell, self.scenario.channel)

    def downlink(self) -> Downlink:
        return Downlink(self.cell, self.scenario.channel)

    def compute_model(self, bits: int) -> ComputeModel:
        return ComputeModel(self.scenario.energy, self.model_profile, bits)

    def label_counts(self) -> np.ndarray:
        """[N, C] training samples of each class on each device."""
        return label_counts(self.dataset.y_train, self.shards, self.dataset.num_classes)

    def partition_record(self) -> dict:
        """What the manifest records about the split (hand it to ``RunWriter(partition=...)``)."""
        config = self.scenario.partition
        return partition_manifest(config.scheme, config.params(), self.label_counts())


def build_world(scenario: Scenario) -> World:
    """Place devices, load and split the data, build the model and the evaluator."""
    keep_freed_memory()  # the round's large temporaries reuse heap memory (engine/allocator.py)
    seed, n = scenario.seed, scenario.population.num_devices
    device = torch_device(scenario.device)
    if scenario.population.distances_m is not None:
        cell = Cell.from_distances(np.asarray(scenario.population.distances_m, float),
                                   scenario.channel, keyed_rng(seed, "placement"))
    else:
        cell = Cell.build(n, scenario.channel, keyed_rng(seed, "placement"))
    dataset = load_dataset(scenario.data, seed)
    shards = partition(scenario.partition.scheme, dataset.y_train, n, keyed_rng(seed, "partition"),
                       **scenario.partition.params())
    model = build_model(scenario.model.name, dataset.input_shape, dataset.num_classes,
                        hidden=tuple(scenario.model.hidden),
                        seed=stream_key(seed, "init") % 2**31)
    model_profile = profile_model(model, dataset.input_shape)
    model = model.to(device)
    flat = FlatModel(model)
    data = DeviceData.from_shards(dataset.x_train, dataset.y_train, shards, dataset.x_test,
                                  dataset.y_test, device)
    evaluator = BatchedEvaluator(flat, data, model_profile.activations_per_sample,
                                 model_profile.input_size, scenario.engine.max_chunk_mb)
    return World(scenario, cell, dataset, shards, flat, model_profile, evaluator, device)
