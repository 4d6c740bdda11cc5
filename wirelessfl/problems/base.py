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
* capabilities: ``reads_data`` (the ``data`` section is read: its files are checked),
  ``multi_sequence`` (an ``MSAProblem``: FedMSA runs on it and single-level methods do not),
  ``bilevel`` (a ``BilevelProblem``: FedNest runs on it).

Algorithms that need a kind of problem check a capability, never a name (pipeline/preflight.py).
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator

from wirelessfl.energy.profiler import ModelProfile
from wirelessfl.errors import UserError
from wirelessfl.learning.seeds import keyed_generator

if TYPE_CHECKING:
    from wirelessfl.pipeline.memory import ProblemFacts
    from wirelessfl.learning.datasets import DataFacts, Dataset
    from wirelessfl.problems.classifier import FlatModel
    from wirelessfl.learning.partition import DeviceSamples
    from wirelessfl.scenario.schema import Scenario


class Problem(ABC):
    """N devices' local objectives f_i and their mean f, batched over devices.

    Subclasses set ``num_devices``, ``d``, ``device`` and ``compute_s`` (host seconds spent in
    learning compute) and, when known, ``optimum`` x* [d] and ``optimum_value`` f* = f(x*).
    """

    num_devices: int
    d: int
    device: torch.device
    compute_s: float
    optimum_value: float | None = None
    optimum: torch.Tensor | None = None
    # Precision of local computation algorithms may use (models on the air stay float32).
    compute_dtype: torch.dtype = torch.float32

    # ---- what every problem defines ---------------------------------------------------------
    @abstractmethod
    def initial(self) -> torch.Tensor:
        """theta_0 [d], float32, a fresh copy on ``device``."""

    @abstractmethod
    def chunks(self, batch_size: int, own_model: bool) -> Iterator[slice]:
        """Consecutive slices of devices whose work fits the memory bound."""

    @abstractmethod
    def sample(self, generator: torch.Generator, batch_size: int, steps: int = 1) -> torch.Tensor:
        """Minibatches idx [steps, N, w] drawn from ``generator`` (rows in device order). Where
        a minibatch is a set of stored samples, a device holding m_i < b samples gets all of
        them once, in the first m_i slots of its row (the rest is padding the losses and
        gradients weight 0), and w = min(b, max_i m_i) (learning/minibatch.py)."""

    @abstractmethod
    def device_losses(self, theta: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """f_i(theta; idx_i) of every device at a shared theta [d]: idx [N, b] -> [N]."""

    @abstractmethod
    def stacked_losses(self, models: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """f_i(models_i; idx_i), each device at its own model, no gradient: [n, d], [n, b] -> [n]."""

    @abstractmethod
    def stacked_gradients(self, models: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """grad f_i(models_i; idx_i), each device at its own model: [n, d], [n, b] -> [n, d]."""

    @abstractmethod
    def full_gradients(self, theta: torch.Tensor, devices: np.ndarray | None = None
                       ) -> torch.Tensor:
        """Exact local gradients grad f_i over all of each device's data, at a shared point
        theta [d] or at each device's own model theta [n, d]: -> [n, d], for the devices
        ``devices`` (increasing indices; None: all N). A device's gradient reads its own data
        only, so a subset costs its own samples, not the population's (cross-device rounds)."""

    @abstractmethod
    def objective(self, theta: torch.Tensor) -> float:
        """f(theta) = (1/N) sum_i f_i(theta), exact (all data, regulariser included)."""

    @abstractmethod
    def objective_gradient(self, theta: torch.Tensor) -> torch.Tensor:
        """grad f(theta) [d], exact."""

    @abstractmethod
    def evaluate(self, theta: torch.Tensor) -> tuple[float, float]:
        """(accuracy, loss) of theta as the rounds table records them (test_accuracy, test_loss)."""

    # ---- facts a problem may know --------------------------------------------------------------
    @property
    def constants(self) -> dict[str, float] | None:
        """L, mu, delta_A, delta_A_exact, delta_B (fedred.md Sec. 1.2-1.3) when the problem knows
        or can bound them (the parameter rules of the drift-corrected methods read them); None
        for a neural network."""
        return None

    def full_batch_sizes(self) -> np.ndarray:
        """[N] samples one exact local gradient passes over (the batch a full-gradient step is
        costed at)."""
        return np.ones(self.num_devices, dtype=np.int64)

    def minibatch_sizes(self, batch_size: int) -> np.ndarray:
        """[N] samples a minibatch of ``batch_size`` really holds on each device, what its passes
        are costed at (``Cost.batch_size``): b here (the quadratic's minibatch is a noise
        level, not a set of samples); min(b, m_i) where minibatches are stored samples."""
        return np.full(self.num_devices, int(batch_size), dtype=np.int64)

    def sample_weights(self) -> np.ndarray:
        """[N] float64: device k's weight n_k in McMahan et al.'s (2017) sample-weighted
        average sum_k n_k Delta_k / sum_k n_k, for this problem's f_k: the device's sample count
        where f_k is the mean loss over its samples; equal weights (here) where there are no
        samples or f_k already carries its share of them."""
        return np.ones(self.num_devices)

    def server_sample_weight(self) -> float:
        """The base station's weight beside ``sample_weights`` when it trains on a loss of its
        own (``server_data``): here one more device's (a loss without samples)."""
        return 1.0

    def sample_devices(self, seed: int, stream: str, keys: tuple[int, ...], batch_size: int,
                       steps: int, devices: np.ndarray) -> torch.Tensor:
        """Minibatches [steps, n, w] of the devices ``devices`` only, each device's from its own
        stream keyed by (seed, stream, keys, device) (per-device random streams): a device's
        minibatches do not depend on which other devices are drawn for."""
        raise UserError(f"problem: {type(self).__name__} has no per-device random streams; set "
                        "population.random_streams: shared")

    # ---- built on the above -----------------------------------------------------------------
    def minibatches(self, seed: int, stream: str, keys: tuple[int, ...], batch_size: int,
                    steps: int, devices: np.ndarray, per_device: bool) -> torch.Tensor:
        """This round's minibatches [steps, n, w] for the devices ``devices`` (increasing
        indices), rows in their order. Shared streams: the population's draw from
        (seed, stream, keys) (``sample``), of which the devices' rows are taken, so computing a
        round's participants alone gives the numbers computing everyone gave; per-device
        streams: drawn for these devices alone (``sample_devices``)."""
        if per_device:
            return self.sample_devices(seed, stream, keys, batch_size, steps, devices)
        idx = self.sample(keyed_generator(seed, stream, *keys), batch_size, steps)
        if len(devices) == self.num_devices:
            return idx
        return idx[:, torch.as_tensor(devices, device=idx.device)]

    def row_chunks(self, count: int, batch_size: int, own_model: bool) -> Iterator[slice]:
        """Consecutive slices of ``count`` rows (devices of a round, in any selection) no larger
        than ``chunks``' first one: the memory bound of a chunk of devices, for any subset."""
        first = next(iter(self.chunks(batch_size, own_model)))
        size = first.stop - first.start
        for start in range(0, count, size):
            yield slice(start, min(start + size, count))

    def device_gradients(self, theta: torch.Tensor, idx: torch.Tensor
                         ) -> Iterator[tuple[slice, torch.Tensor]]:
        """Per-device minibatch gradients at a shared theta, chunk by chunk of idx's rows [n, b]
        (any selection of devices): (rows, [rows, d])."""
        b = idx.shape[1]
        for rows in self.row_chunks(idx.shape[0], b, own_model=True):
            start = time.perf_counter()
            models = theta.expand(rows.stop - rows.start, -1)
            grads = self.stacked_gradients(models, idx[rows])
            self.compute_s += time.perf_counter() - start
            yield rows, grads

    def local_sgd(self, theta: torch.Tensor, idx: torch.Tensor, lr: float,
                  steps: torch.Tensor | None = None) -> Iterator[tuple[slice, torch.Tensor]]:
        """Each device runs SGD from theta on its minibatches idx [E, n, b] (the rows of any
        selection of devices); yields (rows of idx, [rows, d]).

        ``steps`` [n] (optional) lets devices stop early: row i takes only its first steps[i].
        """
        num_steps, count, b = idx.shape
        for rows in self.row_chunks(count, b, own_model=True):
            start = time.perf_counter()
            models = theta.expand(rows.stop - rows.start, -1).clone()
            for e in range(num_steps):
                g = self.stacked_gradients(models, idx[e, rows])
                if steps is None:
                    models.sub_(g, alpha=lr)
                else:
                    keep = (e < steps[rows]).to(device=self.device, dtype=g.dtype)[:, None]
                    models.sub_(g * keep, alpha=lr)
            self.compute_s += time.perf_counter() - start
            yield rows, models

    def stacked_losses_and_gradients(self, models: torch.Tensor, idx: torch.Tensor
                                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """(f_i(models_i; idx_i) [n], grad f_i(models_i; idx_i) [n, d]): the loss and the
        gradient of one minibatch at each device's own model (one pass where the problem can)."""
        return self.stacked_losses(models, idx), self.stacked_gradients(models, idx)

    def evaluate_devices(self, theta: torch.Tensor) -> tuple[float, float, np.ndarray | None]:
        """``evaluate``'s (accuracy, loss) and the [N] accuracy of theta on each device's own
        test distribution (None for a problem without accuracy, such as the quadratic)."""
        return (*self.evaluate(theta), None)

    def suboptimality(self, theta: torch.Tensor) -> float:
        """f(theta) - f*, NaN when f* is unknown."""
        if self.optimum_value is None:
            return math.nan
        return self.objective(theta) - self.optimum_value

    def grad_norm_sq(self, theta: torch.Tensor) -> float:
        """||grad f(theta)||^2, in float64."""
        g = self.objective_gradient(theta).double()
        return float(g @ g)

    def metrics(self, theta: torch.Tensor) -> dict:
        """What the rounds table records at an evaluation point (``device_accuracy``: [N] or
        None)."""
        accuracy, loss, devices = self.evaluate_devices(theta)
        return {"test_accuracy": float(accuracy), "test_loss": float(loss),
                "suboptimality": float(self.suboptimality(theta)),
                "grad_norm_sq": float(self.grad_norm_sq(theta)),
                "device_accuracy": devices}

    def server_gradient(self, theta: torch.Tensor, generator: torch.Generator,
                        batch_size: int) -> torch.Tensor:
        """Minibatch gradient [d] of the base station's own loss (seed 000's f_1), for problems
        whose base station holds data; others refuse with a clear message."""
        raise UserError(f"this algorithm needs a loss held by the base station, which problem "
                        f"'{type(self).__name__}' does not have; set data.server_fraction > 0 "
                        "(classification) or problem.server_loss: true (quadratic)")

    def describe(self) -> dict:
        """Facts for the run manifest (``problem`` entry)."""
        return {"d": self.d, "optimum_value": self.optimum_value}


# ---- the quadratic ------------------------------------------------------------------------------
KEY_LIMIT = 2**62


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


# ---- the plugin contract ------------------------------------------------------------------------
class ProblemConfig(BaseModel):
    """The ``problem:`` section of one problem: subclass it with the problem's keys and their
    defaults. Unknown keys are typos (refused); NaN and inf never a meaningful setting. A key
    given as null counts as not given (its default applies), as it always has."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str = Field(description="the problem: a built-in name (wirelessfl list), a registered "
                                  "or installed plugin, or a 'module:attribute' reference")

    @model_validator(mode="before")
    @classmethod
    def _keys_of_other_problems(cls, data):
        """Drop null keys; refuse a key only another problem reads, naming that problem (a
        plain unknown key is left to ``extra="forbid"``)."""
        if not isinstance(data, dict):
            return data
        data = {k: v for k, v in data.items() if v is not None or k == "name"}
        for key in data:
            if key in cls.model_fields:
                continue
            readers = problems_reading(key)
            if readers:
                names = " or ".join(map(repr, readers))
                raise ValueError(f"'{key}' is only read by problem {names} but name is "
                                 f"{data.get('name')!r}; remove it or set name: {readers[0]}")
        return data

    @model_serializer(mode="wrap")
    def _only_given(self, handler):
        """Leave out what is None (not given, no default): the dump validates again as is."""
        return {k: v for k, v in handler(self).items() if v is not None}


def default_field(defaults: dict, key: str, description: str, **constraints):
    """``Field(defaults[key], ...)`` of a problem's key: the default comes from the problem's
    cited defaults table and ``{default}`` in the description shows it."""
    value = defaults[key]
    shown = f"{value:g}" if isinstance(value, float) else value
    return Field(value, description=description.format(default=shown), **constraints)


def problems_reading(key: str) -> list[str]:
    """The problems whose section has ``key`` (built-ins in registry order, then those loaded
    in this process): what the "only read by problem" message names."""
    from wirelessfl.plugins import PROBLEMS

    return [name for name, spec in PROBLEMS.loaded().items() if key in spec.Config.model_fields]


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
    reads_data: bool = False
    multi_sequence: bool = False
    bilevel: bool = False
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
    from wirelessfl.scenario import schema

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
    from wirelessfl.scenario.schema import PopulationConfig

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
        scenario.population = PopulationConfig.model_validate(
            {**scenario.population.model_dump(exclude_unset=True),
             "num_devices": problem.clients})


def refuse_data_sections(scenario: Scenario) -> None:
    """A problem without a dataset reads no data, model or partition section."""
    key = unread_section(scenario, ("data", "model", "partition"))
    if key is not None:
        raise ValueError(f"{key}: not read by problem '{scenario.problem.name}' (it has no "
                         f"dataset or model); remove the {key} section or set "
                         "problem.name: classification")
