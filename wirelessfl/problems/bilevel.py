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
import time
from abc import abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import numpy as np
import torch
from pydantic import Field

from wirelessfl.contract.payload import Cost
from wirelessfl.energy.profiler import ModelProfile
from wirelessfl.pipeline.memory import ProblemFacts
from wirelessfl.errors import UserError
from wirelessfl.learning.seeds import keyed_normals, keyed_rng
from wirelessfl.problems.base import (
    KEY_LIMIT,
    BuiltProblem,
    Problem,
    ProblemConfig,
    ProblemSpec,
    default_field,
    one_device_per_client,
    refuse_data_sections,
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


# Below this many multiply-adds per map evaluation, torch's intra-op threads cost more than they
# save (measured: a 50-value state on 2 shared cores ran 10x slower with 2 threads than with 1).
SINGLE_THREAD_MACS = 2**20


@contextmanager
def single_thread_if_small(macs: int):
    """Run tiny tensor work on one intra-op thread (results do not depend on it)."""
    before = torch.get_num_threads()
    if macs >= SINGLE_THREAD_MACS or before == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass(frozen=True)
class EpochBatch:
    """One minibatch per client: ``positions`` [n, b] of its training samples (0 .. m_i - 1)
    and ``weights`` [n, b], 1 for a sample in the batch, 0 past the client's last sample."""

    positions: torch.Tensor
    weights: torch.Tensor


class MSAProblem(Problem):
    """A federated MSA problem (fedmsa.md Sec. 1.2): per-client maps on a block state.

    Subclasses set ``blocks`` and define ``maps``; ``solution`` (x*, the true x part of the
    fixed point) when known. Algorithms for single-level problems (gradients of one f_i) are
    refused with a clear message.
    """

    blocks: tuple[int, ...]
    compute_dtype = torch.float64
    solution: torch.Tensor | None = None

    @abstractmethod
    def maps(self, states: torch.Tensor, devices: torch.Tensor,
             keys: np.ndarray | None = None) -> torch.Tensor:
        """Map evaluations [n, P] of clients ``devices`` [n] at their own states [n, P]
        (float64): exact (all local data) when ``keys`` is None, else one stochastic sample per
        row keyed by ``keys`` [n] (the same key gives the same sample, so two states evaluated
        with one key share it, as the variance-reduced differences need)."""

    @abstractmethod
    def evaluation_cost(self, evaluations, full_batch: bool, batch_size: int) -> Cost:
        """What ``evaluations`` map evaluations (scalar or [N]) cost a device."""

    def step_sizes(self, rates: tuple[float, ...]) -> torch.Tensor:
        """[P] the step of each state entry: rates[0] on x, rates[n] on z^n."""
        if len(rates) != len(self.blocks):
            raise ValueError(f"{len(rates)} step sizes for {len(self.blocks)} blocks")
        return torch.cat([torch.full((size,), float(rate), dtype=torch.float64)
                          for size, rate in zip(self.blocks, rates, strict=True)]).to(self.device)

    def sample_keys(self, generator: torch.Generator) -> np.ndarray:
        """[N] sample keys, one per device, from ``generator``."""
        keys = torch.randint(0, KEY_LIMIT, (self.num_devices,), generator=generator)
        return keys.numpy().astype(np.uint64)

    def x_part(self, theta: torch.Tensor) -> torch.Tensor:
        return theta[..., :self.blocks[0]]

    def relative_error(self, theta: torch.Tensor) -> float:
        """||x - x*|| / ||x*|| of the state's x part (NaN when x* is unknown)."""
        if self.solution is None:
            return math.nan
        x = self.x_part(theta).to(torch.float64)
        return float(torch.linalg.vector_norm(x - self.solution)
                     / torch.linalg.vector_norm(self.solution))

    def suboptimality(self, theta: torch.Tensor) -> float:
        """For an MSA problem the relative error ||x - x*|| / ||x*|| (docs/results.md)."""
        return self.relative_error(theta)

    # ---- a multi-sequence problem has no single f_i to take gradients of ----------------------
    def _single_level(self, *_args, **_kwargs):
        raise UserError(f"problem '{self.name}' is a multi-sequence (bilevel) problem: it has no "
                        "single loss f_i to take gradients of; run it with algorithm 'fedmsa', "
                        "or use a single-level problem (classification, quadratic, logistic)")

    device_losses = stacked_losses = stacked_gradients = full_gradients = _single_level

    def chunks(self, batch_size: int, own_model: bool) -> Iterator[slice]:
        yield slice(0, self.num_devices)

    def sample(self, generator: torch.Generator, batch_size: int, steps: int = 1) -> torch.Tensor:
        self._single_level()

    def initial(self) -> torch.Tensor:
        """theta_0 = 0: x_0 = w_0 = v_0 = 0 (fedmsa.md Sec. 5.1, A13)."""
        return torch.zeros(self.d, device=self.device)


class BilevelProblem(MSAProblem):
    """min_x (1/M) sum_m f^m(x, w*(x)), w*(x) = argmin_w (1/M) sum_m g^m(x, w) (Sec. 1.4);
    state [x; w; v], blocks (d_x, 2 d_w) (N = 1: z = [w; v], one step size beta for both)."""

    dx: int
    dw: int

    @abstractmethod
    def inner_loss(self, x: torch.Tensor, w: torch.Tensor, devices: torch.Tensor,
                   keys: np.ndarray | None, batch: EpochBatch | None = None) -> torch.Tensor:
        """sum over rows of g^{m}(x_i, w_i; sample_i), m = devices[i]: a scalar. ``batch``:
        only these of each client's training samples (its mean over them; ``epoch_batches``),
        None for all of them."""

    @abstractmethod
    def outer_loss(self, x: torch.Tensor, w: torch.Tensor, devices: torch.Tensor,
                   keys: np.ndarray | None) -> torch.Tensor:
        """sum over rows of f^{m}(x_i, w_i; sample_i), m = devices[i]: a scalar."""

    def work(self, rows: int) -> int:
        """Multiply-adds of one map evaluation for ``rows`` clients (picks the thread count)."""
        return rows * self.model_profile.macs_per_sample

    def maps(self, states, devices, keys=None):
        """(p, s_w, s_v) by one backward with the graph kept and one double backward
        (module docstring); rows are independent, so the sums give per-device derivatives."""
        start = time.perf_counter()
        s = states.to(torch.float64)
        dx, dw = self.dx, self.dw
        x = s[:, :dx].detach().requires_grad_(True)
        w = s[:, dx:dx + dw].detach().requires_grad_(True)
        v = s[:, dx + dw:].detach()
        with torch.enable_grad(), single_thread_if_small(self.work(len(states))):
            (g_w,) = torch.autograd.grad(self.inner_loss(x, w, devices, keys), w,
                                         create_graph=True)
            # One reverse sweep over <grad_w g, v> - f gives, with respect to w,
            # grad^2_ww g v - grad_w f = s_v and, with respect to x, grad^2_xw g v - grad_x f = -p:
            # the double backward and the outer backward share the sweep.
            s_v, minus_p = torch.autograd.grad((g_w * v).sum()
                                               - self.outer_loss(x, w, devices, keys), (w, x),
                                               allow_unused=True)
        minus_p = torch.zeros_like(x) if minus_p is None else minus_p
        out = torch.cat([-minus_p, g_w.detach(), s_v], dim=1)
        self.compute_s += time.perf_counter() - start
        return out

    # ---- the separate oracles of methods that do not evaluate the maps whole (FedNest) -------
    def _leaves(self, x: torch.Tensor, w: torch.Tensor):
        return (x.to(torch.float64).detach().requires_grad_(True),
                w.to(torch.float64).detach().requires_grad_(True))

    def inner_gradients(self, x, w, devices, keys=None, batch: EpochBatch | None = None
                        ) -> torch.Tensor:
        """grad_w g^m(x_i, w_i) [n, d_w] (one forward + one backward), over the minibatch
        ``batch`` of each client's training samples or over all of them."""
        x, w = self._leaves(x, w)
        with torch.enable_grad(), single_thread_if_small(self.work(len(w))):
            return torch.autograd.grad(self.inner_loss(x, w, devices, keys, batch), w)[0]

    def epoch_batches(self, generator: torch.Generator, batch_size: int, devices: torch.Tensor
                      ) -> tuple[list[EpochBatch], np.ndarray]:
        """One local epoch over the training samples of clients ``devices`` [n]: each client's
        samples in a random order (drawn from ``generator``, on the CPU) cut into ceil(m_i / b)
        minibatches of b, the last one smaller when b does not divide m_i (a data loader's
        epoch with shuffling). Returns the batches of step j = 0, 1, ... (a client whose epoch
        has ended has no sample in the later ones) and the steps per client [n]."""
        sizes = torch.as_tensor(self.full_batch_sizes(), dtype=torch.int64)[devices.cpu()]
        slots = int(sizes.max()) if len(sizes) else 0
        order = torch.rand((len(sizes), slots), generator=generator, dtype=torch.float64)
        order.masked_fill_(torch.arange(slots) >= sizes[:, None], 2.0)  # padding sorts last
        order = order.argsort(dim=1)
        steps = (sizes + batch_size - 1) // batch_size
        batches = []
        for start in range(0, slots, batch_size):
            rank = torch.arange(start, min(start + batch_size, slots))
            batches.append(EpochBatch(
                positions=order[:, rank].to(self.device),
                weights=(rank[None, :] < sizes[:, None]).to(torch.float64).to(self.device)))
        return batches, steps.numpy()

    def outer_gradients(self, x, w, devices, keys=None) -> tuple[torch.Tensor, torch.Tensor]:
        """(grad_x f^m [n, d_x], grad_w f^m [n, d_w]) (one forward + one backward)."""
        x, w = self._leaves(x, w)
        with torch.enable_grad(), single_thread_if_small(self.work(len(w))):
            f_x, f_w = torch.autograd.grad(self.outer_loss(x, w, devices, keys), (x, w),
                                           allow_unused=True)
        return (torch.zeros_like(x) if f_x is None else f_x), f_w

    def second_order(self, x, w, u, devices, keys=None) -> tuple[torch.Tensor, torch.Tensor]:
        """(grad^2_ww g^m u [n, d_w], grad^2_xw g^m u [n, d_x]) at (x_i, w_i): one forward,
        one backward with the graph kept, one double backward."""
        x, w = self._leaves(x, w)
        u = u.to(torch.float64)
        with torch.enable_grad(), single_thread_if_small(self.work(len(w))):
            (g_w,) = torch.autograd.grad(self.inner_loss(x, w, devices, keys), w,
                                         create_graph=True)
            hvp, jvp = torch.autograd.grad((g_w * u).sum(), (w, x), allow_unused=True)
        return hvp, (torch.zeros_like(x) if jvp is None else jvp)

    def evaluation_cost(self, evaluations, full_batch, batch_size):
        """One map evaluation = 2 forward + 2 backward passes (inner and outer batch) + 1
        Hessian-vector product (fedmsa.md Sec. 3.1)."""
        batch = self.full_batch_sizes() if full_batch else batch_size
        return Cost(forward_passes=2 * np.asarray(evaluations), backward_passes=2 * np.asarray(
            evaluations), hvp_passes=np.asarray(evaluations), batch_size=batch)


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


SPEC = ProblemSpec(
    name="bilevel-quadratic", Config=BilevelQuadraticConfig, build=build, memory=memory, fit=fit,
    multi_sequence=True, bilevel=True,
    summary="fedmsa.md's federated bilevel quadratic with known solution (fedmsa, fednest)")
