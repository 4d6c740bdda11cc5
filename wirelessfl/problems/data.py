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
from wirelessfl.learning.partition import DeviceSamples, drawn_count, partition
from wirelessfl.learning.seeds import keyed_rng

if TYPE_CHECKING:
    from wirelessfl.scenario.schema import Scenario


@dataclass
class SplitData:
    """The dataset and who holds what: ``server`` the training indices the base station keeps
    (sorted), ``shards`` each device's training indices (index sets into the whole training
    set, ``DeviceSamples``)."""

    dataset: Dataset
    server: np.ndarray
    shards: DeviceSamples


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
    return SplitData(dataset, server, shards.mapped(on_devices))


def selected_classes(scenario: Scenario, facts: DataFacts | None) -> int | None:
    """Labels the learner sees after the label selection (None when only loading tells)."""
    data = scenario.data
    if data.classes is not None:
        return len(data.classes)
    if data.positive_classes is not None:
        return 2
    return facts.labels if facts is not None else None


def check_partition(scenario: Scenario, facts: DataFacts | None) -> None:
    """What would stop the split (learning/partition.py), known before loading: more classes per
    device than the set has, ``rare_classes`` naming labels the set does not have (the labels
    after the label selection: ``data.classes`` renumbers its labels 0..k-1,
    ``positive_classes`` makes them 0 and 1), or ``samples_per_device`` below what the scheme
    gives a device.

    A population larger than the training set allows (N x the fewest samples a device may hold
    > the samples on devices) is not refused: every device then draws its samples from the whole
    set, with replacement across devices (learning/partition.py, module docstring; the manifest's
    ``partition.with_replacement`` says so)."""
    config = scenario.partition
    if config.samples_per_device is not None:
        drawn_count(config.samples_per_device, config.scheme, config.params())
    if facts is None:
        return
    classes = selected_classes(scenario, facts)
    if config.scheme == "label-skew" and classes is not None \
            and config.classes_per_device > classes:
        raise UserError(f"partition.classes_per_device={config.classes_per_device} exceeds the "
                        f"{classes} classes in the training set; lower it")
    unknown = sorted({int(c) for c in config.rare_classes or ()
                      if classes is not None and not 0 <= c < classes})
    if unknown:
        raise UserError(f"partition.rare_classes lists {unknown}, which the training set does not "
                        f"hold; its labels are {list(range(classes))}: list labels below "
                        f"{classes} or drop the key")


def server_keeps_data(scenario: Scenario, facts: DataFacts | None) -> bool:
    """The base station holds a loss of its own: ``data.server_fraction`` leaves it samples."""
    fraction = scenario.data.server_fraction
    train = facts.train_samples if facts is not None else None
    return fraction > 0 and (train is None or round(fraction * train) > 0)
