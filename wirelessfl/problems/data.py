"""What the problems on a dataset split over the devices share (classification, logistic): the
split itself, its checks before a run, and whether the base station keeps a share.

They share one split so that a classifier and a logistic regression on the same scenario see the
same devices' data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from wirelessfl.errors import UserError
from wirelessfl.learning.datasets import DataFacts, Dataset, load_dataset
from wirelessfl.learning.partition import partition
from wirelessfl.learning.seeds import keyed_rng

if TYPE_CHECKING:
    from wirelessfl.scenario.schema import Scenario


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


def selected_classes(scenario: Scenario, facts: DataFacts | None) -> int | None:
    """Labels the learner sees after the label selection (None when only loading tells)."""
    data = scenario.data
    if data.classes is not None:
        return len(data.classes)
    if data.positive_classes is not None:
        return 2
    return facts.labels if facts is not None else None


def check_partition(scenario: Scenario, facts: DataFacts | None) -> None:
    """Every device gets samples (learning/partition.py); known only without a label selection,
    which changes the count."""
    if facts is None:
        return
    data, config, n = scenario.data, scenario.partition, scenario.population.num_devices
    classes = selected_classes(scenario, facts)
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


def server_keeps_data(scenario: Scenario, facts: DataFacts | None) -> bool:
    """The base station holds a loss of its own: ``data.server_fraction`` leaves it samples."""
    fraction = scenario.data.server_fraction
    train = facts.train_samples if facts is not None else None
    return fraction > 0 and (train is None or round(fraction * train) > 0)
