"""The learning-problem plugin contract, and the one interface algorithms compute with.

**What algorithms see.** Every algorithm reaches its learning problem through ``ctx.evaluator``,
a ``Problem``: N devices, device i holding a local objective f_i, and the global objective

    f(x) = (1/N) sum_i f_i(x)                                      (fedred.md, Sec. 1.1)

with x = theta a flat vector [d]. Shapes: N devices, d parameters, b samples per minibatch, E
local steps; ``models`` [n, d] holds one model per device of a chunk of n devices, ``idx``
[n, b] their minibatches (as ``sample`` returned them, rows of the same devices). Multi-sequence
and bilevel problems (FedMSA, FedNest) extend it (problems/bilevel.py ``MSAProblem``,
``BilevelProblem``).

**What a scenario names.** ``problem: {name: NAME, <keys>}`` resolves NAME in the ``PROBLEMS``
registry (wirelessfl/plugins.py: built-ins, registered, entry points of the group
``wirelessfl.problems``, or a ``module:attribute`` reference) to a ``ProblemSpec``. A spec is
everything the package knows of a problem, kept beside its ``Problem`` class so that adding a
problem edits no other module:

* ``Config``: a ``ProblemConfig`` subclass, the ``problem:`` section's keys with their defaults
  (cited) and its own rules between them. The scenario validates the section with it; a key
  that another registered problem reads is refused as "only read by problem ...". What it
  dumps (``None`` values left out) is what the manifest records, so keep field order stable.
* ``build(scenario, device) -> BuiltProblem``: the ``Problem`` (and, for a problem on data,
  the dataset and its split) from the resolved scenario; seeded only from keyed streams of
  ``scenario.seed`` so the same scenario gives the same problem.
* ``memory(scenario, limit_bytes) -> ProblemFacts``: its size from the scenario alone, for the
  memory estimate (pipeline/memory.py), without building it.
* ``fit(scenario)``: rules across sections (raise ``ValueError``; e.g. one device per client),
  run at the end of the scenario's validation; may fill in values (``clients``).
* ``check(scenario, facts)``: what would only fail once built, checked from the scenario and
  the data's cheap facts (``facts`` is None unless ``reads_data``); raise ``UserError``.
* ``constants(scenario, facts)``: the problem constants its ``Problem.constants`` will hold (the
  drift-corrected methods' default rules read them), None when only building tells;
  ``server_loss(scenario, facts)``: whether the base station holds a loss of its own.
* ``unrecorded(scenario)``: the rounds columns a target reads (scenario/schema.py
  ``TARGET_COLUMNS``: ``grad_norm_sq``, ``worst_device_accuracy``) that the problem leaves NaN
  in this scenario, each with the rest of the sentence that says so and names the fix ("does
  not record ...; remove it and use ..."). The scenario refuses a target on such a column, as
  it could never be met; a problem that omits the hook records them all (a plugin is taken at
  its word).
* capabilities: ``reads_data`` (the ``data`` section is read: its files are checked),
  ``multi_sequence`` (an ``MSAProblem``: FedMSA runs on it and single-level methods do not),
  ``compositional`` (an ``MSAProblem`` with ``pooled_gradient``: centralized SGD runs on it),
  ``bilevel`` (a ``BilevelProblem``: FedNest runs on it).

Algorithms that need a kind of problem check a capability, never a name (pipeline/preflight.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

# The interfaces and the section base are re-exported here: the plugin contract
# (docs/plugins.md) names them from this module.
from wirelessfl.contract.problem import KEY_LIMIT, Problem, ProblemFacts
from wirelessfl.energy.profiler import ModelProfile
from wirelessfl.scenario import schema
from wirelessfl.scenario.problem_section import ProblemConfig, default_field, problems_reading

if TYPE_CHECKING:
    from wirelessfl.learning.datasets import DataFacts, Dataset
    from wirelessfl.learning.flat_model import FlatModel
    from wirelessfl.learning.partition import DeviceSamples
    from wirelessfl.scenario.schema import Scenario

__all__ = ["ALL_CONSTANTS", "KEY_LIMIT", "BuiltProblem", "Problem", "ProblemConfig",
           "ProblemFacts", "ProblemSpec", "default_field", "one_device_per_client",
           "problem_check", "problems_reading", "refuse_data_sections", "similarity_constants",
           "unread_section", "without_device_accuracy"]


# ---- the quadratic ------------------------------------------------------------------------------


def similarity_constants(a: np.ndarray) -> dict[str, float]:
    """L, mu and the Hessian dissimilarities of quadratics with Hessians a [n, d, d] (fedred.md
    Sec. 1.3): L = max_i ||A_i||, mu = min_i lambda_min(A_i), delta_A = sqrt(mean_i ||A_i - A||^2)
    (the paper's formula), delta_A_exact = sqrt(lambda_max(mean_i (A_i - A)^2)) (the smallest
    constant of Definition 2), delta_B = max_i ||A_i - A|| (spectral norms, A = mean_i A_i)."""
    eig = np.linalg.eigvalsh(a)
    dev = a - a.mean(0)
    dev_norms = np.abs(np.linalg.eigvalsh(dev)).max(axis=1) if len(a) else np.zeros(0)
    exact = np.linalg.eigvalsh(np.einsum("nij,njk->ik", dev, dev) / len(a))[-1]
    return {"L": float(np.abs(eig).max()), "mu": float(eig[:, 0].min()),
            "delta_A": float(np.sqrt(np.mean(dev_norms**2))),
            "delta_A_exact": float(np.sqrt(max(exact, 0.0))), "delta_B": float(dev_norms.max())}


# What similarity_constants gives; a problem's ``constants`` hook answers with a subset of it.
ALL_CONSTANTS = frozenset({"L", "mu", "delta_A", "delta_A_exact", "delta_B"})


# ---- the plugin contract ----------------------------------------------------------------------
@dataclass
class BuiltProblem:
    """What a problem's builder hands the world: the ``Problem`` the algorithms use, the compute
    profile its devices are priced with (default: ``problem.model_profile``) and, for a problem
    on data split over devices, the dataset, each device's training indices and the flat model
    (``World.dataset``, ``shards``, ``flat``; None otherwise)."""

    problem: Problem
    model_profile: ModelProfile | None = None
    dataset: Dataset | None = None
    shards: DeviceSamples | None = None
    flat: FlatModel | None = None

    def __post_init__(self) -> None:
        if self.model_profile is None:
            self.model_profile = self.problem.model_profile


def _no_rule(scenario: Scenario, *facts) -> None:
    return None


def _no_server_loss(scenario: Scenario, facts: DataFacts | None) -> bool:
    return False


def _records_every_column(scenario: Scenario) -> dict[str, str]:
    return {}


def without_device_accuracy(targets: str) -> str:
    """``unrecorded``'s sentence for a problem whose ``evaluate_devices`` is the contract's
    default (contract/problem.py: no per-device accuracy): ``targets`` serve instead."""
    return (f"does not record; remove it and use {targets} instead, or a classification or "
            "logistic problem")


@dataclass(frozen=True)
class ProblemSpec:
    """A learning problem as the registry holds it (see the module docstring for each hook)."""

    name: str
    Config: type[ProblemConfig]
    build: Callable[[Scenario, torch.device], BuiltProblem]
    memory: Callable[[Scenario, float], ProblemFacts]
    fit: Callable[[Scenario], None] = _no_rule
    check: Callable[[Scenario, DataFacts | None], None] = _no_rule
    constants: Callable[[Scenario, DataFacts | None], set[str] | None] = _no_rule
    server_loss: Callable[[Scenario, DataFacts | None], bool] = _no_server_loss
    unrecorded: Callable[[Scenario], dict[str, str]] = _records_every_column
    reads_data: bool = False
    multi_sequence: bool = False
    bilevel: bool = False
    compositional: bool = False
    summary: str = ""


def problem_check(obj) -> str | None:
    """What is wrong with ``obj`` offered as a problem (the registry's kind check)."""
    if not isinstance(obj, ProblemSpec):
        return ("is not a problem: it must be a wirelessfl.problems.base.ProblemSpec (name, "
                "Config, build, memory, ...)")
    if not (isinstance(obj.Config, type) and issubclass(obj.Config, ProblemConfig)):
        return "has a Config that is not a subclass of wirelessfl.problems.base.ProblemConfig"
    return None


# ---- rules shared by several problems ----------------------------------------------------------
def unread_section(scenario: Scenario, sections: tuple[str, ...]) -> str | None:
    """The first of ``sections`` (data, model, partition) that the scenario sets although the
    problem does not read it (it differs from its default); None when all are defaults."""
    defaults = {"data": schema.DataConfig, "model": schema.ModelConfig,
                "partition": schema.PartitionConfig}
    for key in sections:
        if getattr(scenario, key) != defaults[key]():
            return key
    return None


def one_device_per_client(scenario: Scenario, default_clients: int) -> None:
    """A problem without data has one device per client: ``problem.clients`` and
    ``population.num_devices`` agree (either one given sets the other; neither: the
    problem's default)."""
    problem = scenario.problem
    given = "num_devices" in scenario.population.model_fields_set
    n = scenario.population.num_devices
    if problem.clients is None:
        problem.clients = n if given else default_clients
    elif given and problem.clients != n:
        raise ValueError(f"problem.clients is {problem.clients} but population.num_devices is "
                         f"{n}; the quadratic has one device per client: give only one of "
                         "them, or equal values")
    if not given:
        scenario.population = schema.PopulationConfig.model_validate(
            {**scenario.population.model_dump(exclude_unset=True),
             "num_devices": problem.clients})


def refuse_data_sections(scenario: Scenario) -> None:
    """A problem without a dataset reads no data, model or partition section."""
    key = unread_section(scenario, ("data", "model", "partition"))
    if key is not None:
        raise ValueError(f"{key}: not read by problem '{scenario.problem.name}' (it has no "
                         f"dataset or model); remove the {key} section or set "
                         "problem.name: classification")
