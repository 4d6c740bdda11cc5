"""Multi-sequence stochastic approximation (MSA) problems: federated bilevel optimisation.

FedMSA (fedmsa.md, seed 001) does not minimise one f_i; it zeroes a chain of per-client maps
(fedmsa.md Sec. 1.1-1.2). The run's state theta is the flat vector [x; z^1; ...; z^N] whose
blocks have sizes ``blocks`` = (d_0, d_1, ..., d_N), and client m's map evaluation returns a
vector of the same layout, [p^m(x, Z); s^{m,1}; ...; s^{m,N}], so a step is
theta <- theta - steps * maps with one step size per block.

Bilevel instance (Sec. 1.4, N = 1, z = [w; v]), with the eq. (10) sign convention (A1, A2):

    p^m   = grad_x f^m(x, w) - grad^2_xw g^m(x, w) v          [d_x]
    s_w^m = grad_w g^m(x, w)                                 [d_w]
    s_v^m = grad^2_ww g^m(x, w) v - grad_w f^m(x, w)         [d_w]

``BilevelProblem.maps`` computes them by autodiff, batched over devices (the devices' losses are
summed, each device's variables are its own rows, so one backward gives every device's
gradient): one backward of the inner loss with the graph kept gives grad_w g, and one double
backward of <grad_w g, v> with respect to (w, x) gives the Hessian-vector product grad^2_ww g v
and the mixed Jacobian-vector product grad^2_xw g v in the same pass (Sec. 2.4 [D]). One map
evaluation is costed as 2 forward, 2 backward passes and 1 Hessian-vector product (Sec. 3.1).

``BilevelQuadratic``: the synthetic problem of fedmsa.md Sec. 5.1 with closed-form solution,
g^m = 1/2 w^T A_m w - w^T B_m x, f^m = 1/2 ||w - c_m||^2 + mu/2 ||x||^2.
"""

from __future__ import annotations

import math
from functools import partial
from typing import TYPE_CHECKING

import numpy as np
import torch
from pydantic import Field

from wirelessfl.contract.problem import (
    BilevelProblem,
    ProblemFacts,
)
from wirelessfl.energy.profiler import ModelProfile
from wirelessfl.learning.seeds import keyed_normals, keyed_rng
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
    from wirelessfl.scenario.schema import Scenario

# Defaults of the `problem: {name: bilevel-quadratic}` scenario section (fedmsa.md Sec. 5.1 [D]).
BILEVEL_QUADRATIC_DEFAULTS = {
    "clients": 10,  # M = 10 (fedmsa.md Sec. 5.1)
    "dimension_x": 10,  # d_x = 10 (Sec. 5.1)
    "dimension_w": 20,  # d_w = 20 (Sec. 5.1)
    # h, the spread of client data (Sec. 5.1: {0, 0.3, 1.0}; 0.3 in its sanity numbers)
    "heterogeneity": 0.3,
    "mu": 1.0,  # mu of the outer regulariser (Sec. 5.1)
    "noise_std": 0.0,  # sigma of each oracle call (Sec. 5.1: {0, 0.1})
}


def bilevel_quadratic(clients: int, dimension_x: int, dimension_w: int, heterogeneity: float,
                      rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A [M, d_w, d_w], B [M, d_w, d_x], c [M, d_w] of fedmsa.md Sec. 5.1's construction:
    G_0 ~ N(0,1)/sqrt(d_w), B_0 ~ N(0,1)/sqrt(d_x), c_0 ~ N(0, I); per client
    G_m = G_0 + h N/sqrt(d_w), A_m = 0.5 I + 1/2 G_m G_m^T, B_m = B_0 + h N/sqrt(d_x),
    c_m = c_0 + h N(0, I)."""
    m, dx, dw, h = clients, dimension_x, dimension_w, heterogeneity
    g0 = rng.standard_normal((dw, dw)) / math.sqrt(dw)
    b0 = rng.standard_normal((dw, dx)) / math.sqrt(dx)
    c0 = rng.standard_normal(dw)
    g = g0 + h * rng.standard_normal((m, dw, dw)) / math.sqrt(dw)
    a = 0.5 * np.eye(dw) + 0.5 * np.einsum("mij,mkj->mik", g, g)
    b = b0 + h * rng.standard_normal((m, dw, dx)) / math.sqrt(dx)
    c = c0 + h * rng.standard_normal((m, dw))
    return a, b, c


class BilevelQuadratic(BilevelProblem):
    """g^m = 1/2 w^T A_m w - w^T B_m x, f^m = 1/2 ||w - c_m||^2 + mu/2 ||x||^2 (fedmsa.md
    Sec. 2.4 / 5.1).

    Closed form (Sec. 5.1): with A, B, c the client means, G = A^{-1} B, w*(x) = G x,
    x* = (G^T G + mu I)^{-1} G^T c, v* = A^{-1}(G x* - c); the outer objective is
    F(x) = (1/M) sum_m f^m(x, G x), with gradient G^T (G x - c) + mu x.
    Stochastic oracle (Sec. 5.1): a call with key k perturbs A_m by sym(sigma E)/sqrt(d_w),
    B_m by sigma N/sqrt(d_x) and c_m by sigma N, all drawn from k (``keyed_normals``).
    One "sample" per client: a map evaluation is costed at batch 1 on a dense model of
    d_w (d_w + d_x) MACs.
    """

    name = "bilevel-quadratic"

    def __init__(self, a, b, c, mu: float = 1.0, noise_std: float = 0.0,
                 device: torch.device | str = "cpu"):
        self.a_np = np.asarray(a, dtype=np.float64)
        self.b_np = np.asarray(b, dtype=np.float64)
        self.c_np = np.asarray(c, dtype=np.float64)
        self.num_devices, self.dw, self.dx = self.b_np.shape
        self.blocks = (self.dx, 2 * self.dw)
        self.d = self.dx + 2 * self.dw
        self.mu = float(mu)
        self.noise_std = float(noise_std)
        self.device = torch.device(device)
        self.compute_s = 0.0
        self.A = torch.as_tensor(self.a_np, device=self.device)
        self.B = torch.as_tensor(self.b_np, device=self.device)
        self.c = torch.as_tensor(self.c_np, device=self.device)
        a_mean, b_mean, c_mean = self.a_np.mean(0), self.b_np.mean(0), self.c_np.mean(0)
        gain = np.linalg.solve(a_mean, b_mean)
        x_star = np.linalg.solve(gain.T @ gain + self.mu * np.eye(self.dx), gain.T @ c_mean)
        self.gain = torch.as_tensor(gain, device=self.device)
        self.c_mean = torch.as_tensor(c_mean, device=self.device)
        self.solution = torch.as_tensor(x_star, device=self.device)
        w_star = gain @ x_star
        v_star = np.linalg.solve(a_mean, w_star - c_mean)
        self.fixed_point = torch.as_tensor(np.concatenate([x_star, w_star, v_star]),
                                           device=self.device)
        self.optimum_value = self.objective(self.fixed_point)
        self.model_profile = ModelProfile(params=self.dw * (self.dw + self.dx),
                                          macs_per_sample=self.dw * (self.dw + self.dx),
                                          activations_per_sample=self.dw, input_size=self.dx)

    def _perturbed(self, devices: torch.Tensor, keys: np.ndarray | None):
        """(A_m, B_m, c_m) of the rows, perturbed by each row's key (Sec. 5.1 noise)."""
        if len(devices) == self.num_devices:  # every client, in order: no copy
            a, b, c = self.A, self.B, self.c
        else:
            a, b, c = self.A[devices], self.B[devices], self.c[devices]
        if keys is None or self.noise_std == 0:
            return a, b, c
        dx, dw, sigma = self.dx, self.dw, self.noise_std
        z = torch.from_numpy(keyed_normals(keys, dw * dw + dw * dx + dw)).to(self.device)
        e = z[:, :dw * dw].reshape(-1, dw, dw)
        a = a + sigma * (e + e.transpose(1, 2)) / 2 / math.sqrt(dw)
        b = b + sigma * z[:, dw * dw:dw * dw + dw * dx].reshape(-1, dw, dx) / math.sqrt(dx)
        c = c + sigma * z[:, dw * dw + dw * dx:]
        return a, b, c

    def inner_loss(self, x, w, devices, keys, batch=None):
        """One sample per client (its A_m, B_m; under noise, the key's draw), so every
        minibatch of it is the whole: ``batch`` changes nothing."""
        a, b, _ = self._perturbed(devices, keys)
        aw = torch.bmm(a, w.unsqueeze(2)).squeeze(2)
        bx = torch.bmm(b, x.unsqueeze(2)).squeeze(2)
        return (0.5 * (w * aw).sum() - (w * bx).sum())

    def outer_loss(self, x, w, devices, keys):
        _, _, c = self._perturbed(devices, keys)
        return 0.5 * (w - c).square().sum() + 0.5 * self.mu * x.square().sum()

    def full_batch_sizes(self) -> np.ndarray:
        return np.ones(self.num_devices, dtype=np.int64)

    # ---- the outer objective and its hypergradient, exact ---------------------------------------
    def objective(self, theta: torch.Tensor) -> float:
        """F(x) = (1/M) sum_m [1/2 ||G x - c_m||^2 + mu/2 ||x||^2] at the state's x."""
        x = self.x_part(theta).to(torch.float64)
        residual = self.gain @ x - self.c
        return float(0.5 * residual.square().sum(1).mean() + 0.5 * self.mu * x @ x)

    def objective_gradient(self, theta: torch.Tensor) -> torch.Tensor:
        """The hypergradient grad F(x) = G^T (G x - c) + mu x [d_x]."""
        x = self.x_part(theta).to(torch.float64)
        return self.gain.T @ (self.gain @ x - self.c_mean) + self.mu * x

    def grad_norm_sq(self, theta: torch.Tensor) -> float:
        g = self.objective_gradient(theta)
        return float(g @ g)

    def evaluate(self, theta: torch.Tensor) -> tuple[float, float]:
        """(NaN, F(x)): no accuracy; the "test loss" is the outer objective at w*(x)."""
        return math.nan, self.objective(theta)

    def describe(self) -> dict:
        return {"name": self.name, "clients": self.num_devices, "d": self.d,
                "dimension_x": self.dx, "dimension_w": self.dw, "mu": self.mu,
                "noise_std": self.noise_std, "optimum_value": self.optimum_value,
                "solution_norm": float(torch.linalg.vector_norm(self.solution))}


# ---- the problem as a plugin (problems/base.py) -------------------------------------------------
_key = partial(default_field, BILEVEL_QUADRATIC_DEFAULTS)  # a key of this problem's section

class BilevelQuadraticConfig(ProblemConfig):
    """``problem: {name: bilevel-quadratic}``: fedmsa.md Sec. 5.1's federated bilevel quadratic
    with known solution, one device per client (for ``fedmsa`` and ``fednest``)."""

    clients: int | None = Field(
        None, gt=0, description=f"bilevel-quadratic: n clients = devices (default "
                                f"{BILEVEL_QUADRATIC_DEFAULTS['clients']}, or "
                                "population.num_devices)")
    dimension_x: int = _key("dimension_x", "bilevel-quadratic: d_x, the upper-level variable "
                                           "(default {default})", gt=0)
    dimension_w: int = _key("dimension_w", "bilevel-quadratic: d_w, the lower-level variable "
                                           "(default {default})", gt=0)
    heterogeneity: float = _key("heterogeneity", "bilevel-quadratic: h, the spread of the clients'"
                                                 " A_m, B_m, c_m around their common draw (default"
                                                 " {default})", ge=0)
    mu: float = _key("mu", "bilevel-quadratic: weight of the outer mu/2 ||x||^2 (default "
                           "{default})", ge=0)
    noise_std: float = _key("noise_std", "bilevel-quadratic: sigma of the per-call perturbation of"
                                         " A_m, B_m, c_m (fedmsa.md Sec. 5.1; default 0)", ge=0)


def build(scenario: Scenario, device: torch.device) -> BuiltProblem:
    """fedmsa.md Sec. 5.1's federated bilevel quadratic from the ``problem`` section, drawn from
    the stream (seed, "bilevel-quadratic")."""
    p = scenario.problem
    a, b, c = bilevel_quadratic(p.clients, p.dimension_x, p.dimension_w, p.heterogeneity,
                                keyed_rng(scenario.seed, "bilevel-quadratic"))
    return BuiltProblem(BilevelQuadratic(a, b, c, mu=p.mu, noise_std=p.noise_std, device=device))


def fit(scenario: Scenario) -> None:
    """One device per client, no data."""
    one_device_per_client(scenario, BILEVEL_QUADRATIC_DEFAULTS["clients"])
    refuse_data_sections(scenario)


def memory(scenario: Scenario, limit_bytes: float) -> ProblemFacts:
    """A_m, B_m, c_m float64; the draw's G_m beside them."""
    p, n = scenario.problem, scenario.population.num_devices
    held = 8 * n * p.dimension_w * (p.dimension_w + p.dimension_x + 1)
    return ProblemFacts(p.dimension_x + 2 * p.dimension_w, 8, held,
                        held + 8 * n * p.dimension_w**2)


def unrecorded(scenario: Scenario) -> dict[str, str]:
    """No per-device accuracy (a quadratic has no labels)."""
    return {"worst_device_accuracy": without_device_accuracy(
        "target_suboptimality, target_loss or target_grad_norm_sq")}


SPEC = ProblemSpec(
    name="bilevel-quadratic", Config=BilevelQuadraticConfig, build=build, memory=memory, fit=fit,
    unrecorded=unrecorded, multi_sequence=True, bilevel=True,
    summary="fedmsa.md's federated bilevel quadratic with known solution (fedmsa, fednest)")
