"""Classification: a model from the zoo trained on a dataset split over the devices.

f_i is the mean cross-entropy over device i's samples (+ model.l2/2 ||theta||^2), computed for
all devices at once by ``BatchedEvaluator`` (problems/classifier.py). The problem reads the
``data``, ``model`` and ``partition`` sections; its own section has one key.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import torch
from pydantic import Field

from wirelessfl.contract.problem import ProblemFacts
from wirelessfl.energy import profile_model
from wirelessfl.energy.profiler import ModelProfile
from wirelessfl.errors import UserError
from wirelessfl.learning.datasets import DataFacts
from wirelessfl.learning.flat_model import FlatModel
from wirelessfl.learning.models import MODEL_NAMES, build_model
from wirelessfl.learning.seeds import stream_key
from wirelessfl.problems.base import BuiltProblem, ProblemConfig, ProblemSpec
from wirelessfl.problems.classifier import BatchedEvaluator, DeviceData
from wirelessfl.problems.data import (
    check_partition,
    selected_classes,
    server_keeps_data,
    split_data,
)
from wirelessfl.problems.data_size import (
    SAMPLE_BYTES,
    classifier_sample_bytes,
    data_bytes,
    drawn_samples,
)

if TYPE_CHECKING:
    from wirelessfl.scenario.schema import Scenario


class ClassificationConfig(ProblemConfig):
    """``problem: {name: classification}`` (the default problem)."""

    train_metrics: bool = Field(
        False, description="classification: compute grad_norm_sq over the training set at "
                           "evaluation points (one extra pass over it each time; default false, "
                           "always on when f* is known: logistic with model.l2 > 0)")


def training_passes(scenario: Scenario) -> bool:
    """Whether evaluations pass over the whole training set: training-set metrics cost a pass
    at each evaluation, on when the scenario asks and always when the optimum is known (their
    point is f - f* then: logistic with model.l2 > 0)."""
    return bool(scenario.problem.train_metrics) or (scenario.model.name == "logistic"
                                                    and scenario.model.l2 > 0)


def build(scenario: Scenario, device: torch.device) -> BuiltProblem:
    """Split the data (``split_data``), build the model (initialised from the stream (seed,
    "init")) and the batched evaluator over the devices' shards."""
    split = split_data(scenario)
    dataset, server, shards = split.dataset, split.server, split.shards
    model = build_model(scenario.model.name, dataset.input_shape, dataset.num_classes,
                        hidden=tuple(scenario.model.hidden),
                        seed=stream_key(scenario.seed, "init") % 2**31,
                        options=scenario.model.options)
    model_profile = profile_model(model, dataset.input_shape)
    model = model.to(device)
    flat = FlatModel(model)
    data = DeviceData.from_index_sets(dataset.x_train, dataset.y_train, shards.order,
                                      shards.sizes, dataset.x_test, dataset.y_test, device,
                                      server=server)
    evaluator = BatchedEvaluator(flat, data, model_profile.activations_per_sample,
                                 model_profile.input_size, scenario.engine.max_chunk_mb,
                                 l2=scenario.model.l2)
    evaluator.train_metrics = training_passes(scenario)
    if scenario.model.name == "logistic" and scenario.model.l2 > 0:
        evaluator.solve_optimum()  # strongly convex: f* and x* by a reference solve, once
    return BuiltProblem(evaluator, model_profile, dataset, shards, flat)


def check(scenario: Scenario, facts: DataFacts | None) -> None:
    """The model fits the data's input shape; every device gets samples; a plugin model builds."""
    shape = facts.input_shape if facts is not None else None
    if shape is not None:
        check_model(scenario.model.name, shape, scenario.data.name)
    check_partition(scenario, facts)
    check_plugin_model(scenario, facts)


def check_plugin_model(scenario: Scenario, facts: DataFacts | None) -> None:
    """A plugin model is built once for the data's input shape (learning/models.py
    ``build_model``), so that its own failures and a wrong return type are found by
    ``validate``; the built-ins' conditions are ``check_model``'s, without building."""
    model = scenario.model
    shape = facts.input_shape if facts is not None else None
    if model.name in MODEL_NAMES or shape is None:
        return
    build_model(model.name, shape, selected_classes(scenario, facts) or 2, options=model.options)


def check_model(model: str, shape: tuple[int, ...], dataset: str) -> None:
    """learning/models.py ``build_model``'s conditions on the input shape."""
    if model == "seed002-cnn" and (len(shape) != 3 or min(shape[1:]) < 14):
        raise UserError(f"model 'seed002-cnn' needs image inputs (channels, height, width) of at "
                        f"least 14x14 pixels, but dataset '{dataset}' has shape {shape}; use "
                        "dataset 'digits28', 'mnist', 'fashionmnist' or 'cifar10'")
    if model == "resnet18-cifar" and (len(shape) != 3 or min(shape[1:]) < 8):
        raise UserError(f"model 'resnet18-cifar' needs image inputs (channels, height, width) of "
                        f"at least 8x8 pixels, but dataset '{dataset}' has shape {shape}; it is "
                        "built for 3x32x32 (CIFAR-10): use an image dataset (cifar10, digits28, "
                        "mnist, fashionmnist) or model mlp")


def memory(scenario: Scenario, limit_bytes: float) -> ProblemFacts:
    """The data (``data_bytes``) and the model, built on the CPU to count its parameters and
    activations (the dataset is not loaded)."""
    data = data_bytes(scenario, limit_bytes)
    share = (drawn_samples(scenario, data.on_devices) or data.on_devices) \
        / max(scenario.population.num_devices, 1)
    per_entry = classifier_sample_bytes(scenario, share, training_passes(scenario))
    data = replace(data, held=data.held + (per_entry - SAMPLE_BYTES) * data.entries)
    shape, classes, test = data.shape.input_shape, data.shape.classes, data.shape.test
    if max(data.held, data.load) > limit_bytes:  # no model needed to refuse
        return ProblemFacts(0, 4, data.held, data.load, data.on_devices, test, data.input_size,
                            0, classes)
    if not all(shape):
        return ProblemFacts(0, 4, 0, 0)  # files missing or unreadable: the loader says which
    prof, d = _model_size(scenario, shape, classes)
    return ProblemFacts(d, 4, data.held, data.load, data.on_devices, test, prof.input_size,
                        prof.activations_per_sample, classes)


def _model_size(scenario: Scenario, shape: tuple[int, ...], classes: int
                ) -> tuple[ModelProfile, int]:
    """The model's profile and d, counted on torch's meta device (shapes, no storage), so a
    model too large for the machine is sized, and refused, without being allocated; a plugin
    model that cannot be built there is built on the CPU."""
    def size(device: str | None) -> tuple[ModelProfile, int]:
        model = build_model(scenario.model.name, shape, classes,
                            hidden=tuple(scenario.model.hidden), options=scenario.model.options,
                            device=device)
        return profile_model(model, shape), sum(v.numel() for v in model.parameters())

    try:
        return size("meta")
    except Exception:  # noqa: BLE001 - a plugin's own code that needs real tensors: the CPU
        return size(None)  # build gives its true error, if it has one


def constants(scenario: Scenario, facts: DataFacts | None) -> set[str]:
    """A classifier's constants are unknown (none)."""
    return set()


def unrecorded(scenario: Scenario) -> dict[str, str]:
    """grad_norm_sq needs a pass over the training set, made only when ``training_passes``."""
    if training_passes(scenario):
        return {}
    return {"grad_norm_sq": "records only with problem.train_metrics: true (one pass over the "
                            "training set per evaluation); set it, or use target_accuracy or "
                            "target_loss instead"}


SPEC = ProblemSpec(
    name="classification", Config=ClassificationConfig, build=build, memory=memory,
    check=check, constants=constants, server_loss=server_keeps_data, unrecorded=unrecorded,
    reads_data=True,
    summary="a zoo model on a dataset split over devices (data, model, partition)")
