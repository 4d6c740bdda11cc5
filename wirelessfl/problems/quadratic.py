"""fedred.md's synthetic quadratic with a known optimum, one device per client.

f_i(x) = 1/2 x^T A_i x - c_i^T x, the setting of fedred.md Sec. 4.1 drawn by the generator of
Sec. 5.1, with closed-form x* and f*; a "minibatch" is a key for additive Gaussian gradient noise
(Assumption 1, Sec. 1.4). No data, model or partition section.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from functools import cached_property, partial
from typing import TYPE_CHECKING

import numpy as np
import torch
from pydantic import Field, model_validator
from scipy.optimize import brentq

from wirelessfl.contract.problem import ProblemFacts
from wirelessfl.energy.profiler import ModelProfile
from wirelessfl.errors import UserError
from wirelessfl.learning.seeds import keyed_normals, keyed_rng
from wirelessfl.problems.base import (
    ALL_CONSTANTS,
    KEY_LIMIT,
    BuiltProblem,
    Problem,
    ProblemConfig,
    ProblemSpec,
    default_field,
    one_device_per_client,
    refuse_data_sections,
    similarity_constants,
)

if TYPE_CHECKING:
    from wirelessfl.learning.datasets import DataFacts
    from wirelessfl.scenario.schema import Scenario

# Defaults of the `problem: {name: quadratic}` scenario section, from fedred.md.
QUADRATIC_DEFAULTS = {
    "clients": 5,  # n = 5 clients (fedred.md Sec. 4.1)
    "dimension": 100,  # d = 100 on a CPU (Sec. 5.1, item 6; the paper uses 1000)
    "L": 100.0,  # max ||A_i|| = 100 (Sec. 4.1; L_0 = 100 in Sec. 5.1)
    "mu": 1.0,  # smallest eigenvalue 1, the strongly convex instance (Sec. 4.1, 4.4)
    "delta": 5.0,  # delta_A ~ delta_B ~ 5 (Sec. 4.1)
    "noise_std": 0.0,  # sigma of Assumption 1 (Sec. 1.4); 0 = exact gradients
    "minimizer_std": 3.0,  # client minimisers b_i ~ N(0, 3^2 I) (Sec. 5.1, item 5)
    "server_loss": False,  # [D] the base station's own loss (seed 000's f_1): the clients' mean
}



def fedred_quadratic(clients: int, dimension: int, L: float, mu: float, delta: float,
                     rng: np.random.Generator, minimizer_std: float = 3.0
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Hessians A [n, d, d] and linear terms c [n, d] of fedred.md Sec. 5.1's generator, with the
    requested constants holding exactly: max_i ||A_i|| = L, min_i lambda_min(A_i) = mu and the
    paper's delta_A = sqrt(mean_i ||A_i - A||^2) = delta (Sec. 4.1).

    Steps (Sec. 5.1): (1) Q random orthogonal (QR of a Gaussian), A_0 = lo I + w Q diag(t) Q^T with
    t = linspace(0, 1, d); (2) G_i = sym(Gaussian) / ||.||_2, B_i = G_i - mean_k G_k, scaled so
    that sqrt(mean_i ||B_i||^2) = delta; (3) A_i = A_0 + B_i. The spec fixes A_0's spectrum at
    [mu, L_0 - 2 delta] and then shifts, which lands near (not on) L; here the span w solves
    max_i lambda_max(A_i) - min_i lambda_min(A_i) = L - mu (a convex function of w, so one root)
    and lo shifts the smallest eigenvalue to mu. (5) Client minimisers b_i ~ N(0, minimizer_std^2
    I) and c_i = A_i b_i, so f_i(x) = 1/2 x^T A_i x - c_i^T x is minimised at b_i (Sec. 5.1 with
    b_ij = b_i: only A_i and c_i enter the gradients).
    """
    n, d = clients, dimension
    q, r = np.linalg.qr(rng.standard_normal((d, d)))
    q = q * np.sign(np.diag(r))
    shape = (q * np.linspace(0.0, 1.0, d)) @ q.T
    shape = (shape + shape.T) / 2
    g = rng.standard_normal((n, d, d))
    g = (g + g.transpose(0, 2, 1)) / 2
    g /= np.abs(np.linalg.eigvalsh(g)).max(axis=1)[:, None, None]
    b = g - g.mean(0)
    size = math.sqrt(float(np.mean(np.abs(np.linalg.eigvalsh(b)).max(axis=1) ** 2)))
    if delta > 0 and size == 0:
        raise UserError(f"problem.delta: {delta:g} needs at least 2 clients (one client has no "
                        "dissimilarity); set delta: 0 or clients >= 2")
    b = b * (delta / size) if size > 0 else np.zeros_like(b)

    def ends(w: float) -> tuple[float, float]:
        eig = np.linalg.eigvalsh(w * shape + b)
        return float(eig[:, 0].min()), float(eig[:, -1].max())

    def excess(w: float) -> float:
        low, high = ends(w)
        return high - low - (L - mu)

    if excess(0.0) >= 0:
        raise UserError(f"problem.delta: {delta:g} is too large for L - mu = {L - mu:g} (the clients' "
                        f"deviations alone spread the eigenvalues over {excess(0.0) + L - mu:.4g});"
                        " lower delta or raise L")
    top = L - mu + 2 * float(np.abs(np.linalg.eigvalsh(b)).max()) + 1.0
    w = brentq(excess, 0.0, top, xtol=1e-14, rtol=4 * np.finfo(float).eps, maxiter=200)
    lo = mu - ends(w)[0]
    a = lo * np.eye(d) + w * shape + b
    a = (a + a.transpose(0, 2, 1)) / 2
    minimizers = minimizer_std * rng.standard_normal((n, d))
    return a, np.einsum("nij,nj->ni", a, minimizers)


class QuadraticProblem(Problem):
    """f_i(x) = 1/2 x^T A_i x - c_i^T x (fedred.md Sec. 4.1, beta = 0), batched over devices.

    Closed forms: grad f_i(x) = A_i x - c_i; x* = A^{-1} c and f* = -1/2 c^T x* with A, c the
    means over clients. Stochastic oracle (Assumption 1, Sec. 1.4): a minibatch of b "samples"
    with key k gives f_i(x; k) = f_i(x) + xi_k^T x, so grad f_i(x; k) = grad f_i(x) + xi_k with
    xi_k ~ N(0, sigma^2 / (b d) I): unbiased, E||g - grad f_i||^2 = sigma^2 / b. ``sample`` draws
    the keys from the caller's generator (the (seed, "batch", round) stream) and returns them as
    idx [steps, N, b] = key * N + device (the b columns are equal), so the noise is a pure
    function of idx, whatever the chunking. Arithmetic is float64; results come back in the
    dtype of theta. Compute is costed (``model_profile``) as one dense Hessian-vector product
    per sample: d^2 MACs, d activations, d inputs.
    """

    compute_dtype = torch.float64

    def __init__(self, a, c, noise_std: float = 0.0, device: torch.device | str = "cpu",
                 max_chunk_mb: float = 1024.0, server_loss: bool = False):
        a = np.asarray(a, dtype=np.float64)
        c = np.asarray(c, dtype=np.float64)
        self.num_devices, self.d = c.shape
        self.device = torch.device(device)
        self.noise_std = float(noise_std)
        self.max_chunk_bytes = max_chunk_mb * 2**20
        self.compute_s = 0.0
        self.server_loss = bool(server_loss)
        self.a_np, self.c_np = a, c
        self.A = torch.as_tensor(a, device=self.device)
        self.c = torch.as_tensor(c, device=self.device)
        self.A_mean = self.A.mean(0)
        self.c_mean = self.c.mean(0)
        a_mean, c_mean = a.mean(0), c.mean(0)
        try:
            np.linalg.cholesky(a_mean)
        except np.linalg.LinAlgError:
            raise UserError("problem: the mean Hessian is singular, so x* is not unique; "
                            "raise problem.mu above 0") from None
        x_star = np.linalg.solve(a_mean, c_mean)
        self.optimum = torch.as_tensor(x_star, device=self.device)
        self.optimum_value = float(-0.5 * c_mean @ x_star)
        self.model_profile = ModelProfile(params=self.d, macs_per_sample=self.d * self.d,
                                          activations_per_sample=self.d, input_size=self.d)

    @cached_property
    def constants(self) -> dict[str, float]:  # type: ignore[override]
        """L, mu, delta_A (paper), delta_A_exact, delta_B of the A_i (``similarity_constants``)."""
        return similarity_constants(self.a_np)

    def describe(self) -> dict:
        return {"name": "quadratic", "clients": self.num_devices, "d": self.d,
                "noise_std": self.noise_std, **self.constants,
                "optimum_value": self.optimum_value,
                "optimum_norm": float(torch.linalg.vector_norm(self.optimum))}

    def initial(self) -> torch.Tensor:
        """x^0 = 0 (fedred.md Sec. 5.1, item 5)."""
        return torch.zeros(self.d, device=self.device)

    # ---- devices, chunks, minibatch keys ------------------------------------------------------
    def chunks(self, batch_size: int, own_model: bool) -> Iterator[slice]:
        per_device = 8 * self.d * (6 if own_model else 2)  # float64 rows: model, A x, noise, ...
        size = max(1, min(self.num_devices, int(self.max_chunk_bytes // per_device)))
        for start in range(0, self.num_devices, size):
            yield slice(start, min(start + size, self.num_devices))

    def sample(self, generator: torch.Generator, batch_size: int, steps: int = 1) -> torch.Tensor:
        """Keys idx [steps, N, b]: key * N + device, one key per (step, device)."""
        start = time.perf_counter()
        n = self.num_devices
        keys = torch.randint(0, KEY_LIMIT // n, (steps, n), generator=generator)
        idx = keys * n + torch.arange(n)
        out = idx[:, :, None].expand(steps, n, batch_size).contiguous().to(self.device)
        self.compute_s += time.perf_counter() - start
        return out

    def _rows(self, idx: torch.Tensor):
        """The devices of idx's rows: a slice when consecutive (no copy of their A_i)."""
        devices = torch.remainder(idx[:, 0], self.num_devices).cpu()
        first = int(devices[0])
        if torch.equal(devices, torch.arange(first, first + len(devices))):
            return slice(first, first + len(devices))
        return devices.to(self.device)

    def _noise(self, idx: torch.Tensor) -> torch.Tensor | None:
        """xi [n, d] of the minibatches idx [n, b], float64 (None without noise)."""
        if self.noise_std == 0:
            return None
        keys = torch.div(idx[:, 0], self.num_devices, rounding_mode="floor").cpu().numpy()
        scale = self.noise_std / math.sqrt(idx.shape[1] * self.d)
        return torch.from_numpy(keyed_normals(keys, self.d) * scale).to(self.device)

    # ---- losses and gradients ----------------------------------------------------------------
    def stacked_losses(self, models: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        rows = self._rows(idx)
        x = models.to(torch.float64)
        ax = torch.bmm(self.A[rows], x.unsqueeze(2)).squeeze(2)
        linear = self.c[rows]
        noise = self._noise(idx)
        if noise is not None:
            linear = linear - noise
        return ((0.5 * ax - linear) * x).sum(1).to(models.dtype)

    def device_losses(self, theta: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        start = time.perf_counter()
        out = self.stacked_losses(theta.expand(idx.shape[0], -1), idx)
        self.compute_s += time.perf_counter() - start
        return out

    def stacked_gradients(self, models: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        rows = self._rows(idx)
        x = models.to(torch.float64)
        g = torch.bmm(self.A[rows], x.unsqueeze(2)).squeeze(2) - self.c[rows]
        noise = self._noise(idx)
        if noise is not None:
            g += noise
        return g.to(models.dtype)

    def full_gradients(self, theta: torch.Tensor, devices: np.ndarray | None = None
                       ) -> torch.Tensor:
        start = time.perf_counter()
        x = theta.to(torch.float64)
        A, c = self.A, self.c
        if devices is not None:
            rows = torch.as_tensor(devices, dtype=torch.int64, device=A.device)
            A, c = A[rows], c[rows]
        if x.dim() == 1:
            g = torch.matmul(A, x) - c
        else:
            g = torch.bmm(A, x.unsqueeze(2)).squeeze(2) - c
        self.compute_s += time.perf_counter() - start
        return g.to(theta.dtype)

    def objective(self, theta: torch.Tensor) -> float:
        x = theta.to(torch.float64)
        return float(0.5 * x @ (self.A_mean @ x) - self.c_mean @ x)

    def server_gradient(self, theta: torch.Tensor, generator: torch.Generator,
                        batch_size: int) -> torch.Tensor:
        """With ``server_loss``, the base station's own loss is the clients' mean quadratic:
        grad = A x - c (+ the same minibatch noise model as the devices', from ``generator``)."""
        if not self.server_loss:
            return super().server_gradient(theta, generator, batch_size)
        g = self.A_mean @ theta.to(torch.float64) - self.c_mean
        if self.noise_std:
            xi = torch.randn(self.d, generator=generator, dtype=torch.float64)
            g = g + xi.to(self.device) * self.noise_std / math.sqrt(batch_size * self.d)
        return g.to(theta.dtype)

    def server_objective(self, theta: torch.Tensor) -> float:
        """With ``server_loss``, f_1 = the clients' mean quadratic (``objective``)."""
        if not self.server_loss:
            return super().server_objective(theta)
        return self.objective(theta)

    def objective_gradient(self, theta: torch.Tensor) -> torch.Tensor:
        x = theta.to(torch.float64)
        return (self.A_mean @ x - self.c_mean).to(theta.dtype)

    def suboptimality(self, theta: torch.Tensor) -> float:
        """f(theta) - f* = 1/2 (theta - x*)^T A (theta - x*): exact, no cancellation."""
        e = theta.to(torch.float64) - self.optimum
        return float(0.5 * e @ (self.A_mean @ e))

    def grad_norm_sq(self, theta: torch.Tensor) -> float:
        g = self.A_mean @ theta.to(torch.float64) - self.c_mean
        return float(g @ g)

    def evaluate(self, theta: torch.Tensor) -> tuple[float, float]:
        """(NaN, f(theta)): a quadratic has no accuracy; its "test loss" is the objective."""
        return math.nan, self.objective(theta)


# ---- the problem as a plugin (problems/base.py) -------------------------------------------------
_key = partial(default_field, QUADRATIC_DEFAULTS)  # a key of this problem's section

class QuadraticConfig(ProblemConfig):
    """``problem: {name: quadratic}``: fedred.md's synthetic f_i(x) = 1/2 x^T A_i x - c_i^T x with
    known optimum, one device per client."""

    clients: int | None = Field(
        None, gt=0, description=f"quadratic: n clients = devices (default "
                                f"{QUADRATIC_DEFAULTS['clients']}, or population.num_devices)")
    dimension: int = _key("dimension", "quadratic: d (default {default})", gt=0)
    L: float = _key("L", "quadratic: smoothness max_i ||A_i|| (default {default})", gt=0)
    mu: float = _key("mu", "quadratic: min_i lambda_min(A_i) (default {default})", ge=0)
    delta: float = _key("delta", "quadratic: Hessian dissimilarity delta_A = sqrt(mean_i ||A_i - "
                                 "A||^2) (default {default})", ge=0)
    noise_std: float = _key("noise_std", "quadratic: sigma, E||g - grad f_i||^2 = sigma^2 / "
                                         "batch_size (default 0)", ge=0)
    minimizer_std: float = _key("minimizer_std", "quadratic: std of the clients' minimisers "
                                                 "(default {default})", ge=0)
    server_loss: bool = _key("server_loss", "quadratic: the base station holds a loss of its own, "
                                            "the clients' mean quadratic (what ZO-HFL's server "
                                            "term needs; default false)")

    @model_validator(mode="after")
    def _l_above_mu(self):
        if not self.L > self.mu:
            raise ValueError(f"L ({self.L:g}) must be larger than mu ({self.mu:g}); raise L or "
                             "lower mu")
        return self


def build(scenario: Scenario, device: torch.device) -> BuiltProblem:
    """fedred.md's synthetic quadratic (Sec. 4.1 / 5.1), drawn from the stream (seed,
    "quadratic")."""
    p = scenario.problem
    a, c = fedred_quadratic(p.clients, p.dimension, p.L, p.mu, p.delta,
                            keyed_rng(scenario.seed, "quadratic"), p.minimizer_std)
    return BuiltProblem(QuadraticProblem(a, c, p.noise_std, device, scenario.engine.max_chunk_mb,
                                         server_loss=p.server_loss))


def fit(scenario: Scenario) -> None:
    """One device per client, at least two clients for a dissimilarity, no data."""
    one_device_per_client(scenario, QUADRATIC_DEFAULTS["clients"])
    problem = scenario.problem
    if problem.clients == 1 and problem.delta > 0:
        raise ValueError(f"problem.delta ({problem.delta:g}) needs at least 2 clients (one "
                         "client has no dissimilarity); set delta: 0 or clients >= 2")
    refuse_data_sections(scenario)


def memory(scenario: Scenario, limit_bytes: float) -> ProblemFacts:
    """A_i [N, d, d] and c_i [N, d] float64; the draw makes copies."""
    p, n = scenario.problem, scenario.population.num_devices
    held = 8 * n * p.dimension * (p.dimension + 1)
    return ProblemFacts(p.dimension, 8, held, 3 * held)


def constants(scenario: Scenario, facts: DataFacts | None) -> set[str]:
    return set(ALL_CONSTANTS)


def server_loss(scenario: Scenario, facts: DataFacts | None) -> bool:
    return bool(scenario.problem.server_loss)


SPEC = ProblemSpec(
    name="quadratic", Config=QuadraticConfig, build=build, memory=memory, fit=fit,
    constants=constants, server_loss=server_loss,
    summary="fedred.md's synthetic quadratic with known optimum, one device per client")
