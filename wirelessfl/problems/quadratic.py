"""fedred.md's synthetic quadratic with a known optimum, one device per client.

f_i(x) = 1/2 x^T A_i x - c_i^T x + beta sum_k [x]_k^2 / (1 + [x]_k^2), the setting of fedred.md
Sec. 4.1 drawn by the generator of Sec. 5.1, in the three instances of its Fig. 1
(``problem.instance``): strongly convex (every A_i >= mu I, beta = 0), general convex (every A_i
PSD with some eigenvalues close to 0, beta = 0) and non-convex (indefinite A_i, beta = 400). With
beta = 0, x* and f* in closed form (a least-squares solve where the mean Hessian is singular);
with beta > 0 f* is unknown and ||grad f||^2 is the measure (A14). A "minibatch" is a key for
additive Gaussian gradient noise (Assumption 1, Sec. 1.4). No data, model or partition section.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from functools import cached_property, partial
from typing import TYPE_CHECKING, Literal

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
    without_device_accuracy,
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
    "instance": "strongly-convex",  # Fig. 1's first instance (Sec. 4.1)
}

# What each of Fig. 1's instances (fedred.md Sec. 4.1) sets when the section leaves a key out.
INSTANCE_DEFAULTS = {
    # smallest eigenvalue of every A_ij = 1 (Sec. 4.1 / 4.4); beta = 0 for the convex instances
    "strongly-convex": {"mu": 1.0, "beta": 0.0},
    # [D] "some eigenvalues set close to 0, all A_ij PSD" (Sec. 4.1): d // 10 shared directions
    # with eigenvalue 1e-3 (1e-5 L) in every A_i; the other eigenvalues start at 1, the strongly
    # convex instance's floor
    "general-convex": {"mu": 1e-3, "beta": 0.0, "bulk_mu": 1.0},
    # [D] mu = -delta/2 (-2.5 at delta = 5; None here: it follows delta): every A_i indefinite
    # while the mean Hessian stays positive definite, f bounded below (fedred_quadratic);
    # beta = 400 (Sec. 4.1)
    "non-convex": {"mu": None, "beta": 400.0},
}



def fedred_quadratic(clients: int, dimension: int, L: float, mu: float, delta: float,
                     rng: np.random.Generator, minimizer_std: float = 3.0, flat: int = 0,
                     bulk_mu: float | None = None, indefinite: bool = False
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

    ``indefinite`` (Fig. 1's non-convex instance, mu < 0) [D]: every client also gets a
    direction of its own, u_i = Q's i-th column (i < n, the n at the bottom of A_0's spectrum,
    t_i = 0), along which its curvature dips below the mean's: B_i gets the part
    (mean_k P_k - P_i) / (1 - 1/n), P_i = u_i u_i^T, with the same root-mean-square norm as
    its random part, before the two are scaled to delta together. It cancels in the mean, so the
    mean Hessian keeps its floor (0.75-1.15 delta above mu, measured) while every A_i dips to
    within about 0.3 delta of mu (d = 100): with mu = -delta/2 every A_i is indefinite and f is
    bounded below. (Random deviations alone reach only 0.05-0.2 delta below the mean's floor,
    depending on the draw, so an f bounded below would leave most A_i PSD.)

    ``flat`` = k > 0 gives the general convex instance [D]: the first k columns U of Q are
    directions on which every A_i has the eigenvalue mu (>= 0, close to 0), and the generator
    above runs on the other d - k directions V (Q's other columns; G_i compressed to V^T G_i V)
    with its smallest eigenvalue at ``bulk_mu``: A_i = V A_i' V^T + mu U U^T, all PSD. The flat
    directions are shared because they must be: a near-zero eigenvalue of the mean A along u
    with every A_i PSD forces A_i u ~ 0 on every client. The clients then differ only on V, so
    delta_A and delta_B are those of the A_i'. The draws are the same as without ``flat`` (Q,
    the G_i, the b_i, in that order).
    """
    n, d = clients, dimension
    floor, floor_name = (mu, "mu") if not flat else (bulk_mu, "bulk_mu")
    q, r = np.linalg.qr(rng.standard_normal((d, d)))
    q = q * np.sign(np.diag(r))
    if flat:  # the bulk's spectrum shape, in the basis V of the bulk directions
        bulk = q[:, flat:]
        shape = np.diag(np.linspace(0.0, 1.0, d - flat))
    else:
        t = np.linspace(0.0, 1.0, d)
        if indefinite:
            t[:n] = 0.0  # a common floor for the clients' own directions
        shape = (q * t) @ q.T
        shape = (shape + shape.T) / 2
    g = rng.standard_normal((n, d, d))
    g = (g + g.transpose(0, 2, 1)) / 2
    if flat:
        g = bulk.T @ g @ bulk
        g = (g + g.transpose(0, 2, 1)) / 2
    g /= np.abs(np.linalg.eigvalsh(g)).max(axis=1)[:, None, None]
    b = g - g.mean(0)
    size = math.sqrt(float(np.mean(np.abs(np.linalg.eigvalsh(b)).max(axis=1) ** 2)))
    if delta > 0 and size == 0:
        raise UserError(f"problem.delta: {delta:g} needs at least 2 clients (one client has no "
                        "dissimilarity); set delta: 0 or clients >= 2")
    if indefinite and size > 0:
        own = np.einsum("ik,jk->kij", q[:, :n], q[:, :n])  # P_i = u_i u_i^T
        b = b / size + (own.mean(0) - own) / (1 - 1 / n)
        size = math.sqrt(float(np.mean(np.abs(np.linalg.eigvalsh(b)).max(axis=1) ** 2)))
    b = b * (delta / size) if size > 0 else np.zeros_like(b)

    def ends(w: float) -> tuple[float, float]:
        eig = np.linalg.eigvalsh(w * shape + b)
        return float(eig[:, 0].min()), float(eig[:, -1].max())

    def excess(w: float) -> float:
        low, high = ends(w)
        return high - low - (L - floor)

    if excess(0.0) >= 0:
        raise UserError(f"problem.delta: {delta:g} is too large for L - {floor_name} = "
                        f"{L - floor:g} (the clients' deviations alone spread the eigenvalues over "
                        f"{excess(0.0) + L - floor:.4g}); lower delta or raise L")
    top = L - floor + 2 * float(np.abs(np.linalg.eigvalsh(b)).max()) + 1.0
    w = brentq(excess, 0.0, top, xtol=1e-14, rtol=4 * np.finfo(float).eps, maxiter=200)
    lo = floor - ends(w)[0]
    a = lo * np.eye(len(shape)) + w * shape + b
    a = (a + a.transpose(0, 2, 1)) / 2
    if flat:
        flat_directions = q[:, :flat]
        a = bulk @ a @ bulk.T + mu * (flat_directions @ flat_directions.T)
        a = (a + a.transpose(0, 2, 1)) / 2
    minimizers = minimizer_std * rng.standard_normal((n, d))
    return a, np.einsum("nij,nj->ni", a, minimizers)


# Relative size below which an eigenvalue of the mean Hessian counts as 0 (a singular A: x* by
# least squares, the minimum-norm minimiser) [D].
SINGULAR = 1e-10


def quadratic_minimiser(a: np.ndarray, c: np.ndarray, clients: np.ndarray | None = None
                        ) -> np.ndarray:
    """x* of 1/2 x^T A x - c^T x: A^{-1} c for A positive definite; for A PSD and singular, the
    minimum-norm minimiser (least squares, eigenvalues below SINGULAR ||A|| taken as 0), when c
    lies in A's range. A UserError when the quadratic is unbounded below (A indefinite, or c
    outside the range of a singular A); the clients' A_i [n, d, d], when given, word the fix."""
    eig = np.linalg.eigvalsh(a)
    scale = max(abs(float(eig[0])), abs(float(eig[-1])), np.finfo(float).tiny)
    if eig[0] > SINGULAR * scale:
        return np.linalg.solve(a, c)
    if eig[0] < -SINGULAR * scale:
        fix = ""
        if clients is not None and len(clients):
            client_mu = float(np.linalg.eigvalsh(clients)[:, 0].min())
            fix = (f"; problem.mu (the A_i's most negative eigenvalue, {client_mu:.3g}) must stay "
                   f"above about {client_mu - float(eig[0]):.3g} at this delta and dimension: "
                   "raise mu toward 0 or raise delta")
        raise UserError(f"problem: the mean Hessian A = mean_i A_i has a negative eigenvalue "
                        f"({float(eig[0]):.3g}), so f is unbounded below (the beta term is "
                        f"bounded){fix}")
    x, *_ = np.linalg.lstsq(a, c, rcond=SINGULAR)
    if np.linalg.norm(a @ x - c) > 1e-8 * max(float(np.linalg.norm(c)), 1.0):
        raise UserError("problem: the mean Hessian is singular and c is not in its range, so f "
                        "is unbounded below; raise problem.mu above 0")
    return x


class QuadraticProblem(Problem):
    """f_i(x) = 1/2 x^T A_i x - c_i^T x + beta sum_k phi([x]_k), phi(t) = t^2 / (1 + t^2)
    (fedred.md Sec. 4.1), batched over devices.

    Closed forms: grad f_i(x) = A_i x - c_i + beta phi'(x), phi'(t) = 2t / (1 + t^2)^2. With
    beta = 0: x* = A^{-1} c (A, c the means over clients; the minimum-norm least-squares
    minimiser where A is singular, ``quadratic_minimiser``) and f* = -1/2 c^T x*; with beta > 0
    (non-convex) f* has no closed form: ``optimum`` and ``optimum_value`` are None, so the
    recorded ``suboptimality`` is NaN and ``grad_norm_sq`` is the measure (fedred.md A14); the
    mean Hessian must still be PSD, else f is unbounded below.

    Stochastic oracle (Assumption 1, Sec. 1.4): a minibatch of b "samples" with key k gives
    f_i(x; k) = f_i(x) + xi_k^T x, so grad f_i(x; k) = grad f_i(x) + xi_k with
    xi_k ~ N(0, sigma^2 / (b d) I): unbiased, E||g - grad f_i||^2 = sigma^2 / b. ``sample`` draws
    the keys from the caller's generator (the (seed, "batch", round) stream) and returns them as
    idx [steps, N, b] = key * N + device (the b columns are equal), so the noise is a pure
    function of idx, whatever the chunking. Arithmetic is float64; results come back in the
    dtype of theta. Compute is costed (``model_profile``) as one dense Hessian-vector product
    per sample: d^2 MACs, d activations, d inputs.
    """

    compute_dtype = torch.float64

    def __init__(self, a, c, noise_std: float = 0.0, device: torch.device | str = "cpu",
                 max_chunk_mb: float = 1024.0, server_loss: bool = False, beta: float = 0.0):
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
        self.beta = float(beta)
        if not self.beta >= 0:
            raise UserError(f"problem.beta: {self.beta:g} must be >= 0")
        a_mean, c_mean = a.mean(0), c.mean(0)
        x_star = quadratic_minimiser(a_mean, c_mean, a)  # refuses an unbounded f
        if self.beta == 0:
            self.optimum = torch.as_tensor(x_star, device=self.device)
            self.optimum_value = float(-0.5 * c_mean @ x_star)
        self.model_profile = ModelProfile(params=self.d, macs_per_sample=self.d * self.d,
                                          activations_per_sample=self.d, input_size=self.d)

    @cached_property
    def constants(self) -> dict[str, float]:  # type: ignore[override]
        """L, mu, delta_A (paper), delta_A_exact, delta_B of the f_i: those of the A_i
        (``similarity_constants``) with beta = 0. The beta term's Hessian is beta diag(phi''(x)),
        phi'' in [-1/2, 2] (2 at 0, -1/2 at +-1), the same on every client: it leaves delta_A and
        delta_B alone and, exactly, L = sup_x ||hess f_i(x)|| = max(max_i lambda_max(A_i) +
        2 beta, beta/2 - min_i lambda_min(A_i)) (the first at x = 0) and mu = inf_x
        lambda_min(hess f_i(x)) = min_i lambda_min(A_i) - beta/2 (at x = (+-1, ..., +-1)), so a
        non-convex instance has mu < 0 (weak convexity)."""
        out = similarity_constants(self.a_np)
        if self.beta:
            top, low = self._quadratic_ends
            out["L"] = float(max(top + 2 * self.beta, self.beta / 2 - low))
            out["mu"] = float(low - self.beta / 2)
        return out

    @cached_property
    def _quadratic_ends(self) -> tuple[float, float]:
        """(max_i lambda_max(A_i), min_i lambda_min(A_i)): the quadratic part's spectrum."""
        eig = np.linalg.eigvalsh(self.a_np)
        return float(eig[:, -1].max()), float(eig[:, 0].min())

    def describe(self) -> dict:
        out = {"name": "quadratic", "clients": self.num_devices, "d": self.d,
               "noise_std": self.noise_std, **self.constants,
               "optimum_value": self.optimum_value}
        if self.optimum is not None:
            out["optimum_norm"] = float(torch.linalg.vector_norm(self.optimum))
        if self.beta:  # the quadratic part's own constants; L and mu above include beta's
            top, low = self._quadratic_ends
            out.update(beta=self.beta, quadratic_L=float(max(top, -low)), quadratic_mu=low,
                       mean_mu=float(np.linalg.eigvalsh(self.a_np.mean(0))[0]))
        return out

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

    def _beta_value(self, x: torch.Tensor) -> torch.Tensor:
        """beta sum_k [x]_k^2 / (1 + [x]_k^2) over the last axis of x (float64)."""
        square = x * x
        return self.beta * (square / (1 + square)).sum(-1)

    def _beta_gradient(self, x: torch.Tensor) -> torch.Tensor:
        """Its gradient, beta 2 [x]_k / (1 + [x]_k^2)^2, x's shape (float64)."""
        return self.beta * 2 * x / (1 + x * x) ** 2

    # ---- losses and gradients ----------------------------------------------------------------
    def stacked_losses(self, models: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        rows = self._rows(idx)
        x = models.to(torch.float64)
        ax = torch.bmm(self.A[rows], x.unsqueeze(2)).squeeze(2)
        linear = self.c[rows]
        noise = self._noise(idx)
        if noise is not None:
            linear = linear - noise
        out = ((0.5 * ax - linear) * x).sum(1)
        if self.beta:
            out = out + self._beta_value(x)
        return out.to(models.dtype)

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
        if self.beta:
            g += self._beta_gradient(x)
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
        if self.beta:
            g = g + self._beta_gradient(x)
        self.compute_s += time.perf_counter() - start
        return g.to(theta.dtype)

    def objective(self, theta: torch.Tensor) -> float:
        x = theta.to(torch.float64)
        value = 0.5 * x @ (self.A_mean @ x) - self.c_mean @ x
        if self.beta:
            value = value + self._beta_value(x)
        return float(value)

    def server_gradient(self, theta: torch.Tensor, generator: torch.Generator,
                        batch_size: int) -> torch.Tensor:
        """With ``server_loss``, the base station's own loss is the clients' mean quadratic:
        grad = A x - c + beta phi'(x) (+ the same minibatch noise model as the devices', from
        ``generator``)."""
        if not self.server_loss:
            return super().server_gradient(theta, generator, batch_size)
        x = theta.to(torch.float64)
        g = self.A_mean @ x - self.c_mean
        if self.beta:
            g = g + self._beta_gradient(x)
        if self.noise_std:
            xi = torch.randn(self.d, generator=generator, dtype=torch.float64)
            g = g + xi.to(self.device) * self.noise_std / math.sqrt(batch_size * self.d)
        return g.to(theta.dtype)

    def server_objective(self, theta: torch.Tensor) -> float:
        """With ``server_loss``, f_1 = the clients' mean quadratic (``objective``)."""
        if not self.server_loss:
            return super().server_objective(theta)
        return self.objective(theta)

    def _objective_gradient(self, theta: torch.Tensor) -> torch.Tensor:
        """grad f(theta) [d], float64."""
        x = theta.to(torch.float64)
        g = self.A_mean @ x - self.c_mean
        if self.beta:
            g = g + self._beta_gradient(x)
        return g

    def objective_gradient(self, theta: torch.Tensor) -> torch.Tensor:
        return self._objective_gradient(theta).to(theta.dtype)

    def suboptimality(self, theta: torch.Tensor) -> float:
        """f(theta) - f* = 1/2 (theta - x*)^T A (theta - x*) with beta = 0: exact, no
        cancellation (x* any minimiser: c lies in A's range); NaN with beta > 0 (f* unknown:
        ``grad_norm_sq`` is the measure, fedred.md A14)."""
        if self.optimum is None:
            return math.nan
        e = theta.to(torch.float64) - self.optimum
        return float(0.5 * e @ (self.A_mean @ e))

    def grad_norm_sq(self, theta: torch.Tensor) -> float:
        g = self._objective_gradient(theta)
        return float(g @ g)

    def evaluate(self, theta: torch.Tensor) -> tuple[float, float]:
        """(NaN, f(theta)): a quadratic has no accuracy; its "test loss" is the objective."""
        return math.nan, self.objective(theta)


# ---- the problem as a plugin (problems/base.py) -------------------------------------------------
_key = partial(default_field, QUADRATIC_DEFAULTS)  # a key of this problem's section

class QuadraticConfig(ProblemConfig):
    """``problem: {name: quadratic}``: fedred.md's synthetic f_i(x) = 1/2 x^T A_i x - c_i^T x +
    beta sum_k [x]_k^2 / (1 + [x]_k^2), one device per client, in one of Fig. 1's three
    instances (``instance``); ``mu`` and ``beta`` default by instance (INSTANCE_DEFAULTS)."""

    clients: int | None = Field(
        None, gt=0, description=f"quadratic: n clients = devices (default "
                                f"{QUADRATIC_DEFAULTS['clients']}, or population.num_devices)")
    dimension: int = _key("dimension", "quadratic: d (default {default})", gt=0)
    L: float = _key("L", "quadratic: max_i ||A_i|| of the quadratic part (default {default}); "
                         "the recorded smoothness constant adds the beta term's 2 beta", gt=0)
    mu: float | None = Field(
        None, description="quadratic: min_i lambda_min(A_i) of the quadratic part, exact. "
                          "strongly-convex: >= 0 (default 1); general-convex: the eigenvalue "
                          "close to 0 of the flat directions, >= 0 and below bulk_mu (default "
                          "1e-3); non-convex: < 0, the most negative eigenvalue of the indefinite "
                          "A_i, >= -L, with the mean Hessian still PSD so that f is bounded "
                          "below (default -delta/2). The recorded constant mu subtracts beta/2")
    delta: float = _key("delta", "quadratic: Hessian dissimilarity delta_A = sqrt(mean_i ||A_i - "
                                 "A||^2) (default {default})", ge=0)
    noise_std: float = _key("noise_std", "quadratic: sigma, E||g - grad f_i||^2 = sigma^2 / "
                                         "batch_size (default 0)", ge=0)
    minimizer_std: float = _key("minimizer_std", "quadratic: std of the clients' minimisers "
                                                 "(default {default})", ge=0)
    server_loss: bool = _key("server_loss", "quadratic: the base station holds a loss of its own, "
                                            "the clients' mean quadratic (what ZO-HFL's server "
                                            "term needs; default false)")
    instance: Literal["strongly-convex", "general-convex", "non-convex"] = Field(
        QUADRATIC_DEFAULTS["instance"],
        description="quadratic: which of fedred.md Fig. 1's instances (Sec. 4.1): "
                    "strongly-convex (every A_i >= mu I, beta = 0; the default), general-convex "
                    "(every A_i PSD with flat_directions eigenvalues mu close to 0, beta = 0; "
                    "f - f* recorded) or non-convex (indefinite A_i, beta = 400; f* unknown: "
                    "suboptimality is NaN and grad_norm_sq is the measure, A14)")
    beta: float | None = Field(
        None, ge=0, description="quadratic: weight of beta sum_k [x]_k^2 / (1 + [x]_k^2), the same "
                                "on every client; only with instance: non-convex (default 400), "
                                "0 for the convex instances")
    flat_directions: int | None = Field(
        None, ge=1, description="quadratic, general-convex only: k, the directions (shared by "
                                "every client) on which every A_i has the eigenvalue mu close "
                                "to 0 (default dimension // 10, at least 1; at most dimension - "
                                "2) [D]")
    bulk_mu: float | None = Field(
        None, gt=0, description="quadratic, general-convex only: the smallest eigenvalue of the "
                                "other dimension - k directions (default 1, the strongly convex "
                                "instance's floor) [D]")

    @model_validator(mode="after")
    def _instance_rules(self):
        """Fill mu, beta (and for general-convex flat_directions, bulk_mu) from the instance;
        refuse a value the instance cannot have."""
        kind, defaults = self.instance, INSTANCE_DEFAULTS[self.instance]
        general = kind == "general-convex"
        for key in ("flat_directions", "bulk_mu"):
            if not general and getattr(self, key) is not None:
                raise ValueError(f"{key} is only read with instance: general-convex (instance is "
                                 f"{kind}); remove it or set instance: general-convex")
        if self.beta is not None and self.beta > 0 and kind != "non-convex":
            raise ValueError(f"beta: {self.beta:g} makes f non-convex, but instance is {kind}; "
                             "remove beta or set instance: non-convex")
        if self.mu is None:
            self.mu = defaults["mu"] if defaults["mu"] is not None else -self.delta / 2
        if self.beta is None:
            self.beta = defaults["beta"]
        if general:
            if self.flat_directions is None:
                self.flat_directions = max(1, self.dimension // 10)
            if self.bulk_mu is None:
                self.bulk_mu = defaults["bulk_mu"]
            if self.flat_directions > self.dimension - 2:
                raise ValueError(f"flat_directions ({self.flat_directions}) must leave at least 2 "
                                 f"of the dimension's {self.dimension} directions to the bulk; "
                                 "lower it or raise dimension")
            if not 0 <= self.mu < self.bulk_mu:
                raise ValueError(f"mu ({self.mu:g}), the flat directions' eigenvalue, must be >= 0 "
                                 f"and below bulk_mu ({self.bulk_mu:g}) for instance: "
                                 "general-convex")
            if not self.L > self.bulk_mu:
                raise ValueError(f"L ({self.L:g}) must be larger than bulk_mu "
                                 f"({self.bulk_mu:g}); raise L or lower bulk_mu")
            return self
        if kind == "strongly-convex" and self.mu < 0:
            raise ValueError(f"mu ({self.mu:g}) must be >= 0 for instance: strongly-convex; a "
                             "negative mu (indefinite A_i) is instance: non-convex")
        if kind == "non-convex" and not -self.L <= self.mu < 0:
            raise ValueError(f"mu ({self.mu:g}) must be negative (the most negative eigenvalue "
                             f"of the indefinite A_i) and >= -L ({-self.L:g}) for instance: "
                             "non-convex" + ("; with delta: 0 the clients are identical and "
                                             "their mean would be indefinite too: set delta > 0"
                                             if self.delta == 0 else ""))
        if not self.L > self.mu:
            raise ValueError(f"L ({self.L:g}) must be larger than mu ({self.mu:g}); raise L or "
                             "lower mu")
        return self


def build(scenario: Scenario, device: torch.device) -> BuiltProblem:
    """fedred.md's synthetic quadratic (Sec. 4.1 / 5.1) in the section's instance, drawn from
    the stream (seed, "quadratic")."""
    p = scenario.problem
    flat = p.flat_directions if p.instance == "general-convex" else 0
    a, c = fedred_quadratic(p.clients, p.dimension, p.L, p.mu, p.delta,
                            keyed_rng(scenario.seed, "quadratic"), p.minimizer_std, flat=flat,
                            bulk_mu=p.bulk_mu, indefinite=p.instance == "non-convex")
    return BuiltProblem(QuadraticProblem(a, c, p.noise_std, device, scenario.engine.max_chunk_mb,
                                         server_loss=p.server_loss, beta=p.beta))


def fit(scenario: Scenario) -> None:
    """One device per client, at least two clients for a dissimilarity, no data."""
    one_device_per_client(scenario, QUADRATIC_DEFAULTS["clients"])
    problem = scenario.problem
    if problem.clients == 1 and problem.delta > 0:
        raise ValueError(f"problem.delta ({problem.delta:g}) needs at least 2 clients (one "
                         "client has no dissimilarity); set delta: 0 or clients >= 2")
    if problem.instance == "non-convex" and problem.clients > problem.dimension - 2:
        raise ValueError(f"problem.instance: non-convex gives each of the {problem.clients} "
                         f"clients a direction of its own, which needs dimension >= clients + 2 "
                         f"(dimension is {problem.dimension}); raise dimension")
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


def unrecorded(scenario: Scenario) -> dict[str, str]:
    """No per-device accuracy (a quadratic has no labels)."""
    return {"worst_device_accuracy": without_device_accuracy(
        "target_suboptimality, target_loss or target_grad_norm_sq")}


SPEC = ProblemSpec(
    name="quadratic", Config=QuadraticConfig, build=build, memory=memory, fit=fit,
    constants=constants, server_loss=server_loss, unrecorded=unrecorded,
    summary="fedred.md's synthetic quadratic with known optimum, one device per client")
