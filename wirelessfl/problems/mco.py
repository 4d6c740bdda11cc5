"""Federated multi-level compositional optimisation (Fed-MCO, fedmsa.md Sec. 1.5 / 2.5): the
risk-averse example of the paper's Sec. 4 (fedmsa.md Sec. 4.1), N = 2.

    min_x  E[U] + lambda sqrt(E[max(0, U - E U)^2] + delta),   U(x; a, b) = (b - (a^T x)^2)^2,

written as F^2(F^1(F^0(x))) with the layers (Sec. 2.5)

    f^0(x) = (x, mean U(x))                  in R^{d+1}
    f^1(x', y) = (y, mean max(0, U(x') - y)^2)   in R^2
    f^2(y', s) = y' + lambda sqrt(s + delta)      in R

(means over the client's sample). State [x; z^1; z^2] with z^1 tracking F^0(x) and z^2 tracking
F^1(z^1); client m's maps s^1 = z^1 - f^{m,0}(x), s^2 = z^2 - f^{m,1}(z^1) and
p = grad f^{m,0}(x) grad f^{m,1}(z^1) grad f^{m,2}(z^2), each layer at its own tracker: a chain
of vector-Jacobian products by autodiff, batched over clients, no second derivatives.

Data (Sec. 4.1 with A15's fixes): a ~ N(0, Sigma), Sigma = G G^T / d, G_ij ~ N(0, 1);
x_true ~ N(0, I); b = (a^T x_true)^2 + 0.001 N(0, 1) (std 1e-3 [C]); split equally at random
over the clients. x and -x give the same U, so the error is measured up to sign (A15).
"""

from __future__ import annotations

import math
import time
from functools import partial
from typing import TYPE_CHECKING

import numpy as np
import torch
from pydantic import Field

from wirelessfl.contract.payload import Cost
from wirelessfl.contract.problem import MSAProblem, ProblemFacts, single_thread_if_small
from wirelessfl.energy.profiler import ModelProfile
from wirelessfl.errors import UserError
from wirelessfl.learning.seeds import keyed_rng
from wirelessfl.problems.base import (
    BuiltProblem,
    ProblemConfig,
    ProblemSpec,
    default_field,
    one_device_per_client,
    refuse_data_sections,
    without_device_accuracy,
)

if TYPE_CHECKING:
    from wirelessfl.learning.datasets import DataFacts
    from wirelessfl.scenario.schema import Scenario

# Defaults of `problem: {name: risk-averse-mco}` (fedmsa.md Sec. 4.1, 4.5 [C], 5.3).
MCO_DEFAULTS = {
    "clients": 2,  # M = 2 (Sec. 4.5 [C]: the MCO notebook)
    "dimension": 10,  # d = 10 (Sec. 4.1)
    "samples": 1000,  # 1,000 examples in total (Sec. 4.1)
    "risk_weight": 0.1,  # lambda = 0.1 (A15 [C])
    "risk_delta": 0.1,  # delta = 0.1 (A15 [C])
    "label_noise_std": 1e-3,  # std 0.001 (A15 [C])
    "initial_value": 0.1,  # x_0 = 0.1 * 1 (Sec. 4.5 [C]); x = 0 is a stationary point
    "sample_batch": 100,  # batch 100 (Sec. 4.5 [C])
}


class RiskAverseMCO(MSAProblem):
    """The risk-averse three-level composition (module docstring), blocks (d, d + 1, 2)."""

    name = "risk-averse-mco"

    def __init__(self, a, b, x_true, clients: int, risk_weight: float = 0.1,
                 risk_delta: float = 0.1, initial_value: float = 0.1, sample_batch: int = 100,
                 device: torch.device | str = "cpu"):
        a = np.asarray(a, dtype=np.float64)
        b = np.asarray(b, dtype=np.float64)
        n, d = a.shape
        if n % clients:
            raise UserError(f"problem.samples ({n}) must be a multiple of problem.clients "
                            f"({clients}): every client holds the same number of samples")
        self.num_devices, self.dim = clients, d
        self.blocks = (d, d + 1, 2)
        self.d = sum(self.blocks)
        self.lam, self.delta = float(risk_weight), float(risk_delta)
        self.device = torch.device(device)
        self.compute_s = 0.0
        per = n // clients
        self.a = torch.as_tensor(a.reshape(clients, per, d), device=self.device)
        self.b = torch.as_tensor(b.reshape(clients, per), device=self.device)
        self.per_client = per
        self.solution = torch.as_tensor(np.asarray(x_true, dtype=np.float64), device=self.device)
        self.initial_value = float(initial_value)
        self.batch_size = int(sample_batch)
        # per sample: a^T x (d MACs) in f^0 and again in f^1
        self.model_profile = ModelProfile(params=d, macs_per_sample=2 * d,
                                          activations_per_sample=4, input_size=d + 1)

    # ---- samples --------------------------------------------------------------------------------
    def _data(self, devices: torch.Tensor, keys: np.ndarray | None, batch: int):
        """(a [n, s, d], b [n, s]) of the rows: all local data, or ``batch`` samples drawn with
        replacement from each row's key."""
        a, b = self.a[devices], self.b[devices]
        if keys is None:
            return a, b
        idx = np.stack([np.random.default_rng(int(k)).integers(0, self.per_client, batch)
                        for k in np.asarray(keys, dtype=np.uint64)])
        idx = torch.as_tensor(idx, device=self.device)
        rows = torch.arange(len(devices), device=self.device)[:, None]
        return a[rows, idx], b[rows, idx]

    def _u(self, x, a, b):
        """U(x; a, b) [n, s] with x [n, d]."""
        return (b - torch.einsum("nsd,nd->ns", a, x).square()).square()

    def layers(self, x, z1, z2, a, b):
        """(f^0(x), f^1(z^1), f^2(z^2)) on the sample (a, b): [n, d+1], [n, 2], [n]."""
        f0 = torch.cat([x, self._u(x, a, b).mean(1, keepdim=True)], dim=1)
        x1, y = z1[:, :-1], z1[:, -1:]
        f1 = torch.cat([y, torch.clamp(self._u(x1, a, b) - y, min=0).square().mean(
            1, keepdim=True)], dim=1)
        f2 = z2[:, 0] + self.lam * torch.sqrt(torch.clamp(z2[:, 1], min=0) + self.delta)
        return f0, f1, f2

    # ---- maps ------------------------------------------------------------------------------------
    def maps(self, states, devices, keys=None):
        start = time.perf_counter()
        a, b = self._data(devices, keys, self.batch_size)
        out = self._maps_on(states, a, b)
        self.compute_s += time.perf_counter() - start
        return out

    def pooled_maps(self, states: torch.Tensor, key: int, batch: int) -> torch.Tensor:
        """``maps`` of every row on one sample of ``batch`` samples drawn with replacement from
        all M clients' samples pooled (the draw of ``pooled_gradient`` for the same key)."""
        start = time.perf_counter()
        a, b = self._pooled_sample(key, batch)
        out = self._maps_on(states, a.expand(len(states), -1, -1), b.expand(len(states), -1))
        self.compute_s += time.perf_counter() - start
        return out

    def _maps_on(self, states: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """(p, z^1 - f^0(x), z^2 - f^1(z^1)) [n, P] of each row's state on its samples (a [n, s,
        d], b [n, s]): the three layers forward and their vector-Jacobian products back."""
        d = self.dim
        s = states.to(torch.float64)
        x = s[:, :d].detach().requires_grad_(True)
        z1 = s[:, d:2 * d + 1].detach().requires_grad_(True)
        z2 = s[:, 2 * d + 1:].detach().requires_grad_(True)
        work = len(states) * a.shape[1] * self.model_profile.macs_per_sample
        with torch.enable_grad(), single_thread_if_small(work):
            f0, f1, f2 = self.layers(x, z1, z2, a, b)
            (g2,) = torch.autograd.grad(f2.sum(), z2)
            (g1,) = torch.autograd.grad(f1, z1, grad_outputs=g2)
            (p,) = torch.autograd.grad(f0, x, grad_outputs=g1)
        return torch.cat([p, (z1 - f0).detach(), (z2 - f1).detach()], dim=1)

    def evaluation_cost(self, evaluations, full_batch, batch_size):
        """One map evaluation: the three layers forward and their vector-Jacobian products
        back, priced as 1 forward + 1 backward pass of the 2d-MAC-per-sample model (no HVP;
        fedmsa.md Sec. 3.1), over the client's data or a batch of ``batch_size``."""
        batch = (np.full(self.num_devices, self.per_client) if full_batch
                 else self.batch_size)
        e = np.asarray(evaluations)
        return Cost(forward_passes=e, backward_passes=e, batch_size=batch)

    def full_batch_sizes(self) -> np.ndarray:
        return np.full(self.num_devices, self.per_client, dtype=np.int64)

    # ---- the composed objective ------------------------------------------------------------------
    def initial(self) -> torch.Tensor:
        """x_0 = initial_value * 1 (Sec. 4.5 [C]) and the trackers at their targets:
        z^1_0 = F^0(x_0), z^2_0 = F^1(z^1_0) over all data ([D])."""
        x = torch.full((self.dim,), self.initial_value, dtype=torch.float64, device=self.device)
        f0, f1 = self._global_layers(x)
        return torch.cat([x, f0, f1]).float()

    def _global_layers(self, x: torch.Tensor, a: torch.Tensor | None = None,
                       b: torch.Tensor | None = None):
        """(F^0(x), F^1(F^0(x))) over the samples (a [1, s, d], b [1, s]), by default every
        client's."""
        a = self.a.reshape(1, -1, self.dim) if a is None else a
        b = self.b.reshape(1, -1) if b is None else b
        z = x.to(torch.float64)[None]
        u = self._u(z, a, b)
        f0 = torch.cat([z, u.mean(1, keepdim=True)], dim=1)[0]
        f1 = torch.stack([u.mean(), torch.clamp(u - u.mean(), min=0).square().mean()])
        return f0, f1

    def objective(self, theta: torch.Tensor) -> float:
        """F(x) = E U + lambda sqrt(E max(0, U - E U)^2 + delta) over all data."""
        _, f1 = self._global_layers(self.x_part(theta))
        return float(f1[0] + self.lam * math.sqrt(float(f1[1]) + self.delta))

    def objective_gradient(self, theta: torch.Tensor, a: torch.Tensor | None = None,
                           b: torch.Tensor | None = None) -> torch.Tensor:
        """grad_x F at theta's x part, F over the samples (a, b) (default: all data)."""
        x = self.x_part(theta).to(torch.float64).detach().requires_grad_(True)
        with torch.enable_grad():
            _, f1 = self._global_layers(x, a, b)
            value = f1[0] + self.lam * torch.sqrt(f1[1] + self.delta)
            return torch.autograd.grad(value, x)[0]

    def pooled_gradient(self, theta: torch.Tensor, key: int, batch: int) -> torch.Tensor:
        """grad_x of the composed objective's plug-in estimate on ``batch`` samples drawn with
        replacement from all M clients' samples pooled (the authors' centralized baseline: plain
        minibatch SGD on the objective, fedmsa.md 4.5 [C]; with replacement, as the clients'
        own minibatches are drawn [D]): E U and the semi-deviation both as means over the batch,
        so the estimate of the square root's argument, and of the gradient, is biased (what
        the tracking recipe avoids)."""
        start = time.perf_counter()
        grad = self.objective_gradient(theta, *self._pooled_sample(key, batch))
        self.compute_s += time.perf_counter() - start
        return grad

    def _pooled_sample(self, key: int, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(a [1, batch, d], b [1, batch]): ``batch`` samples drawn with replacement, keyed by
        ``key``, from every client's samples pooled."""
        idx = np.random.default_rng(int(key)).integers(0, self.a.shape[0] * self.a.shape[1],
                                                        batch)
        idx = torch.as_tensor(idx, device=self.device)
        return self.a.reshape(-1, self.dim)[idx][None], self.b.reshape(-1)[idx][None]

    def grad_norm_sq(self, theta: torch.Tensor) -> float:
        g = self.objective_gradient(theta)
        return float(g @ g)

    def relative_error(self, theta: torch.Tensor) -> float:
        """min(||x - x*||, ||x + x*||) / ||x*||, x* the ground truth (A15: up to sign)."""
        x = self.x_part(theta).to(torch.float64)
        norm = torch.linalg.vector_norm
        return float(torch.minimum(norm(x - self.solution), norm(x + self.solution))
                     / norm(self.solution))

    def evaluate(self, theta: torch.Tensor) -> tuple[float, float]:
        return math.nan, self.objective(theta)

    def describe(self) -> dict:
        return {"name": self.name, "clients": self.num_devices, "d": self.d,
                "dimension": self.dim, "samples": self.per_client * self.num_devices,
                "risk_weight": self.lam, "risk_delta": self.delta,
                "solution_norm": float(torch.linalg.vector_norm(self.solution))}


def risk_averse_data(samples: int, dimension: int, noise_std: float, rng: np.random.Generator
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(a [n, d], b [n], x_true [d]) of fedmsa.md Sec. 4.1 with A15's valid covariance
    Sigma = G G^T / d, rows shuffled (the equal random split over clients)."""
    g = rng.standard_normal((dimension, dimension))
    a = rng.standard_normal((samples, dimension)) @ g.T / math.sqrt(dimension)
    x_true = rng.standard_normal(dimension)
    b = (a @ x_true) ** 2 + noise_std * rng.standard_normal(samples)
    order = rng.permutation(samples)
    return a[order], b[order], x_true


# ---- the problem as a plugin (problems/base.py) -------------------------------------------------
_key = partial(default_field, MCO_DEFAULTS)  # a key of this problem's section

class RiskAverseMCOConfig(ProblemConfig):
    """``problem: {name: risk-averse-mco}``: fedmsa.md Sec. 4.1's three-level compositional
    problem, one device per client (for ``fedmsa``)."""

    clients: int | None = Field(
        None, gt=0, description=f"risk-averse-mco: n clients = devices (default "
                                f"{MCO_DEFAULTS['clients']}, or population.num_devices)")
    dimension: int = _key("dimension", "risk-averse-mco: d (default {default})", gt=0)
    samples: int = _key("samples", "risk-averse-mco: examples in total, split equally over the "
                                   "clients (default {default})", gt=0)
    risk_weight: float = _key("risk_weight", "risk-averse-mco: lambda (default {default})", ge=0)
    risk_delta: float = _key("risk_delta", "risk-averse-mco: delta in sqrt(s + delta) (default "
                                           "{default})", gt=0)
    label_noise_std: float = _key("label_noise_std", "risk-averse-mco: std of the noise on b "
                                                     "(default {default})", ge=0)
    initial_value: float = _key("initial_value", "risk-averse-mco: x_0 = initial_value * 1 "
                                                 "(default {default}; 0 is a stationary point)")
    sample_batch: int = _key("sample_batch", "risk-averse-mco: samples per stochastic map "
                                             "evaluation (full_batch: false; default {default})",
                                             gt=0)


def build(scenario: Scenario, device: torch.device) -> BuiltProblem:
    """fedmsa.md Sec. 4.1's risk-averse composition from the ``problem`` section, data drawn from
    the stream (seed, "risk-averse-mco")."""
    p = scenario.problem
    a, b, x_true = risk_averse_data(p.samples, p.dimension, p.label_noise_std,
                                    keyed_rng(scenario.seed, "risk-averse-mco"))
    return BuiltProblem(RiskAverseMCO(a, b, x_true, p.clients, p.risk_weight, p.risk_delta,
                                      p.initial_value, p.sample_batch, device))


def fit(scenario: Scenario) -> None:
    """One device per client, no data."""
    one_device_per_client(scenario, MCO_DEFAULTS["clients"])
    refuse_data_sections(scenario)


def check(scenario: Scenario, facts: DataFacts | None) -> None:
    """Every client holds the same number of samples."""
    problem = scenario.problem
    if problem.samples % problem.clients:
        raise UserError(f"problem.samples ({problem.samples}) must be a multiple of "
                        f"problem.clients ({problem.clients}): every client holds the same "
                        "number of samples")


def memory(scenario: Scenario, limit_bytes: float) -> ProblemFacts:
    """The samples a [S, d] and b [S], float64, and copies while drawing."""
    p = scenario.problem
    held = 8 * p.samples * (p.dimension + 2)
    return ProblemFacts(p.dimension, 8, held, 3 * held)


def unrecorded(scenario: Scenario) -> dict[str, str]:
    """No per-device accuracy (a regression, no labels)."""
    return {"worst_device_accuracy": without_device_accuracy("target_loss or target_grad_norm_sq")}


SPEC = ProblemSpec(
    name="risk-averse-mco", Config=RiskAverseMCOConfig, build=build, memory=memory, fit=fit,
    check=check, unrecorded=unrecorded, multi_sequence=True, compositional=True,
    summary="fedmsa.md's three-level risk-averse compositional problem (fedmsa)")
