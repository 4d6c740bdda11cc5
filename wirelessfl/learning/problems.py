"""Learning problems: the one interface algorithms compute with, and problems with a known optimum.

Every algorithm reaches its learning problem through ``ctx.evaluator``, a ``Problem``: N devices,
device i holding a local objective f_i, and the global objective

    f(x) = (1/N) sum_i f_i(x)                                      (fedred.md, Sec. 1.1)

with x = theta a flat vector [d]. Two implementations:

* ``BatchedEvaluator`` (learning/evaluator.py): a torch classifier, f_i = mean cross-entropy over
  device i's samples (+ l2/2 ||x||^2); a minibatch is a set of sample indices;
* ``QuadraticProblem`` (here): f_i(x) = 1/2 x^T A_i x - c_i^T x, the synthetic setting of
  fedred.md Sec. 4.1 drawn by the generator of Sec. 5.1, with closed-form x* and f*; a "minibatch"
  is a key for additive Gaussian gradient noise (Assumption 1, Sec. 1.4).

Shapes: N devices, d parameters, b samples per minibatch, E local steps; ``models`` [n, d] holds
one model per device of a chunk of n devices, ``idx`` [n, b] their minibatches (as ``sample``
returned them, rows of the same devices).
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from functools import cached_property

import numpy as np
import torch
from scipy.optimize import brentq

from wirelessfl.energy.profiler import ModelProfile
from wirelessfl.errors import UserError

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
    def full_gradients(self, theta: torch.Tensor) -> torch.Tensor:
        """Exact local gradients grad f_i over all of each device's data, at a shared point
        theta [d] or at each device's own model theta [N, d]: -> [N, d]."""

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

    # ---- built on the above -----------------------------------------------------------------
    def device_gradients(self, theta: torch.Tensor, idx: torch.Tensor
                         ) -> Iterator[tuple[slice, torch.Tensor]]:
        """Per-device minibatch gradients at a shared theta, chunk by chunk: (rows, [n, d])."""
        b = idx.shape[1]
        for rows in self.chunks(b, own_model=True):
            start = time.perf_counter()
            models = theta.expand(rows.stop - rows.start, -1)
            grads = self.stacked_gradients(models, idx[rows])
            self.compute_s += time.perf_counter() - start
            yield rows, grads

    def local_sgd(self, theta: torch.Tensor, idx: torch.Tensor, lr: float,
                  steps: torch.Tensor | None = None) -> Iterator[tuple[slice, torch.Tensor]]:
        """Each device runs SGD from theta on its minibatches idx [E, N, b]; yields (rows, [n, d]).

        ``steps`` [N] (optional) lets devices stop early: device i takes only its first steps[i].
        """
        num_steps, _, b = idx.shape
        for rows in self.chunks(b, own_model=True):
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


# ---- counter-based Gaussian noise ----------------------------------------------------------------
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def _mix64(z: np.ndarray) -> np.ndarray:
    """SplitMix64's output function (Steele, Lea and Flood 2014) on uint64 arrays (wrapping)."""
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


def keyed_normals(keys: np.ndarray, count: int) -> np.ndarray:
    """Standard normals [len(keys), count], float64: row r is a pure function of keys[r].

    Row r reads the SplitMix64 stream seeded by mix(keys[r]); two uniforms per value go through
    Box-Muller. Vectorised over rows and columns, so which rows are drawn together (chunking)
    never changes a row.
    """
    state = _mix64(np.asarray(keys, dtype=np.uint64).reshape(-1))[:, None]
    counters = np.arange(1, 2 * count + 1, dtype=np.uint64) * _GOLDEN
    bits = _mix64(state + counters[None, :])
    u = ((bits >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53  # in (0, 1)
    return np.sqrt(-2.0 * np.log(u[:, 0::2])) * np.cos(2.0 * np.pi * u[:, 1::2])


# ---- the quadratic ---------------------------------------------------------------------------------
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

    def full_gradients(self, theta: torch.Tensor) -> torch.Tensor:
        start = time.perf_counter()
        x = theta.to(torch.float64)
        if x.dim() == 1:
            g = torch.matmul(self.A, x) - self.c
        else:
            g = torch.bmm(self.A, x.unsqueeze(2)).squeeze(2) - self.c
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
